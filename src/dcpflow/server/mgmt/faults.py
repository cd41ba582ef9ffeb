"""Fault injection over REST: `/faults/...`, admin only (`cluster.admin!write`).

Each endpoint injects one fault of server/faults (what each does, and what a correct consumer
sees, is in docs/server.md "Fault injection") and answers 200 with a JSON object saying what it
did. Parameters come as an application/x-www-form-urlencoded body (as ns_server's own endpoints
take them) or as a JSON object; a parameter the endpoint does not know is refused, so a typo is
not silently ignored.

| endpoint | parameters |
|---|---|
| GET /faults | - : faults in force (paused buckets, delay rules) and the recent ones |
| DELETE /faults | - : resume persistence everywhere, remove every delay |
| POST /faults/buckets/<b>/failover | vbuckets (required: "0,4-7", "all" or a JSON list), unclean |
| POST /faults/buckets/<b>/rollback | vbucket, seqno (both required) |
| POST /faults/buckets/<b>/streams/end | reason (required), vbuckets, name (a DCP connection) |
| POST /faults/buckets/<b>/persistence/pause, .../resume | - |
| POST /faults/connections/drop | bucket, name, or all=true (one at least) |
| POST /faults/delays | seconds (required), opcode ("all" by default), duration |
| DELETE /faults/delays[/<opcode>] | - |
| POST /faults/nodes/failover | node (host:port; this node by default) |

Errors are the listener's (app.py), shaped as ns_server's: 401/403 without admin credentials, 404
`Requested resource not found.` for an unknown bucket, 400 {"errors": {param: message}} for a
malformed body or a bad parameter, 413 for a body over the limit.
"""

import re

from aiohttp import web

from dcpflow.engine import VBucketState
from dcpflow.protocol.dcp import StreamEndReason
from dcpflow.protocol.opcodes import Opcode

from ..faults import END_REASONS, BucketGone, FaultError
from ..faults.delays import ALL, MAX_DURATION, MAX_SECONDS, opcode_label
from .app import SERVER, error, errors, not_found, read_form, read_json, reply_json, require

routes = web.RouteTableDef()

_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
_MAX_SEQNO = 2**64 - 1


# ---------------------------------------------------------------------------------------------
# parameters


def _bad(field: str, message: str):
    return error(400, message, field=field)


async def _params(request: web.Request, allowed: tuple[str, ...]) -> dict:
    """The request's parameters, from a form or a JSON object; 400 for anything else, or for a
    parameter not in `allowed`."""
    if request.content_type == "application/json":
        doc = await read_json(request)
        if not isinstance(doc, dict):
            raise error(400, "The JSON body must be an object of parameters")
    else:
        doc = await read_form(request)
    unknown = {key: "Unsupported parameter" for key in doc if key not in allowed}
    if unknown:
        raise errors(unknown)
    return doc


def _int(doc: dict, key: str, low: int, high: int, *, required: bool = False) -> int | None:
    value = doc.get(key)
    if value is None:
        if required:
            raise _bad(key, f"{key} is required")
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise _bad(key, f"{key} must be an integer from {low} to {high}")
    return value


def _seconds(doc: dict, key: str, high: float, *, required: bool = False) -> float | None:
    value = doc.get(key)
    if value is None:
        if required:
            raise _bad(key, f"{key} is required")
        return None
    try:
        number = float(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        number = None
    if number is None or not 0 < number <= high:  # also refuses nan and infinities
        raise _bad(key, f"{key} must be a number of seconds above 0 and at most {high:g}")
    return number


def _flag(doc: dict, key: str) -> bool:
    value = doc.get(key, False)
    if value in (True, False, 0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
        return value.lower() in ("true", "1")
    raise _bad(key, f"{key} must be true or false")


def _text(doc: dict, key: str) -> str | None:
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise _bad(key, f"{key} must be a non-empty string")
    return value


def _vbuckets(doc: dict, key: str, engine, *, required: bool) -> list[int] | None:
    """"0,4-7", "all" (every vbucket active here: what fails over) or a JSON list of numbers."""
    value = doc.get(key)
    if value is None:
        if required:
            raise _bad(key, f"{key} is required: a list such as 0,4-7, or all")
        return None
    n = engine.num_vbuckets
    message = f"{key} must be all, or vbucket numbers from 0 to {n - 1} such as 0,4-7"
    if value == "all":
        return sorted(vb for vb, v in engine.vbuckets.items() if v.state == VBucketState.ACTIVE)
    out: list[int] = []
    if isinstance(value, list):
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise _bad(key, message)
        out = list(value)
    elif isinstance(value, str):
        for part in value.split(","):
            m = _RANGE.fullmatch(part.strip())
            if m is None:
                raise _bad(key, message)
            low, high = int(m.group(1)), int(m.group(2) or m.group(1))
            if high < low or high - low >= n:
                raise _bad(key, message)
            out.extend(range(low, high + 1))
    else:
        raise _bad(key, message)
    if not out or any(not 0 <= v < n for v in out):
        raise _bad(key, message)
    return sorted(set(out))


def _reason(doc: dict) -> StreamEndReason:
    value = doc.get("reason")
    names = ", ".join(r.name for r in END_REASONS)
    if value is None:
        raise _bad("reason", f"reason is required: one of {names}")
    reason = None
    if (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, str) and value.isdigit()):
        reason = StreamEndReason._value2member_map_.get(int(value))
    elif isinstance(value, str):
        reason = StreamEndReason.__members__.get(value.upper().replace("-", "_"))
    if reason is None:
        raise _bad("reason", f"unknown reason {value!r}: one of {names}")
    return reason


def parse_opcode(value) -> int | str:
    """"all", an opcode name (GET, dcp_stream_req) or its number (83, 0x53)."""
    if isinstance(value, str):
        text = value.strip()
        if text.lower() == ALL:
            return ALL
        if text.upper() in Opcode.__members__:
            return int(Opcode[text.upper()])
        try:
            value = int(text, 0)
        except ValueError:
            value = None
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 0xFF:
        return value
    raise _bad("opcode", f"unknown opcode {value!r}: all, a name such as GET or DCP_STREAM_REQ, or a number "
                         "from 0 to 255 (0x53)")


# ---------------------------------------------------------------------------------------------
# helpers


def _bucket(request: web.Request, name: str | None = None):
    """The bucket named in the path (or `name`), 404 when there is none; admin first."""
    server = request.app[SERVER]
    bucket = server.buckets.get(name if name is not None else request.match_info["bucket"])
    if bucket is None:
        raise not_found()
    return bucket


def _record(request: web.Request, bucket: str, text: str) -> None:
    request.app[SERVER].mgmt.observer.record("fault", bucket, text)


async def _injected(coro):
    """Await a fault: its refusals as ns_server-style 400s, a bucket dropped meanwhile as 404."""
    try:
        return await coro
    except FaultError as e:
        raise _bad(e.field, str(e)) from None
    except BucketGone:
        raise not_found() from None


def _done(call):
    try:
        return call()
    except FaultError as e:
        raise _bad(e.field, str(e)) from None


# ---------------------------------------------------------------------------------------------
# routes


@routes.get("/faults")
async def list_faults(request: web.Request) -> web.Response:
    require(request, "admin")
    return reply_json(request.app[SERVER].faults.active())


@routes.delete("/faults")
async def clear_faults(request: web.Request) -> web.Response:
    require(request, "admin")
    result = request.app[SERVER].faults.clear()
    _record(request, "", "faults cleared: persistence resumed, delays removed")
    return reply_json(result)


@routes.post("/faults/buckets/{bucket}/failover")
async def failover(request: web.Request) -> web.Response:
    require(request, "admin")
    bucket = _bucket(request)
    doc = await _params(request, ("vbuckets", "unclean"))
    vbids = _vbuckets(doc, "vbuckets", bucket.engine, required=True)
    if not vbids:
        raise _bad("vbuckets", "no vbucket is active on this node")
    unclean = _flag(doc, "unclean")
    result = await _injected(request.app[SERVER].faults.failover(bucket, vbids, unclean=unclean))
    _record(request, bucket.name, f"{'unclean ' if unclean else ''}failover of {len(vbids)} vbucket(s) injected: "
            f"new failover entries, {result['streams_ended']} stream(s) ended (STATE_CHANGED)")
    return reply_json(result)


@routes.post("/faults/buckets/{bucket}/rollback")
async def rollback(request: web.Request) -> web.Response:
    require(request, "admin")
    bucket = _bucket(request)
    doc = await _params(request, ("vbucket", "seqno"))
    vbid = _int(doc, "vbucket", 0, bucket.engine.num_vbuckets - 1, required=True)
    seqno = _int(doc, "seqno", 0, _MAX_SEQNO, required=True)
    result = await _injected(request.app[SERVER].faults.rollback(bucket, vbid, seqno))
    _record(request, bucket.name, f"rollback of vb {vbid} to seqno {result['reached']} injected: "
            f"{result['lost']} seqno(s) lost, {result['streams_ended']} stream(s) ended (ROLLBACK)")
    return reply_json(result)


@routes.post("/faults/buckets/{bucket}/streams/end")
async def end_streams(request: web.Request) -> web.Response:
    require(request, "admin")
    bucket = _bucket(request)
    doc = await _params(request, ("reason", "vbuckets", "name"))
    reason = _reason(doc)
    vbids = None if doc.get("vbuckets") == "all" else _vbuckets(doc, "vbuckets", bucket.engine, required=False)
    name = _text(doc, "name")
    result = _done(lambda: request.app[SERVER].faults.end_streams(bucket, reason, vbids=vbids, name=name))
    _record(request, bucket.name, f"{reason.name} injected into {len(result['streams'])} stream(s)")
    return reply_json(result)


@routes.post("/faults/buckets/{bucket}/persistence/pause")
async def pause_persistence(request: web.Request) -> web.Response:
    require(request, "admin")
    bucket = _bucket(request)
    await _params(request, ())
    result = await request.app[SERVER].faults.pause_persistence(bucket)
    _record(request, bucket.name, "persistence paused")
    return reply_json(result)


@routes.post("/faults/buckets/{bucket}/persistence/resume")
async def resume_persistence(request: web.Request) -> web.Response:
    require(request, "admin")
    bucket = _bucket(request)
    await _params(request, ())
    result = request.app[SERVER].faults.resume_persistence(bucket)
    _record(request, bucket.name, "persistence resumed")
    return reply_json(result)


@routes.post("/faults/connections/drop")
async def drop_connections(request: web.Request) -> web.Response:
    require(request, "admin")
    doc = await _params(request, ("bucket", "name", "all"))
    name, every = _text(doc, "name"), _flag(doc, "all")
    bucket_name = _text(doc, "bucket")
    if every == (bucket_name is not None or name is not None):
        raise _bad("_", "say which connections: bucket, name (a DCP connection), or all=true alone")
    bucket = _bucket(request, bucket_name) if bucket_name is not None else None
    result = request.app[SERVER].faults.drop_connections(bucket=bucket, name=name)
    _record(request, bucket_name or "", f"{result['dropped']} KV connection(s) dropped")
    return reply_json(result)


@routes.post("/faults/delays")
async def add_delay(request: web.Request) -> web.Response:
    require(request, "admin")
    doc = await _params(request, ("opcode", "seconds", "duration"))
    opcode = parse_opcode(doc.get("opcode", ALL))
    seconds = _seconds(doc, "seconds", MAX_SECONDS, required=True)
    duration = _seconds(doc, "duration", MAX_DURATION)
    result = _done(lambda: request.app[SERVER].faults.add_delay(opcode, seconds, duration))
    _record(request, "", f"KV requests {result['opcode']} delayed {seconds:g} s"
            + (f" for {duration:g} s" if duration else " until cleared"))
    return reply_json(result)


@routes.delete("/faults/delays")
async def clear_delays(request: web.Request) -> web.Response:
    require(request, "admin")
    return reply_json(request.app[SERVER].faults.clear_delays())


@routes.delete("/faults/delays/{opcode}")
async def clear_delay(request: web.Request) -> web.Response:
    require(request, "admin")
    opcode = parse_opcode(request.match_info["opcode"])
    result = request.app[SERVER].faults.clear_delays(opcode)
    if not result["delays_cleared"]:
        raise error(404, f"no delay rule for {opcode_label(opcode)}", field="opcode")
    return reply_json(result)


@routes.post("/faults/nodes/failover")
async def fail_over_node(request: web.Request) -> web.Response:
    require(request, "admin")
    doc = await _params(request, ("node",))
    node = _text(doc, "node")
    result = await _injected(request.app[SERVER].faults.fail_over_node(node))
    _record(request, "", f"node {node or 'this node'} failed over")
    return reply_json(result)
