"""Compiles in child processes (xg2.actors.compile_workers): the same grammars as compiling in
process, typed errors that keep their pointers, and a worker past its deadline or dead replaced,
its replacement's start paid by no request."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import threading
import time

import numpy as np
import pytest

import xg2
from xg2.actors import GrammarRuntime
from xg2.actors.compile_workers import CompileWorkerError
from xg2.errors import QuotaError
from xg2.grammar.budget import CompileTimeout


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def proc_runtime(json_info):
    rt = GrammarRuntime(json_info, compile_processes=True)
    rt.compile_workers.wait_ready()
    yield rt
    rt.shutdown()


SPECS = [
    {"type": "json_schema", "schema": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12}, "n": {"type": "integer", "minimum": -3, "maximum": 250},
        "tags": {"type": "array", "items": {"enum": ["a", "b c"]}, "maxItems": 3}}, "required": ["name"]}},
    {"type": "ebnf", "grammar": 'root ::= "(" root ")" root | ""'},
    {"type": "regex", "pattern": r"[a-c]{2,5}-\d{1,3}(x|yz)?"},
    {"type": "tools", "tools": [
        {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "add", "parameters": {
            "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}],
     "tool_choice": "required"},
]


def _walk_masks(rt, session, info, rng, steps=40):
    """The masks along a random walk of allowed tokens (the next token drawn from the mask)."""
    width = (info.vocab_size + 31) // 32
    out = []
    for _ in range(steps):
        if session.is_terminated():
            break
        bitmask = np.zeros((1, width), np.int32)
        rt.fill([session], bitmask)
        out.append(bitmask.copy())
        allowed = np.flatnonzero(np.unpackbits(bitmask.view(np.uint8), bitorder="little")[:info.vocab_size])
        assert len(allowed), "an empty mask before the end"
        token = int(rng.choice(allowed))
        assert rt.accept([session], [token]) == [True]
    return out


@pytest.mark.parametrize("spec", SPECS, ids=["json_schema", "ebnf", "regex", "tools"])
def test_masks_are_those_of_an_in_process_compile(json_info, proc_runtime, spec):
    local = GrammarRuntime(json_info)
    try:
        for seed in range(3):
            a = run(proc_runtime.open({"grammar": spec, "tenant": "t"}))
            b = run(local.open({"grammar": spec, "tenant": "t"}))
            rng_a, rng_b = random.Random(seed), random.Random(seed)
            masks_a = _walk_masks(proc_runtime, a, json_info, rng_a)
            masks_b = _walk_masks(local, b, json_info, rng_b)
            assert len(masks_a) == len(masks_b) > 0
            for x, y in zip(masks_a, masks_b):
                assert np.array_equal(x, y)
            proc_runtime.close(a)
            local.close(b)
    finally:
        local.shutdown()
    assert proc_runtime.stats["compiles"] >= 1 and proc_runtime.stats["deserialize_ms"] > 0


def test_typed_errors_keep_their_class_and_where(proc_runtime):
    with pytest.raises(xg2.SchemaError) as info:
        run(proc_runtime.open({"grammar": {"type": "json_schema", "schema": {
            "type": "object", "properties": {"a": {"$ref": "#/nope"}}}}}))
    assert info.value.pointer == "/properties/a/$ref"
    with pytest.raises(xg2.GrammarError) as info:
        run(proc_runtime.open({"grammar": {"type": "ebnf", "grammar": 'root ::= "a" (\n'}}))
    assert "line 1" in str(info.value) or getattr(info.value, "line", None) == 1


def _freeze_new_workers(workers, monkeypatch) -> list[int]:
    """Every worker started from now on is stopped (SIGSTOP) as soon as it is: its start never
    ends, as on a machine too busy to start one within any deadline. The pids, to SIGCONT."""
    frozen: list[int] = []
    start = workers._start

    def frozen_start(*args, **kwargs):
        w = start(*args, **kwargs)
        os.kill(w.proc.pid, signal.SIGSTOP)
        frozen.append(w.proc.pid)
        return w

    monkeypatch.setattr(workers, "_start", frozen_start)
    return frozen


def _thaw(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def test_a_compile_past_its_deadline_kills_and_replaces_the_worker(json_info, monkeypatch):
    """The worker is killed past the deadline, and the next request is served at once by the spare
    kept started: the replacement's start (frozen here, never ending) is paid by no request. What
    is timed is the deadline alone: the worker under the first spec is frozen too, so the spec is
    past any deadline whatever the machine's speed, and the next request has a generous one (it
    would wait in vain for the frozen replacement if it waited for it at all)."""
    rt = GrammarRuntime(json_info, compile_processes=True, compile_timeout_s=60, compile_workers=1)
    frozen: list[int] = []
    try:
        workers = rt.compile_workers
        workers.wait_ready(spares=True)
        (pid,), (spare,) = workers.pids(), workers.spare_pids()
        frozen = _freeze_new_workers(workers, monkeypatch)
        os.kill(pid, signal.SIGSTOP)        # the compile sent to it cannot finish
        rt.compile_timeout_s = 0.3
        t0 = time.monotonic()
        with pytest.raises(xg2.GrammarLimitError):      # CompileTimeout, the open's or the worker's kill
            run(rt.open({"grammar": SPECS[1], "tenant": "t"}))
        assert time.monotonic() - t0 < 30
        while rt._inflight:                 # the compile thread sees the deadline after the open does
            time.sleep(0.01)
        assert workers.restarts == 1 and workers.pids() == [spare]
        with pytest.raises(OSError):
            os.kill(pid, 0)                 # the old one is gone
        assert len(frozen) == 1 and workers.spare_pids() == frozen      # the replacement: a spare, still starting
        rt.compile_timeout_s = 60
        s = run(rt.open({"grammar": SPECS[2], "tenant": "u"}))         # another tenant: served by the spare
        assert not s.is_terminated()
        assert workers.spare_pids() == frozen and os.sched_getscheduler(spare) != getattr(os, "SCHED_IDLE", -1)
    finally:
        _thaw(frozen)
        rt.shutdown()


def test_the_wait_for_a_starting_worker_is_not_a_compiles_time(json_info, monkeypatch):
    """Without a spare, a compile that reaches a worker still starting waits for it apart from its
    deadline: the deadline bounds the compile, not the machine's speed at starting a process."""
    from xg2.actors.compile_workers import CompileWorkers

    workers = CompileWorkers(json_info, 1, compile_timeout_s=60, spare_workers=0)
    frozen: list[int] = []
    try:
        workers.wait_ready()
        assert workers.spare_pids() == []
        frozen = _freeze_new_workers(workers, monkeypatch)
        os.kill(workers.pids()[0], signal.SIGKILL)
        time.sleep(0.2)
        threading.Timer(6.0, _thaw, args=(frozen,)).start()         # its start takes 6 s and more
        t0 = time.monotonic()
        assert workers.compile(xg2.actors.spec.RegexSpec("ab+"), timeout=5)     # replaced, waited for, compiled
        assert time.monotonic() - t0 > 6 and workers.restarts == 1 and workers.pids() == frozen
    finally:
        _thaw(frozen)
        workers.close()


def test_the_worker_is_killed_on_a_timeout_its_own_deadline_missed(json_info):
    from xg2.actors.compile_workers import CompileWorkers

    workers = CompileWorkers(json_info, 1, compile_timeout_s=60)     # its own deadline will not fire
    try:
        workers.wait_ready()
        pid = workers.pids()[0]
        slow = xg2.actors.spec.JSONSchemaSpec({"anyOf": [
            {"type": "object", "properties": {f"k{j}_{i}": {"type": "integer"} for i in range(8)}} for j in range(600)]})
        with pytest.raises(CompileTimeout):
            workers.compile(slow, timeout=0.05)
        assert workers.restarts == 1 and workers.pids()[0] != pid
        with pytest.raises(OSError):
            os.kill(pid, 0)                             # the old one is gone
        blob = workers.compile(xg2.actors.spec.RegexSpec("ab+"), timeout=30)
        assert xg2.GrammarCompiler(json_info).deserialize(blob) is not None
        assert 0 < workers.last.cpu_s < 30            # the worker's CPU time for it, reported
    finally:
        workers.close()


def test_a_dead_worker_costs_one_request_and_is_replaced(json_info):
    from xg2.actors.compile_workers import CompileWorkers

    workers = CompileWorkers(json_info, 1, compile_timeout_s=60)
    try:
        workers.wait_ready()
        os.kill(workers.pids()[0], signal.SIGKILL)          # dies while idle: replaced unseen
        assert workers.compile(xg2.actors.spec.RegexSpec("a|b"), timeout=30)     # at once or on the retry
        assert workers.restarts == 1
        os.kill(workers.pids()[0], signal.SIGKILL)
        time.sleep(0.2)                                     # seen dead before the spec is sent
        assert workers.compile(xg2.actors.spec.RegexSpec("a|c"), timeout=30)
        assert workers.restarts == 2
        slow = xg2.actors.spec.JSONSchemaSpec({"anyOf": [
            {"type": "object", "properties": {f"q{j}_{i}": {"type": "integer"} for i in range(8)}} for j in range(600)]})

        def kill_whoever_compiles(n: int) -> None:      # every worker that takes the spec dies under it
            killed: set[int] = set()
            until = time.monotonic() + 30
            while len(killed) < n and time.monotonic() < until:
                live = [w for w in list(workers._all)
                        if w.ready and w not in workers._spares and w.proc.pid not in killed]
                if live:
                    time.sleep(0.2)
                    os.kill(live[0].proc.pid, signal.SIGKILL)
                    killed.add(live[0].proc.pid)
                time.sleep(0.02)

        killer = threading.Thread(target=kill_whoever_compiles, args=(2,))
        killer.start()
        with pytest.raises(CompileWorkerError):             # tried once more, then refused
            workers.compile(slow, timeout=30)
        killer.join()
        assert workers.compile(xg2.actors.spec.RegexSpec("c"), timeout=30)
        assert workers.restarts == 4
    finally:
        workers.close()
    assert workers.pids() == []


def _sched_policy(pid: int) -> int:
    return os.sched_getscheduler(pid)


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_a_tenant_past_half_its_compile_budget_compiles_on_the_idle_cpu_worker(json_info):
    """The background worker runs at SCHED_IDLE; a tenant past half its budget is sent there, the
    others keep the ordinary workers; a background compile starved past the deadline is a
    QuotaError for that tenant, not a failure of the spec remembered against everyone."""
    rt = GrammarRuntime(json_info, compile_processes=True, compile_workers=1, max_compile_seconds_per_tenant=1.0)
    try:
        workers = rt.compile_workers
        workers.wait_ready()
        assert workers.background_workers == 1
        by_class = {w.background: w.proc.pid for w in workers._all if w not in workers._spares}
        assert _sched_policy(by_class[True]) == os.SCHED_IDLE
        assert _sched_policy(by_class[False]) != os.SCHED_IDLE
        s = run(rt.open({"grammar": SPECS[2], "tenant": "quiet"}))
        assert rt.stats["background_compiles"] == 0
        rt._usage["heavy"] = (0.7, time.monotonic())       # past half of its 1 s, not past it
        h = run(rt.open({"grammar": SPECS[1], "tenant": "heavy"}))
        assert rt.stats["background_compiles"] == 1
        # nothing speculative for it: no background precompute here, not shared through a cache tier
        assert h.matcher.compiled_grammar in rt._unshared and h.matcher.compiled_grammar._precompute_budget_ms == 0
        assert s.matcher.compiled_grammar not in rt._unshared
        assert _walk_masks(rt, h, json_info, random.Random(1), 10)      # a working grammar (it may end early)
        rt.close([s, h])

        # starved: the background worker stopped (as if the machine never had idle CPU), past any
        # deadline whatever the machine's speed
        os.kill(by_class[True], signal.SIGSTOP)
        rt.compile_timeout_s = 0.5
        try:
            with pytest.raises(QuotaError, match="idle CPU"):
                run(rt.open({"grammar": SPECS[0], "tenant": "heavy"}))
            while rt._inflight:             # the compile thread's own deadline: the worker is killed
                time.sleep(0.01)
        finally:
            _thaw([by_class[True]])
        assert rt.stats["background_timeouts"] == 1
        # its place, in its class, went to the spare
        assert workers.restarts == 1 and by_class[True] not in workers.pids()
        assert _sched_policy(next(w.proc.pid for w in workers._all if w.background)) == os.SCHED_IDLE
        rt.compile_timeout_s = 60       # what follows is about the spec's fate, not about time
        q = run(rt.open({"grammar": SPECS[0], "tenant": "quiet"}))    # the same spec: not refused for others
        assert not q.is_terminated()
    finally:
        rt.shutdown()
