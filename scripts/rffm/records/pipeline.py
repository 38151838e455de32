"""The pipeline's steps, one row each: the rule, its code, its `rffm <rule>` options and its part in the
ledger's policy. Every list of steps (the workflow's code digests, the ledger's, the CLI's verbs, the manifest's) comes from here."""

from __future__ import annotations

from dataclasses import dataclass

from rffm.backbone_kinds import BUILT_HERE, IMPORTED
from rffm.records.layout import MANIFEST_NAME, MODEL_CARD


@dataclass(frozen=True)
class Rule:
    """One rule of the workflow (records/step.Step is one run of it): it runs `rffm <rule>`, whose code is
    rffm.steps.<rule>, with the options `flags` names."""

    rule: str
    help: str
    flags: tuple[str, ...]  # what the rule's shell string passes besides --spec, --threads, --device (rffm.cli.steps)
    spec: str = ""  # the config section one entry of which is its --spec ("": no spec)
    torch: bool = False  # a heavy step: sets up torch threads and its device (--threads, --device)
    selection: bool = False  # its code decides a run's selected artifact (a qualified run is frozen on it)
    reference: bool = False  # its code decides an end-to-end reference's selected artifact
    backbone_sources: tuple[str, ...] = ()  # the backbone sources it builds (one such step per backbone)
    prints: tuple[str, str] = ()  # (what, file): a file beside its sentinel it names when done
    consumed_as: str = ""  # the role its folder has for the qualification that reads its provenance (a manifest step)

    @property
    def module(self) -> str:
        """The module whose code (and what it imports) the step runs: its code digest."""
        return f"steps.{self.rule}"


DIRS = ("--dataset-dir", "--backbone-dir", "--cache-record-dir")
BACKBONE_PASS = ("--batch-size", "--batch-profile")
CACHE = (*BACKBONE_PASS, "--disk-headroom", "--scratch", "--store")

STEPS = (
    Rule(
        "stage_dataset",
        "Stage a dataset into canonical HDF5 splits.",
        ("--source-root", "--out-dir"),
        "datasets",
        selection=True,
        reference=True,
        consumed_as="dataset",
    ),
    Rule(
        "pretrain_backbone",
        "Build a backbone: self-supervised pretraining or random init.",
        ("--dataset-dir", "--out-dir"),
        "backbones",
        torch=True,
        selection=True,
        backbone_sources=BUILT_HERE,
        consumed_as="backbone",
    ),
    Rule(
        "import_backbone",
        "Import a user backbone (checkpoint, python entry point + weights, torch.export program) after checking its sha256.",
        ("--source-root", "--out-dir"),
        "backbones",
        selection=True,
        backbone_sources=IMPORTED,
        consumed_as="backbone",
    ),
    Rule(
        "build_cache",
        "Build the hidden-state cache (node-local) and its record.",
        ("--dataset-dir", "--backbone-dir", "--out-dir", *CACHE, "--profile-runs", "--profile-batches", "--encoder"),
        torch=True,
        selection=True,
        consumed_as="cache",
    ),
    Rule(
        "train_epoch",
        "Train one epoch of the head from cached hidden states.",
        ("--cache-record-dir", "--out-dir", "--epoch", "--previous-dir", *CACHE, "--memo-store", "--profile-batches", "--members"),
        "runs",
        torch=True,
        selection=True,
        consumed_as="epochs",
    ),
    Rule(
        "select_checkpoint",
        "Select the best epoch into an immutable artifact.",
        ("--epoch-dirs", "--store", "--out-dir"),
        "runs",
        selection=True,
        consumed_as="selection",
    ),
    Rule(
        "qualify",
        "Evaluate the selected artifact once on the test split; write the run manifest.",
        ("--selection-dir", *DIRS, "--epoch-dirs", "--source", "--launch-profile", *BACKBONE_PASS, "--store", "--out-dir"),
        "runs",
        torch=True,
        prints=("run manifest", MANIFEST_NAME),
    ),
    Rule(
        "plot_training",
        "Plot training curves and selection evidence from sentinels.",
        ("--run", "--epoch-dirs", "--selection-dir", "--out-dir"),
    ),
    Rule("summarize_manifest", "Render a run manifest as an HTML table.", ("--run", "--qualification-dir", "--out-dir")),
    Rule(
        "summarize_profiling",
        "Summarize a profiled run's cache lifecycle timings.",
        ("--run", "--cache-record-dir", "--epoch-dirs", "--profile-dir", "--store"),
    ),
    Rule("plot_cache_lifecycle", "Plot a profiled run's cache lifecycle summary.", ("--run", "--summary", "--out-dir")),
    Rule(
        "train_reference",
        "Train an end-to-end reference CNN from scratch; select its epoch on val into an immutable artifact.",
        ("--dataset-dir", "--store", "--out-dir", "--members"),
        "references",
        torch=True,
        reference=True,
        consumed_as="selection",
    ),
    Rule(
        "qualify_reference",
        "Evaluate an end-to-end reference's selected CNN once on the test split; write its manifest.",
        ("--selection-dir", "--dataset-dir", "--source", "--store", "--out-dir"),
        "references",
        torch=True,
        prints=("run manifest", MANIFEST_NAME),
    ),
    Rule(
        "plot_comparison",
        "Plot the floor | frozen backbone | end-to-end comparison of the qualified runs.",
        ("--results-dir", "--runs", "--out-dir"),
    ),
    Rule(
        "export",
        "Export the qualified classifier (.pt2, ONNX, safetensors, model card), checked on the validation split.",
        ("--qualification-dir", "--selection-dir", "--dataset-dir", "--backbone-dir", "--cache-record-dir", "--store", "--out-dir"),
        "runs",
        torch=True,
        prints=("exported classifier", MODEL_CARD),
    ),
)

BY_RULE = {step.rule: step for step in STEPS}
RULES = tuple(BY_RULE)

# The ledger's policy: whose code a qualified run's (or reference's) selected artifact depends on.
SELECTION_STEPS = tuple(step.rule for step in STEPS if step.selection)
BACKBONE_STEPS = tuple(step.rule for step in STEPS if step.backbone_sources)
REFERENCE_STEPS = tuple(step.rule for step in STEPS if step.reference)


def backbone_step(source: str) -> str:
    """The rule that builds a backbone of this source (pretrain_backbone or import_backbone)."""
    return next(step.rule for step in STEPS if source in step.backbone_sources)
