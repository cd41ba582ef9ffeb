"""Which optional dependencies a command needs, and the one line that says how to get them.

`pip install dcpflow` brings the base dependencies only (aiohttp, cramjam): the server, `inspect`,
the client's event API, `tail`, `cluster`, `xdcr`, `fault` and `collections` run with them. Arrow
batches need the `arrow` extra, the Spark commands `spark` (and `connect` for a Spark Connect
client), `load` the official SDK (`load`). A command that needs an extra declares it (`extra` in
its parser defaults); cli.py checks it before running, and turns an import of a missing package
anywhere below into the same line, never a traceback.

The extras' contents are read from the installed distribution's metadata (the Requires-Dist lines
pyproject.toml's optional-dependencies become), so this module keeps no list of its own. Run
from a source tree without metadata, nothing is checked up front and the import error is named
by package.
"""

import importlib.metadata as md
import re

_NAME = re.compile(r"[A-Za-z0-9._-]+")
_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")
#: Import names that differ from their distribution's name.
_DISTRIBUTION_OF = {"grpc": "grpcio", "google": "googleapis-common-protos"}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _extras() -> dict[str, set[str]]:
    """extra -> the distributions it installs (an extra naming dcpflow[other] includes other's)."""
    try:
        requires = md.requires("dcpflow") or []
    except md.PackageNotFoundError:
        return {}
    direct: dict[str, set[str]] = {}
    nested: dict[str, set[str]] = {}
    for line in requires:
        requirement, _, marker = line.partition(";")
        extra = _EXTRA.search(marker)
        if extra is None:
            continue
        name = _normal(_NAME.match(requirement.strip()).group())
        inner = re.search(r"\[([^\]]+)\]", requirement)
        if name == "dcpflow" and inner:
            nested.setdefault(extra.group(1), set()).update(_normal(x) for x in inner.group(1).split(","))
        else:
            direct.setdefault(extra.group(1), set()).add(name)
    out = {}
    for extra in set(direct) | set(nested):
        names, todo, seen = set(direct.get(extra, ())), list(nested.get(extra, ())), {extra}
        while todo:
            other = todo.pop()
            if other not in seen:
                seen.add(other)
                names |= direct.get(other, set())
                todo.extend(nested.get(other, ()))
        out[extra] = names
    return out


def _installed(distribution: str) -> bool:
    try:
        md.version(distribution)
    except md.PackageNotFoundError:
        return False
    return True


def hint(extra: str) -> str:
    return f"pip install 'dcpflow[{extra}]'"


def missing(extra: str) -> str | None:
    """None when everything `extra` installs is there, else the line saying what is missing."""
    absent = sorted(d for d in _extras().get(extra, ()) if not _installed(d))
    if not absent:
        return None
    return f"needs {', '.join(absent)} (the '{extra}' extra): {hint(extra)}"


def explain(error: ModuleNotFoundError, extra: str | None = None) -> str | None:
    """The line for an import of a package that is not installed, None for anything else (one of
    dcpflow's own modules missing is a broken install, not a missing extra)."""
    top = (error.name or "").partition(".")[0]
    if not top or top == "dcpflow":
        return None
    distribution = _normal(_DISTRIBUTION_OF.get(top, top))
    extras = _extras()
    if extra is None or distribution not in extras.get(extra, ()):
        # the smallest extra that brings it
        holders = sorted((len(names), name) for name, names in extras.items() if distribution in names)
        extra = holders[0][1] if holders else None
    if extra is None:
        return f"needs the Python package {top!r}, which is not installed"
    return f"needs {distribution} (the '{extra}' extra): {hint(extra)}"
