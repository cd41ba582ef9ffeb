"""Running sub-document specs against one version of a document: the xattr phase, then the body.

Pages: https://github.com/couchbase/kv_engine/blob/master/docs/SubDocument.md and
docs/ExtendedAttributes.md. kv_engine's order: the xattr specs (which come first in a request) run
on the document's xattrs seen as one JSON object, `{"key": value, ...}`, so an xattr path's first
component is the key; then the body specs run on the body. A lookup runs every spec and reports
each; a mutation stops at its first failing spec and changes nothing.

Virtual xattrs (read-only): `$document` (the version's CAS, vbucket uuid, seqno, revid, exptime,
flags, value_bytes, datatype, deleted, last_modified, value_crc32c), `$vbucket` (its HLC) and
`$XTOC` (the xattr keys). Macros, in an xattr mutation with EXPAND_MACROS: `${Mutation.CAS}`,
`${Mutation.seqno}` and `${Mutation.value_crc32c}` take the new version's values, so they are
written as unique placeholders that `expand_macros` replaces once the store has assigned them;
`${$document...}` takes the current version's value at once.

System xattrs (keys starting with '_') need the caller's say-so (`system_xattrs`): without it a
spec on one answers EACCESS (the whole request when single-path). No engine state is touched here:
`server/subdoc.py` fetches the version, checks the document flags and stores the result.
"""

import base64
import binascii
import json
import secrets
from typing import NamedTuple

from dcpflow.protocol.datatype import Datatype, pack_xattr_pair, pack_xattr_section, split_xattrs, xattr_body_offset
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from dcpflow.protocol.subdoc import (
    MACRO_CAS,
    MACRO_SEQNO,
    MACRO_VALUE_CRC32C,
    TRAITS,
    PathFlag,
    SubdocSpec,
    cas_macro_text,
    is_virtual,
    xattr_key_of,
)

from . import subdoc as paths
from .crc32c import crc32c
from .subdoc import SubdocError

_JSON, _XATTR, _SNAPPY = int(Datatype.JSON), int(Datatype.XATTR), int(Datatype.SNAPPY)
_XATTR_PATH, _BINARY_VALUE, _EXPAND_MACROS, _MKDIR_P = (int(PathFlag.XATTR_PATH), int(PathFlag.BINARY_VALUE),
                                                       int(PathFlag.EXPAND_MACROS), int(PathFlag.MKDIR_P))
_BASE64_PREFIX = "cb-content-base64-encoded:"
_DATATYPE_NAMES = ("raw", "json", "snappy", "json,snappy", "xattr", "json,xattr", "snappy,xattr",
                   "json,snappy,xattr")
_U32 = (1 << 32) - 1


class Meta(NamedTuple):
    """What `$document` and the `${$document...}` macros tell about the version read."""

    cas: int = 0
    vbucket_uuid: int = 0
    seqno: int = 0
    rev_seqno: int = 0
    expiry: int = 0
    flags: int = 0
    datatype: int = 0
    deleted: bool = False


class Result(NamedTuple):
    status: int
    value: bytes = b""


class Lookup(NamedTuple):
    """Every spec's result, in request order, and whether any failed."""

    results: tuple[Result, ...]
    failed: bool


class Mutation(NamedTuple):
    """A successful mutation: the new value and datatype (with macro placeholders still in),
    the values specs return (index, text), whether the whole document was deleted, and the
    placeholders `expand_macros` must fill."""

    value: bytes
    datatype: int
    returned: tuple[tuple[int, bytes], ...]
    delete_document: bool
    macros: tuple[tuple[bytes, bytes], ...]


class Failure(NamedTuple):
    """A mutation that changed nothing: the first failing spec (index, status), or with index None
    a status for the whole request."""

    index: int | None
    status: int
    reason: str = ""


def _hex64(n: int) -> str:
    return f"0x{n & 0xFFFFFFFFFFFFFFFF:016x}"


class _Document:
    """One document version split into an xattr object (text) and a body, as the phases see it."""

    def __init__(self, value: bytes, datatype: int, meta: Meta | None, *, system_xattrs: bool,
                 vbucket_vattr: str | None):
        self.meta = meta
        self.system_xattrs = system_xattrs
        self.vbucket_vattr = vbucket_vattr
        self.datatype = datatype
        if datatype & _XATTR:
            end = xattr_body_offset(value)
            self._section: bytes | None = value[:end]  # the stored xattr section, as it is
            self.body = value[end:]
        else:
            self._section = None
            self.body = value
        self._xattrs_text: str | None = None  # the xattrs as one JSON object, built when a spec needs it
        self.xattrs_changed = False
        self.body_text: str | None = None  # decoded lazily, only for body specs
        self.body_changed = False
        self._crc: int | None = None

    @property
    def xattrs_text(self) -> str:
        if self._xattrs_text is None:
            pairs = split_xattrs(self._section)[0] if self._section is not None else {}
            self._xattrs_text = "{" + ",".join(f'"{k}":{v}' for k, v in pairs.items()) + "}"
        return self._xattrs_text

    @xattrs_text.setter
    def xattrs_text(self, text: str) -> None:
        self._xattrs_text = text

    # -- virtual xattrs ------------------------------------------------------------------------
    def value_crc32c(self) -> int:
        if self._crc is None:
            self._crc = crc32c(self.body)
        return self._crc

    def document_fields(self, with_crc: bool) -> dict:
        meta = self.meta
        if meta is None:
            meta = Meta()
        elif callable(meta):  # built only when a virtual xattr or macro needs it
            meta = self.meta = meta()
        doc = {
            "CAS": _hex64(meta.cas),
            "vbucket_uuid": _hex64(meta.vbucket_uuid),
            "seqno": _hex64(meta.seqno),
            "revid": str(meta.rev_seqno),
            "exptime": meta.expiry,
            "flags": meta.flags,
            "value_bytes": len(self.body),
            "datatype": _DATATYPE_NAMES[meta.datatype & 7].split(","),
            "deleted": meta.deleted,
            "last_modified": str(meta.cas // 1_000_000_000),
        }
        if with_crc:  # a CRC over a large body costs; only paths that can reach it compute it
            doc["value_crc32c"] = f"0x{self.value_crc32c():08x}"
        return doc

    def virtual(self, key: bytes, path: bytes) -> str:
        """The JSON object a virtual-xattr lookup runs on."""
        if key == b"$document":
            wants_crc = path in (b"$document", b"$document.value_crc32c") or not path.startswith(b"$document.")
            return json.dumps({"$document": self.document_fields(wants_crc)}, separators=(",", ":"))
        if key == b"$vbucket":
            if self.vbucket_vattr is None:
                raise SubdocError(Status.NOT_MY_VBUCKET, "the vbucket is not on this node")
            return self.vbucket_vattr
        if key == b"$XTOC":
            keys = [k for k, _ in paths.members(self.xattrs_text) if self.system_xattrs or not k.startswith("_")]
            return json.dumps({"$XTOC": keys}, separators=(",", ":"))
        name = key.decode("utf-8", "replace")
        raise SubdocError(Status.SUBDOC_XATTR_UNKNOWN_VATTR, f"unknown virtual xattr {name!r}")

    def document_macro(self, macro: bytes) -> str:
        """The value of a `${$document...}` macro (the current version's)."""
        name = macro[len(b'"${$document'):-len(b'}"')].decode("utf-8", "replace")
        fields = self.document_fields(with_crc=name in ("", ".value_crc32c"))
        if name == "":
            return json.dumps(fields, separators=(",", ":"))
        if name.startswith(".") and name[1:] in fields:
            return json.dumps(fields[name[1:]], separators=(",", ":"))
        raise SubdocError(Status.SUBDOC_XATTR_UNKNOWN_VATTR_MACRO, f"unknown macro {macro.decode('utf-8', 'replace')}")

    # -- the body --------------------------------------------------------------------------------
    def body_json(self) -> str:
        if self.body_text is None:
            if not self.datatype & _JSON:
                raise SubdocError(Status.SUBDOC_DOC_NOT_JSON, "the document body is not JSON")
            try:
                text = self.body.decode("utf-8")
            except UnicodeDecodeError:
                raise SubdocError(Status.SUBDOC_DOC_NOT_JSON, "the document body is not UTF-8 JSON") from None
            paths.check_depth(text)
            self.body_text = text
        return self.body_text

    def set_body(self, body: bytes, is_json: bool | None = None) -> None:
        self.body, self.body_text, self.body_changed = body, None, True
        if is_json is None:
            is_json = bool(body) and _is_json(body)
        self.datatype = (self.datatype | _JSON) if is_json else (self.datatype & ~_JSON)

    def value(self) -> tuple[bytes, int]:
        """The whole value and datatype as they now stand."""
        body = self.body if self.body_text is None or not self.body_changed else self.body_text.encode("utf-8")
        if not self.xattrs_changed:  # the xattr section as it was
            if self._section is None:
                return body, self.datatype & ~_XATTR
            return self._section + body, self.datatype | _XATTR
        pairs = paths.members(self.xattrs_text)
        if not pairs:
            return body, self.datatype & ~_XATTR
        blob = b"".join(pack_xattr_pair(k.encode("utf-8"), v.encode("utf-8")) for k, v in pairs)
        return pack_xattr_section(blob) + body, self.datatype | _XATTR


def _is_json(data: bytes) -> bool:
    from dcpflow.protocol.datatype import is_json
    return is_json(data)


def _text(value: bytes) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise SubdocError(Status.SUBDOC_VALUE_CANTINSERT, "the value is not UTF-8 JSON") from None


def _binary_get(text: str) -> bytes:
    """A BINARY_VALUE lookup: the bytes of a value stored as `"cb-content-base64-encoded:..."`."""
    if not (text.startswith('"' + _BASE64_PREFIX) and text.endswith('"')):
        raise SubdocError(Status.SUBDOC_FIELD_NOT_BINARY_VALUE, "the field is not a binary value")
    try:
        return base64.b64decode(text[1 + len(_BASE64_PREFIX):-1], validate=True)
    except (binascii.Error, ValueError):
        raise SubdocError(Status.SUBDOC_FIELD_NOT_BINARY_VALUE, "the field is not a binary value") from None


def _binary_set(value: bytes) -> str:
    return '"' + _BASE64_PREFIX + base64.b64encode(value).decode("ascii") + '"'


# ---------------------------------------------------------------------------------------------
# lookups


def lookup(value: bytes, datatype: int, meta, specs: tuple[SubdocSpec, ...], *,
           system_xattrs: bool, vbucket_vattr: str | None = None) -> Lookup:
    """Run lookup specs on a document version (value uncompressed). EACCESS marks every xattr spec
    when one names a system xattr the caller may not read (kv_engine checks the phase as a whole).
    `meta` is the version's Meta, or a callable that makes it (only `$document` needs it)."""
    doc = _Document(value, datatype, meta, system_xattrs=system_xattrs, vbucket_vattr=vbucket_vattr)
    results: list[Result] = []
    denied = not system_xattrs and any(s.flags & _XATTR_PATH and s.path[:1] == b"_" for s in specs)
    failed = False
    for spec in specs:
        if denied and spec.flags & _XATTR_PATH:
            results.append(_DENIED)
            failed = True
            continue
        try:
            results.append(Result(_SUCCESS, _lookup_one(doc, spec)))
        except SubdocError as e:
            results.append(Result(e.status))
            failed = True
    return Lookup(tuple(results), failed)


_SUCCESS = int(Status.SUCCESS)
_DENIED = Result(Status.EACCESS)
_GET_OPS = {int(Opcode.SUBDOC_GET): paths.get, int(Opcode.SUBDOC_GET_COUNT): paths.get_count}


def _lookup_one(doc: _Document, spec: SubdocSpec) -> bytes:
    op = spec.opcode
    if op == Opcode.GET:  # whole body
        if not doc.body:
            raise SubdocError(Status.SUBDOC_PATH_ENOENT, "the document has no body")
        return doc.body
    path = spec.path.decode("utf-8", "replace")
    flags = spec.flags
    if flags & _XATTR_PATH:
        key = xattr_key_of(spec.path)
        target = doc.virtual(key, spec.path) if is_virtual(key) else doc.xattrs_text
    else:
        target = doc.body_json()
    get = _GET_OPS.get(op)
    if get is None:  # EXISTS
        paths.exists(target, path)
        return b""
    found = get(target, path)
    if flags & _BINARY_VALUE:
        return _binary_get(found)
    return found.encode("utf-8")


# ---------------------------------------------------------------------------------------------
# mutations


def mutate(value: bytes, datatype: int, meta: Meta | None, specs: tuple[SubdocSpec, ...], *,
           system_xattrs: bool, mkdir_p: bool = False) -> Mutation | Failure:
    """Run mutation specs on a document version (value uncompressed; for a new document the
    template body, "{}" or "[]", or b"" for whole-document SETs). `mkdir_p` is implied by the
    MKDOC / ADD doc flags."""
    doc = _Document(value, datatype, meta, system_xattrs=system_xattrs, vbucket_vattr=None)
    if not system_xattrs and any(s.flags & _XATTR_PATH and s.path[:1] == b"_" for s in specs):
        first = next(i for i, s in enumerate(specs) if s.flags & _XATTR_PATH)  # kv_engine denies the whole phase
        return Failure(first, Status.EACCESS, "system xattrs need the system xattr write privilege")
    macros: dict[bytes, bytes] = {}
    returned: list[tuple[int, bytes]] = []
    delete_document = False
    for index, spec in enumerate(specs):
        try:
            result = _mutate_one(doc, spec, mkdir_p or bool(spec.flags & _MKDIR_P), macros)
        except SubdocError as e:
            return Failure(index, e.status, e.reason)
        if spec.opcode == Opcode.DELETE:
            delete_document = True
        if result is not None and TRAITS[spec.opcode].returns_value:
            returned.append((index, result.encode("utf-8")))
    if delete_document:
        _keep_only_system_xattrs(doc)
    new_value, new_datatype = doc.value()
    return Mutation(new_value, new_datatype, tuple(returned), delete_document,
                    tuple((placeholder, macro) for macro, placeholder in macros.items()))


def _mutate_one(doc: _Document, spec: SubdocSpec, mkdir_p: bool, macros: dict[bytes, bytes]) -> str | None:
    op = spec.opcode
    if op == Opcode.SET:
        doc.set_body(spec.value)
        return None
    if op == Opcode.DELETE:
        doc.set_body(b"", False)
        return None
    path = spec.path.decode("utf-8", "replace")
    if op == Opcode.SUBDOC_REPLACE_BODY_WITH_XATTR:
        found = paths.get(doc.xattrs_text, path)
        if spec.flags & _BINARY_VALUE:
            doc.set_body(_binary_get(found))
        else:
            doc.set_body(found.encode("utf-8"), True)
        return None
    if spec.flags & _EXPAND_MACROS:
        text = _macro_value(doc, spec.value, macros)
    elif spec.flags & _BINARY_VALUE:
        text = _binary_set(spec.value)
    else:
        text = _text(spec.value)
    if spec.flags & _XATTR_PATH:
        new, result = paths.apply(op, doc.xattrs_text, path, text, mkdir_p)
        doc.xattrs_text, doc.xattrs_changed = new, True
    else:
        new, result = paths.apply(op, doc.body_json(), path, text, mkdir_p)
        doc.body_text, doc.body_changed = new, True
    return result


def _macro_value(doc: _Document, macro: bytes, macros: dict[bytes, bytes]) -> str:
    if macro.startswith(b'"${$document'):
        return doc.document_macro(macro)
    placeholder = macros.get(macro)
    if placeholder is None:
        width = 8 if macro == MACRO_VALUE_CRC32C else 16  # the expanded value's width: same length
        while True:
            placeholder = f'"0x{secrets.token_hex(width // 2)}"'.encode()
            if placeholder not in doc.xattrs_text.encode() and all(placeholder != p for p in macros.values()):
                break
        macros[macro] = placeholder
    return placeholder.decode()


def _keep_only_system_xattrs(doc: _Document) -> None:
    kept = [(k, v) for k, v in paths.members(doc.xattrs_text) if k.startswith("_")]
    doc.xattrs_text = "{" + ",".join(f'"{k}":{v}' for k, v in kept) + "}"
    doc.xattrs_changed = True


def has_system_xattrs(value: bytes, datatype: int) -> bool:
    if not datatype & _XATTR:
        return False
    return any(k.startswith("_") for k in split_xattrs(value)[0])


def expand_macros(value: bytes, datatype: int, macros: tuple[tuple[bytes, bytes], ...], cas: int,
                  seqno: int) -> bytes:
    """The stored value with each macro placeholder replaced by the new version's value. As in
    kv_engine, ${Mutation.CAS} is the CAS's 8 bytes in network order read as a little-endian
    number (what transactions decode), ${Mutation.seqno} the seqno, ${Mutation.value_crc32c} the
    CRC32C of the body, each as a "0x..." hex string of the field's full width."""
    if not macros or not datatype & _XATTR:
        return value
    end = xattr_body_offset(value)
    section, body = value[:end], value[end:]
    for placeholder, macro in macros:
        if macro == MACRO_CAS:
            text = cas_macro_text(cas)
        elif macro == MACRO_SEQNO:
            text = f'"0x{seqno:016x}"'.encode()
        else:
            text = f'"0x{crc32c(body) & _U32:08x}"'.encode()
        section = section.replace(placeholder, text)
    return section + body
