"""Sub-document commands (0xc5-0xd3): single-path requests, multi-path lookups and mutations, and
their responses.

Page: https://github.com/couchbase/kv_engine/blob/master/docs/SubDocument.md ("Wire Protocol
Format"), with the flag values, extras lengths and per-command rules of kv_engine's request
validator (the page lists fewer doc flags than the server accepts). Status codes: the
sub-document block of https://github.com/couchbase/kv_engine/blob/master/include/memcached/protocol_binary.h
(0xc0-0xd8).

Single path: extras = path length u16, path flags u8, then optionally expiry u32 (and after it
the document's user flags u32), then optionally the doc flags u8; the value is the path followed
by the operation's value. Lookups take 3 or 4 bytes of extras, mutations 3, 4, 7, 8, 11 or 12.

Multi path: extras = optionally expiry u32 (and user flags u32), optionally doc flags u8 (lookups
only the doc flags); the value is up to 16 specs: opcode u8, path flags u8, path length u16,
(mutations only) value length u32, path, value. Whole-document GET (0x00), SET (0x01) and DELETE
(0x04) may appear as specs with an empty path. Xattr specs come first.

A lookup reply carries every spec's (status u16, value length u32, value); a mutation reply the
(index u8, status u16, value length u32, value) of each spec that returns a value (COUNTER), or on
failure only (index u8, status u16) of the first failing spec.

The rules a request must meet are checked by `request_problem` in kv_engine's order (the first
broken rule decides the status: EINVAL, SUBDOC_INVALID_COMBO, SUBDOC_INVALID_XATTR_ORDER,
SUBDOC_XATTR_INVALID_FLAG_COMBO, XATTR_EINVAL, SUBDOC_XATTR_CANT_MODIFY_VATTR,
SUBDOC_XATTR_UNKNOWN_MACRO); what depends on the connection (HELLO Xattr) is the server's.
"""

import struct
from enum import IntFlag
from typing import NamedTuple

from . import rules
from .datatype import xattr_key_problem
from .errors import ProtocolError
from .frame import HEADER, Frame, Magic, request, response
from .kv.common import _mutation_extras as _token_extras
from .kv.common import _mutation_token as _token
from .kv.replies import MUTATION_RESPONSE_WITH_TOKEN
from .opcodes import Opcode
from .rules import MAY, MUST, Shape
from .status import Status

PAGE = "docs/SubDocument.md"
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_SINGLE_HEAD = struct.Struct(">HB")
#: The head of one spec of a multi-path body (SubDocument.md): a lookup's (opcode u8, path flags u8,
#: path length u16) and a mutation's, which adds the value length u32; the path (and value) follow.
#: A server's fast path reads the first spec in place with them.
LOOKUP_SPEC_HEAD = struct.Struct(">BBH")
MUTATION_SPEC_HEAD = struct.Struct(">BBHI")
_LOOKUP_RESULT = struct.Struct(">HI")
_MUTATION_RESULT = struct.Struct(">BH")

#: kv_engine's limits (SubDocument.md "Limits").
MAX_PATHS = 16
MAX_PATH_LEN = 1024


class PathFlag(IntFlag):
    """Per-path flags (kv_engine's cb::mcbp::subdoc::PathFlag)."""

    NONE = 0x00
    MKDIR_P = 0x01  # create missing intermediate dictionaries
    XATTR_PATH = 0x04  # the path's first component is an extended attribute's key
    EXPAND_MACROS = 0x10  # the value is a macro (${Mutation.CAS}, ...) to expand; xattr paths only
    BINARY_VALUE = 0x20  # the xattr value is binary (stored base64-encoded); xattr paths only


class DocFlag(IntFlag):
    """Whole-document flags (kv_engine's cb::mcbp::subdoc::DocFlag)."""

    NONE = 0x00
    MKDOC = 0x01  # create the document if missing (upsert semantics; implies MKDIR_P)
    ADD = 0x02  # create the document, failing if it exists (insert semantics; implies MKDIR_P)
    ACCESS_DELETED = 0x04  # operate on a tombstone too (its xattrs)
    CREATE_AS_DELETED = 0x08  # with MKDOC/ADD: create the document as a tombstone
    REVIVE_DOCUMENT = 0x10  # turn a tombstone back into a live document (needs ACCESS_DELETED)
    REPLICA_READ = 0x20  # look the document up in a replica vbucket


KNOWN_DOC_FLAGS = 0x3F
# Plain ints of the flags for the checks every request runs (IntFlag operators are slow).
_MKDIR_P, _XATTR_PATH, _EXPAND, _BINARY = 0x01, 0x04, 0x10, 0x20
_MKDOC, _ADD, _ACCESS_DELETED, _CREATE_AS_DELETED, _REVIVE, _REPLICA_READ = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_READ_DOC_FLAGS = _ACCESS_DELETED | _REVIVE | _REPLICA_READ
_CREATE_DOC_FLAGS = _MKDOC | _ACCESS_DELETED | _REVIVE | _ADD | _CREATE_AS_DELETED


class Traits(NamedTuple):
    """What one path operation accepts (kv_engine's SubdocCmdTraits)."""

    mutator: bool
    has_value: bool  # the request must carry a value (else must not)
    empty_path: bool  # an empty path is allowed
    path_flags: int  # valid path flags
    mandatory_flags: int
    doc_flags: int  # valid doc flags
    returns_value: bool  # the reply carries a value (GET, GET_COUNT, COUNTER, whole-doc GET)
    whole_doc: bool = False  # GET/SET/DELETE inside a multi: the path must be empty


_X, _M, _E, _B = _XATTR_PATH, _MKDIR_P, _EXPAND, _BINARY
TRAITS: dict[int, Traits] = {
    Opcode.GET: Traits(False, False, True, 0, 0, _READ_DOC_FLAGS, True, True),
    Opcode.SET: Traits(True, True, True, 0, 0, _MKDOC | _ADD, False, True),
    Opcode.DELETE: Traits(True, False, True, 0, 0, _ACCESS_DELETED | _REVIVE, False, True),
    Opcode.SUBDOC_GET: Traits(False, False, False, _X | _B, 0, _READ_DOC_FLAGS, True),
    Opcode.SUBDOC_EXISTS: Traits(False, False, False, _X, 0, _READ_DOC_FLAGS, False),
    Opcode.SUBDOC_GET_COUNT: Traits(False, False, True, _X, 0, _READ_DOC_FLAGS, True),
    Opcode.SUBDOC_DICT_ADD: Traits(True, True, False, _M | _X | _E | _B, 0, _CREATE_DOC_FLAGS, False),
    Opcode.SUBDOC_DICT_UPSERT: Traits(True, True, False, _M | _X | _E | _B, 0, _CREATE_DOC_FLAGS, False),
    Opcode.SUBDOC_DELETE: Traits(True, False, False, _X, 0, _ACCESS_DELETED | _REVIVE, False),
    Opcode.SUBDOC_REPLACE: Traits(True, True, False, _X | _E | _B, 0, _ACCESS_DELETED | _REVIVE | _ADD, False),
    Opcode.SUBDOC_ARRAY_PUSH_LAST: Traits(True, True, True, _M | _X | _E, 0, _CREATE_DOC_FLAGS, False),
    Opcode.SUBDOC_ARRAY_PUSH_FIRST: Traits(True, True, True, _M | _X | _E, 0, _CREATE_DOC_FLAGS, False),
    Opcode.SUBDOC_ARRAY_INSERT: Traits(True, True, False, _X | _E, 0,
                                       _ACCESS_DELETED | _REVIVE | _ADD | _CREATE_AS_DELETED, False),
    Opcode.SUBDOC_ARRAY_ADD_UNIQUE: Traits(True, True, True, _M | _X, 0, _CREATE_DOC_FLAGS, False),
    Opcode.SUBDOC_COUNTER: Traits(True, True, False, _M | _X, 0, _CREATE_DOC_FLAGS, True),
    Opcode.SUBDOC_REPLACE_BODY_WITH_XATTR: Traits(True, False, False, _X | _B, _X, _ACCESS_DELETED | _REVIVE,
                                                  False),
}
#: The single-path opcodes (everything in TRAITS but the whole-document specs).
SINGLE_OPCODES = tuple(op for op in TRAITS if op >= Opcode.SUBDOC_GET)
LOOKUP_OPCODES = tuple(op for op in SINGLE_OPCODES if not TRAITS[op].mutator)
MUTATION_OPCODES = tuple(op for op in SINGLE_OPCODES if TRAITS[op].mutator)
MULTI_OPCODES = (Opcode.SUBDOC_MULTI_LOOKUP, Opcode.SUBDOC_MULTI_MUTATION)

#: Macros an EXPAND_MACROS value may be (the JSON string, quotes included; ExtendedAttributes.md).
MACRO_CAS = b'"${Mutation.CAS}"'
MACRO_SEQNO = b'"${Mutation.seqno}"'
MACRO_VALUE_CRC32C = b'"${Mutation.value_crc32c}"'
MACROS = (MACRO_CAS, MACRO_SEQNO, MACRO_VALUE_CRC32C)
_BASE64_MARK = b"cb-content-base64-encoded:"


def cas_macro_text(cas: int) -> bytes:
    """What ${Mutation.CAS} expands to: the CAS's 8 bytes in network order read as a little-endian
    number (what transactions decode), as a JSON string "0x" and 16 hex digits (kv_engine's
    ExtendedAttributes.md, "Macros")."""
    return f'"0x{int.from_bytes(cas.to_bytes(8, "big"), "little"):016x}"'.encode()


def xattr_key_of(path: bytes) -> bytes:
    """The xattr key of an xattr path: up to the first '.' or '[' (ExtendedAttributes.md)."""
    for i, ch in enumerate(path):
        if ch == 0x2E or ch == 0x5B:
            return path[:i]
    return path


def is_virtual(path: bytes) -> bool:
    return path[:1] == b"$"


def _fail(reason: str, status: int = Status.EINVAL) -> ProtocolError:
    return ProtocolError(f"{reason} ({PAGE})", status)


def _spec_problem(op: int, flags: int, path: bytes, value: bytes, doc_flags: int, mutator: bool,
                  multi: bool) -> ProtocolError | None:
    """The first rule one path operation breaks, in kv_engine's validator order."""
    traits = TRAITS.get(op)
    if traits is None or (not multi and traits.whole_doc):
        return _fail(f"opcode 0x{op:02x} is not a sub-document operation", Status.SUBDOC_INVALID_COMBO)
    if traits.mutator != mutator:
        what = "lookup" if mutator else "mutation"
        return _fail(f"{rules.opcode_name(op)} cannot be part of a multi-{what}"
                     if multi else f"{rules.opcode_name(op)} is not a {what}", Status.SUBDOC_INVALID_COMBO)
    if not multi:
        if traits.has_value and not value:
            return _fail(f"{rules.opcode_name(op)} must have a value")
        if not traits.has_value and value:
            return _fail(f"{rules.opcode_name(op)} must not have a value")
    if flags & ~traits.path_flags:
        return _fail(f"path flags 0x{flags:02x} are not valid for {rules.opcode_name(op)}")
    if flags & traits.mandatory_flags != traits.mandatory_flags:
        return _fail(f"{rules.opcode_name(op)} needs path flags 0x{traits.mandatory_flags:02x}")
    if doc_flags & ~traits.doc_flags:
        return _fail(f"doc flags 0x{doc_flags:02x} are not valid for {rules.opcode_name(op)}")
    if len(path) > MAX_PATH_LEN:
        return _fail(f"path is {len(path)} bytes; the limit is {MAX_PATH_LEN}")
    if multi and traits.whole_doc and path:
        return _fail(f"whole-document {rules.opcode_name(op)} must have an empty path")
    if not multi and doc_flags & _CREATE_AS_DELETED:
        if not doc_flags & (_ADD | _MKDOC):
            return _fail("CREATE_AS_DELETED needs MKDOC or ADD")
        if not flags & _XATTR_PATH:
            return _fail("CREATE_AS_DELETED does not support a body path")
    problem = _xattr_problem(flags, path, value, mutator)
    if problem is not None:
        return problem
    if not traits.empty_path and not path and not (multi and flags & _XATTR_PATH):
        return _fail(f"{rules.opcode_name(op)} must have a path")
    if multi:
        if traits.has_value and not value:
            return _fail(f"{rules.opcode_name(op)} must have a value")
        if not traits.has_value and value:
            return _fail(f"{rules.opcode_name(op)} must not have a value")
    return None


def _xattr_problem(flags: int, path: bytes, value: bytes, mutator: bool) -> ProtocolError | None:
    if not flags & _XATTR_PATH:
        if flags & _EXPAND:
            return _fail("EXPAND_MACROS needs XATTR_PATH", Status.SUBDOC_XATTR_INVALID_FLAG_COMBO)
        if flags & _BINARY:
            return _fail("BINARY_VALUE needs XATTR_PATH", Status.SUBDOC_XATTR_INVALID_FLAG_COMBO)
        return None
    if flags & _BINARY and flags & _EXPAND:
        return _fail("BINARY_VALUE cannot be combined with EXPAND_MACROS", Status.SUBDOC_XATTR_INVALID_FLAG_COMBO)
    key = xattr_key_of(path)
    problem = xattr_key_problem(key, allow_virtual=True)
    if problem is not None:
        return ProtocolError(f"xattr key {key[:32]!r}: {problem} (docs/ExtendedAttributes.md)", Status.XATTR_EINVAL)
    if is_virtual(key) and mutator:
        return _fail(f"virtual xattr {key.decode('utf-8', 'replace')!r} is read-only",
                     Status.SUBDOC_XATTR_CANT_MODIFY_VATTR)
    if flags & _EXPAND and value not in MACROS and not (
            value.startswith(b'"${$document') and value.endswith(b'}"')):
        return _fail(f"unknown macro {value[:40]!r} (known: {', '.join(m.decode() for m in MACROS)}, "
                     "\"${$document...}\")", Status.SUBDOC_XATTR_UNKNOWN_MACRO)
    return None


def _doc_flag_problem(doc_flags: int, cas: int) -> ProtocolError | None:
    if doc_flags & ~KNOWN_DOC_FLAGS:
        return _fail(f"unknown doc flag bits 0x{doc_flags & ~KNOWN_DOC_FLAGS:02x}")
    if doc_flags & _ADD and cas:
        return _fail("a request with the ADD doc flag must have CAS 0")
    if doc_flags & _ADD and doc_flags & _MKDOC:
        return _fail("ADD and MKDOC cannot be combined")
    return None


# ---------------------------------------------------------------------------------------------
# Requests


class SubdocSpec(NamedTuple):
    """One operation of a multi-path request (or the operation of a single-path one)."""

    opcode: int
    path: bytes = b""
    value: bytes = b""
    flags: int = 0

    @property
    def xattr(self) -> bool:
        return bool(self.flags & _XATTR_PATH)

    def encode(self, mutation: bool) -> bytes:
        if mutation:
            return MUTATION_SPEC_HEAD.pack(self.opcode, self.flags, len(self.path), len(self.value)) + self.path + \
                self.value
        return LOOKUP_SPEC_HEAD.pack(self.opcode, self.flags, len(self.path)) + self.path


def _single_extras(path_len: int, path_flags: int, expiry: int | None, user_flags: int | None,
                   doc_flags: int) -> bytes:
    extras = _SINGLE_HEAD.pack(path_len, path_flags)
    if expiry is not None or user_flags is not None:
        extras += _U32.pack(expiry or 0)
        if user_flags is not None:
            extras += _U32.pack(user_flags)
    if doc_flags:
        extras += bytes([doc_flags])
    return extras


def _tail_fields(extras: bytes, with_head: int) -> tuple[int | None, int | None, int]:
    """(expiry, user flags, doc flags) from the extras after the first `with_head` bytes."""
    rest = extras[with_head:]
    doc_flags = 0
    if len(rest) in (1, 5, 9):
        doc_flags = rest[-1]
        rest = rest[:-1]
    expiry = user_flags = None
    if len(rest) >= 4:
        expiry = _U32.unpack_from(rest)[0]
    if len(rest) == 8:
        user_flags = _U32.unpack_from(rest, 4)[0]
    return expiry, user_flags, doc_flags


_SINGLE_EXTRAS = {False: (3, 4), True: (3, 4, 7, 8, 11, 12)}
_MULTI_EXTRAS = {False: (0, 1), True: (0, 1, 4, 5, 8, 9)}


class SubdocRequest(NamedTuple):
    """A single-path request (0xc5-0xcf, 0xd2, 0xd3). `expiry` None: no expiry in the extras (a
    mutation then gives the document no expiry); `user_flags` None: the document keeps its flags."""

    opcode: int
    key: bytes
    path: bytes
    value: bytes = b""
    path_flags: int = 0
    doc_flags: int = 0
    expiry: int | None = None
    user_flags: int | None = None
    cas: int = 0
    vbucket: int = 0
    opaque: int = 0
    framing: bytes = b""

    OPCODES = SINGLE_OPCODES

    @property
    def traits(self) -> Traits:
        return TRAITS[self.opcode]

    @property
    def spec(self) -> SubdocSpec:
        return SubdocSpec(self.opcode, self.path, self.value, self.path_flags)

    def encode(self) -> bytes:
        extras = _single_extras(len(self.path), self.path_flags, self.expiry, self.user_flags, self.doc_flags)
        return request(self.opcode, key=self.key, extras=extras, value=self.path + self.value,
                       vbucket=self.vbucket, opaque=self.opaque, cas=self.cas, framing=self.framing)

    @classmethod
    def from_frame(cls, frame: Frame) -> "SubdocRequest":
        _check_opcode(frame, cls.OPCODES, cls)
        rules.check(frame)
        path_len, path_flags = _SINGLE_HEAD.unpack_from(frame.extras)
        expiry, user_flags, doc_flags = _tail_fields(frame.extras, 3)
        value = frame.value
        return cls(frame.opcode, frame.key, value[:path_len], value[path_len:], path_flags, doc_flags, expiry,
                   user_flags, frame.cas, frame.vbucket, frame.opaque, frame.framing)


def _single_problems(frame: Frame):
    if frame.datatype:
        yield _fail(f"a sub-document request has datatype 0 (raw), not 0x{frame.datatype:02x}")
        return
    mutator = TRAITS[frame.opcode].mutator
    extras = frame.extras
    if len(extras) not in _SINGLE_EXTRAS[True]:
        yield _fail(f"extras must be 3, 4, 7, 8, 11 or 12 bytes; got {len(extras)}")
        return
    path_len, flags = _SINGLE_HEAD.unpack_from(extras)
    _, _, doc_flags = _tail_fields(extras, 3)
    problem = _doc_flag_problem(doc_flags, 0)
    if problem is not None:
        yield problem
        return
    if path_len > MAX_PATH_LEN:
        yield _fail(f"path is {path_len} bytes; the limit is {MAX_PATH_LEN}")
        return
    if path_len > len(frame.value):
        yield _fail(f"path length {path_len} is longer than the value ({len(frame.value)} bytes)")
        return
    path, value = frame.value[:path_len], frame.value[path_len:]
    problem = _spec_problem(frame.opcode, flags, path, value, doc_flags, mutator, multi=False) or \
        _doc_flag_problem(doc_flags, frame.cas)
    if problem is not None:
        yield problem
        return
    if len(extras) not in _SINGLE_EXTRAS[mutator]:
        yield _fail(f"a lookup's extras are 3 or 4 bytes; got {len(extras)}")


class SubdocMultiLookup(NamedTuple):
    """SUBDOC_MULTI_LOOKUP 0xd0: up to 16 lookups on one version of the document."""

    key: bytes
    specs: tuple[SubdocSpec, ...]
    doc_flags: int = 0
    vbucket: int = 0
    opaque: int = 0
    framing: bytes = b""

    opcode = Opcode.SUBDOC_MULTI_LOOKUP

    def encode(self) -> bytes:
        extras = bytes([self.doc_flags]) if self.doc_flags else b""
        return request(self.opcode, key=self.key, extras=extras,
                       value=b"".join(s.encode(False) for s in self.specs), vbucket=self.vbucket,
                       opaque=self.opaque, framing=self.framing)

    @classmethod
    def from_frame(cls, frame: Frame) -> "SubdocMultiLookup":
        _check_opcode(frame, (cls.opcode,), cls)
        specs = _decode_multi(frame)
        return cls(frame.key, specs, frame.extras[0] if frame.extras else 0, frame.vbucket, frame.opaque,
                   frame.framing)


class SubdocMultiMutation(NamedTuple):
    """SUBDOC_MULTI_MUTATION 0xd1: up to 16 mutations applied atomically (all or none)."""

    key: bytes
    specs: tuple[SubdocSpec, ...]
    doc_flags: int = 0
    expiry: int | None = None
    user_flags: int | None = None
    cas: int = 0
    vbucket: int = 0
    opaque: int = 0
    framing: bytes = b""

    opcode = Opcode.SUBDOC_MULTI_MUTATION

    def encode(self) -> bytes:
        extras = b""
        if self.expiry is not None or self.user_flags is not None:
            extras = _U32.pack(self.expiry or 0)
            if self.user_flags is not None:
                extras += _U32.pack(self.user_flags)
        if self.doc_flags:
            extras += bytes([self.doc_flags])
        return request(self.opcode, key=self.key, extras=extras,
                       value=b"".join(s.encode(True) for s in self.specs), vbucket=self.vbucket,
                       opaque=self.opaque, cas=self.cas, framing=self.framing)

    @classmethod
    def from_frame(cls, frame: Frame) -> "SubdocMultiMutation":
        _check_opcode(frame, (cls.opcode,), cls)
        specs = _decode_multi(frame)
        expiry, user_flags, doc_flags = _tail_fields(frame.extras, 0)
        return cls(frame.key, specs, doc_flags, expiry, user_flags, frame.cas, frame.vbucket, frame.opaque,
                   frame.framing)


def _parse_multi(frame: Frame) -> tuple[list[SubdocSpec], ProtocolError | None]:
    """The specs of a multi-path request and the first rule it breaks (None: none), checked in
    kv_engine's order while the specs are read."""
    specs: list[SubdocSpec] = []
    if frame.datatype:
        return specs, _fail(f"a sub-document request has datatype 0 (raw), not 0x{frame.datatype:02x}")
    mutation = frame.opcode == Opcode.SUBDOC_MULTI_MUTATION
    extras = frame.extras
    if len(extras) not in _MULTI_EXTRAS[mutation]:
        allowed = ", ".join(str(n) for n in _MULTI_EXTRAS[mutation])
        return specs, _fail(f"extras must be {allowed} bytes; got {len(extras)}")
    doc_flags = extras[-1] if len(extras) in (1, 5, 9) else 0
    problem = _doc_flag_problem(doc_flags, frame.cas)
    if problem is None and doc_flags & _REVIVE:
        if not doc_flags & _ACCESS_DELETED:
            problem = _fail("REVIVE_DOCUMENT needs ACCESS_DELETED")
        elif doc_flags & _CREATE_AS_DELETED:
            problem = _fail("REVIVE_DOCUMENT cannot be combined with CREATE_AS_DELETED")
    if problem is not None:
        return specs, problem
    value, pos, end, count = frame.value, 0, len(frame.value), 0
    head = MUTATION_SPEC_HEAD if mutation else LOOKUP_SPEC_HEAD
    head_size, unpack = head.size, head.unpack_from
    xattrs_allowed = body_allowed = True
    while pos < end and count < MAX_PATHS:
        if not body_allowed:
            return specs, _fail("nothing may follow a whole-document DELETE", Status.SUBDOC_INVALID_COMBO)
        if end - pos < head_size:
            return specs, _fail(f"spec {count} is truncated")
        if mutation:
            op, flags, path_len, value_len = unpack(value, pos)
        else:
            op, flags, path_len = unpack(value, pos)
            value_len = 0
        start = pos + head_size
        stop = start + path_len + value_len
        if stop > end:
            return specs, _fail(f"spec {count}: its path and value run past the end of the request")
        path = value[start:start + path_len]
        spec_value = value[start + path_len:stop]
        problem = _spec_problem(op, flags, path, spec_value, doc_flags, mutation, multi=True)
        if problem is not None:
            problem.reason = f"spec {count}: {problem.reason}"
            return specs, problem
        is_xattr = flags & _XATTR_PATH
        singleton = op == Opcode.DELETE
        if xattrs_allowed:
            xattrs_allowed = bool(is_xattr)
        elif is_xattr:
            return specs, _fail(f"spec {count}: xattr specs must come before body specs",
                                Status.SUBDOC_INVALID_XATTR_ORDER)
        elif singleton:
            return specs, _fail(f"spec {count}: a whole-document DELETE cannot follow other body specs",
                                Status.SUBDOC_INVALID_COMBO)
        if singleton:
            body_allowed = False
        specs.append(SubdocSpec(op, path, spec_value, flags))
        pos = stop
        count += 1
    if count == 0:
        return specs, _fail("a multi-path request needs at least one spec", Status.SUBDOC_INVALID_COMBO)
    if pos != end:
        return specs, _fail(f"a multi-path request has at most {MAX_PATHS} specs", Status.SUBDOC_INVALID_COMBO)
    return specs, None


def _multi_problems(frame: Frame):
    problem = _parse_multi(frame)[1]
    if problem is not None:
        yield problem


def _decode_multi(frame: Frame) -> tuple[SubdocSpec, ...]:
    """The specs of a valid multi-path request: parsed and checked in one pass; a frame with
    framing extras or without a key takes the registry's full check (frame infos, shape) first."""
    specs, problem = _parse_multi(frame)
    if problem is not None or frame.framing or not frame.key:
        rules.check(frame)  # raises the first problem (inside rules.lenient(): what could be read is kept)
    return tuple(specs)


# ---------------------------------------------------------------------------------------------
# Responses

#: Statuses of a reply that carries a body (kv_engine also answers a deleted document's success).
SINGLE_BODY_STATUSES = frozenset((Status.SUCCESS, Status.SUBDOC_SUCCESS_DELETED))
LOOKUP_BODY_STATUSES = frozenset((Status.SUCCESS, Status.SUBDOC_SUCCESS_DELETED, Status.SUBDOC_MULTI_PATH_FAILURE,
                                  Status.SUBDOC_MULTI_PATH_FAILURE_DELETED))
MUTATION_BODY_STATUSES = frozenset((Status.SUCCESS, Status.SUBDOC_SUCCESS_DELETED, Status.SUBDOC_MULTI_PATH_FAILURE))


class SubdocResponse(NamedTuple):
    """Reply to a single-path request: the value (GET, GET_COUNT, COUNTER), the document's CAS and,
    for a mutation with HELLO MutationSeqno, (vbucket uuid, seqno) in 16 bytes of extras."""

    opcode: int
    value: bytes = b""
    cas: int = 0
    vbucket_uuid: int | None = None
    seqno: int | None = None
    status: int = Status.SUCCESS
    opaque: int = 0
    datatype: int = 0

    OPCODES = SINGLE_OPCODES

    def encode(self) -> bytes:
        if self.status not in SINGLE_BODY_STATUSES:
            return response(self.opcode, self.status, opaque=self.opaque)
        return response(self.opcode, self.status, extras=_token_extras(self.vbucket_uuid, self.seqno),
                        value=self.value, opaque=self.opaque, cas=self.cas, datatype=self.datatype)

    @classmethod
    def from_frame(cls, frame: Frame) -> "SubdocResponse":
        _check_opcode(frame, cls.OPCODES, cls, response=True)
        rules.check(frame)
        if frame.status not in SINGLE_BODY_STATUSES:
            return cls(frame.opcode, status=frame.status, opaque=frame.opaque)
        uuid, seqno = _token(frame.extras)
        return cls(frame.opcode, frame.value, frame.cas, uuid, seqno, frame.status, frame.opaque, frame.datatype)


class LookupResult(NamedTuple):
    status: int
    value: bytes = b""


class SubdocMultiLookupResponse(NamedTuple):
    """Every spec's (status, value), in request order; the header status is SUCCESS,
    SUBDOC_MULTI_PATH_FAILURE (some spec failed) or their _DELETED twins (a tombstone was read)."""

    results: tuple[LookupResult, ...] = ()
    cas: int = 0
    status: int = Status.SUCCESS
    opaque: int = 0

    opcode = Opcode.SUBDOC_MULTI_LOOKUP

    def encode(self) -> bytes:
        if self.status not in LOOKUP_BODY_STATUSES:
            return response(self.opcode, self.status, opaque=self.opaque)
        body = b"".join(_LOOKUP_RESULT.pack(r.status, len(r.value)) + r.value for r in self.results)
        return response(self.opcode, self.status, value=body, opaque=self.opaque, cas=self.cas)

    @classmethod
    def from_frame(cls, frame: Frame) -> "SubdocMultiLookupResponse":
        _check_opcode(frame, (cls.opcode,), cls, response=True)
        rules.check(frame)
        if frame.status not in LOOKUP_BODY_STATUSES:
            return cls(status=frame.status, opaque=frame.opaque)
        value, pos, out = frame.value, 0, []
        while pos < len(value):
            status, n = _LOOKUP_RESULT.unpack_from(value, pos)
            pos += _LOOKUP_RESULT.size
            out.append(LookupResult(status, value[pos:pos + n]))
            pos += n
        return cls(tuple(out), frame.cas, frame.status, frame.opaque)


class MutationResult(NamedTuple):
    index: int
    status: int
    value: bytes = b""


class SubdocMultiMutationResponse(NamedTuple):
    """On success the results of the specs that return a value (COUNTER), with the mutation token
    in the extras; on SUBDOC_MULTI_PATH_FAILURE only the first failing spec's (index, status)."""

    results: tuple[MutationResult, ...] = ()
    cas: int = 0
    vbucket_uuid: int | None = None
    seqno: int | None = None
    status: int = Status.SUCCESS
    opaque: int = 0

    opcode = Opcode.SUBDOC_MULTI_MUTATION

    def encode(self) -> bytes:
        if self.status not in MUTATION_BODY_STATUSES:
            return response(self.opcode, self.status, opaque=self.opaque)
        parts = []
        for r in self.results:
            parts.append(_MUTATION_RESULT.pack(r.index, r.status))
            if r.status == Status.SUCCESS:
                parts.append(_U32.pack(len(r.value)) + r.value)
        extras = _token_extras(self.vbucket_uuid, self.seqno) if self.status != Status.SUBDOC_MULTI_PATH_FAILURE \
            else b""
        return response(self.opcode, self.status, extras=extras, value=b"".join(parts), opaque=self.opaque,
                        cas=self.cas)

    @classmethod
    def from_frame(cls, frame: Frame) -> "SubdocMultiMutationResponse":
        _check_opcode(frame, (cls.opcode,), cls, response=True)
        rules.check(frame)
        if frame.status not in MUTATION_BODY_STATUSES:
            return cls(status=frame.status, opaque=frame.opaque)
        value, pos, out = frame.value, 0, []
        while pos < len(value):
            index, status = _MUTATION_RESULT.unpack_from(value, pos)
            pos += _MUTATION_RESULT.size
            data = b""
            if status == Status.SUCCESS:
                (n,) = _U32.unpack_from(value, pos)
                data = value[pos + 4:pos + 4 + n]
                pos += 4 + n
            out.append(MutationResult(index, status, data))
        uuid, seqno = _token(frame.extras)
        return cls(tuple(out), frame.cas, uuid, seqno, frame.status, frame.opaque)


_ONE_RESULT_REPLY = struct.Struct(HEADER.format + "HI")


def one_lookup_reply(status: int, result_status: int, value: bytes, opaque: int, cas: int) -> bytes:
    """The bytes of SubdocMultiLookupResponse((LookupResult(result_status, value),), cas, status,
    opaque).encode(), packed in one call: the reply to the most common lookup, one spec."""
    return _ONE_RESULT_REPLY.pack(Magic.RESPONSE, Opcode.SUBDOC_MULTI_LOOKUP, 0, 0, 0, status, 6 + len(value), opaque,
                                  cas, result_status, len(value)) + value


_TOKEN_REPLY = MUTATION_RESPONSE_WITH_TOKEN  # a body may follow: its length counts in the header
_PLAIN_REPLY = HEADER


def one_mutation_reply(opaque: int, cas: int, vbucket_uuid: int | None, seqno: int, value: bytes | None) -> bytes:
    """The bytes of a successful SubdocMultiMutationResponse with at most one result (spec 0's
    value, as COUNTER returns), packed directly: the reply to the most common mutation."""
    body = b"" if value is None else _MUTATION_RESULT.pack(0, 0) + _U32.pack(len(value)) + value
    if vbucket_uuid is None:
        return _PLAIN_REPLY.pack(Magic.RESPONSE, Opcode.SUBDOC_MULTI_MUTATION, 0, 0, 0, 0, len(body), opaque,
                                 cas) + body
    return _TOKEN_REPLY.pack(Magic.RESPONSE, Opcode.SUBDOC_MULTI_MUTATION, 0, 16, 0, 0, 16 + len(body), opaque, cas,
                             vbucket_uuid, seqno) + body


def _lookup_body_problems(frame: Frame):
    if frame.status not in LOOKUP_BODY_STATUSES:
        return
    value, pos = frame.value, 0
    while pos < len(value):
        if len(value) - pos < _LOOKUP_RESULT.size:
            yield _fail("a lookup result is truncated")
            return
        n = _LOOKUP_RESULT.unpack_from(value, pos)[1]
        pos += _LOOKUP_RESULT.size + n
        if pos > len(value):
            yield _fail("a lookup result's value runs past the end of the reply")
            return


def _mutation_body_problems(frame: Frame):
    if frame.status not in MUTATION_BODY_STATUSES:
        return
    if len(frame.extras) not in (0, 16):
        yield _fail(f"a multi-mutation reply's extras are 0 or 16 bytes; got {len(frame.extras)}")
    value, pos = frame.value, 0
    while pos < len(value):
        if len(value) - pos < _MUTATION_RESULT.size:
            yield _fail("a mutation result is truncated")
            return
        status = _MUTATION_RESULT.unpack_from(value, pos)[1]
        pos += _MUTATION_RESULT.size
        if status == Status.SUCCESS:
            if len(value) - pos < 4:
                yield _fail("a mutation result's value length is truncated")
                return
            pos += 4 + _U32.unpack_from(value, pos)[0]
            if pos > len(value):
                yield _fail("a mutation result's value runs past the end of the reply")
                return


def _single_response_problems(frame: Frame):
    if frame.status in SINGLE_BODY_STATUSES and len(frame.extras) not in (0, 16):
        yield _fail(f"a sub-document reply's extras are 0 or 16 bytes; got {len(frame.extras)}")


def _check_opcode(frame: Frame, opcodes, cls: type, response: bool = False) -> None:
    if frame.magic in (Magic.SERVER_REQUEST, Magic.SERVER_RESPONSE) or frame.opcode not in opcodes or \
            frame.is_response != response:
        kind = "response" if frame.is_response else "request"
        raise ProtocolError(f"{cls.__name__} cannot decode a {rules.opcode_name(frame.opcode)} {kind}",
                            opcode=frame.opcode, opaque=frame.opaque, magic=frame.magic)


# The shapes leave extras and value to the checks, which apply kv_engine's order of rules.
for _op in SINGLE_OPCODES:
    rules.register(_op, Shape(PAGE, extras=None, key=MUST, value=MAY), Shape(PAGE, extras=None, value=MAY))
for _op in MULTI_OPCODES:
    rules.register(_op, Shape(PAGE, extras=None, key=MUST, value=MAY), Shape(PAGE, extras=None, value=MAY))
rules.request_check(*SINGLE_OPCODES)(_single_problems)
rules.request_check(*MULTI_OPCODES)(_multi_problems)
rules.response_check(*SINGLE_OPCODES)(_single_response_problems)
rules.response_check(Opcode.SUBDOC_MULTI_LOOKUP)(_lookup_body_problems)
rules.response_check(Opcode.SUBDOC_MULTI_MUTATION)(_mutation_body_problems)
del _op

#: Request opcode -> type, response opcode -> type of a reply with a body (for kv.decode_kv's `types`).
REQUEST_TYPES: dict[int, type] = {op: SubdocRequest for op in SINGLE_OPCODES}
REQUEST_TYPES[Opcode.SUBDOC_MULTI_LOOKUP] = SubdocMultiLookup
REQUEST_TYPES[Opcode.SUBDOC_MULTI_MUTATION] = SubdocMultiMutation
RESPONSE_TYPES: dict[int, type] = {op: SubdocResponse for op in SINGLE_OPCODES}
RESPONSE_TYPES[Opcode.SUBDOC_MULTI_LOOKUP] = SubdocMultiLookupResponse
RESPONSE_TYPES[Opcode.SUBDOC_MULTI_MUTATION] = SubdocMultiMutationResponse
