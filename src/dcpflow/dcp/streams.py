"""The streams of one producer connection: by (vbucket, stream-id), by vbucket, and which may
have work.

Pages: https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/commands/stream-request.md
(one stream per vbucket, or per vbucket and stream-id with `enable_stream_id`) and
commands/stream-end.md. A stream that ended is forgotten by its key at once (a new request for
the vbucket may follow) but is kept in `draining` until its last messages, the STREAM_END among
them, are written. `pending` is an ordered set of the streams that may have something to send: the
send pass visits them round-robin and drops the idle ones until something wakes them.
"""

from .active_stream import ActiveStream


class StreamRegistry:
    __slots__ = ("streams", "by_vb", "draining", "pending")

    def __init__(self) -> None:
        self.streams: dict[tuple[int, int | None], ActiveStream] = {}
        self.by_vb: dict[int, list[ActiveStream]] = {}
        self.draining: list[ActiveStream] = []  # dead, with a STREAM_END still to send
        self.pending: dict[ActiveStream, None] = {}  # may have work (an ordered set)

    def add(self, stream: ActiveStream) -> None:
        self.streams[(stream.vbid, stream.stream_id)] = stream
        self.by_vb.setdefault(stream.vbid, []).append(stream)

    def wake(self, stream: ActiveStream) -> None:
        self.pending[stream] = None

    def is_registered(self, stream: ActiveStream) -> bool:
        return self.streams.get((stream.vbid, stream.stream_id)) is stream

    def remove(self, stream: ActiveStream) -> None:
        """Forget a dead stream by its key; keep it until its messages are written."""
        key = (stream.vbid, stream.stream_id)
        if self.streams.get(key) is stream:
            del self.streams[key]
        peers = self.by_vb.get(stream.vbid)
        if peers and stream in peers:
            peers.remove(stream)
            if not peers:
                del self.by_vb[stream.vbid]
        if stream.ready:
            self.draining.append(stream)
            self.pending[stream] = None
        else:
            self.pending.pop(stream, None)

    def drained(self, stream: ActiveStream) -> None:
        """A dead stream wrote its last message: it is not waited for any more."""
        self.pending.pop(stream, None)
        if stream in self.draining:
            self.draining.remove(stream)

    def clear(self) -> None:
        self.streams.clear()
        self.by_vb.clear()
        self.pending.clear()
        self.draining.clear()
