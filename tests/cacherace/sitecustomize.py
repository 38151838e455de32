"""Races on the node-local hidden-state cache, for tests/workflow/test_fixes_cache_race_workflow.py; loaded only through
PYTHONPATH, like tests/killpoint/sitecustomize.py.

In a co-located group job (cache.colocate: per-cache) the epoch jobs of several runs share one node's
`<scratch>/<dataset>__<backbone>/`, so another job may rebuild or remove it between an epoch's `ensure()` (the cache
is there, of this recipe) and its `open_cache()`. RFFM_CACHE_RACE='{"<run>": "<race>", ...}' makes the
`rffm train_epoch` process of each named run do what that other job would, right after `ensure()` returns: "missing"
(the cache's sentinel removed), "recipe" (a cache of another recipe in its place) or "bytes" (one of its files removed,
as a replacement's rmtree leaves it). "upstream" acts right before `ensure()`: this node has no cache, and the
backbone the cache record names is rebuilt meanwhile (pretrain_backbone run for real with the backbone spec
RFFM_CACHE_RACE_BACKBONE, as another invocation with other settings would).
"""

import json
import os
import shutil
import sys
from pathlib import Path

_races = json.loads(os.environ.get("RFFM_CACHE_RACE", "{}"))
if _races and Path(sys.argv[0]).name == "rffm" and sys.argv[1:2] == ["train_epoch"]:
    from rffm.data import cache_local
    from rffm.data.cache_format import SENTINEL_LABEL
    from rffm.records.layout import SENTINEL_NAME, hidden_file
    from rffm.records.seal import seal, unseal
    from rffm.steps import pretrain_backbone

    _race = _races.get(json.loads(sys.argv[sys.argv.index("--spec") + 1])["run"])
    _ensure = cache_local.ensure

    def _raced(record, record_dir, scratch, *args, **kwargs):
        if _race == "upstream":
            shutil.rmtree(cache_local.local_dir(scratch, record["key"]), ignore_errors=True)
            dataset, backbone = ((record_dir / record["inputs"][role]["path"]).parent for role in ("dataset", "backbone"))
            pretrain_backbone.run(json.loads(os.environ["RFFM_CACHE_RACE_BACKBONE"]), dataset, backbone)
        directory, built = _ensure(record, record_dir, scratch, *args, **kwargs)
        sentinel = directory / SENTINEL_NAME
        if _race == "missing":
            sentinel.unlink()
        elif _race == "recipe":
            body = unseal(sentinel, sentinel.read_bytes(), SENTINEL_LABEL)
            sentinel.write_bytes(seal({**body, "recipe": "0" * 64}))
        elif _race == "bytes":
            (directory / hidden_file("val")).unlink()
        return directory, built

    cache_local.ensure = _raced
