"""ShardKeeper: the owner of a deployment's CacheShard actors, so that they end with it.

Ray ends an actor when its owner (the process that created it) ends, unless it is detached. Shards
that a keeper creates are its own: when the keeper's application is deleted (`serve shutdown`,
`xg2 serve` stopped by SIGINT or SIGTERM) they go with it, and nothing is left behind in a cluster
that the application only joined. While the keeper lives, Ray restarts a shard that died (its node
lost) on another node, empty: a lost shard costs recomputation, never a wrong mask.

Shards are placed with Ray's SPREAD strategy, over the cluster's nodes, so that one node's loss
takes only its share of the cache. Their names carry the build (`transport.build_id`): two builds
running side by side in a rolling deploy have shards of their own, and every key carries the build
and the vocabulary besides (xg2.actors.tier.namespace_digest).

The keeper is placed on the head node by its application (serve/shards.py): a worker node's loss
must not take the owner of every shard with it.
"""

from __future__ import annotations

from .. import transport

#: The Ray namespace of the shard actors.
SHARD_NAMESPACE = "xg2"


def shard_prefix() -> str:
    """The names of this build's shards begin with this."""
    return f"xg2-shard-{transport.build_id()}"


def shard_names(n: int, prefix: str | None = None) -> list[str]:
    return [f"{prefix or shard_prefix()}-{i}" for i in range(n)]


class ShardKeeper:
    """Creates (or finds) the named shards and holds them; see the module note."""

    def __init__(self, names: list[str], namespace: str = SHARD_NAMESPACE, budget_bytes: int | None = None):
        import ray

        from .shard import DEFAULT_SHARD_BYTES, shard_actor_class

        if not names:
            raise ValueError("a keeper needs at least one shard name")
        self.names, self.namespace = list(names), namespace
        cls = shard_actor_class()
        self._handles = [cls.options(name=name, namespace=namespace, get_if_exists=True,
                                     scheduling_strategy="SPREAD").remote(budget_bytes or DEFAULT_SHARD_BYTES)
                         for name in self.names]
        ray.get([h.ping.remote() for h in self._handles])     # serving only once every shard answers

    async def shards(self) -> tuple[list[str], str]:
        """The shards' names and their Ray namespace."""
        return self.names, self.namespace

    async def placement(self) -> list[str | None]:
        """The node id each shard runs on now (None: not answering)."""
        import asyncio

        async def node(h):
            try:
                return await asyncio.wait_for(h.node_id.remote(), 10)
            except Exception:       # noqa: BLE001 - a shard being restarted
                return None

        return list(await asyncio.gather(*(node(h) for h in self._handles)))
