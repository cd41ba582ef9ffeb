"""Connecting the official Couchbase Python SDK to a dcpflow server under test."""

from datetime import timedelta

from couchbase.auth import PasswordAuthenticator
from couchbase.cluster import Cluster
from couchbase.options import ClusterOptions, ClusterTimeoutOptions


def connect(port: int, query: str = "", user: str = "Administrator", password: str = "password",
            scheme: str = "couchbase", **options) -> Cluster:
    timeouts = ClusterTimeoutOptions(kv_timeout=timedelta(seconds=5), connect_timeout=timedelta(seconds=10),
                                     bootstrap_timeout=timedelta(seconds=10))
    return Cluster(f"{scheme}://127.0.0.1:{port}{query}",
                   ClusterOptions(PasswordAuthenticator(user, password), timeout_options=timeouts,
                                  **options))
