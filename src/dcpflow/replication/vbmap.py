"""Planning a vbucket map: where each vbucket's active and replicas go (pure: no nodes, no I/O).

A map is a list of chains, one per vbucket: [active, replica 1, ...] as node indexes, -1 for no
node. `plan_map` is the target a rebalance moves to (rebalance.py, cluster.py).
"""

from .errors import ClusterError


def plan_map(current: list[list[int]], live: list[int], num_replicas: int) -> list[list[int]]:
    """A balanced map over `live` nodes that moves as little as it can.

    Actives: each node gets an equal share (the nodes that hold most now get the odd ones); a
    vbucket keeps its active where that node is live and under its share, else goes to a live
    node holding a copy of it (its replica: the cheapest move), else to the least loaded node.
    Replicas likewise, preferring nodes that already hold a copy. Chains are padded with -1 when
    there are fewer live nodes than copies.
    """
    if not live:
        raise ClusterError("no live node to place vbuckets on")
    nv = len(current)
    width = num_replicas + 1
    held = [{x for x in chain if x in live} for chain in current]
    counts = {n: sum(1 for chain in current if chain and chain[0] == n) for n in live}
    order = sorted(live, key=lambda n: (-counts[n], n))
    base, extra = divmod(nv, len(live))
    share = {n: base + (1 if i < extra else 0) for i, n in enumerate(order)}
    active = [-1] * nv
    load = dict.fromkeys(live, 0)
    for vb, chain in enumerate(current):
        a = chain[0] if chain else -1
        if a in share and load[a] < share[a]:
            active[vb], load[a] = a, load[a] + 1
    for vb in range(nv):
        if active[vb] >= 0:
            continue
        free = [n for n in live if load[n] < share[n]]
        best = min(free, key=lambda n: (n not in held[vb], load[n], n))
        active[vb], load[best] = best, load[best] + 1
    replicas = min(num_replicas, len(live) - 1)
    out = [[a] for a in active]
    if replicas:
        total = nv * replicas
        r_base, r_extra = divmod(total, len(live))
        r_share = {n: r_base + (1 if i < r_extra else 0) for i, n in enumerate(sorted(live))}
        r_load = dict.fromkeys(live, 0)
        for _ in range(replicas):
            for vb in range(nv):
                chain = out[vb]
                candidates = [n for n in live if n not in chain]
                under = [n for n in candidates if r_load[n] < r_share[n]] or candidates
                best = min(under, key=lambda n: (n not in held[vb], r_load[n], n))
                chain.append(best)
                r_load[best] += 1
        # The greedy pass can leave a node short (late vbuckets whose active it is cannot use it):
        # move replicas from nodes above their share to nodes below it, copies-in-place first.
        for _ in range(total):
            over = [n for n in live if r_load[n] > r_share[n]]
            short = [n for n in live if r_load[n] < r_share[n]]
            moved = False
            for a in over:
                for b in short:
                    options = [vb for vb in range(nv) if a in out[vb][1:] and b not in out[vb]]
                    if options:
                        vb = min(options, key=lambda v: (b not in held[v], a in held[v], v))
                        out[vb][out[vb].index(a)] = b
                        r_load[a] -= 1
                        r_load[b] += 1
                        moved = True
                        break
                if moved:
                    break
            if not moved:
                break
    for chain in out:
        chain.extend([-1] * (width - len(chain)))
    return out
