"""Compiles in child processes, so that a tenant's compile never takes the GIL from the decode loop.

Lowering a grammar is mostly Python (front-ends, automata, keys, linking). Run on a thread of the
process that samples, a stream of large compiles (one tenant's 64-tool sets) holds the GIL in
5 ms slices while the model's forward pass and the step around it wait for it at every release:
measured here, the other tenants' decode step went from 3 ms to 89 ms at the median and 609 ms at
p99. A worker process has its own interpreter: the parent only reads the compiled grammar back
(`CompiledGrammar.serialize` bytes, about a millisecond), and the workers run at a lower priority,
so the decode loop keeps its core.

Each worker is `python -m xg2.actors.compile_workers`, talking over its stdin and stdout (its own
stdout goes to stderr, so nothing a library prints can corrupt the frames). It holds a
GrammarCompiler with its own caches (modules and automata are reused across the compiles it runs),
compiles a spec, builds its first mask (by default nothing more: the parent's background precompute
builds the costliest other entries, so that they do not sit on the time to first mask; measured on
new 8-tool sets, p50 9.9-12.3 ms this way, 16.5-17.9 ms with a 40 ms precompute here, 6.3-10.7 ms
compiling on a thread of the parent), and sends the bytes back with every entry it built. A compile past the deadline is stopped by killing the worker (it is started
again), which also bounds work inside one C call that the compiler's own deadline checks cannot
interrupt; a worker that dies (out of memory, a crash) costs only the request that was running on
it.

Background workers (`background_workers`) run under SCHED_IDLE: they get a core only when nothing
else wants it. The runtime sends them the compiles of tenants that have compiled heavily lately, so
that one tenant's stream of slow specs is paid for with idle CPU, not with the other tenants'
decode steps (on 2 cores, a worker at the lowest nice level still took about a third of a core
from the model's forward pass while it ran). Every worker at SCHED_IDLE starves everyone's compiles
under load; a separate class starves only the tenant that put itself there.
"""

from __future__ import annotations

import contextlib
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

_SPEC_ENC = msgspec.msgpack.Encoder()
_SPEC_DEC = msgspec.msgpack.Decoder(GrammarSpec)

_OK, _ERROR, _READY = b"o", b"e", b"r"
_CPU = struct.Struct("<d")      # after _OK: the compile's CPU seconds in the worker

#: How long a worker may take to start (import, build the vocabulary's tables) before it counts as
#: failed to start.
START_TIMEOUT_S = 120.0


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
        self.proc = subprocess.Popen([sys.executable, "-m", "xg2.actors.compile_workers"],
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
                 background_workers: int = 0):
        if workers < 1 or background_workers < 0:
            raise ValueError("workers must be at least 1, background_workers at least 0")
        setup = {"tokenizer_info": tokenizer_info, "cache_limit_bytes": cache_limit_bytes,
                 "precompute_budget_ms": precompute_budget_ms, "compile_timeout_ms": compile_timeout_s * 1e3,
                 "nice": nice}
        self._setup = pickle.dumps(setup)
        self._setup_idle = pickle.dumps({**setup, "sched_idle": True})
        self._idle: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        self._idle_background: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        self.background_workers = background_workers
        self._all: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False
        self.restarts = 0
        # the CPU seconds the worker spent on the last compile this thread got back (what a
        # tenant is charged: wall time would charge it for the machine being busy)
        self.last_cpu_s = threading.local()
        for _ in range(workers):
            self._idle.put(self._start())
        for _ in range(background_workers):
            self._idle_background.put(self._start(background=True))

    def _start(self, background: bool = False) -> _Worker:
        w = _Worker(self._setup_idle if background else self._setup)
        w.background = background
        with self._lock:
            self._all.append(w)
        return w

    def _replace(self, w: _Worker) -> None:
        w.kill()
        with self._lock:
            if w in self._all:
                self._all.remove(w)
            closed = self._closed
        if not closed:
            self.restarts += 1
            (self._idle_background if w.background else self._idle).put(self._start(w.background))

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        """Block until every worker has started (a replica calls it once, before serving)."""
        with self._lock:
            workers = list(self._all)
        for w in workers:
            w.wait_ready(timeout)

    def compile(self, spec: Any, timeout: float, background: bool = False) -> bytes:
        """`background`: on a background worker (SCHED_IDLE), when there is one."""
        if self._closed:
            raise CompileWorkerError("the compile workers were closed")
        idle = self._idle_background if background and self.background_workers else self._idle
        w = idle.get()
        while w.proc.poll() is not None:        # died while idle (killed from outside): replaced unseen
            self._replace(w)
            w = idle.get()
        try:
            w.wait_ready(START_TIMEOUT_S)
        except BaseException:
            self._replace(w)
            raise
        try:
            w.send.send_bytes(_SPEC_ENC.encode(spec))
            if not w.recv.poll(timeout):
                self._replace(w)
                raise CompileTimeout(f"the compile did not finish within {timeout:g} s")
            msg = w.recv.recv_bytes()
        except (EOFError, OSError, BrokenPipeError):
            self._replace(w)
            raise CompileWorkerError("the compile worker died while compiling this spec "
                                     "(out of memory, or killed); it was started again") from None
        idle.put(w)
        if msg[:1] == _OK:
            self.last_cpu_s.value = _CPU.unpack_from(msg, 1)[0]
            return msg[1 + _CPU.size:]
        raise _error_from(msg[1:])

    def pids(self) -> list[int]:
        with self._lock:
            return [w.proc.pid for w in self._all]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers, self._all = self._all, []
        for w in workers:
            w.kill()


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
    out.send_bytes(_READY)
    while True:
        try:
            data = inp.recv_bytes()
        except (EOFError, OSError):
            return      # the parent closed the pipe: stop
        cpu0 = time.process_time()
        try:
            spec = _SPEC_DEC.decode(data)
            compiled = spec.compile(compiler)
            compiled._precomputed.wait()
            blob = compiled.serialize(all_entries=True)
            reply = _OK + _CPU.pack(time.process_time() - cpu0) + blob
        except XG2Error as e:
            reply = _ERROR + _error_bytes(e)
        except RecursionError:
            reply = _ERROR + _error_bytes(GrammarLimitError("the spec nests too deeply to compile"))
        except MemoryError:
            reply = _ERROR + _error_bytes(GrammarLimitError("the spec needs more memory than a compile may use"))
        except Exception as e:      # noqa: BLE001 - a bug, said as such rather than a dead worker
            reply = _ERROR + _error_bytes(GrammarLimitError(f"the compile failed: {type(e).__name__}: {e}"))
        out.send_bytes(reply)


if __name__ == "__main__":
    _serve()
