"""From an OpenAI request to the grammar spec xg2's runtime compiles, and from a compile error back
to the place in the request at fault.

Errors xg2 raises while compiling carry a pointer (or line and column) relative to the grammar;
`compile_error_to_request_error` re-roots them at the body field the grammar came from
(``/response_format/json_schema/schema/properties/x``, ``/tools/3/function/parameters/...``), so a
client with a large schema or many tools learns exactly what to fix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from xg2 import get_model_structural_tag
from xg2.actors.spec import EBNFSpec, GrammarSpec, JSONSchemaSpec, RegexSpec, StructuralTagSpec, ToolsSpec
from xg2.errors import GrammarLimitError, ModelFormatError, QuotaError, SchemaError, SpecError, XG2Error

from .protocol import (
    AllowedToolsChoice,
    ChatCompletionRequest,
    CompletionRequest,
    LegacyStructure,
    NamedToolChoice,
    ReasoningMode,
    RequestError,
    ResponseFormat,
    ResponseFormatJSONObject,
    ResponseFormatJSONSchema,
    ResponseFormatStructuralTag,
    StructuredOutputs,
    _escape,
    _GrammarFields,
    _validation_error,
)

# ------------------------------------------------------------------------------------------------
# Request -> grammar spec
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Source:
    """Where a request's grammar came from: `param` the body field holding it; `value` the
    document compiled, as it is in that field (an object a pointer can go into; None when the
    field held JSON text or a grammar); `remap` the translation of a pointer into `value` to one
    into the field, when the two differ (the legacy structural tag is rewritten); `kind` what
    the message calls it."""

    param: str
    kind: str
    spec: GrammarSpec | None
    value: Any = None
    remap: Callable[[str], str | None] | None = None
    text: bool = False


def _ebnf_literal(text: str) -> str:
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}")
    return '"' + "".join(out) + '"'


def choice_grammar(choices: list[str]) -> str:
    """EBNF whose language is exactly the given strings (vLLM's `choice`)."""
    return "root ::= " + " | ".join(_ebnf_literal(c) for c in choices) + "\n"


def _parse_json_text(text: str, param: str, kind: str) -> Any:
    """JSON text decoded up front, so the same schema sent as text or as an object shares one
    compile (the spec's content key is of the decoded document)."""
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError as e:
        raise RequestError(f"{kind} is not valid JSON text: {e}", param, code="invalid_value") from None
    except RecursionError:
        raise RequestError(f"{kind} nests too deeply to decode", param, code="invalid_value") from None


def _schema_spec(value: Any, param: str, *, any_whitespace: bool = True, strict_mode: bool = True) -> _Source:
    schema = _parse_json_text(value, param, "the JSON Schema") if isinstance(value, str) else value
    return _Source(param, "invalid JSON Schema",
                   JSONSchemaSpec(schema, any_whitespace=any_whitespace, strict_mode=strict_mode), schema,
                   text=isinstance(value, str))


def _convert(value: Any, type_: Any, param: str, field: str, text: bool) -> Any:
    """`value` checked as `type_`; a refusal points at `param` + `field` + where (at `param` alone
    when the document was JSON text)."""
    try:
        return msgspec.convert(value, type_)
    except msgspec.ValidationError as e:
        err = _validation_error(e)
        where = field + (err.param or "")
        if text:
            raise RequestError(f"{err.message} (at {where})", param, code=err.code) from None
        raise RequestError(err.message, param + where, code=err.code) from None


def _tag_spec(value: Any, param: str) -> _Source:
    """A structural tag field: xgrammar's current form, or (as vLLM tells them apart, by a
    `structures` member) the legacy one."""
    text = isinstance(value, str)
    tag = _parse_json_text(value, param, "the structural tag") if text else value
    if isinstance(tag, dict) and "structures" in tag:
        structures = _convert(tag["structures"], list[LegacyStructure], param, "/structures", text)
        triggers = _convert(tag.get("triggers") or [], list[str], param, "/triggers", text)
        return _legacy_tag(structures, triggers, param, text)
    return _Source(param, "invalid structural tag", StructuralTagSpec(tag), tag, text=text)


#: xgrammar's `json_object` mode: any JSON object. xg2 leaves an object that names no member
#: open even in strict mode, so this is the object half of xgrammar's builtin JSON grammar.
JSON_OBJECT_SCHEMA = {"type": "object"}


def _legacy_tag(structures: list[LegacyStructure], triggers: list[str], param: str,
                text: bool = False) -> _Source:
    """The legacy form, as xgrammar read it: free text in which a trigger opens one of the
    structures (begin, JSON per schema, end), any number of times. Pointers into the rewritten
    tag are mapped back to the legacy layout."""
    tags = [{"type": "tag", "begin": s.begin, "content": {"type": "json_schema", "json_schema": s.schema},
             "end": s.end} for s in structures]
    tag = {"type": "structural_tag",
           "format": {"type": "triggered_tags", "triggers": list(triggers), "tags": tags}}

    def remap(pointer: str) -> str | None:
        tokens = _tokens(pointer)
        if tokens[:2] == ["format", "triggers"]:
            return "".join("/" + _escape(t) for t in ["triggers", *tokens[2:]])
        if tokens[:2] != ["format", "tags"] or len(tokens) < 3:
            return None
        at = f"/structures/{tokens[2]}"
        if len(tokens) == 4 and tokens[3] in ("begin", "end"):
            return f"{at}/{tokens[3]}"
        if tokens[3:5] == ["content", "json_schema"]:
            return at + "/schema" + "".join("/" + _escape(t) for t in tokens[5:])
        return at

    return _Source(param, "invalid structural tag", StructuralTagSpec(tag), tag, remap, text)


def _response_format_source(rf: ResponseFormat | None, ws: bool = True) -> _Source | None:
    """`ws`: JSON's whitespace allowed between tokens (False with
    structured_outputs.disable_any_whitespace, which applies to every JSON grammar of a request)."""
    if isinstance(rf, ResponseFormatJSONSchema):
        js = rf.json_schema
        # OpenAI's strict=true is xgrammar's strict_mode (objects closed to the members they name);
        # an explicit strict=false asks for plain JSON Schema semantics (objects open unless they
        # say otherwise); omitted, xgrammar's and vLLM's default, strict_mode.
        return _Source("/response_format/json_schema/schema", "invalid JSON Schema",
                       JSONSchemaSpec(js.schema, strict_mode=js.strict is not False, any_whitespace=ws), js.schema)
    if isinstance(rf, ResponseFormatJSONObject):
        return _Source("/response_format", "invalid JSON object format",
                       JSONSchemaSpec(JSON_OBJECT_SCHEMA, any_whitespace=ws))
    if isinstance(rf, ResponseFormatStructuralTag):
        if (rf.format is None) == (rf.structures is None):
            raise RequestError("a structural_tag response_format needs either 'format' or 'structures'",
                               "/response_format/format", code="invalid_value")
        if rf.structures is not None:
            return _legacy_tag(rf.structures, rf.triggers or [], "/response_format")
        tag = {"type": "structural_tag", "format": rf.format}
        return _Source("/response_format", "invalid structural tag", StructuralTagSpec(tag), tag)
    return None


def _structured_outputs_sources(so: StructuredOutputs) -> list[_Source]:
    """vLLM's `structured_outputs`. `disable_additional_properties` needs nothing: xg2's
    strict_mode, on here as in vLLM's xgrammar backend, already closes objects."""
    if so.whitespace_pattern is not None:
        raise RequestError("a whitespace pattern is not supported (use disable_any_whitespace)",
                           "/structured_outputs/whitespace_pattern", code="unsupported_parameter")
    at = "/structured_outputs/"
    ws = not so.disable_any_whitespace
    out = []
    if so.json is not None:
        out.append(_schema_spec(so.json, at + "json", any_whitespace=ws))
    if so.regex is not None:
        out.append(_Source(at + "regex", "invalid regex", RegexSpec(so.regex)))
    if so.choice is not None:
        out.append(_choice_source(so.choice, at + "choice"))
    if so.grammar is not None:
        out.append(_Source(at + "grammar", "invalid grammar", EBNFSpec(so.grammar)))
    if so.json_object:
        out.append(_Source(at + "json_object", "invalid JSON object format",
                           JSONSchemaSpec(JSON_OBJECT_SCHEMA, any_whitespace=ws)))
    if so.structural_tag is not None:
        out.append(_tag_spec(so.structural_tag, at + "structural_tag"))
    return out


def _grammar_source(req: _GrammarFields) -> _Source | None:
    """The one grammar constraint a request gives outside its tools, or None; RequestError when
    it gives more than one, or an option xg2 cannot honour. Building a spec compiles nothing, so
    validation builds it too (and so refuses bad JSON text and empty choices early)."""
    if req.guided_whitespace_pattern is not None:
        raise RequestError("a whitespace pattern is not supported (xg2 allows JSON's whitespace, or none "
                           "with structured_outputs.disable_any_whitespace)", "/guided_whitespace_pattern",
                           code="unsupported_parameter")
    found: list[_Source] = []
    so = req.structured_outputs
    ws = not (so is not None and so.disable_any_whitespace)
    rf = _response_format_source(req.response_format, ws)
    if rf is not None:
        found.append(rf)
    if req.guided_json is not None:
        found.append(_schema_spec(req.guided_json, "/guided_json", any_whitespace=ws))
    if req.guided_regex is not None:
        found.append(_Source("/guided_regex", "invalid regex", RegexSpec(req.guided_regex)))
    if req.guided_grammar is not None:
        found.append(_Source("/guided_grammar", "invalid grammar", EBNFSpec(req.guided_grammar)))
    if req.guided_choice is not None:
        found.append(_choice_source(req.guided_choice, "/guided_choice"))
    if req.structural_tag is not None:
        found.append(_tag_spec(req.structural_tag, "/structural_tag"))
    if req.structured_outputs is not None:
        found.extend(_structured_outputs_sources(req.structured_outputs))
    if len(found) > 1:
        names = ", ".join(_field(src.param) for src in found)
        raise RequestError(f"only one output constraint may be given, got {names}", _field(found[1].param),
                           code="invalid_value")
    return found[0] if found else None


def _field(param: str) -> str:
    """The request field a grammar source is in (`/response_format/json_schema/schema` is in
    `/response_format`)."""
    return param if not param.startswith("/response_format") else "/response_format"


def _choice_source(choices: list[str], param: str) -> _Source:
    if not choices:
        raise RequestError("choice needs at least one string", param, code="invalid_value")
    return _Source(param, "invalid choice", EBNFSpec(choice_grammar(choices)))


def _tool_mode(req: ChatCompletionRequest) -> str:
    """`none` (no tools or tool_choice none), `auto`, `required` or `forced`."""
    choice = req.tool_choice
    if not req.tools or choice == "none":
        return "none"
    if choice is None or choice == "auto":
        return "auto"
    if choice == "required" or isinstance(choice, NamedToolChoice):
        return "required" if choice == "required" else "forced"
    assert isinstance(choice, AllowedToolsChoice)
    return choice.allowed_tools.mode


def _reasoning(req: ChatCompletionRequest, reasoning: ReasoningMode | None) -> ReasoningMode:
    """The caller's mode, else what the request's chat template is told (vLLM's
    ``chat_template_kwargs.enable_thinking``, as Qwen 3 clients send it), else none."""
    if reasoning is not None:
        return reasoning
    flag = (req.chat_template_kwargs or {}).get("enable_thinking")
    if isinstance(flag, bool):
        return "enabled" if flag else "disabled"
    return "disabled"


def _tools_spec(req: ChatCompletionRequest, tool_format: str, reasoning: ReasoningMode) -> ToolsSpec:
    # Only what shapes the output goes into the spec (name, parameters), so requests that differ
    # in descriptions share one compiled grammar.
    tools = []
    for t in req.tools or ():
        fn: dict[str, Any] = {"name": t.function.name}
        if t.function.parameters is not None:
            fn["parameters"] = t.function.parameters
        tools.append({"type": "function", "function": fn})
    choice = req.tool_choice
    plain_choice = "auto" if choice is None else msgspec.to_builtins(choice)
    # structured_outputs.disable_any_whitespace holds for the arguments as for a response format
    ws = not (req.structured_outputs is not None and req.structured_outputs.disable_any_whitespace)
    return ToolsSpec(tools, plain_choice, tool_format, req.parallel_tool_calls is not False, reasoning, ws)


def _chat_source(req: ChatCompletionRequest, tool_format: str,
                 reasoning: ReasoningMode | None) -> _Source | None:
    """Tools and an output format together: with tool_choice `auto` the model may answer in text
    or call, and xg2's tool formats constrain that text to be free, so a format for it cannot be
    combined (400); with `required` or a named tool the answer is tool calls only, so the format
    (which would govern content) has nothing to govern and the tools win, as in vLLM."""
    mode = _tool_mode(req)
    other = _grammar_source(req)
    if mode == "none":
        return other
    if other is not None and mode == "auto":
        raise RequestError(f"{_field(other.param)[1:]} cannot be combined with tools when tool_choice is "
                           "'auto'; use tool_choice 'none', 'required' or a named tool", _field(other.param),
                           code="unsupported_parameter")
    return _Source("/tools", "invalid tools", _tools_spec(req, tool_format, _reasoning(req, reasoning)))


def chat_session_spec(req: ChatCompletionRequest, *, tool_format: str = "qwen_3",
                      reasoning: ReasoningMode | None = None) -> GrammarSpec | None:
    """The grammar spec a chat request asks for, or None (unconstrained). `tool_format` is the
    served model's tool-call format (xg2.get_model_structural_tag's names); `reasoning` whether
    it opens with a reasoning block (None: from ``chat_template_kwargs.enable_thinking``, else
    disabled)."""
    src = _chat_source(req, tool_format, reasoning)
    return None if src is None else src.spec


def completion_session_spec(req: CompletionRequest) -> GrammarSpec | None:
    """The grammar spec a completion request asks for, or None (unconstrained)."""
    src = _grammar_source(req)
    return None if src is None else src.spec


# ------------------------------------------------------------------------------------------------
# Compile errors -> RequestError
# ------------------------------------------------------------------------------------------------

def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _tokens(pointer: str) -> list[str]:
    return [_unescape(t) for t in pointer.split("/")[1:]] if pointer else []


def _step(doc: Any, token: str) -> tuple[bool, Any]:
    if isinstance(doc, dict):
        return (token in doc, doc.get(token))
    if isinstance(doc, list) and token.isdigit() and int(token) < len(doc):
        return True, doc[int(token)]
    return False, None


def _resolves(doc: Any, pointer: str) -> bool:
    for token in _tokens(pointer):
        ok, doc = _step(doc, token)
        if not ok:
            return False
    return True


def _schema_in_tag(tag: Any, pointer: str) -> tuple[Any, str] | None:
    """Where a pointer into a structural tag enters an embedded JSON Schema: (the schema, the
    rest of the pointer within it), or None when it stops outside every schema."""
    tokens = _tokens(pointer)
    node = tag
    for i, token in enumerate(tokens):
        if token == "json_schema" and isinstance(node, dict) and node.get("type") in ("json_schema",
                                                                                     "qwen_xml_parameter"):
            return node.get("json_schema"), "".join("/" + _escape(t) for t in tokens[i + 1:])
        ok, node = _step(node, token)
        if not ok:
            return None
    return None


def _schemas_in(doc: Any, at: str = "") -> list[tuple[str, Any]]:
    """Every JSON Schema embedded in a structural tag: (pointer of its `json_schema` field, schema)."""
    out: list[tuple[str, Any]] = []
    stack = [(doc, at)]
    while stack:
        node, where = stack.pop()
        if isinstance(node, dict):
            if node.get("type") in ("json_schema", "qwen_xml_parameter") and "json_schema" in node:
                out.append((where + "/json_schema", node["json_schema"]))
                continue
            stack.extend((v, f"{where}/{_escape(k)}") for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, f"{where}/{i}") for i, v in enumerate(node))
    return sorted(out)


def _exc_pointer(exc: BaseException) -> str | None:
    return getattr(exc, "pointer", None)


def _describe(exc: BaseException) -> str:
    """The error's own message and, for grammar text, where in it (line and column)."""
    message = getattr(exc, "message", None) or str(exc)
    line, column = getattr(exc, "line", None), getattr(exc, "column", None)
    if line is not None:
        message += f" at line {line}, column {column}"
    return message


def _code(exc: BaseException, schema: bool = False) -> str:
    if isinstance(exc, GrammarLimitError):
        return "grammar_limit_exceeded"
    return "invalid_schema" if schema or isinstance(exc, SchemaError) else "invalid_grammar"


def _server_error(what: str, exc: BaseException) -> RequestError:
    return RequestError(f"{what}: {_describe(exc)}", None, status=500, code="server_error")


def _into_value(src: _Source, pointer: str, exc: BaseException) -> RequestError:
    """An error at `pointer` within the source's document, as a body pointer when the field holds
    the document as an object, else at the field with the inner pointer in the message."""
    message = f"{src.kind}: {_describe(exc)}"
    doc = src.value
    if isinstance(src.spec, StructuralTagSpec) and pointer and not _resolves(doc, pointer):
        # a limit inside a schema embedded in the tag points into that schema, not into the tag
        for where, schema in _schemas_in(doc):
            if _resolves(schema, pointer):
                pointer = where + pointer
                break
    mapped = pointer if src.remap is None else src.remap(pointer)
    if doc is None or src.text or mapped is None:
        where = mapped if mapped is not None else pointer
        return RequestError(f"{message} (at {where})" if where else message, src.param, code=_code(exc))
    return RequestError(message, src.param + mapped, code=_code(exc))


def _tools_error(src: _Source, exc: BaseException) -> RequestError:
    spec = src.spec
    assert isinstance(spec, ToolsSpec)
    pointer = _exc_pointer(exc)
    if isinstance(exc, ModelFormatError):
        # xg2 points into its (tools, tool_choice) arguments, laid out as the request's
        if pointer and pointer.startswith(("/tools", "/tool_choice")):
            return RequestError(f"invalid tools: {exc.message}", pointer, code="invalid_value")
        return _server_error("the model's tool-call format could not be built", exc)
    if pointer is None:
        return RequestError(f"invalid tools: {_describe(exc)}", "/tools", code=_code(exc))
    tools = [t.get("function", {}) for t in spec.tools]

    def in_tool(schema: Any, rest: str) -> RequestError | None:
        for i, fn in enumerate(tools):
            if fn.get("parameters", True) == schema:
                return RequestError(f"invalid parameters schema of tool {fn.get('name')!r}: {_describe(exc)}",
                                    f"/tools/{i}/function/parameters{rest}", code=_code(exc, schema=True))
        return None

    if pointer.startswith("/format"):
        # a pointer into the structural tag xg2 built from the tools: find the schema it enters
        try:
            tag = msgspec.to_builtins(get_model_structural_tag(
                spec.model, spec.tools, spec.tool_choice, reasoning=spec.reasoning,
                parallel_tool_calls=spec.parallel_tool_calls, any_whitespace=spec.any_whitespace))
        except XG2Error:
            tag = None
        hit = _schema_in_tag(tag, pointer) if tag is not None else None
        if hit is not None:
            found = in_tool(*hit)
            if found is not None:
                return found
        # outside every tool's schema: the format's own markers, which the server chose
        return _server_error("the model's tool-call format does not fit its vocabulary", exc)
    for i, fn in enumerate(tools):     # a limit inside a tool's schema points into that schema
        if _resolves(fn.get("parameters", True), pointer):
            return RequestError(f"invalid parameters schema of tool {fn.get('name')!r}: {_describe(exc)}",
                                f"/tools/{i}/function/parameters{pointer}", code=_code(exc, schema=True))
    return RequestError(f"invalid tools: {_describe(exc)} (at {pointer or '/'})", "/tools", code=_code(exc))


def compile_error_to_request_error(exc: BaseException, req: ChatCompletionRequest | CompletionRequest, *,
                                   tool_format: str = "qwen_3",
                                   reasoning: ReasoningMode | None = None) -> RequestError:
    """The RequestError for an error raised while opening or compiling the request's grammar
    (`chat_session_spec` / `completion_session_spec` with the same arguments), its `param`
    re-rooted at the body field the grammar came from. Errors the request cannot have caused
    (the tool-call format's own markers missing from the vocabulary) are 500s."""
    if isinstance(exc, RequestError):
        return exc
    if isinstance(exc, QuotaError):
        return RequestError(str(exc), None, status=429, code="too_many_sessions")
    if not isinstance(exc, XG2Error):
        return RequestError(f"internal error while compiling the grammar ({type(exc).__name__})", None,
                            status=500, code="server_error")
    try:
        if isinstance(req, ChatCompletionRequest):
            src = _chat_source(req, tool_format, reasoning)
        else:
            src = _grammar_source(req)
    except RequestError as e:
        return e
    if src is None or src.spec is None:
        return _server_error("grammar error on a request without a grammar", exc)
    if isinstance(exc, SpecError):
        tokens = _tokens(exc.pointer)
        if tokens[:1] != ["grammar"]:
            return _server_error("the session spec was refused", exc)
        # /grammar/<field of the spec>/rest: rest lies within the source's value
        rest = "".join("/" + _escape(t) for t in tokens[2:])
        if isinstance(src.spec, ToolsSpec):
            if tokens[1:2] in (["tools"], ["tool_choice"]):     # laid out as in the request
                return RequestError(f"invalid tools: {exc.message}",
                                    "".join("/" + _escape(t) for t in tokens[1:]), code="invalid_value")
            return _server_error("the tools' session spec was refused", exc)
        return _into_value(src, rest, exc)
    if isinstance(src.spec, ToolsSpec):
        return _tools_error(src, exc)
    # schemas and structural tags carry a pointer; EBNF and regex errors a line and column, which
    # _describe puts in the message
    return _into_value(src, _exc_pointer(exc) or "", exc)
