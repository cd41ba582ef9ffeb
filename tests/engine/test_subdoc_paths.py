"""Sub-document path syntax: subjson's parser, which memcached runs for every sub-document path.

Reference: https://github.com/couchbase/subjson/blob/master/subdoc/path.cc (the grammar) and
tests/t_path.cc (its own cases, repeated here), with the limits of
https://github.com/couchbase/kv_engine/blob/master/docs/SubDocument.md#limits (32 components
counting the root: 31 in a path, the 32nd is PATH_E2BIG). The official SDKs rely on the grammar's
looser corners: their own tests write `array.[2]` for `array[2]`
(couchbase-python-client couchbase/tests/subdoc_t.py, test_array_insert).
"""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcpflow.engine import subdoc as sd
from dcpflow.engine.subdoc import INDEX, KEY, MAX_COMPONENTS, SubdocError
from dcpflow.protocol.status import Status

S = Status


def outcome(path: str):
    try:
        return sd.parse_path(path)
    except SubdocError as e:
        return e.status


def keys(*names):
    return tuple((KEY, n) for n in names)


@pytest.mark.parametrize("path, comps", [
    # subjson tests/t_path.cc
    ("foo.bar.baz", keys("foo", "bar", "baz")),
    ("array[1].item[9]", ((KEY, "array"), (INDEX, 1), (KEY, "item"), (INDEX, 9))),
    ("foo[0][0][0]", ((KEY, "foo"), (INDEX, 0), (INDEX, 0), (INDEX, 0))),
    ("[1][2][3]", ((INDEX, 1), (INDEX, 2), (INDEX, 3))),
    ("`simple`.`escaped`.`path`", keys("simple", "escaped", "path")),
    ("escaped.`arr.idx`[9]", ((KEY, "escaped"), (KEY, "arr.idx"), (INDEX, 9))),
    ("`BACKTICK``HAPPY`.`CAMPER`", keys("BACKTICK`HAPPY", "CAMPER")),
    ("trailing``", keys("trailing`")),
    ("foo[-1][-1][-1]", ((KEY, "foo"), (INDEX, -1), (INDEX, -1), (INDEX, -1))),
    ('\\"quoted.path', keys('\\"quoted', "path")),  # a JSON escape stays as written
    ("F\u00fatbol", keys("F\u00fatbol")),
    # the SDK's own tests: an index after a '.'
    ("array.[2]", ((KEY, "array"), (INDEX, 2))),
    ("xattr_array.[0]", ((KEY, "xattr_array"), (INDEX, 0))),
    ("a.[1].[2].b", ((KEY, "a"), (INDEX, 1), (INDEX, 2), (KEY, "b"))),
    ("a[1].[2]", ((KEY, "a"), (INDEX, 1), (INDEX, 2))),
    ("[0].a", ((INDEX, 0), (KEY, "a"))),
    # one trailing '.' after a key or an index is skipped
    ("a.", keys("a")), ("a[1].", ((KEY, "a"), (INDEX, 1))), ("[3].", ((INDEX, 3),)),
    # backticks quote wherever they stand; lone ones are dropped, doubled ones are literal
    ("a`.`b", keys("a.b")), ("`q`x", keys("qx")), ("`a]`[0]", ((KEY, "a]"), (INDEX, 0))),
    ("````", keys("`")), ("`[1]`", keys("[1]")),
    # indexes: leading zeros, the empty index is 0, 2**64-1 is -1 (subjson's signed reading)
    ("a[007]", ((KEY, "a"), (INDEX, 7))), ("a[]", ((KEY, "a"), (INDEX, 0))),
    ("a[18446744073709551615]", ((KEY, "a"), (INDEX, -1))),
    ("a[18446744073709551614]", ((KEY, "a"), (INDEX, 2**64 - 2))),
    # JSON escapes and characters a JSON string may hold unescaped
    ("a\\n\\t\\/\\\\b", keys("a\\n\\t\\/\\\\b")), ("a\x1fb c", keys("a\x1fb c")),
    ("", ()),
])
def test_accepted_paths(path, comps):
    assert sd.parse_path(path) == comps


@pytest.mark.parametrize("path", [
    # subjson tests/t_path.cc
    "....", "foo[-2]", "hello[0]world", "[not][a][number]", '"invalid.path',
    # empty components
    ".a", "a..b", "a[0]..", ".", ".[1]", "``", "a.``",
    # brackets
    "a[", "a[1", "a]", "a[1]]", "a[x]", "a[-0]", "a[+1]", "a[ 1]", "a[1 ]", "a[[1]]", "a[1]b", "a[0]`b`",
    "a[\u0661]",  # a non-ASCII digit
    # quoting
    "`open", "a`b", "`a`b`",
    # what a JSON string must escape
    'a"b', "a\x00", "a\nb", "a\x1e", "a\\", "a\\u0041", "a\\x", "`a\\q`",
    # an index that overflows 64 bits
    "a[18446744073709551616]", "a[99999999999999999999]",
])
def test_invalid_paths(path):
    assert outcome(path) == S.SUBDOC_PATH_EINVAL


def test_the_component_limit():
    """At most 31 components; the 32nd is E2BIG when the parser reaches it, so a syntax error
    found first (even inside the 32nd key) is EINVAL, and an empty 32nd key is E2BIG."""
    assert len(sd.parse_path(".".join(["a"] * MAX_COMPONENTS))) == MAX_COMPONENTS
    assert len(sd.parse_path("[0]" * MAX_COMPONENTS)) == MAX_COMPONENTS
    assert len(sd.parse_path("a" + "[0]" * (MAX_COMPONENTS - 1) + ".")) == MAX_COMPONENTS
    full = ".".join(["a"] * MAX_COMPONENTS)
    assert outcome(full + ".a") == S.SUBDOC_PATH_E2BIG
    assert outcome(full + ".[0]") == S.SUBDOC_PATH_E2BIG
    assert outcome("[0]" * (MAX_COMPONENTS + 1)) == S.SUBDOC_PATH_E2BIG
    assert outcome(full + "..") == S.SUBDOC_PATH_E2BIG
    assert outcome(full + '.a"') == S.SUBDOC_PATH_EINVAL
    assert outcome(full + "[x]") == S.SUBDOC_PATH_EINVAL
    assert outcome(full + "[1") == S.SUBDOC_PATH_EINVAL
    assert outcome("a..b." + ".".join(["a"] * 40)) == S.SUBDOC_PATH_EINVAL


# ---------------------------------------------------------------------------------------------
# properties: any list of components, written in any of the ways the grammar allows, reads back


_plain = st.characters(codec="utf-8", min_codepoint=0x1f, exclude_characters='"\\`.[]')
_token = st.one_of(_plain, _plain, _plain, st.sampled_from([".", "[", "]", "`", '\\"', "\\\\", "\\/", "\\b",
                                                             "\\f", "\\n", "\\r", "\\t"]))
_key = st.lists(_token, min_size=1, max_size=8).map("".join)
_index = st.one_of(st.just(-1), st.integers(0, 20), st.integers(0, 2**64 - 2))
_RUNS = re.compile(r"[.\[\]`]+|[^.\[\]`]+")
_META = re.compile(r"[.\[\]]")
component = st.one_of(st.tuples(st.just(KEY), _key), st.tuples(st.just(INDEX), _index))


@st.composite
def written(draw, comps):
    """One spelling of `comps`: keys quoted whole or piece by piece (or bare when they can be),
    indexes with leading zeros or not, a '.' before an index or not, a trailing '.' or not."""
    out = ""
    for kind, want in comps:
        if kind == INDEX:
            digits = "-1" if want == -1 else "0" * draw(st.integers(0, 2)) + str(want)
            out += ("." if out and draw(st.booleans()) else "") + f"[{digits}]"
            continue
        whole = "`" + want.replace("`", "``") + "`"
        # piece by piece: each run of '.', '[', ']' and backticks quoted (backticks doubled) when it
        # holds a metacharacter. subjson turns each run of n backticks into n // 2 literal ones, so
        # two quoted pieces must never touch: runs are maximal.
        pieces = "".join(f"`{run.replace('`', '``')}`" if _META.search(run) else run.replace("`", "``")
                         for run in _RUNS.findall(want))
        style = draw(st.sampled_from(["whole", "pieces"]))
        text = whole if style == "whole" or (pieces[0] == "`" and pieces[-1] == "`") else pieces
        out += ("." if out else "") + text
    if out and draw(st.booleans()):
        out += "."
    return out


@settings(max_examples=400, deadline=None)
@given(st.lists(component, max_size=MAX_COMPONENTS + 3).flatmap(lambda c: st.tuples(st.just(c), written(c))))
def test_every_spelling_reads_back(case):
    comps, path = case
    expected = tuple(comps) if len(comps) <= MAX_COMPONENTS else S.SUBDOC_PATH_E2BIG
    assert outcome(path) == expected


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.sampled_from('ab.[]`"\\-019n\x01 '), max_size=24))
def test_any_text_is_read_or_refused_with_a_path_status(path):
    """Never another exception; the shortcut for plain keys agrees with the full scan; a key never
    comes out empty; indexes are -1 or above."""
    got = outcome(path)
    try:
        full = tuple(sd._parse_path(path))
    except SubdocError as e:
        full = e.status
    assert got == full
    if isinstance(got, tuple):
        assert all(want for kind, want in got if kind == KEY)
        assert all(want >= -1 for kind, want in got if kind == INDEX)
    else:
        assert got in (S.SUBDOC_PATH_EINVAL, S.SUBDOC_PATH_E2BIG)


def test_lookups_and_mutations_take_the_sdks_paths():
    """The grammar reaches the operations: the SDK tests' documents and paths."""
    doc = '{"array":[1,2,3,4,5]}'
    assert sd.get(doc, "array.[2]") == "3"
    assert sd.get(doc, "array.[-1]") == "5"
    assert sd.get('{"m":[[0,1],[2,[3]]]}', "m[1].[1][0]") == "3"
    assert sd.get('{"a.b":{"c`d":7}}', "`a.b`.`c``d`") == "7"
    assert sd.array_insert(doc, "array.[2]", "10") == '{"array":[1,2,10,3,4,5]}'
    assert sd.array_insert(doc, "array.[3]", "6,7,8") == '{"array":[1,2,3,6,7,8,4,5]}'
    assert sd.array_insert("[]", "[0]", "1") == "[1]"
    assert sd.dict_add("{}", "`x.y`.", "1") == '{"x.y":1}'
    assert sd.root_for(sd.Opcode.SUBDOC_ARRAY_PUSH_LAST, "  ") == "[]"
    assert sd.root_for(sd.Opcode.SUBDOC_DICT_UPSERT, " [0]") == "[]"
