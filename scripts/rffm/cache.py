"""The hidden-state cache: frozen-backbone outputs for train and val, BF16 in memory-mapped files."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rffm import backbone, provenance
from rffm.dataset import iter_iq_batches, read_split, split_attrs
from rffm.errors import ConfigError, IntegrityError
from rffm.files import atomic_write_json, read_json
from rffm.progress import Progress
from rffm.sentinel import array_record, file_record, require_intact, upstream, write_sentinel

CACHED_SPLITS = ("train", "val")
DISK_HEADROOM = 1.1


def hidden_file(split: str) -> str:
    return f"{split}.hidden.bf16"


def output_names() -> list[str]:
    """Every file a cache directory holds besides its sentinel."""
    names = ["meta.json"]
    for split in CACHED_SPLITS:
        names += [hidden_file(split), f"{split}.labels.npy", f"{split}.snr.npy"]
    return names


def to_bf16_bits(hidden: torch.Tensor) -> np.ndarray:
    """FP32 tensor -> raw BF16 bits as uint16 (numpy has no bfloat16)."""
    return hidden.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def from_bf16_bits(bits: np.ndarray) -> torch.Tensor:
    """Raw BF16 bits -> FP32 tensor."""
    return torch.from_numpy(np.ascontiguousarray(bits).view(np.int16)).view(torch.bfloat16).float()


def human_bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if count < 1024 or unit == "TiB":
            return f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"


def check_disk_budget(directory: Path, needed: int, headroom: float = DISK_HEADROOM) -> None:
    """Refuse to start unless the scratch filesystem has headroom x the cache size free."""
    directory.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(directory).free
    if free < headroom * needed:
        raise ConfigError(
            f"not enough free space for the hidden-state cache in {directory}: need {headroom}x "
            f"{needed} bytes ({human_bytes(needed)}) = {int(headroom * needed)} bytes ({human_bytes(headroom * needed)}), "
            f"free {free} bytes ({human_bytes(free)}). Fix: free space, or point `scratch` (or "
            "--hidden-state-cache-directory) at a larger local disk."
        )


def build(
    dataset_dir: str | Path,
    backbone_dir: str | Path,
    out_dir: str | Path,
    provenance_path: str | Path,
    batch_size: int = 256,
    full_hash: bool = False,
) -> Path:
    """Run the frozen backbone once over train and val and store BF16 hidden states."""
    dataset_dir, backbone_dir, out_dir = Path(dataset_dir), Path(backbone_dir), Path(out_dir)
    started = provenance.start()
    files = [f"{split}.h5" for split in CACHED_SPLITS]
    dataset_sentinel = require_intact(dataset_dir / "sentinel.json", files, "build_cache")
    backbone_sentinel = require_intact(backbone_dir / "sentinel.json", ["backbone.pt"], "build_cache")
    model = backbone.load(backbone_dir / "backbone.pt")
    arch = model.arch
    counts = {split: split_attrs(dataset_dir / f"{split}.h5")["count"] for split in CACHED_SPLITS}
    check_disk_budget(out_dir, sum(counts.values()) * arch.tokens * arch.dim * 2)
    progress = Progress("build_cache", total=sum(counts.values()), unit="example")
    outputs: dict[str, Any] = {}
    for split in CACHED_SPLITS:
        shape = (counts[split], arch.tokens, arch.dim)
        path = out_dir / hidden_file(split)
        stored = np.memmap(path, dtype=np.uint16, mode="w+", shape=shape)
        with torch.no_grad():
            for start, iq in iter_iq_batches(dataset_dir / f"{split}.h5", batch_size):
                stored[start : start + len(iq)] = to_bf16_bits(model(torch.from_numpy(iq)))
                progress.update(len(iq))
        stored.flush()
        del stored
        arrays = read_split(dataset_dir / f"{split}.h5")
        np.save(out_dir / f"{split}.labels.npy", arrays["label"])
        np.save(out_dir / f"{split}.snr.npy", arrays["snr_db"])
        outputs[hidden_file(split)] = array_record(path, shape, "bfloat16", full_hash=full_hash)
        outputs[f"{split}.labels.npy"] = file_record(out_dir / f"{split}.labels.npy")
        outputs[f"{split}.snr.npy"] = file_record(out_dir / f"{split}.snr.npy")
    progress.close()
    meta = {
        "backbone_fingerprint": model.fingerprint,
        "classes": dataset_sentinel["dataset"]["classes"],
        "dtype": "bfloat16",
        "shapes": {split: [counts[split], arch.tokens, arch.dim] for split in CACHED_SPLITS},
    }
    atomic_write_json(out_dir / "meta.json", meta)
    outputs["meta.json"] = file_record(out_dir / "meta.json")
    inputs = {
        "dataset": upstream(dataset_dir / "sentinel.json", out_dir),
        "backbone": upstream(backbone_dir / "sentinel.json", out_dir),
    }
    # results-tree paths are meaningless from scratch; record the digests only
    for ref in inputs.values():
        ref["path"] = None
    provenance.finish(provenance_path, "build_cache", started, extra={"batch_size": batch_size})
    key = {"dataset": dataset_sentinel["key"]["dataset"], "backbone": backbone_sentinel["key"]["backbone"]}
    extra = {"backbone_fingerprint": model.fingerprint}
    # batch size is an execution detail: outputs are identical whatever it is, so it is not a param
    return write_sentinel(out_dir, "build_cache", key, outputs, inputs, {}, "cache", extra)


class CacheSplit:
    """Read side of one cached split: batched gathers of FP32 hidden states."""

    def __init__(self, cache_dir: Path, split: str, meta: dict[str, Any]):
        self.shape = tuple(meta["shapes"][split])
        self.hidden = np.memmap(cache_dir / hidden_file(split), dtype=np.uint16, mode="r", shape=self.shape)
        self.labels = np.load(cache_dir / f"{split}.labels.npy")
        self.snr_db = np.load(cache_dir / f"{split}.snr.npy")

    def __len__(self) -> int:
        return self.shape[0]

    def gather(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """FP32 hidden states and labels for the given rows (read in sorted order)."""
        rows = np.sort(rows)
        return from_bf16_bits(self.hidden[rows]), torch.from_numpy(self.labels[rows])


def open_cache(cache_dir: str | Path, consumer: str) -> tuple[dict[str, CacheSplit], dict[str, Any]]:
    """Check a cache against its sentinel and open its splits for reading."""
    cache_dir = Path(cache_dir)
    sentinel = require_intact(cache_dir / "sentinel.json", output_names(), consumer)
    meta = read_json(cache_dir / "meta.json")
    if meta["backbone_fingerprint"] != sentinel["backbone_fingerprint"]:
        raise IntegrityError(f"{cache_dir}/meta.json: backbone fingerprint disagrees with the sentinel")
    return {split: CacheSplit(cache_dir, split, meta) for split in CACHED_SPLITS}, meta
