# Two commands do all the set-up on a fresh machine (see README):
#   make reproduce   runs the embedded tiny default end to end
#   make test        runs the test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install reproduce test dry-run-paper benchmark benchmark-vllm benchmark-default clean

$(BIN)/esrepro: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# the CPU build of torch first: an unpinned torch would pull a multi-GB CUDA build
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

# DVC in its own environment: its hydra-core pins antlr4 4.9, which breaks math-verify
$(VENV)-dvc/bin/dvc:
	$(PYTHON) -m venv $(VENV)-dvc
	$(VENV)-dvc/bin/pip install --quiet dvc==3.67.1
	touch $@

install: $(BIN)/esrepro $(VENV)-dvc/bin/dvc

reproduce: install
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/snakemake --profile workflow/profiles/default
	# Snakemake's own HTML report: every table and figure with its caption and provenance
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/snakemake --report results/reports/workflow_report.html

test: install
	# a real single-node SLURM for tests/test_slurm.py (Debian packages; skipped without root)
	scripts/install-slurm
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest -ra

dry-run-paper: install
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/snakemake -n --configfile config/paper.yaml

# ES against pure inference on the CPU (random-weight tiny model), then bf16 drift; GPU runs: see README
benchmark: install
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python benchmarks/es_engine.py --build-shape tiny --population 8 \
		--prompts 32 --new-tokens 64 --iterations 3 --drift-cycles 1000 --json results/benchmarks/es_engine.json

# the same with vLLM's CPU build beside transformers, at the tiny shape and at the 22.8M-parameter medium shape
# where generation dominates (10-20 minutes on two busy cores); needs $(VENV)-vllm (vLLM's CPU build)
benchmark-vllm:
	@test -x $(VENV)-vllm/bin/python || { echo "benchmark-vllm needs $(VENV)-vllm (vLLM's CPU build)"; exit 1; }
	PATH="$(abspath $(VENV)-vllm/bin):$$PATH" VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_LOGGING_LEVEL=ERROR \
		$(VENV)-vllm/bin/python benchmarks/es_engine.py --build-shape tiny --backend hf,vllm --population 8 \
		--prompts 32 --new-tokens 64 --iterations 3 --json results/benchmarks/es_engine_vllm_tiny.json
	PATH="$(abspath $(VENV)-vllm/bin):$$PATH" VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_LOGGING_LEVEL=ERROR \
		$(VENV)-vllm/bin/python benchmarks/es_engine.py --build-shape medium --backend hf,vllm --population 4 \
		--prompts 64 --new-tokens 128 --iterations 2 --json results/benchmarks/es_engine_vllm_medium.json

# the embedded default from a fresh clone of the committed state: wall time, jobs, job-seconds per rule
benchmark-default: install
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python benchmarks/embedded_default.py

clean:
	rm -rf results/models results/runs results/eval results/tables results/figures results/logs results/reports results/ro-crate data/prepared .snakemake
