"""The mask service's Ray Serve handle under the load test's multi-tenant scenario (issue 18), from
asyncio: locust's gevent cannot patch Ray's core, so the handle is driven by this separate program.

    python loadtests/mask_driver.py [--duration S] [--tenants N] [--sessions-per-step B]
                                    [--max-tokens T] [--step-mode packed|rows] [--attach [ADDRESS]]
                                    [--model tiny] [--seed N] [--json FILE]

Without `--attach` the application is started here (`serve.cli.Server`, the tiny model by default,
a free loopback port) and stopped at the end; with it, the driver joins a running Ray (`auto` by
default) and uses the application named `--app` (`xg2-masks`, as serve/cli.py names it).

Each tenant task plays an engine that keeps its own model and asks the mask service for masks, as
an engine would: through a `StepClient` over the application's Serve handle, which asks Serve once
for a replica's host actor and then calls it directly (the default, `--step-mode packed`). It
opens a batch of sessions (`open`, first mask included), then makes ONE call per decode step for
the whole batch (`step_packed` through the client's row book), picks each next token at random
among those the mask allows (so every token is valid by construction, and any refusal is the
service's fault), and closes the batch when its sessions have ended (stop token accepted) or
reached `--max-tokens`. For comparison, `--step-mode packed-serve` sends the same steps through the
Serve handle (routed by session id to the replica that holds them), and `rows` sends `step_rows`
(whole rows) through the handle. The tenant classes and their grammars are the locust
scenario's (loadtests/workload.py, the same seed, the same specs as the HTTP front end builds, so
both share compiled grammars by content key):

- `tools`: Zipf-drawn registry tool sets, `tool_choice` auto / required / named (qwen_3 format);
- `json`: Zipf-drawn jsonschemabench schemas, without whitespace;
- `grammar`: the workload's regex and EBNF cases.

Checks, as a client makes them: every chosen token is accepted; a mask of a session that has not
ended allows some token; a session ends exactly when a stop token was chosen; a finished output
(decoded as the replica decodes: the model's tokenizer, special tokens kept, the stop token cut)
parses and validates against its schema, calls tools of its set with valid arguments, or is in
its grammar's language (workload's checks; judged after the run, off the event loop the replies
wait on). Every call is bounded (`--call-timeout`) and counted
by method; failures by exception type. Sessions are always closed, and the service's open-session
count is compared before and after (a leak check).

A step's latency is what an engine waits for: from the call to the rows in hand (the reply read
into the bitmask). The driver's own share is reported beside it: its CPU (in cores, over the run;
six engines share one Python process here, which a real deployment would not) and how late its
event loop runs a 5 ms timer (p99): when either is high, the latencies are the driver's, not the
service's.

The JSON summary (printed on stdout, and written to `--json`: the file is what to parse, since Ray
prints its own shutdown messages on stdout too): calls, failed calls by type, invalid outputs,
check failures, step-call latency p50/p95/p99, open latency p50/p99, masks per second, per tenant
class counts, the driver's CPU and loop lag, and the service's runtime counters summed over its
replicas (`handle.broadcast("stats")`) with each replica's open sessions and clients; the
headline figures go to stderr. The exit
status is 1 when anything failed or did not check.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:       # `python loadtests/mask_driver.py` and `import loadtests.mask_driver`
    sys.path.insert(0, str(HERE))
import workload as w
from run import PROMPT_BUDGETS, free_port, quantile  # the locust run's: same figures, same tool sets

APP_NAME = "xg2-masks"
CLASSES = ("tools", "json", "grammar")
#: Tenant classes in the order tasks take them: the locust weights (3 : 2 : 2) over seven tasks,
#: and the three classes among the first three, so even a small run covers them all.
CLASS_CYCLE = ("tools", "json", "grammar", "tools", "json", "grammar", "tools")
MAX_TENANTS = 64
MAX_BATCH = 64
MAX_DURATION_S = 3600.0
#: Keys of tenants per class, as the locust users' (`lt-<class>-<n>`): grammars shared across
#: tenants by content, sessions kept apart by tenant.
TENANTS_PER_CLASS = 2
#: Messages kept per kind of failure or invalid output.
SAMPLES = 20
#: Exception types an `open` may raise for a grammar xg2 refuses by design: counted as
#: `unsupported` (the locust users' 400 at the schema), not as failed calls.
REFUSALS = ("GrammarError", "GrammarLimitError", "RegexError", "SchemaError", "StructuralTagError",
            "ModelFormatError")


def say(msg: str) -> None:
    print(f"[mask-driver {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _r(x: float | None, nd: int = 2) -> float | None:
    return None if x is None else round(x, nd)


def cause_of(e: BaseException) -> BaseException:
    """The exception the replica raised: Ray hands it back wrapped (a RayTaskError that is also an
    instance of its cause, with the cause in `.cause`); the type name counted is the cause's."""
    cause = getattr(e, "cause", None)
    return cause if isinstance(cause, BaseException) else e


def _bit_counts(words: np.ndarray) -> np.ndarray:
    if hasattr(np, "bitwise_count"):        # numpy >= 2.0
        return np.bitwise_count(words)
    return np.unpackbits(words.view(np.uint8)).reshape(-1, 32).sum(1)


class RowView:
    """One mask row read the way the tenant reads it every step (bit j of word i is token 32 i +
    j, xgrammar's layout): how many tokens it allows, and the k-th of them in id order, from
    per-word bit counts (the row's 1,500 words, not its 49,000 bits: unpacking every bit twice a
    row a step was a fifth of the driver's CPU)."""

    def __init__(self, row: np.ndarray, vocab_size: int):
        words = np.ascontiguousarray(row, "<u4").view(np.uint32)
        tail = vocab_size - 32 * (len(words) - 1)       # bits past the vocabulary do not count
        if tail < 32:
            words = words.copy()
            words[-1] &= np.uint32((1 << tail) - 1)
        self.words = words
        self.counts = np.cumsum(_bit_counts(words), dtype=np.int64)
        self.size = int(self.counts[-1]) if len(self.counts) else 0

    def allows(self, token: int) -> bool:
        return bool(self.words[token >> 5] >> np.uint32(token & 31) & 1) if token >> 5 < len(self.words) else False

    def kth(self, k: int) -> int:
        """The k-th allowed token (0-based, in id order)."""
        i = int(np.searchsorted(self.counts, k, side="right"))
        word = int(self.words[i])
        skip = k - (int(self.counts[i - 1]) if i else 0)
        for _ in range(skip):
            word &= word - 1
        return 32 * i + (word & -word).bit_length() - 1


# ------------------------------------------------------------------------------------------------
# What a tenant asks for
# ------------------------------------------------------------------------------------------------

@dataclass
class Draw:
    """One session's grammar: its spec (sent to `open`) and the judge of its finished text."""

    cls: str
    label: str                          # the tool set, schema or grammar case drawn
    spec: Any
    judge: Callable[[str], w.Verdict]


class Workload:
    """The locust scenario's pools (loadtests/workload.py, same seed and sizes), and the specs
    serve/grammars.py builds from the same requests: only a tool's name and parameters, the
    schema with strict mode and no whitespace, the regex or EBNF text as it is."""

    def __init__(self, *, seed: int, model: str, tool_format: str, tool_pool: int = 1000, zipf_s: float = 1.1,
                 easy_named: float = 0.5):
        t0 = time.perf_counter()
        self.tools = w.ToolPool(w.load_registry_tools(), seed=seed, size=tool_pool,
                                budget_tokens=PROMPT_BUDGETS.get(model, PROMPT_BUDGETS["default"]))
        self.tool_zipf = w.ZipfIndex(tool_pool, zipf_s)
        self.schemas = w.SchemaPool(seed=seed)
        self.schema_zipf = w.ZipfIndex(len(self.schemas.schemas), zipf_s)
        self.tool_format = tool_format
        self.easy_named = easy_named
        self.load_s = time.perf_counter() - t0

    def draw(self, cls: str, rng: random.Random) -> Draw | None:
        if cls == "tools":
            return self._tools(rng)
        if cls == "json":
            return self._json(rng)
        return self._grammar(rng)

    def _tools(self, rng: random.Random) -> Draw:
        from xg2.actors.spec import ToolsSpec

        i = self.tool_zipf.draw(rng)
        ts = self.tools.get(i)
        mode = rng.choice(("auto", "required", "named"))
        choice: Any = mode
        if mode == "named":     # as the locust users: half the time a tool without required arguments
            names = ts.easy if ts.easy and rng.random() < self.easy_named else ts.names
            choice = {"type": "function", "function": {"name": rng.choice(names)}}
        tools = [{"type": "function", "function": {"name": t["function"]["name"],
                                                   "parameters": t["function"]["parameters"]}} for t in ts.tools]
        spec = ToolsSpec(tools, choice, self.tool_format, True, "disabled")

        def judge(text: str) -> w.Verdict:
            """The output read back as the server reads it (the format's own reader)."""
            import xg2
            from serve.chat import openai_tool_calls

            out = xg2.read_model_output(self.tool_format, text, tools, "disabled")
            calls = openai_tool_calls(out.calls)
            finish = "length" if out.cut else "tool_calls" if calls else "stop"
            return w.check_tool_output(finish, out.content, calls, ts, choice)

        return Draw("tools", f"tools/{i}/{mode}", spec, judge)

    def _json(self, rng: random.Random) -> Draw | None:
        from xg2.actors.spec import JSONSchemaSpec

        pool = self.schemas
        for _ in range(8):
            s = pool.schemas[self.schema_zipf.draw(rng)]
            if s.id not in pool.refused:
                return Draw("json", f"schema/{s.id}", JSONSchemaSpec(s.schema, any_whitespace=False),
                            lambda text, s=s: w.check_json_output("stop", text, s.validator))
        return None

    @staticmethod
    def _grammar(rng: random.Random) -> Draw:
        from xg2.actors.spec import EBNFSpec, RegexSpec

        case = rng.choice(w.GRAMMAR_CASES)
        spec = RegexSpec(case.grammar) if case.kind == "regex" else EBNFSpec(case.grammar)
        return Draw("grammar", case.name, spec, lambda text: w.check_grammar_output("stop", text, case))


# ------------------------------------------------------------------------------------------------
# What is measured
# ------------------------------------------------------------------------------------------------

@dataclass
class Tally:
    """Every count and latency of a run, shared by the tasks (one event loop: no lock)."""

    calls: Counter = field(default_factory=Counter)             # by method
    failures: Counter = field(default_factory=Counter)          # by "method: Type"
    failure_samples: list[dict] = field(default_factory=list)
    unsupported: Counter = field(default_factory=Counter)       # refused grammars, by type
    unsupported_samples: list[dict] = field(default_factory=list)
    checks: Counter = field(default_factory=Counter)            # failed client checks, by kind
    check_samples: list[dict] = field(default_factory=list)
    invalid_samples: list[dict] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)
    read_ms: list[float] = field(default_factory=list)
    open_ms: list[float] = field(default_factory=list)
    ttfm_ms: list[float] = field(default_factory=list)          # the service's own, from open's reply
    close_ms: list[float] = field(default_factory=list)
    batch_rows: list[int] = field(default_factory=list)
    loop_lag_ms: list[float] = field(default_factory=list)      # the driver's event loop, late by
    by_class: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    labels: dict[str, set] = field(default_factory=lambda: defaultdict(set))

    def fail(self, method: str, e: BaseException, **ctx: Any) -> None:
        c = cause_of(e)
        kind = f"{method}: {type(c).__name__}"
        self.failures[kind] += 1
        if len(self.failure_samples) < SAMPLES:
            self.failure_samples.append({"kind": kind, "msg": str(c).splitlines()[0][:300] if str(c) else "", **ctx})

    def check(self, kind: str, msg: str, **ctx: Any) -> None:
        self.checks[kind] += 1
        if len(self.check_samples) < SAMPLES:
            self.check_samples.append({"kind": kind, "msg": msg[:300], **ctx})


# ------------------------------------------------------------------------------------------------
# The tenants
# ------------------------------------------------------------------------------------------------

@dataclass
class Session:
    id: str
    draw: Draw
    mask: np.ndarray
    tokens: list[int] = field(default_factory=list)
    view: RowView | None = None


class Tenant:
    """One tenant task: batches of sessions opened, stepped one call per step, checked, closed,
    until the deadline. It plays an engine: it owns a StepClient (its row book), and never has
    more than one step in flight, which is what StepClient requires."""

    def __init__(self, n: int, cls: str, handle: Any, workload: Workload, tally: Tally, *, args: argparse.Namespace,
                 vocab_size: int, stop_ids: list[int], tokenizer: Any, deadline: float):
        from xg2.actors.host import StepClient

        self.n, self.cls, self.handle, self.workload, self.tally = n, cls, handle, workload, tally
        self.tenant = f"md-{cls}-{n // len(CLASSES) % TENANTS_PER_CLASS}"
        self.rng = random.Random(f"{args.seed}/mask-driver/{cls}/{n}")
        self.batch, self.max_tokens, self.mode = args.sessions_per_step, args.max_tokens, args.step_mode
        self.stop_bias, self.timeout = args.stop_bias, args.call_timeout
        self.vocab_size, self.stop_ids, self.tokenizer = vocab_size, stop_ids, tokenizer
        self.stop_set = frozenset(stop_ids)
        self.deadline = deadline
        self.client = StepClient(handle, self.tenant, vocab_size)
        self.counts = tally.by_class[cls]
        self.finished: list[tuple[Draw, list[int]]] = []

    async def _call(self, method: str, *args: Any) -> Any:
        """One bounded call through the Serve handle (a timeout cancels the request)."""
        self.tally.calls[method] += 1
        return await asyncio.wait_for(getattr(self.handle, method).remote(self.tenant, *args), self.timeout)

    async def _bounded(self, method: str, call: Any) -> Any:
        """One bounded call the StepClient makes (on the replica's host, directly)."""
        self.tally.calls[method] += 1
        return await asyncio.wait_for(call, self.timeout)

    async def run(self) -> None:
        self.counts["tenants"] += 1
        while time.monotonic() < self.deadline:
            draws = [d for d in (self.workload.draw(self.cls, self.rng) for _ in range(self.batch)) if d is not None]
            if not draws:
                await asyncio.sleep(0.1)
                continue
            self.counts["batches"] += 1
            sessions = [s for s in await asyncio.gather(*(self._open(d) for d in draws)) if s is not None]
            try:
                if sessions:
                    await self._decode(sessions)
            finally:
                await self._close(sessions)

    async def _open(self, draw: Draw) -> Session | None:
        """Open one session with its first mask in the reply (what an engine needs before its
        first forward pass); a grammar refused by design is counted and not drawn again."""
        self.tally.labels[self.cls].add(draw.label)
        t0 = time.perf_counter()
        try:
            reply = await self._bounded("open", self.client.open_async(draw.spec))
        except Exception as e:      # noqa: BLE001 - every failure is counted, the run goes on
            c = cause_of(e)
            if type(c).__name__ in REFUSALS:
                self.counts["unsupported"] += 1
                self.tally.unsupported[type(c).__name__] += 1
                if len(self.tally.unsupported_samples) < SAMPLES:
                    self.tally.unsupported_samples.append({"label": draw.label, "msg": str(c)[:300]})
                if draw.label.startswith("schema/"):
                    self.workload.schemas.refused.add(draw.label.removeprefix("schema/"))
            else:
                self.counts["open_failed"] += 1
                self.tally.fail("open", e, label=draw.label)
            return None
        self.tally.open_ms.append((time.perf_counter() - t0) * 1e3)
        if "ttfm_ms" in reply:
            self.tally.ttfm_ms.append(reply["ttfm_ms"])
        self.counts["sessions"] += 1
        return Session(reply["session"], draw, np.asarray(reply["mask"]))

    def _mask_ok(self, s: Session) -> bool:
        """A session that has not ended must be allowed some token."""
        s.view = RowView(s.mask, self.vocab_size)
        if s.view.size:
            return True
        self.counts["empty_masks"] += 1
        self.tally.check("empty_mask", "a live session's mask allows no token", label=s.draw.label,
                         tokens=len(s.tokens))
        return False

    def _pick(self, s: Session) -> int:
        """A random allowed token; a stop token, when allowed, with probability `stop_bias` (a
        model stops when it can; a uniform draw among 49k tokens almost never would)."""
        view = s.view
        stops = [t for t in self.stop_ids if t < self.vocab_size and view.allows(t)]
        if stops and self.rng.random() < self.stop_bias:
            return self.rng.choice(stops)
        return view.kth(self.rng.randrange(view.size))

    async def _step(self, ids: list[str], tokens: list[int]) -> tuple[np.ndarray, list[bool], list[bool]]:
        """One call for the whole batch: the tokens chosen go in, the next rows come back (the
        latency counted is until they are in hand, read as the engine reads them)."""
        t0 = time.perf_counter()
        if self.mode == "packed":
            out = await self._bounded("step_packed", self.client.step_async(ids, tokens))
        elif self.mode == "packed-serve":
            reply = await self._call("step_packed", self.client.request(ids, tokens))
            t1 = time.perf_counter()
            out = self.client.read(ids, reply)
            self.tally.read_ms.append((time.perf_counter() - t1) * 1e3)
        else:
            reply = await self._call("step_rows", ids, tokens)
            out = np.asarray(reply["masks"]), list(reply["accepted"]), list(reply["ended"])
        self.tally.step_ms.append((time.perf_counter() - t0) * 1e3)
        return out

    async def _decode(self, sessions: list[Session]) -> None:
        live = [s for s in sessions if self._mask_ok(s)]
        while live:
            if time.monotonic() >= self.deadline:
                self.counts["cut_at_end"] += len(live)
                return
            tokens = [self._pick(s) for s in live]
            ids = [s.id for s in live]
            try:
                rows, accepted, ended = await self._step(ids, tokens)
            except Exception as e:  # noqa: BLE001 - counted; the batch is given up and closed
                self.counts["step_failed"] += 1
                self.counts["abandoned"] += len(live)
                self.tally.fail("step_rows" if self.mode == "rows" else "step_packed", e, rows=len(ids))
                return
            self.counts["steps"] += 1
            self.counts["masks"] += len(ids)
            self.tally.batch_rows.append(len(ids))
            nxt = []
            for s, tok, row, acc, end in zip(live, tokens, rows, accepted, ended):
                if not acc:
                    self.counts["rejected_tokens"] += 1
                    self.tally.check("rejected_token", f"token {tok} allowed by the mask was refused",
                                     label=s.draw.label, tokens=len(s.tokens))
                    continue
                s.tokens.append(tok)
                self.counts["tokens"] += 1
                if end != (tok in self.stop_set):
                    self.tally.check("ended_mismatch", f"ended={end} after token {tok}", label=s.draw.label)
                if end:
                    self._judge(s)
                elif len(s.tokens) >= self.max_tokens:
                    self.counts["truncated"] += 1
                else:
                    s.mask = row
                    if self._mask_ok(s):
                        nxt.append(s)
            live = nxt

    def _judge(self, s: Session) -> None:
        """A finished output, kept to be judged after the run (`judge_finished`): judging in the
        run would hold the event loop the other tenants' replies wait on (decoding and validating
        a document takes milliseconds), and count the driver's checks in the service's latency."""
        self.counts["finished"] += 1
        self.finished.append((s.draw, s.tokens))

    def judge_finished(self) -> None:
        """Each finished output, decoded as the replica decodes it (serve.replica.TextStream: the
        tokenizer, special tokens kept, the stop token not part of the text), judged."""
        for draw, tokens in self.finished:
            ids = tokens[:-1] if tokens and tokens[-1] in self.stop_set else tokens
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
            verdict = draw.judge(text)
            if not verdict.ok:
                self.counts["invalid"] += 1
                if len(self.tally.invalid_samples) < SAMPLES:
                    self.tally.invalid_samples.append({"label": draw.label, "msg": verdict.message,
                                                       "text": text[:300], "tokens": tokens[:128]})
            else:
                self.counts["checked_ok"] += 1
        self.finished.clear()

    async def _close(self, sessions: list[Session]) -> None:
        """Close the batch (also after a failure or at the deadline); the service must find them
        all, since none was closed before."""
        if not sessions:
            return
        ids = [s.id for s in sessions]
        t0 = time.perf_counter()
        try:
            closed = await self._bounded("close", self.client.close_async(ids))
        except Exception as e:      # noqa: BLE001
            self.tally.fail("close", e, sessions=len(ids))
            return
        self.tally.close_ms.append((time.perf_counter() - t0) * 1e3)
        if closed != len(ids):
            self.tally.check("close_count", f"close found {closed} of {len(ids)} open sessions")


# ------------------------------------------------------------------------------------------------
# The run
# ------------------------------------------------------------------------------------------------

async def drive(handle: Any, args: argparse.Namespace, workload: Workload, tokenizer: Any,
                stop_ids: list[int]) -> dict:
    """The tenant tasks until the deadline, then the summary (with the service's counters before
    and after: its open sessions must be back where they were)."""
    tally = Tally()
    tally.calls.update(("info", "stats"))
    info = await asyncio.wait_for(handle.info.remote(), args.call_timeout)
    vocab_size = int(info["vocab_size"])
    before = await service_stats(handle, args.call_timeout)
    t0 = time.monotonic()
    cpu0 = time.process_time()
    deadline = t0 + args.duration
    lag = asyncio.create_task(loop_lag(tally, deadline))
    tenants = [Tenant(n, CLASS_CYCLE[n % len(CLASS_CYCLE)], handle, workload, tally, args=args,
                      vocab_size=vocab_size, stop_ids=stop_ids, tokenizer=tokenizer, deadline=deadline)
               for n in range(args.tenants)]
    say(f"{len(tenants)} tenant tasks ({', '.join(f'{c} {sum(t.cls == c for t in tenants)}' for c in CLASSES)}), "
        f"{args.sessions_per_step} sessions a batch, {args.step_mode} steps, {args.duration:g} s")
    results = await asyncio.gather(*(t.run() for t in tenants), return_exceptions=True)
    elapsed = time.monotonic() - t0
    cpu = time.process_time() - cpu0
    await lag
    crashed = [r for r in results if isinstance(r, BaseException)]
    for t in tenants:
        t.judge_finished()
    for r in crashed:                   # a driver bug, not the service's: reported as such
        tally.fail("driver", r)
    tally.calls["stats"] += 1
    after = await service_stats(handle, args.call_timeout)
    summary = summarize(tally, elapsed, before, after, args, vocab_size, len(crashed))
    host_cpu = {r["tag"]: r["cpu_s"] for r in before["replicas"] if r.get("cpu_s") is not None}
    summary["service"]["host_cpu_cores"] = {
        r["tag"]: round((r["cpu_s"] - host_cpu[r["tag"]]) / max(elapsed, 1e-9), 2)
        for r in after["replicas"] if r.get("cpu_s") is not None and r["tag"] in host_cpu}
    summary["driver"] = {"cpu_cores": round(cpu / max(elapsed, 1e-9), 2),
                         "loop_lag_p50_ms": _r(quantile(tally.loop_lag_ms, 0.5)),
                         "loop_lag_p99_ms": _r(quantile(tally.loop_lag_ms, 0.99))}
    return summary


async def loop_lag(tally: Tally, deadline: float, period_s: float = 0.005) -> None:
    """How late the driver's event loop wakes a timer: the time a reply waits before its tenant
    runs again, which a step's latency includes without being the service's."""
    while time.monotonic() < deadline:
        t = time.perf_counter()
        await asyncio.sleep(period_s)
        tally.loop_lag_ms.append((time.perf_counter() - t - period_s) * 1e3)


async def service_stats(handle: Any, timeout_s: float) -> dict:
    """Every replica's figures (`stats` broadcast): runtime counters, open sessions and cache bytes
    summed, and each replica's open sessions and bound clients."""
    replies = await handle.broadcast("stats").results_async(timeout_s=timeout_s)
    runtime: Counter = Counter()
    cache: Counter = Counter()
    for r in replies:
        runtime.update({k: v for k, v in (r.get("runtime") or {}).items() if isinstance(v, (int, float))})
        cache.update(r.get("cache_bytes") or {})
    return {"runtime": dict(runtime), "cache_bytes": dict(cache),
            "open_sessions": sum(r.get("open_sessions", 0) for r in replies),
            "replicas": sorted(({"tag": (r.get("replica") or {}).get("tag"),
                                 "clients": (r.get("replica") or {}).get("clients"),
                                 "open_sessions": r.get("open_sessions"), "cpu_s": r.get("cpu_s"),
                                 **(r.get("timings") or {})}
                                for r in replies),
                               key=lambda x: str(x["tag"]))}


def summarize(t: Tally, elapsed: float, before: dict, after: dict, args: argparse.Namespace, vocab_size: int,
              crashed: int) -> dict:
    span = max(elapsed, 1e-9)
    masks = sum(c["masks"] for c in t.by_class.values())
    invalid = sum(c["invalid"] for c in t.by_class.values())
    rt0, rt1 = before.get("runtime") or {}, after.get("runtime") or {}
    leaked = after.get("open_sessions", 0) - before.get("open_sessions", 0)
    if leaked and not args.attach:      # attached, other clients may hold sessions: reported only
        t.check("leaked_sessions", f"{leaked} more sessions open on the service after the run than before")
    keys = ("tenants", "batches", "sessions", "steps", "masks", "tokens", "finished", "checked_ok", "invalid",
            "truncated", "cut_at_end", "abandoned", "unsupported", "open_failed", "step_failed", "rejected_tokens",
            "empty_masks")
    return {
        "duration_s": round(elapsed, 1),
        "tenants": args.tenants,
        "calls": sum(t.calls.values()),
        "calls_by_method": dict(t.calls),
        "failed_calls": sum(t.failures.values()),
        "failed_by_type": dict(t.failures),
        "failure_samples": t.failure_samples,
        "invalid_outputs": invalid,
        "invalid_samples": t.invalid_samples,
        "check_failures": sum(t.checks.values()),
        "check_failures_by_kind": dict(t.checks),
        "check_samples": t.check_samples,
        "unsupported": sum(t.unsupported.values()),
        "unsupported_by_type": dict(t.unsupported),
        "unsupported_samples": t.unsupported_samples,
        "step_calls": len(t.step_ms),
        "step_p50_ms": _r(quantile(t.step_ms, 0.5)), "step_p95_ms": _r(quantile(t.step_ms, 0.95)),
        "step_p99_ms": _r(quantile(t.step_ms, 0.99)), "step_max_ms": _r(max(t.step_ms, default=None)),
        "step_read_p50_ms": _r(quantile(t.read_ms, 0.5), 3),
        "rows_per_step": _r(sum(t.batch_rows) / len(t.batch_rows) if t.batch_rows else None),
        "open_calls": len(t.open_ms),
        "open_p50_ms": _r(quantile(t.open_ms, 0.5)), "open_p99_ms": _r(quantile(t.open_ms, 0.99)),
        "open_max_ms": _r(max(t.open_ms, default=None)),
        "ttfm_service_p50_ms": _r(quantile(t.ttfm_ms, 0.5)), "ttfm_service_p99_ms": _r(quantile(t.ttfm_ms, 0.99)),
        "close_p50_ms": _r(quantile(t.close_ms, 0.5)),
        "masks": masks,
        "masks_per_s": round(masks / span, 1),
        "step_calls_per_s": round(len(t.step_ms) / span, 1),
        "by_class": {cls: {k: t.by_class[cls][k] for k in keys} | {"distinct_grammars": len(t.labels[cls])}
                     for cls in CLASSES if cls in t.by_class},
        "service": {
            "open_sessions_before": before.get("open_sessions"), "open_sessions_after": after.get("open_sessions"),
            "sessions_opened": rt1.get("sessions_opened", 0) - rt0.get("sessions_opened", 0),
            "compiles": rt1.get("compiles", 0) - rt0.get("compiles", 0),
            "grammar_hits_local": rt1.get("grammar_hits", 0) - rt0.get("grammar_hits", 0),
            "grammar_hits_shards": rt1.get("tier_grammar_hits", 0) - rt0.get("tier_grammar_hits", 0),
            "compile_shared": rt1.get("compile_shared", 0) - rt0.get("compile_shared", 0),
            "sessions_reaped": rt1.get("sessions_reaped", 0) - rt0.get("sessions_reaped", 0),
            "cache_bytes": after.get("cache_bytes"),
            "replicas_before": before.get("replicas"), "replicas_after": after.get("replicas"),
        },
        "driver_crashes": crashed,
        "config": {"duration_s": args.duration, "tenants": args.tenants, "sessions_per_step": args.sessions_per_step,
                   "max_tokens": args.max_tokens, "step_mode": args.step_mode, "stop_bias": args.stop_bias,
                   "seed": args.seed, "model": args.model, "vocab_size": vocab_size,
                   "attach": args.attach, "app": args.app, "call_timeout_s": args.call_timeout},
    }


def print_summary(s: dict) -> None:
    """The headline figures on stderr (the whole summary is the JSON on stdout)."""
    say(f"{s['calls']} calls in {s['duration_s']} s, failed {s['failed_calls']} {s['failed_by_type'] or ''}, "
        f"invalid outputs {s['invalid_outputs']}, check failures {s['check_failures']} "
        f"{s['check_failures_by_kind'] or ''}, unsupported {s['unsupported']}")
    say(f"steps: {s['step_calls']} calls ({s['rows_per_step']} rows each), p50/p95/p99 {s['step_p50_ms']} / "
        f"{s['step_p95_ms']} / {s['step_p99_ms']} ms; {s['masks_per_s']} masks/s; open p50/p99 {s['open_p50_ms']} / "
        f"{s['open_p99_ms']} ms")
    for cls, c in s["by_class"].items():
        say(f"  {cls:8s} sessions {c['sessions']}, finished {c['finished']} (ok {c['checked_ok']}, invalid "
            f"{c['invalid']}), truncated {c['truncated']}, cut {c['cut_at_end']}, grammars {c['distinct_grammars']}")
    d = s.get("driver") or {}
    spread = "; ".join(f"{r['tag']}: {r['clients']} clients, its loop late p99 {r.get('loop_lag_p99_ms')} ms "
                       f"(max {r.get('loop_lag_max_ms')}), a step on it p99 {r.get('step_p99_ms')} ms"
                       for r in s["service"].get("replicas_after") or [])
    say(f"driver: {d.get('cpu_cores')} cores of CPU, event loop late p50/p99 {d.get('loop_lag_p50_ms')} / "
        f"{d.get('loop_lag_p99_ms')} ms; hosts' CPU (cores) {s['service'].get('host_cpu_cores')}; replicas: {spread}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of load (default 30)")
    ap.add_argument("--tenants", type=int, default=6, help=f"tenant tasks (default 6, at most {MAX_TENANTS})")
    ap.add_argument("--sessions-per-step", type=int, default=8,
                    help=f"sessions a tenant opens and steps together (default 8, at most {MAX_BATCH})")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens a session is given before it is cut")
    ap.add_argument("--step-mode", choices=("packed", "packed-serve", "rows"), default="packed",
                    help="step_packed through StepClient on the replica's host (default), the same through "
                    "the Serve handle (packed-serve), or step_rows through the Serve handle")
    ap.add_argument("--stop-bias", type=float, default=0.3,
                    help="probability of taking a stop token when the mask allows one (default 0.3)")
    ap.add_argument("--model", default="tiny", help="the model the started application serves (default tiny)")
    ap.add_argument("--attach", nargs="?", const="auto", default=None, metavar="ADDRESS",
                    help="use a running Ray and application (ADDRESS default auto) instead of starting one")
    ap.add_argument("--app", default=APP_NAME, help=f"the mask service's application (default {APP_NAME})")
    ap.add_argument("--seed", type=int, default=0, help="the workload's pools and the tenants' draws")
    ap.add_argument("--call-timeout", type=float, default=30.0, help="bound of each call (default 30 s)")
    ap.add_argument("--json", help="write the summary here too")
    args = ap.parse_args(argv)
    if not 1 <= args.tenants <= MAX_TENANTS:
        ap.error(f"--tenants must be in 1..{MAX_TENANTS}")
    if not 1 <= args.sessions_per_step <= MAX_BATCH:
        ap.error(f"--sessions-per-step must be in 1..{MAX_BATCH}")
    if not 0 < args.duration <= MAX_DURATION_S:
        ap.error(f"--duration must be in (0, {MAX_DURATION_S:g}]")
    if args.max_tokens < 1 or not 0 <= args.stop_bias <= 1 or not args.call_timeout > 0:
        ap.error("--max-tokens must be positive, --stop-bias in [0, 1], --call-timeout positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    from serve.model import load_model

    t0 = time.perf_counter()
    loaded = load_model(args.model, progress=False)
    workload = Workload(seed=args.seed, model=args.model, tool_format=loaded.tool_format)
    say(f"model {args.model} and workload ready in {time.perf_counter() - t0:.1f} s "
        f"({len(workload.schemas.schemas)} schemas, {len(w.GRAMMAR_CASES)} grammar cases)")
    with contextlib.ExitStack() as stack:
        import ray
        from ray import serve

        if args.attach:
            ray.init(address=args.attach, namespace="xg2", logging_level="ERROR", log_to_driver=False)
            stack.callback(ray.shutdown)
        else:
            from serve.cli import Server

            port = free_port()
            say(f"starting the application (model {args.model}, port {port})")
            server = Server(model=args.model, port=port, mask_service=True, progress=False)
            stack.callback(server.stop)
            server.start()
            args.app = APP_NAME
        handle = serve.get_app_handle(args.app)
        summary = asyncio.run(drive(handle, args, workload, loaded.tokenizer, list(loaded.eos_token_ids)))
    print_summary(summary)
    text = json.dumps(summary, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    bad = summary["failed_calls"] or summary["invalid_outputs"] or summary["check_failures"] \
        or summary["driver_crashes"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
