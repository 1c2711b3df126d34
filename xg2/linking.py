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
    _tables: dict[str, np.ndarray] | None = None
    _nbytes: int | None = None

    @property
    def keys(self) -> GrammarKeys:
        if self._keys is None:
            low = self.lowered
            self._keys = grammar_keys(low.fsms, low.root, root_ctx=MODULE_CTX, follows=low.follows)
        return self._keys

    @property
    def linkable(self) -> bool:
        """Whether its root is called from nowhere inside it (its context is then the root's)."""
        return not np.any(self.tables["re_rule"] == self.lowered.root)

    @property
    def nbytes(self) -> int:
        if self._nbytes is None:
            self._nbytes = int(sum(a.nbytes for a in self.lowered.arrays.values()))
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
    from .compiler import LoweredGrammar

    tabs = [m.tables for m in modules]
    n_nodes = np.array([len(t["node_rule"]) for t in tabs], np.int64)
    n_rules = np.array([len(t["rule_start"]) for t in tabs], np.int64)
    n_be = np.array([len(t["be_lo"]) for t in tabs], np.int64)
    n_re = np.array([len(t["re_rule"]) for t in tabs], np.int64)
    n_ctx = np.array([len(t["ctx_item"]) for t in tabs], np.int64)
    rule_base = 1 + np.cumsum(n_rules) - n_rules
    node_base = 2 + np.cumsum(n_nodes) - n_nodes
    roots = rule_base + np.array([m.lowered.root for m in modules], np.int64)
    be_base = np.cumsum(n_be) - n_be
    re_base = len(modules) + np.cumsum(n_re) - n_re
    ctx_base = np.cumsum(n_ctx) - n_ctx

    def cat(name: str, prefix, shift=None, counts=None, dtype=np.int32):
        parts = np.concatenate([t[name] for t in tabs])
        if shift is not None:
            parts = parts + np.repeat(shift, counts).astype(parts.dtype)
        return np.concatenate([np.asarray(prefix, dtype), parts.astype(dtype, copy=False)])

    ctx_resume = np.concatenate([t["ctx_resume"] for t in tabs])
    ctx_resume = np.where(ctx_resume >= 0, ctx_resume + np.repeat(node_base, 4 * n_rules), -1)
    items = cat("ctx_item", [], (rule_base << 32) + node_base, n_ctx, np.uint64)
    firsts = np.array([t["ctx_root_start"][0] for t in tabs], np.int64)
    arrays = {
        "node_rule": cat("node_rule", [0, 0], rule_base, n_nodes),
        "node_final": cat("node_final", [0, 1], dtype=np.uint8),
        "be_start": np.concatenate([cat("be_start", [0, 0], be_base, n_nodes), [int(n_be.sum())]]).astype(np.int32),
        "be_lo": cat("be_lo", [], dtype=np.uint8),
        "be_hi": cat("be_hi", [], dtype=np.uint8),
        "be_target": cat("be_target", [], node_base, n_be),
        "re_start": np.concatenate([cat("re_start", [0, len(modules)], re_base, n_nodes),
                                    [len(modules) + int(n_re.sum())]]).astype(np.int32),
        "re_rule": cat("re_rule", roots, rule_base, n_re),
        "re_target": cat("re_target", [1] * len(modules), node_base, n_re),
        "rule_start": cat("rule_start", [0], node_base, n_rules),
        "rule_nullable": cat("rule_nullable", [any(t["rule_nullable"][m.lowered.root] for t, m in zip(tabs, modules))],
                             dtype=np.uint8),
        "node_pure": cat("node_pure", [0, 1], dtype=np.uint8),
        "rule_follow": cat("rule_follow", [0], dtype=np.uint8),
        "ctx_resume": np.concatenate([[-1] * 4, ctx_resume]).astype(np.int32),
        # Callers per rule: none for the root; a module root also has the root's node 0 (item 0,
        # inserted first among its callers).
        "ctx_start": cat("ctx_end", [0, 0], ctx_base + np.arange(len(modules)), n_rules),
        "ctx_item": np.insert(items, ctx_base + firsts, np.uint64(0)),
    }
    module_keys = [m.keys for m in modules]
    callee = [b""] + [k for mk in module_keys for k in mk.rule]
    root_key, _ = fsm_key(RuleFSM([[], []], [[(int(r), 1) for r in roots], []], {1}), callee)
    keys = GrammarKeys([root_key] + callee[1:], [ROOT_CTX] + [k for mk in module_keys for k in mk.ctx],
                       [None] + [c for mk in module_keys for c in mk.canon])
    names = ["root"] + [n for m in modules for n in m.lowered.rule_names]
    return LoweredGrammar(names, None, 0, arrays, keys)
