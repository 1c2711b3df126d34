"""OpenAI's Responses API (`POST /v1/responses`), as a translation over the chat path.

Why a translation and not a path of its own: the chat path (serve.replica.Replica.chat) is where
every guarantee a request gets lives: the tenant's limits, the grammar cache and its content keys,
the tool-call format and its parsing, the prompt rendering, how a stream ends and how a client
that leaves is cleaned up after. A Responses request becomes the chat request that means the same
(`decode_responses_request`), the replica answers it as it answers any chat request, and the chat
answer, or its server-sent events, is written back as a Response object, or as the Responses
events OpenAI sends (`respond`). The ingress computes a Responses request's affinity from the same
chat request, so a request with tools goes where those tools are, as a chat request does.

A refusal names the Responses field at fault, as a JSON pointer into the body: the chat path's
refusals name chat fields, and `remap_error` re-roots them at the field they came from
(`/tools/3/function/parameters/x` -> `/tools/3/parameters/x`, `/response_format/json_schema/schema`
-> `/text/format/schema`, a chat message -> the input item it was made of).

Nothing is stored. `store` is accepted, true (OpenAI's default, which SDKs send or imply) or false,
and every answer says `store: false`; a conversation goes whole in `input`, with a previous
response's output items fed back as they came and `function_call_output` items carrying the
tools' results. What would need stored state (`previous_response_id`, `conversation`, prompt
templates, `background`) is refused, and so is whatever this server cannot honour: tools other
than functions, non-text input, reasoning, logprobs, truncation "auto", moderation. Unknown fields
are ignored, as on the chat path. Two extensions are the chat path's: `seed` (reproducible
sampling; OpenAI's Responses API has none) and vLLM's `structured_outputs` (a regex, choice,
grammar or schema for the text instead of `text.format`, and `disable_any_whitespace`, which also
holds for the arguments of function calls).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from . import protocol as p

_log = logging.getLogger("xg2.serve")

# ------------------------------------------------------------------------------------------------
# Requests
# ------------------------------------------------------------------------------------------------

ItemStatus = Literal["in_progress", "completed", "incomplete"]


class InputTextContent(msgspec.Struct, tag_field="type", tag="input_text"):
    text: str


class OutputTextContent(msgspec.Struct, tag_field="type", tag="output_text", kw_only=True):
    """Text the assistant wrote: a part of an answer's message, and of an input message when a
    previous answer is fed back."""

    text: str
    annotations: list[Any] = msgspec.field(default_factory=list)
    logprobs: list[Any] = msgspec.field(default_factory=list)


class RefusalContent(msgspec.Struct, tag_field="type", tag="refusal"):
    refusal: str


InputContent = InputTextContent | OutputTextContent | RefusalContent


class InputMessage(msgspec.Struct, tag_field="type", tag="message", kw_only=True):
    """A message item. OpenAI's short form without `type` is read as one (see
    `_refuse_unsupported`)."""

    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputContent]


class FunctionCallItem(msgspec.Struct, tag_field="type", tag="function_call", kw_only=True, omit_defaults=True):
    """A call the model made: an output item, and an input item when fed back."""

    id: str | None = None
    call_id: str
    name: str
    arguments: str
    status: ItemStatus | None = None


class FunctionCallOutputItem(msgspec.Struct, tag_field="type", tag="function_call_output", kw_only=True):
    """A tool's result, fed back for the call `call_id` names."""

    call_id: str
    output: str | list[InputTextContent]
    id: str | None = None
    status: ItemStatus | None = None


InputItem = InputMessage | FunctionCallItem | FunctionCallOutputItem


class ResponsesFunctionTool(msgspec.Struct, tag_field="type", tag="function", kw_only=True, omit_defaults=True):
    """A function tool in the Responses shape (flat: no `function` wrapper)."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | bool | None = None
    strict: bool | None = None


class FunctionToolChoice(msgspec.Struct, tag_field="type", tag="function"):
    name: str


class AllowedToolsToolChoice(msgspec.Struct, tag_field="type", tag="allowed_tools", kw_only=True):
    mode: Literal["auto", "required"]
    tools: list[FunctionToolChoice]


ResponsesToolChoice = Literal["none", "auto", "required"] | FunctionToolChoice | AllowedToolsToolChoice


class TextFormatText(msgspec.Struct, tag_field="type", tag="text"):
    pass


class TextFormatJSONObject(msgspec.Struct, tag_field="type", tag="json_object"):
    pass


class TextFormatJSONSchema(msgspec.Struct, tag_field="type", tag="json_schema", kw_only=True, omit_defaults=True):
    name: str
    schema: dict[str, Any] | bool
    description: str | None = None
    strict: bool | None = None


TextFormat = TextFormatText | TextFormatJSONObject | TextFormatJSONSchema


class TextConfig(msgspec.Struct, kw_only=True):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningConfig(msgspec.Struct, kw_only=True):
    effort: str | None = None
    summary: str | None = None


class ResponsesStreamOptions(msgspec.Struct, kw_only=True):
    include_obfuscation: bool | None = None


class ResponseCreateRequest(msgspec.Struct, kw_only=True):
    """A `/v1/responses` body."""

    input: str | list[InputItem]
    model: str | None = None
    instructions: str | None = None
    tools: list[ResponsesFunctionTool] | None = None
    tool_choice: ResponsesToolChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stream: bool | None = False
    stream_options: ResponsesStreamOptions | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    service_tier: str | None = None
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    top_logprobs: int | None = None
    reasoning: ReasoningConfig | None = None
    # refused when given: they need stored state, or ask for what this server does not do
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    background: bool | None = None
    context_management: list[Any] | None = None
    moderation: dict[str, Any] | None = None
    # vLLM's extension, as on the chat path: a grammar for the text, and JSON without whitespace
    structured_outputs: p.StructuredOutputs | None = None

    @property
    def text_format(self) -> TextFormat | None:
        return None if self.text is None else self.text.format


# ------------------------------------------------------------------------------------------------
# Responses
# ------------------------------------------------------------------------------------------------

class OutputMessage(msgspec.Struct, tag_field="type", tag="message", kw_only=True):
    id: str
    status: ItemStatus
    role: Literal["assistant"] = "assistant"
    content: list[OutputTextContent]


OutputItem = OutputMessage | FunctionCallItem


class InputTokensDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(msgspec.Struct, kw_only=True):
    reasoning_tokens: int = 0


class ResponseUsage(msgspec.Struct, kw_only=True):
    input_tokens: int
    input_tokens_details: InputTokensDetails = msgspec.field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = msgspec.field(default_factory=OutputTokensDetails)
    total_tokens: int


class IncompleteDetails(msgspec.Struct):
    reason: Literal["max_output_tokens"]


class ResponseError(msgspec.Struct):
    code: str | None
    message: str


class Response(msgspec.Struct, kw_only=True):
    """A Response object; the request's settings are said back, as OpenAI does (`output_text` is
    the SDKs' own convenience, not on the wire)."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    completed_at: int | None = None
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    model: str
    output: list[OutputItem] = msgspec.field(default_factory=list)
    usage: ResponseUsage | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    parallel_tool_calls: bool = True
    previous_response_id: None = None
    reasoning: ReasoningConfig = msgspec.field(default_factory=ReasoningConfig)
    service_tier: str = "default"
    store: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_logprobs: int = 0
    text: TextConfig = msgspec.field(default_factory=TextConfig)
    tool_choice: ResponsesToolChoice = "auto"
    tools: list[ResponsesFunctionTool] = msgspec.field(default_factory=list)
    truncation: Literal["auto", "disabled"] = "disabled"
    background: bool = False
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None


class ResponseLifecycleEvent(msgspec.Struct, kw_only=True):
    """response.created, .in_progress, .completed, .incomplete, .failed."""

    type: str
    sequence_number: int
    response: Response


class OutputItemEvent(msgspec.Struct, kw_only=True):
    """response.output_item.added, .done."""

    type: str
    sequence_number: int
    output_index: int
    item: OutputItem


class ContentPartEvent(msgspec.Struct, kw_only=True):
    """response.content_part.added, .done."""

    type: str
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    part: OutputTextContent


class OutputTextDeltaEvent(msgspec.Struct, kw_only=True):
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[Any] = msgspec.field(default_factory=list)


class OutputTextDoneEvent(msgspec.Struct, kw_only=True):
    type: Literal["response.output_text.done"] = "response.output_text.done"
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[Any] = msgspec.field(default_factory=list)


class ArgumentsDeltaEvent(msgspec.Struct, kw_only=True):
    type: Literal["response.function_call_arguments.delta"] = "response.function_call_arguments.delta"
    sequence_number: int
    item_id: str
    output_index: int
    delta: str


class ArgumentsDoneEvent(msgspec.Struct, kw_only=True):
    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    sequence_number: int
    item_id: str
    output_index: int
    name: str
    arguments: str


class ErrorEvent(msgspec.Struct, kw_only=True):
    type: Literal["error"] = "error"
    sequence_number: int
    code: str | None
    message: str
    param: str | None


def _new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(24)


def sse(event: Any) -> bytes:
    """One server-sent event as OpenAI writes the Responses events: named by its type."""
    return b"event: " + event.type.encode() + b"\ndata: " + p.encode(event) + b"\n\n"


# ------------------------------------------------------------------------------------------------
# Decoding, validation and the chat request
# ------------------------------------------------------------------------------------------------

_ITEM_TYPES = ("message", "function_call", "function_call_output")
_TEXT_PARTS = ("input_text", "output_text", "refusal")
#: `include` values that ask for nothing this server could give (the items they name are never
#: produced: no built-in tools, no reasoning, no image input), so they are accepted.
MOOT_INCLUDES = frozenset({
    "reasoning.encrypted_content", "web_search_call.action.sources", "web_search_call.results",
    "code_interpreter_call.outputs", "computer_call_output.output.image_url", "file_search_call.results",
    "message.input_image.image_url"})
_NOT_STORED = "this server stores no responses: send the whole conversation in `input`"


def _unsupported(message: str, param: str) -> p.RequestError:
    return p.RequestError(message, param, code="unsupported_parameter")


def _refuse_unsupported(doc: Any) -> None:
    """Refuses, with a message saying why, the kinds of items, parts and tools OpenAI has and this
    server does not (the decoder would only say that a tag is not among its own), and gives a
    message item written without `type` (OpenAI's short form) its type."""
    if not isinstance(doc, dict):
        return
    items = doc.get("input")
    for i, item in enumerate(items if isinstance(items, list) else ()):
        if not isinstance(item, dict):
            continue
        if "type" not in item and "role" in item:
            item["type"] = "message"
        kind = item.get("type")
        if isinstance(kind, str) and kind not in _ITEM_TYPES:
            why = {"item_reference": f"items are not referred to by id: {_NOT_STORED}",
                   "reasoning": "this model does not reason, and writes no reasoning items"}.get(
                kind, "this server takes message, function_call and function_call_output items")
            raise _unsupported(f"input items of type {kind!r} are not supported: {why}", f"/input/{i}/type")
        for field in ("content", "output"):
            parts = item.get(field)
            for j, part in enumerate(parts if isinstance(parts, list) else ()):
                part_kind = part.get("type") if isinstance(part, dict) else None
                if isinstance(part_kind, str) and part_kind not in _TEXT_PARTS:
                    raise _unsupported(f"content parts of type {part_kind!r} are not supported: this model reads "
                                       "text only (input_text, output_text)", f"/input/{i}/{field}/{j}/type")
    tools = doc.get("tools")
    for i, tool in enumerate(tools if isinstance(tools, list) else ()):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if isinstance(kind, str) and kind != "function":
            raise _unsupported(f"tools of type {kind!r} are not supported: only function tools are",
                               f"/tools/{i}/type")
    choice = doc.get("tool_choice")
    kind = choice.get("type") if isinstance(choice, dict) else None
    if isinstance(kind, str) and kind not in ("function", "allowed_tools"):
        raise _unsupported(f"a tool_choice of type {kind!r} is not supported: only function tools are",
                           "/tool_choice/type")


def _decode_json(body: bytes) -> Any:
    try:
        doc = msgspec.json.decode(body)
    except msgspec.DecodeError as e:
        raise p.RequestError(f"the body is not valid JSON: {e}", None, code="invalid_json") from None
    except RecursionError:
        raise p.RequestError("the body nests too deeply to decode (JSON nested about a thousand levels or "
                             "more)", None, code="invalid_json") from None
    if p._LONG_DIGITS.search(body):     # (no integer past 64 bits without 19 digits in a row)
        where = p._wide_int(doc, "")
        if where is not None:
            raise p.RequestError("integer out of range: integers must fit in 64 bits (from -2**63 to 2**64 - 1)",
                                 where or None, code="invalid_value")
    return doc


def validate_responses_request(req: ResponseCreateRequest, *,
                               max_tokens_limit: int = p.DEFAULT_MAX_TOKENS_LIMIT) -> None:
    """The Responses fields the chat request cannot check, each refusal with its pointer (the rest,
    sampling, tools and the grammar, is checked on the chat request, see decode_responses_request)."""
    if req.previous_response_id is not None:
        raise _unsupported(f"previous_response_id is not supported: {_NOT_STORED}", "/previous_response_id")
    if req.conversation is not None:
        raise _unsupported(f"conversation is not supported: {_NOT_STORED}", "/conversation")
    if req.prompt is not None:
        raise _unsupported("prompt templates are not supported (none are stored here): send instructions and "
                           "input", "/prompt")
    if req.background:
        raise _unsupported("background responses are not supported (nothing is stored to poll)", "/background")
    if req.context_management:
        raise _unsupported("context_management is not supported: nothing is compacted", "/context_management")
    if req.moderation is not None:
        raise _unsupported("moderation is not supported", "/moderation")
    if req.reasoning is not None:
        if req.reasoning.effort not in (None, "none"):
            raise _unsupported("this model does not reason: reasoning.effort must be 'none' or left out",
                               "/reasoning/effort")
        if req.reasoning.summary is not None:
            raise _unsupported("this model does not reason, so there is no reasoning to summarize",
                               "/reasoning/summary")
    if req.top_logprobs:
        raise _unsupported("logprobs are not supported", "/top_logprobs")
    for i, value in enumerate(req.include or ()):
        if value not in MOOT_INCLUDES:
            raise _unsupported(f"include {value!r} is not supported", f"/include/{i}")
    if req.truncation == "auto":
        raise _unsupported("truncation 'auto' is not supported: an input longer than the model's context is "
                           "refused, never cut", "/truncation")
    if req.stream_options is not None and not req.stream:
        raise p.RequestError("stream_options is only allowed when stream is true", "/stream_options",
                             code="invalid_value")
    p._check_max_tokens(req.max_output_tokens, "/max_output_tokens", max_tokens_limit)
    if req.max_tool_calls is not None and req.max_tool_calls < 0:
        raise p.RequestError("max_tool_calls must be at least 0", "/max_tool_calls", code="invalid_value")
    if req.metadata is not None:
        if len(req.metadata) > 16:
            raise p.RequestError(f"metadata holds at most 16 pairs, got {len(req.metadata)}", "/metadata",
                                 code="invalid_value")
        for k, v in req.metadata.items():
            if len(k) > 64 or len(v) > 512:
                raise p.RequestError("metadata keys are at most 64 characters and values at most 512",
                                     f"/metadata/{p._escape(k)}", code="invalid_value")
    fmt = req.text_format
    if isinstance(fmt, TextFormatJSONSchema) and not p.TOOL_NAME_RE.match(fmt.name):
        raise p.RequestError(f"text.format.name {fmt.name!r} must be 1 to 64 letters, digits, '_' or '-'",
                             "/text/format/name", code="invalid_value")


def _chat_content(content: str | list[Any]) -> str | list[p.TextPart]:
    if isinstance(content, str):
        return content
    return [p.TextPart(part.refusal if isinstance(part, RefusalContent) else part.text) for part in content]


def _chat_messages(req: ResponseCreateRequest) -> tuple[list[Any], list[str]]:
    """The chat messages `instructions` and `input` make, and for each the Responses field it came
    from. A run of function_call items (with the assistant message before it, if any) is one
    assistant message with its tool calls, as a chat conversation has it."""
    messages: list[Any] = []
    origins: list[str] = []
    if req.instructions is not None:
        messages.append(p.SystemMessage(content=req.instructions))
        origins.append("/instructions")
    if isinstance(req.input, str):
        messages.append(p.UserMessage(content=req.input))
        origins.append("/input")
        return messages, origins
    calls: set[str] = set()
    roles = {"user": p.UserMessage, "system": p.SystemMessage, "developer": p.DeveloperMessage,
             "assistant": p.AssistantMessage}
    for i, item in enumerate(req.input):
        if isinstance(item, InputMessage):
            message = roles[item.role](content=_chat_content(item.content))
        elif isinstance(item, FunctionCallItem):
            calls.add(item.call_id)
            call = p.ToolCall(id=item.call_id, function=p.FunctionCall(name=item.name, arguments=item.arguments))
            if messages and isinstance(messages[-1], p.AssistantMessage):
                messages[-1].tool_calls = [*(messages[-1].tool_calls or ()), call]
                continue
            message = p.AssistantMessage(tool_calls=[call])
        else:
            if item.call_id not in calls:
                raise p.RequestError(f"no function_call item before this one has call_id {item.call_id!r}",
                                     f"/input/{i}/call_id", code="invalid_value")
            message = p.ToolMessage(content=_chat_content(item.output), tool_call_id=item.call_id)
        messages.append(message)
        origins.append(f"/input/{i}")
    if not messages:
        raise p.RequestError("input must hold at least one item (or give instructions)", "/input",
                             code="invalid_value")
    return messages, origins


def _chat_tool_choice(req: ResponseCreateRequest) -> Any:
    choice = req.tool_choice
    if isinstance(choice, FunctionToolChoice):
        return p.NamedToolChoice(function=p.ToolChoiceFunction(choice.name))
    if isinstance(choice, AllowedToolsToolChoice):
        return p.AllowedToolsChoice(allowed_tools=p.AllowedTools(
            tools=[p.NamedToolChoice(function=p.ToolChoiceFunction(t.name)) for t in choice.tools], mode=choice.mode))
    if choice == "auto" and not req.tools:
        return None     # (OpenAI takes "auto" without tools; the chat path wants tools for any choice)
    return choice


def _chat_response_format(fmt: TextFormat | None) -> Any:
    if isinstance(fmt, TextFormatJSONSchema):
        return p.ResponseFormatJSONSchema(p.JSONSchemaFormat(schema=fmt.schema, name=fmt.name,
                                                             description=fmt.description, strict=fmt.strict))
    if isinstance(fmt, TextFormatJSONObject):
        return p.ResponseFormatJSONObject()
    return None


def to_chat_request(req: ResponseCreateRequest) -> tuple[p.ChatCompletionRequest, list[str]]:
    """The chat request that asks for what `req` asks for, and the origins of its messages (see
    remap_error). A stream asks for usage, which the last Responses event carries."""
    messages, origins = _chat_messages(req)
    tools = [p.FunctionTool(p.FunctionDefinition(name=t.name, description=t.description, parameters=t.parameters,
                                                 strict=t.strict)) for t in req.tools or ()]
    chat = p.ChatCompletionRequest(
        messages=messages, model=req.model, temperature=req.temperature, top_p=req.top_p, seed=req.seed,
        stream=bool(req.stream), stream_options=p.StreamOptions(include_usage=True) if req.stream else None,
        max_completion_tokens=req.max_output_tokens, tools=tools or None, tool_choice=_chat_tool_choice(req),
        parallel_tool_calls=req.parallel_tool_calls, response_format=_chat_response_format(req.text_format),
        structured_outputs=req.structured_outputs, user=req.user)
    return chat, origins


@dataclass
class Translation:
    """A Responses request, the chat request it became, and where each chat message came from."""

    request: ResponseCreateRequest
    chat: p.ChatCompletionRequest
    origins: list[str]

    def chat_body(self) -> bytes:
        return p.encode({k: v for k, v in msgspec.to_builtins(self.chat).items() if v is not None})

    def response(self, response_id: str, created_at: int, model: str, **fields: Any) -> Response:
        """The Response object, with the request's settings said back."""
        req = self.request
        fmt = req.text_format or TextFormatText()
        return Response(
            id=response_id, created_at=created_at, model=model, instructions=req.instructions,
            max_output_tokens=req.max_output_tokens, max_tool_calls=req.max_tool_calls,
            parallel_tool_calls=req.parallel_tool_calls is not False,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            text=TextConfig(format=fmt, verbosity=(req.text.verbosity if req.text else None) or "medium"),
            tool_choice="auto" if req.tool_choice is None else req.tool_choice, tools=list(req.tools or ()),
            metadata=dict(req.metadata or {}), user=req.user, safety_identifier=req.safety_identifier,
            prompt_cache_key=req.prompt_cache_key, **fields)


_DECODER = msgspec.json.Decoder()


def decode_responses_request(body: bytes, *, max_tokens_limit: int = p.DEFAULT_MAX_TOKENS_LIMIT) -> Translation:
    """A Responses request from its body, validated (also as the chat request it becomes, which
    resolves its grammar without compiling it), with that chat request; RequestError otherwise."""
    doc = _decode_json(body)
    _refuse_unsupported(doc)
    try:
        req = msgspec.convert(doc, ResponseCreateRequest)
    except msgspec.ValidationError as e:
        raise p._validation_error(e) from None
    except RecursionError:
        raise p.RequestError("the body nests too deeply to decode", None, code="invalid_json") from None
    validate_responses_request(req, max_tokens_limit=max_tokens_limit)
    chat, origins = to_chat_request(req)
    try:
        p.validate_chat_request(chat, max_tokens_limit=max_tokens_limit)
    except p.RequestError as e:
        raise remap_error(e, origins) from None
    return Translation(req, chat, origins)


# ------------------------------------------------------------------------------------------------
# Chat refusals -> Responses fields
# ------------------------------------------------------------------------------------------------

#: The chat fields whose name a refusal's message may say, and their Responses names.
_FIELD_NAMES = {"response_format": "text.format", "max_completion_tokens": "max_output_tokens",
                "max_tokens": "max_output_tokens"}


def _remap_param(param: str, origins: list[str]) -> str:
    tokens = param.split("/")[1:]
    head, rest = tokens[0], tokens[1:]
    if head == "messages":
        if rest and rest[0].isdigit() and int(rest[0]) < len(origins):
            return origins[int(rest[0])]
        return "/input"
    if head == "tools" and rest and rest[0].isdigit():
        inner = rest[2:] if rest[1:2] == ["function"] else rest[1:]
        return "/".join(["", "tools", rest[0], *inner])
    if head == "tool_choice":
        if rest[:2] == ["function", "name"]:
            return "/tool_choice/name"
        if rest[:2] == ["allowed_tools", "tools"] and len(rest) > 2:
            return f"/tool_choice/tools/{rest[2]}/name" if rest[3:4] == ["function"] else f"/tool_choice/tools/{rest[2]}"
        return "/tool_choice"
    if head == "response_format":
        if rest[:2] == ["json_schema", "schema"]:
            return "/".join(["", "text", "format", "schema", *rest[2:]])
        if rest[:1] == ["json_schema"] and len(rest) > 1:
            return "/".join(["", "text", "format", *rest[1:]])
        return "/text/format"
    if head in ("max_tokens", "max_completion_tokens"):
        return "/max_output_tokens"
    return param


def remap_error(e: p.RequestError, origins: list[str]) -> p.RequestError:
    """A chat path refusal re-rooted at the Responses field it came from (see the module note)."""
    if e.param is None or not e.param.startswith("/"):
        return e
    param, message = _remap_param(e.param, origins), e.message
    if "/schema" not in param and "/parameters" not in param:     # the message may name chat fields
        for chat_name, name in _FIELD_NAMES.items():
            message = message.replace(chat_name, name)
    return p.RequestError(message, param, status=e.status, code=e.code, type=e.type)


# ------------------------------------------------------------------------------------------------
# Chat answers -> Responses answers
# ------------------------------------------------------------------------------------------------

def _usage(usage: dict[str, Any] | None) -> ResponseUsage | None:
    if not usage:
        return None
    i, o = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    return ResponseUsage(input_tokens=i, output_tokens=o, total_tokens=i + o)


def _ending(finish: str | None) -> dict[str, Any]:
    """The status fields of an answer that ended with the chat finish reason `finish`."""
    if finish == "length":
        return {"status": "incomplete", "incomplete_details": IncompleteDetails("max_output_tokens")}
    return {"status": "completed"}


def response_from_chat(t: Translation, chat: dict[str, Any], response_id: str, created_at: int) -> Response:
    """The Response object of a (whole) chat completion: its text as a message item, its calls as
    function_call items, after it; the item being written when the answer was cut is incomplete."""
    choice = chat["choices"][0]
    message, finish = choice.get("message") or {}, choice.get("finish_reason")
    ending = _ending(finish)
    calls = message.get("tool_calls") or []
    output: list[OutputItem] = []
    if message.get("content") or not calls:
        output.append(OutputMessage(id=_new_id("msg_"), status="completed",
                                    content=[OutputTextContent(text=message.get("content") or "")]))
    for call in calls:
        fn = call.get("function") or {}
        output.append(FunctionCallItem(id=_new_id("fc_"), call_id=call.get("id") or _new_id("call_"),
                                       name=fn.get("name", ""), arguments=fn.get("arguments", ""), status="completed"))
    if ending["status"] == "incomplete":
        output[-1].status = "incomplete"
    return t.response(response_id, created_at, chat.get("model", ""), output=output,
                      usage=_usage(chat.get("usage")), completed_at=int(time.time()), **ending)


class _StreamWriter:
    """The Responses events of a chat stream's chunks: output items opened as their first text or
    call arrives, closed when the next begins or the stream ends, every event numbered."""

    def __init__(self, t: Translation, response_id: str, created_at: int, model: str):
        self.t, self.response_id, self.created_at, self.model = t, response_id, created_at, model
        self.seq = -1
        self.output: list[OutputItem] = []
        self.open: OutputMessage | FunctionCallItem | None = None
        self.call_index: int | None = None
        self.text: list[str] = []

    def _n(self) -> int:
        self.seq += 1
        return self.seq

    def lifecycle(self, kind: str, **fields: Any) -> bytes:
        response = self.t.response(self.response_id, self.created_at, self.model, output=list(self.output), **fields)
        return sse(ResponseLifecycleEvent(type=f"response.{kind}", sequence_number=self._n(), response=response))

    def _item(self, kind: str, item: OutputItem) -> bytes:
        return sse(OutputItemEvent(type=f"response.output_item.{kind}", sequence_number=self._n(),
                                   output_index=len(self.output), item=item))

    def content(self, piece: str) -> list[bytes]:
        out = []
        if not isinstance(self.open, OutputMessage):
            out += self.close("completed")
            self.open, self.text = OutputMessage(id=_new_id("msg_"), status="in_progress", content=[]), []
            out.append(self._item("added", self.open))
            out.append(sse(ContentPartEvent(type="response.content_part.added", sequence_number=self._n(),
                                            item_id=self.open.id, output_index=len(self.output), content_index=0,
                                            part=OutputTextContent(text=""))))
        if piece:
            self.text.append(piece)
            out.append(sse(OutputTextDeltaEvent(sequence_number=self._n(), item_id=self.open.id,
                                                output_index=len(self.output), content_index=0, delta=piece)))
        return out

    def call(self, delta: dict[str, Any]) -> list[bytes]:
        out = []
        fn = delta.get("function") or {}
        index = delta.get("index", 0)
        if not isinstance(self.open, FunctionCallItem) or index != self.call_index:
            out += self.close("completed")
            self.call_index = index
            self.open = FunctionCallItem(id=_new_id("fc_"), call_id=delta.get("id") or _new_id("call_"),
                                         name=fn.get("name") or "", arguments="", status="in_progress")
            out.append(self._item("added", self.open))
        args = fn.get("arguments")
        if args:
            self.open.arguments += args
            out.append(sse(ArgumentsDeltaEvent(sequence_number=self._n(), item_id=self.open.id,
                                               output_index=len(self.output), delta=args)))
        return out

    def close(self, status: ItemStatus) -> list[bytes]:
        """The events that end the open item, if any."""
        item, self.open = self.open, None
        if item is None:
            return []
        at = len(self.output)
        if isinstance(item, OutputMessage):
            text = "".join(self.text)
            part = OutputTextContent(text=text)
            out = [sse(OutputTextDoneEvent(sequence_number=self._n(), item_id=item.id, output_index=at,
                                           content_index=0, text=text)),
                   sse(ContentPartEvent(type="response.content_part.done", sequence_number=self._n(),
                                        item_id=item.id, output_index=at, content_index=0, part=part))]
            done: OutputItem = OutputMessage(id=item.id, status=status, content=[part])
        else:
            out = [sse(ArgumentsDoneEvent(sequence_number=self._n(), item_id=item.id or "", output_index=at,
                                          name=item.name, arguments=item.arguments))]
            done = FunctionCallItem(id=item.id, call_id=item.call_id, name=item.name, arguments=item.arguments,
                                    status=status)
        out.append(self._item("done", done))
        self.output.append(done)
        return out

    def finish(self, finish: str | None, usage: dict[str, Any] | None) -> list[bytes]:
        ending = _ending(finish)
        out = []
        if self.open is None and not self.output:       # an empty answer is an empty message, as when whole
            out += self.content("")
        out += self.close("incomplete" if ending["status"] == "incomplete" else "completed")
        kind = "incomplete" if ending["status"] == "incomplete" else "completed"
        out.append(self.lifecycle(kind, usage=_usage(usage), completed_at=int(time.time()), **ending))
        return out

    def failed(self, e: p.RequestError) -> list[bytes]:
        error = sse(ErrorEvent(sequence_number=self._n(), code=e.code, message=e.message, param=e.param))
        return [error, self.lifecycle("failed", status="failed", error=ResponseError(e.code, e.message))]


async def _events(t: Translation, chunks: AsyncIterator[bytes], response_id: str, created_at: int,
                  model: str) -> AsyncIterator[bytes]:
    """The Responses events of a chat stream. A failure after the first event is an `error` event,
    then `response.failed`, as OpenAI ends such a stream; the chat stream is closed however this
    one ends (its request released at once, not when collected)."""
    w = _StreamWriter(t, response_id, created_at, model)
    try:
        yield w.lifecycle("created", status="in_progress")
        yield w.lifecycle("in_progress", status="in_progress")
        finish, usage = None, None
        async for raw in chunks:
            if not raw.startswith(b"data: "):
                continue
            data = raw[6:].strip()
            if data == b"[DONE]":
                break
            chunk = _DECODER.decode(data)
            if chunk.get("error"):      # (the chat path raises instead; an event would say the same)
                err = chunk["error"]
                raise p.RequestError(err.get("message", "error"), err.get("param"), status=500, code=err.get("code"))
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    for event in w.content(delta["content"]):
                        yield event
                for call in delta.get("tool_calls") or ():
                    for event in w.call(call):
                        yield event
                finish = choice.get("finish_reason") or finish
        for event in w.finish(finish, usage):
            yield event
    except p.RequestError as e:
        for event in w.failed(remap_error(e, t.origins)):
            yield event
    except Exception as e:      # noqa: BLE001 - the client gets error events, not a cut stream
        _log.exception("a responses stream failed")
        for event in w.failed(p.RequestError(f"internal error: {type(e).__name__}", status=500, code="server_error")):
            yield event
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()


ChatCall = Callable[[str, bytes], Awaitable["bytes | AsyncIterator[bytes]"]]


async def respond(chat: ChatCall, tenant: str, body: bytes, *, model_name: str,
                  max_tokens_limit: int = p.DEFAULT_MAX_TOKENS_LIMIT,
                  max_body_bytes: int = 4 << 20) -> bytes | AsyncIterator[bytes]:
    """A `/v1/responses` body answered by `chat` (the replica's chat path: tenant, body -> the
    chat answer's JSON or its events): the Response's JSON, or its server-sent events. Raises
    RequestError, its `param` a pointer into this body, before any event is sent."""
    if len(body) > max_body_bytes:
        raise p.RequestError(f"the request body is {len(body)} bytes; at most {max_body_bytes}", status=413,
                             code="request_too_large")
    t = decode_responses_request(body, max_tokens_limit=max_tokens_limit)
    response_id, created_at = _new_id("resp_"), int(time.time())
    try:
        out = await chat(tenant, t.chat_body())
    except p.RequestError as e:
        raise remap_error(e, t.origins) from None
    if isinstance(out, bytes):
        return p.encode(response_from_chat(t, _DECODER.decode(out), response_id, created_at))
    return _events(t, out, response_id, created_at, model_name)
