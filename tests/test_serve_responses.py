"""The Responses API's translation onto the chat path (serve/responses.py), without a server: the
chat request a Responses body becomes, the refusals and their pointers into the Responses body,
and the chat answers and streams written back as Responses objects and events. (Real clients
drive the running application in test_clients.py.)"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
import pytest

from serve import protocol as p
from serve import responses as r

TOOL = {"type": "function", "name": "get_weather", "description": "Weather of a city.", "strict": True,
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
SCHEMA_FORMAT = {"type": "json_schema", "name": "answer", "schema": {"type": "object"}, "strict": True}


def decode(body: dict[str, Any]) -> r.Translation:
    return r.decode_responses_request(json.dumps(body).encode())


def chat_of(body: dict[str, Any]) -> dict[str, Any]:
    """The chat request's body, as the replica's chat path reads it."""
    return json.loads(decode(body).chat_body())


def test_a_conversation_becomes_the_chat_request_that_means_the_same():
    body = {"model": "m", "instructions": "Be brief.", "tools": [TOOL], "tool_choice": "required",
            "parallel_tool_calls": False, "max_output_tokens": 50, "temperature": 0.5, "top_p": 0.9, "seed": 3,
            "store": True, "metadata": {"k": "v"}, "include": [], "reasoning": {"effort": None},
            "input": [
                {"role": "user", "content": "Weather in Paris?"},                       # the short form
                {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                 "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
                {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}',
                 "id": "fc_1", "status": "completed"},
                {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city":"Oslo"}'},
                {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
                {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "rain"}]},
                {"role": "developer", "content": [{"type": "input_text", "text": "Answer now."}]}]}
    t = decode(body)
    chat = json.loads(t.chat_body())
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}], "tool_calls": [
            {"type": "function", "id": "call_1", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
            {"type": "function", "id": "call_2", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
        {"role": "tool", "content": [{"type": "text", "text": "rain"}], "tool_call_id": "call_2"},
        {"role": "developer", "content": [{"type": "text", "text": "Answer now."}]}]
    assert t.origins == ["/instructions", "/input/0", "/input/1", "/input/4", "/input/5", "/input/6"]
    assert chat["tools"] == [{"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}}]
    assert (chat["tool_choice"], chat["parallel_tool_calls"], chat["max_completion_tokens"]) == ("required", False, 50)
    assert (chat["temperature"], chat["top_p"], chat["seed"], chat["stream"]) == (0.5, 0.9, 3, False)
    named = chat_of({"input": "x", "tools": [TOOL], "tool_choice": {"type": "function", "name": "get_weather"}})
    assert named["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    allowed = chat_of({"input": "x", "tools": [TOOL], "tool_choice": {
        "type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_weather"}]}})
    assert allowed["tool_choice"] == {"type": "allowed_tools", "allowed_tools": {
        "tools": [{"type": "function", "function": {"name": "get_weather"}}], "mode": "required"}}


def test_text_formats_streams_and_extensions():
    chat = chat_of({"input": "x", "text": {"format": SCHEMA_FORMAT, "verbosity": "low"}})
    assert chat["response_format"]["json_schema"]["schema"] == {"type": "object"}
    assert chat["response_format"]["json_schema"]["strict"] is True
    assert chat_of({"input": "x", "text": {"format": {"type": "json_object"}}})["response_format"] == {
        "type": "json_object"}
    assert "response_format" not in chat_of({"input": "x", "text": {"format": {"type": "text"}}})
    streamed = chat_of({"input": "x", "stream": True, "stream_options": {"include_obfuscation": False}})
    assert streamed["stream"] is True and streamed["stream_options"] == {"include_usage": True}
    so = chat_of({"input": "x", "structured_outputs": {"regex": "[a-z]+", "disable_any_whitespace": True}})
    assert so["structured_outputs"]["regex"] == "[a-z]+"
    assert "tool_choice" not in chat_of({"input": "x", "tool_choice": "auto"})      # "auto" without tools


@pytest.mark.parametrize("body, param, code", [
    ({}, "/input", "missing_required_parameter"),
    ({"input": []}, "/input", "invalid_value"),
    ({"input": 3}, "/input", "invalid_type"),
    ({"input": [{"role": "tool", "content": "x"}]}, "/input/0/role", "invalid_value"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "/input/0/content/0/type", "unsupported_parameter"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
     "/input/0/content/0/type", "unsupported_parameter"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "/input/0/type", "unsupported_parameter"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "/input/0/type", "unsupported_parameter"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, "/input/0/call_id", "invalid_value"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "/tools/0/type", "unsupported_parameter"),
    ({"input": "x", "tools": [TOOL, {"type": "file_search", "vector_store_ids": []}]}, "/tools/1/type",
     "unsupported_parameter"),
    ({"input": "x", "tools": [TOOL], "tool_choice": {"type": "web_search_preview"}}, "/tool_choice/type",
     "unsupported_parameter"),
    ({"input": "x", "tools": [{**TOOL, "name": "bad name"}]}, "/tools/0/name", "invalid_value"),
    ({"input": "x", "tools": [TOOL, TOOL]}, "/tools/1/name", "invalid_value"),
    ({"input": "x", "tools": [TOOL], "tool_choice": {"type": "function", "name": "nope"}}, "/tool_choice/name",
     "invalid_value"),
    ({"input": "x", "tools": [TOOL], "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": [
        {"type": "function", "name": "nope"}]}}, "/tool_choice/tools/0/name", "invalid_value"),
    ({"input": "x", "tool_choice": "required"}, "/tool_choice", "invalid_value"),
    ({"input": "x", "tools": [TOOL], "text": {"format": SCHEMA_FORMAT}}, "/text/format", "unsupported_parameter"),
    ({"input": "x", "text": {"format": {**SCHEMA_FORMAT, "name": "a b"}}}, "/text/format/name", "invalid_value"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}}, "/text/format/name",
     "missing_required_parameter"),
    ({"input": "x", "text": {"format": {"type": "grammar"}}}, "/text/format/type", "invalid_value"),
    ({"input": "x", "text": {"format": SCHEMA_FORMAT}, "structured_outputs": {"regex": "a"}},
     "/structured_outputs/regex", "invalid_value"),
    ({"input": "x", "previous_response_id": "resp_1"}, "/previous_response_id", "unsupported_parameter"),
    ({"input": "x", "conversation": "conv_1"}, "/conversation", "unsupported_parameter"),
    ({"input": "x", "prompt": {"id": "pmpt_1"}}, "/prompt", "unsupported_parameter"),
    ({"input": "x", "background": True}, "/background", "unsupported_parameter"),
    ({"input": "x", "reasoning": {"effort": "high"}}, "/reasoning/effort", "unsupported_parameter"),
    ({"input": "x", "reasoning": {"summary": "auto"}}, "/reasoning/summary", "unsupported_parameter"),
    ({"input": "x", "include": ["message.output_text.logprobs"]}, "/include/0", "unsupported_parameter"),
    ({"input": "x", "top_logprobs": 2}, "/top_logprobs", "unsupported_parameter"),
    ({"input": "x", "truncation": "auto"}, "/truncation", "unsupported_parameter"),
    ({"input": "x", "context_management": [{"type": "compaction"}]}, "/context_management", "unsupported_parameter"),
    ({"input": "x", "stream_options": {"include_obfuscation": True}}, "/stream_options", "invalid_value"),
    ({"input": "x", "max_output_tokens": 0}, "/max_output_tokens", "invalid_value"),
    ({"input": "x", "max_output_tokens": 10 ** 6}, "/max_output_tokens", "invalid_value"),
    ({"input": "x", "temperature": 2.5}, "/temperature", "invalid_value"),
    ({"input": "x", "top_p": 0}, "/top_p", "invalid_value"),
    ({"input": "x", "seed": 2 ** 70}, "/seed", "invalid_value"),
    ({"input": "x", "metadata": {"k" * 65: "v"}}, "/metadata/" + "k" * 65, "invalid_value"),
    ({"input": "x", "metadata": {str(i): "v" for i in range(17)}}, "/metadata", "invalid_value"),
])
def test_refusals_point_into_the_responses_body(body, param, code):
    with pytest.raises(p.RequestError) as err:
        decode(body)
    assert (err.value.status, err.value.param, err.value.code) == (400, param, code), err.value.message
    assert "response_format" not in err.value.message and "max_completion_tokens" not in err.value.message


def test_chat_refusals_are_re_rooted_at_the_responses_field():
    origins = ["/instructions", "/input/0", "/input/2"]
    cases = {"/tools/3/function/parameters/properties/x/type": "/tools/3/parameters/properties/x/type",
             "/tools/3/function/name": "/tools/3/name", "/tools": "/tools",
             "/response_format/json_schema/schema/properties/age": "/text/format/schema/properties/age",
             "/response_format": "/text/format", "/tool_choice/function/name": "/tool_choice/name",
             "/tool_choice/allowed_tools/tools/1/function/name": "/tool_choice/tools/1/name",
             "/messages/2/content": "/input/2", "/messages": "/input", "/max_completion_tokens": "/max_output_tokens",
             "/temperature": "/temperature", "/structured_outputs/json/type": "/structured_outputs/json/type"}
    for chat_param, param in cases.items():
        e = r.remap_error(p.RequestError("no", chat_param, status=400, code="invalid_schema"), origins)
        assert (e.param, e.status, e.code) == (param, 400, "invalid_schema")
    e = r.remap_error(p.RequestError("slow down", None, status=429, code="rate_limit_exceeded"), origins)
    assert (e.param, e.status, e.type) == (None, 429, "rate_limit_error")


def chat_answer(content: str | None, calls: list[tuple[str, str]] = (), finish: str = "stop") -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [{"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}}
                                 for i, (n, a) in enumerate(calls)]
    return {"id": "chatcmpl-1", "object": "chat.completion", "model": "tiny", "choices": [
        {"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}


def test_chat_answers_become_response_objects():
    t = decode({"input": "x", "tools": [TOOL], "metadata": {"k": "v"}, "text": {"verbosity": "low"}, "user": "u"})
    out = json.loads(p.encode(r.response_from_chat(t, chat_answer("hello"), "resp_1", 5)))
    assert (out["id"], out["object"], out["created_at"], out["status"], out["model"]) == (
        "resp_1", "response", 5, "completed", "tiny")
    [message] = out["output"]
    assert message["type"] == "message" and message["role"] == "assistant" and message["status"] == "completed"
    assert message["id"].startswith("msg_") and message["content"] == [
        {"type": "output_text", "text": "hello", "annotations": [], "logprobs": []}]
    assert out["usage"] == {"input_tokens": 7, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                            "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 10}
    assert (out["store"], out["metadata"], out["user"], out["tool_choice"], out["incomplete_details"]) == (
        False, {"k": "v"}, "u", "auto", None)
    assert out["tools"] == [TOOL] and out["text"] == {"format": {"type": "text"}, "verbosity": "low"}
    out = json.loads(p.encode(r.response_from_chat(t, chat_answer(None, [("get_weather", '{"city":"P"}')] * 2,
                                                                    "tool_calls"), "resp_2", 5)))
    assert [(o["type"], o["call_id"], o["name"], o["status"]) for o in out["output"]] == [
        ("function_call", "call_0", "get_weather", "completed"), ("function_call", "call_1", "get_weather", "completed")]
    assert all(o["id"].startswith("fc_") and o["arguments"] == '{"city":"P"}' for o in out["output"])
    out = json.loads(p.encode(r.response_from_chat(t, chat_answer("cut sho", finish="length"), "resp_3", 5)))
    assert (out["status"], out["incomplete_details"], out["output"][0]["status"]) == (
        "incomplete", {"reason": "max_output_tokens"}, "incomplete")


def sse_chunks(*deltas: dict, finish: str = "stop") -> list[bytes]:
    """A chat stream as the chat path writes it (stream_options.include_usage on)."""
    def chunk(delta: dict, reason: str | None = None) -> bytes:
        return p.sse_event({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "tiny", "choices": [
            {"index": 0, "delta": delta, "finish_reason": reason}], "usage": None})
    out = [chunk({"role": "assistant", "content": ""})] + [chunk(d) for d in deltas] + [chunk({}, finish)]
    out.append(p.sse_event({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "tiny", "choices": [],
                            "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}}))
    return out + [p.SSE_DONE]


class FakeStream:
    """The chat path's events; remembers being closed (the request released)."""

    def __init__(self, events: list[bytes], fail: Exception | None = None):
        self.events, self.fail, self.closed = list(events), fail, False

    def __aiter__(self):
        return self

    async def __anext__(self) -> bytes:
        if self.events:
            return self.events.pop(0)
        if self.fail is not None:
            raise self.fail
        raise StopAsyncIteration

    async def aclose(self) -> None:
        self.closed = True


def run_stream(body: dict, chunks: FakeStream) -> list[dict]:
    t = decode({**body, "stream": True})

    async def collect() -> list[bytes]:
        return [e async for e in r._events(t, chunks, "resp_1", 5, "tiny")]

    events = []
    for raw in asyncio.run(collect()):
        head, data = raw.decode().split("\n", 1)
        event = json.loads(data.removeprefix("data: "))
        assert head == f"event: {event['type']}" and raw.endswith(b"\n\n")
        events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert chunks.closed
    return events


def test_chat_streams_become_responses_events():
    chunks = FakeStream(sse_chunks({"content": "Hel"}, {"content": "lo"},
                                   {"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                                    "function": {"name": "get_weather", "arguments": '{"ci'}}]},
                                   {"tool_calls": [{"index": 0, "function": {"arguments": 'ty":"P"}'}}]},
                                   {"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                                                    "function": {"name": "get_weather", "arguments": "{}"}}]},
                                   finish="tool_calls"))
    events = run_stream({"input": "x", "tools": [TOOL]}, chunks)
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    assert events[6]["text"] == "Hello" and events[7]["part"]["text"] == "Hello"
    assert events[12]["arguments"] == '{"city":"P"}' and events[12]["name"] == "get_weather"
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.done"] == [0, 1, 2]
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["usage"]["total_tokens"] == 6
    assert [(o["type"], o.get("call_id"), o["status"]) for o in final["output"]] == [
        ("message", None, "completed"), ("function_call", "call_a", "completed"), ("function_call", "call_b", "completed")]
    assert final["output"][0]["content"][0]["text"] == "Hello"


def test_a_cut_stream_is_incomplete_and_a_failed_one_ends_with_an_error_event():
    events = run_stream({"input": "x"}, FakeStream(sse_chunks({"content": "abc"}, finish="length")))
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert events[-2]["type"] == "response.output_item.done" and events[-2]["item"]["status"] == "incomplete"
    empty = run_stream({"input": "x"}, FakeStream(sse_chunks()))       # an empty answer is an empty message
    assert empty[-1]["response"]["output"][0]["content"][0]["text"] == ""
    failing = FakeStream(sse_chunks({"content": "abc"})[:2], p.RequestError(
        "too costly", None, status=400, code="grammar_too_costly"))
    events = run_stream({"input": "x"}, failing)
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert (events[-2]["code"], events[-2]["message"], events[-2]["param"]) == ("grammar_too_costly", "too costly", None)
    assert events[-1]["response"]["status"] == "failed"
    assert events[-1]["response"]["error"] == {"code": "grammar_too_costly", "message": "too costly"}
    broken = run_stream({"input": "x"}, FakeStream([], RuntimeError("boom")))
    assert broken[-2]["code"] == "server_error" and broken[-1]["type"] == "response.failed"


def test_respond_sends_the_chat_body_and_re_roots_its_refusals():
    sent: list[bytes] = []

    async def chat(tenant: str, body: bytes) -> bytes:
        sent.append(body)
        req = p.decode_chat_request(body)
        if req.tools:
            raise p.RequestError("invalid JSON Schema: no", "/tools/0/function/parameters/type", code="invalid_schema")
        return p.encode(msgspec.convert(chat_answer("hi"), p.ChatCompletion))

    out = json.loads(asyncio.run(r.respond(chat, "t", b'{"input": "x"}', model_name="tiny")))
    assert out["output"][0]["content"][0]["text"] == "hi" and out["id"].startswith("resp_")
    assert json.loads(sent[0])["messages"] == [{"role": "user", "content": "x"}]
    with pytest.raises(p.RequestError) as err:
        asyncio.run(r.respond(chat, "t", json.dumps({"input": "x", "tools": [TOOL]}).encode(), model_name="tiny"))
    assert err.value.param == "/tools/0/parameters/type" and err.value.code == "invalid_schema"
    with pytest.raises(p.RequestError) as err:
        asyncio.run(r.respond(chat, "t", b'{"input": "xxxx"}', model_name="tiny", max_body_bytes=8))
    assert err.value.status == 413
