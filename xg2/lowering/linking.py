"""Grammars assembled from modules lowered once: a root that chooses one of several modules.

Tenants send the same tools again and again in ever new combinations. Lowering a combination from
scratch costs milliseconds of Python per tool; a module (one lowered branch, kept by the compiler)
costs a few array copies to link. The linked grammar is the grammar `root ::= m1 | m2 | ...`:
its root calls each module's root and ends there, so each module sees exactly the context it would
see as a whole grammar (the text may end after it), its context-free tables are copied with offsets,
and its keys (hashing.py) are the ones any grammar of this shape gives it, so its mask entries come
from the pool.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .._ext.core import link_tables
from ..grammar.fsm import RuleFSM
from ..grammar.hashing import (
    UNSHARED,
    GrammarKeys,
    choice_key,
    context_key,
    grammar_keys,
    horizon_key,
    node_digests,
    retired_key,
)
from .tables import LoweredGrammar

#: The root of a linked grammar: node 0 calls every module (added by `link`) and goes to node 1,
#: which is final and reads nothing.
_END = RuleFSM([[], []], [[], []], {1})
#: Context keys of the linked root (nothing calls it) and of every module root (called from the
#: linked root, after which nothing follows).
ROOT_CTX = context_key(True, [])
MODULE_CTX = context_key(False, [(node_digests(_END, [])[1], ROOT_CTX)])
#: Contexts a module keeps its keys for (frames call it in ever other ones).
MAX_CONTEXTS = 4


@dataclass
class Module:
    """One lowered branch (a LoweredGrammar), with its keys as a module and what linking needs."""

    lowered: LoweredGrammar
    warnings: list = field(default_factory=list)
    _keys: GrammarKeys | None = None
    _tables: dict[str, np.ndarray] | None = None
    _nbytes: int | None = None
    _under: dict = field(default_factory=dict)      # root context -> keys (see keys_under)
    _rules: GrammarKeys | None = None               # the rule keys alone (contexts empty)
    from_tier: bool = False     # read from a second cache tier: its entries are likely there too

    @property
    def rule_keys(self) -> GrammarKeys:
        """Its rule keys and numberings, which do not depend on where it is called: computed once
        for `keys` and every `keys_under`."""
        if self._rules is None:
            low = self.lowered
            self._rules = grammar_keys(low.fsms, low.root, follows=low.follows, contexts=False)
        return self._rules

    @property
    def keys(self) -> GrammarKeys:
        if self._keys is None:
            low = self.lowered
            self._keys = grammar_keys(low.fsms, low.root, root_ctx=MODULE_CTX, follows=low.follows,
                                      rules=self.rule_keys)
        return self._keys

    def keys_under(self, root_ctx: bytes) -> GrammarKeys:
        """Its keys when its root is called in the context keyed `root_ctx` (in a frame)."""
        memo = self._under
        keys = memo.get(root_ctx)
        if keys is None:
            low = self.lowered
            keys = grammar_keys(low.fsms, low.root, root_ctx=root_ctx, follows=low.follows,
                                rules=self.rule_keys)
            if len(memo) >= MAX_CONTEXTS:
                memo.pop(next(iter(memo)))
            memo[root_ctx] = keys
        return keys

    @property
    def linkable(self) -> bool:
        """Whether its root is called from nowhere inside it (its context is then the root's)."""
        return not np.any(self.tables["re_rule"] == self.lowered.root)

    @property
    def nbytes(self) -> int:
        if self._nbytes is None:
            # tables, plus the automata kept for frames and the keys (Python objects, estimated)
            self._nbytes = int(sum(a.nbytes for a in self.lowered.arrays.values())) + self.lowered.python_bytes
        return self._nbytes

    @property
    def tables(self) -> dict[str, np.ndarray]:
        """The lowered arrays trimmed to their lengths, in the dtypes of the linked grammar; the
        callers' end per rule counts the linked root's call of the module root."""
        if self._tables is None:
            a = self.lowered.arrays
            n_be, n_re, n_ctx = int(a["be_start"][-1]), int(a["re_start"][-1]), int(a["ctx_start"][-1])
            n_rules = len(a["rule_start"])
            self._tables = {
                "node_rule": a["node_rule"].astype(np.int32), "node_final": a["node_final"].astype(np.uint8),
                "be_start": a["be_start"][:-1].astype(np.int32), "be_lo": a["be_lo"][:n_be].astype(np.uint8),
                "be_hi": a["be_hi"][:n_be].astype(np.uint8), "be_target": a["be_target"][:n_be].astype(np.int32),
                "re_start": a["re_start"][:-1].astype(np.int32), "re_rule": a["re_rule"][:n_re].astype(np.int32),
                "re_target": a["re_target"][:n_re].astype(np.int32), "rule_start": a["rule_start"].astype(np.int32),
                "rule_nullable": a["rule_nullable"].astype(np.uint8), "node_pure": a["node_pure"].astype(np.uint8),
                "rule_follow": a["rule_follow"].astype(np.uint8),
                "ctx_resume": a["ctx_resume"].astype(np.int32), "ctx_item": a["ctx_item"][:n_ctx].astype(np.uint64),
                "ctx_end": (a["ctx_start"][1:] + (np.arange(1, n_rules + 1) > self.lowered.root)).astype(np.int32),
                "ctx_root_start": a["ctx_start"][self.lowered.root: self.lowered.root + 1].astype(np.int64),
            }
        return self._tables


def link(modules: list[Module]):
    """The LoweredGrammar of `root ::= m1 | m2 | ...` (modules distinct, each linkable): the root is
    rule 0 with nodes 0 (calls every module root) and 1 (final); module tables follow, moved."""

    arrays = link_tables([m.tables for m in modules], [m.lowered.root for m in modules])
    module_keys = [m.keys for m in modules]
    callee = [b""] + [k for mk in module_keys for k in mk.rule]
    root_key = choice_key([callee[r] for r in arrays["re_rule"][: len(modules)]])
    keys = GrammarKeys([root_key] + callee[1:], [ROOT_CTX] + [k for mk in module_keys for k in mk.ctx],
                       [None] + [c for mk in module_keys for c in mk.canon])
    names = ["root"] + [n for m in modules for n in m.lowered.rule_names]
    return LoweredGrammar(names, None, 0, arrays, keys)


def _literal_after(fsm: RuleFSM, v: int) -> bytes:
    """The bytes every path from node `v` reads first (one byte edge of one byte, no call, not final)."""
    out = bytearray()
    seen = set()
    while v not in seen and v not in fsm.finals and not fsm.rule_edges[v] and len(fsm.byte_edges[v]) == 1:
        lo, hi, t = fsm.byte_edges[v][0]
        if lo != hi:
            break
        seen.add(v)
        out.append(lo)
        v = t
    return bytes(out)


def _module_context(frame, sites: list[tuple[int, int]], ctx: bytes, impassable) -> bytes:
    """The context a module is keyed under in a frame: when every call of its stub (`sites`:
    caller, resume node) is followed by one literal that no token reads past (`impassable`),
    nothing after the literal can change its entries and the key names the literal only, the same
    in every frame (a tool's entries then serve every request that offers it); else the stub's own
    context key in the frame (`ctx`)."""
    literals = {_literal_after(frame.fsms[p], v) for p, v in sites}
    if len(literals) == 1:
        (literal,) = literals
        if literal and impassable is not None and impassable(literal):
            return horizon_key(literal)
    return ctx


def _frame_keys(frame, stubs: dict[int, Module], impassable, gates: dict[int, bytes]) -> GrammarKeys:
    """The frame's keys, its stubs keyed as their modules' roots.

    `gates`: rules only ever called right after their literal (a trigger). Where no token reads
    past the literal, what the gate holds cannot change an entry of the rules around it, which are
    then keyed with the gate named by its literal: the text that dispatches to tool calls has the
    same keys, and so the same entries, whatever tools the gate leads to. The gates and all they
    call keep their own keys; the gates' entries stay out of the pool."""
    root_keys = {s: m.rule_keys.rule[m.lowered.root] for s, m in stubs.items()}
    shut = {g: horizon_key(b"gate\0" + lit) for g, lit in gates.items() if impassable is not None and impassable(lit)}
    own = grammar_keys(frame.fsms, frame.root, follows=frame.follows, fixed=root_keys, contexts=not shut)
    if not shut:
        return own
    around = grammar_keys(frame.fsms, frame.root, follows=frame.follows, fixed={**root_keys, **shut})
    inside = set(shut)
    work = list(shut)
    while work:
        for edges in frame.fsms[work.pop()].rule_edges:
            for r, _v in edges:
                if r not in inside:
                    inside.add(r)
                    work.append(r)
    return GrammarKeys([k if r in inside else around.rule[r] for r, k in enumerate(own.rule)],
                       [UNSHARED if r in shut else c for r, c in enumerate(around.ctx)],
                       [c if r in inside else around.canon[r] for r, c in enumerate(own.canon)])


def link_frame(frame, stubs: dict[int, Module], impassable=None, gates: dict[int, bytes] | None = None):
    """The LoweredGrammar of a frame (a lowered grammar whose stub rules stand for modules) with
    every call of a stub going to its module's root instead: the frame's tables first, the modules'
    after them, moved. A module root takes over its stub's callers (context items and resume
    nodes) and is keyed under its context in the frame (`_module_context`), its inner rules after
    it; the frame's keys are `_frame_keys`."""

    fa = frame.arrays
    fkeys = _frame_keys(frame, stubs, impassable, gates or {})
    n_rules, n_nodes = len(fa["rule_start"]), len(fa["node_rule"])
    counts = np.diff(fa["ctx_start"])
    remap = np.arange(n_rules, dtype=np.int32)
    rule_base, node_base = n_rules, n_nodes
    be_base, re_base = int(fa["be_start"][-1]), int(fa["re_start"][-1])
    cols = {k: [fa[k][:n]] for k, n in (("node_rule", n_nodes), ("node_final", n_nodes), ("node_pure", n_nodes),
                                        ("be_start", n_nodes), ("re_start", n_nodes), ("be_lo", be_base),
                                        ("be_hi", be_base), ("be_target", be_base), ("re_target", re_base),
                                        ("rule_start", n_rules), ("rule_nullable", n_rules), ("rule_follow", n_rules))}
    resume = [fa["ctx_resume"].reshape(n_rules, -1)]
    item_parts = [np.delete(fa["ctx_item"], np.concatenate([np.arange(fa["ctx_start"][s], fa["ctx_start"][s + 1])
                                                            for s in stubs] or [np.zeros(0, np.int64)]))]
    count_parts = [np.where(np.isin(np.arange(n_rules), list(stubs)), 0, counts)]
    re_rules = [fa["re_rule"]]
    names = list(frame.rule_names)
    key_rule, key_ctx, canon = list(fkeys.rule), list(fkeys.ctx), list(fkeys.canon)
    sites: dict[int, list[tuple[int, int]]] = {s: [] for s in stubs}
    for p, f in enumerate(frame.fsms):
        for edges in f.rule_edges:
            for r, v in edges:
                if r in sites:
                    sites[r].append((p, v))
    for s in stubs:     # a stub is no longer called: its entries must not pass for its module root's
        key_rule[s] = retired_key(key_rule[s])
    for s, m in stubs.items():
        a, low = m.lowered.arrays, m.lowered
        nr, nn = len(a["rule_start"]), len(a["node_rule"])
        nbe, nre = int(a["be_start"][-1]), int(a["re_start"][-1])
        remap[s] = rule_base + low.root
        for k, n, shift in (("node_rule", nn, rule_base), ("node_final", nn, 0), ("node_pure", nn, 0),
                            ("be_start", nn, be_base), ("re_start", nn, re_base), ("be_lo", nbe, 0), ("be_hi", nbe, 0),
                            ("be_target", nbe, node_base), ("re_target", nre, node_base), ("rule_start", nr, node_base),
                            ("rule_nullable", nr, 0), ("rule_follow", nr, 0)):
            cols[k].append(a[k][:n] + shift if shift else a[k][:n])
        re_rules.append(a["re_rule"][:nre] + rule_base)
        rows = a["ctx_resume"].reshape(nr, -1)
        rows = np.where(rows >= 0, rows + node_base, -1)
        rows[low.root] = resume[0][s]
        resume.append(rows)
        mc = np.diff(a["ctx_start"])
        start = int(a["ctx_start"][low.root])
        own = a["ctx_item"][: int(a["ctx_start"][-1])] + ((np.uint64(rule_base) << np.uint64(32)) + np.uint64(node_base))
        theirs = fa["ctx_item"][fa["ctx_start"][s]: fa["ctx_start"][s + 1]]
        item_parts.append(np.concatenate([own[:start], theirs, own[start:]]))
        mc = mc.copy()
        mc[low.root] += len(theirs)
        count_parts.append(mc)
        mk = m.keys_under(_module_context(frame, sites[s], fkeys.ctx[s], impassable))
        key_rule += mk.rule
        key_ctx += mk.ctx
        canon += mk.canon
        names += low.rule_names
        rule_base += nr
        node_base += nn
        be_base += nbe
        re_base += nre
    re_rule = np.concatenate(re_rules).astype(np.int32)
    re_rule[: len(fa["re_rule"])] = remap[fa["re_rule"]]
    arrays = {k: np.concatenate(v) for k, v in cols.items()}
    arrays["be_start"] = np.append(arrays["be_start"], be_base).astype(np.int32)
    arrays["re_start"] = np.append(arrays["re_start"], re_base).astype(np.int32)
    arrays["re_rule"] = re_rule
    arrays["ctx_item"] = np.concatenate(item_parts).astype(np.uint64)
    arrays["ctx_start"] = np.concatenate([[0], np.cumsum(np.concatenate(count_parts))]).astype(np.int32)
    arrays["ctx_resume"] = np.concatenate(resume).reshape(-1).astype(np.int32)
    for k in ("node_rule", "be_target", "re_target", "rule_start"):
        arrays[k] = arrays[k].astype(np.int32)
    return LoweredGrammar(names, None, frame.root, arrays, GrammarKeys(key_rule, key_ctx, canon))
