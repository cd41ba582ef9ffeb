"""DCP_CONTROL on a producer without a socket (dcp/controls.py): every key, its accepted values,
and the status and reason of every refusal, against a DcpProducer over a real bucket."""

import pytest

from dcpflow.dcp.controls import CONTROLS, PRIORITY_BATCH
from dcpflow.dcp.errors import Refusal
from dcpflow.dcp.noop import DEFAULT_NOOP_INTERVAL
from dcpflow.dcp.outcomes import ARM_NOOP_TIMER, NOTHING, WAKE
from dcpflow.dcp.producer import DcpProducer, Started
from dcpflow.protocol.dcp import DcpStreamRequest, OpenFlag
from dcpflow.protocol.status import Status

OK = NOTHING  # accepted, nothing more to do


@pytest.fixture
def make(engine):
    def make(flags: int = OpenFlag.PRODUCER) -> DcpProducer:
        return DcpProducer("t", flags, engine, now=100.0, created=0.0)
    return make


def control(p: DcpProducer, key: str, value: str, *, now: float = 100.0, collections: bool = False):
    return p.control(key, value, now=now, collections=collections)


def refusal(status: int, reason: str) -> Refusal:
    return Refusal(status, reason)


def test_the_table_has_every_key_of_control_md():
    assert set(CONTROLS) == {
        "enable_noop", "set_noop_interval", "connection_buffer_size", "stream_buffer_size", "set_priority",
        "force_value_compression", "supports_cursor_dropping", "supports_cursor_dropping_vulcan",
        "supports_hifi_MFU", "send_stream_end_on_client_close_stream", "enable_expiry_opcode", "enable_stream_id",
        "enable_sync_writes", "consumer_name", "enable_out_of_order_snapshots", "include_deleted_user_xattrs",
        "v7_dcp_status_codes", "flatbuffers_system_events", "change_streams", "max_marker_version",
        "backfill_order", "cache_transfer"}


def test_an_unknown_key_is_einval(make):
    p = make()
    assert control(p, "enable_time_travel", "true") == refusal(
        Status.EINVAL, "unknown DCP_CONTROL key 'enable_time_travel'")


def test_enable_noop_any_value_and_the_timer(make):
    p = make()
    assert control(p, "enable_noop", "true", now=150.0) == (ARM_NOOP_TIMER,)
    assert p.noop.enabled and p.noop.last_sent == 150.0  # the first noop is due an interval from now
    assert control(p, "enable_noop", "false", now=160.0) == (ARM_NOOP_TIMER,)
    assert not p.noop.enabled and p.noop.last_sent == 160.0
    assert control(p, "enable_noop", "yes") == (ARM_NOOP_TIMER,) and not p.noop.enabled  # only "true" is on


@pytest.mark.parametrize("value, interval", [("0.1", 0.1), ("1", 1.0), ("20.5", 20.5), ("1e3", 1000.0)])
def test_set_noop_interval_accepts_seconds(make, value, interval):
    p = make()
    assert p.noop.interval == DEFAULT_NOOP_INTERVAL
    assert control(p, "set_noop_interval", value) == (ARM_NOOP_TIMER,)
    assert p.noop.interval == interval


@pytest.mark.parametrize("value, reason", [
    ("abc", "set_noop_interval 'abc' is not a number of seconds"),
    ("", "set_noop_interval '' is not a number of seconds"),
    ("0.05", "set_noop_interval must be >= 0.1 s, got '0.05'"),
    ("-1", "set_noop_interval must be >= 0.1 s, got '-1'"),
    ("nan", "set_noop_interval must be >= 0.1 s, got 'nan'"),
    ("inf", "set_noop_interval must be >= 0.1 s, got 'inf'"),
])
def test_set_noop_interval_refusals(make, value, reason):
    p = make()
    assert control(p, "set_noop_interval", value) == refusal(Status.EINVAL, reason)
    assert p.noop.interval == DEFAULT_NOOP_INTERVAL  # unchanged


@pytest.mark.parametrize("value", ["0", "1", "4096", str(0xFFFFFFFF)])
def test_connection_buffer_size_accepts_u32(make, value):
    p = make()
    assert control(p, "connection_buffer_size", value) == (WAKE,)
    assert p.window.buffer_size == int(value)


@pytest.mark.parametrize("value", ["-1", "1.5", "", "ten", str(0x100000000), " 5"])
def test_connection_buffer_size_refusals(make, value):
    p = make()
    control(p, "connection_buffer_size", "100")
    assert control(p, "connection_buffer_size", value) == refusal(
        Status.EINVAL, f"connection_buffer_size {value!r} is not an unsigned 32-bit number")
    assert p.window.buffer_size == 100


def test_stream_buffer_size_is_not_supported(make):
    assert control(make(), "stream_buffer_size", "1024") == refusal(
        Status.NOT_SUPPORTED, "per-stream flow control does not exist; use connection_buffer_size")


@pytest.mark.parametrize("value", ["high", "medium", "low"])
def test_set_priority_sets_the_batch(make, value):
    p = make()
    assert control(p, "set_priority", value) == OK
    assert (p.settings.priority, p.settings.batch) == (value, PRIORITY_BATCH[value])


def test_set_priority_refusal(make):
    p = make()
    assert control(p, "set_priority", "urgent") == refusal(
        Status.EINVAL, "set_priority must be high, medium or low, got 'urgent'")
    assert p.settings.priority == "medium"


def test_force_value_compression_needs_snappy(make):
    assert control(make(), "force_value_compression", "true") == refusal(
        Status.EINVAL, "force_value_compression needs HELLO Snappy on this connection")


@pytest.mark.parametrize("key, field", [
    ("supports_cursor_dropping", "cursor_dropping"), ("supports_cursor_dropping_vulcan", "cursor_dropping"),
    ("supports_hifi_MFU", "hifi_mfu"), ("enable_expiry_opcode", "expiry_opcode")])
def test_boolean_keys(make, key, field):
    p = make()
    assert control(p, key, "true") == OK and getattr(p.settings, field) is True
    assert control(p, key, "false") == OK and getattr(p.settings, field) is False
    assert control(p, key, "1") == OK and getattr(p.settings, field) is False


@pytest.mark.parametrize("key, field", [
    ("enable_stream_id", "stream_ids"), ("enable_sync_writes", "sync_writes"),
    ("v7_dcp_status_codes", "v7_status"), ("flatbuffers_system_events", "flatbuffers_events")])
def test_true_only_keys(make, key, field):
    p = make()
    for value in ("false", "TRUE", ""):
        assert control(p, key, value) == refusal(Status.EINVAL, f"{key} only accepts 'true'")
        assert getattr(p.settings, field) is False
    assert control(p, key, "true") == OK and getattr(p.settings, field) is True


def test_stream_ids_and_sync_writes_exclude_each_other(make):
    p = make()
    assert control(p, "enable_stream_id", "true") == OK
    assert control(p, "enable_sync_writes", "true") == refusal(
        Status.NOT_SUPPORTED, "sync writes and stream-ids are mutually exclusive")
    q = make()
    assert control(q, "enable_sync_writes", "true") == OK
    assert control(q, "enable_stream_id", "true") == refusal(
        Status.NOT_SUPPORTED, "stream-ids and sync writes are mutually exclusive")
    assert not q.settings.stream_ids


def test_enable_stream_id_only_before_the_first_stream(make):
    p = make()
    assert isinstance(p.stream_request(DcpStreamRequest(0, 0, 10, 0, 0, 0, 0), collections=False), Started)
    assert control(p, "enable_stream_id", "true") == refusal(
        Status.EINVAL, "enable_stream_id must be sent before the first stream-request")
    assert not p.settings.stream_ids


def test_send_stream_end_on_close_reaches_streams_already_running(make):
    p = make()
    started = p.stream_request(DcpStreamRequest(1, 0, 10, 0, 0, 0, 0), collections=False)
    assert not started.stream.opts.send_stream_end_on_close
    assert control(p, "send_stream_end_on_client_close_stream", "false") == OK
    assert not p.settings.send_stream_end_on_close and not started.stream.opts.send_stream_end_on_close
    assert control(p, "send_stream_end_on_client_close_stream", "true") == OK
    assert p.settings.send_stream_end_on_close and started.stream.opts.send_stream_end_on_close
    assert control(p, "send_stream_end_on_client_close_stream", "false") == OK  # "false" changes nothing
    assert p.settings.send_stream_end_on_close


def test_consumer_name(make):
    p = make()
    assert control(p, "consumer_name", "") == refusal(Status.EINVAL, "consumer_name must not be empty")
    assert control(p, "consumer_name", "replica-1") == OK and p.settings.consumer_name == "replica-1"
    assert not p.settings.sync_replication  # sync writes need both
    assert control(p, "enable_sync_writes", "true") == OK and p.settings.sync_replication


@pytest.mark.parametrize("value", ["true", "true_with_seqno_advanced"])
def test_out_of_order_snapshots_accepted(make, value):
    p = make()
    assert control(p, "enable_out_of_order_snapshots", value) == OK and p.settings.oso == value


def test_out_of_order_snapshots_refusal(make):
    assert control(make(), "enable_out_of_order_snapshots", "false") == refusal(
        Status.EINVAL, "enable_out_of_order_snapshots takes 'true' or 'true_with_seqno_advanced'")


def test_include_deleted_user_xattrs_needs_the_open_flag(make):
    reason = "include_deleted_user_xattrs needs DCP_OPEN flag IncludeDeletedUserXattrs"
    assert control(make(), "include_deleted_user_xattrs", "true") == refusal(Status.EINVAL, reason)
    p = make(OpenFlag.PRODUCER | OpenFlag.INCLUDE_DELETED_USER_XATTRS)
    assert control(p, "include_deleted_user_xattrs", "false") == refusal(Status.EINVAL, reason)
    assert control(p, "include_deleted_user_xattrs", "true") == OK and p.settings.include_deleted_user_xattrs


def test_change_streams_needs_collections(make):
    assert control(make(), "change_streams", "false") == refusal(Status.EINVAL, "change_streams only accepts 'true'")
    assert control(make(), "change_streams", "true") == refusal(
        Status.NOT_SUPPORTED, "change_streams needs HELLO Collections (history is per collection)")
    p = make()
    assert control(p, "change_streams", "true", collections=True) == OK and p.settings.change_streams
    assert not isinstance(control(p, "enable_noop", "true", collections=True), Refusal)  # needed with collections
    opts = p.stream_request(DcpStreamRequest(2, 0, 10, 0, 0, 0, 0), collections=True).stream.opts
    assert opts.change_streams


def test_max_marker_version_needs_collections(make):
    p = make()
    assert control(p, "max_marker_version", "2.0") == refusal(Status.EINVAL, "max_marker_version only accepts '2.2'")
    assert control(p, "max_marker_version", "2.2") == refusal(
        Status.NOT_SUPPORTED, "max_marker_version=2.2 needs HELLO Collections")
    assert not p.settings.marker_v22
    assert control(p, "max_marker_version", "2.2", collections=True) == OK and p.settings.marker_v22


def test_backfill_order(make):
    p = make()
    assert p.settings.backfill_order == "round-robin"
    assert control(p, "backfill_order", "sequential") == OK and p.settings.backfill_order == "sequential"
    assert control(p, "backfill_order", "round-robin") == OK and p.settings.backfill_order == "round-robin"
    assert control(p, "backfill_order", "random") == refusal(
        Status.EINVAL, "backfill_order must be round-robin or sequential")


def test_cache_transfer_is_not_supported(make):
    assert control(make(), "cache_transfer", "true") == refusal(
        Status.NOT_SUPPORTED, "cache transfer is not enabled on this server")


def test_stream_shaping_settings_reach_new_streams(make):
    p = make(OpenFlag.PRODUCER | OpenFlag.INCLUDE_DELETE_TIMES)
    for key, value in [("enable_expiry_opcode", "true"), ("supports_cursor_dropping", "true"),
                       ("enable_noop", "true"), ("max_marker_version", "2.2")]:
        assert not isinstance(control(p, key, value, collections=True), Refusal)
    opts = p.stream_request(DcpStreamRequest(2, 0, 10, 0, 0, 0, 0), collections=True).stream.opts
    assert opts.expiry_opcode and opts.delete_times and opts.supports_cursor_dropping and opts.marker_v22
    assert opts.collections
    q = make()  # without IncludeDeleteTimes the expiry opcode has no effect (erratum 13)
    control(q, "enable_expiry_opcode", "true")
    assert not q.stream_request(DcpStreamRequest(3, 0, 10, 0, 0, 0, 0), collections=False).stream.opts.expiry_opcode
