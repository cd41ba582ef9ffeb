"""The streaming config endpoints, as ns_server serves them: `/pools/default/bs/<bucket>` (the
terse bucket map, the one `/pools/default/b/<bucket>` and the KV port serve),
`/pools/default/bucketsStreaming/<bucket>` (the bucket's JSON, as `/pools/default/buckets/<bucket>`
without its fast-changing basicStats), `/pools/default/nodeServicesStreaming` (the cluster-level
map of `/pools/default/nodeServices`) and `/poolsStreaming/default` (the pool of `/pools/default`,
whose `streamingUri` `/pools` advertises). SDKs that bootstrap over HTTP poll these (gocbcore's HTTP
config poller reads `bs` and, before this endpoint existed, logged "bad bucket" every 10 s).

What ns_server does (menelaus_util.erl, handle_streaming, in https://github.com/couchbase/ns_server)
and this module does the same: a 200 with a chunked body (application/json; charset=utf-8), the
config first, then a new one after every change, each followed by a "\\n\\n\\n\\n" chunk that
separates them; an unchanged config is not sent again; `?heartbeat=<seconds>` sends the separator
alone when nothing else was sent for that long; the stream ends when the bucket is dropped.

Why it stays bounded: a change only wakes the stream (Topology.watchers), the config is built when
the stream gets to it, so changes that arrive while a slow reader holds up the stream coalesce into
one config instead of queueing; aiohttp's writer waits for the transport to drain once it holds
more than its limit, so what is buffered for one reader is at most a few configs. A reader that
takes no bytes for SEND_TIMEOUT seconds is disconnected (ns_server's send timeout), a stream whose
reader left ends within GONE_CHECK seconds (aiohttp does not cancel its handler), and each stream is
one of the management port's `--mgmt-max-connections` connections.
"""

import asyncio
import contextlib
import json

from aiohttp import web

from .app import LISTENER, SERVER, error, not_found, require
from .buckets import bucket_json
from .nodes import bucket_map, cluster_map, pool_json

routes = web.RouteTableDef()

SEPARATOR = b"\n\n\n\n"
#: Seconds a write may wait for a reader to take bytes before the stream is dropped (ns_server's 5 s).
SEND_TIMEOUT = 5.0
#: Seconds between looks when nothing says something changed (ns_server's 25 s).
IDLE_LOOK = 25.0
#: Seconds between checks that the reader is still there (a stream that lost it ends within this).
GONE_CHECK = 2.0


@routes.get("/pools/default/bs/{bucket}")
async def terse_bucket_streaming(request: web.Request) -> web.StreamResponse:
    bucket = _bucket(request)
    return await _stream(request, lambda: bucket_map(request, bucket), bucket)


@routes.get("/pools/default/bucketsStreaming/{bucket}")
async def bucket_streaming(request: web.Request) -> web.StreamResponse:
    bucket = _bucket(request)
    return await _stream(request, lambda: bucket_json(request, bucket, streaming=True), bucket)


@routes.get("/pools/default/nodeServicesStreaming")
async def node_services_streaming(request: web.Request) -> web.StreamResponse:
    """The cluster-level map (what gocbcore polls when no bucket is open), for as long as the reader reads."""
    require(request, "pools.read")
    return await _stream(request, lambda: cluster_map(request), None)


@routes.get("/poolsStreaming/default")
async def pool_streaming(request: web.Request) -> web.StreamResponse:
    """The pool as /pools/default describes it (the `streamingUri` /pools advertises)."""
    user = require(request, "pools.read")
    return await _stream(request, lambda: pool_json(request, user, stable=True), None)


def _bucket(request: web.Request):
    name = request.match_info["bucket"]
    require(request, "bucket.read", name)
    bucket = request.app[SERVER].buckets.get(name)
    if bucket is None:
        raise not_found()
    return bucket


def _heartbeat(request: web.Request) -> float | None:
    text = request.query.get("heartbeat")
    if text is None:
        return None
    try:
        seconds = int(text)
    except ValueError:
        seconds = 0
    if seconds < 1:
        raise error(400, "The value must be an integer between 1 and 18446744073709551615.", field="heartbeat")
    return float(seconds)


async def _stream(request: web.Request, build, bucket) -> web.StreamResponse:
    """Stream `build()` until the reader leaves, the server stops or `bucket` (if any) is dropped."""
    server, listener = request.app[SERVER], request.app[LISTENER]
    name = bucket.name if bucket is not None else None
    heartbeat = _heartbeat(request)
    changed = asyncio.Event()
    server.topology.watchers.add(changed.set)
    response = web.StreamResponse(headers={"Content-Type": "application/json; charset=utf-8",
                                           "Cache-Control": "no-cache"})
    response.enable_chunked_encoding()
    try:
        await response.prepare(request)
        loop = asyncio.get_running_loop()
        last, sent_at, looked_at = None, loop.time(), loop.time()
        while not listener.closing and (bucket is None or server.buckets.get(name) is bucket):
            if request.transport is None or request.transport.is_closing():
                return response  # the reader left (aiohttp lets the handler run on: it ends here)
            if changed.is_set() or last is None or loop.time() - looked_at >= IDLE_LOOK:
                changed.clear()
                looked_at = loop.time()
                data = json.dumps(build(), separators=(",", ":")).encode()
                if data != last:
                    await asyncio.wait_for(_send(response, data), SEND_TIMEOUT)
                    last, sent_at = data, loop.time()
            if heartbeat is not None and loop.time() - sent_at >= heartbeat:
                await asyncio.wait_for(response.write(SEPARATOR), SEND_TIMEOUT)
                sent_at = loop.time()
            due = [GONE_CHECK, looked_at + IDLE_LOOK - loop.time()]
            if heartbeat is not None:
                due.append(sent_at + heartbeat - loop.time())
            with contextlib.suppress(TimeoutError):  # a heartbeat or a look is due, or a check for the reader
                await asyncio.wait_for(changed.wait(), max(min(due), 0.01))
        await response.write_eof()  # the bucket is gone, or the server stops
    except TimeoutError:
        server.log.warning("http-stream-timeout", "dropped the config stream %s to %s: it took no bytes for "
                           "%.0f s", request.path, request.remote, SEND_TIMEOUT)
        if request.transport is not None:
            request.transport.abort()
    except (ConnectionError, asyncio.CancelledError):
        pass  # the reader left
    finally:
        server.topology.watchers.discard(changed.set)
    return response


async def _send(response: web.StreamResponse, data: bytes) -> None:
    await response.write(data)
    await response.write(SEPARATOR)
