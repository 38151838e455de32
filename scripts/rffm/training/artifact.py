"""A published artifact loaded back from the results store, checked against its sha256: a head, or a reference CNN."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch

from rffm.errors import IntegrityError
from rffm.model import cnn
from rffm.model import head as head_model
from rffm.model.head import AttentionPoolHead
from rffm.records.files import sha256_bytes
from rffm.records.rebuild import rebuild_command
from rffm.records.store import Store


def load_head(
    store: Store, artifact: dict[str, Any], rule: str = "qualify", selection: str | Path | None = None
) -> tuple[AttentionPoolHead, dict[str, Any]]:
    """The head and its metadata from a selection's artifact {key, sha256}; `rule` names who refuses a bad one, whose fix
    rebuilds the `selection` (sentinel) that recorded it."""
    where = store.where(artifact["key"])
    data = store.read(artifact["key"])
    if data is None:
        raise IntegrityError(f"{rule} refuses to start: {where}: the selected artifact is missing from the results store. Fix: restore it.")
    if sha256_bytes(data) != artifact["sha256"]:
        raise IntegrityError(f"{rule} refuses to start: {where}: sha256 differs from its name and the selection record. Fix: restore it.")
    try:
        blob = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        head = head_model.from_record(blob["head_config"])
        head.load_state_dict(blob["head"])
    except Exception as error:  # a hostile or foreign file: never unpickled with code, one line either way
        kind = type(error).__name__
        # its bytes are the ones recorded, so no copy of it can be restored: the selection recorded a file that is no head
        # (edited and resealed, or another rffm's format); selecting again publishes the chosen epoch's head
        again = rebuild_command(selection, remove=True) if selection else "select again (snakemake <the run's selection sentinel>)"
        raise IntegrityError(f"{rule} refuses to start: {where}: not an rffm head artifact ({kind}). Fix: {again}") from None
    return head.eval(), blob


def load_cnn(store: Store, selection: dict[str, Any], rule: str = "qualify_reference") -> tuple[cnn.RadioMLCNN, dict[str, Any]]:
    """The reference CNN and its metadata from a selection record {artifact_path, artifact_sha256}."""
    key, where = selection["artifact_path"], store.where(selection["artifact_path"])
    data = store.read(key)
    if data is None or sha256_bytes(data) != selection["artifact_sha256"]:
        raise IntegrityError(
            f"{rule} refuses to start: {where}: missing, or its sha256 differs from the selection record. Fix: restore it."
        )
    try:
        blob = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        model = cnn.RadioMLCNN(cnn.CNNConfig(**blob["cnn_config"]))
        model.load_state_dict(blob["state_dict"])
    except Exception as error:  # never unpickled with code; one line either way
        raise IntegrityError(f"{rule} refuses to start: {where}: not an rffm reference artifact ({type(error).__name__}).") from None
    return model.eval(), blob
