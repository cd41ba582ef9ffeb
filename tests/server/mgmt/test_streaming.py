"""The streaming config endpoints as ns_server serves them (menelaus_util.erl handle_streaming and
menelaus_web_buckets.erl serve_streaming_short_bucket_info / handle_bucket_info_streaming in
https://github.com/couchbase/ns_server): `/pools/default/bs/<b>` and
`/pools/default/bucketsStreaming/<b>` answer a chunked 200 whose body is the config, then a new one
after every change, each followed by "\\n\\n\\n\\n"; `heartbeat=<s>` sends the separator alone; the
stream ends when the bucket is dropped. gocbcore's HTTP config poller reads `bs` (it got 404 before).
A slow reader is bounded: changes coalesce, the server buffers a few configs at most, and a reader
that takes nothing for the send timeout is dropped. Read here with a raw socket, chunk by chunk."""

import base64
import contextlib
import json
import socket
import time

import pytest

from dcpflow.server.mgmt import streaming

from .rest_client import http_of

SEP = b"\n\n\n\n"
AUTH = "Basic " + base64.b64encode(b"Administrator:password").decode()


class Stream:
    """A streaming HTTP reader: the response head, then the configs as they come, chunk by chunk."""

    def __init__(self, port: int, path: str, rcvbuf: int | None = None, auth: str | None = AUTH):
        self.sock = socket.socket()
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(30)
        self.sock.connect(("127.0.0.1", port))
        head = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n" + (f"Authorization: {auth}\r\n" if auth else "")
        self.sock.sendall((head + "\r\n").encode())
        self.file = self.sock.makefile("rb")
        self.status = int(self.file.readline().split()[1])
        self.headers = {}
        while (line := self.file.readline().rstrip(b"\r\n")):
            key, _, value = line.decode().partition(":")
            self.headers[key.strip().lower()] = value.strip()
        self.body = b""
        self.ended = False

    def chunk(self) -> bytes | None:
        """The next chunk's bytes; None once the response ended (the zero-length chunk)."""
        size = int(self.file.readline().strip(), 16)
        data = self.file.read(size)
        assert self.file.read(2) == b"\r\n"
        if size == 0:
            self.ended = True
            return None
        return data

    def next_config(self) -> dict | None:
        """The next whole config (None if the stream ended first)."""
        while SEP not in self.body:
            data = self.chunk()
            if data is None:
                return None
            self.body += data
        text, _, self.body = self.body.partition(SEP)
        return json.loads(text)

    def close(self) -> None:
        self.file.close()
        self.sock.close()


@pytest.fixture
def streams():
    opened: list[Stream] = []

    def open_(*args, **kw) -> Stream:
        s = Stream(*args, **kw)
        opened.append(s)
        return s

    yield open_
    for s in opened:
        s.close()


def test_bs_streams_the_terse_map_first_and_a_new_one_after_every_change(server, streams):
    http = http_of(server)
    s = streams(server.mgmt_port, "/pools/default/bs/default")
    assert s.status == 200 and s.headers["transfer-encoding"] == "chunked"
    assert s.headers["content-type"].startswith("application/json")
    first = s.next_config()
    assert first == http.get("/pools/default/b/default").json  # the map /b/ and the KV port serve
    assert first["nodesExt"][0]["hostname"] == "127.0.0.1" and first["clusterName"] == "dcpflow"
    assert http.post("/pools/default/buckets/default/scopes", {"name": "app"}).status == 200
    after_scope = s.next_config()
    assert after_scope["rev"] > first["rev"] and after_scope["collectionsManifestUid"] == "1"
    assert http.post("/pools/default/buckets/default", {"storageBackend": "magma"}).status == 200
    after_setting = s.next_config()
    assert after_setting["rev"] > after_scope["rev"] and "nonDedupedHistory" in after_setting["bucketCapabilities"]
    assert s.body == b""  # nothing was sent twice


def test_buckets_streaming_sends_the_bucket_and_ends_when_it_is_dropped(server, streams):
    http = http_of(server)
    assert http.post("/pools/default/buckets", {"name": "orders", "ramQuotaMB": "100"}).status == 202
    s = streams(server.mgmt_port, "/pools/default/bucketsStreaming/orders")
    assert s.status == 200
    first = s.next_config()
    assert first["name"] == "orders" and first["quota"]["rawRAM"] == 100 * 1024 * 1024
    assert "basicStats" not in first and first["vBucketServerMap"]["serverList"] == [f"127.0.0.1:{server.port}"]
    with server.login(bucket="orders") as c:  # writes change no config: nothing is sent for them
        for i in range(5):
            c.set(f"k{i}".encode(), b"v")
    assert http.post("/pools/default/buckets/orders", {"ramQuotaMB": "200"}).status == 200
    changed = s.next_config()
    assert changed["quota"]["rawRAM"] == 200 * 1024 * 1024
    assert {k: v for k, v in changed.items() if k != "quota"} == {k: v for k, v in first.items() if k != "quota"}
    assert http.delete("/pools/default/buckets/orders").status == 200
    assert s.next_config() is None and s.ended  # the chunked body ends, as ns_server's does


def test_heartbeats_bad_requests_and_permissions(server, streams):
    s = streams(server.mgmt_port, "/pools/default/bs/default?heartbeat=1")
    assert s.next_config()["name"] == "default"
    assert s.chunk() == SEP  # a second later: the separator alone, nothing changed
    assert streams(server.mgmt_port, "/pools/default/bs/default?heartbeat=0").status == 400
    assert streams(server.mgmt_port, "/pools/default/bs/nothere").status == 404
    assert streams(server.mgmt_port, "/pools/default/bs/default", auth=None).status == 401
    reader = "Basic " + base64.b64encode(b"reader:readpw").decode()  # data_reader[default] only
    assert streams(server.mgmt_port, "/pools/default/bucketsStreaming/default", auth=reader).status == 200
    assert http_of(server).post("/pools/default/buckets", {"name": "other", "ramQuotaMB": "100"}).status == 202
    assert streams(server.mgmt_port, "/pools/default/bs/other", auth=reader).status == 403


def stream_transports(server) -> list:
    """The server side of the management port's open connections."""
    return [proto.transport for proto in server.server.mgmt._runner.server.connections
            if proto.transport is not None]


def test_a_slow_reader_costs_a_bounded_buffer_and_gets_the_newest_config(server, streams, monkeypatch):
    """Changes made while the reader reads nothing coalesce: the server holds at most a few configs
    for it (a 1024-vbucket map is ~6 kB, 200 changes would be ~1.2 MB), and once the reader reads
    again it gets to the newest config."""
    monkeypatch.setattr(streaming, "SEND_TIMEOUT", 120.0)  # this reader comes back: not dropped here
    http = http_of(server)
    assert http.post("/pools/default/buckets", {"name": "big", "ramQuotaMB": "100", "numVBuckets": "1024"}).status \
        == 202
    s = streams(server.mgmt_port, "/pools/default/bs/big", rcvbuf=4096)
    size = len(json.dumps(s.next_config()))
    assert size > 5000

    def shrink():  # the kernel keeps little for it, so what is held back is the server's own buffer
        for t in stream_transports(server):
            t.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    server.call(shrink)
    most = 0
    for ttl in range(1, 201):
        assert http.post("/pools/default/buckets/big", {"maxTTL": str(ttl)}).status == 200
        held = server.call(lambda: sum(t.get_write_buffer_size() for t in stream_transports(server)))
        most = max(most, held)
    print("most held for the slow reader:", most)
    assert most < 300 * 1024, most  # aiohttp's limit and the transport's high-water mark, a few configs
    newest = http.get("/pools/default/b/big").json["rev"]
    got = s.next_config()
    while got["rev"] < newest:
        got = s.next_config()
    assert got["rev"] == newest


def test_a_reader_that_takes_nothing_is_dropped_after_the_send_timeout(make_server, streams, monkeypatch):
    monkeypatch.setattr(streaming, "SEND_TIMEOUT", 0.5)
    server = make_server(mgmt_port=0)
    http = http_of(server)
    assert http.post("/pools/default/buckets", {"name": "big", "ramQuotaMB": "100", "numVBuckets": "1024"}).status \
        == 202
    s = streams(server.mgmt_port, "/pools/default/bs/big", rcvbuf=4096)
    s.next_config()
    server.call(lambda: [t.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
                         for t in stream_transports(server)])
    ttl = 0
    deadline = time.monotonic() + 60
    while server.call(lambda: server.server.mgmt.open_connections) > 0:  # until the server drops it
        assert time.monotonic() < deadline
        ttl += 1
        assert http.post("/pools/default/buckets/big", {"maxTTL": str(ttl)}).status == 200


def test_streams_count_against_the_connection_limit_and_end_when_the_server_stops(make_server, streams):
    server = make_server(mgmt_port=0, mgmt_max_connections=2)
    held = [streams(server.mgmt_port, "/pools/default/bs/default") for _ in range(2)]
    for s in held:
        assert s.next_config()["name"] == "default"
    extra = socket.create_connection(("127.0.0.1", server.mgmt_port), timeout=10)
    try:
        extra.sendall(f"GET /pools/default/bs/default HTTP/1.1\r\nAuthorization: {AUTH}\r\n\r\n".encode())
        assert extra.recv(65536) == b""  # closed at once: the two streams hold the port's connections
    except ConnectionResetError:
        pass
    finally:
        extra.close()
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 10
    for s in held:  # each stream ended (its last chunk) or was closed with the server
        with contextlib.suppress(ConnectionError, ValueError):
            assert s.next_config() is None


def test_a_stream_whose_reader_left_ends_and_stops_watching(server, streams):
    def watching() -> int:
        return server.call(lambda: len(server.server.topology.watchers))

    before = watching()
    s = streams(server.mgmt_port, "/pools/default/bs/default")
    assert s.next_config()["name"] == "default" and watching() == before + 1
    s.close()  # no change follows: the stream notices by itself (streaming.GONE_CHECK)
    deadline = time.monotonic() + 30
    while watching() > before:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_node_services_streaming_sends_the_cluster_map_after_every_change(server, streams):
    """ns_server's /pools/default/nodeServicesStreaming (menelaus_web_cluster.erl,
    serve_node_services_streaming): the cluster-level map, which gocbcore polls with no bucket open."""
    http = http_of(server)
    s = streams(server.mgmt_port, "/pools/default/nodeServicesStreaming")
    first = s.next_config()
    assert first == http.get("/pools/default/nodeServices").json and "vBucketServerMap" not in first
    assert http.post("/pools/default/buckets", {"name": "more", "ramQuotaMB": "100"}).status == 202
    assert s.next_config()["rev"] > first["rev"]
    assert streams(server.mgmt_port, "/pools/default/nodeServicesStreaming", auth=None).status == 401
    pool = streams(server.mgmt_port, http.get("/pools").json["pools"][0]["streamingUri"])  # what /pools advertises
    assert [b["bucketName"] for b in pool.next_config()["bucketNames"]] == ["default", "more"]
    assert http.delete("/pools/default/buckets/more").status == 200
    assert [b["bucketName"] for b in pool.next_config()["bucketNames"]] == ["default"]
