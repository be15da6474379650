# llamaray — the two commands a newcomer needs: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
LOCAL_CONFIG := build/serve_local.yaml
PORT ?= 8000

.PHONY: run test test-slow install config clean

# The venv is rebuilt only when pyproject.toml changes. pip's wheel cache keeps the
# llama-cpp-python build (compiled from source, ~5 min) for later venvs.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# serve_config.yaml (production: GPU replicas) + configs/local-cpu.yaml (CPU overrides).
config: $(STAMP)
	$(VENV)/bin/llamaray render-config serve_config.yaml --overlay configs/local-cpu.yaml -o $(LOCAL_CONFIG)
	$(VENV)/bin/llamaray check-config $(LOCAL_CONFIG)

run: config
	$(VENV)/bin/serve run $(LOCAL_CONFIG)

test: $(STAMP)
	$(PY) -m pytest -m "not slow" -q

test-slow: $(STAMP)
	$(PY) -m pytest -m slow -q

clean:
	rm -rf build .pytest_cache .hypothesis
