"""Benchmark of llamaray against llama.cpp's llama-server and llama-cpp-python's server
(`make bench` / `python -m bench`). The load generator it drives them with is loadtools/loadgen.py."""
