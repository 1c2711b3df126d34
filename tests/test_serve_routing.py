"""Grammar-affinity routing in the running application: two replicas of the tiny model behind the
ingress (started once for the module on the session's Ray, loopback only). Requests whose tools a
replica was sent go to that replica; when it is saturated (past the load bound, 1 here) they go to
the other; requests without a grammar are spread over both. Each answer names its replica in the
X-XG2-Replica header."""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import pytest

from xg2.errors import UsageError

MESSAGES = [{"role": "user", "content": "Call a tool."}]


def tools(n: int, tag: str) -> list[dict]:
    """`n` tools whose parameter schemas no other tag shares (each one module of its own)."""
    return [{"type": "function", "function": {"name": f"{tag}_{i}", "parameters": {
        "type": "object", "properties": {f"{tag}_field_{i}": {"type": "integer", "maximum": 100 + i}},
        "required": [f"{tag}_field_{i}"], "additionalProperties": False}}} for i in range(n)]


@pytest.fixture(scope="module")
def app(serve_local):
    from serve.cli import Server

    server = Server(model="tiny", port=serve_local, replicas=2, shards=1, progress=False, mask_service=False,
                    options={"routing_imbalance": 1, "max_tokens_limit": 2000})
    server.start()
    yield server
    server.stop()


def chat(app, tool_set: list[dict] | None, **extra) -> tuple[str, dict]:
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 4, **extra}
    if tool_set:
        body.update(tools=tool_set, tool_choice="required")
    request = urllib.request.Request(app.url + "/chat/completions", json.dumps(body).encode(),
                                     {"Authorization": "Bearer routing", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as r:
        return r.headers["x-xg2-replica"], json.loads(r.read())


def respond(app, tool_set: list[dict]) -> tuple[str, dict]:
    """A Responses request with the same tools (flat, as the Responses API has them)."""
    body = {"model": "tiny", "input": MESSAGES[0]["content"], "max_output_tokens": 4, "tool_choice": "required",
            "tools": [{"type": "function", **t["function"]} for t in tool_set]}
    request = urllib.request.Request(app.url + "/responses", json.dumps(body).encode(),
                                     {"Authorization": "Bearer routing", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as r:
        return r.headers["x-xg2-replica"], json.loads(r.read())


class HeldStream:
    """A streamed request kept open (its first event read) until closed: the replica counts it in
    its queue meanwhile."""

    def __init__(self, app, tool_set: list[dict]):
        url = urlsplit(app.url)
        self.conn = http.client.HTTPConnection(url.hostname, url.port, timeout=120)
        body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 1500, "stream": True, "seed": 1,
                "tools": tool_set, "tool_choice": "auto"}
        self.conn.request("POST", url.path + "/chat/completions", json.dumps(body),
                          {"Authorization": "Bearer holder", "Content-Type": "application/json"})
        response = self.conn.getresponse()
        assert response.status == 200
        self.replica = response.getheader("x-xg2-replica")
        assert response.readline().startswith(b"data: ")

    def close(self) -> None:
        self.conn.close()


def stats_of(app, replica: str, timeout_s: float = 30.0) -> dict:
    """`replica`'s /v1/xg2/stats (any replica answers; asked until that one does)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        request = urllib.request.Request(app.url + "/xg2/stats", headers={"Authorization": "Bearer routing-test"})
        with urllib.request.urlopen(request, timeout=30) as r:
            stats = json.loads(r.read())
        if stats["replica"]["id"] == replica:
            return stats
    raise AssertionError(f"replica {replica} did not answer /v1/xg2/stats within {timeout_s:.0f} s")


def test_requests_sharing_tools_go_to_the_replica_that_holds_them(app):
    shared = tools(6, "shared")
    home, first = chat(app, shared + tools(2, "own0"))
    assert first["choices"][0]["finish_reason"] in ("tool_calls", "length")
    # new sets as a whole, most of whose tools went to `home`
    assert [chat(app, shared + tools(2, f"own{i}"))[0] for i in range(1, 5)] == [home] * 4
    assert chat(app, shared + tools(2, "own0"))[0] == home      # the same set: its grammar is there
    replica, answer = respond(app, shared + tools(2, "own0"))    # through the Responses API: the same grammar
    assert replica == home and answer["object"] == "response"
    # requests without a grammar are spread by load alone: both replicas answer some
    seen = {chat(app, None, max_tokens=1)[0] for _ in range(16)}
    assert len(seen) == 2 and home in seen


def test_a_saturated_replica_passes_its_requests_to_the_other(app):
    held_set = tools(6, "busy") + tools(2, "held")
    home, _ = chat(app, held_set)
    streams = [HeldStream(app, held_set) for _ in range(2)]
    try:
        assert [s.replica for s in streams] == [home, home]     # at the bound: affinity holds
        # 2 requests in flight on `home`, none on the other: past the bound of 1
        elsewhere, _ = chat(app, tools(6, "busy") + tools(2, "probe"))
        assert elsewhere != home
    finally:
        for s in streams:
            s.close()
    # a client gone mid-stream ends its request on the replica (the ingress passes the cancel on)
    deadline = time.monotonic() + 30
    while stats_of(app, home)["open_sessions"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert stats_of(app, home)["open_sessions"] == 0
    assert chat(app, held_set)[0] == home       # unloaded again: back where its grammar is


def test_errors_and_unknown_routes_come_back_through_the_ingress(app):
    body = json.dumps({"model": "tiny", "messages": MESSAGES, "tools": tools(1, "bad") + [
        {"type": "function", "function": {"name": "b", "parameters": {"type": "strin"}}}]}).encode()
    request = urllib.request.Request(app.url + "/chat/completions", body,
                                     {"Authorization": "Bearer routing", "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=60)
    assert err.value.code == 400 and json.loads(err.value.read())["error"]["param"].startswith("/tools/1/")
    assert err.value.headers["x-xg2-replica"]       # answered by a replica, as over HTTP
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(app.url + "/nowhere", timeout=60)
    assert err.value.code == 404 and json.loads(err.value.read())["error"]["code"] == "not_found"
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(app.url + "/chat/completions", timeout=60)     # a GET
    assert err.value.code == 405


def test_build_takes_the_default_router_for_comparison_and_refuses_others():
    from serve.app import build

    affinity = build({"model": "tiny", "shards": 0})
    assert affinity._bound_deployment.name == "xg2-ingress"
    model = affinity._bound_deployment.init_args[0]._bound_deployment
    assert model.name == "xg2-model"
    assert model._deployment_config.request_router_config.request_router_class == "serve.routing.GrammarAffinityRouter"
    default = build({"model": "tiny", "shards": 0, "router": "default"})
    assert default._bound_deployment.name == "xg2-model"
    assert default._bound_deployment._deployment_config.request_router_config.is_default_request_router()
    with pytest.raises(UsageError, match="router must be"):
        build({"router": "fastest"})
