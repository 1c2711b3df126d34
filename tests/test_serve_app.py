"""The Serve application through the official `openai` client: a local application (the tiny
random model, loopback only, started once for the module on the session's Ray).

A random model is the hardest case for a grammar: whatever it samples, what comes back must be
valid. A response that finished (`stop`, `tool_calls`) must parse and validate; one cut by
`max_tokens` (`length`) must be a prefix the grammar accepts. Sampling is seeded, so each request
gives the same output on every run.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.request

import jsonschema
import numpy as np
import openai
import pytest

from xg2.actors import GrammarRuntime
from xg2.errors import AccessError, SessionError, XG2Error

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0,
                                                                          "maximum": 99}},
          "required": ["ok", "n"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "set_unit", "description": "Set the unit.", "parameters": {
        "type": "object", "properties": {"unit": {"enum": ["c", "f"]}}, "required": ["unit"],
        "additionalProperties": False}}},
    {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"],
        "additionalProperties": False}}},
]
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


#: The application's tenants, each with its key (serve/keys.py), and an operator with the admin key.
TENANTS = ["tenant-a", "tenant-b", "probe", "engine-1", "engine-2"] + [f"tenant-d{i}" for i in range(12)]


def key(tenant: str) -> str:
    return f"sk-{tenant}-0123456789abcdef"


ADMIN_KEY = "sk-operator-0123456789abcdef"


@pytest.fixture(scope="module")
def app(serve_local):
    from serve.cli import Server
    from serve.keys import KeyRing

    ring = KeyRing([(key(t), t, False) for t in TENANTS] + [(ADMIN_KEY, "operator", True)])
    server = Server(model="tiny", port=serve_local, shards=1, progress=False, api_keys=ring, mask_replicas=1,
                    options={"max_requests_per_tenant": 2, "max_tokens_limit": 512})
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def loaded():
    from serve.model import load_model

    return load_model("tiny", progress=False)


@pytest.fixture(scope="module")
def reference(loaded):
    """An in-process runtime on the same vocabulary: the grammar's judgement of an output."""
    from serve.model import tokenizer_info

    return GrammarRuntime(tokenizer_info(loaded))


def client(app, tenant: str = "tenant-a"):
    return openai.OpenAI(base_url=app.url, api_key=key(tenant), max_retries=0, timeout=120)


def stats(app, api_key: str | None) -> tuple[int, dict]:
    headers = {} if api_key is None else {"Authorization": f"Bearer {api_key}"}
    try:
        with urllib.request.urlopen(urllib.request.Request(app.url + "/xg2/stats", headers=headers), timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def accepted_by(reference, grammar: dict, text: str) -> bool:
    """Whether the grammar accepts `text` (as a prefix of an output)."""
    import asyncio

    session = asyncio.run(reference.open({"grammar": grammar}))
    try:
        return session.matcher.accept_string(text)
    finally:
        reference.close(session)


def test_health_models_and_keys(app):
    with urllib.request.urlopen(app.url.removesuffix("/v1") + "/health") as r:
        assert r.status == 200
    assert [m.id for m in client(app).models.list().data] == ["tiny"]
    body = json.dumps({"model": "tiny", "messages": MESSAGES, "max_tokens": 2}).encode()
    request = urllib.request.Request(app.url + "/chat/completions", body, {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:          # no key: 401, OpenAI's error object
        urllib.request.urlopen(request)
    assert err.value.code == 401 and json.loads(err.value.read())["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):             # a key not in the file: 401 too
        openai.OpenAI(base_url=app.url, api_key="sk-someone-else-0123456789", max_retries=0).chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=2)


def test_stats_show_a_tenant_its_own_figures_and_the_admin_all(app):
    client(app, "tenant-a").chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2)
    client(app, "tenant-b").chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2)
    assert stats(app, None)[0] == 401 and stats(app, "sk-unknown-0123456789abcdef")[0] == 401
    status, mine = stats(app, key("tenant-a"))
    assert status == 200 and mine["tenant"] == "tenant-a"
    assert mine["recent"] and {r["tenant"] for r in mine["recent"]} == {"tenant-a"}
    assert "tenant-b" not in json.dumps(mine)          # no other tenant's name or figures
    assert "runtime" not in mine and "compile_usage" in mine
    status, everything = stats(app, ADMIN_KEY)
    assert status == 200 and {"tenant-a", "tenant-b"} <= {r["tenant"] for r in everything["recent"]}
    assert "runtime" in everything and "reuse" in everything


def test_json_schema_responses_parse_and_validate(app, reference):
    c = client(app)
    finished = 0
    for seed in range(6):
        r = c.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=40, seed=seed,
            response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}},
            extra_body={"structured_outputs": {"disable_any_whitespace": True}})
        choice = r.choices[0]
        text = choice.message.content
        assert r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 0
        if choice.finish_reason == "stop":
            jsonschema.validate(json.loads(text), SCHEMA)
            finished += 1
        else:
            assert choice.finish_reason == "length"
            grammar = {"type": "json_schema", "schema": SCHEMA, "any_whitespace": False}
            assert accepted_by(reference, grammar, text), text
    assert finished >= 3


def test_json_object_and_completions_grammars(app, reference):
    c = client(app)
    r = c.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=24, seed=1,
                                  response_format={"type": "json_object"})
    text = r.choices[0].message.content
    assert text.startswith("{")
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    regex = r"[a-c]{2,4}-[0-9]{1,2}"
    r = c.completions.create(model="tiny", prompt="code:", max_tokens=12, seed=3, extra_body={"guided_regex": regex})
    import re

    assert r.choices[0].finish_reason == "stop" and re.fullmatch(regex, r.choices[0].text), r.choices[0].text
    ebnf = 'root ::= "yes" | "no" | "maybe"'
    r = c.completions.create(model="tiny", prompt="answer:", max_tokens=8, seed=0, extra_body={"guided_grammar": ebnf})
    assert r.choices[0].text in ("yes", "no", "maybe")


def test_tool_calls_parse_and_validate(app):
    c = client(app)
    calls = 0
    for seed in range(6):
        for choice_arg in ("required", {"type": "function", "function": {"name": "get_weather"}}):
            r = c.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice=choice_arg,
                                          max_tokens=120, seed=seed)
            choice = r.choices[0]
            # cut by max_tokens inside a call: `length`, the whole calls before it, and no markup
            assert choice.finish_reason in ("tool_calls", "length"), choice
            assert not choice.message.content, choice.message.content   # no text before a required call
            for call in choice.message.tool_calls or ():
                tool = {t["function"]["name"]: t for t in TOOLS}[call.function.name]
                jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
                if isinstance(choice_arg, dict):
                    assert call.function.name == "get_weather"
                calls += 1
            if choice.finish_reason == "tool_calls":
                assert choice.message.tool_calls
    assert calls >= 4


def test_streaming_gives_what_the_whole_response_gives(app):
    c = client(app)
    kwargs = {"model": "tiny", "messages": MESSAGES, "max_tokens": 30, "seed": 7}
    whole = c.chat.completions.create(**kwargs)
    chunks = list(c.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    # a streamed tool call arrives whole in tool_calls deltas
    for seed in range(4):
        stream = c.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=120, seed=seed, stream=True)
        deltas = [ch.choices[0] for ch in stream if ch.choices]
        if deltas[-1].finish_reason == "tool_calls":
            calls = [tc for d in deltas for tc in (d.delta.tool_calls or [])]
            assert calls and all(json.loads(tc.function.arguments) is not None for tc in calls)
            return
    pytest.fail("no streamed request of four finished with a tool call")


def test_bad_requests_get_400_with_a_pointer(app):
    c = client(app)
    bad_schema = {"type": "object", "properties": {"a": {"type": "strin"}}}
    cases = [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": bad_schema}}},
         "/response_format/json_schema/schema/properties/a/type"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "/tool_choice/function/name"),
        ({"tools": [TOOLS[0], {"type": "function", "function": {"name": "b", "parameters": bad_schema}}]},
         "/tools/1/function/parameters/properties/a/type"),
        ({"temperature": 7}, "/temperature"),
    ]
    for extra, pointer in cases:
        with pytest.raises(openai.BadRequestError) as err:
            c.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, **extra)
        assert err.value.status_code == 400 and err.value.body["param"] == pointer, err.value.body
    with pytest.raises(openai.BadRequestError) as err:
        c.completions.create(model="tiny", prompt="x", max_tokens=4, extra_body={"guided_grammar": 'root ::= "a" |'})
    assert err.value.body["param"] == "/guided_grammar" and "line 1" in err.value.body["message"]


def test_responses_refusals_point_into_the_responses_body(app):
    """The Responses API is served by the chat path: its refusals, those found while compiling
    included, name the Responses field (serve/responses.py)."""
    c = client(app)
    bad_schema = {"type": "object", "properties": {"a": {"type": "strin"}}}
    flat = [{"type": "function", **t["function"]} for t in TOOLS]
    cases = [
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": bad_schema}}},
         "/text/format/schema/properties/a/type"),
        ({"tools": [flat[0], {"type": "function", "name": "b", "parameters": bad_schema}], "tool_choice": "required"},
         "/tools/1/parameters/properties/a/type"),
        ({"tools": flat, "tool_choice": {"type": "function", "name": "nope"}}, "/tool_choice/name"),
        ({"tools": [{"type": "web_search"}]}, "/tools/0/type"),
        ({"previous_response_id": "resp_1"}, "/previous_response_id"),
        ({"reasoning": {"effort": "high"}}, "/reasoning/effort"),
    ]
    for extra, pointer in cases:
        with pytest.raises(openai.BadRequestError) as err:
            c.responses.create(model="tiny", input="x", max_output_tokens=4, **extra)
        assert err.value.status_code == 400 and err.value.body["param"] == pointer, err.value.body
    r = c.responses.create(model="tiny", input=[{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
                           max_output_tokens=3, extra_body={"seed": 1})
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3 and r.output[0].status == "incomplete"


def test_two_tenants_limits_are_kept_apart(app):
    """Tenant A at its bound of requests in flight (2 here) is refused a third with 429; tenant B,
    at the same moment, is served."""
    a = client(app, "tenant-a")
    started = threading.Barrier(3)
    streams = []

    def hold():
        s = a.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=400, seed=1, stream=True)
        it = iter(s)
        next(it)
        streams.append(s)
        started.wait(timeout=60)

    threads = [threading.Thread(target=hold) for _ in range(2)]
    for t in threads:
        t.start()
    started.wait(timeout=60)
    try:
        with pytest.raises(openai.RateLimitError):
            a.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2)
        r = client(app, "tenant-b").chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2)
        assert r.choices[0].finish_reason in ("stop", "length")
    finally:
        for s in streams:
            s.close()
        for t in threads:
            t.join(timeout=60)


def test_mask_service_handle_gives_the_in_process_masks(app, loaded, reference):
    """The mask service through its Serve handle: open, packed steps (StepClient), close; each
    row equals an in-process session's."""
    import asyncio

    from ray import serve

    from xg2.actors.host import StepClient

    handle = serve.get_app_handle("xg2-masks")
    spec = {"grammar": {"type": "json_schema", "schema": SCHEMA}}
    client_ = StepClient(handle, key("engine-1"), loaded.vocab_size)
    sid = client_.open(spec)
    local = asyncio.run(reference.open(spec))
    width = (loaded.vocab_size + 31) // 32
    row = np.zeros((1, width), np.int32)
    text = '{"ok": true, "n": 42}'
    tokens = loaded.tokenizer.encode(text, add_special_tokens=False)
    try:
        reference.fill([local], row)
        assert np.array_equal(client_.mask(sid), row[0])
        for t in tokens:
            rows, accepted, ended = client_.step([sid], [t])
            assert reference.accept([local], [t]) == [True] and accepted == [True] and ended == [False]
            reference.fill([local], row)
            assert np.array_equal(rows[0], row[0])
        # The session is its key's tenant's: another key cannot see it, an unknown key is refused.
        assert handle.close.remote(key("engine-2"), [sid]).result() == 0     # not engine-2's: nothing closed
        with pytest.raises(SessionError):
            StepClient(handle, key("engine-2"), loaded.vocab_size).step([sid], [None])
        with pytest.raises(AccessError):
            StepClient(handle, "engine-1", loaded.vocab_size).open(spec)    # a tenant's name is not its key
        assert handle.close.remote(key("engine-1"), [sid]).result() == 1
        with pytest.raises(XG2Error):
            client_.step([sid], [None])
    finally:
        reference.close(local)


def test_each_response_says_where_its_grammar_came_from(app):
    """The X-XG2-Grammar header: a new tool set is compiled (its tools lowered), the same set again
    is found in the replica's cache; a request without a grammar has no header."""
    tools = [{"type": "function", "function": {"name": f"probe_{i}", "parameters": {
        "type": "object", "properties": {f"field_{i}": {"type": "integer", "maximum": 1000 + i}},
        "required": [f"field_{i}"]}}} for i in range(3)]

    def grammar_header(body: dict) -> dict | None:
        request = urllib.request.Request(app.url + "/chat/completions", data=json.dumps(body).encode(),
                                         headers={"Authorization": f"Bearer {key('probe')}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request) as r:
            value = r.headers.get("x-xg2-grammar")
        return None if value is None else json.loads(value)

    body = {"model": "tiny", "messages": MESSAGES, "tools": tools, "tool_choice": "required", "max_tokens": 4}
    first = grammar_header(body)
    assert first["from"] == "compiled" and first["modules_lowered"] == 3, first
    assert first["ready_ms"] > 0 and first["replica"]
    again = grammar_header(body)
    assert again["from"] == "local" and "modules_lowered" not in again, again
    assert grammar_header({"model": "tiny", "messages": MESSAGES, "max_tokens": 2}) is None


def test_clients_that_go_at_any_point_leave_the_others_and_every_counter_alone(app, reference):
    """24 requests at once from 12 tenants, half streamed; a third of the clients go away before
    the response starts, after its first bytes, or in the middle of the stream. Every other request
    finishes with a valid answer, and once all are done the replica holds nothing of the ones that
    went: no request in flight, no open session, no row in the decoding batch."""
    import asyncio
    import random

    import aiohttp

    pattern = r"[a-z]{2,10}( [a-z]{2,10}){1,5}\."
    grammar = {"type": "regex", "pattern": pattern}
    rng = random.Random(34)
    plan = [(i, bool(i % 2), rng.choice(["stay", "stay", "before", "first", "middle"])) for i in range(24)]

    async def one(session, i, stream, leave):
        body = {"model": "tiny", "prompt": f"Request {i}:", "max_tokens": 40, "temperature": 0.9, "seed": i,
                "guided_regex": pattern, "stream": stream}
        headers = {"Authorization": f"Bearer {key(f'tenant-d{i % 12}')}"}
        try:
            if leave == "before":
                await asyncio.wait_for(session.post(app.url + "/completions", json=body, headers=headers), 0.05)
                return i, leave, None
            async with session.post(app.url + "/completions", json=body, headers=headers) as r:
                if leave == "stay":
                    return i, leave, (r.status, await r.read())
                await r.content.readline()
                if leave == "middle":
                    for _ in range(4):
                        await r.content.readline()
                r.close()           # the client goes, the connection with it
                return i, leave, None
        except (asyncio.TimeoutError, aiohttp.ClientError):
            return i, leave, None

    async def run():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            return await asyncio.gather(*(one(session, *p) for p in plan))

    results = asyncio.run(run())
    stayed = [(i, out) for i, leave, out in results if leave == "stay"]
    assert len(stayed) >= 8
    for i, (status, data) in stayed:
        assert status == 200, (i, data[:300])
        stream = plan[i][1]
        if stream:
            events = [json.loads(line[6:]) for line in data.decode().splitlines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
            text = "".join(e["choices"][0]["text"] for e in events if e.get("choices"))
            finish = [e["choices"][0]["finish_reason"] for e in events if e.get("choices")][-1]
        else:
            answer = json.loads(data)
            text, finish = answer["choices"][0]["text"], answer["choices"][0]["finish_reason"]
        assert accepted_by(reference, grammar, text), (i, text)
        if finish == "stop":
            assert re.fullmatch(pattern, text), (i, text)
    deadline = time.monotonic() + 30
    while True:
        _, figures = stats(app, ADMIN_KEY)
        held = (figures["requests_in_flight"], figures["open_sessions"], figures["engine_rows"])
        if held == (0, 0, 0) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert held == (0, 0, 0), held
