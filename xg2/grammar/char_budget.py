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
from .ir import EPSILON, CharClass, Expr, Literal, Repeat, Rule
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
