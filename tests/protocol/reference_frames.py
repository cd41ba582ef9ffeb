"""The worked examples of KV-Engine's DCP command pages as bytes
(https://github.com/couchbase/kv_engine/tree/master/docs/dcp/documentation/commands, one page
per opcode: stream-request.md, snapshot-marker.md, ...).

`REFERENCE_FRAMES` (alias `EXAMPLES`): name -> (hex, expected message). The hex is the page's grid transcribed row by
row (one group of four bytes per grid row) in its *corrected* reading: where the bytes disagree
with the page's field table (or with what KV-Engine's code accepts), the table and the code win.
Each such disagreement is an *erratum*, numbered as dcpflow's rule messages number them ("erratum
55"); the test that pins an erratum states its rule in its docstring (test_dcp_examples.py,
test_kv.py, test_meta.py). Decoding the hex must give exactly the message, and encoding the
message exactly the hex.

`UPSTREAM_EXAMPLES`: name -> (hex, erratum, expected substring). The page's bytes as printed (or,
for names with a `[...]` suffix, the corrected bytes with only that one erratum left in), which a
decoder must refuse: the substring is part of the reason `rules.problems()` gives, or of the
ProtocolError `decode_all` raises when the header's lengths contradict the bytes, and is chosen so
that `dcpflow inspect` (which frames leniently and words length errors its own way) reports it too.

`UPSTREAM_UNDETECTED`: name -> (hex, erratum, note). Upstream bytes that are wrong per an erratum
but still a well-formed frame (a label, a field swapped with another, a value the table disagrees
with); no structural rule can notice, so tests pin what they decode to instead.

Shared with the CLI tests (`dcpflow inspect`), so keep the names stable.
"""

from dcpflow.protocol.dcp import (
    CacheTransferRecord,
    DcpAbort,
    DcpAddStream,
    DcpAddStreamResponse,
    DcpBufferAck,
    DcpCacheTransfer,
    DcpCacheTransferEnd,
    DcpCloseStream,
    DcpCommit,
    DcpControl,
    DcpDeletion,
    DcpExpiration,
    DcpGetFailoverLog,
    DcpMutation,
    DcpNoop,
    DcpOpen,
    DcpOsoSnapshot,
    DcpPrepare,
    DcpSeqnoAcknowledged,
    DcpSeqnoAdvanced,
    DcpSetVbucketState,
    DcpSnapshotMarker,
    DcpStreamEnd,
    DcpStreamRequest,
    DcpStreamRequestResponse,
    DcpSystemEvent,
    DurabilityLevel,
    FailoverLogResponse,
    MarkerVersion,
    OsoFlag,
    SnapshotFlag,
    StreamEndReason,
    StreamFlag,
    SystemEventId,
    VBucketState,
)
from dcpflow.protocol.kv import RawResponse
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status


def h(text: str) -> str:
    """Normalise a grid transcription ("80 56 00 00 | 14 ...", ASCII as 'x') to plain hex."""
    out = []
    for tok in text.replace("|", " ").split():
        if len(tok) == 3 and tok[0] == tok[2] == "'":
            out.append(f"{ord(tok[1]):02x}")
        else:
            assert len(tok) == 2, tok
            out.append(tok.lower())
    return "".join(out)


def ascii_hex(s: str) -> str:
    return s.encode().hex()


ZERO8 = "00 00 00 00 | 00 00 00 00"
MAX_U64 = 0xFFFFFFFFFFFFFFFF

# The failover log printed in stream-request.md, failover-log.md and BinaryProtocol.md 0x96, in the
# page's order: (uuid, seqno). Erratum 16: its seqnos are not non-increasing, so it cannot be a log
# sent newest-first. The corrected reading keeps the four entries and orders them newest-first
# (seqnos never increase), which is the only order a producer sends.
FAILOVER_LOG_AS_PRINTED = ((0xFEEDDECA, 0x5432), (0xDECAFE, 0x1343214), (0xFEEDFACE, 0x4),
                           (0xDEADBEEF, 0x6524))
FAILOVER_LOG = tuple(sorted(FAILOVER_LOG_AS_PRINTED, key=lambda e: e[1], reverse=True))


def _log_hex(entries) -> str:
    return "".join(f"{uuid:016x}{seqno:016x}" for uuid, seqno in entries)


# The CAS of the corrected prepare example. Erratum 25: the page prints CAS 0, but the server
# validator requires a non-zero CAS on DCP_PREPARE; the value itself is our choice (an HLC-like CAS).
PREPARE_CAS = 0x17C4B5D6E7F80000

# Delete time of the V2 deletion built from deletion.md's V2 extras table (the page shows only V1).
DELETE_TIME = 0x66A0B0C0

# ---------------------------------------------------------------------------------------------
# Corrected examples

_OPEN = h(f"""
    80 50 00 18 | 08 00 00 00 | 00 00 00 20 | 00 00 00 01 | {ZERO8} |
    00 00 00 00 | 00 00 00 00 |
    """) + ascii_hex("bucketstream vb[100-105]")

_OPEN_RESPONSE = h(f"81 50 00 00 | 00 00 00 00 | 00 00 00 00 | 00 00 00 01 | {ZERO8}")

_ADD_STREAM = h(f"80 51 00 00 | 04 00 00 05 | 00 00 00 04 | 00 00 00 01 | {ZERO8} | 00 00 00 01")

_ADD_STREAM_RESPONSE = h(f"81 51 00 00 | 04 00 00 00 | 00 00 00 04 | 00 00 00 01 | {ZERO8} | 00 00 10 00")

_CLOSE_STREAM = h(f"80 52 00 00 | 00 00 00 05 | 00 00 00 00 | de ad be ef | {ZERO8}")

# First request of stream-request.md, erratum 14: the table's snapshot start (0) is used; the grid's
# 0xffeedd at 56-63 is kept in UPSTREAM_UNDETECTED.
_STREAM_REQ_1 = h(f"""
    80 53 00 00 | 30 00 00 00 | 00 00 00 30 | 00 00 10 00 | {ZERO8} |
    00 00 00 00 | 00 00 00 00 | 00 00 00 00 | 00 ff ee dd | ff ff ff ff | ff ff ff ff |
    00 00 00 00 | fe ed de ca | 00 00 00 00 | 00 00 00 00 | 00 00 00 00 | 00 ff ee ff
    """)

_STREAM_REQ_ROLLBACK = h(f"81 53 00 00 | 00 00 00 23 | 00 00 00 08 | 00 00 10 00 | {ZERO8} | {ZERO8}")

# Second request, erratum 15: the grid stops at 63; snapshot end (64-71, 0 per the table) restored.
_STREAM_REQ_2 = h(f"""
    80 53 00 00 | 30 00 00 00 | 00 00 00 30 | 00 00 10 00 | {ZERO8} |
    00 00 00 00 | 00 00 00 00 | 00 00 00 00 | 00 00 00 00 | ff ff ff ff | ff ff ff ff |
    00 00 00 00 | fe ed de ca | 00 00 00 00 | 00 00 00 00 | 00 00 00 00 | 00 00 00 00
    """)

_STREAM_REQ_OK = h(f"81 53 00 00 | 00 00 00 00 | 00 00 00 40 | 00 00 10 00 | {ZERO8}") + _log_hex(FAILOVER_LOG)

_FAILOVER_LOG_REQ = h(f"80 54 00 00 | 00 00 00 00 | 00 00 00 00 | de ad be ef | {ZERO8}")

_FAILOVER_LOG_RESP = (h(f"81 54 00 00 | 00 00 00 00 | 00 00 00 40 | de ad be ef | {ZERO8}")
                      + _log_hex(FAILOVER_LOG))

_STREAM_END = h(f"80 55 00 00 | 04 00 00 00 | 00 00 00 04 | de ad be ef | {ZERO8} | 00 00 00 00")

# Errata 1-2: type 0x01 is Memory; total body 0x14.
_MARKER_V1 = h(f"""
    80 56 00 00 | 14 00 00 00 | 00 00 00 14 | de ad be ef | {ZERO8} |
    00 00 00 00 | 00 00 00 00 | 00 00 00 00 | 00 00 00 08 | 00 00 00 01
    """)

# Errata 3-5: extras length 0x01, total body 0x25, version byte 0x00.
_MARKER_V20 = h(f"""
    80 56 00 00 | 01 00 00 00 | 00 00 00 25 | de ad be ef | {ZERO8} |
    00 00 00 00 | 00 00 00 00 | 01 00 00 00 | 00 00 00 00 | 08 00 00 00 | 02 00 00 00 |
    00 00 00 00 | 08 00 00 00 | 00 00 00 00 | 07
    """)

# V2.2 built from snapshot-marker.md's offset list (version 0x02 at 24, then start, end, type, MVS,
# HCS, purge seqno, HPS): a Disk|Checkpoint snapshot 1..8, MVS 8, HCS 7, purge seqno 3, HPS 8.
_MARKER_V22 = h(f"""
    80 56 00 00 | 01 00 00 00 | 00 00 00 35 | de ad be ef | {ZERO8} |
    02 |
    00 00 00 00 00 00 00 01 | 00 00 00 00 00 00 00 08 | 00 00 00 06 |
    00 00 00 00 00 00 00 08 | 00 00 00 00 00 00 00 07 | 00 00 00 00 00 00 00 03 |
    00 00 00 00 00 00 00 08
    """)

_MUTATION = h(f"""
    80 57 00 05 | 1f 00 02 10 | 00 00 00 29 | 00 00 12 10 | {ZERO8} |
    00 00 00 00 | 00 00 00 04 | 00 00 00 00 | 00 00 00 01 | 00 00 00 00 | 00 00 00 00 |
    00 00 00 00 | 00 00 00 'h' | 'e' 'l' 'l' 'o' | 'w' 'o' 'r' 'l' | 'd'
    """)

# Erratum 22: key "hello" at 42-46, total body 0x17 (the grid's `01 'c' ':' ':'` dropped).
_DELETION_V1 = h(f"""
    80 58 00 05 | 12 00 02 10 | 00 00 00 17 | 00 00 12 10 | {ZERO8} |
    00 00 00 00 | 00 00 00 05 | 00 00 00 00 | 00 00 00 01 | 00 00 'h' 'e' | 'l' 'l' 'o'
    """)

# V2 built from deletion.md's V2 extras table with the V1 example's values plus a delete time.
_DELETION_V2 = h(f"""
    80 58 00 05 | 15 00 02 10 | 00 00 00 1a | 00 00 12 10 | {ZERO8} |
    00 00 00 00 | 00 00 00 05 | 00 00 00 00 | 00 00 00 01 | 66 a0 b0 c0 | 00 'h' 'e' 'l' | 'l' 'o'
    """)

# Erratum 24: extras length 0x14, total body 0x19.
_EXPIRATION = h(f"""
    80 59 00 05 | 14 00 02 10 | 00 00 00 19 | 00 00 12 10 | {ZERO8} |
    00 00 00 00 | 00 00 00 05 | 00 00 00 00 | 00 00 00 01 | 00 00 00 00 | 'h' 'e' 'l' 'l' | 'o'
    """)

_SET_VB_STATE = h(f"80 5b 00 00 | 01 00 00 00 | 00 00 00 01 | de ad be ef | {ZERO8} | 04")

# Erratum 29: 24 bytes, opaque 5 (the table's value).
_NOOP = h(f"80 5c 00 00 | 00 00 00 00 | 00 00 00 00 | 00 00 00 05 | {ZERO8}")
_NOOP_RESPONSE = h(f"81 5c 00 00 | 00 00 00 00 | 00 00 00 00 | 00 00 00 05 | {ZERO8}")

# Erratum 28: extras length 0x04.
_BUFFER_ACK = h(f"80 5d 00 00 | 04 00 00 00 | 00 00 00 04 | 00 00 00 05 | {ZERO8} | 00 00 10 00")
_BUFFER_ACK_RESPONSE = h(f"81 5d 00 00 | 00 00 00 00 | 00 00 00 00 | 00 00 00 05 | {ZERO8}")

# Errata 6-9: key length 0x000B, no extras, total body 0x0F, vbucket 0.
_CONTROL = h(f"80 5e 00 0b | 00 00 00 00 | 00 00 00 0f | 00 00 00 01 | {ZERO8}") + ascii_hex("enable_nooptrue")
# Errata 10-11: opcode 0x5E, extras length 0 and total body 0.
_CONTROL_RESPONSE = h(f"81 5e 00 00 | 00 00 00 00 | 00 00 00 00 | 00 00 00 01 | {ZERO8}")

# Erratum 31: value is manifest uid 2, scope 0 (57-60), collection 8 (61-64), max_ttl 72000.
_SYSTEM_EVENT = h(f"""
    80 5f 00 0c | 0d 00 02 10 | 00 00 00 2d | 00 00 12 10 | {ZERO8} |
    00 00 00 00 | 00 00 00 04 | 00 00 00 00 | 01
    """) + ascii_hex("mycollection") + h("""
    00 00 00 00 00 00 00 02 | 00 00 00 00 | 00 00 00 08 | 00 01 19 40
    """)
_SYSTEM_EVENT_VALUE = bytes.fromhex("0000000000000002" "00000000" "00000008" "00011940")

# Erratum 25: opcode 0x60, and a non-zero CAS (PREPARE_CAS).
_PREPARE = h("""
    80 60 00 05 | 1f 00 02 10 | 00 00 00 29 | 00 00 12 10 | 17 c4 b5 d6 | e7 f8 00 00 |
    00 00 00 00 | 00 00 00 04 | 00 00 00 00 | 00 00 00 01 | 00 00 00 00 | 00 00 00 00 |
    00 00 00 00 | 00 00 01 'h' | 'e' 'l' 'l' 'o' | 'w' 'o' 'r' 'l' | 'd'
    """)

_COMMIT = h(f"""
    80 62 00 05 | 10 00 02 10 | 00 00 00 15 | 00 00 12 10 | {ZERO8} |
    00 00 00 00 | 00 00 00 04 | 00 00 00 00 | 00 00 00 05 | 'h' 'e' 'l' 'l' | 'o'
    """)

_ABORT = h(f"""
    80 63 00 05 | 10 00 02 10 | 00 00 00 15 | 00 00 12 10 | {ZERO8} |
    00 00 00 00 | 00 00 00 04 | 00 00 00 00 | 00 00 00 05 | 'h' 'e' 'l' 'l' | 'o'
    """)

_SEQNO_ACK = h(f"80 61 00 00 | 08 00 02 10 | 00 00 00 08 | 00 00 12 10 | {ZERO8} | 00 00 00 00 | 00 00 00 04")

# Erratum 26: opcode 0x64, extras length 0x08, total body 0x08.
_SEQNO_ADVANCED = h(f"80 64 00 00 | 08 00 00 00 | 00 00 00 08 | de ad be ef | {ZERO8} | 00 00 00 00 | 00 00 00 04")

# Erratum 27: total body 0x04.
_OSO = h(f"80 65 00 00 | 04 00 00 00 | 00 00 00 04 | de ad be ef | {ZERO8} | 00 00 00 01")

# Erratum 32: the 40-byte record as the table lays it out (rev_seqno 40-47, key_len 60-61,
# cacheHint 63, key 64-68, value 69-73); 74 bytes in all.
_CACHE_TRANSFER = h(f"""
    80 66 00 00 | 00 00 02 10 | 00 00 00 32 | 00 00 12 10 | {ZERO8} |
    00 00 00 00 | 00 00 00 04 | 00 00 00 00 | 00 00 00 01 | 00 00 00 00 | 00 00 00 05 |
    00 00 00 05 | 00 00 00 00 | 00 00 00 00 | 00 05 00 0a |
    'h' 'e' 'l' 'l' | 'o' 'w' 'o' 'r' | 'l' 'd'
    """)

_CACHE_TRANSFER_END = h(f"80 67 00 00 | 00 00 02 10 | 00 00 00 00 | 00 00 12 10 | {ZERO8}")

# The pages' "Stream-ID" section (cache-transfer-end.md): magic 0x08, 3 bytes of framing extras
# (id 2, length 2: 0x22, then sid 1), key length in byte 3.
_CACHE_TRANSFER_END_SID = h(f"08 67 03 00 | 00 00 02 10 | 00 00 00 03 | 00 00 12 10 | {ZERO8} | 22 00 01")


REFERENCE_FRAMES: dict[str, tuple[str, object]] = {
    "open-connection request": (_OPEN, DcpOpen(b"bucketstream vb[100-105]", flags=0, value=b"", opaque=1)),
    "open-connection response": (_OPEN_RESPONSE, RawResponse(Opcode.DCP_OPEN, Status.SUCCESS, opaque=1)),
    "add-stream request": (_ADD_STREAM, DcpAddStream(vbucket=5, flags=StreamFlag.TAKEOVER, opaque=1)),
    "add-stream response": (_ADD_STREAM_RESPONSE, DcpAddStreamResponse(stream_opaque=0x1000, opaque=1)),
    "close-stream request": (_CLOSE_STREAM, DcpCloseStream(vbucket=5, opaque=0xDEADBEEF)),
    "stream-request 1": (_STREAM_REQ_1, DcpStreamRequest(
        vbucket=0, start_seqno=0xFFEEDD, end_seqno=MAX_U64, vbucket_uuid=0xFEEDDECA, snap_start_seqno=0,
        snap_end_seqno=0xFFEEFF, flags=0, opaque=0x1000)),
    "stream-request rollback response": (_STREAM_REQ_ROLLBACK, DcpStreamRequestResponse(
        Status.ROLLBACK, rollback_seqno=0, opaque=0x1000)),
    "stream-request 2": (_STREAM_REQ_2, DcpStreamRequest(
        vbucket=0, start_seqno=0, end_seqno=MAX_U64, vbucket_uuid=0xFEEDDECA, snap_start_seqno=0,
        snap_end_seqno=0, flags=0, opaque=0x1000)),
    "stream-request OK response": (_STREAM_REQ_OK, DcpStreamRequestResponse(
        Status.SUCCESS, failover_log=FAILOVER_LOG, opaque=0x1000)),
    "failover-log request": (_FAILOVER_LOG_REQ, DcpGetFailoverLog(vbucket=0, opaque=0xDEADBEEF)),
    "failover-log response": (_FAILOVER_LOG_RESP, FailoverLogResponse(FAILOVER_LOG, opaque=0xDEADBEEF)),
    "stream-end": (_STREAM_END, DcpStreamEnd(vbucket=0, reason=StreamEndReason.OK, opaque=0xDEADBEEF)),
    "snapshot-marker V1": (_MARKER_V1, DcpSnapshotMarker(
        0, 0, 8, SnapshotFlag.MEMORY, MarkerVersion.V1, opaque=0xDEADBEEF)),
    "snapshot-marker V2.0": (_MARKER_V20, DcpSnapshotMarker(
        0, 1, 8, SnapshotFlag.DISK, MarkerVersion.V2_0, max_visible_seqno=8, high_completed_seqno=7,
        opaque=0xDEADBEEF)),
    "snapshot-marker V2.2": (_MARKER_V22, DcpSnapshotMarker(
        0, 1, 8, SnapshotFlag.DISK | SnapshotFlag.CHECKPOINT, MarkerVersion.V2_2, max_visible_seqno=8,
        high_completed_seqno=7, purge_seqno=3, high_prepared_seqno=8, opaque=0xDEADBEEF)),
    "mutation": (_MUTATION, DcpMutation(
        vbucket=0x210, by_seqno=4, rev_seqno=1, flags=0, expiration=0, lock_time=0, key=b"hello",
        value=b"world", cas=0, datatype=0, opaque=0x1210, nru=0)),
    "deletion V1": (_DELETION_V1, DcpDeletion(
        vbucket=0x210, by_seqno=5, rev_seqno=1, key=b"hello", opaque=0x1210, delete_time=None)),
    "deletion V2": (_DELETION_V2, DcpDeletion(
        vbucket=0x210, by_seqno=5, rev_seqno=1, key=b"hello", opaque=0x1210, delete_time=DELETE_TIME)),
    "expiration": (_EXPIRATION, DcpExpiration(
        vbucket=0x210, by_seqno=5, rev_seqno=1, key=b"hello", delete_time=0, opaque=0x1210)),
    "set-vbucket-state": (_SET_VB_STATE, DcpSetVbucketState(0, VBucketState.DEAD, 0xDEADBEEF)),
    "no-op request": (_NOOP, DcpNoop(opaque=5)),
    "no-op response": (_NOOP_RESPONSE, RawResponse(Opcode.DCP_NOOP, Status.SUCCESS, opaque=5)),
    "buffer-ack request": (_BUFFER_ACK, DcpBufferAck(bytes_acked=4096, opaque=5, vbucket=0)),
    "buffer-ack response": (_BUFFER_ACK_RESPONSE,
                            RawResponse(Opcode.DCP_BUFFER_ACKNOWLEDGEMENT, Status.SUCCESS, opaque=5)),
    "control request": (_CONTROL, DcpControl(b"enable_noop", b"true", opaque=1)),
    "control response": (_CONTROL_RESPONSE, RawResponse(Opcode.DCP_CONTROL, Status.SUCCESS, opaque=1)),
    "system-event begin collection": (_SYSTEM_EVENT, DcpSystemEvent(
        vbucket=0x210, by_seqno=4, event=SystemEventId.BEGIN_COLLECTION, version=1, key=b"mycollection",
        value=_SYSTEM_EVENT_VALUE, opaque=0x1210)),
    "prepare": (_PREPARE, DcpPrepare(
        vbucket=0x210, by_seqno=4, rev_seqno=1, flags=0, expiration=0, lock_time=0, key=b"hello",
        value=b"world", cas=PREPARE_CAS, durability_level=DurabilityLevel.MAJORITY, deleted=False,
        datatype=0, opaque=0x1210, nru=0)),
    "commit": (_COMMIT, DcpCommit(vbucket=0x210, prepared_seqno=4, commit_seqno=5, key=b"hello",
                                  opaque=0x1210)),
    "abort": (_ABORT, DcpAbort(vbucket=0x210, prepared_seqno=4, abort_seqno=5, key=b"hello", opaque=0x1210)),
    "seqno-acknowledged": (_SEQNO_ACK, DcpSeqnoAcknowledged(vbucket=0x210, prepared_seqno=4, opaque=0x1210)),
    "seqno-advanced": (_SEQNO_ADVANCED, DcpSeqnoAdvanced(vbucket=0, by_seqno=4, opaque=0xDEADBEEF)),
    "oso-snapshot start": (_OSO, DcpOsoSnapshot(vbucket=0, flags=OsoFlag.START, opaque=0xDEADBEEF)),
    "cache-transfer": (_CACHE_TRANSFER, DcpCacheTransfer(
        vbucket=0x210, records=(CacheTransferRecord(cas=4, by_seqno=1, rev_seqno=5, flags=0, expiration=0,
                                                    datatype=0, cache_hint=0x0A, key=b"hello",
                                                    value=b"world"),),
        opaque=0x1210)),
    "cache-transfer-end": (_CACHE_TRANSFER_END, DcpCacheTransferEnd(vbucket=0x210, opaque=0x1210)),
    "cache-transfer-end with stream-id": (_CACHE_TRANSFER_END_SID, DcpCacheTransferEnd(
        vbucket=0x210, opaque=0x1210, stream_id=1)),
}

#: The name the CLI tests use.
EXAMPLES = REFERENCE_FRAMES

# ---------------------------------------------------------------------------------------------
# Upstream bytes, as printed (self-inconsistent: a decoder must report them)

TRAILING = "trailing bytes do not make a whole frame"  # decode_all: bytes left over
OVERRUN = "exceed the total body length"  # FrameDecoder: extras + key run past the body
# What both the strict decoder (either error above) and `dcpflow inspect` (lenient framing) say when
# a header's total body length contradicts the bytes.
BODY_LENGTH = "total body length"

_UP_MARKER_V1 = h(f"""
    80 56 00 00 | 14 00 00 00 | 00 00 00 00 | de ad be ef | {ZERO8} |
    00 00 00 00 | 00 00 00 00 | 00 00 00 00 | 00 00 00 08 | 00 00 00 01
    """)

_UP_MARKER_V20 = h(f"""
    80 56 00 00 | 14 00 00 00 | 00 00 00 00 | de ad be ef | {ZERO8} |
    01 00 00 00 | 00 00 00 00 | 01 00 00 00 | 00 00 00 00 | 08 00 00 00 | 02 00 00 00 |
    00 00 00 00 | 08 00 00 00 | 00 00 00 00 | 07
    """)

_UP_CONTROL = h(f"80 5e 00 00 | 04 00 00 05 | 00 00 00 04 | 00 00 00 01 | {ZERO8}") + ascii_hex("enable_nooptrue")
_UP_CONTROL_RESPONSE = h(f"81 51 00 00 | 04 00 00 00 | 00 00 00 04 | 00 00 00 01 | {ZERO8}")

_UP_STREAM_REQ_2 = _STREAM_REQ_2[: 64 * 2]
_UP_STREAM_REQ_OK = (h(f"81 53 00 00 | 00 00 00 00 | 00 00 00 40 | 00 00 10 00 | {ZERO8}")
                     + _log_hex(FAILOVER_LOG_AS_PRINTED))
_UP_FAILOVER_LOG_RESP = (h(f"81 54 00 00 | 00 00 00 00 | 00 00 00 40 | de ad be ef | {ZERO8}")
                         + _log_hex(FAILOVER_LOG_AS_PRINTED))

_UP_DELETION_V1 = h(f"""
    80 58 00 05 | 12 00 02 10 | 00 00 00 17 | 00 00 12 10 | {ZERO8} |
    00 00 00 00 | 00 00 00 05 | 00 00 00 00 | 00 00 00 01 | 00 00 01 'c' | ':' ':' 'h' 'e' | 'l' 'l' 'o'
    """)

_UP_EXPIRATION = h(f"""
    80 59 00 05 | 12 00 02 10 | 00 00 00 17 | 00 00 12 10 | {ZERO8} |
    00 00 00 00 | 00 00 00 05 | 00 00 00 00 | 00 00 00 01 | 00 00 00 00 | 'h' 'e' 'l' 'l' | 'o'
    """)

_UP_PREPARE = h(f"""
    80 57 00 05 | 1f 00 02 10 | 00 00 00 29 | 00 00 12 10 | {ZERO8} |
    00 00 00 00 | 00 00 00 04 | 00 00 00 00 | 00 00 00 01 | 00 00 00 00 | 00 00 00 00 |
    00 00 00 00 | 00 00 01 'h' | 'e' 'l' 'l' 'o' | 'w' 'o' 'r' 'l' | 'd'
    """)

_UP_SEQNO_ADVANCED = h(f"80 65 00 00 | 04 00 00 00 | 00 00 00 00 | de ad be ef | {ZERO8} | 00 00 00 00 | 00 00 00 04")
_UP_OSO = h(f"80 65 00 00 | 04 00 00 00 | 00 00 00 00 | de ad be ef | {ZERO8} | 00 00 00 01")
_UP_BUFFER_ACK = h(f"80 5d 00 00 | 00 00 00 00 | 00 00 00 04 | 00 00 00 00 | {ZERO8} | 00 00 10 00")
_UP_NOOP = h(f"80 5c 00 00 | 00 00 00 00 | 00 00 00 00 | 00 00 00 00 | {ZERO8} | 00 00 00 00")

_UP_CACHE_TRANSFER = h(f"""
    80 66 00 00 | 00 00 02 10 | 00 00 00 32 | 00 00 12 10 | {ZERO8} |
    00 00 00 00 | 00 00 00 04 | 00 00 00 00 | 00 00 00 01 | 00 00 00 05 | 00 00 00 00 |
    00 00 00 00 | 00 00 00 00 | 00 05 00 0a | 'h' 'e' 'l' 'l' | 'o' 'w' 'o' 'r' | 'l' 'd'
    """)

# mutation.md's extras diagram read literally: nmeta u16 + nru u8 + clen u8 = 32 bytes of extras.
_UP_MUTATION_CLEN = h(f"""
    80 57 00 05 | 20 00 02 10 | 00 00 00 2a | 00 00 12 10 | {ZERO8} |
    00 00 00 00 | 00 00 00 04 | 00 00 00 00 | 00 00 00 01 | 00 00 00 00 | 00 00 00 00 |
    00 00 00 00 | 00 00 00 00 | 'h' 'e' 'l' 'l' | 'o' 'w' 'o' 'r' | 'l' 'd'
    """)

# set-vbucket-state.md "May have a value (set-vbucket-state-value.md)": the example with a
# `topology` JSON value (datatype JSON, 1 + 17 bytes of body).
_UP_SET_VB_STATE_VALUE = h(f"80 5b 00 00 | 01 01 00 00 | 00 00 00 12 | de ad be ef | {ZERO8} | 04") + ascii_hex(
    '{"topology":[[]]}')


def patch(hexstr: str, offset: int, new: str) -> str:
    """`hexstr` with the bytes at `offset` replaced by `new` (hex, same length)."""
    data = bytearray(bytes.fromhex(hexstr))
    repl = bytes.fromhex(h(new))
    data[offset:offset + len(repl)] = repl
    return data.hex()


UPSTREAM_EXAMPLES: dict[str, tuple[str, int, str]] = {
    # snapshot-marker.md
    "snapshot-marker V1": (_UP_MARKER_V1, 2, BODY_LENGTH),
    "snapshot-marker V2.0": (_UP_MARKER_V20, 4, BODY_LENGTH),
    "snapshot-marker V2.0 [erratum 3 only]": (patch(_MARKER_V20, 4, "14"), 3, "must not have a value"),
    "snapshot-marker V2.0 [erratum 4 only]": (patch(_MARKER_V20, 8, "00 00 00 00"), 4, BODY_LENGTH),
    "snapshot-marker V2.0 [erratum 5 only]": (patch(_MARKER_V20, 24, "01"), 5, "version 0x01 is invalid"),
    # control.md
    "control request": (_UP_CONTROL, 8, BODY_LENGTH),
    "control request [erratum 6 only]": (patch(_CONTROL, 2, "00 00"), 6, "must have a key"),
    "control request [erratum 7 only]": (patch(_CONTROL, 4, "04"), 7, "must not have extras"),
    "control request [erratum 8 only]": (patch(_CONTROL, 8, "00 00 00 04"), 8, BODY_LENGTH),
    "control response": (_UP_CONTROL_RESPONSE, 11, "header says 4 body bytes, only 0 present"),
    "control response [erratum 10 only]": (patch(_CONTROL_RESPONSE, 1, "51"), 10, "extras must be 4 bytes"),
    "control response [erratum 11 only]": (
        h(f"81 5e 00 00 | 04 00 00 00 | 00 00 00 04 | 00 00 00 01 | {ZERO8} | 00 00 00 00"), 11,
        "must not have extras"),
    # stream-request.md / failover-log.md
    "stream-request 2": (_UP_STREAM_REQ_2, 15, "header says 48 body bytes, only 40 present"),
    "stream-request OK response": (_UP_STREAM_REQ_OK, 16, "not newest-first"),
    "failover-log response": (_UP_FAILOVER_LOG_RESP, 16, "not newest-first"),
    # mutation.md: the extras diagram's `clen` byte (32-byte extras)
    "mutation [erratum 21: extras with clen]": (_UP_MUTATION_CLEN, 21, "extras must be 31 bytes"),
    # deletion.md / expiration.md
    "deletion V1": (_UP_DELETION_V1, 22, BODY_LENGTH),
    "expiration": (_UP_EXPIRATION, 24, BODY_LENGTH),
    "expiration [erratum 24: extras 0x12]": (patch(_EXPIRATION, 4, "12"), 24, "extras must be 20 bytes"),
    # prepare.md: the table's reading (opcode 0x60, CAS 0)
    "prepare [erratum 25: CAS 0]": (patch(_PREPARE, 16, ZERO8), 25, "non-zero CAS"),
    # seqno-advanced.md, oso_snapshot.md, buffer-ack.md, no-op.md
    "seqno-advanced": (_UP_SEQNO_ADVANCED, 26, BODY_LENGTH),
    "oso-snapshot": (_UP_OSO, 27, BODY_LENGTH),
    "buffer-ack request": (_UP_BUFFER_ACK, 28, "extras must be 4 bytes"),
    "no-op request": (_UP_NOOP, 29, BODY_LENGTH),
    # set-vbucket-state.md "May have a value": the validator rejects any value
    "set-vbucket-state [erratum 30: with a value]": (_UP_SET_VB_STATE_VALUE, 30, "must not have a value"),
    # cache-transfer.md
    "cache-transfer": (_UP_CACHE_TRANSFER, 32, BODY_LENGTH),
}

UPSTREAM_UNDETECTED: dict[str, tuple[str, int, str]] = {
    "snapshot-marker V1 type label": (_MARKER_V1, 1, "type 0x01 is labelled (disk) but is Memory"),
    "control request vbucket 5": (patch(_CONTROL, 6, "00 05"), 9, "vbucket 5 is meaningless; 0 expected"),
    "stream-request 1 grid snapshot start": (patch(_STREAM_REQ_1, 56, "00 00 00 00 00 ff ee dd"), 14,
                                             "grid has snap start 0xffeedd, the table 0"),
    "prepare as printed (opcode 0x57)": (_UP_PREPARE, 25, "opcode 0x57 makes it a valid DCP_MUTATION"),
    "system-event scope/collection swapped": (
        patch(_SYSTEM_EVENT, 57, "00 00 00 08 | 00 00 00 00"), 31, "scope id 8, collection id 0"),
}
