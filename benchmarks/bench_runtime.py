"""The grammar runtime (xg2.actors): batched fills in process, a Ray MatcherHost's decode step, the
shared cache tier's time to first mask, and a shard killed under load.

    python benchmarks/bench_runtime.py [--quick] [--json FILE] [--shards 2] [--seed 0]

**Workload** (runtime_workload.py). Tool calling over the DeepSeek-V3 vocabulary
(``<shared>/tokenizers/deepseek_v3_tokenizer.json``; ``<shared>`` is ``$XG2_SHARED_DIR``, else
``shared`` beside the checkout): a request is ``{"grammar": {"type": "tools", "tools": <8 tools>}}``
(ToolsSpec defaults: qwen_3 format, reasoning disabled) over tools drawn from
``<shared>/data/tools/registry.jsonl``, with a model-like output built as bench_toolcalling.py
builds it (a sentence, then one or two ``<tool_call>\\n{"name": ..., "arguments": <seeded valid
instance>}\\n</tool_call>`` joined by ``"\\n"``), tokenized with ``tokenizers``
(``add_special_tokens=False``). Walking an output = teacher forcing: at each position the mask must
allow the output's next token, which is then accepted; after the last token the mask must allow
the stop tokens (``TokenizerInfo.stop_token_ids``), which are not accepted (the session is closed).
Every section takes its own distinct tool sets from one seeded draw (``--seed``).

**1. batch_fill** (in process, no Ray). For B in 1, 8, 32, 128: B sessions of one GrammarRuntime,
session j on its own tool set, teacher-forced to position ``floor((j + 0.5) / B * (len + 1))`` of
its output (so the states spread from the start to the end of the outputs), its mask warmed by one
fill (the grammars compiled beforehand, their background precompute over). Then, ``reps`` times
(200 quick, 1000 full; garbage collection off): one ``rt.fill(sessions, bitmask)`` (timed), then
each session's ``session.matcher.fill_next_token_bitmask(bitmask, i)`` in turn (each timed). Both
see the same states; a dense row (free text) costs more than a sparse one, so ``single_us`` moves
with the mix of states of each B, the ratio does not. ``per_row_us`` =
median batch call / B; ``single_us`` = median over repetitions of the B single calls' total / B (the
same states as one batch call: a median of single calls alone would leave the costlier rows out);
``ratio`` = per_row_us / single_us. The
bitmask is ``xg2.allocate_token_bitmask(B, vocab_size)`` (torch int32). ``rows_identical``: the
batch call's rows equal the single calls' rows. For B = 32 also ``submit_wait_us``: median of
``rt.submit_fill(sessions, bitmask).wait()`` (same repetitions, interleaved).

**2. actor_rtt_ms**: median of ``ray.get(host.ping.remote())`` over 300 calls (after 20 unmeasured),
on an idle host.

**3-4. host step.** A host S without shards; 32 slots, each walking outputs one after another (a
slot whose output ends is closed and reopened on the next request, ``open(first_mask=True)``, not
timed) so every step carries 32 sessions in mixed states. A step sends the 32 tokens the previous
masks were checked against and gets 32 rows back; each row must allow its output's next token (or
the stop tokens at the end). ``host_step_p50_ms`` / ``p90``: the ``ray.get(host.step.remote(...))``
round trip over ``steps`` steps (200 quick, 1000 full) after 20 unmeasured ones. The same schedule
(same specs, tokens and slots) runs in process on a local GrammarRuntime as MatcherHost.step runs
it (``rt.accept`` then ``rt.fill`` into a numpy int32 buffer of 32 rows): ``fills_ms`` is the
median of those fills, ``host_step_bound_ms`` = actor_rtt_ms + fills_ms (what a step cannot beat);
the host's rows are compared with the local ones (``wrong_masks``). ``reply_rtt_ms``: the round trip
of an empty call to an actor that returns a fresh (32, words) int32 array, i.e. what carrying a
step's rows back costs (above Ray's inline size, so through the object store).

**5. sharing.** Shards from ``ShardRouter.create(--shards, prefix="bench-shard-<pid>")``; hosts A
and B use them, host C has none. B and C are warmed alike on 5 other tool sets (opened with the
first mask, their outputs walked with ``step`` in lockstep). A opens N tool sets (60 quick, 200
full) with ``first_mask=True``; then ``A.flush()`` (what A built is on the shards); then B opens the
N specs, then C does (each open waits for the previous). ``shared_ttfm`` = B's ``ttfm_ms``
(arrival of the call to the first row, in the host), ``unshared_ttfm`` = C's. ``masks_identical``:
A's, B's and C's first masks are byte-identical for every spec, and for 10 specs the rows of B and
C along the whole output (``step``, lockstep) are identical and allow each next token (the rows of
the warm-up walks are compared the same way and count too).

**6. shard_kill.** 500 requests (also with --quick) on hosts D and E, both with the shards:
request i on D when i is even, on E otherwise, each host walking 2 requests at a time, the two
hosts' steps in flight together. Request i's tool set is drawn from a pool of 40 sets with weights
1 / (rank + 1)^1.1 (Zipf-like, seeded), its output seeded per request. Every row a host returns (the
first masks too) is compared with an in-process reference: a GrammarRuntime without any tier,
walking the same specs and tokens. Before the 250th open, ``router.kill(0)`` (Ray restarts the shard
empty). ``wrong_masks`` = rows that differ from the reference; ``failed_requests`` = requests with
an exception from open/step/close or a token a host refused; ``disallowed_rows`` = rows that do not
allow the output's next token; ``steps`` counts the tokens stepped, ``step_calls`` the calls. The
shards' stats afterwards, and the hosts' step round trips within 10 s after the kill against the
others.

**7. cache_bytes.** Each host's ``stats()["cache_bytes"]`` (compiled grammars against their
budget, the compiler's caches against theirs) and each shard's bytes against ``budget_bytes``;
``within_budgets`` when all hold.

Ray runs locally only: ``address="local"``, 2 CPUs, no dashboard, and
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (unless set), which makes the node's address 127.0.0.1 so
that Ray's servers listen on the loopback interface only. The shards are killed and Ray is shut
down at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.append(str(HERE.parent))

from engines import percentile
from runtime_workload import REGISTRY, TOKENIZER, Request, Workload

TENANT = "bench"
BATCH_SIZES = (1, 8, 32, 128)
SIZES = {
    "quick": {"reps": 200, "rtt_calls": 300, "step_slots": 32, "step_pool": 48, "step_warm": 20, "steps": 200,
              "sharing_n": 60, "sharing_walks": 10, "kill_requests": 500, "kill_pool": 40, "kill_at": 250,
              "kill_width": 2},
    "full": {"reps": 1000, "rtt_calls": 300, "step_slots": 32, "step_pool": 64, "step_warm": 20, "steps": 1000,
             "sharing_n": 200, "sharing_walks": 10, "kill_requests": 500, "kill_pool": 40, "kill_at": 250,
             "kill_width": 2},
}


def log(msg: str) -> None:
    print(f"[bench_runtime] {msg}", file=sys.stderr, flush=True)


def allows(row: np.ndarray, token: int) -> bool:
    w = np.ascontiguousarray(row).reshape(-1).view(np.uint32)
    return (token >> 5) < len(w) and bool((int(w[token >> 5]) >> (token & 31)) & 1)


def pcts(values: Iterable[float], scale: float = 1.0) -> dict[str, float | None]:
    """Nearest-rank p50/p90/p99, max and count (None for no values: JSON has no NaN)."""
    v = sorted(x * scale for x in values)
    if not v:
        return {"p50": None, "p90": None, "p99": None, "max": None, "n": 0}
    return {"p50": percentile(v, 0.5), "p90": percentile(v, 0.9), "p99": percentile(v, 0.99), "max": v[-1],
            "n": len(v)}


class Refused(Exception):
    """A token the matcher refused along an output."""


# ---------------------------------------------------------------------------------------------- backends


class LocalBackend:
    """Sessions of an in-process GrammarRuntime, stepped as MatcherHost.step steps them (accept the
    tokens, then one batch fill into rows of a numpy int32 buffer); the fills are timed."""

    def __init__(self, rt: Any, loop: asyncio.AbstractEventLoop):
        self.rt = rt
        self.loop = loop
        self.width = (rt.tokenizer_info.vocab_size + 31) // 32
        self._buf = np.zeros((8, self.width), np.int32)
        self.fill_ms: list[float] = []
        self.accept_ms: list[float] = []

    def open(self, req: Request) -> tuple[Any, np.ndarray]:
        s = self.loop.run_until_complete(self.rt.open(req.spec))
        row = np.zeros((1, self.width), np.int32)
        self.rt.fill([s], row)
        return s, row[0]

    def submit(self, handles: list, tokens: list[int]) -> Any:
        return self.step(handles, tokens)

    def collect(self, pending: Any) -> tuple[np.ndarray, list[bool]]:
        return pending

    def step(self, handles: list, tokens: list[int]) -> tuple[np.ndarray, list[bool]]:
        n = len(handles)
        if len(self._buf) < n:
            self._buf = np.zeros((max(n, 2 * len(self._buf)), self.width), np.int32)
        masks = self._buf[:n]
        t0 = time.perf_counter()
        accepted = self.rt.accept(handles, tokens)
        t1 = time.perf_counter()
        self.rt.fill(handles, masks)
        t2 = time.perf_counter()
        self.accept_ms.append((t1 - t0) * 1e3)
        self.fill_ms.append((t2 - t1) * 1e3)
        return masks, accepted

    def close(self, handles: list) -> None:
        self.rt.close(handles)


#: The vocabulary's size, set once by main (remote backends keep rows of its width).
VOCAB_SIZE = [0]


class RemoteBackend:
    """Sessions of a MatcherHost actor: open with the first mask, one `step` call per decode step
    (its round trip timed, with the rows sent as the words that changed and written back by a
    StepClient, as an engine calls it), close."""

    def __init__(self, handle: Any, name: str, vocab_size: int | None = None):
        import ray

        from xg2.actors.host import StepClient

        self.ray = ray
        self.h = handle
        self.name = name
        self.client = StepClient(handle, TENANT, vocab_size or VOCAB_SIZE[0])
        self.step_ms: list[float] = []
        self.step_end: list[float] = []       # perf_counter at each step's end
        self.ttfm_ms: list[float] = []
        self.open_rtt_ms: list[float] = []

    def open(self, req: Request) -> tuple[str, np.ndarray]:
        t0 = time.perf_counter()
        r = self.ray.get(self.h.open.remote(TENANT, req.spec, first_mask=True))
        self.open_rtt_ms.append((time.perf_counter() - t0) * 1e3)
        self.ttfm_ms.append(r["ttfm_ms"])
        return r["session"], r["mask"]

    def submit(self, handles: list, tokens: list[int]) -> Any:
        return time.perf_counter(), list(handles), self.client.submit(handles, tokens)

    def collect(self, pending: Any) -> tuple[np.ndarray, list[bool]]:
        t0, handles, ref = pending
        masks, accepted, ended = self.client.collect(handles, ref)
        r = {"masks": masks, "accepted": accepted, "ended": ended}
        t1 = time.perf_counter()
        self.step_ms.append((t1 - t0) * 1e3)
        self.step_end.append(t1)
        if any(r["ended"]):
            raise Refused(f"{self.name}: a session ended before its stop token")
        return r["masks"], r["accepted"]

    def step(self, handles: list, tokens: list[int]) -> tuple[np.ndarray, list[bool]]:
        return self.collect(self.submit(handles, tokens))

    def close(self, handles: list) -> None:
        self.ray.get(self.h.close.remote(TENANT, list(handles)))
        self.client.forget(handles)


# ---------------------------------------------------------------------------------------------- lanes


class Slot:
    __slots__ = ("handle", "k", "ref", "req", "rid")

    def __init__(self, rid: int, req: Request, handle: Any, ref: Any):
        self.rid, self.req, self.handle, self.ref, self.k = rid, req, handle, ref, 0


class Lane:
    """Outputs walked on one backend, `width` sessions at a time (a finished session's slot takes the
    next request), mirrored on a reference backend whose rows each row is compared with. Every row
    must allow the output's next token (the stop tokens after the last one). An exception of the
    backend or a refused token fails the requests concerned; the lane goes on with the next ones."""

    def __init__(self, backend: Any, reference: Any, queue: Iterable[tuple[int, Request]], width: int,
                 stop_ids: list[int], before_open: Any = None):
        self.backend, self.reference = backend, reference
        self.queue: Iterator[tuple[int, Request]] = iter(queue)
        self.width = width
        self.stop_ids = stop_ids
        self.before_open = before_open
        self.slots: list[Slot] = []
        self.counts = {"requests": 0, "completed": 0, "failed_requests": 0, "wrong_masks": 0,
                       "disallowed_rows": 0, "rows": 0, "steps": 0, "step_calls": 0}
        self.errors: list[str] = []
        self.first_masks: dict[int, np.ndarray] = {}
        self.keep_first = False
        self._exhausted = False
        self.refill()

    @property
    def active(self) -> bool:
        return bool(self.slots)

    def _fail(self, slot: Slot | None, rid: int, what: str) -> None:
        self.counts["failed_requests"] += 1
        if len(self.errors) < 10:
            self.errors.append(f"request {rid}: {what}")
        if slot is None:
            return
        for backend, h in ((self.backend, slot.handle), (self.reference, slot.ref)):
            if backend is not None and h is not None:
                with contextlib.suppress(Exception):      # the request is counted as failed already
                    backend.close([h])

    def _check(self, slot: Slot, row: np.ndarray, ref_row: np.ndarray | None) -> bool:
        """Row checks at position slot.k; True when the output is walked to its end."""
        self.counts["rows"] += 1
        if ref_row is not None and np.asarray(row).tobytes() != np.asarray(ref_row).tobytes():
            self.counts["wrong_masks"] += 1
            if len(self.errors) < 10:
                self.errors.append(f"request {slot.rid}: mask differs from the reference at position {slot.k}")
        tokens = slot.req.tokens
        ok = (allows(row, tokens[slot.k]) if slot.k < len(tokens)
              else all(allows(row, t) for t in self.stop_ids))
        if not ok:
            self.counts["disallowed_rows"] += 1
            if len(self.errors) < 10:
                self.errors.append(f"request {slot.rid}: row at position {slot.k} of {len(tokens)} does not allow "
                                   "the next token")
        return slot.k >= len(tokens)

    def refill(self) -> None:
        while len(self.slots) < self.width and not self._exhausted:
            nxt = next(self.queue, None)
            if nxt is None:
                self._exhausted = True
                return
            rid, req = nxt
            if self.before_open is not None:
                self.before_open(rid)
            self.counts["requests"] += 1
            try:
                handle, row = self.backend.open(req)
            except Exception as e:  # noqa: BLE001 - counted
                self._fail(None, rid, f"open: {type(e).__name__}: {e}")
                continue
            ref, ref_row = self.reference.open(req) if self.reference is not None else (None, None)
            slot = Slot(rid, req, handle, ref)
            if self.keep_first:
                self.first_masks[rid] = np.array(row, copy=True)
            self._check(slot, row, ref_row)
            self.slots.append(slot)

    def submit(self) -> Any:
        if not self.slots:
            return None
        tokens = [s.req.tokens[s.k] for s in self.slots]
        try:
            return ("ok", self.backend.submit([s.handle for s in self.slots], tokens), tokens)
        except Exception as e:  # noqa: BLE001
            return ("error", e, tokens)

    def complete(self, pending: Any) -> None:
        if pending is None:
            return
        kind, value, tokens = pending
        slots = self.slots
        self.counts["step_calls"] += 1
        self.counts["steps"] += len(slots)
        try:
            if kind == "error":
                raise value
            masks, accepted = self.backend.collect(value)
        except Exception as e:  # noqa: BLE001 - every request of the call fails
            for s in slots:
                self._fail(s, s.rid, f"step: {type(e).__name__}: {e}")
            self.slots = []
            self.refill()
            return
        if self.reference is not None:
            ref_masks, ref_accepted = self.reference.step([s.ref for s in slots], tokens)
            ref_masks = ref_masks.copy()
        else:
            ref_masks, ref_accepted = None, [True] * len(slots)
        keep, done = [], []
        for i, s in enumerate(slots):
            if not accepted[i] or not ref_accepted[i]:
                who = "the host" if not accepted[i] else "the reference"
                self._fail(s, s.rid, f"{who} refused token {tokens[i]} at position {s.k}")
                continue
            s.k += 1
            if self._check(s, masks[i], None if ref_masks is None else ref_masks[i]):
                done.append(s)
            else:
                keep.append(s)
        self.slots = keep
        if done:
            self.counts["completed"] += len(done)
            try:
                self.backend.close([s.handle for s in done])
            except Exception as e:  # noqa: BLE001
                self.counts["completed"] -= len(done)
                for s in done:
                    self._fail(None, s.rid, f"close: {type(e).__name__}: {e}")
            if self.reference is not None:
                self.reference.close([s.ref for s in done])
        self.refill()

    def step(self) -> None:
        self.complete(self.submit())

    def run(self) -> Lane:
        while self.active:
            self.step()
        return self

    def close_all(self) -> None:
        for s in self.slots:
            self.backend.close([s.handle])
            if self.reference is not None:
                self.reference.close([s.ref])
        self.slots = []


def run_together(lanes: list[Lane]) -> None:
    """Step several lanes (on different hosts) with their calls in flight together."""
    while any(lane.active for lane in lanes):
        pending = [lane.submit() for lane in lanes]
        for lane, p in zip(lanes, pending):
            lane.complete(p)


# ---------------------------------------------------------------------------------------------- sections


def bench_batch_fill(rt: Any, loop: asyncio.AbstractEventLoop, pool: list[Request], reps: int) -> dict:
    import xg2

    vocab = rt.tokenizer_info.vocab_size
    out: dict[str, Any] = {}
    for req in pool[:max(BATCH_SIZES)]:     # compiled, and their background precompute over, first
        compiled = loop.run_until_complete(rt.compile(req.spec["grammar"]))
        done = getattr(compiled, "_precomputed", None)
        if done is not None:
            done.wait(10.0)
    for b in BATCH_SIZES:
        sessions = []
        for j in range(b):
            req = pool[j]
            s = loop.run_until_complete(rt.open(req.spec))
            pos = min(len(req.tokens), int((j + 0.5) / b * (len(req.tokens) + 1)))
            if not all(rt.accept([s], [t])[0] for t in req.tokens[:pos]):
                raise Refused(f"batch_fill: a token of request {j} was refused")
            sessions.append(s)
        bitmask = xg2.allocate_token_bitmask(b, vocab)
        rt.fill(sessions, bitmask)                       # warm
        batch_rows = bitmask.clone()
        for i, s in enumerate(sessions):
            s.matcher.fill_next_token_bitmask(bitmask, i)
        identical = bool(np.array_equal(batch_rows.numpy(), bitmask.numpy()))
        batch_ns, single_ns, submit_ns = [], [], []
        clock = time.perf_counter_ns
        gc.collect()
        gc.disable()
        try:
            for _ in range(reps):
                t0 = clock()
                rt.fill(sessions, bitmask)
                batch_ns.append(clock() - t0)
                singles = 0
                for i, s in enumerate(sessions):
                    m = s.matcher
                    t0 = clock()
                    m.fill_next_token_bitmask(bitmask, i)
                    singles += clock() - t0
                single_ns.append(singles)       # the B single calls of this repetition, together
                if b == 32:
                    t0 = clock()
                    rt.submit_fill(sessions, bitmask).wait()
                    submit_ns.append(clock() - t0)
        finally:
            gc.enable()
        per_row = statistics.median(batch_ns) / b / 1e3
        single = statistics.median(single_ns) / b / 1e3     # per call, over the same B states as a batch
        entry = {"B": b, "reps": reps, "per_row_us": per_row, "single_us": single, "ratio": per_row / single,
                 "batch_call_us": statistics.median(batch_ns) / 1e3, "rows_identical": identical,
                 "positions": [len(s.tokens) for s in sessions][:8]}
        if submit_ns:
            entry["submit_wait_us"] = statistics.median(submit_ns) / 1e3
            entry["submit_wait_per_row_us"] = entry["submit_wait_us"] / b
        out[str(b)] = entry
        rt.close(sessions)
        log(f"batch_fill B={b}: {per_row:.2f} us/row batched, {single:.2f} us single")
    return out


def bench_rtt(host: Any, calls: int) -> dict:
    import ray

    for _ in range(20):
        ray.get(host.ping.remote())
    ms = []
    for _ in range(calls):
        t0 = time.perf_counter()
        ray.get(host.ping.remote())
        ms.append((time.perf_counter() - t0) * 1e3)
    return {"median_ms": statistics.median(ms), **pcts(ms)}


def bench_reply_rtt(rows: int, width: int, calls: int) -> dict:
    """Round trip of an empty call to an async actor that returns a fresh int32 (rows, width) array,
    as a host step's reply is: what moving the masks costs, apart from any work."""
    import ray

    @ray.remote(num_cpus=0)
    class Rows:
        def __init__(self, rows: int, width: int):
            self.a = np.zeros((rows, width), np.int32)

        async def get(self) -> np.ndarray:
            return self.a.copy()

    actor = Rows.remote(rows, width)
    for _ in range(10):
        ray.get(actor.get.remote())
    ms = []
    for _ in range(calls):
        t0 = time.perf_counter()
        ray.get(actor.get.remote())
        ms.append((time.perf_counter() - t0) * 1e3)
    ray.kill(actor)
    return {"rows": rows, "width": width, "bytes": rows * width * 4, "median_ms": statistics.median(ms), **pcts(ms)}


def bench_host_step(host: Any, rt: Any, loop: asyncio.AbstractEventLoop, pool: list[Request], cfg: dict,
                    stop_ids: list[int]) -> dict:
    import ray

    for req in pool:                  # compiled once on the host (and locally) before the clock starts
        r = ray.get(host.open.remote(TENANT, req.spec, first_mask=True))
        ray.get(host.close.remote(TENANT, [r["session"]]))
        rt.close(loop.run_until_complete(rt.open(req.spec)))
    time.sleep(1.0)                   # the compilers' background precompute settles
    remote, local = RemoteBackend(host, "S"), LocalBackend(rt, loop)
    slots = cfg["step_slots"]
    # Every output of the pool walked once on both sides first, so that the host and the in-process
    # reference are timed on states they have both seen (steady decoding, not first visits).
    Lane(remote, local, enumerate(pool), slots, stop_ids).run()
    for timed in (remote.step_ms, remote.step_end, local.fill_ms, local.accept_ms):
        timed.clear()
    # the pool over and over, each request to the first slot free: mixed states, the same on both sides
    queue = ((i, pool[i % len(pool)]) for i in itertools.count())
    lane = Lane(remote, local, queue, slots, stop_ids)
    warm, steps = cfg["step_warm"], cfg["steps"]
    for _ in range(warm + steps):
        lane.step()
    lane.close_all()
    host_ms, fill_ms, accept_ms = remote.step_ms[warm:], local.fill_ms[warm:], local.accept_ms[warm:]
    reply = bench_reply_rtt(slots, local.width, cfg["rtt_calls"] // 3)
    return {"slots": slots, "steps": len(host_ms), "warm_steps": warm, "pool": len(pool), "reply_rtt": reply,
            "reply_rtt_ms": reply["median_ms"],
            "host_step_ms": pcts(host_ms), "fills_ms": statistics.median(fill_ms), "fills": pcts(fill_ms),
            "accept_ms": statistics.median(accept_ms),
            "local_step_ms": statistics.median(a + f for a, f in zip(accept_ms, fill_ms)),
            "ttfm_ms_reopen": pcts(remote.ttfm_ms), "wrong_masks": lane.counts["wrong_masks"],
            "disallowed_rows": lane.counts["disallowed_rows"], "failed_requests": lane.counts["failed_requests"],
            "lane": lane.counts, "errors": lane.errors}


def open_all(host: Any, reqs: list[Request]) -> list[dict]:
    import ray

    return [ray.get(host.open.remote(TENANT, r.spec, first_mask=True)) for r in reqs]


def bench_sharing(hosts: dict[str, Any], wl: Workload, cfg: dict, stop_ids: list[int]) -> dict:
    import ray

    a, b, c = hosts["A"], hosts["B"], hosts["C"]
    warm = wl.take(5)
    warm_lane = Lane(RemoteBackend(b, "B"), RemoteBackend(c, "C"), enumerate(warm), len(warm), stop_ids).run()
    reqs = wl.take(cfg["sharing_n"])
    t0 = time.perf_counter()
    opened_a = open_all(a, reqs)
    a_open_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    flushed = ray.get(a.flush.remote(300.0))
    flush_s = time.perf_counter() - t0
    stats_b0 = ray.get(b.stats.remote())
    opened_b = open_all(b, reqs)
    stats_b1 = ray.get(b.stats.remote())
    opened_c = open_all(c, reqs)
    first_same = [oa["mask"].tobytes() == ob["mask"].tobytes() == oc["mask"].tobytes()
                  for oa, ob, oc in zip(opened_a, opened_b, opened_c)]
    first_allow = [allows(ob["mask"], r.tokens[0]) for ob, r in zip(opened_b, reqs)]
    for host, opened in ((a, opened_a), (b, opened_b), (c, opened_c)):
        ray.get(host.close.remote(TENANT, [o["session"] for o in opened]))
    walks = reqs[:cfg["sharing_walks"]]
    walk = Lane(RemoteBackend(b, "B"), RemoteBackend(c, "C"), enumerate(walks), len(walks), stop_ids).run()
    shared = [o["ttfm_ms"] for o in opened_b]
    unshared = [o["ttfm_ms"] for o in opened_c]
    rt0, rt1 = stats_b0["runtime"], stats_b1["runtime"]
    tier0, tier1 = stats_b0.get("tier", {}), stats_b1.get("tier", {})
    walk_ok = walk.counts["wrong_masks"] == 0 and walk.counts["disallowed_rows"] == 0 \
        and walk.counts["failed_requests"] == 0 and walk.counts["completed"] == len(walks)
    return {
        "n": len(reqs), "a_open_s": a_open_s, "a_flushed": flushed, "a_flush_s": flush_s,
        "a_ttfm_ms": pcts(o["ttfm_ms"] for o in opened_a),
        "shared_ttfm_ms": pcts(shared), "unshared_ttfm_ms": pcts(unshared),
        "shared_ttfm_mean_ms": statistics.fmean(shared), "unshared_ttfm_mean_ms": statistics.fmean(unshared),
        "b_tier_grammar_hits": rt1["tier_grammar_hits"] - rt0["tier_grammar_hits"],
        "b_compiled_here": (rt1["compiles"] - rt0["compiles"]) - (rt1["tier_grammar_hits"] - rt0["tier_grammar_hits"]),
        "b_deserialize_ms": rt1["deserialize_ms"] - rt0["deserialize_ms"],
        "b_entry_hits": tier1.get("entry_hits", 0) - tier0.get("entry_hits", 0),
        "b_entry_gets": tier1.get("entry_gets", 0) - tier0.get("entry_gets", 0),
        "first_masks_identical": all(first_same), "first_masks_differing": first_same.count(False),
        "first_masks_allow_first_token": all(first_allow),
        "walked": len(walks), "walk": walk.counts, "walk_errors": walk.errors, "walk_ok": walk_ok,
        "warm": warm_lane.counts, "warm_errors": warm_lane.errors,
        "masks_identical": all(first_same) and all(first_allow) and walk_ok and warm_lane.counts["wrong_masks"] == 0,
    }


def bench_shard_kill(hosts: dict[str, Any], router: Any, ref_rt: Any, loop: asyncio.AbstractEventLoop,
                     wl: Workload, cfg: dict, stop_ids: list[int], seed: int) -> dict:
    import ray

    pool = wl.take(cfg["kill_pool"])
    rng = random.Random(seed * 7 + 11)
    weights = [1.0 / (r + 1) ** 1.1 for r in range(len(pool))]
    draws = rng.choices(range(len(pool)), weights, k=cfg["kill_requests"])
    reqs = [wl.output_for(pool[z], i) for i, z in enumerate(draws)]
    reference = LocalBackend(ref_rt, loop)
    opens = {"n": 0}
    kill: dict[str, Any] = {}

    def before_open(rid: int) -> None:
        if opens["n"] == cfg["kill_at"] and not kill:
            kill["at_open"] = opens["n"]
            kill["request"] = rid
            kill["stats_before"] = router.stats()
            t0 = time.perf_counter()
            router.kill(0)
            kill["kill_s"] = time.perf_counter() - t0
            kill["t"] = time.perf_counter()
            log(f"shard_kill: killed shard 0 before open {opens['n']} (request {rid})")
        opens["n"] += 1

    backends = {name: RemoteBackend(hosts[name], name) for name in ("D", "E")}
    lanes = [Lane(backends["D"], reference, ((i, r) for i, r in enumerate(reqs) if i % 2 == 0), cfg["kill_width"],
                  stop_ids, before_open),
             Lane(backends["E"], reference, ((i, r) for i, r in enumerate(reqs) if i % 2 == 1), cfg["kill_width"],
                  stop_ids, before_open)]
    t0 = time.perf_counter()
    run_together(lanes)
    run_s = time.perf_counter() - t0
    counts = {k: sum(lane.counts[k] for lane in lanes) for k in lanes[0].counts}
    after: dict[str, Any] = {}
    if "t" in kill:     # steps ending within 10 s after the kill, against the others
        near = [ms for b in backends.values() for ms, t in zip(b.step_ms, b.step_end) if 0 <= t - kill["t"] <= 10]
        rest = [ms for b in backends.values() for ms, t in zip(b.step_ms, b.step_end) if not 0 <= t - kill["t"] <= 10]
        after = {"steps_within_10s_after_kill_ms": pcts(near), "other_steps_ms": pcts(rest)}
    host_stats = {name: ray.get(hosts[name].stats.remote()) for name in ("D", "E")}
    return {
        **counts, "run_s": run_s, "pool": len(pool), "distinct_sets_used": len(set(draws)),
        "killed_shard": router.names[0], "kill_before_open": kill.get("at_open"), "kill_request": kill.get("request"),
        "kill_call_s": kill.get("kill_s"), "shard_stats_before_kill": kill.get("stats_before"),
        "shard_stats": router.stats(),
        "host_step_ms": {n: pcts(b.step_ms) for n, b in backends.items()}, **after,
        "host_ttfm_ms": {n: pcts(b.ttfm_ms) for n, b in backends.items()},
        "host_tier": {n: s.get("tier") for n, s in host_stats.items()},
        "host_runtime": {n: s.get("runtime") for n, s in host_stats.items()},
        "errors": [e for lane in lanes for e in lane.errors][:10],
    }


def bench_cache_bytes(hosts: dict[str, Any], router: Any) -> dict:
    import ray

    out: dict[str, Any] = {"hosts": {}, "shards": []}
    ok = True
    for name, h in hosts.items():
        cb = ray.get(h.stats.remote())["cache_bytes"]
        within = cb["grammars"] <= cb["grammars_budget"] and cb["compiler"] <= cb["compiler_budget"]
        out["hosts"][name] = {**cb, "within": within}
        ok &= within
    for name, st in zip(router.names, router.stats()):
        if "error" in st:
            out["shards"].append({"name": name, **st, "within": False})
            ok = False
            continue
        within = st["bytes"] <= st["budget_bytes"]
        out["shards"].append({"name": name, "bytes": st["bytes"], "budget_bytes": st["budget_bytes"],
                              "items": st["items"], "evictions": st["evictions"], "within": within})
        ok &= within
    out["within_budgets"] = bool(ok)
    return out


# ---------------------------------------------------------------------------------------------- main


def summary(res: dict) -> str:
    lines = ["", "batch fill (in process, torch int32 bitmask)",
             f"  {'B':>5} {'per row us':>11} {'single us':>10} {'ratio':>6} {'rows same':>9}"]
    for b, e in res["batch_fill"].items():
        lines.append(f"  {b:>5} {e['per_row_us']:>11.2f} {e['single_us']:>10.2f} {e['ratio']:>6.2f} "
                     f"{e['rows_identical']!s:>9}")
    e32 = res["batch_fill"].get("32", {})
    if "submit_wait_us" in e32:
        lines.append(f"  B=32 submit_fill().wait(): {e32['submit_wait_us']:.1f} us per call")
    hs = res["host_step"]
    lines += ["", "MatcherHost (Ray)",
              f"  actor round trip (ping)     p50 {res['actor_rtt_ms']:.3f} ms",
              f"  32-row fill in process      p50 {res['fills_ms']:.3f} ms (accept {hs['accept_ms']:.3f} ms)",
              f"  reply of 32 int32 rows      p50 {hs['reply_rtt_ms']:.3f} ms (an empty call returning them)",
              (f"  host step, 32 sessions      p50 {res['host_step_p50_ms']:.3f} ms, "
               f"p90 {res['host_step_p90_ms']:.3f} ms (bound {res['host_step_bound_ms']:.3f} ms; {hs['steps']} steps, "
               f"wrong rows {hs['wrong_masks']}, disallowed {hs['disallowed_rows']})")]
    sh = res["sharing"]
    lines += ["", f"time to first mask, {sh['n']} new tool sets after host A built them",
              (f"  with shards (B)    p50 {res['shared_ttfm_p50_ms']:.2f} ms, p90 {res['shared_ttfm_p90_ms']:.2f} ms"
               f"  ({sh['b_tier_grammar_hits']} grammars from the shards, {sh['b_compiled_here']} compiled)"),
              f"  without (C)        p50 {res['unshared_ttfm_p50_ms']:.2f} ms, p90 {res['unshared_ttfm_p90_ms']:.2f} ms",
              f"  unshared / shared  {res['ttfm_ratio']:.2f} (p50)   masks identical: {res['masks_identical']}"]
    sk = res["shard_kill"]
    lines += ["", (f"shard kill: {sk['requests']} requests, {sk['steps']} steps, shard {sk['killed_shard']} "
                   f"killed before open {sk['kill_before_open']}"),
              (f"  wrong masks {sk['wrong_masks']}, failed requests {sk['failed_requests']}, disallowed rows "
               f"{sk['disallowed_rows']}, completed {sk['completed']}")]
    for st in sk["shard_stats"]:
        lines.append(f"  shard: {json.dumps(st)}")
    cb = res["cache_bytes"]
    lines += ["", f"cache bytes (within budgets: {cb['within_budgets']})"]
    for name, c in cb["hosts"].items():
        lines.append(f"  host {name}: grammars {c['grammars'] / 2**20:.1f} / {c['grammars_budget'] / 2**20:.0f} MB, "
                     f"compiler {c['compiler'] / 2**20:.1f} / {c['compiler_budget'] / 2**20:.0f} MB")
    for s in cb["shards"]:
        if "bytes" in s:
            lines.append(f"  {s['name']}: {s['bytes'] / 2**20:.1f} / {s['budget_bytes'] / 2**20:.0f} MB, "
                         f"{s['items']} items")
    lines.append(f"\nwall time {res['wall_s']:.0f} s")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller sizes (under 15 minutes on 2 cores)")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--shards", type=int, default=2, help="CacheShard actors")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.shards < 1:
        ap.error("--shards must be at least 1")
    for path in (TOKENIZER, REGISTRY):
        if not path.exists():
            ap.error(f"{path} not found (the shared data lives beside the checkout, or set XG2_SHARED_DIR)")
    cfg = SIZES["quick" if args.quick else "full"]
    t_start = time.perf_counter()

    from tokenizers import Tokenizer

    import xg2
    from xg2.actors import GrammarRuntime

    tok_path = str(TOKENIZER)
    info = xg2.TokenizerInfo.from_huggingface(tok_path)
    VOCAB_SIZE[0] = info.vocab_size
    stop_ids = list(info.stop_token_ids)
    wl = Workload(Tokenizer.from_file(tok_path), args.seed)
    res: dict[str, Any] = {"args": {"quick": args.quick, "shards": args.shards, "seed": args.seed,
                                    "json": str(args.json) if args.json else None},
                           "config": cfg, "tokenizer": tok_path, "vocab_size": info.vocab_size, "stop_ids": stop_ids}

    batch_pool = wl.take(max(BATCH_SIZES))
    log(f"{len(batch_pool)} requests for batch_fill, mean {statistics.fmean(len(r.tokens) for r in batch_pool):.0f}"
        f" tokens ({time.perf_counter() - t_start:.1f} s)")
    loop = asyncio.new_event_loop()
    rt = GrammarRuntime(info)
    res["batch_fill"] = bench_batch_fill(rt, loop, batch_pool, cfg["reps"])

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")    # node IP 127.0.0.1: servers on loopback
    import ray

    from xg2.actors.host import host_actor_class
    from xg2.actors.router import ShardRouter

    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR",
             namespace=f"xg2-bench-{os.getpid()}")
    router = None
    ref_rt = GrammarRuntime(info)
    try:
        host_cls = host_actor_class()
        host_s = host_cls.remote(tok_path)
        ray.get(host_s.ping.remote())
        rtt = bench_rtt(host_s, cfg["rtt_calls"])
        res["actor_rtt"] = rtt
        res["actor_rtt_ms"] = rtt["median_ms"]
        log(f"actor rtt {rtt['median_ms']:.3f} ms")

        step = bench_host_step(host_s, rt, loop, batch_pool[:cfg["step_pool"]], cfg, stop_ids)
        res["host_step"] = step
        res["fills_ms"] = step["fills_ms"]
        res["host_step_p50_ms"] = step["host_step_ms"]["p50"]
        res["host_step_p90_ms"] = step["host_step_ms"]["p90"]
        res["host_step_bound_ms"] = res["actor_rtt_ms"] + res["fills_ms"]
        log(f"host step p50 {res['host_step_p50_ms']:.3f} ms, fills {res['fills_ms']:.3f} ms")

        router = ShardRouter.create(args.shards, prefix=f"bench-shard-{os.getpid()}")
        hosts = {"S": host_s, "A": host_cls.remote(tok_path, shards=router.names),
                 "B": host_cls.remote(tok_path, shards=router.names), "C": host_cls.remote(tok_path)}
        ray.get([h.ping.remote() for h in hosts.values()])
        sharing = bench_sharing(hosts, wl, cfg, stop_ids)
        res["sharing"] = sharing
        res.update(shared_ttfm_p50_ms=sharing["shared_ttfm_ms"]["p50"],
                   shared_ttfm_p90_ms=sharing["shared_ttfm_ms"]["p90"],
                   unshared_ttfm_p50_ms=sharing["unshared_ttfm_ms"]["p50"],
                   unshared_ttfm_p90_ms=sharing["unshared_ttfm_ms"]["p90"],
                   masks_identical=sharing["masks_identical"])
        res["ttfm_ratio"] = res["unshared_ttfm_p50_ms"] / res["shared_ttfm_p50_ms"]
        res["ttfm_ratio_p90"] = res["unshared_ttfm_p90_ms"] / res["shared_ttfm_p90_ms"]
        log(f"ttfm shared p50 {res['shared_ttfm_p50_ms']:.2f} ms, unshared {res['unshared_ttfm_p50_ms']:.2f} ms, "
            f"masks identical {res['masks_identical']}")

        hosts["D"] = host_cls.remote(tok_path, shards=router.names)
        hosts["E"] = host_cls.remote(tok_path, shards=router.names)
        ray.get([hosts["D"].ping.remote(), hosts["E"].ping.remote()])
        res["shard_kill"] = bench_shard_kill(hosts, router, ref_rt, loop, wl, cfg, stop_ids, args.seed)
        log(f"shard kill: {res['shard_kill']['wrong_masks']} wrong masks, "
            f"{res['shard_kill']['failed_requests']} failed requests")

        for h in hosts.values():
            ray.get(h.flush.remote(60.0))
        res["cache_bytes"] = bench_cache_bytes(hosts, router)
    finally:
        if router is not None:
            for h in router.handles:
                with contextlib.suppress(Exception):
                    ray.kill(h, no_restart=True)
        ray.shutdown()
        rt.shutdown()
        ref_rt.shutdown()
        loop.close()
    res["wall_s"] = time.perf_counter() - t_start
    print(summary(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1, ensure_ascii=False, default=str))


if __name__ == "__main__":
    main()
