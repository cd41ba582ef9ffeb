"""The key and value of each DCP system event, in both layouts a consumer may ask for.

Page: https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/commands/system_event.md
(scope id before collection id, as its structs say; its example swaps them). Versions 0 and 1 are
fixed structs, network order:

* create collection: key = its name; version 0 (manifest uid u64, scope id u32, collection id
  u32), or version 1 adding maxTTL u32 when the collection has one;
* drop collection: no key; version 0 (manifest uid, scope id, collection id);
* create scope: key = its name; drop scope: no key; both version 0 (manifest uid, scope id);
* modify collection: only in FlatBuffers (a consumer without them is not sent it).

Version 2, with DCP_CONTROL `flatbuffers_system_events`, is one FlatBuffers table of
https://github.com/couchbase/kv_engine/blob/master/engines/ep/src/collections/events.fbs:
Collection (create, modify), DroppedCollection, Scope, DroppedScope (flatbuffers.py); the keys
are the same.
"""

import struct
from enum import IntEnum

from .errors import ProtocolError
from .flatbuffers import decode_table, encode_table


class SystemEventId(IntEnum):
    """The `event` of DCP_SYSTEM_EVENT's extras."""

    BEGIN_COLLECTION = 0
    END_COLLECTION = 1
    CREATE_SCOPE = 3
    DROP_SCOPE = 4
    MODIFY_COLLECTION = 5


_V0_COLLECTION = struct.Struct(">QII")
_V1_COLLECTION = struct.Struct(">QIII")
_V0_SCOPE = struct.Struct(">QI")
FLATBUFFERS_VERSION = 2

#: events.fbs, in field order: (name, kind)
TABLES = {
    SystemEventId.BEGIN_COLLECTION: (("uid", "u64"), ("scope_id", "u32"), ("collection_id", "u32"),
                                     ("ttl_valid", "bool"), ("max_ttl", "u32"), ("name", "string"),
                                     ("history", "bool")),
    SystemEventId.END_COLLECTION: (("uid", "u64"), ("scope_id", "u32"), ("collection_id", "u32")),
    SystemEventId.CREATE_SCOPE: (("uid", "u64"), ("scope_id", "u32"), ("name", "string")),
    SystemEventId.DROP_SCOPE: (("uid", "u64"), ("scope_id", "u32")),
}
TABLES[SystemEventId.MODIFY_COLLECTION] = TABLES[SystemEventId.BEGIN_COLLECTION]


def event_body(event: SystemEventId, *, flatbuffers: bool, manifest_uid: int, scope_id: int,
               collection_id: int = 0, name: str = "", max_ttl: int = 0,
               history: bool = False) -> tuple[int, bytes, bytes] | None:
    """(version, key, value) of a system event, or None for one the consumer is not sent (modify
    without FlatBuffers)."""
    collection = event in (SystemEventId.BEGIN_COLLECTION, SystemEventId.MODIFY_COLLECTION)
    key = name.encode() if collection or event == SystemEventId.CREATE_SCOPE else b""
    ttl = max(max_ttl, 0)
    if flatbuffers:
        values = {"uid": manifest_uid, "scope_id": scope_id, "collection_id": collection_id,
                  "ttl_valid": max_ttl != 0, "max_ttl": ttl, "name": name, "history": history}
        fields = [(kind, values[field]) if field != "ttl_valid" or max_ttl else None
                  for field, kind in TABLES[event]]
        return FLATBUFFERS_VERSION, key, encode_table(fields)
    if event == SystemEventId.MODIFY_COLLECTION:
        return None
    if event == SystemEventId.BEGIN_COLLECTION:
        if max_ttl:
            return 1, key, _V1_COLLECTION.pack(manifest_uid, scope_id, collection_id, ttl)
        return 0, key, _V0_COLLECTION.pack(manifest_uid, scope_id, collection_id)
    if event == SystemEventId.END_COLLECTION:
        return 0, key, _V0_COLLECTION.pack(manifest_uid, scope_id, collection_id)
    return 0, key, _V0_SCOPE.pack(manifest_uid, scope_id)


def decode_event_value(event: int, version: int, value: bytes) -> dict:
    """The fields of a system event's value (either layout), by the names of event_body's
    arguments; ProtocolError when it matches neither."""
    if version == FLATBUFFERS_VERSION:
        table = TABLES.get(event)
        if table is None:
            raise ProtocolError(f"system event {event} has no FlatBuffers table (events.fbs)")
        got = decode_table(value, [kind for _, kind in table])
        out = {field: v for (field, _), v in zip(table, got, strict=True) if v is not None}
        if "name" in out:
            out["name"] = out["name"].decode("utf-8", "replace")
        return {"manifest_uid": out.pop("uid", 0), **out}
    if event == SystemEventId.BEGIN_COLLECTION and version == 1 and len(value) == _V1_COLLECTION.size:
        uid, sid, cid, ttl = _V1_COLLECTION.unpack(value)
        return {"manifest_uid": uid, "scope_id": sid, "collection_id": cid, "max_ttl": ttl}
    if event in (SystemEventId.BEGIN_COLLECTION, SystemEventId.END_COLLECTION) and len(value) == _V0_COLLECTION.size:
        uid, sid, cid = _V0_COLLECTION.unpack(value)
        return {"manifest_uid": uid, "scope_id": sid, "collection_id": cid}
    if event in (SystemEventId.CREATE_SCOPE, SystemEventId.DROP_SCOPE) and len(value) == _V0_SCOPE.size:
        uid, sid = _V0_SCOPE.unpack(value)
        return {"manifest_uid": uid, "scope_id": sid}
    raise ProtocolError(f"system event {event} version {version} value of {len(value)} bytes does "
                        f"not match its struct (system_event.md)")
