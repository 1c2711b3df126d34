"""Long alternations of literals written as a trie.

An `enum` of thousands of strings, or an EBNF rule listing thousands of keywords, is a choice of
literals that mostly share prefixes. Built as it is written, its automaton starts as one branch per
literal, and the subset construction then merges them again, which costs far more than the trie
it ends as; past a few hundred thousand characters it exceeds the automaton limits. Written as a
trie with single-child runs kept as one literal, the expression is already deterministic and about
the size of the trie; a subtree too large for one rule automaton becomes a rule of its own.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable

from . import budget
from .ir import EPSILON, Choice, Expr, Literal, Seq

#: Alternations with fewer literals are left as they are (nothing to gain).
MIN_TRIE_LITERALS = 32
#: ... or fewer characters (the automaton builder's limit is MAX_NFA_NODES, 400,000 nodes).
MIN_TRIE_CHARS = 150_000
#: Largest subtree (characters) kept inline; bigger ones become rules when a rule can be added.
MAX_INLINE_CHARS = 4_000


def literal_trie(texts: list[str], add_rule: Callable[[str, Expr], Expr] | None = None) -> Expr:
    """One expression for the choice of `texts` (at least one), prefixes shared. With
    `add_rule(hint, body) -> reference`, subtrees of more than MAX_INLINE_CHARS characters are made
    rules, so that no rule automaton grows with the number of strings.

    The trie is read off the sorted strings: a node is a range of them sharing a prefix up to an
    offset, its children the runs of equal next characters (found by bisection), so the Python
    work is per trie branch, not per character."""
    texts = sorted(set(texts))
    budget.check("a long alternation")
    # Post-order without recursion (strings may be long): (lo, hi, offset, expanded?)
    out: list[tuple[Expr, int]] = []    # finished children: (expression or None marker, size)
    stack: list[tuple[int, int, int, int]] = [(0, len(texts), 0, -1)]
    pending: list[tuple[str, bool, int]] = []    # per open node: (its prefix, terminal, children)
    steps = 0
    while stack:
        lo, hi, offset, state = stack.pop()
        if state < 0 and hi - lo == 1:      # one string left: the rest of it
            rest = texts[lo][offset:]
            out.append((Literal(rest) if rest else EPSILON, len(rest)))
            continue
        if state < 0:
            steps += 1
            if not steps & 1023:
                budget.check("a long alternation")
            first, last = texts[lo], texts[hi - 1]
            n = offset
            end = min(len(first), len(last))
            while n < end and first[n] == last[n]:
                n += 1
            prefix = first[offset:n]
            terminal = len(first) == n
            if terminal:
                lo += 1
            kids = []
            i = lo
            while i < hi:
                c = texts[i][n]
                j = hi if ord(c) == 0x10FFFF else bisect_left(texts, chr(ord(c) + 1), i, hi,
                                                              key=lambda t, n=n: t[n:n + 1])
                kids.append((i, j))
                i = j
            pending.append((prefix, terminal, len(kids)))
            stack.append((lo, hi, n, len(kids)))
            stack.extend((i, j, n, -1) for i, j in reversed(kids))
            continue
        prefix, terminal, count = pending.pop()
        children = out[len(out) - count:] if count else []
        del out[len(out) - count:]
        alts: list[Expr] = [EPSILON] if terminal and children else []
        alts += [e for e, _size in children]
        size = len(prefix) + sum(sz for _e, sz in children)
        tail = None if not alts else alts[0] if len(alts) == 1 else Choice(tuple(alts))
        head = Literal(prefix) if prefix else None
        if tail is None:
            body = head or EPSILON
        elif head is None:
            body = tail
        else:
            body = Seq((head, *(tail.items if type(tail) is Seq else (tail,))))
        if add_rule is not None and size > MAX_INLINE_CHARS and stack:
            body = add_rule("alternatives", body)
            size = 1
        out.append((body, size))
    return out[0][0]


def factor_literals(alts: list[Expr], add_rule: Callable[[str, Expr], Expr] | None = None,
                    min_chars: int = MIN_TRIE_CHARS) -> list[Expr]:
    """`alts` with its literals replaced by their trie (see literal_trie) when they have at least
    `min_chars` characters: with fewer, the automaton builder merges one branch per literal faster
    than the trie is built in Python (a front-end that can add rules splits the trie into rules
    from MAX_INLINE_CHARS on, as one automaton of random-looking strings is costly to minimise)."""
    texts = [a.text for a in alts if type(a) is Literal and a.text]
    if len(texts) < MIN_TRIE_LITERALS or sum(map(len, texts)) < min_chars:
        return alts
    rest = [a for a in alts if not (type(a) is Literal and a.text)]
    return [*rest, literal_trie(texts, add_rule)]
