"""The example user backbones (config/examples/models) at test sizes: their weights written the way make_weights does."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "config" / "examples" / "models"
sys.path.insert(0, str(MODELS))

import make_weights  # noqa: E402
import spectrumfm_like  # noqa: E402, F401 (the example user models, for tests)
import wavesfm_like  # noqa: E402, F401

LENGTH = 64  # the tiny config's example length
WAVES = {"length": LENGTH, "segment": 16, "dim": 32, "depth": 2, "heads": 2, "mlp_ratio": 2.0}  # 4 tokens + CLS
SPECTRUM = {"length": LENGTH, "dim": 16, "depth": 2, "heads": 2, "kernel": 5}  # 64 tokens, 3 states
EXPORTED_LAYERS = [1, 2]


def user_models(workdir: Path) -> dict[str, str]:
    """Copy the example model code into workdir/models and write small weights into workdir/weights; their sha256 by name."""
    shutil.copytree(MODELS, workdir / "models", ignore=shutil.ignore_patterns("weights", "__pycache__", "make_weights.py"))
    return make_weights.write_all(workdir / "weights", WAVES, SPECTRUM, EXPORTED_LAYERS)


def backbones(digests: dict[str, str]) -> dict[str, dict]:
    """The three example backbones (as config/examples/*.yaml declare them) at test sizes, paths relative to the workdir."""
    return {
        "waves": {
            "source": "python",
            "path": "weights/wavesfm_like.pth",
            "sha256": digests["wavesfm_like.pth"],
            "python": {"entry_point": "wavesfm_like:build", "import_path": "models", "key": "model", "kwargs": WAVES},
            "adapter": {"length": LENGTH, "layout": "antenna", "normalize": "rms"},
            "taps": {"modules": ["blocks.0", "norm"], "prefix": 1},
            "keep": "prefix+mean",
        },
        "spectrum": {
            "source": "python",
            "path": "weights/spectrumfm_like.safetensors",
            "sha256": digests["spectrumfm_like.safetensors"],
            "python": {"entry_point": "spectrumfm_like:build", "import_path": "models", "kwargs": SPECTRUM},
            "adapter": {"length": LENGTH, "layout": "samples", "normalize": "rms"},
            "taps": {"method": "hidden_states", "select": [1, 2]},
            "keep": "mean",
        },
        "exported": {
            "source": "export",
            "path": "weights/spectrumfm_like.pt2",
            "sha256": digests["spectrumfm_like.pt2"],
            "adapter": {"length": LENGTH, "layout": "samples", "normalize": "rms"},
            "keep": "every:8",
        },
    }
