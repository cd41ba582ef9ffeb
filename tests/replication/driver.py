"""A blocking test peer that plays ns_server *and* the producer on one socket to a consumer
connection (rebalance.md, "Initial Stream Handshake"): it opens the consumer, sends ADD_STREAM,
reads the consumer's own requests (DCP_CONTROL, STREAM_REQ, BUFFER_ACK) and replies, and streams
producer messages into it. Everything is encoded and decoded with dcpflow.protocol.dcp."""

import time

from dcpflow.protocol import dcp
from dcpflow.protocol.frame import Frame
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from tests.server.client import REPLY_TIMEOUT, Closed, RawClient

MAX = 0xFFFFFFFFFFFFFFFF


class ConsumerPeer(RawClient):
    def __init__(self, port: int, **kw):
        super().__init__(port, **kw)
        self.inbox: list[Frame] = []  # frames read while waiting for something else
        self.controls: dict[str, str] = {}
        self.acked = 0  # sum of the consumer's BUFFER_ACKs
        self.answer_controls = True
        self.control_status: dict[str, int] = {}

    def open_consumer(self, name: str = "replication:test", user: str = "Administrator", password: str = "password",
                      features=(Feature.XERROR,)) -> "ConsumerPeer":
        self.login(user, password, "default", features=features)
        opaque = self.next_opaque()
        self.send(dcp.DcpOpen(name.encode(), 0, opaque=opaque).encode())
        reply = self.wait(lambda f: f.is_response and f.opaque == opaque)
        assert reply.status == Status.SUCCESS, reply
        return self

    # -- reading ---------------------------------------------------------------------------------
    def _read(self, timeout: float) -> Frame:
        self.sock.settimeout(timeout)
        try:
            while True:
                frame = self.decoder.next_frame()
                if frame is not None:
                    return frame
                data = self.sock.recv(1 << 20)
                if not data:
                    raise Closed("the consumer closed the connection")
                self.decoder.feed(data)
        finally:
            self.sock.settimeout(REPLY_TIMEOUT)

    def _auto(self, frame: Frame) -> bool:
        """Handle the consumer's housekeeping requests; True if consumed."""
        if frame.is_response:
            return False
        if frame.opcode == Opcode.DCP_CONTROL and self.answer_controls:
            req = dcp.DcpControl.from_frame(frame)
            key = req.key.decode()
            self.controls[key] = req.value.decode()
            status = self.control_status.get(key, Status.SUCCESS)
            self.send(Frame(0x81, Opcode.DCP_CONTROL, vbucket_or_status=status, opaque=frame.opaque).encode())
            return True
        if frame.opcode == Opcode.DCP_BUFFER_ACKNOWLEDGEMENT:
            self.acked += dcp.DcpBufferAck.from_frame(frame).bytes_acked
            return True
        return False

    def wait(self, pred, timeout: float = 60.0) -> Frame:
        """The first frame matching `pred` (from the inbox or the socket); others are kept."""
        for i, frame in enumerate(self.inbox):
            if pred(frame):
                return self.inbox.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no matching frame; inbox {self.inbox[-5:]}")
            try:
                frame = self._read(remaining)
            except TimeoutError:
                raise TimeoutError(f"no matching frame; inbox {self.inbox[-5:]}") from None
            if self._auto(frame):
                continue
            if pred(frame):
                return frame
            self.inbox.append(frame)

    def settle(self, seconds: float = 0.3) -> list[Frame]:
        """Everything that arrives within `seconds` (housekeeping handled), plus the inbox."""
        out = list(self.inbox)
        self.inbox.clear()
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                frame = self._read(remaining)
            except TimeoutError:
                break
            if not self._auto(frame):
                out.append(frame)
        return out

    # -- the ns_server side ------------------------------------------------------------------------
    def add_stream(self, vbucket: int, flags: int = 0) -> int:
        opaque = self.next_opaque()
        self.send(dcp.DcpAddStream(vbucket, flags, opaque).encode())
        return opaque

    def add_stream_reply(self, opaque: int, timeout: float = 10.0) -> dcp.DcpAddStreamResponse:
        frame = self.wait(lambda f: f.is_response and f.opcode == Opcode.DCP_ADD_STREAM and f.opaque == opaque,
                          timeout)
        return dcp.DcpAddStreamResponse.from_frame(frame)

    # -- the producer side -------------------------------------------------------------------------
    def stream_req(self, vbucket: int | None = None, timeout: float = 10.0) -> dcp.DcpStreamRequest:
        frame = self.wait(lambda f: not f.is_response and f.opcode == Opcode.DCP_STREAM_REQ and
                          (vbucket is None or f.vbucket == vbucket), timeout)
        return dcp.DcpStreamRequest.from_frame(frame)

    def accept(self, req: dcp.DcpStreamRequest, failover_log=((0xABCDEF, 0),)) -> None:
        self.send(dcp.DcpStreamRequestResponse(Status.SUCCESS, tuple(failover_log), opaque=req.opaque).encode())

    def rollback(self, req: dcp.DcpStreamRequest, seqno: int) -> None:
        self.send(dcp.DcpStreamRequestResponse(Status.ROLLBACK, rollback_seqno=seqno, opaque=req.opaque).encode())

    def refuse(self, req: dcp.DcpStreamRequest, status: int) -> None:
        self.send(dcp.DcpStreamRequestResponse(status, opaque=req.opaque).encode())

    def open_stream(self, vbucket: int, flags: int = 0, failover_log=((0xABCDEF, 0),)) -> int:
        """ADD_STREAM, accept the consumer's STREAM_REQ; returns the stream opaque."""
        add = self.add_stream(vbucket, flags)
        req = self.stream_req(vbucket)
        self.accept(req, failover_log)
        reply = self.add_stream_reply(add)
        assert reply.status == Status.SUCCESS and reply.stream_opaque == req.opaque, reply
        return req.opaque

    def push(self, *messages) -> None:
        self.send(b"".join(m.encode() for m in messages))

    def reply_to(self, opcode: int, opaque: int, timeout: float = 10.0) -> Frame:
        return self.wait(lambda f: f.is_response and f.opcode == opcode and f.opaque == opaque, timeout)
