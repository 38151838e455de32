"""The package's import graph: every folder imports only the floors below it, and no modules import each other in a circle."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "scripts" / "rffm"

# Floors from the ground up (workflow/docs/development.md): a module imports only its own folder or a lower floor.
FLOORS = {
    "errors": 0,
    "backbone_kinds": 0,
    "rffm": 0,  # the package's face (__init__: the version)
    "records": 1,
    "runtime": 2,
    "report": 2,
    "model": 3,
    "data": 4,
    "training": 5,
    "config": 5,
    "ops": 6,
    "cloud": 7,
    "plan": 8,
    "steps": 9,
    "bench": 10,
    "cli": 11,
    "__main__": 12,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """The rffm modules a file imports, at any depth of its code (lazy imports count)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "rffm":
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "rffm")
    return found


def graph() -> dict[str, set[str]]:
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {name: {target for target in imports(path) if target in modules and target != name} for name, path in modules.items()}


def floor(module: str) -> int:
    parts = module.split(".")
    return FLOORS[parts[1] if len(parts) > 1 else "rffm"]


def test_every_folder_is_on_a_known_floor() -> None:
    assert {module.split(".")[1] for module in graph() if "." in module} <= set(FLOORS)


def test_no_import_runs_back_up() -> None:
    upward = [
        f"{source} -> {target}"
        for source, targets in graph().items()
        for target in targets
        if floor(target) > floor(source) and target != "rffm"
    ]
    assert upward == []


def test_no_modules_import_each_other_in_a_circle() -> None:
    edges, state, circles = graph(), {}, []

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(edges[module]):
            if target == "rffm" or target in {m for m in edges if m.startswith(f"{module}.")}:
                continue  # a package's face importing its own modules is no circle
            if state.get(target) == "open":
                circles.append(" -> ".join(path[path.index(target) :] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[module] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert circles == []
