"""Connection strings as the Couchbase SDKs write them.

    couchbase://host[:port][,host[:port]...][/bucket][?option=value&...]
    couchbases://...      TLS; the default port becomes 11207

Hosts are seeds: the client bootstraps from the first one that answers and then follows the
cluster map. A port is the KV port (as in the official SDKs: `couchbase://127.0.0.1:PORT` makes
PORT the KV port); without one, 11210 (11207 with TLS). IPv6 literals go in brackets.

Options (unknown ones are an error, so a typo is not silently ignored):

    ca_file=PATH          CA bundle to verify the server certificate (aliases: trust_certificate,
                          certpath). Default: the system trust store.
    tls_verify=peer|none  `none` encrypts without verifying (test certificates only).
    sasl_mech_force=M     SCRAM-SHA512 (default), SCRAM-SHA256, SCRAM-SHA1 or PLAIN (PLAIN only
                          over TLS on a real server).
    buffer_size=BYTES     DCP flow-control window (default 20 MiB; 0 disables flow control).
    noop_interval=SECONDS DCP noop interval asked of the producer (default 20).
    connect_timeout=SECONDS per connection attempt, bootstrap included (default 10).
    reconnect_timeout=SECONDS  how long to keep retrying a lost node (default 120; 0 = forever).
    dead_timeout=SECONDS  a connection that delivers nothing (not even a noop) this long is dead
                          (default 2 x noop_interval + 5).
    mitigate_rollbacks=true  hand out only changes persisted on the active and its replicas
                          (mitigation.py); persistence_poll_interval=SECONDS (default 0.1) and
                          max_held_bytes=BYTES (default: buffer_size) tune it.
"""

import urllib.parse
from dataclasses import dataclass, field

from .errors import ConnectionStringError

DEFAULT_KV_PORT = 11210
DEFAULT_KV_TLS_PORT = 11207
SCHEMES = {"couchbase": False, "couchbases": True}
SASL_MECHANISMS = ("SCRAM-SHA512", "SCRAM-SHA256", "SCRAM-SHA1", "PLAIN")

_ALIASES = {"trust_certificate": "ca_file", "certpath": "ca_file", "cacert": "ca_file"}


def _float(name: str, text: str, minimum: float = 0.0) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConnectionStringError(f"option {name}={text!r} is not a number") from None
    if not value >= minimum:
        raise ConnectionStringError(f"option {name}={text!r} must be >= {minimum}")
    return value


def _int(name: str, text: str, maximum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ConnectionStringError(f"option {name}={text!r} is not a whole number") from None
    if not 0 <= value <= maximum:
        raise ConnectionStringError(f"option {name}={text!r} must be between 0 and {maximum}")
    return value


_OPTIONS = {
    "ca_file": lambda n, v: v,
    "tls_verify": lambda n, v: v if v in ("peer", "none") else _bad_choice(n, v, ("peer", "none")),
    "sasl_mech_force": lambda n, v: v.upper() if v.upper() in SASL_MECHANISMS else _bad_choice(n, v, SASL_MECHANISMS),
    "buffer_size": lambda n, v: _int(n, v, 0xFFFFFFFF),
    "noop_interval": lambda n, v: _float(n, v, 0.1),
    "connect_timeout": lambda n, v: _float(n, v, 0.001),
    "reconnect_timeout": lambda n, v: _float(n, v),
    "dead_timeout": lambda n, v: _float(n, v, 0.1),
    "stream_ids": lambda n, v: _bool(n, v),
    "mitigate_rollbacks": lambda n, v: _bool(n, v),
    "persistence_poll_interval": lambda n, v: _float(n, v, 0.001),
    "max_held_bytes": lambda n, v: _int(n, v, 1 << 40),
}


def _bool(name: str, value: str) -> bool:
    if value.lower() not in ("true", "false"):
        _bad_choice(name, value, ("true", "false"))
    return value.lower() == "true"


def _bad_choice(name: str, value: str, choices) -> None:
    raise ConnectionStringError(f"option {name}={value!r} must be one of {', '.join(choices)}")


@dataclass(frozen=True)
class ConnSpec:
    """A parsed connection string."""

    hosts: tuple[tuple[str, int], ...]
    bucket: str | None = None
    tls: bool = False
    options: dict = field(default_factory=dict)
    explicit_ports: bool = False

    @property
    def scheme(self) -> str:
        return "couchbases" if self.tls else "couchbase"

    def __str__(self) -> str:
        hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.hosts)
        bucket = f"/{self.bucket}" if self.bucket else ""
        query = f"?{urllib.parse.urlencode(self.options)}" if self.options else ""
        return f"{self.scheme}://{hosts}{bucket}{query}"


def _parse_host(part: str, default_port: int, text: str) -> tuple[str, int, bool]:
    if not part:
        raise ConnectionStringError(f"empty host in {text!r} (hosts are separated by single commas)")
    if part.startswith("["):
        close = part.find("]")
        if close < 0:
            raise ConnectionStringError(f"IPv6 host {part!r} is missing its closing ']'")
        host, rest = part[1:close], part[close + 1:]
        if rest and not rest.startswith(":"):
            raise ConnectionStringError(f"unexpected {rest!r} after IPv6 host [{host}]")
        port_text = rest[1:] if rest else None
    elif part.count(":") > 1:
        raise ConnectionStringError(f"host {part!r} looks like an IPv6 address: put it in brackets, e.g. "
                                    f"[{part}]:11210")
    else:
        host, _, port_text = part.partition(":")
        port_text = port_text if ":" in part else None
    if not host:
        raise ConnectionStringError(f"host missing in {part!r}")
    if port_text is None:
        return host, default_port, False
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConnectionStringError(f"port {port_text!r} of host {host!r} is not a number between 1 and 65535")
    return host, int(port_text), True


def parse_connection_string(text: str) -> ConnSpec:
    """Parse `text`; raises ConnectionStringError saying what is wrong and how it should look."""
    if not isinstance(text, str) or not text.strip():
        raise ConnectionStringError("connection string is empty; expected couchbase://host[:port]/bucket")
    text = text.strip()
    scheme, sep, rest = text.partition("://")
    if not sep:
        raise ConnectionStringError(f"{text!r} has no scheme; expected couchbase://{text} or couchbases://{text}")
    scheme = scheme.lower()
    if scheme not in SCHEMES:
        raise ConnectionStringError(f"scheme {scheme!r} is not supported; use couchbase:// (plain) or "
                                    f"couchbases:// (TLS)")
    tls = SCHEMES[scheme]
    rest, _, query = rest.partition("?")
    hostpart, slash, path = rest.partition("/")
    if "@" in hostpart:
        raise ConnectionStringError("credentials do not belong in the connection string; pass username= and "
                                    "password= instead")
    default_port = DEFAULT_KV_TLS_PORT if tls else DEFAULT_KV_PORT
    hosts, explicit = [], False
    for part in hostpart.split(","):
        host, port, given = _parse_host(part.strip(), default_port, text)
        hosts.append((host, port))
        explicit = explicit or given
    bucket = urllib.parse.unquote(path.strip("/")) if slash else None
    if bucket is not None and "/" in bucket:
        raise ConnectionStringError(f"bucket {bucket!r} contains '/'; the path is just the bucket name")
    if bucket == "":
        bucket = None
    options: dict = {}
    if query:
        for name, value in urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=False):
            key = _ALIASES.get(name, name)
            parser = _OPTIONS.get(key)
            if parser is None:
                raise ConnectionStringError(f"unknown option {name!r}; known options: {', '.join(sorted(_OPTIONS))}")
            if value == "":
                raise ConnectionStringError(f"option {name!r} has no value")
            options[key] = parser(name, value)
    if "ca_file" in options and not tls:
        raise ConnectionStringError("ca_file is only used with TLS: use couchbases:// to connect with TLS")
    return ConnSpec(tuple(hosts), bucket, tls, options, explicit)
