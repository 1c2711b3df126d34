"""Repetition-state compression: large bounded repetitions become a few small rules.

Unrolled, `e{m,n}` costs n copies of e's automaton: a string with `maxLength: 2000` is ~200 000
automaton nodes, seconds of compilation and one mask entry per copy. Counting in blocks keeps the
language identical while the automata stay small: with `B ::= e{b}`, a count c = b*q + r (0 <= r < b)
is q blocks followed by r single copies, so

    e{m,n} = B{qm} e{m%b, b-1} | B{qm+1, qn-1} e{0, b-1} | B{qn} e{0, n%b}      (qm = m//b, qn = n//b)

(alternatives with an empty count range are left out). The block repetitions are compressed the same
way in turn, so the number of rules grows with log_b(n) and every automaton holds at most a few
times b copies. Each count has exactly one derivation, so the Earley parser carries a few items per
level, never one per position, and masks stay exact because the language does not change.
Repetitions with at most :data:`REPEAT_THRESHOLD` copies are left unrolled: there the unrolled
automaton is both smaller and faster to walk. A bounded repetition keeps its last T copies unrolled
and the rules of its counter declare that T more elements may follow them (`_Compressor.bounded`):
their mask entries are then the same whatever the count, built once, with no uncertain tokens but
those that leave the repetition.

Only repetitions whose element splits a text one way are compressed: the element must not match the
empty string, and when it calls no rule its strings must form a prefix code (checked on its
automaton). Otherwise (`("a" | "aa"){0,1000}`, `("a"{0,300}){0,300}`) the parser would carry one item
per possible count where the unrolled automaton, once determinised, carries one state; those stay
unrolled and are subject to the automaton size limits. Nested repetitions `(e{0,a}){m,b}` are first
flattened to `e{0,a*b}`, the same language with one way to count.
"""

from __future__ import annotations

from . import budget
from .fsm import rule_automaton
from .ir import (
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
    TokenSet,
    TokenSlot,
    any_node,
)

#: Repetitions with more copies than this are compressed (the paper's threshold T), and the last T
#: copies of a compressed bounded repetition stay unrolled. T is also how many elements the mask
#: builder may assume can follow any rule of a compressed counter (see `_Compressor.bounded`): with
#: T at least the longest token in bytes, every token that reads only elements past such a rule's
#: end is accepted without a run-time check. 128 covers the vocabularies in use (DeepSeek-V3, Qwen,
#: cl100k, o200k: 128 bytes; Mistral: 25).
REPEAT_THRESHOLD = 128
#: Copies per block.
BLOCK = 8


def _large(e: Repeat) -> bool:
    return (e.max if e.max is not None else e.min) > REPEAT_THRESHOLD


def _nullable(e: Expr, nullable_rules: set[str]) -> bool:
    if isinstance(e, Literal):
        return not e.text
    if isinstance(e, CharClass):
        return False
    if isinstance(e, RuleRef):
        return e.name in nullable_rules
    if isinstance(e, Seq):
        return all(_nullable(x, nullable_rules) for x in e.items)
    if isinstance(e, Choice):
        return any(_nullable(x, nullable_rules) for x in e.alts)
    if isinstance(e, FreeText):
        return not e.ends       # text up to an end string holds it, so is never empty
    if isinstance(e, (TokenSet, TokenSlot)):
        return False            # one token, never none
    return e.min == 0 or _nullable(e.expr, nullable_rules)


def nullable_rule_names(ir: GrammarIR) -> set[str]:
    """Rules that can match the empty string (least fixpoint over the IR)."""
    out: set[str] = set()
    changed = True
    while changed:
        changed = False
        for r in ir.rules:
            if r.name not in out and _nullable(r.body, out):
                out.add(r.name)
                changed = True
    return out


class _Compressor:
    def __init__(self, ir: GrammarIR):
        self.nullable = nullable_rule_names(ir)
        self.names = {r.name for r in ir.rules}
        self.rules: list[Rule] = []
        self.memo: dict[tuple[Expr, int, int | None], RuleRef] = {}
        self.blocks: dict[Expr, RuleRef] = {}
        self.follows: dict[Expr, tuple[str, int]] = {}

    def rule(self, hint: str, body: Expr, follow: tuple[str, int] | None = None) -> RuleRef:
        name, i = hint, 1
        while name in self.names:
            i += 1
            name = f"{hint}_{i}"
        self.names.add(name)
        self.rules.append(Rule(name, body, follow=follow))
        if _nullable(body, self.nullable):
            self.nullable.add(name)
        return RuleRef(name)

    def bounded(self, e: Expr, lo: int, hi: int | None) -> Expr:
        """`e{lo,hi}` compressed, one derivation per count: a counter in rules (`repeat`) for the
        counts up to hi-T, then the last T copies unrolled (the paper's Alg. 3):

            e{lo,hi} = e{lo, hi-T-1} | e{hi-T} e{0,T}        (e{hi-T} e{lo-hi+T, T} when lo >= hi-T)

        Both branches read the same text up to count hi-T-1, so wherever a rule of either counter
        ends, the second branch can still read T more elements: every counter rule declares `e*`
        as what may follow it, up to T elements (`Rule.follow`). For e{lo,} the counter ends in a
        loop on e, which makes the same true. The mask entries of the counter's nodes then accept
        every token of up to T elements however the count stands, and the last T copies keep the
        masks near the bound exact without run-time checks."""
        if not self.splits_one_way(e):
            return Repeat(e, lo, hi)
        follow = self.follows.get(e)
        if follow is None:
            follow = self.follows[e] = (self.rule("follow", Repeat(e, 0, None)).name, REPEAT_THRESHOLD)
        if hi is None:
            return self.repeat(e, lo, None, follow)
        t = REPEAT_THRESHOLD
        exact = _seq(self.repeat(e, hi - t, hi - t, follow), self.tail(e, max(0, lo - (hi - t))))
        if lo >= hi - t:
            return exact
        return Choice((self.repeat(e, lo, hi - t - 1, follow), exact))

    def tail(self, e: Expr, lo: int) -> RuleRef:
        """`e{lo,T}`, the unrolled last copies, as a rule of its own: its automaton, the largest
        of the repetition, is then built once per process for every bound (automata are memoised
        by rule body)."""
        key = (e, lo, REPEAT_THRESHOLD)
        if key not in self.memo:
            self.memo[key] = self.rule("tail", Repeat(e, lo, REPEAT_THRESHOLD))
        return self.memo[key]

    def repeat(self, e: Expr, lo: int, hi: int | None, follow: tuple[str, int]) -> Expr:
        """`e{lo,hi}` inside a counter of `bounded`: a rule reference when the bounds are large."""
        if lo == hi == 1:
            return e
        if lo == hi == 0:
            return Literal("")
        rep = Repeat(e, lo, hi)
        if not _large(rep):
            return rep
        key = (e, lo, hi)
        if key not in self.memo:
            self.memo[key] = self.rule("rep", self._blocks(e, lo, hi, follow), follow)
        return self.memo[key]

    def splits_one_way(self, e: Expr) -> bool:
        if _nullable(e, self.nullable):
            return False
        if any(isinstance(x, RuleRef) for x in _walk(e)):
            return True
        fsm = rule_automaton(e, {})
        return fsm.deterministic and not any(fsm.byte_edges[u] for u in fsm.finals)

    def _blocks(self, e: Expr, m: int, n: int | None, follow: tuple[str, int]) -> Expr:
        block = self.blocks.get(e)
        if block is None:
            block = self.blocks[e] = self.rule("block", Repeat(e, BLOCK, BLOCK), follow)
        qm, rm = divmod(m, BLOCK)
        if n is None:  # e{m,} = B{qm} e{rm} e*
            return _seq(self.repeat(block, qm, qm, follow), Repeat(e, rm, rm), Repeat(e, 0, None))
        qn, rn = divmod(n, BLOCK)
        if qm == qn:
            return _seq(self.repeat(block, qm, qm, follow), Repeat(e, rm, rn))
        alts = [_seq(self.repeat(block, qm, qm, follow), Repeat(e, rm, BLOCK - 1))]
        if qn - 1 >= qm + 1:
            alts.append(_seq(self.repeat(block, qm + 1, qn - 1, follow), Repeat(e, 0, BLOCK - 1)))
        alts.append(_seq(self.repeat(block, qn, qn, follow), Repeat(e, 0, rn)))
        return Choice(tuple(alts))

    def expr(self, e: Expr) -> Expr:
        """Post-order rewrite with an explicit stack (bodies can nest deeply)."""
        out: dict[int, Expr] = {}
        stack: list[tuple[Expr, bool]] = [(e, False)]
        while stack:
            x, done = stack.pop()
            kids = x.items if isinstance(x, Seq) else x.alts if isinstance(x, Choice) else \
                (x.expr,) if isinstance(x, Repeat) else ()
            if not done:
                stack.append((x, True))
                stack.extend((c, False) for c in kids)
                continue
            if isinstance(x, Seq):
                out[id(x)] = Seq(tuple(out[id(c)] for c in kids))
            elif isinstance(x, Choice):
                out[id(x)] = Choice(tuple(out[id(c)] for c in kids))
            elif isinstance(x, Repeat):
                inner, lo, hi = out[id(x.expr)], x.min, x.max
                if isinstance(x.expr, Repeat) and x.expr.min == 0 and not _nullable(x.expr.expr, self.nullable):
                    # (e{0,a}){m,b} is e{0,a*b}: flattening keeps one count instead of many ways to group it
                    inner, lo = x.expr.expr, 0
                    hi = None if hi is None or x.expr.max is None else x.expr.max * hi
                rep = Repeat(inner, lo, hi)
                out[id(x)] = self.bounded(inner, lo, hi) if _large(rep) else rep
            else:
                out[id(x)] = x
        return out[id(e)]


def _seq(*items: Expr) -> Expr:
    kept = tuple(i for i in items if not _empty(i))
    if not kept:
        return Literal("")
    return kept[0] if len(kept) == 1 else Seq(kept)


def _empty(e: Expr) -> bool:
    return e == Literal("") or (isinstance(e, Repeat) and e.max == 0)


def _walk(e: Expr):
    stack = [e]
    while stack:
        x = stack.pop()
        yield x
        if isinstance(x, Repeat):
            stack.append(x.expr)
        elif isinstance(x, Seq):
            stack.extend(x.items)
        elif isinstance(x, Choice):
            stack.extend(x.alts)


def _needs_rewrite(e: Expr) -> bool:
    """Whether `e` holds a large or a nested repetition (one walk, node types tested inline: it
    runs over every rule body)."""
    stack = [e]
    pop, extend = stack.pop, stack.extend
    steps = 0
    while stack:
        steps += 1
        if steps > MAX_TREE_STEPS:
            return _needs_rewrite_dag(e)
        x = pop()
        t = type(x)
        if t is Seq:
            extend(x.items)
        elif t is Choice:
            extend(x.alts)
        elif t is Repeat:
            if _large(x) or type(x.expr) is Repeat:
                return True
            stack.append(x.expr)
    return False


def _needs_rewrite_dag(e: Expr) -> bool:
    """_needs_rewrite visiting each node once (a predicate: a second visit answers the same)."""
    return any_node(e, lambda x: type(x) is Repeat and (_large(x) or type(x.expr) is Repeat))


def compress_repetitions(ir: GrammarIR) -> GrammarIR:
    """The same grammar with every repetition of more than REPEAT_THRESHOLD copies compressed."""
    todo = [_needs_rewrite(r.body) for r in ir.rules]
    if not any(todo):
        return ir
    comp = _Compressor(ir)
    rules = []
    for r, rewrite in zip(ir.rules, todo):
        budget.check("compressing repetitions")
        rules.append(Rule(r.name, comp.expr(r.body) if rewrite else r.body, r.lookahead, r.follow, r.temperature, r.capture, r.max_tokens, r.capture_trim, r.hide_tail,
                  r.stop_capture))
    return GrammarIR(rules + comp.rules, ir.root)
