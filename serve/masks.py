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

import asyncio
import gc
import random
import sys
import time
from collections import Counter, deque
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from xg2.actors.host import MatcherHost, session_tag, step_request_sessions

#: The host process's GIL switch interval (Python's default is 5 ms; see MaskHost).
SWITCH_INTERVAL_S = 0.001
#: The host's event loop is timed this often (how late a timer fires: what a step waits for).
LAG_PERIOD_S = 0.01
#: Samples kept of that lag and of the steps' own time (a minute's at the period above).
TIMINGS_KEPT = 6000


#: How long after the last step a mask replica counts as quiet enough to link a tool set itself.
LINK_QUIET_S = 0.2


class MaskHost(MatcherHost):
    """A mask service replica's sessions: the model's vocabulary, the deployment's cache shards,
    compiles in child processes (off this process's GIL, so steps stay quick), and the caches a
    model replica has (the shards are behind them)."""

    def __init__(self, model: str, tag: str, shards: list[str] | None = None, shard_namespace: str | None = None,
                 keys: Any = None):
        from .model import load_model, tokenizer_info
        from .replica import ReplicaOptions

        loaded = load_model(model, progress=False)
        info = tokenizer_info(loaded)
        del loaded      # only its vocabulary is wanted here: the weights go before the freeze below
        super().__init__(info, tag=tag, shards=shards or None, shard_namespace=shard_namespace, keys=keys,
                         compile_processes=True,
                         max_compile_seconds_per_tenant=ReplicaOptions.max_compile_seconds_per_tenant,
                         grammar_cache_bytes=ReplicaOptions.grammar_cache_mb << 20,
                         cache_limit_bytes=ReplicaOptions.compiler_cache_mb << 20)
        if self.runtime.compile_workers is not None:
            self.runtime.compile_workers.wait_ready()
        # Known tool sets are linked on the runtime's own thread only when no step has come for a
        # while (a link holds the GIL for milliseconds that a step would wait for); else in workers.
        self._last_step = 0.0
        self.runtime.links_here_when = lambda: time.monotonic() - self._last_step > LINK_QUIET_S
        # A step waits for this process's event loop, so nothing may hold it for long: the
        # collector, walking the model, vocabulary and caches built above, paused it for up to
        # 50 ms (gen 1, measured under the load driver); frozen, they are never walked again.
        # The tier's publisher thread holds the GIL in stretches as well, and the loop waited up
        # to the default 5 ms switch interval for it at every hand-over: 1 ms bounds that wait.
        gc.collect()
        gc.freeze()
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._lag_ms: deque[float] = deque(maxlen=TIMINGS_KEPT)
        self._step_ms: deque[float] = deque(maxlen=TIMINGS_KEPT)
        self._timer: asyncio.Task | None = None

    async def step_packed(self, tenant: str, request: bytes) -> bytes:
        self._last_step = time.monotonic()
        if self._timer is None:     # the actor's loop exists once a call runs on it
            self._timer = asyncio.get_running_loop().create_task(self._time_loop())
        t0 = time.perf_counter()
        try:
            return await super().step_packed(tenant, request)
        finally:
            self._step_ms.append((time.perf_counter() - t0) * 1e3)

    async def _time_loop(self) -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(LAG_PERIOD_S)
            self._lag_ms.append((time.perf_counter() - t0 - LAG_PERIOD_S) * 1e3)

    async def stats(self) -> dict:
        """MatcherHost's, the host's latency figures over the last samples: how late its event
        loop ran a timer (`loop_lag_*`: what a step arriving then waited) and how long a step held
        it (`step_*`), in ms; and its CPU seconds so far (a load run's share of it is the
        difference)."""
        out = await super().stats()
        timings = {}
        for name, samples in (("loop_lag", self._lag_ms), ("step", self._step_ms)):
            ms = sorted(samples)
            if ms:
                timings.update({f"{name}_p50_ms": round(ms[len(ms) // 2], 3),
                                f"{name}_p99_ms": round(ms[int(len(ms) * 0.99)], 3),
                                f"{name}_max_ms": round(ms[-1], 3)})
        out["timings"] = timings
        out["cpu_s"] = time.process_time()     # this process's (not its compile workers')
        return out


def start_host(model: str, tag: str, shards: list[str] | None, shard_namespace: str | None,
               keys: Any = None) -> Any:
    """The calling replica's MaskHost actor, on the replica's node (a step crosses no network the
    replica's would not), owned by the replica (it ends with it)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = ray.get_runtime_context().get_node_id()
    actor = ray.remote(num_cpus=0, max_concurrency=256, max_restarts=0)(MaskHost)
    return actor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
        model, tag, shards, shard_namespace, keys)


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


class SessionRouter(RequestRouter):
    """Routes a call that names sessions to the replica holding them (see the module note).

    Not FIFO (Serve's FIFOMixin hands a replica chosen for one request to the oldest one waiting,
    which would send a session's call to another session's replica): the replica chosen for a
    request is that request's."""

    def initialize_state(self, **kwargs: Any) -> None:
        self._bound: Counter[ReplicaID] = Counter()         # clients bound through this router
        self._binding: dict[str, ReplicaID] = {}            # a `host` call's choice, until routed

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
            # counted when chosen, so that clients binding at once spread; moved if it lands elsewhere
            rid = pending_request.metadata.internal_request_id
            if rid in self._binding:
                self._bound[self._binding.pop(rid)] -= 1
            ranked = sorted(candidate_replicas, key=lambda r: (self._bound[r.replica_id],
                                                               (r.routing_stats or {}).get("clients", 0),
                                                               random.random()))
            self._binding[rid] = ranked[0].replica_id
            self._bound[ranked[0].replica_id] += 1
            return [[r] for r in ranked]
        return self._two(candidate_replicas)

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        chosen = self._binding.pop(pending_request.metadata.internal_request_id, None)
        if chosen is not None and chosen != replica_id:
            self._bound[chosen] -= 1
            self._bound[replica_id] += 1

    @staticmethod
    def _two(candidates: list[RunningReplica]) -> list[list[RunningReplica]]:
        """Serve's default: two replicas at random, the one with the shorter queue taken."""
        return [random.sample(candidates, min(2, len(candidates)))] if candidates else []
