"""Listening sockets whose connections the server accepts itself, within its limits.

Why not `loop.create_server`: when the process runs out of file descriptors, asyncio's accept loop
(CPython 3.11) logs a traceback for every failed accept - up to its backlog's worth per readiness
event - and schedules a retry for each, which keep firing (and failing on the closed socket) after
the listener is gone. A client that opens connections faster than they close then fills the log
instead of being told no. Here a listener accepts up to ACCEPTS_PER_PASS connections per readiness
event and hands each to `on_accept(sock, tls)`, which admits or refuses it (the connection limit
lives with the server, app.py), and returns False to end the pass early (the server is at its
limit with connections still being made: the rest wait in the backlog for the next pass).
When accept() fails for lack of descriptors (EMFILE, ENFILE) or kernel memory, the listener
stops reading its socket for EXHAUSTED_PAUSE seconds and tells `on_exhausted(error)` once per
failure, which the server logs at a bounded rate: the connections
waiting meanwhile stay in the kernel's backlog, which is sized for bursts (LISTEN_BACKLOG, as
memcached's is), and are accepted once descriptors are free again.
"""

import asyncio
import errno
import socket
import ssl
from collections.abc import Callable

#: The kernel queue of connections not yet accepted (Linux caps it at net.core.somaxconn).
LISTEN_BACKLOG = 1024
#: Connections accepted per readiness event before the loop runs something else.
ACCEPTS_PER_PASS = 64
#: Seconds a listener stops accepting after the process ran out of descriptors.
EXHAUSTED_PAUSE = 0.25

_OUT_OF_RESOURCES = frozenset((errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM))
#: accept() errors about one connection that died before it was accepted: skip it.
_GONE = frozenset((errno.ECONNABORTED, errno.EPROTO, errno.EPERM, errno.ENETDOWN, errno.ENOPROTOOPT,
                   errno.EHOSTDOWN, errno.ENONET, errno.EHOSTUNREACH, errno.EOPNOTSUPP, errno.ENETUNREACH))


def listening_sockets(host: str, port: int, backlog: int = LISTEN_BACKLOG) -> list[socket.socket]:
    """Bound, listening, non-blocking sockets for every address of `host` (as create_server binds
    them: SO_REUSEADDR, IPv6 sockets v6-only); with port 0 the later ones take the first one's port."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    socks: list[socket.socket] = []
    seen = set()
    try:
        for family, kind, proto, _, address in infos:
            if (family, address) in seen:
                continue
            seen.add((family, address))
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(socks) > 1:
                address = (address[0], socks[0].getsockname()[1], *address[2:])
            sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks


class Listener:
    """One or more listening sockets of one port (see the module docstring)."""

    def __init__(self, socks: list[socket.socket], tls: ssl.SSLContext | None,
                 on_accept: Callable[[socket.socket, ssl.SSLContext | None], bool | None],
                 on_exhausted: Callable[[OSError], None]):
        self.socks = socks
        self.tls = tls
        self._on_accept = on_accept
        self._on_exhausted = on_exhausted
        self._loop: asyncio.AbstractEventLoop | None = None
        self._retry: dict[int, asyncio.TimerHandle] = {}
        self.closed = False

    @property
    def port(self) -> int:
        return self.socks[0].getsockname()[1]

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        for sock in self.socks:
            self._watch(sock)

    def _watch(self, sock: socket.socket) -> None:
        self._retry.pop(sock.fileno(), None)
        if not self.closed:
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    def _accept(self, sock: socket.socket) -> None:
        for _ in range(ACCEPTS_PER_PASS):
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in _GONE:
                    continue
                if e.errno in _OUT_OF_RESOURCES:
                    self._loop.remove_reader(sock.fileno())
                    self._retry[sock.fileno()] = self._loop.call_later(EXHAUSTED_PAUSE, self._watch, sock)
                    self._on_exhausted(e)
                    return
                raise
            conn.setblocking(False)
            if self._on_accept(conn, self.tls) is False:
                return

    def close(self) -> None:
        """Stop accepting and close the sockets (connections already accepted are the server's)."""
        if self.closed:
            return
        self.closed = True
        for handle in self._retry.values():
            handle.cancel()
        self._retry.clear()
        for sock in self.socks:
            if self._loop is not None and sock.fileno() >= 0:
                self._loop.remove_reader(sock.fileno())
            sock.close()
