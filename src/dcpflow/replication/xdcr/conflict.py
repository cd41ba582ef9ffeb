"""Source-side conflict resolution: for a document larger than the optimistic-replication threshold,
ask the target for its metadata first (GET_META) and send the document only if it would win there.

goxdcr does the same: a small document is cheaper to send and let the target decide (it answers
KEY_EEXISTS when its own version wins), a large one is cheaper to ask about first, since losing it
would waste its bytes on the wire. Deletions carry no body and are always sent optimistically.
The comparison is the engine's, the one the target itself applies (dcpflow.engine.conflict), in
the bucket's mode: rev seqno first for "seqno" buckets, CAS first for "lww".
"""

from dcpflow.client.with_meta import SET, Change, Target
from dcpflow.engine.conflict import ConflictResolutionMode, DocMeta, incoming_wins
from dcpflow.protocol.status import Status

DEFAULT_OPTIMISTIC_THRESHOLD = 256


async def source_side_losers(target: Target, changes: list[Change], mode: ConflictResolutionMode,
                             threshold: int) -> set[int]:
    """Indexes of the changes above `threshold` bytes whose version the target's already beats."""
    big = [i for i, c in enumerate(changes) if c.kind == SET and len(c.value) > threshold]
    if not big:
        return set()
    metas = await target.get_metas([changes[i] for i in big])
    losers = set()
    for i, meta in zip(big, metas, strict=True):
        if meta.status != Status.SUCCESS:
            continue  # KEY_ENOENT: nothing there, the change wins; anything else: let the write decide
        c = changes[i]
        existing = DocMeta(meta.cas, meta.rev_seqno, meta.expiry, meta.flags, meta.datatype or 0)
        incoming = DocMeta(c.cas, c.rev_seqno, c.expiry, c.flags, c.datatype)
        if not incoming_wins(mode, incoming, existing):
            losers.add(i)
    return losers
