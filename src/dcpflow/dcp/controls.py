"""DCP_CONTROL on a producer connection, as a table: key -> its value's rules -> its effect.

Page: https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/commands/control.md
(the keys, their values and when they may be sent). Each key has one `Control`: `parse` checks the
value on its own and returns what to apply or a Refusal; `apply` checks the value against the
connection (other controls, streams already requested, HELLO features) and changes it, or refuses
without changing anything. `effect` tells the caller what to do after a change: re-arm the noop
timer, or run a send pass (a larger window may unblock streams).

Keys this server accepts but that change nothing here are kept, so a client can tell "accepted"
from "unknown": `supports_hifi_MFU`, `enable_out_of_order_snapshots` (every backfill is in seqno
order, which an OSO-capable client must accept). `flatbuffers_system_events` makes system events
FlatBuffers; `change_streams` (with HELLO Collections) gives streams requested afterwards the
history of collections that keep it. Keys that would need what this server lacks are refused with
NOT_SUPPORTED and a reason: per-stream buffers, cache transfer. `force_value_compression` needs
HELLO Snappy on the connection (EINVAL without, as kv_engine answers); with it, streams requested
afterwards send values Snappy-compressed.
"""

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple, Protocol

from dcpflow.protocol.dcp import OpenFlag
from dcpflow.protocol.status import Status

from .active_stream import ActiveStream
from .errors import Refusal
from .flow_control import FlowControlWindow
from .noop import MIN_NOOP_INTERVAL, NoopPolicy

#: set_priority -> messages per send pass. kv_engine's 50/5/1 per pass of a C++ worker, scaled by
#: 100 because one pass here costs a loop callback and a send() call; the ratio is kept.
PRIORITY_BATCH = {"high": 5000, "medium": 500, "low": 100}
_U32_MAX = 0xFFFFFFFF
_O_INCLUDE_DELETED_USER_XATTRS = int(OpenFlag.INCLUDE_DELETED_USER_XATTRS)


@dataclass(slots=True)
class ProducerSettings:
    """What DCP_CONTROL set on a producer connection, besides the noop (noop.py) and the window
    (flow_control.py). Stream-shaping settings apply to streams requested afterwards."""

    priority: str = "medium"
    batch: int = PRIORITY_BATCH["medium"]  # messages per send pass
    stream_ids: bool = False  # enable_stream_id
    sync_writes: bool = False  # enable_sync_writes
    consumer_name: str = ""
    expiry_opcode: bool = False  # enable_expiry_opcode (effective only with IncludeDeleteTimes)
    send_stream_end_on_close: bool = False  # send_stream_end_on_client_close_stream
    cursor_dropping: bool = False  # supports_cursor_dropping(_vulcan)
    hifi_mfu: bool = False
    v7_status: bool = False  # v7_dcp_status_codes
    oso: str = ""  # enable_out_of_order_snapshots
    flatbuffers_events: bool = False
    change_streams: bool = False  # history: every retained version, History / May Duplicate Keys markers
    marker_v22: bool = False  # max_marker_version=2.2
    backfill_order: str = "round-robin"
    include_deleted_user_xattrs: bool = False
    force_compression: bool = False  # force_value_compression (needs HELLO Snappy)

    @property
    def sync_replication(self) -> bool:
        """Sync writes take a consumer name too (markers of at least V2.0)."""
        return self.sync_writes and bool(self.consumer_name)


class Controlled(Protocol):
    """What DCP_CONTROL may read and change (producer.DcpProducer)."""

    open_flags: int
    settings: ProducerSettings
    noop: NoopPolicy
    window: FlowControlWindow

    @property
    def streams(self) -> dict[tuple[int, int | None], ActiveStream]: ...


class Effect(Enum):
    NONE = "none"
    NOOP_TIMER = "noop-timer"  # the noop settings changed: re-arm the timer
    SEND = "send"  # the window changed: run a send pass


class ControlContext(NamedTuple):
    """What a control may depend on besides the connection's state."""

    now: float  # the caller's monotonic clock
    collections: bool  # HELLO Collections on this connection
    snappy: bool = False  # HELLO Snappy on this connection


Parse = Callable[[str], object]  # -> the value to apply, or a Refusal
Apply = Callable[[Controlled, object, ControlContext], "Refusal | None"]


class Control(NamedTuple):
    parse: Parse
    apply: Apply
    effect: Effect = Effect.NONE


# -- value rules --------------------------------------------------------------------------------

def _is_true(value: str) -> bool:
    """Boolean keys: "true" turns them on; any other value turns them off (kv_engine)."""
    return value == "true"


def _raw(value: str) -> str:
    return value


def _only_true(key: str) -> Parse:
    def parse(value: str):
        return True if value == "true" else Refusal(Status.EINVAL, f"{key} only accepts 'true'")
    return parse


def _refused(status: int, reason: str) -> Parse:
    def parse(value: str):
        return Refusal(status, reason)
    return parse


def _noop_interval(value: str):
    try:
        interval = float(value)
    except ValueError:
        return Refusal(Status.EINVAL, f"set_noop_interval {value!r} is not a number of seconds")
    if not interval >= MIN_NOOP_INTERVAL or interval != interval or interval == float("inf"):
        return Refusal(Status.EINVAL, f"set_noop_interval must be >= {MIN_NOOP_INTERVAL} s, got {value!r}")
    return interval


def _buffer_size(value: str):
    if not value.isdigit() or int(value) > _U32_MAX:
        return Refusal(Status.EINVAL, f"connection_buffer_size {value!r} is not an unsigned 32-bit number")
    return int(value)


def _priority(value: str):
    if value not in PRIORITY_BATCH:
        return Refusal(Status.EINVAL, f"set_priority must be high, medium or low, got {value!r}")
    return value


def _oso(value: str):
    if value not in ("true", "true_with_seqno_advanced"):
        return Refusal(Status.EINVAL, "enable_out_of_order_snapshots takes 'true' or 'true_with_seqno_advanced'")
    return value


def _consumer_name(value: str):
    return value if value else Refusal(Status.EINVAL, "consumer_name must not be empty")


def _marker_version(value: str):
    return value if value == "2.2" else Refusal(Status.EINVAL, "max_marker_version only accepts '2.2'")


def _backfill_order(value: str):
    if value not in ("round-robin", "sequential"):
        return Refusal(Status.EINVAL, "backfill_order must be round-robin or sequential")
    return value


# -- connection rules and changes ---------------------------------------------------------------

def _setting(name: str) -> Apply:
    """Set one ProducerSettings field to the parsed value."""
    def apply(p: Controlled, value, ctx: ControlContext) -> None:
        setattr(p.settings, name, value)
    return apply


def _apply_noop(p: Controlled, on, ctx: ControlContext) -> None:
    p.noop.enable(on, ctx.now)


def _apply_noop_interval(p: Controlled, interval, ctx: ControlContext) -> None:
    p.noop.interval = interval


def _apply_buffer_size(p: Controlled, size, ctx: ControlContext) -> None:
    p.window.buffer_size = size


def _apply_priority(p: Controlled, priority, ctx: ControlContext) -> None:
    p.settings.priority, p.settings.batch = priority, PRIORITY_BATCH[priority]


def _apply_stream_end_on_close(p: Controlled, on, ctx: ControlContext) -> None:
    # the one stream-shaping control that reaches streams already running; "false" changes nothing
    if on:
        p.settings.send_stream_end_on_close = True
        for stream in p.streams.values():
            stream.opts.send_stream_end_on_close = True


def _apply_stream_id(p: Controlled, on, ctx: ControlContext) -> Refusal | None:
    if p.settings.sync_writes:
        return Refusal(Status.NOT_SUPPORTED, "stream-ids and sync writes are mutually exclusive")
    if p.streams and not p.settings.stream_ids:
        return Refusal(Status.EINVAL, "enable_stream_id must be sent before the first stream-request")
    p.settings.stream_ids = True
    return None


def _apply_sync_writes(p: Controlled, on, ctx: ControlContext) -> Refusal | None:
    if p.settings.stream_ids:
        return Refusal(Status.NOT_SUPPORTED, "sync writes and stream-ids are mutually exclusive")
    p.settings.sync_writes = True
    return None


def _apply_deleted_user_xattrs(p: Controlled, value, ctx: ControlContext) -> Refusal | None:
    if value == "true" and p.open_flags & _O_INCLUDE_DELETED_USER_XATTRS:
        p.settings.include_deleted_user_xattrs = True
        return None
    return Refusal(Status.EINVAL, "include_deleted_user_xattrs needs DCP_OPEN flag IncludeDeletedUserXattrs")


def _apply_change_streams(p: Controlled, on, ctx: ControlContext) -> Refusal | None:
    if not ctx.collections:
        return Refusal(Status.NOT_SUPPORTED, "change_streams needs HELLO Collections (history is per collection)")
    p.settings.change_streams = True
    return None


def _apply_marker_version(p: Controlled, value, ctx: ControlContext) -> Refusal | None:
    if not ctx.collections:
        return Refusal(Status.NOT_SUPPORTED, "max_marker_version=2.2 needs HELLO Collections")
    p.settings.marker_v22 = True
    return None


def _apply_compression(p: Controlled, on, ctx: ControlContext) -> Refusal | None:
    if not ctx.snappy:
        return Refusal(Status.EINVAL, "force_value_compression needs HELLO Snappy on this connection")
    p.settings.force_compression = True
    return None


def _nothing(p: Controlled, value, ctx: ControlContext) -> None:
    return None


#: Every key this producer knows (control.md). A key missing here is refused with EINVAL.
CONTROLS: dict[str, Control] = {
    "enable_noop": Control(_is_true, _apply_noop, Effect.NOOP_TIMER),
    "set_noop_interval": Control(_noop_interval, _apply_noop_interval, Effect.NOOP_TIMER),
    "connection_buffer_size": Control(_buffer_size, _apply_buffer_size, Effect.SEND),
    "stream_buffer_size": Control(_refused(Status.NOT_SUPPORTED, "per-stream flow control does not exist; use "
                                                                 "connection_buffer_size"), _nothing),
    "set_priority": Control(_priority, _apply_priority),
    "force_value_compression": Control(_is_true, _apply_compression),
    # Streams requested from now on get droppable cursors; existing ones keep theirs (a stream's
    # options are fixed at its request, like every other stream-shaping control).
    "supports_cursor_dropping": Control(_is_true, _setting("cursor_dropping")),
    "supports_cursor_dropping_vulcan": Control(_is_true, _setting("cursor_dropping")),
    "supports_hifi_MFU": Control(_is_true, _setting("hifi_mfu")),
    "send_stream_end_on_client_close_stream": Control(_is_true, _apply_stream_end_on_close),
    "enable_expiry_opcode": Control(_is_true, _setting("expiry_opcode")),
    "enable_stream_id": Control(_only_true("enable_stream_id"), _apply_stream_id),
    "enable_sync_writes": Control(_only_true("enable_sync_writes"), _apply_sync_writes),
    "consumer_name": Control(_consumer_name, _setting("consumer_name")),
    "enable_out_of_order_snapshots": Control(_oso, _setting("oso")),
    "include_deleted_user_xattrs": Control(_raw, _apply_deleted_user_xattrs),
    "v7_dcp_status_codes": Control(_only_true("v7_dcp_status_codes"), _setting("v7_status")),
    "flatbuffers_system_events": Control(_only_true("flatbuffers_system_events"), _setting("flatbuffers_events")),
    "change_streams": Control(_only_true("change_streams"), _apply_change_streams),
    "max_marker_version": Control(_marker_version, _apply_marker_version),
    "backfill_order": Control(_backfill_order, _setting("backfill_order")),
    "cache_transfer": Control(_refused(Status.NOT_SUPPORTED, "cache transfer is not enabled on this server"),
                              _nothing),
}


def apply_control(p: Controlled, key: str, value: str, ctx: ControlContext) -> Refusal | Effect:
    """One DCP_CONTROL: the Refusal to answer, or the Effect of the change."""
    control = CONTROLS.get(key)
    if control is None:
        return Refusal(Status.EINVAL, f"unknown DCP_CONTROL key {key!r}")
    parsed = control.parse(value)
    if parsed.__class__ is Refusal:
        return parsed
    refused = control.apply(p, parsed, ctx)
    return control.effect if refused is None else refused
