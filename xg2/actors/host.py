"""MatcherHost: a GrammarRuntime in a Ray actor, for engines that sample in another process.

An engine that keeps its own model (and cannot host matchers beside it) opens sessions here and
makes one call per decode step for all of its sessions: the tokens it sampled go in, the bitmask
rows for the next step come back in one reply, never one message per row (`step`: one int32 array;
`step_packed` with `StepClient`: one byte string naming the rows the caller holds already, see
xg2._ext.rowbook). Every call names the tenant; a tenant reaches only its own sessions, and a
session id of another tenant is answered exactly as an unknown one.

The class is plain Python around the runtime (usable and tested in process); `host_actor_class()`
makes it an async Ray actor. With `shards` (CacheShard names) its runtime uses the deployment's
second cache tier.
"""

from __future__ import annotations

import asyncio
import secrets
import struct
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from .._ext.rowbook import RowBook, RowBookError
from ..errors import UsageError
from ..tokenizer import TokenizerInfo
from .runtime import GrammarRuntime, parse_spec


def _tokenizer(tokenizer: Any) -> TokenizerInfo:
    if isinstance(tokenizer, TokenizerInfo):
        return tokenizer
    if isinstance(tokenizer, str):
        if tokenizer.endswith(".json"):
            return TokenizerInfo.from_huggingface(tokenizer)
        return TokenizerInfo.from_tiktoken(tokenizer)
    raise TypeError("tokenizer must be a TokenizerInfo or a tokenizer file's path")


class MatcherHost:
    """Sessions of remote callers, stepped a whole batch per call (see the module note)."""

    def __init__(self, tokenizer: Any, *, shards: list[str] | None = None, shard_namespace: str | None = None,
                 shard_bytes: int | None = None, row_book_bytes: int = 8 << 20, max_row_books: int = 32,
                 **runtime_options: Any):
        info = _tokenizer(tokenizer)
        tier = None
        if shards:
            from .router import ShardRouter
            from .tier import ShardedCache

            tier = ShardedCache(ShardRouter(shards, namespace=shard_namespace, budget_bytes=shard_bytes))
        self.runtime = GrammarRuntime(info, cache_tier=tier, **runtime_options)
        self._width = (info.vocab_size + 31) // 32
        self._bitmask = np.zeros((8, self._width), np.int32)
        # Per client of step_packed: its row book and its sessions' last row ids (LRU, bounded).
        self.max_row_books = max_row_books
        self._book_rows = max(8, row_book_bytes // (4 * self._width))
        self._books: OrderedDict[tuple[str, str], tuple[RowBook, dict[str, int]]] = OrderedDict()
        self._words = np.empty(0, np.int32)
        self._values = np.empty(0, np.int32)

    def _rows(self, n: int) -> np.ndarray:
        if len(self._bitmask) < n:
            self._bitmask = np.zeros((max(n, 2 * len(self._bitmask)), self._width), np.int32)
        return self._bitmask[:n]

    async def open(self, tenant: str, spec: Any, first_mask: bool = False) -> dict:
        """Open a session for `tenant` (the spec's own tenant field is overridden: the caller says
        who it serves). With `first_mask`, the first bitmask row comes back in the same call, and
        `ttfm_ms` is the time from the call's arrival to that row."""
        t0 = time.perf_counter()
        spec = parse_spec(spec)
        if spec.tenant != tenant:
            spec = msgspec.structs.replace(spec, tenant=tenant)
        session = await self.runtime.open(spec)
        out = {"session": session.id}
        if first_mask:
            row = self._rows(1)
            self.runtime.fill([session], row)
            out["mask"] = row[0].copy()
            out["ttfm_ms"] = (time.perf_counter() - t0) * 1e3
        return out

    def _advance(self, tenant: str, session_ids: Sequence[str],
                 tokens: Sequence[int | None]) -> tuple[np.ndarray, list[bool], list[bool]]:
        """Accept the step's tokens and fill the next rows (into the host's buffer)."""
        if len(tokens) != len(session_ids):
            raise UsageError(f"{len(tokens)} tokens for {len(session_ids)} sessions: they must be as many")
        rt = self.runtime
        sessions = [rt.session(sid, tenant) for sid in session_ids]
        accepted = [True] * len(sessions)
        todo = [k for k, t in enumerate(tokens) if t is not None]
        if todo:
            flags = rt.accept([sessions[k] for k in todo], [int(tokens[k]) for k in todo])
            for k, ok in zip(todo, flags):
                accepted[k] = ok
        ended = [s.matcher._core.terminated for s in sessions]
        masks = self._rows(len(sessions))
        if any(ended):
            masks[:] = 0
        rt.fill([None if e else s for s, e in zip(sessions, ended)], masks)
        return masks, accepted, ended

    async def step(self, tenant: str, session_ids: Sequence[str], tokens: Sequence[int | None]) -> dict:
        """One decode step for the caller's sessions: session k accepts tokens[k] (None: nothing to
        accept, e.g. the first step), then its next mask is row k of `masks`; `accepted[k]` says
        whether its token was accepted (a refused token leaves the session as it was). A session
        that has ended (stop token accepted) gets an all-zero row and `ended[k]` True.

        The rows come back whole: a row is 16 kB for a 129k vocabulary, and a batch of them is too
        large for Ray to pass inline. `StepClient` (`step_packed`) sends only the rows the caller
        does not hold yet."""
        masks, accepted, ended = self._advance(tenant, session_ids, tokens)
        return {"masks": masks.copy(), "accepted": accepted, "ended": ended}

    async def step_packed(self, tenant: str, request: bytes) -> bytes:
        """`step` with the call and its reply as single byte strings (what StepClient sends): Ray
        passes one bytes argument and result at about the cost of an empty call, while lists and a
        dict of arrays cost a few hundred microseconds more.

        The rows travel through a row book the host keeps for each of the tenant's clients (see
        xg2._ext.rowbook): a row the client already holds is named by its number, a new one is sent
        as the words that differ from its session's previous row. The request names the client and
        the state of its book (epoch, next number); a book in another state (a lost reply, a client
        the host has forgotten, a restarted host) is started afresh and the reply says so, so the
        two books never disagree silently.

        request: msgpack [client id, book epoch, book next id, session ids, tokens (None for none)].
        reply: little-endian header (u64 epoch, i64 the book's next id before the step, i64
        capacity, i32 words m, i32 sessions n), then i64 row ids[n], i32 positions[m], i32
        values[m], and one byte per session (bit 0 accepted, bit 1 ended)."""
        try:
            client, epoch, next_id, ids, tokens = _STEP_REQUEST.decode(request)
        except msgspec.DecodeError as e:
            raise UsageError(f"malformed step request: {e}") from None
        masks, accepted, ended = self._advance(tenant, ids, tokens)
        book, last = self._book(tenant, client, epoch, next_id)
        n, w = masks.shape
        base = book.next_id
        last_ids = np.fromiter((last.get(sid, -1) for sid in ids), np.int64, n)
        row_ids = np.empty(n, np.int64)
        if len(self._words) < n * w:
            self._words = np.empty(max(n * w, 2 * len(self._words)), np.int32)
            self._values = np.empty(len(self._words), np.int32)
        m = book.encode(masks, last_ids, row_ids, self._words, self._values)
        for sid, rid in zip(ids, row_ids.tolist()):
            last[sid] = rid
        flags = np.array(accepted, np.uint8) | (np.array(ended, np.uint8) << 1)
        return b"".join((_REPLY_HEADER.pack(book.epoch, base, book.capacity, m, n), row_ids.astype("<i8").tobytes(),
                         self._words[:m].astype("<i4").tobytes(), self._values[:m].astype("<i4").tobytes(),
                         flags.tobytes()))

    def _book(self, tenant: str, client: str, epoch: int, next_id: int) -> tuple[Any, dict[str, int]]:
        """The client's row book and its sessions' last row ids, started afresh unless the client's
        book is in the state the host's is."""
        key = (tenant, client)
        entry = self._books.get(key)
        if entry is None or entry[0].epoch != epoch or entry[0].next_id != next_id:
            fresh = secrets.randbits(63) or 1
            entry = (RowBook(self._book_rows, self._width, fresh), {})
            self._books[key] = entry
            while len(self._books) > self.max_row_books:
                self._books.popitem(last=False)
        else:
            self._books.move_to_end(key)
            last = entry[1]
            if len(last) > 2 * self.runtime.open_sessions() + 64:    # sessions closed or reaped meanwhile
                for sid in [sid for sid in last if sid not in self.runtime._sessions]:
                    del last[sid]
        return entry

    async def close(self, tenant: str, session_ids: Sequence[str]) -> int:
        """Close the caller's sessions; ids that are not open (or not its own) are ignored."""
        rt = self.runtime
        found = []
        for sid in session_ids:
            s = rt._sessions.get(sid)
            if s is not None and s.tenant == tenant:
                found.append(s)
        rt.close(found)
        for (owner, _client), (_book, last) in self._books.items():
            if owner == tenant:
                for s in found:
                    last.pop(s.id, None)
        return len(found)

    async def fork(self, tenant: str, session_id: str, n: int = 1) -> list[str]:
        return [s.id for s in await self.runtime.fork(self.runtime.session(session_id, tenant), n)]

    async def rollback(self, tenant: str, session_ids: Sequence[str], counts: int | Sequence[int] = 1) -> None:
        rt = self.runtime
        rt.rollback([rt.session(sid, tenant) for sid in session_ids], counts)

    async def stats(self) -> dict:
        rt = self.runtime
        out = {"runtime": dict(rt.stats), "cache_bytes": rt.cache_bytes(), "pool": rt.compiler.cache_stats(),
               "open_sessions": rt.open_sessions()}
        if rt.cache_tier is not None:
            out["tier"] = rt.cache_tier.stats()
        return out

    async def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until what this host built is published to the shards (on a thread: the host's
        other calls go on meanwhile)."""
        tier = self.runtime.cache_tier
        return True if tier is None else await asyncio.to_thread(tier.flush, timeout_s)

    async def ping(self) -> int:
        import os

        return os.getpid()

    async def clear_local(self) -> None:
        """Drop this process's own caches (compiled grammars, modules, entries): benchmarks use it
        to measure what the shards alone give."""
        rt = self.runtime
        with rt._lock:
            rt._grammars.clear()
            rt._grammar_bytes = 0
        rt.compiler.clear_cache()


_STEP_REQUEST = msgspec.msgpack.Decoder(tuple[str, int, int, list[str], list[int | None]])
_STEP_ENCODER = msgspec.msgpack.Encoder()
_REPLY_HEADER = struct.Struct("<QqqII")


class StepClient:
    """The caller's side of `MatcherHost.step_packed`: keeps its row book in step with the host's
    and writes each step's rows from it. A session's calls all go through one client; the client
    is not thread-safe, and its steps are collected in the order they were submitted (a reply
    that does not follow the book's state raises RowBookError, and the next step starts the book
    afresh, so a mask is never taken from a book out of step)."""

    def __init__(self, host: Any, tenant: str, vocab_size: int):
        """`host`: a MatcherHost actor's handle, or the Serve mask service's (serve.app)."""
        self.host = host
        self.tenant = tenant
        self.width = (vocab_size + 31) // 32
        self.id = uuid.uuid4().hex
        self._book = RowBook(1, self.width, 0, indexed=False)   # epoch 0: the host starts a book
        self._last: dict[str, int] = {}
        self._opened: dict[str, np.ndarray] = {}

    def open(self, spec: Any) -> str:
        """Open a session through the host, keeping its first mask (`mask(session_id)`)."""
        reply = _result(self.host.open.remote(self.tenant, spec, True))
        self._opened[reply["session"]] = reply["mask"]
        return reply["session"]

    def mask(self, session_id: str) -> np.ndarray:
        """The mask an `open` returned (until the session's first step)."""
        return self._opened[session_id]

    def request(self, session_ids: Sequence[str], tokens: Sequence[int | None]) -> bytes:
        """The bytes of a step call (what `submit` sends)."""
        return _STEP_ENCODER.encode([self.id, self._book.epoch, self._book.next_id, list(session_ids),
                                     [None if t is None else int(t) for t in tokens]])

    def submit(self, session_ids: Sequence[str], tokens: Sequence[int | None]) -> Any:
        """Start a step (an object ref for `collect`): e.g. when the forward pass is launched."""
        return self.host.step_packed.remote(self.tenant, self.request(session_ids, tokens))

    def read(self, session_ids: Sequence[str], reply: bytes,
             out: np.ndarray | None = None) -> tuple[np.ndarray, list[bool], list[bool]]:
        """A step's (bitmask rows, accepted, ended) from its reply bytes."""
        epoch, base, capacity, m, n = _REPLY_HEADER.unpack_from(reply)
        if n != len(session_ids):
            raise UsageError(f"a reply for {n} sessions read for {len(session_ids)}")
        book = self._book
        if epoch != book.epoch:
            if base != 0:
                self._book = RowBook(1, self.width, 0, indexed=False)
                raise RowBookError("a step reply of a book this client does not have")
            book = self._book = RowBook(capacity, self.width, epoch, indexed=False)
            self._last.clear()
        elif base != book.next_id:
            self._book = RowBook(1, self.width, 0, indexed=False)
            raise RowBookError("a step reply out of order (steps are collected in the order they were made)")
        at = _REPLY_HEADER.size
        row_ids = np.frombuffer(reply, "<i8", n, at)
        words = np.frombuffer(reply, "<i4", 2 * m, at + 8 * n)
        flags = np.frombuffer(reply, np.uint8, n, at + 8 * n + 8 * m)
        rows = np.empty((n, self.width), np.int32) if out is None else out
        last = np.fromiter((self._last.get(sid, -1) for sid in session_ids), np.int64, n)
        try:
            book.decode(last, row_ids, words[:m], words[m:], rows)
        except RowBookError:
            self._book = RowBook(1, self.width, 0, indexed=False)
            raise
        for sid, rid in zip(session_ids, row_ids.tolist()):
            self._last[sid] = rid
            self._opened.pop(sid, None)
        return rows, (flags & 1).astype(bool).tolist(), (flags & 2).astype(bool).tolist()

    def collect(self, session_ids: Sequence[str], ref: Any,
                out: np.ndarray | None = None) -> tuple[np.ndarray, list[bool], list[bool]]:
        """The step's (bitmask rows, accepted, ended)."""
        return self.read(session_ids, _result(ref), out)

    def step(self, session_ids: Sequence[str], tokens: Sequence[int | None],
             out: np.ndarray | None = None) -> tuple[np.ndarray, list[bool], list[bool]]:
        """One decode step through the host: (bitmask rows, accepted, ended)."""
        return self.collect(session_ids, self.submit(session_ids, tokens), out)

    def forget(self, session_ids: Sequence[str]) -> None:
        """Drop what the client keeps for closed sessions."""
        for sid in session_ids:
            self._last.pop(sid, None)
            self._opened.pop(sid, None)


def _result(ref: Any) -> Any:
    """The value of a call: a Ray object ref (an actor's method), or a Serve handle's response."""
    if hasattr(ref, "result"):
        return ref.result()
    import ray

    return ray.get(ref)


def host_actor_class(**options: Any):
    """MatcherHost as an async Ray actor (its runtime's compile and fill threads are its own)."""
    import ray

    return ray.remote(num_cpus=0, max_concurrency=256, **options)(MatcherHost)
