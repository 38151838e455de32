# Setup, run and test in a local virtual environment (.venv).
#
# torch: a CPU build on a machine without an NVIDIA GPU, a CUDA build where `nvidia-smi -L` lists one.
#   cpu:  torch==$(TORCH_VERSION) from the official CPU wheel index ($(TORCH_CPU_INDEX)) when it answers
#         within a few seconds; otherwise the plain pin, resolved the way this machine's pip is configured
#         (a local wheel directory, a mirror, or PyPI, whose Linux x86-64 wheel is the CUDA build: setup
#         then says so; it runs on the CPU all the same).
#   cuda: torch==$(TORCH_VERSION) from the configured index (PyPI: on Linux a CUDA 13.0 build, which needs
#         an NVIDIA driver >= 580); setup fails if pip resolved it to a CPU build.
# Override the detection with TORCH_BUILD=cpu|cuda, or the whole pip argument list with TORCH_SPEC, e.g.
#   make run TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
# `make torch-choice` prints the choice. It is recorded in $(VENV)/torch-<checksum>.stamp: a different choice
# (another TORCH_SPEC, TORCH_BUILD or detection result) reinstalls torch in the existing .venv.
# With a CUDA build `make run` and `make floor` pass `--config device=cuda` (DEVICE=cpu or DEVICE= keeps
# the config's device); nothing is written into config/.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CORES ?= 2
TEST_WORKERS ?= 3
TORCH_VERSION ?= 2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

ifeq ($(origin TORCH_BUILD),undefined)
TORCH_BUILD := $(if $(shell nvidia-smi -L 2>/dev/null | grep '^GPU '),cuda,cpu)
endif
ifneq ($(filter-out cpu cuda,$(TORCH_BUILD)),)
$(error TORCH_BUILD=$(TORCH_BUILD): use cpu or cuda)
endif

# Whether the CPU wheel index answers (HEAD of its torch page) within 5 s; never waits longer, offline or not.
cpu_index_reachable = $(shell $(PYTHON) -c 'import sys, threading, urllib.request as u; ok = []; \
  t = threading.Thread(target=lambda: ok.append(u.urlopen(u.Request(sys.argv[1], method="HEAD"), timeout=4).status), daemon=True); \
  t.start(); t.join(5); print("yes" if ok else "")' '$(TORCH_CPU_INDEX)/torch/' 2>/dev/null)
torch_spec_cpu = torch==$(TORCH_VERSION)$(if $(cpu_index_reachable), --index-url $(TORCH_CPU_INDEX))
torch_spec_cuda = torch==$(TORCH_VERSION)

# The pip arguments that install torch (computed once, and only when a target needs them).
TORCH_SPEC_ORIGIN := $(origin TORCH_SPEC)
ifeq ($(TORCH_SPEC_ORIGIN),undefined)
TORCH_SPEC = $(eval TORCH_SPEC := $(torch_spec_$(TORCH_BUILD)))$(TORCH_SPEC)
endif
TORCH_CHOICE = $(TORCH_BUILD): $(TORCH_SPEC)
TORCH_STAMP = $(eval TORCH_STAMP := $(VENV)/torch-$(shell printf '%s' '$(TORCH_CHOICE)' | cksum | cut -d' ' -f1).stamp)$(TORCH_STAMP)

DEVICE ?= $(if $(filter cuda,$(TORCH_BUILD)),cuda)
RUN_CONFIG = $(if $(DEVICE),--config device=$(DEVICE))

# After installing: name the build; a computed cuda choice that pip resolved to a CPU build is an error.
define torch_check
import sys, torch
wanted, computed = sys.argv[1], sys.argv[2] == "undefined"
cuda = torch.version.cuda
print(f"torch {torch.__version__} installed: {'CUDA ' + cuda if cuda else 'CPU'} build")
if wanted == "cuda" and not cuda:
    message = ("an NVIDIA GPU is present but pip resolved torch to a CPU build (this machine's pip configuration chose it). "
               "Fix: make setup TORCH_SPEC='torch==$(TORCH_VERSION) --index-url <a CUDA wheel index, e.g. https://download.pytorch.org/whl/cu130>' "
               "or TORCH_BUILD=cpu to keep the CPU build.")
    sys.exit(message) if computed else print("note:", message)
if wanted == "cpu" and cuda:
    print("note: a CUDA build of torch (several GB) on a machine without an NVIDIA GPU: the CPU wheel index was "
          "not reachable, so pip took the plain pin from its configured index; it runs on the CPU all the same.")
endef
export torch_check

.PHONY: setup run test test-quick lint floor compare rml2018-compare independent-data docs figures clean torch-choice example-weights

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# One stamp per torch choice: a new choice has no stamp yet, so torch is reinstalled.
$(VENV)/torch-%.stamp: | $(BIN)/python
	rm -f $(VENV)/torch-*.stamp
	$(BIN)/python -m pip uninstall --quiet --yes torch
	$(BIN)/python -m pip install --quiet $(TORCH_SPEC)
	$(BIN)/python -c "$$torch_check" $(TORCH_BUILD) $(TORCH_SPEC_ORIGIN)
	echo '$(TORCH_CHOICE)' > $@

.SECONDEXPANSION:
$(BIN)/rffm: pyproject.toml $$(TORCH_STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(BIN)/rffm

# Also links ~/.config/snakemake/{gcp-batch,slurm} to profiles/ (rffm install_profiles), so the literal
# `snakemake --profile gcp-batch` / `--profile slurm` find them; an existing different profile of that
# name is left alone (the message says how to proceed) and setup goes on.
setup: $(BIN)/rffm
	@$(BIN)/rffm install_profiles --checkout $(CURDIR) || echo "make setup: a profile was not linked (see above: each one skipped and its Fix); --profile profiles/<name> works all the same"

# What setup installs here, without installing anything.
torch-choice:
	@echo 'TORCH_BUILD=$(TORCH_BUILD)'
	@echo 'TORCH_SPEC=$(TORCH_SPEC)'
	@echo 'TORCH_STAMP=$(TORCH_STAMP)'
	@echo 'DEVICE=$(DEVICE)'

run: setup
	$(BIN)/snakemake --profile profiles/default --cores $(CORES) $(RUN_CONFIG)
	$(BIN)/rffm verify results
	$(BIN)/rffm status results

# The example user backbones' weights (config/examples/{wavesfm_like,spectrumfm_like,exported_backbone}.yaml):
# random, deterministic, written locally (not in git); prints the sha256 the example configs pin.
example-weights: setup
	$(BIN)/python config/examples/models/make_weights.py

# Tests run on TEST_WORKERS processes (pytest-xdist; three on two cores: the SLURM and Batch tests wait on their
# schedulers much of the time), each test module on one of them (its module fixtures are built once), the longest
# first (tests/conftest.py: LONGEST_FIRST; the SLURM modules share one local cluster on one worker);
# TEST_WORKERS=0 runs them in this one. The summary line and the 25 slowest tests close the output.
XDIST = -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
test: setup
	$(BIN)/python -m pytest -q $(XDIST) --durations=25

# The edit-test loop (a few minutes): the unit tests and one workflow smoke run (the tiny workflow from nothing to a
# qualified run, then its dry run plans nothing). `make test` (and CI) run the whole suite.
QUICK = tests/unit tests/workflow/test_workflow.py::test_complete_run_has_nothing_to_do
test-quick: setup
	$(BIN)/python -m pytest -q $(XDIST) --durations=10 $(QUICK)

lint: setup
	RFFM_WORKER_IMAGE=$${RFFM_WORKER_IMAGE:-example.invalid/rffm/worker@sha256:$$(printf '0%.0s' $$(seq 64))} $(BIN)/snakemake --lint
	$(BIN)/snakefmt --check workflow
	$(BIN)/ruff check scripts tests
	$(BIN)/ruff format --check scripts tests

# The default run between its floor (the same head on a frozen, randomly initialized backbone) and the end-to-end
# CNNs (IQ and rf input) trained on the same splits, 3 seeds of every row (config/examples/random_floor.yaml):
# floor | frozen backbone | end-to-end, each measured against the strongest reference by val accuracy.
floor: setup
	$(BIN)/snakemake --profile profiles/default --cores $(CORES) --configfile config/config.yaml config/examples/random_floor.yaml $(RUN_CONFIG)
	$(BIN)/rffm compare results --config config/config.yaml config/examples/random_floor.yaml

compare: floor

# The second, independent generator's data (rffm.data.independent, scikit-commpy) for config/examples/independent.yaml,
# in results-independent/data/ (where that config, run with --directory results-independent, reads it).
independent-data: setup
	mkdir -p results-independent/data
	$(BIN)/rffm independent_data --out results-independent/data/independent.hdf5 --per-class-snr 40 --seed 0

# RadioML 2018-shaped synthetic data (1024 samples, 11 classes, varying symbol rates): floor | frozen backbone |
# end-to-end at k = 5, 20 and all labels per (class, SNR), in results-rml2018/ (config/examples/rml2018_synthetic.yaml).
rml2018-compare: setup
	$(BIN)/snakemake --profile profiles/default --cores $(CORES) --directory results-rml2018 --configfile config/examples/rml2018_synthetic.yaml --replace-workflow-config $(RUN_CONFIG)
	$(BIN)/rffm compare results-rml2018/results --config config/examples/rml2018_synthetic.yaml

# Regenerate config/REFERENCE.md from the config schema.
docs: setup
	$(BIN)/rffm config_reference --write config/REFERENCE.md

# Rewrite every figure README.md and workflow/docs/performance.md mark (<!-- rec NAME PATH FORMAT -->) from its
# committed record, workflow/docs/records/NAME.json (written by `rffm record NAME -- COMMAND`); prints how many remain.
figures: setup
	$(BIN)/rffm figures

# Where the workflow ran as root the ledger entries are immutable (chattr +i): rffm clears the flag first, naming each.
clean:
	@if [ -x $(BIN)/rffm ]; then $(BIN)/rffm release_immutable results scratch .snakemake; fi
	rm -rf results scratch .snakemake
