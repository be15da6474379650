"""Client-side load tools, outside the server package: the streaming load generator (`loadgen`) that
`make bench` and the load test share, and the ramped load test with its report (`python -m
loadtools.loadtest`). They need the `test`/`bench` extras (httpx, matplotlib); the server does not."""
