"""HELLO (0x1f) feature negotiation: the request value is a list of u16 feature codes, and so is
the response (the subset the server granted). Codes are KV-Engine's
(its headers define them; BinaryProtocol.md's HELO section lists some)."""

import struct
from enum import IntEnum

from .errors import ProtocolError


class Feature(IntEnum):
    DATATYPE_RETIRED = 0x0001
    TLS = 0x0002
    TCP_NODELAY = 0x0003
    MUTATION_SEQNO = 0x0004
    TCP_DELAY = 0x0005
    XATTR = 0x0006
    XERROR = 0x0007
    SELECT_BUCKET = 0x0008
    COLLECTIONS_PROTOTYPE_RETIRED = 0x0009
    SNAPPY = 0x000A
    JSON = 0x000B
    DUPLEX = 0x000C
    CLUSTERMAP_CHANGE_NOTIFICATION = 0x000D
    UNORDERED_EXECUTION = 0x000E
    TRACING = 0x000F
    ALT_REQUEST_SUPPORT = 0x0010
    SYNC_REPLICATION = 0x0011
    COLLECTIONS = 0x0012
    SNAPPY_EVERYWHERE = 0x0013
    PRESERVE_TTL = 0x0014
    VATTR = 0x0015
    PITR_RETIRED = 0x0016
    SUBDOC_CREATE_AS_DELETED = 0x0017
    SUBDOC_DOCUMENT_MACRO_SUPPORT = 0x0018
    SUBDOC_REPLACE_BODY_WITH_XATTR = 0x0019
    REPORT_UNIT_USAGE = 0x001A
    NON_BLOCKING_THROTTLING_MODE = 0x001B
    SUBDOC_REPLICA_READ = 0x001C
    GET_CLUSTER_CONFIG_WITH_KNOWN_VERSION = 0x001D
    DEDUPE_NOT_MY_VBUCKET_CLUSTERMAP = 0x001E
    CLUSTERMAP_CHANGE_NOTIFICATION_BRIEF = 0x001F
    SUBDOC_ALLOWS_ACCESS_ON_MULTIPLE_XATTR_KEYS = 0x0020
    SUBDOC_BINARY_XATTR = 0x0021
    RANGE_SCAN_INCLUDE_XATTR = 0x0022
    SUBDOC_ALLOW_REPLICA_READ_ON_DELETED_DOCS = 0x0023
    GET_RANDOM_KEY_INCLUDE_XATTR = 0x0024
    MUTATE_WITH_META = 0x0025
    DCP_SKIP_DELETES_IN_INITIAL_BACKFILL = 0x0026


#: Codes that a server must never grant (retired, or meaningless as negotiated features).
RETIRED = frozenset({Feature.DATATYPE_RETIRED, Feature.TLS, Feature.TCP_DELAY,
                     Feature.COLLECTIONS_PROTOTYPE_RETIRED, Feature.PITR_RETIRED})


def encode_features(features) -> bytes:
    return b"".join(struct.pack(">H", int(f)) for f in features)


def decode_features(value: bytes) -> list[int]:
    """Feature codes in order; unknown codes are kept as ints (a server ignores them)."""
    if len(value) % 2:
        raise ProtocolError(f"HELLO value must be a list of u16 feature codes; got {len(value)} bytes")
    codes = [c for (c,) in struct.iter_unpack(">H", value)]
    return [Feature(c) if c in Feature._value2member_map_ else c for c in codes]
