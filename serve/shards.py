"""The cache shards' application ("xg2-shards"): one ShardKeeper replica on the head node that
creates and owns the shard actors (xg2.actors.keeper), so that they are spread over the cluster's
nodes and end with the application. The model and mask applications' replicas find the shards by
name; they never create them."""

from __future__ import annotations

from typing import Any

from ray import serve

from xg2.actors.keeper import SHARD_NAMESPACE, ShardKeeper, shard_names

#: On the head node: a worker node's loss must not take the owner of every shard with it (Ray
#: puts this resource on the head node only).
HEAD_NODE = {"node:__internal_head__": 0.001}


@serve.deployment(name="xg2-shard-keeper", num_replicas=1, ray_actor_options={"num_cpus": 0, "resources": HEAD_NODE},
                  health_check_period_s=10, graceful_shutdown_wait_loop_s=0.5)
class ShardKeeperDeployment(ShardKeeper):
    pass


def build_shards(args: dict[str, Any]) -> Any:
    """Args `shards` (how many, default 2), `shard_prefix` (default: this build's,
    xg2.actors.keeper.shard_prefix), `shard_namespace`, `shard_mb` (each shard's budget)."""
    args = dict(args or {})
    names = shard_names(int(args.get("shards", 2)), args.get("shard_prefix"))
    mb = args.get("shard_mb")
    return ShardKeeperDeployment.bind(names, args.get("shard_namespace") or SHARD_NAMESPACE,
                                      int(mb) << 20 if mb else None)
