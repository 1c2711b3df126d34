"""MatcherHost: a GrammarRuntime in a Ray actor, for engines that sample in another process.

An engine that keeps its own model (and cannot host matchers beside it) opens sessions here and
makes one call per decode step for all of its sessions: the tokens it sampled go in, the bitmask
rows for the next step come back as one int32 array (rows in the order of the call), never one
message per row. Every call names the tenant; a tenant reaches only its own sessions, and a
session id of another tenant is answered exactly as an unknown one.

The class is plain Python around the runtime (usable and tested in process); `host_actor_class()`
makes it an async Ray actor. With `shards` (CacheShard names) its runtime uses the deployment's
second cache tier.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

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
                 shard_bytes: int | None = None, **runtime_options: Any):
        info = _tokenizer(tokenizer)
        tier = None
        if shards:
            from .router import ShardRouter
            from .tier import ShardedCache

            tier = ShardedCache(ShardRouter(shards, namespace=shard_namespace, budget_bytes=shard_bytes))
        self.runtime = GrammarRuntime(info, cache_tier=tier, **runtime_options)
        self._width = (info.vocab_size + 31) // 32
        self._bitmask = np.zeros((8, self._width), np.int32)
        self._last: dict[str, np.ndarray] = {}     # per session: the mask last sent (see step's delta)
        self._zero_row = np.zeros(self._width, np.int32)

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
            self._last[session.id] = out["mask"]
            out["ttfm_ms"] = (time.perf_counter() - t0) * 1e3
        return out

    async def step(self, tenant: str, session_ids: Sequence[str], tokens: Sequence[int | None],
                   delta: bool = False) -> dict:
        """One decode step for the caller's sessions: session k accepts tokens[k] (None: nothing to
        accept, e.g. the first step), then its next mask is row k of `masks`; `accepted[k]` says
        whether its token was accepted (a refused token leaves the session as it was). A session
        that has ended (stop token accepted) gets an all-zero row and `ended[k]` True.

        With `delta`, the rows come back as the words that changed since the mask this host last
        sent for each session (zeros before the first): `changed` (flat positions, row * words +
        word) and `values`. A whole bitmask row is 16 kB for a 129k vocabulary and a batch of them
        is too large for Ray to pass inline, while consecutive masks of a session mostly agree;
        `StepClient` applies the changes to the rows it keeps."""
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
        out: dict[str, Any] = {"accepted": accepted, "ended": ended}
        last = self._last
        if delta:
            zero = self._zero_row
            before = np.stack([last.get(sid, zero) for sid in session_ids])
            changed = np.flatnonzero(before != masks).astype(np.int32)
            out["changed"], out["values"] = changed, masks.reshape(-1)[changed]
            for k in np.unique(changed // masks.shape[1]).tolist():
                last[session_ids[k]] = masks[k].copy()
        else:
            out["masks"] = masks.copy()
            for k, sid in enumerate(session_ids):
                last[sid] = masks[k].copy()
        if len(last) > 2 * rt.open_sessions() + 64:        # rows of sessions closed or reaped meanwhile
            for sid in [sid for sid in last if sid not in rt._sessions]:
                del last[sid]
        return out

    async def step_packed(self, tenant: str, request: bytes) -> bytes:
        """`step(..., delta=True)` with the call and its reply as single byte strings (what
        StepClient sends): Ray passes one bytes argument and result at about the cost of an empty
        call, while lists and a dict of arrays cost it a few hundred microseconds more.

        request: msgpack [session ids, tokens (None for none)]; reply: little-endian int32 count n,
        n changed flat positions, n values, then one byte per session (bit 0 accepted, bit 1 ended)."""
        try:
            ids, tokens = _STEP_REQUEST.decode(request)
        except msgspec.DecodeError as e:
            raise UsageError(f"malformed step request: {e}") from None
        out = await self.step(tenant, ids, tokens, delta=True)
        flags = np.array(out["accepted"], np.uint8) | (np.array(out["ended"], np.uint8) << 1)
        changed = out["changed"]
        return b"".join((np.int32(changed.size).tobytes(), changed.astype("<i4").tobytes(),
                         out["values"].astype("<i4").tobytes(), flags.tobytes()))

    async def close(self, tenant: str, session_ids: Sequence[str]) -> int:
        """Close the caller's sessions; ids that are not open (or not its own) are ignored."""
        rt = self.runtime
        found = []
        for sid in session_ids:
            s = rt._sessions.get(sid)
            if s is not None and s.tenant == tenant:
                found.append(s)
        rt.close(found)
        for s in found:
            self._last.pop(s.id, None)
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


_STEP_REQUEST = msgspec.msgpack.Decoder(tuple[list[str], list[int | None]])
_STEP_ENCODER = msgspec.msgpack.Encoder()


class StepClient:
    """The caller's side of `MatcherHost.step(..., delta=True)`: keeps each session's last mask and
    writes the step's rows from the changed words. A session's calls all go through one client
    (opened by it, or its first step made with the host's zeros as the base); not thread-safe."""

    def __init__(self, host: Any, tenant: str, vocab_size: int):
        self.host = host
        self.tenant = tenant
        self.width = (vocab_size + 31) // 32
        self._rows: dict[str, np.ndarray] = {}

    def apply(self, session_ids: Sequence[str], reply: dict, out: np.ndarray | None = None) -> np.ndarray:
        """The bitmask rows (one per session, in order) of a delta reply, into `out` if given."""
        rows = np.zeros((len(session_ids), self.width), np.int32) if out is None else out
        for k, sid in enumerate(session_ids):
            row = self._rows.get(sid)
            if row is None:
                rows[k] = 0
            else:
                rows[k] = row
        rows.reshape(-1)[reply["changed"]] = reply["values"]
        for k, sid in enumerate(session_ids):
            self._rows[sid] = rows[k].copy()
        return rows

    def open(self, spec: Any) -> str:
        """Open a session through the host, keeping its first mask (`mask(session_id)`)."""
        import ray

        reply = ray.get(self.host.open.remote(self.tenant, spec, True))
        self._rows[reply["session"]] = reply["mask"]
        return reply["session"]

    def mask(self, session_id: str) -> np.ndarray:
        return self._rows[session_id]

    def submit(self, session_ids: Sequence[str], tokens: Sequence[int | None]) -> Any:
        """Start a step (an object ref for `collect`): e.g. when the forward pass is launched."""
        request = _STEP_ENCODER.encode([list(session_ids), [None if t is None else int(t) for t in tokens]])
        return self.host.step_packed.remote(self.tenant, request)

    def collect(self, session_ids: Sequence[str], ref: Any,
                out: np.ndarray | None = None) -> tuple[np.ndarray, list[bool], list[bool]]:
        """The step's (bitmask rows, accepted, ended)."""
        import ray

        reply = ray.get(ref)
        n = int(np.frombuffer(reply, "<i4", 1)[0])
        body = np.frombuffer(reply, "<i4", 2 * n, 4)
        flags = np.frombuffer(reply, np.uint8, len(session_ids), 4 + 8 * n)
        rows = self.apply(session_ids, {"changed": body[:n], "values": body[n:]}, out)
        return rows, (flags & 1).astype(bool).tolist(), (flags & 2).astype(bool).tolist()

    def step(self, session_ids: Sequence[str], tokens: Sequence[int | None],
             out: np.ndarray | None = None) -> tuple[np.ndarray, list[bool], list[bool]]:
        """One decode step through the host: (bitmask rows, accepted, ended)."""
        return self.collect(session_ids, self.submit(session_ids, tokens), out)

    def forget(self, session_ids: Sequence[str]) -> None:
        """Drop the rows of closed sessions."""
        for sid in session_ids:
            self._rows.pop(sid, None)


def host_actor_class(**options: Any):
    """MatcherHost as an async Ray actor (its runtime's compile and fill threads are its own)."""
    import ray

    return ray.remote(num_cpus=0, max_concurrency=256, **options)(MatcherHost)
