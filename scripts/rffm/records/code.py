"""Code digests: which rffm code a step runs, so that editing it reruns that step (a tracked param)."""

from __future__ import annotations

import ast
import functools
import hashlib
from collections.abc import Iterator
from pathlib import Path

from rffm.records.files import canonical_json

PACKAGE_DIR = Path(__file__).resolve().parents[1]


def _module_file(name: str) -> Path | None:
    relative = name.split(".")[1:]
    candidate = PACKAGE_DIR.joinpath(*relative).with_suffix(".py") if relative else PACKAGE_DIR / "__init__.py"
    if candidate.exists():
        return candidate
    package = PACKAGE_DIR.joinpath(*relative) / "__init__.py"
    return package if package.exists() else None


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement of a body, nested ones too (an import is a statement: expressions need no walk)."""
    for node in body:
        yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            for child in getattr(node, field, ()):
                nested = isinstance(child, ast.excepthandler | ast.match_case)  # a clause holding statements
                yield from _statements(child.body if nested else [child])


def _rffm_imports(name: str, source: str) -> set[str]:
    found = set()
    package = name if _module_file(name) and _module_file(name).name == "__init__.py" else name.rpartition(".")[0]
    for node in _statements(ast.parse(source).body):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "rffm")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            if base.split(".")[0] != "rffm":
                continue
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {module for module in found if _module_file(module)}


def code_closure(module: str) -> dict[str, str]:
    """sha256 of the module's source and of every rffm module it imports, transitively."""
    seen: dict[str, str] = {}
    pending = [module if module.startswith("rffm") else f"rffm.{module}"]
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        path = _module_file(name)
        if path is None:
            raise ValueError(f"no rffm module named {name}")
        stat = path.stat()
        seen[name], imports = _module_digest(name, str(path), stat.st_mtime_ns, stat.st_size)
        pending.extend(imports - seen.keys())
    return dict(sorted(seen.items()))


@functools.lru_cache(maxsize=256)
def _module_digest(name: str, path: str, mtime_ns: int, size: int) -> tuple[str, frozenset[str]]:
    """sha256 and rffm imports of one module file, cached per (path, mtime, size): parsing is the slow part."""
    source = Path(path).read_text()
    return hashlib.sha256(source.encode()).hexdigest(), frozenset(_rffm_imports(name, source))


def code_digest(module: str) -> str:
    """One digest of the code a step runs: its module and the rffm modules it imports."""
    return hashlib.sha256(canonical_json(code_closure(module)).encode()).hexdigest()
