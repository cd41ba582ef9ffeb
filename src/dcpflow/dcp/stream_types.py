"""What a producer stream is made of: its states, the connection's options that shape its messages,
a backfill's range and the ready-queue entry of whole messages (active_stream.py, stream_messages.py,
stream_backfill.py share them)."""

from dataclasses import dataclass
from enum import Enum

from dcpflow.protocol.dcp import SnapshotFlag, whole_messages

MAX_SEQNO = 0xFFFFFFFFFFFFFFFF
U64 = 0xFFFFFFFFFFFFFFFF
MEMORY, DISK, CHK, ACK = (int(SnapshotFlag.MEMORY), int(SnapshotFlag.DISK), int(SnapshotFlag.CHECKPOINT),
                          int(SnapshotFlag.ACK))
HISTORY, MAY_DUPLICATE = int(SnapshotFlag.HISTORY), int(SnapshotFlag.MAY_CONTAIN_DUPLICATES)


class Frames:
    """A ready-queue entry holding `count` whole messages (a backfill page SQLite encoded). The
    owner may send a prefix of it (`split`), never part of a message."""

    __slots__ = ("data", "count")

    def __init__(self, data: bytes | memoryview, count: int):
        self.data, self.count = data, count

    def __len__(self) -> int:
        return len(self.data)

    def split(self, nbytes: int) -> tuple["Frames", "Frames | None"]:
        """The shortest prefix of whole messages holding at least `nbytes` bytes, and the rest."""
        data = memoryview(self.data)
        pos, n = whole_messages(data, nbytes)
        if pos >= len(data):
            return self, None
        return Frames(data[:pos], n), Frames(data[pos:], self.count - n)


class StreamState(Enum):
    BACKFILLING = "backfilling"
    IN_MEMORY = "in-memory"
    TAKEOVER_SEND = "takeover-send"
    TAKEOVER_WAIT = "takeover-wait"
    DEAD = "dead"


@dataclass(slots=True)
class StreamOptions:
    """The connection's settings that shape a stream's messages (DCP_OPEN flags, DCP_CONTROL keys,
    HELLO Collections)."""

    include_xattrs: bool = False
    no_value: bool = False
    no_value_underlying_datatype: bool = False
    delete_times: bool = False
    expiry_opcode: bool = False  # effective only with delete_times (as in KV-Engine): the producer checks
    collections: bool = False  # keys carry the LEB128 collection id; SEQNO_ADVANCED may be sent
    sync_replication: bool = False  # enable_sync_writes + consumer_name: markers at least V2.0
    sync_writes: bool = False  # enable_sync_writes: DCP_PREPARE / DCP_COMMIT / DCP_ABORT (module docstring)
    marker_v22: bool = False  # max_marker_version=2.2: Disk markers carry the purge seqno
    skip_deletes_in_initial_backfill: bool = False
    supports_cursor_dropping: bool = False
    send_stream_end_on_close: bool = False
    compress_values: bool = False  # force_value_compression: values go out Snappy-compressed
    flatbuffers_events: bool = False  # flatbuffers_system_events: system event values as FlatBuffers
    change_streams: bool = False  # history of the collections that keep it (module docstring)


@dataclass(frozen=True, slots=True)
class BackfillRange:
    """Read items with start <= seqno <= end from disk (`Store.scan(vb, start - 1, end)`), and
    every older version of the `history` collections."""

    start: int
    end: int
    history: frozenset[int] = frozenset()
