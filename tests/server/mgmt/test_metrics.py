"""`/metrics` scraped and parsed with prometheus_client's parser: KV ops, items, vbucket seqnos, the
flusher's queue, DCP flow control and items remaining per connection and stream, and who may see
which bucket's series."""

import time

from prometheus_client.parser import text_string_to_metric_families

from dcpflow.engine import VBucketState
from dcpflow.protocol import dcp
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from dcpflow.server import UserDB, make_user
from tests.dcp.client import DcpClient

from ..conftest import keys_in, users_db
from .rest_client import http_of

VB = 5


def scrape(http) -> dict:
    """{(sample name, frozenset(labels)): value}, through prometheus_client's parser."""
    reply = http.get("/metrics")
    assert reply.status == 200, reply
    assert reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    out = {}
    for family in text_string_to_metric_families(reply.text):
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in out, f"duplicate series {key}"
            out[key] = s.value
    return out


def value(samples: dict, name: str, **labels) -> float:
    """The one sample of `name` with these labels. The parser reports a counter written without
    `_total` (Couchbase's `kv_ops`) under `<name>_total`."""
    want = {k: str(v) for k, v in labels.items()}
    found = [v for (n, ls), v in samples.items()
             if n in (name, name + "_total") and want.items() <= dict(ls).items()]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def wait_for(http, check, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(http)
        if check(samples):
            return samples
        assert time.monotonic() < deadline, "the metrics never showed the expected state"
        time.sleep(0.05)


def test_kv_and_bucket_metrics(server):
    http = http_of(server)
    keys = keys_in(VB, 4)
    with server.login() as c:
        for k in keys:
            c.set(k, b"v")
        c.delete(keys[0])
        c.get(keys[1])
        c.get(b"missing-key")
    engine = server.server.buckets["default"].engine
    samples = scrape(http)
    assert value(samples, "kv_ops", bucket="default", op="set") == 4
    assert value(samples, "kv_ops", bucket="default", op="delete") == 1
    assert value(samples, "kv_ops", bucket="default", op="get", result="hit") == 1
    assert value(samples, "kv_ops", bucket="default", op="get", result="miss") == 1
    assert value(samples, "kv_curr_items", bucket="default") == 3
    assert value(samples, "kv_num_vbuckets", bucket="default", state="active") == 64
    assert value(samples, "kv_vb_high_seqno", bucket="default", vb=VB, state="active") == 5
    assert value(samples, "kv_ep_queue_size", bucket="default") <= 5
    persisted = wait_for(http, lambda s: value(s, "kv_vb_persisted_seqno", bucket="default", vb=VB) == 5)
    assert value(persisted, "kv_ep_queue_size", bucket="default") == 0  # only VB was written to
    assert value(samples, "kv_total_connections") == 1 and value(samples, "process_resident_memory_bytes") > 1e6
    assert value(samples, "kv_vb_rollbacks_total", bucket="default") == 0

    server.call(lambda: engine.set_vbucket_state(VB, VBucketState.REPLICA))
    server.call(lambda: engine.set_vbucket_state(VB, VBucketState.ACTIVE))  # a new failover entry: a failover
    assert value(scrape(http), "kv_vb_failovers_total", bucket="default") == 1


def test_dcp_flow_control_and_items_remaining(make_server):
    server = make_server(checkpoint_max_items=100)  # snapshots of 100 items: a stream queues a few at a time
    http = http_of(server)
    n = 2000
    keys = keys_in(VB, n)
    with server.login() as c:
        # Persistence paused: the checkpoints stay in memory, so the stream reads them (its queue
        # fills to its bound) rather than a backfill, whose pages the backfill queue bounds lower -
        # which one it got depended on how far the flusher was on a busy machine.
        assert c.call(Opcode.STOP_PERSISTENCE).status == Status.SUCCESS
        for k in keys:  # ~1.3 MB: more than a stream queues ahead (256 KiB) while flow control holds it
            c.set(k, b"x" * 600)
    name = 'metrics "test" \\ conn'
    with DcpClient(server.port) as c:
        c.num_vbuckets = 64
        c.connect(name=name)
        c.controls(connection_buffer_size=300)
        assert c.stream_request(VB).status == Status.SUCCESS
        labels = {"bucket": "default", "connection": name}

        def blocked(s):  # flow control holds the stream and its queue has filled up to its bound
            return (value(s, "kv_dcp_flow_control_unacked_bytes", **labels) >= 300
                    and value(s, "kv_dcp_stream_ready_queue_bytes", vb=VB, **labels) > 200_000)

        samples = wait_for(http, blocked)
        assert value(samples, "kv_dcp_flow_control_buffer_bytes", **labels) == 300
        remaining = value(samples, "kv_dcp_stream_items_remaining", vb=VB, **labels)
        assert 0 < remaining < n
        assert value(samples, "kv_dcp_items_remaining", type="producer", **labels) == remaining
        assert value(samples, "kv_dcp_stream_last_seqno", vb=VB, **labels) == n - remaining
        assert value(samples, "kv_dcp_connections", bucket="default", type="producer") == 1
        c.messages_until(lambda m: isinstance(m, dcp.DcpMutation) and m.by_seqno == n, ack=True)
        done = wait_for(http, lambda s: value(s, "kv_dcp_stream_items_remaining", vb=VB, **labels) == 0 and
                        value(s, "kv_dcp_stream_ready_queue_bytes", vb=VB, **labels) == 0)
        assert value(done, "kv_dcp_total_data_size_bytes", **labels) > n * 600


def test_a_user_sees_the_series_of_the_buckets_they_may_read_stats_of(make_server):
    users = UserDB([*users_db().users.values(), make_user("ordersonly", password="pw",
                                                          roles=["data_reader[orders]"])])
    server = make_server(users=users)
    admin = http_of(server)
    assert admin.post("/pools/default/buckets", {"name": "orders", "ramQuotaMB": "100"}).status == 202
    buckets = {dict(ls).get("bucket") for (n, ls) in scrape(admin) if n == "kv_curr_items"}
    assert buckets == {"default", "orders"}
    mine = scrape(admin.as_user("ordersonly", "pw"))
    assert {dict(ls).get("bucket") for (_, ls) in mine} == {None, "orders"}
    assert admin.as_user(None).get("/metrics").status == 401
