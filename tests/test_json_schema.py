"""JSON Schema front-end: per-keyword and per-option unit tests, errors, and JSONSchemaBench data."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
from conftest import SHARED

import xg2
from xg2.errors import GrammarLimitError, SchemaError
from xg2.grammar.json_schema import json_schema_to_ir

DATA = SHARED / "data" / "jsonschemabench"


@pytest.fixture(scope="module")
def compiler(json_info):
    """The language tests need no real vocabulary: a small one (every byte plus JSON pieces) runs
    them without ../shared; the benchmark test below uses a real one."""
    return xg2.GrammarCompiler(json_info)


@pytest.fixture(scope="module")
def real_compiler(deepseek_info):
    return xg2.GrammarCompiler(deepseek_info)


@pytest.fixture(scope="module")
def check(compiler):
    def make(schema, **kw):
        compiled = compiler.compile_grammar(xg2.Grammar(json_schema_to_ir(schema, **kw)))

        def accepts(text: str) -> bool:
            m = xg2.GrammarMatcher(compiled)
            return m.accept_string(text) and m.is_completed()

        return accepts

    return make


def assert_lang(accepts, good, bad):
    for t in good:
        assert accepts(t), f"should accept {t!r}"
    for t in bad:
        assert not accepts(t), f"should reject {t!r}"


# --- types ---------------------------------------------------------------------------------------

def test_any_value(check):
    for schema in (True, {}, {"title": "x", "description": "y"}):
        acc = check(schema)
        assert_lang(acc, ['1', '"a"', 'null', 'true', '{"a": [1, {"b": null}]}', '[]', '{}', '-0.5e+3'],
                    ['', 'nul', '{a: 1}', '[1,]', '01', '"\x01"', ' 1'])


@pytest.mark.parametrize("t,good,bad", [
    ("null", ["null"], ["0", '"null"']),
    ("boolean", ["true", "false"], ["null", "1"]),
    ("string", ['""', '"a\\n\\u00e9é"', '"\\/"'], ['"\\x"', '"\n"', "1"]),
    ("number", ["0", "-1.5", "1e10", "2E-3", "12"], ["01", "1.", ".5", "+1", '"1"']),
    ("integer", ["0", "-12", "1234567890123"], ["1.0", "1e2", "01", "-"]),
    ("object", ["{}", '{"a": 1}', '{"a": {"b": []}}'], ["[]", '{"a"}']),
    ("array", ["[]", "[1, \"x\", [null]]"], ["{}", "[1 2]"]),
])
def test_type(check, t, good, bad):
    assert_lang(check({"type": t}, strict_mode=False), good, bad)


def test_type_list(check):
    acc = check({"type": ["string", "null"]})
    assert_lang(acc, ['"x"', "null"], ["1", "{}"])


def test_no_type_means_all_types(check):
    acc = check({"properties": {"a": {"type": "integer"}}, "minLength": 2}, strict_mode=False)
    assert_lang(acc, ['{"a": 1}', '"ab"', "3", "[1]"], ['{"a": "x"}', '"a"'])


# --- enum / const --------------------------------------------------------------------------------

def test_enum_const(check):
    acc = check({"enum": ["a", 1, None, {"k": [1, 2]}, True]})
    assert_lang(acc, ['"a"', "1", "null", '{"k": [1, 2]}', '{ "k" :[1,2]}', "true"],
                ['"b"', "2", "false", '{"k": [2, 1]}'])
    assert_lang(check({"const": "x\"y"}), ['"x\\"y"'], ['"x"'])
    assert_lang(check({"type": "string", "enum": ["a", 1]}), ['"a"'], ["1"])
    # listed values are checked against every sibling keyword, including ones with no grammar form
    assert_lang(check({"enum": [1, -1, 2, [1, 1], [1, 2]], "minimum": 0, "not": {"const": 2}, "uniqueItems": True}),
                ["1", "[1, 2]"], ["-1", "2", "[1, 1]"])


# --- objects -------------------------------------------------------------------------------------

OBJ = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                                        "c": {"type": "boolean"}}, "required": ["b"]}


def test_properties_order_and_optional(check):
    acc = check(OBJ)
    assert_lang(acc, ['{"b": ""}', '{"a": 1, "b": ""}', '{"b": "", "c": true}', '{"a": 1, "b": "", "c": false}'],
                ['{}', '{"a": 1}', '{"b": "", "a": 1}', '{"b": "", "d": 1}', '{"a": "x", "b": ""}',
                 '{"b": "", "b": ""}', '{"c": true, "b": ""}'])


def test_property_names_outside_ascii_and_leading_digits(check):
    # Rule names come from property names; they must still print as EBNF (registry tool
    # "m_año_vehiculo" once raised GrammarError).
    acc = check({"type": "object", "properties": {"año": {"type": "object", "properties": {"x": {}}},
                                                  "3d": {"type": "object", "properties": {"y": {}}}}})
    assert_lang(acc, ['{"año": {"x": 1}, "3d": {}}'], ['{"año": 1}', '{"3d": 2}'])


def test_all_optional_subsets(check):
    props = {k: {"type": "integer"} for k in "abcd"}
    acc = check({"type": "object", "properties": props})
    import itertools
    for r in range(5):
        for sub in itertools.combinations("abcd", r):
            assert acc(json.dumps({k: 1 for k in sub}))
            if r >= 2:
                assert not acc(json.dumps({k: 1 for k in reversed(sub)}))


def test_additional_properties(check):
    strict = check(OBJ)
    assert not strict('{"b": "", "zz": 1}')
    loose = check(OBJ, strict_mode=False)
    assert_lang(loose, ['{"b": "", "zz": 1}', '{"b": "", "zz": [], "yy": {}}', '{"b": "", "aa": 1}', '{"b": "", "": 1}'],
                ['{"b": "", "a": 1}', '{"b": "", "b": 2}', '{"zz": 1, "b": ""}'])
    typed = check({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}})
    assert_lang(typed, ['{}', '{"x": "y"}', '{"a": 1, "x": "y"}', '{"ab": "y"}'], ['{"x": 1}', '{"a": "s"}'])
    free = check({"type": "object", "additionalProperties": {"type": "integer"}})
    assert_lang(free, ['{}', '{"x": 1, "y": 2}'], ['{"x": "1"}'])


def test_required_not_in_properties(check):
    acc = check({"type": "object", "required": ["z"], "additionalProperties": {"type": "null"}})
    assert_lang(acc, ['{"z": null}', '{"z": null, "q": null}'], ['{}', '{"z": 1}'])
    # strict_mode closes the object to the keys it names, and a required key is named
    assert_lang(check({"type": "object", "required": ["z"]}), ['{"z": 1}', '{"z": {"q": []}}'], ['{}', '{"z": 1, "q": 2}'])


# --- arrays --------------------------------------------------------------------------------------

def test_items_bounds(check):
    acc = check({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3})
    assert_lang(acc, ["[1, 2]", "[1, 2, 3]"], ["[]", "[1]", "[1, 2, 3, 4]", '[1, "a"]'])
    acc = check({"type": "array", "items": {"type": "integer"}, "minItems": 1})
    assert_lang(acc, ["[1]", "[1, 2, 3, 4, 5]"], ["[]"])


def test_prefix_items(check):
    schema = {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}]}
    assert_lang(check(schema), ["[]", "[1]", '[1, "a"]'], ['[1, "a", 2]', '["a"]'])
    assert_lang(check(schema, strict_mode=False), ['[1, "a", 2, null]'], ['["a"]'])
    schema2 = dict(schema, items={"type": "null"}, minItems=3)
    assert_lang(check(schema2), ['[1, "a", null]', '[1, "a", null, null]'], ['[1, "a"]', '[1, "a", 1]'])
    legacy = {"type": "array", "items": [{"type": "integer"}], "additionalItems": {"type": "string"}}
    assert_lang(check(legacy), ['[1, "x", "y"]'], ['[1, 2]'])


# --- strings -------------------------------------------------------------------------------------

def test_string_length(check):
    acc = check({"type": "string", "minLength": 2, "maxLength": 3})
    assert_lang(acc, ['"ab"', '"abc"', '"\\n\\u0041"', '"éé"', '"😀😀"'], ['"a"', '"abcd"', '"\\n"'])


# --- combinators and refs ------------------------------------------------------------------------

def test_any_of_one_of_all_of(check):
    acc = check({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 1}]})
    assert_lang(acc, ["1", '"a"'], ['"ab"', "null"])
    acc = check({"oneOf": [{"type": "null"}, {"type": "boolean"}]})
    assert_lang(acc, ["null", "true"], ["1"])
    acc = check({"allOf": [{"type": "string"}], "maxLength": 1})
    assert_lang(acc, ['"a"'], ['"ab"', "1"])
    acc = check({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                 "anyOf": [{"required": ["a"]}, {"required": ["b"]}]})
    assert_lang(acc, ['{"a": 1}', '{"b": 1}', '{"a": 1, "b": 2}'], ['{}'])


def test_all_of_merging(check):
    # additionalProperties is relative to each subschema's own properties
    schema = {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False},
                        {"properties": {"b": {"type": "integer"}}}]}
    acc = check(schema, strict_mode=False)
    assert_lang(acc, ['{"a": 1}', "{}"], ['{"a": 1, "b": 2}', '{"b": 2}', '{"c": 2}'])
    defs = {"$defs": {"A": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}, "required": ["a"]},
                      "B": {"type": "object", "properties": {"a": {"maximum": 5}, "b": {"type": "string"}}}},
            "allOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/B"}]}
    acc = check(defs)
    assert_lang(acc, ['{"a": 0}', '{"a": 5, "b": "x"}'], ['{"a": 6}', '{"a": -1}', '{"b": "x"}', '{"a": 1, "c": 1}'])
    acc = check({"allOf": [{"type": "string", "maxLength": 3}, {"minLength": 2, "maxLength": 5}]})
    assert_lang(acc, ['"ab"', '"abc"'], ['"a"', '"abcd"'])
    acc = check({"allOf": [{"enum": [1, 2, "x"]}, {"enum": [2, "x", 3]}], "type": "integer"})
    assert_lang(acc, ["2"], ["1", '"x"', "3"])


def test_recursive_ref(check):
    schema = {"$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["v"]}}, "$ref": "#/$defs/node"}
    acc = check(schema)
    assert_lang(acc, ['{"v": 1}', '{"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}, {"v": 4}]}'],
                ['{"v": 1, "kids": [{}]}'])
    root = {"type": "array", "items": {"anyOf": [{"type": "integer"}, {"$ref": "#"}]}}
    assert_lang(check(root), ["[1, [2, [[]]]]"], ['[1, ["x"]]'])
    defs = {"definitions": {"a": {"type": "integer", "minimum": 0}}, "$ref": "#/definitions/a"}
    assert_lang(check(defs), ["0", "7"], ["-1"])


def test_recursive_ref_indent(check):
    schema = {"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}}, "$ref": "#/$defs/n"}
    acc = check(schema, any_whitespace=False, indent=2)
    for doc in ([], [[]], [[], [[[]]]]):
        assert acc(json.dumps(doc, indent=2))
    assert not acc("[[]]")


# --- integer bounds ------------------------------------------------------------------------------

@pytest.mark.parametrize("bounds", [
    {"minimum": 0}, {"maximum": 0}, {"minimum": -37, "maximum": 205}, {"exclusiveMinimum": 9, "exclusiveMaximum": 101},
    {"minimum": 1.5, "maximum": 99.5}, {"minimum": -120}, {"maximum": -13}, {"minimum": 5, "exclusiveMinimum": True},
    {"minimum": 100, "maximum": 100},
])
def test_integer_bounds_exhaustive(check, bounds):
    schema = {"type": "integer", **bounds}
    acc = check(schema)
    for n in range(-300, 301):
        assert acc(str(n)) == jsonschema.Draft4Validator(schema).is_valid(n) if "exclusiveMinimum" in bounds and \
            isinstance(bounds["exclusiveMinimum"], bool) else acc(str(n)) == jsonschema.Draft202012Validator(schema).is_valid(n), n
    assert not acc("01") and not acc("1.0")
    assert acc("1" + "0" * 30) == ("maximum" not in bounds and "exclusiveMaximum" not in bounds)


def test_empty_integer_range():
    with pytest.raises(SchemaError):
        json_schema_to_ir({"type": "integer", "minimum": 5, "maximum": 4})


# --- layout options ------------------------------------------------------------------------------

DOC_SCHEMA = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}},
                                               "b": {"type": "object", "properties": {"c": {"const": [1, {"d": None}]}}},
                                               "e": {"type": "object"}}}
DOC = {"a": [1, 2], "b": {"c": [1, {"d": None}]}, "e": {"x": [], "y": {"z": [1]}}}


def test_whitespace_flexible(check):
    acc = check(DOC_SCHEMA, strict_mode=False)
    assert acc(json.dumps(DOC))
    assert acc(json.dumps(DOC, indent=4))
    assert acc(json.dumps(DOC, separators=(",", ":")))
    assert acc(' {"a" :[ 1 ,2 ]}'.strip())
    assert not acc(' {"a": []}')  # no whitespace around the root value


def test_max_whitespace(check):
    acc = check({"type": "array", "items": {"type": "integer"}}, max_whitespace_cnt=2)
    assert_lang(acc, ["[1,  2]", "[  1 ,\n 2\t]"], ["[1,   2]", "[   1]"])


def test_strict_default_separators(check):
    acc = check(DOC_SCHEMA, any_whitespace=False, strict_mode=False)
    assert acc(json.dumps(DOC))
    assert not acc(json.dumps(DOC, separators=(",", ":")))
    assert not acc(json.dumps(DOC, indent=2))


def test_indent(check):
    for indent in (2, 4):
        acc = check(DOC_SCHEMA, any_whitespace=False, indent=indent, strict_mode=False)
        assert acc(json.dumps(DOC, indent=indent))
        assert not acc(json.dumps(DOC, indent=indent + 1))
        assert not acc(json.dumps(DOC))
    acc = check({"type": "object"}, any_whitespace=False, indent=2, strict_mode=False)
    assert acc("{}") and acc('{\n  "x": {}\n}') and not acc("{ }")


def test_custom_separators(check):
    acc = check(DOC_SCHEMA, any_whitespace=False, separators=(",", ":"), strict_mode=False)
    assert acc(json.dumps(DOC, separators=(",", ":")))
    assert not acc(json.dumps(DOC))
    acc = check(DOC_SCHEMA, any_whitespace=False, indent=2, separators=(", ", " = "), strict_mode=False)
    assert acc(json.dumps(DOC, indent=2, separators=(", ", " = ")))


def test_schema_as_json_text(check):
    assert check('{"type": "integer"}')("5")


def test_schema_text_takes_the_path_of_its_document(compiler):
    """Text is what a server receives: it shares the dict's cache entry, and an anyOf of objects
    is linked from modules as the dict is (it was lowered whole, about three times slower)."""
    schema = {"anyOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                        {"type": "object", "properties": {"b": {"type": "string"}}, "required": ["b"]}]}
    as_dict = compiler.compile_json_schema(schema)
    assert compiler.compile_json_schema(json.dumps(schema)) is as_dict
    assert compiler.compile_json_schema(json.dumps(schema).encode()) is as_dict
    other = {"anyOf": [{"type": "object", "properties": {"c": {"type": "boolean"}}}, {"type": "null"}]}
    from_text = compiler.compile_json_schema(json.dumps(other, indent=2))
    assert from_text is compiler.compile_json_schema(other)
    with pytest.raises(SchemaError):        # text that does not decode: the front-end's typed error
        compiler.compile_json_schema('{"type": ')


# --- errors --------------------------------------------------------------------------------------

def test_errors():
    with pytest.raises(SchemaError):
        json_schema_to_ir("{not json")
    with pytest.raises(SchemaError):
        json_schema_to_ir(False)
    with pytest.raises(SchemaError):
        json_schema_to_ir({"type": "array", "prefixItems": [False], "minItems": 1})
    with pytest.raises(SchemaError) as exc:
        json_schema_to_ir({"properties": {"a/b": {"items": {"pattern": "(?<=x)y"}}}})
    assert exc.value.pointer == "/properties/a~1b/items/pattern" and "lookbehind" in exc.value.message.lower()
    for kw, val in [("uniqueItems", True), ("not", {"uniqueItems": True})]:
        with pytest.raises(SchemaError) as exc:
            json_schema_to_ir({"anyOf": [{"type": "string"}, {kw: val}]})
        assert exc.value.pointer == f"/anyOf/1/{kw}", kw
    with pytest.raises(SchemaError) as exc:     # `if` whose complement has no positive form
        json_schema_to_ir({"anyOf": [{"type": "string"}, {"if": {"uniqueItems": True}, "then": {"maxItems": 3}}]})
    assert exc.value.pointer == "/anyOf/1/if"
    with pytest.raises(SchemaError) as exc:  # two nots merge into "neither", here nothing at all
        json_schema_to_ir({"allOf": [{"not": {}}, {"not": {"type": "null"}}]})
    assert "accepts no JSON value" in exc.value.message
    with pytest.raises(SchemaError) as exc:
        json_schema_to_ir({"allOf": [{"not": {"type": "null"}}, {"not": {"uniqueItems": True}}]})
    assert exc.value.pointer == "/allOf/1/not" and "'not'" in exc.value.message
    with pytest.raises(GrammarLimitError, match="combining two anyOf"):
        json_schema_to_ir({"allOf": [{"anyOf": [{"minimum": i} for i in range(9)]},
                                     {"anyOf": [{"maximum": i} for i in range(9)]}]})
    with pytest.raises(SchemaError) as exc:  # the second oneOf overlaps, so the product is not exact
        json_schema_to_ir({"allOf": [{"oneOf": [{"type": "string"}, {"type": "integer"}]},
                                     {"oneOf": [{"uniqueItems": True}, {"maximum": 5}]}]})
    assert exc.value.pointer == "/allOf/1/oneOf"
    with pytest.raises(SchemaError):
        json_schema_to_ir({"$ref": "http://example.com/x"})
    with pytest.raises(SchemaError):
        json_schema_to_ir({"$ref": "#/$defs/missing"})
    with pytest.raises(SchemaError):
        json_schema_to_ir({"type": "strin"})
    with pytest.raises(SchemaError):  # "a" is additional at the root, so the required key cannot appear
        json_schema_to_ir({"allOf": [{"properties": {"a": {}}, "required": ["a"]}], "additionalProperties": False,
                           "type": "object"})


def test_limits():
    with pytest.raises(GrammarLimitError):
        json_schema_to_ir({"type": "array", "maxItems": 1_000_001})
    with pytest.raises(GrammarLimitError):
        json_schema_to_ir({"type": "string", "minLength": 1_000_001})
    deep: dict = {"type": "integer"}
    for _ in range(200):
        deep = {"type": "array", "items": deep}
    with pytest.raises(GrammarLimitError):
        json_schema_to_ir(deep)
    json_schema_to_ir({"type": "array", "maxItems": 10_000})


def test_large_length_bounds_compile_small_and_stay_exact(check):
    """Length bounds compress (repetition.py): 65536 compiles to a few small rules, edges exact."""
    acc = check({"type": "string", "minLength": 40, "maxLength": 65536})
    assert_lang(acc, ['"' + "a" * 40 + '"', '"' + "é" * 65536 + '"'], ['"' + "a" * 39 + '"', '"' + "ab" * 32768 + 'c"'])
    acc = check({"type": "array", "items": {"type": "integer"}, "minItems": 20, "maxItems": 300})
    assert_lang(acc, ["[" + ", ".join(["1"] * n) + "]" for n in (20, 300)],
                ["[" + ", ".join(["1"] * n) + "]" for n in (19, 301)])


# --- strings: pattern, format, escapes ------------------------------------------------------------

def test_pattern_search_semantics_and_escaping(check):
    acc = check({"type": "string", "pattern": "^[a-z]+$"})
    assert_lang(acc, ['"abc"'], ['""', '"aBc"', '"ab1"'])
    acc = check({"type": "string", "pattern": "b"})  # ECMA-262 search: anywhere in the value
    assert_lang(acc, ['"b"', '"abc"', '"x\\ny b"'], ['"ac"', '""'])
    acc = check({"type": "string", "pattern": '^a"\\\\$'})  # the value a"\ is spelt "a\"\\"
    assert_lang(acc, ['"a\\"\\\\"'], ['"a\\"\\"', '"a"'])


@pytest.mark.parametrize("fmt,good,bad", [
    ("date", ["2024-02-29", "1999-12-31"], ["2023-02-29", "2024-13-01", "24-01-01"]),
    ("time", ["12:30:00Z", "23:59:59.5+02:00"], ["24:00:00Z", "12:30"]),
    ("date-time", ["2024-01-01T00:00:00Z"], ["2024-01-01 00:00:00", "2024-01-01T00:00:00"]),
    ("email", ["a.b@example.com"], ["a@", "@b.com", "a b@c.com"]),
    ("ipv4", ["192.168.0.1"], ["256.1.1.1", "01.2.3.4"]),
    ("ipv6", ["::1", "2001:db8::8a2e:370:7334"], ["1:::2", "12345::"]),
    ("uuid", ["123e4567-e89b-12d3-a456-426614174000"], ["123e4567e89b12d3a456426614174000"]),
    ("uri", ["https://example.com/a?b=c#d"], ["//no-scheme", "not a uri"]),
    ("duration", ["P1Y2M3DT4H5M6S", "PT36H", "P4W"], ["P", "1Y", "PT"]),
    ("hostname", ["example.com"], ["-bad.com", "a..b"]),
])
def test_formats(check, fmt, good, bad):
    assert_lang(check({"type": "string", "format": fmt}), [json.dumps(g) for g in good], [json.dumps(b) for b in bad])


def test_unknown_format_is_an_annotation(check):
    assert_lang(check({"type": "string", "format": "x-custom"}), ['"anything"'], ["1"])


def test_length_folded_into_pattern(check):
    acc = check({"type": "string", "pattern": "^[A-Z]{2}[0-9]+$", "minLength": 4, "maxLength": 5})
    assert_lang(acc, ['"AB12"', '"AB123"'], ['"AB1"', '"AB1234"'])
    # a bound the pattern's structure does not carry: met on automata (string_automaton)
    acc = check({"type": "string", "format": "email", "maxLength": 8})
    assert_lang(acc, ['"a@b.com"', '"ab@c.de"'], ['"abc@d.com"', '"ab.c"'])
    acc = check({"type": "string", "pattern": "^[a-z@.]+$", "format": "email"})     # both, met
    assert_lang(acc, ['"a@b.c"'], ['"abc"', '"A@b.c"'])


def test_strings_have_no_lone_surrogates_or_raw_controls(check):
    acc = check({"type": "string"})
    assert_lang(acc, ['"\\ud83d\\ude00"', '"\\u00e9"', '"\\u001f"'],
                ['"\\ud83d"', '"\\ude00"', '"\\ud83dx"', '"\x01"', '"\n"'])
    # a surrogate pair is one character for maxLength
    assert_lang(check({"type": "string", "maxLength": 1}), ['"\\ud83d\\ude00"', '"😀"'], ['"ab"'])


# --- numbers ------------------------------------------------------------------------------------------

def test_number_bounds_exact(check):
    acc = check({"type": "number", "minimum": -1.5, "exclusiveMaximum": 2.25})
    assert_lang(acc, ["-1.5", "-1.50", "0", "-0", "2.2499", "2", "1.0"], ["-1.51", "2.25", "2.250", "3", "-2"])
    acc = check({"type": "number", "exclusiveMinimum": 0})
    assert_lang(acc, ["0.001", "5", "12.5"], ["0", "0.000", "-0.1"])
    acc = check({"type": "number", "minimum": 0, "maximum": 10, "exclusiveMaximum": True})  # draft 4
    assert_lang(acc, ["0", "9.99"], ["10", "-1"])


def test_multiple_of(check):
    assert_lang(check({"type": "integer", "multipleOf": 7}), ["0", "14", "-21", "700007"], ["15", "1", "-8"])
    assert_lang(check({"type": "integer", "multipleOf": 5, "minimum": 12, "maximum": 31}), ["15", "30"], ["10", "35", "16"])
    assert_lang(check({"type": "integer", "multipleOf": 3, "exclusiveMinimum": 0}), ["3", "99"], ["0", "-3", "4"])
    assert_lang(check({"type": "number", "multipleOf": 0.01}), ["1", "1.5", "-0.25", "2.100"], ["1.255", "0.001"])
    assert_lang(check({"type": "number", "multipleOf": 2}), ["4", "-8"], ["3", "4.5"])


# --- objects: pattern/names/counts/order --------------------------------------------------------------

def test_pattern_properties_regions(check):
    schema = {"type": "object", "properties": {"x-id": {"type": "integer"}},
              "patternProperties": {"^x-": {"minimum": 5}, "b$": {"type": "string"}},
              "additionalProperties": {"type": "boolean"}}
    acc = check(schema)
    assert_lang(acc, ['{"x-id": 7}', '{"x-o": 9, "ab": "s", "q": true}', '{"x-b": "s"}'],
                ['{"x-id": 3}', '{"x-o": 1}', '{"q": 1}', '{"ab": true}', '{"x-b": 9}'])


def test_property_names(check):
    acc = check({"type": "object", "propertyNames": {"pattern": "^[a-z]+$", "maxLength": 3}}, strict_mode=False)
    assert_lang(acc, ['{"abc": 1}', "{}"], ['{"aBc": 1}', '{"abcd": 1}'])
    assert_lang(check({"type": "object", "propertyNames": False}, strict_mode=False), ["{}"], ['{"a": 1}'])


def test_min_max_properties(check):
    acc = check({"type": "object", "properties": {"a": {}, "b": {}}, "minProperties": 2, "maxProperties": 3},
                strict_mode=False)
    assert_lang(acc, ['{"a": 1, "b": 2}', '{"a": 1, "x": 2}', '{"x": 1, "y": 2, "z": 3}'],
                ["{}", '{"a": 1}', '{"a": 1, "b": 2, "x": 3, "y": 4}'])


def test_any_order(check):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["a"]}
    acc = check(schema, any_order=True)
    assert_lang(acc, ['{"b": "s", "a": 1}', '{"a": 1, "b": "s"}', '{"a": 1}'], ['{"b": "s"}', '{"a": 1, "a": 2}'])
    assert_lang(check(schema), ['{"a": 1, "b": "s"}'], ['{"b": "s", "a": 1}'])


def test_not_forms_with_a_positive_equivalent(check):
    assert_lang(check({"not": {"type": ["string", "null"]}}), ["1", "[]", "true"], ['"a"', "null"])
    assert_lang(check({"type": "object", "not": {"required": ["a"]}}, strict_mode=False), ['{"b": 1}', "{}"],
                ['{"a": 1}'])
    assert_lang(check({"anyOf": [{"type": "integer"}, {"type": "string", "not": {}}]}), ["1"], ['"a"'])
    assert_lang(check({"type": "string", "not": {"pattern": "^a"}}), ['"ba"', '""'], ['"a"', '"ab"'])
    with pytest.raises(SchemaError) as exc:     # no positive form: the typed error at the keyword
        json_schema_to_ir({"type": "array", "not": {"uniqueItems": True}})
    assert exc.value.pointer == "/not"


def test_one_of_exact_when_disjoint_error_otherwise(check):
    assert_lang(check({"oneOf": [{"type": "integer"}, {"type": "string"}]}), ["1", '"a"'], ["null"])
    tagged = {"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}}, "required": ["kind"]},
        {"type": "object", "properties": {"kind": {"const": "b"}, "y": {"type": "string"}}, "required": ["kind"]}]}
    assert_lang(check(tagged, strict_mode=False), ['{"kind": "a", "x": 1}', '{"kind": "b", "y": "s"}'],
                ['{"kind": "c"}', '{"kind": "a", "x": "s"}'])
    assert_lang(check({"oneOf": [{"enum": [1, 2]}, {"enum": [3]}]}), ["1", "3"], ["4"])
    # overlapping branches: each met with the complements of the others
    overlapping = {"oneOf": [{"type": "object", "required": ["a"]}, {"type": "object", "required": ["b"]}]}
    assert_lang(check(overlapping, strict_mode=False), ['{"a": 1}', '{"b": 1}'], ['{"a": 1, "b": 2}', "{}"])
    unsure = {"oneOf": [{"type": "array", "uniqueItems": True}, {"type": "array", "maxItems": 2}]}
    with pytest.raises(SchemaError) as exc:
        json_schema_to_ir(unsure, strict_mode=False)
    assert exc.value.pointer == "/oneOf"
    with pytest.warns(xg2.SchemaWarning):
        json_schema_to_ir(unsure, strict_mode=False, lenient=True)


def test_one_of_any_of_over_required_sets(check):
    schema = {"type": "object", "properties": {"ssn": {}, "ein": {}, "x": {}},
              "oneOf": [{"required": ["ssn"]}, {"required": ["ein"]}]}
    assert_lang(check(schema, strict_mode=False), ['{"ssn": 1}', '{"ein": 1, "x": 2}'],
                ['{"ssn": 1, "ein": 2}', "{}", '{"x": 1}'])
    schema = {"properties": {"a": {}, "b": {}}, "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}
    assert_lang(check(schema, strict_mode=False), ['{"a": 1}', '{"a": 1, "b": 2}', "1"], ["{}"])


def test_dependent_required(check):
    schema = {"type": "object", "properties": {"a": {}, "b": {}, "c": {}},
              "dependentRequired": {"c": ["a"], "a": ["b"]}, "additionalProperties": False}
    assert_lang(check(schema), ["{}", '{"b": 1}', '{"a": 1, "b": 2}', '{"a": 1, "b": 1, "c": 1}'],
                ['{"a": 1}', '{"b": 1, "c": 1}', '{"c": 1}'])
    assert_lang(check(schema, any_order=True), ['{"c": 1, "b": 2, "a": 3}'], ['{"c": 1, "a": 3}'])
    draft7 = {"type": "object", "properties": {"a": {}, "b": {}}, "dependencies": {"a": {"required": ["b"]}}}
    assert_lang(check(draft7), ['{"a": 1, "b": 2}', '{"b": 2}'], ['{"a": 1}'])
    # keys a dependency names become named members (an additional "a" would be out of reach of the states)
    assert_lang(check({"type": "object", "dependentRequired": {"a": ["b"]}}, strict_mode=False),
                ["{}", '{"b": 1}', '{"b": 1, "a": 2}', '{"x": 1}'], ['{"a": 1}', '{"x": 1, "a": 2}'])


UNEVALUATED_CASES = [
    # alone: like additionalProperties
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "unevaluatedProperties": False},
     [{"a": 1}, {"a": 1, "b": 2}, {}]),
    # members of allOf branches count as evaluated
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "unevaluatedProperties": False,
      "allOf": [{"properties": {"b": {"type": "string"}}}]},
     [{"a": 1, "b": "x"}, {"a": 1, "b": "x", "c": 1}, {"a": 1}, {"a": 1, "b": 2}]),
    # a branch's own keyword sees only the branch's members, not the parent's
    ({"type": "object", "properties": {"a": {}, "b": {}},
      "allOf": [{"properties": {"a": {}}, "unevaluatedProperties": False}]},
     [{"a": 1}, {"a": 1, "b": 2}, {}]),
    # members of a $ref target count
    ({"$defs": {"base": {"properties": {"x": {"type": "integer"}}}}, "$ref": "#/$defs/base",
      "properties": {"y": {"type": "boolean"}}, "unevaluatedProperties": False},
     [{"y": True, "x": 1}, {"x": 1, "z": 2}, {"y": False}]),
    # a schema value constrains the unevaluated members
    ({"properties": {"a": {}}, "unevaluatedProperties": {"type": "integer"}},
     [{"a": "s", "b": 1}, {"a": "s", "b": "t"}, "not an object"]),
    # additionalProperties evaluates every member first
    ({"properties": {"a": {}}, "additionalProperties": True, "unevaluatedProperties": False},
     [{"a": "s", "b": 1}]),
    # disjoint oneOf branches: the branch that holds names the evaluated members
    ({"oneOf": [{"type": "object", "properties": {"k": {"const": 1}, "p": {}}, "required": ["k"]},
                {"type": "object", "properties": {"k": {"const": 2}, "q": {}}, "required": ["k"]}],
      "unevaluatedProperties": False},
     [{"k": 1, "p": 0}, {"k": 1, "q": 0}, {"k": 2, "q": 0}, {"k": 2, "p": 0}]),
    # patternProperties evaluate the keys they match
    ({"patternProperties": {"^x_": {"type": "integer"}}, "unevaluatedProperties": False},
     [{"x_a": 1}, {"y": 1}, {"x_a": "s"}]),
    # listed values are checked by the validator with the same meaning
    ({"enum": [{"a": 1}, {"a": 1, "b": 2}], "properties": {"a": {}}, "unevaluatedProperties": False},
     [{"a": 1}, {"a": 1, "b": 2}]),
]


#: allOf members whose keywords meet: each pair is combined exactly (the validator is the oracle).
MERGE_CASES = [
    # anyOf and anyOf: one branch of each holds
    ({"allOf": [{"anyOf": [{"type": "string"}, {"type": "integer"}]},
                {"anyOf": [{"type": "integer", "minimum": 5}, {"type": "string", "maxLength": 2}]}]},
     ["ab", "abc", 5, 4, None, 7.5]),
    # disjoint oneOf and disjoint oneOf
    ({"allOf": [{"oneOf": [{"type": "object", "properties": {"k": {"const": "a"}}, "required": ["k"]},
                           {"type": "object", "properties": {"k": {"const": "b"}}, "required": ["k"]}]},
                {"oneOf": [{"type": "object", "properties": {"v": {"type": "integer"}}, "required": ["v"]},
                           {"type": "object", "properties": {"v": {"type": "string"}}, "required": ["v"]}]}]},
     [{"k": "a", "v": 1}, {"k": "b", "v": "x"}, {"k": "c", "v": 1}, {"k": "a"}, {"k": "a", "v": None}]),
    # allOf inside allOf members
    ({"allOf": [{"allOf": [{"minimum": 1}]}, {"allOf": [{"maximum": 3}]}], "type": "integer"}, [0, 1, 3, 4]),
    # two nots: neither holds
    ({"allOf": [{"not": {"type": "string"}}, {"not": {"type": "null"}}]}, ["s", None, 1, True, [], {}]),
    ({"not": {"anyOf": [{"type": "boolean"}, {"$ref": "#/$defs/n"}]}, "$defs": {"n": {"type": "null"}}},
     [True, None, 1, "s"]),
    # patternProperties from both members apply
    ({"type": "object", "allOf": [{"patternProperties": {"^a": {"type": "integer"}}},
                                  {"patternProperties": {"^a": {"minimum": 2}, "b$": {"type": "string"}}}]},
     [{"ab": "s"}, {"ax": 2}, {"ax": 1}, {"xb": "s"}, {"xb": 1}, {"c": None}]),
    # multipleOf on integers: both divide
    ({"type": "integer", "allOf": [{"multipleOf": 4}, {"multipleOf": 6}]}, [12, 24, 8, 6, 0]),
    # non-standard keywords never conflict
    ({"allOf": [{"x-tag": 1, "type": "integer"}, {"x-tag": 2, "minimum": 0}]}, [1, -1, "s"]),
]


@pytest.mark.parametrize("schema,docs", MERGE_CASES + UNEVALUATED_CASES)
def test_against_the_validator(check, schema, docs):
    """allOf combinations and unevaluatedProperties, judged as the jsonschema package judges them."""
    acc = check(schema, any_whitespace=False, strict_mode=False)
    oracle = jsonschema.Draft202012Validator(schema)
    for doc in docs:
        text = json.dumps(doc, ensure_ascii=False)
        assert acc(text) == oracle.is_valid(doc), text


def test_unevaluated_properties_next_to_any_of_is_an_error():
    schema = {"allOf": [{"anyOf": [{"properties": {"a": {}}}], "unevaluatedProperties": False}]}
    with pytest.raises(SchemaError) as exc:
        json_schema_to_ir(schema)
    assert exc.value.pointer == "/allOf/0/unevaluatedProperties"


def test_lenient_mode_warns_instead_of_raising(check):
    schema = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    with pytest.raises(SchemaError) as exc:
        json_schema_to_ir(schema)
    assert exc.value.pointer == "/uniqueItems"
    with pytest.warns(xg2.SchemaWarning, match="uniqueItems"):
        acc = check(schema, lenient=True)
    assert_lang(acc, ["[1, 2]", "[1, 1]"], ['["a"]'])


def test_pydantic_model_input(compiler):
    pydantic = pytest.importorskip("pydantic")

    class Point(pydantic.BaseModel):
        x: int
        label: str = "p"

    matcher = xg2.GrammarMatcher(compiler.compile_json_schema(Point))
    assert matcher.accept_string('{"x": 1, "label": "a"}') and matcher.is_completed()
    matcher = xg2.GrammarMatcher(compiler.compile_json_schema(Point))
    assert not matcher.accept_string('{"x": "1"}')


# --- JSONSchemaBench -----------------------------------------------------------------------------

def _valid_under(data, schema, root) -> bool:
    if not isinstance(schema, dict):
        return schema is not False
    full = dict(schema)
    for k in ("$defs", "definitions"):
        if isinstance(root, dict) and k in root and k not in full:
            full[k] = root[k]
    try:
        return jsonschema.validators.validator_for(root)(full).is_valid(data)
    except (jsonschema.exceptions.SchemaError, jsonschema.exceptions.RefResolutionError):
        return True


def _collect(schema, root, data):
    """Schema nodes that apply to `data` at this level (through $ref, allOf, and the anyOf/oneOf
    alternatives `data` is valid under)."""
    out, todo, seen = [], [schema], set()
    while todo and len(out) < 200:
        s = todo.pop(0)
        if not isinstance(s, dict) or id(s) in seen:
            continue
        seen.add(id(s))
        out.append(s)
        found = []  # depth first, in writing order
        if isinstance(s.get("$ref"), str) and s["$ref"].startswith("#"):
            node = root
            for part in s["$ref"][1:].split("/")[1:]:
                part = part.replace("~1", "/").replace("~0", "~")
                node = node.get(part) if isinstance(node, dict) else None
            found.append(node)
        if isinstance(s.get("allOf"), list):
            found += s["allOf"]
        for kw in ("anyOf", "oneOf"):
            if isinstance(s.get(kw), list):
                alts = [a for a in s[kw] if _valid_under(data, a, root)]
                found += alts[:1] or s[kw]
        todo[:0] = found
    return out


def _normalise(data, schemas, root):
    """Reorder object keys into schema order and write integral floats as ints (documented limits)."""
    nodes = [n for s in schemas for n in _collect(s, root, data)]
    if isinstance(data, float) and data.is_integer() and any(
            n.get("type") == "integer" or "integer" in (n.get("type") or []) for n in nodes):
        return int(data)
    if isinstance(data, dict):
        order = []
        for n in nodes:
            for k in n.get("properties", {}) if isinstance(n.get("properties"), dict) else []:
                if k not in order:
                    order.append(k)
        for n in nodes:
            for k in n.get("required", []) if isinstance(n.get("required"), list) else []:
                if k not in order:
                    order.append(k)
        keys = sorted(data, key=lambda k: (order.index(k) if k in order else len(order)))
        out = {}
        for k in keys:
            subs = [n["properties"][k] for n in nodes if isinstance(n.get("properties"), dict) and k in n["properties"]]
            subs += [n["additionalProperties"] for n in nodes if isinstance(n.get("additionalProperties"), dict)]
            out[k] = _normalise(data[k], subs, root)
        return out
    if isinstance(data, list):
        out = []
        for i, x in enumerate(data):
            subs = []
            for n in nodes:
                pre = n.get("prefixItems") if isinstance(n.get("prefixItems"), list) else \
                    n.get("items") if isinstance(n.get("items"), list) else None
                if pre is not None and i < len(pre):
                    subs.append(pre[i])
                elif isinstance(n.get("items"), dict):
                    subs.append(n["items"])
            out.append(_normalise(x, subs, root))
        return out
    return data


@pytest.mark.parametrize("subset", ["Github_easy", "Glaiveai2K"])
def test_jsonschemabench(real_compiler, subset):
    compiler = real_compiler
    path = DATA / f"{subset}.jsonl"
    if not path.exists():
        pytest.skip(f"{path} not found: the benchmark data lives in ../shared beside the checkout")
    stats = {"records": 0, "compiled": 0, "unsupported": 0, "limit": 0, "judged": 0, "right": 0, "false_accept": 0,
                 "false_reject": 0}
    problems = []
    with path.open() as f:
        records = [json.loads(line) for _, line in zip(range(150), f)]
    for rec in records:
        stats["records"] += 1
        schema = rec["schema"]
        try:
            ir = json_schema_to_ir(schema, strict_mode=False)
        except SchemaError:
            stats["unsupported"] += 1
            continue
        except GrammarLimitError:
            stats["limit"] += 1
            continue
        try:
            compiled = compiler.compile_grammar(xg2.Grammar(ir))
        except xg2.GrammarError as exc:  # e.g. a oneOf no object can satisfy: the schema accepts nothing
            assert "accepts no string" in str(exc)
            stats["unsupported"] += 1
            continue
        stats["compiled"] += 1
        for t in rec["tests"]:
            data, valid = t["data"], t["valid"]
            texts = [json.dumps(data, ensure_ascii=False)]
            texts.append(json.dumps(_normalise(data, [schema], schema), ensure_ascii=False))
            accepted = False
            for text in texts:
                m = xg2.GrammarMatcher(compiled)
                if m.accept_string(text) and m.is_completed():
                    accepted = True
                    break
            stats["judged"] += 1
            if accepted == valid:
                stats["right"] += 1
            elif accepted:
                stats["false_accept"] += 1
                problems.append((rec["id"], "accepted invalid", texts[0][:200]))
            else:
                stats["false_reject"] += 1
                problems.append((rec["id"], "rejected valid", texts[-1][:200]))
    print(subset, stats)
    for p in problems[:20]:
        print("  ", p)
    assert stats["compiled"] >= 50
    assert not problems, problems[:5]


# --- soundness: random documents drawn from the grammar validate ---------------------------------

def _random_doc(compiled, rng: random.Random, limit: int = 400) -> str | None:
    """Walk the grammar byte by byte with a random choice among the allowed bytes."""
    m = xg2.GrammarMatcher(compiled)
    out = bytearray()
    for _ in range(limit):
        if m.is_completed() and (rng.random() < 0.3 or not m._core.allowed_bytes()):
            return out.decode("utf-8")
        allowed = list(m._core.allowed_bytes())
        if not allowed:
            return None
        # prefer printable ASCII to keep documents short and decodable
        pref = [b for b in allowed if 0x20 <= b < 0x7F] or allowed
        b = rng.choice(pref)
        assert m.accept_string(bytes([b]))
        out.append(b)
    return None


@pytest.mark.parametrize("schema", [
    OBJ, DOC_SCHEMA, {"type": "integer", "minimum": -20, "maximum": 1234},
    {"type": "array", "prefixItems": [{"type": "integer"}, {"enum": ["a", None]}], "items": {"type": "boolean"},
     "minItems": 1, "maxItems": 4},
    {"type": "object", "properties": {"ab": {"type": "null"}, "abc": {"type": "null"}}, "additionalProperties": {"type": "integer"}},
    {"type": "string", "minLength": 1, "maxLength": 3},
])
def test_random_walk_sound(compiler, schema):
    compiled = compiler.compile_grammar(xg2.Grammar(json_schema_to_ir(schema)))
    rng = random.Random(0)
    strict = json.loads(json.dumps(schema))
    if isinstance(strict, dict) and strict.get("type") == "object" and "additionalProperties" not in strict:
        strict["additionalProperties"] = False
    found = 0
    for _ in range(150):
        text = _random_doc(compiled, rng)
        if text is None:
            continue
        found += 1
        doc = json.loads(text)
        assert jsonschema.Draft202012Validator(strict).is_valid(doc), (text, schema)
    assert found > 20


def test_members_share_bounded_string_and_key_rules():
    """Members with the same string bounds, and objects with the same key patterns, call one rule
    each, so their mask entries are built once per grammar instead of once per member."""
    pp = {"type": "object", "patternProperties": {"^[a-z]+$": {"type": "integer"}}, "additionalProperties": False}
    schema = {"type": "object", "properties": {
        "a": {"type": "string", "maxLength": 128}, "b": {"type": "string", "maxLength": 128},
        "c": {"type": "string", "maxLength": 50}, "x": pp, "y": pp | {"minProperties": 1}}}
    ir = json_schema_to_ir(schema)
    names = [r.name for r in ir.rules]
    assert names.count("string_0_128") == 1 and names.count("string_0_50") == 1
    assert sum(n == "key" or n.startswith("key_") and not n.startswith("key_state") for n in names) == 1


# --- issue 15: sibling-dependent keywords, propertyNames, open objects, depth --------------------

#: A vocabulary of every byte and a stop token: JSON Schema tests need no real tokenizer.
TINY_VOCAB = [bytes([b]) for b in range(256)] + [b"</s>"]


@pytest.fixture(scope="module")
def tiny_compiler():
    return xg2.GrammarCompiler(xg2.TokenizerInfo(TINY_VOCAB, xg2.VocabType.RAW, stop_token_ids=[256]))


def _accepts(compiled, text: str) -> bool:
    m = xg2.GrammarMatcher(compiled)
    return m.accept_string(text) and m.accept_token(256)


@pytest.mark.parametrize("schema,docs", [
    ({"allOf": [{"prefixItems": [{"minimum": 3}]}], "items": {"minimum": 5}}, [[3, 5], [3], [5, 5], [5, 4], [3, 6, 4]]),
    ({"allOf": [{"items": {"minimum": 5}}], "prefixItems": [{"minimum": 3}]}, [[3, 5], [5], [3], [5, 4]]),
    ({"$defs": {"p": {"prefixItems": [{"type": "integer"}, {"type": "string"}]}}, "$ref": "#/$defs/p",
      "prefixItems": [{"minimum": 1}], "items": {"type": ["string", "integer"]}}, [[1, "a", 2], [0, "a"], [1, 2], [1]]),
    ({"allOf": [{"patternProperties": {"^a": {}}}], "additionalProperties": False}, [{"ab": 1}, {}, {"b": 1}]),
    ({"anyOf": [{"patternProperties": {"^a": {"type": "integer"}}}], "properties": {"b": {}},
      "additionalProperties": False}, [{"ab": 1}, {"b": 1}, {"b": 1, "ab": 2}]),
    ({"allOf": [{"properties": {"a": {}}, "additionalProperties": False}], "patternProperties": {"^b": {}}},
     [{"a": 1}, {"b": 1}, {"ab": 1}, {}]),
    ({"allOf": [{"patternProperties": {"^a": {"maximum": 1}}, "additionalProperties": {"type": "string"}}],
      "properties": {"ab": {}, "c": {}}}, [{"ab": 1}, {"ab": 2}, {"c": "s"}, {"c": 1}, {"ab": 1, "c": "s"}]),
    ({"allOf": [{"patternProperties": {"^a": {"type": "integer"}}}, {"additionalProperties": {"type": "string"}}]},
     [{"ab": 1}, {"ab": "s"}, {"b": "s"}, {"b": 1}]),
    ({"propertyNames": False, "properties": {"ab": {}}}, [{"ab": 1}, {}]),
    ({"propertyNames": {"maxLength": 1}, "properties": {"a": {}, "ab": {}}}, [{"a": 1}, {"ab": 1}, {}]),
    ({"allOf": [{"propertyNames": {"maxLength": 1}}], "propertyNames": {"pattern": "^[ab]"},
      "properties": {"a": {}, "ab": {}, "c": {}}}, [{"a": 1}, {"ab": 1}, {"c": 1}, {"b": 1}]),
    ({"type": "object", "oneOf": [{"required": ["foo", "bar"]}, {"required": ["foo", "baz"]}]},
     [{"foo": 1, "bar": 2}, {"foo": 1, "baz": 2}, {"foo": 1, "bar": 2, "baz": 3}, {"foo": 1}, {}]),
    ({"not": {"required": ["a"]}}, [{}, {"a": 1}, 1, "s", None]),
    ({"type": "string", "contentMediaType": "application/json", "contentEncoding": "base64",
      "contentSchema": {"type": "object"}}, ["eyJ9", "x", 1]),
])
@pytest.mark.parametrize("strict", [True, False])
def test_issue15_cases_against_the_validator(tiny_compiler, schema, docs, strict):
    """Each compiles and never accepts a document jsonschema rejects; on these documents the result is
    exact too, except where strict_mode closes an object (then only fewer are accepted)."""
    compiled = tiny_compiler.compile_json_schema(schema, strict_mode=strict, any_whitespace=False)
    oracle = jsonschema.Draft202012Validator(schema)
    for doc in docs:
        got = _accepts(compiled, json.dumps(doc))
        if strict:
            assert not got or oracle.is_valid(doc), doc
        else:
            assert got == oracle.is_valid(doc), doc


def test_issue15_exact_cases(tiny_compiler):
    def acc(schema, text):
        return _accepts(tiny_compiler.compile_json_schema(schema), text)

    items = {"allOf": [{"prefixItems": [{"minimum": 3}]}], "items": {"minimum": 5}}
    assert acc(items, "[5, 5, 9]") and not acc(items, "[3, 5]") and not acc(items, "[5, 4]")
    members = {"allOf": [{"patternProperties": {"^a": {}}}], "additionalProperties": False}
    assert acc(members, "{}") and not acc(members, '{"ab": 1}')
    names = {"propertyNames": False, "properties": {"ab": {}}}
    assert acc(names, "{}") and not acc(names, '{"ab": 1}')
    with pytest.raises(SchemaError, match="accepts no JSON value"):  # a required name ruled out by propertyNames
        json_schema_to_ir({"type": "object", "propertyNames": {"maxLength": 1}, "properties": {"ab": {}}, "required": ["ab"]})


def test_lenient_one_of_over_required_sets_not_listed(tiny_compiler):
    import warnings

    schema = {"type": "object", "oneOf": [{"required": ["foo", "bar"]}, {"required": ["foo", "baz"]}]}
    for strict in (True, False):
        with warnings.catch_warnings():
            warnings.simplefilter("error")      # enforced exactly: nothing is relaxed
            compiled = tiny_compiler.compile_json_schema(schema, lenient=True, strict_mode=strict)
        assert _accepts(compiled, '{"foo": 1, "bar": 2}') and _accepts(compiled, '{"foo": 1, "baz": 2}')
        for bad in ('{"foo": 1, "bar": 2, "baz": 3}', '{"foo": 1}', "{}"):
            assert not _accepts(compiled, bad)
        assert _accepts(compiled, '{"foo": 1, "bar": 2, "q": 3}') != strict  # strict: closed to the named keys


def test_content_keywords_are_annotations():
    for kw, value in [("contentSchema", {"type": "object"}), ("contentMediaType", "application/json"),
                      ("contentEncoding", "base64")]:
        json_schema_to_ir({"type": "string", kw: value})
        json_schema_to_ir({"enum": ["a"], kw: value})       # the validator ignores them too


#: Object schemas and documents, compiled side by side with xgrammar in both strict modes. Left out,
#: where xgrammar is not sound: `required` without `properties` (xgrammar drops the member, so
#: strict mode gives `{}` only) and `minProperties` in strict mode (xgrammar refuses it).
OPEN_OBJECTS = [
    {"type": "object"}, {}, {"type": "object", "title": "free-form"}, {"type": "object", "properties": {}},
    {"type": "object", "properties": {"x": {}}}, {"type": "object", "patternProperties": {"^a": {}}},
    {"type": "object", "patternProperties": {}}, {"type": "object", "propertyNames": {"pattern": "^a"}},
    {"type": "object", "propertyNames": {"maxLength": 3}}, {"type": "object", "additionalProperties": True},
    {"type": "object", "additionalProperties": {"type": "integer"}}, {"type": "object", "maxProperties": 2},
    {"type": "object", "dependentRequired": {}}, {"type": "object", "unevaluatedProperties": False},
    {"type": "object", "properties": {"o": {"type": "object"}}},
    {"type": "object", "allOf": [{"properties": {"x": {}}}]},
    {"type": "object", "propertyNames": {"pattern": "^a"}, "properties": {"b": {}}},
    {"type": "array"}, {"type": "array", "prefixItems": [{"type": "integer"}]},
]
OPEN_DOCS = ["{}", '{"a": 1}', '{"x": 1}', '{"a": {"b": [1]}}', '{"o": {"a": 1}}', '{"b": 1}', '{"x": 1, "a": 2}',
             "[]", "[1]", "[1, 2]"]


def test_open_objects_as_in_xgrammar(tiny_compiler):
    import xgrammar as xgr  # a declared test dependency: its absence fails the test
    info = xgr.TokenizerInfo([chr(b) if 32 <= b < 127 else f"<0x{b:02X}>" for b in range(256)] + ["</s>"],
                             xgr.VocabType.BYTE_FALLBACK, stop_token_ids=[256])
    theirs = xgr.GrammarCompiler(info)
    for schema in OPEN_OBJECTS:
        for strict in (True, False):
            ours = tiny_compiler.compile_json_schema(schema, strict_mode=strict)
            other = theirs.compile_json_schema(json.dumps(schema), strict_mode=strict)
            valid = jsonschema.Draft202012Validator(schema).is_valid
            for doc in OPEN_DOCS:
                m = xgr.GrammarMatcher(other)
                expected = m.accept_string(doc) and m.accept_token(256)
                if expected and not valid(json.loads(doc)):
                    expected = False    # xgrammar accepts an invalid document; xg2 never does
                elif not strict and not expected and valid(json.loads(doc)):
                    expected = True     # without strict_mode, xgrammar closes patternProperties objects
                assert _accepts(ours, doc) == expected, (schema, strict, doc)


# Deep nesting, as dicts: every walk over tenant input is bounded (a typed error, never RecursionError).
def _nest(wrap, n: int, leaf=None):
    s = {"type": "integer"} if leaf is None else leaf
    for i in range(n):
        s = wrap(s, i)
    return s


def _ref_chain(n: int, extra: dict) -> dict:
    defs = {f"a{i}": {"$ref": f"#/$defs/a{i + 1}", **extra} for i in range(n)}
    defs[f"a{n}"] = {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/a0"}


DEEP_VALUE = _nest(lambda s, i: [s], 5000, 1)
DEEP_SCHEMAS = {
    "anyOf": _nest(lambda s, i: {"anyOf": [s]}, 600),
    "anyOf_two_branches": _nest(lambda s, i: {"anyOf": [s, {"type": "null"}]}, 600),
    "allOf": _nest(lambda s, i: {"allOf": [s], "minimum": i}, 600),
    "oneOf": _nest(lambda s, i: {"oneOf": [s, {"type": "string"}]}, 600),
    "not": _nest(lambda s, i: {"not": s}, 600),
    "not_anyOf": {"not": _nest(lambda s, i: {"anyOf": [s]}, 10000, {"type": "null"})},
    "properties": _nest(lambda s, i: {"type": "object", "properties": {"a": s}}, 10000),
    "items": _nest(lambda s, i: {"type": "array", "items": s}, 10000),
    "prefixItems": _nest(lambda s, i: {"type": "array", "prefixItems": [s]}, 10000),
    "additionalProperties": _nest(lambda s, i: {"type": "object", "additionalProperties": s}, 10000),
    "patternProperties": _nest(lambda s, i: {"type": "object", "patternProperties": {"^a": s}}, 10000),
    "propertyNames": {"propertyNames": _nest(lambda s, i: {"allOf": [s]}, 10000, {"maxLength": 3})},
    "merged_properties": {"allOf": [_nest(lambda s, i: {"properties": {"a": s}}, 10000)] * 2},
    "enum_value": {"enum": [DEEP_VALUE]},
    "const_value": {"const": _nest(lambda s, i: {"a": s}, 5000, 1)},
    "merged_enums": {"allOf": [{"enum": [DEEP_VALUE]}, {"enum": [_nest(lambda s, i: [s], 5000, 1)]}]},
    "validated_deep": _nest(lambda s, i: {"type": "array", "items": s}, 120,
                            {"enum": [_nest(lambda s, i: [s], 250, 1)], **_nest(lambda s, i: {"items": s}, 250, {})}),
    "ref_chain": _ref_chain(10000, {}),
    "ref_chain_merged": _ref_chain(10000, {"minimum": 0}),
    "ref_cycle": {"$defs": {"a": {"$ref": "#/$defs/b", "minimum": 1}, "b": {"$ref": "#/$defs/a", "maximum": 5}},
                  "$ref": "#/$defs/a"},
    "not_ref_cycle": {"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}]}}, "not": {"$ref": "#/$defs/a"}},
    # deep but short (a reference straight to the leaf), within the document's nesting limit
    "definitions": {"$defs": _nest(lambda s, i: {"x": {"$defs": s}}, 120, {"y": {"type": "integer"}}),
                    "$ref": "#/$defs" + "/x/$defs" * 120 + "/y"},
    # past it: refused unread, whatever the reference reaches
    "definitions_past_the_document_limit": {
        "$defs": _nest(lambda s, i: {"x": {"$defs": s}}, 10000, {"y": {"type": "integer"}}),
        "$ref": "#/$defs" + "/x/$defs" * 10000 + "/y"},
    "unevaluated": _nest(lambda s, i: {"allOf": [s], "unevaluatedProperties": False}, 600),
}


@pytest.mark.parametrize("name", list(DEEP_SCHEMAS))
def test_deep_nesting_is_typed(tiny_compiler, name):
    import warnings

    schema = DEEP_SCHEMAS[name]
    for compile_it in (lambda: json_schema_to_ir(schema), lambda: tiny_compiler.compile_json_schema(schema),
                       lambda: json_schema_to_ir(schema, strict_mode=False, lenient=True)):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", xg2.SchemaWarning)
                compile_it()
        except GrammarLimitError as exc:
            assert exc.pointer is not None or "line" in str(exc), exc   # says where (in the schema or a pattern)
        except SchemaError as exc:
            assert exc.pointer, exc
    if name == "definitions":   # deep but short: a reference straight to the leaf
        assert _accepts(tiny_compiler.compile_json_schema(schema), "12")
    if name == "definitions_past_the_document_limit":
        with pytest.raises(GrammarLimitError, match="nested deeper than"):
            tiny_compiler.compile_json_schema(schema)


def test_free_form_xml_arguments_are_open(tiny_compiler):
    """A tool whose parameters name no member takes any arguments in the XML styles too."""
    for style, arg in [("qwen_xml", "<parameter=x>\nhello\n</parameter>"),
                       ("glm_xml", "<arg_key>x</arg_key><arg_value>1</arg_value>")]:
        free = tiny_compiler.compile_grammar(xg2.Grammar(json_schema_to_ir({"type": "object"}, style=style)))
        listed = tiny_compiler.compile_grammar(xg2.Grammar(json_schema_to_ir(
            {"type": "object", "properties": {"a": {"type": "string"}}}, style=style)))
        assert _accepts(free, "") and _accepts(free, arg)
        assert _accepts(listed, "") and not _accepts(listed, arg)


def test_embedded_resources_resolve_against_their_own_id(tiny_compiler):
    """A `$ref` inside a subschema with its own `$id` resolves against that resource (here to an
    integer, where the root's pointer would give a string), as the validator resolves it."""
    schema = {"$defs": {"B": {"type": "string"},
                        "A": {"$id": "http://example.com/a", "$defs": {"B": {"type": "integer"}}, "$ref": "#/$defs/B"}},
              "$ref": "#/$defs/A"}
    compiled = tiny_compiler.compile_json_schema(schema)
    for doc in ['"x"', "1"]:
        assert _accepts(compiled, doc) == jsonschema.Draft202012Validator(schema).is_valid(json.loads(doc)), doc
    # a plain-name fragment, or an $id that only appears in data, changes no base
    json_schema_to_ir({"$defs": {"B": {"$id": "#b", "type": "string"}}, "$ref": "#/$defs/B"})
    json_schema_to_ir({"$defs": {"B": {"const": {"$id": "http://example.com/x"}}}, "$ref": "#/$defs/B"})
    with pytest.raises(SchemaError) as exc:     # a remote document nobody registered
        json_schema_to_ir({"properties": {"a": {"$ref": "http://example.com/other.json"}}})
    assert exc.value.pointer == "/properties/a/$ref" and "schema_store" in exc.value.message


def test_keywords_without_their_partner_mean_nothing(tiny_compiler):
    for schema, docs in [({"type": "integer", "then": {"type": "string"}, "else": False}, ["1", '"a"']),
                         ({"type": "array", "minContains": 2, "maxContains": 0}, ["[]", "[1, 2]", "1"])]:
        compiled = tiny_compiler.compile_json_schema(schema)
        for doc in docs:
            assert _accepts(compiled, doc) == jsonschema.Draft202012Validator(schema).is_valid(json.loads(doc)), doc
    # `then` beside an allOf whose member holds the `if`: separate schemas, so neither means anything
    schema = {"allOf": [{"if": {"type": "integer"}}], "then": {"minimum": 3}}
    compiled = tiny_compiler.compile_json_schema(schema)
    for doc in ["1", "5", '"a"']:
        assert _accepts(compiled, doc) == jsonschema.Draft202012Validator(schema).is_valid(json.loads(doc)), doc


# --- unevaluatedItems, recursion through a union, and why a schema accepts nothing --------------

@pytest.mark.parametrize("schema, verdicts", [
    ({"prefixItems": [{"type": "integer"}], "unevaluatedItems": {"type": "string"}},
     {"[]": True, "[1]": True, '[1, "a", "b"]': True, "[1, 2]": False, '["a"]': False}),
    ({"$schema": "https://json-schema.org/draft/2019-09/schema",          # the array form of items
      "items": [{"type": "integer"}], "unevaluatedItems": False}, {"[1]": True, "[1, 2]": False}),
    ({"type": "array", "unevaluatedItems": False}, {"[]": True, "[1]": False}),
    ({"items": {"type": "integer"}, "unevaluatedItems": False}, {"[1, 2]": True, '["a"]': False}),
    # evaluated by an in-place subschema: allOf and $ref members count
    ({"allOf": [{"prefixItems": [{"type": "integer"}]}], "unevaluatedItems": {"type": "string"}},
     {'[1, "a"]': True, "[1, 2]": False}),
    ({"$defs": {"P": {"prefixItems": [True, True]}}, "$ref": "#/$defs/P", "unevaluatedItems": False},
     {'[1, "a"]': True, "[1, 2, 3]": False}),
    # next to anyOf, each branch sees its own evaluated items: exact, as they are initial segments
    ({"anyOf": [{"prefixItems": [{"type": "integer"}]}, {"type": "array"}], "unevaluatedItems": False},
     {"[]": True, "[1]": True, "[1, 2]": False, '["a"]': False}),
])
def test_unevaluated_items(check, schema, verdicts):
    accepts = check(schema)
    for doc, ok in verdicts.items():
        validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        assert accepts(doc) == ok == validator(schema).is_valid(json.loads(doc)), doc


def test_unevaluated_items_errors():
    with pytest.raises(SchemaError) as exc:
        json_schema_to_ir({"type": "array", "unevaluatedItems": "x"})
    assert exc.value.pointer == "/unevaluatedItems" and "must be a boolean or an object" in exc.value.message
    with pytest.raises(SchemaError) as exc:     # the branch that holds decides which items are evaluated
        json_schema_to_ir({"allOf": [{"contains": {"type": "integer"}, "unevaluatedItems": False,
                                      "anyOf": [{"prefixItems": [True]}, {"minItems": 2}]}]})
    assert "anyOf" in exc.value.message


def test_a_union_that_refers_back_to_itself(check):
    """A branch that leads back to its own union (with keywords beside it, here `type`) is that
    union again: a rule, not an unfolding without end. The language is the least fixed point."""
    defs = {"V": {"anyOf": [{"type": "string", "maxLength": 2}, {"$ref": "#/$defs/V"}]}}
    accepts = check({"$defs": defs, "type": ["string", "integer"], "$ref": "#/$defs/V"})
    assert accepts('"ab"') and not accepts('"abc"') and not accepts("1")
    accepts = check({"$defs": defs, "type": "object", "properties": {"v": {"type": "string", "$ref": "#/$defs/V"}}})
    assert accepts('{"v": "ab"}') and not accepts('{"v": "abc"}') and not accepts('{"v": 1}')


@pytest.mark.parametrize("schema, pointer, words", [
    ({"type": "array", "minItems": 5, "maxItems": 3}, "", "minItems is greater than maxItems: 5 > 3"),
    ({"type": "array", "prefixItems": [{}, {}], "items": False, "minItems": 3}, "",
     "minItems is greater than the number of prefixItems, but additional items are not allowed: 3 > 2"),
    ({"type": "array", "prefixItems": [{}, False], "minItems": 2}, "/prefixItems/1", "item 1 accepts no value"),
    ({"type": "object", "minProperties": 5, "maxProperties": 3}, "", "minProperties is greater than maxProperties"),
    ({"type": "object", "maxProperties": 1, "required": ["a", "b"]}, "",
     "maxProperties is less than the number of required properties: 1 < 2"),
    ({"type": "object", "properties": {"a": {}}, "additionalProperties": False, "minProperties": 2}, "",
     "minProperties is greater than the number of properties, but additional properties aren't allowed"),
    ({"type": "integer", "minimum": 5, "maximum": 6, "multipleOf": 7}, "/multipleOf",
     "range contains no multipleOf value"),
])
def test_why_a_schema_accepts_nothing(schema, pointer, words):
    with pytest.raises(SchemaError) as exc:
        json_schema_to_ir(schema)
    assert exc.value.pointer == pointer and "accepts no JSON value" in exc.value.message
    assert words in exc.value.message
    # inside a union the same part is just an empty branch
    assert json_schema_to_ir({"anyOf": [schema, {"type": "null"}]}) is not None


@pytest.mark.parametrize("schema, pointer, words", [
    ({"type": "integer", "multipleOf": "x"}, "/multipleOf", "Value must be a number"),
    ({"type": "number", "multipleOf": 0}, "/multipleOf", "multipleOf must be greater than 0"),
    ({"type": "integer", "multipleOf": -2}, "/multipleOf", "multipleOf must be greater than 0"),
    ({"minItems": "3"}, "/minItems", "minItems must be an integer"),
    ({"maxItems": -1}, "/maxItems", "maxItems must be a non-negative integer"),
    ({"prefixItems": ["x"]}, "/prefixItems/0", "prefixItems must be an array of objects or booleans"),
    ({"items": [{}, 1]}, "/items/1", "items must be an array of objects or booleans"),
    ({"items": "x"}, "/items", "items must be a boolean or an object"),
    ({"items": [{}], "additionalItems": 3}, "/additionalItems", "additionalItems must be a boolean or an object"),
    ({"type": "object", "propertyNames": "x"}, "/propertyNames", "propertyNames must be an object"),
])
def test_keyword_value_errors(schema, pointer, words):
    with pytest.raises(SchemaError) as exc:
        json_schema_to_ir(schema if "type" in schema else {"type": "array", **schema})
    assert exc.value.pointer == pointer and words in exc.value.message


def test_multiple_of_up_to_1024_over_a_wide_range(check):
    accepts = check({"type": "integer", "multipleOf": 1024})
    assert all(accepts(d) for d in ["0", "1024", "-2048", "1048576"])
    assert not any(accepts(d) for d in ["1000", "1025", "-1"])
    accepts = check({"type": "integer", "multipleOf": 1025, "minimum": 3})     # remainder automaton and range
    assert all(accepts(d) for d in ["1025", "2050", "1025000"]) and not any(accepts(d) for d in ["0", "1026", "-1025"])
    with pytest.raises(SchemaError) as exc:
        json_schema_to_ir({"type": "integer", "multipleOf": 4099})
    assert exc.value.pointer == "/multipleOf"
