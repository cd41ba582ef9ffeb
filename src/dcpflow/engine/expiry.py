"""Document expiry: client exptime conversion and the expired test.

Expiry times are stored as absolute unix seconds. Clients send memcached-style exptime, where a
value of at most 30 days (2592000 s) is an offset from now and anything larger is already an
absolute time; `to_absolute` does that conversion once, at the edge. Expired documents are turned
into expirations (tombstones with DeleteSource.TTL and a delete time, which DCP sends as
Expiration messages) either on access or by the pager the owner calls periodically
(`Bucket.run_expiry_pager`; each vbucket's `expire_due`).
"""

import time

from .item import Item

RELATIVE_EXPIRY_LIMIT = 30 * 24 * 60 * 60  # 2592000 s


def to_absolute(exptime: int, now: float | None = None) -> int:
    """Convert a client exptime to absolute unix seconds (0 stays 0 = never expires)."""
    if exptime < 0:
        raise ValueError(f"exptime must be >= 0, got {exptime}")
    if exptime == 0:
        return 0
    if exptime <= RELATIVE_EXPIRY_LIMIT:
        return int(time.time() if now is None else now) + exptime
    return exptime


def is_expired(item: Item, now: float) -> bool:
    """A live document whose expiry time has been reached (memcached: expiry <= now)."""
    return not item.deleted and item.expiry != 0 and item.expiry <= now

