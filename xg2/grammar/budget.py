"""The compile deadline: a tenant's input must not hold a compiler (or the thread serving it) for
longer than the compiler's `compile_timeout_ms`.

A deadline is set per thread for the length of one compile (`deadline`), and the long loops of the
pipeline (front-ends, repetition compression, inlining, automaton construction, content keys,
linking, precompute) call `check` as they go. A check is a thread-local read and a clock read,
taken once per rule or per few hundred steps, so it costs nothing measurable; outside a compile
(a `Grammar` built directly) it does nothing. Work inside one call into the C core (one rule's
subset construction and minimisation, the core's table build, one node's mask entries) is not
interrupted: each such call is bounded on its own (MAX_DFA_STATES, MAX_CLOSURE_WORK, the grammar's
size), and the check runs between them. The exception is one node's mask entry, whose cost no size
bound caps: the core is given the deadline itself (`ends_at`) and stops the build there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import GrammarLimitError

_local = threading.local()


class CompileTimeout(GrammarLimitError):
    """A compile ran past its compiler's `compile_timeout_ms` (a GrammarLimitError like any other
    limit; its own class only so that code that retries a part of a compile another way does not
    retry past the deadline)."""


@contextmanager
def deadline(timeout_ms: float | None, what: str) -> Iterator[None]:
    """Within the block, `check` raises CompileTimeout once `timeout_ms` have passed (None: no
    limit). An inner block (a compile that compiles parts of itself) keeps the outer deadline."""
    outer = getattr(_local, "current", None)
    if outer is not None or timeout_ms is None:
        yield
        return
    _local.current = (time.perf_counter() + timeout_ms / 1e3, timeout_ms, what)
    try:
        yield
    finally:
        _local.current = None


def check(phase: str) -> None:
    """Raise CompileTimeout if this thread's compile is past its deadline; `phase` says where."""
    current = getattr(_local, "current", None)
    if current is not None and time.perf_counter() > current[0]:
        _, timeout_ms, what = current
        raise CompileTimeout(f"compiling {what} took longer than the compile budget of {timeout_ms:g} ms "
                             f"(stopped in {phase}; raise GrammarCompiler(compile_timeout_ms=...) if it is legitimate)")


def expired() -> bool:
    """Whether this thread's compile is past its deadline."""
    current = getattr(_local, "current", None)
    return current is not None and time.perf_counter() > current[0]


def ends_at() -> float:
    """This thread's compile deadline in time.perf_counter seconds (0.0: none): handed to the C
    core, whose entry builds stop there on their own (the clocks are the same)."""
    current = getattr(_local, "current", None)
    return 0.0 if current is None else current[0]
