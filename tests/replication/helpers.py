"""Shared pieces of the cluster tests: an official-SDK writer under load, a dcpflow client that
keeps a rollback-aware model of what it streamed, and readers of a vbucket's contents."""

import asyncio
import threading
import time
from datetime import timedelta

from couchbase.auth import PasswordAuthenticator
from couchbase.cluster import Cluster
from couchbase.exceptions import CouchbaseException
from couchbase.options import ClusterOptions, ClusterTimeoutOptions, GetOptions, UpsertOptions
from couchbase.transcoder import RawJSONTranscoder

from dcpflow.client import DcpClient, Deletion, Expiration, Mutation, Rollback
from dcpflow.protocol import kv
from dcpflow.protocol.dcp import DcpDeletion, DcpExpiration, DcpMutation, DcpStreamEnd
from dcpflow.protocol.status import Status
from tests.dcp.client import DcpClient as RawDcpClient
from tests.server.client import RawClient

RAW_JSON = RawJSONTranscoder()


def sdk_connect(connstr: str, kv_timeout: float = 2.5) -> Cluster:
    timeouts = ClusterTimeoutOptions(kv_timeout=timedelta(seconds=kv_timeout), connect_timeout=timedelta(seconds=10),
                                     bootstrap_timeout=timedelta(seconds=10))
    return Cluster(connstr, ClusterOptions(PasswordAuthenticator("Administrator", "password"),
                                           timeout_options=timeouts))


class Ack:
    """One acknowledged write: what the SDK was told."""

    __slots__ = ("key", "value", "cas", "vb", "uuid", "seqno", "index")

    def __init__(self, key, value, cas, vb, uuid, seqno, index):
        self.key, self.value, self.cas, self.vb, self.uuid, self.seqno, self.index = \
            key, value, cas, vb, uuid, seqno, index

    def __repr__(self) -> str:
        return f"<Ack {self.key} #{self.index} vb={self.vb} seqno={self.seqno} uuid={self.uuid:#x}>"


class SdkWriter(threading.Thread):
    """Upserts a steady stream of distinct values over `keys` with the official SDK until stopped;
    keeps every acknowledged write (with its mutation token) and counts the failures."""

    def __init__(self, connstr: str, keys: list[str], pause: float = 0.0):
        super().__init__(daemon=True)
        self.connstr = connstr
        self.keys = keys
        self.pause = pause
        self.acked: list[Ack] = []
        self.failures = 0
        self.errors: list[str] = []
        self._halt = threading.Event()
        self.ready = threading.Event()

    def run(self) -> None:
        cluster = sdk_connect(self.connstr)
        try:
            col = cluster.bucket("default").default_collection()
            opts = UpsertOptions(transcoder=RAW_JSON, timeout=timedelta(seconds=2.5))
            i = 0
            while not self._halt.is_set():
                key = self.keys[i % len(self.keys)]
                value = b'{"n":%d}' % i
                try:
                    r = col.upsert(key, value, opts)
                except CouchbaseException as e:
                    self.failures += 1
                    if len(self.errors) < 20:
                        self.errors.append(type(e).__name__)
                    time.sleep(0.01)
                else:
                    t = r.mutation_token()
                    self.acked.append(Ack(key, value, r.cas, t.partition_id, t.partition_uuid, t.sequence_number, i))
                    self.ready.set()
                i += 1
                if self.pause:
                    time.sleep(self.pause)
        finally:
            cluster.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(30)


def sdk_contents(connstr: str, keys) -> dict[str, tuple[bytes, int]]:
    """key -> (value, cas) as the SDK reads it now (absent keys left out)."""
    cluster = sdk_connect(connstr)
    out = {}
    try:
        col = cluster.bucket("default").default_collection()
        for key in keys:
            try:
                r = col.get(key, GetOptions(transcoder=RAW_JSON))
            except CouchbaseException:
                continue
            out[key] = (bytes(r.value), r.cas)
    finally:
        cluster.close()
    return out


def high_seqnos(port: int, state: int) -> dict[int, int]:
    with RawClient(port) as c:
        c.login()
        reply = c.call(kv.GetAllVbSeqnos(state).opcode, extras=state.to_bytes(4, "big"))
        return kv.GetAllVbSeqnosResponse.from_frame(reply).as_dict()


def vb_contents(port: int, vb: int, end: int) -> dict[bytes, tuple]:
    """Everything a node holds for a vbucket (active or replica) up to `end`, read over DCP:
    key -> (value, cas, rev seqno, by seqno, flags, expiry, datatype, deleted)."""
    out: dict[bytes, tuple] = {}
    if end == 0:
        return out
    with RawDcpClient(port) as c:
        c.connect(user="Administrator", password="password", name=f"check:{vb}")
        resp = c.stream_request(vb, 0, end)
        assert resp.status == Status.SUCCESS, resp
        for m in c.until_stream_end(vb):
            if isinstance(m, DcpMutation):
                out[m.key] = (m.value, m.cas, m.rev_seqno, m.by_seqno, m.flags, m.expiration, m.datatype, False)
            elif isinstance(m, DcpDeletion | DcpExpiration):
                out[m.key] = (b"", m.cas, m.rev_seqno, m.by_seqno, 0, 0, 0, True)
            elif isinstance(m, DcpStreamEnd):
                break
    return out


def failover_log(port: int, vb: int) -> list[tuple[int, int]]:
    from dcpflow.protocol.dcp import FailoverLogResponse
    from dcpflow.protocol.opcodes import Opcode
    with RawClient(port) as c:
        c.login()
        reply = c.call(Opcode.GET_FAILOVER_LOG, vbucket=vb)
        assert reply.status == Status.SUCCESS
        return list(FailoverLogResponse.from_frame(reply).entries)


class ClientModel(threading.Thread):
    """A dcpflow DcpClient streaming every vbucket from the beginning (rollback policy "resume"),
    applying its events to a model that honours Rollback events: what an application derives."""

    def __init__(self, connstr: str, **options):
        super().__init__(daemon=True)
        self.connstr = connstr
        self.options = options  # DcpClient.connect's (mitigate_rollbacks...)
        self.delivered: list = []  # every event in the order the application got it
        self.history: dict[int, list[tuple[int, bytes, bytes, int, bool]]] = {}  # vb -> (seqno, key, value, cas, del)
        self.rollbacks: list[Rollback] = []
        self.error: BaseException | None = None
        self.started = threading.Event()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._halt: asyncio.Event | None = None

    def run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._halt = asyncio.Event()
        try:
            async with await DcpClient.connect(self.connstr, "Administrator", "password",
                                               noop_interval=1.0, **self.options) as client:
                stream = client.events(start="beginning", rollback="resume")
                self.started.set()
                it = stream.__aiter__()
                while not self._halt.is_set():
                    nxt = asyncio.ensure_future(it.__anext__())
                    stopper = asyncio.ensure_future(self._halt.wait())
                    done, _ = await asyncio.wait({nxt, stopper}, return_when=asyncio.FIRST_COMPLETED)
                    if nxt not in done:
                        nxt.cancel()
                        break
                    stopper.cancel()
                    self._apply(nxt.result())
                await stream.aclose()
        except BaseException as e:  # noqa: BLE001 - reported to the test
            self.error = e
            self.started.set()

    def _apply(self, ev) -> None:
        with self._lock:
            self.delivered.append(ev)
            if isinstance(ev, Mutation):
                self.history.setdefault(ev.vbucket, []).append((ev.seqno, ev.key, ev.value, ev.cas, False))
            elif isinstance(ev, Deletion | Expiration):
                self.history.setdefault(ev.vbucket, []).append((ev.seqno, ev.key, b"", ev.cas, True))
            elif isinstance(ev, Rollback):
                self.rollbacks.append(ev)
                hist = self.history.get(ev.vbucket, [])
                self.history[ev.vbucket] = [h for h in hist if h[0] <= ev.seqno]

    def seen(self) -> dict[int, int]:
        with self._lock:
            return {vb: h[-1][0] for vb, h in self.history.items() if h}

    def view(self) -> dict[bytes, tuple[bytes, int]]:
        with self._lock:
            out = {}
            for hist in self.history.values():
                for _seqno, key, value, cas, deleted in hist:
                    if deleted:
                        out.pop(key, None)
                    else:
                        out[key] = (value, cas)
            return out

    def stop(self) -> None:
        if self._loop is not None and self._halt is not None:
            self._loop.call_soon_threadsafe(self._halt.set)
        self.join(30)

    def wait_caught_up(self, highs: dict[int, int], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            seen = self.seen()
            behind = {vb: (seen.get(vb, 0), h) for vb, h in highs.items() if seen.get(vb, 0) < h}
            if not behind:
                return
            if self.error is not None:
                raise self.error
            assert time.monotonic() < deadline, f"the client did not catch up: {behind}"
            time.sleep(0.05)
