"""Options of the `dcp` source: strings in, one validated `DcpOptions` out, parsed once.

Spark hands options over as a case-insensitive map whose keys come back lower-cased,
so every name is matched lower-cased, and an unknown name is an error that
suggests the closest known one: a typo such as `maxSeqnoPerTrigger` would otherwise be ignored
and the query would quietly run without its limit.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field


class DcpOptionError(ValueError):
    """An option of the `dcp` source is missing or wrong; the message names it and says what to do."""


OPTION_NAMES = (
    "connection", "bucket", "username", "password", "vbuckets", "startingOffsets", "endingOffsets",
    "maxSeqnosPerTrigger", "maxBytesPerTrigger", "partitions", "keyFormat", "valueFormat", "valueSchema",
    "inferSchemaSamples", "rollback", "bufferSize", "maxRowsPerBatch", "timeout", "scope", "collections", "history",
    "syncWrites", "mitigateRollbacks", "withMeta", "writeBatchSize",  # df.write.format("dcp") only (writer.py)
)
_BY_LOWER = {name.lower(): name for name in OPTION_NAMES}
_IGNORED = {"path"}  # Spark may pass `path` for load(path); it means nothing to us

KEY_FORMATS = ("string", "binary")
VALUE_FORMATS = ("binary", "string", "json")
ROLLBACK_POLICIES = ("reread", "fail")
_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


@dataclass(frozen=True)
class DcpOptions:
    connection: str  # as the user gave it (the client parses it)
    bucket: str
    username: str
    password: str
    vbuckets: tuple[int, ...] | None = None  # None: every vbucket of the bucket
    starting_offsets: object = "earliest"  # "earliest" | "latest" | offsets.OffsetSpec
    ending_offsets: object = None  # batch reads only: None (not given) reads to the latest seqnos
    max_seqnos_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    partitions: int = field(default_factory=lambda: os.cpu_count() or 2)
    key_format: str = "string"
    value_format: str = "binary"
    value_schema: str | None = None  # DDL of the JSON value struct; None with json: inferred from a sample
    infer_schema_samples: int = 1000
    rollback: str = "reread"
    buffer_size: int = 20 << 20
    max_rows_per_batch: int = 32768
    timeout: float = 30.0
    scope: str | None = None  # stream this scope's collections (by name)
    collections: tuple[str, ...] = ()  # or these collections ("scope.collection"; bare: in `scope`)
    history: bool = False  # change streams: every retained version of collections with history
    sync_writes: bool = False  # rows for prepares, commits and aborts too (a durability audit)
    mitigate_rollbacks: bool = False  # plan only seqnos every copy persisted (no failover takes them back)

    @property
    def filters(self) -> dict:
        """What the client's reads take: scope=, collections=, history=, sync_writes=."""
        return {"scope": self.scope, "collections": list(self.collections) or None, "history": self.history,
                "sync_writes": self.sync_writes}

    @property
    def connection_string(self) -> str:
        """What `DcpClient.connect` takes: the user's string with the bucket as its path."""
        from dcpflow.client.connstr import parse_connection_string

        spec = parse_connection_string(self.connection)
        return str(type(spec)(spec.hosts, self.bucket, spec.tls, spec.options, spec.explicit_ports))


def parse_options(options: Mapping[str, str]) -> DcpOptions:
    """Validate the options Spark passed (values are strings) into a DcpOptions."""
    raw: dict[str, str] = {}
    for key, value in options.items():
        lower = key.lower()
        if lower in _IGNORED:
            continue
        if lower not in _BY_LOWER:
            close = difflib.get_close_matches(lower, list(_BY_LOWER), n=1)
            hint = f" Did you mean {_BY_LOWER[close[0]]!r}?" if close else ""
            raise DcpOptionError(f"unknown option {key!r} for format('dcp').{hint} Known options: "
                                 f"{', '.join(OPTION_NAMES)} (see docs/spark.md).")
        raw[_BY_LOWER[lower]] = "" if value is None else str(value)

    if "connection" not in raw or not raw["connection"].strip():
        raise DcpOptionError("option 'connection' is required, e.g. .option('connection', "
                             "'couchbase://127.0.0.1:11210/default')")
    spec = parse_connection(raw["connection"])
    url_bucket = spec.bucket
    bucket = raw.get("bucket") or url_bucket or "default"
    if url_bucket and raw.get("bucket") and raw["bucket"] != url_bucket:
        raise DcpOptionError(f"option 'bucket' is {raw['bucket']!r} but the connection string names bucket "
                             f"{url_bucket!r}: give the bucket once")
    for name in ("username", "password"):
        if name not in raw:
            raise DcpOptionError(f"option {name!r} is required (the account needs the DCP reader role "
                                 "on the bucket; `dcpflow server` creates Administrator/password by default)")
    value_format = _choice(raw, "valueFormat", VALUE_FORMATS, "binary")
    value_schema = raw.get("valueSchema") or None
    if value_schema is not None and value_format != "json":
        raise DcpOptionError("option 'valueSchema' only applies with valueFormat=json")
    scope = raw.get("scope", "").strip() or None
    collections = tuple(c.strip() for c in raw.get("collections", "").split(",") if c.strip())
    if scope is not None or collections:
        from dcpflow.client.manifest import Filter, FilterError
        try:
            Filter.build(scope, collections)
        except FilterError as e:
            raise DcpOptionError(f"option 'collections': {e}") from None
    history, sync_writes, mitigate = (_bool(raw, name) for name in ("history", "syncWrites", "mitigateRollbacks"))
    return DcpOptions(
        scope=scope, collections=collections, history=history, sync_writes=sync_writes, mitigate_rollbacks=mitigate,
        connection=raw["connection"].strip(), bucket=bucket, username=raw["username"], password=raw["password"],
        vbuckets=parse_vbuckets(raw["vbuckets"]) if raw.get("vbuckets", "").strip() not in ("", "all") else None,
        starting_offsets=parse_offsets_option(raw.get("startingOffsets", "earliest"), "startingOffsets"),
        ending_offsets=(parse_offsets_option(raw["endingOffsets"], "endingOffsets") if "endingOffsets" in raw
                        else None),
        max_seqnos_per_trigger=_int(raw, "maxSeqnosPerTrigger", None, minimum=1),
        max_bytes_per_trigger=_size(raw, "maxBytesPerTrigger"),
        partitions=_int(raw, "partitions", os.cpu_count() or 2, minimum=1),
        key_format=_choice(raw, "keyFormat", KEY_FORMATS, "string"),
        value_format=value_format, value_schema=value_schema,
        infer_schema_samples=_int(raw, "inferSchemaSamples", 1000, minimum=1),
        rollback=_choice(raw, "rollback", ROLLBACK_POLICIES, "reread"),
        buffer_size=_size(raw, "bufferSize") or 20 << 20,
        max_rows_per_batch=_int(raw, "maxRowsPerBatch", 32768, minimum=1),
        timeout=_float(raw, "timeout", 30.0),
    )


def parse_connection(text: str):
    """Validate a connection string with the client's own parser (one parser for the project)."""
    from dcpflow.client.connstr import parse_connection_string
    from dcpflow.client.errors import ConnectionStringError

    try:
        return parse_connection_string(text)
    except ConnectionStringError as e:
        raise DcpOptionError(f"option 'connection': {e}") from None


def parse_vbuckets(text: str) -> tuple[int, ...]:
    """"0-63,100,200-210" → sorted unique vbucket ids."""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\d+)\s*-\s*(\d+)|(\d+)", part)
        if m is None:
            raise DcpOptionError(f"option 'vbuckets': {part!r} is not a vbucket id or a range like 0-63 "
                                 "(use e.g. '0-63,100' or 'all')")
        if m.group(3) is not None:
            out.add(int(m.group(3)))
        else:
            lo, hi = int(m.group(1)), int(m.group(2))
            if lo > hi:
                raise DcpOptionError(f"option 'vbuckets': range {part!r} runs backwards")
            out.update(range(lo, hi + 1))
    if not out:
        raise DcpOptionError("option 'vbuckets' names no vbucket (use 'all' or e.g. '0-63')")
    if max(out) > 0xFFFF:
        raise DcpOptionError(f"option 'vbuckets': {max(out)} is not a vbucket id (ids are 0..1023 on Couchbase)")
    return tuple(sorted(out))


def parse_offsets_option(text: str, name: str):
    """'earliest' | 'latest' | JSON offsets (offsets.py); per vbucket an offset object or one of the words."""
    from .offsets import OffsetError, parse_vbucket_offsets

    stripped = text.strip()
    if stripped.lower() in ("earliest", "latest"):
        return stripped.lower()
    try:
        doc = json.loads(stripped)
    except ValueError as e:
        raise DcpOptionError(f"option {name!r} must be 'earliest', 'latest' or JSON offsets like "
                             f'{{"0": {{"vbuuid": 123, "seqno": 10}}}}; JSON error: {e}') from None
    try:
        return parse_vbucket_offsets(doc)
    except OffsetError as e:
        raise DcpOptionError(f"option {name!r}: {e}") from None


def _choice(raw: dict, name: str, choices: tuple[str, ...], default: str) -> str:
    value = raw.get(name, default).strip().lower()
    if value not in choices:
        raise DcpOptionError(f"option {name!r} is {raw[name]!r}; use one of {', '.join(choices)}")
    return value


def _bool(raw: dict, name: str) -> bool:
    text = raw.get(name, "false").strip().lower()
    if text not in ("true", "false"):
        raise DcpOptionError(f"option {name!r} is {raw[name]!r}; use true or false")
    return text == "true"


def _int(raw: dict, name: str, default, minimum: int) -> int | None:
    if name not in raw or raw[name].strip() == "":
        return default
    try:
        value = int(raw[name].strip().replace("_", ""))
    except ValueError:
        raise DcpOptionError(f"option {name!r} must be a whole number, not {raw[name]!r}") from None
    if value < minimum:
        raise DcpOptionError(f"option {name!r} must be at least {minimum}, not {value}")
    return value


def _float(raw: dict, name: str, default: float) -> float:
    if name not in raw:
        return default
    try:
        value = float(raw[name])
    except ValueError:
        raise DcpOptionError(f"option {name!r} must be a number of seconds, not {raw[name]!r}") from None
    if not value > 0:
        raise DcpOptionError(f"option {name!r} must be positive, not {raw[name]!r}")
    return value


def parse_size(text: str) -> int:
    """'1048576', '64k', '64m', '1g', '512MiB' → bytes."""
    m = _SIZE.match(text)
    if m is None:
        raise ValueError(text)
    return int(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]


def _size(raw: dict, name: str) -> int | None:
    if name not in raw or raw[name].strip() == "":
        return None
    try:
        value = parse_size(raw[name])
    except ValueError:
        raise DcpOptionError(f"option {name!r} must be a size like 67108864, 64m or 1g, not {raw[name]!r}") from None
    if value < 1:
        raise DcpOptionError(f"option {name!r} must be positive")
    return value
