"""MatcherHost: a GrammarRuntime in a Ray actor, for engines that sample in another process.

An engine that keeps its own model (and cannot host matchers beside it) opens sessions here and
makes one call per decode step for all of its sessions: the tokens it sampled go in, the bitmask
rows for the next step come back in one reply, never one message per row (`step`: one int32 array;
`step_packed` with `StepClient`: one byte string naming the rows the caller holds already, see
xg2._ext.rowbook). Every call names the tenant; a tenant reaches only its own sessions, and a
session id of another tenant is answered exactly as an unknown one.

The class is plain Python around the runtime (usable and tested in process); `host_actor_class()`
makes it an async Ray actor. With `shards` (CacheShard names) its runtime uses the deployment's
second cache tier. With a `tag` (the mask service gives each replica's host its replica id), its
session ids are `<tag>.<id>`: whoever holds an id knows which host holds the session, and a host
asked for another tag's session answers SessionLostError (the router of serve.masks sends such a
call elsewhere only when the tag's replica has stopped).

`StepClient` is an engine's side: given the mask service's Serve handle it asks Serve once for a
replica's host (an actor handle) and then calls that actor directly, one Ray call per step (a Serve
handle call costs several times as much CPU in the caller: see loadtests/README.md).
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
from ..errors import (
    AccessError,
    FillTimeoutError,
    SessionError,
    SessionLostError,
    StepTimeoutError,
    UsageError,
    XG2Error,
)
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


def _typed(method: Any) -> Any:
    """xg2's typed errors go back to the caller as they are (they pickle); a ValueError, TypeError
    or KeyError from deeper down becomes a UsageError naming it, so a remote caller's `except
    XG2Error` sees every refusal."""
    import functools

    @functools.wraps(method)
    async def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return await method(*args, **kwargs)
        except XG2Error:
            raise
        except (ValueError, TypeError, KeyError) as e:
            raise UsageError(f"{type(e).__name__}: {e}") from None

    return call


class MatcherHost:
    """Sessions of remote callers, stepped a whole batch per call (see the module note)."""

    def __init__(self, tokenizer: Any, *, shards: list[str] | None = None, shard_namespace: str | None = None,
                 shard_bytes: int | None = None, row_book_bytes: int = 8 << 20, max_row_books: int = 32,
                 tag: str | None = None, keys: Any = None, **runtime_options: Any):
        """`keys`: API keys (an object whose `caller(key)` gives the key's caller, with its
        `tenant`, or None; serve.keys.KeyRing): every call then names the caller's key where it
        names a tenant, and is answered as that key's tenant (AccessError for a key it does not
        know). Without, the tenant a call names is taken as it is: the host serves callers that
        are trusted to say who they serve. `runtime_options` go to GrammarRuntime (among them
        `max_tenants` and `max_sessions`, the host's caps)."""
        info = _tokenizer(tokenizer)
        self._keys = keys
        self._failed: list[int] = []        # positions of the last _advance's sessions that failed
        if tag is not None and (not tag or "." in tag):
            raise UsageError(f"a host's tag is a non-empty name without '.': {tag!r}")
        self.tag = tag
        self._prefix = None if tag is None else tag + "."
        self.vocab_size = info.vocab_size
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

    def _who(self, tenant: str) -> str:
        """The tenant a call speaks for: the one it names, or with keys the named key's."""
        if self._keys is None:
            if not isinstance(tenant, str) or not tenant:
                raise UsageError("a call names its tenant (a non-empty string)")
            return tenant
        caller = self._keys.caller(tenant) if isinstance(tenant, str) else None
        if caller is None:
            raise AccessError("unknown API key: this mask service takes the caller's key where a call names "
                              "its tenant")
        return caller.tenant

    def _rows(self, n: int) -> np.ndarray:
        if len(self._bitmask) < n:
            self._bitmask = np.zeros((max(n, 2 * len(self._bitmask)), self._width), np.int32)
        return self._bitmask[:n]

    @_typed
    async def open(self, tenant: str, spec: Any, first_mask: bool = False) -> dict:
        """Open a session for `tenant` (the spec's own tenant field is overridden: the caller says
        who it serves). With `first_mask`, the first bitmask row comes back in the same call, and
        `ttfm_ms` is the time from the call's arrival to that row."""
        tenant = self._who(tenant)
        t0 = time.perf_counter()
        spec = parse_spec(spec)
        if spec.tenant != tenant:
            spec = msgspec.structs.replace(spec, tenant=tenant)
        session = await self.runtime.open(spec)
        out = {"session": self._outer(session.id)}
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
        sessions = self._sessions(tenant, session_ids)
        accepted = [True] * len(sessions)
        todo = [k for k, t in enumerate(tokens) if t is not None]
        too_costly = []
        if todo:
            try:
                flags = rt.accept([sessions[k] for k in todo], [int(tokens[k]) for k in todo])
            except FillTimeoutError as e:
                flags = e.accepted
                too_costly = [todo[k] for k in e.rows]
            for k, ok in zip(todo, flags):
                accepted[k] = ok
        if too_costly:          # ended here, as a fill past its budget ends them (below)
            rt.close([sessions[k] for k in too_costly])
        ended = [s.closed or s.matcher._core.terminated for s in sessions]
        masks = self._rows(len(sessions))
        if any(ended):
            masks[:] = 0
        self._failed = list(too_costly)
        try:
            rt.fill([None if e else s for s, e in zip(sessions, ended)], masks)
        except FillTimeoutError as e:
            # Those sessions' grammars are too costly at this point: they end here (closed, an
            # all-zero row, ended and failed in the reply); the others' rows are written.
            for k in e.rows:
                ended[k] = True
                self._failed.append(k)
            rt.close([sessions[k] for k in e.rows])
        return masks, accepted, ended

    @_typed
    async def step(self, tenant: str, session_ids: Sequence[str], tokens: Sequence[int | None]) -> dict:
        """One decode step for the caller's sessions: session k accepts tokens[k] (None: nothing to
        accept, e.g. the first step), then its next mask is row k of `masks`; `accepted[k]` says
        whether its token was accepted (a refused token leaves the session as it was). A session
        that has ended (stop token accepted) gets an all-zero row and `ended[k]` True; so does one
        whose mask could not be built within the fill budget (FillTimeoutError: its grammar is too
        costly there), which is closed and has `failed[k]` True.

        The rows come back whole: a row is 16 kB for a 129k vocabulary, and a batch of them is too
        large for Ray to pass inline. `StepClient` (`step_packed`) sends only the rows the caller
        does not hold yet."""
        tenant = self._who(tenant)
        masks, accepted, ended = self._advance(tenant, session_ids, tokens)
        failed = [k in self._failed for k in range(len(session_ids))]
        return {"masks": masks.copy(), "accepted": accepted, "ended": ended, "failed": failed}

    @_typed
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
        values[m], and one byte per session (bit 0 accepted, bit 1 ended, bit 2 failed: see `step`)."""
        tenant = self._who(tenant)
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
        for k in self._failed:
            flags[k] |= 4
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
                for sid in [sid for sid in last if self._inner(sid) not in self.runtime._sessions]:
                    del last[sid]
        return entry

    async def close(self, tenant: str, session_ids: Sequence[str]) -> int:
        """Close the caller's sessions; ids that are not open (or not its own, or of another host's
        tag: a lost session is closed already) are ignored. The count closed comes back."""
        tenant = self._who(tenant)
        rt = self.runtime
        found = []
        for sid in session_ids:
            s = rt._sessions.get(self._inner(sid))
            if s is not None and s.tenant == tenant:
                found.append(s)
        rt.close(found)
        for (owner, _client), (_book, last) in self._books.items():
            if owner == tenant:
                for s in found:
                    last.pop(self._outer(s.id), None)
        return len(found)

    @_typed
    async def fork(self, tenant: str, session_id: str, n: int = 1) -> list[str]:
        tenant = self._who(tenant)
        parent = self._sessions(tenant, [session_id])[0]
        return [self._outer(s.id) for s in await self.runtime.fork(parent, n)]

    @_typed
    async def rollback(self, tenant: str, session_ids: Sequence[str], counts: int | Sequence[int] = 1) -> None:
        tenant = self._who(tenant)
        self.runtime.rollback(self._sessions(tenant, session_ids), counts)

    def _outer(self, sid: str) -> str:
        """The id callers know a runtime session by (tagged when the host has a tag)."""
        return sid if self._prefix is None else self._prefix + sid

    def _inner(self, sid: str) -> str | None:
        """The runtime's id of a caller's session id; None for an id of another tag."""
        p = self._prefix
        if p is None:
            return sid
        return sid[len(p):] if sid.startswith(p) else None

    def _sessions(self, tenant: str, session_ids: Sequence[str]) -> list:
        """The tenant's open sessions by the ids callers know; SessionLostError naming every id of
        another host's tag (the sessions of a replica that stopped), SessionError for an id that
        is not open here (closed, reaped, another tenant's: told apart from an unknown id by
        nothing)."""
        rt = self.runtime
        p = self._prefix
        if p is None:
            return [rt.session(sid, tenant) for sid in session_ids]
        n = len(p)
        out = []
        for sid in session_ids:
            if not isinstance(sid, str):
                raise UsageError(f"a session id is a string, not {type(sid).__name__}")
            if sid.startswith(p):
                out.append(rt.session(sid[n:], tenant))
            elif "." not in sid:
                raise SessionError(f"no open session {sid!r}")
            else:
                lost = [x for x in session_ids if isinstance(x, str) and not x.startswith(p) and "." in x]
                tags = sorted({x.partition(".")[0] for x in lost})
                raise SessionLostError(
                    f"{len(lost)} session(s) of mask service replica(s) {', '.join(tags)} reached replica "
                    f"{self.tag}: their replica has stopped and its sessions are lost (open them again), or "
                    f"the call named sessions of several replicas (one call per replica)", lost)
        return out

    async def info(self) -> dict:
        """What a client needs before its first call: the vocabulary's size and this host's tag."""
        return {"vocab_size": self.vocab_size, "tag": self.tag}

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


def session_tag(session_id: Any) -> str | None:
    """The tag of the host that gave out a session id (None for an untagged or malformed id)."""
    if isinstance(session_id, str):
        tag, dot, _ = session_id.partition(".")
        if dot and tag:
            return tag
    return None


def step_request_sessions(request: Any) -> list[str]:
    """The session ids a `step_packed` request names ([] for bytes that are not one)."""
    try:
        return _STEP_REQUEST.decode(request)[3]
    except (msgspec.DecodeError, TypeError):
        return []
_STEP_ENCODER = msgspec.msgpack.Encoder()
_REPLY_HEADER = struct.Struct("<QqqII")


#: StepClient's default `timeout_s`: far past a step (milliseconds) or an open that compiles (the
#: compile deadline is 5 s), short enough that a stuck host does not hold an engine for long.
DEFAULT_CALL_TIMEOUT_S = 30.0


class StepClient:
    """The caller's side of `MatcherHost.step_packed`: keeps its row book in step with the host's
    and writes each step's rows from it. A session's calls all go through one client; the client
    is not thread-safe, and its steps are collected in the order they were submitted (a reply
    that does not follow the book's state raises RowBookError, and the next step starts the book
    afresh, so a mask is never taken from a book out of step).

    Given the mask service's Serve handle, the client asks Serve once for a replica's host (the
    replica this process has bound fewest clients to) and makes every later call on that actor
    directly: all its sessions are on one replica, so a step is one Ray call, without Serve's
    routing in the caller (several times the CPU of the call itself). When that host has stopped,
    a call naming its sessions raises SessionLostError (their state went with it; closing them
    is a no-op), and the next `open` binds to a running replica. Each call has a blocking form
    (`open`, `step`, `close`) and an asyncio one (`open_async`, `step_async`, `close_async`)."""

    def __init__(self, host: Any, tenant: str, vocab_size: int, *, timeout_s: float = DEFAULT_CALL_TIMEOUT_S):
        """`host`: a MatcherHost actor's handle, or the Serve mask service's (serve.app). `tenant`:
        the tenant (the caller's API key, for a service with keys). `timeout_s`: how long any call
        waits for its answer before StepTimeoutError."""
        if not timeout_s > 0:
            raise UsageError("timeout_s must be positive")
        self.timeout_s = timeout_s
        #: Sessions the host ended because their mask could not be built within its fill budget
        #: (reported as ended, with an all-zero row): they are closed.
        self.failed: set[str] = set()
        self.service = host if _is_serve_handle(host) else None
        self.host = None if self.service is not None else host
        self.tag: str | None = None         # the bound replica's (through the service)
        self.tenant = tenant
        self.width = (vocab_size + 31) // 32
        self.id = uuid.uuid4().hex
        self._book = RowBook(1, self.width, 0, indexed=False)   # epoch 0: the host starts a book
        self._last: dict[str, int] = {}
        self._opened: dict[str, np.ndarray] = {}
        self._binding: asyncio.Lock | None = None      # one `host` call for concurrent first opens

    # -- binding to a replica's host (through the service) ------------------------------------

    def _bind(self, reply: dict) -> Any:
        self.host, self.tag = reply["host"], reply["tag"]
        return self.host

    def _bound(self) -> Any:
        return self.host if self.host is not None else self._bind(self._wait(self.service.host.remote(), "host"))

    def _wait(self, ref: Any, what: str, session_ids: Sequence[str] = ()) -> Any:
        """A call's value within timeout_s; StepTimeoutError past it."""
        try:
            return _result(ref, self.timeout_s)
        except _TIMEOUTS as e:
            raise self._timed_out(what, session_ids, e) from None

    async def _await(self, ref: Any, what: str, session_ids: Sequence[str] = ()) -> Any:
        try:
            return await asyncio.wait_for(_awaitable(ref), self.timeout_s)
        except _TIMEOUTS as e:
            raise self._timed_out(what, session_ids, e) from None

    def _timed_out(self, what: str, session_ids: Sequence[str], e: BaseException) -> StepTimeoutError:
        if what == "step":      # the host may have taken the step: the book starts afresh
            self._book = RowBook(1, self.width, 0, indexed=False)
            self._last.clear()
        return StepTimeoutError(f"the mask service did not answer `{what}` within {self.timeout_s:g} s"
                                + (" (the sessions' state is unknown: close them and open them again)"
                                   if session_ids else ""), list(session_ids))

    async def _bound_async(self) -> Any:
        if self.host is None:
            if self._binding is None:
                self._binding = asyncio.Lock()
            async with self._binding:           # the opens of a first batch all wait for one binding
                if self.host is None:
                    self._bind(await self._await(self.service.host.remote(), "host"))
        return self.host

    def _host_died(self, e: BaseException) -> bool:
        """Whether `e` says the host actor has stopped (then, through the service, the client
        unbinds: the next open binds to a running replica)."""
        if not _actor_died(e):
            return False
        if self.service is not None:
            self.host = None
        return True

    def _rebind(self, e: BaseException, attempt: int) -> bool:
        """Whether an open that failed with `e` is tried again: its host has stopped, and another
        can be bound through the service (a new session can go anywhere)."""
        return self._host_died(e) and self.service is not None and attempt < _OPEN_TRIES - 1

    def _lost(self, session_ids: Sequence[str]) -> SessionLostError:
        self.forget(session_ids)
        return SessionLostError(f"the mask service host of {len(session_ids)} session(s) has stopped: they are "
                                "lost (open them again)", list(session_ids))

    # -- calls --------------------------------------------------------------------------------

    def open(self, spec: Any) -> str:
        """Open a session through the host, keeping its first mask (`mask(session_id)`)."""
        for attempt in range(_OPEN_TRIES):
            host = self._bound()
            try:
                reply = self._wait(host.open.remote(self.tenant, spec, True), "open")
            except Exception as e:
                if self._rebind(e, attempt):
                    continue
                raise
            return self._opened_reply(reply)

    async def open_async(self, spec: Any) -> dict:
        """`open` from asyncio; the host's whole reply (`session`, `mask`, `ttfm_ms`)."""
        for attempt in range(_OPEN_TRIES):
            host = await self._bound_async()
            try:
                reply = await self._await(host.open.remote(self.tenant, spec, True), "open")
            except Exception as e:
                if self._rebind(e, attempt):
                    continue
                raise
            self._opened_reply(reply)
            return reply

    def _opened_reply(self, reply: dict) -> str:
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
        return self._bound().step_packed.remote(self.tenant, self.request(session_ids, tokens))

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
        for k in np.nonzero(flags & 4)[0].tolist():
            self.failed.add(session_ids[k])
        return rows, (flags & 1).astype(bool).tolist(), (flags & 2).astype(bool).tolist()

    def collect(self, session_ids: Sequence[str], ref: Any,
                out: np.ndarray | None = None) -> tuple[np.ndarray, list[bool], list[bool]]:
        """The step's (bitmask rows, accepted, ended)."""
        try:
            reply = self._wait(ref, "step", session_ids)
        except StepTimeoutError:
            raise
        except Exception as e:
            if self._host_died(e):
                raise self._lost(session_ids) from None
            raise
        return self.read(session_ids, reply, out)

    def step(self, session_ids: Sequence[str], tokens: Sequence[int | None],
             out: np.ndarray | None = None) -> tuple[np.ndarray, list[bool], list[bool]]:
        """One decode step through the host: (bitmask rows, accepted, ended)."""
        return self.collect(session_ids, self.submit(session_ids, tokens), out)

    async def step_async(self, session_ids: Sequence[str], tokens: Sequence[int | None],
                         out: np.ndarray | None = None) -> tuple[np.ndarray, list[bool], list[bool]]:
        """`step` from asyncio."""
        host = await self._bound_async()
        try:
            reply = await self._await(host.step_packed.remote(self.tenant, self.request(session_ids, tokens)),
                                      "step", session_ids)
        except StepTimeoutError:
            raise
        except Exception as e:
            if self._host_died(e):
                raise self._lost(session_ids) from None
            raise
        return self.read(session_ids, reply, out)

    def close(self, session_ids: Sequence[str]) -> int:
        """Close sessions (and forget them); how many were open. Lost ones are closed already."""
        try:
            return 0 if self.host is None else self._wait(self.host.close.remote(self.tenant, list(session_ids)),
                                                          "close")
        except StepTimeoutError:
            raise
        except Exception as e:
            if self._host_died(e):
                return 0
            raise
        finally:
            self.forget(session_ids)

    async def close_async(self, session_ids: Sequence[str]) -> int:
        """`close` from asyncio."""
        try:
            return 0 if self.host is None else await self._await(
                self.host.close.remote(self.tenant, list(session_ids)), "close")
        except StepTimeoutError:
            raise
        except Exception as e:
            if self._host_died(e):
                return 0
            raise
        finally:
            self.forget(session_ids)

    def forget(self, session_ids: Sequence[str]) -> None:
        """Drop what the client keeps for closed sessions."""
        for sid in session_ids:
            self._last.pop(sid, None)
            self._opened.pop(sid, None)


#: Opens tried through the service when the bound host has stopped (each binds anew).
_OPEN_TRIES = 3


def _is_serve_handle(handle: Any) -> bool:
    try:
        from ray.serve.handle import DeploymentHandle
    except ImportError:
        return False
    return isinstance(handle, DeploymentHandle)


def _actor_died(e: BaseException) -> bool:
    try:
        from ray.exceptions import ActorDiedError
    except ImportError:
        return False
    return isinstance(e, ActorDiedError)


def _result(ref: Any, timeout_s: float | None = None) -> Any:
    """The value of a call: a Ray object ref (an actor's method), or a Serve handle's response."""
    if hasattr(ref, "result"):
        return ref.result(timeout_s=timeout_s)
    import ray

    return ray.get(ref, timeout=timeout_s)


def _awaitable(ref: Any) -> Any:
    """A coroutine over a Ray object ref or a Serve response (asyncio.wait_for takes coroutines)."""
    async def wait() -> Any:
        return await ref
    return wait()


def _timeouts() -> tuple[type[BaseException], ...]:
    out: list[type[BaseException]] = [TimeoutError, asyncio.TimeoutError]
    try:
        from ray.exceptions import GetTimeoutError

        out.append(GetTimeoutError)
    except ImportError:
        pass
    return tuple(out)


_TIMEOUTS = _timeouts()


def host_actor_class(**options: Any):
    """MatcherHost as an async Ray actor (its runtime's compile and fill threads are its own)."""
    import ray

    return ray.remote(num_cpus=0, max_concurrency=256, **options)(MatcherHost)
