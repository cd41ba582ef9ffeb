"""The import graph of dcpflow, read from the sources: imports run one way and go round in no
circle.

Direction (DESIGN.md): cli -> spark / replication / client / server -> dcp / engine -> protocol.
The protocol imports nothing of ours, the engine not the DCP state machines (dcp may use the
engine), spark uses the client, never the server or replication, and replication does not reach
into the server. Every import counts: those under `if TYPE_CHECKING:` (an annotation that names a
module above is a dependency all the same, and a cycle through one is a knot the next change
pulls tight), those inside functions (a late import hides a dependency from the interpreter, not
from the reader) and a package module's imports of its own parent package (`from . import x`
where x is defined in `__init__`). The few arrows left to a later pass are listed, with why.
"""

import ast
import functools
import gc
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "dcpflow"

#: package -> its layer; a module may import its own layer's peers or lower layers only.
LAYERS = {"protocol": 0, "engine": 1, "dcp": 1, "client": 2, "server": 2, "replication": 2, "spark": 2, "cli": 3}
#: Imports the layers alone would allow, and the design forbids.
FORBIDDEN = {("engine", "dcp"), ("spark", "server"), ("spark", "replication"), ("replication", "server")}

#: Arrows against the direction that stay for now (none: the node runner is at the CLI level,
#: dcpflow/node.py, and the workload the demo and the Spark sources share is client/workload.py).
ALLOWED_WRONG_WAY: set[tuple[str, str]] = set()
#: Import cycles that stay for now (none: a new cycle fails test_no_import_cycles).
ALLOWED_CYCLES: list[set[str]] = []


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


def imports_of(name: str, path: Path, known: dict[str, Path], nested: bool = True) -> set[str]:
    """The dcpflow modules `name` imports: at module level (in if/try blocks and TYPE_CHECKING too)
    and, with `nested` (the default), inside functions and classes as well. `from pkg import mod`
    counts as importing pkg.mod, `from pkg import name` as importing pkg, its own parent too."""
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
    return {m for m in found if m in known and m != name}


def graph(nested: bool = True) -> dict[str, set[str]]:
    return {name: set(targets) for name, targets in _graph(nested).items()}  # a copy: callers may change it


@functools.cache  # read once per run: the walk over every module's tree is the slow part of these tests
def _graph(nested: bool) -> dict[str, set[str]]:
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
    # ...imports inside functions (the metrics server starts late) and of a module's own parent
    assert "dcpflow.replication.xdcr.metrics" in g["dcpflow.replication.xdcr.command"]
    assert "dcpflow.replication.xdcr.metrics" not in graph(nested=False)["dcpflow.replication.xdcr.command"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def _package(root: Path, files: dict[str, str]) -> dict[str, set[str]]:
    """The import graph of a made-up package `pkg` under root (module name -> source)."""
    known = {}
    for name, source in files.items():
        path = root / (name.replace(".", "/") + ("/__init__.py" if name == "pkg" else ".py"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
        known[name] = path
    return {name: imports_of(name, path, known) for name, path in known.items()}


def test_a_package_that_imports_its_routers_back_is_a_cycle(tmp_path):
    """The shape server/mgmt had: the package's __init__ imports the routers, which import `app`,
    which took the router list from the package (`from . import ROUTERS`, inside a function). The
    reader sees the parent-package import, so the cycle is found; registered from outside, it is
    gone."""
    files = {
        "pkg": "from . import router\nfrom .app import Listener\nROUTERS = (router,)\n",
        "pkg.router": "from .app import SERVER\n",
        "pkg.app": "SERVER = 1\nclass Listener:\n    def make(self):\n        from . import ROUTERS\n",
    }
    g = _package(tmp_path, files)
    assert "pkg" in g["pkg.app"]
    assert cycles(g) == [{"pkg", "pkg.router", "pkg.app"}]
    files["pkg.app"] = "SERVER = 1\nclass Listener:\n    def __init__(self, routers):\n        self.routers = routers\n"
    assert cycles(_package(tmp_path / "fixed", files)) == []


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
    allowed = {f"{a} imports {b}" for a, b in ALLOWED_WRONG_WAY}
    found = wrong_way(graph())
    wrong = [w for w in found if w.rpartition(" (")[0] not in allowed]
    assert not wrong, "\n".join(wrong)
    stale = allowed - {w.rpartition(" (")[0] for w in found}
    assert not stale, f"allowed but no longer there (drop them from ALLOWED_WRONG_WAY): {sorted(stale)}"


def test_no_import_cycles():
    """Through imports inside functions too: a late import hides a knot from the interpreter, not
    from the reader."""
    found = cycles(graph())
    new = [c for c in found if c not in ALLOWED_CYCLES]
    assert not new, "import cycles:\n" + "\n".join(" <-> ".join(sorted(c)) for c in new)
    stale = [c for c in ALLOWED_CYCLES if c not in found]
    assert not stale, f"allowed but no longer there (drop them from ALLOWED_CYCLES): {stale}"


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
