"""The load tests (loadtests/, issue 18): the clients' checks on their own, then a short headless run
of every tenant class against the application (the tiny model, on the session's Ray) through
run.py's function: no invalid output, no failed request, every summary field, nothing left running.

Locust is never imported here: it patches the standard library with gevent, which Ray's core cannot
run under, so run.py starts it as a child process.
"""

from __future__ import annotations

import importlib.util
import json
import random
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"loadtests_{name}", ROOT / "loadtests" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


workload = _load("workload")


def _need_data():
    try:
        workload.shared_dir()
    except FileNotFoundError as e:
        pytest.skip(str(e))


# ------------------------------------------------------------------------------------------------
# The checks a client makes
# ------------------------------------------------------------------------------------------------

TOOLS = workload.ToolSet(0, [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}},
])


def call(name: str, args: str) -> dict:
    return {"id": "call_1", "function": {"name": name, "arguments": args}}


def test_tool_checks():
    check = workload.check_tool_output
    named = {"type": "function", "function": {"name": "now"}}
    assert check("tool_calls", None, [call("get_weather", '{"city": "Paris"}')], TOOLS, "required").kind == "ok"
    assert check("tool_calls", None, [call("now", "{}")], TOOLS, named).kind == "ok"
    assert check("length", "<tool_call>\n{", [], TOOLS, "required").kind == "truncated"
    assert check("length", None, [call("now", "{}")], TOOLS, "required").kind == "truncated"    # whole calls, then cut
    assert check("stop", "plain text", [], TOOLS, "auto").kind == "ok"
    bad = [
        ("tool_calls", None, [call("get_weather", "{}")], "required"),           # a required argument missing
        ("tool_calls", None, [call("get_weather", '{"city": ')], "auto"),        # not JSON
        ("length", None, [call("get_weather", "{}")], "required"),               # a cut answer's call invalid
        ("tool_calls", None, [call("search", "{}")], "auto"),                    # not a tool of the request
        ("tool_calls", None, [call("get_weather", '{"city": "x"}')], named),     # not the named tool
        ("tool_calls", None, [], "required"),
        ("stop", "no call", [], "required"),                                     # required, finished, no call
        ("stop", 'x <tool_call>\n{"name"', [], "auto"),                          # a half call left in the text
    ]
    for finish, content, calls, choice in bad:
        assert check(finish, content, calls, TOOLS, choice).kind == "invalid_output", (finish, calls, choice)


def test_json_and_grammar_checks():
    schema = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 9}, "d": {"format": "date"}},
              "required": ["n"], "additionalProperties": False}
    v = workload.validator_for(schema)
    assert workload.check_json_output("stop", '{"n":3}', v).kind == "ok"
    assert workload.check_json_output("length", '{"n":', v).kind == "truncated"
    for text in ('{"n":30}', '{"n":3,"x":1}', '{"n":', '{"n":1,"d":"2024-13-45"}', "[]"):
        assert workload.check_json_output("stop", text, v).kind == "invalid_output", text
    cases = {c.name: c for c in workload.GRAMMAR_CASES}
    good = {"regex-date": "2024-01-31", "ebnf-arith": "(1+2)+34", "ebnf-parens": "(())()", "ebnf-parens ": "",
            "ebnf-intlist": "[1,-2,33]", "ebnf-pairs": "ab=1,c=22", "ebnf-kv-json": '{ "k": true}'}
    bad = {"regex-date": "2024-1-31", "ebnf-arith": "(1+2", "ebnf-parens": "())(", "ebnf-intlist": "[1,]",
           "ebnf-pairs": "abc=1", "ebnf-kv-json": '{"k":tru}'}
    for name, text in good.items():
        assert workload.check_grammar_output("stop", text, cases[name.strip()]).kind == "ok", (name, text)
    for name, text in bad.items():
        assert workload.check_grammar_output("stop", text, cases[name]).kind == "invalid_output", (name, text)


def test_every_grammar_case_compiles_and_agrees_with_its_check(json_info):
    """The server compiles each case (xg2 takes it), and xg2's matcher and the independent check
    agree on sample strings."""
    import xg2

    compiler = xg2.GrammarCompiler(json_info)
    samples = ["yes", "2024-01-31", "ab=1,c=22", "[1,-2]", "[]", "(1+2)+3", "(())", "", "red blue", "a@b.com",
               "+1-234-5678", "-12", "Ann Lee", "0xdeadbeef", "abc-12", '{"k":7}', "maybe", "(", "1+"]
    for case in workload.GRAMMAR_CASES:
        compiled = compiler.compile_grammar(case.grammar) if case.kind == "ebnf" else compiler.compile_regex(case.grammar)
        for text in samples:
            m = xg2.GrammarMatcher(compiled)
            accepted = m.accept_string(text) and m.is_completed() if text else m.is_completed()
            assert bool(accepted) == case.check(text), (case.name, text)


def test_sse_assembly():
    clock = iter(range(100)).__next__
    chunks = [b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n',
              b'data: {"choices":[{"delta":{"content":"he"}}]}\n\ndata: {"choices":[{"del',
              b'ta":{"content":"llo"}}]}\n\n',
              (b'data: {"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"now",'
               b'"arguments":"{}"}}]}}]}\n\n'),
              b'data: {"choices":[{"delta":{},"finish_reason":"tool_calls"}]}\n\n',
              b'data: {"choices":[],"usage":{"completion_tokens":7}}\n\ndata: [DONE]\n\n']
    a = workload.assemble(workload.sse_data(chunks), clock)
    assert (a.content, a.finish_reason, a.completion_tokens, a.first_token_at) == ("hello", "tool_calls", 7, 0)
    assert a.tool_calls == [{"id": "c", "function": {"name": "now", "arguments": "{}"}}]
    with pytest.raises(workload.StreamError, match="without"):
        workload.assemble(workload.sse_data(chunks[:3]), clock)
    with pytest.raises(workload.StreamError, match="error event"):
        workload.assemble(workload.sse_data([b'data: {"error":{"code":"x","message":"m"}}\n\n']), clock)


def test_every_hostile_kind_builds_a_body_that_is_sent_as_is():
    """The hostile bodies are built without recursion (json.dumps failed past ~990 levels inside
    the locust task, so the deepest were never sent) and are what they claim to be."""
    tools = [{"type": "function", "function": {"name": f"t{i}", "parameters": {"type": "object"}}} for i in range(5)]
    rng = random.Random(3)
    for kind in workload.HOSTILE_KINDS:
        body = workload.hostile_body(kind, rng, "tiny", tools)
        assert isinstance(body, (dict, bytes)), kind
        if isinstance(body, dict):
            json.dumps(body)
    deep = workload.deep_body("tiny", 3000)
    assert deep.count(b'"items"') == 3000 and deep.endswith(b"}" * 3003)
    shallow = json.loads(workload.deep_body("tiny", 40))
    node, depth = shallow["response_format"]["json_schema"]["schema"], 0
    while node.get("type") == "array":
        node, depth = node["items"], depth + 1
    assert depth == 40 and node == {"type": "string"} and shallow["max_tokens"] == 1
    a, b = workload.slow_schema(random.Random(1)), workload.slow_schema(random.Random(2))
    assert a != b and len(json.dumps(a)) > 5000           # fresh names: nothing cached helps
    huge = workload.hostile_body("huge_tools", random.Random(0), "tiny", tools)
    assert len(huge["tools"]) == 64 and len({t["function"]["name"] for t in huge["tools"]}) == 64
    with pytest.raises(ValueError):
        workload.hostile_body("nope", rng, "tiny", tools)


def test_pools_are_deterministic_and_zipf_hot():
    _need_data()
    tools = workload.load_registry_tools()
    a, b = workload.ToolPool(tools, seed=3), workload.ToolPool(tools, seed=3)
    for i in (0, 1, 57, 999):
        assert a.get(i).names == b.get(i).names and 4 <= len(a.get(i).tools) <= 64
        cost = sum(workload.estimate_tokens(json.dumps(t, ensure_ascii=False)) + 1 for t in a.get(i).tools)
        assert cost <= a.budget_tokens
    z = workload.ZipfIndex(1000, 1.1)
    rng = random.Random(0)
    draws = [z.draw(rng) for _ in range(5000)]
    assert draws.count(0) > 600 and len(set(draws)) > 500       # a hot head, a long tail
    pool = workload.SchemaPool(seed=0, limit=40)
    assert len(pool.schemas) == 40 and all(workload.schema_usable(s.schema) for s in pool.schemas)


# ------------------------------------------------------------------------------------------------
# A short run
# ------------------------------------------------------------------------------------------------

def test_a_multi_tenant_run_with_faults_and_a_hostile_tenant(serve_local, tmp_path):
    """One run (it was two, each starting the application: the suite's 15 minutes): about 45 s of 4
    users over the four tenant classes and one hostile tenant's user on the tiny model, with a cache
    shard killed (at 10 s) and then Serve's HTTP proxy (the ingress, at 20 s: back in about 7 s)
    restarted. Before the first fault not one request fails or is retried; throughout, no invalid
    output and nothing hung; every hostile request is answered with its 4xx (or an answer, when it
    was within the limits); both faults are recovered from; every summary field is there; and the
    run stops by itself, leaving nothing running."""
    _need_data()
    run = _load("run")
    t0 = time.monotonic()
    summary = run.run_load(duration=45, users=4, spawn_rate=5, model="tiny", shards=1, mask_service=False, port=serve_local,
                           out_dir=tmp_path, json_path=tmp_path / "summary.json", sample_every=2.0,
                           request_timeout=30, do_plot=False, progress=False,
                           hostile=1, kill_shard_=True, restart_ingress_=True,
                           fault_at_s={"shard": 10, "ingress": 20})     # 25 s to see the proxy back and serving
    elapsed = time.monotonic() - t0
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    for key in run.REQUIRED_FIELDS:
        assert key in on_disk, key
    assert summary["invalid_outputs"] == 0, summary["invalid_samples"]
    assert summary["hung_requests"] == 0 and summary["timeouts"] == 0, summary["failure_samples"]
    assert summary["locust"]["exit_code"] == 0 and summary["locust"]["client_exceptions"] == []

    # before the first fault: a clean run, not one failure or retry
    faults = {f["kind"]: f for f in summary["faults"]}
    assert set(faults) == {"shard", "ingress"} and not any(f.get("error") for f in faults.values()), faults
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines() if line.strip()]
    started = next(e["t"] for e in events if e.get("type") == "start")
    first_fault = started + min(f["at_s"] for f in faults.values()) - 0.1      # at_s is rounded to 0.1 s
    before = [e for e in events if e.get("type") == "request" and e["user"] != "HostileTenant"
              and e["t"] < first_fault]
    assert len(before) >= 4, len(before)
    bad = [e for e in before if e["kind"] in run.FAILURE_KINDS or e["kind"] == "retried"]
    assert not bad, bad[:3]

    # the faults recovered from
    assert faults["shard"]["restarted_after_s"] is not None and faults["ingress"]["restarted_after_s"] is not None
    assert faults["ingress"]["first_success_after_s"] is not None
    assert summary["others"]["requests"] >= 10
    hostile = summary["outcomes_by_class"]["HostileTenant"]
    assert hostile.get("refused", 0) >= 5 and set(hostile) <= {"refused", "ok", "retried", "connection"}, hostile

    # the summary of every tenant class
    assert set(summary["outcomes_by_class"]) == {"ToolAgent", "Extractor", "GrammarUser", "StreamingChatter",
                                                 "HostileTenant"}
    assert summary["cpu_s_by_role"].get("replica", 0) > 0 and "locust" in summary["cpu_s_by_role"]
    assert summary["tenants"] == 5
    for key in ("p50_ms", "p99_ms", "ttft_p50_ms", "cache_hit_rate", "module_hit_rate", "entry_hit_rate",
                "grammar_hit_rate", "compile_cpu_ms_per_request"):
        assert summary[key] is not None, key
    assert summary["reuse"]["modules"] > 0 and summary["compile_cpu_ms_per_request"] > 0   # tool sets compiled
    assert summary["tokens_per_s"] > 0 and summary["cache_hit_rate_over_time"]
    assert summary["rss_mb"] and any("replica" in r for r in summary["rss_mb"])
    assert summary["cache_bytes"] and summary["cache_bytes"][-1]["grammars"] > 0

    # it stops by itself (its 45 s, the app's start, bounded, and the stop), leaving nothing behind:
    # the locust child and the application's replica and shard
    assert elapsed < 45 + 120 + 30, elapsed
    deadline = time.monotonic() + 15
    while True:
        left = [(pid, title) for pid, title, *_ in run._descendants()
                if "locust" in title or title.startswith(("ray::ServeReplica:xg2", "ray::CacheShard"))]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not left, left
