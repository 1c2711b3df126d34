"""Public API: bitmask helpers for numpy and torch, and bad input raising typed errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


def test_apply_bitmask_indices_mask_their_own_rows():
    """Each listed row i of the logits is masked by bitmask row i (xgrammar's convention: the bitmask
    rows line up with the logits); unlisted rows are untouched. The side-by-side comparison with
    xgrammar over every argument combination is tests/test_conventions.py."""
    torch = pytest.importorskip("torch")
    logits = torch.zeros(3, 40)
    mask = torch.zeros(3, 2, dtype=torch.int32)
    for row in range(3):
        mask[row, 0] = 1 << row
    xg2.apply_token_bitmask_inplace(logits, mask, indices=[1])
    assert torch.isfinite(logits[0]).all() and torch.isfinite(logits[2]).all()
    assert torch.isfinite(logits[1]).nonzero().flatten().tolist() == [1]


def test_apply_runs_on_the_tensors_device():
    """The torch path is torch ops on the tensors' own device (CUDA in production), checked here on
    the meta device: it holds no data, so a host copy or a numpy conversion would raise."""
    torch = pytest.importorskip("torch")
    logits = torch.zeros(3, 70, device="meta")
    bitmask = torch.zeros(3, 3, dtype=torch.int32, device="meta")
    for kwargs in [{}, {"vocab_size": 40}, {"indices": [2, 0]}, {"indices": [1], "vocab_size": 64}]:
        xg2.apply_token_bitmask_inplace(logits, bitmask, **kwargs)
        xg2.apply_token_bitmask_inplace(logits[0], bitmask[0], **kwargs if "indices" not in kwargs else {})


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


def test_fill_clears_the_bits_past_the_vocabulary(small_info):
    """No token has the bits of the last word past the vocabulary, so a fill leaves them 0 whatever
    the mask (xgrammar leaves them set when most tokens are allowed). Applied to logits wider than
    the vocabulary with the default vocab_size, those columns are masked, not left open."""
    n_words = (small_info.vocab_size + 31) // 32
    past = 32 * n_words - small_info.vocab_size
    assert past > 0, "the test vocabulary must not fill its last word"
    compiler = xg2.GrammarCompiler(small_info)
    for grammar in [r'root ::= [\x00-\U0010FFFF]*', 'root ::= [^a]*', 'root ::= "ab"', 'root ::= "ab" "c"?']:
        m = xg2.GrammarMatcher(compiler.compile_grammar(grammar))
        for text in ["", "ab"]:
            if m.accept_string(text):
                bitmask = np.full((1, n_words), -1, dtype=np.int32)
                m.fill_next_token_bitmask(bitmask)
                bits = np.unpackbits(bitmask.view(np.uint8), bitorder="little")
                assert not bits[small_info.vocab_size:].any(), (grammar, text)
                assert bits[: small_info.vocab_size].any(), (grammar, text)


def test_bad_bitmask_inputs(small_info):
    compiled = xg2.GrammarCompiler(small_info).compile_grammar('root ::= "ab"')
    m = xg2.GrammarMatcher(compiled)
    n_words = (small_info.vocab_size + 31) // 32
    bad = [np.zeros((1, n_words), dtype=np.int64), np.zeros((1, 2), dtype=np.int32),
           np.zeros((1, n_words + 1), dtype=np.int32), np.zeros((1, 1, n_words), dtype=np.int32),
           np.zeros(2 * n_words, dtype=np.int32), np.zeros((2, 2 * n_words), dtype=np.int32)[:, ::2]]
    for bitmask in bad:
        with pytest.raises(xg2.UsageError):
            m.fill_next_token_bitmask(bitmask)
        assert not bitmask.any(), "nothing is written into a refused bitmask"
    with pytest.raises(xg2.UsageError):
        m.fill_next_token_bitmask(xg2.allocate_token_bitmask(1, small_info.vocab_size, backend="numpy"), 1)
    with pytest.raises(xg2.UsageError):
        m.fill_next_token_bitmask(np.zeros(n_words, dtype=np.int32), 1)
    with pytest.raises(TypeError):
        m.fill_next_token_bitmask(xg2.allocate_token_bitmask(2, small_info.vocab_size, backend="numpy"), 1.0)
    with pytest.raises(TypeError):
        m.fill_next_token_bitmask([0] * 20)
    # UsageError is what xgrammar raises for these checks: ValueError for some, RuntimeError for others
    assert issubclass(xg2.UsageError, ValueError) and issubclass(xg2.UsageError, RuntimeError)


def test_accept_token_and_rollback_argument_types(small_info):
    m = xg2.GrammarMatcher(xg2.GrammarCompiler(small_info).compile_grammar('root ::= "ab" "c"*'))
    for bad in ["97", 97.0, None, b"a", np.float64(97), np.array(97)]:
        with pytest.raises(TypeError):
            m.accept_token(bad)
    for out_of_range in [-1, small_info.vocab_size, 2**31, 2**32 + 97, 2**63, -2**63 - 1, 10**30]:
        assert m.accept_token(out_of_range) is False
    assert m.accept_token(np.int64(ord("a"))) and m.accept_token(np.int32(ord("b")))
    for bad in ["1", 1.0, None]:
        with pytest.raises(TypeError):
            m.rollback(bad)
    for too_many in [3, 2**31, 2**63, -1]:
        with pytest.raises(xg2.UsageError):
            m.rollback(too_many)
    m.rollback(np.int64(1))
    assert not m.is_completed() and m.accept_token(ord("b")) and m.is_completed()


RACE_CHILD = """
import sys, threading
import numpy as np
import xg2
assert "torch" not in sys.modules, "the race needs torch's first import to happen in the threads"
N = 8
barrier = threading.Barrier(N)
failures = []
def work(i):
    barrier.wait()
    try:
        if i % 2:   # a numpy call while torch is half imported by another thread
            xg2.apply_token_bitmask_inplace(np.zeros((1, 64), np.float32), np.full((1, 2), -1, np.int32))
        bitmask = xg2.allocate_token_bitmask(1, 64)
        logits = bitmask.new_zeros((1, 64)).float()
        xg2.apply_token_bitmask_inplace(logits, bitmask)
    except BaseException as exc:
        failures.append(repr(exc))
threads = [threading.Thread(target=work, args=(i,)) for i in range(N)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert not failures, failures
"""


def test_lazy_torch_import_is_thread_safe():
    """Several threads' first calls at once import torch once; none sees the half-initialised module
    (`AttributeError: partially initialized module 'torch'`). A fresh interpreter each run, so the
    first import happens in the threads; before the fix every run failed."""
    pytest.importorskip("torch")
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", RACE_CHILD], check=False, capture_output=True, text=True,
                              timeout=120, cwd=Path(__file__).resolve().parents[1])
        assert proc.returncode == 0, proc.stderr[-2000:]


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
    assert m.accept_token(ord("a")) and m.accept_token(small_info.stop_token_ids[0])
    with pytest.raises(xg2.UsageError):      # no next-token mask after the stop token, as in xgrammar
        m.fill_next_token_bitmask(xg2.allocate_token_bitmask(1, small_info.vocab_size))


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
