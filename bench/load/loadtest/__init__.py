"""Load test for an OpenAI-compatible chat endpoint: `python -m bench.load.loadtest --help`.

A ramped workload (workload.py) drives streamed chat requests through bench.load.loadgen; replica
counts come from the Ray dashboard when reachable (serve_status.py); a live line shows progress
(progress.py); report.py writes report.json and report.png. No `ray` import anywhere, and
matplotlib only when the PNG is drawn.
"""
