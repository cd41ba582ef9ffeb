"""The engine's modules import one another in one direction: no module reaches back, directly or
through others, to a module that imports it. Imports inside functions count; imports under
`if TYPE_CHECKING:` (annotations only) count as well - a module that names another's type in its
signatures depends on it, and a knot there is a knot for the reader."""

import ast
from pathlib import Path

import dcpflow.engine

ENGINE = Path(dcpflow.engine.__file__).parent


def _imports(path: Path) -> set[str]:
    """The engine modules `path` imports (relative or absolute), anywhere in the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                names = [node.module] if node.module else [a.name for a in node.names]
            elif node.level == 0 and node.module == "dcpflow.engine":
                names = [a.name for a in node.names]
            elif node.level == 0 and node.module and node.module.startswith("dcpflow.engine."):
                names = [node.module.removeprefix("dcpflow.engine.")]
            else:
                names = []
        elif isinstance(node, ast.Import):
            names = [a.name.removeprefix("dcpflow.engine.") for a in node.names if a.name.startswith("dcpflow.engine.")]
        else:
            continue
        found.update(name.split(".")[0] for name in names)
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph`, as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for dep in sorted(graph[module]):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module)):
            return found
    return None


def test_the_check_sees_every_kind_of_import_and_finds_a_knot(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text("from typing import TYPE_CHECKING\nfrom . import hlc\nimport dcpflow.engine.store\n"
                      "if TYPE_CHECKING:\n    from .bucket import Bucket\n"
                      "def later():\n    from dcpflow.engine.flusher import Flusher\n")
    assert _imports(source) == {"hlc", "store", "bucket", "flusher"}
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycles_inside_the_engine():
    modules = {p.stem: p for p in ENGINE.glob("*.py") if p.stem != "__init__"}
    graph = {name: _imports(path) & modules.keys() for name, path in modules.items()}
    assert _cycle(graph) is None, _cycle(graph)
