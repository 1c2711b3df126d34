"""ShardRouter: which CacheShard holds a key, and batched calls to all of them at once.

Keys go to shards by rendezvous hashing: each (shard, key) pair gets a score and the key lives on the
shard with the highest, so adding a shard moves only the keys it now wins (about 1/N of them) and
removing one moves only its own. Keys are content digests already, so the score is a cheap mix of
the key's first 8 bytes with the shard's seed.

A batched read sends one call per shard that holds any of the keys, all at once, and waits for them
together: the cost is one round trip, whatever the number of keys. A shard that fails or does not
answer in time gives misses for its keys (a miss is only recomputation), and its handle is looked up
again by name, so a shard that Ray restarted is used again on the next call.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Iterable

import numpy as np

_log = logging.getLogger("xg2.router")
_MASK = (1 << 64) - 1


def _seed(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


def _score(key_head: int, seed: int) -> int:
    h = ((key_head ^ seed) * 0x9E3779B97F4A7C15) & _MASK
    h ^= h >> 29
    return (h * 0xBF58476D1CE4E5B9) & _MASK


class ShardRouter:
    """Routes keys over the named CacheShard actors (created on first use when missing)."""

    def __init__(self, names: list[str], *, namespace: str | None = None, budget_bytes: int | None = None,
                 create: bool = True, get_timeout_s: float = 5.0, put_timeout_s: float = 10.0):
        if not names:
            raise ValueError("a router needs at least one shard")
        self.names = list(names)
        self.namespace = namespace
        self.budget_bytes = budget_bytes
        self.get_timeout_s = get_timeout_s
        self.put_timeout_s = put_timeout_s
        self._seeds = [_seed(n) for n in self.names]
        self._handles: list = [None] * len(self.names)
        self._create = create
        self._lock = threading.Lock()
        self.failures = 0
        #: Shards seen restarted (empty) by a read or a write, and what to call with such a shard's index.
        self.restarts = 0
        self.on_restart: list = []
        self._incarnations: dict[int, str] = {}

    @classmethod
    def create(cls, n: int, *, prefix: str = "xg2-cache-shard", **kwargs) -> ShardRouter:
        return cls([f"{prefix}-{i}" for i in range(n)], **kwargs)

    def _handle(self, i: int, refresh: bool = False):
        """Shard i's actor handle, looked up by name on first use (created when missing and
        `create`), again after a failure."""
        import ray

        with self._lock:
            h = self._handles[i]
            if h is not None and not refresh:
                return h
        try:
            h = ray.get_actor(self.names[i], namespace=self.namespace)
        except ValueError:
            if not self._create:
                raise
            from .shard import DEFAULT_SHARD_BYTES, shard_actor_class

            # owned by this process (never detached: it ends with its creator); an application's
            # shards are created by its ShardKeeper (xg2.actors.keeper), and its replicas only find them
            h = shard_actor_class().options(name=self.names[i], namespace=self.namespace, get_if_exists=True,
                                            scheduling_strategy="SPREAD").remote(
                                                self.budget_bytes or DEFAULT_SHARD_BYTES)
        with self._lock:
            self._handles[i] = h
        return h

    @property
    def handles(self) -> list:
        return [self._handle(i) for i in range(len(self.names))]

    def shard_of(self, key: bytes) -> int:
        head = int.from_bytes(key[:8].ljust(8, b"\0"), "little")
        best, best_score = 0, -1
        for i, seed in enumerate(self._seeds):
            s = _score(head, seed)
            if s > best_score:
                best, best_score = i, s
        return best

    def group(self, keys: Iterable[bytes]) -> dict[int, list[bytes]]:
        """Keys by shard, all scored at once (a Python loop per key and shard held the GIL for
        milliseconds on the thousand keys of a grammar)."""
        keys = list(keys)
        if len(keys) < 16:
            out: dict[int, list[bytes]] = {}
            for k in keys:
                out.setdefault(self.shard_of(k), []).append(k)
            return out
        heads = np.frombuffer(b"".join(k[:8].ljust(8, b"\0") for k in keys), "<u8")
        seeds = np.array(self._seeds, np.uint64)
        with np.errstate(over="ignore"):
            h = (heads[:, None] ^ seeds[None, :]) * np.uint64(0x9E3779B97F4A7C15)
            h ^= h >> np.uint64(29)
            h *= np.uint64(0xBF58476D1CE4E5B9)
        best = h.argmax(axis=1)
        out = {}
        for i in np.unique(best).tolist():
            out[i] = [keys[j] for j in np.flatnonzero(best == i).tolist()]
        return out

    def _send(self, keys: list[bytes]) -> tuple[dict[int, list[bytes]], dict[int, object]]:
        """One get_many call per shard that holds any of `keys`, all sent: (keys by shard, refs)."""
        groups = self.group(keys)
        calls = {}
        for i, ks in groups.items():
            try:
                calls[i] = self._handle(i).get_many_tagged.remote(ks)
            except Exception as e:      # noqa: BLE001 - no shard there right now: misses
                self._failed(i, e)
        return groups, calls

    def get_many(self, keys: list[bytes]) -> dict[bytes, bytes]:
        """The values the shards hold for `keys` (absent keys left out): one call per shard, all in
        flight together."""
        import ray

        groups, calls = self._send(keys)
        out: dict[bytes, bytes] = {}
        for i, ref in calls.items():
            try:
                values, incarnation = ray.get(ref, timeout=self.get_timeout_s)
            except Exception as e:      # noqa: BLE001 - a dead or slow shard is only a miss
                self._failed(i, e)
                continue
            self._seen(i, incarnation)
            for k, v in zip(groups[i], values):
                if v is not None:
                    out[k] = v
        return out

    async def get_many_async(self, keys: list[bytes]) -> dict[bytes, bytes]:
        """`get_many` awaited on the caller's event loop (no thread blocked in ray.get)."""
        import asyncio

        groups, calls = self._send(keys)
        results = await asyncio.gather(*(asyncio.wait_for(_awaited(ref), self.get_timeout_s)
                                         for ref in calls.values()), return_exceptions=True)
        out: dict[bytes, bytes] = {}
        for i, result in zip(calls, results):
            if isinstance(result, BaseException):
                self._failed(i, result)
                continue
            values, incarnation = result
            self._seen(i, incarnation)
            for k, v in zip(groups[i], values):
                if v is not None:
                    out[k] = v
        return out

    def put_many(self, items: list[tuple[bytes, bytes]]) -> int:
        """Store pairs on their shards (one call per shard, together); returns how many were new.
        A failed shard drops its pairs: they are rebuilt where needed."""
        import ray

        groups: dict[int, list[tuple[bytes, bytes]]] = {}
        for k, v in items:
            groups.setdefault(self.shard_of(k), []).append((k, v))
        calls = {}
        for i, ps in groups.items():
            try:
                calls[i] = self._handle(i).put_many.remote(ps)
            except Exception as e:      # noqa: BLE001
                self._failed(i, e)
        new = 0
        for i, ref in calls.items():
            try:
                stored, incarnation = ray.get(ref, timeout=self.put_timeout_s)
            except Exception as e:      # noqa: BLE001
                self._failed(i, e)
                continue
            new += stored
            self._seen(i, incarnation)
        return new

    def _seen(self, i: int, incarnation: str) -> None:
        """Shard i answered as `incarnation`: another one than before means Ray restarted it empty,
        and the listeners (the tiers that wrote to it) are told."""
        with self._lock:
            known = self._incarnations.get(i)
            self._incarnations[i] = incarnation
        if known is not None and known != incarnation:
            self.restarts += 1
            for listener in list(self.on_restart):
                listener(i)

    def _failed(self, i: int, e: BaseException) -> None:
        self.failures += 1
        _log.warning("cache shard %s failed (%s: %s); its keys count as misses", self.names[i], type(e).__name__, e)
        try:
            self._handle(i, refresh=True)
        except Exception as e2:     # noqa: BLE001 - not back yet; the next call tries again
            _log.warning("cache shard %s not found again yet: %s", self.names[i], e2)

    def stats(self) -> list[dict]:
        import ray

        out = []
        for i in range(len(self.names)):
            try:
                out.append(ray.get(self._handle(i).stats.remote(), timeout=self.get_timeout_s))
            except Exception as e:      # noqa: BLE001
                out.append({"error": f"{type(e).__name__}: {e}"})
        return out

    def kill(self, i: int, *, restart: bool = True) -> None:
        """Kill shard i (fault tests); Ray restarts it empty unless `restart` is False."""
        import ray

        ray.kill(self._handle(i), no_restart=not restart)


async def _awaited(ref):
    return await ref
