"""ONE SparkSession for every Spark test (starting one takes seconds), plus the server
fixtures of tests/server (an in-process server thread, or `dcpflow server` subprocesses).

Tests that need no Spark (options, offsets, schema) do not request `spark`, so running just them
starts no JVM.
"""

import pytest

from tests.server.conftest import make_server, server, spawn_server  # noqa: F401  (fixtures reused)


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    from dcpflow.spark.session import local_session

    session = local_session("dcpflow-tests", cores=2, driver_memory="1g", fast_start=True,
                            warehouse=tmp_path_factory.mktemp("warehouse"))
    yield session
    session.stop()
