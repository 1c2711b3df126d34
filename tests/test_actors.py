"""The Ray side of the runtime: cache shards, the router, the second cache tier, MatcherHost.

Real Ray, local, started once per test session (conftest.ray_local). The reference for every mask is
an in-process GrammarCompiler with nothing shared: hosts that get their grammars and entries from
the shards must give exactly its masks, before and after a shard dies.
"""

from __future__ import annotations

import asyncio
import json
import random
import struct

import msgspec
import numpy as np
import pytest
from conftest import SHARED, shared_file

import xg2
from xg2.actors.router import ShardRouter
from xg2.actors.shard import ITEM_OVERHEAD, CacheShard
from xg2.errors import SessionError, SpecError

REGISTRY = SHARED / "data" / "tools" / "registry.jsonl"


# -- the shard as plain Python ----------------------------------------------------------------------

def test_shard_lru_by_bytes_and_refusals():
    shard = CacheShard(budget_bytes=2300)     # 8 items of 16 + 100 bytes and their overhead
    run = asyncio.run
    assert run(shard.put_many([(bytes([i]) * 16, b"v" * 100) for i in range(20)])) == (20, shard.incarnation)
    stats = run(shard.stats())
    assert stats["bytes"] <= 2300 and stats["items"] == 8 and stats["evictions"] == 12
    assert stats["bytes"] == 8 * (16 + 100 + ITEM_OVERHEAD)
    # the oldest went first; a read refreshes recency
    got = run(shard.get_many([bytes([0]) * 16, bytes([19]) * 16, bytes([12]) * 16]))
    assert got == [None, b"v" * 100, b"v" * 100]
    run(shard.put_many([(b"n" * 16, b"w" * 100)]))
    assert run(shard.get_many([bytes([12]) * 16]))[0] is not None      # refreshed, kept
    assert run(shard.get_many([bytes([13]) * 16]))[0] is None          # oldest, evicted
    # idempotent: a second put of a held key keeps the first value
    assert run(shard.put_many([(b"n" * 16, b"other")]))[0] == 0
    assert run(shard.get_many([b"n" * 16])) == [b"w" * 100]
    # refused: too large, keys of the wrong size, not bytes, not pairs
    before = run(shard.stats())["refused"]
    assert run(shard.put_many([(b"k" * 16, b"x" * 3000), (b"short", b"v"), ("s" * 16, b"v"), (b"k" * 16,),
                               None]))[0] == 0
    assert run(shard.stats())["refused"] == before + 5


def test_router_rendezvous_moves_about_one_nth():
    keys = [random.Random(i).randbytes(16) for i in range(6000)]
    three = ShardRouter(["s0", "s1", "s2"])
    four = ShardRouter(["s0", "s1", "s2", "s3"])
    counts = np.bincount([three.shard_of(k) for k in keys], minlength=3)
    assert counts.min() > 1700                      # spread evenly
    moved = [k for k in keys if three.shard_of(k) != four.shard_of(k)]
    assert all(four.shard_of(k) == 3 for k in moved)        # only to the new shard
    assert 0.18 < len(moved) / len(keys) < 0.32             # about 1/4


# -- Ray: hosts, shards, faults --------------------------------------------------------------------

def _tools(rng: random.Random, n: int) -> list[dict]:
    lines = REGISTRY.read_text().splitlines()
    return [{"type": "function", "function": json.loads(lines[i])["function"]} for i in rng.sample(range(len(lines)), n)]


def _spec(tools: list[dict]) -> dict:
    return {"grammar": {"type": "tools", "tools": tools}}


def _reference_path(compiler: xg2.GrammarCompiler, tools: list[dict], prefix: list[int], rng: random.Random,
                    steps: int) -> tuple[list[int], list[np.ndarray]]:
    """Tokens (the prefix, then random allowed ones) and the mask before each, from an in-process
    compiler that shares nothing: a random model, the hardest case for a grammar."""
    tag = xg2.get_model_structural_tag("qwen_3", tools, reasoning="disabled")
    matcher = xg2.GrammarMatcher(compiler.compile_structural_tag(tag))
    bitmask = xg2.allocate_token_bitmask(1, compiler.tokenizer_info.vocab_size)
    tokens, masks = [], []
    vocab = compiler.tokenizer_info.vocab_size
    for i in range(steps):
        matcher.fill_next_token_bitmask(bitmask)
        row = bitmask[0].numpy().copy()
        masks.append(row)
        if i < len(prefix):
            t = prefix[i]
        else:
            allowed = np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little")[:vocab])
            allowed = allowed[~np.isin(allowed, compiler.tokenizer_info.stop_token_ids)]
            if not len(allowed):
                break
            t = int(rng.choice(list(allowed)))
        assert matcher.accept_token(t)
        tokens.append(t)
    return tokens, masks


@pytest.fixture(scope="module")
def deepseek_path() -> str:
    return str(shared_file("deepseek_v3_tokenizer.json"))


@pytest.fixture(scope="module")
def cluster(ray_local, deepseek_path):
    """Two shards, hosts A and B sharing them, host C without them."""
    from xg2.actors.host import host_actor_class

    router = ShardRouter.create(2, prefix="test-shard", namespace="xg2-tests", budget_bytes=64 << 20)
    Host = host_actor_class()
    a = Host.remote(deepseek_path, shards=router.names, shard_namespace="xg2-tests")
    b = Host.remote(deepseek_path, shards=router.names, shard_namespace="xg2-tests")
    c = Host.remote(deepseek_path)
    ray_local.get([h.ping.remote() for h in (a, b, c)])
    yield router, a, b, c
    for h in (a, b, c):
        ray_local.kill(h)
    for h in router.handles:
        ray_local.kill(h, no_restart=True)


def _published_cases(host, info, prefix: list[int], *, seed: int, n: int, n_tools: int, steps: int) -> list:
    """`n` tool sets with their reference paths; `host` compiles them and publishes to the shards."""
    import ray

    rng = random.Random(seed)
    reference = xg2.GrammarCompiler(info, cross_grammar_cache=False, cache_enabled=False)
    cases = []
    for _ in range(n):
        tools = _tools(rng, n_tools)
        cases.append((tools, *_reference_path(reference, tools, prefix, rng, steps)))
    for tools, _tokens, _masks in cases:
        ray.get(host.open.remote("t1", _spec(tools), True))
    assert ray.get(host.flush.remote())
    return cases


def _walk(ray, host, tenant: str, spec: dict, tokens: list[int]) -> list[np.ndarray]:
    opened = ray.get(host.open.remote(tenant, spec, True))
    sid, masks = opened["session"], [opened["mask"]]
    for t in tokens[:-1]:
        out = ray.get(host.step.remote(tenant, [sid], [t]))
        assert out["accepted"] == [True]
        masks.append(out["masks"][0])
    ray.get(host.close.remote(tenant, [sid]))
    return masks


def test_second_host_gets_grammars_from_shards_with_identical_masks(cluster, deepseek_info, deepseek_tokenizer):
    import ray

    router, a, b, c = cluster
    cases = _published_cases(a, deepseek_info, deepseek_tokenizer.encode(
        'Let me check.\n<tool_call>\n{"name": "', add_special_tokens=False).ids, seed=7, n=4, n_tools=6, steps=40)
    for tools, tokens, masks in cases:
        for host in (b, c):
            got = _walk(ray, host, "t2", _spec(tools), tokens)
            assert len(got) == len(masks)
            for k, (x, y) in enumerate(zip(got, masks)):
                assert np.array_equal(x, y), f"mask {k} differs"
    stats_b = ray.get(b.stats.remote())
    assert stats_b["runtime"]["tier_grammar_hits"] >= len(cases)      # from the shards, not compiled
    assert ray.get(c.stats.remote())["runtime"]["tier_grammar_hits"] == 0
    shard_stats = router.stats()
    assert sum(s["items"] for s in shard_stats) > 0
    assert all(s["bytes"] <= s["budget_bytes"] for s in shard_stats)


def test_a_killed_shard_costs_hits_not_masks(cluster, deepseek_info, deepseek_tokenizer):
    import ray

    router, a, b, _c = cluster
    cases = _published_cases(a, deepseek_info, deepseek_tokenizer.encode(
        '<tool_call>\n{"name": "', add_special_tokens=False).ids, seed=11, n=6, n_tools=4, steps=24)
    for i, (tools, tokens, masks) in enumerate(cases):
        if i == 2:
            router.kill(0)          # Ray restarts it, empty
        got = _walk(ray, b, "t3", _spec(tools), tokens)
        assert all(np.array_equal(x, y) for x, y in zip(got, masks))
    # the restarted shard answers again; the hosts that see it restarted send their items again
    assert ray.get(router.handles[0].ping.remote(), timeout=60) > 0
    for tools, tokens, _masks in cases:
        _walk(ray, b, "t3", _spec(tools), tokens[:3])
    assert ray.get(b.flush.remote())
    for tools, tokens, _masks in cases:
        _walk(ray, b, "t3", _spec(tools), tokens[:3])
    assert ray.get(b.flush.remote())
    tier = ray.get(b.stats.remote())["tier"]
    assert tier["shard_restarts"] >= 1                   # seen on the first read or write after it
    assert router.stats()[0]["items"] > 0


def test_host_sessions_are_per_tenant(cluster):
    import ray

    _router, a, _b, _c = cluster
    spec = {"grammar": {"type": "regex", "pattern": "(ab)+"}}
    sid = ray.get(a.open.remote("alice", spec))["session"]
    with pytest.raises(SessionError):
        ray.get(a.step.remote("mallory", [sid], [None]))
    with pytest.raises(SessionError):
        ray.get(a.fork.remote("mallory", sid, 1))
    assert ray.get(a.close.remote("mallory", [sid])) == 0          # not hers: nothing closed
    out = ray.get(a.step.remote("alice", [sid], [None]))
    assert out["masks"].shape[0] == 1 and out["masks"].dtype == np.int32
    with pytest.raises(SpecError) as e:
        ray.get(a.open.remote("alice", {"grammar": {"type": "regex", "pattern": 3}}))
    assert e.value.pointer == "/grammar/pattern"
    assert ray.get(a.close.remote("alice", [sid])) == 1
    with pytest.raises(SessionError):
        ray.get(a.step.remote("alice", [sid], [None]))


def test_host_step_batches_rows_and_forks(json_info):
    """One call per step for several sessions: tokens in, one array of rows out, equal to each
    session's own matcher; a fork continues where its parent was."""
    from xg2.actors.host import MatcherHost

    host = MatcherHost(json_info)
    table = {t: i for i, t in enumerate(json_info.decoded_vocab) if t}
    from conftest import longest_match

    texts = ['{"a": [1, 2]}', '{"b": "x"}', '[true, null]']
    specs = [{"grammar": {"type": "json_schema", "schema": {"type": ["object", "array"]}}}] * 3
    reference = xg2.GrammarCompiler(json_info)

    async def run():
        ids = [(await host.open("t", s))["session"] for s in specs]
        paths = [longest_match(table, t.encode()) for t in texts]
        matchers = [xg2.GrammarMatcher(reference.compile_json_schema({"type": ["object", "array"]})) for _ in ids]
        bitmask = xg2.allocate_token_bitmask(1, json_info.vocab_size)
        last: list = [None] * 3
        for step in range(max(map(len, paths))):
            live = [k for k in range(3) if step < len(paths[k])]
            out = await host.step("t", [ids[k] for k in live], [last[k] for k in live])
            assert out["masks"].shape == (len(live), (json_info.vocab_size + 31) // 32)
            for row, k in enumerate(live):
                if last[k] is not None:
                    assert matchers[k].accept_token(last[k])
                matchers[k].fill_next_token_bitmask(bitmask)
                assert np.array_equal(out["masks"][row], bitmask[0].numpy())
                last[k] = paths[k][step]
            if step == 3:
                forked = await host.fork("t", ids[0], 2)
                out_f = await host.step("t", forked, [None, None])
                out_p = await host.step("t", [ids[0]], [None])
                assert np.array_equal(out_f["masks"][0], out_p["masks"][0])
                assert np.array_equal(out_f["masks"][1], out_p["masks"][0])
        await host.close("t", ids)
        assert host.runtime.open_sessions("t") == 2      # the forks
        host.runtime.shutdown()

    asyncio.run(run())


def test_packed_steps_give_the_full_rows(json_info):
    """`step_packed` names rows the client holds and sends new ones as changed words; StepClient's
    rows equal the full rows step by step (a book of 8 rows, so the ring wraps), and after a lost
    reply or a forgotten client the books start afresh instead of naming rows wrongly."""
    from conftest import longest_match
    from xg2._ext.rowbook import RowBookError

    from xg2.actors.host import MatcherHost, StepClient

    table = {t: i for i, t in enumerate(json_info.decoded_vocab) if t}
    texts = ['{"a": [1, 2, {"b": null}]}', '["x", "yy", true]', '{"a": [1, 2, {"b": null}]}', '"q"']
    spec = {"grammar": {"type": "json_schema", "schema": {"type": ["object", "array", "string"]}}}
    width = (json_info.vocab_size + 31) // 32
    full_host = MatcherHost(json_info)
    book_host = MatcherHost(json_info, row_book_bytes=8 * 4 * width, max_row_books=1)
    client = StepClient(None, "t", json_info.vocab_size)

    async def run():
        full_ids = [(await full_host.open("t", spec))["session"] for _ in texts]
        book_ids = [(await book_host.open("t", spec))["session"] for _ in texts]
        paths = [longest_match(table, t.encode()) for t in texts]
        last = [None] * len(texts)
        named = 0
        for step in range(max(map(len, paths))):
            live = [k for k in range(len(texts)) if step < len(paths[k])]
            want = await full_host.step("t", [full_ids[k] for k in live], [last[k] for k in live])
            ids = [book_ids[k] for k in live]
            reply = await book_host.step_packed("t", client.request(ids, [last[k] for k in live]))
            base, n = struct.unpack_from("<q", reply, 8)[0], len(ids)
            named += int((np.frombuffer(reply, "<i8", n, 32) < base).sum())
            rows, accepted, ended = client.read(ids, reply)
            assert np.array_equal(rows, want["masks"]) and accepted == want["accepted"] and ended == want["ended"]
            for k in live:
                last[k] = paths[k][step]
        assert client._book.next_id > 8                               # the ring wrapped
        assert named > 10                                           # rows named, not sent again
        # a reply lost: the host's book is not in the state the client names; the step starts afresh
        ids = [book_ids[1]]
        want = await full_host.step("t", [full_ids[1]], [None])
        request = msgspec.msgpack.decode(client.request(ids, [None]))
        request[2] += 1
        reply = await book_host.step_packed("t", msgspec.msgpack.encode(request))
        assert struct.unpack_from("<q", reply, 8)[0] == 0                  # a fresh book
        assert np.array_equal(client.read(ids, reply)[0], want["masks"])
        # a reply read twice (out of order): refused, and the next step starts afresh
        client.read(ids, await book_host.step_packed("t", client.request(ids, [None])))
        stale = reply
        with pytest.raises(RowBookError):
            client.read(ids, stale)
        reply = await book_host.step_packed("t", client.request(ids, [None]))
        assert struct.unpack_from("<q", reply, 8)[0] == 0
        assert np.array_equal(client.read(ids, reply)[0], want["masks"])
        # another client of the same tenant pushes this one's book out (max_row_books=1)
        other = StepClient(None, "t", json_info.vocab_size)
        other.read(ids, await book_host.step_packed("t", other.request(ids, [None])))
        reply = await book_host.step_packed("t", client.request(ids, [None]))
        assert np.array_equal(client.read(ids, reply)[0], want["masks"])
        full_host.runtime.shutdown()
        book_host.runtime.shutdown()

    asyncio.run(run())


def test_step_client_through_ray_gives_the_full_rows(cluster, deepseek_tokenizer):
    """StepClient's packed steps (one bytes call and reply per step) give the rows full steps give."""
    import ray

    from xg2.actors.host import StepClient

    _router, _a, _b, c = cluster
    spec = {"grammar": {"type": "json_schema", "schema": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}
    tokens = deepseek_tokenizer.encode('{"city": "Paris", "days": 3}', add_special_tokens=False).ids
    client = StepClient(c, "packed", 129280)
    mine = [client.open(spec), client.open(spec)]
    theirs = ray.get(c.open.remote("full", spec))["session"]
    last = None
    for t in tokens + [None]:
        rows, accepted, ended = client.step(mine, [last, last])
        want = ray.get(c.step.remote("full", [theirs], [last]))
        assert accepted == [True, True] and ended == [False, False]
        assert np.array_equal(rows[0], want["masks"][0]) and np.array_equal(rows[1], want["masks"][0])
        last = t
    with pytest.raises(SessionError):           # another tenant's client cannot step them
        StepClient(c, "other", 129280).step(mine, [None, None])


def test_a_new_combination_of_known_tools_takes_their_modules_from_the_shards(cluster, deepseek_info,
                                                                             deepseek_tokenizer):
    """Host A compiled tool sets; host B opens a set that mixes their tools (no grammar of it
    anywhere): B lowers none of those tools' schemas itself (their modules come from the shards)
    and its masks are the reference's."""
    import ray

    _router, a, b, _c = cluster
    rng = random.Random(23)
    first, second = _tools(rng, 3), _tools(rng, 3)
    for tools in (first, second):
        ray.get(a.open.remote("t1", _spec(tools), True))
    assert ray.get(a.flush.remote())
    mixed = [first[0], second[1], first[2]]
    before = ray.get(b.stats.remote())["tier"]
    reference = xg2.GrammarCompiler(deepseek_info, cross_grammar_cache=False, cache_enabled=False)
    prefix = deepseek_tokenizer.encode('<tool_call>\n{"name": "', add_special_tokens=False).ids
    tokens, masks = _reference_path(reference, mixed, prefix, rng, 30)
    got = _walk(ray, b, "t4", _spec(mixed), tokens)
    assert all(np.array_equal(x, y) for x, y in zip(got, masks)) and len(got) == len(masks)
    after = ray.get(b.stats.remote())["tier"]
    assert after["module_hits"] - before["module_hits"] == 3
