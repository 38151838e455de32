#!/usr/bin/env bash
# The CUDA path of the hidden-state cache, measured on a GPU machine: pinned host buffers,
# non-blocking host-to-device copies, BF16 autocast in the backbone, adaptive batches.
# Prints the same P-figures as `rffm bench cache` (last line: JSON), then runs the tiny
# workflow end to end with `device: cuda`. Usage: scripts/gpu_check.sh [SAMPLES]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device visible to torch')"
"$PY" -c "import torch; print('device:', torch.cuda.get_device_name(0), 'torch', torch.__version__)"
"$PY" -m rffm bench cache --device cuda --samples "${1:-88000}" --repeats 3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sed 's/^threads: 1$/threads: 4\ndevice: cuda/' tests/tiny.yaml > "$work/config.yaml"
"$(dirname "$PY")/snakemake" -s workflow/Snakefile -d "$work" --configfile "$work/config.yaml" --cores 4 -q
"$(dirname "$PY")/rffm" verify "$work/results"
grep -h '"device"' "$work"/results/runs/base/qualification/provenance.json "$work"/results/caches/*/provenance.json
