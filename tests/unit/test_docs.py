"""The documentation's relative links resolve: every linked file exists and every #anchor names a heading."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
TOPICAL = sorted([*ROOT.glob("config/*.md"), *ROOT.glob("profiles/*.md"), *ROOT.glob("workflow/docs/*.md")])
DOCS = [ROOT / "README.md", *TOPICAL]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(document: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+\s+(.*)$", document.read_text(), flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


@pytest.mark.parametrize("document", DOCS, ids=lambda path: str(path.relative_to(ROOT)))
def test_relative_links_resolve(document: Path):
    broken = []
    for target in LINK.findall(document.read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        path, _, anchor = target.partition("#")
        linked = (document.parent / path).resolve() if path else document
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, broken


def test_every_document_is_reachable_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    for document in TOPICAL:
        assert str(document.relative_to(ROOT)) in readme, f"{document} is not linked from README.md"
