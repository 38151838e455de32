"""Write the example backbones' weights, deterministically (random init from a fixed seed: nothing is downloaded).

    python config/examples/models/make_weights.py [OUT_DIR]      (make example-weights; default: config/examples/models/weights)

Writes, the way the published checkpoints are saved:
  wavesfm_like.pth            {"model": state_dict, "epoch": 0, "args": kwargs}  (torch.save; load with python.key: model)
  wavesfm_like.safetensors    the same state_dict as safetensors
  spectrumfm_like.safetensors the SpectrumFM-shaped model's state_dict
  spectrumfm_like.pt2         a torch.export program of it whose outputs are the tapped layers (dynamic batch >= 1)
and prints each file's sha256 (the example configs pin them). The bytes hold no path of this checkout: the same
torch version writes the same files in any directory.
"""

from __future__ import annotations

import hashlib
import io
import sys
from pathlib import Path

import torch

from rffm.model.programs import program_bytes  # the .pt2 without this checkout's paths, as the exported classifier

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import spectrumfm_like  # noqa: E402
import wavesfm_like  # noqa: E402

WAVES = {"length": 128, "segment": 16, "dim": 256, "depth": 8, "heads": 8, "mlp_ratio": 6.0}  # ~8.4 M parameters
SPECTRUM = {"length": 128, "dim": 128, "depth": 4, "heads": 4, "kernel": 15}
EXPORTED_LAYERS = [2, 4]  # embedding = 0: the outputs of blocks 2 and 4


def seeded(build, kwargs: dict, seed: int) -> torch.nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build(**kwargs).eval()


def write_all(out: Path, waves: dict = WAVES, spectrum: dict = SPECTRUM, layers: list[int] = EXPORTED_LAYERS) -> dict[str, str]:
    """Write the four files into `out`; their sha256 by name."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    model = seeded(wavesfm_like.build, waves, 0)
    state = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    buffer = io.BytesIO()  # through memory: the archive's bytes do not depend on the file name
    torch.save({"model": state, "epoch": 0, "args": dict(waves)}, buffer)
    (out / "wavesfm_like.pth").write_bytes(buffer.getvalue())
    save_file(state, str(out / "wavesfm_like.safetensors"))
    model = seeded(spectrumfm_like.build, spectrum, 1)
    save_file({name: tensor.contiguous() for name, tensor in model.state_dict().items()}, str(out / "spectrumfm_like.safetensors"))
    example = torch.randn(2, spectrum["length"], 2, generator=torch.Generator().manual_seed(0))
    batch = torch.export.Dim("batch", min=1, max=1 << 20)
    program = torch.export.export(spectrumfm_like.LayerOutputs(model, layers), (example,), dynamic_shapes={"x": {0: batch}})
    (out / "spectrumfm_like.pt2").write_bytes(program_bytes(program))
    names = ("wavesfm_like.pth", "wavesfm_like.safetensors", "spectrumfm_like.safetensors", "spectrumfm_like.pt2")
    return {name: hashlib.sha256((out / name).read_bytes()).hexdigest() for name in names}


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "weights"
    for name, digest in write_all(target).items():
        print(f"{digest}  {target / name}")
