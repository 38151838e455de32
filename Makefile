# Setup, run and test in a local virtual environment (.venv).
# CPU machines get the pinned CPU torch wheel; GPU users override TORCH_SPEC, e.g.
#   make run TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
PYTHON ?= python3
TORCH_SPEC ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
CORES ?= 2

.PHONY: setup run test lint floor docs clean

$(BIN)/rffm: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(TORCH_SPEC)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(BIN)/rffm

setup: $(BIN)/rffm

run: setup
	$(BIN)/snakemake --profile profiles/default --cores $(CORES)
	$(BIN)/rffm verify results
	$(BIN)/rffm status results

test: setup
	$(BIN)/python -m pytest -q

lint: setup
	RFFM_WORKER_IMAGE=$${RFFM_WORKER_IMAGE:-example.invalid/rffm/worker@sha256:$$(printf '0%.0s' $$(seq 64))} $(BIN)/snakemake --lint
	$(BIN)/snakefmt --check workflow
	$(BIN)/ruff check scripts tests

# The default run next to the same head on a frozen, randomly initialized backbone (the floor).
floor: setup
	$(BIN)/snakemake --profile profiles/default --cores $(CORES) --configfile config/config.yaml config/examples/random_floor.yaml
	$(BIN)/rffm status results --config config/config.yaml config/examples/random_floor.yaml

# Regenerate config/REFERENCE.md from the config schema.
docs: setup
	$(BIN)/rffm config_reference --write config/REFERENCE.md

clean:
	rm -rf results scratch .snakemake
