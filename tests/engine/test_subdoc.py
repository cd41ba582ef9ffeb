"""The sub-document path engine (engine/subdoc.py) against SubDocument.md: paths, every operation and
error, the limits; and a model-based property test: random mutation sequences give the same
document (and the same errors) as a plain Python model of the JSON edits."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcpflow.engine import subdoc as sd
from dcpflow.engine.subdoc import SubdocError
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

S = Status

#: The page's example document ("Path" section).
PAGE_DOC = json.dumps({
    "type": "product", "pType": "toy", "pName": "Tickle Me Elmo", "pDetails": {"audience": "children"},
    "pDistributors": [{"dName": "Going Out of Business Wholesale", "dAdded": ["Feb", 36, 2025]},
                      {"dName": "Everything Must Go!", "dAdded": ["May", 72, 1492]}],
    "dot.ted.field": None, "back`tick`field": None, 'field.with."quotes"': None}, indent=2)


def status_of(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except SubdocError as e:
        return e.status
    return S.SUCCESS


@pytest.mark.parametrize("path, value", [
    ("type", '"product"'),
    ("pDistributors[0].dName", '"Going Out of Business Wholesale"'),
    ("pDistributors[1].dAdded[2]", "1492"),
    ("`dot.ted.field`", "null"),
    ("`back``tick``field`", "null"),
    ('`field.with.\\"quotes\\"`', "null"),
    ("pDistributors[-1].dAdded[-1]", "1492"),
    ("pDetails", '{\n    "audience": "children"\n  }'),  # the document's own text
])
def test_the_pages_path_table(path, value):
    assert sd.get(PAGE_DOC, path) == value


@pytest.mark.parametrize("path, status", [
    ("pDistributors.count", S.SUBDOC_PATH_MISMATCH),  # an array member named by key
    ("pType.category", S.SUBDOC_PATH_MISMATCH),  # a string treated as an object
    ("pDetails[0]", S.SUBDOC_PATH_MISMATCH),  # an object member named by index
    ("pDetails.missing", S.SUBDOC_PATH_ENOENT),
    ("pDistributors[5]", S.SUBDOC_PATH_ENOENT),
    ("a..b", S.SUBDOC_PATH_EINVAL), (".a", S.SUBDOC_PATH_EINVAL), ("a[", S.SUBDOC_PATH_EINVAL),
    ("a[x]", S.SUBDOC_PATH_EINVAL), ("a[-2]", S.SUBDOC_PATH_EINVAL), ("a]", S.SUBDOC_PATH_EINVAL),
    ("a[0]b", S.SUBDOC_PATH_EINVAL), ("`open", S.SUBDOC_PATH_EINVAL),
    (".".join(["a"] * 32), S.SUBDOC_PATH_E2BIG),
    # subjson accepts these (tests/engine/test_subdoc_paths.py has the grammar): found or not found
    ("pDistributors.[1].dAdded.[2].", S.SUCCESS), ("`pType`x", S.SUBDOC_PATH_ENOENT),
])
def test_path_errors(path, status):
    assert status_of(sd.get, PAGE_DOC, path) == status


def nested_dict(levels: int) -> str:
    doc = "{}"
    for n in range(levels - 1, 0, -1):
        doc = f'{{"{n}":{doc}}}'
    return doc


def nested_array(levels: int) -> str:
    return "[" * (levels - 1) + "[]" + "]" * (levels - 1)


def test_depth_limits():
    """kv_engine: a 32-level document is read with a 31-component path; 33 levels is DOC_E2DEEP,
    and a value that would reach level 33 is VALUE_ETOODEEP."""
    deepest = ".".join(str(n) for n in range(1, 32))
    assert sd.get(nested_dict(32), deepest) == "{}"
    assert status_of(sd.get, nested_dict(33), deepest + ".32") == S.SUBDOC_PATH_E2BIG
    assert status_of(sd.check_depth, nested_dict(33)) == S.SUBDOC_DOC_E2DEEP
    sd.check_depth(nested_dict(32))
    path = "[0]" * 31
    doc = nested_array(32)
    assert sd.get(doc, path) == "[]"
    assert sd.get(sd.replace(doc, path, '"deep"'), path) == '"deep"'
    assert status_of(sd.replace, doc, path, "[0]") == S.SUBDOC_VALUE_ETOODEEP
    assert sd.get(sd.replace(doc, "[0]", "[]"), "[0]") == "[]"
    assert [sd.depth(t) for t in ("1", "[]", "[1]", '{"a":{}}', "[[1],[]]", '["[[["]', "[ ]")] == [1, 1, 2, 2, 3, 2, 1]


def test_dictionary_operations():
    doc = '{"a": {"b": 1}}'
    assert sd.dict_add(doc, "a.c", '"x"') == '{"a": {"b": 1,"c":"x"}}'
    assert status_of(sd.dict_add, doc, "a.b", "2") == S.SUBDOC_PATH_EEXISTS
    assert sd.dict_add(doc, "a.b", "2", upsert=True) == '{"a": {"b": 2}}'
    assert status_of(sd.dict_add, doc, "x.y", "1") == S.SUBDOC_PATH_ENOENT  # no MKDIR_P
    assert sd.dict_add(doc, "x.y", "1", mkdir_p=True) == '{"a": {"b": 1},"x":{"y":1}}'
    assert status_of(sd.dict_add, doc, "a[0]", "1") == S.SUBDOC_PATH_EINVAL  # ends with an index
    assert status_of(sd.dict_add, doc, "a.b.c", "1") == S.SUBDOC_PATH_MISMATCH
    assert status_of(sd.dict_add, doc, "a.c", "{") == S.SUBDOC_VALUE_CANTINSERT
    assert status_of(sd.dict_add, doc, "a.c", "1 2") == S.SUBDOC_VALUE_CANTINSERT
    assert sd.dict_add("{}", "k", ' [1, 2] ') == '{"k":[1, 2]}'  # surrounding whitespace is not kept
    assert status_of(sd.dict_add, "{}", 'bad"key', "1") == S.SUBDOC_PATH_EINVAL


def test_replace_and_remove():
    doc = '{"a": [1, 2, 3], "b": true}'
    assert sd.replace(doc, "a[1]", "{}") == '{"a": [1, {}, 3], "b": true}'
    assert status_of(sd.replace, doc, "c", "1") == S.SUBDOC_PATH_ENOENT
    assert sd.remove(doc, "a[0]") == '{"a": [2, 3], "b": true}'
    assert sd.remove(doc, "a[-1]") == '{"a": [1, 2], "b": true}'
    assert sd.remove(doc, "b") == '{"a": [1, 2, 3]}'
    assert sd.remove('{"only": 1}', "only") == "{}"
    assert status_of(sd.remove, doc, "a[3]") == S.SUBDOC_PATH_ENOENT


def test_array_operations():
    doc = '{"l": [1], "e": [], "o": {}}'
    assert sd.array_push(doc, "l", "2, 3") == '{"l": [1,2, 3], "e": [], "o": {}}'
    assert sd.array_push(doc, "l", "0", first=True) == '{"l": [0,1], "e": [], "o": {}}'
    assert sd.array_push(doc, "e", "1") == '{"l": [1], "e": [1], "o": {}}'
    assert status_of(sd.array_push, doc, "o", "1") == S.SUBDOC_PATH_MISMATCH
    assert status_of(sd.array_push, doc, "new", "1") == S.SUBDOC_PATH_ENOENT
    assert sd.array_push(doc, "new", "1", mkdir_p=True).endswith(',"new":[1]}')
    assert sd.array_push("[]", "", "1") == "[1]"  # the root is the array
    assert status_of(sd.array_push, doc, "l", "1,") == S.SUBDOC_VALUE_CANTINSERT
    assert sd.array_insert(doc, "l[0]", '"x"') == '{"l": ["x",1], "e": [], "o": {}}'
    assert sd.array_insert(doc, "l[1]", '"x"') == '{"l": [1,"x"], "e": [], "o": {}}'  # at the length: append
    assert sd.array_insert(doc, "e[0]", "7") == '{"l": [1], "e": [7], "o": {}}'
    assert status_of(sd.array_insert, doc, "l[2]", "1") == S.SUBDOC_PATH_ENOENT
    assert status_of(sd.array_insert, doc, "l[-1]", "1") == S.SUBDOC_PATH_EINVAL
    assert status_of(sd.array_insert, doc, "l", "1") == S.SUBDOC_PATH_EINVAL
    assert status_of(sd.array_insert, doc, "o[0]", "1") == S.SUBDOC_PATH_MISMATCH
    assert status_of(sd.array_insert, doc, "missing[0]", "1") == S.SUBDOC_PATH_ENOENT


def test_array_add_unique_compares_text():
    """The page: "123" != 123, true != "true", 1.0 != 1; only primitives, in the value and the array."""
    doc = '{"u": [1, "1", true, 1.0]}'
    for value in ("1", '"1"', "true", "1.0"):
        assert status_of(sd.array_add_unique, doc, "u", value) == S.SUBDOC_PATH_EEXISTS
    assert sd.array_add_unique(doc, "u", '"true"') == '{"u": [1, "1", true, 1.0,"true"]}'
    assert sd.array_add_unique(doc, "u", "1.00").endswith("1.00]}")
    for value in ("[1]", "{}", "1,2"):
        assert status_of(sd.array_add_unique, doc, "u", value) == S.SUBDOC_VALUE_CANTINSERT
    assert status_of(sd.array_add_unique, '{"u": [{}, 1]}', "u", "2") == S.SUBDOC_PATH_MISMATCH
    assert status_of(sd.array_add_unique, '{"u": [1, {}]}', "u", "1") == S.SUBDOC_PATH_EEXISTS


def test_counter():
    """kv_engine's SubdocCounter tests: int64 limits, what is not an integer, what is not a delta."""
    top = 2**63 - 1
    assert sd.counter('{"k":1}', "k", "5") == ('{"k":6}', "6")
    assert sd.counter(f'{{"k":{top - 1}}}', "k", "1")[1] == str(top)
    assert status_of(sd.counter, f'{{"k":{top}}}', "k", "1") == S.SUBDOC_VALUE_CANTINSERT
    assert status_of(sd.counter, f'{{"k":{-top}}}', "k", "-2") == S.SUBDOC_VALUE_CANTINSERT
    for too_big in (str(top + 1), str(-top - 2)):
        assert status_of(sd.counter, f'{{"k":{too_big}}}', "k", "1") == S.SUBDOC_NUM_ERANGE
    for not_int in ("null", '"string"', "[0]", '{"foo": "bar"}', "1.1", "true", "1e3"):
        assert status_of(sd.counter, f'{{"k":{not_int}}}', "k", "1") == S.SUBDOC_PATH_MISMATCH
    for bad in ("0", "1.1", "+1", "01", " 1", "abc", str(top + 1), "null", '"1"'):
        assert status_of(sd.counter, '{"k":10}', "k", bad) == S.SUBDOC_DELTA_EINVAL
    assert sd.counter("{}", "new", "-3") == ('{"new":-3}', "-3")
    assert status_of(sd.counter, "{}", "a.b", "1") == S.SUBDOC_PATH_ENOENT
    assert sd.counter("{}", "a.b", "1", mkdir_p=True) == ('{"a":{"b":1}}', "1")
    assert status_of(sd.counter, '{"l":[]}', "l[0]", "1") == S.SUBDOC_PATH_ENOENT


def test_lookups_and_not_json():
    doc = '{"a": [1, 2, {"x": 1}], "o": {"p": 1, "q": 2}}'
    assert sd.get_count(doc, "a") == "3" and sd.get_count(doc, "o") == "2" and sd.get_count(doc, "") == "2"
    assert status_of(sd.get_count, doc, "a[0]") == S.SUBDOC_PATH_MISMATCH
    assert sd.apply(Opcode.SUBDOC_EXISTS, doc, "a[2].x") == (None, None)
    assert status_of(sd.get, '{"a": [1, }', "a[1]") == S.SUBDOC_DOC_NOT_JSON
    assert status_of(sd.get, "", "a") == S.SUBDOC_DOC_NOT_JSON
    assert status_of(sd.get, "[1, NaN]", "[1]") == S.SUBDOC_DOC_NOT_JSON


def test_numbers_and_formatting_elsewhere_are_kept_byte_for_byte():
    doc = '{ "big": 123456789012345678901234567890.50, "e": 1E+2,\n  "s": "\\u00e9", "n": 1 }'
    out = sd.counter(doc, "n", "1")[0]
    assert out == doc.replace('"n": 1', '"n": 2')
    assert sd.get(doc, "big") == "123456789012345678901234567890.50"


def test_root_for_mkdoc():
    assert sd.root_for(Opcode.SUBDOC_ARRAY_PUSH_LAST, "") == "[]"
    assert sd.root_for(Opcode.SUBDOC_ARRAY_PUSH_FIRST, "[0]") == "[]"
    assert sd.root_for(Opcode.SUBDOC_DICT_UPSERT, "a.b") == "{}"
    assert sd.root_for(Opcode.SUBDOC_ARRAY_PUSH_LAST, "list") == "{}"


# ---------------------------------------------------------------------------------------------
# model-based property test


class ModelError(Exception):
    def __init__(self, status):
        self.status = status


def _walk(doc, comps):
    """(value, matched levels, complete) as the page defines existence and mismatch."""
    cur = doc
    for level, (kind, want) in enumerate(comps):
        if isinstance(cur, dict) and kind == "k":
            if want not in cur:
                return cur, level, False
            cur = cur[want]
        elif isinstance(cur, list) and kind == "i":
            if want == -1:
                if not cur:
                    return cur, level, False
                cur = cur[-1]
            elif want >= len(cur):
                return cur, level, False
            else:
                cur = cur[want]
        else:
            raise ModelError(S.SUBDOC_PATH_MISMATCH)
    return cur, len(comps), True


def _container(doc, comps):
    return _walk(doc, comps)[0]


def _slot(parent, comp):
    return comp[1] if isinstance(parent, dict) else (len(parent) - 1 if comp[1] == -1 else comp[1])


def _create(doc, comps, level, leaf, mkdir_p):
    container = _container(doc, comps[:level])
    if level < len(comps) - 1:
        if not mkdir_p or not isinstance(container, dict) or any(k != "k" for k, _ in comps[level:]):
            raise ModelError(S.SUBDOC_PATH_ENOENT)
    elif not isinstance(container, dict):
        raise ModelError(S.SUBDOC_PATH_ENOENT)
    for _, key in comps[level:-1]:
        container[key] = {}
        container = container[key]
    container[comps[-1][1]] = leaf


def model_apply(doc, op, comps, values, mkdir_p):
    """The JSON edit of one operation on a Python value; raises ModelError with the status."""
    if op in ("dict_add", "dict_upsert"):
        if not comps:
            raise ModelError(S.SUBDOC_VALUE_CANTINSERT)
        if comps[-1][0] != "k":
            raise ModelError(S.SUBDOC_PATH_EINVAL)
        _, level, complete = _walk(doc, comps)
        if complete:
            if op == "dict_add":
                raise ModelError(S.SUBDOC_PATH_EEXISTS)
            parent = _container(doc, comps[:-1])
            parent[comps[-1][1]] = values[0]
        else:
            _create(doc, comps, level, values[0], mkdir_p)
    elif op == "replace":
        if not comps:
            raise ModelError(S.SUBDOC_VALUE_CANTINSERT)
        if not _walk(doc, comps)[2]:
            raise ModelError(S.SUBDOC_PATH_ENOENT)
        parent = _container(doc, comps[:-1])
        parent[_slot(parent, comps[-1])] = values[0]
    elif op == "remove":
        if not comps:
            raise ModelError(S.SUBDOC_VALUE_CANTINSERT)
        if not _walk(doc, comps)[2]:
            raise ModelError(S.SUBDOC_PATH_ENOENT)
        parent = _container(doc, comps[:-1])
        del parent[_slot(parent, comps[-1])]
    elif op in ("push_last", "push_first", "add_unique"):
        if op == "add_unique" and (len(values) != 1 or isinstance(values[0], dict | list)):
            raise ModelError(S.SUBDOC_VALUE_CANTINSERT)
        target, level, complete = _walk(doc, comps)
        if not complete:
            if not mkdir_p or not comps:
                raise ModelError(S.SUBDOC_PATH_ENOENT)
            _create(doc, comps, level, list(values), mkdir_p)
            return
        if not isinstance(target, list):
            raise ModelError(S.SUBDOC_PATH_MISMATCH)
        if op == "add_unique":
            for element in target:
                if isinstance(element, dict | list):
                    raise ModelError(S.SUBDOC_PATH_MISMATCH)
                if json.dumps(element) == json.dumps(values[0]):
                    raise ModelError(S.SUBDOC_PATH_EEXISTS)
        if op == "push_first":
            target[:0] = values
        else:
            target.extend(values)
    elif op == "insert":
        if not comps or comps[-1][0] != "i" or comps[-1][1] < 0:
            raise ModelError(S.SUBDOC_PATH_EINVAL)
        target, _, complete = _walk(doc, comps[:-1])
        if not complete:
            raise ModelError(S.SUBDOC_PATH_ENOENT)
        if not isinstance(target, list):
            raise ModelError(S.SUBDOC_PATH_MISMATCH)
        if comps[-1][1] > len(target):
            raise ModelError(S.SUBDOC_PATH_ENOENT)
        target[comps[-1][1]:comps[-1][1]] = values
    elif op == "counter":
        delta = values[0]
        if not comps:
            raise ModelError(S.SUBDOC_VALUE_CANTINSERT)
        current, level, complete = _walk(doc, comps)
        if complete:
            if type(current) is not int:
                raise ModelError(S.SUBDOC_PATH_MISMATCH)
            if not -(2**63) <= current + delta < 2**63:
                raise ModelError(S.SUBDOC_VALUE_CANTINSERT)
            parent = _container(doc, comps[:-1])
            parent[_slot(parent, comps[-1])] = current + delta
        else:
            if comps[-1][0] != "k":
                raise ModelError(S.SUBDOC_PATH_ENOENT)
            _create(doc, comps, level, delta, mkdir_p)


ENGINE_OPS = {
    "dict_add": lambda d, p, v, m: sd.dict_add(d, p, v, m),
    "dict_upsert": lambda d, p, v, m: sd.dict_add(d, p, v, m, upsert=True),
    "replace": lambda d, p, v, m: sd.replace(d, p, v),
    "remove": lambda d, p, v, m: sd.remove(d, p),
    "push_last": lambda d, p, v, m: sd.array_push(d, p, v, m),
    "push_first": lambda d, p, v, m: sd.array_push(d, p, v, m, first=True),
    "add_unique": lambda d, p, v, m: sd.array_add_unique(d, p, v, m),
    "insert": lambda d, p, v, m: sd.array_insert(d, p, v),
    "counter": lambda d, p, v, m: sd.counter(d, p, v, m)[0],
}

scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.sampled_from(["", "x", "a b", "é"]))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from("abcz"), inner, max_size=3)), max_leaves=6)
components = st.one_of(st.tuples(st.just("k"), st.sampled_from("abcz")),
                       st.tuples(st.just("i"), st.integers(-1, 3)))


def path_text(comps) -> str:
    out = ""
    for kind, want in comps:
        out += f"[{want}]" if kind == "i" else (f".{want}" if out else want)
    return out


@st.composite
def operations(draw):
    op = draw(st.sampled_from(sorted(ENGINE_OPS)))
    comps = draw(st.lists(components, max_size=3))
    if op == "counter":
        values = [draw(st.integers(-(2**63), 2**63 - 1).filter(bool))]
    elif op in ("push_last", "push_first", "insert"):
        values = draw(st.lists(json_values, min_size=1, max_size=3))
    elif op == "add_unique":
        values = [draw(json_values)]
    else:
        values = [draw(json_values)]
    return op, comps, values, draw(st.booleans())


def _text_of(op, values) -> str:
    if op == "counter":
        return str(values[0])
    return ",".join(json.dumps(v, ensure_ascii=False) for v in values)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from("abcz"), json_values, max_size=4), st.sampled_from([None, 1, 2]),
       st.lists(operations(), min_size=1, max_size=12))
def test_random_mutation_sequences_match_a_python_model(initial, indent, ops):
    model = json.loads(json.dumps(initial))
    doc = json.dumps(initial, indent=indent, ensure_ascii=False)
    for op, comps, values, mkdir_p in ops:
        path = path_text(comps)
        if comps and comps[0][0] == "i":  # a path starting with an index addresses a root array
            path = path.lstrip(".")
        expected = S.SUCCESS
        try:
            model_apply(model, op, comps, values, mkdir_p)
        except ModelError as e:
            expected = e.status
        try:
            new = ENGINE_OPS[op](doc, path, _text_of(op, values), mkdir_p)
            got = S.SUCCESS
        except SubdocError as e:
            got, new = e.status, doc
        assert got == expected, (op, path, values, doc)
        doc = new
        assert json.dumps(json.loads(doc)) == json.dumps(model), (op, path, values)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values, st.sampled_from([None, 1]), st.lists(components, max_size=3))
def test_lookups_agree_with_the_mutation_walk(value, indent, comps):
    """`get` finds values with a shortcut for compact objects; it must say what the walk the
    mutations use says: the same text, or the same error."""
    doc = json.dumps({"root": value, "a": value}, indent=indent, ensure_ascii=False)
    path = path_text(comps)
    try:
        found = sd._walk(doc, sd.parse_path(path))
        expected = doc[found.span[0]:found.span[1]] if found.complete else S.SUBDOC_PATH_ENOENT
    except SubdocError as e:
        expected = e.status
    try:
        got = sd.get(doc, path)
    except SubdocError as e:
        got = e.status
    assert got == expected
    model = json.loads(doc)
    if isinstance(got, str):
        assert json.loads(got) == _walk(model, sd.parse_path(path))[0]
