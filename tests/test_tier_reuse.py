"""Tools reused across replicas in the configuration that ships: two Serve replicas' Replica objects
(ReplicaOptions' defaults, so compiles run in worker processes) on one real shard tier in Ray.

Replica one answers a chat request with tools [A, B]; replica two one with [A, C], a set nobody
compiled. Replica two must take A's module and first-mask entries from the shards and lower only C;
its masks must be those of an in-process compiler that shares nothing.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading

import numpy as np
import pytest

import xg2
from xg2.actors.keeper import ShardKeeper, shard_names
from xg2.actors.router import ShardRouter
from xg2.actors.spec import SessionSpec, ToolsSpec

TOOL_A = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                     "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}}
TOOL_B = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
TOOL_C = {"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1,
                                                                               "maximum": 50}},
    "required": ["query"]}}}


@pytest.fixture(scope="module")
def replicas(ray_local):
    from serve.replica import Replica, ReplicaOptions

    keeper = ShardKeeper(shard_names(2, "reuse-shard"), "xg2-tests", 64 << 20)     # owns the shards, as in Serve
    names = keeper.names
    router = ShardRouter(names, namespace="xg2-tests", create=False)
    made = []
    try:
        for _ in range(2):
            made.append(Replica(ReplicaOptions(model="tiny", max_len=512, shards=names,
                                               shard_namespace="xg2-tests")))
        yield made
    finally:
        for r in made:
            asyncio.run(r.close())
        for h in router.handles:
            ray_local.kill(h, no_restart=True)


def _chat(replica, tools):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "weather in Paris?"}], "tools": tools,
            "tool_choice": "required", "max_tokens": 8, "temperature": 0}
    return json.loads(asyncio.run(replica.chat("tenant-x", json.dumps(body).encode())))


def _walk_equal(rt, spec, steps=40, seed=7):
    """Every mask of a random walk of `spec`'s grammar on the runtime equals a compiler's that
    shares nothing."""
    info = rt.tokenizer_info
    reference = xg2.GrammarCompiler(info, cross_grammar_cache=False, cache_enabled=False)
    ref = xg2.GrammarMatcher(spec.compile(reference))
    session = asyncio.run(rt.open(SessionSpec(grammar=spec, tenant="walker")))
    width = (info.vocab_size + 31) // 32
    rng = random.Random(seed)
    try:
        for step in range(steps):
            if ref.is_terminated():
                break
            want = xg2.allocate_token_bitmask(1, info.vocab_size).numpy()
            ref.fill_next_token_bitmask(want, 0)
            got = np.zeros((1, width), np.int32)
            rt.fill([session], got)
            assert np.array_equal(got, want), f"mask {step} differs"
            allowed = np.flatnonzero(np.unpackbits(want.view(np.uint8), bitorder="little")[:info.vocab_size])
            token = int(rng.choice(allowed))
            assert ref.accept_token(token) and rt.accept([session], [token]) == [True]
    finally:
        rt.close(session)


def test_a_tool_lowered_on_one_replica_is_taken_from_the_shards_on_another(replicas, ray_local):
    one, two = replicas
    assert one.runtime.compile_workers is not None      # the default: compiles in worker processes
    _chat(one, [TOOL_A, TOOL_B])
    assert one.runtime.cache_tier.flush()
    first = one.runtime.reuse()
    assert first["modules_lowered"] == 2 and first["modules_shards"] == 0
    assert one.runtime.cache_tier.counts["published_modules"] == 2

    before = two.runtime.reuse()
    entry_hits = two.runtime.cache_tier.counts["entry_hits"]
    _chat(two, [TOOL_A, TOOL_C])
    assert two.runtime.cache_tier.flush()       # the background prefetch too
    after = two.runtime.reuse()
    got = {k: after[k] - before[k] for k in ("modules_local", "modules_shards", "modules_lowered",
                                             "entries_needed", "entries_shards")}
    assert got["modules_shards"] == 1, got          # A's, from the shards
    assert got["modules_lowered"] == 1, got         # C's, lowered in the worker
    assert got["modules_local"] == 0, got
    # A's entries: the first mask's (a new frame's: none there) in the worker, the others by the
    # prefetch that a module from the shards starts
    assert two.runtime.cache_tier.counts["entry_hits"] > entry_hits
    assert after["grammars_shards"] == before["grammars_shards"]      # no grammar of [A, C] existed
    assert two.runtime.cache_tier.counts["published_modules"] == 1     # C's, for the next replica


def test_masks_of_a_reused_tool_set_are_a_fresh_compilers(replicas):
    """Walk [A, C] on replica two (grammar, modules and entries from the shards and its own caches)
    and compare every mask with a compiler that shares nothing."""
    _one, two = replicas
    spec = ToolsSpec(tools=[TOOL_A, TOOL_C], tool_choice="required", model=two.loaded.tool_format)
    _walk_equal(two.runtime, spec, steps=60, seed=5)


class _StuckRouter:
    """A router whose writes wait for `gate` (shards slow or gone): the publish queue fills."""

    def __init__(self):
        self.on_restart, self.failures, self.restarts = [], 0, 0
        self.gate, self.entered = threading.Event(), threading.Event()
        self.stored: list[bytes] = []

    def put_many(self, items):
        self.entered.set()
        self.gate.wait(30)
        self.stored += [k for k, _v in items]
        return len(items)


def test_the_publish_queue_is_bounded_the_oldest_dropped_and_counted():
    from xg2.actors.tier import ShardedCache

    router = _StuckRouter()
    tier = ShardedCache(router)
    tier._ns = bytes(16)
    tier.max_publish_jobs = 4
    tier.publish_module_blob(b"m" * 16, b"first")          # taken by the publisher, which waits
    assert router.entered.wait(10)
    for i in range(10):
        tier.publish_module_blob(bytes([i]) * 16, b"blob")
    assert tier.counts["publish_dropped"] == 6 and len(tier._jobs) == 4
    router.gate.set()
    assert tier.flush(10)
    assert [k[:16] for k in router.stored] == [b"m" * 16] + [bytes([i]) * 16 for i in range(6, 10)]   # the newest kept


def test_a_heavy_tenants_compile_reads_the_shards_and_publishes_nothing(replicas):
    """A tenant past half its compile budget compiles on the idle-CPU worker: what others built
    still saves its CPU (its tools' modules come from the shards), but nothing it lowers is sent."""
    import time as _time

    one, two = replicas
    _chat(one, [TOOL_A, TOOL_B])            # A's module is in the shards (from the first test or now)
    assert one.runtime.cache_tier.flush()
    rt = two.runtime
    tool_d = {"type": "function", "function": {"name": "book", "parameters": {
        "type": "object", "properties": {"room": {"type": "integer", "minimum": 100, "maximum": 999}},
        "required": ["room"]}}}
    rt._usage["tenant-heavy"] = (0.9 * rt.max_compile_seconds_per_tenant, _time.monotonic())
    published = rt.cache_tier.counts["published_modules"]
    before = rt.reuse()
    body = {"model": "tiny", "messages": [{"role": "user", "content": "book it"}], "tools": [TOOL_B, tool_d],
            "tool_choice": "required", "max_tokens": 4}
    asyncio.run(two.chat("tenant-heavy", json.dumps(body).encode()))
    assert rt.stats["background_compiles"] >= 1
    after = rt.reuse()
    assert after["modules_shards"] - before["modules_shards"] == 1      # B's, lowered by replica one
    assert after["modules_lowered"] - before["modules_lowered"] == 1    # D's, here
    assert rt.cache_tier.flush()
    assert rt.cache_tier.counts["published_modules"] == published       # D's was not sent



def test_a_set_of_known_tools_is_linked_in_the_replica_without_a_worker(replicas):
    """[C, A]: a set nobody sent, both tools lowered before (by the tests above, or now). The
    replica links it on its own compile thread: no worker compile, nothing lowered, the modules
    from its memory or the shards; its masks are a fresh compiler's."""
    one, two = replicas
    _chat(one, [TOOL_A, TOOL_C])
    assert one.runtime.cache_tier.flush()
    rt = two.runtime
    before, links = rt.reuse(), rt.stats["links_here"]
    in_workers = dict(rt._worker_reuse)
    spec = ToolsSpec(tools=[TOOL_C, TOOL_A], tool_choice="required", model=two.loaded.tool_format)
    _walk_equal(rt, spec)
    after = rt.reuse()
    assert rt.stats["links_here"] == links + 1
    assert after["modules_lowered"] == before["modules_lowered"]
    assert after["modules_local"] + after["modules_shards"] - before["modules_local"] - before["modules_shards"] == 2
    assert rt._worker_reuse == in_workers       # no worker compiled it


def test_a_grammar_another_replica_compiled_comes_with_the_module_read(replicas):
    """A tool set replica one compiled: replica two's link attempt asks for the grammar in the same
    read as the modules, and loads it (one round trip to the shards, no link, no worker)."""
    one, two = replicas
    tool_e = {"type": "function", "function": {"name": "convert", "parameters": {
        "type": "object", "properties": {"amount": {"type": "number"}, "to": {"type": "string", "maxLength": 3}},
        "required": ["amount", "to"]}}}
    _chat(one, [TOOL_B, tool_e])
    assert one.runtime.cache_tier.flush()
    rt = two.runtime
    hits, gets, links = rt.stats["tier_grammar_hits"], rt.cache_tier.counts["grammar_gets"], rt.stats["links_here"]
    spec = ToolsSpec(tools=[TOOL_B, tool_e], tool_choice="required", model=two.loaded.tool_format)
    session = asyncio.run(rt.open(SessionSpec(grammar=spec, tenant="reader")))
    rt.close(session)
    assert session.source == "shards"
    assert rt.stats["tier_grammar_hits"] == hits + 1 and rt.stats["links_here"] == links
    assert rt.cache_tier.counts["grammar_gets"] == gets + 1
    _walk_equal(rt, spec, seed=9)
