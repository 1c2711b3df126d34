"""IR to flat tables: per-rule byte automata, flattened (CSR) for the core, with the context
and follow tables the mask builder reads. The layer between the front-ends' IR and the Cython
core; the compiler and linking both stand on it, neither on the other."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..errors import GrammarError, GrammarLimitError
from ..grammar import budget
from ..grammar.fsm import (
    RuleFSM,
    byte_tables,
    fsm_nbytes,
    nullable_rules,
    productive_rules,
    prune,
    rule_automaton,
    strongly_connected,
)
from ..grammar.hashing import GrammarKeys, grammar_keys
from ..grammar.ir import MAX_TOKEN_SETS, Expr, GrammarIR, TokenSet, TokenSlot, Unbuildable, any_node
from ..grammar.optimize import inline_small_rules, map_leaves, tail_recursion_as_repetition
from ..grammar.repetition import compress_repetitions


@dataclass
class LoweredGrammar:
    rule_names: list[str]
    fsms: list[RuleFSM] | None          # None for linked grammars (their keys come with them)
    root: int
    arrays: dict[str, np.ndarray]
    _keys: GrammarKeys | None = None
    follows: dict[int, int] | None = None   # rule -> its declared follow rule, where the core uses it

    @property
    def keys(self) -> GrammarKeys:
        """Content keys of the rules and their contexts, computed on first use (only the entry
        pool needs them)."""
        if self._keys is None:
            self._keys = grammar_keys(self.fsms, self.root, follows=self.follows)
        return self._keys

    def core_keys(self) -> tuple[list[bytes], list[bytes], np.ndarray]:
        """(rule keys, context keys, per-node canonical numbers): what the core keys entries by."""
        keys = self.keys
        rule_start = self.arrays["rule_start"]
        node_canon = np.arange(self.n_nodes, dtype=np.int32) - rule_start[self.arrays["node_rule"]]
        for r, perm in enumerate(keys.canon):
            if perm is not None:
                node_canon[rule_start[r]: rule_start[r] + len(perm)] = perm
        return keys.rule, keys.ctx, node_canon

    @property
    def n_nodes(self) -> int:
        return len(self.arrays["node_rule"])

    @property
    def python_bytes(self) -> int:
        """What the automata and keys kept beside the tables hold as Python objects (estimated:
        see fsm_nbytes); a cache budget that counted the tables alone undercounted a tool-calling
        grammar about five times."""
        n = sum(fsm_nbytes(f) for f in self.fsms) if self.fsms is not None else 0
        if self._keys is not None:
            n += 2 * 90 * len(self._keys.rule)
            n += sum(64 + 40 * len(c) for c in self._keys.canon if c is not None)
        return n


#: Caller nodes per rule the mask builder follows as certain contexts (the core's MAX_RESUMES).
MAX_RESUMES = 4


def _all_resumes(fsms: list[RuleFSM], sites: list[list[tuple[int, int, int]]], root: int) -> list[set | None]:
    """Per rule, the caller nodes (rule, node) where its calls resume, looking through tail calls
    (a resume node that is final with no way on hands over to that rule's own callers); None when
    the root is among the callers seen through tail calls (the text may end there) or there are
    more than MAX_RESUMES. One pass over the tail-call graph's components, callers first: a walk
    up the chain per rule would be quadratic in a chain of thousands of tail-calling rules."""
    n = len(fsms)
    direct: list[set[tuple[int, int]] | None] = [set() for _ in range(n)]
    tail: list[list[int]] = [[] for _ in range(n)]      # rule -> rules it hands over to
    for r in range(n):
        for p, _u, v in sites[r]:
            f = fsms[p]
            if v in f.finals and not f.byte_edges[v] and not f.rule_edges[v]:
                tail[r].append(p)
            elif direct[r] is not None:
                direct[r].add((p, v))
                if len(direct[r]) > MAX_RESUMES:
                    direct[r] = None
    out: list[set | None] = [None] * n
    for comp in strongly_connected(n, tail):    # the rules a component hands over to come first
        acc: set[tuple[int, int]] | None = set()
        for r in comp:
            if r == root or direct[r] is None:
                acc = None
                break
            acc |= direct[r]
            for p in tail[r]:
                if p in comp:
                    continue
                if out[p] is None:
                    acc = None
                    break
                acc |= out[p]
            if acc is None or len(acc) > MAX_RESUMES:
                acc = None
                break
        for r in comp:
            out[r] = acc
    return out


def _first_unbuildable(e: Expr) -> Unbuildable | None:
    found: list[Unbuildable] = []

    def test(x: Expr) -> bool:
        if type(x) is Unbuildable:
            found.append(x)
            return True
        return False

    any_node(e, test)
    return found[0] if found else None


def _numbered_token_sets(ir: GrammarIR) -> tuple[GrammarIR, list[tuple[tuple[int, ...], bool]]]:
    """`ir` with each distinct TokenSet replaced by its TokenSlot (numbered in order of first
    use), and the sets by number. Most grammars have none and come back as they are."""
    marked = [r for r in ir.rules if any_node(r.body, lambda x: type(x) in (TokenSet, Unbuildable))]
    for r in marked:
        bad = _first_unbuildable(r.body)
        if bad is not None:
            raise GrammarError(f"Failed to build the automaton for rule {r.name}: {bad.message}", bad.line,
                               bad.column)
    if not marked:
        return ir, []
    slots: dict[TokenSet, TokenSlot] = {}

    def leaf(x: Expr) -> Expr:
        if type(x) is not TokenSet:
            return x
        if x not in slots:
            if len(slots) == MAX_TOKEN_SETS:
                raise GrammarLimitError(f"more than {MAX_TOKEN_SETS} distinct token sets in one grammar")
            slots[x] = TokenSlot(len(slots))
        return slots[x]

    rules = [replace(r, body=map_leaves(r.body, leaf),
                     lookahead=None if r.lookahead is None else map_leaves(r.lookahead, leaf)) for r in ir.rules]
    return GrammarIR(rules, ir.root), [(x.ids, x.exclude) for x in slots]


def lower(ir: GrammarIR, *, compress: bool = True, max_token_bytes: int | None = None,
          keep: frozenset[str] = frozenset()) -> LoweredGrammar:
    """Lower IR to per-rule automata and flatten them (CSR) for the core; `compress=False` keeps
    every repetition unrolled (the reference the compressed form must match). A rule's declared
    follow (`Rule.follow`) replaces its callers as the mask builder's certain context when it
    covers `max_token_bytes` elements: then no token can read past what the declaration promises.
    Rules in `keep` stay rules (not inlined), e.g. the stubs a frame links modules in for."""
    ir, token_sets = _numbered_token_sets(ir)
    ir = tail_recursion_as_repetition(ir)
    ir = inline_small_rules(compress_repetitions(ir) if compress else ir, keep)
    names = [r.name for r in ir.rules]
    index = {n: i for i, n in enumerate(names)}
    fsms = []
    for r in ir.rules:
        budget.check("rule automata")
        fsms.append(rule_automaton(r.body, index))
    live = productive_rules(fsms)
    root = index[ir.root]
    if root not in live:
        raise GrammarError(f"the root rule {ir.root!r} accepts no string")
    fsms = [prune(f, live) if r in live else RuleFSM([[]], [[]], set()) for r, f in enumerate(fsms)]
    nullable = nullable_rules(fsms)
    budget.check("rule automata")

    tables = [byte_tables(f) for f in fsms]
    sizes = np.array([f.n_nodes for f in fsms], np.int64)
    base = np.concatenate([[0], np.cumsum(sizes)])
    n_nodes = int(base[-1])
    if n_nodes >= 2**30:
        raise GrammarError("grammar too large")
    counts = np.concatenate([t[0] for t in tables])
    be_start = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    be_target = np.concatenate([t[3] + b for t, b in zip(tables, base[:-1])])
    node_rule = np.repeat(np.arange(len(fsms), dtype=np.int32), sizes)
    node_final = np.concatenate([t[4] for t in tables])
    re_count = np.zeros(n_nodes, np.int32)
    re_rule, re_target = [], []
    sites: list[list[tuple[int, int, int]]] = [[] for _ in fsms]  # per rule: (caller, node, resume node)
    for r, (f, t) in enumerate(zip(fsms, tables)):
        b = int(base[r])
        for u in t[6]:
            edges = f.rule_edges[u]
            re_count[b + u] = len(edges)
            for rr, v in edges:
                re_rule.append(rr)
                re_target.append(b + v)
                sites[rr].append((r, u, v))
    re_start = np.concatenate([[0], np.cumsum(re_count)]).astype(np.int32)

    # Context: for each rule, the caller items waiting on it; item origin = the caller's own rule,
    # whose static state set in the core's context parser holds that caller's callers.
    ctx_start = np.zeros(len(fsms) + 1, np.int32)
    ctx_item: list[int] = []
    for r in range(len(fsms)):
        ctx_item.extend(sorted((p << 32) | (int(base[p]) + u) for p, u, _v in sites[r]))
        ctx_start[r + 1] = len(ctx_item)
    budget.check("call sites")
    ctx_resume = np.full((len(fsms), MAX_RESUMES), -1, np.int32)
    for r, resumes in enumerate(_all_resumes(fsms, sites, root)):
        if resumes is not None and len(resumes) <= MAX_RESUMES:
            ctx_resume[r, : len(resumes)] = sorted(int(base[p]) + v for p, v in resumes)
    follows = {}
    for r, rule in enumerate(ir.rules):
        if rule.follow is not None and max_token_bytes is not None and rule.follow[1] >= max_token_bytes:
            follows[r] = index[rule.follow[0]]
            ctx_resume[r] = -1
            ctx_resume[r, 0] = base[follows[r]]

    # Nodes from which the rule is a plain deterministic automaton: no call is reachable.
    node_pure = np.concatenate([t[5] for t in tables])

    rule_start = base[:-1].astype(np.int32)
    arrays = {
        "node_rule": node_rule,
        "node_final": node_final,
        "be_start": be_start,
        "be_lo": np.concatenate([t[1] for t in tables]),
        "be_hi": np.concatenate([t[2] for t in tables]),
        "be_target": be_target.astype(np.int32),
        "re_start": re_start,
        "re_rule": np.array(re_rule, np.int32),
        "re_target": np.array(re_target, np.int32),
        "rule_start": rule_start,
        "rule_nullable": np.array([r in nullable for r in range(len(fsms))], np.uint8),
        "ctx_start": ctx_start,
        "ctx_item": np.array(ctx_item, np.uint64),
        "node_pure": node_pure,
        "ctx_resume": ctx_resume.reshape(-1),
        "rule_follow": np.array([r in follows for r in range(len(fsms))], np.uint8),
    }
    if token_sets:
        # Per TokenSlot, its set: ids (CSR) and whether it excludes them (see CompiledCore).
        arrays["token_set_start"] = np.concatenate([[0], np.cumsum([len(ids) for ids, _ in token_sets])]).astype(np.int32)
        arrays["token_set_ids"] = np.array([t for ids, _ in token_sets for t in ids], np.int32)
        arrays["token_set_exclude"] = np.array([exclude for _, exclude in token_sets], np.uint8)
    if any(rule.capture_trim or rule.hide_tail for rule in ir.rules):
        # Per rule, the marker bytes its own captures leave out, and those every enclosing capture
        # leaves out (GrammarMatcher.get_captures).
        arrays["rule_capture_trim"] = np.array([rule.capture_trim for rule in ir.rules], np.int32)
        arrays["rule_hide"] = np.array([rule.hide_tail for rule in ir.rules], np.int32)
    if any(rule.max_tokens is not None for rule in ir.rules):
        # Per rule, its token budget (-1: none); the matcher enforces it (MatcherCore._enforce_budgets).
        arrays["rule_max_tokens"] = np.array([-1 if rule.max_tokens is None else rule.max_tokens
                                              for rule in ir.rules], np.int32)
    if any(rule.capture is not None or rule.stop_capture is not None for rule in ir.rules):
        # Per rule, the number of its capture name (-1: none) and of its marker's; the names,
        # NUL-separated UTF-8.
        names = sorted({n for rule in ir.rules for n in (rule.capture, rule.stop_capture) if n is not None})
        arrays["rule_capture"] = np.array([-1 if rule.capture is None else names.index(rule.capture)
                                           for rule in ir.rules], np.int32)
        arrays["rule_stop_capture"] = np.array([-1 if rule.stop_capture is None else names.index(rule.stop_capture)
                                                for rule in ir.rules], np.int32)
        arrays["capture_names"] = np.frombuffer("\0".join(names).encode("utf-8"), np.uint8).copy()
    if any(rule.temperature is not None for rule in ir.rules):
        # Per rule, its `[temperature=...]` (NaN: none); only grammars that set one carry the table.
        arrays["rule_temperature"] = np.array([np.nan if rule.temperature is None else rule.temperature
                                               for rule in ir.rules], np.float64)
    return LoweredGrammar(names, fsms, root, arrays, follows=follows)


def byte_classes(arrays: dict[str, np.ndarray]) -> bytes:
    """Byte -> class: bytes that no byte edge of the grammar separates share a class."""
    starts = np.zeros(257, np.uint8)      # bytes where some edge's range starts or ends + 1
    starts[arrays["be_lo"]] = 1
    starts[arrays["be_hi"].astype(np.int32) + 1] = 1
    return np.cumsum(starts[:256], dtype=np.int32).astype(np.uint8).tobytes()
