"""GrammarRuntime: sessions and batched decode steps for many tenants, in the process that samples.

One runtime per process and vocabulary. Opening a session compiles its spec on a worker pool, off
the event loop: concurrent opens of the same spec share one compile (single-flight by content key),
a compile has a deadline, and a spec that failed is refused at once for a short while (negative
cache) rather than compiled again by every retry. Compiled grammars are kept by content key within
a byte budget; the compiler's own caches (modules, the cross-grammar entry pool) share another.

Each decode step touches the whole batch at once: `fill` writes every session's bitmask row in one
call into the core that releases the GIL once (split over a persistent pool of threads for large
batches), `submit_fill` starts the same work on that pool and returns a handle to wait on, so the
fill overlaps the forward pass; `accept`, `rollback` and `fork` (n > 1 sampling) follow. A session
keeps the tokens it accepted, so it can be rebuilt anywhere by replaying them (`restore`).

Compiles are fair across tenants: a waiting compile goes to the tenant that has used the least
compile time lately, a tenant past `max_compile_seconds_per_tenant` of recent compile time has its
new specs refused (QuotaError) until that decays, and with `compile_processes` the compiles run in
child processes (xg2.actors.compile_workers), so that no tenant's compile holds the GIL this
process's decode loop needs. With both, a tenant past half its budget compiles on a background
worker that runs on idle CPU only (SCHED_IDLE): before it is refused, a heavy tenant already stops
taking CPU from the others' decode steps.

Partial JIT as the XGrammar 2 paper means it: a compile builds the entries the first mask needs and
returns; the costliest others are built by the compiler's background thread while the model
prefills and decodes.

A second cache tier (`cache_tier`, xg2.actors.tier) is consulted on a compile: the compiled grammar
by its content key, and every mask entry the grammar's keys name in one batched fetch; what this
process builds is published to it in the background.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import itertools
import logging
import math
import os
import secrets
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from .._ext.core import fill_rows
from ..batch_matcher import MIN_ROWS_PER_THREAD, _bitmask_base
from ..compiler import REUSE_COUNTS, CompiledGrammar, GrammarCompiler, MustLower
from ..errors import FillTimeoutError, QuotaError, SessionError, SpecError, UsageError, XG2Error
from ..grammar.budget import CompileTimeout
from ..matcher import GrammarMatcher
from ..tokenizer import TokenizerInfo
from .compile_workers import CompileWorkers
from .spec import GrammarSpec, SessionSpec, ToolsSpec, as_session_spec, content_key
from .tier import GrammarFound

_log = logging.getLogger("xg2.runtime")

#: Defaults sized for a serving process: a few hundred MB of caches, thousands of sessions.
DEFAULT_CACHE_LIMIT_BYTES = 512 << 20
DEFAULT_GRAMMAR_CACHE_BYTES = 256 << 20
#: A tenant's recent compile time (what orders the compiles waiting for a worker) halves in this long.
COMPILE_USAGE_HALF_LIFE_S = 10.0
#: Default caps of one runtime: tenants with open sessions, and sessions in all (each holds a
#: matcher's parse; a caller that opens without closing, or invents tenants, stops here).
DEFAULT_MAX_TENANTS = 1024
DEFAULT_MAX_SESSIONS = 16384
#: A tenant past this fraction of `max_compile_seconds_per_tenant` compiles on the background worker
#: (idle CPU only). Measured here, the busiest well-behaved tenants of the load tests stay under 0.41 s.
BACKGROUND_COMPILE_FRACTION = 0.5
#: A tool set of at most this many tools is linked on a compile thread of this process when every
#: tool's module exists (here, in a worker's output, or in the shards): a few milliseconds of
#: Python, against a worker's round trip and the grammar's serialization both ways. Larger sets go
#: to a worker whatever they hold, so that a link never holds the GIL long from the decode loop.
MAX_TOOLS_LINKED_HERE = 16
#: And links here take at most this share of this process's time (decayed over LINK_HALF_LIFE_S);
#: past it, sets of known tools go to the workers like any other. Measured: a stream of new sets of
#: 32 known tools from ever new API keys, all linked here, took the other requests' decode steps
#: from 10 ms to 75 ms at the median (to 9 ms with the same stream in workers).
LINK_SHARE = 0.1
LINK_HALF_LIFE_S = 1.0


class Session:
    """One request's matcher inside a runtime. Belongs to one tenant; use it from one task at a time."""

    __slots__ = (
        "__weakref__",
        "_core",
        "closed",
        "id",
        "key",
        "last_used",
        "matcher",
        "source",
        "spec",
        "tenant",
        "tokens",
    )

    def __init__(self, sid: str, spec: SessionSpec, key: bytes, compiled: CompiledGrammar):
        self.id = sid
        self.tenant = spec.tenant
        self.key = key
        self.spec = spec
        o = spec.options
        self.matcher = GrammarMatcher(compiled, override_stop_tokens=o.override_stop_tokens,
                                      terminate_without_stop_token=o.terminate_without_stop_token,
                                      max_rollback_tokens=o.max_rollback_tokens)
        self._core = self.matcher._core
        self.tokens: list[int] = []       # accepted so far, for replay (fork, restore)
        self.last_used = time.monotonic()
        self.closed = False
        self.source = "local"       # where its grammar came from (see _opened_from)

    def _open_matcher(self) -> GrammarMatcher:
        if self.matcher is None:
            raise SessionError(f"session {self.id} is closed")
        return self.matcher

    @property
    def compiled_grammar(self) -> CompiledGrammar:
        return self._open_matcher().compiled_grammar

    def is_terminated(self) -> bool:
        return self._open_matcher().is_terminated()

    def is_completed(self) -> bool:
        return self._open_matcher().is_completed()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self.tokens)} tokens"
        return f"<Session {self.id} tenant={self.tenant!r} {state}>"


class FillHandle:
    """A batch fill started on the runtime's fill threads: `wait()` (or `await handle`) returns once
    every row is written, and re-raises what went wrong (FillTimeoutError with positions in the
    sessions given, as `GrammarRuntime.fill`)."""

    __slots__ = ("_futures", "_sessions", "_sizes")

    def __init__(self, futures: list[concurrent.futures.Future], sizes: list[int] | None = None,
                 sessions: Sequence[Session | None] | None = None):
        self._futures = futures
        self._sizes = sizes           # cores per future, in order
        self._sessions = sessions

    def done(self) -> bool:
        return all(f.done() for f in self._futures)

    def _check(self, results: list[BaseException | None]) -> None:
        failed, offset = [], 0
        for k, e in enumerate(results):
            if isinstance(e, FillTimeoutError) and self._sizes is not None:
                failed += [offset + r for r in e.rows]
            elif e is not None:
                raise e
            offset += self._sizes[k] if self._sizes is not None else 0
        if failed:
            raise _failed_sessions(self._sessions, failed)

    def wait(self, timeout: float | None = None) -> None:
        concurrent.futures.wait(self._futures, timeout)
        for f in self._futures:
            if not f.done():
                raise TimeoutError("the batch fill is still running")
        self._check([f.exception() for f in self._futures])

    async def _wait(self) -> None:
        results = await asyncio.gather(*(asyncio.wrap_future(f) for f in self._futures), return_exceptions=True)
        self._check([r if isinstance(r, BaseException) else None for r in results])

    def __await__(self):
        return self._wait().__await__()


def _failed_sessions(sessions: Sequence[Session | None], positions: list[int]) -> FillTimeoutError:
    """A fill's failed positions among the cores it filled, as positions in `sessions` (whose None
    entries had no core)."""
    live = [k for k, s in enumerate(sessions) if s is not None]
    return FillTimeoutError(sorted(live[p] for p in positions))


def _spec_error(e: msgspec.ValidationError) -> SpecError:
    """msgspec says where as `$.grammar.schema` or `$[...]`; a JSON pointer says it as /grammar/schema."""
    text = str(e)
    message, sep, path = text.rpartition(" - at `")
    if not sep:
        return SpecError(text, "")      # at the top of the spec
    path = path.rstrip("`")
    parts = []
    for piece in path.lstrip("$").replace("[", ".").replace("]", "").split("."):
        if piece:
            parts.append(piece.replace("~", "~0").replace("/", "~1"))
    return SpecError(message, "/" + "/".join(parts) if parts else "")


#: Where the grammar of the open running in this task came from (set by `_compiled_for`, read by
#: `open` into Session.source): "local" (this runtime's cache), "joined" (a compile another open
#: started), "shards" (the cache tier's copy), "compiled" (compiled for this open).
_opened_from: contextvars.ContextVar[str] = contextvars.ContextVar("xg2_opened_from", default="local")

#: `_compile_blocking`'s blob when nobody has asked the tier yet.
_ASK = object()


def _again(err: BaseException) -> BaseException:
    """A fresh copy of a remembered error (its own traceback; the message not formatted twice, as
    copy.copy would by calling the constructor with the formatted text)."""
    again = type(err).__new__(type(err), *err.args)
    again.__dict__.update(err.__dict__)
    again.args = err.args
    return again


def parse_spec(spec: Any) -> SessionSpec:
    """A SessionSpec from any of its forms, or SpecError with the pointer of what is wrong."""
    try:
        return as_session_spec(spec)
    except msgspec.ValidationError as e:
        raise _spec_error(e) from None
    except msgspec.DecodeError as e:
        raise SpecError(f"malformed spec: {e}") from None
    except RecursionError:
        raise SpecError("malformed spec: it nests too deeply to decode") from None


class GrammarRuntime:
    """Sessions and batched steps over one vocabulary (see the module note).

    `compile_timeout_s`: the deadline of a compile, and of an open's wait for one. `failure_ttl_s`:
    how long a spec that failed to compile is refused without compiling it again.
    `max_sessions_per_tenant`: open sessions a tenant may hold; `max_tenants`: tenants holding
    sessions at once, `max_sessions`: sessions in all (QuotaError past either); `max_compiles_per_tenant`: compiles
    of one tenant running at once (default: all workers but one, so other tenants always have one).
    `idle_timeout_s`: a session not stepped for that long is closed (calls on it then raise
    SessionError). `grammar_cache_bytes` bounds the compiled grammars kept by content key;
    `cache_limit_bytes` the compiler's caches. `compile_processes`: compile in
    `compile_workers` child processes (xg2.actors.compile_workers) rather than on threads of this
    one, so that compiles never hold this process's GIL: what a process that runs the model wants.
    `max_compile_seconds_per_tenant`: a tenant whose recent compile CPU time (decayed, half-life
    COMPILE_USAGE_HALF_LIFE_S; a steady rate r of compile seconds per second sums to about 14.4 r)
    is past this has its new specs refused with QuotaError until it decays (its cached grammars are
    still served): one tenant's stream of slow or unique specs cannot take the CPU from the others.
    With both, a tenant past BACKGROUND_COMPILE_FRACTION of that budget compiles on a background
    worker process at SCHED_IDLE; one of its compiles that does not finish in time there (the
    machine was busy) is refused with QuotaError, and not remembered as the spec's failure. Nothing
    speculative is done for such a grammar here (no background precompute, no prefetch of its other
    entries, nothing published): a tenant that churns through new specs pays for what its own
    requests use. Its compile still reads what the cache tier holds (the modules of its tools, its
    first mask's entries): that costs one batched read and saves its CPU.
    """

    def __init__(self, tokenizer_info: TokenizerInfo, *, compiler: GrammarCompiler | None = None,
                 compile_workers: int = 2, compile_timeout_s: float = 5.0, failure_ttl_s: float = 10.0,
                 max_sessions_per_tenant: int = 1024, max_compiles_per_tenant: int | None = None,
                 idle_timeout_s: float | None = 600.0,
                 fill_threads: int | None = None, grammar_cache_bytes: int = DEFAULT_GRAMMAR_CACHE_BYTES,
                 cache_limit_bytes: int = DEFAULT_CACHE_LIMIT_BYTES, cache_tier: Any = None,
                 compile_processes: bool = False, max_compile_seconds_per_tenant: float | None = None,
                 max_tenants: int = DEFAULT_MAX_TENANTS, max_sessions: int = DEFAULT_MAX_SESSIONS):
        if max_tenants < 1 or max_sessions < 1:
            raise ValueError("max_tenants and max_sessions must be at least 1")
        self.max_tenants, self.max_sessions = max_tenants, max_sessions
        if max_compiles_per_tenant is None:
            max_compiles_per_tenant = max(1, compile_workers - 1)
        if (compile_workers < 1 or max_sessions_per_tenant < 1 or max_compiles_per_tenant < 1
                or not compile_timeout_s > 0):
            raise ValueError("compile_workers, max_sessions_per_tenant and max_compiles_per_tenant must be "
                             "at least 1, compile_timeout_s positive")
        self.max_compiles_per_tenant = max_compiles_per_tenant
        self.max_compile_seconds_per_tenant = max_compile_seconds_per_tenant
        self._gates: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Semaphore]] = {}
        self.tokenizer_info = tokenizer_info
        self.compiler = compiler or GrammarCompiler(
            tokenizer_info, max_threads=compile_workers, cache_limit_bytes=cache_limit_bytes,
            background_precompute=True, compile_timeout_ms=compile_timeout_s * 1e3)
        self.compile_timeout_s = compile_timeout_s
        self.failure_ttl_s = failure_ttl_s
        self.max_sessions_per_tenant = max_sessions_per_tenant
        self.idle_timeout_s = idle_timeout_s
        self.grammar_cache_bytes = grammar_cache_bytes
        self._compile_pool = concurrent.futures.ThreadPoolExecutor(compile_workers, thread_name_prefix="xg2-compile")
        # Compiles waiting for a worker, served by least recent compile time of their tenant (see
        # _next_compile); the time each tenant's compiles took, decayed with COMPILE_USAGE_HALF_LIFE_S.
        self._waiting: list[tuple[int, str, Any, tuple, concurrent.futures.Future, bool]] = []
        self._waiting_seq = itertools.count()
        self._usage: dict[str, tuple[float, float]] = {}
        self._charge = threading.local()        # per compile thread: the worker's CPU seconds
        self.compile_workers: CompileWorkers | None = None
        self._background_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._unshared: weakref.WeakSet[CompiledGrammar] = weakref.WeakSet()     # background tenants' grammars
        if compile_processes:       # one process per compile thread; this process only reads results
            background = 1 if max_compile_seconds_per_tenant is not None else 0
            self.compile_workers = CompileWorkers(tokenizer_info, compile_workers, cache_limit_bytes=cache_limit_bytes,
                                                  compile_timeout_s=compile_timeout_s, background_workers=background)
            if background:
                self._background_pool = concurrent.futures.ThreadPoolExecutor(
                    background, thread_name_prefix="xg2-compile-background")
        self.fill_threads = fill_threads if fill_threads is not None else max(1, (os.cpu_count() or 2) // 2)
        self._fill_pool = concurrent.futures.ThreadPoolExecutor(max(1, self.fill_threads),
                                                                thread_name_prefix="xg2-fill")
        self._lock = threading.Lock()
        self._grammars: OrderedDict[bytes, CompiledGrammar] = OrderedDict()
        self._grammar_bytes = 0
        self._inflight: dict[bytes, concurrent.futures.Future] = {}
        self._failures: dict[bytes, tuple[float, BaseException]] = {}
        self._sessions: dict[str, Session] = {}
        self._per_tenant: dict[str, int] = {}
        self._held_total = 0        # the sum of _per_tenant (slots of open sessions and opens under way)
        self._last_reap = time.monotonic()
        self._width = (tokenizer_info.vocab_size + 31) // 32
        self._rows_cache: np.ndarray = np.arange(256, dtype=np.int64)
        self._bitmask_seen: tuple | None = None
        self.stats = {"compiles": 0, "compile_shared": 0, "grammar_hits": 0, "failures_refused": 0,
                      "tier_grammar_hits": 0, "sessions_opened": 0, "sessions_reaped": 0,
                      "deserialize_ms": 0.0, "compile_budget_refused": 0, "background_compiles": 0,
                      "background_timeouts": 0, "compile_cpu_ms": 0.0, "links_here": 0,
                      "links_here_missed": 0, "links_here_over_share": 0, "links_here_busy": 0}
        self._worker_reuse = dict.fromkeys(REUSE_COUNTS, 0)    # GrammarCompiler.reuse, summed over workers
        self._link_load = (0.0, time.monotonic())     # CPU seconds of links here, decayed (see LINK_SHARE)
        #: When set, links here only while it says so: a replica passes "no request is decoding",
        #: since a link holds the GIL for milliseconds that a decode step would wait for (measured:
        #: with a stream of links beside them, within LINK_SHARE, decode steps' p99 twice that of
        #: the same stream in the workers); an idle replica links at once.
        self.links_here_when: Any = None
        self.cache_tier = None
        if cache_tier is not None:
            self.attach_tier(cache_tier)

    # -- compiling ---------------------------------------------------------------------------------
    def attach_tier(self, tier: Any) -> None:
        """Use `tier` (xg2.actors.tier.ShardedCache) as the second cache tier from now on."""
        self.cache_tier = tier
        tier.bind(self.compiler)

    def _compile_blocking(self, grammar: GrammarSpec, key: bytes, blob: Any = _ASK,
                          background: bool = False) -> CompiledGrammar:
        """On a compile thread: the tier's copy of the grammar (`blob`, when the caller has asked
        for it already), else a compile (whose entries the tier is asked for before the first mask
        is built); then published in the background. A tool set is first linked here when every
        tool's module exists (_link_here), and only lowered in a worker when one does not."""
        tier = self.cache_tier
        if blob is _ASK and self._links_first(grammar, background):
            # the grammar is asked for in the same read as the tool set's modules
            linked, blob = self._link_here(grammar, key)
            if linked is not None:
                tier.prefetch(linked, key)
                tier.publish_grammar(key, linked)
                return linked
        if tier is not None:
            if blob is _ASK:
                blob = tier.get_grammar(key)
            if blob is not None:
                try:
                    t0 = time.perf_counter()
                    compiled = self.compiler.deserialize(blob, precompute=False)    # the tier brings the rest
                    compiled._origin = "shards"
                    self.stats["deserialize_ms"] += (time.perf_counter() - t0) * 1e3
                    self.stats["tier_grammar_hits"] += 1
                    tier.prefetch(compiled, key)
                    return compiled
                except XG2Error as e:      # a stale or damaged copy costs a compile, never a wrong mask
                    _log.warning("cache tier gave an unusable grammar (%s); compiling it", e)
        if self.compile_workers is not None:
            workers = self.compile_workers
            try:
                # through this process's tier (modules and first-mask entries fetched before the worker
                # lowers them, the modules it lowered published; a background tenant's only read)
                blob = workers.compile(grammar, self.compile_timeout_s, background=background, tier=tier,
                                       publish=not background)
            except CompileTimeout:
                if not background:
                    raise
                raise self._background_timeout(count=False) from None
            self._charge.worker_s = workers.last.cpu_s
            meta = workers.last.meta
            with self._lock:
                for name in REUSE_COUNTS:
                    self._worker_reuse[name] += meta.get(name, 0)
            t0 = time.perf_counter()
            # the worker built the first mask; the costliest other entries are built here in the
            # background (the partial JIT: in C, mostly without the GIL), not on the compile path.
            # Not for a background tenant's grammar: nothing speculative is done for a tenant that
            # churns through new specs (no precompute, no prefetch, nothing published); its entries
            # are built when its own steps need them.
            compiled = self.compiler.deserialize(blob, precompute=not background)
            if background:
                self._unshared.add(compiled)        # nor published when its sessions close
            # what the worker found in the shards decides the prefetch, as for a compile here: every
            # key the grammar names, not only those the worker built
            compiled._built_keys, compiled._tier_found = None, meta.get("tier_found")
            compiled._tier_modules = meta.get("tier_modules", 0)
            compiled._reuse = {k: meta.get(k, 0) for k in REUSE_COUNTS}
            self.stats["deserialize_ms"] += (time.perf_counter() - t0) * 1e3
        else:
            before = dict(self.compiler.reuse)
            compiled = grammar.compile(self.compiler)
            # (compiles on other threads meanwhile are counted in too: exact with one at a time)
            compiled._reuse = {k: v - before[k] for k, v in self.compiler.reuse.items()}
        if tier is not None and not background:
            tier.prefetch(compiled, key)
            tier.publish_grammar(key, compiled)
        return compiled

    def _links_first(self, grammar: GrammarSpec, background: bool = False) -> bool:
        """Whether a compile of `grammar` first tries to link it here (MAX_TOOLS_LINKED_HERE): a
        tool set not too large, compiles in workers, a cache tier to find modules in, a tenant not
        sent to the background worker, nothing else in this process that a link would hold up
        (`links_here_when`), and this process's links within their share (LINK_SHARE)."""
        if not (self.compile_workers is not None and self.cache_tier is not None and not background
                and isinstance(grammar, ToolsSpec) and len(grammar.tools) <= MAX_TOOLS_LINKED_HERE):
            return False
        idle = self.links_here_when
        if idle is not None and not idle():
            self.stats["links_here_busy"] += 1
            return False
        now = time.monotonic()
        with self._lock:
            used = self._link_load[0] * 0.5 ** ((now - self._link_load[1]) / LINK_HALF_LIFE_S)
        if used > LINK_SHARE * LINK_HALF_LIFE_S / math.log(2):      # the steady state of that share
            self.stats["links_here_over_share"] += 1
            return False
        return True

    def _charge_link(self, seconds: float) -> None:
        now = time.monotonic()
        with self._lock:
            used, at = self._link_load
            self._link_load = (used * 0.5 ** ((now - at) / LINK_HALF_LIFE_S) + seconds, now)

    def _link_here(self, grammar: GrammarSpec, key: bytes) -> tuple[CompiledGrammar | None, bytes | None]:
        """A tool set whose every module exists, linked on this thread: (the grammar, None). Its
        compiled grammar is asked of the shards in the read of its modules: (None, its blob) when
        they hold it. (None, None) when something must be lowered: the modules read meanwhile stay
        in this process and in the tier's memory, where the worker's questions find them; (None,
        _ASK) when nothing was read (every module was here), so the grammar is still to be asked."""
        tier = self.cache_tier
        ask = None
        t0 = time.thread_time()
        try:
            with self.compiler.linking_only() as tally, tier.asking_grammar(key) as ask:
                compiled = grammar.compile(self.compiler)
        except GrammarFound as found:
            return None, found.blob
        except (MustLower, RecursionError):     # (nested past the interpreter's limit: the worker says so)
            self.stats["links_here_missed"] += 1
            return None, (None if ask is not None and ask.asked else _ASK)
        finally:
            self._charge_link(time.thread_time() - t0)
        self.stats["links_here"] += 1
        compiled._reuse = dict(tally)
        return compiled, None

    async def compile(self, grammar: GrammarSpec | Any) -> CompiledGrammar:
        """The compiled grammar of a spec: from the cache, from a compile in flight, or compiled."""
        if isinstance(grammar, SessionSpec):
            grammar = grammar.grammar
        elif not hasattr(grammar, "compile"):
            grammar = parse_spec({"grammar": grammar}).grammar
        return await self._compiled_for(grammar, content_key(grammar))

    def _known(self, key: bytes) -> CompiledGrammar | concurrent.futures.Future | None:
        """The compiled grammar, or the compile in flight, for `key`; raises a recent failure again."""
        with self._lock:
            hit = self._grammars.pop(key, None)
            if hit is not None:
                self._grammars[key] = hit
                self.stats["grammar_hits"] += 1
                return hit
            failed = self._failures.get(key)
            if failed is not None:
                if failed[0] > time.monotonic():
                    self.stats["failures_refused"] += 1
                    raise _again(failed[1])
                del self._failures[key]
            fut = self._inflight.get(key)
            if fut is not None:
                self.stats["compile_shared"] += 1
            return fut

    async def _compiled_for(self, grammar: GrammarSpec, key: bytes, tenant: str = "",
                            again: bool = False) -> CompiledGrammar:
        """From the cache, from the compile in flight (single-flight), or compiled on the pool. A
        tenant runs at most `max_compiles_per_tenant` compiles at once (the others wait for its
        own), so one tenant's slow specs cannot hold every compile worker."""
        found = self._known(key)
        if isinstance(found, CompiledGrammar):
            _opened_from.set("local")
            return found
        if found is None:
            budget_s = self.max_compile_seconds_per_tenant
            if budget_s is not None:
                used = self._tenant_usage(tenant, time.monotonic())
                if used > budget_s:
                    self.stats["compile_budget_refused"] += 1
                    wait = COMPILE_USAGE_HALF_LIFE_S * math.log2(used / budget_s)
                    raise QuotaError(f"tenant {tenant!r} has used {used:.1f} s of compile time lately, past its "
                                     f"{budget_s:g} s; new grammars are refused for about {wait:.0f} s "
                                     "(grammars compiled before are still served)")
            loop = asyncio.get_running_loop()
            gate = self._gates.get(tenant)
            if gate is None or gate[0] is not loop:     # a semaphore belongs to one event loop
                if len(self._gates) >= 4096:      # forget the gates of tenants that compile nothing now
                    for t in [t for t, (_l, g) in self._gates.items() if not g.locked() and
                              g._value == self.max_compiles_per_tenant]:
                        del self._gates[t]
                gate = self._gates[tenant] = (loop, asyncio.Semaphore(self.max_compiles_per_tenant))
            gate = gate[1]
            async with gate:
                found = self._known(key)        # compiled, or started, while this one waited
                if isinstance(found, CompiledGrammar):
                    _opened_from.set("local")
                    return found
                if found is None:
                    blob = _ASK
                    tier = self.cache_tier
                    if tier is not None and hasattr(tier, "get_grammar_async") and not self._links_first(grammar):
                        blob = await tier.get_grammar_async(key)    # on the loop: no thread waits on it
                        found = self._known(key)
                        if isinstance(found, CompiledGrammar):
                            _opened_from.set("local")
                            return found
                if found is None:
                    background = self._background_pool is not None and \
                        self._tenant_usage(tenant, time.monotonic()) > BACKGROUND_COMPILE_FRACTION * budget_s
                    with self._lock:
                        found = self._queue_compile(tenant, background, self._compile_blocking, grammar, key, blob,
                                                    background)
                        self._inflight[key] = found
                        self.stats["compiles"] += 1
                        self.stats["background_compiles"] += background
                    # not under the lock
                    (self._background_pool if background else self._compile_pool).submit(self._next_compile, background)
                    found.add_done_callback(lambda f, key=key: self._compiled(key, f))
                    compiled = await self._wait(found, background)
                    _opened_from.set(compiled._origin)
                    return compiled
                return await self._join(found, grammar, key, tenant, again)
        return await self._join(found, grammar, key, tenant, again)

    async def _join(self, fut: concurrent.futures.Future, grammar: GrammarSpec, key: bytes, tenant: str,
                    again: bool) -> CompiledGrammar:
        """Wait for a compile another request started; if that was a heavy tenant's background
        compile refused for its quota, this tenant compiles the spec itself (once)."""
        try:
            compiled = await self._wait(fut)
            _opened_from.set("joined")
            return compiled
        except QuotaError:
            if again:
                raise
            return await self._compiled_for(grammar, key, tenant, again=True)

    def _queue_compile(self, tenant: str, background: bool, fn: Any, *args: Any) -> concurrent.futures.Future:
        """Queue a compile (with self._lock; then submit one `_next_compile` to the pool, without it).
        Workers take the waiting compile whose tenant has used the least compile time lately, not
        the oldest: a tenant that sends a stream of slow or unique specs gets a worker only when
        no other tenant waits for one, rather than half of them all the time."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._waiting.append((next(self._waiting_seq), tenant, fn, args, fut, background))
        return fut

    def _tenant_usage(self, tenant: str, now: float) -> float:
        used, at = self._usage.get(tenant, (0.0, now))
        return used * 0.5 ** ((now - at) / COMPILE_USAGE_HALF_LIFE_S)

    def compile_usage(self, top: int = 8) -> dict[str, float]:
        """The tenants with the most recent compile time (decayed seconds), most first."""
        now = time.monotonic()
        with self._lock:
            usage = {t: self._tenant_usage(t, now) for t in self._usage}
        return {t: round(u, 3) for t, u in sorted(usage.items(), key=lambda kv: -kv[1])[:top]}

    def _next_compile(self, background: bool = False) -> None:
        """On a compile thread of the class (`background` or not): the waiting compile of that class
        whose tenant has compiled least lately."""
        with self._lock:
            mine = [j for j, w in enumerate(self._waiting) if w[5] == background]
            if not mine:
                return
            now = time.monotonic()
            i = min(mine, key=lambda j: (self._tenant_usage(self._waiting[j][1], now), self._waiting[j][0]))
            _seq, tenant, fn, args, fut, _bg = self._waiting.pop(i)
        if not fut.set_running_or_notify_cancel():
            return
        t0, cpu0 = time.monotonic(), time.thread_time()
        self._charge.worker_s = None
        failed = False
        try:
            fut.set_result(fn(*args))
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits on the compile
            failed = True
            fut.set_exception(e)
        finally:
            # Charged CPU time (this thread's, and a worker process's when it compiled): wall time
            # would charge a tenant for the machine being busy. A compile that failed in a worker
            # (a timeout, a dead worker) is charged its wall time.
            now = time.monotonic()
            worker_s = self._charge.worker_s
            spent = (now - t0) if failed and self.compile_workers is not None else \
                (time.thread_time() - cpu0) + (worker_s or 0.0)
            with self._lock:
                self.stats["compile_cpu_ms"] += spent * 1e3
                self._usage[tenant] = (self._tenant_usage(tenant, now) + spent, now)
                if len(self._usage) > 4096:     # forget the tenants whose usage has decayed away
                    for t in [t for t in self._usage if self._tenant_usage(t, now) < 1e-3]:
                        del self._usage[t]

    async def _wait(self, fut: concurrent.futures.Future, background: bool = False) -> CompiledGrammar:
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(fut)), self.compile_timeout_s)
        except asyncio.TimeoutError:
            if background:
                raise self._background_timeout() from None
            raise CompileTimeout(f"the compile did not finish within {self.compile_timeout_s:g} s") from None

    def _background_timeout(self, count: bool = True) -> QuotaError:
        """(Counted once per request: the open's wait, whose deadline comes first.)"""
        self.stats["background_timeouts"] += count
        return QuotaError("this tenant has compiled much lately, so its compiles run on idle CPU only, and this one "
                          f"did not finish within {self.compile_timeout_s:g} s; try again later")

    def _compiled(self, key: bytes, fut: concurrent.futures.Future) -> None:
        """A compile ended: keep its grammar within the budget, or remember its failure a while."""
        with self._lock:
            self._inflight.pop(key, None)
            err = fut.exception()
            if err is not None:
                if isinstance(err, XG2Error) and not isinstance(err, QuotaError):   # a tenant's quota is not the spec's fault
                    self._failures[key] = (time.monotonic() + self.failure_ttl_s, err)
                    if len(self._failures) > 4096:      # the oldest go first
                        for k in list(itertools.islice(self._failures, 1024)):
                            del self._failures[k]
                return
            compiled = fut.result()
            if key not in self._grammars:
                self._grammars[key] = compiled
                self._grammar_bytes += compiled.tables_bytes
            self._trim_grammars()

    def _trim_grammars(self) -> int:
        """Let the least recently used grammars go until the rest fit the budget (with self._lock);
        the bytes kept. Run at every compile and every report: in between, only the working memory
        of entry builds grows (the background precompute, masks built mid-generation)."""
        heap = sum(int(g._core.heap_bytes) for g in self._grammars.values())
        while self._grammar_bytes + heap > self.grammar_cache_bytes and len(self._grammars) > 1:
            _k, old = self._grammars.popitem(last=False)
            self._grammar_bytes -= old.tables_bytes
            heap -= int(old._core.heap_bytes)
        return self._grammar_bytes + heap

    # -- sessions ----------------------------------------------------------------------------------
    async def open(self, spec: SessionSpec | GrammarSpec | dict | str | bytes) -> Session:
        """A new session for a spec (a SessionSpec, a grammar spec, or their dict or JSON form).
        SpecError for a malformed spec, QuotaError at the tenant's session limit, the compile's
        typed error (GrammarError, SchemaError, ...) or CompileTimeout past the deadline."""
        spec = parse_spec(spec)
        self.reap_idle()
        tenant = spec.tenant
        with self._lock:        # the slot is held while compiling, so a burst cannot pass the quota
            held = self._per_tenant.get(tenant, 0)
            if held >= self.max_sessions_per_tenant:
                raise QuotaError(f"tenant {tenant!r} has {held} open sessions, its limit")
            if self._held_total >= self.max_sessions:
                raise QuotaError(f"this runtime holds {self._held_total} sessions, its limit (max_sessions)")
            if not held and len(self._per_tenant) >= self.max_tenants:
                raise QuotaError(f"this runtime serves {len(self._per_tenant)} tenants with open sessions, its "
                                 "limit (max_tenants): a new tenant waits until one closes its sessions")
            self._per_tenant[tenant] = held + 1
            self._held_total += 1
        tier = self.cache_tier
        try:
            key = content_key(spec.grammar)
            if tier is None:
                compiled = await self._compiled_for(spec.grammar, key, tenant)
            else:
                with tier.foreground():
                    compiled = await self._compiled_for(spec.grammar, key, tenant)
            session = Session(secrets.token_hex(12), spec, key, compiled)
            session.source = _opened_from.get()
        except BaseException:
            self._release(tenant)
            raise
        with self._lock:
            self._sessions[session.id] = session
            self.stats["sessions_opened"] += 1
        return session

    def _release(self, tenant: str) -> None:
        with self._lock:
            if tenant in self._per_tenant:
                self._held_total -= 1
            n = self._per_tenant.get(tenant, 0) - 1
            if n > 0:
                self._per_tenant[tenant] = n
            else:
                self._per_tenant.pop(tenant, None)

    def session(self, session_id: str, tenant: str | None = None) -> Session:
        """An open session by id; SessionError if there is none, or it is another tenant's (the
        two are not told apart, so ids reveal nothing across tenants)."""
        s = self._sessions.get(session_id)
        if s is None or (tenant is not None and s.tenant != tenant):
            raise SessionError(f"no open session {session_id!r}")
        return s

    def close(self, sessions: Session | Sequence[Session]) -> None:
        """Close sessions (their matchers' memory goes with them); closing twice is harmless."""
        for s in [sessions] if isinstance(sessions, Session) else sessions:
            with self._lock:
                if s.closed:
                    continue
                s.closed = True
                self._sessions.pop(s.id, None)
            self._release(s.tenant)
            if self.cache_tier is not None and s.matcher.compiled_grammar not in self._unshared:
                self.cache_tier.publish_entries(s.matcher.compiled_grammar, s.key)
            s.matcher = None
            s._core = None

    def reap_idle(self, now: float | None = None) -> int:
        """Close sessions idle past `idle_timeout_s` (run by every open, at most once a second)."""
        if self.idle_timeout_s is None:
            return 0
        now = time.monotonic() if now is None else now
        if now - self._last_reap < 1.0:
            return 0
        self._last_reap = now
        with self._lock:
            stale = [s for s in self._sessions.values() if now - s.last_used > self.idle_timeout_s]
        self.close(stale)
        self.stats["sessions_reaped"] += len(stale)
        return len(stale)

    def open_sessions(self, tenant: str | None = None) -> int:
        with self._lock:
            return len(self._sessions) if tenant is None else self._per_tenant.get(tenant, 0)

    def _live(self, s: Session) -> Session:
        if s.closed:
            raise SessionError(f"session {s.id} is closed")
        return s

    async def fork(self, session: Session, n: int = 1) -> list[Session]:
        """`n` new sessions in the state of `session` (n > 1 sampling): same spec, same tokens."""
        self._live(session)
        return [await self.restore(session.spec, session.tokens) for _ in range(n)]

    async def restore(self, spec: Any, tokens: Sequence[int]) -> Session:
        """A session rebuilt by replaying accepted tokens (after a move, a restart, a fork);
        UsageError, and nothing left open, if the grammar refuses one of them."""
        session = await self.open(spec)
        for i, t in enumerate(tokens):
            if not session.matcher.accept_token(int(t)):
                self.close(session)
                raise UsageError(f"replay refused token {int(t)} at position {i}")
            session.tokens.append(int(t))
        return session

    # -- decode steps --------------------------------------------------------------------------------
    def _plan(self, sessions: Sequence[Session | None], bitmask: Any, indices: Sequence[int] | None):
        """(address, row words, cores, rows) of a batch fill, after the checks: rows whose session is
        None are left alone and cost nothing."""
        seen = self._bitmask_seen
        if (seen is not None and seen[0] is bitmask and getattr(bitmask, "data_ptr", None) is not None
                and bitmask.data_ptr() == seen[1] and bitmask.shape == seen[2]):
            address, n_rows, width = seen[3]
        else:
            address, n_rows, width = _bitmask_base(bitmask)
            if width != self._width:
                raise UsageError(f"bitmask shape {(n_rows, width)} is not (batch_size, {self._width})")
            if hasattr(bitmask, "data_ptr"):
                self._bitmask_seen = (bitmask, bitmask.data_ptr(), bitmask.shape, (address, n_rows, width))
        n = len(sessions)
        if indices is not None and len(indices) != n:
            raise UsageError(f"{len(indices)} indices for {n} sessions: they must be as many")
        cores = []
        skipped = False
        for s in sessions:
            if s is None:
                skipped = True
                continue
            core = s._core
            if core is None:
                raise SessionError(f"session {s.id} is closed")
            if core.terminated:
                raise UsageError(f"session {s.id} has accepted its stop token; there is no next token mask")
            cores.append(core)
        if indices is None and not skipped:
            if n_rows < n:
                raise UsageError(f"{n} sessions for a bitmask of {n_rows} rows")
            return address, width, cores, None       # row k: the core needs no row list
        idx = range(n) if indices is None else indices
        rows = np.fromiter((r for r, s in zip(idx, sessions) if s is not None), np.int64, len(cores))
        if len(rows) and (int(rows.min()) < 0 or int(rows.max()) >= n_rows):
            raise UsageError(f"a bitmask row is out of range for {n_rows} rows")
        return address, width, cores, rows

    def _jobs(self, address: int, width: int, cores: list, rows: np.ndarray | None):
        threads = min(self.fill_threads, len(cores) // MIN_ROWS_PER_THREAD)
        if threads <= 1:
            return [(cores, rows)]
        if rows is None:
            if len(cores) > len(self._rows_cache):
                self._rows_cache = np.arange(2 * len(cores), dtype=np.int64)
            rows = self._rows_cache[:len(cores)]
        step = -(-len(cores) // threads)
        return [(cores[i:i + step], rows[i:i + step]) for i in range(0, len(cores), step)]

    def fill(self, sessions: Sequence[Session | None], bitmask: Any,
             indices: Sequence[int] | None = None) -> None:
        """Session k's next-token mask into row indices[k] (row k without them) of an int32 CPU
        bitmask (batch, ceil(vocab / 32)): one call into the core per thread, the GIL released once;
        a None session's row is not touched. UsageError, nothing written, for a bitmask of the
        wrong kind, a row out of range, or a session that has ended; SessionError for a closed one.
        FillTimeoutError when some sessions' masks could not be built within the fill budget: its
        `rows` are their positions in `sessions` (their rows are zeros), every other row is written."""
        address, width, cores, rows = self._plan(sessions, bitmask, indices)
        if len(cores) < 2 * MIN_ROWS_PER_THREAD or self.fill_threads <= 1:
            try:
                fill_rows(cores, address, width, rows, width)
            except FillTimeoutError as e:
                raise _failed_sessions(sessions, e.rows) from None
            return
        jobs = self._jobs(address, width, cores, rows)
        futures = [self._fill_pool.submit(fill_rows, c, address, width, r, width) for c, r in jobs[1:]]
        failed = []
        try:
            fill_rows(jobs[0][0], address, width, jobs[0][1], width)
        except FillTimeoutError as e:
            failed += e.rows
        offset = len(jobs[0][0])
        for f, (c, _) in zip(futures, jobs[1:]):
            try:
                f.result()
            except FillTimeoutError as e:
                failed += [offset + k for k in e.rows]
            offset += len(c)
        if failed:
            raise _failed_sessions(sessions, failed)

    def submit_fill(self, sessions: Sequence[Session | None], bitmask: Any,
                    indices: Sequence[int] | None = None) -> FillHandle:
        """`fill` started on the fill threads (checks done here, before it returns): call it when the
        forward pass is launched, wait on the handle just before sampling. Accept nothing into these
        sessions until it is done."""
        address, width, cores, rows = self._plan(sessions, bitmask, indices)
        jobs = self._jobs(address, width, cores, rows)
        return FillHandle([self._fill_pool.submit(fill_rows, c, address, width, r, width) for c, r in jobs],
                          [len(c) for c, _ in jobs], sessions)

    def accept(self, sessions: Sequence[Session | None], tokens: Sequence[int]) -> list[bool]:
        """Whether each session accepted its token (a refused token changes nothing); None sessions
        are skipped (False). FillTimeoutError when some accepts ran past the fill budget: its `rows`
        are their positions (their state is as before), its `accepted` every position's flag."""
        if len(tokens) != len(sessions):
            raise UsageError(f"{len(tokens)} tokens for {len(sessions)} sessions: they must be as many")
        now = time.monotonic()
        out = []
        failed = []
        for k, (s, t) in enumerate(zip(sessions, tokens)):
            if s is None:
                out.append(False)
                continue
            m = self._live(s).matcher
            try:
                ok = m.accept_token(t)
            except FillTimeoutError:        # its grammar is too costly here; the others go on
                failed.append(k)
                ok = False
            if ok:
                s.tokens.append(int(t))
            s.last_used = now
            out.append(ok)
        if failed:
            raise FillTimeoutError(failed, out)
        return out

    def rollback(self, sessions: Sequence[Session], counts: int | Sequence[int] = 1) -> None:
        counts = [counts] * len(sessions) if isinstance(counts, (int, np.integer)) else list(counts)
        if len(counts) != len(sessions):
            raise UsageError(f"{len(counts)} counts for {len(sessions)} sessions: they must be as many")
        for s, k in zip(sessions, counts):
            self._live(s).matcher.rollback(k)
            if k:
                del s.tokens[len(s.tokens) - k:]
            s.last_used = time.monotonic()

    def reuse(self) -> dict[str, Any]:
        """What this runtime's compiles found where, wherever they ran (on its threads or in its
        worker processes): modules and first-mask entries from the process's own caches, from the
        shards, or built; grammars by content key; and the hit rates and compile CPU per open
        that the load tests and benchmarks report. Lookups = local + shards + built."""
        with self._lock:
            r = {k: v + self.compiler.reuse[k] for k, v in self._worker_reuse.items()}
            st = dict(self.stats)
        tier = self.cache_tier.counts if self.cache_tier is not None else {}
        modules = r["modules_local"] + r["modules_shards"] + r["modules_lowered"]
        # an open found its grammar here, in the shards, or shared a compile in flight; else it compiled
        opens = st["grammar_hits"] + st["compile_shared"] + st["compiles"]
        grammars_found = st["grammar_hits"] + st["compile_shared"] + st["tier_grammar_hits"]
        return {**r, "modules": modules, "grammar_opens": opens, "grammars_local": st["grammar_hits"],
                "grammars_shards": st["tier_grammar_hits"],
                "module_hit_rate": (r["modules_local"] + r["modules_shards"]) / modules if modules else None,
                "entry_hit_rate": (r["entries_local"] + r["entries_shards"]) / r["entries_needed"]
                if r["entries_needed"] else None,
                "grammar_hit_rate": grammars_found / opens if opens else None,
                "compile_cpu_ms": st["compile_cpu_ms"],
                "compile_cpu_ms_per_request": st["compile_cpu_ms"] / opens if opens else None,
                "shard_module_gets": tier.get("module_gets", 0), "shard_entry_gets": tier.get("entry_gets", 0)}

    # -- lifetime ------------------------------------------------------------------------------------
    def cache_bytes(self) -> dict[str, int]:
        """Bytes held per tier of this process: compiled grammars by key, and the compiler's caches."""
        with self._lock:
            grammars = self._trim_grammars()
        return {"grammars": grammars, "grammars_budget": self.grammar_cache_bytes,
                "compiler": self.compiler.get_cache_size_bytes(),
                "compiler_budget": self.compiler.cache_limit_bytes}

    def shutdown(self) -> None:
        """Close every session and stop the worker threads."""
        with self._lock:
            sessions = list(self._sessions.values())
        self.close(sessions)
        self._compile_pool.shutdown(wait=False, cancel_futures=True)
        if self._background_pool is not None:
            self._background_pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            waiting, self._waiting = self._waiting, []
        for *_rest, fut, _background in waiting:
            fut.cancel()
        if self.compile_workers is not None:
            self.compile_workers.close()
        self._fill_pool.shutdown(wait=False)
        if self.cache_tier is not None:
            self.cache_tier.flush()
