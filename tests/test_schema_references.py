"""References (`$id`, `$anchor`, `$dynamicRef`, URNs, registered documents), `format` as an
annotation, and spellings of listed values, judged side by side with the `jsonschema` package
(and its `referencing` registry for registered documents)."""

from __future__ import annotations

import json

import jsonschema
import pytest
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

import xg2
from xg2.grammar.json_schema import json_schema_to_ir

STORE = {"https://other.example/s.json": {"$defs": {"n": {"type": "integer", "minimum": 2}}}}
CASES = [
    # relative $id, $anchor inside another resource, a plain pointer
    ({"$id": "https://ex.example/root.json",
      "$defs": {"a": {"$id": "a.json", "type": "integer", "$defs": {"b": {"$anchor": "bb", "type": "string"}}}},
      "properties": {"x": {"$ref": "a.json"}, "y": {"$ref": "a.json#bb"}, "z": {"$ref": "#/$defs/a"}}},
     [{"x": 1}, {"x": "s"}, {"y": "s"}, {"y": 1}, {"z": 2}, {"z": "s"}], None),
    # a URN base: fragments only
    ({"$id": "urn:uuid:deadbeef-1234-ffff-ffff-4321feebdaed", "$defs": {"s": {"type": "string"}},
      "properties": {"x": {"$ref": "urn:uuid:deadbeef-1234-ffff-ffff-4321feebdaed#/$defs/s"}}},
     [{"x": "a"}, {"x": 1}], None),
    # a registered document
    ({"$ref": "https://other.example/s.json#/$defs/n"}, [1, 2, "a"], STORE),
    # the document's own resource declares the anchor: outermost in every scope, so it wins
    ({"$id": "https://ex.example/strict", "$dynamicAnchor": "node", "$ref": "tree", "unevaluatedProperties": False,
      "$defs": {"tree": {"$id": "tree", "$dynamicAnchor": "node", "type": "object",
                         "properties": {"data": True, "children": {"type": "array", "items": {"$dynamicRef": "#node"}}}}}},
     [{"children": [{"daat": 1}]}, {"children": [{"data": 1}]}, {"data": 1}], None),
    # $dynamicRef to the one resource declaring the anchor: a static reference
    ({"$dynamicAnchor": "node", "type": "object", "properties": {"c": {"type": "array", "items": {"$dynamicRef": "#node"}}}},
     [{"c": [{}]}, {"c": [1]}, {"c": [{"c": [{}]}]}], None),
    ({"$defs": {"foo": {"$anchor": "foo", "type": "integer"}}, "$ref": "#foo"}, [1, "a"], None),
    # draft 7: an $id fragment is an anchor
    ({"$schema": "http://json-schema.org/draft-07/schema#", "definitions": {"a": {"$id": "#foo", "type": "integer"}},
      "properties": {"p": {"$ref": "#foo"}}}, [{"p": 1}, {"p": "a"}], None),
    # pointers with escapes into keys that need them
    ({"$defs": {"a/b": {"type": "integer"}, "c%d": {"type": "string"}},
      "properties": {"x": {"$ref": "#/$defs/a~1b"}, "y": {"$ref": "#/$defs/c%25d"}}},
     [{"x": 1}, {"x": "s"}, {"y": "s"}, {"y": 1}], None),
    # listed objects in any member order; an integral float listed is the integer
    ({"const": {"a": 1, "b": [1, {"x": 1, "y": 2}]}},
     [{"a": 1, "b": [1, {"x": 1, "y": 2}]}, {"b": [1, {"y": 2, "x": 1}], "a": 1}, {"a": 1}], None),
    ({"enum": [{"a": 1, "b": 2}, -2.0]}, [{"b": 2, "a": 1}, -2, {"a": 1}], None),
]


def _accepts(compiled, doc) -> bool:
    m = xg2.GrammarMatcher(compiled)
    return m.accept_string(json.dumps(doc, ensure_ascii=False)) and m.accept_token(256)


@pytest.mark.parametrize("schema, docs, store", CASES, ids=[json.dumps(c[0])[:50] for c in CASES])
def test_agrees_with_jsonschema(byte_compiler, schema, docs, store):
    compiled = byte_compiler.compile_json_schema(schema, strict_mode=False, schema_store=store)
    registry = Registry().with_resources(
        [(uri, Resource.from_contents(doc, default_specification=DRAFT202012)) for uri, doc in (store or {}).items()])
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)(
        schema, registry=registry)
    for doc in docs:
        assert _accepts(compiled, doc) == validator.is_valid(doc), (schema, doc)


def test_references_that_cannot_be_resolved_are_typed_errors():
    with pytest.raises(xg2.SchemaError) as exc:
        json_schema_to_ir({"properties": {"a": {"$ref": "https://nowhere.example/x.json"}}})
    assert exc.value.pointer == "/properties/a/$ref" and "schema_store" in exc.value.message
    with pytest.raises(xg2.SchemaError) as exc:
        json_schema_to_ir({"$ref": "#missing"})
    assert exc.value.pointer == "/$ref"
    # two resources declare the anchor and the document's own does not: the path decides
    two = {"$id": "https://ex.example/t", "$defs": {
        "a": {"$id": "a", "$dynamicAnchor": "n", "items": {"$dynamicRef": "#n"}},
        "o": {"$id": "o", "$dynamicAnchor": "n", "type": "integer", "$ref": "a"}}, "$ref": "o"}
    with pytest.raises(xg2.SchemaError, match="evaluation path"):
        json_schema_to_ir(two)


def test_format_as_annotation(byte_compiler):
    schema = {"type": "string", "format": "date"}
    asserted = byte_compiler.compile_json_schema(schema)
    annotated = byte_compiler.compile_json_schema(schema, format_assertion=False)
    assert _accepts(asserted, "2024-01-31") and not _accepts(asserted, "06/19/1963")
    assert _accepts(annotated, "2024-01-31") and _accepts(annotated, "06/19/1963")
    # the validator that filters listed values reads the option too
    listed = {"enum": ["2024-01-31", "06/19/1963"], "format": "date"}
    assert not _accepts(byte_compiler.compile_json_schema(listed), "06/19/1963")
    assert _accepts(byte_compiler.compile_json_schema(listed, format_assertion=False), "06/19/1963")


@pytest.mark.parametrize("escapes", ["non_ascii", "all"])
def test_escaped_spellings_of_constrained_strings(byte_compiler, escapes):
    """Keys, listed values, patterns and formats are judged by their value: a non-ASCII character
    written as a \\u escape (or a surrogate pair) is accepted as its raw spelling is; with
    string_escapes="all", printable ASCII too."""
    schema = {"type": "object", "properties": {"café": {"enum": ["naïve", "x😀"]}, "p": {"pattern": "^é+$"},
                                               "d": {"type": "string", "format": "date"}},
              "additionalProperties": False}
    compiled = byte_compiler.compile_json_schema(schema, string_escapes=escapes)

    def accepts(text: str) -> bool:
        m = xg2.GrammarMatcher(compiled)
        return m.accept_string(text) and m.accept_token(256)

    for doc in [{"café": "naïve"}, {"café": "x😀"}, {"p": "éé"}, {"d": "2024-01-31"}]:
        assert accepts(json.dumps(doc)) and accepts(json.dumps(doc, ensure_ascii=False)), doc
    assert accepts('{"caf\\u00E9": "na\\u00efve"}') and accepts('{"caf\\u00e9": "x\\uD83D\\uDE00"}')
    assert not accepts('{"caf\\u00e9": "x\\ud83d"}')        # a lone surrogate is no character
    assert not accepts('{"cafe": "naive"}') and not accepts('{"p": "\\u00e8"}')
    ascii_escaped = '{"d": "\\u0032024-01-31"}'
    assert accepts(ascii_escaped) == (escapes == "all")
    with pytest.raises(ValueError):
        json_schema_to_ir({"type": "string"}, string_escapes="some")


def test_integers_as_numbers(byte_compiler):
    """JSON Schema counts 1.0 and 1e2 as integers: accepted with integers_as_numbers (canonical by
    default), the value still judged by the schema's bounds and multiples (an exponent only where
    nothing bounds the value: 1e1 under a maximum is refused though valid)."""
    cases = [({"type": "integer"}, ["1", "1.0", "1e2", "-2.00", "0E+1"], ["1.5", "1e-1"]),
             ({"type": "integer", "minimum": 0, "maximum": 10}, ["3.0", "10"], ["11.0", "-1.0", "1e1"]),
             ({"type": "integer", "multipleOf": 3}, ["3.00", "-6"], ["4.0"]),
             ({"enum": [1, -2.0]}, ["1.0", "-2", "-2.0"], ["2", "1.5"])]
    for schema, good, bad in cases:
        compiled = byte_compiler.compile_json_schema(schema, integers_as_numbers=True)
        canonical = byte_compiler.compile_json_schema(schema)
        validator = jsonschema.Draft202012Validator(schema)
        for text in good + bad:
            m = xg2.GrammarMatcher(compiled)
            got = m.accept_string(text) and m.accept_token(256)
            assert got == (text in good), (schema, text)
            assert not got or validator.is_valid(json.loads(text)), (schema, text)     # sound
            assert got or text == "1e1" or not validator.is_valid(json.loads(text)), (schema, text)
            m = xg2.GrammarMatcher(canonical)
            assert not (m.accept_string(text) and m.accept_token(256)) or text == str(int(json.loads(text)))


def test_an_id_written_as_a_path():
    """An `$id` written as if it were a JSON pointer starts a resource the `$ref`s inside it miss:
    a located error, and in lenient mode the pointer is read from the root with a warning."""
    schema = {"definitions": {"c": {"type": "string"}},
              "properties": {"x": {"$id": "/properties/x", "$ref": "#/definitions/c"}}}
    with pytest.raises(xg2.SchemaError) as exc:
        json_schema_to_ir(schema)
    assert exc.value.pointer == "/properties/x/$ref" and "does not resolve" in exc.value.message
    with pytest.warns(xg2.SchemaWarning, match="document's root"):
        json_schema_to_ir(schema, lenient=True)


def test_options_and_registered_documents_travel_with_a_serialized_grammar(byte_compiler):
    """A serialized JSON Schema grammar names its source: the new options and the registered
    documents are part of it, so the grammar rebuilt elsewhere is the same language."""
    schema = {"properties": {"a": {"$ref": "https://o.example/s.json#/$defs/n"},
                             "b": {"type": "string", "format": "date"}}}
    compiled = byte_compiler.compile_json_schema(schema, schema_store=STORE_INT, format_assertion=False,
                                                 integers_as_numbers=True)
    options = json.loads(compiled._source[1])["options"]
    assert options["format_assertion"] is False and options["integers_as_numbers"] is True
    assert options["schema_store"] == STORE_INT
    loaded = byte_compiler.deserialize(compiled.serialize())
    for text, ok in [('{"a": 1.0, "b": "06/19/1963"}', True), ('{"a": "s"}', False)]:
        m = xg2.GrammarMatcher(loaded)
        assert (m.accept_string(text) and m.accept_token(256)) == ok, text


STORE_INT = {"https://o.example/s.json": {"$defs": {"n": {"type": "integer"}}}}
