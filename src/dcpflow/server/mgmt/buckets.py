"""Buckets over REST: `/pools/default/buckets` (list, create), `/pools/default/buckets/<b>` (get,
update, delete) and `/pools/default/buckets/<b>/controller/doFlush`.

The parameters are ns_server's (https://docs.couchbase.com/server/current/rest-api/rest-bucket-create.html),
sent as an application/x-www-form-urlencoded body as the SDKs' bucket managers send them; answers
are shaped as ns_server's, which the SDKs parse: a bucket is a JSON object with name, uuid,
bucketType, quota.rawRAM, replicaNumber, evictionPolicy, conflictResolutionType, controllers
(with `flush` when flushing is enabled), nodes[] and vBucketServerMap (the same map the KV port
serves, with `$HOST` replaced by the address the client dialled). Creation answers 202 with an
empty body, other changes 200; invalid parameters 400 with {"errors": {param: message}}; an
unknown bucket 404; a flush of a bucket without flushEnabled 400 "Flush is disabled for the
bucket".

What dcpflow serves: Couchbase (persistent) buckets with seqno or lww conflict resolution, any
number of vbuckets up to 1024, value-only or full eviction, no minimum durability. Other values of those
parameters are refused with a 400 that says so. `ramQuotaMB` (or `ramQuota`) is the bucket's memory
quota (engine/memory.py), in force at once when changed; a bucket that was never given one
reports the server's `--memory-quota`, and `basicStats` its memory use. The settings that change
nothing in the engine (replicaNumber, maxTTL, compressionMode, replicaIndex, flushEnabled) are kept
with the bucket and reported back; a single server places no replicas, so its map's numReplicas stays 0
whatever replicaNumber says. Creating, changing, dropping and flushing buckets is a single
server's: a node of `dcpflow cluster` serves the bucket its cluster manager set up and answers
those with 400.

Storage backends. Couchbase keeps history (collections with `history`, DCP change streams) only
in magma buckets, so dcpflow has ns_server's `storageBackend`: `couchstore` (the default) or
`magma`, both served by dcpflow's one store - the setting decides what the bucket may do, as in
Couchbase, not how it is stored. Only a magma bucket advertises `nonDedupedHistory` in its map (the
SDKs' collection managers refuse `history` to a bucket without it: FeatureUnavailable), reports
historyRetentionSeconds / historyRetentionBytes / historyRetentionCollectionDefault (true unless set,
as ns_server's default), and accepts them; a couchstore bucket answers them with ns_server's 400
"History Retention can only used with Magma" (menelaus_web_buckets.erl,
parse_validate_history_param_inner). historyRetentionBytes is 0 or at least 2 GiB, as ns_server's.
Changing `storageBackend` of an existing bucket is ns_server's storage mode migration, at once here
(one store): to magma always; back to couchstore refused with ns_server's 400 texts while the
bucket's historyRetentionCollectionDefault is explicitly true or a collection keeps history
(ns_bucket.erl, is_storage_mode_update_allowed).
"""

import json
import re

from aiohttp import web

from ..audit import CREATE_BUCKET, DELETE_BUCKET, FLUSH_BUCKET, MODIFY_BUCKET
from .app import (
    SERVER,
    HTTPError,
    allowed,
    audit_change,
    error,
    errors,
    not_found,
    path_bucket,
    read_form,
    reply_json,
    require,
)
from .nodes import bucket_map, node_entries

routes = web.RouteTableDef()

#: What a bucket created from the command line reports (ns_server's defaults for a new bucket).
DEFAULTS = {
    "ramQuotaMB": 100,
    "replicaNumber": 0,
    "flushEnabled": False,
    "maxTTL": 0,
    "compressionMode": "passive",
    "evictionPolicy": "valueOnly",
    "durabilityMinLevel": "none",
    "storageBackend": "couchstore",
    "replicaIndex": False,
    "historyRetentionSeconds": 0,
    "historyRetentionBytes": 0,
}
#: The history settings, which only a magma bucket has (ns_server's build_magma_bucket_info)
HISTORY_SETTINGS = ("historyRetentionSeconds", "historyRetentionBytes", "historyRetentionCollectionDefault")
HISTORY_RETENTION_BYTES_MIN = 2 * 1024 ** 3  # ns_bucket.hrl
MAX_UINT64 = (1 << 64) - 1
_MAGMA_ONLY = "History Retention can only used with Magma"  # ns_server's words
MIN_RAM_QUOTA_MB = 100
MAX_TTL = 2_147_483_647
MAX_VBUCKETS = 1024
_NAME = re.compile(r"[A-Za-z0-9._%-]{1,100}")
#: Parameters that are fixed when a bucket is created.
_CREATION_ONLY = ("bucketType", "conflictResolutionType", "numVBuckets")
_UPDATABLE = ("ramQuotaMB", "ramQuota", "replicaNumber", "flushEnabled", "maxTTL", "compressionMode", "storageBackend",
              "evictionPolicy", "durabilityMinLevel", "replicaIndex", "historyRetentionCollectionDefault",
              "historyRetentionBytes", "historyRetentionSeconds")
_UNSUPPORTED = "is not supported by dcpflow"


def settings_of(bucket) -> dict:
    quota = bucket.engine.memory.quota
    reported = {"ramQuotaMB": quota // (1024 * 1024)} if quota else {}
    settings = {**DEFAULTS, **reported, **bucket.settings}
    settings["evictionPolicy"] = bucket.engine.eviction_policy  # the server's flag, or as the bucket was
    settings["historyRetentionCollectionDefault"] = history_default(bucket)
    return settings


def history_default(bucket) -> bool:
    """Whether a new collection of the bucket keeps history when not told: ns_server's
    history_retention_collection_default - true unless set, and only ever for magma."""
    return bucket.keeps_history and bool(bucket.settings.get("historyRetentionCollectionDefault", True))


# ---------------------------------------------------------------------------------------------
# parameters


def _int(form: dict, key: str, low: int, high: int, problems: dict, message: str) -> int | None:
    text = form.get(key)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        problems[key] = message
        return None
    if not low <= value <= high:
        problems[key] = message
        return None
    return value


def _flag(form: dict, key: str, problems: dict) -> bool | None:
    text = form.get(key)
    if text is None:
        return None
    if text in ("1", "true"):
        return True
    if text in ("0", "false"):
        return False
    problems[key] = f"{key} must be 0 or 1"
    return None


def _choice(form: dict, key: str, supported: tuple[str, ...], known: tuple[str, ...], problems: dict) -> str | None:
    value = form.get(key)
    if value is None:
        return None
    if value in supported:
        return value
    if value in known:
        problems[key] = f"{key} {value!r} {_UNSUPPORTED} (it serves {', '.join(supported)})"
    else:
        problems[key] = f"{key} must be one of {', '.join(known)}"
    return None


def parse_settings(form: dict, *, creating: bool) -> tuple[dict, dict]:
    """(settings, creation parameters) from a create or update form; 400 with every problem found."""
    problems: dict[str, str] = {}
    allowed = {"name", *_CREATION_ONLY, *_UPDATABLE} if creating else {*_CREATION_ONLY, *_UPDATABLE}
    for key in form:
        if key not in allowed:
            problems[key] = "Unsupported parameter"
    settings: dict = {}
    quota_key = "ramQuotaMB" if "ramQuotaMB" in form or "ramQuota" not in form else "ramQuota"
    quota = _int(form, quota_key, MIN_RAM_QUOTA_MB, 1 << 40, problems,
                 f"RAM quota must be an integer of at least {MIN_RAM_QUOTA_MB} MiB")
    if quota is not None:
        settings["ramQuotaMB"] = quota
    elif creating and quota_key not in problems:
        problems["ramQuota"] = "The RAM Quota must be specified and must be a positive integer."
    replicas = _int(form, "replicaNumber", 0, 3, problems, "The replica number must be an integer from 0 to 3.")
    if replicas is not None:
        settings["replicaNumber"] = replicas
    max_ttl = _int(form, "maxTTL", 0, MAX_TTL, problems, f"Max TTL must be an integer from 0 to {MAX_TTL}")
    if max_ttl is not None:
        settings["maxTTL"] = max_ttl
    for key in ("flushEnabled", "replicaIndex"):
        value = _flag(form, key, problems)
        if value is not None:
            settings[key] = value
    for key, supported, known in (
            ("compressionMode", ("off", "passive", "active"), ("off", "passive", "active")),
            ("evictionPolicy", ("valueOnly", "fullEviction"), ("valueOnly", "fullEviction", "noEviction",
                                                              "nruEviction")),
            ("durabilityMinLevel", ("none",), ("none", "majority", "majorityAndPersistActive",
                                               "persistToMajority"))):
        value = _choice(form, key, supported, known, problems)
        if value is not None:
            settings[key] = value
    # history retention (DCP change streams): what compaction keeps of the older versions of
    # collections with history; the default `history` of new collections (magma only: check_history)
    for key, low in (("historyRetentionBytes", HISTORY_RETENTION_BYTES_MIN), ("historyRetentionSeconds", 0)):
        if form.get(key, "").strip() == "0":
            settings[key] = 0  # off: no minimum (ns_server's special case)
            continue
        value = _int(form, key, low, MAX_UINT64, problems,
                     f"Value must be an integer between {low} and {MAX_UINT64}, inclusive")
        if value is not None:
            settings[key] = value
    if form.get("historyRetentionCollectionDefault") not in (None, "true", "false"):
        problems["historyRetentionCollectionDefault"] = "Value must be true or false"
    elif "historyRetentionCollectionDefault" in form:
        settings["historyRetentionCollectionDefault"] = form["historyRetentionCollectionDefault"] == "true"
    creation: dict = {}
    _choice(form, "bucketType", ("couchbase", "membase"), ("couchbase", "membase", "ephemeral", "memcached"),
            problems)
    crt = _choice(form, "conflictResolutionType", ("seqno", "lww"), ("seqno", "lww", "custom"), problems)
    if crt is not None:
        creation["conflict_resolution"] = crt
    vbuckets = _int(form, "numVBuckets", 1, MAX_VBUCKETS, problems,
                    f"Number of vbuckets must be an integer from 1 to {MAX_VBUCKETS}")
    if vbuckets is not None:
        creation["num_vbuckets"] = vbuckets
    backend = _choice(form, "storageBackend", ("couchstore", "magma"), ("couchstore", "magma"), problems)
    if backend is not None:
        settings["storageBackend"] = backend
    if problems:
        raise errors(problems)
    return settings, creation


def check_history(settings: dict, magma: bool) -> None:
    """ns_server's 400 for history settings given to a bucket whose storage is not magma."""
    if not magma:
        given = {key: _MAGMA_ONLY for key in HISTORY_SETTINGS if key in settings}
        if given:
            raise errors(given)


def check_migration(bucket, backend: str) -> None:
    """A change of storage backend (ns_server's storage mode migration): back to couchstore only
    while nothing keeps history - ns_server answers these in plain text."""
    if backend == "magma" or not bucket.keeps_history:
        return
    if bucket.settings.get("historyRetentionCollectionDefault") is True:
        raise HTTPError(400, "Cannot migrate storage mode. history_retention enabled on bucket.", "text/plain")
    if any(c.history for scope in bucket.engine.manifest.scopes for c in scope.collections):
        raise HTTPError(400, "Cannot migrate storage mode. history_retention enabled on collections.", "text/plain")


def check_name(name: str | None, existing) -> None:
    """ns_server's bucket-name rules; the name also names a directory, which these rules keep safe."""
    if not name:
        raise errors({"name": "Bucket name cannot be empty"})
    if not _NAME.fullmatch(name):
        raise errors({"name": "Bucket name can only contain characters in range A-Z, a-z, 0-9 as well as "
                              "underscore, period, dash & percent. Consult the documentation."})
    if name.startswith("."):
        raise errors({"name": "Bucket name cannot start with dot."})
    if any(n.lower() == name.lower() for n in existing):
        raise errors({"name": "Bucket with given name already exists"})


# ---------------------------------------------------------------------------------------------
# answers


def bucket_json(request: web.Request, bucket, *, skip_map: bool = False, streaming: bool = False) -> dict:
    """The bucket as ns_server describes it; `streaming`: without basicStats, which change with every
    write (ns_server's streaming info level leaves them out too)."""
    server = request.app[SERVER]
    engine = bucket.engine
    settings = settings_of(bucket)
    config = bucket_map(request, bucket)
    stats = engine.stats()
    quota = settings["ramQuotaMB"] * 1024 * 1024
    memory = engine.memory
    base = f"/pools/default/buckets/{bucket.name}"
    doc = {
        "name": bucket.name,
        "nodeLocator": "vbucket",
        "bucketType": "membase",  # what ns_server calls a Couchbase bucket
        "storageBackend": settings["storageBackend"],
        "uuid": bucket.uuid,
        "uri": f"{base}?bucket_uuid={bucket.uuid}",
        "streamingUri": f"/pools/default/bucketsStreaming/{bucket.name}?bucket_uuid={bucket.uuid}",
        "numVBuckets": engine.num_vbuckets,
        "bucketCapabilitiesVer": "",
        "bucketCapabilities": config["bucketCapabilities"],
        "collectionsManifestUid": format(engine.manifest.uid, "x"),
        "controllers": {"compactAll": f"{base}/controller/compactBucket"},
        "nodes": node_entries(request, config["nodesExt"], stable=streaming),
        "stats": {"uri": f"{base}/stats"},
        "authType": "sasl",
        "replicaIndex": settings["replicaIndex"],
        "replicaNumber": settings["replicaNumber"],
        "threadsNumber": 3,
        "quota": {"ram": quota, "rawRAM": quota},
        "basicStats": {
            "quotaPercentUsed": round(100 * memory.used / memory.quota, 3) if memory.quota else 0,
            "opsPerSec": server.mgmt.observer.ops_per_second(bucket.name),
            "diskFetches": stats["ep_bg_fetched"] + stats["ep_bg_meta_fetched"],
            "itemCount": stats["curr_items"],
            "diskUsed": 0,
            "dataUsed": 0,
            "memUsed": memory.used,
        },
        "evictionPolicy": settings["evictionPolicy"],
        "durabilityMinLevel": settings["durabilityMinLevel"],
        "conflictResolutionType": engine.conflict_resolution.value,
        "maxTTL": settings["maxTTL"],
        "compressionMode": settings["compressionMode"],
    }
    if bucket.keeps_history:
        doc.update({key: settings[key] for key in HISTORY_SETTINGS})
    if settings["flushEnabled"]:
        doc["controllers"]["flush"] = f"{base}/controller/doFlush"
    if not skip_map:
        doc["vBucketServerMap"] = config["vBucketServerMap"]
    if streaming:
        del doc["basicStats"]
    return doc


def _single_server(server) -> None:
    if not server.manages_buckets:
        raise error(400, "This node belongs to a dcpflow cluster: its bucket is created and managed by the "
                         "cluster manager (`dcpflow cluster`), not through this API")


# ---------------------------------------------------------------------------------------------
# routes


@routes.get("/pools/default/buckets")
async def list_buckets(request: web.Request) -> web.Response:
    user = require(request, "pools.read")
    skip_map = request.query.get("skipMap") == "true"
    server = request.app[SERVER]
    return reply_json([bucket_json(request, b, skip_map=skip_map) for name, b in server.buckets.items()
                       if allowed(user, "bucket.read", name)])


@routes.post("/pools/default/buckets")
async def create_bucket(request: web.Request) -> web.Response:
    require(request, "bucket.create")
    server = request.app[SERVER]
    form = await read_form(request)
    _single_server(server)
    check_name(form.get("name"), server.buckets)
    settings, creation = parse_settings(form, creating=True)
    check_history(settings, settings.get("storageBackend") == "magma")
    name = form["name"]
    try:
        server.create_bucket(name, settings=settings, **creation)
    except ValueError as e:
        raise errors({"name": str(e)}) from None
    server.mgmt.observer.record("bucket", name, f"bucket {name!r} created")
    audit_change(request, CREATE_BUCKET, bucket_name=name, type="membase", props=json.dumps(form, sort_keys=True))
    return web.Response(status=202)


@routes.get("/pools/default/buckets/{bucket}")
async def get_bucket(request: web.Request) -> web.Response:
    bucket = path_bucket(request, "bucket.read")
    return reply_json(bucket_json(request, bucket, skip_map=request.query.get("skipMap") == "true"))


@routes.post("/pools/default/buckets/{bucket}")
async def update_bucket(request: web.Request) -> web.Response:
    bucket = path_bucket(request, "bucket.write")
    form = await read_form(request)
    _single_server(request.app[SERVER])
    settings, creation = parse_settings(form, creating=False)
    engine = bucket.engine
    fixed = {"conflict_resolution": ("conflictResolutionType", engine.conflict_resolution.value),
             "num_vbuckets": ("numVBuckets", engine.num_vbuckets)}
    problems = {param: f"{param} cannot be changed after the bucket is created (it is {current})"
                for key, (param, current) in fixed.items() if key in creation and creation[key] != current}
    if problems:
        raise errors(problems)
    backend = settings.get("storageBackend", settings_of(bucket)["storageBackend"])
    check_history(settings, backend == "magma")
    if backend != settings_of(bucket)["storageBackend"]:
        check_migration(bucket, backend)
    bucket.save_settings({**bucket.settings, **settings})
    audit_change(request, MODIFY_BUCKET, bucket_name=bucket.name, type="membase",
                 props=json.dumps(form, sort_keys=True))
    return web.Response(status=200)


@routes.delete("/pools/default/buckets/{bucket}")
async def delete_bucket(request: web.Request) -> web.Response:
    name = request.match_info["bucket"]
    require(request, "bucket.delete", name)
    server = request.app[SERVER]
    if name not in server.buckets:
        raise not_found()
    _single_server(server)
    await server.drop_bucket(name)
    server.mgmt.observer.record("bucket", name, f"bucket {name!r} dropped: its connections were closed")
    audit_change(request, DELETE_BUCKET, bucket_name=name)
    return web.Response(status=200)


@routes.post("/pools/default/buckets/{bucket}/controller/doFlush")
async def flush_bucket(request: web.Request) -> web.Response:
    bucket = path_bucket(request, "bucket.flush")
    server = request.app[SERVER]
    _single_server(server)
    if not settings_of(bucket)["flushEnabled"]:
        raise error(400, "Flush is disabled for the bucket")
    try:
        removed = await server.flush_bucket(bucket.name)
    except KeyError:  # dropped meanwhile
        raise not_found() from None
    server.mgmt.observer.record("flush", bucket.name, f"bucket {bucket.name!r} flushed: {removed} documents "
                                "removed, every vbucket has a new failover entry (DCP clients roll back to 0)")
    audit_change(request, FLUSH_BUCKET, bucket_name=bucket.name)
    return web.Response(status=200)
