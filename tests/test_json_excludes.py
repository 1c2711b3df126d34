"""`excludes` of the structural tag's json_schema format: string content never holds an excluded
string, as written (xg2/grammar/json_schema.py, json_excludes.py).

Verdicts are compared with xgrammar 0.2.8 where it is right; where xg2 deliberately differs the
test asserts xg2's behaviour and says why (xgrammar leaves strings under pattern/format unfiltered
and drops length bounds, refuses excludes in the nested styles, and accepts excluded strings that
JSON or XML syntax could spell)."""

from __future__ import annotations

import json
import random
from typing import Any

import jsonschema
import pytest
from conftest import JSON_PIECES
from test_xml_styles import STYLES, write

import xg2
import xg2.testing
from xg2.errors import GrammarLimitError, SchemaError, StructuralTagError
from xg2.grammar.json_excludes import ExcludesError
from xg2.grammar.json_schema import json_schema_to_ir
from xg2.grammar.regex import regex_to_expr
from xg2.grammar.regular import avoiding, from_expr, spelled

xgr = pytest.importorskip("xgrammar")

TC = "</tool_call>"
FLAT = [s for s in STYLES if s not in ("cohere_xml", "minimax_m3_xml")]

_compiled: dict[tuple[str, str], Any] = {}
_compilers: dict[str, Any] = {}


def _tag(schema: Any, style: str, excludes: list[str], **extra: Any) -> str:
    return json.dumps({"type": "structural_tag", "format": {
        "type": "json_schema", "json_schema": schema, "style": style, "excludes": excludes, **extra}})


def _compile(engine: str, schema: Any, style: str, excludes: list[str], **extra: Any):
    key = (engine, _tag(schema, style, excludes, **extra))
    if key not in _compiled:
        mod = xgr if engine == "xgr" else xg2
        if engine not in _compilers:
            _compilers[engine] = mod.GrammarCompiler(mod.TokenizerInfo([]))
        _compiled[key] = _compilers[engine].compile_structural_tag(key[1])
    return _compiled[key]


def accepts(engine: str, schema: Any, style: str, excludes: list[str], text: str, **extra: Any) -> bool:
    mod = xgr if engine == "xgr" else xg2
    m = mod.GrammarMatcher(_compile(engine, schema, style, excludes, **extra), terminate_without_stop_token=True)
    return bool(m.accept_string(text)) and m.is_completed()


def text_of(style: str, args: dict) -> str:
    return json.dumps(args) if style == "json" else write(style, list(args.items()))


# --- the same verdicts as xgrammar ---------------------------------------------------------------

ARGS = {"type": "object", "additionalProperties": False, "properties": {
    "s": {"type": "string"},
    "n": {"type": "integer"},
    "o": {"type": "object", "properties": {"t": {"type": "string"}, "u": {"type": "array", "items": {"type": "string"}}},
          "additionalProperties": False},
    "a": {"type": "array", "items": {"type": "string"}},
    "e": {"enum": ["x", "y</tool_call>z", "</tool_call>"]},
    "c": {"const": "</tool_call>!"},
}}

#: (arguments, whether the excluded string is kept out of them)
CASES = [
    ({"s": "plain"}, True),
    ({"s": "a</tool_call>b"}, False),
    ({"s": TC}, False),                                   # the whole value
    ({"s": "</tool_call>tail"}, False),                   # at the start
    ({"s": "head</tool_call>"}, False),                   # at the end
    ({"s": "</tool_call"}, True),                         # one character short
    ({"s": "/tool_call>"}, True),
    ({"s": "<</tool_call>"}, False),                      # after a false start
    ({"s": "</tool_call</tool_call>"}, False),
    ({"s": "a<\\/tool_call>"}, True),                     # raw: a backslash, not the excluded text
    ({"o": {"t": TC}}, False),                            # nested
    ({"o": {"t": "ok", "u": ["a", "b</tool_call>"]}}, False),
    ({"o": {"t": "ok", "u": ["</tool", "_call>"]}}, True),  # split across two strings
    ({"a": ["x", TC]}, False),
    ({"a": ["</tool_", "call>"]}, True),
    ({"e": "x"}, True),
    ({"e": "y</tool_call>z"}, False),                     # listed values holding it are dropped
    ({"e": TC}, False),
    ({"c": "</tool_call>!"}, False),
    ({"s": "fine", "n": 5}, True),
]


@pytest.mark.parametrize("style", ["json", *FLAT])
@pytest.mark.parametrize("args,kept", CASES, ids=range(len(CASES)))
def test_same_verdicts_as_xgrammar(style, args, kept):
    text = text_of(style, args)
    assert accepts("xg2", ARGS, style, [TC], text) is kept, text
    assert accepts("xgr", ARGS, style, [TC], text) is kept, text


@pytest.mark.parametrize("text,kept", [
    ('{"s": "\\n</tool_call>"}', False),            # right after an escape
    ('{"s": "</tool_call>\\n"}', False),            # right before one
    ('{"s": "</tool_\\u0063all>"}', True),          # an escape inside it: not the excluded text
    ('{"s": "\\u003c/tool_call>"}', True),
    ('{"s": "</tool_call\\u003e"}', True),
    ('{"s": "<\\/tool_call>"}', True),
    ('{"s": "\\"</tool_call>\\""}', False),
    ('{"s": "\\\\</tool_call>"}', False),
    ('{"</tool_call>": 1}', False),                # a free key
    ('{"k</tool_call>k": "v"}', False),
    ('{"k<\\/tool_call>": "v"}', True),
    ('{"k": {"</tool_call>": []}}', False),        # a key of a value the schema leaves free
    ('{"k": ["x", {"y": "</tool_call>"}]}', False),
    ('{"k": ["x", {"y": "<tool_call>"}]}', True),
])
def test_escapes_and_keys_agree_with_xgrammar(text, kept):
    schema = {"type": "object", "properties": {"s": {"type": "string"}}, "additionalProperties": True}
    assert accepts("xg2", schema, "json", [TC], text) is kept
    assert accepts("xgr", schema, "json", [TC], text) is kept


@pytest.mark.parametrize("excluded,text,kept", [
    # excluded strings that an escape can spell: matched on the text as written, as in xgrammar
    ("nab", '{"s": "\\nab"}', False),
    ("nab", '{"s": "na\\b"}', True),
    ("ab", '{"s": "\\u00ab"}', False),
    ("ab", '{"s": "a\\u0062"}', True),
    ("\\n", '{"s": "x\\ny"}', False),
    ("\\n", '{"s": "x\\\\ny"}', False),            # `\\n`: an escaped backslash, then n
    ("\\n", '{"s": "x\\ty"}', True),
    ("\\n", '{"s": "x\\u000ay"}', True),
])
def test_excluded_strings_inside_escapes(excluded, text, kept):
    schema = {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"], "additionalProperties": False}
    assert accepts("xg2", schema, "json", [excluded], text) is kept
    assert accepts("xgr", schema, "json", [excluded], text) is kept


# --- strings xgrammar leaves unfiltered or unbounded: xg2 is exact --------------------------------

@pytest.mark.parametrize("string,good,bad", [
    # xgrammar matches a string with `pattern` or `format` by that constraint alone
    ({"pattern": "^<.*>$"}, ["<a>", "<\\/tool_call>", "</tool_call x>"], ["</tool_call>", "<x</tool_call>>"]),
    ({"pattern": "call>$"}, ["a_call>", "<tool_call>"], ["</tool_call>", "x</tool_call>"]),
    ({"format": "uri"}, ["http://a.b/c"], []),
    # xgrammar drops minLength/maxLength under excludes (with a warning); xg2 keeps both exact
    ({"maxLength": 14}, ["", "a" * 14, "</tool_call", "\\n" * 14, "x</tool_call"], ["a" * 15, TC, "x" + TC, "\\n" * 15]),
    ({"minLength": 3, "maxLength": 13}, ["abc", "<\\/tool_call>"], ["ab", TC, "a" + TC, "a" * 14]),
    ({"minLength": 13}, ["a" * 13, "<<<<<<<<<<<<<", "a</tool_call>"[:12] + "x", "x" * 40], ["a" * 12, "a" + TC, "a" * 30 + TC]),
    ({"maxLength": 11}, ["</tool_call", "a" * 11], ["a" * 12]),   # too short to hold it: unchanged
    ({"pattern": "^[a-z<>/_]{0,14}$"}, ["</tool_call", "tool_call>"], [TC, "a" + TC]),
])
def test_constrained_strings_are_filtered_exactly(string, good, bad):
    schema = {"type": "object", "properties": {"s": {"type": "string", **string}}, "required": ["s"],
              "additionalProperties": False}
    for s in good:
        assert accepts("xg2", schema, "json", [TC], '{"s": "' + s + '"}'), s
    for s in bad:
        assert not accepts("xg2", schema, "json", [TC], '{"s": "' + s + '"}'), s
    if string.get("pattern", "").startswith("^"):     # the difference: xgrammar lets the pattern decide alone
        assert accepts("xgr", schema, "json", [TC], '{"s": "' + TC + '"}')


def test_strings_that_cannot_hold_it_keep_their_rules():
    """A pattern or format whose texts cannot spell an excluded string is lowered as without
    excludes: no automaton is built for it."""
    schema = {"type": "object", "properties": {
        "d": {"type": "string", "pattern": "^[0-9]{3}-[0-9]{4}$"}, "t": {"type": "string", "format": "date-time"},
        "u": {"type": "string", "format": "uuid"}, "m": {"type": "string", "maxLength": 5}}}
    plain = json_schema_to_ir(schema)
    excluding = json_schema_to_ir(schema, excludes=[TC])
    assert [str(r.body) for r in plain.rules] == [str(r.body) for r in excluding.rules]


@pytest.fixture(scope="module")
def tiny_compiler():
    vocab = [bytes([b]) for b in range(256)] + [b"</s>"]
    return xg2.GrammarCompiler(xg2.TokenizerInfo(vocab, xg2.VocabType.RAW, stop_token_ids=[256]))


_PIECES = ["<", "/", "t", "a", ">", "n", "b", "u", "0", "x", "\\n", "\\/", "\\u003c", "\\u0000", "\\\\", '\\"', "\\",
           '"', "\n", "</ta>"]


@pytest.mark.parametrize("excludes", [["</ta>"], ["nab", "u00"], ["a/", "ta"]])
@pytest.mark.parametrize("bounds", [{}, {"maxLength": 6}, {"minLength": 2, "maxLength": 7}, {"minLength": 3}])
def test_string_content_against_the_definition(tiny_compiler, excludes, bounds):
    """Free and bounded strings, against the definition: JSON string text (every escape) whose
    decoded length is within the bounds and whose written text holds no excluded string."""
    schema = {"type": "string", **bounds}
    compiled = tiny_compiler.compile_grammar(xg2.Grammar(json_schema_to_ir(schema, excludes=excludes)))
    rng = random.Random(len(excludes) * 31 + len(bounds))
    for _ in range(300):
        content = "".join(rng.choice(_PIECES) for _ in range(rng.randrange(9)))
        try:
            value = json.loads('"' + content + '"')
        except ValueError:
            value = None
        want = value is not None and not any(e in content for e in excludes) and \
            bounds.get("minLength", 0) <= len(value) <= bounds.get("maxLength", 99)
        m = xg2.GrammarMatcher(compiled)
        got = m.accept_string('"' + content + '"') and m.is_completed()
        assert got == want, (content, excludes, bounds)


# --- keys and names -------------------------------------------------------------------------------

def test_listed_keys_holding_it_are_never_written():
    schema = {"type": "object", "properties": {"a</tool_call>": {"type": "integer"}, "b": {"type": "integer"}}}
    for engine in ("xg2", "xgr"):
        assert not accepts(engine, schema, "json", [TC], '{"a</tool_call>": 1, "b": 2}')
        assert accepts(engine, schema, "json", [TC], '{"b": 2}')
    required = {**schema, "required": ["a</tool_call>"]}
    with pytest.raises(StructuralTagError, match="accepts no JSON value") as exc:
        _compile("xg2", required, "json", [TC])
    assert exc.value.pointer == "/format/json_schema"


@pytest.mark.parametrize("text,kept", [
    ('{"xa": 1}', True),
    ('{"x</tool_call>": 1}', False),
    ('{"x<\\/tool_call>": 1}', True),
    ('{"y": 1}', False),
])
def test_pattern_property_keys(text, kept):
    schema = {"type": "object", "patternProperties": {"^x": {"type": "integer"}}, "additionalProperties": False}
    assert accepts("xg2", schema, "json", [TC], text) is kept
    # xgrammar refuses every key here (`{"xa": 1}` too) once excludes are given: wrong, not compared


def test_property_names_and_enum_keys():
    schema = {"type": "object", "propertyNames": {"enum": ["a", "b</tool_call>", "c"]}, "additionalProperties": True}
    assert accepts("xg2", schema, "json", [TC], '{"a": 1, "c": 2}')
    assert not accepts("xg2", schema, "json", [TC], '{"b</tool_call>": 1}')


@pytest.mark.parametrize("style", ["json", *STYLES])
def test_listed_values_of_every_shape(style):
    value = {"type": "object", "properties": {"v": {"type": "object", "additionalProperties": False, "properties": {
        "k": {"enum": [{"p": TC}, {"p": "ok"}, ["q", TC], ["q"], {TC: 1}, 3]}}}}}
    if style == "minimax_m3_xml":
        value = {"type": "object", "properties": {"v": {"type": "object", "additionalProperties": False,
                                                        "properties": {"k": {"enum": [{"p": TC}, {"p": "ok"}, 3]}}}}}
    good = [{"v": {"k": {"p": "ok"}}}, {"v": {"k": 3}}]
    bad = [{"v": {"k": {"p": TC}}}]
    if style != "minimax_m3_xml":
        good.append({"v": {"k": ["q"]}})
        bad += [{"v": {"k": ["q", TC]}}, {"v": {"k": {TC: 1}}}]
    for args in good:
        assert accepts("xg2", value, style, [TC], text_of(style, args)), args
    for args in bad:
        assert not accepts("xg2", value, style, [TC], text_of(style, args)), args


@pytest.mark.parametrize("style", FLAT)
def test_xml_names_and_raw_values(style):
    schema = {"type": "object", "additionalProperties": {"type": "string"}}
    assert accepts("xg2", schema, style, [TC], write(style, [("name_1", "value")]))
    assert not accepts("xg2", schema, style, [TC], write(style, [("name_1", "a</tool_call>")]))
    assert accepts("xg2", schema, style, [TC], write(style, [("name_1", "a</tool_call")]))
    # constrained raw values hold no "<", so they cannot hold the excluded string at all
    bounded = {"type": "object", "properties": {"s": {"type": "string", "maxLength": 20}}, "additionalProperties": False}
    assert accepts("xg2", bounded, style, [TC], write(style, [("s", "short")]))


@pytest.mark.parametrize("style", ["cohere_xml", "minimax_m3_xml"])
def test_nested_styles(style):
    """xgrammar refuses excludes in the nested styles; xg2 keeps them out of raw values and names."""
    schema = {"type": "object", "properties": {"s": {"type": "string"}, "o": {"type": "object", "properties": {
        "t": {"type": "string"}, "l": {"type": "array", "items": {"type": "string"}}}, "additionalProperties": False}},
        "additionalProperties": False}
    with pytest.raises(RuntimeError):
        _compile("xgr", schema, style, [TC])
    assert accepts("xg2", schema, style, [TC], write(style, [("s", "ok"), ("o", {"t": "a", "l": ["b", "c"]})]))
    for args in ([("s", TC)], [("o", {"t": "a" + TC})], [("o", {"l": ["b", "c" + TC]})]):
        assert not accepts("xg2", schema, style, [TC], write(style, args)), args
    if style == "cohere_xml":
        # a name is written entity-escaped: `</tool_call>` as a name is `&lt;/tool_call&gt;`
        free = {"type": "object", "additionalProperties": {"type": "integer"}}
        assert accepts("xg2", free, style, [TC], write(style, [(TC, 1)]))
        assert not accepts("xg2", free, style, ["lt;/tool"], write(style, [(TC, 1)]))
        assert accepts("xg2", free, style, ["lt;/tool"], write(style, [("a", 1)]))


def test_a_listed_name_whose_tag_would_spell_it_is_dropped():
    """minimax_m3_xml closes a member with its name: `</tool_call>` would be written around a
    member named `tool_call`, so that member is never written (the tag is not content, but the
    name is)."""
    schema = {"type": "object", "properties": {"tool_call": {"type": "integer"}, "b": {"type": "integer"}}}
    assert not accepts("xg2", schema, "minimax_m3_xml", [TC], write("minimax_m3_xml", [("tool_call", 1)]))
    assert accepts("xg2", schema, "minimax_m3_xml", [TC], write("minimax_m3_xml", [("b", 1)]))
    assert accepts("xg2", schema, "minimax_m3_xml", [], write("minimax_m3_xml", [("tool_call", 1)]))


def test_an_excluded_closing_tag_of_the_style_itself():
    """The style's own tags are not content: excluding `</parameter>` in qwen_xml keeps it out of
    values only (raw text stops there anyway; JSON strings inside values do not)."""
    schema = {"type": "object", "properties": {"s": {"type": "string"}, "o": {"type": "object"}}, "additionalProperties": False}
    for engine in ("xg2", "xgr"):
        assert accepts(engine, schema, "qwen_xml", ["</parameter>"], write("qwen_xml", [("s", "x")]))
        assert not accepts(engine, schema, "qwen_xml", ["</parameter>"], write("qwen_xml", [("o", {"k": "</parameter>"})]))
    for engine in ("xg2", "xgr"):   # a string inside the style's own closing tag
        assert accepts(engine, schema, "qwen_xml", ["parameter"], write("qwen_xml", [("s", "x")]))
        assert not accepts(engine, schema, "qwen_xml", ["parameter"], write("qwen_xml", [("s", "a parameter")]))


# --- what is refused, and why ----------------------------------------------------------------------

@pytest.mark.parametrize("style,excluded,why", [
    ("json", "1", "outside strings"),                  # a number could spell it
    ("json", ", ", "outside strings"),
    ("json", "true", "outside strings"),
    ("json", "e}", "outside strings"),                 # true}
    ("json", "\n", "outside strings"),
    ("json", 'x"', "quotes"),                          # `"x"` ends a value with it
    ("json", '"}', "quotes"),
    ("qwen_xml", "null", "outside strings"),
    ("qwen_xml", " </tool_call>", "white space"),      # xgrammar refuses these too
    ("glm_xml", "</tool_call>\n", "white space"),
    ("kimi_k3_xml", " safe", "must not start or end with formatting whitespace"),
    ("kimi_k3_xml", "\n", "must not start or end with formatting whitespace"),   # the padding, named first
    ("qwen_xml", "a>b", "opening tag"),                # `...>` then a value starting with b
    ("kimi_k3_xml", "x<|close|>", "closing tag"),      # a value ending with x, then the closing tag
    ("minimax_m3_xml", "]<]minimax[>[", "opening tag"),
    ("qwen_xml", "parameter>", "argument name"),       # <parameter=xparameter>
    ("glm_xml", "x</arg_key>", "closing tag"),
])
def test_refused_excluded_strings(style, excluded, why):
    tag = _tag({"type": "object", "properties": {"s": {"type": "string"}}}, style, ["ok", excluded])
    with pytest.raises(StructuralTagError, match=why) as exc:
        xg2.GrammarCompiler(xg2.TokenizerInfo([])).compile_structural_tag(tag)
    assert exc.value.pointer == "/format/excludes/1"
    with pytest.raises(ExcludesError) as conv:
        json_schema_to_ir({"type": "object"}, style=style, excludes=[excluded])
    assert conv.value.index == 0 and isinstance(conv.value, SchemaError)
    if "white" in why or style == "minimax_m3_xml":
        with pytest.raises(RuntimeError):   # xgrammar refuses these too
            xgr.GrammarCompiler(xgr.TokenizerInfo([])).compile_structural_tag(tag)
    else:
        # xgrammar takes them and matches inside strings only: `1` stays allowed in numbers, `x"`
        # after a value ending in x, `a>b` across a tag; xg2 refuses what it cannot keep out
        xgr.GrammarCompiler(xgr.TokenizerInfo([])).compile_structural_tag(tag)


@pytest.mark.parametrize("style,excluded", [
    ("json", "</tool_call>"), ("json", "nab"), ("json", "ta"), ("json", "nulll"), ("json", "x'y"), ("qwen_xml", "<function="), ("qwen_xml", "</function>"),
    ("glm_xml", "</arg_key>"), ("glm_xml", "<arg_value>"), ("deepseek_xml", "</\uff5cDSML\uff5cinvoke>"),
    ("kimi_k3_xml", "<|tool_call_end|>"), ("minimax_m3_xml", TC), ("cohere_xml", "a b"),
])
def test_model_markers_are_accepted(style, excluded):
    json_schema_to_ir({"type": "object", "properties": {"s": {"type": "string"}}}, style=style, excludes=[excluded])


def test_empty_and_limits():
    with pytest.raises(StructuralTagError, match="empty") as exc:
        _compile("xg2", {"type": "object"}, "json", ["a", ""])
    assert exc.value.pointer == "/format/excludes/1"
    with pytest.raises(GrammarLimitError, match="prefixes"):
        json_schema_to_ir({"type": "string"}, excludes=["<" + "x" * 1000 + ">"])
    # a bound times the prefixes of the excluded strings past the automaton limit
    with pytest.raises(GrammarLimitError) as limit:
        json_schema_to_ir({"type": "object", "properties": {"s": {"type": "string", "maxLength": 5000}}}, excludes=[TC])
    assert limit.value.pointer == "/properties/s"


# --- random walks: nothing generated holds it, everything completed validates -------------------

EXCLUDED = ["</tool_call>", "<function="]
PIECES = ["</tool_call>", "</tool_call", "</", "<", "tool", "_call", "call>", ">", "<function", "<function=", "=",
          "<\\/", "\\/", "\\u003c", "\\n"]
#: The XML styles' tags as tokens (and favoured once a walk should end), so that walks complete.
TAGS = ["<parameter=", "</parameter>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", '<cofl:value name="',
        '" type="', 'raw">', 'json">', 'list">', 'dict">', "<cofl:value", "</cofl:value>", ">\n", "\n<"]


@pytest.fixture(scope="module")
def walk_info():
    vocab = [bytes([b]) for b in range(256)]
    vocab += [w.encode() for w in dict.fromkeys(JSON_PIECES + PIECES + TAGS) if len(w.encode()) > 1]
    vocab += [b"</s>"]
    return xg2.TokenizerInfo(vocab, xg2.VocabType.RAW, stop_token_ids=[len(vocab) - 1])


WALK_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["s", "e"], "properties": {
    "s": {"type": "string"},
    "b": {"type": "string", "maxLength": 16},
    "p": {"type": "string", "pattern": "^[<>/a-z_=]*$"},
    "e": {"enum": ["</tool_call>", "a<function=b", "ok", 1]},
    "l": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    "o": {"type": "object", "additionalProperties": {"type": "string"}, "maxProperties": 2},
}}


def _walk(compiled, info, rng: random.Random, favoured: list[int], limit: int = 120) -> str | None:
    """Tokens drawn from the allowed ones, the excluded strings' pieces and closing quotes
    favoured; the text once the stop token is drawn (None if it is not within `limit`)."""
    m = xg2.GrammarMatcher(compiled)
    bitmask = xg2.allocate_token_bitmask(1, info.vocab_size)
    stop = info.stop_token_ids[0]
    out = bytearray()
    vocab = info.decoded_vocab
    for step in range(limit):
        m.fill_next_token_bitmask(bitmask)
        allowed = set(xg2.testing._get_masked_tokens_from_bitmask(bitmask, info.vocab_size))
        allowed = set(range(info.vocab_size)) - allowed
        assert allowed, "dead end"
        if stop in allowed and (step > limit // 2 or rng.random() < 0.2):
            return out.decode("utf-8")
        nice = [t for t in favoured if t in allowed]
        closing = [t for t in allowed if vocab[t][:1] in (b'"', b"}", b"]") or vocab[t].decode("latin-1") in TAGS] \
            if step > limit // 3 else []
        plain = [t for t in sorted(allowed) if vocab[t].strip()] or sorted(allowed)     # white space goes nowhere
        pool = closing if closing and rng.random() < 0.5 else nice if nice and rng.random() < 0.6 else plain
        t = rng.choice(pool)
        assert m.accept_token(t)
        if t == stop:
            return out.decode("utf-8")
        out += vocab[t]
    return None


@pytest.mark.parametrize("style", ["json", "qwen_xml", "glm_xml", "cohere_xml"])
def test_random_walks_never_hold_an_excluded_string(walk_info, style):
    compiled = xg2.GrammarCompiler(walk_info).compile_structural_tag(_tag(WALK_SCHEMA, style, EXCLUDED))
    vocab = walk_info.decoded_vocab
    favoured = [i for i, t in enumerate(vocab) if t and t.decode("utf-8", "replace") in PIECES]
    rng = random.Random(7)
    validator = jsonschema.Draft202012Validator(WALK_SCHEMA)
    done = 0
    for _ in range(60):
        text = _walk(compiled, walk_info, rng, favoured)
        if text is None:
            continue
        assert not any(e in text for e in EXCLUDED), text
        if style == "json":
            doc = json.loads(text)
            assert validator.is_valid(doc), (text, list(validator.iter_errors(doc)))
        done += 1
    assert done >= 15


# --- the automata underneath ------------------------------------------------------------------------

def test_avoiding_automaton_against_the_definition():
    rng = random.Random(3)
    strings = ["abc", "bcd", "cc", "abab"]
    d = avoiding(strings)
    for _ in range(2000):
        text = "".join(rng.choice("abcdx") for _ in range(rng.randrange(12)))
        assert d.accepts(text) == (not any(s in text for s in strings)), text


def test_spelled_writes_the_characters_through_the_spelling():
    from xg2.grammar.json_string import json_string_body

    d = from_expr(regex_to_expr('^[a"/]{1,2}$', search=True))
    written = spelled(d, json_string_body)
    for text, ok in [("a", True), ('\\"', True), ("\\/a", True), ("/", True), ('"', False), ("aaa", False),
                     ("\\a", False), ("", False)]:
        assert written.accepts(text) is ok, text


def test_many_long_names_beside_other_members():
    """The other members' names (none of the listed ones, holding no excluded string) are one
    automaton whose string rest is shared by every node of the names' trie: forty long names fit
    (a copy of the rest per node made it tens of thousands of states, past the limit)."""
    names = [f"customer_{i:03d}_preferred_contact_channel" for i in range(40)]
    schema = {"type": "object", "properties": {k: {"type": "integer"} for k in names}, "additionalProperties": True}
    controls = ["<|open|>", "<|close|>", "<|sep|>"]
    for doc, ok in [({names[0]: 1, "备注": "safe"}, True), ({names[0]: "x"}, False), ({names[0] + "_x": "x"}, True),
                    ({names[0][:-1]: "x"}, True), ({"x<|sep|>y": 1}, False), ({"k": "a<|open|>"}, False)]:
        text = json.dumps(doc, ensure_ascii=False)
        assert accepts("xg2", schema, "json", controls, text) == ok, text
        assert accepts("xgr", schema, "json", controls, text) == ok, text
