"""The error of the replication package's cluster operations."""


class ClusterError(Exception):
    """A cluster operation could not be done; the message says why and what to do."""
