"""Model tool-call formats: the structural tag under which a model's output follows its own chat
template — an optional reasoning block, free text, and tool calls whose arguments follow each tool's
schema — so that the model's own tool-call parser reads what was generated.

A format is data (design rule): a builder turns a normalised request (`ToolCallRequest`) into a
structural tag. Most models share one shape, free text in which a trigger opens a call, and are
described by a `CallSyntax`; harmony (gpt-oss), whose output is a series of channel messages, has a
builder of its own. `register_model_structural_tag` adds builders; `get_model_structural_tag`
normalises OpenAI-style tools and tool choice and calls one, `build_model_structural_tag` takes
a request normalised already (xgrammar's per-model functions, xg2.builtin_structural_tag).

Each syntax follows the model's chat template and the tool-call parsers that read its output
(vLLM's, SGLang's): where the parsers read more than one spelling that the model writes, each is
accepted (a newline inside EXAONE's tags, whitespace between GLM's key and value, the blank line
DeepSeek-V3.2 writes before its block even when a call must come first, MiMo's calls with or
without newlines between their tags, Cohere's text answer with or without its text markers).

Harmony's markers are special tokens of gpt-oss's vocabulary and are named as tokens
(`{"type": "token", ...}`): its structural tag compiles only for a vocabulary holding them, and the
model must emit each token itself, never its text spelled out. Its stop tokens (`<|call|>`,
`<|return|>`) are left to the serving stack: the output ends where the format can end. The other
formats' markers are text (in DeepSeek's and Qwen's vocabularies they are ordinary added tokens,
which match their text).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import ModelFormatError
from .structural_tag import StructuralTag, parse_structural_tag

Reasoning = Literal["enabled", "disabled", "auto"]
Mode = Literal["none", "auto", "required", "forced"]


@dataclass(frozen=True)
class Tool:
    """A tool the model may call: `name` as it appears in the output, `parameters` the JSON Schema
    of its arguments (True: any JSON), `builtin` the provider's tool type for a builtin tool."""

    name: str
    parameters: Any = True
    builtin: str | None = None


@dataclass(frozen=True)
class ToolCallRequest:
    """What a format builder is given: the tools left after the tool choice, whether the model
    must call one (`required`; `forced`: exactly one call of the single tool), the reasoning mode,
    and the options for every argument schema."""

    tools: tuple[Tool, ...]
    mode: Mode
    reasoning: Reasoning
    parallel_tool_calls: bool = True
    any_order: bool = False
    max_whitespace_cnt: int | None = None
    exclude_special_tokens: bool = True
    any_whitespace: bool = True

    def arguments(self, tool: Tool, style: str = "json") -> dict:
        fmt: dict[str, Any] = {"type": "json_schema", "json_schema": tool.parameters, "style": style}
        if self.any_order:
            fmt["any_order"] = True
        if not self.any_whitespace:
            fmt["any_whitespace"] = False
        if self.max_whitespace_cnt is not None:
            fmt["max_whitespace_cnt"] = self.max_whitespace_cnt
        return fmt


Builder = Callable[[ToolCallRequest], dict]
_REGISTRY: dict[str, Builder] = {}


def register_model_structural_tag(name: str) -> Callable[[Builder], Builder]:
    """Register a builder (a function of a `ToolCallRequest` returning a structural tag's format,
    as a dict) under `name`, for `get_model_structural_tag(name, ...)`."""
    if not isinstance(name, str) or not name:
        raise ModelFormatError("a model format name must be a non-empty string", "/model")

    def register(fn: Builder) -> Builder:
        _REGISTRY[name] = fn
        SYNTAXES.pop(name, None)        # a builder of its own: read by the reader registered with it
        return fn
    return register


def model_formats() -> list[str]:
    """The registered model format names."""
    return sorted(_REGISTRY)


def get_model_structural_tag(model: str, tools: list | None = None, tool_choice: Any = "auto",
                             reasoning: bool | Reasoning = "enabled", force_reasoning: bool = False,
                             any_order: bool = False, exclude_special_tokens: bool = True,
                             max_whitespace_cnt: int | None = None, parallel_tool_calls: bool = True, *,
                             any_whitespace: bool = True) -> StructuralTag:
    """The structural tag of a model's output format for an OpenAI-style request.

    `tools`: function tools ``{"type": "function", "function": {"name", "parameters", ...}}`` and
    builtin tools ``{"type": <builtin type>, "name"?: ..., "parameters"?: ...}``. `tool_choice`:
    ``"none"``, ``"auto"``, ``"required"``, a named function ``{"type": "function", "function":
    {"name": ...}}``, a builtin tool by type ``{"type": <builtin type>}``, or ``{"type":
    "allowed_tools", "allowed_tools": {"mode": "auto" | "required", "tools": [...]}}``.
    `reasoning`: ``"enabled"`` (the output opens with a reasoning block; its opening tag may
    already be in the prompt), ``"auto"`` (a block or none) or ``"disabled"`` (none; booleans are
    read as enabled/disabled); models without reasoning ignore it. `parallel_tool_calls=False`
    allows one call at most. The parameters are xgrammar's, in its order; `force_reasoning`
    (deprecated there, its behaviour now part of each model's format) is accepted and changes
    nothing. `any_whitespace=False` (xg2's) allows no whitespace between the JSON tokens of the
    arguments. Invalid requests raise ModelFormatError with the pointer of the bad argument."""
    del force_reasoning
    builder = _builder(model)
    mode, chosen = _choice(tool_choice, _tools(tools))
    return _build(builder, chosen, mode, reasoning, any_order, exclude_special_tokens, max_whitespace_cnt,
                  parallel_tool_calls, any_whitespace)


def build_model_structural_tag(model: str, tools: list | None = None, builtin_tools: list | None = None,
                               tool_choice: str = "auto", reasoning: bool | Reasoning = "enabled",
                               any_order: bool = False, exclude_special_tokens: bool = True,
                               max_whitespace_cnt: int | None = None,
                               parallel_tool_calls: bool = True) -> StructuralTag:
    """A model's structural tag from an already normalised request, as xgrammar's per-model
    functions take it (xg2.builtin_structural_tag): the function tools and the builtin tools the
    model may call, and the simplified tool choice ``"auto"`` (text or calls; text only without
    tools), ``"required"`` (at least one call) or ``"forced"`` (exactly one call of the one tool)."""
    builder = _builder(model)
    chosen = _tools([*(_listed(tools, "/tools")), *(_listed(builtin_tools, "/builtin_tools"))])
    if tool_choice == "auto":
        mode: Mode = "auto" if chosen else "none"
    elif tool_choice == "required":
        if not chosen:
            raise ModelFormatError("tool_choice 'required' with no tools", "/tool_choice")
        mode = "required"
    elif tool_choice == "forced":
        if len(chosen) != 1:
            raise ModelFormatError(f"tool_choice 'forced' needs exactly one tool, got {len(chosen)}", "/tool_choice")
        mode = "forced"
    else:
        raise ModelFormatError(f"tool_choice must be 'auto', 'required' or 'forced', got {tool_choice!r}",
                               "/tool_choice")
    return _build(builder, chosen, mode, reasoning, any_order, exclude_special_tokens, max_whitespace_cnt,
                  parallel_tool_calls)


def _builder(model: str) -> Builder:
    builder = _REGISTRY.get(model)
    if builder is None:
        raise ModelFormatError(f"Unknown format type {model!r}; registered: {', '.join(model_formats())}", "/model")
    return builder


def _listed(tools: Any, at: str) -> list:
    if tools is None:
        return []
    if not isinstance(tools, (list, tuple)):
        raise ModelFormatError(f"{at[1:]} must be a list", at)
    return list(tools)


def _build(builder: Builder, tools: tuple[Tool, ...], mode: Mode, reasoning: Any, any_order: bool,
           exclude_special_tokens: bool, max_whitespace_cnt: int | None, parallel_tool_calls: bool,
           any_whitespace: bool = True) -> StructuralTag:
    if isinstance(reasoning, bool):
        reasoning = "enabled" if reasoning else "disabled"
    if reasoning not in ("enabled", "disabled", "auto"):
        raise ModelFormatError(f"reasoning must be 'enabled', 'disabled' or 'auto', got {reasoning!r}", "/reasoning")
    if max_whitespace_cnt is not None and (not isinstance(max_whitespace_cnt, int) or max_whitespace_cnt < 1):
        raise ModelFormatError("max_whitespace_cnt must be a positive integer", "/max_whitespace_cnt")
    for name, value in (("parallel_tool_calls", parallel_tool_calls), ("any_order", any_order),
                        ("exclude_special_tokens", exclude_special_tokens), ("any_whitespace", any_whitespace)):
        if not isinstance(value, bool):     # bool("no") would loosen the format the caller asked for
            raise ModelFormatError(f"{name} must be a boolean, got {value!r}", "/" + name)
    request = ToolCallRequest(tools, mode, reasoning, bool(parallel_tool_calls), bool(any_order),
                              max_whitespace_cnt, bool(exclude_special_tokens), bool(any_whitespace))
    return parse_structural_tag({"type": "structural_tag", "format": builder(request)})


def normalized_tool_choice(tools: Any, tool_choice: Any) -> tuple[list, str]:
    """The tools a request leaves the model (as given, each a plain dict) and its simplified tool
    choice (``"auto"``, ``"required"`` or ``"forced"``): the model-independent part of
    get_model_structural_tag; ``"none"`` leaves no tools and ``"auto"``."""
    given = [_plain(t) for t in _listed(tools, "/tools")]
    read = _tools(given)
    mode, chosen = _choice(tool_choice, read)
    kept = [given[i] for i, t in enumerate(read) if t in chosen and mode != "none"]
    return kept, ("auto" if mode == "none" else mode)


def _tools(tools: Any) -> tuple[Tool, ...]:
    if tools is None:
        return ()
    if not isinstance(tools, (list, tuple)):
        raise ModelFormatError("tools must be a list", "/tools")
    out: list[Tool] = []
    for i, t in enumerate(tools):
        t = _plain(t)
        at = f"/tools/{i}"
        if isinstance(t, dict) and "type" not in t and "function" in t:
            t = {**t, "type": "function"}       # as xgrammar reads it: the 'function' says what it is
        if not isinstance(t, dict) or not isinstance(t.get("type"), str):
            raise ModelFormatError("a tool is an object with a 'type' (or a 'function')", at)
        if t["type"] == "function":
            fn = t.get("function")
            if not isinstance(fn, dict):
                raise ModelFormatError("a function tool needs a 'function' object", at + "/function")
            name, params, where, what = fn.get("name"), fn.get("parameters"), at + "/function", "function."
            if fn.get("strict") is False:
                params = None       # OpenAI's non-strict function: its arguments are any JSON object
            builtin = None
        else:
            name, params, where, builtin = t.get("name", t["type"]), t.get("parameters"), at, t["type"]
            what = ""
        if not isinstance(name, str) or not name:
            raise ModelFormatError(f"a tool's {what}name must be a non-empty string", where + "/name")
        if params is None:
            params = True
        elif not isinstance(params, (dict, bool)):
            raise ModelFormatError(f"a tool's {what}parameters must be a JSON Schema (an object or a boolean)",
                                   where + "/parameters")
        if any(x.name == name for x in out):
            raise ModelFormatError(f"two tools are named {name!r}", where + "/name")
        out.append(Tool(name, params, builtin))
    return tuple(out)


def _choice(choice: Any, tools: tuple[Tool, ...]) -> tuple[Mode, tuple[Tool, ...]]:
    """(mode, the tools the model may call)."""
    choice = _plain(choice)
    if choice is None:
        choice = "auto"
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise ModelFormatError(f"tool_choice must be 'none', 'auto', 'required' or an object, got {choice!r}",
                                   "/tool_choice")
        if choice == "required" and not tools:
            raise ModelFormatError("tool_choice 'required' with no tools", "/tool_choice")
        return ("none" if choice == "none" or not tools else choice), tools
    if not isinstance(choice, dict) or not isinstance(choice.get("type"), str):
        raise ModelFormatError("tool_choice must be a string or an object with a 'type'", "/tool_choice")
    if choice["type"] == "allowed_tools":
        spec = choice.get("allowed_tools", choice)
        mode, refs = spec.get("mode", "auto"), spec.get("tools")
        if mode not in ("auto", "required"):
            raise ModelFormatError("allowed_tools mode must be 'auto' or 'required'", "/tool_choice/allowed_tools/mode")
        if not isinstance(refs, list):
            raise ModelFormatError("allowed_tools needs a list of tools", "/tool_choice/allowed_tools/tools")
        kept = [_find(r, tools, f"/tool_choice/allowed_tools/tools/{i}") for i, r in enumerate(refs)]
        allowed = tuple(t for t in tools if t in kept)
        if not allowed:
            return "none", ()
        return mode, allowed
    return "forced", (_find(choice, tools, "/tool_choice"),)


def _find(ref: Any, tools: tuple[Tool, ...], at: str) -> Tool:
    """The tool a reference names: a function by name, a builtin tool by type (or name)."""
    ref = _plain(ref)
    if not isinstance(ref, dict) or not isinstance(ref.get("type"), str):
        raise ModelFormatError("a tool reference is an object with a 'type'", at)
    if ref["type"] == "function":
        name = ref["function"].get("name") if isinstance(ref.get("function"), dict) else ref.get("name")
        found = [t for t in tools if t.builtin is None and t.name == name]
    else:
        name = ref.get("name", ref["type"])
        found = [t for t in tools if t.builtin == ref["type"] and (t.name == name or "name" not in ref)]
    if len(found) == 1:
        return found[0]
    allowed = "/allowed_tools/" in at       # a reference in the allowed tools, not the choice itself
    if ref["type"] == "function":
        raise ModelFormatError(f"{'Allowed' if allowed else 'tool_choice:'} function {name!r} is not among the tools",
                               at)
    named = f"of type {ref['type']!r}" + (f" named {name!r}" if "name" in ref else "")
    what = "Allowed builtin tools must each name" if allowed else "tool_choice must name"
    raise ModelFormatError(f"{what} exactly one tool, but {len(found)} of the tools are builtin tools {named}"
                           + ("; give its name" if found else ""), at)


def _plain(x: Any) -> Any:
    """A tool or tool choice as plain JSON data: pydantic models and xg2.openai_tool_call_schema's
    structs alike have model_dump."""
    return x.model_dump(exclude_none=True) if hasattr(x, "model_dump") else x


# --- shared shape: free text in which a trigger opens a tool call -------------------------------

def _token(text: str) -> dict:
    return {"type": "token", "token": text}


def _const(text: str) -> dict:
    return {"type": "const_string", "value": text}


def _regex(pattern: str) -> dict:
    return {"type": "regex", "pattern": pattern}


#: A call's index where a format numbers its calls: nine digits at most, so that a model cannot
#: run on in digits (unbounded, a degenerate model filled max_tokens with them).
_INDEX = "[0-9]{1,9}"


@dataclass(frozen=True)
class CallSyntax:
    """How a model writes its reasoning and tool calls.

    A call is `begin`, the formats of `before_arguments`, the arguments in `style`, the formats of
    `after_arguments`, then `end` (`{name}` in `begin` and in constant strings is the tool's name);
    the calls of a turn are joined by `separator`.
    `section`: the (opening, closing) markers around all calls of a turn. `trigger` opens the
    calls in free text: a prefix of every `begin`, or of the section's opening (default: all of
    it), and free text never holds it where no call may follow (tool choice none). `think`: the
    reasoning block's opening and closing tags (None: the model does not reason). `markers`:
    strings free text never holds (with exclude_special_tokens). `lead`: a pattern for what the
    template writes before the calls even without text (a required or forced call may follow it).
    `text`: the (opening, closing) markers the template writes around a text answer, which the
    parser also reads bare; calls may follow the closing one. `escapes`: how the tool's name is
    spelled where `{name}` stands (an attribute value's entities). `declines_bare`: with reasoning
    "auto", the model may skip reasoning by writing the closing tag alone. `loose_separator`: the
    parser finds each call by its tags, so calls may also follow one another without `separator`."""

    begin: str
    end: str
    trigger: str = ""
    style: str = "json"
    before_arguments: tuple[dict, ...] = ()
    after_arguments: tuple[dict, ...] = ()
    section: tuple[str, str] | None = None
    separator: str = ""
    think: tuple[str, str] | None = ("<think>", "</think>")
    markers: tuple[str, ...] = ()
    lead: str = ""
    text: tuple[str, str] | None = None
    escapes: tuple[tuple[str, str], ...] = ()
    declines_bare: bool = False
    loose_separator: bool = False

    @property
    def opener(self) -> str:
        return self.trigger or (self.section[0] if self.section else "")

    def call(self, tool: Tool, req: ToolCallRequest) -> dict:
        name = tool.name
        for ch, entity in self.escapes:
            name = name.replace(ch, entity)
        named = [{**f, "value": f["value"].replace("{name}", name)} if f["type"] == "const_string" else f
                 for f in (*self.before_arguments, *self.after_arguments)]
        before = len(self.before_arguments)
        content = [*named[:before], req.arguments(tool, self.style), *named[before:]]
        return {"type": "tag", "begin": self.begin.replace("{name}", name),
                "content": content[0] if len(content) == 1 else {"type": "sequence", "elements": content},
                "end": self.end}

    def build(self, req: ToolCallRequest) -> dict:
        excludes = [m for m in (*(self.think or ()), *self.markers) if req.exclude_special_tokens]
        parts = []
        if self.think is not None and req.reasoning != "disabled":
            opening, closing = self.think
            # enabled: the template may have opened the block in the prompt; auto: the model
            # chooses, so the block it writes opens with its own tag (or, where the model declines
            # that way, is the closing tag alone)
            first = _const(opening) if req.reasoning == "auto" else {"type": "optional", "content": _const(opening)}
            block = {"type": "sequence", "elements": [
                first,
                # the text ends at the first closing tag anyway; the opening one is a special token
                # like the others, kept out only with exclude_special_tokens
                {"type": "tag", "begin": "", "content": {"type": "any_text", "excludes": [opening, closing] if
                                                          req.exclude_special_tokens else []}, "end": closing},
                {"type": "regex", "pattern": r"\s*"}]}
            if req.reasoning == "auto":
                if self.declines_bare:
                    block = {"type": "or", "elements": [
                        block, {"type": "sequence", "elements": [_const(closing), {"type": "regex", "pattern": r"\s*"}]}]}
                block = {"type": "optional", "content": block}
            parts.append(block)
        if req.mode == "none":      # no call, nor the start of one
            text = {"type": "any_text", "excludes": [*excludes, self.opener]}
            parts.append({"type": "or", "elements": [text, self.wrapped(excludes)]} if self.text else text)
        else:
            parts.append(self.calls(req, excludes))
        return parts[0] if len(parts) == 1 else {"type": "sequence", "elements": parts}

    def calls(self, req: ToolCallRequest, excludes: list[str]) -> dict:
        """Free text, then the calls and nothing after them (the turn ends): at least one with
        `required` (no text before it), exactly one when forced, one at most without parallel
        calls; calls are joined by `separator`, inside a section when the model has one."""
        one_only = req.mode == "forced" or not req.parallel_tool_calls
        tags = [self.call(t, req) for t in req.tools]
        if self.section is not None:
            opening, closing = self.section
            inner = {"type": "tags_with_separator", "tags": tags, "separator": self.separator,
                     "at_least_one": True, "stop_after_first": one_only}
            tags = [{"type": "tag", "begin": opening, "content": inner, "end": closing}]
            one_only = True
        trigger = self.opener
        if req.mode == "forced":
            return self.led(tags[0])
        first = {"type": "triggered_tags", "triggers": [trigger], "tags": tags, "excludes": excludes,
                 "at_least_one": req.mode == "required", "stop_after_first": True}
        if req.mode == "required":
            first = self.led(first)
        any_call = tags[0] if len(tags) == 1 else {"type": "or", "elements": tags}
        separator = _const(self.separator)
        if self.loose_separator:
            separator = {"type": "optional", "content": separator}
        more = {"type": "star", "content": {"type": "sequence", "elements": [separator, any_call]}}
        if not one_only:
            first = {"type": "sequence", "elements": [first, more]}
        if self.text and req.mode == "auto":    # or a text answer in its markers, then the calls if any
            calls = any_call if one_only else {"type": "sequence", "elements": [any_call, more]}
            after = {"type": "optional", "content": calls}
            first = {"type": "or", "elements": [first, {"type": "sequence", "elements": [self.wrapped(excludes), after]}]}
        return first

    def led(self, calls: dict) -> dict:
        return {"type": "sequence", "elements": [_regex(self.lead), calls]} if self.lead else calls

    def wrapped(self, excludes: list[str]) -> dict:
        """A text answer between the `text` markers; it never holds the start of the calls."""
        assert self.text is not None
        opening, closing = self.text
        inside = [e for e in (*excludes, self.opener) if e != closing]
        return {"type": "tag", "begin": opening, "content": {"type": "any_text", "excludes": inside}, "end": closing}


#: The formats defined by a CallSyntax: model_output.py reads their output from the same definition.
SYNTAXES: dict[str, CallSyntax] = {}


def _register_syntax(name: str, syntax: CallSyntax) -> None:
    register_model_structural_tag(name)(syntax.build)
    SYNTAXES[name] = syntax


#: Llama 3.1–3.3 JSON tool calling: `{"name": ..., "parameters": {...}}` (no reasoning).
_register_syntax("llama", CallSyntax(begin='{"name": "{name}", "parameters": ', end="}", trigger='{"name": ',
                                     separator="; ", think=None))
#: Qwen 3 (and QwQ / Qwen 2.5 style Hermes calls): `<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`,
#: calls on separate lines or back to back (vLLM's hermes parser finds each by its tags).
_register_syntax("qwen_3", CallSyntax(begin='<tool_call>\n{"name": "{name}", "arguments": ', end="}\n</tool_call>",
                                      trigger="<tool_call>", separator="\n", markers=("</tool_call>",),
                                      loose_separator=True))
#: Qwen3-Coder and Qwen 3.5 (one template and parser, qwen3_coder): XML parameters, `<function=name>`
#: then `<parameter=p>\nvalue\n</parameter>`; Qwen 3.5 reasons (`<think>\n` in the prompt). Calls on
#: separate lines or back to back, as the parser finds each by its tags.
_QWEN_XML = CallSyntax(begin="<tool_call>\n<function={name}>\n", end="</function>\n</tool_call>", trigger="<tool_call>",
                       style="qwen_xml", separator="\n", markers=("</tool_call>", "<function=", "</function>"),
                       loose_separator=True)
_register_syntax("qwen_3_coder", _QWEN_XML)
_register_syntax("qwen_3_5", _QWEN_XML)
_DS_MARKERS = ("<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>", "<｜tool▁sep｜>")
#: DeepSeek-R1: calls in a section, each `function<｜tool▁sep｜>name` and a fenced JSON block.
_register_syntax("deepseek_r1", CallSyntax(
    begin="<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n", end="\n```<｜tool▁call▁end｜>",
    section=("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"), separator="\n", markers=_DS_MARKERS))
#: DeepSeek-V3.1: calls in a section, each `name<｜tool▁sep｜>{JSON}`.
_register_syntax("deepseek_v3_1", CallSyntax(
    begin="<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>", end="<｜tool▁call▁end｜>",
    section=("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"), markers=_DS_MARKERS))
_KIMI = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
         "<|tool_call_argument_begin|>", "<|tool_call_end|>")
#: Kimi K2: calls in a section, each `functions.name:index<|tool_call_argument_begin|>{JSON}`.
_register_syntax("kimi", CallSyntax(
    begin="<|tool_call_begin|>functions.{name}:", end="<|tool_call_end|>",
    before_arguments=(_regex(_INDEX), _const("<|tool_call_argument_begin|>")),
    section=("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"), markers=_KIMI[1:]))
#: GLM-4.7 (and GLM-5): `<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value>...</tool_call>`,
#: calls back to back, strings raw and other values JSON; the reasoning `<think>...</think>` opens
#: in the prompt (`</think>` alone there when thinking is off).
_register_syntax("glm_4_7", CallSyntax(begin="<tool_call>{name}", end="</tool_call>", trigger="<tool_call>",
                                       style="glm_xml", markers=("</tool_call>", "<arg_key>", "</arg_key>",
                                                                 "<arg_value>", "</arg_value>")))
#: MiniMax-M2 (M2.1, M2.5): one `<minimax:tool_call>` block, an `<invoke name="...">` per call,
#: `<parameter name="k">v</parameter>` lines; the reasoning block's `<think>\n` is in the prompt.
_register_syntax("minimax", CallSyntax(begin='<invoke name="{name}">', end="</invoke>", trigger="<minimax:tool_call>",
                                       style="minimax_xml", section=("<minimax:tool_call>\n", "\n</minimax:tool_call>"),
                                       separator="\n", markers=("</minimax:tool_call>",), lead=r"\n?"))
_DSML = "\uff5cDSML\uff5c"


def _dsml(block: str, invoke: str, style: str) -> CallSyntax:
    """DeepSeek's DSML calls (V3.2's shape) under a block name and an invoke tag name."""
    return CallSyntax(begin=f'<{_DSML}{invoke} name="{{name}}">', end=f"</{_DSML}{invoke}>", trigger=f"<{_DSML}{block}>",
                      style=style, section=(f"<{_DSML}{block}>\n", f"\n</{_DSML}{block}>"), separator="\n",
                      markers=(f"</{_DSML}{block}>", f"<{_DSML}{invoke}", f"</{_DSML}{invoke}>"), lead=r"(\n\n)?")


#: DeepSeek-V3.2 DSML: one `<｜DSML｜function_calls>` block, an `<｜DSML｜invoke name="...">` per call,
#: parameters with string="true" (raw text) or "false" (JSON); `<think>` (or `</think>`) ends the prompt.
_register_syntax("deepseek_v3_2", _dsml("function_calls", "invoke", "deepseek_xml"))
#: EXAONE 4.0: Hermes-style JSON, `<tool_call>{"name": ..., "arguments": ...}</tool_call>` as its template
#: writes it (no newlines), or with a newline inside each tag as Qwen's layout has it (vLLM's hermes
#: parser, the one EXAONE names, reads both); calls on separate lines or back to back; `<think>\n` ends the prompt
#: when it reasons.
_register_syntax("exaone", CallSyntax(
    begin="<tool_call>", end="</tool_call>", trigger="<tool_call>",
    before_arguments=(_regex(r"\n?"), _const('{"name": "{name}", "arguments": ')),
    after_arguments=(_const("}"), _regex(r"\n?")), separator="\n", markers=("</tool_call>",), loose_separator=True))
#: DeepSeek-V4: V3.2's DSML under a `tool_calls` block; the prompt ends with `<think>` or `</think>`.
_register_syntax("deepseek_v4", _dsml("tool_calls", "invoke", "deepseek_xml"))
#: DeepSeek-V4.1: every DSML tag name after a space (`<｜DSML｜ calls>`, `<｜DSML｜ invoke ...>`, ...).
_register_syntax("deepseek_v4_1", _dsml(" calls", " invoke", "deepseek_v4_1_xml"))
_NS = "]<]minimax[>["
#: MiniMax-M3: one `<tool_call>` block of `<invoke name="...">` elements, one per line, every tag
#: behind the namespace marker, arguments as nested elements; reasoning in `<mm:think>`, whose
#: opening the prompt holds when thinking is on (a bare `</mm:think>` when the model declines).
_register_syntax("minimax_m3", CallSyntax(
    begin=f'{_NS}<invoke name="{{name}}">', end=f"{_NS}</invoke>", trigger=f"{_NS}<tool_call>", style="minimax_m3_xml",
    section=(f"{_NS}<tool_call>\n", f"\n{_NS}</tool_call>"), separator="\n", think=("<mm:think>", "</mm:think>"),
    markers=(f"{_NS}</tool_call>", f"{_NS}<invoke", f"{_NS}</invoke>"), declines_bare=True))
#: MiMo-V2 (Flash, V2.5, V2.6): `<tool_call><function=name><parameter=k>v</parameter></function></tool_call>`,
#: values never padded (the parser keeps them as they are), strings raw and others JSON; V2/V2.5
#: write a newline after each tag but the parameter's opening, V2.6 none; calls back to back.
_register_syntax("mimo", CallSyntax(
    begin="<tool_call>", end="</tool_call>", trigger="<tool_call>", style="mimo_xml",
    before_arguments=(_regex(r"\n?"), _const("<function={name}>")), after_arguments=(_const("</function>"), _regex(r"\n?")),
    markers=("</tool_call>", "<function=", "</function>")))
_ATTR_ESCAPES = (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ('"', "&quot;"))
#: Cohere Command (cmd5, nested XML): `<cofl:tool_calls>` then `<cofl:tool_call id="n" name="...">`
#: per call, every argument a typed `<cofl:value>` element; no text in a turn that calls; a text
#: answer between `<|START_TEXT|>` and `<|END_TEXT|>` (read bare too); the prompt ends with
#: `<|START_THINKING|>` (or the empty block when reasoning is off).
_register_syntax("cohere", CallSyntax(
    begin='<cofl:tool_call id="', end="</cofl:tool_call>", trigger="<cofl:tool_calls>", style="cohere_xml",
    before_arguments=(_regex(_INDEX), _const('" name="{name}">')), section=("<cofl:tool_calls>", "</cofl:tool_calls>"),
    think=("<|START_THINKING|>", "<|END_THINKING|>"), text=("<|START_TEXT|>", "<|END_TEXT|>"), escapes=_ATTR_ESCAPES,
    markers=("</cofl:tool_calls>", "<cofl:tool_call ", "</cofl:tool_call>", "<|START_TEXT|>", "<|END_TEXT|>")))


# --- Kimi K3: channels -----------------------------------------------------------------------------

def _k3_open(channel: str) -> str:
    return f"<|open|>{channel}<|sep|>"


def _k3_close(channel: str) -> str:
    return f"<|close|>{channel}<|sep|>"


@register_model_structural_tag("kimi_k3")
def kimi_k3(req: ToolCallRequest) -> dict:
    """Kimi K3's message after the prompt's channel opening (`think` with reasoning, else
    `response`): the reasoning channel (per `reasoning`), the response channel (text, written even
    when empty), the `tools` channel with the calls (`<|open|>call tool="name" index="1"<|sep|>`,
    one `<|open|>argument key="k" type="t"<|sep|>` element per argument), and the message's closing
    `<|close|>message<|sep|>`. The text of a channel never holds the tools channel's opening; with
    exclude_special_tokens no `<|open|>` and no other channel's closing either, and no argument
    value holds a marker (`<|open|>`, `<|close|>`, `<|sep|>`)."""
    closings = [_k3_close(c) for c in ("think", "response", "tools", "call", "argument", "message")]

    def channel(name: str) -> dict:
        end = _k3_close(name)
        excludes = ["<|open|>", *(c for c in closings if c != end)] if req.exclude_special_tokens else [_k3_open("tools")]
        return {"type": "tag", "begin": "", "content": {"type": "any_text", "excludes": excludes}, "end": end}

    response = {"type": "optional", "content": _const(_k3_open("response"))}       # the prompt may hold it
    thinking = {"type": "sequence", "elements": [{"type": "optional", "content": _const(_k3_open("think"))},
                                                  channel("think"), _const(_k3_open("response"))]}
    start = {"enabled": thinking, "disabled": response}.get(req.reasoning, {"type": "or", "elements": [thinking, response]})
    elements = [start, channel("response")]
    if req.mode != "none":
        calls = []
        for tool in req.tools:
            name = tool.name.replace("&", "&amp;").replace('"', "&quot;")
            arguments = req.arguments(tool, "kimi_k3_xml")
            if req.exclude_special_tokens:      # a raw value runs to its closing marker: no marker inside
                arguments["excludes"] = ["<|open|>", "<|close|>", "<|sep|>"]
            calls.append({"type": "tag", "begin": f'<|open|>call tool="{name}" index="', "content": {
                "type": "sequence", "elements": [_regex("[1-9][0-9]{0,8}"), _const('"<|sep|>'), arguments]},
                "end": _k3_close("call")})
        one_only = req.mode == "forced" or not req.parallel_tool_calls
        inner = calls[0] if req.mode == "forced" else {"type": "tags_with_separator", "tags": calls, "separator": "",
                                                       "at_least_one": True, "stop_after_first": one_only}
        section = {"type": "tag", "begin": _k3_open("tools"), "content": inner, "end": _k3_close("tools")}
        elements.append(section if req.mode in ("required", "forced") else {"type": "optional", "content": section})
    elements.append(_const(_k3_close("message")))
    return {"type": "sequence", "elements": elements}


# --- harmony (gpt-oss): channel messages ---------------------------------------------------------

@register_model_structural_tag("harmony")
def harmony(req: ToolCallRequest) -> dict:
    """The messages after the prompt's `<|start|>assistant`: a reasoning message on the analysis
    channel (per `reasoning`), then the final answer, or a call: the recipient
    (`functions.<name>`, or a builtin tool's name) in the header or after the commentary channel,
    an optional `<|constrain|>json`, the JSON arguments. The answer and the call run to the end of
    the output (`<|return|>` and `<|call|>` are stop tokens); other messages end with `<|end|>`."""
    start, channel, message, end = (_token(t) for t in ("<|start|>", "<|channel|>", "<|message|>", "<|end|>"))
    message_text = {"type": "tag", "begin": message, "content": {"type": "any_text"}, "end": end}
    elements: list[dict] = []
    if req.reasoning != "disabled":
        analysis = {"type": "sequence", "elements": [channel, _const("analysis"), message_text, start, _const("assistant")]}
        elements.append(analysis if req.reasoning == "enabled" else {"type": "optional", "content": analysis})
    answer = {"type": "sequence", "elements": [channel, _const("final"), message, {"type": "any_text"}]}
    calls = []
    for tool in req.tools:
        recipient = tool.name if tool.builtin else f"functions.{tool.name}"
        constrain = {"type": "optional", "content": {"type": "sequence", "elements": [
            _const(" "), {"type": "optional", "content": _token("<|constrain|>")}, _const("json")]}}
        body = [constrain, message, req.arguments(tool)]
        # the recipient after the channel, or before it: each a tag that begins with it (no end
        # string: the call's stop token is the serving stack's)
        calls.append({"type": "or", "elements": [
            {"type": "sequence", "elements": [channel, {"type": "tag", "begin": f"commentary to={recipient}",
                                                        "content": {"type": "sequence", "elements": body}, "end": ""}]},
            {"type": "tag", "begin": f" to={recipient}", "content": {"type": "sequence", "elements": [
                channel, _const("commentary"), *body]}, "end": ""}]})
    if req.mode == "none":
        last = [answer]
    elif req.mode == "auto":
        last = [answer, *calls]
    else:
        last = calls
    if req.tools and req.mode != "none":
        # preambles to the user on the commentary channel may come before a call
        preamble = {"type": "sequence", "elements": [channel, _const("commentary"), message_text, start,
                                                     _const("assistant")]}
        elements.append({"type": "star", "content": preamble})
    elements.append(last[0] if len(last) == 1 else {"type": "or", "elements": last})
    return elements[0] if len(elements) == 1 else {"type": "sequence", "elements": elements}
