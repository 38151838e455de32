#!/usr/bin/env bash
# The CUDA path of the hidden-state cache, measured on a GPU machine: pinned host buffers,
# non-blocking host-to-device copies, BF16 autocast in the backbone, adaptive batches.
# Prints the same P-figures as `rffm bench cache` (P1, P3, ...), runs the tiny workflow
# (config/examples/tiny.yaml) end to end with `device: cuda`, verifies it, checks that its cache
# and qualification ran on that device, exports the run (the export's check runs on the CPU in
# either mode) and prints the bench's JSON again as its last line.
# Usage: scripts/gpu_check.sh [SAMPLES]          (default 22000: the default dataset's size)
#   RFFM_GPU_CHECK_DEVICE=cpu scripts/gpu_check.sh [SAMPLES]   the same steps on the CPU at tiny
#   size (default 64 samples, a one-block backbone): the script's own test
#   (tests/workflow/test_gpu_check.py), no GPU figure.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
BIN=$(dirname "$PY")
DEVICE=${RFFM_GPU_CHECK_DEVICE:-cuda}
case "$DEVICE" in
cuda)
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device visible to torch. Fix: run on a GPU machine, or RFFM_GPU_CHECK_DEVICE=cpu for the CPU check.')"
  "$PY" -c "import torch; print('device:', torch.cuda.get_device_name(0), 'torch', torch.__version__)"
  bench=(--samples "${1:-22000}" --repeats 3)
  cores=4
  ;;
cpu)
  "$PY" -c "import torch; print('device: cpu (RFFM_GPU_CHECK_DEVICE=cpu: tiny size, no GPU figure)', 'torch', torch.__version__)"
  bench=(--samples "${1:-64}" --repeats 1 --arch '{"dim": 16, "depth": 1, "heads": 2, "output_layers": 2}')  # 2: the tail's input too (P6, P7)
  cores=2
  ;;
*)
  echo "RFFM_GPU_CHECK_DEVICE=$DEVICE: not cuda or cpu. Fix: set RFFM_GPU_CHECK_DEVICE=cuda (the default) or cpu." >&2
  exit 2
  ;;
esac
work=$(mktemp -d)
release() {  # the workflow's ledger entries are immutable where it may make them so (root): released before removal
  "$PY" -c "import sys, pathlib; from rffm.records.store import set_immutable; [set_immutable(p, False) for p in pathlib.Path(sys.argv[1]).rglob('ledger/*/*.json')]" "$work" || true
  rm -rf "$work"
}
trap release EXIT
"$BIN/rffm" bench cache --device "$DEVICE" "${bench[@]}" | tee "$work/bench.txt"
"$PY" - "$work/config.yaml" "$DEVICE" "$cores" <<'EOF'
import sys, yaml
path, device, cores = sys.argv[1:]
config = yaml.safe_load(open("config/examples/tiny.yaml"))
config.update(threads=int(cores), device=device)
for run in config["runs"].values():  # the export of a run trained on the device (its check runs on the CPU)
    run["export"] = True
yaml.safe_dump(config, open(path, "w"), sort_keys=False)
EOF
"$BIN/snakemake" -s workflow/Snakefile -d "$work" --configfile "$work/config.yaml" --cores "$cores" -q
"$BIN/rffm" verify "$work/results"
"$PY" - "$work" "$DEVICE" <<'EOF'
import json, pathlib, sys
work, device = pathlib.Path(sys.argv[1]), sys.argv[2]
records = [work / "results/runs/base/qualification/provenance.json", *sorted((work / "results/caches").glob("*/provenance.json"))]
card = json.loads((work / "results/runs/base/export/model_card.json").read_text())
print(f"export: {card['validation_check']['examples']} val examples, pt2 max |logit difference| "
      f"{card['validation_check']['pt2']['max_abs_logit_difference']}")
for record in records:
    found = json.loads(record.read_text()).get("device")
    print(f"{record.relative_to(work)}: device {found}")
    if found is None or not str(found).startswith(device):
        sys.exit(f"{record}: ran on {found}, not {device}. Fix: report this line with `nvidia-smi` and `pip show torch`.")
EOF
tail -n 1 "$work/bench.txt"
