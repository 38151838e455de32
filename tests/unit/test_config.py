import yaml

from conftest import REPO, tiny_config
from rffm import config

SCHEMA = REPO / "workflow/schemas/config.schema.yaml"


def test_shipped_configs_are_valid():
    default = yaml.safe_load((REPO / "config/config.yaml").read_text())
    assert config.problems(default, SCHEMA) == []
    floor = yaml.safe_load((REPO / "config/examples/random_floor.yaml").read_text())
    merged = config.merge(default, floor)  # as Snakemake merges two --configfile: key by key
    assert config.problems(merged, SCHEMA) == []
    assert len(config.check(merged)["runs"]) == 18  # 3 pretraining x 3 head seeds of the frozen run and of the floor
    assert config.problems(tiny_config(), SCHEMA) == []


def test_each_problem_is_one_line_naming_the_key():
    bad = tiny_config()
    bad["runs"]["base"]["train"]["epochs"] = 0
    bad["datasets"]["tiny"]["colour"] = "red"
    bad["datasets"]["Bad__Name"] = bad["datasets"]["tiny"]
    problems = config.problems(bad, SCHEMA)
    assert any(p.startswith("runs.base.train.epochs: 0 is less than the minimum of 1") for p in problems)
    assert any(p.startswith("datasets.tiny: unknown key(s) 'colour'") for p in problems)
    assert any("datasets: name 'Bad__Name' is not allowed" in p for p in problems)
    assert all("\n" not in p for p in problems)


def test_references_are_checked_once_the_shape_is_right():
    bad = tiny_config()
    bad["backbones"]["mini"]["dataset"] = "elsewhere"
    bad["runs"]["base"]["backbone"] = "huge"
    assert config.problems(bad, SCHEMA) == [
        "backbones.mini.dataset: 'elsewhere' is not defined under datasets",
        "runs.base.backbone: 'huge' is not defined under backbones (defined: mini)",
    ]


def test_the_bring_your_own_backbone_examples_are_valid_with_the_default_config():
    default = yaml.safe_load((REPO / "config/config.yaml").read_text())
    for name in ("wavesfm_like", "spectrumfm_like", "exported_backbone"):
        example = yaml.safe_load((REPO / f"config/examples/{name}.yaml").read_text())
        merged = config.merge(default, example)
        assert config.problems(merged, SCHEMA) == [], name
        (backbone,) = example["backbones"].values()
        assert backbone["source"] in ("python", "export") and len(backbone["sha256"]) == 64
