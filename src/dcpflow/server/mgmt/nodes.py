"""The cluster and its nodes over REST: `/pools`, `/pools/default` (and `/pools/nodes`, which
ns_server serves as its alias: menelaus_web.erl, MB-10859), `/pools/default/nodeServices`,
the terse bucket map `/pools/default/b/<bucket>`, and `/` (what the SDKs' `ping()` and
`wait_until_ready()` fetch to see that the management service answers).

Shapes follow ns_server (https://docs.couchbase.com/server/current/rest-api/rest-cluster-get.html,
rest-cluster-details.html, rest-list-node-services.html): the SDKs read nodes[].hostname, otpNode,
version, os, status and services of /pools/default, and nodeServices is the cluster-level map
(nodesExt with each node's service ports). Every map comes from the one the KV port serves
(server/topology.py), with `$HOST` replaced by the address the HTTP client dialled. Each node
also says `configuredHostname`, the host:port of its REST port (what the official Python SDK's
test harness reads from /pools/nodes to reach every node), and the cluster's name and uuid are the
ones the KV port's maps carry.
"""

import json
import os
import platform
import sys
import time
import uuid as uuidlib

from aiohttp import web

from dcpflow.protocol.config import HOST_PLACEHOLDER

from .app import SERVER, USER, allowed, not_found, reply_json, request_host, require

routes = web.RouteTableDef()


def _substitute(request: web.Request, data: bytes) -> dict:
    return json.loads(data.decode().replace(HOST_PLACEHOLDER, request_host(request)))


def bucket_map(request: web.Request, bucket) -> dict:
    """The bucket's map as the KV port serves it, `$HOST` replaced."""
    return _substitute(request, bucket.config())


def cluster_map(request: web.Request) -> dict:
    return _substitute(request, request.app[SERVER].topology.cluster_config())


def _memory() -> tuple[int, int]:
    try:
        pages, avail = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_AVPHYS_PAGES")
        size = os.sysconf("SC_PAGE_SIZE")
        return pages * size, avail * size
    except (ValueError, OSError, AttributeError):
        return 0, 0


def node_entries(request: web.Request, nodes_ext: list[dict], *, stable: bool = False) -> list[dict]:
    """ns_server's node objects for the map's nodes (index-aligned with nodesExt); `stable`: without
    the figures that change all the time (uptime, memory, items), as ns_server's streaming info
    leaves them out, so a stream sends a node again only when it changed."""
    server = request.app[SERVER]
    total, free = _memory()
    items = sum(b.engine.stats()["curr_items"] for b in server.buckets.values())
    out = []
    for ext in nodes_ext:
        services = ext["services"]
        host = ext.get("hostname", request_host(request))
        this = bool(ext.get("thisNode"))
        ports = {"direct": services["kv"]}
        if "mgmtSSL" in services:
            ports["httpsMgmt"] = services["mgmtSSL"]
        entry = {
            "hostname": f"{host}:{services['mgmt']}",
            "configuredHostname": f"{host}:{services['mgmt']}",
            "otpNode": f"ns_1@{host.strip('[]')}",
            "nodeUUID": uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"dcpflow-node:{host}:{services['kv']}").hex,
            "clusterMembership": "active",
            "recoveryType": "none",
            # Only this node is known to be up; the others are what the cluster manager's map says.
            "status": "healthy" if this else "unknown",
            "thisNode": this,
            "version": f"{server.version}-dcpflow",
            "os": f"{platform.machine()}-{sys.platform}",
            "services": ["kv"],
            "ports": ports,
        }
        if this and not stable:
            entry.update({
                "uptime": str(int(time.time() - server.started)),
                "memoryTotal": total,
                "memoryFree": free,
                "interestingStats": {"curr_items": items},
                "systemStats": {"mem_total": total, "mem_free": free},
            })
        out.append(entry)
    return out


@routes.get("/")
async def root(request: web.Request) -> web.Response:
    """ns_server sends a browser to its console; the SDKs' ping only needs an answer."""
    raise web.HTTPFound("/ui/")


@routes.get("/pools")
async def pools(request: web.Request) -> web.Response:
    """Served without credentials, as ns_server does (clients discover the cluster with it)."""
    server = request.app[SERVER]
    uuid = server.topology.cluster_uuid
    user = request.get(USER)
    return reply_json({
        "isAdminCreds": bool(user is not None and user.is_admin),
        "isROAdminCreds": False,
        "isEnterprise": False,
        "allowedServices": ["kv"],
        "isDeveloperPreview": False,
        "packageVariant": "",
        "pools": [{"name": "default", "uri": f"/pools/default?uuid={uuid}",
                   "streamingUri": f"/poolsStreaming/default?uuid={uuid}"}],
        "settings": {},
        "uuid": uuid,
        "implementationVersion": f"{server.version}-dcpflow",
        "componentsVersion": {"ns_server": f"{server.version}-dcpflow"},
    })


@routes.get("/pools/default")
@routes.get("/pools/nodes")
async def pool_default(request: web.Request) -> web.Response:
    user = require(request, "pools.read")
    return reply_json(pool_json(request, user))


def pool_json(request: web.Request, user, *, stable: bool = False) -> dict:
    """The pool (the cluster); `stable`: without the nodes' fast-changing figures (node_entries)."""
    server = request.app[SERVER]
    uuid = server.topology.cluster_uuid
    cmap = cluster_map(request)
    names = [name for name in server.buckets if allowed(user, "bucket.read", name)]
    return {
        "name": "default",
        "clusterName": server.topology.cluster_name,
        "nodes": node_entries(request, cmap["nodesExt"], stable=stable),
        "bucketNames": [{"bucketName": n, "uuid": server.buckets[n].uuid} for n in names],
        "buckets": {"uri": f"/pools/default/buckets?v={server.topology.rev}&uuid={uuid}",
                    "terseBucketsBase": "/pools/default/b/",
                    "terseStreamingBucketsBase": "/pools/default/bs/"},
        "nodeServicesUri": f"/pools/default/nodeServices?v={server.topology.rev}",
        "rebalanceStatus": "none",
        "balanced": True,
        "memoryQuota": sum(b.settings.get("ramQuotaMB", 100) for b in server.buckets.values()),
    }


@routes.get("/pools/default/nodeServices")
async def node_services(request: web.Request) -> web.Response:
    require(request, "pools.read")
    return reply_json(cluster_map(request))


@routes.get("/pools/default/b/{bucket}")
async def terse_bucket(request: web.Request) -> web.Response:
    name = request.match_info["bucket"]
    require(request, "bucket.read", name)
    bucket = request.app[SERVER].buckets.get(name)
    if bucket is None:
        raise not_found()
    return reply_json(bucket_map(request, bucket))
