"""Repetition-state compression: languages stay exact at the bounds, automata stay small."""

from __future__ import annotations

import random

import pytest

import xg2
from xg2.grammar.ebnf import parse_ebnf
from xg2.grammar.ir import Repeat
from xg2.grammar.repetition import REPEAT_THRESHOLD, compress_repetitions

_T = REPEAT_THRESHOLD
CASES = [(0, 17), (3, 20), (17, 17), (5, 100), (0, 1000), (250, 260), (64, 64), (7, None), (40, None), (0, 4097),
         # around the unrolled first and last T copies and the compressed middle
         (0, _T + 1), (_T - 1, 2 * _T), (_T - 1, 2 * _T + 1), (_T, 3 * _T + 3), (_T + 1, 3 * _T), (2 * _T + 1, 2 * _T + 9)]


def _bound(m: int, n: int | None) -> str:
    return f"{{{m},{'' if n is None else n}}}"


@pytest.mark.parametrize(("m", "n"), CASES)
def test_counts_at_the_edges(small_info, m, n):
    compiler = xg2.GrammarCompiler(small_info, cache_enabled=False)
    compiled = compiler.compile_grammar(f'root ::= "<" ("a" | "bc"){_bound(m, n)} ">"')
    rng = random.Random(m * 7919 + (n or 0))
    top = (n if n is not None else m + 40) + 2
    counts = {c for c in (m - 1, m, m + 1, top - 3, top - 2, top - 1, 0, 1) if c >= 0}
    counts |= {rng.randrange(top) for _ in range(4)}
    for c in sorted(counts):
        text = "<" + "".join(rng.choice(["a", "bc"]) for _ in range(c)) + ">"
        matcher = xg2.GrammarMatcher(compiled)
        ok = matcher.accept_string(text) and matcher.is_completed()
        assert ok == (m <= c and (n is None or c <= n)), (c, text[:40])


def test_large_bounds_compress_to_few_small_rules():
    ir = compress_repetitions(parse_ebnf('root ::= [a-z]{0,65536} "!"'))
    assert len(ir.rules) < 30
    for rule in ir.rules:
        stack = [rule.body]
        while stack:
            e = stack.pop()
            if isinstance(e, Repeat):
                assert (e.max if e.max is not None else e.min) <= REPEAT_THRESHOLD
                stack.append(e.expr)
            stack.extend(getattr(e, "items", ()) or getattr(e, "alts", ()))


def test_small_bounds_are_left_alone():
    ir = parse_ebnf('root ::= [a-z]{0,16} "!"')
    assert compress_repetitions(ir) is ir
