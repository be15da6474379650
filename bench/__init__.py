"""The benches: llamaray measured against llama.cpp's llama-server and llama-cpp-python's server, its shapes
against each other, and its features under load. One wing, in three parts beside the scenarios:

- the scenarios, one module each, each a command (`python -m bench`, `python -m bench.<name> --help`; what each
  measures and its latest figures: docs/benchmarks.md): __main__ (the servers compared: `make bench`), router,
  graph, hops, serve_hop, hostile, embeddings, structured, engine, spec, pool, tenants, lora_mix, profile,
  determinism, prompt_cache, gpu_check (`make gpu-check`);
- harness/: what the scenarios run and watch: the servers compared (built, started, paused, stopped), the
  bundled model, arms that take turns, the serve driver and the graph probe (Ray drivers of the bench's own),
  /proc sampling and CPU accounting, py-spy, the OTLP collector (also the tests' trace receiver);
- load/: the client side: the streaming load generator, multi-turn conversations, the graph bench's load
  process, and the ramped load test (`make loadtest`, `python -m bench.load.loadtest`);
- reports/: the tables, JSON and charts the scenarios print and write.

The scenarios import harness/, load/ and reports/, never the other way round; tools/ imports nothing from here.
"""
