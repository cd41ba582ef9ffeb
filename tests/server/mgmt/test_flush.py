"""A bucket flush through REST, as Couchbase's: every vbucket emptied with a new failover entry; DCP
streams on the bucket end (STATE_CHANGED) and a consumer resuming from before is told to roll
back to 0; the flush survives a restart; KV requests are served during and after it."""

from dcpflow.protocol import dcp
from dcpflow.protocol.dcp import StreamEndReason
from dcpflow.protocol.status import Status
from tests.dcp.client import DcpClient, items

from ..conftest import keys_in
from .rest_client import http_of

VB = 3


def test_flush_ends_streams_and_resuming_consumers_roll_back_to_zero(make_server):
    server = make_server()
    http = http_of(server)
    assert http.post("/pools/default/buckets/default", {"flushEnabled": "1"}).status == 200
    keys = keys_in(VB, 5)
    with server.login() as w:
        for k in keys:
            assert w.set(k, b"before").status == Status.SUCCESS
    engine = server.server.buckets["default"].engine
    old_uuid = server.call(lambda: engine.vbucket(VB).uuid)
    with DcpClient(server.port) as c:
        c.num_vbuckets = 64
        c.connect(name="flush-watcher")
        assert c.stream_request(VB, uuid=old_uuid).status == Status.SUCCESS
        seen = c.messages_until(lambda m: isinstance(m, dcp.DcpMutation) and m.by_seqno == 5)
        assert len(items(seen)) == 5

        assert http.post("/pools/default/buckets/default/controller/doFlush").status == 200
        end = c.until_stream_end(VB)[-1]
        assert end.reason == StreamEndReason.STATE_CHANGED

        new_uuid, high = server.call(lambda: (engine.vbucket(VB).uuid, engine.vbucket(VB).high_seqno))
        assert new_uuid != old_uuid and high == 0
        resumed = c.stream_request(VB, start=5, uuid=old_uuid)
        assert resumed.status == Status.ROLLBACK and resumed.rollback_seqno == 0

        with server.login() as w:
            assert all(w.get(k).status == Status.KEY_ENOENT for k in keys)
            assert w.set(keys[0], b"after").status == Status.SUCCESS
        fresh = c.stream_request(VB, uuid=new_uuid, end=1)
        assert fresh.status == Status.SUCCESS
        got = items(c.until_stream_end(VB))
        assert [(m.key, m.value) for m in got] == [(keys[0], b"after")]
    events = [e.text for e in server.server.mgmt.observer.events if e.kind == "flush"]
    assert events and "5 documents removed" in events[0]

    server.stop()
    again = make_server()
    engine = again.server.buckets["default"].engine
    assert again.call(lambda: (engine.vbucket(VB).uuid, engine.vbucket(VB).high_seqno,
                               engine.stats()["curr_items"])) == (new_uuid, 1, 1)
