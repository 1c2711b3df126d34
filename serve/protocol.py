"""The OpenAI wire protocol of the Serve application: request and response types, validation, and
(serve.grammars maps a request onto the grammar spec xg2's runtime compiles).

Requests are decoded with msgspec straight from the body bytes, so a malformed request is refused
before any work is done, and every refusal names the place at fault as a JSON pointer into the
body (``/messages/0/role``, ``/response_format/json_schema/schema/properties/x``): a client with a
large schema or many tools learns exactly what to fix. Errors xg2 raises while compiling a grammar
carry a pointer (or line and column) relative to the grammar; `compile_error_to_request_error`
re-roots them at the body field the grammar came from.

Unknown request fields are accepted and ignored, as OpenAI-compatible servers do (vLLM ignores
them), so clients that send newer or provider-specific parameters keep working; fields whose
silent omission would change the answer (``n`` > 1, ``echo``, ``suffix``, a whitespace pattern)
are refused instead.

Grammar extensions follow vLLM's names (its "Structured Outputs" documentation, which lists the
``guided_*`` -> ``structured_outputs`` renames of v0.12.0): the older top-level ``guided_json``,
``guided_regex``, ``guided_grammar``, ``guided_choice`` and ``structural_tag`` (with
``guided_whitespace_pattern`` refused and ``guided_decoding_backend`` ignored), their replacement
``structured_outputs`` with ``json``, ``regex``, ``choice``, ``grammar``, ``json_object``,
``structural_tag``, ``disable_any_whitespace``, ``disable_additional_properties`` and
``whitespace_pattern`` (refused), and vLLM's ``response_format`` of type ``structural_tag`` in
both its forms (``format``, and the legacy ``structures`` + ``triggers``, which the top-level
``structural_tag`` also takes). Both endpoints accept all of them; at most one may be given.
"""

from __future__ import annotations

import re
import secrets
import time
from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

#: The largest `max_tokens` a request may ask for unless the server configures another limit.
DEFAULT_MAX_TOKENS_LIMIT = 32768
#: OpenAI's default `max_tokens` for the legacy completions endpoint.
COMPLETION_DEFAULT_MAX_TOKENS = 16
#: OpenAI's rule for function names; the model writes the name in its output, so it must be plain.
TOOL_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}\Z")

ReasoningMode = Literal["enabled", "disabled", "auto"]
FinishReason = Literal["stop", "length", "tool_calls"]


# ------------------------------------------------------------------------------------------------
# Requests
# ------------------------------------------------------------------------------------------------

class TextPart(msgspec.Struct, tag_field="type", tag="text"):
    """A text content part; the only kind a text model can read (images, audio, files are refused
    by the decoder with a pointer to the part's `type`)."""

    text: str


Content = str | list[TextPart]


class FunctionCall(msgspec.Struct):
    name: str
    arguments: str


class ToolCall(msgspec.Struct, tag_field="type", tag="function"):
    """A call the assistant made earlier in the conversation."""

    id: str
    function: FunctionCall


class _Message(msgspec.Struct, tag_field="role", omit_defaults=True):
    """Messages are a union tagged by `role`, so each role's required fields are checked (a tool
    message without `tool_call_id` is a 400 pointing at it) and omitted optionals stay out of
    `msgspec.to_builtins`, which the prompt renderer consumes."""


class SystemMessage(_Message, tag="system"):
    content: Content
    name: str | None = None


class DeveloperMessage(_Message, tag="developer"):
    content: Content
    name: str | None = None


class UserMessage(_Message, tag="user"):
    content: Content
    name: str | None = None


class AssistantMessage(_Message, tag="assistant"):
    content: Content | None = None
    tool_calls: list[ToolCall] | None = None
    name: str | None = None
    refusal: str | None = None


class ToolMessage(_Message, tag="tool"):
    content: Content
    tool_call_id: str
    name: str | None = None


Message = SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage


class FunctionDefinition(msgspec.Struct, omit_defaults=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | bool | None = None
    strict: bool | None = None


class FunctionTool(msgspec.Struct, tag_field="type", tag="function", omit_defaults=True):
    """An OpenAI function tool; custom and provider-builtin tools are refused by the decoder."""

    function: FunctionDefinition


class ToolChoiceFunction(msgspec.Struct):
    name: str


class NamedToolChoice(msgspec.Struct, tag_field="type", tag="function"):
    function: ToolChoiceFunction


class AllowedTools(msgspec.Struct):
    tools: list[NamedToolChoice]
    mode: Literal["auto", "required"] = "auto"


class AllowedToolsChoice(msgspec.Struct, tag_field="type", tag="allowed_tools"):
    """OpenAI's newer restriction of a request's tools to a subset, which xg2's formats honour."""

    allowed_tools: AllowedTools


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice | AllowedToolsChoice


class ResponseFormatText(msgspec.Struct, tag_field="type", tag="text"):
    pass


class ResponseFormatJSONObject(msgspec.Struct, tag_field="type", tag="json_object"):
    pass


class JSONSchemaFormat(msgspec.Struct):
    """`schema` is required here (OpenAI makes it optional, but an absent schema constrains
    nothing, which a client asking for structured output never means)."""

    schema: dict[str, Any] | bool
    name: str | None = None
    description: str | None = None
    strict: bool | None = None


class ResponseFormatJSONSchema(msgspec.Struct, tag_field="type", tag="json_schema"):
    json_schema: JSONSchemaFormat


class LegacyStructure(msgspec.Struct):
    begin: str
    schema: dict[str, Any] | bool
    end: str


class ResponseFormatStructuralTag(msgspec.Struct, tag_field="type", tag="structural_tag"):
    """vLLM's extension: xgrammar's structural tag, as ``format`` (the current form) or as the
    legacy ``structures`` (begin, schema, end) with ``triggers``."""

    format: dict[str, Any] | None = None
    structures: list[LegacyStructure] | None = None
    triggers: list[str] | None = None


ResponseFormat = (ResponseFormatText | ResponseFormatJSONObject | ResponseFormatJSONSchema
                  | ResponseFormatStructuralTag)


class StructuredOutputs(msgspec.Struct):
    """vLLM's `structured_outputs` (its StructuredOutputsParams); exactly one constraint at most."""

    json: dict[str, Any] | bool | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: dict[str, Any] | str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class _GrammarFields(msgspec.Struct, kw_only=True):
    """The grammar extensions both endpoints accept (vLLM's names, see the module note)."""

    response_format: ResponseFormat | None = None
    guided_json: dict[str, Any] | bool | str | None = None
    guided_regex: str | None = None
    guided_grammar: str | None = None
    guided_choice: list[str] | None = None
    structural_tag: dict[str, Any] | str | None = None
    guided_whitespace_pattern: str | None = None
    structured_outputs: StructuredOutputs | None = None


class _RequestFields(_GrammarFields, kw_only=True):
    """What both endpoints share: sampling, streaming and the grammar extensions."""

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    n: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    @property
    def stop_sequences(self) -> list[str]:
        """`stop` as a list (OpenAI takes one string or a list)."""
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        """Whether a stream ends with a usage chunk."""
        return bool(self.stream) and self.stream_options is not None and self.stream_options.include_usage


class ChatCompletionRequest(_RequestFields, kw_only=True):
    """A `/v1/chat/completions` body."""

    messages: list[Message]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @property
    def effective_max_tokens(self) -> int | None:
        """`max_completion_tokens` (OpenAI's current name) over `max_tokens` (deprecated); None:
        the server's own limit."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def message_dicts(self) -> list[dict[str, Any]]:
        """The messages as plain dicts (None fields left out), for a prompt renderer."""
        return msgspec.to_builtins(self.messages)

    def tool_dicts(self) -> list[dict[str, Any]]:
        """The tools as plain OpenAI-shaped dicts (empty when there are none)."""
        return msgspec.to_builtins(self.tools or [])


class CompletionRequest(_RequestFields, kw_only=True):
    """A `/v1/completions` body. `prompt` is typed loosely so that token-id prompts decode and are
    refused with a message saying why rather than with a type error."""

    prompt: str | list[Any]
    max_tokens: int | None = COMPLETION_DEFAULT_MAX_TOKENS
    echo: bool | None = False
    suffix: str | None = None
    best_of: int | None = None

    @property
    def effective_max_tokens(self) -> int:
        return COMPLETION_DEFAULT_MAX_TOKENS if self.max_tokens is None else self.max_tokens

    @property
    def prompt_text(self) -> str:
        """The one prompt (validated to be a string or a list of exactly one string)."""
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


# ------------------------------------------------------------------------------------------------
# Responses
# ------------------------------------------------------------------------------------------------

def new_chat_id() -> str:
    return "chatcmpl-" + secrets.token_hex(16)


def new_completion_id() -> str:
    return "cmpl-" + secrets.token_hex(16)


def now() -> int:
    return int(time.time())


class Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> Usage:
        return cls(prompt_tokens, completion_tokens, prompt_tokens + completion_tokens)


class ResponseFunctionCall(msgspec.Struct):
    name: str
    arguments: str


class ResponseToolCall(msgspec.Struct, kw_only=True):
    id: str
    type: Literal["function"] = "function"
    function: ResponseFunctionCall


class ChatMessage(msgspec.Struct, kw_only=True):
    """The assistant's message; `content` is always written (null with tool calls, as OpenAI
    does), `tool_calls` only when there are some. `reasoning_content` is vLLM's field for a
    reasoning model's thinking, kept out of `content` (clients that do not know it ignore it)."""

    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | UnsetType = UNSET
    tool_calls: list[ResponseToolCall] | UnsetType = UNSET


class ChatChoice(msgspec.Struct, kw_only=True):
    index: int = 0
    message: ChatMessage
    logprobs: None = None
    finish_reason: FinishReason


class ChatCompletion(msgspec.Struct, kw_only=True):
    id: str = msgspec.field(default_factory=new_chat_id)
    object: Literal["chat.completion"] = "chat.completion"
    created: int = msgspec.field(default_factory=now)
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class DeltaFunctionCall(msgspec.Struct, kw_only=True):
    name: str | UnsetType = UNSET
    arguments: str | UnsetType = UNSET


class DeltaToolCall(msgspec.Struct, kw_only=True):
    """A piece of a tool call in a stream: the first piece of a call has its id, type and name,
    later pieces add to `arguments`; `index` says which call a piece belongs to."""

    index: int
    id: str | UnsetType = UNSET
    type: Literal["function"] | UnsetType = UNSET
    function: DeltaFunctionCall | UnsetType = UNSET


class Delta(msgspec.Struct, kw_only=True):
    role: Literal["assistant"] | UnsetType = UNSET
    content: str | None | UnsetType = UNSET
    reasoning_content: str | UnsetType = UNSET
    tool_calls: list[DeltaToolCall] | UnsetType = UNSET


class ChunkChoice(msgspec.Struct, kw_only=True):
    index: int = 0
    delta: Delta
    logprobs: None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(msgspec.Struct, kw_only=True):
    """A stream event. All chunks of a stream share `id` and `created`. With
    ``stream_options.include_usage`` every chunk carries ``usage: null`` and the last one (with
    no choices) the usage, so `usage` is left out only when UNSET."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None | UnsetType = UNSET


class CompletionChoice(msgspec.Struct, kw_only=True):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None


class Completion(msgspec.Struct, kw_only=True):
    id: str = msgspec.field(default_factory=new_completion_id)
    object: Literal["text_completion"] = "text_completion"
    created: int = msgspec.field(default_factory=now)
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class CompletionChunk(msgspec.Struct, kw_only=True):
    """A stream event of `/v1/completions`: OpenAI streams `text_completion` objects whose last
    choice has the finish reason (null before)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None | UnsetType = UNSET


class ModelCard(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["model"] = "model"
    created: int = msgspec.field(default_factory=now)
    owned_by: str = "xg2"


class ModelList(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(msgspec.Struct, kw_only=True):
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None


class ErrorResponse(msgspec.Struct):
    error: ErrorDetail


_ENCODER = msgspec.json.Encoder()

#: The event that ends a stream.
SSE_DONE = b"data: [DONE]\n\n"


def encode(obj: Any) -> bytes:
    """A response (any struct here, or plain data) as JSON bytes."""
    return _ENCODER.encode(obj)


def sse_event(obj: Any) -> bytes:
    """One server-sent event carrying a chunk (or an error, which OpenAI sends the same way)."""
    return b"data: " + _ENCODER.encode(obj) + b"\n\n"


# ------------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------------

_ERROR_TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 429: "rate_limit_error"}


class RequestError(Exception):
    """A request the server refuses: `param` is the JSON pointer (RFC 6901) of the body field at
    fault (None: the body as a whole), `status` the HTTP status, `code` a short machine-readable
    reason. `to_response()` is OpenAI's error body."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None,
                 type: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.code = code
        fallback = "server_error" if status >= 500 else "invalid_request_error"
        self.type = type or _ERROR_TYPES.get(status, fallback)

    def __repr__(self) -> str:
        return f"RequestError({self.message!r}, param={self.param!r}, status={self.status})"

    def to_response(self) -> ErrorResponse:
        return ErrorResponse(ErrorDetail(message=self.message, type=self.type, param=self.param,
                                         code=self.code))


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


_PATH_PIECE = re.compile(r"\.([^.\[\]]+)|\[(\d+)\]|\[\.\.\.\]")


def msgspec_path_to_pointer(path: str) -> str:
    """msgspec's ``$.messages[0].role`` as the JSON pointer ``/messages/0/role``. A dict key
    msgspec elides (``[...]``) ends the pointer at the dict."""
    parts = []
    for m in _PATH_PIECE.finditer(path.removeprefix("$")):
        if m.group(0) == "[...]":
            break
        parts.append(_escape(m.group(1) if m.group(1) is not None else m.group(2)))
    return "".join("/" + p for p in parts)


_MISSING_RE = re.compile(r"^Object missing required field `([^`]+)`")


def _validation_error(e: msgspec.ValidationError) -> RequestError:
    text = str(e)
    message, sep, path = text.rpartition(" - at `")
    if not sep:
        message, pointer = text, ""
    else:
        pointer = msgspec_path_to_pointer(path.rstrip("`"))
    missing = _MISSING_RE.match(message)
    if missing:     # point at the missing field itself, not at the object lacking it
        pointer += "/" + _escape(missing.group(1))
        code = "missing_required_parameter"
    else:
        code = "invalid_value" if message.startswith("Invalid") else "invalid_type"
    return RequestError(message, pointer or None, code=code)


# ------------------------------------------------------------------------------------------------
# Decoding and validation
# ------------------------------------------------------------------------------------------------

_CHAT_DECODER = msgspec.json.Decoder(ChatCompletionRequest)
_COMPLETION_DECODER = msgspec.json.Decoder(CompletionRequest)


def _decode(decoder: msgspec.json.Decoder, body: bytes) -> Any:
    try:
        req = decoder.decode(body)
    except msgspec.ValidationError as e:
        raise _validation_error(e) from None
    except msgspec.DecodeError as e:
        raise RequestError(f"the body is not valid JSON: {e}", None, code="invalid_json") from None
    except RecursionError:      # msgspec's decoder recurses per nesting level
        raise RequestError("the body nests too deeply to decode (JSON nested about a thousand levels "
                           "or more)", None, code="invalid_json") from None
    if _LONG_DIGITS.search(body):       # (no integer past 64 bits without 19 digits in a row)
        where = _wide_int(msgspec.to_builtins(req), "")
        if where is not None:
            raise RequestError("integer out of range: integers must fit in 64 bits (from -2**63 to 2**64 - 1)",
                               where or None, code="invalid_value")
    return req


#: Integers outside these bounds have no 64-bit form: msgspec decodes them into the free-form
#: fields (a schema, a structural tag), but the grammar's content key (msgpack) and the
#: compilers cannot take them, so they are refused with the body's other errors.
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1
_LONG_DIGITS = re.compile(rb"[0-9]{19}")


def _wide_int(value: Any, at: str) -> str | None:
    """The JSON pointer of the first integer past 64 bits in `value` (builtins), or None."""
    stack = [(value, at)]
    while stack:
        value, at = stack.pop()
        if type(value) is int:
            if not _INT_MIN <= value <= _INT_MAX:
                return at
        elif isinstance(value, dict):
            stack.extend((v, f"{at}/{_escape(str(k))}") for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((v, f"{at}/{i}") for i, v in reversed(list(enumerate(value))))
    return None


def decode_chat_request(body: bytes, *,
                        max_tokens_limit: int = DEFAULT_MAX_TOKENS_LIMIT) -> ChatCompletionRequest:
    """A chat request from its body, validated (RequestError otherwise)."""
    req = _decode(_CHAT_DECODER, body)
    validate_chat_request(req, max_tokens_limit=max_tokens_limit)
    return req


def decode_completion_request(body: bytes, *,
                              max_tokens_limit: int = DEFAULT_MAX_TOKENS_LIMIT) -> CompletionRequest:
    """A completion request from its body, validated (RequestError otherwise)."""
    req = _decode(_COMPLETION_DECODER, body)
    validate_completion_request(req, max_tokens_limit=max_tokens_limit)
    return req


def _check_sampling(req: _RequestFields) -> None:
    if req.temperature is not None and not 0.0 <= req.temperature <= 2.0:
        raise RequestError(f"temperature must be between 0 and 2, got {req.temperature:g}", "/temperature",
                           code="invalid_value")
    if req.top_p is not None and not 0.0 < req.top_p <= 1.0:
        raise RequestError(f"top_p must be greater than 0 and at most 1, got {req.top_p:g}", "/top_p",
                           code="invalid_value")
    if req.seed is not None and not -(1 << 63) <= req.seed < (1 << 63):
        raise RequestError(f"seed must be a 64-bit signed integer, got {req.seed}", "/seed", code="invalid_value")
    if req.n is not None and req.n != 1:
        raise RequestError(f"only n=1 is supported, got n={req.n}", "/n", code="unsupported_value")
    if req.stream_options is not None and not req.stream:
        raise RequestError("stream_options is only allowed when stream is true", "/stream_options",
                           code="invalid_value")


def _check_max_tokens(value: int | None, param: str, limit: int) -> None:
    if value is None:
        return
    if value < 1:
        raise RequestError(f"{param[1:]} must be at least 1, got {value}", param, code="invalid_value")
    if value > limit:
        raise RequestError(f"{param[1:]} must be at most {limit}, got {value}", param, code="invalid_value")


def validate_chat_request(req: ChatCompletionRequest, *,
                          max_tokens_limit: int = DEFAULT_MAX_TOKENS_LIMIT) -> None:
    """The checks the types cannot say, each refusal with its pointer; also resolves the grammar
    (without compiling it), so conflicting constraints are refused here."""
    _check_sampling(req)
    if not req.messages:
        raise RequestError("messages must hold at least one message", "/messages", code="invalid_value")
    _check_max_tokens(req.max_tokens, "/max_tokens", max_tokens_limit)
    _check_max_tokens(req.max_completion_tokens, "/max_completion_tokens", max_tokens_limit)
    names: dict[str, int] = {}
    for i, tool in enumerate(req.tools or ()):
        name, at = tool.function.name, f"/tools/{i}/function/name"
        if not TOOL_NAME_RE.match(name):
            raise RequestError(f"tool name {name!r} must be 1 to 64 letters, digits, '_' or '-'", at,
                               code="invalid_value")
        if name in names:
            raise RequestError(f"tool name {name!r} is also the name of tool {names[name]}", at,
                               code="invalid_value")
        names[name] = i
    choice = req.tool_choice
    if choice is not None and choice != "none" and not req.tools:
        raise RequestError("tool_choice other than 'none' needs tools", "/tool_choice", code="invalid_value")
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        raise RequestError(f"tool_choice names {choice.function.name!r}, which is not among the tools",
                           "/tool_choice/function/name", code="invalid_value")
    if isinstance(choice, AllowedToolsChoice):
        for i, ref in enumerate(choice.allowed_tools.tools):
            if ref.function.name not in names:
                raise RequestError(f"allowed tool {ref.function.name!r} is not among the tools",
                                   f"/tool_choice/allowed_tools/tools/{i}/function/name",
                                   code="invalid_value")
    from .grammars import _chat_source  # (grammars builds on this module's types)

    _chat_source(req, "qwen_3", "disabled")


def validate_completion_request(req: CompletionRequest, *,
                                max_tokens_limit: int = DEFAULT_MAX_TOKENS_LIMIT) -> None:
    """As `validate_chat_request`, for `/v1/completions`."""
    _check_sampling(req)
    prompt = req.prompt
    if isinstance(prompt, list):
        if not prompt:
            raise RequestError("prompt must not be empty", "/prompt", code="invalid_value")
        if not isinstance(prompt[0], str):
            raise RequestError("token-id prompts are not supported; send the prompt as text", "/prompt",
                               code="unsupported_value")
        if len(prompt) > 1:
            raise RequestError("only one prompt per request is supported", "/prompt/1",
                               code="unsupported_value")
    if not req.prompt_text:     # no token to start from (vLLM refuses it too)
        raise RequestError("prompt must not be empty", "/prompt" if isinstance(prompt, str) else "/prompt/0",
                           code="invalid_value")
    _check_max_tokens(req.max_tokens, "/max_tokens", max_tokens_limit)
    if req.echo:
        raise RequestError("echo is not supported", "/echo", code="unsupported_value")
    if req.suffix:
        raise RequestError("suffix is not supported", "/suffix", code="unsupported_parameter")
    if req.best_of is not None and req.best_of != 1:
        raise RequestError("only best_of=1 is supported", "/best_of", code="unsupported_value")
    from .grammars import _grammar_source

    _grammar_source(req)
