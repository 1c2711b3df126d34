"""BatchGrammarMatcher: a batch fill writes what single fills write, row for row, and accepts and
refuses what xgrammar's BatchGrammarMatcher accepts and refuses."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import xgrammar as xgr

import xg2

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"enum": ["a", "bc"]}}},
          "required": ["name"]}
EBNF = 'root ::= "(" expr ")"\nexpr ::= [0-9]+ | expr "+" expr | "(" expr ")"'


@pytest.fixture(scope="module")
def grammars(json_info):
    compiler = xg2.GrammarCompiler(json_info)
    return [compiler.compile_json_schema(SCHEMA), compiler.compile_grammar(EBNF),
            compiler.compile_regex(r"[a-z]{1,8}@[a-z]+\.(com|org)"), compiler.compile_builtin_json_grammar()]


def _walked(grammars, info, n: int, seed: int) -> list[xg2.GrammarMatcher]:
    """n matchers over the grammars, each walked a random number of random allowed tokens."""
    rng = random.Random(seed)
    bitmask = xg2.allocate_token_bitmask(1, info.vocab_size, backend="numpy")
    out = []
    for k in range(n):
        m = xg2.GrammarMatcher(grammars[k % len(grammars)])
        for _ in range(rng.randrange(12)):
            m.fill_next_token_bitmask(bitmask)
            bits = np.unpackbits(bitmask[0].view(np.uint8), bitorder="little")[: info.vocab_size]
            allowed = [t for t in np.flatnonzero(bits).tolist() if t not in info.stop_token_ids]
            if not allowed:
                break
            assert m.accept_token(rng.choice(allowed))
        out.append(m)
    return out


@pytest.mark.parametrize("n, max_threads", [(1, 1), (7, 1), (40, 1), (130, 2), (130, 4)])
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_batch_fill_writes_what_single_fills_write(grammars, json_info, n, max_threads, backend):
    matchers = _walked(grammars, json_info, n, seed=n)
    width = (json_info.vocab_size + 31) // 32
    rows = list(range(n + 3))
    random.Random(n).shuffle(rows)
    indices = rows[:n]                       # a permutation with padding rows left over
    expected = np.full((n + 3, width), 7, dtype=np.int32)
    for m, i in zip(matchers, indices):
        m.fill_next_token_bitmask(expected, i)
    got = np.full((n + 3, width), 7, dtype=np.int32)
    target = got if backend == "numpy" else torch.from_numpy(got)
    xg2.BatchGrammarMatcher(max_threads).batch_fill_next_token_bitmask(matchers, target, indices)
    np.testing.assert_array_equal(got, expected)     # padding rows untouched (7) in both

    plain = np.zeros((n, width), dtype=np.int32)
    xg2.BatchGrammarMatcher(max_threads).batch_fill_next_token_bitmask(matchers, plain)
    np.testing.assert_array_equal(plain, expected[indices])


@pytest.fixture(scope="module")
def pair(json_info):
    """The same grammar under both engines, over the same vocabulary."""
    vocab = [bytes(t) for t in json_info.decoded_vocab]
    theirs = xgr.GrammarCompiler(xgr.TokenizerInfo(vocab, stop_token_ids=json_info.stop_token_ids))
    return (xg2.GrammarCompiler(json_info).compile_grammar('root ::= "ab" "c"*'),
            theirs.compile_grammar('root ::= "ab" "c"*'))


def _outcome(fn):
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - the outcome compared is the exception's kind
        return exc


def _both(pair, vocab_size, body):
    """Run `body(engine, matchers, bitmask)` on each engine's own objects; return both outcomes."""
    results = []
    for engine, compiled in (("xg2", pair[0]), ("xgrammar", pair[1])):
        lib = xg2 if engine == "xg2" else xgr
        matchers = [lib.GrammarMatcher(compiled) for _ in range(3)]
        bitmask = lib.allocate_token_bitmask(4, vocab_size)
        batch = lib.BatchGrammarMatcher()
        results.append(_outcome(lambda: body(lib, batch, matchers, bitmask)))   # noqa: B023
    return results


CASES = {
    "plain": lambda lib, b, ms, bm: b.batch_fill_next_token_bitmask(ms, bm),
    "indices": lambda lib, b, ms, bm: b.batch_fill_next_token_bitmask(ms, bm, [3, 0, 1]),
    "repeated row": lambda lib, b, ms, bm: b.batch_fill_next_token_bitmask(ms[:2], bm, [1, 1]),
    "no matchers": lambda lib, b, ms, bm: b.batch_fill_next_token_bitmask([], bm),
    "fewer indices": lambda lib, b, ms, bm: b.batch_fill_next_token_bitmask(ms, bm, [0, 1]),
    "row out of range": lambda lib, b, ms, bm: b.batch_fill_next_token_bitmask(ms, bm, [0, 1, 4]),
    "more matchers than rows": lambda lib, b, ms, bm: b.batch_fill_next_token_bitmask(ms * 2, bm),
    "narrow bitmask": lambda lib, b, ms, bm: b.batch_fill_next_token_bitmask(ms, bm[:, :-1]),
    "wrong dtype": lambda lib, b, ms, bm: b.batch_fill_next_token_bitmask(ms, bm.to(torch.int64)),
    "after the stop token": lambda lib, b, ms, bm: (ms[1].accept_string("ab"), ms[1].accept_token(ms[1].stop_token_ids[0]),
                                                    b.batch_fill_next_token_bitmask(ms, bm)),
    "accept tokens": lambda lib, b, ms, bm: b.batch_accept_token(ms, [ord("a"), ord("b"), ord("x")]),
    "accept too few tokens": lambda lib, b, ms, bm: b.batch_accept_token(ms, [ord("a")]),
    "accept strings": lambda lib, b, ms, bm: b.batch_accept_string(ms, ["ab", "abcc", "b"]),
    "roll back": lambda lib, b, ms, bm: (b.batch_accept_token(ms, [ord("a")] * 3), b.batch_rollback(ms, 1),
                                         b.batch_accept_token(ms, [ord("a"), ord("b"), ord("a")])),
    "roll back per matcher": lambda lib, b, ms, bm: (b.batch_accept_token(ms, [ord("a")] * 3),
                                                     b.batch_rollback(ms, [1, 0, 1]),
                                                     b.batch_accept_token(ms, [ord("a"), ord("b"), ord("a")])),
    "roll back too far": lambda lib, b, ms, bm: b.batch_rollback(ms, [1, 0, 0]),
    "roll back, counts mismatched": lambda lib, b, ms, bm: b.batch_rollback(ms, [0, 0]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_same_outcome_as_xgrammar(pair, json_info, case):
    ours, theirs = _both(pair, json_info.vocab_size, CASES[case])
    if isinstance(theirs, Exception):
        assert isinstance(ours, type(theirs)), f"{case}: xgrammar raised {theirs!r}, xg2 gave {ours!r}"
    else:
        assert not isinstance(ours, Exception), f"{case}: xgrammar succeeded, xg2 raised {ours!r}"
        assert ours == theirs
