"""Which changes a replication sends, as goxdcr's replication settings choose them: a regular
expression the key must match (filterExpression's key part), and whether deletions and
expirations are sent (filterDeletion, filterExpiration) and TTLs kept (filterBypassExpiry: the
target's copy then never expires)."""

import re
from typing import NamedTuple

from dcpflow.client.with_meta import DELETE, EXPIRE, Change


class Filters(NamedTuple):
    key_regex: str | None = None
    skip_deletions: bool = False
    skip_expirations: bool = False
    strip_ttl: bool = False

    def compile(self) -> "CompiledFilters":
        try:
            pattern = re.compile(self.key_regex.encode()) if self.key_regex else None
        except re.error as e:
            raise ValueError(f"key filter {self.key_regex!r} is not a regular expression: {e}") from None
        return CompiledFilters(pattern, self)


class CompiledFilters:
    def __init__(self, pattern, settings: Filters):
        self.pattern = pattern
        self.settings = settings

    def apply(self, change: Change) -> Change | None:
        """The change to send (TTL removed if asked), or None if it is filtered out."""
        s = self.settings
        if self.pattern is not None and self.pattern.search(change.key) is None:
            return None
        if change.kind == DELETE and s.skip_deletions:
            return None
        if change.kind == EXPIRE and s.skip_expirations:
            return None
        if s.strip_ttl and change.kind not in (DELETE, EXPIRE) and change.expiry:
            return change._replace(expiry=0)
        return change
