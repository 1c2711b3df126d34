"""BatchGrammarMatcher: one decode step for a whole batch of requests (xgrammar's class and semantics).

An engine that fills each request's mask with its own call pays the Python call and a GIL round trip
per row; with hundreds of requests that is a large share of a step. Here the bitmask is checked once
for the batch, and every row is filled by one call into the core that releases the GIL once (split
over a few threads for large batches).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import numpy as np

from ._ext.core import fill_rows
from .errors import FillTimeoutError, UsageError
from .matcher import GrammarMatcher, _int_arg, check_temperatures, cpu_bitmask

#: Rows a worker thread takes at the least; smaller batches are filled on the calling thread.
MIN_ROWS_PER_THREAD = 32


def _bitmask_base(bitmask: Any) -> tuple[int, int, int]:
    """(address, rows, words per row) of a 2-D int32 C-contiguous CPU bitmask, as xgrammar requires."""
    address, shape = cpu_bitmask(bitmask)
    if len(shape) != 2:
        raise UsageError(f"a batch bitmask is 2-D (batch_size, words), got {len(shape)}-D")
    return address, int(shape[0]), int(shape[1])


class BatchGrammarMatcher:
    """Steps of many GrammarMatchers at once. Thread-safe as long as no two calls share a matcher."""

    def __init__(self, max_threads: int | Literal["auto"] = "auto") -> None:
        if max_threads == "auto":
            max_threads = max(1, (os.cpu_count() or 2) // 2)
        max_threads = _int_arg(max_threads, "max_threads")
        if max_threads < 1:
            raise UsageError("max_threads must be at least 1")
        self.max_threads = max_threads
        self._pool: ThreadPoolExecutor | None = None

    def batch_fill_next_token_bitmask(self, matchers: Sequence[GrammarMatcher], bitmask: Any,
                                      indices: Sequence[int] | None = None, debug_print: bool = False) -> None:
        """Matcher k's next-token mask into row indices[k] (row k without indices). Refused with
        UsageError before anything is written, as xgrammar refuses it: a bitmask that is not 2-D
        int32 on the CPU or not as wide as the vocabulary needs, a row out of range, as many indices
        as matchers, a matcher that has accepted its stop token. FillTimeoutError when some masks
        could not be built within the fill budget: `rows` are those matchers' positions, every other
        row is written."""
        matchers = list(matchers)
        if indices is not None and len(indices) != len(matchers):
            raise UsageError(f"{len(indices)} indices for {len(matchers)} matchers: they must be as many")
        if not matchers:
            return
        address, n_rows, width = _bitmask_base(bitmask)
        rows = np.arange(len(matchers), dtype=np.int64) if indices is None else np.array(
            [_int_arg(i, "index") for i in indices], dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= n_rows):
            bad = int(rows[(rows < 0) | (rows >= n_rows)][0])
            raise UsageError(f"bitmask row {bad} out of range for {n_rows} rows")
        cores = []
        for m in matchers:
            if not isinstance(m, GrammarMatcher):
                raise TypeError("matchers must be xg2.GrammarMatcher objects")
            if m._n_words != width:
                raise UsageError(f"bitmask shape {(n_rows, width)} is not (batch_size, {m._n_words})")
            if m._core.terminated:
                raise UsageError("a matcher has accepted the stop token; there is no next token mask")
            cores.append(m._core)
        threads = min(self.max_threads, len(cores) // MIN_ROWS_PER_THREAD)
        if threads <= 1:
            fill_rows(cores, address, width, rows, width)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.max_threads, thread_name_prefix="xg2-batch-fill")
        step = -(-len(cores) // threads)
        jobs = [self._pool.submit(fill_rows, cores[i:i + step], address, width, rows[i:i + step], width)
                for i in range(0, len(cores), step)]
        failed = []
        for i, job in zip(range(0, len(cores), step), jobs):
            try:
                job.result()
            except FillTimeoutError as e:       # the other rows are written; say which failed
                failed += [i + k for k in e.rows]
        if failed:
            raise FillTimeoutError(failed)

    @staticmethod
    def batch_accept_token(matchers: Sequence[GrammarMatcher], tokens: Sequence[int],
                           debug_print: bool = False) -> list[bool]:
        """Whether each matcher accepted its token (a refused token leaves its matcher as it was)."""
        if len(tokens) != len(matchers):
            raise UsageError(f"{len(tokens)} tokens for {len(matchers)} matchers: they must be as many")
        return [m.accept_token(t) for m, t in zip(matchers, tokens)]

    @staticmethod
    def batch_accept_string(matchers: Sequence[GrammarMatcher], strings: Sequence[str | bytes],
                            debug_print: bool = False) -> list[bool]:
        if len(strings) != len(matchers):
            raise UsageError(f"{len(strings)} strings for {len(matchers)} matchers: they must be as many")
        return [m.accept_string(s) for m, s in zip(matchers, strings)]

    @staticmethod
    def batch_rollback(matchers: Sequence[GrammarMatcher], num_tokens: int | Sequence[int] = 1) -> None:
        """Roll each matcher back by its count (one count for all when an int)."""
        counts = [num_tokens] * len(matchers) if isinstance(num_tokens, (int, np.integer)) else list(num_tokens)
        if len(counts) != len(matchers):
            raise UsageError(f"{len(counts)} counts for {len(matchers)} matchers: they must be as many")
        for m, k in zip(matchers, counts):
            m.rollback(k)

    @staticmethod
    def batch_fill_temperature(matchers: Sequence[GrammarMatcher], temperatures: Any,
                               indices: Sequence[int] | None = None) -> None:
        """Each matcher's `temperature` into `temperatures[indices[k]]` (1-D float32 on the CPU),
        -1 where it has none (xgrammar's convention)."""
        matchers = list(matchers)
        if indices is not None and len(indices) != len(matchers):
            raise UsageError(f"the indices size ({len(indices)}) must equal the number of matchers "
                             f"({len(matchers)})")
        rows = list(range(len(matchers))) if indices is None else [_int_arg(i, "index") for i in indices]
        check_temperatures(temperatures, 0 if indices is not None else len(matchers))
        for r in rows:
            if not 0 <= r < temperatures.shape[0]:
                raise UsageError(f"temperature index {r} is out of bounds for {temperatures.shape[0]} entries")
        for m, r in zip(matchers, rows):
            t = m.temperature
            temperatures[r] = -1.0 if t is None else t

    def __del__(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
