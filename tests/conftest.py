"""How the suite is shared between pytest-xdist workers.

scripts/test.sh runs the suite on two workers with `--dist loadgroup`: a test is a unit of work of
its own unless it is in an `xdist_group`, whose tests all run on one worker. Groups here:

- every test that uses the shared SparkSession (the `spark` fixture of tests/spark/conftest.py):
  one JVM serves them all, where two local sessions would each start a JVM and fight over the two
  cores. Tests that start Spark in processes of their own (a standalone cluster, a Connect server,
  a `dcpflow pipeline` subprocess) are not in it and run beside it on the other worker;
- the tests of a module with a module-scoped fixture (a wheel built and installed, an SDK server):
  split over two workers, each would build it.

Order: xdist hands out the groups first, the largest foremost, then single tests in collection
order. A long test collected last - the bench smoke runs and the plain install live in
tests/test_*.py, after every directory - would run alone at the end while the other worker idles,
so tests marked `slow` are moved to the front. Without xdist nothing is marked or moved.
"""

import threading

import pytest


def _under_xdist(config) -> bool:
    return hasattr(config, "workerinput") or getattr(config.option, "numprocesses", None) not in (None, 0)


def _group(item) -> str | None:
    names = getattr(item, "fixturenames", ())
    if "spark" in names:
        return "spark-session"
    info = getattr(item, "_fixtureinfo", None)
    if info is not None and any(d.scope in ("module", "package") for name in names
                                for d in info.name2fixturedefs.get(name, ())):
        return item.module.__name__
    return None


def _tag_with_group(item, group: str) -> None:
    """What xdist's worker does for `--dist loadgroup` (its scheduler reads the group from the
    node id's `@group` suffix), for pytest 9.2, whose structured node ids ignore xdist 3.8's write
    of `item._nodeid`: https://github.com/pytest-dev/pytest-xdist/issues/1386."""
    from _pytest.nodeid import NodeId

    item._id = NodeId.parse(f"{item.nodeid}@{group}")


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    if not _under_xdist(config):
        return (yield)
    for item in items:
        if item.get_closest_marker("xdist_group") is None and (group := _group(item)) is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: slow ones first
    result = yield  # xdist's own hook tags the grouped tests' node ids here
    if config.getvalue("loadgroup"):
        for item in items:
            names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                            for m in item.iter_markers("xdist_group")})
            if names and "@" not in item.nodeid:
                _tag_with_group(item, "_".join(names))
    return result


#: Threads of the test helpers that run an event loop (a server, a replicator, a cluster manager):
#: one that outlives its test keeps its clients reconnecting, for ever with some settings, to ports
#: the OS hands to the servers of later tests.
LOOP_THREAD_PREFIX = "dcpflow-test-"


@pytest.fixture(autouse=True)
def _no_loop_thread_outlives_its_test():
    """A test whose helpers' loop threads are still running once its fixtures are torn down fails."""
    before = set(threading.enumerate())
    yield
    left = [t for t in threading.enumerate() if t not in before and t.name.startswith(LOOP_THREAD_PREFIX)]
    for t in left:
        t.join(10)  # ending, at most: their owners stopped them and waited
    left = [t.name for t in left if t.is_alive()]
    assert not left, f"threads left running by the test: {left}"
