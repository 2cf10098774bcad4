"""The house rules of issue 28 that no linter checks: typed seams, short functions, no sys.path edits.

import-linter (layers, no cycles), vulture (dead code) and deptry (declared dependencies) run from
scripts/test.sh; these are the counts those tools do not keep.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("memoriesd", "memories_cli")
MAX_BARE_ANY = 40
MAX_LONG_FUNCTIONS = 2
LONG = 80


def _modules(*folders: str) -> Iterator[tuple[Path, ast.Module]]:
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path, ast.parse(path.read_text(encoding="utf-8"), str(path))


def _is_bare_any(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id == "Any"
    if isinstance(node, ast.Attribute):
        return node.attr == "Any"
    return isinstance(node, ast.Constant) and node.value == "Any"


def _annotations(tree: ast.Module) -> Iterator[ast.expr]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
                if arg is not None and arg.annotation is not None:
                    yield arg.annotation
            if node.returns is not None:
                yield node.returns
        elif isinstance(node, ast.AnnAssign):
            yield node.annotation


def test_the_daemon_has_at_most_forty_bare_any_annotations() -> None:
    # `dict[str, Any]` for protocol JSON is fine; a bare `Any` is a seam mypy cannot check.
    found = [
        f"{path.relative_to(ROOT)}:{ann.lineno}"
        for path, tree in _modules("memoriesd")
        for ann in _annotations(tree)
        if _is_bare_any(ann)
    ]
    assert len(found) <= MAX_BARE_ANY, f"{len(found)} bare Any annotations: {found}"


def test_at_most_two_product_functions_are_over_eighty_lines() -> None:
    long = [
        f"{path.relative_to(ROOT)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path, tree in _modules(*PRODUCT)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > LONG
    ]
    assert len(long) <= MAX_LONG_FUNCTIONS, long


def test_no_test_script_or_benchmark_edits_sys_path() -> None:
    folders = [name for name in ("tests", "scripts", "bench") if (ROOT / name).is_dir()]
    edits = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path, tree in _modules(*folders)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr == "path"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
        and _mutates(tree, node)
    ]
    assert edits == []


def _mutates(tree: ast.Module, target: ast.Attribute) -> bool:
    """True when `sys.path` is the object of insert/append/extend/assignment (reading it is fine)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.value is target:
            return node.func.attr in {"insert", "append", "extend", "remove", "pop", "clear"}
        if isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if t is target or (isinstance(t, ast.Subscript) and t.value is target):
                    return True
    return False
