"""Structural tags nested past any sane depth raise a typed limit error with a pointer, as a dict or
as JSON text; nested within the limit, they compile (no RecursionError anywhere on the way)."""

from __future__ import annotations

import json

import pytest

import xg2
from xg2.grammar.structural_tag import MAX_FORMAT_DEPTH


def _nested(kind: str, depth: int) -> dict:
    fmt: dict = {"type": "const_string", "value": "x"}
    for _ in range(depth - 1):
        if kind == "sequence":
            fmt = {"type": "sequence", "elements": [fmt]}
        elif kind == "or":
            fmt = {"type": "or", "elements": [fmt, {"type": "const_string", "value": "y"}]}
        elif kind == "tag":
            fmt = {"type": "tag", "begin": "<a>", "content": fmt, "end": "</a>"}
        elif kind == "optional":
            fmt = {"type": "optional", "content": fmt}
        elif kind == "tags_with_separator":
            fmt = {"type": "tags_with_separator", "separator": ",",
                   "tags": [{"type": "tag", "begin": "<a>", "content": fmt, "end": "</a>"}]}
        elif kind == "triggered_tags":
            fmt = {"type": "triggered_tags", "triggers": ["<a"], "at_least_one": True,
                   "tags": [{"type": "tag", "begin": "<a>", "content": fmt, "end": "</a>"}]}
    return {"type": "structural_tag", "format": fmt}


def _nested_text(kind: str, depth: int) -> str:
    """The same document as JSON text, written without json.dumps (which recurses)."""
    wrap = {
        "sequence": ('{"type": "sequence", "elements": [', ']}'),
        "or": ('{"type": "or", "elements": [', ', {"type": "const_string", "value": "y"}]}'),
        "tag": ('{"type": "tag", "begin": "<a>", "content": ', ', "end": "</a>"}'),
        "optional": ('{"type": "optional", "content": ', '}'),
        "triggered_tags": ('{"type": "triggered_tags", "triggers": ["<a"], "at_least_one": true, "tags": [{"type": '
                           + '"tag", "begin": "<a>", "content": ', ', "end": "</a>"}]}'),
        "tags_with_separator": ('{"type": "tags_with_separator", "separator": ",", "tags": [{"type": "tag", '
                                + '"begin": "<a>", "content": ', ', "end": "</a>"}]}'),
    }[kind]
    inner = '{"type": "const_string", "value": "x"}'
    text = wrap[0] * (depth - 1) + inner + wrap[1] * (depth - 1)
    return '{"type": "structural_tag", "format": ' + text + "}"


KINDS = ["sequence", "or", "tag", "optional", "tags_with_separator", "triggered_tags"]


@pytest.fixture(scope="module")
def compiler(small_info):
    return xg2.GrammarCompiler(small_info)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("as_text", [False, True])
@pytest.mark.parametrize("depth", [600, 5000, 20000])
def test_deep_tags_raise_a_typed_limit(compiler, kind, as_text, depth):
    tag = _nested_text(kind, depth) if as_text else _nested(kind, depth)
    with pytest.raises(xg2.GrammarLimitError) as info:
        compiler.compile_structural_tag(tag)
    assert info.value.pointer is not None
    if not as_text:
        assert info.value.pointer.startswith("/format/")


@pytest.mark.parametrize("kind", KINDS)
def test_formats_past_the_format_limit_raise(compiler, kind):
    with pytest.raises(xg2.GrammarLimitError, match="nested deeper") as info:
        compiler.compile_structural_tag(_nested(kind, MAX_FORMAT_DEPTH + 1))
    assert info.value.pointer.startswith("/format/")


@pytest.mark.parametrize("kind", KINDS)
def test_tags_at_the_limit_compile_and_match(compiler, kind):
    # a separated list or a triggered tag holds its content through a tag: two formats a level
    depth = MAX_FORMAT_DEPTH // 2 if kind in ("tags_with_separator", "triggered_tags") else MAX_FORMAT_DEPTH
    compiled = compiler.compile_structural_tag(_nested(kind, depth))
    matcher = xg2.GrammarMatcher(compiled)
    text = {"sequence": "x", "or": "x", "optional": "x",
            "tag": "<a>" * (depth - 1) + "x" + "</a>" * (depth - 1),
            "tags_with_separator": "<a>" * (depth - 1) + "x" + "</a>" * (depth - 1),
            "triggered_tags": "<a>" * (depth - 1) + "x" + "</a>" * (depth - 1)}[kind]
    assert matcher.accept_string(text)
    assert matcher.is_completed()


def test_deep_json_schema_inside_a_tag_is_typed(compiler):
    schema: dict = {"type": "string"}
    for _ in range(3000):
        schema = {"type": "array", "items": schema}
    tag = {"type": "structural_tag", "format": {"type": "tag", "begin": "<f>", "end": "</f>",
                                                "content": {"type": "json_schema", "json_schema": schema}}}
    with pytest.raises(xg2.GrammarLimitError):
        compiler.compile_structural_tag(tag)


@pytest.mark.parametrize("kind", KINDS)
def test_text_and_dict_agree_within_the_limit(compiler, kind):
    assert json.loads(_nested_text(kind, 5)) == _nested(kind, 5)


@pytest.mark.parametrize("depth", [1500, 100000])
def test_deep_schema_text_is_a_limit_not_invalid_json(compiler, depth):
    text = '{"anyOf": [' * depth + '{"type": "string"}' + "]}" * depth
    with pytest.raises(xg2.GrammarLimitError):
        compiler.compile_json_schema(text)


def _deep_schema(kind: str, depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"items": {"type": "array", "items": schema},
                  "properties": {"type": "object", "properties": {"a": schema}},
                  "anyOf": {"anyOf": [schema], "description": "x"},
                  "$defs": {"$defs": {"a": schema}, "title": "t"}}[kind]
    return schema


@pytest.mark.parametrize("kind", ["items", "properties", "anyOf", "$defs"])
@pytest.mark.parametrize("how", ["compiler", "grammar"])
def test_deep_schemas_are_refused_before_any_whole_document_walk(compiler, kind, how):
    """100,000 levels: measured first, so no walk over the whole document (embedded resources,
    references) runs on it; such walks once took memory growing with the square of the depth."""
    schema = _deep_schema(kind, 100_000)
    with pytest.raises(xg2.GrammarLimitError) as info:
        if how == "compiler":
            compiler.compile_json_schema(schema)
        else:
            xg2.Grammar.from_json_schema(schema)
    assert info.value.pointer.startswith({"items": "/items/items", "properties": "/properties/a/properties",
                                          "anyOf": "/anyOf/0/anyOf/0", "$defs": "/$defs/a/$defs/a"}[kind])
