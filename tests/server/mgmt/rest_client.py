"""A small blocking HTTP client for the management listener tests (the standard library only, so
what is tested is the server's answer byte for byte, not a client library's interpretation)."""

import base64
import http.client
import json
from typing import NamedTuple
from urllib.parse import urlencode


class Reply(NamedTuple):
    status: int
    headers: dict
    body: bytes

    @property
    def json(self):
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode()


class Http:
    def __init__(self, port: int, user: str | None = "Administrator", password: str = "password",
                 host: str = "127.0.0.1", tls_context=None, source: str | None = None):
        self.port, self.host = port, host
        self.source = (source, 0) if source else None  # the local address to connect from
        self.user, self.password = user, password
        self.tls_context = tls_context

    def as_user(self, user: str | None, password: str = "") -> "Http":
        return Http(self.port, user, password, self.host, self.tls_context, self.source[0] if self.source else None)

    def request(self, method: str, path: str, body: bytes | str | dict | None = None,
                headers: dict | None = None) -> Reply:
        hdrs = dict(headers or {})
        if self.user is not None:
            token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
            hdrs.setdefault("Authorization", f"Basic {token}")
        if isinstance(body, dict):
            body = urlencode(body)
            hdrs.setdefault("Content-Type", "application/x-www-form-urlencoded")
        if isinstance(body, str):
            body = body.encode()
        if self.tls_context is not None:
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=30, context=self.tls_context,
                                               source_address=self.source)
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=30, source_address=self.source)
        try:
            conn.request(method, path, body=body, headers=hdrs)
            resp = conn.getresponse()
            return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
        finally:
            conn.close()

    def get(self, path: str, **kw) -> Reply:
        return self.request("GET", path, **kw)

    def post(self, path: str, body=None, **kw) -> Reply:
        return self.request("POST", path, body, **kw)

    def delete(self, path: str, **kw) -> Reply:
        return self.request("DELETE", path, **kw)


def http_of(server_thread, **kw) -> Http:
    """An Http client for a ServerThread's management port."""
    return Http(server_thread.server.mgmt.port, **kw)
