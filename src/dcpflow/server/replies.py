"""A connection's error replies: XError context, engine errors, NOT_MY_VBUCKET with the cluster map.

Pages: https://github.com/couchbase/kv_engine/blob/master/docs/BinaryProtocol.md (error responses
with an XError JSON context; NOT_MY_VBUCKET carrying the map unless the client negotiated
DedupeNotMyVbucketClustermap and already has it) and docs/Collections.md (UNKNOWN_COLLECTION and
UNKNOWN_SCOPE carry the manifest uid). A mixin of connection.Connection, reading its session
(`xerror`, `dedupe_nmvb`, `known_config`, `bucket`, `server`); handlers everywhere call these.
"""

import json

from dcpflow.engine.errors import EngineError
from dcpflow.protocol import kv as kvproto
from dcpflow.protocol.datatype import Datatype
from dcpflow.protocol.frame import Frame, response
from dcpflow.protocol.status import Status

#: codes a client without XError does not know: it gets ETmpfail (KV-Engine remaps them the same way)
_XERROR_STATUSES = frozenset((Status.LOCKED, Status.NOT_LOCKED, Status.SYNC_WRITE_RE_COMMIT_IN_PROGRESS))


class Replies:
    """See the module docstring."""

    def error_reply(self, opcode: int, opaque: int, status: int, context: str | None = None) -> bytes:
        """An error response; clients that negotiated XERROR also get the reason as JSON context."""
        if self.xerror and context:
            return kvproto.error_response(opcode, status, opaque, context)
        return response(opcode, status, opaque=opaque)

    def engine_error(self, frame: Frame, e: EngineError) -> bytes:
        if e.status == Status.NOT_MY_VBUCKET:
            return self.not_my_vbucket(frame)
        if e.status in _XERROR_STATUSES and not self.xerror:
            # BinaryProtocol.md#0x95-unlock-key: clients without XError get ETmpfail instead (and for a
            # re-commit in progress, which is as temporary)
            return response(frame.opcode, Status.ETMPFAIL, opaque=frame.opaque)
        if e.status in (Status.UNKNOWN_COLLECTION, Status.UNKNOWN_SCOPE):
            # Collections.md: these carry the uid of the manifest the lookup used (the bucket's: the
            # lookup ran on this thread just now)
            uid = self.bucket.engine.manifest.uid if self.bucket is not None else 0
            doc = {"manifest_uid": format(uid, "x")}
            if self.xerror:
                doc["error"] = {"context": e.reason}
            return response(frame.opcode, e.status, opaque=frame.opaque, datatype=Datatype.JSON,
                            value=json.dumps(doc, separators=(",", ":")).encode())
        return self.error_reply(frame.opcode, frame.opaque, e.status, e.reason)

    def not_my_vbucket(self, frame: Frame) -> bytes:
        """NOT_MY_VBUCKET carries the current map, unless the client already has it and negotiated
        DedupeNotMyVbucketClustermap."""
        bucket = self.bucket
        if bucket is None:
            return response(frame.opcode, Status.NOT_MY_VBUCKET, opaque=frame.opaque)
        config = bucket.config()
        if self.dedupe_nmvb and self.known_config is not None and \
                self.known_config >= self.server.topology.version:
            config = b""
        else:
            self.known_config = self.server.topology.version
        return response(frame.opcode, Status.NOT_MY_VBUCKET, opaque=frame.opaque, value=config,
                        datatype=Datatype.JSON if config else 0)
