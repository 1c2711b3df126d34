"""Grammar-affinity routing for the model replicas (Serve deployment "xg2-model").

Why: a replica that already holds a request's compiled grammar (its runtime's cache, by content
key) opens it without compiling; one that holds most of the request's tools is cheaper still than
a cold one, because each tool's `function.parameters` schema is lowered once per compiler as a
module and a new tool set whose tools were seen only links their modules. Serve's default router
(power of two choices) spreads a tool's requests over every replica, so each replica lowers it.

What a router can see: for an HTTP request Serve's proxy gives the router only the ASGI scope
(`PendingRequest.args` is one pickled StreamingHTTPRequest: method, path, headers); the chosen
replica pulls the body from the proxy after routing. So with this router the application's ingress
(serve/ingress.py) reads the body, computes the request's affinity (the grammar's content key and
one key per tool, without compiling anything) and calls "xg2-model" through a DeploymentHandle
whose router is this one, passing the affinity as the `affinity` keyword argument, which reaches
the router in `PendingRequest.kwargs`.

How it chooses, best first:
  1. a replica this router sent the same grammar to (it holds it, unless its cache let it go);
  2. the replica it sent most of the request's tools to;
  3. with nothing learned, the rendezvous (highest-random-weight) home of most of the tools, else
     of the grammar: every router in the cluster places a new key on the same replica without
     talking to the others, and only 1/n of the keys move when a replica comes or goes.
Replicas that tie are told apart by queue length (load is the tie-break). A preferred replica whose
queue is more than `imbalance` requests longer than the shortest one (or full) is passed over for
the next, so a hot grammar cannot pile its requests onto one replica while others idle. Requests
without a grammar go to the shorter queue of two random replicas, as with Serve's default router.

What it learned (which keys went where) is per router process and bounded per replica, most
recently used kept, as the replicas' caches are; it is a hint, never a correctness matter: a
request routed anywhere is served the same. Queue lengths come from Serve's queue-length cache,
probed when stale (the same RPC Serve's own routers make).

This module is pickled by value into every process that routes to "xg2-model" (Serve does so for a
custom router): it imports nothing from the application and takes the affinity as plain data.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec
from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

_log = logging.getLogger("xg2.serve.routing")

#: The keyword argument of the model's `generate` that carries a request's affinity to the router.
AFFINITY_KWARG = "affinity"
#: The response header naming the model replica that answered (its Serve replica id).
REPLICA_HEADER = "x-xg2-replica"
#: A preferred replica is passed over when its queue is this much longer than the shortest: half a
#: decoding batch (8) of extra waiting beats compiling again only while the batch still has room.
DEFAULT_IMBALANCE = 4
#: Keys remembered per replica (grammars and tools together): about what a replica's default caches
#: hold (64 MB of grammars and 128 MB of compiler caches at some tens of KB a module or grammar).
DEFAULT_REMEMBERED_KEYS = 8192

_GRAMMAR, _TOOL = b"g", b"t"
_JSON = msgspec.json.Encoder()

#: A request's affinity: its grammar's content key (None: no grammar) and one key per tool.
Affinity = tuple[bytes | None, tuple[bytes, ...]]


def tool_key(parameters: Any) -> bytes:
    """A tool's key: a digest of its `parameters` schema as sent (member order kept: it is the
    module's source, and a reordered schema is lowered as another module). Tools that differ only
    in name or description share a module, so they share a key."""
    return hashlib.blake2b(_JSON.encode(parameters), digest_size=16).digest()


def rendezvous_weight(key: bytes, replica: str) -> int:
    """The highest-random-weight score of `key` on `replica`: the replica with the largest
    score is the key's home. Keyed BLAKE2b, so the score is stable across processes and runs
    (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8, key=replica.encode()[:64]).digest(), "big")


def rendezvous_home(key: bytes, replicas: Sequence[str]) -> str:
    return max(replicas, key=lambda r: rendezvous_weight(key, r))


def as_affinity(value: Any) -> Affinity | None:
    """The affinity a call carries, or None when it carries none or something else: the router
    must route every request, so a malformed value only costs the request its preference."""
    if value is None:
        return None
    try:
        grammar, tools = value
        tools = tuple(tools)
    except (TypeError, ValueError):
        return None
    if not (grammar is None or isinstance(grammar, bytes)) or not all(isinstance(t, bytes) for t in tools):
        return None
    if grammar is None and not tools:
        return None
    return grammar, tools


class KeyLedger:
    """Which keys this router sent to which replica: per replica the last `capacity` keys, most
    recently used last (what the replica's LRU caches most likely still hold)."""

    def __init__(self, capacity: int = DEFAULT_REMEMBERED_KEYS):
        if capacity < 1:
            raise ValueError(f"a ledger must remember at least one key per replica, got {capacity}")
        self.capacity = capacity
        self._held: dict[str, OrderedDict[bytes, None]] = {}

    def record(self, replica: str, affinity: Affinity) -> None:
        held = self._held.setdefault(replica, OrderedDict())
        grammar, tools = affinity
        keys = [_TOOL + t for t in tools]
        if grammar is not None:
            keys.append(_GRAMMAR + grammar)
        for k in keys:
            held[k] = None
            held.move_to_end(k)
        while len(held) > self.capacity:
            held.popitem(last=False)

    def holds_grammar(self, replica: str, grammar: bytes | None) -> bool:
        return grammar is not None and (_GRAMMAR + grammar) in self._held.get(replica, ())

    def tools_held(self, replica: str, tools: Iterable[bytes]) -> int:
        held = self._held.get(replica)
        return sum((_TOOL + t) in held for t in tools) if held else 0

    def keep_only(self, replicas: Iterable[str]) -> None:
        """Forget replicas that are gone (a new replica with a new id starts empty)."""
        live = set(replicas)
        for r in [r for r in self._held if r not in live]:
            del self._held[r]

    def __len__(self) -> int:
        return sum(len(h) for h in self._held.values())


def preference_tiers(affinity: Affinity, replicas: Sequence[str],
                     ledger: KeyLedger | None) -> tuple[list[list[str]], str]:
    """The replicas in tiers, most preferred first, and what ordered them ("learned": where this
    router sent the grammar or the tools; "home": the rendezvous homes). Replicas within a tier
    are equally good for this request's caches: load decides between them."""
    grammar, tools = affinity
    if ledger is not None:
        learned = {r: (ledger.holds_grammar(r, grammar), ledger.tools_held(r, tools)) for r in replicas}
        if any(held or n for held, n in learned.values()):
            return _tiers(replicas, learned), "learned"
    votes = Counter(rendezvous_home(t, replicas) for t in tools)
    placed = {r: (votes[r], rendezvous_weight(grammar, r) if grammar is not None else 0) for r in replicas}
    return _tiers(replicas, placed), "home"


def _tiers(replicas: Sequence[str], score: dict[str, Any]) -> list[list[str]]:
    out: list[list[str]] = []
    for r in sorted(replicas, key=lambda r: score[r], reverse=True):
        if out and score[out[-1][0]] == score[r]:
            out[-1].append(r)
        else:
            out.append([r])
    return out


def pick(tiers: list[list[str]], queue_lens: dict[str, int | None], capacity: dict[str, int],
         imbalance: int) -> str | None:
    """The first replica, tier by tier and shortest queue first within a tier, whose queue is at
    most `imbalance` longer than the shortest known one and not full; None when no queue length is
    known (the caller then lets Serve probe them all). A replica whose length is unknown is taken
    only when nothing known qualifies: the probe that follows finds its length."""
    known = [q for q in queue_lens.values() if q is not None]
    if not known:
        return None
    bound = min(known) + imbalance
    unknown = None
    for tier in tiers:
        for r in sorted(tier, key=lambda r: (queue_lens.get(r) is None, queue_lens.get(r) or 0)):
            q = queue_lens.get(r)
            if q is None:
                unknown = unknown or r
            elif q <= bound and q < capacity.get(r, q + 1):
                return r
    return unknown


class GrammarAffinityRouter(RequestRouter):
    """See the module note. Request router kwargs: `imbalance` (DEFAULT_IMBALANCE),
    `remembered_keys` per replica (DEFAULT_REMEMBERED_KEYS; 0: nothing learned, the rendezvous
    homes alone decide)."""

    def initialize_state(self, imbalance: int = DEFAULT_IMBALANCE,
                         remembered_keys: int = DEFAULT_REMEMBERED_KEYS, **unknown: Any) -> None:
        if unknown:
            raise TypeError(f"GrammarAffinityRouter takes imbalance and remembered_keys; got {sorted(unknown)}")
        if imbalance < 0:
            raise ValueError(f"imbalance must be at least 0, got {imbalance}")
        self.imbalance = int(imbalance)
        self.ledger = KeyLedger(remembered_keys) if remembered_keys > 0 else None
        #: How requests were placed: "learned" (where their grammar or tools went before), "home"
        #: (rendezvous), "spilled" (the preferred replicas were past the bound), "unkeyed" (no grammar).
        self.decisions: Counter[str] = Counter()

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        affinity = None
        if pending_request is not None:
            # back off between rounds when every chosen replica refuses (Serve retries at once otherwise)
            pending_request.routing_context.should_backoff = True
            affinity = as_affinity(pending_request.kwargs.get(AFFINITY_KWARG))
        if affinity is None or len(candidate_replicas) == 1:
            self.decisions["unkeyed"] += 1
            return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        tiers, basis = preference_tiers(affinity, list(by_id), self.ledger)
        queue_lens = await self._queue_lens(candidate_replicas)
        chosen = pick(tiers, queue_lens, {i: r.max_ongoing_requests for i, r in by_id.items()}, self.imbalance)
        if chosen is None:
            return [candidate_replicas]
        self.decisions["spilled" if chosen not in tiers[0] else basis] += 1
        rest = [r for i, r in by_id.items() if i != chosen]
        return [[by_id[chosen]], rest] if rest else [[by_id[chosen]]]

    async def _queue_lens(self, replicas: list[RunningReplica]) -> dict[str, int | None]:
        """Queue lengths from Serve's cache; the stale or missing ones probed, as Serve's routers
        do (without it a replica this router never sends to would stay unknown, and never be
        chosen over the preferred one)."""
        out: dict[str, int | None] = {}
        missing = []
        for r in replicas:
            q = self.replica_queue_len_cache.get(r.replica_id)
            if q is None:
                missing.append(r)
            else:
                out[r.replica_id.unique_id] = q
        if missing:
            for r, q in await self._probe_queue_lens(missing, 0):
                out[r.replica_id.unique_id] = q
        return out

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        if self.ledger is None:
            return
        affinity = as_affinity(pending_request.kwargs.get(AFFINITY_KWARG))
        if affinity is not None:
            self.ledger.record(replica_id.unique_id, affinity)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        if self.ledger is not None:
            self.ledger.keep_only(r.replica_id.unique_id for r in replicas)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        if self.ledger is not None:
            self.ledger.keep_only(r.unique_id for r in self._replica_id_set)


def router_config(imbalance: int = DEFAULT_IMBALANCE, remembered_keys: int = DEFAULT_REMEMBERED_KEYS) -> Any:
    """The "xg2-model" deployment's RequestRouterConfig for this router."""
    from ray.serve.config import RequestRouterConfig

    return RequestRouterConfig(request_router_class=GrammarAffinityRouter,
                               request_router_kwargs={"imbalance": imbalance, "remembered_keys": remembered_keys})
