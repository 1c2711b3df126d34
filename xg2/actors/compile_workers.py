"""Compiles in child processes, so that a tenant's compile never takes the GIL from the decode loop.

Lowering a grammar is mostly Python (front-ends, automata, keys, linking). Run on a thread of the
process that samples, a stream of large compiles (one tenant's 64-tool sets) holds the GIL in
5 ms slices while the model's forward pass and the step around it wait for it at every release:
measured here, the other tenants' decode step went from 3 ms to 89 ms at the median and 609 ms at
p99. A worker process has its own interpreter: the parent only reads the compiled grammar back
(`CompiledGrammar.serialize` bytes, about a millisecond), and the workers run at a lower priority,
so the decode loop keeps its core.

Each worker is a Python process running `_serve` below, talking over its stdin and stdout (its own
stdout goes to stderr, so nothing a library prints can corrupt the frames). It holds a
GrammarCompiler with its own caches (modules and automata are reused across the compiles it runs),
compiles a spec, builds its first mask (by default nothing more: the parent's background precompute
builds the costliest other entries, so that they do not sit on the time to first mask; measured on
new 8-tool sets, p50 9.9-12.3 ms this way, 16.5-17.9 ms with a 40 ms precompute here, 6.3-10.7 ms
compiling on a thread of the parent), and sends the bytes back with every entry it built. A compile past the deadline is stopped by killing the worker (it is started
again), which also bounds work inside one C call that the compiler's own deadline checks cannot
interrupt; a worker that dies (out of memory, a crash) costs only the request that was running on
it.

A replacement's start is paid by no request: starting a worker (an interpreter, the imports, the
vocabulary's tables) took longer than a compile's whole deadline on a busy machine, and the next
request to reach the replacement timed out waiting for it, paying for the one that was killed. So
a spare worker is kept started (`spare_workers`, one by default; started once the others have,
not beside them): a killed or dead worker's place is taken at once by the spare, and the
replacement started in the background becomes the next spare. A compile's deadline starts once it holds a started worker; the wait for one to finish
starting (when two died within one start's time) is bounded apart, by START_TIMEOUT_S.

The replica's cache tier (xg2.actors.tier) reaches the workers through their pipe: a worker asks
its parent for the modules it is about to lower and for its first mask's entries (one batched read
each, which the parent's compile thread answers from the shards between the worker's frames), and
sends the modules it lowered for the parent to publish. So whichever process lowers a tool, every
other one in the cluster reads it instead. Ray actors with a tier of their own were measured as the
alternative (benchmarks/README.md, "Where compiles run"): the same time to first mask, twice the
memory a worker, ten times the restart time.

Workers lower; the replica links. A tool set (of at most runtime.MAX_TOOLS_LINKED_HERE tools) whose
every tool's module exists, in the replica's memory (what its workers lowered, what it read before)
or in the shards, is linked on the replica's own compile thread and never comes here: that is a
few milliseconds of Python, against a worker's round trip and the grammar serialized both ways
(on an 8-tool set, 8 ms in all against 10 ms of serialization alone). Only a set with something to
lower is sent, with the modules the replica found held in its tier's memory for the worker's
question. Links run there only while the replica decodes nothing, within a tenth of its time (a
stream of them beside decoding doubled the steps' p99), and a tenant that compiles heavily is sent
to the background worker whatever its set holds.

Background workers (`background_workers`) run under SCHED_IDLE: they get a core only when nothing
else wants it. The runtime sends them the compiles of tenants that have compiled heavily lately, so
that one tenant's stream of slow specs is paid for with idle CPU, not with the other tenants'
decode steps (on 2 cores, a worker at the lowest nice level still took about a third of a core
from the model's forward pass while it ran). Every worker at SCHED_IDLE starves everyone's compiles
under load; a separate class starves only the tenant that put itself there.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

import msgspec

from ..errors import GrammarLimitError, XG2Error
from ..grammar.budget import CompileTimeout
from ..tokenizer import TokenizerInfo
from .spec import GrammarSpec

_log = logging.getLogger("xg2.compile_workers")
_SPEC_ENC = msgspec.msgpack.Encoder()
_SPEC_DEC = msgspec.msgpack.Decoder(GrammarSpec)

_OK, _ERROR, _READY = b"o", b"e", b"r"
# A worker's questions while it compiles: _FETCH + kind (b"m" modules, b"e" pool entries) + keys,
# answered with the blobs the parent's tier found; _PUBLISH + a module's 16-byte digest + its blob.
_FETCH, _PUBLISH = b"f", b"p"
# A spec is sent behind one of these: whether the compile reads the parent's cache tier and
# publishes what it lowered to it, only reads it, or neither.
_WITH_TIER, _READ_TIER, _ALONE = b"t", b"r", b"-"
_HEAD = struct.Struct("<dI")    # after _OK: the compile's CPU seconds in the worker, the meta's length
_KEYS = msgspec.msgpack.Encoder()
_KEYS_DEC = msgspec.msgpack.Decoder(list[bytes])
_BLOBS_DEC = msgspec.msgpack.Decoder(list[bytes | None])
_META_DEC = msgspec.msgpack.Decoder(dict[str, Any])

#: How long a worker may take to start (import, build the vocabulary's tables) before it counts as
#: failed to start.
START_TIMEOUT_S = 120.0


class _WorkerDied(Exception):
    """A worker's pipe closed under a compile."""


class CompileWorkerError(GrammarLimitError):
    """A compile worker died while compiling a spec (out of memory, or killed): the spec is
    refused like any input past a limit, and the worker is started again."""


def _error_bytes(err: BaseException) -> bytes:
    """A typed error as (class, args, attributes), read back as the same class in the parent."""
    cls = type(err)
    try:
        return pickle.dumps((cls, err.args, dict(getattr(err, "__dict__", {}))))
    except (pickle.PicklingError, TypeError, AttributeError):   # an attribute that does not pickle
        return pickle.dumps((cls, err.args, {}))


def _error_from(data: bytes) -> BaseException:
    cls, args, attrs = pickle.loads(data)      # our own child's bytes, never a tenant's
    if not (isinstance(cls, type) and issubclass(cls, XG2Error)):
        return GrammarLimitError(f"the compile failed: {args[0] if args else cls!r}")
    err = cls.__new__(cls, *args)
    err.args = args
    err.__dict__.update(attrs)
    return err


class _Worker:
    """One child process and its pipe ends."""

    def __init__(self, setup: bytes):
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        # not `-m` this module: the package imports it first, and runpy would run it twice
        self.proc = subprocess.Popen([sys.executable, "-c", "from xg2.actors.compile_workers import _serve; _serve()"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True)
        send_fd, recv_fd = os.dup(self.proc.stdin.fileno()), os.dup(self.proc.stdout.fileno())
        for fd in (send_fd, recv_fd):       # gevent's subprocess, when patched in, makes them nonblocking
            os.set_blocking(fd, True)
        self.send = Connection(send_fd, readable=False)
        self.recv = Connection(recv_fd, writable=False)
        self.proc.stdin.close()
        self.proc.stdout.close()
        self.send.send_bytes(setup)
        self.ready = False
        self.background = False

    def wait_ready(self, timeout: float) -> None:
        if self.ready:
            return
        if not self.recv.poll(timeout):
            self.kill()
            raise CompileWorkerError(f"a compile worker did not start within {timeout:g} s")
        msg = self.recv.recv_bytes()
        if msg[:1] == _ERROR:
            self.kill()
            raise _error_from(msg[1:])
        self.ready = True

    def started(self) -> bool:
        """Whether the worker has started, without waiting (False while it starts, or if it failed)."""
        if self.ready:
            return True
        try:
            if self.recv.poll(0):
                self.wait_ready(0)
        except (XG2Error, EOFError, OSError):
            return False
        return self.ready

    def make_background(self) -> None:
        """This (started) worker runs at SCHED_IDLE from now on, every thread of it (see _serve)."""
        self.background = True
        if not hasattr(os, "SCHED_IDLE"):
            return
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{self.proc.pid}/task"):
                with contextlib.suppress(OSError):
                    os.sched_setscheduler(int(tid), os.SCHED_IDLE, os.sched_param(0))

    def kill(self) -> None:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(5)
        for c in (self.send, self.recv):
            with contextlib.suppress(OSError):
                c.close()


class CompileWorkers:
    """A fixed set of compile worker processes for one vocabulary (see the module note).

    `compile(spec, timeout)` blocks the calling thread (a compile thread of the runtime) until the
    worker sends the compiled grammar's bytes, and raises the compile's typed error, CompileTimeout
    (the worker is killed and replaced) or CompileWorkerError."""

    def __init__(self, tokenizer_info: TokenizerInfo, workers: int = 2, *, cache_limit_bytes: int = 128 << 20,
                 precompute_budget_ms: float = 0.0, compile_timeout_s: float = 5.0, nice: int = 10,
                 background_workers: int = 0, spare_workers: int = 1):
        if workers < 1 or background_workers < 0 or spare_workers < 0:
            raise ValueError("workers must be at least 1, background_workers and spare_workers at least 0")
        setup = {"tokenizer_info": tokenizer_info, "cache_limit_bytes": cache_limit_bytes,
                 "precompute_budget_ms": precompute_budget_ms, "compile_timeout_ms": compile_timeout_s * 1e3,
                 "nice": nice}
        self._setup = pickle.dumps(setup)
        self._setup_idle = pickle.dumps({**setup, "sched_idle": True})
        self._idle: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        self._idle_background: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        self.background_workers = background_workers
        self.spare_workers = spare_workers
        self._all: list[_Worker] = []           # every process: those that serve, and the spares
        self._spares: list[_Worker] = []        # started (or starting), waiting to take a dead worker's place
        self._lock = threading.Lock()
        self._closed = False
        self.restarts = 0
        # Per compile thread, of the last compile it got back: `cpu_s`, the CPU seconds the worker
        # spent (what a tenant is charged: wall time would charge it for the machine being busy),
        # and `meta`, what the worker found where (GrammarCompiler.reuse's counts, `tier_found`).
        self.last = threading.local()
        for _ in range(workers):
            self._idle.put(self._start())
        for _ in range(background_workers):
            self._idle_background.put(self._start(background=True))
        # the spares start once the others have (wait_ready), or with the first compile: not beside
        # them, where they would only make the replica's start longer on a busy machine
        self._spares_due = spare_workers

    def _start(self, background: bool = False) -> _Worker:
        w = _Worker(self._setup_idle if background else self._setup)
        w.background = background
        with self._lock:
            self._all.append(w)
        return w

    def _replace(self, w: _Worker) -> None:
        """A dead or killed worker's place goes to a spare (a started one first), at once; a new
        spare starts in its stead. Without a spare, a new worker starts in the place itself."""
        w.kill()
        with self._lock:
            if w in self._all:
                self._all.remove(w)
            closed = self._closed
            spare = self._take_spare() if not closed else None
        if closed:
            return
        self.restarts += 1
        if spare is None:
            (self._idle_background if w.background else self._idle).put(self._start(w.background))
            return
        if w.background:
            spare.make_background()
        (self._idle_background if w.background else self._idle).put(spare)
        self._keep_spare(self._start())

    def _keep_spare(self, w: _Worker) -> None:
        """A worker just started becomes a spare, unless the workers were closed meanwhile."""
        with self._lock:
            if self._closed:
                w.kill()
            else:
                self._spares.append(w)

    def _take_spare(self) -> _Worker | None:
        """(Under the lock.) A spare, a started one first; spares that died are dropped."""
        for dead in [x for x in self._spares if x.proc.poll() is not None]:
            self._spares.remove(dead)
            if dead in self._all:
                self._all.remove(dead)
            dead.kill()
        if not self._spares:
            return None
        spare = next((x for x in self._spares if x.started()), self._spares[0])
        self._spares.remove(spare)
        return spare

    def _start_spares(self) -> None:
        with self._lock:
            n, self._spares_due = self._spares_due, 0
        for _ in range(n):
            self._keep_spare(self._start())

    def wait_ready(self, timeout: float = START_TIMEOUT_S, spares: bool = False) -> None:
        """Block until every worker has started (a replica calls it once, before serving); the
        spares start then. With `spares`, wait for them too."""
        with self._lock:
            workers = [w for w in self._all if w not in self._spares]
        for w in workers:
            w.wait_ready(timeout)
        self._start_spares()
        if spares:
            with self._lock:
                workers = list(self._spares)
            for w in workers:
                w.wait_ready(timeout)

    def compile(self, spec: Any, timeout: float, background: bool = False, tier: Any = None,
                publish: bool = True) -> bytes:
        """`background`: on a background worker (SCHED_IDLE), when there is one. `tier`: the
        parent's second cache tier (xg2.actors.tier.ShardedCache), through which the worker fetches
        the modules and first-mask entries it lacks before lowering them, and publishes the modules
        it lowered (unless `publish` is False); this thread answers the worker's questions while it
        waits.

        A worker that dies under a spec is replaced and the spec tried once more on another: the
        first death may not be the spec's (a worker killed from outside while idle is seen only
        when the spec is sent to it), a second one is, and the spec is refused.

        `timeout` bounds the compile from the moment it holds a started worker: waiting for one
        to finish starting is not the compile's time (see the module note), and is bounded by
        START_TIMEOUT_S instead."""
        if self._closed:
            raise CompileWorkerError("the compile workers were closed")
        if self._spares_due:
            self._start_spares()
        idle = self._idle_background if background and self.background_workers else self._idle
        budget = [timeout]      # what is left of it, for a second attempt
        for attempt in range(2):
            try:
                msg = self._compile_once(idle, spec, budget, timeout, tier, publish)
                break
            except _WorkerDied:
                if attempt or self._closed or budget[0] <= 0:
                    raise CompileWorkerError("the compile worker died while compiling this spec (out of "
                                             "memory, or killed); it was started again") from None
        if msg[:1] == _OK:
            cpu_s, n = _HEAD.unpack_from(msg, 1)
            self.last.cpu_s = cpu_s
            self.last.meta = _META_DEC.decode(msg[1 + _HEAD.size:1 + _HEAD.size + n])
            return msg[1 + _HEAD.size + n:]
        raise _error_from(msg[1:])

    def _compile_once(self, idle: queue.SimpleQueue, spec: Any, budget: list[float], timeout: float, tier: Any,
                      publish: bool) -> bytes:
        """One worker's answer to the spec (its reply frame); _WorkerDied if it died meanwhile.
        `budget[0]`: the seconds the compile may take from when it holds a started worker (what
        is left of it is written back)."""
        w = idle.get()
        while w.proc.poll() is not None:        # died while idle (killed from outside): replaced unseen
            self._replace(w)
            w = idle.get()
        try:
            w.wait_ready(START_TIMEOUT_S)       # not the compile's time: a spare is started already
        except (EOFError, OSError):
            self._replace(w)
            raise _WorkerDied from None
        except BaseException:
            self._replace(w)
            raise
        deadline = time.monotonic() + budget[0]
        try:
            mode = _ALONE if tier is None else _WITH_TIER if publish else _READ_TIER
            w.send.send_bytes(mode + _SPEC_ENC.encode(spec))
            lowered: list[tuple[bytes, bytes]] = []
            while True:
                if not w.recv.poll(max(0.0, deadline - time.monotonic())):
                    self._replace(w)
                    raise CompileTimeout(f"the compile did not finish within {timeout:g} s")
                msg = w.recv.recv_bytes()
                if msg[:1] == _FETCH:
                    w.send.send_bytes(_answer(tier, msg[1:2], msg[2:]))
                elif msg[:1] == _PUBLISH:
                    lowered.append((msg[1:17], msg[17:]))
                else:
                    break
            # sent once the worker is done, in one batch: the publisher's calls and the shards'
            # work would otherwise take the cores from the worker (at a lower priority) mid-compile
            if lowered and tier is not None and publish and msg[:1] == _OK:
                tier.publish_module_blobs(lowered)
        except (EOFError, OSError, BrokenPipeError):
            budget[0] = deadline - time.monotonic()
            self._replace(w)
            raise _WorkerDied from None
        idle.put(w)
        return msg

    def pids(self) -> list[int]:
        """The processes that serve compiles (the spares aside: spare_pids)."""
        with self._lock:
            return [w.proc.pid for w in self._all if w not in self._spares]

    def spare_pids(self) -> list[int]:
        with self._lock:
            return [w.proc.pid for w in self._spares]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers, self._all, self._spares = self._all, [], []
        for w in workers:
            w.kill()


def _answer(tier: Any, kind: bytes, keys: bytes) -> bytes:
    """The blobs the tier holds for a worker's question (None for each where it holds none, or
    when the shards cannot be read: a miss only costs lowering)."""
    wanted = _KEYS_DEC.decode(keys)
    blobs: list = [None] * len(wanted)
    if tier is not None and kind in (b"m", b"e"):
        try:
            blobs = tier.get_blobs(kind, wanted)
        except Exception:       # noqa: BLE001 - a failed read is a miss
            _log.warning("cache tier read for a compile worker failed; it lowers what it lacks", exc_info=True)
    return _KEYS.encode(blobs)


class _ParentTier:
    """The parent's cache tier as a worker's compiler sees it (its `module_source`, and
    `load_entries` as its `entry_source`): questions over the pipe, answered by the parent's
    ShardedCache between the worker's frames. The worker needs no Ray, and the parent's reads
    are those a compile on its own thread would make. What comes back is checked here as a
    tier's blobs always are (checksum, versions, vocabulary): a bad one is lowered again."""

    def __init__(self, inp: Connection, out: Connection, compiler: Any):
        from .tier import ShardedCache

        self.inp, self.out, self.compiler = inp, out, compiler
        self.fingerprint = compiler.tokenizer_info.fingerprint
        self.module_key = ShardedCache.module_key
        self._fetched: dict[tuple, Any] = {}
        self.publishing = True

    def _ask(self, kind: bytes, keys: list[bytes]) -> list[bytes | None]:
        self.out.send_bytes(_FETCH + kind + _KEYS.encode(keys))
        return _BLOBS_DEC.decode(self.inp.recv_bytes())

    def fetch(self, keys: list[tuple], all_or_nothing: bool = False) -> int:
        from .. import transport

        found = 0
        for key, blob in zip(keys, self._ask(b"m", [self.module_key(k) for k in keys])):
            if blob is None:
                continue
            try:
                self._fetched[key] = transport.load_module(blob, self.fingerprint)
                found += 1
            except transport.DeserializeError:
                pass
        return found

    def take(self, key: tuple) -> Any:
        return self._fetched.pop(key, None)

    def publish(self, key: tuple, module: Any) -> None:
        from .. import transport

        if not self.publishing:
            return
        self.out.send_bytes(_PUBLISH + self.module_key(key) + transport.dump_module(module, self.fingerprint))

    def load_entries(self, keys: list[bytes]) -> int:
        from .. import transport

        pool = self.compiler.entry_pool
        loaded = 0
        for key, blob in zip(keys, self._ask(b"e", keys)):
            if blob is None:
                continue
            try:
                pool.load(key, transport.load_entry(blob, self.fingerprint))
                loaded += 1
            except (ValueError, MemoryError):
                pass
        return loaded

    def attach(self, mode: bytes) -> None:
        """For the next compile: through the parent's tier (_WITH_TIER), reading it only (a
        background tenant's: _READ_TIER), or alone."""
        self._fetched.clear()
        on = mode in (_WITH_TIER, _READ_TIER)
        self.publishing = mode == _WITH_TIER
        self.compiler.module_source = self if on else None
        self.compiler.entry_source = self.load_entries if on else None


def _serve() -> None:
    """The worker's loop: setup, then one spec in, one compiled grammar (or error) out."""
    for fd in (0, 1):       # a parent with nonblocking pipes (gevent's subprocess) shares their mode
        os.set_blocking(fd, True)
    out = Connection(os.dup(1), readable=False)
    inp = Connection(os.dup(0), writable=False)
    os.dup2(2, 1)       # what anything prints goes to stderr, never into a frame
    try:
        setup = pickle.loads(inp.recv_bytes())
        if setup.get("nice"):
            with contextlib.suppress(OSError):
                os.nice(setup["nice"])
        if setup.get("sched_idle") and hasattr(os, "SCHED_IDLE"):     # a background worker (Linux)
            with contextlib.suppress(OSError):
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        from .. import transport
        from ..compiler import GrammarCompiler
        from ..grammar import fsm

        # this process's memo of automata: within a quarter of its compiler's budget, at most the default
        if setup["cache_limit_bytes"] >= 0:
            fsm.MAX_MEMO_AUTOMATA_BYTES = min(fsm.MAX_MEMO_AUTOMATA_BYTES, max(1 << 20, setup["cache_limit_bytes"] // 4))
        compiler = GrammarCompiler(setup["tokenizer_info"], cache_limit_bytes=setup["cache_limit_bytes"],
                                   precompute_budget_ms=setup["precompute_budget_ms"],
                                   compile_timeout_ms=setup["compile_timeout_ms"])
    except BaseException as e:      # noqa: BLE001 - said to the parent, which raises it
        out.send_bytes(_ERROR + _error_bytes(e))
        return
    # What setup built (the vocabulary's tables and tries, the imports) lives as long as the worker:
    # kept out of the collector's scans, which otherwise walk it on every full collection that a
    # compile's garbage sets off.
    gc.collect()
    gc.freeze()
    out.send_bytes(_READY)
    parent_tier = _ParentTier(inp, out, compiler)
    while True:
        try:
            data = inp.recv_bytes()
        except (EOFError, OSError):
            return      # the parent closed the pipe: stop
        cpu0 = time.process_time()
        try:
            parent_tier.attach(data[:1])
            spec = _SPEC_DEC.decode(data[1:])
            before = dict(compiler.reuse)
            compiled = spec.compile(compiler)
            compiled._precomputed.wait()
            blob = transport.dump_grammar(compiled, all_pooled=True, compress=False)     # over a pipe
            meta = _KEYS.encode({**{k: v - before[k] for k, v in compiler.reuse.items()},
                                 "tier_found": compiled._tier_found, "tier_modules": compiled._tier_modules})
            reply = _OK + _HEAD.pack(time.process_time() - cpu0, len(meta)) + meta + blob
        except XG2Error as e:
            reply = _ERROR + _error_bytes(e)
        except RecursionError:
            reply = _ERROR + _error_bytes(GrammarLimitError("the spec nests too deeply to compile"))
        except MemoryError:
            reply = _ERROR + _error_bytes(GrammarLimitError("the spec needs more memory than a compile may use"))
        except Exception as e:      # noqa: BLE001 - a bug, said as such rather than a dead worker
            reply = _ERROR + _error_bytes(GrammarLimitError(f"the compile failed: {type(e).__name__}: {e}"))
        out.send_bytes(reply)


