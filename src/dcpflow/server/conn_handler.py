"""ConnHandler: the DCP role of a connection, as the rest of the server sees it.

kv_engine names the DCP half of a connection a ConnHandler (DcpProducer and DcpConsumer derive
from it; https://github.com/couchbase/kv_engine/blob/master/engines/ep/src/connhandler.h). Here
the logic keeps kv_engine's names, dcp.producer.DcpProducer and dcp.consumer.DcpConsumer, without
I/O; DCP_OPEN (dcp_commands.py) sets `Connection.dcp` to the asyncio shell that runs one of them,
producer.ProducerShell or consumer.ConsumerShell; the connection, the server's shutdown, the fault
injector and the management views reach either through this Protocol instead of asking which
attributes it happens to have. The streams of either role answer `StreamHandle`.
"""

from typing import Protocol


class StreamHandle(Protocol):
    """What the server reads of any DCP stream (dcp.active_stream.ActiveStream on a producer,
    dcp.passive_stream.PassiveStream on a consumer)."""

    vbid: int

    @property
    def ended(self) -> bool: ...

    end_reason: int | None  # why it ended (a StreamEndReason); None while it runs


class ConnHandler(Protocol):
    """The DCP role of a connection (see the module docstring)."""

    name: str
    kind: str  # "producer" or "consumer", as its `stats` type says
    bucket: object  # the app.ServerBucket it was opened on

    @property
    def closed(self) -> bool: ...

    @property
    def streams(self) -> dict: ...  # producer: (vbid, sid) -> ActiveStream; consumer: vbid -> PassiveStream

    def stats(self) -> dict: ...

    def items_remaining(self) -> int:
        """Items the role still has to send (a producer's streams up to their end or the high
        seqno; 0 for a consumer)."""

    def privileges_changed(self) -> None:
        """Re-authentication or SELECT_BUCKET changed the connection's privileges."""

    def shutdown(self) -> None:
        """The server is going away: say goodbye on the connection before it closes."""

    def disconnect(self) -> None:
        """The connection is gone: release what the role holds."""
