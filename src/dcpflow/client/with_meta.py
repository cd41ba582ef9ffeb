"""Writing changes to the target bucket with their metadata: SetWithMeta for mutations, DelWithMeta
for deletions and expirations (option IS_EXPIRATION), each carrying the source's CAS, revision
seqno, flags, expiry (or delete time) and xattrs, so the target stores the same version and its
conflict resolution can compare versions from both sides
(https://github.com/couchbase/kv_engine/blob/master/engines/ep/docs/protocol/set_with_meta.md,
del_with_meta.md).

A batch is split by the target node that holds each key's vbucket (the target's own map: the
two buckets may differ in vbucket count) and pipelined, one write per node, replies matched in
order. NOT_MY_VBUCKET (a vbucket moved, a node failed over) refreshes the map and sends the
change again to the new owner; temporary failures and lost connections are retried with backoff
for as long as it takes, since a replication must not drop a change: an outcome is final only
when the target said SUCCESS, KEY_EEXISTS (its version won conflict resolution: counted, not
retried, as goxdcr does) or refused the change for good (an error naming it).

HELLO MutationSeqno makes every success carry the target's vbucket UUID and seqno: XDCR's
checkpoints record them (replication/xdcr/checkpoints.py), and a UUID that changed tells its
replicator the target failed over or restarted uncleanly.

It is a client of the target bucket, used by XDCR (dcpflow.replication.xdcr) and by the Spark
writer (dcpflow.spark.writer) alike, so it lives in the client package both may import.
"""

import asyncio
import contextlib
import logging
import urllib.parse
from typing import NamedTuple

from dcpflow.protocol import kv as kvproto
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.keys import make_key
from dcpflow.protocol.meta import DelWithMeta, GetMeta, GetMetaResponse, SetWithMeta, WithMetaOption
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from . import rest_client
from .client import DcpClient
from .connection import FEATURES
from .errors import ClientError, ConnectError

log = logging.getLogger("dcpflow.xdcr")

WRITER_FEATURES = FEATURES + (Feature.MUTATION_SEQNO,)
SET, DELETE, EXPIRE = "set", "delete", "expire"
#: Statuses after which the same request is sent again (after a pause, or a map refresh).
_AGAIN = frozenset({Status.ETMPFAIL, Status.EBUSY, Status.ENOMEM, Status.NOT_INITIALIZED, Status.NOT_MY_VBUCKET})
MAX_BACKOFF = 2.0


class Change(NamedTuple):
    """One change to write: what the source's DCP stream said about it."""

    kind: str  # SET, DELETE or EXPIRE
    key: bytes
    value: bytes
    cas: int
    rev_seqno: int
    flags: int
    expiry: int  # a mutation's absolute expiry, a deletion's delete time
    datatype: int
    collection: int = 0  # the collection id (the target's, once mapped: namespaces.py)


class Outcome(NamedTuple):
    status: int  # SUCCESS, KEY_EEXISTS (the target's version won) or the refusal
    vbucket: int  # the target vbucket
    vbuuid: int | None = None
    seqno: int | None = None


class ReplicationError(Exception):
    """The replication (or a write with metadata) cannot run as asked (the message says why)."""


def _wire_key(change: Change, collections: bool) -> bytes:
    """The key as the connection takes it: with its collection's LEB128 prefix when HELLO granted
    collections (Collections.md), else only the default collection can be named."""
    if collections:
        return make_key(change.key, change.collection)
    if change.collection:
        raise ReplicationError(f"the target does not speak collections; {change.key!r} is in collection "
                               f"0x{change.collection:x}")
    return change.key


def _key(item) -> bytes:
    return item.key if isinstance(item, Change) else item


class Target:
    """The target bucket, through a DcpClient's cluster map and KV connections."""

    def __init__(self, client: DcpClient, lww: bool, timeout: float = 30.0):
        self.client = client
        self.lww = lww
        self.timeout = timeout
        self.retries = 0  # requests sent again (moved vbucket, temporary failure, lost connection)

    @classmethod
    async def connect(cls, url: str, username: str, password: str, lww: bool | None = None) -> "Target":
        client = await DcpClient.connect(url, username, password, agent="dcpflow-xdcr", features=WRITER_FEATURES)
        return cls(client, bool(lww))

    async def close(self) -> None:
        await self.client.close()

    def vbucket_of(self, key: bytes) -> int:
        return self.client.cluster_map.vbucket_for_key(key)

    def _request(self, change: Change, vbucket: int, collections: bool):
        key = _wire_key(change, collections)
        if change.kind == SET:
            options = WithMetaOption.FORCE_ACCEPT_WITH_META_OPS if self.lww else None
            return SetWithMeta(key, change.value, change.flags, change.expiry, change.rev_seqno, change.cas,
                               options, vbucket=vbucket, datatype=change.datatype)
        options = WithMetaOption.FORCE_ACCEPT_WITH_META_OPS if self.lww else 0
        if change.kind == EXPIRE:
            options |= WithMetaOption.IS_EXPIRATION
        return DelWithMeta(key, change.flags, change.expiry, change.rev_seqno, change.cas, options or None,
                           value=change.value, vbucket=vbucket, datatype=change.datatype if change.value else 0)

    async def write(self, changes: list[Change]) -> list[Outcome]:
        """Write every change; returns each one's final outcome, in order."""
        return await self._each(changes, lambda c, vb, coll: self._request(c, vb, coll), self._outcome)

    async def write_plain(self, changes: list[Change]) -> list[Outcome]:
        """Write without metadata: SET for a mutation (flags, expiry and datatype kept; the target
        gives it a new CAS), DELETE for a deletion or expiration (one of a missing key counts as
        done). What a plain upsert/remove of a Spark DataFrame does."""
        def make(c: Change, vb: int, coll: bool):
            key = _wire_key(c, coll)
            if c.kind == SET:
                return kvproto.Store(key, c.value, c.flags, c.expiry, vbucket=vb, datatype=c.datatype)
            return kvproto.Delete(key, vbucket=vb)

        def interpret(frame, vb: int) -> Outcome:
            if frame.status == Status.KEY_ENOENT and frame.opcode == Opcode.DELETE:
                return Outcome(Status.SUCCESS, vb)
            return self._outcome(frame, vb)

        return await self._each(changes, make, interpret)

    async def get_metas(self, changes: list[Change]) -> list[GetMetaResponse]:
        """GET_META (version 2) of each change's document on the target, pipelined per node."""
        return await self._each(changes, lambda c, vb, coll: GetMeta(_wire_key(c, coll), 2, vb),
                                lambda frame, vb: GetMetaResponse.from_frame(frame))

    @staticmethod
    def _outcome(frame, vb: int) -> Outcome:
        # A reply per change: its mutation token is read from the extras in place, not through the
        # validating decoder.
        if frame.status == Status.SUCCESS:
            token = kvproto.MutationToken.from_extras(frame.extras)
            if token is not None:
                return Outcome(Status.SUCCESS, vb, token.vbucket_uuid, token.seqno)
            return Outcome(Status.SUCCESS, vb)
        return Outcome(frame.status, vb)

    async def _each(self, items: list, make, interpret) -> list:
        """Send make(item, vbucket, collections) for every item to the node owning its vbucket and
        return interpret(reply, vbucket) for each, retrying what may succeed later."""
        results: list = [None] * len(items)
        pending = list(range(len(items)))
        vbs = [self.vbucket_of(_key(item)) for item in items]
        backoff = 0.05
        while pending:
            groups: dict[tuple[str, int] | None, list[int]] = {}
            nodes: dict[int, tuple[str, int] | None] = {}
            for i in pending:
                vb = vbs[i]
                node = nodes.get(vb, 0)
                if node == 0:
                    node = nodes[vb] = self.client.node_for_vbucket(vb)
                groups.setdefault(node, []).append(i)
            parts = await asyncio.gather(*(self._send(a, idx, items, vbs, make, interpret, results)
                                           for a, idx in groups.items()))
            retry = sorted(i for part, _ in parts for i in part)
            if not retry:
                break
            self.retries += len(retry)
            pending = retry
            await asyncio.sleep(backoff)  # the target is moving a vbucket or restarting: give it a moment
            backoff = min(backoff * 2, MAX_BACKOFF)
            if any(refresh for _, refresh in parts):
                with contextlib.suppress(ConnectError, ProtocolError, ClientError, OSError):
                    await self.client.refresh_map()
        return results

    async def _send(self, address, idx: list[int], items: list, vbs: list[int], make, interpret, results: list):
        """One node's share, pipelined; (indexes to send again, whether the map needs a refresh)."""
        if address is None:  # no active copy in the map right now (failover under way)
            return idx, True
        try:
            conn = await self.client.kv_connection(address)
            coll = conn.collections
            requests = [make(items[i], vbs[i], coll) for i in idx]
            replies = await conn.call_many(requests, self.timeout)
        except (ClientError, TimeoutError, OSError) as e:
            log.info("target %s:%d: %s; sending %d requests again", address[0], address[1], e, len(idx))
            return idx, True
        retry, refresh = [], False
        for i, req, frame in zip(idx, requests, replies, strict=True):
            if frame.status in _AGAIN:
                refresh |= frame.status == Status.NOT_MY_VBUCKET
                retry.append(i)
            else:
                results[i] = interpret(frame, req.vbucket)
        return retry, refresh

    async def failover_logs(self, vbuckets) -> dict[int, list[tuple[int, int]]]:
        return await self.client.failover_logs(vbuckets)


async def bucket_conflict_mode(client: DcpClient, username: str, password: str) -> str:
    """The bucket's conflictResolutionType, from the REST API of any node of its cluster."""
    path = "/pools/default/buckets/" + urllib.parse.quote(client.bucket, safe="")
    errors = []
    for node in client.cluster_map.nodes:
        url = f"http://{node.hostname}:{node.mgmt_port}"
        try:
            doc = await asyncio.to_thread(rest_client.call, url, username, password, "GET", path, None, 10.0)
        except rest_client.RestError as e:
            errors.append(f"{url}: {e}")
            continue
        mode = doc.get("conflictResolutionType", "seqno") if isinstance(doc, dict) else None
        if mode not in ("seqno", "lww"):
            raise ReplicationError(f"bucket {client.bucket!r} resolves conflicts by {mode!r}; "
                                   f"only seqno and lww buckets can be replicated")
        return mode
    raise ReplicationError(f"cannot learn bucket {client.bucket!r}'s conflict resolution type from its REST API "
                           f"({'; '.join(errors) or 'no node in the map'}); give it with --conflict-resolution")
