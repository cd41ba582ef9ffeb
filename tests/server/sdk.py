"""Connecting the official Couchbase Python SDK to a dcpflow server under test."""

from datetime import timedelta

from couchbase.auth import PasswordAuthenticator
from couchbase.cluster import Cluster
from couchbase.options import ClusterOptions, ClusterTimeoutOptions


def connect(port: int, query: str = "", user: str = "Administrator", password: str = "password",
            scheme: str = "couchbase", **options) -> Cluster:
    # bounds on a failure, not expectations: a server sharing two busy cores with the suite can take
    # seconds to answer (a test that wants a timeout sets its own)
    timeouts = ClusterTimeoutOptions(kv_timeout=timedelta(seconds=30), connect_timeout=timedelta(seconds=60),
                                     bootstrap_timeout=timedelta(seconds=60))
    return Cluster(f"{scheme}://127.0.0.1:{port}{query}",
                   ClusterOptions(PasswordAuthenticator(user, password), timeout_options=timeouts,
                                  **options))
