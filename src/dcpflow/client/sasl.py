"""The client side of SASL as Couchbase uses it: SCRAM-SHA512/256/1 (RFC 5802) and PLAIN.

Sans-I/O: `ScramClient.first()` gives the SASL_AUTH payload, `final(server_first)` the SASL_STEP
payload, and `verify(server_final)` checks the server's signature (a server that cannot produce it
does not know the password: we refuse to talk to it).
Pages: https://github.com/couchbase/kv_engine/blob/master/docs/sasl.md and cbsasl/CBSASL.md.
The official clients start with SCRAM-SHA512 over plain TCP.
"""

import base64
import hashlib
import hmac
import os

from .errors import AuthenticationError

HASHES = {"SCRAM-SHA512": "sha512", "SCRAM-SHA256": "sha256", "SCRAM-SHA1": "sha1"}


def _saslname(user: str) -> str:
    """RFC 5802 escaping of ',' and '=' in the user name."""
    return user.replace("=", "=3D").replace(",", "=2C")


def plain_payload(user: str, password: str) -> bytes:
    return b"\x00" + user.encode() + b"\x00" + password.encode()


class ScramClient:
    """One SCRAM exchange."""

    def __init__(self, mechanism: str, user: str, password: str, nonce: str | None = None):
        if mechanism not in HASHES:
            raise ValueError(f"{mechanism!r} is not a SCRAM mechanism ({', '.join(HASHES)})")
        self.mechanism = mechanism
        self.algorithm = HASHES[mechanism]
        self.user = user
        self.password = password
        self.nonce = nonce if nonce is not None else base64.b64encode(os.urandom(18)).decode()
        self._first_bare = f"n={_saslname(user)},r={self.nonce}"
        self._server_signature: bytes | None = None

    def first(self) -> bytes:
        return ("n,," + self._first_bare).encode()

    def final(self, server_first: bytes) -> bytes:
        text = server_first.decode("utf-8", "replace")
        attrs = {}
        for part in text.split(","):
            name, sep, value = part.partition("=")
            if sep:
                attrs[name] = value
        try:
            nonce, salt, iterations = attrs["r"], base64.b64decode(attrs["s"]), int(attrs["i"])
        except (KeyError, ValueError) as e:
            raise AuthenticationError(f"{self.mechanism}: malformed server-first message {text!r} ({e})") from None
        if not nonce.startswith(self.nonce) or len(nonce) == len(self.nonce):
            raise AuthenticationError(f"{self.mechanism}: the server's nonce does not extend ours; refusing to "
                                      f"continue")
        if not 1 <= iterations <= 10_000_000:
            raise AuthenticationError(f"{self.mechanism}: server asks for {iterations} iterations; refusing")
        salted = hashlib.pbkdf2_hmac(self.algorithm, self.password.encode(), salt, iterations)
        client_key = hmac.digest(salted, b"Client Key", self.algorithm)
        stored_key = hashlib.new(self.algorithm, client_key).digest()
        without_proof = f"c=biws,r={nonce}"
        auth_message = f"{self._first_bare},{text},{without_proof}".encode()
        signature = hmac.digest(stored_key, auth_message, self.algorithm)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        server_key = hmac.digest(salted, b"Server Key", self.algorithm)
        self._server_signature = hmac.digest(server_key, auth_message, self.algorithm)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> None:
        """Check `v=<signature>`; raise AuthenticationError if the server cannot prove itself."""
        if self._server_signature is None:
            raise AuthenticationError(f"{self.mechanism}: verify() before final()")
        text = server_final.decode("utf-8", "replace")
        if text.startswith("e="):
            raise AuthenticationError(f"{self.mechanism}: server reports {text[2:]!r}")
        attrs = dict(part.split("=", 1) for part in text.split(",") if "=" in part)
        try:
            got = base64.b64decode(attrs.get("v", ""), validate=True)
        except ValueError:
            got = b""
        if not hmac.compare_digest(got, self._server_signature):
            raise AuthenticationError(f"{self.mechanism}: the server's signature does not verify: it does not know "
                                      f"the password (or the exchange was tampered with)")
