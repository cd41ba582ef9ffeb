"""Structural rules of every DCP command, as KV-Engine's command pages state them ("Must have extras /
Must not have key...", https://github.com/couchbase/kv_engine/tree/master/docs/dcp/documentation/commands)
and as its code enforces them (flag values and combinations, extras sizes, small enums), positive
and negative, with the status a server answers.

`rules.problems(frame)` lists every rule broken; decoders raise the first one (`rules.check`).
"""

import json

import pytest

from dcpflow.protocol import rules
from dcpflow.protocol.dcp import (
    CacheTransferRecord,
    DcpCacheTransfer,
    DcpOpen,
    DcpStreamRequest,
    OpenFlag,
    StreamFlag,
    decode_dcp,
)
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import Frame, Magic, stream_id_frame
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

EINVAL = Status.EINVAL
U32 = 0xFFFFFFFF


def req(opcode, extras=b"", key=b"", value=b"", *, cas=0, datatype=0, vbucket=0, framing=b"", opaque=0x42):
    magic = Magic.ALT_REQUEST if framing else Magic.REQUEST
    return Frame(magic, opcode, datatype, vbucket, opaque, cas, framing, extras, key, value)


def resp(opcode, status=Status.SUCCESS, extras=b"", key=b"", value=b""):
    return Frame(Magic.RESPONSE, opcode, 0, status, 0x42, 0, b"", extras, key, value)


def u32(n):
    return n.to_bytes(4, "big")


def u64(n):
    return n.to_bytes(8, "big")


def open_extras(flags):
    return u32(0) + u32(flags)


def stream_extras(flags=0, start=0, end=U32, uuid=0, snap_start=0, snap_end=0):
    return u32(flags) + u32(0) + u64(start) + u64(end) + u64(uuid) + u64(snap_start) + u64(snap_end)


def marker_v1(start=0, end=8, flags=0x01):
    return u64(start) + u64(end) + u32(flags)


def marker_v2(start=1, end=8, flags=0x02, mvs=8, hcs=7, purge=None, hps=None):
    body = u64(start) + u64(end) + u32(flags) + u64(mvs) + u64(hcs)
    if purge is not None:
        body += u64(purge) + u64(hps or 0)
    return body


def mutation_extras(nmeta=0, nru=0):
    return u64(4) + u64(1) + u32(0) + u32(0) + u32(0) + nmeta.to_bytes(2, "big") + bytes([nru])


def deletion_v1(nmeta=0):
    return u64(5) + u64(1) + nmeta.to_bytes(2, "big")


def deletion_v2():
    return u64(5) + u64(1) + u32(1234) + b"\x00"


def prepare_extras(level=1, deleted=0):
    return u64(4) + u64(1) + u32(0) + u32(0) + u32(0) + bytes([0, deleted, level])


def record(key=b"\x00k", value=b"v", cas=4):
    return (cas.to_bytes(8, "big") + u64(1) + u64(5) + u32(len(value)) + u32(0) + u32(0)
            + len(key).to_bytes(2, "big") + b"\x00\x0a" + key + value)


CONSUMER_NAME = json.dumps({"consumer_name": "replica-1"}).encode()

# ---------------------------------------------------------------------------------------------
# Frames that break no rule

VALID = {
    # DCP_OPEN (open-connection.md; flag values and combinations as KV-Engine's code checks them)
    "open consumer": req(Opcode.DCP_OPEN, open_extras(0), b"conn"),
    "open producer": req(Opcode.DCP_OPEN, open_extras(0x01), b"conn"),
    "open producer all compatible flags": req(Opcode.DCP_OPEN, open_extras(0x01 | 0x04 | 0x08 | 0x20 | 0x100 | 0x200),
                                              b"c"),
    "open producer novalue-with-datatype": req(Opcode.DCP_OPEN, open_extras(0x01 | 0x40), b"c"),
    "open consumer with consumer_name": req(Opcode.DCP_OPEN, open_extras(0), b"c", CONSUMER_NAME, datatype=1),
    "open consumer with empty JSON object": req(Opcode.DCP_OPEN, open_extras(0), b"c", b"{}", datatype=1),
    "open reserved non-zero": req(Opcode.DCP_OPEN, u32(7) + u32(1), b"c"),
    "open response": resp(Opcode.DCP_OPEN),
    # DCP_ADD_STREAM (add-stream.md; stream flags as KV-Engine's code checks them)
    "add-stream no flags": req(Opcode.DCP_ADD_STREAM, u32(0), vbucket=5),
    "add-stream every valid flag but cache transfer": req(Opcode.DCP_ADD_STREAM, u32(0xF7)),
    "add-stream cache transfer alone": req(Opcode.DCP_ADD_STREAM, u32(0x100)),
    "add-stream cache transfer + takeover + active-vb-only": req(Opcode.DCP_ADD_STREAM, u32(0x111)),
    "add-stream response": resp(Opcode.DCP_ADD_STREAM, extras=u32(0x1000)),
    "add-stream error response without extras": resp(Opcode.DCP_ADD_STREAM, Status.KEY_EEXISTS),
    # DCP_CLOSE_STREAM
    "close-stream": req(Opcode.DCP_CLOSE_STREAM, vbucket=5),
    "close-stream with stream-id": req(Opcode.DCP_CLOSE_STREAM, framing=stream_id_frame(1)),
    # DCP_STREAM_REQ (stream-request.md, stream-request-value.md)
    "stream-req": req(Opcode.DCP_STREAM_REQ, stream_extras()),
    "stream-req all valid flags but cache transfer": req(Opcode.DCP_STREAM_REQ, stream_extras(0xF7)),
    "stream-req cache transfer + takeover": req(Opcode.DCP_STREAM_REQ, stream_extras(0x101)),
    "stream-req JSON value": req(Opcode.DCP_STREAM_REQ, stream_extras(), value=b'{"collections":["8"],"sid":7}',
                                 datatype=1),
    "stream-req scope value": req(Opcode.DCP_STREAM_REQ, stream_extras(), value=b'{"scope":"8"}', datatype=1),
    "stream-req OK response, empty log": resp(Opcode.DCP_STREAM_REQ),
    "stream-req OK response": resp(Opcode.DCP_STREAM_REQ, value=u64(2) + u64(10) + u64(1) + u64(0)),
    "stream-req rollback response": resp(Opcode.DCP_STREAM_REQ, Status.ROLLBACK, value=u64(0)),
    "stream-req ERANGE response": resp(Opcode.DCP_STREAM_REQ, Status.ERANGE),
    # DCP_GET_FAILOVER_LOG
    "failover-log": req(Opcode.DCP_GET_FAILOVER_LOG),
    "failover-log response": resp(Opcode.DCP_GET_FAILOVER_LOG, value=u64(1) + u64(0)),
    "failover-log error response": resp(Opcode.DCP_GET_FAILOVER_LOG, Status.NOT_MY_VBUCKET),
    # DCP_STREAM_END
    "stream-end": req(Opcode.DCP_STREAM_END, u32(0)),
    "stream-end unknown reason": req(Opcode.DCP_STREAM_END, u32(8)),
    # DCP_SNAPSHOT_MARKER (snapshot-marker.md: V1 20-byte extras; V2.x a version byte + value)
    "marker V1": req(Opcode.DCP_SNAPSHOT_MARKER, marker_v1()),
    "marker V1 start == end": req(Opcode.DCP_SNAPSHOT_MARKER, marker_v1(5, 5, 0x06)),
    "marker V1 all flags but memory": req(Opcode.DCP_SNAPSHOT_MARKER, marker_v1(flags=0x3E)),
    "marker V2.0": req(Opcode.DCP_SNAPSHOT_MARKER, b"\x00", value=marker_v2()),
    "marker V2.2": req(Opcode.DCP_SNAPSHOT_MARKER, b"\x02", value=marker_v2(purge=3, hps=8)),
    "marker ack response": resp(Opcode.DCP_SNAPSHOT_MARKER),
    # DCP_MUTATION / DELETION / EXPIRATION
    "mutation": req(Opcode.DCP_MUTATION, mutation_extras(nru=2), b"k", b"v"),
    "mutation without value": req(Opcode.DCP_MUTATION, mutation_extras(), b"k"),
    "deletion V1": req(Opcode.DCP_DELETION, deletion_v1(), b"k"),
    "deletion V2": req(Opcode.DCP_DELETION, deletion_v2(), b"k"),
    # a deletion may carry a value: its xattrs (deletion.md says it must not have one)
    "deletion with xattr value (erratum 23)": req(Opcode.DCP_DELETION, deletion_v2(), b"k", b"\x00" * 4, datatype=4),
    "expiration": req(Opcode.DCP_EXPIRATION, u64(5) + u64(1) + u32(0), b"k"),
    # DCP_SET_VBUCKET_STATE
    **{f"set-vbucket-state {s}": req(Opcode.DCP_SET_VBUCKET_STATE, bytes([s])) for s in (1, 2, 3, 4)},
    "set-vbucket-state response": resp(Opcode.DCP_SET_VBUCKET_STATE),
    # DCP_NOOP / BUFFER_ACK / CONTROL
    "noop": req(Opcode.DCP_NOOP),
    "noop response": resp(Opcode.DCP_NOOP),
    "buffer-ack": req(Opcode.DCP_BUFFER_ACKNOWLEDGEMENT, u32(4096)),
    "control": req(Opcode.DCP_CONTROL, key=b"enable_noop", value=b"true"),
    "control response": resp(Opcode.DCP_CONTROL),
    "control error response with text": resp(Opcode.DCP_CONTROL, Status.EINVAL, value=b"unknown key"),
    # DCP_SYSTEM_EVENT
    "system event with key and value": req(Opcode.DCP_SYSTEM_EVENT, u64(4) + u32(0) + b"\x01", b"c", bytes(20)),
    "system event without key": req(Opcode.DCP_SYSTEM_EVENT, u64(4) + u32(1) + b"\x00", value=bytes(16)),
    # SyncWrites
    **{f"prepare level {lv}": req(Opcode.DCP_PREPARE, prepare_extras(lv), b"k", b"v", cas=1) for lv in (1, 2, 3)},
    "prepare of a delete": req(Opcode.DCP_PREPARE, prepare_extras(deleted=1), b"k", cas=7),
    "seqno-ack": req(Opcode.DCP_SEQNO_ACKNOWLEDGED, u64(4)),
    "commit": req(Opcode.DCP_COMMIT, u64(4) + u64(5), b"k"),
    "abort": req(Opcode.DCP_ABORT, u64(4) + u64(5), b"k"),
    # DCP_SEQNO_ADVANCED / OSO
    "seqno-advanced": req(Opcode.DCP_SEQNO_ADVANCED, u64(9)),
    "oso start": req(Opcode.DCP_OSO_SNAPSHOT, u32(1)),
    "oso end": req(Opcode.DCP_OSO_SNAPSHOT, u32(2)),
    # Cache transfer
    "cache-transfer one record": req(Opcode.DCP_CACHE_TRANSFER, value=record()),
    "cache-transfer two records, key only": req(Opcode.DCP_CACHE_TRANSFER, value=record() + record(b"\x08ab", b"")),
    "cache-transfer-end": req(Opcode.DCP_CACHE_TRANSFER_END),
    # Stream messages framed with a stream-id
    "mutation with stream-id": req(Opcode.DCP_MUTATION, mutation_extras(), b"k", framing=stream_id_frame(65535)),
}


@pytest.mark.parametrize("name", sorted(VALID))
def test_frame_breaks_no_rule(name):
    frame = VALID[name]
    assert rules.problems(frame) == []
    decode_dcp(frame)  # and the typed decoder accepts it


# ---------------------------------------------------------------------------------------------
# Frames that break a rule: (frame, status, substring of the reason)

BAD_OPEN = {
    "open flag 0x02": (req(Opcode.DCP_OPEN, open_extras(0x03), b"c"), EINVAL, "InvalidNotifier are invalid"),
    "open flag 0x10": (req(Opcode.DCP_OPEN, open_extras(0x11), b"c"), EINVAL, "Unused are invalid"),
    "open flag 0x80": (req(Opcode.DCP_OPEN, open_extras(0x81), b"c"), EINVAL, "PitrRemoved are invalid"),
    "open unknown flag 0x400": (req(Opcode.DCP_OPEN, open_extras(0x401), b"c"), EINVAL, "unknown flag bits 0x400"),
    "open novalue + novalue-with-datatype": (req(Opcode.DCP_OPEN, open_extras(0x49), b"c"), EINVAL,
                                             "mutually exclusive"),
    "open deleted user xattrs without xattrs": (req(Opcode.DCP_OPEN, open_extras(0x101), b"c"), EINVAL,
                                                "requires IncludeXattrs"),
    "open skip deletes on a consumer": (req(Opcode.DCP_OPEN, open_extras(0x200), b"c"), EINVAL, "producers only"),
    "open value without JSON datatype": (req(Opcode.DCP_OPEN, open_extras(0), b"c", CONSUMER_NAME), EINVAL,
                                         "datatype JSON"),
    "open value not JSON": (req(Opcode.DCP_OPEN, open_extras(0), b"c", b"{nope", datatype=1), EINVAL,
                            "not valid JSON"),
    "open value with another key": (req(Opcode.DCP_OPEN, open_extras(0), b"c", b'{"consumer_name":"a","x":1}',
                                        datatype=1), EINVAL, "only hold 'consumer_name'"),
    "open value a JSON array": (req(Opcode.DCP_OPEN, open_extras(0), b"c", b'["consumer_name"]', datatype=1),
                                EINVAL, "only hold 'consumer_name'"),
    "open consumer_name on a producer": (req(Opcode.DCP_OPEN, open_extras(1), b"c", CONSUMER_NAME, datatype=1),
                                         EINVAL, "only for opening a consumer"),
    "open without name": (req(Opcode.DCP_OPEN, open_extras(1)), EINVAL, "must have a key"),
    "open with 4-byte extras": (req(Opcode.DCP_OPEN, u32(1), b"c"), EINVAL, "extras must be 8 bytes"),
    "open response with a value": (resp(Opcode.DCP_OPEN, value=b"x"), EINVAL, "must not have a value"),
}

BAD_STREAM_SETUP = {
    "add-stream flag 0x08": (req(Opcode.DCP_ADD_STREAM, u32(0x08)), EINVAL, "0x08 (NoValue) is no longer used"),
    "add-stream unknown flag 0x200": (req(Opcode.DCP_ADD_STREAM, u32(0x200)), EINVAL, "unknown flag bits 0x200"),
    **{f"add-stream cache transfer + 0x{f:02x}": (req(Opcode.DCP_ADD_STREAM, u32(0x100 | f)), EINVAL,
                                                  "CacheTransfer may only be combined")
       for f in (0x02, 0x04, 0x20, 0x40, 0x80)},
    "add-stream without extras": (req(Opcode.DCP_ADD_STREAM), EINVAL, "extras must be 4 bytes"),
    "add-stream with a key": (req(Opcode.DCP_ADD_STREAM, u32(0), b"k"), EINVAL, "must not have a key"),
    "add-stream with a value": (req(Opcode.DCP_ADD_STREAM, u32(0), value=b"v"), EINVAL, "must not have a value"),
    "add-stream OK response without stream opaque": (resp(Opcode.DCP_ADD_STREAM), EINVAL, "extras must be 4 bytes"),
    "stream-req flag 0x08": (req(Opcode.DCP_STREAM_REQ, stream_extras(0x08)), EINVAL, "no longer used"),
    "stream-req unknown flag": (req(Opcode.DCP_STREAM_REQ, stream_extras(0x1000 | 0x08)), EINVAL,
                                "unknown flag bits 0x1000 "),
    "stream-req cache transfer + disk only": (req(Opcode.DCP_STREAM_REQ, stream_extras(0x102)), EINVAL,
                                              "CacheTransfer may only be combined"),
    "stream-req 40-byte extras": (req(Opcode.DCP_STREAM_REQ, stream_extras()[:40]), EINVAL,
                                  "extras must be 48 bytes"),
    "stream-req with a key": (req(Opcode.DCP_STREAM_REQ, stream_extras(), b"k"), EINVAL, "must not have a key"),
    "stream-req value not JSON": (req(Opcode.DCP_STREAM_REQ, stream_extras(), value=b"{", datatype=1), EINVAL,
                                  "not valid JSON"),
    "stream-req value not an object": (req(Opcode.DCP_STREAM_REQ, stream_extras(), value=b"[]", datatype=1),
                                       EINVAL, "JSON object"),
    "stream-req sid 0": (req(Opcode.DCP_STREAM_REQ, stream_extras(), value=b'{"sid":0}', datatype=1),
                         Status.DCP_STREAM_ID_INVALID, "1..65535"),
    "stream-req sid 65536": (req(Opcode.DCP_STREAM_REQ, stream_extras(), value=b'{"sid":65536}', datatype=1),
                             Status.DCP_STREAM_ID_INVALID, "1..65535"),
    "stream-req sid a string": (req(Opcode.DCP_STREAM_REQ, stream_extras(), value=b'{"sid":"7"}', datatype=1),
                                Status.DCP_STREAM_ID_INVALID, "1..65535"),
    "stream-req sid true": (req(Opcode.DCP_STREAM_REQ, stream_extras(), value=b'{"sid":true}', datatype=1),
                            Status.DCP_STREAM_ID_INVALID, "1..65535"),
    "stream-req sid null": (req(Opcode.DCP_STREAM_REQ, stream_extras(), value=b'{"sid":null}', datatype=1),
                            Status.DCP_STREAM_ID_INVALID, "1..65535"),
    "stream-req collections and scope": (req(Opcode.DCP_STREAM_REQ, stream_extras(),
                                             value=b'{"collections":["8"],"scope":"8"}', datatype=1), EINVAL,
                                         "not both"),
    "stream-req OK response with a partial entry": (resp(Opcode.DCP_STREAM_REQ, value=bytes(24)), EINVAL,
                                                    "N x 16 bytes"),
    "stream-req OK response oldest-first": (resp(Opcode.DCP_STREAM_REQ, value=u64(1) + u64(0) + u64(2) + u64(9)),
                                            EINVAL, "not newest-first"),
    "stream-req rollback response with 4 bytes": (resp(Opcode.DCP_STREAM_REQ, Status.ROLLBACK, value=u32(0)),
                                                  EINVAL, "exactly a u64 rollback seqno"),
    "stream-req OK response with extras": (resp(Opcode.DCP_STREAM_REQ, extras=u32(0)), EINVAL,
                                           "must not have extras"),
    "failover-log with a value": (req(Opcode.DCP_GET_FAILOVER_LOG, value=b"x"), EINVAL, "must not have a value"),
    "failover-log OK response without a log": (resp(Opcode.DCP_GET_FAILOVER_LOG), EINVAL, "must have a value"),
    "failover-log response of 20 bytes": (resp(Opcode.DCP_GET_FAILOVER_LOG, value=bytes(20)), EINVAL,
                                          "N x 16 bytes"),
    "close-stream with extras": (req(Opcode.DCP_CLOSE_STREAM, u32(0)), EINVAL, "must not have extras"),
    "close-stream with stream-id 0": (req(Opcode.DCP_CLOSE_STREAM, framing=b"\x22\x00\x00"),
                                      Status.DCP_STREAM_ID_INVALID, "stream-id 0"),
}

BAD_STREAM_MESSAGES = {
    "stream-end without extras": (req(Opcode.DCP_STREAM_END), EINVAL, "extras must be 4 bytes"),
    "stream-end with a value": (req(Opcode.DCP_STREAM_END, u32(0), value=b"x"), EINVAL, "must not have a value"),
    # snapshot marker
    "marker without extras": (req(Opcode.DCP_SNAPSHOT_MARKER), EINVAL, "extras must be 20 or 1 bytes"),
    "marker with a key": (req(Opcode.DCP_SNAPSHOT_MARKER, marker_v1(), b"k"), EINVAL, "must not have a key"),
    "marker V1 with a value": (req(Opcode.DCP_SNAPSHOT_MARKER, marker_v1(), value=b"x"), EINVAL,
                               "must not have a value"),
    "marker V2.0 value 35": (req(Opcode.DCP_SNAPSHOT_MARKER, b"\x00", value=marker_v2()[:35]), EINVAL,
                             "must be 36 bytes"),
    "marker V2.0 value 52": (req(Opcode.DCP_SNAPSHOT_MARKER, b"\x00", value=marker_v2(purge=1, hps=1)), EINVAL,
                             "must be 36 bytes"),
    "marker V2.0 without value": (req(Opcode.DCP_SNAPSHOT_MARKER, b"\x00"), EINVAL, "must be 36 bytes"),
    "marker V2.2 value 36": (req(Opcode.DCP_SNAPSHOT_MARKER, b"\x02", value=marker_v2()), EINVAL,
                             "must be 52 bytes"),
    "marker version 0x01": (req(Opcode.DCP_SNAPSHOT_MARKER, b"\x01", value=marker_v2()), EINVAL,
                            "version 0x01 is invalid"),
    "marker version 0x03": (req(Opcode.DCP_SNAPSHOT_MARKER, b"\x03", value=marker_v2(purge=1, hps=1)), EINVAL,
                            "version 0x03 is invalid"),
    "marker 2-byte extras": (req(Opcode.DCP_SNAPSHOT_MARKER, b"\x00\x00", value=marker_v2()), EINVAL,
                             "extras must be 20 or 1 bytes"),
    "marker V1 start > end": (req(Opcode.DCP_SNAPSHOT_MARKER, marker_v1(9, 8)), EINVAL, "greater than"),
    "marker V2.0 start > end": (req(Opcode.DCP_SNAPSHOT_MARKER, b"\x00", value=marker_v2(9, 8)), EINVAL,
                                "greater than"),
    "marker unknown flag 0x40": (req(Opcode.DCP_SNAPSHOT_MARKER, marker_v1(flags=0x41)), EINVAL,
                                 "unknown flag bits 0x40"),
    "marker memory and disk": (req(Opcode.DCP_SNAPSHOT_MARKER, marker_v1(flags=0x03)), EINVAL,
                               "both Memory and Disk"),
    # mutation
    "mutation 32-byte extras": (req(Opcode.DCP_MUTATION, mutation_extras() + b"\x00", b"k"), EINVAL,
                                "extras must be 31 bytes"),
    "mutation without key": (req(Opcode.DCP_MUTATION, mutation_extras(), value=b"v"), EINVAL, "must have a key"),
    "mutation with nmeta": (req(Opcode.DCP_MUTATION, mutation_extras(nmeta=3), b"k", b"vmeta"), EINVAL,
                            "nmeta must be 0"),
    # deletion
    "deletion 20-byte extras": (req(Opcode.DCP_DELETION, u64(5) + u64(1) + u32(0), b"k"), EINVAL,
                                "extras must be 18 or 21 bytes"),
    "deletion without key": (req(Opcode.DCP_DELETION, deletion_v2()), EINVAL, "must have a key"),
    "deletion V1 with nmeta": (req(Opcode.DCP_DELETION, deletion_v1(2), b"k"), EINVAL, "nmeta must be 0"),
    # expiration
    "expiration 18-byte extras": (req(Opcode.DCP_EXPIRATION, deletion_v1(), b"k"), EINVAL, "extras must be 20"),
    "expiration 21-byte extras": (req(Opcode.DCP_EXPIRATION, deletion_v2(), b"k"), EINVAL, "extras must be 20"),
    "expiration without key": (req(Opcode.DCP_EXPIRATION, u64(5) + u64(1) + u32(0)), EINVAL, "must have a key"),
    # set-vbucket-state
    "set-vbucket-state 0": (req(Opcode.DCP_SET_VBUCKET_STATE, b"\x00"), EINVAL, "vbucket state 0"),
    "set-vbucket-state 5": (req(Opcode.DCP_SET_VBUCKET_STATE, b"\x05"), EINVAL, "vbucket state 5"),
    "set-vbucket-state 4-byte extras": (req(Opcode.DCP_SET_VBUCKET_STATE, u32(1)), EINVAL, "extras must be 1"),
    # DCP_SET_VBUCKET_STATE (0x5b) takes no value; the JSON value belongs to SET_VBUCKET (0x3d)
    "set-vbucket-state with a value (erratum 30)": (req(Opcode.DCP_SET_VBUCKET_STATE, b"\x01", value=b"{}",
                                                        datatype=1), EINVAL, "must not have a value"),
    # noop, buffer-ack, control
    "noop with extras": (req(Opcode.DCP_NOOP, u32(0)), EINVAL, "must not have extras"),
    "noop with a key": (req(Opcode.DCP_NOOP, key=b"k"), EINVAL, "must not have a key"),
    "noop response with a value": (resp(Opcode.DCP_NOOP, value=b"x"), EINVAL, "must not have a value"),
    "buffer-ack 8-byte extras": (req(Opcode.DCP_BUFFER_ACKNOWLEDGEMENT, u64(1)), EINVAL, "extras must be 4"),
    "control without value": (req(Opcode.DCP_CONTROL, key=b"enable_noop"), EINVAL, "must have a value"),
    "control without key": (req(Opcode.DCP_CONTROL, value=b"true"), EINVAL, "must have a key"),
    "control with extras": (req(Opcode.DCP_CONTROL, u32(0), b"k", b"v"), EINVAL, "must not have extras"),
    # system event
    "system event 12-byte extras": (req(Opcode.DCP_SYSTEM_EVENT, u64(4) + u32(0), b"c"), EINVAL,
                                    "extras must be 13"),
    # prepare / seqno-ack / commit / abort
    "prepare CAS 0": (req(Opcode.DCP_PREPARE, prepare_extras(), b"k", b"v"), EINVAL, "non-zero CAS"),
    "prepare level 0": (req(Opcode.DCP_PREPARE, prepare_extras(0), b"k", cas=1), Status.DURABILITY_INVALID_LEVEL,
                        "durability level 0"),
    "prepare level 4": (req(Opcode.DCP_PREPARE, prepare_extras(4), b"k", cas=1), Status.DURABILITY_INVALID_LEVEL,
                        "durability level 4"),
    "prepare without key": (req(Opcode.DCP_PREPARE, prepare_extras(), cas=1), EINVAL, "must have a key"),
    "prepare 30-byte extras": (req(Opcode.DCP_PREPARE, prepare_extras()[:30], b"k", cas=1), EINVAL,
                               "extras must be 31"),
    "seqno-ack CAS non-zero": (req(Opcode.DCP_SEQNO_ACKNOWLEDGED, u64(4), cas=1), EINVAL, "must carry CAS 0"),
    "seqno-ack with a key": (req(Opcode.DCP_SEQNO_ACKNOWLEDGED, u64(4), b"k"), EINVAL, "must not have a key"),
    "seqno-ack 4-byte extras": (req(Opcode.DCP_SEQNO_ACKNOWLEDGED, u32(4)), EINVAL, "extras must be 8"),
    "commit CAS non-zero": (req(Opcode.DCP_COMMIT, u64(4) + u64(5), b"k", cas=9), EINVAL, "must carry CAS 0"),
    "commit without key": (req(Opcode.DCP_COMMIT, u64(4) + u64(5)), EINVAL, "must have a key"),
    "commit with a value": (req(Opcode.DCP_COMMIT, u64(4) + u64(5), b"k", b"v"), EINVAL, "must not have a value"),
    "commit 8-byte extras": (req(Opcode.DCP_COMMIT, u64(4), b"k"), EINVAL, "extras must be 16"),
    "abort CAS non-zero": (req(Opcode.DCP_ABORT, u64(4) + u64(5), b"k", cas=9), EINVAL, "must carry CAS 0"),
    "abort without key": (req(Opcode.DCP_ABORT, u64(4) + u64(5)), EINVAL, "must have a key"),
    "abort with a value": (req(Opcode.DCP_ABORT, u64(4) + u64(5), b"k", b"v"), EINVAL, "must not have a value"),
    # seqno-advanced / OSO
    "seqno-advanced 4-byte extras": (req(Opcode.DCP_SEQNO_ADVANCED, u32(4)), EINVAL, "extras must be 8"),
    "oso flags 0": (req(Opcode.DCP_OSO_SNAPSHOT, u32(0)), EINVAL, "must be 0x01 (start) or 0x02 (end)"),
    "oso flags 3": (req(Opcode.DCP_OSO_SNAPSHOT, u32(3)), EINVAL, "must be 0x01 (start) or 0x02 (end)"),
    "oso with a key": (req(Opcode.DCP_OSO_SNAPSHOT, u32(1), b"k"), EINVAL, "must not have a key"),
    # cache transfer (cache-transfer.md)
    "cache-transfer without value": (req(Opcode.DCP_CACHE_TRANSFER), EINVAL, "must have a value"),
    "cache-transfer with extras": (req(Opcode.DCP_CACHE_TRANSFER, b"\x01", value=record()), EINVAL,
                                   "must not have extras"),
    "cache-transfer with a key": (req(Opcode.DCP_CACHE_TRANSFER, key=b"k", value=record()), EINVAL,
                                  "must not have a key"),
    "cache-transfer CAS non-zero": (req(Opcode.DCP_CACHE_TRANSFER, value=record(), cas=1), EINVAL,
                                    "must carry CAS 0"),
    "cache-transfer short header": (req(Opcode.DCP_CACHE_TRANSFER, value=record()[:39]), EINVAL,
                                    "needs 40 bytes"),
    "cache-transfer truncated record": (req(Opcode.DCP_CACHE_TRANSFER, value=record()[:-1]), EINVAL,
                                        "only 2 remain"),
    "cache-transfer trailing partial record": (req(Opcode.DCP_CACHE_TRANSFER, value=record() + bytes(10)), EINVAL,
                                               "needs 40 bytes; 10 remain"),
    "cache-transfer key_len 1": (req(Opcode.DCP_CACHE_TRANSFER, value=record(b"k")), EINVAL, "key_len must be >= 2"),
    "cache-transfer-end with a value": (req(Opcode.DCP_CACHE_TRANSFER_END, value=b"x"), EINVAL,
                                        "must not have a value"),
    # framing extras on stream messages
    "mutation with stream-id 0": (req(Opcode.DCP_MUTATION, mutation_extras(), b"k", framing=b"\x22\x00\x00"),
                                  Status.DCP_STREAM_ID_INVALID, "stream-id 0"),
    "mutation with a 1-byte stream-id": (req(Opcode.DCP_MUTATION, mutation_extras(), b"k", framing=b"\x21\x01"),
                                         EINVAL, "must be 2 bytes"),
    "marker with unknown frame info 3": (req(Opcode.DCP_SNAPSHOT_MARKER, marker_v1(), framing=b"\x30"),
                                         Status.UNKNOWN_FRAME_INFO, "unknown frame info id 3"),
    "prepare with durability frame level 0": (req(Opcode.DCP_PREPARE, prepare_extras(), b"k", cas=1,
                                                  framing=b"\x11\x00"), Status.DURABILITY_INVALID_LEVEL,
                                              "level 0"),
}

BAD = {**BAD_OPEN, **BAD_STREAM_SETUP, **BAD_STREAM_MESSAGES}


@pytest.mark.parametrize("name", sorted(BAD))
def test_broken_rule_is_reported_with_its_status(name):
    frame, status, reason = BAD[name]
    found = rules.problems(frame)
    matching = [p for p in found if reason in p.reason]
    assert matching, [p.reason for p in found]
    assert all(p.status == status for p in matching)
    assert all(isinstance(p, ProtocolError) and not p.fatal for p in found)


@pytest.mark.parametrize("name", sorted(BAD))
def test_decoder_refuses_a_frame_that_breaks_a_rule(name):
    frame, status, _ = BAD[name]
    with pytest.raises(ProtocolError) as e:
        decode_dcp(frame)
    first = rules.problems(frame)[0]
    assert (e.value.status, e.value.reason) == (first.status, first.reason)
    assert e.value.opcode == frame.opcode and e.value.opaque == 0x42


def test_every_broken_rule_is_listed_not_just_the_first():
    frame = req(Opcode.DCP_OPEN, open_extras(0x02 | 0x08 | 0x40 | 0x100 | 0x200), b"c", b"[1]")
    found = [p.reason for p in rules.problems(frame)]
    for part in ("InvalidNotifier", "mutually exclusive", "requires IncludeXattrs", "producers only",
                 "datatype JSON", "consumer_name"):
        assert any(part in r for r in found), (part, found)


def test_unknown_flag_reason_names_only_the_unknown_bits():
    (unknown,) = [p for p in rules.problems(req(Opcode.DCP_OPEN, open_extras(0x402), b"c")) if "unknown" in p.reason]
    assert "0x400 " in unknown.reason
    (unknown,) = [p for p in rules.problems(req(Opcode.DCP_ADD_STREAM, u32(0x808))) if "unknown" in p.reason]
    assert "0x800 " in unknown.reason


def test_error_responses_skip_the_success_shape():
    """A ROLLBACK carries a seqno, NOT_MY_VBUCKET a cluster map: only successful replies have a shape."""
    assert rules.problems(resp(Opcode.DCP_OPEN, Status.EINVAL, value=b"bad flags")) == []
    assert rules.problems(resp(Opcode.DCP_NOOP, Status.NOT_MY_VBUCKET, value=b'{"rev":1}')) == []


# ---------------------------------------------------------------------------------------------
# DCP_OPEN flags one by one (as KV-Engine's code accepts them)

@pytest.mark.parametrize("bit", [1 << i for i in range(12)])
@pytest.mark.parametrize("producer", [True, False])
def test_open_each_flag_bit(bit, producer):
    flags = bit | (OpenFlag.PRODUCER if producer else 0)
    if bit == OpenFlag.INCLUDE_DELETED_USER_XATTRS:
        flags |= OpenFlag.INCLUDE_XATTRS
    found = rules.problems(req(Opcode.DCP_OPEN, open_extras(flags), b"c"))
    rejected = bit in (0x02, 0x10, 0x80) or bit > 0x200 or (bit == 0x200 and not producer)
    assert bool(found) == rejected, (hex(flags), [p.reason for p in found])
    assert all(p.status == EINVAL for p in found)


# ---------------------------------------------------------------------------------------------
# Stream-request / add-stream flags one by one (as KV-Engine's code accepts them)

@pytest.mark.parametrize("bit", [1 << i for i in range(12)])
@pytest.mark.parametrize("opcode", [Opcode.DCP_ADD_STREAM, Opcode.DCP_STREAM_REQ])
def test_stream_flag_each_bit(bit, opcode):
    extras = u32(bit) if opcode == Opcode.DCP_ADD_STREAM else stream_extras(bit)
    found = rules.problems(req(opcode, extras))
    assert bool(found) == (bit == 0x08 or bit > 0x100)
    assert all(p.status == EINVAL for p in found)


@pytest.mark.parametrize("other", [0x001, 0x002, 0x004, 0x010, 0x020, 0x040, 0x080])
def test_cache_transfer_combination_rule(other):
    found = rules.problems(req(Opcode.DCP_STREAM_REQ, stream_extras(StreamFlag.CACHE_TRANSFER | other)))
    allowed = other in (StreamFlag.TAKEOVER, StreamFlag.ACTIVE_VB_ONLY)
    assert (found == []) == allowed
    assert all("CacheTransfer" in p.reason and p.status == EINVAL for p in found)


# ---------------------------------------------------------------------------------------------
# Stream-request ERANGE (stream-request.md; erratum 17: only start > end is ERANGE, start == end is fine)

@pytest.mark.parametrize("start,end,snap_start,snap_end,ok", [
    (0, 0, 0, 0, True),
    (5, 5, 5, 5, True),  # start == end: accepted (erratum 17)
    (5, 10, 0, 5, True),
    (5, 10, 5, 5, True),
    (5, 10, 5, 9, True),
    (5, U32 ** 2, 3, 7, True),
    (6, 5, 6, 6, False),  # start > end
    (5, 10, 6, 9, False),  # snap_start > start
    (5, 10, 0, 4, False),  # start > snap_end
    (5, 10, 6, 4, False),
])
def test_stream_request_seqno_rule(start, end, snap_start, snap_end, ok):
    msg = DcpStreamRequest(0, start, end, 0, snap_start, snap_end)
    problem = msg.seqno_problem()
    if ok:
        assert problem is None
    else:
        assert problem is not None and problem.status == Status.ERANGE
    # ERANGE is a decision on the values, not a structural rule: the frame itself is sound.
    assert rules.problems(req(Opcode.DCP_STREAM_REQ, stream_extras(0, start, end, 0, snap_start, snap_end))) == []


def test_seqno_problem_names_the_values():
    problem = DcpStreamRequest(0, 5, 10, 0, 6, 9).seqno_problem()
    assert "6" in problem.reason and "5" in problem.reason and "9" in problem.reason


# ---------------------------------------------------------------------------------------------
# Encoders produce frames that satisfy the rules they are checked against

def test_encoded_open_value_is_flagged_json():
    data = DcpOpen(b"c", 0, CONSUMER_NAME).encode()
    assert data[5] == 0x01
    data = DcpStreamRequest(0, 0, value=b'{"sid":3}').encode()
    assert data[5] == 0x01


def test_cache_transfer_record_key_len_below_2_is_refused_by_the_decoder():
    msg = DcpCacheTransfer(1, (CacheTransferRecord(1, 1, 1, 0, 0, 0, 0, b"k", b"v"),))
    with pytest.raises(ProtocolError, match="key_len must be >= 2"):
        decode_dcp(req(Opcode.DCP_CACHE_TRANSFER, value=msg.encode()[24:]))


@pytest.mark.parametrize("opcode", [Opcode.DCP_GET_FAILOVER_LOG, Opcode.GET_FAILOVER_LOG])
def test_failover_log_replies_of_both_opcodes_are_checked(opcode):
    """0x96 is the MCBP twin of 0x54 (BinaryProtocol.md#0x96): the same N x 16, newest-first value."""
    ok = Frame(Magic.RESPONSE, opcode, value=(2).to_bytes(8, "big") + (9).to_bytes(8, "big") + bytes(16))
    assert rules.problems(ok) == []
    rising = Frame(Magic.RESPONSE, opcode, value=bytes(8) + (5).to_bytes(8, "big") + bytes(8) + (9).to_bytes(8, "big"))
    assert "newest-first" in rules.problems(rising)[0].reason
    assert "N x 16" in rules.problems(Frame(Magic.RESPONSE, opcode, value=bytes(17)))[0].reason
