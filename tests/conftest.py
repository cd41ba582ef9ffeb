"""Suite-wide scheduling: the longest tests start first.

scripts/test.sh runs the suite on two pytest-xdist workers with `--dist loadgroup`. xdist hands
out work in collection order (a group first, the largest group foremost), so a long test collected
last - the bench smoke runs and the plain install live in tests/test_*.py, after every directory -
would run alone at the end while the other worker idles. Tests marked `slow` are therefore moved to
the front of the collection; the order of everything else is unchanged. Without xdist the order
does not matter for the run's length, and nothing is moved.
"""

import pytest


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    if getattr(config.option, "numprocesses", None) in (None, 0) and not hasattr(config, "workerinput"):
        return  # one process: keep the collected order
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: slow ones first
