"""What a backbone is asked for, as config facts (no torch): its input layouts, tap forms and keep options.

rffm.model.encoder applies them; the cache planner (rffm.data.cache_plan) sizes caches from them while
Snakemake plans, without importing torch.
"""

from __future__ import annotations

import re
from typing import Any

from rffm.backbone_kinds import BUILT_HERE
from rffm.errors import ConfigError

LAYOUTS = {"channels": "[B, 2, L]", "samples": "[B, L, 2]", "antenna": "[B, 2, 1, L]", "complex": "[B, L] complex64"}
FORMS = {"tokens": "[B, T, D]", "channels": "[B, D, T]", "pooled": "[B, D]"}
KEEP = re.compile(r"^(all|prefix|mean|prefix\+mean|every:([1-9][0-9]*))$")


def spec_for(backbone: dict[str, Any]) -> dict[str, Any]:
    """What build_cache does with a backbone (a cache param, part of the cache's identity): adapter, taps, keep."""
    adapter = {"layout": "channels", "normalize": "none", **backbone.get("adapter", {})}
    tap_config = {"form": "tokens", "prefix": 0, **backbone.get("taps", {})}
    return {"adapter": adapter, "taps": tap_config, "keep": backbone.get("keep", "all")}


def kept_count(tokens: int, prefix: int, keep: str) -> int:
    """Tokens a tap of `tokens` tokens (the first `prefix` of them prefix tokens) keeps under a keep option."""
    match = KEEP.match(keep)
    if match is None:
        raise ConfigError(f"keep {keep!r}: not one of all, prefix, mean, prefix+mean, every:K")
    body = tokens - prefix
    if keep == "all":
        return tokens
    if keep == "prefix":
        return prefix
    if keep == "mean":
        return 1
    if keep == "prefix+mean":
        return prefix + 1
    return prefix + -(-body // int(match.group(2)))  # every k-th of the body, after the prefix tokens


def keep_options(prefix: int, configured: str) -> list[str]:
    """The keep options worth printing next to each other for a tap layout (the configured one included)."""
    options = ["all", *(["prefix"] if prefix else []), "mean", *(["prefix+mean"] if prefix else []), "every:2", "every:4", "every:8"]
    return options if configured in options else [*options, configured]


def tap_names(tap_config: dict[str, Any], count: int) -> list[str]:
    """How `count` taps are named in records and messages: module names, or output indices (`tap_config`: spec_for's `taps`)."""
    if tap_config.get("modules"):
        return list(tap_config["modules"])
    select = tap_config.get("select")
    return [f"output {select[i]}" if select else f"output {i}" for i in range(count)]


def declared_names(backbone: dict[str, Any]) -> list[str] | None:
    """The names its cache will give a backbone's taps, where the config alone says them (None: only a probe can tell)."""
    tap_config = spec_for(backbone)["taps"]
    if tap_config.get("modules"):
        return list(tap_config["modules"])
    if tap_config.get("method"):
        return None
    if tap_config.get("select"):
        return tap_names(tap_config, len(tap_config["select"]))
    if backbone["source"] in BUILT_HERE:
        return tap_names(tap_config, int(backbone.get("arch", {}).get("output_layers", 1)))
    return None


def row_shape(tap_shapes: list[tuple[int, int]]) -> list[int]:
    """A cache row's shape: [T, D] (one tap), [k, T, D] (k taps of one shape) or [F] (taps of differing shapes)."""
    if len(tap_shapes) == 1:
        return list(tap_shapes[0])
    if len(set(tap_shapes)) == 1:
        return [len(tap_shapes), *tap_shapes[0]]
    return [sum(tokens * dim for tokens, dim in tap_shapes)]
