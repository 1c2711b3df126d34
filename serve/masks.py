"""The mask service's parts beside its deployment (serve.app.MaskService): the host actor each
replica owns, and the request router that sends a session's calls to the replica holding it.

Why a host actor per replica: an engine makes one call per decode step, and a Serve handle call
costs the caller about 2.5 ms of CPU (the router reserves a slot on the replica with one RPC, then
sends the request with another, across two event loops), against about 0.6 ms for a plain actor
call (measured: loadtests/README.md). So each replica starts a `MaskHost` (a MatcherHost, the
sessions' process) on its node and gives its handle to clients once (`MaskService.host`); a
`StepClient` then calls that actor directly. The actor is the replica's own (not detached): it goes
when the replica goes, and the replica's health check fails when the actor has gone, so Serve
replaces the two together and a replica's sessions are never half there.

Why a custom router rather than model multiplexing: multiplexing treats a model id as something
any replica may load after a matching timeout (it falls back to the replica with fewest models),
while a session's matcher state exists in one process only. `SessionRouter` reads the replica id
from the session id (`<replica id>.<id>`, the host's tag) and sends the call to that replica
only; when that replica has stopped it sends the call to any running one, whose host answers
SessionLostError naming the lost sessions. Calls that name no session are routed as Serve's
default router routes them (power of two choices), except `host`, which goes to the replica this
process has bound fewest clients to (then fewest bound in all, from the replicas' routing stats).
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from ray.serve.request_router import FIFOMixin, PendingRequest, ReplicaID, RequestRouter, RunningReplica

from xg2.actors.host import MatcherHost, session_tag, step_request_sessions

#: Seconds between the replicas' routing stats (bound clients) reaching the routers.
ROUTING_STATS_PERIOD_S = 2.0


class MaskHost(MatcherHost):
    """A mask service replica's sessions: the model's vocabulary, the deployment's cache shards,
    compiles in child processes (off this process's GIL, so steps stay quick), and the caches a
    model replica has (the shards are behind them)."""

    def __init__(self, model: str, tag: str, shards: list[str] | None = None, shard_namespace: str | None = None):
        from .model import load_model, tokenizer_info
        from .replica import ReplicaOptions

        loaded = load_model(model, progress=False)
        super().__init__(tokenizer_info(loaded), tag=tag, shards=shards or None, shard_namespace=shard_namespace,
                         compile_processes=True,
                         max_compile_seconds_per_tenant=ReplicaOptions.max_compile_seconds_per_tenant,
                         grammar_cache_bytes=ReplicaOptions.grammar_cache_mb << 20,
                         cache_limit_bytes=ReplicaOptions.compiler_cache_mb << 20)
        if self.runtime.compile_workers is not None:
            self.runtime.compile_workers.wait_ready()


def start_host(model: str, tag: str, shards: list[str] | None, shard_namespace: str | None) -> Any:
    """The calling replica's MaskHost actor, on the replica's node (a step crosses no network the
    replica's would not), owned by the replica (it ends with it)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = ray.get_runtime_context().get_node_id()
    actor = ray.remote(num_cpus=0, max_concurrency=256, max_restarts=0)(MaskHost)
    return actor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
        model, tag, shards, shard_namespace)


def request_sessions(method: str, args: list | tuple, kwargs: dict) -> list:
    """The session ids a mask service call names (its methods' signatures, serve.app)."""
    def arg(i: int, name: str) -> Any:
        return args[i] if len(args) > i else kwargs.get(name)

    if method == "step_packed":
        return step_request_sessions(arg(1, "request"))
    if method in ("step_rows", "close", "rollback"):
        ids = arg(1, "session_ids")
        return list(ids) if isinstance(ids, (list, tuple)) else []
    if method == "fork":
        return [arg(1, "session_id")]
    return []


def routing_tag(request: PendingRequest) -> str | None:
    """The replica a call must reach: the handle's `session_id` option when set (a session id or
    a bare replica tag), else the first session the call names."""
    meta = request.metadata
    if meta.session_id:
        return session_tag(meta.session_id) or meta.session_id
    for sid in request_sessions(meta.call_method, request.args, request.kwargs):
        return session_tag(sid)
    return None


class SessionRouter(FIFOMixin, RequestRouter):
    """Routes a call that names sessions to the replica holding them (see the module note)."""

    def initialize_state(self, **kwargs: Any) -> None:
        self._bound: Counter[ReplicaID] = Counter()

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if pending_request is None or not candidate_replicas:
            return self._two(candidate_replicas)
        tag = routing_tag(pending_request)
        if tag is not None:
            for r in candidate_replicas:
                if r.replica_id.unique_id == tag:
                    return [[r]]
            # the holder has stopped: a running replica answers SessionLostError for its sessions
        elif pending_request.metadata.call_method == "host":
            ranked = sorted(candidate_replicas, key=lambda r: (self._bound[r.replica_id],
                                                               (r.routing_stats or {}).get("clients", 0),
                                                               random.random()))
            self._bound[ranked[0].replica_id] += 1     # counted once a choice (a retry may count twice)
            return [[r] for r in ranked]
        return self._two(candidate_replicas)

    @staticmethod
    def _two(candidates: list[RunningReplica]) -> list[list[RunningReplica]]:
        """Serve's default: two replicas at random, the one with the shorter queue taken."""
        return [random.sample(candidates, min(2, len(candidates)))] if candidates else []
