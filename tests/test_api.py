"""Public API: bitmask helpers for numpy and torch, and bad input raising typed errors."""

from __future__ import annotations

import numpy as np
import pytest

import xg2


def test_bitmask_shape_and_reset():
    assert xg2.get_bitmask_shape(2, 65) == (2, 3)
    bm = xg2.allocate_token_bitmask(2, 65, backend="numpy")
    assert bm.dtype == np.int32 and bm.shape == (2, 3) and (bm == -1).all()
    bm[:] = 0
    xg2.reset_token_bitmask(bm)
    assert (bm == -1).all()


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_apply_bitmask(backend):
    vocab = 70
    allowed = [0, 5, 31, 32, 63, 69]
    bits = np.zeros(96, dtype=np.uint8)
    bits[allowed] = 1
    words = np.packbits(bits, bitorder="little").view("<i4").astype(np.int32)
    logits = np.arange(2 * vocab, dtype=np.float32).reshape(2, vocab)
    mask2 = np.stack([words, words])
    if backend == "torch":
        torch = pytest.importorskip("torch")
        logits_t, mask_t = torch.tensor(logits), torch.tensor(mask2)
        xg2.apply_token_bitmask_inplace(logits_t, mask_t)
        out = logits_t.numpy()
    else:
        out = logits.copy()
        xg2.apply_token_bitmask_inplace(out, mask2)
    for row in range(2):
        finite = np.nonzero(np.isfinite(out[row]))[0].tolist()
        assert finite == allowed
        assert out[row, 5] == logits[row, 5]


def test_apply_bitmask_indices_and_vocab_size():
    torch = pytest.importorskip("torch")
    logits = torch.zeros(3, 40)
    mask = torch.full((1, 2), -1, dtype=torch.int32)
    mask[0, 0] = 0b1010
    xg2.apply_token_bitmask_inplace(logits, mask, indices=[1], vocab_size=36)
    assert torch.isfinite(logits[0]).all() and torch.isfinite(logits[2]).all()
    row = torch.isfinite(logits[1]).nonzero().flatten().tolist()
    assert row == [1, 3] + list(range(32, 36))


def test_fill_into_torch_and_numpy_rows(small_info):
    torch = pytest.importorskip("torch")
    compiled = xg2.GrammarCompiler(small_info).compile_grammar('root ::= "ab"')
    m = xg2.GrammarMatcher(compiled)
    bt = xg2.allocate_token_bitmask(3, small_info.vocab_size)
    bn = xg2.allocate_token_bitmask(3, small_info.vocab_size, backend="numpy")
    m.fill_next_token_bitmask(bt, 2)
    m.fill_next_token_bitmask(bn, 1)
    assert torch.equal(bt[2], torch.from_numpy(bn[1]))
    assert (bt[0] == -1).all() and (bn[0] == -1).all()
    # the matcher remembers where the last torch row was; a new storage for the same tensor is seen
    m.fill_next_token_bitmask(bt, 2)
    bt.data = torch.full((4, bt.shape[1]), -1, dtype=torch.int32)
    m.fill_next_token_bitmask(bt, 3)
    assert torch.equal(bt[3], torch.from_numpy(bn[1])) and (bt[2] == -1).all()


def test_bad_bitmask_inputs(small_info):
    compiled = xg2.GrammarCompiler(small_info).compile_grammar('root ::= "ab"')
    m = xg2.GrammarMatcher(compiled)
    with pytest.raises(TypeError):
        m.fill_next_token_bitmask(np.zeros((1, 20), dtype=np.int64))
    with pytest.raises(ValueError):
        m.fill_next_token_bitmask(np.zeros((1, 2), dtype=np.int32))
    with pytest.raises(IndexError):
        m.fill_next_token_bitmask(xg2.allocate_token_bitmask(1, small_info.vocab_size, backend="numpy"), 1)
    with pytest.raises(TypeError):
        m.fill_next_token_bitmask([0] * 20)


def test_bad_grammar_and_api_inputs(small_info):
    compiler = xg2.GrammarCompiler(small_info)
    with pytest.raises(xg2.GrammarError) as err:
        compiler.compile_grammar('root ::= "a" | undefined_rule')
    assert err.value.line == 1
    with pytest.raises(xg2.GrammarError):
        compiler.compile_grammar('root ::= "unterminated')
    with pytest.raises(xg2.GrammarError):
        compiler.compile_grammar("root ::= root")  # accepts no string
    with pytest.raises(TypeError):
        compiler.compile_grammar(42)
    with pytest.raises(TypeError):
        xg2.GrammarCompiler("not a tokenizer")
    with pytest.raises(TypeError):
        xg2.GrammarMatcher("not compiled")
    with pytest.raises(ValueError):
        xg2.GrammarMatcher(compiler.compile_grammar('root ::= "a"'), override_stop_tokens=[10**9])
    m = xg2.GrammarMatcher(compiler.compile_grammar('root ::= "a"'))
    assert not m.accept_token(-1) and not m.accept_token(10**9)
    with pytest.raises(ValueError):
        m.rollback(5)


def test_compiler_cache_and_override_stop(small_info):
    compiler = xg2.GrammarCompiler(small_info)
    a = compiler.compile_grammar('root ::= "a"')
    assert compiler.compile_grammar('root ::= "a"') is a
    assert compiler.get_cache_size_bytes() > 0
    compiler.clear_cache()
    assert compiler.get_cache_size_bytes() == 0
    m = xg2.GrammarMatcher(a, override_stop_tokens=[ord("z")])
    assert m.accept_string("a")
    assert m.accept_token(ord("z")) and m.is_terminated()


def test_automaton_size_limit_raises_typed_error(small_info):
    """Automata too large to build must raise GrammarLimitError quickly, not compile for minutes.
    Large bounds over an element that splits text one way are compressed (so they compile), but
    nested bounds that cannot be flattened and ambiguous elements are unrolled, and multiply out."""
    compiler = xg2.GrammarCompiler(small_info)
    with pytest.raises(xg2.GrammarLimitError):
        compiler.compile_grammar('root ::= ((((("a" | "bb"){1,16}){1,16}){1,16}){1,16}){1,16}')
    with pytest.raises(xg2.GrammarLimitError):
        compiler.compile_grammar('root ::= "a"{0,100001}')
    matcher = xg2.GrammarMatcher(compiler.compile_grammar('root ::= ("a"{0,300}){0,300} "!"'))
    assert matcher.accept_string("a" * 5000 + "!") and matcher.is_completed()
