"""CacheShard: one Ray actor holding a slice of the deployment's cross-grammar cache.

Values are transport blobs (xg2.transport: versioned, checksummed, naming their vocabulary) under
128-bit content keys, so a shard never interprets what it holds and tenants share an item only when
their structures are identical. Least recently used items go first once the shard's bytes pass its
budget; an item larger than the budget is not kept. Every call is idempotent (a put of a key already
held keeps the held value, a get has no effect but recency), so Ray may retry them across a
restart, and a restarted shard is simply empty: a lost shard costs recomputation, never a wrong mask.

The class is plain Python (tested without Ray); `shard_actor_class()` makes it an async actor.
"""

from __future__ import annotations

import os
from collections import OrderedDict

#: Default bytes per shard.
DEFAULT_SHARD_BYTES = 256 << 20
#: Bytes a key may have: content keys are 16 to 64 bytes.
MAX_KEY_BYTES = 64
#: What an item costs besides its key's and value's bytes: two bytes objects' headers and its
#: ordered-dict entry (measured: 171 bytes). Counted, so that the budget bounds the process's memory
#: even when the items are small entries (a shard holds hundreds of thousands of them).
ITEM_OVERHEAD = 170


class CacheShard:
    """An LRU of bytes by bytes, bounded by `budget_bytes` (keys, values and ITEM_OVERHEAD counted)."""

    def __init__(self, budget_bytes: int = DEFAULT_SHARD_BYTES):
        if budget_bytes < 0:
            raise ValueError("budget_bytes must be at least 0")
        self.budget_bytes = budget_bytes
        self._items: OrderedDict[bytes, bytes] = OrderedDict()
        self._bytes = 0
        self.incarnation = os.urandom(8).hex()
        self._counts = {"gets": 0, "hits": 0, "misses": 0, "puts": 0, "stored": 0, "evictions": 0,
                        "refused": 0}

    async def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """The values of `keys`, None where absent, in order."""
        out = []
        items = self._items
        for k in keys:
            v = items.get(k)
            if v is None:
                self._counts["misses"] += 1
            else:
                items.move_to_end(k)
                self._counts["hits"] += 1
            out.append(v)
        self._counts["gets"] += len(keys)
        return out

    async def get_many_tagged(self, keys: list[bytes]) -> tuple[list[bytes | None], str]:
        """`get_many` and this incarnation's id (readers learn of a restart as writers do)."""
        return await self.get_many(keys), self.incarnation

    async def put_many(self, items: list[tuple[bytes, bytes]]) -> tuple[int, str]:
        """Store (key, value) pairs; returns how many were new, and this incarnation's id (a shard
        that Ray restarted, empty, has another: writers then know to send their items again). A
        malformed pair (not bytes, a key of the wrong size) or one larger than the budget is
        refused and counted."""
        new = 0
        for pair in items:
            self._counts["puts"] += 1
            try:
                k, v = pair
            except (TypeError, ValueError):
                self._counts["refused"] += 1
                continue
            if (not isinstance(k, bytes) or not isinstance(v, bytes) or not 16 <= len(k) <= MAX_KEY_BYTES
                    or len(k) + len(v) + ITEM_OVERHEAD > self.budget_bytes):
                self._counts["refused"] += 1
                continue
            if k in self._items:
                self._items.move_to_end(k)
                continue
            self._items[k] = v
            self._bytes += len(k) + len(v) + ITEM_OVERHEAD
            new += 1
            self._counts["stored"] += 1
        while self._bytes > self.budget_bytes and self._items:
            k, v = self._items.popitem(last=False)
            self._bytes -= len(k) + len(v) + ITEM_OVERHEAD
            self._counts["evictions"] += 1
        return new, self.incarnation

    async def stats(self) -> dict[str, int]:
        return {"items": len(self._items), "bytes": self._bytes, "budget_bytes": self.budget_bytes,
                "incarnation": self.incarnation, **self._counts}

    async def clear(self) -> None:
        self._items.clear()
        self._bytes = 0

    async def node_id(self) -> str:
        """The Ray node this shard runs on (where a cluster spread it)."""
        import ray

        return ray.get_runtime_context().get_node_id()

    async def ping(self) -> int:
        """An empty call (its round trip is the cost of any call); returns the actor's pid."""
        return os.getpid()


def shard_actor_class(max_restarts: int = -1):
    """CacheShard as a Ray async actor that Ray restarts (empty) when it dies, its calls retried."""
    import ray

    return ray.remote(num_cpus=0, max_restarts=max_restarts, max_task_retries=-1,
                      max_concurrency=64)(CacheShard)
