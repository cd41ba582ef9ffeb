"""The import graph of dcpflow, read from the sources: imports run one way and go round in no
circle.

Direction (DESIGN.md): cli -> spark / replication / client / server -> dcp / engine -> protocol.
The protocol imports nothing of ours, the engine not the DCP state machines (dcp may use the
engine), and spark uses the client, never the server. Every module-level import counts, those
under `if TYPE_CHECKING:` too: an annotation that names a module above is a dependency all the
same, and a cycle through one is a knot the next change pulls tight. Imports inside functions
are not read (they run late, and say so).
"""

import ast
import gc
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "dcpflow"

#: package -> its layer; a module may import its own layer's peers or lower layers only.
LAYERS = {"protocol": 0, "engine": 1, "dcp": 1, "client": 2, "server": 2, "replication": 2, "spark": 2, "cli": 3}
#: Imports the layers alone would allow, and the design forbids.
FORBIDDEN = {("engine", "dcp"), ("spark", "server")}


def modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def parse(path: Path) -> ast.Module:
    """ast.parse with the garbage collector held off. In CPython 3.11 the AST builder's recursion
    counter is shared by nested parses: a collection inside ast.parse can run a finalizer (an
    asyncio future of an earlier test logging its error) whose traceback formatting parses source
    again, and the outer parse then fails with "AST constructor recursion depth mismatch"
    (https://github.com/python/cpython/issues/106905)."""
    source = path.read_text()
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source)
    finally:
        if enabled:
            gc.enable()


def imports_of(name: str, path: Path, known: dict[str, Path], nested: bool = False) -> set[str]:
    """The dcpflow modules `name` imports at module level (in if/try blocks and TYPE_CHECKING too),
    and with `nested` inside functions as well. `from pkg import mod` counts as importing pkg.mod;
    a package's own parents do not count."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                    visit(block)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                subs = [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in known]
                found.update(subs)
                if len(subs) < len(node.names):
                    found.add(module)

    tree = parse(path)
    if nested:
        visit([node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))])
    else:
        visit(tree.body)
    return {m for m in found if m in known and m != name and not name.startswith(m + ".")}


def graph(nested: bool = False) -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known, nested) for name, path in known.items()}


def layer_of(module: str) -> str:
    """dcpflow.server.app -> server; top-level modules (cli, inspect, load) are tools: cli's layer."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS and (SRC / parts[1]).is_dir() else "cli"


def cycles(g: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(g[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(component)

    for v in sorted(g):
        if v not in index:
            strong(v)
    return out


def test_the_graph_is_read():
    g = graph()
    # the reader sees relative, absolute, TYPE_CHECKING and `from . import x` imports
    assert "dcpflow.server.commands" in g["dcpflow.server.app"]
    assert {"dcpflow.server.kv", "dcpflow.server.dcp_commands"} <= g["dcpflow.server.commands"]
    assert "dcpflow.engine.vbucket" in g["dcpflow.engine.flusher"]  # under TYPE_CHECKING
    assert "dcpflow.dcp.active_stream" in g["dcpflow.dcp.producer"]
    assert "dcpflow.protocol.dcp" in g["dcpflow.dcp.active_stream"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def wrong_way(g: dict[str, set[str]]) -> list[str]:
    """Every import against the direction, as "a imports b (layer -> layer)"."""
    wrong = []
    for module, targets in sorted(g.items()):
        here = layer_of(module)
        for target in sorted(targets):
            there = layer_of(target)
            if here == there:
                continue
            if LAYERS[there] > LAYERS[here] or (here, there) in FORBIDDEN or \
                    (LAYERS[there] == LAYERS[here] and here in ("engine", "protocol")):
                wrong.append(f"{module} imports {target} ({here} -> {there})")
    return wrong


def test_the_direction_rules():
    assert wrong_way({"dcpflow.dcp.a": {"dcpflow.engine.b", "dcpflow.protocol.c"},
                      "dcpflow.server.d": {"dcpflow.dcp.a", "dcpflow.engine.b"},
                      "dcpflow.spark.e": {"dcpflow.client.f"}, "dcpflow.cli": {"dcpflow.server.d"}}) == []
    assert len(wrong_way({"dcpflow.engine.b": {"dcpflow.dcp.a"}, "dcpflow.protocol.c": {"dcpflow.engine.b"},
                          "dcpflow.spark.e": {"dcpflow.server.d"}, "dcpflow.dcp.a": {"dcpflow.server.d"},
                          "dcpflow.server.d": {"dcpflow.cli"}})) == 5


def test_imports_run_one_way():
    wrong = wrong_way(graph())
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles():
    found = cycles(graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(sorted(c)) for c in found)


def test_no_cycle_even_through_imports_inside_functions():
    """A late import inside a function hides a knot from the interpreter, not from the reader."""
    found = cycles(graph(nested=True))
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(sorted(c)) for c in found)


#: What the sans-I/O package must not use: the shells in dcpflow.server own sockets, the event loop,
#: threads and the clock, and pass the time in.
IO_MODULES = {"asyncio", "socket", "selectors", "ssl", "threading", "concurrent", "subprocess", "time"}


def test_the_dcp_package_does_no_io():
    used = []
    for path in sorted((SRC / "dcp").glob("*.py")):
        for node in ast.walk(parse(path)):  # function-level imports too
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            used += [f"{path.name}: {n}" for n in names if n.split(".")[0] in IO_MODULES]
    assert not used, used
