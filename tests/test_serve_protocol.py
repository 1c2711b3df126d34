"""serve.protocol: OpenAI request decoding and validation (every refusal with its JSON pointer), the
mapping of requests onto xg2 grammar specs, response shapes the `openai` client parses, and real xg2
compile errors re-rooted at the request field they came from. No network: the `openai` client talks
to an in-process httpx transport."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
import pytest

import serve.grammars as g
import serve.protocol as p
import xg2
from xg2.actors.spec import EBNFSpec, JSONSchemaSpec, RegexSpec, StructuralTagSpec, ToolsSpec
from xg2.grammar.json_schema import MAX_SCHEMA_DEPTH

try:    # the official client, and the httpx it is built on (newer releases ship it as httpx2)
    import openai
    from openai.types import Completion as OpenAICompletion
    from openai.types import Model as OpenAIModel
    from openai.types.chat import ChatCompletion as OpenAIChatCompletion
    from openai.types.chat import ChatCompletionChunk as OpenAIChatCompletionChunk
    from pydantic import BaseModel

    try:
        import httpx2 as httpx
    except ImportError:
        import httpx
except ImportError:
    openai = None

needs_openai = pytest.mark.skipif(openai is None, reason="the openai client is not installed")

USER = [{"role": "user", "content": "hi"}]
BAD_SCHEMA = {"type": "object", "properties": {"x": {"type": "foo"}}}


def tool(name: str, parameters: Any = None, **extra: Any) -> dict:
    fn: dict[str, Any] = {"name": name, **extra}
    if parameters is not None:
        fn["parameters"] = parameters
    return {"type": "function", "function": fn}


WEATHER = tool("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
               description="Current weather")
TIME = tool("get_time", {"type": "object", "properties": {"tz": {"type": "string"}}})


def chat(**fields: Any) -> p.ChatCompletionRequest:
    body = {"model": "m", "messages": USER, **fields}
    return p.decode_chat_request(json.dumps(body).encode())


def completion(**fields: Any) -> p.CompletionRequest:
    body = {"model": "m", "prompt": "Say", **fields}
    return p.decode_completion_request(json.dumps(body).encode())


def refused(decode, body: Any) -> p.RequestError:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(p.RequestError) as info:
        decode(raw)
    return info.value


@pytest.fixture(scope="module")
def compiler(small_info):
    return xg2.GrammarCompiler(small_info, max_threads=1)


# --- decoding ---------------------------------------------------------------------------------------

def test_a_full_chat_request_decodes_and_unknown_fields_are_ignored():
    body = {
        "model": "smol", "temperature": 0.7, "top_p": 0.9, "seed": 7, "n": 1, "stop": ["\n\n", "END"],
        "max_completion_tokens": 64, "stream": True, "stream_options": {"include_usage": True}, "user": "u1",
        "logprobs": False, "frequency_penalty": 0.1, "metadata": {"a": "b"}, "some_future_field": [1, 2],
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "developer", "content": [{"type": "text", "text": "dev"}]},
            {"role": "user", "content": [{"type": "text", "text": "weather?"}, {"type": "text", "text": "Paris"}],
             "name": "bob"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"P"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "sunny"},
            {"role": "assistant", "content": "It is sunny.", "refusal": None},
        ],
        "tools": [WEATHER], "tool_choice": "auto", "parallel_tool_calls": False,
    }
    req = p.decode_chat_request(json.dumps(body).encode())
    assert [type(m).__name__ for m in req.messages] == [
        "SystemMessage", "DeveloperMessage", "UserMessage", "AssistantMessage", "ToolMessage", "AssistantMessage"]
    assert req.messages[3].tool_calls[0].function.name == "get_weather"
    assert req.messages[4].tool_call_id == "call_1"
    assert req.effective_max_tokens == 64 and req.stop_sequences == ["\n\n", "END"]
    assert req.include_usage and req.parallel_tool_calls is False
    dicts = req.message_dicts()
    assert dicts[0] == {"role": "system", "content": "be brief"}
    assert dicts[2]["content"] == [{"type": "text", "text": "weather?"}, {"type": "text", "text": "Paris"}]
    assert dicts[3] == {"role": "assistant", "tool_calls": [
        {"type": "function", "id": "call_1", "function": {"name": "get_weather", "arguments": '{"city":"P"}'}}]}
    assert req.tool_dicts() == [WEATHER]


def test_defaults_of_a_minimal_request():
    req = chat()
    assert req.stop_sequences == [] and req.effective_max_tokens is None and not req.include_usage
    assert g.chat_session_spec(req) is None
    c = completion()
    assert c.effective_max_tokens == 16 and c.prompt_text == "Say" and g.completion_session_spec(c) is None
    assert completion(prompt=["one"], stop="x").prompt_text == "one"
    assert completion(max_tokens=None).effective_max_tokens == 16
    assert chat(max_tokens=5).effective_max_tokens == 5
    assert chat(max_tokens=5, max_completion_tokens=9).effective_max_tokens == 9


# Every refusal of decoding and validation, with the pointer it names.
CHAT_REFUSALS = [
    ({"model": "m"}, "/messages", "missing_required_parameter"),
    ({"model": "m", "messages": []}, "/messages", "invalid_value"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "/messages/0/role", "invalid_value"),
    ({"messages": [{"content": "x"}]}, "/messages/0/role", "missing_required_parameter"),
    ({"messages": [*USER, {"role": "tool", "content": "x"}]}, "/messages/1/tool_call_id", "missing_required_parameter"),
    ({"messages": [{"role": "user", "content": 5}]}, "/messages/0/content", "invalid_type"),
    ({"messages": [{"role": "user", "content": None}]}, "/messages/0/content", "invalid_type"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "/messages/0/content/0/type", "invalid_value"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "/messages/0/content/0/text",
     "missing_required_parameter"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f"}}]}]},
     "/messages/0/tool_calls/0/function/arguments", "missing_required_parameter"),
    ({"messages": USER, "temperature": 2.5}, "/temperature", "invalid_value"),
    ({"messages": USER, "temperature": -0.1}, "/temperature", "invalid_value"),
    ({"messages": USER, "temperature": "hot"}, "/temperature", "invalid_type"),
    ({"messages": USER, "top_p": 0}, "/top_p", "invalid_value"),
    ({"messages": USER, "top_p": 1.5}, "/top_p", "invalid_value"),
    ({"messages": USER, "n": 2}, "/n", "unsupported_value"),
    ({"messages": USER, "max_tokens": 0}, "/max_tokens", "invalid_value"),
    ({"messages": USER, "max_completion_tokens": 10**6}, "/max_completion_tokens", "invalid_value"),
    ({"messages": USER, "stop": 3}, "/stop", "invalid_type"),
    ({"messages": USER, "stream_options": {"include_usage": True}}, "/stream_options", "invalid_value"),
    ({"messages": USER, "tools": [tool("bad name")]}, "/tools/0/function/name", "invalid_value"),
    ({"messages": USER, "tools": [tool("x" * 65)]}, "/tools/0/function/name", "invalid_value"),
    ({"messages": USER, "tools": [WEATHER, TIME, WEATHER]}, "/tools/2/function/name", "invalid_value"),
    ({"messages": USER, "tools": [{"type": "custom", "custom": {"name": "x"}}]}, "/tools/0/type", "invalid_value"),
    ({"messages": USER, "tools": [{"type": "function"}]}, "/tools/0/function", "missing_required_parameter"),
    ({"messages": USER, "tools": [tool("f", [1])]}, "/tools/0/function/parameters", "invalid_type"),
    ({"messages": USER, "tool_choice": "auto"}, "/tool_choice", "invalid_value"),
    ({"messages": USER, "tool_choice": "required"}, "/tool_choice", "invalid_value"),
    ({"messages": USER, "tools": [WEATHER], "tool_choice": "sometimes"}, "/tool_choice", "invalid_value"),
    ({"messages": USER, "tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "/tool_choice/function/name", "invalid_value"),
    ({"messages": USER, "tools": [WEATHER], "tool_choice": {"type": "allowed_tools", "allowed_tools": {
        "mode": "auto", "tools": [{"type": "function", "function": {"name": "get_weather"}},
                                  {"type": "function", "function": {"name": "nope"}}]}}},
     "/tool_choice/allowed_tools/tools/1/function/name", "invalid_value"),
    ({"messages": USER, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "/response_format/json_schema/schema", "missing_required_parameter"),
    ({"messages": USER, "response_format": {"type": "yaml"}}, "/response_format/type", "invalid_value"),
    ({"messages": USER, "response_format": {"type": "structural_tag"}}, "/response_format/format", "invalid_value"),
    ({"messages": USER, "response_format": {"type": "json_object"}, "guided_regex": "a+"}, "/guided_regex",
     "invalid_value"),
    ({"messages": USER, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}},
      "guided_regex": "a+"}, "/guided_regex", "invalid_value"),
    ({"messages": USER, "guided_json": {}, "structured_outputs": {"regex": "a"}}, "/structured_outputs/regex",
     "invalid_value"),
    ({"messages": USER, "structured_outputs": {"regex": "a", "grammar": "root ::= \"a\""}},
     "/structured_outputs/grammar", "invalid_value"),
    ({"messages": USER, "guided_json": "{not json"}, "/guided_json", "invalid_value"),
    ({"messages": USER, "guided_choice": []}, "/guided_choice", "invalid_value"),
    ({"messages": USER, "guided_whitespace_pattern": " *"}, "/guided_whitespace_pattern", "unsupported_parameter"),
    ({"messages": USER, "structured_outputs": {"json": {}, "whitespace_pattern": " "}},
     "/structured_outputs/whitespace_pattern", "unsupported_parameter"),
    ({"messages": USER, "tools": [WEATHER], "response_format": {"type": "json_object"}}, "/response_format",
     "unsupported_parameter"),
    ({"messages": USER, "tools": [WEATHER], "tool_choice": "auto", "guided_grammar": "root ::= \"a\""},
     "/guided_grammar", "unsupported_parameter"),
]


@pytest.mark.parametrize(("body", "param", "code"), CHAT_REFUSALS)
def test_chat_refusals_name_the_field_at_fault(body, param, code):
    err = refused(p.decode_chat_request, body)
    assert (err.param, err.code, err.status) == (param, code, 400), err.message
    detail = msgspec.json.decode(p.encode(err.to_response()))["error"]
    assert detail == {"message": err.message, "type": "invalid_request_error", "param": param, "code": code}


COMPLETION_REFUSALS = [
    ({"model": "m"}, "/prompt", "missing_required_parameter"),
    ({"prompt": []}, "/prompt", "invalid_value"),
    ({"prompt": [1, 2, 3]}, "/prompt", "unsupported_value"),
    ({"prompt": [[1, 2]]}, "/prompt", "unsupported_value"),
    ({"prompt": ["a", "b"]}, "/prompt/1", "unsupported_value"),
    ({"prompt": 5}, "/prompt", "invalid_type"),
    ({"prompt": "x", "echo": True}, "/echo", "unsupported_value"),
    ({"prompt": "x", "suffix": "y"}, "/suffix", "unsupported_parameter"),
    ({"prompt": "x", "best_of": 3}, "/best_of", "unsupported_value"),
    ({"prompt": "x", "n": 3}, "/n", "unsupported_value"),
    ({"prompt": "x", "max_tokens": 0}, "/max_tokens", "invalid_value"),
    ({"prompt": "x", "temperature": 3}, "/temperature", "invalid_value"),
    ({"prompt": "x", "guided_regex": "a", "structural_tag": {"type": "structural_tag"}}, "/structural_tag",
     "invalid_value"),
    ({"prompt": "x", "structural_tag": "{oops"}, "/structural_tag", "invalid_value"),
    ({"prompt": "x", "structural_tag": {"structures": [{"begin": "<f>", "end": "</f>"}], "triggers": ["<f"]}},
     "/structural_tag/structures/0/schema", "missing_required_parameter"),
    ({"prompt": "x", "structural_tag": json.dumps({"structures": [], "triggers": [3]})}, "/structural_tag",
     "invalid_type"),
]


@pytest.mark.parametrize(("body", "param", "code"), COMPLETION_REFUSALS)
def test_completion_refusals_name_the_field_at_fault(body, param, code):
    err = refused(p.decode_completion_request, body)
    assert (err.param, err.code, err.status) == (param, code, 400), err.message


@pytest.mark.parametrize("raw", [b"", b"{", b'{"model": "m",}', b"\xff\xfe", b"[1, 2]", b"null"])
def test_a_body_that_is_not_a_json_object_is_a_400_on_the_whole_body(raw):
    err = refused(p.decode_chat_request, raw)
    assert err.status == 400 and err.param is None
    assert err.code in ("invalid_json", "invalid_type")


@pytest.mark.parametrize("depth", [1000, 3000, 200_000])
def test_a_body_nested_past_what_the_decoder_recurses_is_a_400_not_a_500(depth):
    """msgspec's decoder recurses per level: a deep body raised RecursionError (Serve's plain 500)."""
    schema = b'{"items":' * depth + b"{}" + b"}" * depth
    body = (b'{"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema", '
            b'"json_schema": {"name": "x", "schema": ' + schema + b"}}}")
    err = refused(p.decode_chat_request, body)
    assert (err.status, err.param, err.code) == (400, None, "invalid_json") and "deeply" in err.message
    err = refused(p.decode_completion_request, b'{"prompt": "x", "extra": ' + b"[" * depth + b"]" * depth + b"}")
    assert (err.status, err.code) == (400, "invalid_json")


def test_a_schema_sent_as_text_nested_too_deeply_to_decode_is_refused_at_its_field():
    text = "[" * 5000 + "]" * 5000
    with pytest.raises(p.RequestError) as info:
        g._schema_spec(text, "/response_format/json_schema/schema")
    assert info.value.param == "/response_format/json_schema/schema" and "deeply" in info.value.message


def test_a_spec_nested_too_deeply_to_decode_is_a_spec_error():
    from xg2.actors.runtime import parse_spec
    from xg2.errors import SpecError

    with pytest.raises(SpecError, match="deeply"):
        parse_spec(b'{"grammar": {"type": "json_schema", "schema": ' + b"[" * 5000 + b"]" * 5000 + b"}}")


def test_the_max_tokens_limit_is_configurable():
    body = json.dumps({"messages": USER, "max_tokens": 100}).encode()
    assert p.decode_chat_request(body, max_tokens_limit=100).max_tokens == 100
    with pytest.raises(p.RequestError) as info:
        p.decode_chat_request(body, max_tokens_limit=99)
    assert info.value.param == "/max_tokens" and "99" in info.value.message
    with pytest.raises(p.RequestError):
        p.decode_completion_request(json.dumps({"prompt": "x"}).encode(), max_tokens_limit=8)   # default 16


@pytest.mark.parametrize(("path", "pointer"), [
    ("$", ""), ("$.messages[0].role", "/messages/0/role"), ("$.a[12][3].b", "/a/12/3/b"),
    ("$.guided_json[...]", "/guided_json"), ("$.x[...].y", "/x"),
])
def test_msgspec_paths_become_json_pointers(path, pointer):
    assert p.msgspec_path_to_pointer(path) == pointer


# --- the openai client, end to end over an in-process transport ------------------------------------

class Recorder:
    """An httpx transport answering as the server would: decode, map to a spec, answer."""

    def __init__(self, reply):
        self.reply = reply
        self.requests: list[Any] = []

    def __call__(self, request: Any) -> Any:
        try:
            if request.url.path.endswith("/chat/completions"):
                req = p.decode_chat_request(request.content)
            elif request.url.path.endswith("/completions"):
                req = p.decode_completion_request(request.content)
            else:
                req = None
        except p.RequestError as e:
            return httpx.Response(e.status, content=p.encode(e.to_response()),
                                  headers={"content-type": "application/json"})
        self.requests.append(req)
        status, content, ctype = self.reply(req)
        return httpx.Response(status, content=content, headers={"content-type": ctype})


def client_for(reply) -> tuple[Any, Recorder]:
    rec = Recorder(reply)
    client = openai.OpenAI(api_key="sk-test", base_url="http://xg2.test/v1", max_retries=0,
                           http_client=httpx.Client(transport=httpx.MockTransport(rec)))
    return client, rec


@needs_openai
def test_openai_client_chat_with_tools_round_trip():
    def reply(req):
        call = p.ResponseToolCall(id="call_0", function=p.ResponseFunctionCall("get_weather", '{"city": "Paris"}'))
        body = p.ChatCompletion(model=req.model, choices=[p.ChatChoice(
            message=p.ChatMessage(content=None, tool_calls=[call]), finish_reason="tool_calls")],
            usage=p.Usage.of(12, 9))
        return 200, p.encode(body), "application/json"

    client, rec = client_for(reply)
    out = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "weather in Paris?"}], tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, temperature=0, seed=3,
        max_completion_tokens=32, stop=["\n"], parallel_tool_calls=False)
    req = rec.requests[0]
    assert isinstance(req.tool_choice, p.NamedToolChoice) and req.seed == 3
    spec = g.chat_session_spec(req)
    assert isinstance(spec, ToolsSpec)
    assert spec.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    assert spec.parallel_tool_calls is False and spec.model == "qwen_3"
    assert spec.tools == [tool("get_weather", WEATHER["function"]["parameters"])]   # no description: shared key
    assert out.choices[0].finish_reason == "tool_calls"
    assert out.choices[0].message.tool_calls[0].function.arguments == '{"city": "Paris"}'
    assert out.usage.total_tokens == 21 and out.id.startswith("chatcmpl-") and out.object == "chat.completion"


@needs_openai
def test_openai_client_parse_with_a_pydantic_model_sends_a_strict_json_schema():
    class Answer(BaseModel):
        city: str
        temperature_c: float

    def reply(req):
        body = p.ChatCompletion(model="smol", choices=[p.ChatChoice(
            message=p.ChatMessage(content='{"city": "Paris", "temperature_c": 21.5}'), finish_reason="stop")])
        return 200, p.encode(body), "application/json"

    client, rec = client_for(reply)
    out = client.chat.completions.parse(model="smol", messages=USER, response_format=Answer)
    assert out.choices[0].message.parsed == Answer(city="Paris", temperature_c=21.5)
    req = rec.requests[0]
    assert req.response_format.json_schema.strict is True and req.response_format.json_schema.name == "Answer"
    spec = g.chat_session_spec(req)
    assert isinstance(spec, JSONSchemaSpec) and spec.strict_mode
    assert spec.schema == req.response_format.json_schema.schema and spec.schema["required"] == [
        "city", "temperature_c"]


@needs_openai
def test_openai_client_streams_content_tool_calls_and_usage():
    def reply(req):
        assert req.stream and req.include_usage
        sid, created = p.new_chat_id(), p.now()

        def chunk(delta, finish=None, usage=None):
            return p.sse_event(p.ChatCompletionChunk(id=sid, created=created, model="smol", usage=usage,
                                                     choices=[p.ChunkChoice(delta=delta, finish_reason=finish)]))

        events = [
            chunk(p.Delta(role="assistant", content="")),
            chunk(p.Delta(content="Let me check.")),
            chunk(p.Delta(tool_calls=[p.DeltaToolCall(index=0, id="call_0", type="function",
                                                      function=p.DeltaFunctionCall(name="get_weather", arguments=""))])),
            chunk(p.Delta(tool_calls=[p.DeltaToolCall(index=0, function=p.DeltaFunctionCall(arguments='{"city":'))])),
            chunk(p.Delta(tool_calls=[p.DeltaToolCall(index=0, function=p.DeltaFunctionCall(arguments=' "P"}'))])),
            chunk(p.Delta(), finish="tool_calls"),
            p.sse_event(p.ChatCompletionChunk(id=sid, created=created, model="smol", choices=[],
                                              usage=p.Usage.of(5, 7))),
            p.SSE_DONE,
        ]
        return 200, b"".join(events), "text/event-stream"

    client, _ = client_for(reply)
    stream = client.chat.completions.create(model="smol", messages=USER, tools=[WEATHER], stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert len(chunks) == 7 and len({c.id for c in chunks}) == 1
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Let me check."
    args = "".join(tc.function.arguments or "" for c in chunks if c.choices
                   for tc in (c.choices[0].delta.tool_calls or []))
    assert json.loads(args) == {"city": "P"}
    assert chunks[-2].choices[0].finish_reason == "tool_calls"
    assert chunks[0].usage is None and chunks[-1].usage.completion_tokens == 7


@needs_openai
def test_openai_client_completions_with_vllm_extensions_in_extra_body():
    def reply(req):
        body = p.Completion(model="smol", choices=[p.CompletionChoice(text="abc", finish_reason="stop")],
                            usage=p.Usage.of(2, 3))
        return 200, p.encode(body), "application/json"

    client, rec = client_for(reply)
    out = client.completions.create(model="smol", prompt="x", max_tokens=8, extra_body={"guided_regex": "[a-c]+"})
    assert out.choices[0].text == "abc" and out.id.startswith("cmpl-") and out.object == "text_completion"
    assert g.completion_session_spec(rec.requests[0]) == RegexSpec("[a-c]+")
    client.completions.create(model="smol", prompt="x", extra_body={"structured_outputs": {"choice": ["a", "b"]}})
    assert isinstance(g.completion_session_spec(rec.requests[1]), EBNFSpec)


@needs_openai
def test_openai_client_sees_our_400_with_its_param_and_code():
    client, rec = client_for(lambda req: (200, b"{}", "application/json"))
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="smol", messages=USER, tools=[WEATHER],
                                       tool_choice={"type": "function", "function": {"name": "nope"}})
    assert info.value.status_code == 400 and info.value.param == "/tool_choice/function/name"
    assert info.value.code == "invalid_value" and info.value.type == "invalid_request_error"
    assert not rec.requests
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="smol", prompt=[1, 2, 3])
    assert info.value.param == "/prompt"


# --- response shapes --------------------------------------------------------------------------------

@needs_openai
def test_responses_validate_as_the_openai_types():
    done = p.ChatCompletion(model="smol", choices=[p.ChatChoice(message=p.ChatMessage(content="hi"),
                                                               finish_reason="length")], usage=p.Usage.of(1, 2))
    raw = json.loads(p.encode(done))
    assert raw["choices"][0]["message"] == {"role": "assistant", "content": "hi"}     # no tool_calls key
    assert raw["choices"][0]["logprobs"] is None and raw["usage"]["total_tokens"] == 3
    OpenAIChatCompletion.model_validate(raw)

    thought = p.ChatMessage(content="4", reasoning_content="2+2")
    assert json.loads(p.encode(thought)) == {"role": "assistant", "content": "4", "reasoning_content": "2+2"}
    OpenAIChatCompletion.model_validate(json.loads(p.encode(p.ChatCompletion(
        model="smol", choices=[p.ChatChoice(message=thought, finish_reason="stop")]))))

    chunk = p.ChatCompletionChunk(id="chatcmpl-1", created=1, model="smol",
                                  choices=[p.ChunkChoice(delta=p.Delta(content="x"))])
    raw = json.loads(p.encode(chunk))
    assert raw["choices"][0] == {"index": 0, "delta": {"content": "x"}, "logprobs": None, "finish_reason": None}
    assert "usage" not in raw
    OpenAIChatCompletionChunk.model_validate(raw)
    chunk.usage = None      # with include_usage, every chunk but the last says usage: null
    assert json.loads(p.encode(chunk))["usage"] is None

    sse = p.sse_event(chunk)
    assert sse.startswith(b"data: {") and sse.endswith(b"}\n\n")
    OpenAIChatCompletionChunk.model_validate_json(sse[len(b"data: "):].strip())
    assert p.SSE_DONE == b"data: [DONE]\n\n"

    comp = p.Completion(model="smol", choices=[p.CompletionChoice(text="t", finish_reason="stop")])
    OpenAICompletion.model_validate(json.loads(p.encode(comp)))
    piece = p.CompletionChunk(id=comp.id, created=comp.created, model="smol",
                              choices=[p.CompletionChoice(text="t", finish_reason=None)])
    assert json.loads(p.encode(piece))["choices"][0]["finish_reason"] is None
    assert json.loads(p.encode(piece))["object"] == "text_completion"

    models = json.loads(p.encode(p.ModelList(data=[p.ModelCard(id="smol")])))
    assert models["object"] == "list"
    OpenAIModel.model_validate(models["data"][0])

    err = p.RequestError("boom", "/x", status=500)
    assert json.loads(p.encode(err.to_response()))["error"]["type"] == "server_error"


def test_ids_are_prefixed_hex_and_unique():
    a, b = p.new_chat_id(), p.new_chat_id()
    assert a != b and a.startswith("chatcmpl-") and int(a[len("chatcmpl-"):], 16) >= 0
    assert p.new_completion_id().startswith("cmpl-")


# --- request -> spec --------------------------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.mark.parametrize(("fields", "expected"), [
    ({"response_format": {"type": "text"}}, None),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA, "strict": True}}},
     JSONSchemaSpec(SCHEMA)),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA}}},
     JSONSchemaSpec(SCHEMA)),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA, "strict": False}}},
     JSONSchemaSpec(SCHEMA, strict_mode=False)),
    ({"response_format": {"type": "json_object"}}, JSONSchemaSpec({"type": "object"})),
    ({"guided_json": SCHEMA}, JSONSchemaSpec(SCHEMA)),
    ({"guided_json": json.dumps(SCHEMA)}, JSONSchemaSpec(SCHEMA)),     # text: same spec, same compile
    ({"structured_outputs": {"json": SCHEMA, "disable_any_whitespace": True}},
     JSONSchemaSpec(SCHEMA, any_whitespace=False)),
    ({"structured_outputs": {"json_object": True}}, JSONSchemaSpec({"type": "object"})),
    ({"structured_outputs": {"json_object": False}}, None),
    ({"guided_regex": r"\d+"}, RegexSpec(r"\d+")),
    ({"structured_outputs": {"regex": r"\d+"}}, RegexSpec(r"\d+")),
    ({"guided_grammar": 'root ::= "a"'}, EBNFSpec('root ::= "a"')),
    ({"structured_outputs": {"grammar": 'root ::= "a"'}}, EBNFSpec('root ::= "a"')),
    ({"guided_choice": ["yes", "no"]}, EBNFSpec('root ::= "yes" | "no"\n')),
    ({"structural_tag": {"type": "structural_tag", "format": {"type": "const_string", "value": "x"}}},
     StructuralTagSpec({"type": "structural_tag", "format": {"type": "const_string", "value": "x"}})),
    ({"structured_outputs": {"structural_tag": json.dumps({"type": "structural_tag", "format": {"type": "any_text"}})}},
     StructuralTagSpec({"type": "structural_tag", "format": {"type": "any_text"}})),
    ({"response_format": {"type": "structural_tag", "format": {"type": "any_text"}}},
     StructuralTagSpec({"type": "structural_tag", "format": {"type": "any_text"}})),
    ({"tools": [WEATHER], "tool_choice": "none"}, None),
    ({"tools": [WEATHER], "tool_choice": "none", "guided_regex": "a"}, RegexSpec("a")),
])
def test_chat_spec_for_each_kind(fields, expected):
    assert g.chat_session_spec(chat(**fields)) == expected


@pytest.mark.parametrize(("fields", "choice", "parallel", "reasoning"), [
    ({}, "auto", True, "disabled"),
    ({"tool_choice": "auto"}, "auto", True, "disabled"),
    ({"tool_choice": "required", "parallel_tool_calls": False}, "required", False, "disabled"),
    ({"tool_choice": {"type": "function", "function": {"name": "get_time"}}},
     {"type": "function", "function": {"name": "get_time"}}, True, "disabled"),
    ({"tool_choice": {"type": "allowed_tools", "allowed_tools": {
        "mode": "required", "tools": [{"type": "function", "function": {"name": "get_time"}}]}}},
     {"type": "allowed_tools", "allowed_tools": {
         "tools": [{"type": "function", "function": {"name": "get_time"}}], "mode": "required"}}, True, "disabled"),
    ({"chat_template_kwargs": {"enable_thinking": True}}, "auto", True, "enabled"),
    ({"chat_template_kwargs": {"enable_thinking": False}, "parallel_tool_calls": None}, "auto", True, "disabled"),
])
def test_chat_tools_spec(fields, choice, parallel, reasoning):
    spec = g.chat_session_spec(chat(tools=[WEATHER, TIME], **fields), tool_format="llama")
    assert isinstance(spec, ToolsSpec)
    assert (spec.tool_choice, spec.parallel_tool_calls, spec.reasoning, spec.model) == (
        choice, parallel, reasoning, "llama")
    assert [t["function"]["name"] for t in spec.tools] == ["get_weather", "get_time"]


def test_tools_win_over_a_format_when_the_answer_can_only_be_calls():
    req = chat(tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"})
    assert isinstance(g.chat_session_spec(req), ToolsSpec)
    assert g.chat_session_spec(req, reasoning="auto").reasoning == "auto"


def test_completion_spec_for_each_kind():
    assert completion_spec(guided_json=SCHEMA) == JSONSchemaSpec(SCHEMA)
    assert completion_spec(response_format={"type": "json_object"}) == JSONSchemaSpec({"type": "object"})
    assert completion_spec(guided_grammar='root ::= "a"') == EBNFSpec('root ::= "a"')
    assert completion_spec(structured_outputs={"regex": "b"}) == RegexSpec("b")
    tag = {"type": "structural_tag", "format": {"type": "const_string", "value": "x"}}
    assert completion_spec(structural_tag=tag) == StructuralTagSpec(tag)
    assert completion_spec(structural_tag=json.dumps(tag)) == StructuralTagSpec(tag)


def completion_spec(**fields: Any):
    return g.completion_session_spec(completion(**fields))


def accepts(compiled: xg2.CompiledGrammar, text: str) -> bool:
    m = xg2.GrammarMatcher(compiled)
    return m.accept_string(text) and m.is_completed()


def test_specs_compile_to_the_language_asked_for(compiler):
    choice = ["yes", 'say "no"', "back\\slash", "tab\there", "", "中文"]
    spec = g.chat_session_spec(chat(guided_choice=choice))
    compiled = spec.compile(compiler)
    for c in choice:
        assert accepts(compiled, c), c
    assert not accepts(compiled, "ye") and not accepts(compiled, "yes!")

    compiled = g.chat_session_spec(chat(response_format={"type": "json_object"})).compile(compiler)
    assert accepts(compiled, '{"any": [1, {"thing": null}]}')      # open, like xgrammar's builtin JSON
    assert not accepts(compiled, "[1]") and not accepts(compiled, '"s"')

    legacy = {"type": "structural_tag", "triggers": ["<f="],
              "structures": [{"begin": "<f=a>", "schema": SCHEMA, "end": "</f>"}]}
    spec = g.chat_session_spec(chat(response_format=legacy))
    # the same legacy tag as vLLM's top-level `structural_tag` (object or text) is the same spec
    assert g.chat_session_spec(chat(structural_tag=legacy)) == spec
    assert g.completion_session_spec(completion(structural_tag=json.dumps(legacy))) == spec
    compiled = spec.compile(compiler)
    assert accepts(compiled, 'text <f=a>{"a": 1}</f> more')
    assert not accepts(compiled, 'text <f=a>{"a": "x"}</f>')

    tools = g.chat_session_spec(chat(tools=[WEATHER], tool_choice="required"))
    compiled = tools.compile(compiler)
    assert accepts(compiled, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')


# --- compile errors -> 400 with a pointer into the body ---------------------------------------------

def compile_error(compiler, req, **kwargs) -> p.RequestError:
    spec = g.chat_session_spec(req, **kwargs) if isinstance(req, p.ChatCompletionRequest) else \
        g.completion_session_spec(req)
    with pytest.raises(xg2.XG2Error) as info:
        spec.compile(compiler)
    err = g.compile_error_to_request_error(info.value, req, **kwargs)
    assert isinstance(err, p.RequestError)
    return err


def deep_schema(levels: int) -> dict:
    schema: dict = {"type": "object"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


DEEP = deep_schema(200)
#: Where xg2 stops in DEEP (its nesting limit), relative to the schema.
DEEP_AT = "/properties/a" * MAX_SCHEMA_DEPTH


@pytest.mark.parametrize(("fields", "param", "code", "in_message"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": BAD_SCHEMA}}},
     "/response_format/json_schema/schema/properties/x/type", "invalid_schema", "foo"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {
        "type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}}}}},
     "/response_format/json_schema/schema/properties/x/$ref", "invalid_schema", "does not resolve"),
    ({"guided_json": BAD_SCHEMA}, "/guided_json/properties/x/type", "invalid_schema", "foo"),
    ({"guided_json": json.dumps(BAD_SCHEMA)}, "/guided_json", "invalid_schema", "(at /properties/x/type)"),
    ({"structured_outputs": {"json": {"type": "string", "pattern": "(a"}}}, "/structured_outputs/json/pattern",
     "invalid_schema", "line 1, column 1"),
    ({"guided_grammar": 'root ::= "a" b\n'}, "/guided_grammar", "invalid_grammar", "line 1, column 14"),
    ({"structured_outputs": {"grammar": 'root ::= "a"\nx ::= (\n'}}, "/structured_outputs/grammar",
     "invalid_grammar", "line 2"),
    ({"guided_grammar": 'root ::= "a"{1000000000}'}, "/guided_grammar", "grammar_limit_exceeded", "column 14"),
    ({"guided_regex": "a(?=b)"}, "/guided_regex", "invalid_grammar", "line 1, column 2"),
    ({"structural_tag": {"type": "structural_tag", "format": {"type": "nope"}}}, "/structural_tag/format/type",
     "invalid_grammar", "nope"),
    ({"structured_outputs": {"structural_tag": {"type": "structural_tag", "format": {
        "type": "tag", "begin": "<a>", "content": {"type": "json_schema", "json_schema": BAD_SCHEMA}, "end": "</a>"}}}},
     "/structured_outputs/structural_tag/format/content/json_schema/properties/x/type", "invalid_grammar", "foo"),
    ({"structural_tag": json.dumps({"type": "structural_tag", "format": {"type": "regex", "pattern": "(a"}})},
     "/structural_tag", "invalid_grammar", "(at /format/pattern)"),
    ({"response_format": {"type": "structural_tag", "format": {"type": "grammar", "grammar": "root ::= b"}}},
     "/response_format/format/grammar", "invalid_grammar", "line 1, column 10"),
    ({"response_format": {"type": "structural_tag", "triggers": ["<f"], "structures": [
        {"begin": "<f=a>", "schema": SCHEMA, "end": "</f>"}, {"begin": "<f=b>", "schema": BAD_SCHEMA, "end": "</f>"}]}},
     "/response_format/structures/1/schema/properties/x/type", "invalid_grammar", "foo"),
    ({"response_format": {"type": "structural_tag", "triggers": ["<g"], "structures": [
        {"begin": "<f=a>", "schema": SCHEMA, "end": "</f>"}]}},
     "/response_format/structures/0/begin", "invalid_grammar", "trigger"),
    ({"structural_tag": {"triggers": ["<f"], "structures": [{"begin": "<f>", "schema": BAD_SCHEMA, "end": "</f>"}]}},
     "/structural_tag/structures/0/schema/properties/x/type", "invalid_grammar", "foo"),
    ({"structural_tag": json.dumps({"triggers": ["<f"], "structures": [
        {"begin": "<f>", "schema": BAD_SCHEMA, "end": "</f>"}]})},
     "/structural_tag", "invalid_grammar", "(at /structures/0/schema/properties/x/type)"),
    ({"guided_json": DEEP}, "/guided_json" + DEEP_AT, "grammar_limit_exceeded", "deeper"),
    ({"structural_tag": {"type": "structural_tag", "format": {
        "type": "tag", "begin": "<a>", "content": {"type": "json_schema", "json_schema": DEEP}, "end": "</a>"}}},
     "/structural_tag/format/content/json_schema" + DEEP_AT, "grammar_limit_exceeded", "deeper"),
])
def test_compile_errors_point_into_the_request(compiler, fields, param, code, in_message):
    err = compile_error(compiler, chat(**fields))
    assert (err.status, err.code) == (400, code), err.message
    assert err.param == param, err.message
    assert in_message in err.message


@pytest.mark.parametrize("tool_format", ["qwen_3", "qwen_3_coder", "llama", "deepseek_r1", "kimi"])
@pytest.mark.parametrize("fields", [{}, {"tool_choice": "required"}, {"parallel_tool_calls": False},
                                    {"tool_choice": {"type": "function", "function": {"name": "broken"}}}])
def test_a_bad_tool_schema_points_at_that_tool(compiler, tool_format, fields):
    tools = [WEATHER, TIME, tool("same", {"type": "object"}), tool("broken", BAD_SCHEMA)]
    err = compile_error(compiler, chat(tools=tools, **fields), tool_format=tool_format)
    assert (err.status, err.code, err.param) == (400, "invalid_schema", "/tools/3/function/parameters/properties/x/type")
    assert "'broken'" in err.message and "foo" in err.message


def test_a_tool_schema_past_a_limit_points_at_that_tool(compiler):
    err = compile_error(compiler, chat(tools=[WEATHER, tool("deep", DEEP)]))
    assert err.code == "grammar_limit_exceeded"
    assert err.param == "/tools/1/function/parameters" + DEEP_AT


def test_tools_with_the_same_schema_as_the_broken_one_name_the_first(compiler):
    err = compile_error(compiler, chat(tools=[tool("a", BAD_SCHEMA), tool("b", BAD_SCHEMA)]))
    assert err.param == "/tools/0/function/parameters/properties/x/type"


def test_a_format_whose_markers_are_not_in_the_vocabulary_is_the_servers_fault(compiler):
    # harmony's markers are special tokens; the small vocabulary has none
    err = compile_error(compiler, chat(tools=[WEATHER]), tool_format="harmony")
    assert err.status == 500 and err.type == "server_error" and err.param is None
    err = g.compile_error_to_request_error(
        xg2.ModelFormatError("unknown model format 'x'", "/model"), chat(tools=[WEATHER]))
    assert err.status == 500


def test_model_format_errors_keep_their_request_pointer():
    err = g.compile_error_to_request_error(
        xg2.ModelFormatError("two tools are named 'a'", "/tools/1/function/name"), chat(tools=[WEATHER, TIME]))
    assert (err.status, err.param) == (400, "/tools/1/function/name")


def test_completion_compile_errors_point_into_the_request(compiler):
    err = compile_error(compiler, completion(guided_json=BAD_SCHEMA))
    assert err.param == "/guided_json/properties/x/type"
    err = compile_error(compiler, completion(response_format={"type": "json_schema", "json_schema": {
        "name": "r", "schema": {"type": "object", "properties": {"n": {"minimum": "low"}}}}}))
    assert err.param == "/response_format/json_schema/schema/properties/n/minimum"


def test_spec_errors_and_other_exceptions():
    req = chat(guided_json=SCHEMA)
    err = g.compile_error_to_request_error(xg2.errors.SpecError("bad", "/grammar/schema/properties"), req)
    assert (err.status, err.param) == (400, "/guided_json/properties")
    err = g.compile_error_to_request_error(xg2.errors.SpecError("bad", "/options/max_rollback_tokens"), req)
    assert err.status == 500
    req = chat(tools=[WEATHER])
    err = g.compile_error_to_request_error(xg2.errors.SpecError("bad", "/grammar/tools/0/function"), req)
    assert (err.status, err.param) == (400, "/tools/0/function")
    err = g.compile_error_to_request_error(xg2.errors.QuotaError("tenant 'x' has 3 open sessions"), req)
    assert (err.status, err.type) == (429, "rate_limit_error")
    assert g.compile_error_to_request_error(RuntimeError("boom"), req).status == 500
    already = p.RequestError("x", "/y")
    assert g.compile_error_to_request_error(already, req) is already


def test_the_runtime_raises_what_the_mapping_reads(small_info):
    """The runtime hands the compile's own typed error to the caller (no SpecError wrapping), and
    an error it remembers (failure_ttl_s) maps the same way the second time."""
    from xg2.actors.runtime import GrammarRuntime

    rt = GrammarRuntime(small_info, compile_workers=1, fill_threads=1)
    req = chat(tools=[WEATHER, tool("broken", BAD_SCHEMA)])
    spec = g.chat_session_spec(req)

    async def open_twice():
        errors = []
        for _ in range(2):
            try:
                await rt.open(spec)
            except xg2.XG2Error as e:
                errors.append(g.compile_error_to_request_error(e, req))
        return errors

    try:
        errors = asyncio.run(open_twice())
    finally:
        rt.shutdown()
    assert [e.param for e in errors] == ["/tools/1/function/parameters/properties/x/type"] * 2
