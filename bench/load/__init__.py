"""The client side of the benches: the streaming load generator (loadgen.py) that `make bench` and the load
test share, multi-turn conversations (conversations.py, `python -m bench.router`), the graph bench's load
process (graph_load.py), and the ramped load test with its report (`make loadtest`, `python -m
bench.load.loadtest`). No `ray` import; they need the `test`/`bench` extras (httpx, matplotlib), the server
does not."""
