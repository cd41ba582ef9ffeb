"""Failover and rebalance: the two ways the cluster manager changes which node holds a vbucket's
active copy (failure-scenarios.md; rebalance.md, "VBucket Takeover").

* `failover(mgr, address)` - hard failover: the node's active vbuckets are promoted on the replica
  with the highest seqno (SET_VBUCKET active: a new branch of history, a new failover entry).
* `rebalance(mgr)` - a new balanced map over the nodes that are up (vbmap.plan_map): new copies
  are built as replicas and streamed, then each active that moves does so with a takeover stream,
  which hands over with DCP_SET_VBUCKET_STATE and adds no failover entry.

Each runs under the manager's lock, on the ClusterManager (cluster.py) it is given as `mgr`: its
nodes, map and replicators, and its own steps (SET_VBUCKET, publishing the map, reconciling the
replication streams).
"""

import asyncio
import contextlib
import time

from dcpflow.protocol.dcp import StreamEndReason, StreamFlag, VBucketState

from .errors import ClusterError
from .link import LinkError
from .replicator import Replicator
from .vbmap import plan_map


async def failover(mgr, address: str) -> dict:
    """Hard failover of a node (failure-scenarios.md): promote the replicas of its actives."""
    index = mgr.node_index(address)
    async with mgr._lock:
        node = mgr.nodes[index]
        if node.failed:
            raise ClusterError(f"node {address} is already failed over; `rebalance` brings it back")
        if sum(1 for n in mgr.nodes if not n.failed) < 2:
            raise ClusterError("cannot fail over the last node of the cluster")
        node.failed = True
        for key in [k for k in mgr.replicators if index in k]:
            mgr.replicators.pop(key).close()
        if node.healthy:  # still running: it must stop taking writes before others take over
            with contextlib.suppress(LinkError, OSError):
                for vb, chain in enumerate(mgr.map):
                    if index in chain:
                        await mgr._set_state(node, vb, VBucketState.DEAD)
        seqnos: dict[int, dict[int, int]] = {}
        for other in mgr.nodes:
            if mgr._usable(other.index):
                try:
                    seqnos[other.index] = await mgr.seqnos(other, VBucketState.REPLICA)
                except (LinkError, OSError) as e:
                    other.last_error = str(e)
        promoted = lost = 0
        for vb, chain in enumerate(mgr.map):
            if index not in chain:
                continue
            # Copies a rebalance was building count too (it may have stopped half-way): they
            # hold the same history, and may be all that is left of the vbucket.
            extra = mgr.extra_copies.get(vb, set())
            rest = [x for x in dict.fromkeys([*chain[1:], *sorted(extra)])
                    if x >= 0 and x != index and mgr._usable(x)]
            if chain[0] == index:
                if rest:
                    best = max(rest, key=lambda x: (seqnos.get(x, {}).get(vb, -1), -rest.index(x)))
                    await mgr._set_state(mgr.nodes[best], vb, VBucketState.ACTIVE)
                    rest.remove(best)
                    new = [best, *rest]
                    promoted += 1
                else:
                    new = [-1, *rest]
                    lost += 1
            else:
                new = [chain[0], *rest]
            mgr.map[vb] = (new + [-1] * (mgr.num_replicas + 1))[: mgr.num_replicas + 1]
            extra.difference_update(mgr.map[vb])  # in the chain now: no longer an extra copy
        mgr._event(f"failed over {address}: {promoted} vbucket(s) promoted" +
                    (f", {lost} without any copy" if lost else ""))
        await mgr._publish()
        await mgr._reconcile()
        return {"failed_over": address, "promoted": promoted, "without_copy": lost, "rev": mgr.rev}

async def rebalance(mgr) -> dict:
    """Spread vbuckets evenly over the nodes that are up (see the module docstring)."""
    async with mgr._lock:
        await mgr._check_nodes()
        for node in mgr.nodes:
            if node.failed and node.process is not None and not node.process.alive() and \
                    mgr.restart_node is not None:
                await mgr.restart_node(node)  # recovery of a failed-over node: start it again
                await mgr._connect(node, timeout=10.0)
        down = [n.address for n in mgr.nodes if not n.failed and not n.healthy]
        if down:
            raise ClusterError(f"node(s) {', '.join(down)} are down: fail them over first (`dcpflow cluster "
                               f"failover ADDRESS`) or start them again, then rebalance")
        live = [n.index for n in mgr.nodes if n.healthy]
        if not live:
            raise ClusterError("no node is up")
        back = [n for n in mgr.nodes if n.failed and n.healthy]
        for node in back:  # recovery: its data stays, DCP rolls it back to the cluster's history
            for vb, state in (await mgr._node_states(node)).items():
                if state != VBucketState.DEAD:
                    await mgr._set_state(node, vb, VBucketState.DEAD)
            node.failed = False
            mgr._event(f"node {node.address} rejoins")
        target = plan_map(mgr.map, live, mgr.num_replicas)
        moves = [vb for vb in range(mgr.num_vbuckets) if target[vb][0] != mgr.map[vb][0]]
        built = await _build_copies(mgr, target)
        if built:
            await _wait_copies(mgr, timeout=mgr.takeover_timeout)
        moved = 0
        for vb in moves:
            await _move_active(mgr, vb, target[vb][0])
            moved += 1
        # Final chains: the target's. Old actives it keeps as replicas go from dead to replica
        # (same history: a takeover adds no failover entry); copies it does not keep go dead.
        mgr.map = [list(chain) for chain in target]
        mgr.extra_copies.clear()
        for node in mgr.nodes:
            if node.healthy and not node.failed:
                await mgr._apply_states(node)
        await mgr._publish()
        await mgr._reconcile()
        mgr._event(f"rebalanced over {len(live)} node(s): {moved} active move(s), {built} new cop(ies)")
        return {"nodes": len(live), "moved": moved, "new_copies": built, "rev": mgr.rev}


async def _build_copies(mgr, target: list[list[int]]) -> int:
    """Nodes the target gives a vbucket that hold no copy yet get it as a replica, streamed
    from the current active."""
    built = 0
    for vb, chain in enumerate(target):
        holders = {x for x in mgr.map[vb] if x >= 0}
        for x in chain:
            if x >= 0 and x not in holders and mgr.map[vb][0] >= 0:
                await mgr._set_state(mgr.nodes[x], vb, VBucketState.REPLICA)
                mgr.extra_copies.setdefault(vb, set()).add(x)
                built += 1
    if built:
        await mgr._reconcile()
    return built


async def _wait_copies(mgr, timeout: float, gap: int = 100) -> None:
    """Until the new copies are within `gap` items of their actives (the takeover sends the rest)."""
    deadline = time.monotonic() + timeout
    while True:
        behind = await _copies_behind(mgr, gap)
        if not behind:
            return
        if time.monotonic() > deadline:
            mgr._event(f"{behind} new copies still behind after {timeout:g} s; continuing")
            return
        await mgr._reconcile()
        await asyncio.sleep(0.05)


async def _copies_behind(mgr, gap: int) -> int:
    active: dict[int, int] = {}
    replica: dict[int, dict[int, int]] = {}
    for node in mgr.nodes:
        if not mgr._usable(node.index):
            continue
        act = await mgr.seqnos(node, VBucketState.ACTIVE)
        for vb, s in act.items():
            if mgr.map[vb][0] == node.index:
                active[vb] = s
        replica[node.index] = await mgr.seqnos(node, VBucketState.REPLICA)
    behind = 0
    for vb, copies in mgr.extra_copies.items():
        for x in copies:
            have = replica.get(x, {}).get(vb)
            if have is None or have + gap < active.get(vb, 0):
                behind += 1
    return behind


async def _move_active(mgr, vb: int, dst: int) -> None:
    """Takeover (rebalance.md "VBucket Takeover"): the vbucket's active moves to `dst`."""
    src = mgr.map[vb][0]
    dst_node = mgr.nodes[dst]
    if src < 0 or not mgr._usable(src):
        # No active to take over from: promote the destination's copy (a failover of that vbucket).
        await mgr._set_state(dst_node, vb, VBucketState.ACTIVE)
        mgr.map[vb] = _chain_with_active(mgr, vb, dst)
        await mgr._publish()
        return
    mgr.moving.add(vb)
    try:
        rep = mgr.replicators.get((src, dst))
        if rep is not None:
            await rep.close_stream(vb)  # the replica stream gives way to the takeover stream
        name = f"replication:takeover:{mgr.nodes[src].address}->{dst_node.address}:{mgr.bucket}:{vb}"
        tko = Replicator(name, (mgr.nodes[src].host, mgr.nodes[src].port), (dst_node.host, dst_node.port),
                         bucket=mgr.bucket, user=mgr.user, password=mgr.password)
        await tko.start()
        try:
            await tko.add_stream(vb, StreamFlag.TAKEOVER)
            reason = await tko.wait_stream_end(vb, mgr.takeover_timeout)
        finally:
            tko.close()
        states = await mgr._node_states(dst_node)
        if reason != StreamEndReason.OK or states.get(vb) != VBucketState.ACTIVE:
            raise ClusterError(f"takeover of vbucket {vb} to {dst_node.address} did not complete (stream end "
                               f"{StreamEndReason(reason).name}, state {states.get(vb)!r})")
        chain = _chain_with_active(mgr, vb, dst)
        if src not in chain and -1 in chain:
            # Until the rebalance's final map, the old active (dead now, same history: a takeover
            # adds no failover entry) stays a copy: if the new active dies before the rebalance
            # ends, failover has it to promote (the final map keeps it or makes it dead).
            with contextlib.suppress(LinkError, OSError):
                await mgr._set_state(mgr.nodes[src], vb, VBucketState.REPLICA)
                chain[chain.index(-1)] = src
        mgr.map[vb] = chain
        mgr._event(f"vbucket {vb} moved {mgr.nodes[src].address} -> {dst_node.address}")
    except BaseException:
        await _undo_takeover(mgr, vb, src, dst)
        raise
    finally:
        mgr.moving.discard(vb)
    await mgr._publish()
    await mgr._reconcile()


async def _undo_takeover(mgr, vb: int, src: int, dst: int) -> None:
    """A takeover that failed: put the vbucket back as it was, one node at a time, so that a
    node that died on the way (the reason it failed) does not stop the other from being set.
    If the destination did become active (the source went dead before it), that is recorded
    instead: the map must name the one active copy there is."""
    dst_node = mgr.nodes[dst]
    try:
        dst_state = (await mgr._node_states(dst_node)).get(vb)
    except (LinkError, OSError):
        dst_state = None  # gone: whatever it holds is not serving
    if dst_state == VBucketState.ACTIVE:
        mgr.map[vb] = _chain_with_active(mgr, vb, dst)
        mgr._event(f"vbucket {vb} moved {mgr.nodes[src].address} -> {dst_node.address} (takeover ended "
                    "with an error after the destination became active)")
        with contextlib.suppress(LinkError, OSError):
            await mgr._publish()
        return
    with contextlib.suppress(LinkError, OSError):
        await mgr._set_state(mgr.nodes[src], vb, VBucketState.ACTIVE)  # it takes writes again
    if dst_state is not None:
        with contextlib.suppress(LinkError, OSError):
            await mgr._set_state(dst_node, vb, VBucketState.REPLICA)


def _chain_with_active(mgr, vb: int, active: int) -> list[int]:
    rest = [x for x in mgr.map[vb][1:] if x >= 0 and x != active]
    return ([active, *rest] + [-1] * (mgr.num_replicas + 1))[: mgr.num_replicas + 1]
