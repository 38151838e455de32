"""Report figures and tables, and `snakemake --report` on the tiny workflow."""

from __future__ import annotations

import base64
import json
import re
import zipfile
from pathlib import Path

import jinja2
import pytest

from conftest import snakemake, tiny_config, write_config
from rffm import config as rffm_config
from rffm.errors import DataError
from rffm.ops.verify import verify_tree
from rffm.records.files import read_json
from rffm.records.sentinel import read_sentinel
from rffm.records.step import Step
from rffm.steps import plot_cache_lifecycle, plot_training, summarize_manifest

PNG = b"\x89PNG\r\n\x1a\n"
RUN = "results/runs/base"
# every figure and table of a run in the report: (path under the run, name in the report)
FIGURES = [
    "report/validation/training_curves.png",
    "report/validation/selection_evidence.png",
    "qualification/accuracy_vs_snr.png",
    "qualification/confusion_matrix.png",
    "qualification/metrics.json",
    "report/qualification/manifest_summary.html",
    "report/profiling/cache_lifecycle.png",  # the tiny run is profiled (config/examples/tiny.yaml)
]
SUMMARY = {
    "schema_version": 1,
    "run": "base",
    "batch_count": 4,
    "phases": {
        "cache_build": {"total_s": 2.5, "count": 1},
        "read_batch": {"total_s": 0.41, "count": 4},
        "backbone_forward": {"total_s": 1.73, "count": 4},
        "memmap_write": {"total_s": 0.12, "count": 4},
        "backpressure_wait": {"total_s": 0.0, "count": 0},
    },
    "traces": ["cache_build.json"],
}


def write_summary(directory: Path, summary: dict) -> Path:
    """A profiling summary vouched for by its sentinel, as summarize_profiling writes it."""
    with Step("summarize_profiling", directory, key={"run": "base"}, params={}) as step:
        (directory / "cache_lifecycle_summary.json").write_text(json.dumps(summary))
        step.output("cache_lifecycle_summary.json")
    return directory / "cache_lifecycle_summary.json"


def test_cache_lifecycle_chart_from_a_hand_written_summary(tmp_path: Path):
    summary_path = write_summary(tmp_path / "profiling", SUMMARY)
    plot_cache_lifecycle.run("base", summary_path, tmp_path / "a")
    plot_cache_lifecycle.run("base", summary_path, tmp_path / "b")
    figure = (tmp_path / "a" / plot_cache_lifecycle.FIGURE).read_bytes()
    assert figure.startswith(PNG) and len(figure) > 10_000
    assert figure == (tmp_path / "b" / plot_cache_lifecycle.FIGURE).read_bytes()  # deterministic bytes
    sentinel = read_sentinel(tmp_path / "a/sentinel.json")
    assert sentinel["stage"] == "plot_cache_lifecycle" and list(sentinel["outputs"]) == [plot_cache_lifecycle.FIGURE]
    assert sentinel["inputs"]["profiling_summary"]["path"] == "../profiling/sentinel.json"
    report = verify_tree(tmp_path)
    assert (report.checked, report.broken) == (3, [])


@pytest.mark.parametrize(
    "broken, field",
    [({"phases": {}}, "field 'phases'"), ({"phases": {"read": {"total_s": "1", "count": 2}}}, "phases.read must hold")],
)
def test_a_malformed_lifecycle_summary_names_the_file_and_field(tmp_path: Path, broken: dict, field: str):
    path = write_summary(tmp_path / "profiling", {**SUMMARY, **broken})
    with pytest.raises(DataError, match=re.escape(field)) as error:
        plot_cache_lifecycle.run("base", path, tmp_path / "out")
    assert str(path) in str(error.value)
    assert not (tmp_path / "out" / "sentinel.json").exists()


def test_validation_figures_are_deterministic_and_show_the_selection(finished_workdir: Path, tmp_path: Path):
    run = finished_workdir / RUN
    epoch_dirs = sorted((run / "epochs").iterdir())
    for out in ("a", "b"):
        plot_training.run("base", epoch_dirs, run / "selection", tmp_path / out)
    for name in plot_training.FIGURES:
        assert (tmp_path / "a" / name).read_bytes().startswith(PNG)
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
        assert (tmp_path / "a" / name).read_bytes() == (run / "report/validation" / name).read_bytes(), name
    assert (tmp_path / "a/sentinel.json").read_bytes() == (tmp_path / "b/sentinel.json").read_bytes()


def test_manifest_table_highlights_the_selected_epoch(finished_workdir: Path):
    manifest = read_json(finished_workdir / RUN / "qualification/run_manifest.json")
    page = (finished_workdir / RUN / "report/qualification/manifest_summary.html").read_text()
    assert page == summarize_manifest.manifest_html(manifest)
    selected = re.search(r"<tr class=sel><td>(\d+)</td>", page)
    assert selected and int(selected.group(1)) == manifest["selection"]["epoch"]
    assert manifest["selection"]["artifact_sha256"] in page
    assert f"<td>{manifest['qualification']['exposure_count']} distinct artifact(s)" in page
    assert page.count("<tr>") > 3 + len(manifest["dataset"]["classes"]) and "</html>" in page


@pytest.mark.workflow
def test_snakemake_report_contains_every_figure_of_the_run(workdir: Path, tmp_path: Path):
    snakemake(workdir, "--report", str(tmp_path / "report.zip"))
    with zipfile.ZipFile(tmp_path / "report.zip") as archive:
        raw = {Path(name).name: archive.read(name) for name in archive.namelist() if name.startswith("report/data/raw/")}
        page = archive.read("report/report.html").decode()
    for figure in FIGURES:
        name = Path(figure).name
        assert raw.get(name) == (workdir / RUN / figure).read_bytes(), f"{name} missing or different in report.zip"
    assert "rffm post-trains an RF signal classifier" in page and "selection by max" in page  # workflow description

    snakemake(workdir, "--report", str(tmp_path / "report.html"))
    page = (tmp_path / "report.html").read_text()
    for figure in FIGURES:
        name = Path(figure).name
        embedded = re.search(rf"filename={re.escape(name)};base64,([A-Za-z0-9+/=]+)", page)
        assert embedded, f"{name} not embedded in report.html"
        assert base64.b64decode(embedded.group(1)) == (workdir / RUN / figure).read_bytes(), name


ABSENT = "qualification (test split): absent, the run is not qualified yet"


def report_of(workdir: Path, archive_path: Path) -> tuple[list[tuple[str, bytes]], dict[str, str]]:
    """`snakemake --report <zip>`: its figures (file name, bytes), and each run's line of the workflow description."""
    snakemake(workdir, "--report", str(archive_path))
    with zipfile.ZipFile(archive_path) as archive:
        folder = archive_path.stem
        raw = [(Path(name).name, archive.read(name)) for name in archive.namelist() if name.startswith(f"{folder}/data/raw/")]
        page = archive.read(f"{folder}/report.html").decode()
    lines = dict(re.findall(r"<li><strong>(\w+)</strong>(.*?)</li>", page, re.S))
    return raw, lines


@pytest.mark.workflow
def test_the_report_of_a_run_only_validation_selected_has_its_validation_figures_and_no_qualification(
    selected_workdir: Path, tmp_path: Path
):
    """Issue 34 item 6: the state the README recommends for experimenting reports what it has, and says what is absent."""
    raw, lines = report_of(selected_workdir, tmp_path / "report.zip")
    assert sorted(raw) == sorted((Path(figure).name, (selected_workdir / RUN / figure).read_bytes()) for figure in FIGURES[:2])
    assert ABSENT in lines["base"] and "objective" in lines["base"] and "segment_contrastive" in lines["base"]


@pytest.mark.workflow
def test_the_report_of_a_qualified_and_a_selected_run_says_which_is_qualified(workdir: Path, tmp_path: Path):
    config = tiny_config()
    config["runs"]["extra"] = {**config["runs"]["base"], "train": {**config["runs"]["base"]["train"], "epochs": 1, "seed": 1}}
    config["runs"]["extra"].pop("profiling")
    write_config(workdir, config)
    snakemake(workdir, "validation_selection")  # extra: one epoch, its selection and validation figures
    raw, lines = report_of(workdir, tmp_path / "report.zip")
    base = {(Path(figure).name, (workdir / RUN / figure).read_bytes()) for figure in FIGURES}  # qualification's too
    extra = {(Path(figure).name, (workdir / "results/runs/extra" / figure).read_bytes()) for figure in FIGURES[:2]}
    assert sorted(raw) == sorted(base | extra)
    assert ABSENT in lines["extra"] and ABSENT not in lines["base"], lines


def test_workflow_description_names_each_runs_selection_rule_as_the_config_fills_it():
    """`metric: val_loss` without a mode is minimised: the report says so (the schema fills the mode in)."""
    config = tiny_config()
    config["runs"]["loss"] = {**config["runs"]["base"], "selection": {"metric": "val_loss"}}
    rffm_config.check(config)
    template = (Path(__file__).parents[2] / "workflow" / "report" / "workflow.rst").read_text()
    page = jinja2.Template(template).render(snakemake=type("S", (), {"config": config}))
    assert "selection by max ``val_accuracy``" in page
    assert "selection by min ``val_loss``" in page
    assert "objective ``segment_contrastive``" in page and "masked-patch" not in page  # the configured objective
