"""Boolean operations on regular languages of short strings (object keys), over code points.

JSON Schema describes property names by sets that overlap: `properties` names some, each
`patternProperties` regex matches others, `propertyNames` restricts them all, and
`additionalProperties` applies to the keys no other keyword claims. Splitting the keys into disjoint
regions needs intersection and complement, which grammars do not have, so the regions are computed
here on small deterministic automata over code-point intervals and written back as grammar rules
(one rule per state). Keys are short, so right-linear rules cost the parser nothing worth noting.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from ..errors import GrammarLimitError
from . import budget
from .ir import CharClass, Choice, Expr, Literal, Repeat, Rule, RuleRef, Seq

MAX_CODEPOINT = 0x10FFFF
#: Largest automaton built for a key language (states).
MAX_STATES = 4000
#: Largest repetition unrolled while building one.
MAX_UNROLL = 256


@dataclass(frozen=True)
class KeyDFA:
    """Complete DFA over code points: per state, sorted disjoint intervals covering 0..MAX_CODEPOINT."""

    moves: tuple[tuple[tuple[int, int, int], ...], ...]
    finals: frozenset[int]

    def accepts(self, text: str) -> bool:
        state = 0
        for ch in text:
            cp = ord(ch)
            for lo, hi, target in self.moves[state]:
                if lo <= cp <= hi:
                    state = target
                    break
        return state in self.finals

    def complement(self) -> KeyDFA:
        return KeyDFA(self.moves, frozenset(range(len(self.moves))) - self.finals)

    def is_empty(self) -> bool:
        return not (_reachable(self) & self.finals)


def _reachable(d: KeyDFA) -> set[int]:
    seen = {0}
    work = [0]
    while work:
        for _lo, _hi, t in d.moves[work.pop()]:
            if t not in seen:
                seen.add(t)
                work.append(t)
    return seen


def from_expr(e: Expr) -> KeyDFA:
    """Subset construction from a rule-free IR expression."""
    return _determinize([(e, 0, 1)], 2, 0, {1})


def spelled(d: KeyDFA, spell) -> KeyDFA:
    """The language of `d` with each character written as `spell(CharClass)` (a rule-free
    expression of its spellings): the texts as written where `d` reads them decoded (JSON escapes,
    XML entities), so that they can meet automata over written text."""
    live = _co_reachable(d) & _reachable(d)
    pieces: list[tuple[Expr, int, int]] = []
    for s in sorted(live):
        by_target: dict[int, list[tuple[int, int]]] = {}
        for lo, hi, t in d.moves[s]:
            if t in live:
                by_target.setdefault(t, []).append((lo, hi))
        pieces += [(spell(CharClass(tuple(rs))), s, t) for t, rs in sorted(by_target.items())]
    return _determinize(pieces, len(d.moves), 0, {s for s in live if s in d.finals})


def avoiding(strings) -> KeyDFA:
    """The texts holding none of `strings` (non-empty): text.py's Aho–Corasick automaton, one state
    per prefix of the strings in which none of them ends, and a dead state."""
    from .text import _aho_corasick
    from .text import _step as _ac_step

    patterns = sorted(set(strings))
    if not patterns or any(not p for p in patterns):
        raise ValueError("excluded strings must be non-empty")
    goto, fail, depth = _aho_corasick(patterns)
    if len(goto) > MAX_STATES:
        raise GrammarLimitError("excluded strings with too many prefixes")
    ends = set()
    for p in patterns:
        s = 0
        for ch in p:
            s = goto[s][ch]
        ends.add(s)
    dead = [False] * len(goto)
    for s in sorted(range(len(goto)), key=depth.__getitem__):    # a state's fallback comes first
        dead[s] = s in ends or (s != 0 and dead[fail[s]])
    index = {s: i for i, s in enumerate(s for s in range(len(goto)) if not dead[s])}
    sink = len(index)
    alphabet = sorted({ch for p in patterns for ch in p})
    moves = []
    for s in index:
        row = []
        for ch in alphabet:
            t = _ac_step(goto, fail, s, ch)
            row.append((ord(ch), ord(ch), sink if dead[t] else index[t]))
        moves.append(tuple(_complete(row, 0)))        # a character no string holds: back to the root
    moves.append(((0, MAX_CODEPOINT, sink),))
    return KeyDFA(tuple(moves), frozenset(range(sink)))


def _determinize(pieces: list[tuple[Expr, int, int]], n: int, start: int, ends: set[int]) -> KeyDFA:
    """Subset construction from an automaton whose edges are rule-free IR expressions: `pieces`
    (expression, from, to) between the nodes 0..n-1; the texts leading from `start` to `ends`."""
    edges: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]  # (lo, hi, target); lo == -1: epsilon

    def node() -> int:
        if len(edges) > 20 * MAX_STATES:
            raise GrammarLimitError("key language too large")
        edges.append([])
        return len(edges) - 1

    if n > 20 * MAX_STATES:
        raise GrammarLimitError("key language too large")
    stack: list[tuple[Expr, int, int]] = list(pieces)
    while stack:
        x, s, t = stack.pop()
        if isinstance(x, Literal):
            cur = s
            for i, ch in enumerate(x.text):
                nxt = t if i == len(x.text) - 1 else node()
                edges[cur].append((ord(ch), ord(ch), nxt))
                cur = nxt
            if not x.text:
                edges[s].append((-1, -1, t))
        elif isinstance(x, CharClass):
            for lo, hi in x.codepoint_ranges():
                edges[s].append((lo, hi, t))
        elif isinstance(x, Seq):
            cur = s
            for i, item in enumerate(x.items):
                nxt = t if i == len(x.items) - 1 else node()
                stack.append((item, cur, nxt))
                cur = nxt
            if not x.items:
                edges[s].append((-1, -1, t))
        elif isinstance(x, Choice):
            stack.extend((a, s, t) for a in x.alts)
        elif isinstance(x, Repeat):
            copies = x.min if x.max is None else x.max
            if copies > MAX_UNROLL:
                raise GrammarLimitError(f"repetition bound above {MAX_UNROLL} in a key pattern")
            cur = s
            for _ in range(x.min):
                nxt = node()
                stack.append((x.expr, cur, nxt))
                cur = nxt
            if x.max is None:
                loop = node()
                edges[cur].append((-1, -1, loop))
                stack.append((x.expr, loop, loop))
                edges[loop].append((-1, -1, t))
            else:
                for _ in range(x.max - x.min):
                    edges[cur].append((-1, -1, t))
                    nxt = node()
                    stack.append((x.expr, cur, nxt))
                    cur = nxt
                edges[cur].append((-1, -1, t))
        else:
            raise TypeError(f"a key language cannot refer to rules: {x!r}")

    def closure(seeds) -> frozenset[int]:
        seen = set(seeds)
        work = list(seeds)
        while work:
            for lo, _hi, v in edges[work.pop()]:
                if lo == -1 and v not in seen:
                    seen.add(v)
                    work.append(v)
        return frozenset(seen)

    first = closure([start])
    index = {first: 0}
    order = [first]
    moves: list[tuple[tuple[int, int, int], ...]] = []
    i = 0
    while i < len(order):
        if not i & 63:
            budget.check("key automata")
        cur = order[i]
        i += 1
        ranges = [(lo, hi, v) for u in cur for lo, hi, v in edges[u] if lo >= 0]
        row = []
        for lo, hi, targets in _split([(lo, hi, v) for lo, hi, v in ranges]):
            state = closure(targets)
            if state not in index:
                if len(order) >= MAX_STATES:
                    raise GrammarLimitError("key language automaton too large")
                index[state] = len(order)
                order.append(state)
            row.append((lo, hi, index[state]))
        moves.append(_complete(row, None))
    dead = len(order)
    moves = [tuple((lo, hi, dead if t is None else t) for lo, hi, t in row) for row in moves]
    moves.append(((0, MAX_CODEPOINT, dead),))
    return KeyDFA(tuple(moves), frozenset(j for j, st in enumerate(order) if not ends.isdisjoint(st)))


def _split(ranges: list[tuple[int, int, int]]) -> list[tuple[int, int, frozenset[int]]]:
    points = sorted({lo for lo, _, _ in ranges} | {hi + 1 for _, hi, _ in ranges})
    out = []
    for a, b in pairwise(points):
        targets = frozenset(v for lo, hi, v in ranges if lo <= a and b - 1 <= hi)
        if targets:
            out.append((a, b - 1, targets))
    return out


def _complete(row: list[tuple[int, int, int]], fill) -> list[tuple[int, int, int | None]]:
    """Fill the gaps between intervals with `fill` so the row covers every code point."""
    out: list[tuple[int, int, int | None]] = []
    nxt = 0
    for lo, hi, t in row:
        if lo > nxt:
            out.append((nxt, lo - 1, fill))
        out.append((lo, hi, t))
        nxt = hi + 1
    if nxt <= MAX_CODEPOINT:
        out.append((nxt, MAX_CODEPOINT, fill))
    return out


def intersect(a: KeyDFA, b: KeyDFA) -> KeyDFA:
    """Product automaton, reachable part only."""
    index = {(0, 0): 0}
    order = [(0, 0)]
    moves = []
    i = 0
    while i < len(order):
        if not i & 63:
            budget.check("key automata")
        x, y = order[i]
        i += 1
        points = sorted({lo for lo, _, _ in a.moves[x]} | {lo for lo, _, _ in b.moves[y]})
        row = []
        for j, lo in enumerate(points):
            hi = points[j + 1] - 1 if j + 1 < len(points) else MAX_CODEPOINT
            pair = (_step(a.moves[x], lo), _step(b.moves[y], lo))
            if pair not in index:
                if len(order) >= MAX_STATES:
                    raise GrammarLimitError("key language automaton too large")
                index[pair] = len(order)
                order.append(pair)
            target = index[pair]
            if row and row[-1][2] == target:
                row[-1] = (row[-1][0], hi, target)
            else:
                row.append((lo, hi, target))
        moves.append(tuple(row))
    finals = frozenset(k for k, (x, y) in enumerate(order) if x in a.finals and y in b.finals)
    return KeyDFA(tuple(moves), finals)


def _step(row, cp: int) -> int:
    for lo, hi, t in row:
        if lo <= cp <= hi:
            return t
    raise AssertionError("incomplete automaton row")


def to_rules(d: KeyDFA, spell, fresh, rules: list[Rule]) -> Expr | None:
    """The language as right-linear rules (one per live state), each character written through
    `spell(CharClass) -> Expr` (its JSON spelling); None when the language is empty."""
    live = _co_reachable(d) & _reachable(d)
    if 0 not in live:
        return None
    names = {s: fresh("key_state") for s in sorted(live)}
    for s in sorted(live):
        by_target: dict[int, list[tuple[int, int]]] = {}
        for lo, hi, t in d.moves[s]:
            if t in live:
                by_target.setdefault(t, []).append((lo, hi))
        alts: list[Expr] = [Literal("")] if s in d.finals else []
        alts += [Seq((spell(CharClass(tuple(rs))), RuleRef(names[t]))) for t, rs in sorted(by_target.items())]
        rules.append(Rule(names[s], alts[0] if len(alts) == 1 else Choice(tuple(alts))))
    return RuleRef(names[0])


def _co_reachable(d: KeyDFA) -> set[int]:
    back: dict[int, set[int]] = {}
    for s, row in enumerate(d.moves):
        for _lo, _hi, t in row:
            back.setdefault(t, set()).add(s)
    seen = set(d.finals)
    work = list(seen)
    while work:
        for s in back.get(work.pop(), ()):
            if s not in seen:
                seen.add(s)
                work.append(s)
    return seen


def residue_dfa(modulus: int, accept) -> KeyDFA:
    """Canonical JSON integers (``-?(0|[1-9][0-9]*)``, `-0` too) whose magnitude's remainder r
    modulo `modulus` has `accept(r)`: one state per remainder, read digit by digit. The sign does
    not matter to the conditions used (divisible or not), so the magnitude's remainder decides."""
    if modulus > MAX_STATES:
        raise GrammarLimitError(f"remainder automaton modulo {modulus} too large")
    start, minus, zero, dead, first = 0, 1, 2, 3, 4

    def row(cells: list[tuple[int, int]]) -> tuple[tuple[int, int, int], ...]:
        """A complete row from (character, target) cells; every other character leads to `dead`."""
        out = [(ch, ch, t) for ch, t in sorted(cells)]
        return tuple((lo, hi, dead if t is None else t) for lo, hi, t in _complete(out, None))

    digits = [(0x30, zero), *((0x30 + dgt, first + dgt % modulus) for dgt in range(1, 10))]
    moves = [row([(0x2D, minus), *digits]), row(digits), row([]), row([])]
    moves += [row([(0x30 + dgt, first + (10 * r + dgt) % modulus) for dgt in range(10)]) for r in range(modulus)]
    finals = {first + r for r in range(modulus) if accept(r)} | ({zero} if accept(0) else set())
    assert start == 0
    return KeyDFA(tuple(moves), frozenset(finals))


def finite_strings(d: KeyDFA, limit: int) -> list[str] | None:
    """Every string of `d` when the language is finite and has at most `limit` of them, else None
    (a walk over the live states with an explicit stack; a cycle among them means infinitely many)."""
    live = _co_reachable(d) & _reachable(d)
    if 0 not in live:
        return []
    out: list[str] = []
    stack: list[tuple[int, str, frozenset[int]]] = [(0, "", frozenset({0}))]
    while stack:
        s, text, path = stack.pop()
        if s in d.finals:
            out.append(text)
            if len(out) > limit:
                return None
        for lo, hi, t in d.moves[s]:
            if t not in live:
                continue
            if t in path or hi - lo >= limit:
                return None
            stack.extend((t, text + chr(c), path | {t}) for c in range(lo, hi + 1))
            if len(stack) > 64 * limit:
                return None
    return sorted(out)
