"""A rule's character budget (xgrammar's ``[max_chars=n]`` rule attribute), built into its language.

The budget bounds the code points the rule's text may hold. xgrammar counts them at run time in
the matcher; for a rule whose body is a regular language, the bounded language is regular too
(the body's automaton times a counter of n + 1 states), so xg2 builds it once and the matcher
needs nothing new. The common bodies have a short form: any text, or a repeated character class,
bounded is a bounded repetition (which repetition compression keeps small for any n). Other bodies
go through the product automaton, written as rules; its size is capped (GrammarLimitError).
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import GrammarLimitError
from .ir import EPSILON, CharClass, Expr, Literal, Repeat, Rule, Seq
from .regular import MAX_CODEPOINT, MAX_STATES, KeyDFA, avoiding, from_expr, intersect, to_rules

#: Largest budget the product automaton is built for (the short forms take any).
MAX_PRODUCT_BUDGET = 1024


def within_chars(body: Expr, n: int, fresh: Callable[[str], str], base: str, rules: list[Rule]) -> Expr | None:
    """The texts of `body` (rule-free) holding at most `n` code points, as an expression (with
    rules appended to `rules` when the product automaton is needed); None when none is left."""
    if type(body) is Repeat and body.max is None and body.min == 0 and type(body.expr) is CharClass:
        return Repeat(body.expr, 0, n) if n else EPSILON
    d = from_expr(body)
    if d.complement().is_empty():       # any text
        return Repeat(CharClass(((0, MAX_CODEPOINT),)), 0, n) if n else EPSILON
    if n > MAX_PRODUCT_BUDGET or (n + 2) * len(d.moves) > 4 * MAX_STATES:
        raise GrammarLimitError(f"a max_chars budget of {n} on this body needs an automaton of more than "
                                f"{MAX_STATES} states (any text or a repeated character class take any budget)")
    return to_rules(intersect(d, _at_most(n)), _spelled, lambda _: fresh(base), rules)


def _at_most(n: int) -> KeyDFA:
    """Texts of at most n code points: a counter, then a dead state."""
    moves = tuple(((0, MAX_CODEPOINT, i + 1),) for i in range(n + 1)) + (((0, MAX_CODEPOINT, n + 1),),)
    return KeyDFA(moves, frozenset(range(n + 1)))


def _spelled(cc: CharClass) -> Expr:
    if len(cc.ranges) == 1 and cc.ranges[0][0] == cc.ranges[0][1] and not cc.negated:
        return Literal(chr(cc.ranges[0][0]))
    return cc


def text_within_chars(avoid: tuple[str, ...], n: int, fresh: Callable[[str], str], base: str,
                      rules: list[Rule]) -> Expr | None:
    """Text holding none of `avoid` and at most `n` code points (free text with a character
    budget, before its end string): a bounded repetition without strings to avoid, else the
    product of their Aho–Corasick automaton and the counter, as rules."""
    if not avoid:
        return Repeat(CharClass(((0, MAX_CODEPOINT),)), 0, n) if n else EPSILON
    d = avoiding(avoid)
    if n > MAX_PRODUCT_BUDGET or (n + 2) * len(d.moves) > 4 * MAX_STATES:
        raise GrammarLimitError(f"a max_chars budget of {n} on text that must avoid {len(avoid)} strings needs an "
                                f"automaton of more than {MAX_STATES} states")
    return to_rules(intersect(d, _at_most(n)), _spelled, lambda _: fresh(base), rules)


def committed_within_chars(body: Expr, marker: Expr, n: int, fresh: Callable[[str], str], base: str,
                           rules: list[Rule]) -> Expr | None:
    """A suffix/stop rule with a character budget (``r[max_chars=n, suffix=M]: B``), as xgrammar
    reads it: the body's text up to the first completion of the marker within n code points,
    marker included; and, where the budget runs out before the marker, the rule ends there
    without it if its text so far is a whole text of the body (not inside the marker). A body
    that reads any text may also end without the marker anywhere within the budget (xgrammar's
    language for such bodies). Built as the product of the committed automaton, the body's and a
    counter, written as rules."""
    from .regular import _co_reachable, _step

    d = from_expr(Seq((body, marker)))
    dead = len(d.moves)
    cut = tuple(((0, MAX_CODEPOINT, dead),) if s in d.finals else row for s, row in enumerate(d.moves))
    c = KeyDFA(cut + (((0, MAX_CODEPOINT, dead),),), d.finals)
    b = from_expr(body)
    anywhere = b.complement().is_empty()
    live = _co_reachable(c)
    if n > MAX_PRODUCT_BUDGET or (n + 2) * len(c.moves) * len(b.moves) > 4 * MAX_STATES:
        raise GrammarLimitError(f"a max_chars budget of {n} with a marker needs an automaton of more than "
                                f"{MAX_STATES} states")
    sink = (dead, 0, n + 1)
    index: dict[tuple[int, int, int], int] = {(0, 0, 0): 0}
    order = [(0, 0, 0)]
    moves: list[tuple[tuple[int, int, int], ...]] = []
    i = 0
    while i < len(order):
        cs, bs, k = order[i]
        i += 1
        points = sorted({lo for lo, _, _ in c.moves[cs]} | {lo for lo, _, _ in b.moves[bs]})
        row = []
        for j, lo in enumerate(points):
            hi = points[j + 1] - 1 if j + 1 < len(points) else MAX_CODEPOINT
            t = _step(c.moves[cs], lo)
            key = (t, _step(b.moves[bs], lo), k + 1) if k < n and t in live and cs != dead else sink
            if key not in index:
                index[key] = len(order)
                order.append(key)
            row.append((lo, hi, index[key]))
        moves.append(tuple(row))
    finals = frozenset(
        j for j, (cs, bs, k) in enumerate(order)
        if k <= n and cs != dead and (cs in c.finals or (bs in b.finals and cs in live and (k == n or anywhere))))
    return to_rules(KeyDFA(tuple(moves), finals), _spelled, lambda _: fresh(base), rules)
