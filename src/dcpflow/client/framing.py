"""One buffered framing protocol: the receive side of every memcached-protocol connection that
dcpflow opens as a client - the DCP client's `Connection` (connection.py) and the cluster manager's
relaying `Link` (dcpflow.replication.link).

The transport reads straight into the connection's receive buffer (an asyncio BufferedProtocol):
a received byte is copied once, by the kernel. A subclass walks the whole frames that arrived
(`frames_received`) and may hand out views of them - the client's Segments, the relay's runs of
frames - because the buffer is never written again below what was received: a frame cut at the
end of a read stays where it is until the rest arrives, and only when the buffer runs out of room
are the unwalked bytes (at most one frame) moved, with the next reads, to a new buffer - sized to
hold a large frame whole, so a 20 MB value is not copied piece by piece. Buffers grow by doubling
from RECV_FIRST up to RECV_BUFFER: a connection that only sees small replies keeps a small one.

The rest is what both need of a connection: TCP_NODELAY (requests are pipelined by hand), dialling
with errors a person can act on (`dial`), `send`, and closing or aborting with the reason kept in
`lost` (as the subclass's error type).
"""

import asyncio
import contextlib
import os
import socket
import ssl

from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import HEADER_LEN

#: Receive buffers: the first is RECV_FIRST bytes, each next one twice the last up to RECV_BUFFER
#: (or what a large frame needs); a read gets at least RECV_MIN_ROOM bytes of room.
RECV_FIRST = 64 * 1024
RECV_BUFFER = 1024 * 1024
RECV_MIN_ROOM = 16 * 1024


class FramedProtocol(asyncio.BufferedProtocol):
    """See the module docstring. Subclasses implement `frames_received` and set `error`, the
    exception type their connection's failures are reported as."""

    error: type[Exception] = ConnectionError

    def __init__(self, label: str):
        self.label = label
        self.transport: asyncio.Transport | None = None
        self.lost: BaseException | None = None
        # Receive buffer (get_buffer): bytes [_rpos, _wpos) arrived and are not walked yet; _need
        # is how many the frame at _rpos needs to be whole (0: none is cut).
        self._rbuf = bytearray()
        self._rview = memoryview(self._rbuf)
        self._rpos = self._wpos = self._need = 0

    # -- asyncio.BufferedProtocol --------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def get_buffer(self, sizehint: int) -> memoryview:
        """Where the transport reads next: the free end of the receive buffer, so the bytes land
        once, where the views handed out point (no bytes object per read, no join with the cut
        frame before it). A new buffer takes over the unwalked bytes (at most a frame) when the
        room left is small or the cut frame does not fit."""
        room = len(self._rbuf) - self._wpos
        if room < RECV_MIN_ROOM or self._need > len(self._rbuf) - self._rpos:
            self._grow()
        return self._rview[self._wpos:]

    def _grow(self) -> None:
        pending = self._wpos - self._rpos
        size = max(min(RECV_BUFFER, 2 * len(self._rbuf)), RECV_FIRST, self._need + RECV_MIN_ROOM)
        buf = bytearray(size)
        buf[:pending] = self._rview[self._rpos:self._wpos]
        self._rbuf, self._rview = buf, memoryview(buf)
        self._rpos, self._wpos = 0, pending

    def buffer_updated(self, nbytes: int) -> None:
        self._wpos += nbytes
        end = self._wpos
        if end - self._rpos < self._need:
            return  # the frame at _rpos is still cut
        pos, need = self.frames_received(self._rbuf, self._rpos, end)
        self._rpos = pos
        self._need = need if need else HEADER_LEN if end - pos else 0

    def frames_received(self, buf: bytearray, pos: int, end: int) -> tuple[int, int]:
        """Walk the whole frames in buf[pos:end]: return where the walk stopped and how many bytes
        the frame there needs to be whole (0 if only its header is cut, or nothing is left).
        buf[:end] is never written again: views of it may be kept."""
        raise NotImplementedError

    def data_received(self, data) -> None:
        """Bytes received some other way (a test, a transport that does not read into buffers):
        copied into the receive buffer, as the transport would have read them."""
        view = memoryview(data)
        while view:
            room = self.get_buffer(len(view))
            n = min(len(room), len(view))
            room[:n] = view[:n]
            self.buffer_updated(n)
            view = view[n:]

    # -- sending and closing ------------------------------------------------------------------
    def send(self, data) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(data)

    def broken(self, error: ProtocolError) -> None:
        """A header that cannot start a frame (frame_head's fatal error): nothing after it can be
        framed, so the connection goes."""
        self.abort(self.error(f"{self.label}: {error.reason}: the byte stream cannot be trusted"))

    def close(self) -> None:
        if self.lost is None:
            self.lost = self.error(f"{self.label}: closed")
        if self.transport is not None:
            self.transport.close()

    def abort(self, exc: BaseException) -> None:
        if self.lost is None:
            self.lost = exc
        if self.transport is not None:
            self.transport.abort()

    @property
    def alive(self) -> bool:
        return self.lost is None and self.transport is not None and not self.transport.is_closing()


def fail_waiter(waiter: asyncio.Future, err: BaseException) -> None:
    """A request's future when its connection is lost: failed with `err`, and marked as seen. The
    loss reaches whoever awaits the reply, and the connection's `lost`/`on_lost` report it; a
    pipelined request nobody awaits any more (the login's next step after a failed HELLO) must not
    log it again when collected."""
    if not waiter.done():
        waiter.set_exception(err)
        waiter.exception()


async def dial(factory, host: str, port: int, *, error: type[Exception], tls: ssl.SSLContext | None = None,
               timeout: float = 10.0):
    """The protocol `factory()` connected to host:port (over TLS with `tls`), or `error` saying why
    not: no answer within `timeout`, refused, an untrusted certificate, a handshake that failed."""
    loop = asyncio.get_running_loop()
    where = f"{host}:{port}"
    try:
        _, proto = await asyncio.wait_for(
            loop.create_connection(factory, host, port, ssl=tls, server_hostname=host if tls else None), timeout)
    except TimeoutError:
        raise error(f"{where}: no connection within {timeout:g}s") from None
    except ssl.SSLCertVerificationError as e:
        raise error(f"{where}: TLS certificate not trusted ({e.verify_message}); pass the cluster's CA with "
                    f"?ca_file=PATH") from None
    except ssl.SSLError as e:
        raise error(f"{where}: TLS handshake failed ({e.reason or e}); is this the TLS port?") from None
    except ConnectionRefusedError:
        raise error(f"{where}: connection refused (is a server listening on that port?)") from None
    except OSError as e:
        reason = e.strerror or (os.strerror(e.errno) if e.errno else str(e))
        raise error(f"{where}: {reason}") from None
    return proto
