"""Structural tags: every format type read from dicts, JSON text and pydantic-style objects; bad
tags raise StructuralTagError with the JSON pointer of the element at fault."""

from __future__ import annotations

import json

import pytest
from conftest import SHARED

import xg2
from xg2.grammar import structural_tag as st

REGISTRY = SHARED / "data" / "tools" / "registry.jsonl"


def _tag(fmt: dict) -> dict:
    return {"type": "structural_tag", "format": fmt}


CONST = {"type": "const_string", "value": "ok"}
EVERY_FORMAT = _tag({"type": "sequence", "elements": [
    CONST,
    {"type": "json_schema", "json_schema": {"type": "object"}, "style": "qwen_xml", "any_order": True},
    {"type": "json_schema", "json_schema": True},
    {"type": "qwen_xml_parameter", "json_schema": {"type": "object", "properties": {"a": {"type": "string"}}}},
    {"type": "grammar", "grammar": 'root ::= "x"'},
    {"type": "regex", "pattern": "[a-z]+"},
    {"type": "any_text", "excludes": ["<stop>"], "max_tokens": 20, "max_chars": 100},
    {"type": "or", "elements": [CONST, {"type": "regex", "pattern": "y"}]},
    {"type": "optional", "content": CONST},
    {"type": "plus", "content": CONST},
    {"type": "star", "content": CONST},
    {"type": "repeat", "min": 1, "max": 3, "content": CONST},
    {"type": "tag", "begin": "<a>", "content": CONST, "end": ["</a>", "</A>"]},
    {"type": "tag", "begin": {"type": "token", "token": "<|call|>"}, "content": CONST, "end": {"type": "token", "token": 7}},
    {"type": "triggered_tags", "triggers": ["<f="], "tags": [
        {"type": "tag", "begin": "<f=a>", "content": CONST, "end": "</f>"}], "at_least_one": True,
     "stop_after_first": True, "excludes": ["<think>"]},
    {"type": "tags_with_separator", "tags": [{"type": "tag", "begin": "<b>", "content": CONST, "end": "</b>"}],
     "separator": ",", "at_least_one": True},
    {"type": "dispatch", "rules": [["<x>", CONST], ["<y>", {"type": "any_text"}]], "loop": False, "excludes": ["<z>"]},
    {"type": "exclude_token", "exclude_tokens": [3, "<|end|>"]},
    {"type": "any_tokens", "exclude_tokens": [4], "max_tokens": 10},
    {"type": "token_triggered_tags", "trigger_tokens": ["<|tool|>"], "tags": [
        {"type": "tag", "begin": {"type": "token", "token": "<|tool|>"}, "content": CONST, "end": "."}]},
    {"type": "token_dispatch", "rules": [[5, CONST], ["<|r|>", CONST]], "exclude_tokens": [6]},
]})


def test_every_format_reads_from_dict_and_json_text_alike():
    a = st.parse_structural_tag(EVERY_FORMAT)
    b = st.parse_structural_tag(json.dumps(EVERY_FORMAT))
    assert a == b == st.parse_structural_tag(st.to_json(a))
    kinds = {type(e).__name__ for e in a.format.elements}
    assert len(kinds) == 19          # with the sequence around them and the token in a tag: all 21
    assert isinstance(a.format.elements[13].begin, st.TokenFormat)
    tag = a.format.elements[12]
    assert isinstance(tag, st.TagFormat) and tag.end == ["</a>", "</A>"] and tag.content == st.ConstStringFormat("ok")
    assert a.format.elements[2].style == "json"       # defaults as in xgrammar


class _Pydantic:
    """Stands for a pydantic model (xgrammar's classes are ones): anything with model_dump."""

    def __init__(self, data):
        self.data = data

    def model_dump(self, mode: str = "python", by_alias: bool = False):
        assert mode == "json" and by_alias
        return self.data


def test_pydantic_objects_are_read_through_model_dump():
    inner = _Pydantic({"type": "tag", "begin": "<a>", "content": CONST, "end": "</a>"})
    tag = st.parse_structural_tag({"type": "structural_tag", "format": {"type": "or", "elements": [inner, CONST]}})
    assert tag.format.elements[0] == st.TagFormat("<a>", st.ConstStringFormat("ok"), "</a>")
    assert st.parse_structural_tag(_Pydantic(EVERY_FORMAT)) == st.parse_structural_tag(EVERY_FORMAT)


def test_xgrammar_objects_when_installed():
    xst = pytest.importorskip("xgrammar.structural_tag", reason="xgrammar is a benchmark extra, not a test one")
    obj = xst.StructuralTag(format=xst.TriggeredTagsFormat(triggers=["<tool_call>"], tags=[xst.TagFormat(
        begin="<tool_call>", content=xst.JSONSchemaFormat(json_schema={"type": "object"}), end="</tool_call>")]))
    tag = st.parse_structural_tag(obj)
    assert isinstance(tag.format, st.TriggeredTagsFormat) and tag.format.tags[0].end == "</tool_call>"


@pytest.mark.parametrize(("fmt", "pointer", "words"), [
    ({"type": "sequence", "elements": [{"type": "const_string", "value": 3}]}, "/format/elements/0/value", "str"),
    ({"type": "sequence", "elements": [{"type": "const_strin", "value": "a"}]}, "/format/elements/0/type", "const_strin"),
    ({"type": "or", "elements": [{"type": "regex", "pattern": "a", "flags": 1}]}, "/format/elements/0", "flags"),
    ({"type": "sequence", "elements": []}, "/format/elements", "at least one"),
    ({"type": "repeat", "min": 3, "max": 1, "content": CONST}, "/format", "min"),
    ({"type": "optional", "content": {"type": "repeat", "min": -1, "max": 1, "content": CONST}}, "/format/content/min",
     "min must be >= 0"),
    ({"type": "triggered_tags", "triggers": ["<a"], "tags": [
        {"type": "tag", "begin": "<b>", "content": CONST, "end": "</b>"}]}, "/format/tags/0/begin", "trigger"),
    ({"type": "triggered_tags", "triggers": [], "tags": [
        {"type": "tag", "begin": "<b>", "content": CONST, "end": "</b>"}]}, "/format/triggers", "trigger"),
    ({"type": "triggered_tags", "triggers": ["<"], "tags": []}, "/format/tags", "tag"),
    ({"type": "tag", "begin": "<a>", "content": CONST, "end": []}, "/format/end", "empty"),
    ({"type": "tag", "begin": "<a>", "content": {"type": "any_text", "max_chars": -2}, "end": "x"},
     "/format/content/max_chars", "negative"),
    ({"type": "dispatch", "rules": [["<a>", CONST], ["", CONST]]}, "/format/rules/1/0", "empty"),
    ({"type": "dispatch", "rules": [["<a>", CONST], ["<a>", CONST]]}, "/format/rules", "twice"),
    ({"type": "token_dispatch", "rules": [[-1, CONST]]}, "/format/rules/0/0", "token"),
    ({"type": "any_tokens", "exclude_tokens": [""]}, "/format/exclude_tokens/0", "token"),
    ({"type": "json_schema", "json_schema": {"type": "object"}, "style": "yaml"}, "/format/style", "yaml"),
    ({"type": "json_schema", "json_schema": [1]}, "/format/json_schema", ""),
    ({"type": "any_text", "excludes": ["a", ""]}, "/format/excludes/1", "empty"),
])
def test_bad_tags_say_where(fmt, pointer, words):
    with pytest.raises(xg2.StructuralTagError) as exc:
        st.parse_structural_tag(_tag(fmt))
    assert exc.value.pointer == pointer, exc.value
    assert words in str(exc.value)


def test_not_a_structural_tag():
    for bad in ({"type": "const_string", "value": "x"}, '{"type": "structural_tag", "format": ', 3, None):
        with pytest.raises(xg2.StructuralTagError):
            st.parse_structural_tag(bad)


TAG_ITEM = {"begin": "<b>", "content": CONST, "end": "</b>"}


@pytest.mark.parametrize(("doc", "pointer", "words"), [
    ('{"type": "structural_tag", "format": ', "", "Failed to parse JSON"),
    ('"text"', "", 'Structural tag must be an object, got "text"'),
    ({"type": "structural", "format": CONST}, "/type", 'Structural tag\'s type must be a string "structural_tag"'),
    ({"type": "structural_tag"}, "", "Structural tag must have a format field"),
    (_tag("x"), "/format", 'Format must be an object, got "x"'),
    (_tag({"type": 3}), "/format/type", "Format's type must be a string, got 3"),
    (_tag({"type": "nope"}), "/format/type", "Format type not recognized: nope (known: any_text,"),
    (_tag({"value": "x"}), "/format", "Invalid format: a format must have a type field"),
    (_tag({"type": "const_string"}), "/format", "ConstString format must have a value field with a string"),
    (_tag({"type": "sequence", "elements": "x"}), "/format/elements",
     'Sequence format must have an elements field with an array of formats, got "x"'),
    (_tag({"type": "sequence", "elements": []}), "/format/elements", "Sequence format must have at least one element"),
    (_tag({"type": "tag", "begin": 1, "content": CONST, "end": "x"}), "/format/begin",
     "Tag format must have a begin field with a string or a token format, got 1"),
    (_tag({"type": "triggered_tags", "triggers": ["<b"], "tags": [TAG_ITEM], "at_least_one": "yes"}),
     "/format/at_least_one", 'at_least_one must be a boolean, got "yes"'),
    (_tag({"type": "triggered_tags", "triggers": [], "tags": [TAG_ITEM]}), "/format/triggers",
     "Triggered tags format's triggers must be non-empty"),
    (_tag({"type": "triggered_tags", "triggers": [""], "tags": [TAG_ITEM]}), "/format/triggers/0",
     "Triggered tags format's triggers must be non-empty strings"),
    (_tag({"type": "triggered_tags", "triggers": [1], "tags": [TAG_ITEM]}), "/format/triggers/0",
     "Triggered tags format's triggers must be non-empty strings; item 0 is 1"),
    (_tag({"type": "dispatch", "rules": [[1, CONST]]}), "/format/rules/0/0",
     "Dispatch format's rules must be an array of pairs of a non-empty string and a format; rules[0][0] is 1"),
    (_tag({"type": "dispatch", "rules": [["<a>", CONST, 3]]}), "/format/rules/0",
     "Dispatch format's rules must be pairs of a non-empty string and a format; item 0 is an array of 3 items"),
    (_tag({"type": "tags_with_separator", "tags": [], "separator": ""}), "/format/tags",
     "Tags with separator format's tags must be non-empty"),
    (_tag({"type": "repeat", "min": -1, "max": 2, "content": CONST}), "/format/min", "Repeat min must be >= 0"),
    (_tag({"type": "repeat", "min": 0, "max": -2, "content": CONST}), "/format/max",
     "Repeat max must be -1 (unbounded) or >= 0"),
    (_tag({"type": "repeat", "min": 3, "max": 2, "content": CONST}), "/format", "Repeat min must be <= max"),
    (_tag({"type": "any_text", "max_chars": 2**31}), "/format/max_chars",
     "max_chars must be a non-negative 32-bit integer or null, got 2147483648"),
    (_tag({"type": "any_tokens", "max_tokens": 1.5}), "/format/max_tokens",
     "max_tokens must be a non-negative 32-bit integer or null, got 1.5"),
    (_tag({"type": "json_schema", "json_schema": {}, "style": "yaml"}), "/format/style",
     'style must be one of "json", "qwen_xml"'),
    (_tag({"type": "triggered_tags", "triggers": ["<b"], "tags": [CONST]}), "/format/tags/0/type",
     'Tag format\'s type must be "tag", got "const_string"'),
    (_tag({"type": "dispatch", "rules": [["<a>", 3]]}), "/format/rules/0/1", "Format must be an object, got 3"),
    (_tag({"type": "triggered_tags", "triggers": ["<"], "tags": [
        {"begin": {"type": "token", "token": 5}, "content": CONST, "end": "x"}]}), "/format/tags/0/begin",
     "string begin"),
    (_tag({"type": "token_triggered_tags", "trigger_tokens": [5], "tags": [TAG_ITEM]}), "/format/tags/0/begin",
     "token format begin"),
    (_tag({"type": "tag", "begin": "<a>", "content": {"type": "any_text"}, "end": ""}), "/format/end",
     "free text needs non-empty end strings"),
])
def test_errors_name_the_format_and_field(doc, pointer, words):
    """Type errors are said in the words of formats and fields, not of JSON types; every message
    of a StructuralTagError opens as xgrammar's do, so code that looks for it finds it."""
    with pytest.raises(xg2.StructuralTagError) as exc:
        xg2.Grammar.from_structural_tag(doc)
    assert exc.value.pointer == pointer, exc.value
    assert str(exc.value).startswith("Invalid structural tag error: ")
    assert words in str(exc.value), exc.value
    assert str(exc.value).endswith(f"(at {pointer or '/'})")


def test_json_text_errors_stay_json_errors():
    with pytest.raises(xg2.exception.InvalidJSONError):
        st.parse_structural_tag('{"type": ')


def test_pydantic_api_round_trips():
    """model_dump / model_dump_json / model_validate(_json), as code written for xgrammar's
    pydantic classes calls them; validation is the tag's own, with pointers from the format."""
    tag = st.parse_structural_tag(EVERY_FORMAT)
    assert st.StructuralTag.model_validate_json(tag.model_dump_json()) == tag
    assert st.StructuralTag.model_validate(json.loads(tag.model_dump_json(indent=2))) == tag
    assert tag.model_dump()["format"]["type"] == "sequence"
    budget = st.AnyTextFormat(max_tokens=3, excludes=["x"])
    assert st.AnyTextFormat.model_validate_json(budget.model_dump_json()) == budget
    assert st.AnyTextFormat.model_validate({"max_chars": 2}) == st.AnyTextFormat(max_chars=2)
    with pytest.raises(xg2.StructuralTagError) as exc:
        st.AnyTextFormat.model_validate({"max_tokens": -1})
    assert exc.value.pointer == "/max_tokens"
    with pytest.raises(xg2.StructuralTagError) as exc:
        st.AnyTextFormat.model_validate(CONST)
    assert exc.value.pointer == "/type"
    with pytest.raises(xg2.StructuralTagError):
        st.AnyTextFormat.model_validate_json("{")
    # a format built in Python is checked when used, as a decoded one is
    with pytest.raises(xg2.StructuralTagError, match="32-bit"):
        st.parse_structural_tag(st.StructuralTag(format=st.AnyTextFormat(max_chars=-1)))


def test_deep_nesting_is_checked_without_recursion_limits():
    fmt = CONST
    for _ in range(200):
        fmt = {"type": "optional", "content": fmt}
    bad = {"type": "repeat", "min": 2, "max": 1, "content": CONST}
    for _ in range(200):
        bad = {"type": "optional", "content": bad}
    assert st.parse_structural_tag(_tag(fmt))
    with pytest.raises(xg2.StructuralTagError, match="min"):
        st.parse_structural_tag(_tag(bad))


def test_tool_registry_as_qwen_style_triggered_tags():
    """Real tool sets: one tag per tool, `<tool_call>\\n{"name": <name>, "arguments": ...}` style."""
    if not REGISTRY.exists():
        pytest.skip(f"{REGISTRY} not found: the tool registry lives in ../shared beside the checkout")
    tools = [json.loads(line)["function"] for line in REGISTRY.open()][:50]
    fmt = {"type": "triggered_tags", "triggers": ["<tool_call>"], "tags": [
        {"type": "tag", "begin": f'<tool_call>\n{{"name": "{t["name"]}", "arguments": ',
         "content": {"type": "json_schema", "json_schema": t.get("parameters", {})}, "end": "}\n</tool_call>"}
        for t in tools]}
    tag = st.parse_structural_tag(_tag(fmt))
    assert [t.content.json_schema for t in tag.format.tags] == [t.get("parameters", {}) for t in tools]


# --- lowering to grammars ------------------------------------------------------------------------

def _compile(info, fmt):
    return xg2.GrammarCompiler(info).compile_structural_tag(_tag(fmt))


def _accepts(compiled, text: str) -> bool:
    m = xg2.GrammarMatcher(compiled)
    return m.accept_string(text) and m.is_completed()


CALL = {"type": "tag", "begin": "<call>", "end": ["</call>", "</CALL>"], "content": {
    "type": "json_schema", "json_schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}
ANSWER = {"type": "sequence", "elements": [
    {"type": "const_string", "value": "A:"},
    {"type": "or", "elements": [{"type": "regex", "pattern": "[0-9]{1,3}"}, CALL]},
    {"type": "repeat", "min": 1, "max": 2, "content": {"type": "grammar", "grammar": 'root ::= "!" q\nq ::= "?"*'}},
    {"type": "optional", "content": {"type": "star", "content": {"type": "const_string", "value": "."}}},
    {"type": "plus", "content": {"type": "const_string", "value": ";"}}]}


@pytest.mark.parametrize(("text", "ok"), [
    ("A:12!;", True), ('A:<call>{"n": 5}</call>!??!...;;', True), ('A:<call>{"n":-1}</CALL>!;', True),
    ("A:1234!;", False), ('A:<call>{"n": "5"}</call>!;', False), ('A:<call>{"n": 5}</Call>!;', False),
    ("A:1!!!;", False), ("A:1!", False), ("A:1!.;", True), ("a:1!;", False)])
def test_formats_lowered_to_a_grammar(small_info, text, ok):
    assert _accepts(_compile(small_info, ANSWER), text) == ok


def test_lowered_masks_equal_the_reference(small_info):
    from test_masks import reference_mask, unpack

    compiled = _compile(small_info, ANSWER)
    m = xg2.GrammarMatcher(compiled)
    bm = xg2.allocate_token_bitmask(1, small_info.vocab_size)
    for ch in 'A:<call>{"n": 12}</call>!?!.;':
        m.fill_next_token_bitmask(bm)
        ref = reference_mask(m, small_info, range(small_info.vocab_size))
        assert (unpack(bm, small_info.vocab_size) == ref).all(), ch
        assert m.accept_string(ch)


def _ab(n: str) -> dict:
    return {"type": "tag", "begin": f"<{n}>", "content": {"type": "const_string", "value": n}, "end": f"</{n}>"}


@pytest.mark.parametrize(("at_least_one", "stop_after_first", "accepted"), [
    (False, False, {"", "<a>a</a>", "<a>a</a>,<b>b</b>", "<a>a</a>,<a>a</a>,<b>b</b>"}),
    (True, False, {"<a>a</a>", "<a>a</a>,<b>b</b>", "<a>a</a>,<a>a</a>,<b>b</b>"}),
    (False, True, {"", "<a>a</a>"}),
    (True, True, {"<a>a</a>"}),
])
def test_tags_with_separator(small_info, at_least_one, stop_after_first, accepted):
    """The four combinations, as xgrammar 0.2.8 decides them on the same strings."""
    compiled = _compile(small_info, {"type": "tags_with_separator", "tags": [_ab("a"), _ab("b")], "separator": ",",
                                     "at_least_one": at_least_one, "stop_after_first": stop_after_first})
    for text in ("", "<a>a</a>", "<a>a</a>,<b>b</b>", "<a>a</a>,", "<a>a</a><b>b</b>", "<a>a</a>,<a>a</a>,<b>b</b>"):
        assert _accepts(compiled, text) == (text in accepted), text


# --- free text ----------------------------------------------------------------------------------

def _first_end(text: str, ends, excludes) -> bool:
    """The oracle: `text` ends at the first occurrence of an end string and holds no excluded one
    (without ends: holds no excluded string)."""
    for i in range(1, len(text) + 1):
        if any(text[:i].endswith(x) for x in excludes):
            return False
        if ends and any(text[:i].endswith(e) for e in ends):
            return i == len(text)
    return not ends


@pytest.mark.parametrize(("ends", "excludes"), [
    (("aab",), ()), (("ab", "ba"), ("bb",)), ((), ("aba",)), (("abab", "bab"), ("aa",)), (("a",), ("b",)),
    (("ca",), ("cb",)), (("acb",), ("c",)), (("abcab",), ())])
def test_text_until_against_the_oracle(ends, excludes):
    """Every string of up to 8 characters over a, b, c (overlapping and nested strings)."""
    import itertools

    from xg2.grammar.fsm import rule_automaton
    from xg2.grammar.text import text_until

    text = text_until(ends, excludes)
    fsm = rule_automaton(text, {}) if text is not None else None
    for n in range(9):
        for chars in itertools.product("abc", repeat=n):
            s = "".join(chars)
            assert (fsm is not None and fsm.accepts(s.encode())) == _first_end(s, ends, excludes), s


THINK = {"type": "sequence", "elements": [
    {"type": "tag", "begin": "<think>", "content": {"type": "any_text"}, "end": "</think>"},
    {"type": "any_text", "excludes": ["<tool_call>"]}]}


@pytest.mark.parametrize(("text", "ok"), [
    ("<think>a</think>", True), ("<think></think>answer ü 中文", True), ("<think>x</thin</think>ok", True),
    ("<think>a</think>b</think>", True), ("<think>a", False), ("<think>a</think><tool_call>", False),
    ("<think>a</think>x<tool_cal", True), ("think>a</think>", False)])
def test_free_text_in_and_after_a_tag(small_info, text, ok):
    assert _accepts(_compile(small_info, THINK), text) == ok


def test_free_text_masks_equal_the_reference(small_info, deepseek_info):
    from test_masks import reference_mask, unpack

    for info, steps in ((small_info, "<think>ab</thi</think>x<tool"), (deepseek_info, ["<think>", "ok", "</think>"])):
        compiled = _compile(info, THINK)
        m = xg2.GrammarMatcher(compiled)
        bm = xg2.allocate_token_bitmask(1, info.vocab_size)
        special = set(info.special_token_ids)
        candidates = [t for t in range(info.vocab_size) if t not in special]
        for piece in steps:
            m.fill_next_token_bitmask(bm)
            ref = reference_mask(m, info, candidates)
            assert (unpack(bm, info.vocab_size) == ref).all(), piece
            assert m.accept_string(piece)


def _fn(n: str) -> dict:
    return {"type": "tag", "begin": f"<f={n}>", "content": {"type": "const_string", "value": n}, "end": "</f>"}


TRIGGERED_TEXTS = ["", "hi", "<f=a>a</f>", "hi <f=a>a</f>", "hi <f=a>a</f> bye", "<f=a>a</f><f=b>b</f>",
                   "x<f=a>a</f>y<f=b>b</f>z", "<f=c>c</f>", "x <f", "a<f=a>b</f>", "<f=a>a</f>y",
                   "<f=a>a</f>y<f=b>b</f>", "<f=a>a</f>x <f"]


@pytest.mark.parametrize(("at_least_one", "stop_after_first", "accepted"), [
    (False, False, {"", "hi", "<f=a>a</f>", "hi <f=a>a</f>", "hi <f=a>a</f> bye", "<f=a>a</f><f=b>b</f>",
                    "x<f=a>a</f>y<f=b>b</f>z", "x <f", "<f=a>a</f>y", "<f=a>a</f>y<f=b>b</f>", "<f=a>a</f>x <f"}),
    (True, False, {"<f=a>a</f>", "<f=a>a</f><f=b>b</f>", "<f=a>a</f>y", "<f=a>a</f>y<f=b>b</f>", "<f=a>a</f>x <f"}),
    (False, True, {"", "hi", "<f=a>a</f>", "hi <f=a>a</f>", "x <f"}),
    (True, True, {"<f=a>a</f>"}),
])
def test_triggered_tags(small_info, at_least_one, stop_after_first, accepted):
    """The four combinations, as xgrammar 0.2.8 decides them on the same strings."""
    compiled = _compile(small_info, {"type": "triggered_tags", "triggers": ["<f="], "tags": [_fn("a"), _fn("b")],
                                     "at_least_one": at_least_one, "stop_after_first": stop_after_first})
    for text in TRIGGERED_TEXTS:
        assert _accepts(compiled, text) == (text in accepted), text


@pytest.mark.parametrize(("loop", "accepted"), [
    (True, {"", "hi", "<a>1", "hi<a>1", "hi<a>1 bye", "<a>1<b>x", "x<a>1y<b>xz", "x<a", "<a>1<a>2"}),
    (False, {"", "hi", "<a>1", "hi<a>1", "x<a"}),
])
def test_dispatch(small_info, loop, accepted):
    """Both loop settings, as xgrammar 0.2.8 decides them on the same strings."""
    compiled = _compile(small_info, {"type": "dispatch", "loop": loop, "excludes": ["zz"], "rules": [
        ["<a>", {"type": "regex", "pattern": "[0-9]"}], ["<b>", {"type": "const_string", "value": "x"}]]})
    for text in ("", "hi", "<a>1", "hi<a>1", "hi<a>1 bye", "<a>1<b>x", "x<a>1y<b>xz", "<a>", "x<a", "<a>1<a>2", "zz",
                 "<b>y"):
        assert _accepts(compiled, text) == (text in accepted), text


def test_triggered_tool_calls_mask_like_the_reference(small_info, deepseek_info):
    from test_masks import reference_mask, unpack

    fmt = {"type": "triggered_tags", "triggers": ["<tool_call>"], "excludes": ["<|im_end|>"], "tags": [
        {"type": "tag", "begin": '<tool_call>{"name": "f", "arguments": ', "end": "}</tool_call>", "content": {
            "type": "json_schema", "json_schema": {"type": "object", "properties": {"x": {"type": "integer"}}}}},
        {"type": "tag", "begin": "<tool_call>think:", "content": {"type": "any_text"}, "end": "</tool_call>"}]}
    for info, pieces in ((small_info, ["I will ", "<", "tool_call>", "think:", "ab</tool", "_call>", "ok"]),
                         (deepseek_info, ["Sure. ", "<tool_call>", '{"name": "f", "arguments": ', '{"x": 1}'])):
        m = xg2.GrammarMatcher(_compile(info, fmt))
        bm = xg2.allocate_token_bitmask(1, info.vocab_size)
        special = set(info.special_token_ids)
        candidates = [t for t in range(info.vocab_size) if t not in special]
        for piece in pieces:
            m.fill_next_token_bitmask(bm)
            assert (unpack(bm, info.vocab_size) == reference_mask(m, info, candidates)).all(), piece
            assert m.accept_string(piece), piece


@pytest.mark.parametrize(("fmt", "pointer", "words"), [
    ({"type": "triggered_tags", "triggers": ["<f", "<f="], "tags": [_fn("a")]}, "/format/triggers", "inside"),
    ({"type": "dispatch", "rules": [["<a>", CONST], ["x<a>", CONST]]}, "/format/rules", "inside"),
    ({"type": "sequence", "elements": [{"type": "any_text"}, CONST]}, "/format/elements/0", "any_text"),
    ({"type": "sequence", "elements": [{"type": "or", "elements": [CONST, {"type": "any_text"}]}, CONST]},
     "/format/elements/0/elements/1", "any_text"),
    ({"type": "tag", "begin": "<a>", "content": {"type": "any_text", "max_chars": 5000}, "end": "</a>"},
     "/format/content/max_chars", "max_chars"),
    ({"type": "tag", "begin": "<a>", "content": {"type": "any_text", "excludes": ["/"]}, "end": "</a>"},
     "/format/content/excludes", "excluded"),
    ({"type": "json_schema", "json_schema": {"type": "array"}, "style": "qwen_xml"}, "/format/json_schema/type",
     "object"),
    ({"type": "json_schema", "json_schema": {"type": "object", "additionalProperties": {"type": "integer"}},
      "style": "minimax_m3_xml"}, "/format/json_schema/additionalProperties", "XML"),
    ({"type": "sequence", "elements": [CONST, {"type": "exclude_token", "exclude_tokens": [10**6]}]},
     "/format/elements/1/exclude_tokens/0", "out of range"),
    ({"type": "tag", "begin": {"type": "token", "token": 10**6}, "content": CONST, "end": "x"}, "/format/begin/token",
     "out of range"),
    ({"type": "or", "elements": [CONST, {"type": "json_schema", "json_schema": {"type": "object", "properties": {
        "a": {"type": "string", "pattern": "(?=x)"}}}}]}, "/format/elements/1/json_schema/properties/a/pattern",
     "lookahead"),
    ({"type": "optional", "content": {"type": "grammar", "grammar": "root ::= x"}}, "/format/content/grammar", "x"),
    ({"type": "plus", "content": {"type": "regex", "pattern": "a(b"}}, "/format/content/pattern", "pattern"),
])
def test_what_is_not_lowered_says_where(small_info, fmt, pointer, words):
    with pytest.raises(xg2.StructuralTagError) as exc:
        _compile(small_info, fmt)
    assert exc.value.pointer == pointer, exc.value
    assert words.lower() in str(exc.value).lower()      # the regex module capitalises its messages


def test_tool_calls_from_the_registry_validate(deepseek_info):
    """An `or` of 8 real tools' call tags; random walks end in calls whose arguments validate."""
    jsonschema = pytest.importorskip("jsonschema")
    import random

    import numpy as np

    if not REGISTRY.exists():
        pytest.skip(f"{REGISTRY} not found: the tool registry lives in ../shared beside the checkout")
    tools = [json.loads(line)["function"] for line in REGISTRY.open()][:8]
    fmt = {"type": "or", "elements": [
        {"type": "tag", "begin": f'<tool_call>{{"name": "{t["name"]}", "arguments": ',
         "content": {"type": "json_schema", "json_schema": t["parameters"]}, "end": "}</tool_call>"} for t in tools]}
    compiled = xg2.GrammarCompiler(deepseek_info).compile_structural_tag(_tag(fmt))
    by_name = {t["name"]: t["parameters"] for t in tools}
    bm = xg2.allocate_token_bitmask(1, deepseek_info.vocab_size)
    vocab = deepseek_info.decoded_vocab
    is_stop = np.zeros(deepseek_info.vocab_size, bool)
    is_stop[list(deepseek_info.stop_token_ids)] = True
    closes = np.array([b[:1] in (b"}", b"]", b'"', b"<", b",") for b in vocab] +
                      [False] * (deepseek_info.vocab_size - len(vocab)))
    rng = random.Random(2)
    done = 0
    for _ in range(12):
        m = xg2.GrammarMatcher(compiled)
        out = b""
        for _step in range(120):
            m.fill_next_token_bitmask(bm)
            allowed = np.unpackbits(np.asarray(bm)[0].view(np.uint8), bitorder="little")[:deepseek_info.vocab_size] > 0
            if m.is_completed() and (allowed & is_stop).any():
                break
            # close structures more often than not, so that walks end within the step budget
            pool = np.nonzero(allowed & ~is_stop & closes)[0]
            if not len(pool) or rng.random() < 0.4:
                pool = np.nonzero(allowed & ~is_stop)[0]
            t = int(pool[rng.randrange(len(pool))])
            assert m.accept_token(t)
            out += vocab[t]
        if not m.is_completed():
            continue
        text = out.decode()
        assert text.startswith('<tool_call>{"name": "') and text.endswith("}</tool_call>")
        call = json.loads(text[len("<tool_call>"):-len("</tool_call>")])
        assert jsonschema.Draft202012Validator(by_name[call["name"]]).is_valid(call["arguments"]), text
        done += 1
    assert done >= 3


# --- XML argument styles -------------------------------------------------------------------------

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"enum": ["c", "f"]},
    "opts": {"type": "object", "properties": {"a": {"type": "boolean"}}}, "tags": {"type": "array", "items": {"type": "string"}},
    "code": {"type": "string", "pattern": "^[A-Z]{3}$"}}, "required": ["city", "days"]}


def _xml(style: str, members: list[tuple[str, str]]) -> str:
    """Arguments as each model's template writes them (string-only values raw, the rest JSON)."""
    out = ""
    for name, value in members:
        raw = name in ("city", "unit", "code")
        out += {"qwen_xml": f"<parameter={name}>\n{value}\n</parameter>\n",
                "minimax_xml": f'<parameter name="{name}">{value}</parameter>\n',
                "glm_xml": f"<arg_key>{name}</arg_key>\n<arg_value>{value}</arg_value>\n",
                "deepseek_xml": f'<\uff5cDSML\uff5cparameter name="{name}" string="{str(raw).lower()}">{value}'
                                "</\uff5cDSML\uff5cparameter>\n"}[style]
    return out


@pytest.mark.parametrize("style", ["qwen_xml", "minimax_xml", "glm_xml", "deepseek_xml"])
@pytest.mark.parametrize(("members", "ok"), [
    ([("city", "Paris"), ("days", "3")], True),
    ([("city", "Paris, <b>not</b> a tag\nsecond line"), ("days", " -2 ")], True),
    ([("city", "Paris"), ("days", "3"), ("unit", "c"), ("opts", '{"a": true}'), ("tags", '["x", "y"]'),
      ("code", "CDG")], True),
    ([("city", "Paris"), ("days", "3"), ("code", "CDGX")], False),          # pattern
    ([("city", "Paris"), ("days", "3"), ("unit", "k")], False),             # enum
    ([("city", "Paris"), ("days", "x")], False),                            # not an integer
    ([("days", "3"), ("city", "Paris")], False),                            # out of order
    ([("city", "Paris")], False),                                           # a required one missing
    ([("city", "Paris"), ("days", "3"), ("where", "x")], False),            # not a listed argument
    ([("city", "Paris"), ("days", "3"), ("opts", '{"a": 1}')], False),     # nested JSON checked
])
def test_xml_styles(small_info, style, members, ok):
    fmt = {"type": "json_schema", "json_schema": WEATHER, "style": style}
    assert _accepts(_compile(small_info, fmt), _xml(style, members)) == ok


def test_qwen_xml_parameter_format_is_the_qwen_style(small_info):
    compiled = _compile(small_info, {"type": "qwen_xml_parameter", "json_schema": WEATHER})
    assert _accepts(compiled, "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n")
    assert not _accepts(compiled, '{"city": "Paris", "days": 3}')


def test_xml_arguments_of_an_open_schema(small_info):
    for style, text in [("qwen_xml", "<parameter=any_name>\n[1, 2]\n</parameter>\n<parameter=b>x</parameter>"),
                        ("deepseek_xml", ('<\uff5cDSML\uff5cparameter name="n" string="false">{"k": 1}'
                                          "</\uff5cDSML\uff5cparameter>"))]:
        assert _accepts(_compile(small_info, {"type": "json_schema", "json_schema": True, "style": style}), text)
    bad = '<\uff5cDSML\uff5cparameter name="n" string="false">{"k": 1</\uff5cDSML\uff5cparameter>'
    assert not _accepts(_compile(small_info, {"type": "json_schema", "json_schema": True, "style": "deepseek_xml"}), bad)


# --- token-level formats ---------------------------------------------------------------------------

def _token_walk(info, compiled, pieces) -> bool:
    """Feed text and special tokens (ints) in turn; each step's mask bit agrees with acceptance."""
    from test_masks import unpack

    m = xg2.GrammarMatcher(compiled)
    bm = xg2.allocate_token_bitmask(1, info.vocab_size)
    table = {b: i for i, b in enumerate(info.decoded_vocab) if b and i not in set(info.special_token_ids)}
    from conftest import longest_match

    for piece in pieces:
        ids = [piece] if isinstance(piece, int) else longest_match(table, piece.encode())
        for t in ids:
            m.fill_next_token_bitmask(bm)
            allowed = bool(unpack(bm, info.vocab_size)[t])
            ok = m.accept_token(t)
            assert allowed == ok, (piece, t)
            if not ok:
                return False
    return m.is_completed()


CHANNEL, MESSAGE, END, START = 200005, 200008, 200007, 200006


@pytest.mark.parametrize(("fmt", "pieces", "ok"), [
    ({"type": "token", "token": "<|channel|>"}, [CHANNEL], True),
    ({"type": "token", "token": 200005}, ["<|channel|>"], False),              # its text is not the token
    ({"type": "tag", "begin": {"type": "token", "token": CHANNEL}, "content": {"type": "any_text"},
      "end": {"type": "token", "token": "<|end|>"}}, [CHANNEL, "free <|end|> text", END], True),
    ({"type": "tag", "begin": "", "content": {"type": "any_tokens", "exclude_tokens": ["<|start|>"]},
      "end": {"type": "token", "token": END}}, ["a", MESSAGE, "b", CHANNEL, END], True),
    ({"type": "tag", "begin": "", "content": {"type": "any_tokens", "exclude_tokens": ["<|start|>"]},
      "end": {"type": "token", "token": END}}, ["a", START, END], False),
    ({"type": "tag", "begin": "", "content": {"type": "any_text"}, "end": {"type": "token", "token": END}},
     ["a", MESSAGE, END], False),                                             # free text holds no special token
    ({"type": "token_triggered_tags", "trigger_tokens": [CHANNEL], "exclude_tokens": [START], "tags": [
        {"type": "tag", "begin": {"type": "token", "token": CHANNEL}, "content": {"type": "const_string", "value": "x"},
         "end": {"type": "token", "token": END}}]}, ["hi ", MESSAGE, CHANNEL, "x", END, " bye"], True),
    ({"type": "token_triggered_tags", "trigger_tokens": [CHANNEL], "exclude_tokens": [START], "tags": [
        {"type": "tag", "begin": {"type": "token", "token": CHANNEL}, "content": {"type": "const_string", "value": "x"},
         "end": {"type": "token", "token": END}}]}, ["hi ", CHANNEL, "y"], False),
    ({"type": "token_triggered_tags", "trigger_tokens": [CHANNEL], "exclude_tokens": [START], "tags": [
        {"type": "tag", "begin": {"type": "token", "token": CHANNEL}, "content": {"type": "const_string", "value": "x"},
         "end": {"type": "token", "token": END}}]}, ["hi ", START], False),
    ({"type": "token_dispatch", "loop": False, "rules": [[MESSAGE, {"type": "const_string", "value": "m"}],
                                                          ["<|channel|>", {"type": "regex", "pattern": "[0-9]+"}]]},
     ["text ", CHANNEL, "42"], True),
    ({"type": "token_dispatch", "loop": False, "rules": [[MESSAGE, {"type": "const_string", "value": "m"}],
                                                          ["<|channel|>", {"type": "regex", "pattern": "[0-9]+"}]]},
     ["text ", MESSAGE, "m", CHANNEL], False),                                 # no loop
])
def test_token_level_formats(harmony_info, fmt, pieces, ok):
    compiled = xg2.GrammarCompiler(harmony_info).compile_structural_tag(_tag(fmt))
    assert _token_walk(harmony_info, compiled, pieces) == ok


@pytest.mark.parametrize(("fmt", "pointer", "words"), [
    ({"type": "token", "token": "<|call|>"}, "/format/token", "stop token"),
    ({"type": "token", "token": "<|nope|>"}, "/format/token", "no token has the text"),
    ({"type": "any_tokens", "exclude_tokens": ["<|nope|>"]}, "/format/exclude_tokens/0", "no token has the text"),
    ({"type": "token_triggered_tags", "trigger_tokens": [CHANNEL], "tags": [
        {"type": "tag", "begin": "<|channel|>", "content": CONST, "end": "."}]}, "/format/tags/0/begin", "token"),
])
def test_token_level_errors(harmony_info, fmt, pointer, words):
    with pytest.raises(xg2.StructuralTagError) as exc:
        xg2.GrammarCompiler(harmony_info).compile_structural_tag(_tag(fmt))
    assert exc.value.pointer == pointer and words in str(exc.value), exc.value


def test_token_level_formats_need_the_vocabulary(harmony_info):
    tag = _tag({"type": "token", "token": CHANNEL})
    with pytest.raises(xg2.StructuralTagError, match="vocabulary"):
        xg2.Grammar.from_structural_tag(tag)
    grammar = xg2.Grammar.from_structural_tag(tag, harmony_info)
    compiled = xg2.GrammarCompiler(harmony_info).compile_grammar(grammar)
    assert _token_walk(harmony_info, compiled, [CHANNEL])


def test_only_the_first_2048_special_tokens_can_be_named():
    vocab = [chr(c) for c in range(32, 127)] + [f"<|s{i}|>" for i in range(2100)] + ["<eos>"]
    first = 95
    info = xg2.TokenizerInfo(vocab, stop_token_ids=[len(vocab) - 1], special_token_ids=range(first, first + 2100))
    assert len(info.named_special_tokens) == 2048
    compiler = xg2.GrammarCompiler(info)
    m = xg2.GrammarMatcher(compiler.compile_structural_tag(_tag({"type": "token", "token": "<|s2047|>"})))
    assert not m.accept_token(first + 2046) and m.accept_token(first + 2047) and m.is_completed()
    with pytest.raises(xg2.StructuralTagError, match="cannot be named"):
        compiler.compile_structural_tag(_tag({"type": "token", "token": "<|s2048|>"}))
