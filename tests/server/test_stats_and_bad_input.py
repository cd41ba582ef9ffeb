"""STAT groups, and what malformed input does: EINVAL for one bad frame (the connection and everyone
else carry on), E2BIG for a request over the document limit within the packet limit, a disconnect
for a stream that cannot be trusted (bad magic, a frame over the 30 MiB packet limit, extras and key
that run past the body), and kv_engine's order of checks (a request's key before its sender)."""

import struct

import pytest

from dcpflow.protocol.frame import HEADER, MAX_PACKET_LEN, MAX_VALUE_LEN, encode_frame, request
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from .client import Closed


def test_general_stats(admin):
    admin.set(b"a", b"1")
    admin.get(b"a")
    admin.get(b"missing")
    stats = admin.stats()
    assert stats["curr_items"] == "1" and stats["vb_active_num"] == "64" and stats["ep_num_vbuckets"] == "64"
    assert (stats["cmd_get"], stats["get_hits"], stats["get_misses"], stats["cmd_set"]) == ("2", "1", "1", "1")
    assert stats["version"] == "7.6.0-0000" and int(stats["curr_connections"]) >= 1 and int(stats["pid"]) > 0


def test_general_stats_without_a_bucket(server):
    with server.client() as c:
        c.login(bucket=None)
        stats = c.stats()
        assert "curr_items" not in stats and stats["version"] == "7.6.0-0000"


def test_vbucket_seqno_stats(admin):
    r = admin.set(b"s", b"v")
    vb = admin.vbucket_of(b"s")
    uuid, seqno = struct.unpack(">QQ", r.extras)
    one = admin.stats(f"vbucket-seqno {vb}")
    assert one[f"vb_{vb}:high_seqno"] == str(seqno) and one[f"vb_{vb}:uuid"] == str(uuid)
    assert all(k.startswith(f"vb_{vb}:") for k in one)
    every = admin.stats("vbucket-seqno")
    assert len([k for k in every if k.endswith(":high_seqno")]) == 64


def test_vbucket_details_failovers_and_vbucket_groups(admin):
    admin.call(Opcode.SET_VBUCKET, extras=b"\x02", vbucket=3)
    details = admin.stats("vbucket-details 3")
    assert details["vb_3"] == "replica" and "vb_3:num_items" in details
    failovers = admin.stats("failovers 3")
    assert failovers["vb_3:num_entries"] == "1" and failovers["vb_3:0:seq"] == "0"
    states = admin.stats("vbucket")
    assert states["vb_3"] == "replica" and states["vb_0"] == "active" and len(states) == 64


def test_stat_errors(server):
    with server.client() as c:
        c.login(features=(Feature.XERROR,))
        c.send(request(Opcode.STAT, key=b"no-such-group", opaque=1))
        assert c.recv().status == Status.KEY_ENOENT
        c.send(request(Opcode.STAT, key=b"vbucket-seqno 999", opaque=2))
        assert c.recv().status == Status.NOT_MY_VBUCKET
        c.send(request(Opcode.STAT, key=b"vbucket-seqno x", opaque=3))
        assert c.recv().status == Status.EINVAL
        c.send(request(Opcode.STAT, key=b"failovers", value=b"{not json", datatype=1, opaque=4))
        assert c.recv().status == Status.EINVAL
        assert c.call(Opcode.NOOP).status == Status.SUCCESS
    with server.client() as c:
        c.login(bucket=None)
        c.send(request(Opcode.STAT, key=b"vbucket-seqno", opaque=5))
        assert c.recv().status == Status.NO_BUCKET
    with server.client() as c:
        c.login(user="writer", password="writepw")
        assert c.stats("vbucket-seqno 0")["vb_0:high_seqno"] == "0"  # data roles carry STATS


# ---------------------------------------------------------------------------------------------
# malformed input


def contradicting_lengths(opaque: int) -> bytes:
    """A GET whose key length (10) runs past its total body (4): the body is sound, the header is not."""
    return HEADER.pack(0x80, Opcode.GET, 10, 0, 0, 0, 4, opaque, 0) + b"abcd"


@pytest.mark.parametrize("bad", [
    request(Opcode.SET, key=b"k", extras=b"\x00" * 3, value=b"v", opaque=77),  # wrong extras length
    request(Opcode.GET, opaque=77),  # GET without a key
    request(Opcode.NOOP, key=b"junk", opaque=77),  # NOOP with a key
    request(Opcode.GET_CLUSTER_CONFIG, cas=5, opaque=77),  # CAS must be 0
    encode_frame(0x08, Opcode.GET, key=b"k", framing=b"\x21\x00\x00", opaque=77),  # framing runs past its end
])
def test_malformed_frame_is_einval_and_the_connection_goes_on(admin, bad):
    admin.send(request(Opcode.NOOP, opaque=76) + bad + request(Opcode.NOOP, opaque=78))
    first, err, last = admin.recv_n(3)
    assert (first.opaque, err.opaque, last.opaque) == (76, 77, 78)
    assert err.status == Status.EINVAL and err.value  # XERROR: the reason is in the body
    assert last.status == Status.SUCCESS
    assert admin.set(b"after", b"ok").status == Status.SUCCESS


def test_unknown_frame_info_is_reported(admin):
    reply = admin.call(Opcode.GET, key=b"k", framing=b"\x30", vbucket=0)  # id 3 is unused
    assert reply.status == Status.UNKNOWN_FRAME_INFO


@pytest.mark.parametrize("garbage", [
    b"\x42" + bytes(23),  # bad magic
    HEADER.pack(0x80, Opcode.SET, 1, 8, 0, 0, 0x7FFFFFFF, 0, 0),  # 2 GiB body: over the limit
    HEADER.pack(0x80, Opcode.SET, 1, 8, 0, 0, MAX_PACKET_LEN - HEADER.size + 1, 0, 0),  # 1 byte over 30 MiB
    contradicting_lengths(77),  # kv_engine disconnects: the rest of the stream cannot be trusted
    request(Opcode.NOOP).replace(b"\x80", b"\x82", 1),  # a server request (duplex) from a client
    request(Opcode.NOOP).replace(b"\x80", b"\x81", 1),  # a response from a client that is not DCP
])
def test_unrecoverable_input_disconnects_only_that_client(server, garbage):
    with server.login() as bystander, server.login() as victim:
        bystander.set(b"safe", b"1")
        victim.send(request(Opcode.NOOP, opaque=1) + garbage + request(Opcode.NOOP, opaque=2))
        assert victim.recv().opaque == 1  # what came before is still answered
        with pytest.raises(Closed):
            victim.recv()
        assert bystander.get(b"safe").value == b"1"
    with server.login() as again:
        assert again.get(b"safe").value == b"1"


def test_a_client_that_does_not_read_does_not_hurt_others(server):
    """Thousands of pipelined GETs of a 100 kB value from a client that never reads: the server makes
    replies only as fast as the socket takes them (not gigabytes in memory), and serves others."""
    with server.login() as greedy, server.login() as polite:
        polite.set(b"big", b"x" * 100_000)
        blob = request(Opcode.GET, key=b"big", vbucket=polite.vbucket_of(b"big")) * 5000
        greedy.sock.setblocking(False)
        sent = 0
        try:
            while sent < len(blob):
                sent += greedy.sock.send(blob[sent:])
        except BlockingIOError:
            pass
        assert sent > 100_000  # thousands of GETs in flight

        def buffered() -> int:
            return max(c.transport.get_write_buffer_size() + c.writer.pending for c in server.server.connections)
        for _ in range(20):
            assert polite.get(b"big").status == Status.SUCCESS
            assert server.call(buffered) < 4 * 1024 * 1024  # backpressure: the server stopped making replies


def test_a_value_between_the_document_and_packet_limits_is_e2big_and_the_connection_goes_on(admin):
    """25 MiB: over the 20 MiB document limit, under the 30 MiB packet limit (DocumentSizeLimits.md):
    refused with E2BIG, the body read past without being kept; the pipelined requests around it
    are answered in order."""
    vb = admin.vbucket_of(b"huge")
    big = request(Opcode.SET, key=b"huge", extras=bytes(8), value=b"x" * (25 * 1024 * 1024), vbucket=vb, opaque=77)
    admin.send(request(Opcode.NOOP, opaque=76) + big + request(Opcode.NOOP, opaque=78))
    first, err, last = admin.recv_n(3)
    assert (first.opaque, err.opaque, last.opaque) == (76, 77, 78)
    assert err.status == Status.E2BIG and err.opcode == Opcode.SET and b"limit" in err.value
    assert last.status == Status.SUCCESS
    just_over = admin.set(b"huge", b"y" * (MAX_VALUE_LEN + 1))  # within the body limit: the handler says so
    assert just_over.status == Status.E2BIG
    assert admin.set(b"huge", b"y" * MAX_VALUE_LEN).status == Status.SUCCESS  # exactly 20 MiB is a document
    assert admin.get(b"huge").status == Status.SUCCESS


def test_the_key_is_checked_before_the_sender(server):
    """kv_engine validates a request before it checks privileges: an over-long key is EINVAL for a
    user without the privilege, and for a connection that has not authenticated."""
    with server.login(user="reader", password="readpw") as reader:
        assert reader.set(b"k", b"v").status == Status.EACCESS
        assert reader.set(b"k" * 251, b"v").status == Status.EINVAL
        assert reader.call(Opcode.DELETE, key=b"", vbucket=0).status == Status.EINVAL
    with server.client() as anonymous:
        anonymous.hello(Feature.XERROR)
        assert anonymous.call(Opcode.GET, key=b"k", vbucket=0).status == Status.EACCESS
        assert anonymous.call(Opcode.GET, key=b"k" * 300, vbucket=0).status == Status.EINVAL


@pytest.mark.parametrize("wire_key, status", [
    (b"\x08" + b"k" * 300, Status.EINVAL),  # over 251 bytes: EINVAL before the collection is looked up
    (b"\x08" + b"k" * 247, Status.EINVAL),  # a non-default collection's logical key is at most 246 bytes
    (b"\x08" + b"k" * 246, Status.UNKNOWN_COLLECTION),
    (b"\x00" + b"k" * 250, Status.KEY_ENOENT),  # the default collection keeps the 250 of old
    (b"\x00" + b"k" * 251, Status.EINVAL),
    (b"\x01k", Status.EINVAL),  # ids 1-7 are reserved
    (b"\x00", Status.EINVAL),  # no logical key
    (b"\x80", Status.EINVAL),  # no stop byte
])
def test_collection_keys_follow_kv_engines_rules(server, wire_key, status):
    with server.login(features=(Feature.XERROR, Feature.COLLECTIONS)) as c:
        assert c.call(Opcode.GET, key=wire_key, vbucket=0).status == status
