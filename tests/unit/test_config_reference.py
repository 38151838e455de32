"""config/REFERENCE.md is generated from the schema and kept up to date."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conftest import REPO
from rffm.cli import main
from rffm.errors import ConfigError
from rffm.ops import config_reference as configdoc

TOY = {
    "$defs": {"count": {"type": "integer", "minimum": 1}, "name": {"type": "string", "description": "lower-case"}},
    "type": "object",
    "required": ["items"],
    "properties": {
        "root": {"type": "string", "default": "out", "description": "Where  outputs\n go."},
        "items": {
            "type": "object",
            "propertyNames": {"$ref": "#/$defs/name"},
            "additionalProperties": {
                "type": "object",
                "properties": {
                    "size": {"$ref": "#/$defs/count", "description": "How many."},
                    "kind": {"enum": ["a", "b"]},
                    "share": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                },
            },
        },
    },
}


def test_rows_follow_refs_named_maps_and_constraints():
    assert configdoc.rows(TOY) == [
        ("root", "string", "`out`", "Where outputs go."),
        ("items", "mapping (required)", "", ""),
        ("items.<name>", "mapping", "", "One entry per name; names: lower-case"),
        ("items.<name>.size", "integer ≥ 1", "", "How many."),
        ("items.<name>.kind", "one of `a`, `b`", "", ""),
        ("items.<name>.share", "number > 0, ≤ 1", "", ""),
    ]


def test_every_schema_key_is_in_the_reference():
    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
    keys = [row[0] for row in configdoc.rows(schema)]
    assert {"results", "runs.<name>.train.epochs", "runs.<name>.selection.metric", "datasets.<name>.synthetic.length"} <= set(keys)
    described = [row for row in configdoc.rows(schema) if not row[3]]
    assert len(described) <= 3, f"keys without a description: {described}"


def test_config_reference_is_up_to_date(capsys):
    code = main(["config_reference", "--check", str(REPO / "config/REFERENCE.md")])
    assert code == 0, capsys.readouterr().out + " (run `make docs`)"


def test_check_fails_and_write_repairs_a_stale_section(tmp_path: Path, capsys):
    document = tmp_path / "README.md"
    document.write_text(f"# Title\n\n{configdoc.BEGIN}\n| stale |\n{configdoc.END}\n\nafter\n")
    assert main(["config_reference", "--check", str(document)]) == 1
    assert "out of date" in capsys.readouterr().out
    assert main(["config_reference", "--write", str(document)]) == 0
    text = document.read_text()
    assert "| stale |" not in text and "`runs.<name>.train.lr`" in text and text.endswith("\n\nafter\n")
    assert main(["config_reference", "--check", str(document)]) == 0


def test_a_document_without_markers_is_a_clear_error(tmp_path: Path):
    document = tmp_path / "README.md"
    document.write_text("# no markers\n")
    with pytest.raises(ConfigError, match="no generated config-reference section"):
        configdoc.update(document)
