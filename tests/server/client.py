"""A small blocking test client built on dcpflow.protocol: raw frames in, Frames out, plus the
session steps (HELLO, SCRAM/PLAIN, SELECT_BUCKET) every test needs. Kept dumb on purpose: it
sends exactly the bytes a test asks for, so tests can also send malformed ones."""

import base64
import hashlib
import hmac
import os
import socket
import ssl
import time

from dcpflow.protocol import kv
from dcpflow.protocol.frame import Frame, FrameDecoder, request
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.keys import make_key
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

SDK_FEATURES = (Feature.TCP_NODELAY, Feature.XATTR, Feature.XERROR, Feature.SELECT_BUCKET, Feature.JSON,
                Feature.DUPLEX, Feature.ALT_REQUEST_SUPPORT, Feature.TRACING, Feature.SYNC_REPLICATION,
                Feature.VATTR, Feature.COLLECTIONS, Feature.SUBDOC_CREATE_AS_DELETED, Feature.PRESERVE_TTL,
                Feature.SUBDOC_REPLICA_READ, Feature.SUBDOC_BINARY_XATTR, Feature.UNORDERED_EXECUTION,
                Feature.CLUSTERMAP_CHANGE_NOTIFICATION, Feature.DEDUPE_NOT_MY_VBUCKET_CLUSTERMAP, Feature.SNAPPY,
                Feature.MUTATION_SEQNO)
"""What the official Python SDK 4.6.3 asks for in its HELLO, in its order (seen on the wire)."""

_HASHES = {"SCRAM-SHA512": "sha512", "SCRAM-SHA256": "sha256", "SCRAM-SHA1": "sha1"}


#: seconds a reply may take: a bound on a failure (a server sharing two busy cores with the suite
#: can stall for seconds), not an expectation; a test that waits for silence says how long itself
REPLY_TIMEOUT = 60.0


class Closed(Exception):
    """The server closed the connection."""


class RawClient:
    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = REPLY_TIMEOUT, tls: bool = False,
                 source: str | None = None):
        # `source`: connect from this local address (127.0.0.2 is another client host on Linux's loopback)
        self.sock = socket.create_connection((host, port), timeout=timeout,
                                             source_address=(source, 0) if source else None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls:  # the test certificate is self-signed: encryption without verification
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            self.sock = ctx.wrap_socket(self.sock, server_hostname=host)
        self.decoder = FrameDecoder()
        self._opaque = 0x1000
        self.collections = False

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "RawClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def next_opaque(self) -> int:
        self._opaque += 1
        return self._opaque

    # -- raw I/O -----------------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self) -> Frame:
        while True:
            frame = self.decoder.next_frame()
            if frame is not None:
                return frame
            data = self.sock.recv(65536)
            if not data:
                raise Closed("server closed the connection")
            self.decoder.feed(data)

    def recv_n(self, n: int) -> list[Frame]:
        return [self.recv() for _ in range(n)]

    def is_closed(self, timeout: float = 5.0) -> bool:
        """True once the server has closed the socket (EOF), False if it stays open."""
        deadline = time.monotonic() + timeout
        self.sock.settimeout(0.2)
        try:
            while time.monotonic() < deadline:
                try:
                    data = self.sock.recv(65536)
                except TimeoutError:
                    continue
                except ConnectionResetError:
                    return True
                if not data:
                    return True
                self.decoder.feed(data)
            return False
        finally:
            self.sock.settimeout(REPLY_TIMEOUT)

    def call(self, opcode: int, **kwargs) -> Frame:
        """Send one request and return its reply (checked to carry the same opaque)."""
        opaque = kwargs.pop("opaque", None) or self.next_opaque()
        self.send(request(opcode, opaque=opaque, **kwargs))
        reply = self.recv()
        assert reply.opaque == opaque, f"reply opaque {reply.opaque:#x} != request {opaque:#x}"
        assert reply.opcode == opcode
        return reply

    def key(self, key: bytes) -> bytes:
        return make_key(key) if self.collections else key

    # -- session -----------------------------------------------------------------------------
    def hello(self, *features: int, agent: bytes = b"dcpflow-test") -> tuple[int, ...]:
        reply = self.call(Opcode.HELLO, key=agent, value=b"".join(int(f).to_bytes(2, "big") for f in features))
        assert reply.status == Status.SUCCESS
        granted = kv.HelloResponse.from_frame(reply).features
        self.collections = Feature.COLLECTIONS in granted
        return granted

    def auth_plain(self, user: str, password: str) -> Frame:
        return self.call(Opcode.SASL_AUTH, key=b"PLAIN", value=b"\x00" + user.encode() + b"\x00" + password.encode())

    def auth_scram(self, user: str, password: str, mech: str = "SCRAM-SHA512", nonce: str | None = None) -> Frame:
        """RFC 5802 client side; returns the final reply (its value is `v=...` on success), after
        checking the server signature."""
        algorithm = _HASHES[mech]
        cnonce = nonce if nonce is not None else base64.b64encode(os.urandom(12)).decode()
        first_bare = f"n={user},r={cnonce}"
        reply = self.call(Opcode.SASL_AUTH, key=mech.encode(), value=("n,," + first_bare).encode())
        if reply.status != Status.AUTH_CONTINUE:
            return reply
        server_first = reply.value.decode()
        attrs = dict(part.split("=", 1) for part in server_first.split(","))
        assert attrs["r"].startswith(cnonce)
        salted = hashlib.pbkdf2_hmac(algorithm, password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"]))
        client_key = hmac.digest(salted, b"Client Key", algorithm)
        stored_key = hashlib.new(algorithm, client_key).digest()
        without_proof = f"c=biws,r={attrs['r']}"
        auth_message = f"{first_bare},{server_first},{without_proof}".encode()
        signature = hmac.digest(stored_key, auth_message, algorithm)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        final = f"{without_proof},p={base64.b64encode(proof).decode()}"
        reply = self.call(Opcode.SASL_STEP, key=mech.encode(), value=final.encode())
        if reply.status == Status.SUCCESS:
            server_key = hmac.digest(salted, b"Server Key", algorithm)
            expected = b"v=" + base64.b64encode(hmac.digest(server_key, auth_message, algorithm))
            assert reply.value == expected, "server signature does not verify"
        return reply

    def select(self, bucket: str) -> Frame:
        return self.call(Opcode.SELECT_BUCKET, key=bucket.encode())

    def login(self, user: str = "Administrator", password: str = "password", bucket: str | None = "default",
              features=(Feature.XERROR, Feature.JSON, Feature.MUTATION_SEQNO)) -> "RawClient":
        self.hello(*features)
        assert self.auth_scram(user, password).status == Status.SUCCESS
        if bucket is not None:
            assert self.select(bucket).status == Status.SUCCESS
        return self

    # -- KV ----------------------------------------------------------------------------------
    def set(self, key: bytes, value: bytes, *, vbucket: int | None = None, opcode: int = Opcode.SET, cas: int = 0,
            flags: int = 0, expiry: int = 0, datatype: int = 0, framing: bytes = b"") -> Frame:
        vb = vbucket if vbucket is not None else self.vbucket_of(key)
        return self.call(opcode, key=self.key(key), extras=flags.to_bytes(4, "big") + expiry.to_bytes(4, "big"),
                         value=value, vbucket=vb, cas=cas, datatype=datatype, framing=framing)

    def get(self, key: bytes, *, vbucket: int | None = None, opcode: int = Opcode.GET) -> Frame:
        vb = vbucket if vbucket is not None else self.vbucket_of(key)
        return self.call(opcode, key=self.key(key), vbucket=vb)

    def delete(self, key: bytes, *, cas: int = 0, vbucket: int | None = None) -> Frame:
        vb = vbucket if vbucket is not None else self.vbucket_of(key)
        return self.call(Opcode.DELETE, key=self.key(key), vbucket=vb, cas=cas)

    num_vbuckets = 64

    def vbucket_of(self, key: bytes) -> int:
        from dcpflow.protocol.keys import vbucket_for_key
        return vbucket_for_key(key, self.num_vbuckets)

    def stats(self, group: str = "") -> dict[str, str]:
        opaque = self.next_opaque()
        self.send(request(Opcode.STAT, key=group.encode(), opaque=opaque))
        collector = kv.StatsCollector(opaque)
        while not collector.feed(self.recv()):
            pass
        assert collector.status == Status.SUCCESS, collector.status
        return collector.stats
