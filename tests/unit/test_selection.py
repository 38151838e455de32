import pytest

from rffm.config import entry_defaults
from rffm.errors import ConfigError
from rffm.training.selection import choose


def metrics(values):
    return [{"epoch": e, "val_accuracy": v, "val_loss": 1 - v} for e, v in enumerate(values, start=1)]


def test_best_epoch_with_ties_to_the_earliest():
    assert choose(metrics([0.2, 0.5, 0.5, 0.4]), "val_accuracy", "max")["epoch"] == 2
    assert choose(metrics([0.2, 0.5, 0.5, 0.4]), "val_loss", "min")["epoch"] == 2
    assert choose(list(reversed(metrics([0.3, 0.3]))), "val_accuracy", "max")["epoch"] == 1


def test_unknown_metric_is_a_config_error():
    with pytest.raises(ConfigError, match="not an epoch metric"):
        choose(metrics([0.1]), "val_auc", "max")


def test_mode_defaults_to_the_metrics_direction():
    """The schema holds the rule: losses are minimized, everything else maximized, unless mode is given."""

    def selection(block: dict | None) -> dict:
        run = {"dataset": "d", "backbone": "b", "train": {}} | ({"selection": block} if block is not None else {})
        return entry_defaults("runs", run)["selection"]

    assert selection(None) == {"metric": "val_accuracy", "mode": "max"}
    assert selection({"metric": "val_loss"}) == {"metric": "val_loss", "mode": "min"}
    assert selection({"metric": "val_loss", "mode": "max"})["mode"] == "max"
