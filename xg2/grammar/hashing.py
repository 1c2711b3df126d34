"""Stable content keys of rule automata and of the contexts they are called from (XGrammar 2 §3.3,
Alg. 1 and 2).

A mask entry of a scannable node depends on three things only: the automaton of the node's rule
with everything it calls (parser A of the entry build), where the node sits in it, and what may
follow the rule wherever it is called (parsers B and C, the lookahead). None of them depends on
rule names or rule order, so entries are keyed by content and shared by every grammar with the same
sub-structure. The keys are BLAKE2b-128 digests of canonical serialisations: deterministic across
processes and machines, unlike Python's `hash()`.

Soundness rests on one property: equal keys mean equal structures, because a key hashes the whole
structure under one numbering (a collision of a 128-bit digest aside). Canonical numbering only
decides how often structures that are equal get equal keys.

Rule keys: leaf automata first, then callers in topological order (a call edge is hashed as the
callee's key), then each strongly connected component as a whole: its members are ordered by their
call-free ("shape") digests, calls inside it are written as the callee's position in that order, and
every member's key is the component's digest plus the member's position. Context keys: the same
over the reversed call graph, from the root down; a rule's context is the multiset of its call sites
(caller key, node of the call, node it resumes at, the caller's own context) and whether it is the
root.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass

import numpy as np

from .._ext.automata import node_digests as _c_node_digests
from . import budget
from .fsm import RuleFSM, byte_tables, strongly_connected

_MARK = b"\xff" * 16
#: Callers with more nodes than this name their call sites by their own key and the resume node
#: rather than by a digest of what follows (a digest per node of a 3,000-node unrolled string
#: costs more than the rest of its compilation).
MAX_DIGESTED_CALLER = 256
#: Cycles of up to this many nodes get one walk per node (each node's digest independent of where
#: the rule enters the cycle); larger ones one walk in all, to stay linear.
MAX_CYCLE_WALKS = 16


@dataclass
class GrammarKeys:
    rule: list[bytes]                 # per rule: 16-byte key of its automaton and all it calls
    ctx: list[bytes]                  # per rule: 16-byte key of what may follow it (or UNSHARED)
    canon: list[list[int] | None]     # per rule: node -> canonical node (None: the identity)


#: The context key of a rule whose entries no other grammar can use (a structural tag's gate, whose
#: automaton is the request's set of tags): they stay in its grammar, out of the pool.
UNSHARED = bytes(16)


def _digest(*parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        h.update(len(p).to_bytes(4, "little"))
        h.update(p)
    return h.digest()


def _canon(fsm: RuleFSM, key: list[bytes]) -> list[int] | None:
    """Breadth-first numbering with byte edges before calls and calls ordered by callee key.

    Automata are already numbered breadth-first with calls ordered by callee index; the two agree
    unless a node calls into more than one target, so the renumbering is done only then."""
    if all(len({v for _r, v in fsm.rule_edges[u]}) <= 1 for u in byte_tables(fsm)[6]):
        return None
    num = {0: 0}
    order = [0]
    i = 0
    while i < len(order):
        u = order[i]
        i += 1
        for _lo, _hi, v in fsm.byte_edges[u]:
            if v not in num:
                num[v] = len(order)
                order.append(v)
        for _k, v in sorted((key[r], v) for r, v in fsm.rule_edges[u]):
            if v not in num:
                num[v] = len(order)
                order.append(v)
    for u in range(fsm.n_nodes):  # unreachable nodes (none after pruning) keep their order
        if u not in num:
            num[u] = len(order)
            order.append(u)
    return [num[u] for u in range(fsm.n_nodes)]


def _serialize(fsm: RuleFSM, key: list[bytes], perm: list[int] | None) -> bytes:
    if perm is None:    # the call-free part is digested once per automaton (byte_tables)
        tables = byte_tables(fsm)
        calls = [(u, sorted((key[r], v) for r, v in fsm.rule_edges[u])) for u in tables[6]]
        return repr((tables[7], fsm.n_nodes, calls)).encode()
    inv = sorted(range(fsm.n_nodes), key=perm.__getitem__)
    byte_edges = [[(lo, hi, perm[v]) for lo, hi, v in fsm.byte_edges[u]] for u in inv]
    rules = [sorted((key[r], perm[v]) for r, v in fsm.rule_edges[u]) for u in inv]
    finals = sorted(perm[u] for u in fsm.finals)
    return repr((fsm.deterministic, finals, byte_edges, rules)).encode()


def _component_keys(comp: list[int], done: list[bytes | None], serialize) -> None:
    """Keys of one strongly connected component (Alg. 2, made exact): `serialize(r, key)` writes
    member r with `key` naming every rule; members' shapes use a marker for calls inside."""
    members = set(comp)
    shape_key = [_MARK if r in members else k for r, k in enumerate(done)]
    shape = {r: _digest(serialize(r, shape_key)) for r in comp}
    order = sorted(comp, key=lambda r: (shape[r], r))
    local = list(shape_key)
    for i, r in enumerate(order):
        local[r] = b"@" + i.to_bytes(4, "little") + shape[r][:11]
    whole = _digest(*(serialize(r, local) for r in order))
    for i, r in enumerate(order):
        done[r] = _digest(whole, i.to_bytes(4, "little"))


def _keys_in_order(n: int, succ: list[list[int]], serialize, fixed: dict[int, bytes] | None = None) -> list[bytes]:
    done: list[bytes | None] = [None] * n
    for r, k in (fixed or {}).items():
        done[r] = k
    for comp in strongly_connected(n, succ):
        budget.check("content keys")
        r = comp[0]
        if done[r] is not None and len(comp) == 1:
            continue
        if len(comp) == 1 and r not in succ[r]:
            done[r] = _digest(serialize(r, done))
        else:
            _component_keys(comp, done, serialize)
    return done  # type: ignore[return-value]


def _cycle_digest(fsm: RuleFSM, key: list[bytes], start: int, members: set[int], dig: list[bytes],
                  order: list[int] | None = None) -> bytes:
    """The cycle's nodes numbered breadth-first from `start` (or in the given order) and written
    out, exits named by their digests."""
    if order is None:
        num = {start: 0}
        order = [start]
        i = 0
        while i < len(order):
            u = order[i]
            i += 1
            calls = [v for _k, v in sorted((key[r], v) for r, v in fsm.rule_edges[u])]
            for v in [v for *_, v in fsm.byte_edges[u]] + calls:
                if v in members and v not in num:
                    num[v] = len(order)
                    order.append(v)
    else:
        num = {u: i for i, u in enumerate(order)}

    def name(v: int) -> str:
        return repr(num[v] if v in members else dig[v])

    return _digest(repr([(u in fsm.finals, [(lo, hi, name(v)) for lo, hi, v in fsm.byte_edges[u]],
                          sorted((key[r], name(v)) for r, v in fsm.rule_edges[u])) for u in order]).encode())


def _node_digests(fsm: RuleFSM, key: list[bytes]) -> list[bytes]:
    """Per node: a digest of what the rule reads from that node on (the sub-automaton it reaches,
    calls named by callee key). Nodes outside cycles get a Merkle digest of their edges and their
    targets' digests (in C: automata.node_digests); a node on a cycle gets the serialisation of
    its cycle, numbered breadth-first from it, with exits named by digest (quadratic in the cycle's
    size, which is small in practice)."""
    def cycle(comp: list[int], dig: list[bytes]) -> None:
        members = set(comp)
        if len(comp) > MAX_CYCLE_WALKS:     # one walk for the whole cycle, members by node order
            whole = _cycle_digest(fsm, key, min(comp), members, dig, sorted(comp))
            for i, u in enumerate(sorted(comp)):
                dig[u] = _digest(whole, i.to_bytes(4, "little"))
            return
        for start in comp:
            dig[start] = _cycle_digest(fsm, key, start, members, dig)

    counts, lo, hi, target, final = byte_tables(fsm)[:5]
    return _c_node_digests(counts, lo, hi, target, final, fsm.rule_edges, key, cycle)


def _edgeless_digest(final: bool) -> bytes:
    """What _node_digests gives a node without edges."""
    return _c_node_digests(np.zeros(1, np.int32), np.zeros(0, np.uint8), np.zeros(0, np.uint8),
                        np.zeros(0, np.int32), np.array([final], np.uint8), ((),), [], None)[0]


_END_DIGEST = _edgeless_digest(True)
_DEAD_DIGEST = _edgeless_digest(False)


def grammar_keys(fsms: list[RuleFSM], root: int, *, root_ctx: bytes | None = None,
                 follows: dict[int, int] | None = None, fixed: dict[int, bytes] | None = None,
                 contexts: bool = True, rules: GrammarKeys | None = None) -> GrammarKeys:
    """Keys of every rule.

    A call site is named by what the caller reads after the call (a digest of the rest of its
    automaton), so that a sub-structure called the same way under different roots gets the same
    context key; callers of more than MAX_DIGESTED_CALLER nodes name it by their key and the resume
    node instead (either form is exact; they only differ in what they share). `root_ctx` makes the grammar a module called from a bigger one (see linking.py):
    it is the context key of the root, which no rule of the module may call. Modules are linked
    under roots of one shape only, so there a call site is named by the caller's key and the node
    it resumes at, which costs nothing to compute. A rule with a declared follow in use
    (`follows`, see repetition.py) has it in its context key: its entries accept by it. `fixed`:
    rule keys given (a frame's stubs carry the keys of the modules linked in for them). `contexts=False`
    leaves the context keys out (empty); `rules`: the rule keys and numberings already computed
    (by a call with `contexts=False` and the same `fixed`), so that only the contexts are (a
    module is keyed under each context a frame calls it in)."""
    n = len(fsms)
    callees = [sorted({r for edges in f.rule_edges for r, _ in edges}) for f in fsms]
    canon: list[list[int] | None] = [None] * n

    def rule_part(r: int, key: list[bytes]) -> bytes:
        # Entries are keyed by the numbering of the last serialisation of a rule, the one its key
        # is made of (for a cycle member: under the positions in its component).
        fsm = fsms[r]
        memo_key = _memo_key(fsm, key, b"rule")
        known = _memo_get(fsm, memo_key)
        if known is not None:
            canon[r], part = known
            return part
        canon[r] = _canon(fsm, key)
        part = _digest(_serialize(fsm, key, canon[r]))      # a digest: what the memo keeps
        if memo_key is not None:
            _remember(fsm, memo_key, (None if canon[r] is None else tuple(canon[r]), part))
        return part

    if rules is not None:
        rule, canon = rules.rule, rules.canon
    else:
        rule = _keys_in_order(n, callees, rule_part, fixed)
    if not contexts:
        return GrammarKeys(rule, [], canon)

    follow: dict[int, list[bytes]] = {}
    sites: list[set[tuple[int, int]]] = [set() for _ in range(n)]
    for p, f in enumerate(fsms):
        for edges in f.rule_edges:
            for r, v in edges:
                sites[r].add((p, v))
    callers = [sorted({p for p, _v in s}) for s in sites]

    def ctx_part(r: int, key: list[bytes]) -> bytes:
        seen = set()
        for p, v in sites[r]:
            f = fsms[p]
            if root_ctx is not None or f.n_nodes > MAX_DIGESTED_CALLER:
                seen.add((rule[p] + (v if canon[p] is None else canon[p][v]).to_bytes(4, "little"), key[p]))
                continue
            if not f.byte_edges[v] and not f.rule_edges[v]:
                # A tail call (or a dead end): the digest _node_digests gives a node without edges,
                # without digesting the caller (a chain of thousands of tail calls digests none).
                seen.add((_END_DIGEST if v in f.finals else _DEAD_DIGEST, key[p]))
                continue
            if p not in follow:
                memo_key = _memo_key(fsms[p], rule, b"nodes")
                follow[p] = _memo_get(fsms[p], memo_key)
                if follow[p] is None:
                    follow[p] = _node_digests(fsms[p], rule)
                    if memo_key is not None:
                        _remember(fsms[p], memo_key, tuple(follow[p]))
            seen.add((follow[p][v], key[p]))
        if follows and r in follows:
            seen.add((b"follow", rule[follows[r]]))
        return repr((r == root, sorted(seen))).encode()   # see context_key

    if root_ctx is not None and sites[root]:
        raise ValueError("a module's root must not be called from inside the module")
    ctx = _keys_in_order(n, callers, ctx_part, None if root_ctx is None else {root: root_ctx})
    return GrammarKeys(rule, ctx, canon)


#: Keys remembered per memoised automaton (one per set of callee keys it was seen with).
MAX_KEYS_PER_AUTOMATON = 16


def _memo_key(fsm: RuleFSM, key: list[bytes], kind: bytes) -> tuple | None:
    """What a memoised automaton's key parts depend on besides itself: its callees' keys."""
    if fsm.keys_memo is None:
        return None
    return (kind, *(key[r] for r in fsm.callees))


#: Memoised automata are shared by every grammar, and grammars are compiled on many threads: the
#: memo dicts are changed under this lock (a read is one dict lookup, atomic under the GIL).
_MEMO_LOCK = threading.Lock()


def _memo_get(fsm: RuleFSM, memo_key: tuple | None):
    memo = fsm.keys_memo
    return None if memo is None or memo_key is None else memo.get(memo_key)


def _remember(fsm: RuleFSM, memo_key: tuple, value) -> None:
    memo = fsm.keys_memo
    with _MEMO_LOCK:
        if len(memo) >= MAX_KEYS_PER_AUTOMATON:
            del memo[next(iter(memo))]
        memo[memo_key] = value


def context_key(is_root: bool, sites: list[tuple[bytes, bytes]]) -> bytes:
    """The context key of a rule called at `sites`: (digest of what the caller reads after the
    call, the caller's context key) pairs; the same formula `grammar_keys` applies."""
    return _digest(repr((is_root, sorted(set(sites)))).encode())


def horizon_key(literal: bytes) -> bytes:
    """The context key of a rule after which `literal` always comes and no token reads past it:
    what follows the literal cannot change a mask entry of the rule (see linking.link_frame)."""
    return _digest(b"horizon", literal)


def retired_key(key: bytes) -> bytes:
    """A key derived from `key` that no live rule has (for a rule left in tables but never called)."""
    return _digest(b"retired", key)


def choice_key(callees: list[bytes]) -> bytes:
    """The key of a rule that calls one of the rules keyed `callees` and ends (a linked root):
    the same for the same rules in any order, as its masks are."""
    return _digest(b"choice", *sorted(callees))


def node_digests(fsm: RuleFSM, key: list[bytes]) -> list[bytes]:
    return _node_digests(fsm, key)


def rule_hashes(fsms: list[RuleFSM]) -> list[str]:
    """Hex content keys of the rules (what `CompiledGrammar.rule_hashes` reports)."""
    return [k.hex() for k in grammar_keys(fsms, 0).rule]
