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

from ._ext.core import link_tables
from .grammar.fsm import RuleFSM
from .grammar.hashing import GrammarKeys, choice_key, context_key, grammar_keys, node_digests

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

    arrays = link_tables([m.tables for m in modules], [m.lowered.root for m in modules])
    module_keys = [m.keys for m in modules]
    callee = [b""] + [k for mk in module_keys for k in mk.rule]
    root_key = choice_key([callee[r] for r in arrays["re_rule"][: len(modules)]])
    keys = GrammarKeys([root_key] + callee[1:], [ROOT_CTX] + [k for mk in module_keys for k in mk.ctx],
                       [None] + [c for mk in module_keys for c in mk.canon])
    names = ["root"] + [n for m in modules for n in m.lowered.rule_names]
    return LoweredGrammar(names, None, 0, arrays, keys)
