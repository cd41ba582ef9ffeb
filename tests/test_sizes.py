"""Size is a feature of the code too: no function in `src/` over 80 lines, no class over 500
(issue 44). A function that long does several jobs and a class that large is several classes;
both get split along their own jobs. An entry in ALLOWED that is no longer over fails the test, so
the list only shrinks."""

import ast
import sys

from .test_layering import SRC, parse

MAX_FUNCTION = 80
MAX_CLASS = 500

#: "module:qualified name" allowed over its limit: none (generated tables would be listed here).
ALLOWED: set[str] = set()


def _over(node: ast.AST, module: str, prefix: str, found: set[str]) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{child.name}"
            limit = MAX_CLASS if isinstance(child, ast.ClassDef) else MAX_FUNCTION
            if child.end_lineno - child.lineno + 1 > limit:
                found.add(f"{module}:{name}")
            _over(child, module, name + ".", found)


def oversized() -> set[str]:
    """Every function and class of src/ over its limit, as "module:qualified name"."""
    found: set[str] = set()
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        _over(parse(path), ".".join(parts), "", found)
    return found


def test_the_measure_sees_functions_and_classes_at_any_depth(tmp_path, monkeypatch):
    src = tmp_path / "dcpflow"
    src.mkdir()
    body = "".join(f"        x{i} = {i}\n" for i in range(MAX_FUNCTION))  # with its def: one line over
    (src / "m.py").write_text(f"class A:\n    def f(self):\n{body}\n\ndef g():\n    x = 1\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", src)
    assert oversized() == {"dcpflow.m:A.f"}


def test_no_function_over_80_lines_and_no_class_over_500():
    found = oversized()
    new = sorted(found - ALLOWED)
    assert not new, f"over {MAX_FUNCTION} lines (function) or {MAX_CLASS} (class): split along their jobs: {new}"
    stale = sorted(ALLOWED - found)
    assert not stale, f"no longer over the limit (drop them from ALLOWED): {stale}"
