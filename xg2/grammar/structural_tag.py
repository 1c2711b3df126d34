"""Structural tags: xgrammar's JSON description of output that mixes free text, tags and formats.

A structural tag is `{"type": "structural_tag", "format": <format>}`, where a format is one of the
types below, told apart by its `"type"` member (xgrammar's names and members, so the same JSON
serves either engine). This module reads one from a dict, a JSON text or pydantic objects with a
`model_dump` (xgrammar's own classes among them) into typed, immutable values, and checks what the
types alone cannot: counts, non-empty strings, tags that their triggers announce. Every problem
raises `StructuralTagError` with the JSON pointer of the element at fault, in the words of formats
and fields (structural_tag_errors.py); nothing is silently dropped (unknown members are errors,
since a misspelt option would otherwise loosen the output).
`structural_tag_to_ir` then writes the tag as grammar rules: free text and the dispatching forms
(`triggered_tags`, `dispatch`) become text automata up to the first trigger (see text.py), so the
core runs them like any other rule and their masks are exact.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Union

import msgspec

from ..errors import GrammarError, GrammarLimitError, SchemaError, StructuralTagError, StructuralTagJSONError
from .ir import Choice, Expr, GrammarIR, Repeat, Rule, RuleRef, Seq, TokenSet
from .ir import Literal as Text
from .json_common import XML_STYLES
from .nesting import check_nesting
from .structural_tag_errors import label

#: Formats nested in formats (a tag's content, a sequence's elements, ...) before the tag is refused.
MAX_FORMAT_DEPTH = 256
#: Dicts and lists nested in the whole document (JSON Schemas inside included) before it is
#: refused, measured before any decoder descends into it with the interpreter's stack.
MAX_TAG_NESTING = 512
#: A length budget (`max_tokens`, `max_chars`): xgrammar's range, a non-negative 32-bit integer.
Budget = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]
#: A string that must not be empty (a trigger, an excluded string, a dispatch tag).
NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]
#: What every message of a StructuralTagError begins with: xgrammar's wording for its
#: InvalidStructuralTagError, which code written for xgrammar looks for.
PREFIX = "Invalid structural tag error: "


def _decoded(text: str | bytes | bytearray) -> Any:
    """A structural tag's JSON text as plain data (typed errors: not JSON, nested too deep)."""
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError as e:
        raise _error(f"Failed to parse JSON: {e}", cls=StructuralTagJSONError) from None
    except RecursionError:
        raise GrammarLimitError(f"structural tag nested deeper than {MAX_TAG_NESTING} levels",
                                pointer="") from None


def _error(message: str, pointer: str = "", cls: type = StructuralTagError) -> StructuralTagError:
    """A StructuralTagError (or `cls`) with the common prefix."""
    return cls(PREFIX + message, pointer)


class _Pydantic:
    """The part of pydantic's model API that code written for xgrammar's pydantic formats calls
    (dumping a tag to send it elsewhere, reading it back), on msgspec structs. Stateless, so the
    structs keep their slots."""

    __slots__ = ()

    def model_dump(self, *, mode: str = "python", by_alias: bool = True) -> dict[str, Any]:
        """Plain data, as JSON would carry it (pydantic's modes differ only for types tags lack)."""
        del mode, by_alias      # no aliases, and nothing that JSON mode would write differently
        return msgspec.to_builtins(self)

    def model_dump_json(self, *, indent: int | None = None) -> str:
        if indent is None:
            return _encode(self)
        return json.dumps(msgspec.to_builtins(self), indent=indent)

    @classmethod
    def model_validate(cls, obj: Any) -> Any:
        """`obj` (data, or an instance) read and checked as this class."""
        return _validate(cls, obj)

    @classmethod
    def model_validate_json(cls, text: str | bytes) -> Any:
        return _validate(cls, _decoded(text))


class _Format(_Pydantic, msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag_field="type"):
    pass


class ConstStringFormat(_Format, tag="const_string"):
    value: str


class JSONSchemaFormat(_Format, tag="json_schema"):
    json_schema: Union[bool, dict[str, Any]]  # noqa: UP007 (msgspec reads the annotation)
    style: Literal["json", "qwen_xml", "minimax_xml", "minimax_m3_xml", "deepseek_xml", "glm_xml", "cohere_xml",
                   "kimi_k3_xml", "deepseek_v4_1_xml", "mimo_xml"] = "json"
    any_order: bool = False
    max_whitespace_cnt: Union[int, None] = None  # noqa: UP007
    excludes: list[NonEmpty] = []
    # xg2's: False allows no whitespace between JSON tokens (vLLM's disable_any_whitespace, for tool
    # arguments as for response formats); xgrammar's tag has no such field and always allows it.
    any_whitespace: bool = True


class QwenXMLParameterFormat(_Format, tag="qwen_xml_parameter"):
    json_schema: Union[bool, dict[str, Any]]  # noqa: UP007


class GrammarFormat(_Format, tag="grammar"):
    grammar: str


class RegexFormat(_Format, tag="regex"):
    pattern: str


class AnyTextFormat(_Format, tag="any_text"):
    excludes: list[NonEmpty] = []
    max_tokens: Union[Budget, None] = None  # noqa: UP007
    max_chars: Union[Budget, None] = None  # noqa: UP007


class SequenceFormat(_Format, tag="sequence"):
    elements: list[Format]


class OrFormat(_Format, tag="or"):
    elements: list[Format]


class OptionalFormat(_Format, tag="optional"):
    content: Format


class PlusFormat(_Format, tag="plus"):
    content: Format


class StarFormat(_Format, tag="star"):
    content: Format


class RepeatFormat(_Format, tag="repeat"):
    min: int
    max: int
    content: Format


class TokenFormat(_Format, tag="token"):
    token: Union[int, str]  # noqa: UP007


class TagFormat(_Format, tag="tag"):
    begin: Union[str, TokenFormat]  # noqa: UP007
    content: Format
    end: Union[str, list[str], TokenFormat]  # noqa: UP007


class TriggeredTagsFormat(_Format, tag="triggered_tags"):
    triggers: list[NonEmpty]
    tags: list[TagFormat]
    at_least_one: bool = False
    stop_after_first: bool = False
    excludes: list[NonEmpty] = []


class TagsWithSeparatorFormat(_Format, tag="tags_with_separator"):
    tags: list[TagFormat]
    separator: str
    at_least_one: bool = False
    stop_after_first: bool = False


class DispatchFormat(_Format, tag="dispatch"):
    rules: list[tuple[NonEmpty, Format]]
    loop: bool = True
    excludes: list[NonEmpty] = []


class ExcludeTokenFormat(_Format, tag="exclude_token"):
    exclude_tokens: list[Union[int, str]] = []  # noqa: UP007


class AnyTokensFormat(_Format, tag="any_tokens"):
    exclude_tokens: list[Union[int, str]] = []  # noqa: UP007
    max_tokens: Union[Budget, None] = None  # noqa: UP007


class TokenTriggeredTagsFormat(_Format, tag="token_triggered_tags"):
    trigger_tokens: list[Union[int, str]]  # noqa: UP007
    tags: list[TagFormat]
    exclude_tokens: list[Union[int, str]] = []  # noqa: UP007
    at_least_one: bool = False
    stop_after_first: bool = False


class TokenDispatchFormat(_Format, tag="token_dispatch"):
    rules: list[tuple[Union[int, str], Format]]  # noqa: UP007
    loop: bool = True
    exclude_tokens: list[Union[int, str]] = []  # noqa: UP007


Format = Union[  # noqa: UP007
    ConstStringFormat, JSONSchemaFormat, QwenXMLParameterFormat, GrammarFormat, RegexFormat, AnyTextFormat, SequenceFormat, OrFormat, OptionalFormat, PlusFormat,
    StarFormat, RepeatFormat, TokenFormat, TagFormat, TriggeredTagsFormat, TagsWithSeparatorFormat, DispatchFormat, ExcludeTokenFormat, AnyTokensFormat,
    TokenTriggeredTagsFormat, TokenDispatchFormat,
]


class StructuralTag(_Pydantic, msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag_field="type",
                    tag="structural_tag"):
    format: Format

    @staticmethod
    def from_json(json_str: Any) -> StructuralTag:
        """xgrammar's constructor: a tag from JSON text or a dict, checked."""
        return parse_structural_tag(json_str)

    @staticmethod
    def from_legacy_structural_tag(tags: Any, triggers: Any) -> StructuralTag:
        """xgrammar's constructor for the deprecated (tags, triggers) form."""
        return from_legacy_structural_tag(tags, triggers)


def parse_structural_tag(tag: Any) -> StructuralTag:
    """A structural tag from a dict, a JSON text (str or bytes) or pydantic objects, checked."""
    if isinstance(tag, StructuralTag):
        _check(tag.format, "/format")
        return tag
    if hasattr(tag, "model_dump"):
        tag = tag.model_dump(mode="json", by_alias=True)
    if isinstance(tag, (str, bytes, bytearray)):
        # decoded as plain data first, so that a type error can be explained with the data around it
        tag = _decoded(tag)
    check_nesting(tag, MAX_TAG_NESTING, "structural tag")
    try:
        try:
            out = msgspec.convert(tag, type=StructuralTag)
        except msgspec.ValidationError:
            tag = _plain(tag)       # pydantic objects inside plain containers
            out = msgspec.convert(tag, type=StructuralTag)
    except msgspec.ValidationError as e:
        from .structural_tag_errors import explain

        message, _, where = str(e).rpartition(" - at `")
        if not message:
            message, where = str(e), "$"
        parts = _path(where.rstrip("`"))
        pointer = "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)
        raise _error(explain(message, StructuralTag, tag, parts), pointer) from None
    _check(out.format, "/format")
    return out


def _validate(cls: type, obj: Any) -> Any:
    """A structural tag or one format, checked as `parse_structural_tag` checks a whole tag; a
    format's pointers start at the format itself."""
    if cls is StructuralTag:
        return parse_structural_tag(obj)
    if isinstance(obj, cls):
        obj = obj.model_dump()
    if isinstance(obj, dict) and "type" not in obj:
        obj = {"type": cls.__struct_config__.tag, **obj}
    try:
        out = parse_structural_tag({"type": "structural_tag", "format": obj}).format
    except StructuralTagError as e:
        raise type(e)(e.message, e.pointer.removeprefix("/format")) from None
    if not isinstance(out, cls):
        raise _error(f"expected {label(cls)}, got {label(type(out))}", "/type")
    return out


def _plain(value: Any) -> Any:
    """Pydantic objects nested in plain containers, as plain data (tuples as lists)."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", by_alias=True)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# ------------------------------------------------------------------ xgrammar's legacy (tags, triggers) form


class StructuralTagItem(msgspec.Struct, kw_only=True, frozen=True):
    """xgrammar's deprecated tag item (`begin`, a JSON Schema, `end`), still what vLLM's and SGLang's
    xgrammar backends build for the ``{"structures": [...], "triggers": [...]}`` requests. The
    schema may be JSON text, a dict or a pydantic model class."""

    begin: str
    schema: Any
    end: str

    @property
    def schema_(self) -> Any:
        """xgrammar's attribute name (its pydantic field is `schema_`, aliased `schema`)."""
        return self.schema


def from_legacy_structural_tag(tags: Any, triggers: Any) -> StructuralTag:
    """The legacy form as the structural tag it stands for: free text in which each trigger opens a
    dispatch to the tags whose `begin` starts with it (``triggered_tags``, none required, any
    number). Pointers in errors name the legacy arguments (``/tags/1/schema``)."""
    if not isinstance(tags, (list, tuple)) or not isinstance(triggers, (list, tuple)):
        raise TypeError("the legacy structural tag form is (tags: list[StructuralTagItem], triggers: list[str])")
    out = []
    for i, item in enumerate(tags):
        if isinstance(item, dict):
            parts = (item.get("begin"), item.get("schema", item.get("schema_")), item.get("end"))
        elif hasattr(item, "begin") and hasattr(item, "end"):
            parts = (item.begin, getattr(item, "schema_", getattr(item, "schema", None)), item.end)
        else:
            raise _error(f"expected a StructuralTagItem, got {type(item).__name__}", f"/tags/{i}")
        begin, schema, end = parts
        for name, value in (("begin", begin), ("end", end)):
            if not isinstance(value, str):
                raise _error(f"`{name}` must be a string", f"/tags/{i}/{name}")
        if isinstance(schema, (str, bytes, bytearray)):
            try:
                schema = json.loads(schema)
            except ValueError as e:
                raise _error(f"the schema is not valid JSON: {e}", f"/tags/{i}/schema",
                             cls=StructuralTagJSONError) from None
        elif isinstance(schema, type) and hasattr(schema, "model_json_schema"):
            schema = schema.model_json_schema()
        if not isinstance(schema, (dict, bool)):
            raise _error("the schema must be a JSON Schema (text, dict or pydantic model)", f"/tags/{i}/schema")
        out.append({"type": "tag", "begin": begin, "content": {"type": "json_schema", "json_schema": schema},
                    "end": end})
    for i, t in enumerate(triggers):
        if not isinstance(t, str):
            raise _error("a trigger must be a string", f"/triggers/{i}")
    return parse_structural_tag({"type": "structural_tag",
                                 "format": {"type": "triggered_tags", "triggers": list(triggers), "tags": out}})


def structural_tag_arguments(args: tuple, kwargs: dict) -> tuple[StructuralTag, Any]:
    """xgrammar's two call forms, ``(structural_tag)`` and the deprecated ``(tags, triggers)``
    (positional or by keyword), plus xg2's `tokenizer_info` for token-level formats: (the checked
    tag, tokenizer_info or None)."""
    kwargs = dict(kwargs)
    info = kwargs.pop("tokenizer_info", None)
    if "tags" in kwargs or "triggers" in kwargs or (len(args) >= 2 and isinstance(args[0], (list, tuple))):
        tags = kwargs.pop("tags", args[0] if args else None)
        triggers = kwargs.pop("triggers", args[1] if len(args) > 1 else None)
        rest = args[2:]
        if tags is None or triggers is None:
            raise TypeError("the legacy structural tag form takes both `tags` and `triggers`")
        tag = from_legacy_structural_tag(tags, triggers)
    elif "structural_tag" in kwargs:
        tag, rest = parse_structural_tag(kwargs.pop("structural_tag")), args
    elif args:
        if isinstance(args[0], (list, tuple)):
            raise TypeError("a list of tags is the legacy form, which takes the triggers too")
        tag, rest = parse_structural_tag(args[0]), args[1:]
    else:
        raise TypeError("expected a structural tag, or the legacy (tags, triggers)")
    if rest:
        if len(rest) > 1 or info is not None:
            raise TypeError("too many arguments for a structural tag")
        info = rest[0]
    if kwargs:
        raise TypeError(f"unexpected keyword argument {next(iter(kwargs))!r}")
    return tag, info


def _path(path: str) -> list[str | int]:
    """msgspec's `$.format.elements[0].value` as its steps: ["format", "elements", 0, "value"]."""
    out: list[str | int] = []
    for part in path.removeprefix("$").replace("[", ".[").split("."):
        if part.startswith("[") and part.endswith("]") and part[1:-1].isdigit():
            out.append(int(part[1:-1]))
        elif part:
            out.append(part)
    return out


def _check(fmt: Format, at: str) -> None:
    """What the types do not say, walked with an explicit stack (formats can nest deeply)."""
    stack: list[tuple[Any, str, int]] = [(fmt, at, 1)]
    while stack:
        f, at, depth = stack.pop()
        if depth > MAX_FORMAT_DEPTH:
            raise GrammarLimitError(f"formats nested deeper than {MAX_FORMAT_DEPTH} levels", pointer=at)
        if isinstance(f, (SequenceFormat, OrFormat)):
            if not f.elements:
                raise _error(f"{label(type(f))} must have at least one element", at + "/elements")
            stack.extend((e, f"{at}/elements/{i}", depth + 1) for i, e in enumerate(f.elements))
        elif isinstance(f, (OptionalFormat, PlusFormat, StarFormat)):
            stack.append((f.content, at + "/content", depth + 1))
        elif isinstance(f, RepeatFormat):
            if f.min < 0 or (f.max != -1 and f.max < f.min):
                if f.min < 0:
                    raise _error(f"Repeat min must be >= 0, got {f.min}", at + "/min")
                if f.max < -1:
                    raise _error(f"Repeat max must be -1 (unbounded) or >= 0, got {f.max}", at + "/max")
                raise _error(f"Repeat min must be <= max, got min {f.min} and max {f.max}", at)
            stack.append((f.content, at + "/content", depth + 1))
        elif isinstance(f, TagFormat):
            _check_tag(f, at)
            stack.append((f.content, at + "/content", depth + 1))
        elif isinstance(f, (TriggeredTagsFormat, TagsWithSeparatorFormat, TokenTriggeredTagsFormat)):
            if not f.tags:
                raise _error(f"{label(type(f))}'s tags must be non-empty: at least one tag is needed", at + "/tags")
            if isinstance(f, TriggeredTagsFormat):
                _check_strings(f.triggers, at + "/triggers", "trigger", at_least_one=True, owner=f)
                _check_strings(f.excludes, at + "/excludes", "excluded string", owner=f)
            if isinstance(f, TokenTriggeredTagsFormat):
                _check_tokens(f.trigger_tokens, at + "/trigger_tokens", at_least_one=True)
                _check_tokens(f.exclude_tokens, at + "/exclude_tokens")
            for i, t in enumerate(f.tags):
                where = f"{at}/tags/{i}"
                if isinstance(f, TriggeredTagsFormat) and isinstance(t.begin, TokenFormat):
                    raise _error("a triggered tag needs a string begin that starts with one of the triggers "
                                 "(tags that begin with a token go in 'token_triggered_tags')", where + "/begin")
                if isinstance(f, TriggeredTagsFormat) and not any(t.begin.startswith(s) for s in f.triggers):
                    raise _error("a triggered tag must begin with one of the triggers", where + "/begin")
                if isinstance(f, TokenTriggeredTagsFormat) and not isinstance(t.begin, TokenFormat):
                    raise _error("a token-triggered tag needs a token format begin (one of the trigger tokens)",
                                 where + "/begin")
                stack.append((t, where, depth + 1))
        elif isinstance(f, (DispatchFormat, TokenDispatchFormat)):
            if not f.rules:
                raise _error(f"{label(type(f))}'s rules must be non-empty: at least one rule is needed", at + "/rules")
            keys = [k for k, _ in f.rules]
            if isinstance(f, DispatchFormat):
                _check_strings(keys, at + "/rules", "dispatch tag", item=0, owner=f)
                _check_strings(f.excludes, at + "/excludes", "excluded string", owner=f)
            else:
                _check_tokens(keys, at + "/rules", item=0)
                _check_tokens(f.exclude_tokens, at + "/exclude_tokens")
            if len(set(keys)) < len(keys):
                raise _error(f"{label(type(f))} names a tag twice", at + "/rules")
            stack.extend((r, f"{at}/rules/{i}/1", depth + 1) for i, (_, r) in enumerate(f.rules))
        elif isinstance(f, AnyTextFormat):
            _check_strings(f.excludes, at + "/excludes", "excluded string", owner=f)
            for name in ("max_tokens", "max_chars"):
                _check_budget(f, name, at)
        elif isinstance(f, AnyTokensFormat):
            _check_tokens(f.exclude_tokens, at + "/exclude_tokens")
            _check_budget(f, "max_tokens", at)
        elif isinstance(f, ExcludeTokenFormat):
            _check_tokens(f.exclude_tokens, at + "/exclude_tokens")
        elif isinstance(f, TokenFormat):
            _check_tokens([f.token], at + "/token", item=None)
        elif isinstance(f, JSONSchemaFormat):
            _check_strings(f.excludes, at + "/excludes", "excluded string", owner=f)
            if f.max_whitespace_cnt is not None and f.max_whitespace_cnt < 1:
                raise _error("'max_whitespace_cnt' must be at least 1", at + "/max_whitespace_cnt")


def _check_tag(t: TagFormat, at: str) -> None:
    if isinstance(t.begin, TokenFormat):
        _check_tokens([t.begin.token], at + "/begin/token", item=None)
    if isinstance(t.end, list) and not t.end:
        raise _error("a tag's end list must not be empty", at + "/end")
    if isinstance(t.end, TokenFormat):
        _check_tokens([t.end.token], at + "/end/token", item=None)


def _check_budget(f: AnyTextFormat | AnyTokensFormat, name: str, at: str) -> None:
    """The range decoding checks, again for formats built in Python (not decoded)."""
    value = getattr(f, name)
    if value is not None and not (isinstance(value, int) and 0 <= value < 2**31):
        raise _error(f"{name} must be a non-negative 32-bit integer or null, got {value!r}", f"{at}/{name}")


def _check_strings(values: list[str], at: str, what: str, at_least_one: bool = False, item: int | None = None,
                   owner: Any = None) -> None:
    field = at.rsplit("/", 1)[-1]
    if at_least_one and not values:
        raise _error(f"{label(type(owner))}'s {field} must be non-empty: at least one {what} is needed", at)
    for i, v in enumerate(values):
        if not v:
            raise _error(f"{label(type(owner))}'s {field} must be non-empty strings: {what} {i} is empty",
                         f"{at}/{i}" + ("" if item is None else f"/{item}"))


def _check_tokens(values: list, at: str, at_least_one: bool = False, item: int | None = -1) -> None:
    """Token references: a token id (>= 0) or a token's text (non-empty)."""
    if at_least_one and not values:
        raise _error("at least one token is needed", at)
    for i, v in enumerate(values):
        where = at if item is None else f"{at}/{i}" + ("" if item == -1 else f"/{item}")
        if (isinstance(v, int) and v < 0) or (isinstance(v, str) and not v):
            raise _error("a token is a non-negative id or a non-empty token text", where)


def _name(f: Any) -> str:
    return type(f).__struct_config__.tag


def to_json(tag: StructuralTag) -> str:
    """The structural tag as JSON text (what `parse_structural_tag` reads back)."""
    return _encode(tag)


def _encode(tag: Any) -> str:
    try:
        return msgspec.json.encode(tag).decode()
    except UnicodeEncodeError:      # a lone surrogate in a string: written as an escape
        return json.dumps(msgspec.to_builtins(tag))


#: Formats `structural_tag_to_ir` lowers (`exclude_token`, exactly one token, as a token edge).
_LOWERED = (ConstStringFormat, JSONSchemaFormat, GrammarFormat, RegexFormat, SequenceFormat, OrFormat,
            OptionalFormat, PlusFormat, StarFormat, RepeatFormat, TagFormat, TagsWithSeparatorFormat, AnyTextFormat,
            TriggeredTagsFormat, DispatchFormat, QwenXMLParameterFormat, TokenFormat, AnyTokensFormat,
            TokenTriggeredTagsFormat, TokenDispatchFormat, ExcludeTokenFormat)
_FREE = (AnyTextFormat, AnyTokensFormat)
#: A stub's body until linking replaces its calls: one surrogate no text holds (never read).
STUB_BODY = Text("\udfff")
_STYLES = ("json", *XML_STYLES)


def structural_tag_to_ir(tag: StructuralTag, tokenizer_info: Any = None, stubs: dict | None = None,
                         gates: dict | None = None) -> GrammarIR:
    """The grammar of a parsed structural tag. Embedded grammars (JSON Schemas, EBNF) keep their
    rules under a prefix of their own; errors in them keep their place (JSON pointer within the
    tag, then within the schema, or line and column within the EBNF text).

    The token-level forms need the vocabulary (`tokenizer_info`). A special token named there is
    matched as that token only (TokenizerInfo.named_special_tokens); an ordinary token is matched
    by its text, as the byte-level parser reads every ordinary token; a stop token cannot be named
    (the output ends with it wherever the format can end).

    With `stubs` (a dict, filled in), every JSON Schema becomes a call of a stub rule, one per
    distinct (schema, style, any_order, max_whitespace_cnt, any_whitespace), named in `stubs`: the frame into which
    the compiler links the schemas it lowered once (linking.py). The tags a trigger starts are
    then a rule of their own too, a *gate*, named in `gates` with its trigger: the text around it
    is the same automaton in every frame with the same triggers (built once, its entries shared
    where no token reads past the trigger)."""
    lowering = _Lowering(tokenizer_info, stubs, gates)
    root = lowering.lower(tag.format, "/format")
    return GrammarIR([Rule("root", root), *lowering.rules], "root")


class _Lowering:
    def __init__(self, info: Any = None, stubs: dict | None = None, gates: dict | None = None) -> None:
        self.rules: list[Rule] = []
        self.n_embedded = 0
        self.info = info
        self.stubs = stubs
        self.gates = gates
        self.stub_names: dict[bytes, str] = {}

    def stub(self, f: JSONSchemaFormat | QwenXMLParameterFormat) -> Expr:
        """A call of the stub rule standing for this schema (one per distinct schema and options)."""
        plain = isinstance(f, QwenXMLParameterFormat)
        spec = (f.json_schema, "qwen_xml" if plain else f.style, not plain and f.any_order,
                None if plain else f.max_whitespace_cnt, plain or f.any_whitespace)
        text = msgspec.json.encode(spec)
        name = self.stub_names.get(text)
        if name is None:
            name = self.stub_names[text] = f"stub{len(self.stub_names)}"
            self.stubs[name] = (text, spec)
            self.rules.append(Rule(name, STUB_BODY))
        return RuleRef(name)

    def token(self, token: int | str, at: str) -> str:
        """The text standing for a named token in the grammar (see `structural_tag_to_ir`)."""
        from ..errors import TokenizerError

        if self.info is None:
            raise _error("a token-level format needs the vocabulary: compile the tag with "
                         "GrammarCompiler.compile_structural_tag", at)
        try:
            i = self.info.find_token(token)
        except TokenizerError as e:
            raise _error(str(e), at) from None
        if i in self.info.stop_token_ids:
            raise _error(f"token {i} is a stop token: the output ends with it wherever the format "
                         "can end, so it is not named in the format", at)
        named = self.info.named_special_tokens.get(i)
        if named is not None:
            return named
        if i in self.info.special_token_ids:
            raise _error(f"special token {i} cannot be named (it has no text, or lies beyond the "
                         "first 2048 special tokens)", at)
        try:
            return self.info.token_bytes(i).decode("utf-8")
        except UnicodeDecodeError:
            raise _error(f"token {i} is not whole UTF-8 text", at) from None

    def token_ids(self, tokens: list, at: str) -> set[int]:
        """The ids of `tokens` (ids, or texts the vocabulary finds), for a token edge."""
        from ..errors import TokenizerError

        if self.info is None:
            raise _error("a token-level format needs the vocabulary: compile the tag with "
                         "GrammarCompiler.compile_structural_tag", at)
        out = set()
        for i, t in enumerate(tokens):
            try:
                out.add(self.info.find_token(t))
            except TokenizerError as e:
                raise _error(str(e), f"{at}/{i}") from None
        return out

    def free_tokens(self, excluded: list, at: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Free tokens but `excluded`: (the special tokens' characters free text may hold, the
        texts of excluded ordinary tokens, which it must not)."""
        out = {self.token(t, f"{at}/{i}") for i, t in enumerate(excluded)}
        named = self.info.named_special_tokens if self.info is not None else {}
        specials = set(named.values())
        return (tuple(sorted(specials - out)), tuple(sorted(out - specials)))

    def text_of(self, x: str | TokenFormat, at: str) -> str:
        return x if isinstance(x, str) else self.token(x.token, at + "/token")

    def lower(self, top: Format, at: str) -> Expr:
        """Post-order over the formats with an explicit stack (they can nest deeply)."""
        out: dict[int, Expr] = {}
        stack: list[tuple[Any, str, bool]] = [(top, at, False)]
        at_end = _at_end(top)   # free text outside a tag runs to the end of the output: it must come last
        self.tails = self._tag_tails(top)
        while stack:
            f, where, done = stack.pop()
            kids = _parts(f, where)
            if not done:
                if not isinstance(f, _LOWERED) or (isinstance(f, JSONSchemaFormat) and f.style not in _STYLES):
                    what = f"style '{f.style}' of 'json_schema'" if isinstance(f, JSONSchemaFormat) else f"'{_name(f)}'"
                    raise _error(f"{what} is not supported yet", where)
                if isinstance(f, _FREE) and id(f) not in at_end and id(f) not in self.tails:
                    raise _error(f"'{_name(f)}' is supported at the end of a tag's content or of the "
                                 "output, not yet elsewhere", where)
                stack.append((f, where, True))
                stack.extend((k, w, False) for k, w in kids)
                continue
            parts = [out[id(k)] for k, _ in kids]
            out[id(f)] = self._one(f, where, parts)
        return out[id(top)]

    def _one(self, f: Any, at: str, parts: list[Expr]) -> Expr:
        if isinstance(f, ConstStringFormat):
            return Text(f.value)
        if isinstance(f, (SequenceFormat, OrFormat)):
            if len(parts) == 1:
                return parts[0]
            return Seq(tuple(parts)) if isinstance(f, SequenceFormat) else Choice(tuple(parts))
        if isinstance(f, (OptionalFormat, PlusFormat, StarFormat, RepeatFormat)):
            lo, hi = {OptionalFormat: (0, 1), PlusFormat: (1, None), StarFormat: (0, None)}.get(
                type(f), (getattr(f, "min", 0), getattr(f, "max", 0)))
            return Repeat(parts[0], lo, None if hi == -1 else hi)      # repeat's max -1: unbounded
        if isinstance(f, TokenFormat):
            return Text(self.token(f.token, at + "/token"))
        if isinstance(f, ExcludeTokenFormat):
            # one token, any but these: a token edge (ir.TokenSet), which the matcher crosses by id
            return TokenSet(tuple(sorted(self.token_ids(f.exclude_tokens, at + "/exclude_tokens"))), True)
        if isinstance(f, TagFormat):
            begin = Text(self.text_of(f.begin, at + "/begin"))
            ends = [self.text_of(f.end, at + "/end")] if isinstance(f.end, (str, TokenFormat)) else f.end
            if isinstance(f.content, ExcludeTokenFormat) and isinstance(f.end, TokenFormat):
                # the tag's own end token is never its content (xgrammar leaves it out too)
                content = parts[0]
                assert isinstance(content, TokenSet)
                parts = [TokenSet(tuple(sorted({*content.ids, *self.token_ids([f.end.token], at + "/end")})), True)]
            if isinstance(f.content, _FREE):      # text up to the first end string
                if list(ends) == [""] and isinstance(f.content, AnyTokensFormat):
                    # no end string: the tokens may stop anywhere, and what follows the tag goes on
                    # (say the next trigger token, which they exclude), as xgrammar reads it
                    return Seq((begin, self._text(f.content, at + "/content", ())))
                return Seq((begin, self._text(f.content, at + "/content", tuple(ends))))
            end = Text(ends[0]) if len(ends) == 1 else Choice(tuple(Text(e) for e in ends))
            return Seq((begin, self.named(parts[0]), end))
        if isinstance(f, _FREE):
            if id(f) in self.tails:     # at the end of a tag's content: text that never holds its end
                return self._text(f, at, (), self._unbordered(self.tails[id(f)], at))
            return self._text(f, at, ())
        if isinstance(f, (TriggeredTagsFormat, TokenTriggeredTagsFormat)):
            return self._triggered(f, at, parts)
        if isinstance(f, (DispatchFormat, TokenDispatchFormat)):
            # text, a tag string, its format, and back to text (`loop`) or the end
            if isinstance(f, DispatchFormat):
                keys, excludes, tokens = [k for k, _ in f.rules], f.excludes, ()
            else:
                keys = [self.token(k, f"{at}/rules/{i}/0") for i, (k, _) in enumerate(f.rules)]
                tokens, excludes = self.free_tokens(f.exclude_tokens, at + "/exclude_tokens")
            return _dispatching(dict(zip(keys, parts)), excludes, at + "/rules", loop=f.loop, tokens=tokens)
        if isinstance(f, TagsWithSeparatorFormat):
            # tags joined by the separator: none or more, at least one, or at most one of them
            one = self.named(parts[0] if len(parts) == 1 else Choice(tuple(parts)))
            if f.stop_after_first:
                return one if f.at_least_one else Repeat(one, 0, 1)
            many = Seq((one, Repeat(Seq((Text(f.separator), one)), 0, None)))
            return many if f.at_least_one else Repeat(many, 0, 1)
        if isinstance(f, (JSONSchemaFormat, QwenXMLParameterFormat)) and self.stubs is not None and not (
                isinstance(f, JSONSchemaFormat) and f.excludes):
            return self.stub(f)
        if isinstance(f, (JSONSchemaFormat, QwenXMLParameterFormat)):
            from .json_excludes import ExcludesError
            from .json_schema import json_schema_to_ir

            plain = isinstance(f, QwenXMLParameterFormat)
            try:
                ir = json_schema_to_ir(f.json_schema, style="qwen_xml" if plain else f.style,
                                       any_order=not plain and f.any_order,
                                       max_whitespace_cnt=None if plain else f.max_whitespace_cnt,
                                       any_whitespace=plain or f.any_whitespace,
                                       excludes=() if plain else tuple(f.excludes))
            except ExcludesError as e:
                raise _error(e.message, f"{at}/excludes/{e.index}") from None
            except SchemaError as e:
                raise _error(e.message, f"{at}/json_schema{e.pointer}") from None
            return self._embed(ir, "json")
        if isinstance(f, GrammarFormat):
            from .ebnf import parse_ebnf

            try:
                return self._embed(parse_ebnf(f.grammar), "ebnf")
            except GrammarError as e:
                raise _error(f"in the grammar: {e}", at + "/grammar") from None
        from .regex import regex_to_expr

        try:
            return regex_to_expr(f.pattern)
        except GrammarError as e:
            raise _error(f"in the pattern: {e}", at + "/pattern") from None

    def _triggered(self, f: TriggeredTagsFormat | TokenTriggeredTagsFormat, at: str, tags: list[Expr]) -> Expr:
        """Free text in which a trigger starts one of its tags (xgrammar's semantics, checked on
        the same strings): text that reaches a trigger's first occurrence then the rest of a tag
        that begins with it, again and again, then text with no trigger (`at_least_one`: a tag
        first, no text before it; `stop_after_first`: nothing after the first tag). Trigger tokens
        are triggers spelled as their tokens."""
        if isinstance(f, TriggeredTagsFormat):
            triggers, excludes, tokens = f.triggers, f.excludes, ()
        else:
            triggers = [self.token(t, f"{at}/trigger_tokens/{i}") for i, t in enumerate(f.trigger_tokens)]
            tokens, excludes = self.free_tokens(f.exclude_tokens, at + "/exclude_tokens")
        rests: dict[str, list[Expr]] = {}
        for i, (t, tag) in enumerate(zip(f.tags, tags)):
            begin = tag.items[0].text
            trigger = next((x for x in triggers if begin.startswith(x)), None)
            if trigger is None or (isinstance(f, TokenTriggeredTagsFormat) and begin != trigger):
                raise _error("a triggered tag must begin with one of the triggers", f"{at}/tags/{i}/begin")
            rest = tag.items[1:] if begin == trigger else (Text(begin[len(trigger):]), *tag.items[1:])
            rests.setdefault(trigger, []).append(rest[0] if len(rest) == 1 else Seq(tuple(rest)))
        after: dict[str, Expr | None] = {t: None for t in triggers}
        after.update((t, alts[0] if len(alts) == 1 else Choice(tuple(alts))) for t, alts in rests.items())
        if self.gates is not None:
            for t, then in after.items():
                if then is not None:
                    name = f"gate{len(self.gates)}"
                    self.gates[name] = t
                    self.rules.append(Rule(name, then))
                    after[t] = RuleRef(name)
        any_tag = tags[0] if len(tags) == 1 else Choice(tuple(tags))
        once = _dispatching(after, excludes, at + "/triggers", loop=not f.stop_after_first, tokens=tokens)
        if f.at_least_one:
            # a tag first, no text before it; then text and tags as usual (or nothing, with
            # stop_after_first)
            return any_tag if f.stop_after_first else Seq((any_tag, once))
        return once

    def _tag_tails(self, top: Format) -> dict[int, tuple]:
        """Free text at the end of a composite tag content (the last element of a sequence, each
        alternative of an `or`, an `optional`'s content) -> the tag's end strings, which the text
        then never holds, as xgrammar reads it (its end-string detection)."""
        tails: dict[int, tuple] = {}
        stack = [top]
        while stack:
            f = stack.pop()
            stack.extend(k for k, _ in _parts(f, ""))
            if isinstance(f, TagFormat) and not isinstance(f.content, _FREE):
                ends = (f.end,) if isinstance(f.end, (str, TokenFormat)) else tuple(f.end)
                tails.update((id(g), ends) for g in _trailing(f.content) if isinstance(g, _FREE))
        return tails

    def _unbordered(self, ends: tuple, at: str) -> tuple[str, ...]:
        """The end strings as text. Text that never holds an end string, then the end, reads the
        end's first occurrence exactly when no end string begins with one of its own proper
        suffixes (a border, as in "aa"); a bordered one is refused rather than read loosely."""
        texts = tuple(self.text_of(e, at) for e in ends)
        for e in texts:
            if any(e.startswith(e[i:]) for i in range(1, len(e))):
                raise _error(f"free text before the end string {e!r}, which overlaps itself, is not "
                             "supported yet", at)
        return texts

    def _text(self, f: AnyTextFormat | AnyTokensFormat, at: str, ends: tuple[str, ...],
              never: tuple[str, ...] = ()) -> Expr:
        """The free text of `f` up to its first end string (without ends: stopping anywhere), never
        holding its excluded strings nor `never`."""
        from .text import text_until

        budget = getattr(f, "max_tokens", None)
        chars = getattr(f, "max_chars", None)
        if isinstance(f, AnyTextFormat):
            excludes, tokens = tuple(f.excludes), ()
        else:
            tokens, excludes = self.free_tokens(f.exclude_tokens, at + "/exclude_tokens")
        excludes += never
        if "" in ends or "" in never:
            raise _error("free text needs non-empty end strings: an empty one would end it anywhere",
                         at.rsplit("/", 1)[0] + "/end" if ends else at)
        if budget is not None or chars is not None:
            return self._budgeted_text(budget, chars, ends, excludes, tokens, at)
        try:
            text = text_until(ends, excludes, tokens)
        except ValueError as e:     # GrammarError among them
            raise _error(str(e), at) from None
        if text is None:
            raise _error("every end string of the tag contains an excluded string", at + "/excludes")
        return text

    def _budgeted_text(self, budget: int | None, chars: int | None, ends: tuple[str, ...],
                       excludes: tuple[str, ...], tokens: tuple[str, ...], at: str) -> Expr:
        """Free text with a token budget (`max_tokens`) and/or a character budget (`max_chars`):
        the text that never holds an end string, as a rule of its own (Rule.max_tokens: once it has
        had its tokens it ends where it can, so the end string comes next; the character budget is
        built into its language, see char_budget), then the end. That is the text up to the first
        end string exactly when no string the text must not hold (an end, an excluded string) can
        begin inside the text and finish inside an end string; otherwise it is refused."""
        from .char_budget import text_within_chars
        from .text import text_until

        for x in (*ends, *excludes):
            for e in ends:
                for cut in range(1, len(x)):
                    v = x[cut:]
                    if e.startswith(v) and (v != e or x in excludes):
                        raise _error(f"a token budget on free text before the end string {e!r} is not "
                                     f"supported: {x!r} could begin in the text and end in it", at + "/max_tokens")
        self.n_embedded += 1
        name = f"budgeted_text{self.n_embedded}"
        try:
            if chars is None:
                body = text_until((), excludes + tuple(ends), tokens)
            elif tokens:
                raise _error("a character budget on text that may hold special tokens is not supported yet",
                             at + "/max_chars")
            else:
                counter = iter(range(1 << 30))
                body = text_within_chars(tuple(sorted({*excludes, *ends})), chars,
                                         lambda b: f"{name}_{b}{next(counter)}", "chars", self.rules)
        except GrammarLimitError as e:
            raise _error(e.message, at + "/max_chars") from None
        except ValueError as e:
            raise _error(str(e), at) from None
        if body is None:
            raise _error("the free text can hold nothing", at)
        self.rules.append(Rule(name, body, max_tokens=budget))
        if not ends:
            return RuleRef(name)
        end = Text(ends[0]) if len(ends) == 1 else Choice(tuple(Text(e) for e in sorted(set(ends))))
        return Seq((RuleRef(name), end))

    def named(self, body: Expr) -> Expr:
        """A rule of its own for an expression that other forms repeat (a tag's content, the tags
        of a separated list): the automata see a call instead of a copy, so nested tags grow the
        grammar linearly rather than doubling it at every level."""
        if isinstance(body, (Text, RuleRef)):
            return body
        self.n_embedded += 1
        name = f"part{self.n_embedded}"
        self.rules.append(Rule(name, body))
        return RuleRef(name)

    def _embed(self, ir: GrammarIR, kind: str) -> Expr:
        """The rules of a sub-grammar under a fresh prefix; a reference to its root."""
        from .optimize import embedded

        self.n_embedded += 1
        rules, root = embedded(ir, f"{kind}{self.n_embedded}_")
        self.rules.extend(rules)
        return root


def _dispatching(after: dict[str, Expr], excludes: Any, at: str, loop: bool, tokens: tuple[str, ...]) -> Expr:
    from .text import dispatching

    try:
        return dispatching(after, tuple(excludes), loop=loop, tokens=tokens)
    except ValueError as e:
        raise _error(str(e), at) from None


def _at_end(top: Format) -> set[int]:
    """The formats nothing can follow (ids): see `_trailing`."""
    return {id(f) for f in _trailing(top)}


def _trailing(top: Format) -> list:
    """The formats at the end of `top`: itself, and within one of them the last element of a
    sequence, the alternatives of an `or`, the content of an `optional`."""
    out: list = []
    stack = [top]
    while stack:
        f = stack.pop()
        out.append(f)
        if isinstance(f, SequenceFormat):
            stack.append(f.elements[-1])
        elif isinstance(f, OrFormat):
            stack.extend(f.elements)
        elif isinstance(f, OptionalFormat):
            stack.append(f.content)
    return out


def _parts(f: Any, at: str) -> list[tuple[Any, str]]:
    """The sub-formats a format is made of, with their pointers (those `_Lowering` descends into)."""
    if isinstance(f, (SequenceFormat, OrFormat)):
        return [(e, f"{at}/elements/{i}") for i, e in enumerate(f.elements)]
    if isinstance(f, TagFormat) and isinstance(f.content, _FREE):
        return []           # the tag lowers its free text together with its end strings
    if isinstance(f, (OptionalFormat, PlusFormat, StarFormat, RepeatFormat, TagFormat)):
        return [(f.content, at + "/content")]
    if isinstance(f, (TagsWithSeparatorFormat, TriggeredTagsFormat, TokenTriggeredTagsFormat)):
        return [(t, f"{at}/tags/{i}") for i, t in enumerate(f.tags)]
    if isinstance(f, (DispatchFormat, TokenDispatchFormat)):
        return [(r, f"{at}/rules/{i}/1") for i, (_, r) in enumerate(f.rules)]
    return []
