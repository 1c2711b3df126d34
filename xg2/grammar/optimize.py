"""IR-level optimisations that pay for themselves in the core.

Inlining small reference-free rules into their callers turns Earley predictions and completions into
plain automaton edges: fewer items per state set, and the mask entry of the caller sees through the
inlined text, so fewer tokens are left uncertain.
"""

from __future__ import annotations

from .ir import CharClass, Choice, Expr, GrammarIR, Literal, Repeat, Rule, RuleRef, Seq

#: Largest (weighted) expression size inlined into a caller.
INLINE_LIMIT = 40


def _children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Seq):
        return e.items
    if isinstance(e, Choice):
        return e.alts
    if isinstance(e, Repeat):
        return (e.expr,)
    return ()


def expr_refs(e: Expr) -> set[str]:
    out: set[str] = set()
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, RuleRef):
            out.add(x.name)
        stack.extend(_children(x))
    return out


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
        elif isinstance(x, Repeat):
            s = 1 + sizes[id(x.expr)] * max(1, x.max if x.max is not None else x.min + 1)
        else:
            s = 1 + sum(sizes[id(c)] for c in _children(x))
        sizes[id(x)] = s
    return sizes[id(e)]


def substitute(e: Expr, bodies: dict[str, Expr]) -> Expr:
    """Replace references to rules in `bodies` by their bodies (post-order, no recursion)."""
    out: dict[int, Expr] = {}
    stack: list[tuple[Expr, bool]] = [(e, False)]
    while stack:
        x, done = stack.pop()
        if not done:
            stack.append((x, True))
            stack.extend((c, False) for c in _children(x))
            continue
        if isinstance(x, RuleRef):
            out[id(x)] = bodies.get(x.name, x)
        elif isinstance(x, Seq):
            out[id(x)] = Seq(tuple(out[id(c)] for c in x.items))
        elif isinstance(x, Choice):
            out[id(x)] = Choice(tuple(out[id(c)] for c in x.alts))
        elif isinstance(x, Repeat):
            out[id(x)] = Repeat(out[id(x.expr)], x.min, x.max)
        else:
            out[id(x)] = x
    return out[id(e)]


def inline_small_rules(ir: GrammarIR) -> GrammarIR:
    """Inline reference-free, non-recursive small rules; drop rules no longer reachable from root."""
    inlined: dict[str, Expr] = {}
    # Resolve bottom-up: a rule becomes inlinable once every rule it references was inlined.
    pending = [r for r in ir.rules if r.name != ir.root and r.lookahead is None]
    changed = True
    while changed:
        changed = False
        for r in pending:
            if r.name in inlined:
                continue
            refs = expr_refs(r.body)
            if refs - inlined.keys():
                continue
            body = substitute(r.body, inlined) if refs else r.body
            if expr_size(body) <= INLINE_LIMIT:
                inlined[r.name] = body
                changed = True
    new_rules = []
    for r in ir.rules:
        if r.name in inlined:
            continue
        body = substitute(r.body, inlined)
        la = substitute(r.lookahead, inlined) if r.lookahead is not None else None
        new_rules.append(Rule(r.name, body, la))
    return reachable(GrammarIR(new_rules, ir.root))


def reachable(ir: GrammarIR) -> GrammarIR:
    rules = ir.rule_map()
    seen = {ir.root}
    work = [ir.root]
    while work:
        r = rules[work.pop()]
        refs = expr_refs(r.body)
        if r.lookahead is not None:
            refs |= expr_refs(r.lookahead)
        for name in refs:
            if name not in seen:
                seen.add(name)
                work.append(name)
    return GrammarIR([r for r in ir.rules if r.name in seen], ir.root)
