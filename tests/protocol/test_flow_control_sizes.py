"""`charged_size()`: what a producer charges against the consumer's flow-control buffer for each
message, as KV-Engine's producer counts it (flow-control.md,
https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/flow-control.md): the
message's full wire size, 2 bytes more for a DCP_PREPARE (MB-46634), nothing for a DCP_NOOP.
The expected numbers are the layouts' constants (24-byte header + extras + key + value, e.g.
55 + key + value for a mutation), not computed from the encoder."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcpflow.protocol import dcp
from dcpflow.protocol.dcp import (
    CacheTransferRecord,
    DcpAbort,
    DcpCacheTransfer,
    DcpCacheTransferEnd,
    DcpCommit,
    DcpDeletion,
    DcpExpiration,
    DcpMutation,
    DcpNoop,
    DcpOsoSnapshot,
    DcpPrepare,
    DcpSeqnoAdvanced,
    DcpSetVbucketState,
    DcpSnapshotMarker,
    DcpStreamEnd,
    DcpSystemEvent,
    MarkerVersion,
    charged_size,
)

from .reference_frames import REFERENCE_FRAMES
from .test_dcp_roundtrip import any_request

SID = 3  # stream-id framing extras: 1 byte id/length + u16 sid

keys = st.binary(min_size=1, max_size=250)
values = st.binary(max_size=2000)
sids = st.none() | st.integers(1, 0xFFFF)


def plus_sid(sid):
    return SID if sid is not None else 0


@settings(max_examples=60, deadline=None)
@given(keys, values, sids)
def test_mutation_is_55_plus_key_plus_value(key, value, sid):
    msg = DcpMutation(1, 2, 3, 4, 5, 6, key, value, stream_id=sid)
    assert charged_size(msg) == 55 + len(key) + len(value) + plus_sid(sid)


@settings(max_examples=60, deadline=None)
@given(keys, values, sids, st.none() | st.integers(0, 2**32 - 1))
def test_deletion_v1_is_42_and_v2_is_45_plus_key_plus_value(key, value, sid, delete_time):
    msg = DcpDeletion(1, 2, 3, key, value, delete_time=delete_time, stream_id=sid)
    base = 42 if delete_time is None else 45
    assert charged_size(msg) == base + len(key) + len(value) + plus_sid(sid)


@settings(max_examples=60, deadline=None)
@given(keys, values, sids)
def test_expiration_is_44_plus_key_plus_value(key, value, sid):
    msg = DcpExpiration(1, 2, 3, key, 7, value, stream_id=sid)
    assert charged_size(msg) == 44 + len(key) + len(value) + plus_sid(sid)


@settings(max_examples=60, deadline=None)
@given(keys, values, sids)
def test_prepare_is_57_plus_key_plus_value_two_more_than_the_wire(key, value, sid):
    msg = DcpPrepare(1, 2, 3, 0, 0, 0, key, value, cas=1, stream_id=sid)
    assert charged_size(msg) == 57 + len(key) + len(value) + plus_sid(sid)
    assert charged_size(msg) == len(msg.encode()) + 2


@pytest.mark.parametrize("cls", [DcpCommit, DcpAbort])
@pytest.mark.parametrize("key", [b"k", b"hello", b"x" * 250])
def test_commit_and_abort_are_40_plus_key(cls, key):
    assert charged_size(cls(1, 4, 5, key)) == 40 + len(key)


@pytest.mark.parametrize("version,size", [(MarkerVersion.V1, 44), (MarkerVersion.V2_0, 61), (MarkerVersion.V2_2, 77)])
@pytest.mark.parametrize("sid", [None, 1, 0xFFFF])
def test_snapshot_marker_is_44_61_77(version, size, sid):
    msg = DcpSnapshotMarker(1, 0, 10, 0x02, version, 10, 9, 3, 10, stream_id=sid)
    assert charged_size(msg) == size + plus_sid(sid)


@pytest.mark.parametrize("sid", [None, 7])
def test_fixed_size_stream_messages(sid):
    assert charged_size(DcpStreamEnd(1, 0, stream_id=sid)) == 28 + plus_sid(sid)
    assert charged_size(DcpOsoSnapshot(1, 1, stream_id=sid)) == 28 + plus_sid(sid)
    assert charged_size(DcpSeqnoAdvanced(1, 99, stream_id=sid)) == 32 + plus_sid(sid)


def test_set_vbucket_state_is_25():
    assert charged_size(DcpSetVbucketState(1, 3)) == 25


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=250), values, sids)
def test_system_event_is_37_plus_key_plus_value(key, value, sid):
    msg = DcpSystemEvent(1, 4, 0, 1, key, value, stream_id=sid)
    assert charged_size(msg) == 37 + len(key) + len(value) + plus_sid(sid)


def test_noop_is_free():
    assert charged_size(DcpNoop(opaque=5)) == 0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.binary(min_size=2, max_size=50), st.binary(max_size=100)), min_size=1, max_size=5),
       sids)
def test_cache_transfer_is_24_plus_records(items, sid):
    records = tuple(CacheTransferRecord(1, 2, 3, 0, 0, 0, 0, k, v) for k, v in items)
    msg = DcpCacheTransfer(1, records, stream_id=sid)
    assert charged_size(msg) == 24 + sum(40 + len(k) + len(v) for k, v in items) + plus_sid(sid)


def test_cache_transfer_end_is_24():
    assert charged_size(DcpCacheTransferEnd(1)) == 24


@pytest.mark.parametrize("name,size", [
    ("mutation", 55 + 5 + 5),
    ("deletion V1", 42 + 5),
    ("deletion V2", 45 + 5),
    ("expiration", 44 + 5),
    ("prepare", 57 + 5 + 5),
    ("commit", 40 + 5),
    ("abort", 40 + 5),
    ("snapshot-marker V1", 44),
    ("snapshot-marker V2.0", 61),
    ("snapshot-marker V2.2", 77),
    ("stream-end", 28),
    ("set-vbucket-state", 25),
    ("oso-snapshot start", 28),
    ("seqno-advanced", 32),
    ("system-event begin collection", 37 + 12 + 20),
    ("no-op request", 0),
    ("cache-transfer", 24 + 40 + 5 + 5),
    ("cache-transfer-end", 24),
])
def test_reference_examples_are_charged_per_the_table(name, size):
    assert charged_size(REFERENCE_FRAMES[name][1]) == size


def test_prepare_ack_accounting_differs_from_bytes_received():
    """prepare.md: the consumer must acknowledge the 2 bytes it never received."""
    hexstr, msg = REFERENCE_FRAMES["prepare"]
    assert len(bytes.fromhex(hexstr)) == 65 and charged_size(msg) == 67


@settings(max_examples=300, deadline=None)
@given(any_request)
def test_charge_is_the_wire_size_for_every_message(msg):
    """charged_size computes from lengths (no encode on the producer's hot path); it must still be
    the wire size, with Prepare's extra 2 bytes and free noops."""
    wire = len(msg.encode())
    expected = 0 if isinstance(msg, dcp.DcpNoop) else wire + (2 if isinstance(msg, dcp.DcpPrepare) else 0)
    assert charged_size(msg) == expected
