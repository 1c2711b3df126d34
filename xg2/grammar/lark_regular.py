"""Regular languages the Lark front-end builds beyond plain expressions: the structured
``%regex {"substring_...": ...}`` directive and rules ending at a marker (``[suffix=...]`` /
``[stop=...]``).

A rule ``r[stop=M]: BODY`` (or ``suffix=M``) matches BODY followed by the marker M and commits
at the first point where that is complete: its text is the shortest prefix of the input in
L(BODY)·L(M). Both are regular (BODY must be terminal-like), so the committed language, the words
of L(BODY)·L(M) none of whose proper prefixes is in it, is regular too: the automaton of
L(BODY)·L(M) with the edges out of its accepting states removed. It is written back as
right-linear rules (one per state), which is how xg2 already writes key languages
(:mod:`xg2.grammar.regular`). ``suffix`` and ``stop`` differ only in what a capture records, and
xg2 records no captures, so the two lower alike.
"""

from __future__ import annotations

from collections.abc import Callable

from .ir import EPSILON, CharClass, Choice, Expr, Literal, Repeat, Rule, RuleRef, Seq
from .optimize import _children
from .regular import MAX_CODEPOINT, KeyDFA, from_expr, to_rules

__all__ = ["MAX_MARKER_EXPR", "committed_rules", "expr_size", "substring_rules"]

#: Largest expression (counted as a tree, shared parts once per use) turned into a marker automaton.
MAX_MARKER_EXPR = 200_000


def expr_size(e: Expr, cap: int) -> int:
    """The tree size of `e` (a DAG may share nodes), counted up to `cap` without recursion."""
    sizes: dict[int, int] = {}
    stack: list[tuple[Expr, bool]] = [(e, False)]
    while stack:
        x, done = stack.pop()
        if id(x) in sizes:
            continue
        kids = _children(x)
        if not done and kids:
            stack.append((x, True))
            stack.extend((c, False) for c in kids if id(c) not in sizes)
            continue
        sizes[id(x)] = min(cap + 1, 1 + sum(sizes[id(c)] for c in kids))
    return sizes[id(e)]


def committed_rules(body: Expr, marker: Expr, fresh: Callable[[str], str], base: str,
                    rules: list[Rule]) -> Expr | None:
    """The committed language of `body` then `marker` (both rule-free), as rules appended to
    `rules`; its root expression, or None when the language is empty."""
    d = from_expr(Seq((body, marker)))
    dead = len(d.moves)
    sink = ((0, MAX_CODEPOINT, dead),)
    moves = tuple(sink if s in d.finals else row for s, row in enumerate(d.moves)) + (sink,)
    return to_rules(KeyDFA(moves, d.finals), lambda cc: _spelled(cc), lambda _: fresh(base), rules)


def _spelled(cc: CharClass) -> Expr:
    if len(cc.ranges) == 1 and cc.ranges[0][0] == cc.ranges[0][1] and not cc.negated:
        return Literal(chr(cc.ranges[0][0]))
    return cc


def substring_rules(units: tuple[str, ...], fresh: Callable[[str], str], base: str,
                    rules: list[Rule]) -> Expr:
    """Every run of consecutive `units`, the empty one included: unit i begins a chain of rules
    ``p_i ::= u_i p_(i+1)?``, and the language is the empty text or any chain."""
    if not units:
        return EPSILON
    names = [fresh(base) for _ in units]
    n = len(units)
    for i, unit in enumerate(units):
        head: Expr = Literal(unit) if unit else EPSILON
        if i + 1 < n:
            rest = Repeat(RuleRef(names[i + 1]), 0, 1)
            body: Expr = rest if head == EPSILON else Seq((head, rest))
        else:
            body = head
        rules.append(Rule(names[i], body))
    alts: list[Expr] = [EPSILON, *(RuleRef(name) for name in names)]
    return Choice(tuple(alts))
