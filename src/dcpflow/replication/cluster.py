"""ClusterManager: the ns_server role for a dcpflow cluster on one machine.

Reference: https://github.com/couchbase/kv_engine/tree/master/docs/dcp/documentation (rebalance.md,
failure-scenarios.md, commands/add-stream.md, commands/set-vbucket-state.md, and
set-vbucket-state-value.md, whose JSON value belongs to SET_VBUCKET 0x3d, not to the DCP command).
A vbucket that becomes active other than by a DCP takeover starts a new failover entry; a takeover
keeps the log the new active received in its stream-request reply.

What it owns:

* **The vbucket map** - for each vbucket a chain [active, replica 1, ...] of node indexes (-1: no
  node). A new cluster gets `balanced_vbucket_map`: actives in equal ranges, each node's replicas
  dealt round-robin over the others. Each node is told every vbucket's state with SET_VBUCKET.
* **Replication** - for every (active node, replica node) pair a Replicator relays one DCP
  producer connection and one DCP consumer connection, and ADD_STREAM asks the replica node's
  consumer for each vbucket (the consumer then requests the stream itself; see
  dcp/consumer.py). A reconcile loop keeps the streams the map wants and drops the rest, so a
  stream that ended (state change, lost connection) is re-added.
* **Publication** - every change bumps `rev` and pushes the map to every reachable node with
  SET_CLUSTER_CONFIG; nodes serve it to clients (GET_CLUSTER_CONFIG, NOT_MY_VBUCKET replies).
  The manager's maps use revEpoch 2, so they win over the single-node map a node serves before
  its first push (epoch 1). Failed-over nodes are left out of the published serverList.
* **Failover** (`failover(node)`, rebalance.py) - the node's active vbuckets are promoted on the replica with
  the highest seqno: SET_VBUCKET active, so that replica starts a new branch of history (a new
  failover entry at its last complete snapshot). Writes the old active had not replicated are
  gone, and every DCP consumer that saw them is told to roll back by the new active.
* **Rebalance** (`rebalance()`, rebalance.py) - a new balanced map (vbmap.py) over the nodes that are up (a failed-over
  node that is running again comes back, rolled back to the new history by DCP). New copies are
  built as replicas and streamed; each active that moves does so with a takeover stream: the old
  active streams the rest, hands over with DCP_SET_VBUCKET_STATE (pending, then active) and is
  dead afterwards - no write lost, no new failover entry.

All changes to the map run under one lock; the manager is single-threaded asyncio.
"""

import asyncio
import contextlib
import json
import logging
import os
import time
import uuid as uuidlib
from pathlib import Path

from dcpflow.protocol import kv as kvproto
from dcpflow.protocol.config import (
    DEFAULT_MGMT_PORT,
    Node,
    balanced_vbucket_map,
    build_bucket_config,
    encode_config,
    parse_cluster_map,
)
from dcpflow.protocol.dcp import StreamEndReason, VBucketState
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.status import Status

from . import rebalance
from .errors import ClusterError
from .link import Link, LinkError
from .replicator import Replicator, node_name
from .vbmap import plan_map

__all__ = ["STATE_FILE", "ClusterError", "ClusterManager", "NodeState", "plan_map"]

log = logging.getLogger("dcpflow.replication")

#: The manager's maps beat any map a node derives on its own (epoch 1).
REV_EPOCH = 2
STATE_FILE = "cluster.json"
_STATE_NAMES = {"active": VBucketState.ACTIVE, "replica": VBucketState.REPLICA, "pending": VBucketState.PENDING,
                "dead": VBucketState.DEAD}


class NodeState:
    """What the manager knows about one node."""

    def __init__(self, index: int, host: str, port: int, failed: bool = False, mgmt_port: int | None = None):
        self.index = index
        self.host, self.port = host, port
        self.mgmt_port = mgmt_port  # the node's HTTP management port, advertised in the map (None: not known)
        self.failed = failed  # failed over: out of the map until a rebalance takes it back
        self.link: Link | None = None
        self.last_error = ""
        self.process = None  # a NodeProcess when the manager started the node
        self._next_connect = 0.0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def healthy(self) -> bool:
        if self.process is not None and not self.process.alive():
            return False
        return self.link is not None and self.link.alive

    def __repr__(self) -> str:
        return f"<Node {self.index} {self.address}{' failed' if self.failed else ''}>"


class ClusterManager:
    """See the module docstring. `nodes` are (host, port) in node order."""

    def __init__(self, nodes: list[tuple[str, int]], *, bucket: str = "default", num_vbuckets: int = 64,
                 num_replicas: int = 1, user: str = "Administrator", password: str = "password",
                 state_path: str | Path | None = None, reconcile_interval: float = 0.5,
                 takeover_timeout: float = 120.0):
        if len(nodes) < 1:
            raise ClusterError("a cluster needs at least one node")
        if not 0 <= num_replicas <= 3:
            raise ClusterError(f"--replicas must be 0..3 (Couchbase's limit), got {num_replicas}")
        self.nodes = [NodeState(i, h, p) for i, (h, p) in enumerate(nodes)]
        self.bucket = bucket
        self.num_vbuckets = num_vbuckets
        self.num_replicas = num_replicas
        self.user, self.password = user, password
        self.state_path = Path(state_path) if state_path else None
        self.reconcile_interval = reconcile_interval
        self.takeover_timeout = takeover_timeout
        self.map: list[list[int]] | None = None
        self.rev = 0
        self.rev_epoch = REV_EPOCH
        self.uuid = uuidlib.uuid4().hex
        self.extra_state: dict = {}  # written into the state file too (the CLI keeps its pids there)
        self.replicators: dict[tuple[int, int], Replicator] = {}
        self.extra_copies: dict[int, set[int]] = {}  # vb -> nodes being built as copies (rebalance)
        self.moving: set[int] = set()  # vbuckets in a takeover: no regular stream to the destination
        self.held: set[int] = set()  # nodes whose replication is held (fault injection: a lagging network)
        self.stream_ends: list[tuple[float, int, int, int, int]] = []  # (time, src, dst, vb, reason), recent
        self.events: list[str] = []
        self._retry_at: dict[tuple[int, int, int], float] = {}
        # (node, vb) -> the replication chain last sent with SET_VBUCKET to that node's active copy
        self._topologies: dict[tuple[int, int], list] = {}
        self._lock = asyncio.Lock()
        self._task: asyncio.Task | None = None
        self._wake = asyncio.Event()
        self._stopping = False
        self.restart_node = None  # async fn(NodeState): start a dead node again (the CLI sets it)

    # -- persistence -------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "bucket": self.bucket, "num_vbuckets": self.num_vbuckets, "num_replicas": self.num_replicas,
            "uuid": self.uuid, "rev_epoch": self.rev_epoch, "rev": self.rev,
            "nodes": [{"host": n.host, "port": n.port, "failed": n.failed, "mgmt_port": n.mgmt_port}
                      for n in self.nodes],
            "map": self.map, **self.extra_state,
        }

    def save(self) -> None:
        if self.state_path is None:
            return
        tmp = self.state_path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds the control token
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(self.to_json(), indent=1))
        os.replace(tmp, self.state_path)

    @classmethod
    def from_state(cls, state: dict, **kwargs) -> "ClusterManager":
        mgr = cls([(n["host"], n["port"]) for n in state["nodes"]], bucket=state["bucket"],
                  num_vbuckets=state["num_vbuckets"], num_replicas=state["num_replicas"], **kwargs)
        mgr.uuid = state["uuid"]
        mgr.rev = state["rev"]
        mgr.rev_epoch = state.get("rev_epoch", REV_EPOCH)
        mgr.map = state.get("map")
        for node, saved in zip(mgr.nodes, state["nodes"], strict=True):
            node.failed = bool(saved.get("failed"))
            node.mgmt_port = saved.get("mgmt_port")
        return mgr

    def _event(self, text: str) -> None:
        log.info("cluster: %s", text)
        self.events.append(f"{time.strftime('%H:%M:%S')} {text}")
        del self.events[:-100]

    # -- life cycle --------------------------------------------------------------------------------
    async def start(self) -> "ClusterManager":
        """Connect to every node, set the vbucket states, publish the map, start replicating."""
        await asyncio.gather(*(self._connect(n, timeout=10.0) for n in self.nodes))
        down = [n.address for n in self.nodes if not n.healthy and not n.failed]
        if down and self.map is None:
            raise ClusterError(f"cannot create the cluster: node(s) {', '.join(down)} unreachable "
                               f"({'; '.join(n.last_error for n in self.nodes if not n.healthy)})")
        async with self._lock:
            if self.map is None:
                self.map = balanced_vbucket_map(self.num_vbuckets, len(self.nodes), self.num_replicas)
                self._event(f"new cluster: {len(self.nodes)} nodes, {self.num_vbuckets} vbuckets, "
                            f"{self.num_replicas} replica(s)")
            for node in self.nodes:
                if node.healthy and not node.failed:
                    await self._apply_states(node)
            await self._publish()
            await self._reconcile()
        self._task = asyncio.create_task(self._loop(), name="dcpflow-cluster-reconcile")
        return self

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        for rep in list(self.replicators.values()):
            rep.close()
        self.replicators.clear()
        for node in self.nodes:
            if node.link is not None:
                node.link.close()
        self.save()

    async def __aenter__(self) -> "ClusterManager":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    async def _loop(self) -> None:
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.reconcile_interval)
            self._wake.clear()
            if self._stopping:
                return
            try:
                async with self._lock:
                    await self._check_nodes()
                    await self._reconcile()
            except Exception:
                log.exception("cluster reconcile failed; will retry")

    def wake(self) -> None:
        self._wake.set()

    # -- nodes -------------------------------------------------------------------------------------
    async def _connect(self, node: NodeState, timeout: float = 2.0) -> bool:
        link = None
        try:
            link = await Link.open(node.host, node.port, label=f"manager->{node.address}", timeout=timeout)
            await link.login(self.user, self.password, self.bucket, timeout=timeout)
            await self._learn_mgmt_port(node, link, timeout)
        except (LinkError, OSError) as e:
            if link is not None:
                link.close()
            node.last_error = str(e)
            return False
        if node.link is not None:
            node.link.close()
        node.link = link
        node.last_error = ""
        link.on_lost.append(lambda _l, n=node: self._node_lost(n))
        return True

    async def _learn_mgmt_port(self, node: NodeState, link: Link, timeout: float) -> None:
        """The node's HTTP management port, from the map it serves on its own (revEpoch below the
        manager's: a node that was just started); the maps the manager publishes advertise it."""
        reply = await link.call(kvproto.GetClusterConfig(), timeout, check=True, what="GET_CLUSTER_CONFIG")
        try:
            own = parse_cluster_map(reply.value)
        except ProtocolError as e:
            raise LinkError(f"{node.address}: its cluster map does not parse: {e}") from None
        this = own.this_node
        if own.rev_epoch < REV_EPOCH and this is not None:
            node.mgmt_port = own.nodes[this].mgmt_port

    def _node_lost(self, node: NodeState) -> None:
        for key in [k for k in self._topologies if k[0] == node.index]:
            del self._topologies[key]  # a restarted node has forgotten them
        if not self._stopping:
            self._event(f"lost the connection to node {node.address}")
            self.wake()

    async def _check_nodes(self) -> None:
        """Reconnect to nodes that went away; one that comes back gets its states and the map again
        (a restart without failover: its vbuckets resume where the disk left them)."""
        now = time.monotonic()
        for node in self.nodes:
            if node.healthy or now < node._next_connect:
                continue
            if node.process is not None and not node.process.alive():
                continue
            node._next_connect = now + 1.0
            mgmt_port = node.mgmt_port
            if await self._connect(node):
                self._event(f"node {node.address} is reachable again")
                if not node.failed:
                    await self._apply_states(node)
                if node.mgmt_port != mgmt_port and self.map is not None:
                    await self._publish()  # every node's map must advertise the new management port
                else:
                    await self._push_map(node)

    def node_index(self, address: str) -> int:
        for node in self.nodes:
            if node.address == address or f"localhost:{node.port}" == address:
                return node.index
        raise ClusterError(f"{address} is not a node of this cluster (nodes: "
                           f"{', '.join(n.address for n in self.nodes)})")

    def _usable(self, index: int) -> bool:
        return index >= 0 and not self.nodes[index].failed and self.nodes[index].healthy

    async def _node_states(self, node: NodeState) -> dict[int, VBucketState]:
        stats = await node.link.call(kvproto.Stat(b"vbucket"), what="STAT vbucket")
        if stats.status != Status.SUCCESS:
            raise LinkError(f"{node.address}: STAT vbucket failed with status 0x{stats.status:x}")
        return {int(k[3:]): _STATE_NAMES[v] for k, v in stats.stats.items() if k.startswith("vb_")}

    async def _set_state(self, node: NodeState, vb: int, state: VBucketState) -> None:
        await node.link.call(kvproto.SetVbucket(vb, int(state)), check=True,
                             what=f"SET_VBUCKET vb {vb} {state.name.lower()}")

    async def _apply_states(self, node: NodeState) -> None:
        """Make the node's vbucket states what the map says (active / replica); vbuckets the map
        does not give it that it still has alive are made dead."""
        have = await self._node_states(node)
        want: dict[int, VBucketState] = {}
        for vb, chain in enumerate(self.map):
            if chain[0] == node.index:
                want[vb] = VBucketState.ACTIVE
            elif node.index in chain[1:] or node.index in self.extra_copies.get(vb, ()):
                want[vb] = VBucketState.REPLICA
        for vb, state in have.items():
            if vb not in want and state != VBucketState.DEAD:
                want[vb] = VBucketState.DEAD
        todo = [(vb, s) for vb, s in want.items() if have.get(vb) != s]
        if todo:
            await asyncio.gather(*(self._set_state(node, vb, s) for vb, s in todo))

    async def seqnos(self, node: NodeState, state: VBucketState) -> dict[int, int]:
        reply = await node.link.call(kvproto.GetAllVbSeqnos(int(state)), check=True, what="GET_ALL_VB_SEQNOS")
        return kvproto.GetAllVbSeqnosResponse.from_frame(reply).as_dict()

    # -- the map -----------------------------------------------------------------------------------
    def published_map(self) -> tuple[list[NodeState], list[list[int]]]:
        """Members (not failed over) and the map re-indexed over them."""
        members = [n for n in self.nodes if not n.failed]
        index_of = {n.index: i for i, n in enumerate(members)}
        return members, [[index_of.get(x, -1) for x in chain] for chain in self.map]

    def config_json(self) -> bytes:
        members, vmap = self.published_map()
        cluster_uuid = uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"dcpflow-cluster:{self.uuid}").hex
        config = build_bucket_config(self.bucket, [Node(n.port, hostname=n.host,
                                                        mgmt_port=n.mgmt_port or DEFAULT_MGMT_PORT)
                                                   for n in members],
                                     vbucket_map=vmap, num_replicas=self.num_replicas, rev=self.rev,
                                     rev_epoch=self.rev_epoch, uuid=self.uuid,
                                     cluster_uuid=cluster_uuid)  # one cluster, one uuid: every node serves it
        return encode_config(config)

    async def _push_map(self, node: NodeState) -> None:
        if not node.healthy or self.rev == 0:
            return
        try:
            await node.link.call(kvproto.SetClusterConfig(self.bucket.encode(), self.config_json(), self.rev_epoch,
                                                          self.rev), check=True, what="SET_CLUSTER_CONFIG")
        except LinkError as e:
            log.warning("cluster: could not push map rev %d to %s: %s", self.rev, node.address, e)

    async def _publish(self) -> None:
        """A new revision of the map, pushed to every reachable node and saved."""
        self.rev += 1
        self.save()
        await asyncio.gather(*(self._push_map(n) for n in self.nodes if n.healthy))

    # -- replication -------------------------------------------------------------------------------
    def wanted_streams(self) -> dict[tuple[int, int], set[int]]:
        want: dict[tuple[int, int], set[int]] = {}
        for vb, chain in enumerate(self.map):
            src = chain[0]
            if not self._usable(src) or src in self.held:
                continue
            for dst in [*chain[1:], *self.extra_copies.get(vb, ())]:
                if dst != src and self._usable(dst) and vb not in self.moving:
                    want.setdefault((src, dst), set()).add(vb)
        return want

    def _replicator_name(self, src: int, dst: int) -> str:
        a, b = self.nodes[src], self.nodes[dst]
        return f"replication:{a.address}->{b.address}:{self.bucket}"

    def _on_stream_end(self, src: int, dst: int, vb: int, reason: int) -> None:
        self.stream_ends.append((time.time(), src, dst, vb, reason))
        del self.stream_ends[:-1000]
        if reason != StreamEndReason.OK and not self._stopping:
            self.wake()

    def _on_replicator_lost(self, key: tuple[int, int], rep: Replicator) -> None:
        if self.replicators.get(key) is rep:
            del self.replicators[key]
        if not self._stopping:
            self.wake()

    def topology(self, vb: int) -> list[str | None]:
        """The vbucket's replication chain by node name (None: a slot with no usable node)."""
        return [node_name(self.nodes[i].host, self.nodes[i].port) if i >= 0 and self._usable(i) else None
                for i in self.map[vb]]

    async def _push_topologies(self) -> None:
        """Tell each active copy its chain (SET_VBUCKET's `topology`, set-vbucket-state-value.md)
        when it changed: sync writes need a majority of it, and a promoted replica drives the
        prepares it holds to commit once its new chain acknowledges them."""
        if self.map is None:
            return
        jobs = []
        for vb, chain in enumerate(self.map):
            active = chain[0]
            if active < 0 or vb in self.moving or not self._usable(active) or not self.nodes[active].healthy:
                continue
            topo = self.topology(vb)
            if self._topologies.get((active, vb)) != topo:
                jobs.append(self._send_topology(active, vb, topo))
        if jobs:
            await asyncio.gather(*jobs)

    async def _send_topology(self, index: int, vb: int, topo: list) -> None:
        node = self.nodes[index]
        try:
            value = json.dumps({"topology": [topo]}).encode()
            await node.link.call(kvproto.SetVbucket(vb, int(VBucketState.ACTIVE), value), check=True,
                                 what=f"SET_VBUCKET vb {vb} topology")
            self._topologies[(index, vb)] = topo
        except (LinkError, OSError) as e:
            log.info("cluster: topology of vb %d on %s: %s (will retry)", vb, node.address, e)

    async def _reconcile(self) -> None:
        """Make the running streams what the map wants (adding, closing, reconnecting), and tell
        the active copies their chains."""
        await self._push_topologies()
        want = self.wanted_streams()
        for key, rep in list(self.replicators.items()):
            if key not in want or not rep.alive:
                rep.close()
                del self.replicators[key]
        now = time.monotonic()
        jobs = []
        for key, vbs in want.items():
            rep = self.replicators.get(key)
            if rep is None:
                if now < self._retry_at.get((*key, -1), 0):
                    continue
                src, dst = self.nodes[key[0]], self.nodes[key[1]]
                rep = Replicator(self._replicator_name(*key), (src.host, src.port), (dst.host, dst.port),
                                 bucket=self.bucket, user=self.user, password=self.password,
                                 on_stream_end=lambda vb, reason, k=key: self._on_stream_end(*k, vb, reason),
                                 on_lost=lambda r, k=key: self._on_replicator_lost(k, r))
                try:
                    await rep.start()
                except (LinkError, OSError) as e:
                    self._retry_at[(*key, -1)] = now + 1.0
                    log.warning("cluster: cannot open %s: %s", rep.name, e)
                    continue
                self.replicators[key] = rep
            for vb in sorted(vbs - rep.streams - rep.adding):
                if now >= self._retry_at.get((*key, vb), 0):
                    jobs.append(self._add_stream(key, rep, vb))
            for vb in sorted(rep.streams - vbs):
                jobs.append(self._close_stream(rep, vb))
        if jobs:
            await asyncio.gather(*jobs)

    async def _add_stream(self, key: tuple[int, int], rep: Replicator, vb: int) -> None:
        try:
            await rep.add_stream(vb)
            self._retry_at.pop((*key, vb), None)
        except (LinkError, OSError) as e:
            self._retry_at[(*key, vb)] = time.monotonic() + 1.0
            log.info("cluster: ADD_STREAM vb %d on %s: %s (will retry)", vb, rep.name, e)

    async def _close_stream(self, rep: Replicator, vb: int) -> None:
        try:
            await rep.close_stream(vb)
        except (LinkError, OSError) as e:
            log.info("cluster: CLOSE_STREAM vb %d on %s: %s", vb, rep.name, e)

    async def reconcile(self) -> None:
        """One reconcile pass now (tests, CLI)."""
        async with self._lock:
            await self._check_nodes()
            await self._reconcile()

    async def hold_replication(self, address: str, hold: bool = True) -> None:
        """Fault injection (tests, drills): stop (or resume) replicating from a node's actives, as if
        its replication links were cut; its clients keep writing to it."""
        index = self.node_index(address)
        async with self._lock:
            if hold:
                self.held.add(index)
            else:
                self.held.discard(index)
            await self._reconcile()

    # -- status ------------------------------------------------------------------------------------
    async def status(self) -> dict:
        """Per node: state, vbuckets active/replica (by the map), high seqnos, replication lag.
        Not serialised with map changes, so it answers during a long rebalance too."""
        return await self._status()

    async def _status(self) -> dict:
        actives: dict[int, int] = {}  # vb -> active high seqno
        per_node: dict[int, tuple[dict[int, int], dict[int, int]]] = {}

        async def ask(node: NodeState):
            try:
                per_node[node.index] = (await self.seqnos(node, VBucketState.ACTIVE),
                                        await self.seqnos(node, VBucketState.REPLICA))
            except (LinkError, OSError) as e:
                node.last_error = str(e)

        await asyncio.gather(*(ask(n) for n in self.nodes if n.healthy))
        for idx, (act, _) in per_node.items():
            for vb, seqno in act.items():
                if self.map[vb][0] == idx:
                    actives[vb] = seqno
        nodes = []
        for node in self.nodes:
            act, rep = per_node.get(node.index, ({}, {}))
            lags = [max(0, actives[vb] - seqno) for vb, seqno in rep.items()
                    if vb in actives and node.index in self.map[vb][1:]]
            nodes.append({
                "node": node.address,
                "index": node.index,
                "status": "failed over" if node.failed else ("up" if node.healthy else "down"),
                "pid": node.process.pid if node.process is not None else None,
                "active_vbuckets": sum(1 for chain in self.map if chain[0] == node.index),
                "replica_vbuckets": sum(1 for chain in self.map if node.index in chain[1:]),
                "active_high_seqno_total": sum(act.values()),
                "replica_high_seqno_total": sum(rep.values()),
                "replication_lag_items": sum(lags),
                "replication_lag_max": max(lags, default=0),
                "error": node.last_error or None,
            })
        streams = sum(len(r.streams) for r in self.replicators.values())
        wanted = sum(len(v) for v in self.wanted_streams().values())
        return {
            "bucket": self.bucket, "num_vbuckets": self.num_vbuckets, "num_replicas": self.num_replicas,
            "rev": self.rev, "rev_epoch": self.rev_epoch, "nodes": nodes,
            "vbuckets_without_active": sum(1 for chain in self.map if chain[0] < 0),
            "vbuckets_without_replica": sum(1 for chain in self.map if self.num_replicas and
                                            all(x < 0 for x in chain[1:])),
            "streams": streams, "streams_wanted": wanted, "events": self.events[-10:],
        }

    async def replication_lag(self) -> int:
        """Items the replicas are behind their actives, summed over the cluster."""
        st = await self.status()
        return sum(n["replication_lag_items"] for n in st["nodes"])

    async def wait_replicated(self, timeout: float = 60.0) -> None:
        """Until every wanted stream runs and every replica has its active's high seqno."""
        deadline = time.monotonic() + timeout
        while True:
            st = await self.status()
            lag = sum(n["replication_lag_items"] for n in st["nodes"])
            if lag == 0 and st["streams"] == st["streams_wanted"]:
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"replicas still {lag} items behind, {st['streams']}/{st['streams_wanted']} "
                                   f"streams after {timeout:g} s")
            self.wake()
            await asyncio.sleep(0.05)

    # -- failover and rebalance (rebalance.py) -----------------------------------------------------
    async def failover(self, address: str) -> dict:
        """Hard failover of a node (failure-scenarios.md): promote the replicas of its actives."""
        return await rebalance.failover(self, address)

    async def rebalance(self) -> dict:
        """Spread vbuckets evenly over the nodes that are up (see the module docstring)."""
        return await rebalance.rebalance(self)
