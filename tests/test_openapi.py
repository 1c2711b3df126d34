"""The application's OpenAPI document and bad requests, generated: the tiny app (loopback only,
started once for the module on the session's Ray, through the ingress as users reach it) serves
its document at /openapi.json with every route's body and answers; schemathesis's generated
requests (a small sample of loadtests/openapi_fuzz.py's run) and a seeded generator of malformed
bodies get no answer >= 500, and every 4xx is an OpenAI error object."""

from __future__ import annotations

import importlib.util
import json
import random
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("loadtests_openapi_fuzz", ROOT / "loadtests" / "openapi_fuzz.py")
fuzz = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fuzz)
is_openai_error = fuzz.is_openai_error

KEY = "sk-openapi-test"
ROUTES = {("post", "/v1/chat/completions"), ("post", "/v1/completions"), ("post", "/v1/responses"),
          ("get", "/v1/models"), ("get", "/health"), ("get", "/v1/xg2/stats")}


@pytest.fixture(scope="module")
def app(serve_local):
    from serve.cli import Server

    server = Server(model="tiny", port=serve_local, shards=1, progress=False, mask_service=False,
                    options=dict(fuzz.APP_OPTIONS))
    server.start()
    yield server
    server.stop()


def _base(app) -> str:
    return app.url.removesuffix("/v1")


def send(url: str, body: bytes | None = None, method: str | None = None) -> tuple[int, Any, bytes]:
    """(status, headers (case-insensitive), body) of a request with the test's key."""
    request = urllib.request.Request(url, body, {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
                                     method=method)
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def test_the_document_describes_every_route_its_body_and_its_answers(app):
    from serve.app import openapi_document

    status, headers, body = send(_base(app) + "/openapi.json")
    assert status == 200 and headers["content-type"].startswith("application/json")
    doc = json.loads(body)
    assert doc == json.loads(json.dumps(openapi_document()))     # the replicas' own, through the ingress
    ops = {(method, path): op for path, item in doc["paths"].items() for method, op in item.items()}
    assert set(ops) == ROUTES
    schemas = doc["components"]["schemas"]
    for path, name, required in (("/v1/chat/completions", "ChatCompletionRequest", "messages"),
                                 ("/v1/completions", "CompletionRequest", "prompt"),
                                 ("/v1/responses", "ResponseCreateRequest", "input")):
        op = ops["post", path]
        assert op["requestBody"]["required"] is True
        assert op["requestBody"]["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{name}"}
        assert required in schemas[name]["required"]
        assert {"max_tokens", "max_output_tokens"} & set(schemas[name]["properties"])
        assert set(op["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
        assert op["security"] == [{"bearer": []}]
    # the bounds the validators add are in the document
    chat = schemas["ChatCompletionRequest"]["properties"]
    assert chat["messages"]["minItems"] == 1
    assert {"type": "number", "minimum": 0, "maximum": 2} in chat["temperature"]["anyOf"]
    # every 4xx answer is OpenAI's error object, all four fields always written
    for (method, path), op in ops.items():
        assert "200" in op["responses"] and op["responses"]["200"]["content"], (method, path)
        for status_code, answer in op["responses"].items():
            if status_code.startswith(("4", "5")):
                assert answer["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorResponse"}
    assert schemas["ErrorDetail"]["required"] == ["message", "type", "param", "code"]
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http", "scheme": "bearer", "description": "the API key (`Authorization: Bearer KEY`)"}
    for docs in ("/docs", "/redoc"):        # no documentation pages
        status, _, body = send(_base(app) + docs)
        assert status == 404 and is_openai_error(body)


def test_unknown_routes_and_methods_are_openai_errors_through_the_ingress(app):
    status, _, body = send(_base(app) + "/v1/nowhere")
    assert status == 404 and json.loads(body)["error"]["code"] == "not_found"
    status, headers, body = send(app.url + "/models", b"{}", method="PUT")
    assert status == 405 and is_openai_error(body) and headers["allow"] == "GET, HEAD"
    status, headers, body = send(app.url + "/chat/completions")      # a GET
    assert status == 405 and is_openai_error(body) and headers["allow"] == "POST"
    status, _, body = send(_base(app) + "/health", method="HEAD")   # GET, without the body
    assert status == 200 and body == b""


def test_the_replicas_framework_refusals_are_openai_errors_too():
    """The replicas' own FastAPI app (what router="default" serves): no such route, a method the
    route does not take; its document is the same one."""
    testclient = pytest.importorskip("starlette.testclient")
    from serve.app import api, openapi_document

    client = testclient.TestClient(api)
    answer = client.get("/v1/nowhere")
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "not_found"
    answer = client.put("/v1/models")
    assert answer.status_code == 405 and answer.json()["error"]["code"] == "method_not_allowed"
    assert answer.headers["allow"] == "GET"
    assert client.get("/docs").status_code == 404
    assert client.get("/openapi.json").json() == json.loads(json.dumps(openapi_document()))


def test_generated_requests_get_no_server_error_and_openai_errors(app):
    assert importlib.util.find_spec("schemathesis") is not None, "schemathesis is in the test extra: install it"
    summary = fuzz.run_schemathesis(_base(app), key=KEY, examples=80, seed=7, phases="examples,fuzzing", max_time=240)
    print(fuzz.report(summary))
    # How many requests Hypothesis generates per route within --max-examples depends on the
    # machine's speed (163 on a quiet machine; 91 with CI beside another job, 8 of them to
    # /v1/completions): the bound is that every route was reached and the two bodies tried.
    assert summary["requests"] >= 60, fuzz.report(summary)
    assert summary["server_errors"] == 0, fuzz.report(summary)
    assert summary["non_openai_4xx"] == 0, fuzz.report(summary)
    assert {f"{m.upper()} {p}" for m, p in ROUTES} <= set(summary["per_route"]), fuzz.report(summary)
    for route in ("POST /v1/chat/completions", "POST /v1/completions", "POST /v1/responses"):
        assert sum(summary["per_route"][route].values()) >= 5, fuzz.report(summary)


# ------------------------------------------------------------------------------------------------
# A seeded generator of malformed bodies (with or without schemathesis)
# ------------------------------------------------------------------------------------------------

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
COMPLETION = {"prompt": "hi", "max_tokens": 4}
RESPONSES = {"input": [{"role": "user", "content": "hi"}], "max_output_tokens": 4}
ODD_VALUES = [None, True, False, 0, -1, 1.5, 2 ** 63, -(2 ** 63) - 1, 2 ** 70, 1e308, -0.0, "", "x" * 300, "\u0000",
              "\ud7ff\ue000", [], [None], {}, {"type": 5}, {"$ref": "#/nowhere"}, {"type": "array", "minItems": 2 ** 65},
              {"pattern": "("}, "root ::= x", "(", [{"role": "robot"}], [{"role": "user", "content": [{"type": "image"}]}],
              {"type": "function"}, {"format": {"type": "regex", "pattern": "["}}, [""] * 3]
FIELDS = ["messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "n", "stop",
          "stream", "stream_options", "tools", "tool_choice", "response_format", "guided_json", "guided_regex",
          "guided_grammar", "guided_choice", "structural_tag", "structured_outputs", "echo", "suffix", "best_of",
          "chat_template_kwargs", "model", "user", "parallel_tool_calls"]
RESPONSES_FIELDS = ["input", "instructions", "max_output_tokens", "temperature", "top_p", "seed", "stream",
                    "stream_options", "tools", "tool_choice", "text", "reasoning", "include", "metadata", "store",
                    "previous_response_id", "background", "truncation", "top_logprobs", "parallel_tool_calls"]


def malformed(rng: random.Random) -> tuple[str, bytes]:
    """A route and a body that is (most likely) wrong: truncated or broken JSON, not an object,
    a field of the wrong type or out of bounds, a required field missing, deep nesting."""
    route, body, fields = rng.choice([("/v1/chat/completions", CHAT, FIELDS), ("/v1/completions", COMPLETION, FIELDS),
                                      ("/v1/responses", RESPONSES, RESPONSES_FIELDS)])
    body = json.loads(json.dumps(body))
    kind = rng.randrange(7)
    if kind == 0:
        raw = json.dumps(body).encode()
        return route, raw[:rng.randrange(len(raw))]
    if kind == 1:
        return route, bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
    if kind == 2:
        return route, json.dumps(rng.choice(ODD_VALUES)).encode()
    if kind == 3:
        body.pop(rng.choice(["messages", "prompt", "input"]), None)
    elif kind == 4:     # (the bodies above hold no null but this one)
        depth = rng.choice([50, 500, 5000])
        raw = json.dumps({**body, rng.choice(fields): None}).replace("null", "[" * depth + "]" * depth, 1)
        return route, raw.encode()
    for _ in range(rng.randrange(1, 4)):
        body[rng.choice(fields)] = rng.choice(ODD_VALUES)
    return route, json.dumps(body).encode()


def test_seeded_malformed_bodies_get_openai_errors_and_no_server_error(app):
    rng = random.Random(34)
    statuses: dict[int, int] = {}
    for _ in range(150):
        route, body = malformed(rng)
        status, _, answer = send(app.url.removesuffix("/v1") + route, body)
        statuses[status] = statuses.get(status, 0) + 1
        assert status < 500, (route, body[:200], answer[:300])
        if status >= 400:
            assert is_openai_error(answer), (route, body[:200], answer[:300])
    assert statuses.get(400, 0) >= 100, statuses


@pytest.mark.parametrize("body, param", [
    (b'{"prompt": ""}', "/prompt"),
    (b'{"prompt": [""]}', "/prompt/0"),
    (b'{"prompt": "x", "seed": 9223372036854775808}', "/seed"),
    (b'{"prompt": "x", "seed": -9223372036854775809}', "/seed"),
    (b'{"prompt": "x", "guided_json": {"type": "array", "minItems": 99999999999999999999}}', "/guided_json/minItems"),
    (b'{"prompt": "x", "structural_tag": {"a/b": [0, -9999999999999999999]}}', "/structural_tag/a~1b/1"),
])
def test_what_the_generated_requests_found_is_refused_with_its_pointer(body, param):
    """Bodies that were server errors (an empty prompt, a seed or an integer past 64 bits) are 400s
    pointing at the field."""
    from serve import protocol as p

    with pytest.raises(p.RequestError) as err:
        p.decode_completion_request(body)
    assert err.value.status == 400 and err.value.param == param


def test_integers_within_64_bits_and_long_digit_runs_in_text_pass():
    from serve import protocol as p

    req = p.decode_completion_request(b'{"prompt": "call 12345678901234567890123", "seed": 9223372036854775807, '
                                      b'"guided_json": {"type": "integer", "maximum": 18446744073709551615}}')
    assert req.seed == 2 ** 63 - 1 and req.guided_json["maximum"] == 2 ** 64 - 1
