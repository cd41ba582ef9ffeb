"""ONE SparkSession for every Spark test (starting one takes seconds), plus the server
fixtures of tests/server (an in-process server thread, or `dcpflow server` subprocesses).

Tests that need no Spark (options, offsets, schema) do not request `spark`, so running just them
starts no JVM.

Under pytest-xdist (scripts/test.sh runs the suite on two workers with `--dist loadgroup`) every
test that uses the shared session is put in one group, so they all run on one worker and one JVM
serves them: two local sessions would each start a JVM and fight over the same two cores. Tests
that start Spark in processes of their own (a standalone cluster, a Connect server, a `dcpflow
pipeline` subprocess) are not grouped and run beside them on the other worker.
"""

import pytest

from tests.server.conftest import make_server, server, spawn_server  # noqa: F401  (fixtures reused)

SPARK_GROUP = pytest.mark.xdist_group("spark-session")


def pytest_collection_modifyitems(items):
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(SPARK_GROUP)


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    from dcpflow.spark.session import local_session

    session = local_session("dcpflow-tests", cores=2, driver_memory="1g", fast_start=True,
                            warehouse=tmp_path_factory.mktemp("warehouse"))
    yield session
    session.stop()
