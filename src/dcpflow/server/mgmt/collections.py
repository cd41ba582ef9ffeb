"""Scopes and collections over REST, the routes of
https://docs.couchbase.com/server/current/rest-api/scopes-and-collections-api.html:

    GET    /pools/default/buckets/<b>/scopes                          the manifest
    PUT    /pools/default/buckets/<b>/scopes                          set the whole manifest (JSON)
    POST   /pools/default/buckets/<b>/scopes                          create a scope (name=)
    DELETE /pools/default/buckets/<b>/scopes/<s>                      drop a scope
    POST   /pools/default/buckets/<b>/scopes/<s>/collections          create a collection (name=, maxTTL=, history=)
    PATCH  /pools/default/buckets/<b>/scopes/<s>/collections/<c>      update a collection (maxTTL=, history=)
    DELETE /pools/default/buckets/<b>/scopes/<s>/collections/<c>      drop a collection

The manifest is the engine's (engine/collections.py): each route asks the bucket for the change
(`Bucket.change_manifest`: persisted, then followed by every active vbucket with its system
events) and answers ns_server's way: 200 {"uid": "<new manifest uid>"} on success (the official
SDKs' collection manager waits for that uid to reach the KV nodes); 404 "Scope with name ... is not
found" / "Collection with name ... is not found"; 400 "... already exists" or why a name, a maxTTL
or a change is not valid; and for what this server does not do (dropping the `_default`
collection, history on it) 400 with ns_server's "Not allowed on this version of cluster" first, from
which the SDKs raise FeatureNotAvailable. `history=true` on a bucket whose storage is not magma
answers ns_server's 400 "Not allowed on this type of bucket" in plain text
(menelaus_web_collections.erl, history_validator); the SDKs do not get that far, as such a bucket
does not advertise nonDedupedHistory (mgmt/buckets.py). A new collection without `history` takes the
bucket's historyRetentionCollectionDefault. A dropped collection's documents are purged from disk by
the server once the drop is persisted (Server._flush_loop).
"""

import json

from aiohttp import web

from dcpflow.engine.collections import Manifest, ManifestError

from ..audit import CREATE_COLLECTION, CREATE_SCOPE, DROP_COLLECTION, DROP_SCOPE, MODIFY_COLLECTION, SET_MANIFEST
from .app import SERVER, HTTPError, audit_change, error, path_bucket, read_form, read_json, reply_json
from .buckets import history_default

routes = web.RouteTableDef()

_BASE = "/pools/default/buckets/{bucket}/scopes"
_STATUS = {"unknown_scope": 404, "unknown_collection": 404, "exists": 400, "invalid": 400, "unsupported": 400}


def _change(request: web.Request, bucket, fn, event, **fields) -> web.Response:
    """Apply a manifest change; the answer carries the new manifest uid (so does the cluster map
    from now on: its revision moves). Audited as `event` (ns_server's fields) once applied."""
    before = bucket.engine.manifest
    try:
        manifest: Manifest = bucket.engine.change_manifest(fn)
    except ManifestError as e:
        message = str(e)
        if e.kind == "unsupported":
            message = f"Not allowed on this version of cluster: {message}"
        raise error(_STATUS[e.kind], message) from None
    if manifest is not before:
        request.app[SERVER].topology.bump()
    audit_change(request, event, bucket_name=bucket.name, **fields, new_manifest_uid=format(manifest.uid, "x"))
    return reply_json({"uid": format(manifest.uid, "x")})


def _ttl(form: dict) -> int | None:
    if "maxTTL" not in form:
        return None
    try:
        value = int(form["maxTTL"])
    except ValueError:
        value = -2
    if not -1 <= value <= 2_147_483_647:
        raise error(400, "maxTTL must be an integer from -1 to 2147483647", field="maxTTL")
    return value


def _history(form: dict, bucket) -> bool | None:
    if "history" not in form:
        return None
    if form["history"] not in ("true", "false"):
        raise error(400, "history must be true or false", field="history")
    if form["history"] == "true" and not bucket.keeps_history:
        raise HTTPError(400, "Not allowed on this type of bucket", "text/plain")
    return form["history"] == "true"


@routes.get(_BASE)
async def get_scopes(request: web.Request) -> web.Response:
    bucket = path_bucket(request, "bucket.read")
    return reply_json(bucket.engine.manifest.to_json(rest=True))


@routes.put(_BASE)
async def set_manifest(request: web.Request) -> web.Response:
    """The whole manifest at once, by name: scopes and collections it lacks are dropped, new ones
    created (Manifest.with_scopes)."""
    bucket = path_bucket(request, "bucket.write")
    doc = await read_json(request)
    if not isinstance(doc, dict) or not isinstance(doc.get("scopes"), list):
        raise error(400, 'The manifest must be a JSON object with a "scopes" list')
    try:
        wanted = {s["name"]: [c["name"] for c in s.get("collections", [])] for s in doc["scopes"]}
    except (TypeError, KeyError, AttributeError):
        raise error(400, "Every scope and collection of the manifest needs a name") from None
    return _change(request, bucket, lambda m: m.with_scopes(wanted), SET_MANIFEST,
                   input_manifest=json.dumps(doc, separators=(",", ":")))


@routes.post(_BASE)
async def create_scope(request: web.Request) -> web.Response:
    bucket = path_bucket(request, "bucket.write")
    form = await read_form(request)
    name = form.get("name")
    if not name:
        raise error(400, "Scope name is missing", field="name")
    return _change(request, bucket, lambda m: m.add_scope(name), CREATE_SCOPE, scope_name=name)


@routes.delete(_BASE + "/{scope}")
async def drop_scope(request: web.Request) -> web.Response:
    bucket = path_bucket(request, "bucket.write")
    scope = request.match_info["scope"]
    return _change(request, bucket, lambda m: m.drop_scope(scope), DROP_SCOPE, scope_name=scope)


@routes.post(_BASE + "/{scope}/collections")
async def create_collection(request: web.Request) -> web.Response:
    bucket = path_bucket(request, "bucket.write")
    form = await read_form(request)
    name = form.get("name")
    if not name:
        raise error(400, "Collection name is missing", field="name")
    scope = request.match_info["scope"]
    ttl, history = _ttl(form), _history(form, bucket)
    if history is None:
        history = history_default(bucket)
    return _change(request, bucket, lambda m: m.add_collection(scope, name, max_ttl=ttl or 0, history=history),
                   CREATE_COLLECTION, scope_name=scope, collection_name=name)


@routes.patch(_BASE + "/{scope}/collections/{collection}")
async def update_collection(request: web.Request) -> web.Response:
    bucket = path_bucket(request, "bucket.write")
    form = await read_form(request)
    scope, name = request.match_info["scope"], request.match_info["collection"]
    ttl, history = _ttl(form), _history(form, bucket)
    return _change(request, bucket, lambda m: m.update_collection(scope, name, max_ttl=ttl, history=history),
                   MODIFY_COLLECTION, scope_name=scope, collection_name=name)


@routes.delete(_BASE + "/{scope}/collections/{collection}")
async def drop_collection(request: web.Request) -> web.Response:
    bucket = path_bucket(request, "bucket.write")
    scope, name = request.match_info["scope"], request.match_info["collection"]
    return _change(request, bucket, lambda m: m.drop_collection(scope, name), DROP_COLLECTION, scope_name=scope,
                   collection_name=name)
