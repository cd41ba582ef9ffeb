"""The producer's per-item packers (protocol/dcp/documents.py) give exactly the bytes of the message
classes, for every field value the wire can carry; and `whole_messages` cuts encoded runs only
between messages."""

from hypothesis import given
from hypothesis import strategies as st

from dcpflow.protocol.dcp import (
    DcpDeletion,
    DcpMutation,
    DcpSnapshotMarker,
    pack_deletion,
    pack_mutation_head,
    pack_mutation_head_sid,
    whole_messages,
)

u16, u32, u64 = st.integers(0, 2**16 - 1), st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1)
keys, values = st.binary(min_size=1, max_size=40), st.binary(max_size=300)


@given(vb=u16, seqno=u64, rev=u64, flags=u32, expiry=u32, key=keys, value=values, cas=u64, datatype=st.integers(0, 7),
       opaque=u32)
def test_pack_mutation_head_is_the_mutation_up_to_its_value(vb, seqno, rev, flags, expiry, key, value, cas, datatype,
                                                             opaque):
    want = DcpMutation(vb, seqno, rev, flags, expiry, 0, key, value, cas, datatype, opaque).encode()
    head = pack_mutation_head(vb, seqno, rev, flags, expiry, key, len(value), cas, datatype, opaque)
    assert head + value == want
    assert len(head) == len(want) - len(value)  # the value may follow uncopied


@given(vb=u16, seqno=u64, rev=u64, flags=u32, expiry=u32, key=st.binary(min_size=1, max_size=255), value=values,
       cas=u64, datatype=st.integers(0, 7), opaque=u32, sid=st.integers(1, 2**16 - 1))
def test_pack_mutation_head_sid_is_the_mutation_with_its_stream_id(vb, seqno, rev, flags, expiry, key, value, cas,
                                                                    datatype, opaque, sid):
    want = DcpMutation(vb, seqno, rev, flags, expiry, 0, key, value, cas, datatype, opaque, 0, sid).encode()
    head = pack_mutation_head_sid(vb, seqno, rev, flags, expiry, key, len(value), cas, datatype, opaque, sid)
    assert head + value == want


@given(vb=u16, seqno=u64, rev=u64, key=keys, value=values, cas=u64, datatype=st.integers(0, 7), opaque=u32,
       delete_time=st.none() | u32)
def test_pack_deletion_is_the_deletion_v1_or_v2(vb, seqno, rev, key, value, cas, datatype, opaque, delete_time):
    want = DcpDeletion(vb, seqno, rev, key, value, cas, datatype, opaque, delete_time).encode()
    assert pack_deletion(vb, seqno, rev, key, value, cas, datatype, opaque, delete_time) == want
    assert len(want) == 24 + (18 if delete_time is None else 21) + len(key) + len(value)


@given(sizes=st.lists(st.integers(0, 200), min_size=1, max_size=12), nbytes=st.integers(0, 4000))
def test_whole_messages_is_the_shortest_prefix_of_whole_messages(sizes, nbytes):
    messages = [DcpMutation(0, i + 1, 1, 0, 0, 0, b"k", b"v" * n).encode() if i % 2 else
                DcpSnapshotMarker(0, 0, i, 1).encode() for i, n in enumerate(sizes)]
    data = b"".join(messages)
    end, count = whole_messages(memoryview(data), nbytes)
    assert end == sum(len(m) for m in messages[:count])  # cut between messages
    assert count >= 1 and (end >= nbytes or count == len(messages))  # holds nbytes, or everything
    assert count == 1 or sum(len(m) for m in messages[:count - 1]) < nbytes  # and is the shortest such
