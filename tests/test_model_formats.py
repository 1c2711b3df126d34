"""Model tool-call formats (get_model_structural_tag): requests read as OpenAI's; for every format,
calls written as the model's chat template writes them, for real tool sets (BFCL's parallel
calls with their ground-truth arguments, tools from the registry), are accepted token by token on
the model's vocabulary, and the same calls broken (wrong tool name, bad arguments, text inside a
call, a second call when parallel calls are off) are rejected; masks equal the reference checker;
random walks' calls, read as the model's parser reads them, validate against the tool's schema.
An independent corpus written from the chat templates (tests/data/model_outputs.json) is checked
the same way; xgrammar's per-model functions (xg2.builtin_structural_tag) give each name's tag."""

from __future__ import annotations

import copy
import html
import json
import random
import re
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED
from test_masks import reference_mask, unpack

import xg2
import xg2.testing
from xg2.grammar.model_output import read_model_output

BFCL = SHARED / "data" / "bfcl"
REGISTRY = SHARED / "data" / "tools" / "registry.jsonl"
CORPUS = Path(__file__).parent / "data" / "model_outputs.json"
MODELS = ["llama", "qwen_3", "qwen_3_coder", "deepseek_r1", "deepseek_v3_1", "kimi", "harmony", "glm_4_7", "minimax",
          "qwen_3_5", "deepseek_v3_2", "exaone", "deepseek_v4", "deepseek_v4_1", "minimax_m3", "mimo", "cohere", "kimi_k3"]
DS = {k: f"<\uff5c{k.replace(' ', chr(0x2581))}\uff5c>" for k in
      ("tool calls begin", "tool calls end", "tool call begin", "tool call end", "tool sep")}
DSML = "\uff5cDSML\uff5c"
NS = "]<]minimax[>["
#: The DSML models' (block, invoke, parameter) tag names.
DSML_NAMES = {"deepseek_v3_2": ("function_calls", "invoke", "parameter"), "deepseek_v4": ("tool_calls", "invoke", "parameter"),
              "deepseek_v4_1": (" calls", " invoke", " parameter")}


# --- real tool sets ------------------------------------------------------------------------------

def _bfcl_schema(node):
    """BFCL's parameter dialect (dict, float, tuple, any) as JSON Schema."""
    if isinstance(node, list):
        return [_bfcl_schema(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _bfcl_schema(v) for k, v in node.items()}
    kind = out.get("type")
    if kind == "any":
        out.pop("type")
    elif isinstance(kind, str):
        out["type"] = {"dict": "object", "float": "number", "tuple": "array"}.get(kind, kind)
    return out


@lru_cache(maxsize=1)
def bfcl_parallel_cases() -> list[tuple[list[dict], list[tuple[str, dict]]]]:
    """(tools, ground-truth calls) of BFCL's parallel_multiple set, first acceptable value of each
    argument, in the schema's property order; cases whose arguments do not validate are left out."""
    jsonschema = pytest.importorskip("jsonschema")
    questions = [json.loads(x) for x in (BFCL / "BFCL_v3_parallel_multiple.json").open(encoding="utf-8")]
    answers = {a["id"]: a["ground_truth"] for a in
               (json.loads(x) for x in (BFCL / "possible_answer" / "BFCL_v3_parallel_multiple.json").open(encoding="utf-8"))}
    out = []
    for q in questions:
        tools = [{"type": "function", "function": {**f, "parameters": _bfcl_schema(f["parameters"])}} for f in q["function"]]
        params = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
        calls = []
        for call in answers[q["id"]]:
            (name, options), = call.items()
            order = list(params[name].get("properties", {}))
            args = {k: v[0] for k, v in sorted(options.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 99)
                    if v and v[0] != ""}
            calls.append((name, args))
        if all(jsonschema.Draft202012Validator(params[n]).is_valid(a) for n, a in calls) and len(calls) > 1:
            out.append((tools, calls))
    return out


# --- calls written as each model's template writes them ------------------------------------------

def _json(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def _raw(value) -> str:
    """An XML-style argument as the templates write it: a string as it is, anything else as JSON."""
    return value if isinstance(value, str) else _json(value)


def _attr(value: str, chars: str = "&<>\"") -> str:
    """An XML attribute value with the entities the template writes for `chars`."""
    for ch, entity in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ('"', "&quot;")):
        if ch in chars:
            value = value.replace(ch, entity)
    return value


def _cofl(name: str | None, value) -> str:
    """A cmd5-nested-xml <cofl:value> element (unnamed for a list item): strings raw, other scalars
    JSON, objects and lists as child elements."""
    head = "<cofl:value" + ("" if name is None else f' name="{_attr(name)}"')
    if isinstance(value, dict):
        return head + ' type="dict">' + "".join(_cofl(k, v) for k, v in value.items()) + "</cofl:value>"
    if isinstance(value, list):
        return head + ' type="list">' + "".join(_cofl(None, v) for v in value) + "</cofl:value>"
    return head + (' type="raw">' if isinstance(value, str) else ' type="json">') + _raw(value) + "</cofl:value>"


def _m3(value) -> str:
    """MiniMax-M3's to_xml: members as elements named after them (null ones left out), items as
    <item> elements, every tag behind the namespace marker, scalars bare."""
    if isinstance(value, dict):
        return "".join(f"{NS}<{k}>{_m3(v)}{NS}</{k}>" for k, v in value.items() if v is not None)
    if isinstance(value, list):
        return "".join(f"{NS}<item>{_m3(v)}{NS}</item>" for v in value)
    return _raw(value)


def _k3_type(value) -> str:
    if value is None or isinstance(value, bool):
        return "null" if value is None else "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}[type(value)]


def render(model: str, calls: list[tuple[str, dict]], reasoning: str = "The user asks for this; I will call the tool.",
           text: str = "") -> str:
    """The model's output: reasoning (if any), text, then the calls as its chat template writes them."""
    if model == "kimi_k3":      # channels: the prompt opened the first one (think, or response without reasoning)
        head = f"{reasoning}<|close|>think<|sep|><|open|>response<|sep|>" if reasoning else ""
        tools = "".join(f'<|open|>call tool="{_attr(n, chr(38) + chr(34))}" index="{i}"<|sep|>' + "".join(
            f'<|open|>argument key="{_attr(k, chr(38) + chr(34))}" type="{_k3_type(v)}"<|sep|>{_raw(v)}'
            "<|close|>argument<|sep|>" for k, v in a.items()) + "<|close|>call<|sep|>" for i, (n, a) in enumerate(calls, 1))
        tools = f"<|open|>tools<|sep|>{tools}<|close|>tools<|sep|>" if calls else ""
        return head + text + "<|close|>response<|sep|>" + tools + "<|close|>message<|sep|>"
    if model == "harmony":
        (name, args), = calls
        head = f"<|channel|>analysis<|message|>{reasoning}<|end|><|start|>assistant" if reasoning else ""
        return head + f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{_json(args)}<|call|>"
    think = ""
    if reasoning and model in ("qwen_3", "qwen_3_coder"):
        think = f"<think>\n{reasoning}\n</think>\n\n"
    elif reasoning and model in ("glm_4_7", "deepseek_v3_2", "deepseek_v4", "deepseek_v4_1"):
        think = f"{reasoning}</think>"              # the prompt ends with <think>; no newlines around
    elif reasoning and model == "minimax_m3":
        think = f"{reasoning}</mm:think>"           # the prompt ends with <mm:think>
    elif reasoning and model == "mimo":
        think = f"<think>{reasoning}</think>"       # MiMo-V2.6: the prompt ends at the assistant's line
    elif reasoning and model == "cohere":
        think = f"{reasoning}<|END_THINKING|>"      # the prompt ends with <|START_THINKING|>
    elif reasoning and model != "llama":
        think = f"{reasoning}\n</think>\n\n"      # DeepSeek / Kimi / ...: the prompt opens the block
    if model == "llama":
        body = "; ".join(_json({"name": n, "parameters": a}) for n, a in calls)
    elif model == "qwen_3":
        body = "\n".join(f"<tool_call>\n{_json({'name': n, 'arguments': a})}\n</tool_call>" for n, a in calls)
    elif model in ("qwen_3_coder", "qwen_3_5"):
        body = "\n".join("<tool_call>\n<function=" + n + ">\n" + "".join(
            f"<parameter={k}>\n{_raw(v)}\n</parameter>\n" for k, v in a.items())
            + "</function>\n</tool_call>" for n, a in calls)
    elif model == "glm_4_7":
        body = "".join(f"<tool_call>{n}" + "".join(f"<arg_key>{k}</arg_key><arg_value>{_raw(v)}</arg_value>"
                                                   for k, v in a.items()) + "</tool_call>" for n, a in calls)
    elif model == "minimax":
        body = "\n<minimax:tool_call>\n" + "".join(
            f'<invoke name="{n}">\n' + "".join(f'<parameter name="{k}">{_raw(v)}</parameter>\n' for k, v in a.items())
            + "</invoke>\n" for n, a in calls) + "</minimax:tool_call>"
    elif model in DSML_NAMES:
        block, invoke, param = DSML_NAMES[model]
        body = f"\n\n<{DSML}{block}>\n" + "\n".join(
            f'<{DSML}{invoke} name="{n}">\n' + "\n".join(
                f'<{DSML}{param} name="{k}" string="{str(isinstance(v, str)).lower()}">{_raw(v)}</{DSML}{param}>'
                for k, v in a.items()) + f"\n</{DSML}{invoke}>" for n, a in calls) + f"\n</{DSML}{block}>"
    elif model == "minimax_m3":
        body = f"{NS}<tool_call>\n" + "".join(f'{NS}<invoke name="{n}">{_m3(a)}{NS}</invoke>\n' for n, a in calls) \
            + f"{NS}</tool_call>"
    elif model == "mimo":       # MiMo-V2.5's layout, a newline after each tag but the parameter's opening
        body = "".join(f"<tool_call>\n<function={n}>\n" + "".join(f"<parameter={k}>{_raw(v)}</parameter>\n"
                                                                    for k, v in a.items()) + "</function>\n</tool_call>"
                       for n, a in calls)
    elif model == "cohere":
        body = "<cofl:tool_calls>" + "".join(f'<cofl:tool_call id="{i}" name="{_attr(n)}">'
                                             + "".join(_cofl(k, v) for k, v in a.items()) + "</cofl:tool_call>"
                                             for i, (n, a) in enumerate(calls)) + "</cofl:tool_calls>"
    elif model == "exaone":
        body = "\n".join(f"<tool_call>{_json({'name': n, 'arguments': a})}</tool_call>" for n, a in calls)
    elif model == "deepseek_r1":
        body = DS["tool calls begin"] + "\n".join(
            f"{DS['tool call begin']}function{DS['tool sep']}{n}\n```json\n{_json(a)}\n```{DS['tool call end']}"
            for n, a in calls) + DS["tool calls end"]
    elif model == "deepseek_v3_1":
        body = DS["tool calls begin"] + "".join(f"{DS['tool call begin']}{n}{DS['tool sep']}{_json(a)}{DS['tool call end']}"
                                                for n, a in calls) + DS["tool calls end"]
    else:
        body = "<|tool_calls_section_begin|>" + "".join(
            f"<|tool_call_begin|>functions.{n}:{i}<|tool_call_argument_begin|>{_json(a)}<|tool_call_end|>"
            for i, (n, a) in enumerate(calls)) + "<|tool_calls_section_end|>"
    return think + text + body


class Formats:
    """Compiled model formats per vocabulary, and the model's own tokenization of its output."""

    def __init__(self, deepseek_info, deepseek_tokenizer, harmony_info, harmony_encoding):
        self.compilers = {"deepseek": xg2.GrammarCompiler(deepseek_info), "harmony": xg2.GrammarCompiler(harmony_info)}
        self.deepseek_tokenizer = deepseek_tokenizer
        self.harmony_encoding = harmony_encoding
        self.infos = {"deepseek": deepseek_info, "harmony": harmony_info}
        self.cache: dict[str, xg2.CompiledGrammar] = {}

    def vocab(self, model: str) -> str:
        return "harmony" if model == "harmony" else "deepseek"

    def compiled(self, model: str, tools: list[dict], **options) -> xg2.CompiledGrammar:
        key = json.dumps([model, tools, options], sort_keys=True)
        if key not in self.cache:
            tag = xg2.get_model_structural_tag(model, tools, **options)
            self.cache[key] = self.compilers[self.vocab(model)].compile_structural_tag(tag)
        return self.cache[key]

    def encode(self, model: str, text: str) -> list[int]:
        if model == "harmony":
            return self.harmony_encoding.encode(text, allowed_special="all")
        return self.deepseek_tokenizer.encode(text, add_special_tokens=False).ids

    def accepts(self, model: str, tools: list[dict], text: str, check_masks: bool = True, **options) -> bool:
        """Token by token on the model's vocabulary; each token's mask bit agrees with acceptance."""
        matcher = xg2.GrammarMatcher(self.compiled(model, tools, **options))
        info = self.infos[self.vocab(model)]
        bitmask = xg2.allocate_token_bitmask(1, info.vocab_size)
        for t in self.encode(model, text):
            if matcher.is_terminated():
                return False            # text after the stop token; no mask is asked for (xgrammar raises)
            if check_masks:
                matcher.fill_next_token_bitmask(bitmask)
                allowed = bool(int(bitmask[0, t // 32]) >> (t % 32) & 1)
            ok = matcher.accept_token(t)
            if check_masks:
                assert allowed == ok, (model, t, text)
            if not ok:
                return False
        # gpt-oss's turn ends with a stop token in its output (`<|call|>`, `<|return|>`); for the
        # others the end of the text stands for the end-of-turn token.
        return matcher.is_terminated() if model == "harmony" else matcher.is_completed()


@pytest.fixture(scope="module")
def formats(deepseek_info, deepseek_tokenizer, harmony_info, harmony_encoding):
    return Formats(deepseek_info, deepseek_tokenizer, harmony_info, harmony_encoding)


# --- the request ---------------------------------------------------------------------------------

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}
BROWSER = {"type": "web_search_preview", "name": "browser.search",
           "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}


@pytest.mark.parametrize(("kwargs", "pointer", "words"), [
    ({"model": "nope"}, "/model", "Unknown format type 'nope'"),
    ({"tools": {"a": 1}}, "/tools", "list"),
    ({"tools": [{"type": "function"}]}, "/tools/0/function", "function"),
    ({"tools": [{"type": "function", "function": {"name": ""}}]}, "/tools/0/function/name", "name"),
    ({"tools": [WEATHER, WEATHER]}, "/tools/1/function/name", "two tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]}, "/tools/0/function/parameters",
     "JSON Schema"),
    ({"tool_choice": "sometimes"}, "/tool_choice", "tool_choice"),
    ({"tool_choice": "required", "tools": []}, "/tool_choice", "no tools"),
    ({"tool_choice": {"type": "function", "function": {"name": "fly"}}}, "/tool_choice", "fly"),
    ({"tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "always", "tools": []}}},
     "/tool_choice/allowed_tools/mode", "mode"),
    ({"tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [{"type": "function",
      "function": {"name": "fly"}}]}}}, "/tool_choice/allowed_tools/tools/0", "fly"),
    ({"reasoning": "maybe"}, "/reasoning", "reasoning"),
    ({"max_whitespace_cnt": 0}, "/max_whitespace_cnt", "positive"),
    # a truthy string must not loosen the format (parallel calls, any key order)
    ({"parallel_tool_calls": "no"}, "/parallel_tool_calls", "parallel_tool_calls must be a boolean"),
    ({"any_order": "no"}, "/any_order", "any_order must be a boolean"),
    ({"tools": [{"type": "function", "function": {"name": 3}}]}, "/tools/0/function/name", "function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
     "/tools/0/function/parameters", "function.parameters"),
    ({"tools": [{"type": "web_search_preview", "name": "a"}, {"type": "web_search_preview", "name": "b"}],
      "tool_choice": {"type": "web_search_preview"}}, "/tool_choice", "exactly one tool, but 2"),
    ({"tools": [WEATHER], "tool_choice": {"type": "code_interpreter"}}, "/tool_choice", "exactly one tool, but 0"),
    ({"tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
        {"type": "code_interpreter"}]}}}, "/tool_choice/allowed_tools/tools/0", "Allowed builtin tools"),
])
def test_bad_requests_say_where(kwargs, pointer, words):
    args = {"model": "qwen_3", "tools": [WEATHER, SEARCH], **kwargs}
    with pytest.raises(xg2.ModelFormatError) as exc:
        xg2.get_model_structural_tag(**args)
    assert exc.value.pointer == pointer and words in str(exc.value), exc.value


def test_tools_read_as_xgrammar_reads_them(json_info):
    """A tool without 'type' but with a 'function' is a function tool, and a function with
    `strict: false` has unconstrained arguments, as xgrammar's get_model_structural_tag reads them;
    its parameters come in xgrammar's positional order (force_reasoning fifth)."""
    untyped = {"function": WEATHER["function"]}
    assert xg2.get_model_structural_tag("qwen_3", [untyped]) == xg2.get_model_structural_tag("qwen_3", [WEATHER])
    loose = {"type": "function", "function": {**WEATHER["function"], "strict": False}}
    free = {"type": "function", "function": {"name": "get_weather"}}
    assert xg2.get_model_structural_tag("qwen_3", [loose]) == xg2.get_model_structural_tag("qwen_3", [free])
    compiler = xg2.GrammarCompiler(json_info)
    call = '</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"town": [1]}}\n</tool_call>'
    for tools, ok in (([loose], True), ([WEATHER], False)):
        m = xg2.GrammarMatcher(compiler.compile_structural_tag(xg2.get_model_structural_tag("qwen_3", tools)))
        assert m.accept_string(call) == ok
    positional = xg2.get_model_structural_tag("qwen_3", [WEATHER], "auto", "disabled", True, False, True, None, False)
    assert positional == xg2.get_model_structural_tag("qwen_3", [WEATHER], reasoning="disabled",
                                                      parallel_tool_calls=False)


def test_typed_tool_params_read_as_their_dicts():
    """xg2.openai_tool_call_schema's structs (xgrammar's names) give the tag their JSON gives."""
    import msgspec

    from xg2.openai_tool_call_schema import (
        AllowedToolChoiceParam,
        AllowedToolRef,
        AllowedToolsParam,
        BuiltinToolChoiceParam,
        BuiltinToolParam,
        FunctionToolParam,
        NamedToolChoiceFunction,
        NamedToolChoiceParam,
    )

    weather = msgspec.convert(WEATHER, FunctionToolParam)
    browser = msgspec.convert(BROWSER, BuiltinToolParam)
    assert weather.model_dump() == WEATHER and browser.model_dump() == BROWSER
    choices = [
        (NamedToolChoiceParam(function=NamedToolChoiceFunction(name="get_weather")),
         {"type": "function", "function": {"name": "get_weather"}}),
        (BuiltinToolChoiceParam(type="web_search_preview"), {"type": "web_search_preview"}),
        (AllowedToolChoiceParam(allowed_tools=AllowedToolsParam(mode="required", tools=[
            AllowedToolRef(type="function", function=NamedToolChoiceFunction(name="get_weather"))])),
         {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
             {"type": "function", "function": {"name": "get_weather"}}]}}),
    ]
    for typed, plain in choices:
        assert xg2.get_model_structural_tag("harmony", [weather, browser], typed) == \
            xg2.get_model_structural_tag("harmony", [WEATHER, BROWSER], plain)


CHOICES = ["auto", "required", "none", {"type": "function", "function": {"name": "search"}},
           {"type": "web_search_preview"},
           {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
               {"type": "function", "function": {"name": "get_weather"}}, {"type": "web_search_preview"}]}}]


@pytest.mark.parametrize("model", MODELS)
def test_per_model_functions_give_the_model_tag(model):
    """xgrammar's per-model functions (xg2.builtin_structural_tag.get_<model>_structural_tag, its
    names and parameters), given a request normalize_tool_choice normalised, give the tag
    get_model_structural_tag gives for the model's name."""
    from xg2 import builtin_structural_tag as bst

    fn = getattr(bst, f"get_{model}_structural_tag")
    xgrammar = pytest.importorskip("xgrammar")
    import inspect

    theirs = inspect.signature(getattr(xgrammar.builtin_structural_tag, f"get_{model}_structural_tag")).parameters
    ours = inspect.signature(fn).parameters
    assert [(p.name, p.kind, p.default) for p in ours.values()] == \
        [(p.name, p.kind, p.default) for p in theirs.values()]
    tools = [WEATHER, SEARCH, BROWSER]
    for choice in CHOICES:
        for options in ({}, {"reasoning": "disabled", "parallel_tool_calls": False},
                        {"reasoning": "auto", "any_order": True, "max_whitespace_cnt": 2, "exclude_special_tokens": False}):
            functions, builtins, simple = xg2.normalize_tool_choice(tools, choice)
            # a per-model function has the model's default reasoning (MiniMax-M3's is "auto")
            expected = xg2.get_model_structural_tag(model, tools, choice, **{"reasoning": ours["reasoning"].default,
                                                                              **options})
            assert fn(functions, builtins, simple, **options, unused=1) == expected, (choice, options)
            plain = [t.model_dump() for t in functions], [t.model_dump() for t in builtins]
            assert fn(*plain, tool_choice=simple, **options) == expected
    assert bst.get_model_structural_tag is xg2.get_model_structural_tag
    assert bst.get_builtin_structural_tag(model, tools) == xg2.get_model_structural_tag(model, tools)


def test_normalize_tool_choice_as_xgrammar():
    """normalize_tool_choice splits the tools left by the tool choice into function and builtin
    tools and simplifies the choice as xgrammar's does; the per-model functions refuse what a
    simplified choice cannot mean."""
    xgrammar = pytest.importorskip("xgrammar")
    tools = [WEATHER, SEARCH, BROWSER]
    for choice in CHOICES:
        ours = xg2.normalize_tool_choice(tools, choice)
        theirs = xgrammar.normalize_tool_choice(tools, choice)
        assert [[t.model_dump() for t in ours[i]] for i in (0, 1)] == \
            [[t.model_dump(exclude_none=True) for t in theirs[i]] for i in (0, 1)], choice
        assert ours[2] == theirs[2], choice
    from xg2.builtin_structural_tag import get_qwen_3_structural_tag
    for kwargs, pointer in [({"tools": [WEATHER, SEARCH], "tool_choice": "forced"}, "/tool_choice"),
                            ({"tool_choice": "required"}, "/tool_choice"),
                            ({"tools": [WEATHER], "tool_choice": "none"}, "/tool_choice"),
                            ({"tools": [WEATHER], "reasoning": "maybe"}, "/reasoning"),
                            ({"builtin_tools": {"a": 1}}, "/builtin_tools")]:
        with pytest.raises(xg2.ModelFormatError) as exc:
            get_qwen_3_structural_tag(**kwargs)
        assert exc.value.pointer == pointer, (kwargs, exc.value)


def test_register_a_format(small_info):
    @xg2.register_model_structural_tag("bracket_calls")
    def bracket_calls(req):
        return {"type": "triggered_tags", "triggers": ["[["], "tags": [
            {"type": "tag", "begin": f"[[{t.name}:", "content": req.arguments(t), "end": "]]"} for t in req.tools]}

    tag = xg2.get_model_structural_tag("bracket_calls", [WEATHER])
    compiled = xg2.GrammarCompiler(small_info).compile_structural_tag(tag)
    for text, ok in [('See [[get_weather:{"city": "Oslo"}]] ok', True), ('[[get_weather:{"town": "Oslo"}]]', False)]:
        m = xg2.GrammarMatcher(compiled)
        assert (m.accept_string(text) and m.is_completed()) == ok


def test_tool_choice_and_reasoning_modes(formats):
    q = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    s = '<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n</tool_call>'
    think = "<think>\nok\n</think>\n\n"
    cases = [  # (options, text, accepted)
        ({}, think + "Hello.", True),
        ({}, "ok\n</think>\n\n" + q, True),                     # the prompt opened the block
        ({}, "Hello.", False),                                 # reasoning enabled: the block is needed
        ({"reasoning": "auto"}, "Hello.", True),
        ({"reasoning": "auto"}, think + q, True),
        # auto: the model chooses to reason, so it opens the block itself (an opening in the prompt
        # would make it "enabled")
        ({"reasoning": "auto"}, "ok\n</think>\n\n" + q, False),
        ({"reasoning": "disabled"}, think + "Hello.", False),
        ({"reasoning": "disabled"}, "Hello. " + q + "\n" + s, True),
        ({"tool_choice": "none"}, think + q, False),
        ({"tool_choice": "none"}, think + "No tools needed.", True),
        ({"tool_choice": "required"}, think + "Let me look. " + q, False),   # no text before the call
        ({"tool_choice": "required"}, think + q + "\n" + s, True),
        ({"tool_choice": "required"}, think + "I cannot.", False),
        ({"parallel_tool_calls": False}, think + q + "\n" + s, False),
        ({"parallel_tool_calls": False}, think + "Checking. " + q, True),
        ({"tool_choice": {"type": "function", "function": {"name": "search"}}}, think + q, False),
        ({"tool_choice": {"type": "function", "function": {"name": "search"}}}, think + s, True),
        ({"tool_choice": {"type": "function", "function": {"name": "search"}}}, think + s + "\n" + s, False),
        ({"tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
            {"type": "function", "function": {"name": "search"}}]}}}, think + q, False),
        ({"tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
            {"type": "function", "function": {"name": "search"}}]}}}, think + s, True),
    ]
    for options, text, ok in cases:
        assert formats.accepts("qwen_3", [WEATHER, SEARCH], text, **options) == ok, (options, text)


def test_minimax_m3_declines_reasoning_with_a_bare_closing_tag():
    """MiniMax-M3's adaptive thinking: a whole block, the closing tag alone, or nothing; never a
    block the model did not open, nor two closings."""
    tag = xg2.get_model_structural_tag("minimax_m3", [SEARCH], reasoning="auto")
    grammar = xg2.Grammar.from_structural_tag(tag)
    for text, ok in [("answer", True), ("</mm:think>answer", True), ("<mm:think>plan</mm:think>answer", True),
                     ("plan</mm:think>answer", False), ("</mm:think></mm:think>answer", False),
                     ("</mm:think><mm:think>plan</mm:think>answer", False)]:
        assert xg2.testing._is_grammar_accept_string(grammar, text) == ok, text
    qwen = xg2.Grammar.from_structural_tag(xg2.get_model_structural_tag("qwen_3", [SEARCH], reasoning="auto"))
    assert not xg2.testing._is_grammar_accept_string(qwen, "</think>answer")    # only where the model does it


def test_exclude_special_tokens_reaches_the_reasoning():
    """The flag governs the reasoning's text as it does the answer's: `<think>` inside the block
    only when special tokens are not excluded."""
    def accepts(flag: bool, text: str) -> bool:
        tag = xg2.get_model_structural_tag("qwen_3", [SEARCH], reasoning="enabled", exclude_special_tokens=flag)
        return xg2.testing._is_grammar_accept_string(xg2.Grammar.from_structural_tag(tag), text)
    nested = "<think>a <think> b</think>answer"
    assert accepts(False, nested) and not accepts(True, nested)
    # the answer may then hold the tags too, but not when they are excluded
    assert accepts(False, "<think>a</think>x</think>") and not accepts(True, "<think>a</think>x</think>")


def test_calls_back_to_back_where_the_parser_finds_them_by_their_tags():
    """Hermes and qwen3_coder parsers find each `<tool_call>` by its tags, so calls without the
    template's newline between them are read too; Llama's parser skips exactly the two characters
    of "; " after each call, so there the separator stays required."""
    def accepts(model: str, text: str, **options) -> bool:
        tag = xg2.get_model_structural_tag(model, [WEATHER, SEARCH], reasoning="disabled", **options)
        return xg2.testing._is_grammar_accept_string(xg2.Grammar.from_structural_tag(tag), text)
    q = '<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n</tool_call>'
    e = '<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>'
    x = "<tool_call>\n<function=search>\n<parameter=q>\nx\n</parameter>\n</function>\n</tool_call>"
    for model, call in (("qwen_3", q), ("exaone", e), ("qwen_3_5", x), ("qwen_3_coder", x)):
        assert accepts(model, call + call) and accepts(model, call + "\n" + call), model
        assert not accepts(model, call + call, parallel_tool_calls=False), model
    llama = '{"name": "search", "parameters": {"q": "x"}}'
    assert accepts("llama", llama + "; " + llama) and not accepts("llama", llama + llama)


def test_harmony_channels_and_builtin_tools(formats):
    tools = [WEATHER, BROWSER]
    analysis = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
    call = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}<|call|>'
    search = '<|channel|>commentary to=browser.search <|constrain|>json<|message|>{"query": "oslo"}<|call|>'
    cases = [
        ({}, analysis + call, True),
        ({}, analysis[:-len("<|start|>assistant")] + "<|start|>assistant to=functions.get_weather<|channel|>commentary json"
         '<|message|>{"city": "Oslo"}<|call|>', True),                              # recipient in the header
        ({}, analysis + "<|channel|>final<|message|>It is sunny.<|return|>", True),
        ({}, analysis + "<|channel|>final<|message|>It is sunny.", False),           # the turn has not ended
        ({}, call, False),                                                           # reasoning enabled
        ({"reasoning": "disabled"}, "<|channel|>final<|message|>Hi!<|return|>", True),
        ({"reasoning": "disabled"}, analysis + "<|channel|>final<|message|>Hi!<|return|>", False),
        ({"reasoning": "auto"}, call, True),
        ({}, analysis + search, True),
        ({"tool_choice": {"type": "web_search_preview"}}, analysis + call, False),
        ({"tool_choice": {"type": "web_search_preview"}}, analysis + search, True),
        ({"tool_choice": "required"}, analysis + "<|channel|>final<|message|>Hi!<|return|>", False),
        ({"tool_choice": "required"}, analysis + "<|channel|>commentary<|message|>Checking now.<|end|><|start|>assistant"
         + call, True),                                                             # a preamble, then the call
        ({"tool_choice": "none"}, analysis + call, False),
        ({}, analysis + call.replace('"Oslo"', "7"), False),
        ({}, analysis + call.replace("get_weather", "get_wether"), False),
        ({}, analysis + call[:-len("<|call|>")] + "<|start|>assistant" + call, False),  # a call ends the turn
    ]
    for options, text, ok in cases:
        assert formats.accepts("harmony", tools, text, **options) == ok, (options, text)


def test_harmony_markers_are_tokens_not_text(formats, harmony_info):
    """The model must emit `<|channel|>` as its special token; the same text in plain tokens is not it."""
    compiled = formats.compiled("harmony", [WEATHER], reasoning="disabled")
    spelled = xg2.GrammarMatcher(compiled)
    assert not spelled.accept_string("<|channel|>final<|message|>Hi")
    assert formats.accepts("harmony", [WEATHER], "<|channel|>final<|message|>Hi<|return|>", reasoning="disabled")
    with pytest.raises(xg2.StructuralTagError, match="no token has the text"):
        xg2.GrammarCompiler(formats.infos["deepseek"]).compile_structural_tag(
            xg2.get_model_structural_tag("harmony", [WEATHER]))


def test_harmony_markers_cannot_be_spelled_by_byte_tokens(formats, harmony_info):
    """Where the format allows `<|channel|>`, the mask allows that special token and no ordinary
    token that would start spelling it: o200k has a token for every byte, and a special token's
    stand-in character inside the grammar must not be writable byte by byte (it was, spelled as a
    surrogate: the byte token 0xED, a valid start of Hangul, then two continuation bytes)."""
    compiled = formats.compiled("harmony", [WEATHER], reasoning="disabled")
    matcher = xg2.GrammarMatcher(compiled)
    bm = xg2.allocate_token_bitmask(1, harmony_info.vocab_size)
    matcher.fill_next_token_bitmask(bm)
    allowed = np.flatnonzero(unpack(bm, harmony_info.vocab_size)).tolist()
    assert harmony_info.find_token("<|channel|>") in allowed
    special = set(harmony_info.special_token_ids)
    for t in allowed:
        text = harmony_info.decoded_vocab[t]
        assert t in special or (text[:1] != b"\xed" and max(text) < 0xF8), text
    lone = next(i for i, b in enumerate(harmony_info.decoded_vocab) if b == b"\xed")
    assert not xg2.GrammarMatcher(compiled).accept_token(lone)


# --- every format on BFCL's parallel calls --------------------------------------------------------

def _broken(model: str, tools: list[dict], calls: list[tuple[str, dict]]) -> list[tuple[str, str, dict]]:
    """Malformed variants of a correct output: (what is wrong, the text, request options)."""
    (name, args), rest = calls[0], calls[1:]
    schema = next(t["function"]["parameters"] for t in tools if t["function"]["name"] == name)
    out = [("wrong tool name", render(model, [(name + "_v2", args), *rest]), {}),
           ("undeclared argument", render(model, [(name, {**args, "zz_unknown": 1}), *rest]), {})]
    required = [k for k in schema.get("required", []) if k in args]
    if required:
        missing = {k: v for k, v in args.items() if k != required[0]}
        out.append(("required argument missing", render(model, [(name, missing), *rest]), {}))
    wrong = next((k for k, v in args.items() if isinstance(v, (int, float)) and not isinstance(v, bool)), None)
    if wrong is not None:
        out.append(("number as an object", render(model, [(name, {**args, wrong: {"v": args[wrong]}}), *rest]), {}))
    good = render(model, calls if model != "harmony" else calls[:1])
    if model != "harmony":
        out.append(("a second call with parallel calls off", good, {"parallel_tool_calls": False}))
        out.append(("no call with tool_choice none", good, {"tool_choice": "none"}))
    opener = {"qwen_3": "<tool_call>\n", "qwen_3_coder": f"<function={name}>\n", "llama": '{"name": ',
              "deepseek_r1": DS["tool sep"], "deepseek_v3_1": DS["tool sep"], "kimi": "<|tool_call_argument_begin|>",
              "harmony": "json<|message|>", "glm_4_7": "<tool_call>", "minimax": f'<invoke name="{name}">',
              "qwen_3_5": f"<function={name}>\n", "deepseek_v3_2": f'invoke name="{name}">', "exaone": "<tool_call>",
              "deepseek_v4": f'invoke name="{name}">', "deepseek_v4_1": f'invoke name="{name}">',
              "minimax_m3": f"{NS}<tool_call>\n", "mimo": "<tool_call>", "cohere": "<cofl:tool_calls>",
              "kimi_k3": "<|open|>tools<|sep|>"}[model]
    cut = good.rindex(opener) + len(opener) if model == "harmony" else good.index(opener) + len(opener)
    out.append(("text inside a call", good[:cut] + "Sure, " + good[cut:], {}))
    out.append(("an unclosed call", good[:-len("<|call|>") - 3] if model == "harmony" else good[:-3], {}))
    return out


@pytest.mark.parametrize("model", MODELS)
def test_bfcl_parallel_calls(formats, model):
    cases = bfcl_parallel_cases()
    assert len(cases) > 50
    rng = random.Random(model)
    for tools, calls in rng.sample(cases, 6):
        calls = calls[:1] if model == "harmony" else calls          # gpt-oss makes one call per turn
        text = render(model, calls)
        assert formats.accepts(model, tools, text), (model, text)
        for what, bad, options in _broken(model, tools, calls):
            assert not formats.accepts(model, tools, bad, **options), (model, what, bad)


@pytest.mark.parametrize("model", MODELS)
def test_masks_equal_the_reference(formats, model):
    """Every token's mask bit against trying it, at each step of a real output with two tools."""
    tools, calls = bfcl_parallel_cases()[3]
    text = render(model, calls[:1], reasoning="Short.")
    vocab = formats.vocab(model)
    info = formats.infos[vocab]
    matcher = xg2.GrammarMatcher(formats.compiled(model, tools))
    bitmask = xg2.allocate_token_bitmask(1, info.vocab_size)
    ids = formats.encode(model, text)
    rng = random.Random(7)
    steps = set(rng.sample(range(len(ids)), min(6, len(ids)))) | {0, len(ids) - 1}
    candidates = range(info.vocab_size)
    for step, t in enumerate(ids):
        if step in steps:
            matcher.fill_next_token_bitmask(bitmask)
            got = unpack(bitmask, info.vocab_size)
            ref = reference_mask(matcher, info, candidates)
            diff = np.nonzero(got != ref)[0]
            assert diff.size == 0, (model, step, [(int(i), info.decoded_vocab[i]) for i in diff[:5]])
        assert matcher.accept_token(t), (model, step)


# --- random walks ---------------------------------------------------------------------------------

def _typed(value: str, schema) -> object:
    """An XML-style argument's text as the model's parser reads it: raw for a string-typed argument,
    else JSON when it parses (the parsers fall back to the text when it does not)."""
    if isinstance(schema, dict) and schema.get("type") == "string":
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def _schema_type(schema) -> str | None:
    return schema.get("type") if isinstance(schema, dict) and isinstance(schema.get("type"), str) else None


def _mimo_value(value: str, schema) -> object:
    """SGLang's MiMo detector: entities decoded, "null" is None, then by the schema's type (strings
    as they are, integers and numbers converted, booleans true/false, anything else JSON)."""
    value = html.unescape(value)
    kind = _schema_type(schema) or "string"
    if value.lower() == "null":
        return None
    if kind == "string":
        return value
    try:
        if kind == "integer":
            return int(value)
        if kind == "number":
            number = float(value)
            return int(number) if number == int(number) else number
        if kind == "boolean":
            return {"true": True, "false": False}.get(value.lower(), value)
        return json.loads(value)
    except ValueError:
        return value


def _m3_element(text: str, at: int, name: str, schema) -> tuple[object, int]:
    """The value of MiniMax-M3's element `name` from `at` (just past its opening tag) to past its
    closing tag, as SGLang's and vLLM's minimax_m3 parsers read it: child elements make an object
    (an array under an array schema, its children <item>), a leaf is coerced by the schema's type."""
    close = f"{NS}</{name}>"
    children, leaf = [], ""
    while True:
        nxt = text.index(NS, at)
        leaf += text[at:nxt]
        if text.startswith(close, nxt):
            at = nxt + len(close)
            break
        head_end = text.index(">", nxt + len(NS))
        child = text[nxt + len(NS) + 1:head_end]
        sub = (schema.get("items") if _schema_type(schema) == "array" else
               schema.get("properties", {}).get(child) if isinstance(schema, dict) else None)
        value, at = _m3_element(text, head_end + 1, child, sub if isinstance(sub, dict) else {})
        children.append((child, value))
    kind = _schema_type(schema)
    if children or (not leaf.strip() and kind in ("array", "object")):
        return ([v for _, v in children] if kind == "array" else dict(children)), at
    for entity, ch in (("&lt;", "<"), ("&gt;", ">"), ("&quot;", '"'), ("&apos;", "'"), ("&amp;", "&")):
        leaf = leaf.replace(entity, ch)      # vLLM's parser decodes these in leaf text
    if kind == "string":
        return leaf, at
    try:
        return json.loads(leaf), at
    except ValueError:
        return leaf, at


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


def _cofl_value(body: str, at: int, schema) -> tuple[str | None, object, int]:
    """One <cofl:value> element from `at` (its opening tag) as the melody cmd5-nested filter reads
    it: (name, value, position past its closing tag); raw text entity-decoded."""
    head_end = body.index(">", at)
    attrs = dict(re.findall(r'(\w+)="([^"]*)"', body[at:head_end]))
    name = html.unescape(attrs["name"]) if "name" in attrs else None
    kind, at = attrs.get("type", "raw"), head_end + 1
    if kind in ("dict", "list"):
        items = []
        while not body.startswith("</cofl:value>", at := _skip_space(body, at)):
            sub = (schema.get("items") if kind == "list" else schema.get("properties", {}).get(
                html.unescape(re.match(r'<cofl:value name="([^"]*)"', body[at:]).group(1)))) if isinstance(schema, dict) else None
            key, value, at = _cofl_value(body, at, sub if isinstance(sub, dict) else {})
            items.append((key, value))
        return name, ([v for _, v in items] if kind == "list" else dict(items)), at + len("</cofl:value>")
    end = body.index("</cofl:value>", at)
    raw = body[at:end]
    return name, (html.unescape(raw) if kind == "raw" else json.loads(raw)), end + len("</cofl:value>")


def read_calls(model: str, text: str, schemas: dict) -> list[tuple[str, dict]]:
    """The closed calls in an output, read as the model's tool-call parser reads them (vLLM's and
    SGLang's: hermes for qwen_3 and exaone, qwen3_coder for qwen_3_5, glm47, minimax_m2,
    deepseekv32 / deepseekv4 / deepseekv41, minimax_m3, mimo, kimik3; Cohere's melody filter)."""
    def props(name):
        return schemas.get(name, {}).get("properties", {}) if isinstance(schemas.get(name), dict) else {}

    calls = []
    if model in ("qwen_3", "exaone"):
        for body in re.findall(r"<tool_call>(.*?)</tool_call>", text, re.DOTALL):
            call = json.loads(body)
            assert set(call) == {"name", "arguments"}, text
            calls.append((call["name"], call["arguments"]))
    elif model == "qwen_3_5":
        for body in re.findall(r"<tool_call>\n<function=(.*?)</function>\n</tool_call>", text, re.DOTALL):
            name, _, params = body.partition(">")
            args = {}
            for key, value in re.findall(r"<parameter=(.*?)>(.*?)</parameter>", params, re.DOTALL):
                args[key] = _typed(value.removeprefix("\n").removesuffix("\n"), props(name).get(key))
            calls.append((name, args))
    elif model == "glm_4_7":
        for body in re.findall(r"<tool_call>(.*?)</tool_call>", text, re.DOTALL):
            name, _, rest = body.partition("<arg_key>")
            pairs = re.findall(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", "<arg_key>" + rest, re.DOTALL)
            name = name.strip()     # vLLM's glm47 parser strips it (the style lets whitespace follow it)
            calls.append((name, {k.strip(): _typed(v, props(name).get(k.strip())) for k, v in pairs}))
    elif model == "minimax" or model in DSML_NAMES:
        tag, invoke, param = ("", "invoke", "parameter") if model == "minimax" else (DSML, *DSML_NAMES[model][1:])
        for name, body in re.findall(rf'<{tag}{invoke} name="([^"]+)">(.*?)</{tag}{invoke}>', text, re.DOTALL):
            args = {}
            for key, kind, value in re.findall(rf'<{tag}{param} name="([^"]+)"(?: string="(true|false)")?>(.*?)'
                                               rf"</{tag}{param}>", body, re.DOTALL):
                if model == "minimax":
                    args[key] = _typed(value.strip(), props(name).get(key))
                else:
                    args[key] = value if kind == "true" else json.loads(value)
            calls.append((name, args))
    elif model == "mimo":
        for body in re.findall(r"<tool_call>(.*?)</tool_call>", text, re.DOTALL):
            name, params = re.search(r"<function=([^>]+)>(.*?)</function>", body, re.DOTALL).groups()
            name = name.strip()
            calls.append((name, {k.strip(): _mimo_value(v, props(name).get(k.strip()))
                                 for k, v in re.findall(r"<parameter=([^>]+)>(.*?)</parameter>", params, re.DOTALL)}))
    elif model == "minimax_m3":
        for block in re.findall(rf"{re.escape(NS)}<tool_call>(.*?){re.escape(NS)}</tool_call>", text, re.DOTALL):
            for name, body in re.findall(rf'{re.escape(NS)}<invoke name="([^"]+)">(.*?){re.escape(NS)}</invoke>',
                                         block, re.DOTALL):
                args, _ = _m3_element(f"{body}{NS}</args>", 0, "args", {**schemas.get(name, {}), "type": "object"})
                calls.append((name, args))
    elif model == "cohere":
        for attrs, body in re.findall(r"<cofl:tool_call ([^>]*)>(.*?)</cofl:tool_call>", text, re.DOTALL):
            name = html.unescape(re.search(r'name="([^"]*)"', attrs).group(1))
            args, at = {}, _skip_space(body, 0)
            while at < len(body):
                key = html.unescape(re.match(r'<cofl:value name="([^"]*)"', body[at:]).group(1))
                key, value, at = _cofl_value(body, at, props(name).get(key, {}))
                args[key] = value
                at = _skip_space(body, at)
            calls.append((name, args))
    elif model == "kimi_k3":
        def attrs(s):
            return {k: v.replace("&quot;", '"').replace("&amp;", "&") for k, v in re.findall(r'(\w+)="([^"]*)"', s)}
        section = text[text.index("<|open|>tools<|sep|>"):] if "<|open|>tools<|sep|>" in text else ""
        for head, body in re.findall(r"<\|open\|>call\s+((?:(?!<\|sep\|>).)*?)<\|sep\|>(.*?)<\|close\|>call<\|sep\|>",
                                     section, re.DOTALL):
            args = {}
            for arg_head, value in re.findall(r"<\|open\|>argument\s+((?:(?!<\|sep\|>).)*?)<\|sep\|>(.*?)"
                                              r"<\|close\|>argument<\|sep\|>", body, re.DOTALL):
                a = attrs(arg_head)
                args[a["key"]] = value if a.get("type", "string") == "string" else _typed(value, None)
            calls.append((attrs(head)["tool"], args))
    else:
        raise AssertionError(model)
    return calls


#: An XML style's (value opening, value closing, call closing) tags: a walk is steered now and then
#: to the closing tag of the value it is in, or else of the call (random tokens seldom spell them,
#: and raw text runs until its closing tag).
CLOSERS = {"qwen_3": None, "exaone": None, "qwen_3_5": ("<parameter=", "</parameter>", "</tool_call>"),
           "glm_4_7": ("<arg_value>", "</arg_value>", "</tool_call>"),
           "minimax": ('<parameter name="', "</parameter>", "</invoke>"),
           "deepseek_v3_2": (f'<{DSML}parameter name="', f"</{DSML}parameter>", f"</{DSML}invoke>"),
           "deepseek_v4": (f'<{DSML}parameter name="', f"</{DSML}parameter>", f"</{DSML}invoke>"),
           "deepseek_v4_1": (f'<{DSML} parameter name="', f"</{DSML} parameter>", f"</{DSML} invoke>"),
           "mimo": ("<parameter=", "</parameter>", "</tool_call>"),
           "kimi_k3": ('<|open|>argument key="', "<|close|>argument<|sep|>", "<|close|>call<|sep|>"),
           "cohere": ('<cofl:value name="', "</cofl:value>", "</cofl:tool_call>"),
           "minimax_m3": (f"{NS}<", f"{NS}</", f"{NS}</invoke>")}
#: What a walk is given before it starts: K3's response channel, closed (text in it runs until its
#: closing marker, which random tokens seldom spell).
PRELUDES = {"kimi_k3": "<|close|>response<|sep|>"}
#: How a value's opening tag ends after the part CLOSERS names, where its first ">" does not end it.
OPENING_ENDS = {"kimi_k3": b"<|sep|>", "minimax_m3": b">"}


@pytest.mark.parametrize("model", list(CLOSERS))
def test_random_walk_calls_parse_and_validate(formats, deepseek_info, model):
    """Seeded walks through allowed tokens with registry tools, one call required: every call that
    closes is read as the model's parser reads it and its arguments validate against the tool's
    schema. Runs of whitespace are capped (max_whitespace_cnt) so that the walks move on."""
    jsonschema = pytest.importorskip("jsonschema")
    registry = [json.loads(line) for line in REGISTRY.open(encoding="utf-8")]
    rng = random.Random(f"walk-{model}")
    vocab = deepseek_info.decoded_vocab
    structural = np.zeros(deepseek_info.vocab_size, dtype=bool)
    structural[[i for i, b in enumerate(vocab) if b and set(b) & set(b'"]},\n<>/') and len(b) <= 3]] = True
    structural[deepseek_info.stop_token_ids] = False
    opening, *closers = [c.encode() for c in CLOSERS[model] or ("", "", "")]
    pieces = {c: [i for i, b in enumerate(vocab) if b and b in c] for c in closers}
    bitmask = xg2.allocate_token_bitmask(1, deepseek_info.vocab_size)
    closed = 0
    for walk in range(8):
        for _ in range(50):     # an XML style writes only object arguments; draw again where a schema is not one
            tools = [{"type": "function", "function": {k: v for k, v in t["function"].items() if k != "description"}}
                     for t in rng.sample(registry, 3)]
            try:
                compiled = formats.compiled(model, tools, reasoning="disabled", tool_choice="required",
                                            parallel_tool_calls=False, max_whitespace_cnt=3)
                break
            except (xg2.SchemaError, xg2.StructuralTagError) as e:
                assert model not in ("qwen_3", "exaone")
                error = e
        else:
            pytest.fail(f"no tool set of the registry compiled: {error}")
        schemas = {t["function"]["name"]: t["function"].get("parameters", {}) for t in tools}
        matcher = xg2.GrammarMatcher(compiled)
        out = PRELUDES.get(model, "").encode()
        assert not out or matcher.accept_string(out.decode())
        for _ in range(600):
            matcher.fill_next_token_bitmask(bitmask)
            mask = unpack(bitmask, deepseek_info.vocab_size)
            mask[deepseek_info.stop_token_ids] = False
            pick = []
            if opening:     # the next piece of a closing tag begun, or now and then its start
                c = closers[0] if out.rfind(opening) > out.rfind(closers[0]) else closers[1]
                k = next(k for k in range(min(len(out), len(c) - 1), -1, -1) if out.endswith(c[:k]))
                start = out.rfind(opening)
                value = b"" if c != closers[0] else out[start:].partition(b">")[2] if model not in OPENING_ENDS \
                    else out[start + len(opening):].partition(OPENING_ENDS[model])[2]
                if (k or rng.random() < 0.2) and value.lstrip()[:1] not in (b"[", b"{", b'"'):   # not in JSON
                    pick = [i for i in pieces[c] if mask[i] and c[k:].startswith(vocab[i])]
            if not len(pick) and rng.random() < 0.6:
                pick = np.nonzero(mask & structural)[0]
            if not len(pick):
                pick = np.nonzero(mask)[0]
            if not len(pick):
                break       # the call is closed: only the end of the turn may follow
            t = int(pick[rng.randrange(len(pick))])
            assert matcher.accept_token(t)
            out += vocab[t]
        text = out.decode("utf-8", "replace")
        reference = read_calls(model, text, schemas)
        for name, args in reference:
            assert name in schemas, text
            jsonschema.validate(args, copy.deepcopy(schemas[name]))
            closed += 1
        # the server's reader, from the format's own definition, reads what the model's parser reads
        read = read_model_output(model, text, tools, "disabled")
        assert [(c.name, c.arguments) for c in read.calls] == reference, text
    assert closed >= 6, f"only {closed} walks closed a call to check"


# --- the independent corpus -----------------------------------------------------------------------

def _corpus() -> list[dict]:
    if not CORPUS.exists():
        return []
    data = json.loads(CORPUS.read_text(encoding="utf-8"))
    return [dict(c, tools=data["tools"]) for c in data["cases"]]


@pytest.mark.parametrize("case", _corpus(), ids=lambda c: f"{c['model']}-{c['id']}")
def test_corpus_written_from_the_chat_templates(formats, case):
    ok = formats.accepts(case["model"], case["tools"], case["text"], **case.get("options", {}))
    assert ok == case["valid"], case["why"]


def test_linked_frames_mask_like_whole_grammars(deepseek_info, deepseek_tokenizer):
    """With the entry pool on, a tag's schemas are modules linked into its frame (lowered once per
    compiler, reused by every later tag); without it the tag is one grammar. Both give the same
    mask at every token, over requests that share tools in new combinations."""
    linked = xg2.GrammarCompiler(deepseek_info)
    whole = xg2.GrammarCompiler(deepseek_info, cross_grammar_cache=False)
    cases = bfcl_parallel_cases()[:6]
    pooled_tools = [t for tools, _calls in cases for t in tools]
    requests = [(tools, calls) for tools, calls in cases]
    requests += [(pooled_tools[i::3] + tools, calls) for i, (tools, calls) in enumerate(cases[:3])]   # reused modules
    a = xg2.allocate_token_bitmask(1, deepseek_info.vocab_size)
    b = xg2.allocate_token_bitmask(1, deepseek_info.vocab_size)
    for model in ("qwen_3", "qwen_3_coder", "deepseek_v3_1", "llama"):     # llama: tokens read past its "}"
        for tools, calls in requests:
            names = set()
            tools = [t for t in tools if not (t["function"]["name"] in names or names.add(t["function"]["name"]))]
            tag = xg2.get_model_structural_tag(model, tools)
            framed = linked.compile_structural_tag(tag)
            assert framed._lowered.fsms is None        # linked from modules, not lowered whole
            m1 = xg2.GrammarMatcher(framed)
            m2 = xg2.GrammarMatcher(whole.compile_structural_tag(tag))
            for t in deepseek_tokenizer.encode(render(model, calls), add_special_tokens=False).ids:
                m1.fill_next_token_bitmask(a)
                m2.fill_next_token_bitmask(b)
                assert np.array_equal(a.numpy(), b.numpy()), (model, t)
                assert m1.accept_token(t) and m2.accept_token(t)
            assert m1.is_completed() and m2.is_completed()
