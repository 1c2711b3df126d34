"""Reading a model's output back: its reasoning, its text and its tool calls, in the format whose
structural tag constrained it (model_formats.py).

A server that constrains a model to a format must read that format back, or the calls it forced
come out as plain text. The reader of a format is derived from the same definition as its grammar:
a `CallSyntax` (markers, call layout, argument style) is both built into a structural tag and read
here, and the XML argument styles are read from the `XMLStyle` data the JSON Schema front-end
writes them from. The two formats with builders of their own (Kimi K3's channels, harmony) have
readers of their own beside them here.

What a reader gives is what the model's own tool-call parser (vLLM's, SGLang's) would: argument
values typed by the tool's schema where the style writes them untyped, entities decoded where the
style escapes them. Only closed calls are calls: an output cut inside one (the token limit) says
so (`cut`) and the unfinished markup is in neither the text nor the calls.

No reader recurses on the text: nested argument elements (Cohere's, MiniMax-M3's) are read with an
explicit stack, bounded by MAX_DEPTH.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import ModelFormatError
from .json_common import XML_STYLES, XMLStyle
from .model_formats import SYNTAXES, CallSyntax, Tool, _builder, _tools

#: Nesting of argument elements a reader follows (a tool schema nested deeper is refused long before).
MAX_DEPTH = 256

_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"\s*")


@dataclass
class ToolCallOut:
    """A call read from an output: the tool's name and its arguments as a JSON value."""

    name: str
    arguments: Any


@dataclass
class ModelOutput:
    """An output split as the model's parser splits it. `content` is None when no text is left;
    `cut`: the output ended inside a call (or inside the reasoning), whose markup is dropped."""

    reasoning: str | None = None
    content: str | None = None
    calls: list[ToolCallOut] = field(default_factory=list)
    cut: bool = False


class _Incomplete(Exception):
    """The text ended inside what was being read."""


class _Mismatch(Exception):
    """The text is not what was being read (left as text)."""


Reader = Callable[[str, tuple[Tool, ...], str], ModelOutput]
_READERS: dict[str, Reader] = {}
#: Per format: the strings from which streamed text is held back until the output is read whole
#: ("" holds everything: the format's text lies inside its own markup).
_HOLD: dict[str, tuple[str, ...]] = {}


def register_model_output_reader(name: str, hold: tuple[str, ...] = ("",)) -> Callable[[Reader], Reader]:
    """Register the reader of a format registered with register_model_structural_tag: a function
    (text, tools, reasoning) -> ModelOutput. `hold`: the strings from which a server holds
    streamed text back (default: all of it, until the output ends)."""
    def register(fn: Reader) -> Reader:
        _READERS[name] = fn
        _HOLD[name] = tuple(hold)
        return fn
    return register


def read_model_output(model: str, text: str, tools: list | None = None,
                      reasoning: bool | str = "disabled") -> ModelOutput:
    """Split a model's output in format `model` (get_model_structural_tag's names) into its
    reasoning, text and tool calls. `tools`: the request's tools, as get_model_structural_tag
    takes them (their schemas type the arguments of XML styles); `reasoning`: the mode the output
    was constrained with."""
    reader = _reader(model)
    if isinstance(reasoning, bool):
        reasoning = "enabled" if reasoning else "disabled"
    return reader(text, _tools(tools), reasoning)


def model_output_hold(model: str) -> tuple[str, ...]:
    """The strings from which a server streaming format `model` holds text back: what follows
    one may be a call (or, "" , everything may be)."""
    reader = _reader(model)
    if isinstance(reader, _SyntaxReader):
        s = reader.s
        return (s.opener, *(s.text[:1] if s.text else ()))
    return _HOLD[model]


def model_output_think(model: str) -> tuple[str, str] | None:
    """The (opening, closing) tags of a CallSyntax format's reasoning block, or None."""
    _reader(model)
    syntax = SYNTAXES.get(model)
    return syntax.think if syntax is not None else None


def _reader(model: str) -> Reader:
    _builder(model)     # an unknown name: the same error as the grammar's
    reader = _READERS.get(model)
    if reader is not None:
        return reader
    syntax = SYNTAXES.get(model)
    if syntax is None:
        raise ModelFormatError(f"no output reader is registered for the format {model!r}", "/model")
    return _syntax_reader(syntax)


_SYNTAX_READERS: dict[int, _SyntaxReader] = {}


def _syntax_reader(syntax: CallSyntax) -> _SyntaxReader:
    """The reader of this very definition (a format registered again gets a reader of its own)."""
    reader = _SYNTAX_READERS.get(id(syntax))
    if reader is None or reader.s is not syntax:
        reader = _SYNTAX_READERS[id(syntax)] = _SyntaxReader(syntax)
    return reader


# --- the shared shape: free text in which calls open -------------------------------------------------

def _reasoning_split(text: str, think: tuple[str, str] | None, mode: str) -> tuple[str | None, str, bool]:
    """(reasoning, the rest, cut inside the reasoning)."""
    if think is None or mode == "disabled":
        return None, text, False
    opening, closing = think
    at = text.find(closing)
    if at < 0:
        if mode == "enabled" or text.lstrip().startswith(opening):
            body = text.lstrip().removeprefix(opening)
            return (body.strip() or None), "", True
        return None, text, False
    body = text[:at].lstrip().removeprefix(opening)
    return (body.strip() or None), text[at + len(closing):].lstrip(), False


class _SyntaxReader:
    """The reader of a CallSyntax format (see the module note)."""

    def __init__(self, syntax: CallSyntax):
        self.s = syntax
        self.style = XML_STYLES.get(syntax.style)
        self.lead = re.compile(syntax.lead) if syntax.lead else None

    def __call__(self, text: str, tools: tuple[Tool, ...], reasoning: str) -> ModelOutput:
        s = self.s
        thought, rest, cut = _reasoning_split(text, s.think, reasoning)
        out = ModelOutput(reasoning=thought, cut=cut)
        if cut:
            return out
        opener = s.opener
        kept: list[str] = []
        pos = 0
        while True:
            at = rest.find(opener, pos) if opener else -1
            if at < 0:
                kept.append(rest[pos:])
                break
            try:
                calls, end, cut = self.calls(rest, at, tools)
            except _Incomplete:
                kept.append(rest[pos:at])
                out.cut = True
                break
            except _Mismatch:       # not a call after all: text (an output nothing constrained)
                kept.append(rest[pos:at + len(opener)])
                pos = at + len(opener)
                continue
            kept.append(rest[pos:at])
            out.calls += calls
            pos = end
            if cut:
                out.cut = True
                break
        out.content = self.text_of("".join(kept), bool(out.calls or out.cut))
        return out

    def text_of(self, text: str, calls: bool) -> str | None:
        if self.lead is not None and calls:
            text = text.rstrip()
        if self.s.text:     # the answer between its markers (read bare too)
            opening, closing = self.s.text
            stripped = text.strip()
            if stripped.startswith(opening):
                stripped = stripped[len(opening):]
                stripped = stripped.removesuffix(closing)
                text = stripped
        if calls:
            text = text.strip()
        return text if text.strip() else None

    def calls(self, text: str, at: int, tools: tuple[Tool, ...]) -> tuple[list[ToolCallOut], int, bool]:
        """The calls from `at` (where the opener is) to past the last one (and the section), and
        whether the output was cut after the first. Raises _Incomplete when it was cut in the
        first, _Mismatch when no call is there."""
        s = self.s
        pos = at
        if s.section is not None:
            pos = _expect(text, pos, s.section[0])
        call, pos = self.call(text, pos, tools)
        calls = [call]
        head = s.begin.split("{name}")[0] if s.section is not None else s.opener    # what opens the next call
        joins = [s.separator + head] + ([head] if s.loose_separator and s.separator else [])
        closing = s.section[1] if s.section is not None else None
        while True:
            rest = text[pos:]
            if closing is not None and rest.startswith(closing):
                return calls, pos + len(closing), False
            join = next((j for j in joins if rest.startswith(j)), None)
            if join is None:
                if closing is None and not rest.strip():
                    return calls, pos, False
                if any(j.startswith(rest) for j in joins) or (closing is not None and closing.startswith(rest)):
                    return calls, len(text), True
                return calls, pos, False        # not a call: left as text (an output nothing constrained)
            try:
                call, pos = self.call(text, pos + len(join) - len(head), tools)
            except _Incomplete:
                return calls, len(text), True
            except _Mismatch:
                return calls, pos, False
            calls.append(call)

    def call(self, text: str, pos: int, tools: tuple[Tool, ...]) -> tuple[ToolCallOut, int]:
        """One call: its layout (begin, the elements before the arguments, the arguments, those
        after, end) read in order; the first constant naming the tool says which it is. What does
        not read as a call and is never closed is a call cut short."""
        try:
            return self._call(text, pos, tools)
        except _Mismatch:
            if self.s.end and self.s.end.split("{name}")[-1] not in text[pos:]:
                raise _Incomplete from None
            raise

    def _call(self, text: str, pos: int, tools: tuple[Tool, ...]) -> tuple[ToolCallOut, int]:
        s = self.s
        layout: list[dict | None] = [{"type": "const_string", "value": s.begin}, *s.before_arguments, None,
                                     *s.after_arguments, {"type": "const_string", "value": s.end}]
        tool: Tool | None = None
        args: Any = None
        for i, f in enumerate(layout):
            if f is None:
                if tool is None:
                    raise ModelFormatError("a call layout that never names its tool cannot be read", "/model")
                stop = next((g["value"].replace("{name}", self.spell(tool.name)) for g in layout[i + 1:]
                             if g is not None and g["type"] == "const_string" and g["value"]), s.end)
                args, pos = self.arguments(text, pos, tool, stop)
            elif tool is None and f["type"] == "const_string" and "{name}" in f["value"]:
                head, _, tail = f["value"].partition("{name}")
                pos = _expect(text, pos, head)
                tool, pos = self.name(text, pos, tools, tail)
            else:
                pos = _element(text, pos, f, self.spell(tool.name) if tool is not None else "")
        assert tool is not None
        return ToolCallOut(tool.name, args), pos

    def spell(self, name: str) -> str:
        for ch, entity in self.s.escapes:
            name = name.replace(ch, entity)
        return name

    def name(self, text: str, pos: int, tools: tuple[Tool, ...], tail: str) -> tuple[Tool, int]:
        """The tool whose (spelled) name follows, then `tail`; the longest name first."""
        partial = False
        for tool in sorted(tools, key=lambda t: -len(t.name)):
            spelled = self.spell(tool.name) + tail
            if text.startswith(spelled, pos):
                return tool, pos + len(spelled)
            partial = partial or spelled.startswith(text[pos:])
        if partial:
            raise _Incomplete
        raise _Mismatch

    def arguments(self, text: str, pos: int, tool: Tool, stop: str) -> tuple[Any, int]:
        if self.style is None:      # JSON
            start = _SPACE.match(text, pos).end()
            try:
                value, end = _DECODER.raw_decode(text, start)
            except json.JSONDecodeError as e:
                cut = e.pos >= len(text.rstrip()) or e.msg.startswith("Unterminated string")
                raise (_Incomplete if cut else _Mismatch) from None
            return value, (end if text.startswith(stop, end) else _SPACE.match(text, end).end())
        return _XMLArguments(self.style, self.s.style).read(text, pos, tool.parameters, stop)


def _expect(text: str, pos: int, literal: str) -> int:
    if text.startswith(literal, pos):
        return pos + len(literal)
    if literal.startswith(text[pos:]):
        raise _Incomplete
    raise _Mismatch


def _element(text: str, pos: int, f: dict, name: str) -> int:
    """A constant string or a regex of a call's layout, read at `pos`."""
    if f["type"] == "const_string":
        return _expect(text, pos, f["value"].replace("{name}", name))
    if f["type"] == "regex":
        m = re.compile(f["pattern"]).match(text, pos)
        if m is None:
            raise _Incomplete if pos >= len(text) else _Mismatch
        return m.end()
    raise ModelFormatError(f"a call layout element of type {f['type']!r} cannot be read", "/model")


# --- XML argument styles ------------------------------------------------------------------------------

def _schema_type(schema: Any) -> str | None:
    if not isinstance(schema, dict):
        return None
    t = schema.get("type")
    if isinstance(t, str):
        return t
    if isinstance(t, list):
        kinds = [k for k in t if k != "null"]
        return kinds[0] if len(kinds) == 1 else None
    if "properties" in schema:
        return "object"
    if "items" in schema:
        return "array"
    values = schema["enum"] if isinstance(schema.get("enum"), list) else [schema["const"]] if "const" in schema else []
    kinds = {_value_type(v) for v in values}
    if len(kinds) == 1:         # the type the listed values share (a model writes one of them)
        return kinds.pop()
    return "number" if kinds == {"integer", "number"} else None


def _value_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    return {float: "number", str: "string", list: "array", dict: "object"}.get(type(value), "null")


def _member_schema(schema: Any, name: str) -> Any:
    if not isinstance(schema, dict):
        return True
    props = schema.get("properties")
    if isinstance(props, dict) and name in props:
        return props[name]
    extra = schema.get("additionalProperties")
    return extra if isinstance(extra, dict) else True


def _unescape_name(name: str, style: XMLStyle) -> str:
    for ch, entity in reversed(style.escapes):
        name = name.replace(entity, ch)
    return name


class _XMLArguments:
    """The members of an XML style's arguments, up to the call's next literal (`stop`)."""

    def __init__(self, style: XMLStyle, name: str):
        self.style, self.name = style, name
        self.open = _open_pattern(style.open)
        self.item_open = _open_pattern(style.item_open) if style.item_open else None

    def read(self, text: str, pos: int, schema: Any, stop: str) -> tuple[dict, int]:
        if self.style.recursive:
            return self.read_tree(text, pos, schema, stop)
        args: dict[str, Any] = {}
        while True:
            pos = _SPACE.match(text, pos).end()
            if text.startswith(stop, pos):
                return args, pos
            if pos >= len(text) or stop.startswith(text[pos:]):
                raise _Incomplete
            m = self.open.match(text, pos)
            if m is None:
                if _could_open(text[pos:], self.style.open):
                    raise _Incomplete
                raise _Mismatch
            key = _unescape_name(m.group("name"), self.style)
            kind = m.groupdict().get("kind")
            until = self.style.until()
            end = text.find(until, m.end())
            if end < 0:
                raise _Incomplete
            rest = self.style.close[len(until):].replace("{name}", self.style.spell(key))
            pos = _expect(text, end + len(until), rest)
            args[key] = self.value(text[m.end():end], kind, _member_schema(schema, key))

    def value(self, raw: str, kind: str | None, schema: Any) -> Any:
        style = self.style
        t = _schema_type(schema)
        if self.name == "mimo_xml":
            return _mimo_value(raw, t)
        if style.kinds:         # the marker says whether the value is a raw string
            is_string = any(json_type == "string" and marker == kind for json_type, marker in style.kinds)
            return raw if is_string else _json_or_text(raw)
        if style.pad:
            raw = raw.removeprefix("\n").removesuffix("\n")
        if self.name == "minimax_xml":
            raw = raw.strip()
        return raw if t == "string" else _json_or_text(raw)

    def read_tree(self, text: str, pos: int, schema: Any, stop: str) -> tuple[dict, int]:
        """A recursive style's members (Cohere's typed elements, MiniMax-M3's named ones), with an
        explicit stack."""
        root: dict[str, Any] = {}
        # each frame: (container, schema, closing tag of the element holding it, key in parent)
        stack: list[tuple[Any, Any, str | None]] = [(root, schema, None)]
        while True:
            container, cschema, closing = stack[-1]
            pos = _SPACE.match(text, pos).end()     # between elements (a leaf's own text is read apart)
            if closing is None and text.startswith(stop, pos):
                return root, pos
            if closing is not None and text.startswith(closing, pos):
                pos += len(closing)
                stack.pop()
                continue
            if pos >= len(text):
                raise _Incomplete
            is_list = isinstance(container, list)
            pattern = self.item_open if is_list and self.item_open is not None else self.open
            m = pattern.match(text, pos)
            if m is None:
                if _could_open(text[pos:], self.style.item_open if is_list else self.style.open) or \
                        (closing and closing.startswith(text[pos:])) or stop.startswith(text[pos:]):
                    raise _Incomplete
                raise _Mismatch
            key = None if is_list else _unescape_name(m.group("name"), self.style)
            kind = m.groupdict().get("kind")
            sub = (cschema.get("items", True) if isinstance(cschema, dict) else True) if is_list \
                else _member_schema(cschema, key)
            close = self.style.item_close if is_list else self.style.close.replace("{name}", self.style.spell(key))
            pos = m.end()
            nested = self.nested(text, pos, kind, sub)
            if nested is not None:
                if len(stack) > MAX_DEPTH:
                    raise _Mismatch
                child: Any = [] if nested == "array" else {}
                _put(container, key, child)
                stack.append((child, sub, close))
                continue
            end = text.find(self.style.until(), pos)
            if end < 0:
                raise _Incomplete
            raw = text[pos:end]
            pos = _expect(text, end, close)
            _put(container, key, self.leaf(raw, kind, sub))

    def nested(self, text: str, pos: int, kind: str | None, schema: Any) -> str | None:
        """"object" / "array" when the element just opened holds elements, else None (a leaf)."""
        if self.name == "cohere_xml":
            return {"dict": "object", "list": "array"}.get(kind or "")
        # MiniMax-M3: children follow at once (a leaf's text never holds the namespace marker)
        marker = self.style.until()
        pos = _SPACE.match(text, pos).end()
        rest = text[pos:pos + len(marker) + 2]
        if len(rest) < len(marker) + 2 and (marker + "</").startswith(rest):
            raise _Incomplete
        if not rest.startswith(marker) or rest.startswith(marker + "</"):
            return None         # a leaf (an empty one, closed at once, too)
        return "array" if _schema_type(schema) == "array" else "object"

    def leaf(self, raw: str, kind: str | None, schema: Any) -> Any:
        if self.name == "cohere_xml":
            return html.unescape(raw) if kind == "raw" else _json_or_text(raw)
        t = _schema_type(schema)
        for entity, ch in (("&lt;", "<"), ("&gt;", ">"), ("&quot;", '"'), ("&apos;", "'"), ("&amp;", "&")):
            raw = raw.replace(entity, ch)
        if t in ("object", "array") and not raw.strip():
            return {} if t == "object" else []
        return raw if t == "string" else _json_or_text(raw)


def _put(container: Any, key: str | None, value: Any) -> None:
    if isinstance(container, list):
        container.append(value)
    else:
        container[key] = value


def _open_pattern(pieces: tuple[str, ...]) -> re.Pattern:
    """An opening tag's pieces as a pattern: `{name}` and `{kind}` captured, pieces joined by
    optional whitespace."""
    parts = []
    for piece in pieces:
        out, rest = "", piece
        while rest:
            i = min((rest.find(k) for k in ("{name}", "{kind}") if k in rest), default=-1)
            if i < 0:
                out += re.escape(rest)
                break
            out += re.escape(rest[:i])
            key = rest[i + 1:i + 5]
            nxt = rest[i + 6:i + 7]
            stop = re.escape(nxt) if nxt else ">"
            out += f"(?P<{key}>(?:(?!{stop}).)*?)" if key == "name" else f"(?P<{key}>[^\"]*)"
            rest = rest[i + 6:]
        parts.append(out)
    return re.compile(r"\s*".join(parts), re.DOTALL)


def _could_open(rest: str, pieces: tuple[str, ...]) -> bool:
    """Whether the text left is the start of an opening tag (the output was cut in it)."""
    head = pieces[0].split("{")[0] if pieces else ""
    return bool(rest) and (head.startswith(rest) or (rest.startswith(head) and ">" not in rest[len(head):]))


def _json_or_text(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


def _mimo_value(raw: str, t: str | None) -> Any:
    """MiMo's values as its parser reads them: entities decoded, "null" None, then by the schema's
    type (strings as they are, numbers and booleans converted, anything else JSON)."""
    value = html.unescape(raw)
    if value.lower() == "null":
        return None
    t = t or "string"
    if t == "string":
        return value
    try:
        if t == "integer":
            return int(value)
        if t == "number":
            number = float(value)
            return int(number) if number == int(number) else number
        if t == "boolean":
            return {"true": True, "false": False}.get(value.lower(), value)
        return json.loads(value)
    except (ValueError, OverflowError):
        return value


# --- Kimi K3: channels -----------------------------------------------------------------------------

_K3_STYLE = XML_STYLES["kimi_k3_xml"]


@register_model_output_reader("kimi_k3")
def _read_kimi_k3(text: str, tools: tuple[Tool, ...], reasoning: str) -> ModelOutput:
    """The reasoning channel (its opening may be in the prompt), the response channel's text, the
    tools channel's calls, the message's closing."""
    out = ModelOutput()
    pos = 0
    think_close = "<|close|>think<|sep|>"
    if reasoning != "disabled":
        at = text.find(think_close)
        if at >= 0:
            out.reasoning = text[:at].removeprefix("<|open|>think<|sep|>").strip() or None
            pos = at + len(think_close)
        elif reasoning == "enabled" or text.startswith("<|open|>think<|sep|>"):
            out.reasoning = text.removeprefix("<|open|>think<|sep|>").strip() or None
            out.cut = True
            return out
    if text.startswith("<|open|>response<|sep|>", pos):
        pos += len("<|open|>response<|sep|>")
    close = "<|close|>response<|sep|>"
    at = text.find(close, pos)
    if at < 0:
        out.content = text[pos:] or None
        out.cut = True
        return out
    content = text[pos:at]
    pos = at + len(close)
    if text.startswith("<|open|>tools<|sep|>", pos):
        pos += len("<|open|>tools<|sep|>")
        args = _XMLArguments(_K3_STYLE, "kimi_k3_xml")
        by_name = {t.name: t for t in tools}
        try:
            while not text.startswith("<|close|>tools<|sep|>", pos):
                m = re.compile(r'<\|open\|>call tool="([^"]*)" index="[0-9]+"<\|sep\|>').match(text, pos)
                if m is None:
                    raise _Incomplete
                name = m.group(1).replace("&quot;", '"').replace("&amp;", "&")
                tool = by_name.get(name, Tool(name))
                value, pos = args.read(text, m.end(), tool.parameters, "<|close|>call<|sep|>")
                pos = _expect(text, pos, "<|close|>call<|sep|>")
                out.calls.append(ToolCallOut(name, value))
        except (_Incomplete, _Mismatch):
            out.cut = True
    if out.calls or out.cut:
        content = content.strip()
    out.content = content if content.strip() else None
    return out


# --- harmony (gpt-oss) ------------------------------------------------------------------------------

_HARMONY_HEADER = re.compile(r"(?:<\|start\|>assistant)?(?P<pre> to=(?P<pre_to>\S+?))?<\|channel\|>(?P<channel>analysis|"
                             r"commentary|final)(?: to=(?P<to>\S+?))?(?: ?(?:<\|constrain\|>)?json)?<\|message\|>")


@register_model_output_reader("harmony")
def _read_harmony(text: str, tools: tuple[Tool, ...], reasoning: str) -> ModelOutput:
    """Messages one after another: analysis (reasoning), commentary without a recipient (a
    preamble: text), final (the answer), or a call (a recipient) whose JSON arguments run to the
    end of the output (its stop token is not in the text)."""
    out = ModelOutput()
    reasoning_parts, content_parts = [], []
    by_recipient = {(t.name if t.builtin else f"functions.{t.name}"): t for t in tools}
    pos = 0
    while pos < len(text):
        m = _HARMONY_HEADER.match(text, pos)
        if m is None:
            out.cut = True
            break
        recipient = m.group("to") or m.group("pre_to")
        body_at = m.end()
        if recipient:
            tool = by_recipient.get(recipient)
            body = text[body_at:].removesuffix("<|call|>")
            try:
                value = json.loads(body)
            except ValueError:
                out.cut = True
                break
            out.calls.append(ToolCallOut(tool.name if tool else recipient.removeprefix("functions."), value))
            break
        end = text.find("<|end|>", body_at)
        if m.group("channel") == "final" or end < 0:
            body = text[body_at:] if end < 0 else text[body_at:end]
            body = body.removesuffix("<|return|>")
            (reasoning_parts if m.group("channel") == "analysis" else content_parts).append(body)
            if end < 0 and m.group("channel") == "analysis":
                out.cut = True
            break
        (reasoning_parts if m.group("channel") == "analysis" else content_parts).append(text[body_at:end])
        pos = end + len("<|end|>")
    out.reasoning = "\n".join(reasoning_parts) or None
    out.content = "\n".join(content_parts) or None
    return out


# --- a model's format from its chat template -------------------------------------------------------

#: What a chat template writes that only one family's does, most specific first: (format, strings
#: that must all be in the template).
TEMPLATE_SIGNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("harmony", ("<|channel|>", "<|message|>")),
    ("kimi_k3", ("<|open|>", "<|sep|>", "<|close|>")),
    ("kimi", ("<|tool_calls_section_begin|>",)),
    ("deepseek_v4_1", ("\uff5cDSML\uff5c",  " calls>")),
    ("deepseek_v4", ("\uff5cDSML\uff5c", "tool_calls>")),
    ("deepseek_v3_2", ("\uff5cDSML\uff5c", "function_calls>")),
    ("deepseek_r1", ("<\uff5ctool\u2581calls\u2581begin\uff5c>", "function<\uff5ctool\u2581sep\uff5c>")),
    ("deepseek_v3_1", ("<\uff5ctool\u2581calls\u2581begin\uff5c>", "<\uff5ctool\u2581sep\uff5c>")),
    ("minimax_m3", ("]<]minimax[>[",)),
    ("minimax", ("<minimax:tool_call>",)),
    ("cohere", ("<cofl:tool_call",)),
    ("glm_4_7", ("<arg_key>", "<arg_value>")),
    ("qwen_3_5", ("<tool_call>", "<function=", "<parameter=", "<think>")),
    ("qwen_3_coder", ("<tool_call>", "<function=", "<parameter=")),
    ("exaone", ("<tool_call>", "[|assistant|]")),
    ("qwen_3", ("<tool_call>", "</tool_call>")),
    ("llama", ("<|start_header_id|>", '"parameters": ')),
)


def tool_format_of_template(template: str | None) -> str | None:
    """The tool-call format (get_model_structural_tag's name) a chat template writes, or None when
    it is none of the known ones. MiMo's, which looks like Qwen3-Coder's, is named, never guessed."""
    if not isinstance(template, str):
        return None
    for name, signs in TEMPLATE_SIGNS:
        if all(sign in template for sign in signs):
            return name
    return None
