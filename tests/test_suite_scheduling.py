"""The suite's split over pytest-xdist workers (tests/conftest.py), checked on a small tree of its
own run by `pytest -n 2 --dist loadgroup` as scripts/test.sh runs the suite: every test that uses
the `spark` session fixture runs on one worker, so do the tests of a module with a module-scoped
fixture, and the groups carry their `@group` in the node id (pytest 9.2 dropped xdist's way of
writing it: pytest-dev/pytest-xdist#1386)."""

import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.processes import run_group

pytest.importorskip("xdist")

CONFTEST = Path(__file__).with_name("conftest.py")

SPARK_TESTS = """
import os
import pytest

@pytest.fixture(scope="session")
def spark():
    return os.getpid()  # the scheduling is under test, not Spark: which process serves the session

@pytest.mark.parametrize("i", range(6))
def test_uses_the_session(spark, i):
    assert spark == os.getpid()
"""

MODULE_FIXTURE_TESTS = """
import pytest

@pytest.fixture(scope="module")
def built():
    return object()

@pytest.mark.parametrize("i", range(4))
def test_shares_what_was_built(built, i):
    pass
"""

SINGLE_TESTS = """
import pytest

@pytest.mark.parametrize("i", range(8))
def test_alone(i):
    pass

@pytest.mark.slow
def test_long():
    pass
"""


def test_groups_run_on_one_worker_each(tmp_path):
    tree = tmp_path / "tests"
    tree.mkdir()
    (tree / "__init__.py").write_text("")  # a package, as tests/ is
    shutil.copy(CONFTEST, tree / "conftest.py")
    (tree / "test_spark.py").write_text(SPARK_TESTS)
    (tree / "test_module.py").write_text(MODULE_FIXTURE_TESTS)
    (tree / "test_single.py").write_text(SINGLE_TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: long\n")
    done = run_group([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p",
                      "no:cacheprovider", "tests"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = re.findall(r"\[(gw\d)\] \[\s*\d+%\] PASSED (\S+)", done.stdout)
    assert len(ran) == 6 + 4 + 9, done.stdout[-3000:]
    workers = {}
    for worker, nodeid in ran:
        workers.setdefault(nodeid.split("::")[0], set()).add(worker)
    assert len(workers["tests/test_spark.py"]) == 1 and len(workers["tests/test_module.py"]) == 1, workers
    assert all(nodeid.endswith("@spark-session") for _, nodeid in ran if "test_spark.py" in nodeid)
    assert all(nodeid.endswith("@tests.test_module") for _, nodeid in ran if "test_module.py" in nodeid)
    assert all("@" not in nodeid for _, nodeid in ran if "test_single.py" in nodeid)  # spread freely
