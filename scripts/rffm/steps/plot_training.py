"""plot_training: training curves and selection evidence, read from the epoch and selection sentinels (validation data only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rffm.records.layout import SELECTION_EVIDENCE, SENTINEL_NAME, TRAINING_CURVES
from rffm.records.sentinel import epoch_metrics
from rffm.records.step import Step
from rffm.report.png import plt, save_png

RULE = "plot_training"
FIGURES = (TRAINING_CURVES, SELECTION_EVIDENCE)


def training_curves(epochs: list[dict[str, Any]], path: str | Path, title: str, selected_epoch: int | None = None) -> None:
    """Loss and accuracy per epoch, train vs validation, with the selected epoch marked."""
    x = [m["epoch"] for m in epochs]
    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in ((loss_ax, "loss", "cross-entropy loss"), (acc_ax, "accuracy", "accuracy")):
        ax.plot(x, [m[f"train_{key}"] for m in epochs], "-o", color="tab:blue", ms=3, label="train")
        ax.plot(x, [m[f"val_{key}"] for m in epochs], "-s", color="tab:orange", ms=3, label="validation")
        if selected_epoch is not None:
            ax.axvline(selected_epoch, color="tab:green", ls="--", lw=1.2, label=f"selected (epoch {selected_epoch})")
        ax.set(xlabel="epoch", ylabel=label)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    acc_ax.set_ylim(0, 1.02)
    fig.suptitle(title)
    save_png(fig, path)


def selection_evidence(selection: dict[str, Any], path: str | Path, title: str) -> None:
    """The selection metric of every candidate epoch, the chosen one highlighted with the rule that chose it."""
    metric, chosen = selection["metric"], selection["epoch"]
    epochs = [c["epoch"] for c in selection["candidates"]]
    values = [c[metric] for c in selection["candidates"]]
    best = max(values) if selection["mode"] == "max" else min(values)
    tied = [e for e, v in zip(epochs, values, strict=True) if v == best and e != chosen]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(epochs, values, "-o", color="lightsteelblue", mec="steelblue", ms=6, label="candidate epochs")
    if tied:
        ax.plot(tied, [best] * len(tied), "o", color="tab:olive", ms=9, label="tied, later epoch")
    ax.plot([chosen], [selection["value"]], "o", color="tab:green", ms=11, label=f"selected: epoch {chosen}")
    ax.axhline(selection["value"], color="tab:green", ls="--", lw=1)
    for epoch, value in zip(epochs, values, strict=True):
        ax.annotate(f"{value:.3f}", (epoch, value), textcoords="offset points", xytext=(0, 8), ha="center", fontsize=7)
    word = "highest" if selection["mode"] == "max" else "lowest"
    why = f"selected epoch {chosen}: {word} {metric} ({selection['value']:.4f}) of {len(values)} epochs"
    why += f"; {len(tied) + 1} epochs tie, the earliest wins" if tied else "; ties would go to the earliest"
    ax.set(xlabel="epoch", ylabel=f"{metric} (validation split)", title=f"{title}\n{why}")
    ax.set_xticks(epochs)
    # zoom on the candidates' range: the differences between epochs are what the reader compares
    low, high = min(values), max(values)
    pad = max(0.01, 0.15 * (high - low))
    ax.set_ylim(low - pad, high + 2 * pad)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right" if selection["mode"] == "max" else "upper right")
    save_png(fig, path)


def sweep_evidence(selection: dict[str, Any], path: str | Path, title: str) -> None:
    """A sweep's selection: the validation metric of every (member, epoch) as a heatmap, the chosen cell boxed."""
    metric, candidates = selection["metric"], selection["candidates"]
    members = list(dict.fromkeys(c["member"] for c in candidates))  # grid order, as selection recorded them
    epochs = sorted({c["epoch"] for c in candidates})
    grid = [[next(c[metric] for c in candidates if c["member"] == m and c["epoch"] == e) for e in epochs] for m in members]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.0 + 0.7 * len(epochs)), max(3.0, 1.2 + 0.45 * len(members))))
    image = ax.imshow(grid, aspect="auto", cmap="viridis" if selection["mode"] == "max" else "viridis_r")
    fig.colorbar(image, ax=ax, label=f"{metric} (validation split)")
    middle = (min(map(min, grid)) + max(map(max, grid))) / 2
    for row, values in enumerate(grid):
        for column, value in enumerate(values):  # dark text on the bright half of the colour map
            bright = (value > middle) == (selection["mode"] == "max")
            ax.text(column, row, f"{value:.3f}", ha="center", va="center", fontsize=7, color="black" if bright else "white")
    row, column = members.index(selection["member"]), epochs.index(selection["epoch"])
    ax.add_patch(plt.Rectangle((column - 0.5, row - 0.5), 1, 1, fill=False, ec="red", lw=2.5))
    ax.set_xticks(range(len(epochs)), [str(e) for e in epochs])
    ax.set_yticks(range(len(members)), members, fontsize=7)
    word = "highest" if selection["mode"] == "max" else "lowest"
    why = f"selected {selection['member']} @ epoch {selection['epoch']}: {word} {metric} ({selection['value']:.4f})"
    ax.set(xlabel="epoch", ylabel="sweep member", title=f"{title}\n{why}; ties: earliest epoch, then grid order")
    save_png(fig, path)


def run(run_name: str, epoch_dirs: list[str | Path], selection_dir: str | Path, out_dir: str | Path) -> Path:
    """Both figures of a run, from its epoch and selection sentinels (of a sweep: the chosen member's curves and the heatmap)."""
    selection_dir = Path(selection_dir)
    with Step(RULE, out_dir, key={"run": run_name}, params={"run": run_name}) as step:
        selection = step.consume("selection", selection_dir / SENTINEL_NAME)["selection"]
        epochs = []
        for directory in map(Path, epoch_dirs):  # runs/<run>/epochs/<k>
            body = step.consume(f"epoch_{directory.name}", directory / SENTINEL_NAME)
            epochs.append(epoch_metrics(body, selection.get("member")))
        epochs.sort(key=lambda m: m["epoch"])
        member = f" ({selection['member']})" if "member" in selection else ""
        training_curves(epochs, step.out_dir / FIGURES[0], f"{run_name}{member}: training curves", selection["epoch"])
        if "member" in selection:
            sweep_evidence(selection, step.out_dir / FIGURES[1], f"{run_name}: sweep selection")
        else:
            selection_evidence(selection, step.out_dir / FIGURES[1], f"{run_name}: checkpoint selection")
        for name in FIGURES:
            step.output(name)
    return step.sentinel
