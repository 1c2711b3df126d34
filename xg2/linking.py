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

from .grammar.fsm import RuleFSM
from .grammar.hashing import GrammarKeys, context_key, fsm_key, grammar_keys, node_digests

#: The root of a linked grammar: node 0 calls every module (added by `link`) and goes to node 1,
#: which is final and reads nothing.
_END = RuleFSM([[], []], [[], []], {1})
#: Context keys of the linked root (nothing calls it) and of every module root (called from the
#: linked root, after which nothing follows).
ROOT_CTX = context_key(True, [])
MODULE_CTX = context_key(False, [(node_digests(_END, [])[1], ROOT_CTX)])


@dataclass
class Module:
    """One lowered branch (a LoweredGrammar), with its keys as a module and what linking needs."""

    lowered: object                    # LoweredGrammar (not imported: compiler.py imports this module)
    warnings: list = field(default_factory=list)
    _keys: GrammarKeys | None = None

    @property
    def keys(self) -> GrammarKeys:
        if self._keys is None:
            low = self.lowered
            self._keys = grammar_keys(low.fsms, low.root, root_ctx=MODULE_CTX)
        return self._keys

    @property
    def linkable(self) -> bool:
        """Whether its root is called from nowhere inside it (its context is then the root's)."""
        arrays = self.lowered.arrays
        return not np.any(arrays["re_rule"][: arrays["re_start"][-1]] == self.lowered.root)

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in self.lowered.arrays.values()))


def link(modules: list[Module]):
    """The LoweredGrammar of `root ::= m1 | m2 | ...` (modules distinct, each linkable)."""
    from .compiler import LoweredGrammar

    rule_base = [1]
    node_base = [2]
    for m in modules:
        rule_base.append(rule_base[-1] + len(m.lowered.arrays["rule_start"]))
        node_base.append(node_base[-1] + m.lowered.n_nodes)
    roots = [rule_base[i] + m.lowered.root for i, m in enumerate(modules)]

    def cat(parts, dtype):
        return np.concatenate([np.asarray(p, dtype=dtype) for p in parts])

    arrs = [m.lowered.arrays for m in modules]
    be_base = np.cumsum([0] + [int(a["be_start"][-1]) for a in arrs])
    re_base = np.cumsum([len(roots)] + [int(a["re_start"][-1]) for a in arrs])
    ctx_base = np.cumsum([0] + [int(a["ctx_start"][-1]) for a in arrs])

    arrays = {
        "node_rule": cat([[0, 0]] + [a["node_rule"] + rb for a, rb in zip(arrs, rule_base)], np.int32),
        "node_final": cat([[0, 1]] + [a["node_final"] for a in arrs], np.uint8),
        "be_start": cat([[0, 0]] + [a["be_start"][:-1] + b for a, b in zip(arrs, be_base)]
                        + [[be_base[-1]]], np.int32),
        "be_lo": cat([a["be_lo"][: a["be_start"][-1]] for a in arrs], np.uint8),
        "be_hi": cat([a["be_hi"][: a["be_start"][-1]] for a in arrs], np.uint8),
        "be_target": cat([a["be_target"][: a["be_start"][-1]] + nb for a, nb in zip(arrs, node_base)],
                         np.int32),
        "re_start": cat([[0, len(roots)]] + [a["re_start"][:-1] + b for a, b in zip(arrs, re_base)]
                        + [[re_base[-1]]], np.int32),
        "re_rule": cat([roots] + [a["re_rule"][: a["re_start"][-1]] + rb for a, rb in zip(arrs, rule_base)],
                       np.int32),
        "re_target": cat([[1] * len(roots)] + [a["re_target"][: a["re_start"][-1]] + nb
                                                            for a, nb in zip(arrs, node_base)], np.int32),
        "rule_start": cat([[0]] + [a["rule_start"] + nb for a, nb in zip(arrs, node_base)], np.int32),
        "rule_nullable": cat([[any(a["rule_nullable"][m.lowered.root] for a, m in zip(arrs, modules))]]
                             + [a["rule_nullable"] for a in arrs], np.uint8),
        "node_pure": cat([[0, 1]] + [a["node_pure"] for a in arrs], np.uint8),
        "ctx_resume": cat([[-1] * 4] + [np.where(a["ctx_resume"] >= 0, a["ctx_resume"] + nb, -1)
                                                       for a, nb in zip(arrs, node_base)], np.int32),
    }
    # Callers per rule: the linked root has none; a module root has the root's node 0 (item 0,
    # which sorts first); the others keep theirs, moved by the offsets.
    ctx_start = [np.zeros(2, np.int64)]
    ctx_item = []
    for i, (a, m) in enumerate(zip(arrs, modules)):
        starts = a["ctx_start"].astype(np.int64)
        shift = np.where(np.arange(len(starts)) > m.lowered.root, 1, 0)
        ctx_start.append(starts[1:] + ctx_base[i] + i + shift[1:])   # i: items added before
        items = a["ctx_item"][: starts[-1]].astype(np.uint64)
        items = items + np.uint64((rule_base[i] << 32) + node_base[i])
        r0 = starts[m.lowered.root]
        ctx_item += [items[:r0], np.zeros(1, np.uint64), items[r0:]]
    arrays["ctx_start"] = np.concatenate(ctx_start).astype(np.int32)
    arrays["ctx_item"] = np.concatenate(ctx_item) if ctx_item else np.zeros(0, np.uint64)

    module_keys = [m.keys for m in modules]
    root_key, _ = fsm_key(RuleFSM([[], []], [[(r, 1) for r in roots], []], {1}),
                          _key_list(rule_base, module_keys))
    keys = GrammarKeys([root_key] + [k for mk in module_keys for k in mk.rule],
                       [ROOT_CTX] + [k for mk in module_keys for k in mk.ctx],
                       [None] + [c for mk in module_keys for c in mk.canon])
    names = ["root"] + [f"m{i}.{n}" for i, m in enumerate(modules) for n in m.lowered.rule_names]
    return LoweredGrammar(names, None, 0, arrays, keys)


def _key_list(rule_base: list[int], module_keys: list[GrammarKeys]) -> list[bytes]:
    out = [b""]
    for mk in module_keys:
        out += mk.rule
    return out
