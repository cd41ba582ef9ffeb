"""The flags and enums of the DCP pages, with the values KV-Engine's code uses (its headers, not the
pages, define them): open, stream, snapshot, stream-end, vbucket state, durability, OSO.
"""

from enum import IntEnum, IntFlag

# ---------------------------------------------------------------------------------------------
# Flags and enums: the values KV-Engine's code uses (its headers, not the pages, define them)


class OpenFlag(IntFlag):
    PRODUCER = 0x001
    INVALID_NOTIFIER = 0x002
    INCLUDE_XATTRS = 0x004
    NO_VALUE = 0x008
    UNUSED = 0x010
    INCLUDE_DELETE_TIMES = 0x020
    NO_VALUE_WITH_UNDERLYING_DATATYPE = 0x040
    PITR_REMOVED = 0x080
    INCLUDE_DELETED_USER_XATTRS = 0x100
    SKIP_DELETES_IN_INITIAL_BACKFILL = 0x200


class StreamFlag(IntFlag):
    TAKEOVER = 0x001
    DISK_ONLY = 0x002
    TO_LATEST = 0x004
    NO_VALUE_REMOVED = 0x008
    ACTIVE_VB_ONLY = 0x010
    STRICT_VBUUID = 0x020
    FROM_LATEST = 0x040
    IGNORE_PURGED_TOMBSTONES = 0x080
    CACHE_TRANSFER = 0x100


class SnapshotFlag(IntFlag):
    MEMORY = 0x01
    DISK = 0x02
    CHECKPOINT = 0x04
    ACK = 0x08
    HISTORY = 0x10
    MAY_CONTAIN_DUPLICATES = 0x20


class MarkerVersion(IntEnum):
    """Snapshot-marker encodings. V1 has 20-byte extras; V2.x has a version byte and a value."""

    V1 = -1
    V2_0 = 0x00
    V2_2 = 0x02


class StreamEndReason(IntEnum):
    OK = 0
    CLOSED = 1
    STATE_CHANGED = 2
    DISCONNECTED = 3
    SLOW = 4
    BACKFILL_FAIL = 5
    ROLLBACK = 6
    FILTER_EMPTY = 7
    LOST_PRIVILEGES = 8


class VBucketState(IntEnum):
    ACTIVE = 1
    REPLICA = 2
    PENDING = 3
    DEAD = 4


class DurabilityLevel(IntEnum):
    NONE = 0
    MAJORITY = 1
    MAJORITY_AND_PERSIST_ON_MASTER = 2
    PERSIST_TO_MAJORITY = 3


class OsoFlag(IntFlag):
    START = 0x01
    END = 0x02


def spell_flags(flags: int, enum: type[IntFlag]) -> str:
    """Flags as the reference spells them, e.g. SnapshotFlag 0x05 -> "Memory|Checkpoint".

    Unknown bits are kept as hex so nothing is hidden from the reader.
    """
    names, rest = [], flags
    for member in enum:
        if member.value and flags & member.value == member.value:
            names.append("".join(w.capitalize() for w in member.name.split("_")))
            rest &= ~member.value
    if rest:
        names.append(f"0x{rest:x}")
    return "|".join(names) if names else "0"


# Plain ints: `~` of an IntFlag only complements within the enum's own bits, so a mask built from
# flags would never show an undefined bit.
OPEN_FLAGS_REJECTED = int(OpenFlag.INVALID_NOTIFIER | OpenFlag.UNUSED | OpenFlag.PITR_REMOVED)
OPEN_FLAGS_KNOWN = int(sum(OpenFlag)) & ~OPEN_FLAGS_REJECTED
STREAM_FLAGS_KNOWN = int(sum(StreamFlag)) & ~int(StreamFlag.NO_VALUE_REMOVED)
