"""A blocking DCP test client built on dcpflow.protocol: it sends exactly what a test asks for and
returns typed messages (protocol.dcp) as they arrive, counting the wire bytes of everything the
producer sent so tests can check flow control. Noops are answered automatically unless a test
turns that off."""

import time

from dcpflow.protocol import dcp
from dcpflow.protocol.dcp import OpenFlag
from dcpflow.protocol.frame import Frame, request
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from tests.server.client import REPLY_TIMEOUT, Closed, RawClient

STREAM_MESSAGES = (dcp.DcpSnapshotMarker, dcp.DcpMutation, dcp.DcpDeletion, dcp.DcpExpiration, dcp.DcpStreamEnd,
                   dcp.DcpSeqnoAdvanced, dcp.DcpSetVbucketState)


class DcpClient(RawClient):
    def __init__(self, port: int, **kw):
        super().__init__(port, **kw)
        self.answer_noops = True
        self.noops = 0
        self.received_bytes = 0  # wire bytes of every request the producer sent (noops excluded)
        self.backlog: list = []  # messages read while waiting for something else
        self.closed_by_server = False

    # -- session -------------------------------------------------------------------------------
    def connect(self, user="dcp", password="dcppw", bucket="default", name="test", flags=OpenFlag.PRODUCER,
                features=(Feature.XERROR,), value=b"") -> "DcpClient":
        self.login(user, password, bucket, features=features)
        reply = self.open(name, flags, value)
        assert reply.status == Status.SUCCESS, reply
        return self

    def open(self, name="test", flags=OpenFlag.PRODUCER, value=b"") -> Frame:
        return self.call_dcp(dcp.DcpOpen(name.encode(), flags, value))

    def call_dcp(self, msg) -> Frame:
        """Send a request message and return its reply, keeping stream traffic in the backlog."""
        opaque = self.next_opaque()
        self.send(msg._replace(opaque=opaque).encode())
        while True:
            frame = self.recv_frame()
            if frame.is_response and frame.opaque == opaque:
                return frame
            self.backlog.append(self._decode(frame))

    def control(self, key: str, value: str) -> int:
        return self.call_dcp(dcp.DcpControl(key.encode(), value.encode())).status

    def controls(self, **kv) -> None:
        for k, v in kv.items():
            assert self.control(k, str(v)) == Status.SUCCESS, k

    def stream_request(self, vbucket=0, start=0, end=0xFFFFFFFFFFFFFFFF, uuid=0, snap_start=None, snap_end=None,
                       flags=0, value=b"", opaque=None) -> dcp.DcpStreamRequestResponse:
        snap_start = start if snap_start is None else snap_start
        snap_end = start if snap_end is None else snap_end
        opaque = opaque if opaque is not None else self.next_opaque()
        req = dcp.DcpStreamRequest(vbucket, start, end, uuid, snap_start, snap_end, flags, value, opaque)
        self.send(req.encode())
        while True:
            frame = self.recv_frame()
            if frame.is_response and frame.opaque == opaque and frame.opcode == Opcode.DCP_STREAM_REQ:
                return dcp.DcpStreamRequestResponse.from_frame(frame)
            self.backlog.append(self._decode(frame))

    def buffer_ack(self, nbytes: int) -> None:
        self.send(dcp.DcpBufferAck(nbytes).encode())

    def close_stream(self, vbucket: int, stream_id: int | None = None) -> int:
        return self.call_dcp(dcp.DcpCloseStream(vbucket, stream_id=stream_id)).status

    # -- receiving -----------------------------------------------------------------------------
    def recv_frame(self, deadline: float | None = None) -> Frame:
        while True:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError("no message before the deadline")
            frame = self.decoder.next_frame()
            if frame is not None:
                if not frame.is_response:
                    if frame.opcode == Opcode.DCP_NOOP:
                        self.noops += 1
                        if self.answer_noops:
                            self.send(dcp.DcpNoop(frame.opaque).response())
                        continue
                    self.received_bytes += 24 + len(frame.framing) + len(frame.extras) + len(frame.key) + \
                        len(frame.value)
                return frame
            data = self.sock.recv(1 << 20)
            if not data:
                raise Closed("server closed the connection")
            self.decoder.feed(data)

    @staticmethod
    def _decode(frame: Frame):
        return dcp.decode_dcp(frame)

    def next_message(self, timeout: float = REPLY_TIMEOUT):
        if self.backlog:
            return self.backlog.pop(0)
        self.sock.settimeout(timeout)
        try:
            return self._decode(self.recv_frame(time.monotonic() + timeout))
        finally:
            self.sock.settimeout(REPLY_TIMEOUT)

    def messages_until(self, stop, timeout: float = REPLY_TIMEOUT, ack: bool = False) -> list:
        """Read messages until `stop(msg)` is true for one (included); with ack, BUFFER_ACK each."""
        out = []
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"stop condition not met; got {len(out)} messages, last {out[-3:]}")
            before = self.received_bytes
            try:
                msg = self.next_message(remaining)
            except TimeoutError:
                raise TimeoutError(f"stop condition not met; got {len(out)} messages, last {out[-3:]}") from None
            out.append(msg)
            if ack and self.received_bytes > before:
                self.buffer_ack(self.received_bytes - before)
            if stop(msg):
                return out

    def until_stream_end(self, vbucket: int | None = None, **kw) -> list:
        return self.messages_until(lambda m: isinstance(m, dcp.DcpStreamEnd) and
                                   (vbucket is None or m.vbucket == vbucket), **kw)

    def quiet(self, seconds: float) -> list:
        """Everything that arrives within `seconds` (noops answered, not returned)."""
        out = list(self.backlog)
        self.backlog.clear()
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            self.sock.settimeout(remaining)
            try:
                out.append(self._decode(self.recv_frame(deadline)))
            except TimeoutError:
                break
            except Closed:
                self.closed_by_server = True
                break
        self.sock.settimeout(REPLY_TIMEOUT)
        return out


def raw_request(opcode: int, **kw) -> bytes:
    return request(opcode, **kw)


def items(messages) -> list:
    return [m for m in messages if isinstance(m, (dcp.DcpMutation, dcp.DcpDeletion, dcp.DcpExpiration))]


def markers(messages) -> list:
    return [m for m in messages if isinstance(m, dcp.DcpSnapshotMarker)]
