"""Sub-document path operations on JSON text: what Couchbase's subjson library does for memcached.

Page: https://github.com/couchbase/kv_engine/blob/master/docs/SubDocument.md (path syntax, every
command, its errors and the limits). An operation takes the document's text and a path and gives
the value found (lookups) or the new text (mutations), or raises `SubdocError` with the status the
page names. Mutations splice text: every byte the operation does not touch stays as it was (number
formats, whitespace, key order), as subjson's do. No sockets, no engine state: the executor
(`subdoc_document.py`) runs specs over a document's xattrs and body with these.

Paths: subjson's grammar (see `parse_path`): keys separated by '.', array indexes `[n]` after a
key, an index or a '.' (`a[1][2]`, `a.[2]`, `[0].a`), `[-1]` the last element; backticks quote
'.', '[' and ']' (a doubled backtick is a literal one). A component is compared with the raw text
of a document's keys, and written as it is into a new key.

Limits (kv_engine's): at most 31 components (PATH_E2BIG), documents nest at most 32 levels with
the root at level 1 (DOC_E2DEEP; a value that would put anything deeper is VALUE_ETOODEEP), and
counters are signed 64-bit integers.
"""

import functools
import json
import re
from json.decoder import scanstring as _scanstring
from json.scanner import make_scanner

from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

MAX_COMPONENTS = 31
MAX_DEPTH = 32
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class SubdocError(Exception):
    """A path operation failed: `status` is what the spec (or the whole request) answers."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = Status(status)
        self.reason = reason


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


# Numbers are kept as text: nothing is converted, so a 5000-digit integer or 1e999 scans as well
# as any other value (the scanner only has to find where each value ends).
_scan = make_scanner(json.JSONDecoder(parse_int=str, parse_float=str, parse_constant=_reject_constant))
_WS = re.compile(r"[ \t\n\r]*")
_ws = _WS.match
_JSON_WS = " \t\n\r"
_INTEGER = re.compile(r"-?(?:0|[1-9][0-9]*)\Z")
_DELTA = re.compile(r"-?[1-9][0-9]*\Z")
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_INNERMOST_NONEMPTY = re.compile(r"[\[{][^\[\]{}]*[^\[\]{}\s][^\[\]{}]*[\]}]")
_INNERMOST = re.compile(r"[\[{][^\[\]{}]*[\]}]")

#: Path components: ("k", raw key text) or ("i", index; -1 = the last element).
KEY, INDEX = "k", "i"


# ---------------------------------------------------------------------------------------------
# paths


# A path of plain keys only (no quoting, escapes, indexes or characters a JSON string must escape):
# the common case, split without the full scan.
_PLAIN_PATH = re.compile(r'[^.\[\]`"\\\x00-\x1e]+(?:\.[^.\[\]`"\\\x00-\x1e]+)*\Z')
_JSON_ESCAPES = frozenset('"/\\bfnrt')  # what may follow a backslash (not 'u': subjson refuses \u)
_TICKS = re.compile("``?")
_U64 = (1 << 64) - 1


@functools.lru_cache(maxsize=4096)
def parse_path(path: str) -> tuple[tuple[str, str | int], ...]:
    """The components of a path (empty path: the root). PATH_EINVAL for bad syntax, PATH_E2BIG for
    more than MAX_COMPONENTS components. Applications use few distinct paths: they are cached.

    The grammar is subjson's (`subdoc/path.cc`, what memcached runs), rule for rule:
    - A key component runs to the next '.' or '[' outside backticks; a ']' outside backticks, an
      empty key, an unescaped '"' or a character below 0x1f is PATH_EINVAL; a backslash must start
      a JSON escape other than \\u (the component keeps it as written: keys are compared as the
      document spells them).
    - Backticks quote: '.', '[' and ']' between them are literal. A key written wholly between a
      pair of backticks loses them; any other single backtick is dropped and a doubled one stands
      for a literal backtick (`a``b` is a`b, trailing`` is trailing`, `q`x is qx).
    - `[n]` is an index: ASCII digits (leading zeros allowed, an empty `[]` is index 0) or exactly
      `-1` (the last element); anything else is PATH_EINVAL. After ']' comes the end, '[', or a '.'
      that is skipped, so `array.[2]` is `array[2]`, and a single trailing '.' is allowed after any
      component (`a.` is `a`).
    - The 32nd component is PATH_E2BIG, reported when it is reached (a syntax error earlier in the
      path wins).
    """
    if _PLAIN_PATH.match(path):  # keys only, no quoting: the common case
        comps = tuple((KEY, part) for part in path.split("."))
        if len(comps) > MAX_COMPONENTS:
            raise _e2big()
        return comps
    return tuple(_parse_path(path))


def _parse_path(path: str) -> list[tuple[str, str | int]]:
    comps: list[tuple[str, str | int]] = []
    i, n = 0, len(path)
    while i < n:
        if path[i] == "[":
            close = path.find("]", i + 1)
            if close == -1:
                raise _einval(path, "'[' without ']'")
            index = _index(path, path[i + 1:close])
            if len(comps) == MAX_COMPONENTS:
                raise _e2big()
            comps.append((INDEX, index))
            i = close + 1
            if i < n:
                if path[i] == ".":
                    i += 1
                elif path[i] != "[":
                    raise _einval(path, "an index must be followed by '.', '[' or the end")
        else:
            i = _key(path, i, comps)
    return comps


def _key(path: str, i: int, comps: list) -> int:
    """Scan the key component starting at path[i], append it, and return where the next starts."""
    n = len(path)
    quoted = escaped = False
    ticks = 0
    end = j = i
    while j < n:
        ch = path[j]
        if escaped:
            if ch not in _JSON_ESCAPES:
                raise _einval(path, f"'\\{ch}' is not an escape a path may use")
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"' or ch < "\x1f":
            raise _einval(path, f"{ch!r} must be escaped")
        if ch == "`":
            ticks += 1
            quoted = not quoted
        elif not quoted:
            if ch == "]":
                raise _einval(path, "']' without '['")
            if ch == "." or ch == "[":
                end = j
                break
        j += 1
    else:
        if quoted:
            raise _einval(path, "unterminated backtick")
        if escaped:
            raise _einval(path, "a path cannot end with a backslash")
        end = n
    key = path[i:end]
    if len(key) > 1 and key[0] == "`" and key[-1] == "`":
        key = key[1:-1]
        ticks -= 2
    if len(comps) == MAX_COMPONENTS:
        raise _e2big()
    if not key:
        raise _einval(path, "empty component")
    if ticks:
        key = _TICKS.sub(lambda m: m.group()[1:], key)
    comps.append((KEY, key))
    return end + 1 if end < n and path[end] == "." else end


def _index(path: str, text: str) -> int:
    """An array index's value: n >= 0, or -1 for the last element. subjson reads the digits into
    an unsigned 64-bit number, refusing a digit that wraps it below the value so far, and a value
    of 2**64-1 becomes -1 (its signed twin): both are kept, so the same paths work."""
    if text[:1] == "-":
        if text != "-1":
            raise _einval(path, "the only negative index is [-1]")
        return -1
    value = 0
    for ch in text:
        if not "0" <= ch <= "9":
            raise _einval(path, "an array index is [n] with n >= 0, or [-1]")
        nxt = (value * 10 + ord(ch) - 48) & _U64
        if nxt < value:
            raise _einval(path, "the array index overflows 64 bits")
        value = nxt
    return -1 if value == _U64 else value


def _einval(path: str, why: str) -> SubdocError:
    return SubdocError(Status.SUBDOC_PATH_EINVAL, f"path {path[:64]!r}: {why}")


def _e2big() -> SubdocError:
    return SubdocError(Status.SUBDOC_PATH_E2BIG, f"path has more than {MAX_COMPONENTS} components")


def root_for(opcode: int, path: str) -> str:
    """The empty document MKDOC/ADD start from: an array for an array operation on the root or on
    a path that starts with an index, else an object (subjson's get_root_type)."""
    first = path.lstrip(" \t\n\v\f\r")[:1]  # subjson looks at the first non-space character
    if opcode in _ARRAY_OPS and not first or first == "[":
        return "[]"
    return "{}"


# ---------------------------------------------------------------------------------------------
# reading JSON text


def _not_json(why: str = "the document is not valid JSON") -> SubdocError:
    return SubdocError(Status.SUBDOC_DOC_NOT_JSON, why)


#: A member of a container, as a tuple (cheap to make): its raw key (objects; None in arrays),
#: where it starts (its key's quote, or the value), where its value starts and ends.
_Child = tuple
_KEY, _START, _VSTART, _VEND = 0, 1, 2, 3
_WS_CHARS = " \t\n\r"


def _children(s: str, i: int, kind: str | None = None, want: str | int | None = None) -> tuple[list[_Child], int]:
    """The members of the container at s[i] ('{' or '['), read until the one a path component
    names (`kind`, `want`: a key, or an index with -1 for the last) and its position; with no
    component, or none matching, every member and -1. Whitespace is skipped only where there is
    some (the regex call costs more than the test)."""
    out: list[_Child] = []
    obj = s[i] == "{"
    close = "}" if obj else "]"
    ws, blank, scan, scanstring = _ws, _WS_CHARS, _scan, _scanstring
    j = i + 1
    if s[j:j + 1] in blank:
        j = ws(s, j).end()
    if s[j:j + 1] == close:
        return out, -1
    find_key = want if kind == KEY else None
    find_index = want if kind == INDEX and want >= 0 else None
    n = 0
    while True:
        start = j
        key = None
        try:
            if obj:
                if s[j] != '"':
                    raise _not_json()
                kend = scanstring(s, j + 1)[1]
                key = s[j + 1:kend - 1]
                j = kend
                if s[j] != ":":
                    j = ws(s, j).end()
                    if s[j] != ":":
                        raise _not_json()
                j += 1
                if s[j] in blank:
                    j = ws(s, j).end()
            vend = scan(s, j)[1]
        except (StopIteration, ValueError, IndexError):
            raise _not_json() from None
        except RecursionError:
            raise SubdocError(Status.SUBDOC_DOC_E2DEEP, "the document nests too deeply") from None
        out.append((key, start, j, vend))
        if (find_key is not None and key == find_key) or n == find_index:
            return out, n
        n += 1
        j = vend
        c = s[j:j + 1]
        if c in blank:
            j = ws(s, j).end()
            c = s[j:j + 1]
        if c == ",":
            j += 1
            if s[j:j + 1] in blank:
                j = ws(s, j).end()
        elif c == close:
            return out, (n - 1 if kind == INDEX and want == -1 else -1)
        else:
            raise _not_json()


def _close_of(s: str, i: int, children: list[_Child]) -> int:
    """Where the closing bracket of the container at s[i] is."""
    j = children[-1][_VEND] if children else i + 1
    return _ws(s, j).end()


def _root(s: str) -> tuple[int, int]:
    start = _ws(s).end() if s[:1] in _WS_CHARS else 0
    end = len(s)
    while end and s[end - 1] in _WS_CHARS:
        end -= 1
    if start >= end:
        raise _not_json("the document is empty")
    return start, end


def depth(text: str) -> int:
    """How many levels a JSON value spans: a scalar or an empty container 1, a container 1 more
    than its deepest member. Innermost containers are folded away one level per pass (C regex
    passes, as many as the value has levels)."""
    if "[" not in text and "{" not in text:
        return 1
    s = _STRINGS.sub("0", text)
    s = _INNERMOST_NONEMPTY.sub("[[]]", s)  # a non-empty innermost container holds one more level
    levels = 0
    while "[" in s or "{" in s:
        s = _INNERMOST.sub("0", s)
        levels += 1
        if levels > MAX_DEPTH + 1:
            break
    return max(levels, 1)


def check_depth(text: str) -> None:
    """DOC_E2DEEP for a document deeper than MAX_DEPTH; free for one with fewer brackets than that."""
    if text.count("{") + text.count("[") >= MAX_DEPTH and depth(text) > MAX_DEPTH:
        raise SubdocError(Status.SUBDOC_DOC_E2DEEP, f"the document nests more than {MAX_DEPTH} levels")


# ---------------------------------------------------------------------------------------------
# walking a path


class _Found:
    """Where a walk ended: `span` is the value at the full path when `complete`, else the deepest
    existing container (`level` components matched) with `children` listed."""

    __slots__ = ("complete", "level", "span", "children", "parent", "index")

    def __init__(self):
        self.complete = False
        self.level = 0
        self.span = (0, 0)
        self.children: list[_Child] | None = None
        self.parent = (0, 0)  # the container holding the value at the full path
        self.index = -1  # the value's position among the parent's members


def _walk(s: str, comps) -> _Found:
    found = _Found()
    span = _root(s)
    for level, (kind, want) in enumerate(comps):
        start = span[0]
        c = s[start]
        if c not in "{[":
            raise SubdocError(Status.SUBDOC_PATH_MISMATCH, "a path component goes into a value that is not an "
                              "object or an array")
        if (kind == KEY) != (c == "{"):
            raise SubdocError(Status.SUBDOC_PATH_MISMATCH, "an index names a member of an object, or a key a "
                              "member of an array")
        children, pos = _children(s, start, kind, want)
        if pos < 0:
            found.level, found.span, found.children = level, span, children
            return found
        found.parent, found.index = span, pos
        child = children[pos]
        span = (child[_VSTART], child[_VEND])
    found.complete = True
    found.level = len(comps)
    found.span = span
    return found


def _all_children(s: str, container: tuple[int, int]) -> list[_Child]:
    return _children(s, container[0])[0]


def _enoent(path: str) -> SubdocError:
    return SubdocError(Status.SUBDOC_PATH_ENOENT, f"path {path[:64]!r} does not exist")


# ---------------------------------------------------------------------------------------------
# lookups


def _locate(doc: str, path: str) -> tuple[int, int]:
    """Where the value at an existing path is (PATH_ENOENT if it is not there): `_walk` for the
    lookups, without the bookkeeping a mutation needs (keys are matched without listing the
    members before them)."""
    start, end = _root(doc)
    for kind, want in parse_path(path):
        c = doc[start]
        if c != "{" and c != "[":
            raise SubdocError(Status.SUBDOC_PATH_MISMATCH, "a path component goes into a value that is not an "
                              "object or an array")
        if (kind == KEY) != (c == "{"):
            raise SubdocError(Status.SUBDOC_PATH_MISMATCH, "an index names a member of an object, or a key a "
                              "member of an array")
        span = _member_span(doc, start, want) if kind == KEY else None
        if span is None:
            children, pos = _children(doc, start, kind, want)
            if pos < 0:
                raise _enoent(path)
            span = children[pos][_VSTART], children[pos][_VEND]
        elif span[0] < 0:
            raise _enoent(path)
        start, end = span
    return start, end


def _member_span(s: str, i: int, want: str) -> tuple[int, int] | None:
    """The value span of key `want` in the object at s[i] ((-1, -1): no such key); None when the
    object has whitespace between its tokens or something wrong (then `_children` reads it)."""
    j = i + 1
    if s[j] == "}":
        return -1, -1
    scan, scanstring = _scan, _scanstring
    try:
        while True:
            if s[j] != '"':
                return None
            kend = scanstring(s, j + 1)[1]
            if s[kend] != ":":
                return None
            vend = scan(s, kend + 1)[1]
            if s[j + 1:kend - 1] == want:
                return kend + 1, vend
            c = s[vend]
            if c == ",":
                j = vend + 1
            elif c == "}":
                return -1, -1
            else:
                return None
    except (StopIteration, ValueError, IndexError, RecursionError):
        return None  # whitespace, or a problem `_children` reports with its status


def get(doc: str, path: str) -> str:
    """SUBDOC_GET: the text of the value at `path` (as the document spells it)."""
    start, end = _locate(doc, path)
    return doc[start:end]


def exists(doc: str, path: str) -> None:
    get(doc, path)


def get_count(doc: str, path: str) -> str:
    """SUBDOC_GET_COUNT: the number of members of the array or object at `path`, as text."""
    start = _locate(doc, path)[0]
    if doc[start] not in "{[":
        raise SubdocError(Status.SUBDOC_PATH_MISMATCH, f"path {path[:64]!r} is not an array or an object")
    return str(len(_children(doc, start)[0]))


# ---------------------------------------------------------------------------------------------
# mutations


def _check_value(value: str, max_depth: int, *, many: bool = False) -> str:
    """A value to insert: one JSON value (or, `many`, a comma-separated list of them, as for the
    array operations); VALUE_CANTINSERT if it is not, VALUE_ETOODEEP if it spans more levels than
    fit where it goes."""
    text = value.strip(_JSON_WS)
    probe = f"[{text}]" if many else text
    if not text:
        raise SubdocError(Status.SUBDOC_VALUE_CANTINSERT, "the value is empty")
    try:
        end = _scan(probe, 0)[1]
    except (StopIteration, ValueError, RecursionError):
        end = -1
    if end != len(probe):
        what = "one or more comma-separated JSON values" if many else "one JSON value"
        raise SubdocError(Status.SUBDOC_VALUE_CANTINSERT, f"the value is not {what}")
    levels = depth(probe) - 1 if many else depth(probe)
    if levels > max_depth:
        raise SubdocError(Status.SUBDOC_VALUE_ETOODEEP, f"the value would nest the document deeper than "
                          f"{MAX_DEPTH} levels")
    return text


def _key_text(key: str) -> str:
    """A path component written as a new key: it must make a valid JSON string."""
    text = f'"{key}"'
    try:
        end = _scanstring(text, 1)[1]
    except ValueError:
        end = -1
    if end != len(text):
        raise SubdocError(Status.SUBDOC_PATH_EINVAL, f"component {key[:32]!r} is not a valid JSON key") from None
    return key


def _insert_member(doc: str, container: tuple[int, int], children: list[_Child], text: str,
                   at: int | None = None) -> str:
    """Insert `text` (a member: `"key":value` or array values) into a container, before member `at`
    (None: at the end)."""
    start = container[0]
    if at is not None and at < len(children):
        pos = children[at][_START]
        return f"{doc[:pos]}{text},{doc[pos:]}"
    if children:
        pos = children[-1][_VEND]
        return f"{doc[:pos]},{text}{doc[pos:]}"
    pos = _close_of(doc, start, children)
    return f"{doc[:start + 1]}{text}{doc[pos:]}"


def _mkdir(comps, found: _Found, leaf: str) -> str:
    """The text that creates the missing components (from `found.level` on) as nested objects
    around `leaf`. Only keys can be created: a missing array element is PATH_ENOENT."""
    missing = comps[found.level:]
    if any(kind != KEY for kind, _ in missing):
        raise SubdocError(Status.SUBDOC_PATH_ENOENT, "only dictionary keys can be created: a missing array "
                          "element cannot")
    text = leaf
    for _, key in reversed(missing[1:]):
        text = f'{{"{_key_text(key)}":{text}}}'
    return f'"{_key_text(missing[0][1])}":{text}'


def _parent_container(doc: str, comps, found: _Found, path: str, mkdir_p: bool, leaf: str) -> str | None:
    """For a missing final component: the new document when it can be created here, else raises."""
    if found.level == len(comps) - 1:
        return None  # the immediate parent exists: the caller adds the member
    if not mkdir_p:
        raise _enoent(path)
    if doc[found.span[0]] != "{":
        raise _enoent(path)
    return _insert_member(doc, found.span, found.children, _mkdir(comps, found, leaf))


def _level_room(comps) -> int:
    """How many levels a value may span at the end of this path."""
    return MAX_DEPTH - len(comps)


def dict_add(doc: str, path: str, value: str, mkdir_p: bool = False, *, upsert: bool = False) -> str:
    """SUBDOC_DICT_ADD / DICT_UPSERT: set `"key":value` in the object the path's last key names."""
    comps = parse_path(path)
    if not comps:
        raise SubdocError(Status.SUBDOC_VALUE_CANTINSERT, "the root cannot be added")
    if comps[-1][0] != KEY:
        raise SubdocError(Status.SUBDOC_PATH_EINVAL, "a dictionary operation's path must end with a key")
    text = _check_value(value, _level_room(comps))
    found = _walk(doc, comps)
    if found.complete:
        if not upsert:
            raise SubdocError(Status.SUBDOC_PATH_EEXISTS, f"path {path[:64]!r} already exists")
        vstart, vend = found.span
        return f"{doc[:vstart]}{text}{doc[vend:]}"
    created = _parent_container(doc, comps, found, path, mkdir_p, text)
    if created is not None:
        return created
    if doc[found.span[0]] != "{":
        raise SubdocError(Status.SUBDOC_PATH_MISMATCH, "the parent is not an object")
    return _insert_member(doc, found.span, found.children, f'"{_key_text(comps[-1][1])}":{text}')


def replace(doc: str, path: str, value: str) -> str:
    """SUBDOC_REPLACE: the value at an existing path becomes `value`."""
    comps = parse_path(path)
    if not comps:
        raise SubdocError(Status.SUBDOC_VALUE_CANTINSERT, "the root cannot be replaced by a path operation")
    text = _check_value(value, _level_room(comps))
    found = _walk(doc, comps)
    if not found.complete:
        raise _enoent(path)
    vstart, vend = found.span
    return f"{doc[:vstart]}{text}{doc[vend:]}"


def remove(doc: str, path: str) -> str:
    """SUBDOC_DELETE: remove the member at `path` (and the comma beside it)."""
    comps = parse_path(path)
    if not comps:
        raise SubdocError(Status.SUBDOC_VALUE_CANTINSERT, "the root cannot be removed by a path operation")
    found = _walk(doc, comps)
    if not found.complete:
        raise _enoent(path)
    children, pos = _all_children(doc, found.parent), found.index
    child = children[pos]
    if pos + 1 < len(children):
        return doc[:child[_START]] + doc[children[pos + 1][_START]:]
    if pos > 0:
        return doc[:children[pos - 1][_VEND]] + doc[child[_VEND]:]
    return doc[:child[_START]] + doc[child[_VEND]:]


_ARRAY_OPS = frozenset((Opcode.SUBDOC_ARRAY_PUSH_LAST, Opcode.SUBDOC_ARRAY_PUSH_FIRST,
                        Opcode.SUBDOC_ARRAY_ADD_UNIQUE))


def _array_at(doc: str, comps, path: str, mkdir_p: bool, text: str) -> tuple[str | None, _Found]:
    """The array at `path` (found.span), or the new document if it was created (mkdir_p)."""
    found = _walk(doc, comps)
    if found.complete:
        if doc[found.span[0]] != "[":
            raise SubdocError(Status.SUBDOC_PATH_MISMATCH, f"path {path[:64]!r} is not an array")
        return None, found
    if not mkdir_p:
        raise _enoent(path)
    if doc[found.span[0]] != "{":
        raise _enoent(path)
    return _insert_member(doc, found.span, found.children, _mkdir(comps, found, f"[{text}]")), found


def array_push(doc: str, path: str, value: str, mkdir_p: bool = False, *, first: bool = False) -> str:
    """SUBDOC_ARRAY_PUSH_LAST / PUSH_FIRST: one or more comma-separated values at the end / the
    start of the array at `path` (empty path: the document is the array)."""
    comps = parse_path(path)
    text = _check_value(value, _level_room(comps) - 1, many=True)
    created, found = _array_at(doc, comps, path, mkdir_p, text)
    if created is not None:
        return created
    return _insert_member(doc, found.span, _all_children(doc, found.span), text, 0 if first else None)


def array_insert(doc: str, path: str, value: str) -> str:
    """SUBDOC_ARRAY_INSERT: values at position n of the array (`path` ends with `[n]`, n >= 0, at
    most the array's length)."""
    comps = parse_path(path)
    if not comps or comps[-1][0] != INDEX:
        raise SubdocError(Status.SUBDOC_PATH_EINVAL, "ARRAY_INSERT's path must end with an array index")
    index = comps[-1][1]
    if index < 0:
        raise SubdocError(Status.SUBDOC_PATH_EINVAL, "ARRAY_INSERT takes no negative index")
    text = _check_value(value, _level_room(comps), many=True)
    parent_comps = comps[:-1]
    found = _walk(doc, parent_comps)
    if not found.complete:
        raise _enoent(path)
    start = found.span[0]
    if doc[start] != "[":
        raise SubdocError(Status.SUBDOC_PATH_MISMATCH, "ARRAY_INSERT's parent is not an array")
    children = _all_children(doc, found.span)
    if index > len(children):
        raise _enoent(path)
    return _insert_member(doc, found.span, children, text, index)


def array_add_unique(doc: str, path: str, value: str, mkdir_p: bool = False) -> str:
    """SUBDOC_ARRAY_ADD_UNIQUE: append one JSON primitive unless the array already holds the same
    text (string comparison: "1" != 1 != 1.0). PATH_MISMATCH if the array holds a non-primitive
    before any equal element."""
    comps = parse_path(path)
    text = _check_value(value, _level_room(comps) - 1, many=True)
    if text[0] in "[{" or _scan(text, 0)[1] != len(text):
        raise SubdocError(Status.SUBDOC_VALUE_CANTINSERT, "ARRAY_ADD_UNIQUE takes one JSON primitive")
    created, found = _array_at(doc, comps, path, mkdir_p, text)
    if created is not None:
        return created
    children = _all_children(doc, found.span)
    for child in children:
        element = doc[child[_VSTART]:child[_VEND]]
        if element[0] in "[{":
            raise SubdocError(Status.SUBDOC_PATH_MISMATCH, "the array holds a non-primitive element: uniqueness "
                              "cannot be decided")
        if element == text:
            raise SubdocError(Status.SUBDOC_PATH_EEXISTS, "the value is already in the array")
    return _insert_member(doc, found.span, children, text)


def counter(doc: str, path: str, delta: str, mkdir_p: bool = False) -> tuple[str, str]:
    """SUBDOC_COUNTER: add the signed 64-bit integer `delta` (not 0) to the integer at `path`, or
    create it with `delta`; returns (new document, the new value's text)."""
    if not _DELTA.match(delta) or not _INT64_MIN <= int(delta) <= _INT64_MAX:
        raise SubdocError(Status.SUBDOC_DELTA_EINVAL, "the delta must be a non-zero signed 64-bit integer")
    step = int(delta)
    comps = parse_path(path)
    if not comps:
        raise SubdocError(Status.SUBDOC_VALUE_CANTINSERT, "the root cannot be a counter")
    found = _walk(doc, comps)
    if found.complete:
        vstart, vend = found.span
        current = doc[vstart:vend]
        if not _INTEGER.match(current):
            raise SubdocError(Status.SUBDOC_PATH_MISMATCH, f"path {path[:64]!r} is not an integer")
        number = int(current)
        if not _INT64_MIN <= number <= _INT64_MAX:
            raise SubdocError(Status.SUBDOC_NUM_ERANGE, "the existing number is not a signed 64-bit integer")
        result = number + step
        if not _INT64_MIN <= result <= _INT64_MAX:
            raise SubdocError(Status.SUBDOC_VALUE_CANTINSERT, "the counter would overflow a signed 64-bit integer")
        text = str(result)
        return f"{doc[:vstart]}{text}{doc[vend:]}", text
    text = str(step)
    if comps[-1][0] != KEY:
        raise _enoent(path)
    created = _parent_container(doc, comps, found, path, mkdir_p, text)
    if created is not None:
        return created, text
    if doc[found.span[0]] != "{":
        raise _enoent(path)
    return _insert_member(doc, found.span, found.children, f'"{_key_text(comps[-1][1])}":{text}'), text


#: One entry point per path opcode: (doc, path, value, mkdir_p) -> (new doc or None, result or None).
def apply(opcode: int, doc: str, path: str, value: str = "", mkdir_p: bool = False) -> tuple[str | None, str | None]:
    """Run one path operation: lookups give (None, value text or None for EXISTS); mutations (new
    document, the value a COUNTER returns or None)."""
    if opcode == Opcode.SUBDOC_GET:
        return None, get(doc, path)
    if opcode == Opcode.SUBDOC_EXISTS:
        exists(doc, path)
        return None, None
    if opcode == Opcode.SUBDOC_GET_COUNT:
        return None, get_count(doc, path)
    if opcode == Opcode.SUBDOC_DICT_ADD:
        return dict_add(doc, path, value, mkdir_p), None
    if opcode == Opcode.SUBDOC_DICT_UPSERT:
        return dict_add(doc, path, value, mkdir_p, upsert=True), None
    if opcode == Opcode.SUBDOC_REPLACE:
        return replace(doc, path, value), None
    if opcode == Opcode.SUBDOC_DELETE:
        return remove(doc, path), None
    if opcode == Opcode.SUBDOC_ARRAY_PUSH_LAST:
        return array_push(doc, path, value, mkdir_p), None
    if opcode == Opcode.SUBDOC_ARRAY_PUSH_FIRST:
        return array_push(doc, path, value, mkdir_p, first=True), None
    if opcode == Opcode.SUBDOC_ARRAY_INSERT:
        return array_insert(doc, path, value), None
    if opcode == Opcode.SUBDOC_ARRAY_ADD_UNIQUE:
        return array_add_unique(doc, path, value, mkdir_p), None
    if opcode == Opcode.SUBDOC_COUNTER:
        return counter(doc, path, value, mkdir_p)
    raise SubdocError(Status.EINVAL, f"opcode 0x{opcode:02x} is not a path operation")


def members(doc: str) -> list[tuple[str, str]]:
    """(raw key, value text) of each member of a JSON object's text (the xattr section's view)."""
    start, _ = _root(doc)
    if doc[start] != "{":
        raise _not_json("expected an object")
    return [(c[_KEY], doc[c[_VSTART]:c[_VEND]]) for c in _children(doc, start)[0]]
