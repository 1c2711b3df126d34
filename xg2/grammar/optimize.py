"""IR-level optimisations that pay for themselves in the core.

Inlining small reference-free rules into their callers turns Earley predictions and completions into
plain automaton edges: fewer items per state set, and the mask entry of the caller sees through the
inlined text, so fewer tokens are left uncertain.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from . import budget
from .ir import (
    EPSILON,
    MAX_TREE_STEPS,
    CharClass,
    Choice,
    Expr,
    FreeText,
    GrammarIR,
    Literal,
    Repeat,
    Rule,
    RuleRef,
    Seq,
    any_node,
    choice,
    seq,
)

#: Largest (weighted) expression size inlined into a caller.
INLINE_LIMIT = 40
#: Largest total size all the copies of an inlined rule may add up to; past it the rule stays shared
#: (copies multiply automaton building at compile time and mask entries in the core).
INLINE_TOTAL_LIMIT = 160


def _children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Seq):
        return e.items
    if isinstance(e, Choice):
        return e.alts
    if isinstance(e, Repeat):
        return (e.expr,)
    return ()


def expr_refs(e: Expr) -> set[str]:
    return set(_ref_sites(e))


def _ref_sites(e: Expr) -> list[str]:
    out: list[str] = []
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, RuleRef):
            out.append(x.name)
        stack.extend(_children(x))
    return out


def _ref_copies(e: Expr, into: dict[str, int]) -> list[str]:
    """The calls in `e` (one name per call site), adding to `into`, per rule, how many copies of it
    inlining into `e` would make: a call under `x{m,n}` counts n times (a block rule of a
    compressed repetition called as `B{40}` must stay a rule, or the compression is undone). One
    walk for both, with the node types tested inline: bodies are large and this runs on all. A
    body much larger as a tree than as a DAG (free text) is counted node by node of the DAG."""
    names: list[str] = []
    weights: list[int] = []
    stack: list[tuple[Expr, int]] = [(e, 1)]
    pop, push = stack.pop, stack.append
    steps = 0
    while stack:
        steps += 1
        if steps == MAX_TREE_STEPS:
            counts = _ref_counts_dag(e)
            for name, count in counts.items():
                into[name] = into.get(name, 0) + count
            return list(counts)     # each name once: callers use them as a set
        x, weight = pop()
        t = type(x)
        if t is Seq:
            for c in x.items:
                push((c, weight))
        elif t is Choice:
            for c in x.alts:
                push((c, weight))
        elif t is Repeat:
            push((x.expr, weight * max(1, x.max if x.max is not None else x.min + 1)))
        elif t is RuleRef:
            names.append(x.name)
            weights.append(weight)
    for name, weight in zip(names, weights):    # counted once the walk is known to be complete
        into[name] = into.get(name, 0) + weight
    return names


def _ref_counts_dag(e: Expr) -> dict[str, int]:
    """Per rule called in `e`, its weighted number of call sites (as _ref_copies counts them),
    post-order over the DAG with a memo by identity."""
    memo: dict[int, dict[str, int]] = {}
    stack: list[tuple[Expr, bool]] = [(e, False)]
    while stack:
        x, done = stack.pop()
        if id(x) in memo:
            continue
        t = type(x)
        if t is RuleRef:
            memo[id(x)] = {x.name: 1}
            continue
        kids = _children(x)
        if not done:
            stack.append((x, True))
            stack.extend((k, False) for k in kids if id(k) not in memo)
            continue
        factor = max(1, x.max if x.max is not None else x.min + 1) if t is Repeat else 1
        out: dict[str, int] = {}
        for k in kids:
            for name, count in memo[id(k)].items():
                out[name] = out.get(name, 0) + count * factor
        memo[id(x)] = out
    return memo[id(e)]



def _more_nodes_than(e: Expr, limit: int) -> bool:
    """Whether `e` has more than `limit` nodes (then its size is above `limit` too), stopping early:
    most rule bodies are far too big to inline, and sizing them in full is wasted work."""
    stack = [e]
    n = 0
    while stack:
        n += 1
        if n > limit:
            return True
        stack.extend(_children(stack.pop()))
    return False


def expr_size(e: Expr) -> int:
    """Size after repetition expansion, post-order with an explicit stack."""
    sizes: dict[int, int] = {}
    stack: list[tuple[Expr, bool]] = [(e, False)]
    while stack:
        x, done = stack.pop()
        if not done:
            stack.append((x, True))
            stack.extend((c, False) for c in _children(x))
            continue
        if isinstance(x, Literal):
            s = max(1, len(x.text))
        elif isinstance(x, CharClass):
            s = 1 + len(x.ranges)
        elif isinstance(x, FreeText):
            # a loop over free text, as below: one shared copy; its states count as written out
            s = 1 + INLINE_TOTAL_LIMIT + sum(map(len, (*x.ends, *x.excludes)))
        elif isinstance(x, Repeat):
            s = 1 + sizes[id(x.expr)] * max(1, x.max if x.max is not None else x.min + 1)
            if x.max is None and _wide(x.expr):
                # a loop over free text: its mask entries walk most of the vocabulary, so one shared
                # copy (one set of entries) beats a copy per caller
                s += INLINE_TOTAL_LIMIT
        else:
            s = 1 + sum(sizes[id(c)] for c in _children(x))
        sizes[id(x)] = s
    return sizes[id(e)]


def _wide(e: Expr) -> bool:
    """Whether `e` reads a character class of more than a few hundred code points."""
    stack = [e]
    while stack:
        x = stack.pop()
        if (isinstance(x, CharClass) and _class_width(x) > 256) or isinstance(x, FreeText):
            return True
        stack.extend(_children(x))
    return False


@functools.lru_cache(maxsize=4096)
def _class_width(c: CharClass) -> int:
    """Code points in a class (front-ends reuse the same few classes everywhere)."""
    return sum(hi - lo + 1 for lo, hi in c.codepoint_ranges())


def substitute(e: Expr, bodies: dict[str, Expr]) -> Expr:
    """Replace references to rules in `bodies` by their bodies."""
    return map_leaves(e, lambda x: bodies.get(x.name, x) if isinstance(x, RuleRef) else x)


def embedded(ir: GrammarIR, prefix: str) -> tuple[list[Rule], RuleRef]:
    """The rules of `ir` renamed under `prefix` (bodies, lookaheads and follow sets alike), and a
    reference to its root: one grammar placed inside another without name clashes."""
    renamed = {r.name: RuleRef(prefix + r.name) for r in ir.rules}
    rules = [Rule(prefix + r.name, substitute(r.body, renamed),
                  None if r.lookahead is None else substitute(r.lookahead, renamed),
                  None if r.follow is None else (prefix + r.follow[0], r.follow[1]), r.temperature, r.capture, r.max_tokens, r.capture_trim, r.hide_tail,
                  r.stop_capture)
             for r in ir.rules]
    return rules, renamed[ir.root]


def map_leaves(e: Expr, leaf: Callable[[Expr], Expr]) -> Expr:
    """`e` with every leaf (literal, class, rule reference) x replaced by leaf(x) (post-order, no
    recursion)."""
    out: dict[int, Expr] = {}
    stack: list[tuple[Expr, bool]] = [(e, False)]
    while stack:
        x, done = stack.pop()
        if not done:
            stack.append((x, True))
            stack.extend((c, False) for c in _children(x))
            continue
        # Untouched subtrees are kept as they are (no copy, and memos keyed by them still hit).
        if isinstance(x, (Seq, Choice)):
            kids = x.items if isinstance(x, Seq) else x.alts
            new = tuple(out[id(c)] for c in kids)
            if any(a is not b for a, b in zip(new, kids)):
                out[id(x)] = Seq(new) if isinstance(x, Seq) else Choice(new)
            else:
                out[id(x)] = x
        elif isinstance(x, Repeat):
            inner = out[id(x.expr)]
            out[id(x)] = x if inner is x.expr else Repeat(inner, x.min, x.max)
        else:
            out[id(x)] = leaf(x)
    return out[id(e)]


def tail_recursion_as_repetition(ir: GrammarIR) -> GrammarIR:
    """Rewrite each rule that calls itself only at the very end of its alternatives,
    ``A ::= x1 A | x2 A | b1 | b2``, as ``A ::= (x1 | x2)* (b1 | b2)`` (the same language, by Arden's
    rule). Hand-written grammars spell strings and lists this way (``s ::= "" | [^"] s``), and an
    Earley parser keeps one item per character read for every such call still open: accepting
    n characters costs O(n^2) and more, where the repetition is a loop in one automaton. Rules whose
    self-calls sit anywhere else, and rules with no alternative that ends the recursion, are left
    as they are."""
    out = []
    changed = False
    for r in ir.rules:
        # (a captured rule keeps its recursion: every level is an occurrence of its own)
        body = (_unrolled_tail(r.name, r.body) if r.capture is None and r.max_tokens is None and not r.hide_tail
                and r.stop_capture is None else None)
        if body is None:
            out.append(r)
        else:
            out.append(Rule(r.name, body, r.lookahead, r.follow, r.temperature, r.capture, r.max_tokens, r.capture_trim, r.hide_tail,
                  r.stop_capture))
            changed = True
    return GrammarIR(out, ir.root) if changed else ir


def _unrolled_tail(name: str, body: Expr) -> Expr | None:
    """The body of rule `name` as a repetition then its exits, or None if it is not tail-recursive
    in the form tail_recursion_as_repetition rewrites."""
    me = RuleRef(name)

    def calls_me(x: Expr) -> bool:
        return any_node(x, lambda n: n == me)

    loops: list[Expr] = []
    exits: list[Expr] = []
    for alt in body.alts if type(body) is Choice else (body,):
        items = alt.items if type(alt) is Seq else (alt,)
        if items[-1] == me:
            prefix = items[:-1]
            if not prefix or any(calls_me(x) for x in prefix):
                return None
            loops.append(seq(*prefix))
        elif calls_me(alt):
            return None
        else:
            exits.append(alt)
    if not loops or not exits:
        return None
    loop = choice(loops)
    tail = choice(exits)
    if loop is None or tail is None or loop == EPSILON:
        return None
    return seq(Repeat(loop, 0, None), tail)


def inline_small_rules(ir: GrammarIR, keep: frozenset[str] = frozenset()) -> GrammarIR:
    """Inline reference-free, non-recursive small rules (not those in `keep`); drop rules no longer
    reachable from root."""
    sites: dict[str, int] = {}
    refs = {r.name: _ref_copies(r.body, sites) for r in ir.rules}
    callers: dict[str, list[str]] = {}
    missing = {r.name: set(refs[r.name]) for r in ir.rules}
    for r in ir.rules:
        for name in missing[r.name]:
            callers.setdefault(name, []).append(r.name)
    rules = ir.rule_map()
    followed = {r.follow[0] for r in ir.rules if r.follow is not None}
    inlined: dict[str, Expr] = {}
    # Bottom-up: a rule becomes a candidate once every rule it references was inlined.
    ready = [r.name for r in ir.rules if not missing[r.name]]
    while ready:
        budget.check("inlining small rules")
        name = ready.pop()
        r = rules[name]
        if (name == ir.root or r.lookahead is not None or name in followed or name in keep
                or r.temperature is not None or r.capture is not None or r.max_tokens is not None
                or r.hide_tail or r.stop_capture is not None):
            continue
        body = substitute(r.body, inlined) if refs[name] else r.body
        if _more_nodes_than(body, INLINE_LIMIT):
            continue
        size = expr_size(body)
        if size > INLINE_LIMIT or size * sites.get(name, 0) > INLINE_TOTAL_LIMIT:
            continue
        inlined[name] = body
        for caller in callers.get(name, ()):
            waiting = missing[caller]
            if name in waiting:
                waiting.discard(name)
                if not waiting:
                    ready.append(caller)
    new_rules = []
    new_refs: dict[str, list[str]] = {}
    for r in ir.rules:
        if r.name in inlined:
            continue
        touched = any(n in inlined for n in refs[r.name])
        body = substitute(r.body, inlined) if touched else r.body
        la = substitute(r.lookahead, inlined) if r.lookahead is not None else None
        new_rules.append(Rule(r.name, body, la, r.follow, r.temperature, r.capture, r.max_tokens, r.capture_trim, r.hide_tail,
                  r.stop_capture))
        # inlined bodies call no rule, so the calls left are the ones not inlined
        new_refs[r.name] = [n for n in refs[r.name] if n not in inlined] + (_ref_sites(la) if la is not None else []) \
            + ([r.follow[0]] if r.follow is not None else [])
    return reachable(GrammarIR(new_rules, ir.root), new_refs)


def reachable(ir: GrammarIR, refs: dict[str, list[str]] | None = None) -> GrammarIR:
    """The rules reachable from the root (a rule's declared follow counts as a call); `refs`
    (the names each rule's body, lookahead and follow call) saves walking the bodies again when the caller has them."""
    rules = ir.rule_map()
    seen = {ir.root}
    work = [ir.root]
    while work:
        r = rules[work.pop()]
        if refs is not None:
            called = set(refs[r.name])
        else:
            called = expr_refs(r.body)
            if r.lookahead is not None:
                called |= expr_refs(r.lookahead)
            if r.follow is not None:
                called.add(r.follow[0])
        for name in called:
            if name not in seen:
                seen.add(name)
                work.append(name)
    return GrammarIR([r for r in ir.rules if r.name in seen], ir.root)
