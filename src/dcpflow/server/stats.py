"""STAT 0x10: one reply frame per statistic, then an empty terminator (BinaryProtocol.md#0x10-stat).

Groups (the key; an optional vbucket id may follow after a space):
  ""                   server counters, plus the selected bucket's (curr_items, ep_queue_size...)
  "vbucket-seqno [vb]" high/persisted seqnos, uuid, purge seqno (stats-vbucket-seqno.md): what DCP
                       clients read before STREAM_REQ
  "vbucket-details [vb]", "failovers [vb]", "vbucket" (state of every vbucket)
  "dcp"                every DCP connection of the bucket (dcp_commands.py)
  "collections"        the manifest uid, and per collection (0x<scope id>:0x<collection id>:) its
                       live documents in active vbuckets and its highest seqno
An unknown group answers KEY_ENOENT, as memcached does; a vbucket that is not here NOT_MY_VBUCKET.
"""

import os
import time
from collections.abc import Callable

from dcpflow.protocol import kv as kvproto
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import Frame
from dcpflow.protocol.status import Status

from .auth import Privilege
from .connection import Connection
from .dcp_commands import dcp_stats


def server_stats(conn: Connection) -> dict:
    server = conn.server
    now = time.time()
    out = {
        "pid": os.getpid(),
        "uptime": int(now - server.started),
        "time": int(now),
        "version": server.version,
        "curr_connections": len(server.connections),
        "total_connections": server.total_connections,
    }
    if conn.bucket is not None:
        out.update(conn.bucket.counters.as_dict())
        out.update(conn.bucket.engine.stats())
        out["ep_persistence_paused"] = int(conn.bucket.persistence_paused)
        out.update(fragmentation_stats(conn.bucket))
    return out


def fragmentation_stats(bucket) -> dict[str, int]:
    """The store as last measured (server/app.py checks it after writes): couch_docs_fragmentation
    is ns_server's name, a percentage."""
    frag = bucket.fragmentation
    out = {"ep_compactions": bucket.compactions, "ep_compactions_for_fragmentation": bucket.fragmentation_compactions}
    if frag is not None:
        out.update({"couch_docs_fragmentation": round(100 * frag.fraction), "ep_db_item_rows": frag.items,
                    "ep_db_history_rows": frag.history, "ep_db_file_size": frag.file_bytes,
                    "ep_db_free_bytes": frag.free_bytes})
    return out


def _vbucket_states(conn: Connection, vbid: int | None) -> dict:
    engine = conn.bucket.engine
    vbs = [engine.vbucket(vbid)] if vbid is not None else [engine.vbuckets[v] for v in sorted(engine.vbuckets)]
    return {f"vb_{vb.id}": vb.state.name.lower() for vb in vbs}


#: Group name -> (takes a vbucket argument, builder(conn, vbid)).
GROUPS: dict[str, Callable[[Connection, int | None], dict]] = {
    "vbucket-seqno": lambda c, vb: c.bucket.engine.vbucket_seqno_stats(vb),
    "vbucket-details": lambda c, vb: c.bucket.engine.vbucket_details_stats(vb),
    "failovers": lambda c, vb: c.bucket.engine.failovers_stats(vb),
    "vbucket": _vbucket_states,
    "dcp": dcp_stats,
    "collections": lambda c, vb: c.bucket.engine.collection_stats(),
}


def parse_group(key: bytes) -> tuple[str, int | None]:
    """`vbucket-seqno 12` -> ("vbucket-seqno", 12)."""
    text = key.decode("utf-8", "replace").strip()
    group, _, arg = text.partition(" ")
    arg = arg.strip()
    if not arg:
        return group, None
    if not arg.isdigit() or int(arg) > 0xFFFF:
        raise ProtocolError(f"stat group {group!r}: vbucket argument {arg!r} is not a vbucket id")
    return group, int(arg)


def stat(conn: Connection, frame: Frame) -> bytes:
    req = kvproto.Stat.from_frame(frame)
    group, vbid = parse_group(req.group)
    if not group:
        if conn.bucket is not None and not conn.privileges & Privilege.STATS:
            return conn.error_reply(frame.opcode, frame.opaque, Status.EACCESS, "no stats privilege on this bucket")
        return kvproto.encode_stats(server_stats(conn), frame.opaque)
    builder = GROUPS.get(group)
    if builder is None:
        return conn.error_reply(frame.opcode, frame.opaque, Status.KEY_ENOENT, f"unknown stat group {group!r}")
    if conn.bucket is None:
        return conn.error_reply(frame.opcode, frame.opaque, Status.NO_BUCKET, "select a bucket first")
    if not conn.privileges & Privilege.STATS:
        return conn.error_reply(frame.opcode, frame.opaque, Status.EACCESS, "no stats privilege on this bucket")
    return kvproto.encode_stats(builder(conn, vbid), frame.opaque)
