"""Issue 48: the suite's own claims can fail. Every strict xfail names the exception that proves its upstream defect
(`raises=`), and no assertion compares a value against a bound it cannot miss (`x >= 0`, `0 <= x <= 1`)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def suite() -> list[tuple[Path, ast.AST]]:
    return [(path, ast.parse(path.read_text(), str(path))) for path in sorted(TESTS.rglob("*.py"))]


def is_zero(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value == 0 and not isinstance(node.value, bool)


def loose_bounds(test: ast.AST) -> list[ast.Compare]:
    """The comparisons of an assert (its `and` terms) bounded below by a literal 0, not strictly: `x >= 0`, `0 <= x`."""
    terms = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
    found = []
    for term in terms:
        if not isinstance(term, ast.Compare):
            continue
        operands = [term.left, *term.comparators]
        for op, left, right in zip(term.ops, operands, operands[1:], strict=False):  # n operators between n + 1 operands
            if (isinstance(op, ast.GtE) and is_zero(right)) or (isinstance(op, ast.LtE) and is_zero(left)):
                found.append(term)
    return found


def test_no_assertion_is_bounded_by_a_zero_it_cannot_miss():
    found = [
        f"{path.relative_to(TESTS)}:{node.lineno}: {ast.unparse(node.test)}"
        for path, tree in suite()
        for node in ast.walk(tree)
        if isinstance(node, ast.Assert) and loose_bounds(node.test)
    ]
    assert found == [], "\n".join(found)


def xfail_calls(tree: ast.AST) -> list[ast.Call]:
    return [
        node for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "xfail"
    ]


def test_every_strict_xfail_names_the_exception_that_proves_it():
    calls = [(path, call) for path, tree in suite() for call in xfail_calls(tree)]
    assert calls, "the suite's strict xfails of upstream defects were not found"
    found = [
        f"{path.relative_to(TESTS)}:{call.lineno}: {ast.unparse(call)[:80]}"
        for path, call in calls
        if not any(k.arg == "raises" for k in call.keywords) or not any(k.arg == "strict" for k in call.keywords)
    ]
    assert found == [], "\n".join(found)


def test_the_scan_finds_what_it_is_for():
    """The two scans on the kinds they refuse and the kinds they let pass."""
    refused = ast.parse("assert x >= 0\nassert 0 <= acc <= 1\nassert y and len(z) >= 0\n")
    kept = ast.parse("assert x > 0\nassert 0 < acc <= 1\nassert n >= 1\nassert a - b >= 0.25 - 0.1\n")
    assert [bool(loose_bounds(n.test)) for n in refused.body] == [True, True, True]
    assert [bool(loose_bounds(n.test)) for n in kept.body] == [False, False, False, False]
    [loose] = xfail_calls(ast.parse("pytest.mark.xfail(strict=True, reason='r')"))
    [named] = xfail_calls(ast.parse("pytest.mark.xfail(strict=True, raises=AssertionError, reason='r')"))
    assert [k.arg for k in loose.keywords] == ["strict", "reason"] and "raises" in [k.arg for k in named.keywords]
