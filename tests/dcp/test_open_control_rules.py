"""DCP_OPEN and DCP_CONTROL without a socket: the rules tests/dcp/test_open_control.py checks over
a server, asserted on what the protocol's decoders refuse (the frame: DCP_OPEN flags and value,
the shapes of DCP_CONTROL, DCP_CLOSE_STREAM and DCP_GET_FAILOVER_LOG) and on what
`DcpProducer.control` returns for every key (dcp/controls.py's table; the values' own
rules and reasons are in test_controls_table.py).

open-connection.md and control.md as KV-Engine's code behaves: DCP_OPEN flags 0x02, 0x10 and 0x80
are EINVAL, as are 0x08 with 0x40, and 0x100 without 0x04 (erratum 19); `connection_buffer_size` is
a u32, `set_noop_interval` takes any interval from 0.1 s, the V2.2 marker key is
`max_marker_version` (erratum 12), `enable_expiry_opcode` answers OK without IncludeDeleteTimes
(erratum 13), a control has no extras (erratum 7)."""

import json

import pytest

from dcpflow.dcp.controls import CONTROLS as TABLE
from dcpflow.dcp.errors import Refusal
from dcpflow.dcp.outcomes import NOTHING
from dcpflow.protocol import dcp
from dcpflow.protocol.dcp import OpenFlag
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import request
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from .sansio import frame, producer

#: DCP_OPEN flags the decoder refuses (EINVAL), and flags it accepts.
INVALID_OPEN_FLAGS = [OpenFlag.PRODUCER | OpenFlag.INVALID_NOTIFIER, OpenFlag.PRODUCER | OpenFlag.UNUSED,
                      OpenFlag.PRODUCER | OpenFlag.PITR_REMOVED, OpenFlag.PRODUCER | 0x400,
                      OpenFlag.PRODUCER | OpenFlag.NO_VALUE | OpenFlag.NO_VALUE_WITH_UNDERLYING_DATATYPE,
                      OpenFlag.PRODUCER | OpenFlag.INCLUDE_DELETED_USER_XATTRS,
                      OpenFlag.SKIP_DELETES_IN_INITIAL_BACKFILL]
VALID_OPEN_FLAGS = [OpenFlag.PRODUCER, 0, OpenFlag.PRODUCER | OpenFlag.INCLUDE_XATTRS,
                    OpenFlag.PRODUCER | OpenFlag.INCLUDE_XATTRS | OpenFlag.INCLUDE_DELETED_USER_XATTRS,
                    OpenFlag.PRODUCER | OpenFlag.NO_VALUE,
                    OpenFlag.PRODUCER | OpenFlag.NO_VALUE_WITH_UNDERLYING_DATATYPE,
                    OpenFlag.PRODUCER | OpenFlag.SKIP_DELETES_IN_INITIAL_BACKFILL,
                    OpenFlag.PRODUCER | OpenFlag.INCLUDE_DELETE_TIMES]

# key, value, expected status: every key KV-Engine's producer knows (control.md lists only some),
# on a connection without HELLO Collections or Snappy
CONTROLS = [
    ("enable_noop", "true", Status.SUCCESS),
    ("enable_noop", "false", Status.SUCCESS),
    ("enable_noop", "whatever", Status.SUCCESS),
    ("set_noop_interval", "20", Status.SUCCESS),
    ("set_noop_interval", "0.1", Status.SUCCESS),
    ("set_noop_interval", "1.5", Status.SUCCESS),
    ("set_noop_interval", "0.05", Status.EINVAL),
    ("set_noop_interval", "abc", Status.EINVAL),
    ("set_noop_interval", "nan", Status.EINVAL),
    ("connection_buffer_size", "0", Status.SUCCESS),
    ("connection_buffer_size", "4294967295", Status.SUCCESS),
    ("connection_buffer_size", "4294967296", Status.EINVAL),
    ("connection_buffer_size", "-1", Status.EINVAL),
    ("connection_buffer_size", "10k", Status.EINVAL),
    ("stream_buffer_size", "1024", Status.NOT_SUPPORTED),
    ("set_priority", "high", Status.SUCCESS),
    ("set_priority", "medium", Status.SUCCESS),
    ("set_priority", "low", Status.SUCCESS),
    ("set_priority", "urgent", Status.EINVAL),
    ("force_value_compression", "true", Status.EINVAL),  # needs HELLO Snappy, which this connection lacks
    ("supports_cursor_dropping", "true", Status.SUCCESS),
    ("supports_cursor_dropping_vulcan", "true", Status.SUCCESS),
    ("supports_hifi_MFU", "true", Status.SUCCESS),
    ("send_stream_end_on_client_close_stream", "true", Status.SUCCESS),
    ("send_stream_end_on_client_close_stream", "false", Status.SUCCESS),
    ("enable_expiry_opcode", "true", Status.SUCCESS),  # OK even without IncludeDeleteTimes (erratum 13)
    ("enable_stream_id", "false", Status.EINVAL),
    ("enable_sync_writes", "true", Status.SUCCESS),
    ("enable_sync_writes", "false", Status.EINVAL),
    ("consumer_name", "replica-1", Status.SUCCESS),
    ("consumer_name", "", Status.EINVAL),
    ("enable_out_of_order_snapshots", "true", Status.SUCCESS),
    ("enable_out_of_order_snapshots", "true_with_seqno_advanced", Status.SUCCESS),
    ("enable_out_of_order_snapshots", "false", Status.EINVAL),
    ("include_deleted_user_xattrs", "true", Status.EINVAL),  # needs DCP_OPEN flag 0x100
    ("v7_dcp_status_codes", "true", Status.SUCCESS),
    ("v7_dcp_status_codes", "false", Status.EINVAL),
    ("flatbuffers_system_events", "true", Status.SUCCESS),
    ("flatbuffers_system_events", "false", Status.EINVAL),
    ("change_streams", "true", Status.NOT_SUPPORTED),
    ("change_streams", "false", Status.EINVAL),
    ("max_marker_version", "2.2", Status.NOT_SUPPORTED),  # needs HELLO Collections
    ("max_marker_version", "2.0", Status.EINVAL),
    ("backfill_order", "round-robin", Status.SUCCESS),
    ("backfill_order", "sequential", Status.SUCCESS),
    ("backfill_order", "random", Status.EINVAL),
    ("cache_transfer", "true", Status.NOT_SUPPORTED),
    ("no_such_key", "true", Status.EINVAL),
    ("snapshot_max_marker_version", "2.2", Status.EINVAL),  # control.md's name for max_marker_version (erratum 12)
]


def refused(fn) -> int:
    """The status a decoder refuses the frame with."""
    with pytest.raises(ProtocolError) as e:
        fn()
    return e.value.status


def open_frame(flags: int, value: bytes = b"", *, name: bytes = b"x", datatype: int | None = None,
               extras: bytes | None = None):
    raw = dcp.DcpOpen(name, flags, value).encode()
    f = frame(raw)
    if extras is not None:
        f = f._replace(extras=extras)
    if datatype is not None:
        f = f._replace(datatype=datatype)
    return f


# -- DCP_OPEN ----------------------------------------------------------------------------------

@pytest.mark.parametrize("flags", INVALID_OPEN_FLAGS)
def test_open_rejects_invalid_flags(flags):
    assert refused(lambda: dcp.DcpOpen.from_frame(open_frame(flags))) == Status.EINVAL


@pytest.mark.parametrize("flags", VALID_OPEN_FLAGS)
def test_open_accepts_valid_flags(flags):
    req = dcp.DcpOpen.from_frame(open_frame(flags))
    assert (req.flags, req.name, req.is_producer) == (flags, b"x", bool(flags & OpenFlag.PRODUCER))


def test_open_value_rules():
    # a producer may not carry consumer_name
    value = json.dumps({"consumer_name": "r"}).encode()
    assert refused(lambda: dcp.DcpOpen.from_frame(open_frame(OpenFlag.PRODUCER, value))) == Status.EINVAL
    assert dcp.DcpOpen.from_frame(open_frame(0, value)).consumer_name == "r"  # a consumer may
    # the value must be JSON flagged as JSON, holding only consumer_name
    assert refused(lambda: dcp.DcpOpen.from_frame(open_frame(0, value, datatype=0))) == Status.EINVAL
    assert refused(lambda: dcp.DcpOpen.from_frame(open_frame(0, b'{"a":1}'))) == Status.EINVAL
    assert refused(lambda: dcp.DcpOpen.from_frame(open_frame(0, b'{'))) == Status.EINVAL
    assert refused(lambda: dcp.DcpOpen.from_frame(open_frame(OpenFlag.PRODUCER, name=b""))) == Status.EINVAL


@pytest.mark.parametrize("extras", [b"", b"\0" * 4, b"\0" * 12])
def test_open_extras_must_be_8_bytes(extras):
    assert refused(lambda: dcp.DcpOpen.from_frame(open_frame(OpenFlag.PRODUCER, extras=extras))) == Status.EINVAL


# -- DCP_CONTROL -------------------------------------------------------------------------------

def test_the_table_here_covers_every_key():
    assert {key for key, _, _ in CONTROLS} >= set(TABLE)


@pytest.mark.parametrize("key,value,want", CONTROLS, ids=[f"{k}={v}" for k, v, _ in CONTROLS])
def test_control_keys(engine, key, value, want):
    """The status each key and value is answered with; a refused control changes nothing."""
    p = producer(engine)
    before = (p.settings.__class__(**{f: getattr(p.settings, f) for f in p.settings.__slots__}),
              p.noop.enabled, p.noop.interval, p.window.buffer_size)
    out = p.control(key, value, now=100.0, collections=False)
    if want == Status.SUCCESS:
        assert isinstance(out, tuple), out  # what to do, not a Refusal
    else:
        assert isinstance(out, Refusal) and out.status == want and out.reason, out
        after = (p.settings, p.noop.enabled, p.noop.interval, p.window.buffer_size)
        assert after == before


def test_control_error_carries_a_reason(engine):
    out = producer(engine).control("no_such_key", "1", now=100.0, collections=False)
    assert out.status == Status.EINVAL and "no_such_key" in out.reason


def test_include_deleted_user_xattrs_with_its_open_flag(engine):
    p = producer(engine, OpenFlag.PRODUCER | OpenFlag.INCLUDE_XATTRS | OpenFlag.INCLUDE_DELETED_USER_XATTRS)
    assert p.control("include_deleted_user_xattrs", "true", now=100.0, collections=False) == NOTHING


def test_collections_and_snappy_unlock_their_keys(engine):
    p = producer(engine)
    for key in ("max_marker_version", "change_streams"):
        value = "2.2" if key == "max_marker_version" else "true"
        assert p.control(key, value, now=100.0, collections=True) == NOTHING
    assert p.control("force_value_compression", "true", now=100.0, collections=False, snappy=True) == NOTHING
    assert p.settings.marker_v22 and p.settings.change_streams and p.settings.force_compression


def test_control_shape_is_checked():
    no_value = frame(request(Opcode.DCP_CONTROL, key=b"enable_noop"))
    assert refused(lambda: dcp.DcpControl.from_frame(no_value)) == Status.EINVAL
    extras = frame(request(Opcode.DCP_CONTROL, key=b"enable_noop", value=b"true", extras=b"\0\0\0\0"))
    assert refused(lambda: dcp.DcpControl.from_frame(extras)) == Status.EINVAL  # erratum 7
    ok = dcp.DcpControl.from_frame(frame(request(Opcode.DCP_CONTROL, key=b"enable_noop", value=b"true")))
    assert (ok.key, ok.value) == (b"enable_noop", b"true")


# -- the shapes of the other producer commands -------------------------------------------------

@pytest.mark.parametrize("kw", [dict(extras=b"\0\0\0\0"), dict(key=b"k"), dict(value=b"v")])
def test_close_stream_shape(kw):
    f = frame(request(Opcode.DCP_CLOSE_STREAM, vbucket=0, **kw))
    assert refused(lambda: dcp.DcpCloseStream.from_frame(f)) == Status.EINVAL  # close-stream.md
    assert dcp.DcpCloseStream.from_frame(frame(request(Opcode.DCP_CLOSE_STREAM, vbucket=3))).vbucket == 3


def test_get_failover_log_shape():
    for kw in (dict(key=b"k"), dict(value=b"v"), dict(extras=b"1234")):
        f = frame(request(Opcode.DCP_GET_FAILOVER_LOG, vbucket=0, **kw))
        assert refused(lambda f=f: dcp.DcpGetFailoverLog.from_frame(f)) == Status.EINVAL
    assert dcp.DcpGetFailoverLog.from_frame(frame(request(Opcode.DCP_GET_FAILOVER_LOG, vbucket=4))).vbucket == 4
