"""Grammar-affinity routing (serve/routing.py, serve/ingress.py): the choice itself, without Ray
(rendezvous homes, what was learned, the load bound), the router inside Serve's routing interface
with stand-in replicas, and the keys the ingress computes from a request body."""

from __future__ import annotations

import asyncio
import json

import pytest
from ray.serve._private.common import DeploymentHandleSource, DeploymentID, ReplicaID, RequestMetadata
from ray.serve.request_router import PendingRequest

from serve.ingress import request_affinity
from serve.routing import (
    GrammarAffinityRouter,
    KeyLedger,
    as_affinity,
    pick,
    preference_tiers,
    rendezvous_home,
    tool_key,
)
from xg2.actors.spec import content_key

REPLICAS = ["r-a", "r-b"]


def keys(n: int, tag: str = "k") -> list[bytes]:
    return [tool_key({"type": "object", "properties": {f"{tag}{i}": {"type": "integer"}}}) for i in range(n)]


def test_rendezvous_homes_are_stable_and_a_new_replica_takes_only_its_share():
    ks = keys(600)
    two = {k: rendezvous_home(k, REPLICAS) for k in ks}
    assert two == {k: rendezvous_home(k, list(reversed(REPLICAS))) for k in ks}      # order does not matter
    share = sum(h == "r-a" for h in two.values()) / len(ks)
    assert 0.4 < share < 0.6, share
    three = {k: rendezvous_home(k, [*REPLICAS, "r-c"]) for k in ks}
    moved = [k for k in ks if three[k] != two[k]]
    assert all(three[k] == "r-c" for k in moved)        # a key moves only to the new replica
    assert 0.25 < len(moved) / len(ks) < 0.42, len(moved)


def test_tool_keys_follow_the_module_source():
    params = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}}
    assert tool_key(params) == tool_key(json.loads(json.dumps(params)))
    reordered = {"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "integer"}}}
    assert tool_key(params) != tool_key(reordered)      # another module source: another module
    assert len(tool_key(params)) == 16


def test_a_replica_holding_the_grammar_beats_one_holding_more_tools():
    tools = tuple(keys(6))
    grammar = b"g" * 16
    ledger = KeyLedger()
    ledger.record("r-a", (grammar, tools[:2]))
    ledger.record("r-b", (b"other-grammar---", tools[:5]))
    tiers, basis = preference_tiers((grammar, tools), REPLICAS, ledger)
    assert tiers == [["r-a"], ["r-b"]] and basis == "learned"
    tiers, _ = preference_tiers((b"a-new-grammar---", tools), REPLICAS, ledger)
    assert tiers == [["r-b"], ["r-a"]]                  # most of the tools
    ledger.record("r-a", (b"third-grammar---", tools[2:5]))
    tiers, _ = preference_tiers((b"a-new-grammar---", tools), REPLICAS, ledger)
    assert tiers == [["r-a", "r-b"]] or tiers == [["r-b", "r-a"]]     # a tie: load decides


def test_with_nothing_learned_the_tools_homes_decide():
    tools = keys(40, "home")
    on_a = tuple(t for t in tools if rendezvous_home(t, REPLICAS) == "r-a")
    on_b = tuple(t for t in tools if rendezvous_home(t, REPLICAS) == "r-b")
    assert on_a and on_b
    mostly_b = on_b[:3] + on_a[:1]
    assert preference_tiers((b"x" * 16, mostly_b), REPLICAS, KeyLedger()) == ([["r-b"], ["r-a"]], "home")
    assert preference_tiers((b"x" * 16, mostly_b), REPLICAS, None)[0][0] == ["r-b"]     # stateless
    grammar_only = preference_tiers((b"y" * 16, ()), REPLICAS, None)[0]
    assert grammar_only[0] == [rendezvous_home(b"y" * 16, REPLICAS)]


def test_the_load_bound_passes_over_a_busy_preferred_replica():
    tiers = [["r-a"], ["r-b"]]
    cap = {"r-a": 64, "r-b": 64}
    assert pick(tiers, {"r-a": 4, "r-b": 0}, cap, imbalance=4) == "r-a"       # at the bound: kept
    assert pick(tiers, {"r-a": 5, "r-b": 0}, cap, imbalance=4) == "r-b"       # past it: spilled
    assert pick(tiers, {"r-a": 9, "r-b": 6}, cap, imbalance=4) == "r-a"       # all busy: affinity holds
    assert pick(tiers, {"r-a": 2, "r-b": 0}, {"r-a": 2, "r-b": 64}, imbalance=4) == "r-b"    # full
    assert pick([["r-a", "r-b"]], {"r-a": 3, "r-b": 1}, cap, imbalance=4) == "r-b"     # a tie: the shorter
    assert pick(tiers, {"r-a": None, "r-b": 0}, cap, imbalance=0) == "r-b"    # unknown: last resort
    assert pick(tiers, {"r-a": None, "r-b": 7}, {"r-a": 64, "r-b": 7}, imbalance=0) == "r-a"
    assert pick(tiers, {"r-a": None, "r-b": None}, cap, imbalance=4) is None


def test_the_ledger_forgets_the_least_recently_used_keys_and_gone_replicas():
    ledger = KeyLedger(capacity=4)
    ks = keys(5)
    ledger.record("r-a", (None, tuple(ks[:3])))
    ledger.record("r-a", (None, (ks[0],)))             # used again: kept
    ledger.record("r-a", (None, tuple(ks[3:5])))
    assert ledger.tools_held("r-a", ks) == 4 and ledger.tools_held("r-a", [ks[1]]) == 0
    ledger.keep_only(["r-b"])
    assert ledger.tools_held("r-a", ks) == 0 and len(ledger) == 0
    with pytest.raises(ValueError):
        KeyLedger(capacity=0)


def test_malformed_affinities_are_no_affinity():
    assert as_affinity(None) is None
    assert as_affinity((None, ())) is None
    assert as_affinity(("not bytes", ())) is None
    assert as_affinity((b"g", ["x"])) is None
    assert as_affinity(42) is None
    assert as_affinity((b"g", [b"t"])) == (b"g", (b"t",))


class StandInReplica:
    """What the router reads of a Serve replica: its id, its bound, its queue length on a probe."""

    def __init__(self, name: str, queue_len: int = 0, max_ongoing_requests: int = 64):
        self.replica_id = ReplicaID(name, DeploymentID(name="xg2-model", app_name="xg2"))
        self.max_ongoing_requests = max_ongoing_requests
        self.queue_len = queue_len
        self.probes = 0

    async def get_queue_len(self, *, deadline_s: float) -> int:
        self.probes += 1
        return self.queue_len


def test_the_router_places_by_what_it_sent_and_spills_past_the_bound():
    async def scenario():
        router = GrammarAffinityRouter(deployment_id=DeploymentID(name="xg2-model", app_name="xg2"),
                                       handle_source=DeploymentHandleSource.REPLICA,
                                       use_replica_queue_len_cache=True)
        router.initialize_state(imbalance=2)
        a, b = StandInReplica("r-a"), StandInReplica("r-b")
        tools = tuple(keys(8, "set"))

        def request(affinity):
            return PendingRequest(args=["body"], kwargs={"affinity": affinity},
                                  metadata=RequestMetadata(request_id="r", internal_request_id="i"))

        first = request((b"grammar-1-------", tools))
        ranks = await router.choose_replicas([a, b], first)
        assert first.routing_context.should_backoff      # Serve backs off between refused rounds
        assert a.probes == 1 and b.probes == 1           # nothing cached yet: both probed
        home = ranks[0][0]
        other = b if home is a else a
        assert ranks == [[home], [other]] and router.decisions["home"] == 1
        router.on_request_routed(first, home.replica_id, None)
        # a new set sharing most tools goes where they went, whatever its own rendezvous home
        for i in range(6):
            variant = tools[:6] + tuple(keys(2, f"new{i}"))
            ranks = await router.choose_replicas([a, b], request((b"grammar-v%d------" % i, variant)))
            assert ranks[0] == [home]
        assert router.decisions["learned"] == 6
        # the home replica past the bound (2 more than the other): the next goes elsewhere
        router.replica_queue_len_cache.update(home.replica_id, 3)
        router.replica_queue_len_cache.update(other.replica_id, 0)
        ranks = await router.choose_replicas([a, b], request((b"grammar-1-------", tools)))
        assert ranks[0] == [other] and router.decisions["spilled"] == 1
        router.replica_queue_len_cache.update(home.replica_id, 2)
        assert (await router.choose_replicas([a, b], request((b"grammar-1-------", tools))))[0] == [home]
        # no grammar, or a malformed affinity: two random replicas, the shorter queue wins
        for affinity in (None, ("not a key", ())):
            ranks = await router.choose_replicas([a, b], request(affinity))
            assert len(ranks) == 1 and sorted(r.replica_id.unique_id for r in ranks[0]) == ["r-a", "r-b"]
        assert router.decisions["unkeyed"] == 2

    asyncio.run(scenario())


def test_the_router_refuses_unknown_settings():
    router = GrammarAffinityRouter(deployment_id=DeploymentID(name="xg2-model", app_name="xg2"),
                                   handle_source=DeploymentHandleSource.REPLICA)
    with pytest.raises(TypeError, match="imbalance and remembered_keys"):
        router.initialize_state(imbalence=3)
    with pytest.raises(ValueError, match="at least 0"):
        router.initialize_state(imbalance=-1)
    router.initialize_state(remembered_keys=0)
    assert router.ledger is None        # stateless: the rendezvous homes alone


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather.", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "now", "description": "The time."}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}},
]


def test_the_ingress_keys_are_the_runtimes_content_key_and_one_per_tool_schema():
    from serve import protocol as p
    from serve.grammars import chat_session_spec, completion_session_spec

    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
                       "tool_choice": "required"}).encode()
    grammar, tools = request_affinity("chat", body, tool_format="qwen_3")
    assert grammar == content_key(chat_session_spec(p.decode_chat_request(body), tool_format="qwen_3"))
    assert tools == (tool_key(TOOLS[0]["function"]["parameters"]), tool_key(TOOLS[2]["function"]["parameters"]))
    # descriptions do not shape the output: the same keys without them
    bare = json.loads(body)
    for t in bare["tools"]:
        t["function"].pop("description", None)
    assert request_affinity("chat", json.dumps(bare).encode(), tool_format="qwen_3") == (grammar, tools)
    assert request_affinity("chat", body, tool_format="llama")[0] != grammar      # another format's grammar
    plain = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    assert request_affinity("chat", plain) is None
    assert request_affinity("chat", b"{not json") is None       # the replica answers the 400
    regex = json.dumps({"model": "m", "prompt": "x", "guided_regex": "[a-z]+"}).encode()
    assert request_affinity("completions", regex) == (
        content_key(completion_session_spec(p.decode_completion_request(regex))), ())
    # a Responses request with the same tools (flat, Responses-shaped) has the chat request's keys
    flat = [{"type": "function", **t["function"]} for t in TOOLS]
    responses = json.dumps({"model": "m", "input": "hi", "tools": flat, "tool_choice": "required"}).encode()
    assert request_affinity("responses", responses, tool_format="qwen_3") == (grammar, tools)
    assert request_affinity("responses", json.dumps({"input": "hi"}).encode()) is None
    with pytest.raises(ValueError, match="only chat, completions and responses"):
        request_affinity("embeddings", regex)
