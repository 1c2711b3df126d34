"""Stable content hashes of rule automata (XGrammar 2 §3.3, Alg. 1 and 2).

A mask entry depends only on the structure of the rule automaton it was built from (and the rules it
calls), never on rule names, so entries can be keyed by content and shared by every grammar with the
same sub-structure. Hashes use BLAKE2b-128 over a canonical serialisation: deterministic across
processes and machines, unlike Python's `hash()`.

Order of work: leaf automata first, then acyclic callers in topological order (a call edge is hashed
as the callee's hash), then each strongly connected component, whose internal calls are hashed as the
callee's position among the component's members sorted by their call-free ("shape") hash.
"""

from __future__ import annotations

import hashlib

from .fsm import RuleFSM, strongly_connected


def _digest(parts: list[bytes]) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        h.update(len(p).to_bytes(4, "little"))
        h.update(p)
    return h.digest()


def _serialize(fsm: RuleFSM, callee: dict[int, bytes]) -> list[bytes]:
    parts = [fsm.n_nodes.to_bytes(4, "little"), bytes(sorted(fsm.finals).__repr__(), "ascii")]
    for u in range(fsm.n_nodes):
        parts.append(b"B" + b"".join(bytes((lo, hi)) + v.to_bytes(4, "little") for lo, hi, v in fsm.byte_edges[u]))
        calls = sorted((callee[r], v) for r, v in fsm.rule_edges[u])
        parts.append(b"R" + b"".join(c + v.to_bytes(4, "little") for c, v in calls))
    return parts


def rule_hashes(fsms: list[RuleFSM]) -> list[str]:
    n = len(fsms)
    succ = [sorted({r for edges in f.rule_edges for r, _ in edges}) for f in fsms]
    done: dict[int, bytes] = {}
    for comp in strongly_connected(n, succ):
        members = set(comp)
        if len(comp) == 1 and comp[0] not in succ[comp[0]]:
            r = comp[0]
            done[r] = _digest(_serialize(fsms[r], done))
            continue
        marker = b"\x00" * 16
        shape = {r: _digest(_serialize(fsms[r], {**done, **{m: marker for m in members}})) for r in comp}
        order = sorted(comp, key=lambda r: shape[r])
        local = {r: b"@" + i.to_bytes(4, "little") + shape[r][:11] for i, r in enumerate(order)}
        group = _digest([shape[r] for r in order])
        for r in comp:
            done[r] = _digest([group] + _serialize(fsms[r], {**done, **local}))
    return [done[r].hex() for r in range(n)]
