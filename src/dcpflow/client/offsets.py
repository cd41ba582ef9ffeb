"""Offsets: the client's saved form of where each vbucket's stream stands.

An `Offset` is what a DCP stream request needs to resume (stream-request.md,
building-a-simple-client.md "Restarting from where you left off"): the vbucket UUID of the
history branch the data came from, the last seqno received, and the snapshot that seqno belongs to
(and, for collections, the manifest uid known there). A valid offset has
`snapshot_start <= seqno <= snapshot_end`. It is the one offset model of dcpflow: the client's
state files and the Spark source's offsets hold it in one JSON form, `{"<vbucket>": offset}` with
an offset `[vbuuid, seqno]` when its snapshot is just that seqno, else `[vbuuid, seqno,
snapshot_start, snapshot_end]` (`Offset.to_json`, `offsets_to_json`); the object form of earlier
files is still read.


The offset itself and the rules that move it (`VbTracker`: snapshots, items, stream ends,
rollback points) are the one consumer-side stream position, dcpflow.dcp.position, which the
server's replica consumer follows too; they are re-exported here, where the client's callers and
the Spark source have always found them.
"""

from collections.abc import Mapping

from dcpflow.dcp.position import (  # noqa: F401 - re-exported: the client's offset model
    BEGINNING,
    BOUNDARIES,
    U64_MAX,
    Offset,
    OffsetError,
    VbTracker,
    rollback_offset,
)

__all__ = ["BEGINNING", "BOUNDARIES", "U64_MAX", "Offset", "OffsetError", "VbTracker", "offsets_from_json",
           "offsets_to_json", "rollback_offset", "vbucket_id"]


def vbucket_id(key) -> int:
    """A vbucket id from a JSON object key; raises OffsetError."""
    try:
        vb = int(key)
    except (TypeError, ValueError):
        raise OffsetError(f"vbucket id {key!r} is not a number") from None
    if not 0 <= vb <= 0xFFFF:
        raise OffsetError(f"vbucket id {vb} is out of range")
    return vb


def offsets_to_json(offsets: Mapping[int, Offset]) -> dict[str, list[int]]:
    """{vbucket: Offset} as JSON: {"<vbucket>": compact offset}, in vbucket order."""
    return {str(vb): off.to_json() for vb, off in sorted(offsets.items())}


def offsets_from_json(doc, where: str = "") -> dict[int, Offset]:
    """The inverse of offsets_to_json (each offset in either form); `where` prefixes the error."""
    if not isinstance(doc, dict):
        raise OffsetError(f"{where or 'vbuckets '}must be an object keyed by vbucket id")
    return {vbucket_id(k): Offset.from_json(v, f"{where}vbucket {k}") for k, v in doc.items()}


