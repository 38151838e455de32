"""One run of a rule: what it consumed, what it wrote and where it ran; its sentinel is written last.

    with Step("train_epoch", out_dir, key={"run": run, "epoch": k}, params=options) as step:
        cache = step.consume("cache", cache_record / SENTINEL_NAME)
        ... write the outputs ...
        step.output("checkpoint.pt")
        step.facts["metrics"] = metrics

On entry the directory's old sentinel and the temporary files of a killed earlier attempt are
removed (nothing vouches for a directory while it changes). On a clean exit the provenance file
(host, times, device: the non-deterministic facts, linked to the sentinel; with the full sha256 of
each output the sentinel vouches for only in part) and then the sentinel
(only content: its bytes depend on nothing else) are written. An exception writes neither.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rffm.records import provenance
from rffm.records.code import code_digest
from rffm.records.files import atomic_write_bytes, remove_temporaries, sha256_file, sha256_json
from rffm.records.layout import PROVENANCE_NAME, SENTINEL_NAME
from rffm.records.seal import seal
from rffm.records.sentinel import SCHEMA_VERSION, file_record, require_intact, upstream

IDENTITY_FIELDS = ("schema_version", "stage", "key", "inputs", "params_sha256", "code_sha256")  # Step.identity()'s keys


class Step:
    """Context manager owning a step's consumed sentinels, outputs, provenance and sentinel."""

    def __init__(
        self,
        rule: str,
        out_dir: str | Path,
        *,
        key: dict[str, Any],
        params: Any,
        provenance_path: str | Path | None = None,
        code: str | None = None,
        threads: int | None = None,
    ):
        self.rule, self.out_dir, self.key, self.params = rule, Path(out_dir), key, params
        self.provenance_path = Path(provenance_path) if provenance_path else self.out_dir / PROVENANCE_NAME
        self.code = code or f"steps.{rule}"  # the module whose code (with its rffm imports) the sentinel vouches for
        self.inputs: dict[str, dict[str, Any]] = {}
        self.outputs: dict[str, dict[str, Any]] = {}
        self.facts: dict[str, Any] = {}  # deterministic content the sentinel carries (metrics, descriptions)
        self.details: dict[str, Any] = {}  # non-deterministic facts for the provenance file (timings, batch sizes)
        self.device: Any = None
        self.threads = threads  # the torch intra-op threads the step computes with, when the CLI fixed them (--threads)
        self.sentinel: Path | None = None
        self._provenance: dict[str, Any] | None = None

    def open(self) -> Step:
        """Start: clear the directory's old sentinel and a killed attempt's temporary files."""
        self.started = provenance.start()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / SENTINEL_NAME).unlink(missing_ok=True)
        remove_temporaries(self.out_dir)
        return self

    def child(self, out_dir: str | Path, params: Any) -> Step:
        """An opened step of the same rule and key in `out_dir` (a sweep member as its plain run), reading this step's
        cache on this step's device; the caller links its other inputs and closes it."""
        member = Step(self.rule, out_dir, key=dict(self.key), params=params, code=self.code, threads=self.threads).open()
        member.device = self.device
        member.inputs = {"cache": self.inputs["cache"]}
        return member

    def __enter__(self) -> Step:
        return self.open()

    def consume(self, role: str, sentinel_path: str | Path, files: list[str] = ()) -> dict[str, Any]:
        """Check an upstream sentinel (its links and the named files it vouches for), link it as input `role`, return it."""
        body = require_intact(sentinel_path, list(files), self.rule)
        self.inputs[role] = upstream(sentinel_path, self.out_dir)
        return body

    def output(self, name: str, record: dict[str, Any] | None = None) -> None:
        """Record an output file (default: its size and sha256) once it is written."""
        self.outputs[name] = record if record is not None else file_record(self.out_dir / name)

    def identity(self) -> dict[str, Any]:
        """What this run computed from: the sentinel without its outputs and facts."""
        return {
            "schema_version": SCHEMA_VERSION,
            "stage": self.rule,
            "key": self.key,
            "inputs": dict(sorted(self.inputs.items())),
            "params_sha256": sha256_json(self.params),
            "code_sha256": code_digest(self.code),
        }

    def thread_record(self) -> dict[str, int]:
        """The torch thread count this step computed with, when it fixed one (CPU float sums depend on it)."""
        return {"torch_threads": self.threads} if self.threads else {}

    def provenance_record(self) -> dict[str, Any]:
        """Where and how this run happened, fixed at the first call (a step that reports it in an output asks early)."""
        if self._provenance is None:
            self._provenance = provenance.describe(self.rule, self.started, device=self.device, extra=self.details)
        return self._provenance

    def close(self) -> Path:
        """Finish: write the provenance file, then the sentinel (last: it vouches for everything before it)."""
        sentinel = seal({**self.identity(), "outputs": dict(sorted(self.outputs.items())), **self.thread_record(), **self.facts})
        # outputs the sentinel vouches for only in part (JSON without non-deterministic keys): their full bytes
        full = {name: sha256_file(self.out_dir / name) for name, record in self.outputs.items() if "excluding" in record}
        provenance.write(self.provenance_path, {**self.provenance_record(), **({"outputs_sha256": full} if full else {})}, sentinel)
        self.sentinel = self.out_dir / SENTINEL_NAME
        atomic_write_bytes(self.sentinel, sentinel)
        return self.sentinel

    def __exit__(self, exc_type, exc, traceback) -> bool:
        if exc_type is None:
            self.close()
        return False
