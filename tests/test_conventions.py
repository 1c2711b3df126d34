"""Engine call conventions side by side with xgrammar 0.2.8: the same inputs go to both libraries and
their outputs, or the classes of the exceptions they raise, must agree.

vLLM and SGLang call `apply_token_bitmask_inplace`, `fill_next_token_bitmask`, `accept_token` and
`rollback` with xgrammar's semantics, so a difference is a wrong mask in production. Nothing here is
an expected value written by hand: xgrammar is the oracle. Where xg2 deliberately departs from
xgrammar (xgrammar wraps an id to 32 bits, ignores strides, or silently does nothing), the test says
why and compares with what xgrammar does for an input of the same kind it handles soundly.

xgrammar takes torch tensors only; xg2 also takes numpy arrays, with the torch semantics, so numpy
calls are compared with xgrammar's answer on the same data as tensors. Everything runs on a small
vocabulary built here, so no shared data is needed.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import xgrammar as xgr

import xg2

# ------------------------------------------------------------------------------------------- helpers


def outcome(call: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[str, Any, list[type]]:
    """("ok", value, warnings) or ("raise", exception, warnings) of call(*args, **kwargs)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            value = call(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the exception class is what is compared
            return "raise", exc, [w.category for w in caught]
    return "ok", value, [w.category for w in caught]


def assert_same_outcome(ref: tuple, ours: tuple, case: str) -> None:
    """Both succeed (same value and warning categories), or both raise and xg2's exception is an
    instance of xgrammar's class (the same class or a subclass: an engine's `except` still works)."""
    if ref[0] == "raise":
        assert ours[0] == "raise", f"{case}: xgrammar raised {ref[1]!r}, xg2 did not (returned {ours[1]!r})"
        assert isinstance(ours[1], type(ref[1])), \
            f"{case}: xgrammar raised {type(ref[1]).__name__}, xg2 raised {type(ours[1]).__name__}: {ours[1]}"
        return
    assert ours[0] == "ok", f"{case}: xg2 raised {ours[1]!r}, xgrammar returned {ref[1]!r}"
    assert ours[1] == ref[1], f"{case}: xgrammar returned {ref[1]!r}, xg2 {ours[1]!r}"
    assert ours[2] == ref[2], f"{case}: warnings differ: xgrammar {ref[2]}, xg2 {ours[2]}"


def as_numpy(t: torch.Tensor) -> np.ndarray:
    return t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()


# ------------------------------------------------------------------- apply_token_bitmask_inplace

BATCH = 3
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
#: (logits width, bitmask words): exact, a bitmask wider than the logits, one narrower (its last
#: columns left unmasked, with a warning), a width that is a multiple of 32.
WIDTHS = [(70, 3), (40, 3), (100, 3), (64, 2)]
#: the rows to mask; None is every row. [] masks nothing, [1, 1] repeats, [3] and [-1] are outside.
INDICES = [None, [1], [0, 2], [2, 0], [1, 1], [], [3], [-1]]
#: tuples, numpy arrays and tensors of indices: xgrammar's GPU kernel honours them all, its CPU kernel
#: only lists and tensors (a tuple or an array is dropped and every row masked, against its own
#: documentation). xg2 honours them all; they are compared with xgrammar's answer for the list.
CONTAINERS = {"list": list, "tuple": tuple, "ndarray": lambda rows: np.array(rows, dtype=np.int64),
              "tensor": lambda rows: torch.tensor(rows, dtype=torch.int64)}


def _vocab_sizes(width: int, words: int) -> list[int | None]:
    covered = 32 * words
    return sorted({None, 0, 1, 33, width - 5, min(width, covered), width, covered, max(width, covered) + 1},
                  key=lambda v: -1 if v is None else v)


def _inputs(seed: int, width: int, words: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    logits = torch.tensor(rng.standard_normal((BATCH, width)), dtype=dtype)
    bitmask = torch.tensor(rng.integers(-2**31, 2**31, (BATCH, words), dtype=np.int64).astype(np.int32))
    return logits, bitmask


def _apply_both(backend: str, logits: torch.Tensor, bitmask: torch.Tensor, case: str, *,
                shape: Callable[[Any], Any] = lambda x: x, ref_kwargs: dict, our_kwargs: dict) -> None:
    """Apply with xgrammar on tensors and with xg2 on tensors or numpy copies; compare the outcome and
    the logits afterwards (all of them: untouched rows and columns must stay untouched).

    Whether a call is refused (and with which class, and which warnings) is xgrammar's default CPU
    kernel's answer. The masked values are those of xgrammar's pure-torch kernel (`torch_native`,
    the same semantics in plain torch ops): the CPU kernel of 0.2.8 also masks the first disallowed
    token of the last bitmask word when it lies past `vocab_size` -- past the row's end when
    vocab_size is the logits width, so into the next row's first logit (see
    test_apply_never_writes_past_vocab_size).
    """
    ref = outcome(xgr.apply_token_bitmask_inplace, shape(logits.clone()), shape(bitmask.clone()), **ref_kwargs)
    if backend == "numpy":
        our_logits = as_numpy(logits.clone()).copy()
        our_mask = bitmask.numpy().copy()
    else:
        our_logits, our_mask = logits.clone(), bitmask.clone()
    ours = outcome(xg2.apply_token_bitmask_inplace, shape(our_logits), shape(our_mask), **our_kwargs)
    assert_same_outcome(ref, ours, case)
    expected = logits.clone()
    if ref[0] == "ok":
        native_logits, native_mask = shape(expected), shape(bitmask.clone())
        kwargs = dict(ref_kwargs)
        if kwargs.get("indices") is not None and not isinstance(kwargs["indices"], torch.Tensor):
            kwargs["indices"] = list(kwargs["indices"])
        if kwargs.get("indices") is None or len(kwargs["indices"]):    # torch_native cannot index by []
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")     # the narrow-bitmask warning, compared above
                xgr.apply_token_bitmask_inplace(native_logits.view(-1, native_logits.shape[-1]),
                                                native_mask.view(-1, native_mask.shape[-1]),
                                                backend="torch_native", **kwargs)
    got = our_logits if backend == "numpy" else as_numpy(our_logits)
    np.testing.assert_array_equal(got, as_numpy(expected), err_msg=case)


#: numpy has no bfloat16 dtype
BACKEND_DTYPES = [(b, d) for b in ("torch", "numpy") for d in DTYPES if (b, d) != ("numpy", "bfloat16")]


@pytest.mark.parametrize(("backend", "dtype"), BACKEND_DTYPES)
def test_apply_2d_every_indices_and_vocab_size(backend: str, dtype: str) -> None:
    count = 0
    for (width, words), rows, seed in itertools.product(WIDTHS, INDICES, [0]):
        for vocab_size in _vocab_sizes(width, words):
            containers = ["list"] if rows is None else list(CONTAINERS)
            for container in containers:
                logits, bitmask = _inputs(seed + count, width, words, DTYPES[dtype])
                kwargs: dict[str, Any] = {} if vocab_size is None else {"vocab_size": vocab_size}
                ref_kwargs, our_kwargs = dict(kwargs), dict(kwargs)
                if rows is not None:
                    our_kwargs["indices"] = CONTAINERS[container](rows)
                    ref_kwargs["indices"] = our_kwargs["indices"] if container in ("list", "tensor") else list(rows)
                case = f"{backend} {dtype} logits {width} words {words} indices {container} {rows} vocab_size {vocab_size}"
                _apply_both(backend, logits, bitmask, case, ref_kwargs=ref_kwargs, our_kwargs=our_kwargs)
                count += 1
    assert count > 300


@pytest.mark.parametrize(("backend", "dtype"), BACKEND_DTYPES)
@pytest.mark.parametrize("layout", ["1d logits, 1d bitmask", "1d logits, 2d bitmask", "2d logits, 1d bitmask",
                                    "2d logits of 3 rows, 1d bitmask", "3d logits", "3d bitmask"])
def test_apply_1d_and_other_ranks(backend: str, dtype: str, layout: str) -> None:
    for (width, words), vocab_size, rows in itertools.product(WIDTHS, [None, 33, 40], [None, [0], [1]]):
        logits, bitmask = _inputs(width + words, width, words, DTYPES[dtype])
        logits_rows = 3 if layout.startswith("2d logits of 3") or layout == "3d logits" else 1
        logits = logits[:logits_rows]
        if layout.startswith("1d logits"):
            logits = logits[0]
        elif layout == "3d logits":
            logits = logits[None]
        bitmask = bitmask[0] if "1d bitmask" in layout else (bitmask[None, :1] if layout == "3d bitmask" else bitmask[:1])
        kwargs: dict[str, Any] = {} if vocab_size is None else {"vocab_size": vocab_size}
        if rows is not None:
            kwargs["indices"] = rows
        case = f"{backend} {dtype} {layout} logits {width} words {words} vocab_size {vocab_size} indices {rows}"
        _apply_both(backend, logits, bitmask, case, ref_kwargs=kwargs, our_kwargs=kwargs)


@pytest.mark.parametrize("backend", ["torch", "numpy"])
def test_apply_row_strided_views(backend: str) -> None:
    """Logits and bitmasks that are row slices of wider buffers (a padded vocabulary, a bitmask buffer
    sized for the largest vocabulary). Column-strided logits are not compared: xgrammar's CPU kernel
    ignores the column stride and writes the wrong elements."""
    logits, bitmask = _inputs(5, 96, 4, torch.float32)
    for vocab_size, rows in itertools.product([None, 60, 64], [None, [2, 0]]):
        kwargs: dict[str, Any] = {} if vocab_size is None else {"vocab_size": vocab_size}
        if rows is not None:
            kwargs["indices"] = rows
        _apply_both(backend, logits, bitmask, f"{backend} strided rows vocab_size {vocab_size} indices {rows}",
                    shape=lambda x: x[:, :70] if x.shape[1] == 96 else x[:, :3], ref_kwargs=kwargs, our_kwargs=kwargs)


@pytest.mark.parametrize("backend", ["torch", "numpy"])
def test_apply_dtype_requirements(backend: str) -> None:
    logits, bitmask = _inputs(1, 64, 2, torch.float32)
    bad_logits = [torch.float64, torch.int32, torch.int64] if backend == "torch" else [torch.float64, torch.int32]
    for dtype in bad_logits:
        _apply_both(backend, logits.to(dtype), bitmask, f"{backend} logits {dtype}", ref_kwargs={}, our_kwargs={})
    for dtype in (torch.int64, torch.int16, torch.float32):
        _apply_both(backend, logits, bitmask.to(dtype), f"{backend} bitmask {dtype}", ref_kwargs={}, our_kwargs={})


def test_apply_mixed_devices_and_kinds() -> None:
    """Logits and bitmask on different devices: xgrammar raises ValueError before touching anything.
    A numpy array with a tensor is the same mistake for xg2 (xgrammar sees them as two devices)."""
    logits, bitmask = _inputs(2, 64, 2, torch.float32)
    pairs = {
        "cpu logits, meta bitmask": (lambda: logits.clone(), lambda: bitmask.to("meta")),
        "meta logits, cpu bitmask": (lambda: logits.to("meta"), lambda: bitmask.clone()),
        "numpy logits, tensor bitmask": (lambda: logits.numpy().copy(), lambda: bitmask.clone()),
        "tensor logits, numpy bitmask": (lambda: logits.clone(), lambda: bitmask.numpy().copy()),
    }
    for case, (make_logits, make_mask) in pairs.items():
        ref_logits, our_logits = make_logits(), make_logits()
        ref = outcome(xgr.apply_token_bitmask_inplace, ref_logits, make_mask())
        ours = outcome(xg2.apply_token_bitmask_inplace, our_logits, make_mask())
        assert_same_outcome(ref, ours, case)
        if not case.startswith("meta"):
            np.testing.assert_array_equal(np.asarray(our_logits), np.asarray(ref_logits), err_msg=case)


def test_apply_never_writes_past_vocab_size() -> None:
    """The last word of a row allows the tokens below vocab_size and bans one past it. xgrammar
    0.2.8's CPU kernel masks that banned token anyway: one past the row's end, which is the next
    row's first logit (or past the buffer for the last row). xg2 masks what xgrammar's pure-torch
    kernel masks: nothing beyond vocab_size."""
    logits = torch.zeros(2, 70)
    bitmask = torch.full((2, 3), -1, dtype=torch.int32)
    bitmask[0, 2] = 0b111111           # tokens 64..69 allowed, 70..95 (past the vocabulary) banned
    native = logits.clone()
    xgr.apply_token_bitmask_inplace(native, bitmask, backend="torch_native")
    for backend in ("torch", "numpy"):
        ours = logits.clone() if backend == "torch" else logits.numpy().copy()
        xg2.apply_token_bitmask_inplace(ours, bitmask if backend == "torch" else bitmask.numpy())
        np.testing.assert_array_equal(np.asarray(ours), native.numpy(), err_msg=backend)


def test_apply_negative_vocab_size_is_refused() -> None:
    """xgrammar masks nothing for a negative vocab_size; xg2 refuses it (a silent no-op would leave a
    structured request unconstrained), with the class xgrammar raises for a vocab_size that is too
    large, and leaves the logits as xgrammar leaves them."""
    logits, bitmask = _inputs(3, 64, 2, torch.float32)
    too_large = outcome(xgr.apply_token_bitmask_inplace, logits.clone(), bitmask, vocab_size=65)
    ours = outcome(xg2.apply_token_bitmask_inplace, logits.clone(), bitmask, vocab_size=-1)
    assert_same_outcome(too_large, ours, "vocab_size -1")
    ref_logits = logits.clone()
    xgr.apply_token_bitmask_inplace(ref_logits, bitmask, vocab_size=-1)
    assert torch.equal(ref_logits, logits)


# ----------------------------------------------------------------------------- matcher: a vocabulary

#: every byte, a few multi-byte tokens, a stop token, an empty (special) token, and 5 padding ids.
ENCODED = [bytes([b]) for b in range(256)] + [b"ab", b"abc", b"cc", b"</s>", b""]
STOP = ENCODED.index(b"</s>")
VOCAB_SIZE = len(ENCODED) + 5
N_WORDS = (VOCAB_SIZE + 31) // 32
GRAMMAR = 'root ::= "ab" "c"*'


#: a grammar whose masks allow few tokens, and one whose masks allow nearly all (xgrammar builds
#: those from the tokens it rejects); both accept "", "a" and "abc" and can end after "abc".
GRAMMARS = [GRAMMAR, "root ::= [^d]*"]


def _matchers(grammar: str = GRAMMAR, **kwargs: Any) -> tuple[Any, Any]:
    pair = []
    for module in (xgr, xg2):
        info = module.TokenizerInfo(ENCODED, module.VocabType.RAW, vocab_size=VOCAB_SIZE, stop_token_ids=[STOP])
        pair.append(module.GrammarMatcher(module.GrammarCompiler(info).compile_grammar(grammar), **kwargs))
    return pair[0], pair[1]


def test_tokenizer_info_ids_agree() -> None:
    ref = xgr.TokenizerInfo(ENCODED, xgr.VocabType.RAW, vocab_size=VOCAB_SIZE, stop_token_ids=[STOP])
    ours = xg2.TokenizerInfo(ENCODED, xg2.VocabType.RAW, vocab_size=VOCAB_SIZE, stop_token_ids=[STOP])
    assert (ours.vocab_size, list(ours.stop_token_ids)) == (ref.vocab_size, list(ref.stop_token_ids))
    assert sorted(ours.special_token_ids) == sorted(ref.special_token_ids)


#: the bits of the last word past the vocabulary: no token has them, and xgrammar leaves them set
#: when it builds a mask from the tokens it rejects (xg2 clears them), so they are not compared.
PAST_VOCAB = ~((1 << (VOCAB_SIZE % 32)) - 1)


def _in_vocab(buffer: Any) -> np.ndarray:
    """A copy of a bitmask buffer with the bits past the vocabulary cleared (other buffers as they are)."""
    arr = (buffer.numpy() if isinstance(buffer, torch.Tensor) else np.asarray(buffer)).copy()
    if arr.dtype == np.int32 and arr.ndim in (1, 2) and arr.shape[-1] == N_WORDS and arr.size:
        arr[..., -1] &= ~PAST_VOCAB
    return arr


def _same_state(ref: Any, ours: Any, case: str) -> None:
    """The next-token masks (whole, stop and special ids included) and the end flags agree."""
    assert ours.is_terminated() == ref.is_terminated(), case
    assert ours.is_completed() == ref.is_completed(), case
    if ref.is_terminated():
        return
    a, b = torch.zeros(1, N_WORDS, dtype=torch.int32), torch.zeros(1, N_WORDS, dtype=torch.int32)
    assert ours.fill_next_token_bitmask(b) == ref.fill_next_token_bitmask(a), case
    assert np.array_equal(_in_vocab(a), _in_vocab(b)), f"{case}: masks differ"


# -------------------------------------------------------------------------- fill_next_token_bitmask

def _bitmasks() -> dict[str, Callable[[], Any]]:
    """Fresh, distinct buffers (zeros, so a written row shows) of every shape and kind a caller might pass."""
    t = lambda *shape, dtype=torch.int32: torch.zeros(shape, dtype=dtype)
    n = lambda *shape, dtype=np.int32: np.zeros(shape, dtype=dtype)
    return {
        "torch (2, W)": lambda: t(2, N_WORDS), "torch (1, W)": lambda: t(1, N_WORDS),
        "torch (W,)": lambda: t(N_WORDS), "torch flattened (2W,)": lambda: t(2 * N_WORDS),
        "torch (1, 2, W)": lambda: t(1, 2, N_WORDS), "torch (2, 1, W)": lambda: t(2, 1, N_WORDS),
        "torch (1, W - 1)": lambda: t(1, N_WORDS - 1), "torch (1, W + 1)": lambda: t(1, N_WORDS + 1),
        "torch (0, W)": lambda: t(0, N_WORDS), "torch int64": lambda: t(2, N_WORDS, dtype=torch.int64),
        "torch uint32": lambda: t(2, N_WORDS, dtype=torch.uint32),
        "torch float32": lambda: t(2, N_WORDS, dtype=torch.float32),
        "numpy (2, W)": lambda: n(2, N_WORDS), "numpy (W,)": lambda: n(N_WORDS),
        "numpy flattened (2W,)": lambda: n(2 * N_WORDS), "numpy (1, 2, W)": lambda: n(1, 2, N_WORDS),
        "numpy (1, W - 1)": lambda: n(1, N_WORDS - 1), "numpy int64": lambda: n(2, N_WORDS, dtype=np.int64),
        "a list": lambda: [[0] * N_WORDS],
    }


INDEX_VALUES = [0, 1, 2, -1, 2**31, True, np.int64(1), np.int32(0), 1.0, "1", None]


@pytest.mark.parametrize("grammar", GRAMMARS)
@pytest.mark.parametrize("state", ["start", "after a", "after abc (can end)"])
def test_fill_shapes_dtypes_and_indices(grammar: str, state: str) -> None:
    for (name, make), index in itertools.product(_bitmasks().items(), INDEX_VALUES):
        ref, ours = _matchers(grammar)
        for m in (ref, ours):
            assert m.accept_string({"start": "", "after a": "a", "after abc (can end)": "abc"}[state])
        ref_mask, our_mask = make(), make()
        case = f"{state}: {name} index {index!r}"
        assert_same_outcome(outcome(ref.fill_next_token_bitmask, ref_mask, index),
                            outcome(ours.fill_next_token_bitmask, our_mask, index), case)
        # the whole buffer: the filled row alone written, or nothing at all when refused
        assert np.array_equal(_in_vocab(our_mask), _in_vocab(ref_mask)), case
        _same_state(ref, ours, case)


@pytest.mark.parametrize("grammar", GRAMMARS)
def test_fill_after_the_stop_token_and_without_one(grammar: str) -> None:
    for kwargs in ({}, {"terminate_without_stop_token": True}):
        ref, ours = _matchers(grammar, **kwargs)
        for m in (ref, ours):
            assert m.accept_string("abc")
        if not kwargs:
            assert ours.accept_token(STOP) == ref.accept_token(STOP)
        ref_mask, our_mask = torch.zeros(1, N_WORDS, dtype=torch.int32), torch.zeros(1, N_WORDS, dtype=torch.int32)
        assert_same_outcome(outcome(ref.fill_next_token_bitmask, ref_mask),
                            outcome(ours.fill_next_token_bitmask, our_mask), f"fill after the end {kwargs}")
        assert np.array_equal(_in_vocab(our_mask), _in_vocab(ref_mask)), kwargs
        assert ours.is_terminated() == ref.is_terminated()


def test_fill_refuses_strided_views() -> None:
    """xgrammar takes a strided bitmask but ignores its strides: it writes row i at i * W words from
    the start, outside the view's rows, or over words of other rows of the buffer. xg2 refuses the
    view with the class xgrammar raises for a bitmask of a wrong shape, and writes nothing."""
    ref, ours = _matchers()
    wrong_shape = outcome(ref.fill_next_token_bitmask, torch.zeros(1, N_WORDS + 1, dtype=torch.int32))
    for name, buffer, view in [
        ("columns", torch.zeros(2, 2 * N_WORDS, dtype=torch.int32), lambda b: b[:, ::2]),
        ("rows of a wider buffer", torch.zeros(2, 2 * N_WORDS, dtype=torch.int32), lambda b: b[:, :N_WORDS]),
        ("transposed", torch.zeros(N_WORDS, 2, dtype=torch.int32), lambda b: b.T),
        ("numpy columns", np.zeros((2, 2 * N_WORDS), dtype=np.int32), lambda b: b[:, ::2]),
    ]:
        assert_same_outcome(wrong_shape, outcome(ours.fill_next_token_bitmask, view(buffer), 1), name)
        assert not np.asarray(buffer).any(), name


# ------------------------------------------------------------------------- accept_token, rollback

#: arguments whose handling xgrammar defines: ints (bool is an int), numpy integers, non-integers
#: (TypeError), and ids outside [0, vocab) within int64 (rejected: False). A special id and the
#: stop token before the end are rejected tokens.
TOKEN_VALUES = [97, ord("b"), True, False, np.int64(97), np.int32(97), np.uint8(97), np.int64(-1), "97", 97.0,
                np.float64(97), None, b"a", [97], np.array(97), torch.tensor(97), -1, VOCAB_SIZE - 1,
                VOCAB_SIZE, VOCAB_SIZE + 1, 2**31 - 1, 2**31, -2**31, len(ENCODED) - 1, STOP]


@pytest.mark.parametrize("grammar", GRAMMARS)
@pytest.mark.parametrize("prefix", ["", "a", "abc"])
def test_accept_token_argument_types(grammar: str, prefix: str) -> None:
    for value in TOKEN_VALUES:
        ref, ours = _matchers(grammar)
        for m in (ref, ours):
            assert m.accept_string(prefix)
        case = f"after {prefix!r}: accept_token({value!r})"
        assert_same_outcome(outcome(ref.accept_token, value), outcome(ours.accept_token, value), case)
        _same_state(ref, ours, case)


def test_accept_token_ids_xgrammar_mangles() -> None:
    """xgrammar truncates an id to 32 bits (2**32 + 97 is accepted as 97, -2**63 as 0) and raises
    TypeError past int64. All are ids outside the vocabulary: xg2 rejects them as xgrammar rejects
    any other such id, never raising OverflowError."""
    for value, grammar in itertools.product([2**32 + 97, -2**63, 2**63, -2**63 - 1, 10**30], GRAMMARS):
        ref, ours = _matchers(grammar)
        case = f"accept_token({value})"
        assert_same_outcome(outcome(ref.accept_token, VOCAB_SIZE), outcome(ours.accept_token, value), case)
        _same_state(ref, ours, case)


ROLLBACK_VALUES = [0, 1, 2, 3, True, np.int64(1), np.int32(2), "1", 1.0, None, np.float64(1)]


def test_rollback_argument_types() -> None:
    for value in ROLLBACK_VALUES:
        ref, ours = _matchers()
        for m in (ref, ours):
            assert m.accept_token(ord("a")) and m.accept_token(ord("b"))
        case = f"rollback({value!r}) after 2 tokens"
        assert_same_outcome(outcome(ref.rollback, value), outcome(ours.rollback, value), case)
        _same_state(ref, ours, case)
    ref, ours = _matchers()
    for m in (ref, ours):
        assert m.accept_token(ord("a")) and m.accept_token(ord("b"))
    assert_same_outcome(outcome(ref.rollback), outcome(ours.rollback), "rollback() after 2 tokens")
    _same_state(ref, ours, "rollback() after 2 tokens")


def test_rollback_counts_xgrammar_mangles() -> None:
    """xgrammar ignores a negative count, truncates one to 32 bits (2**32 + 1 rolls back 1 token;
    2**31 becomes negative and is ignored) and raises TypeError past int64. xg2 refuses all of them
    with the class xgrammar raises for rolling back more tokens than were accepted, and changes
    nothing."""
    for value in [-1, 2**31, 2**32 + 1, 2**63]:
        ref, ours = _matchers()
        for m in (ref, ours):
            assert m.accept_token(ord("a")) and m.accept_token(ord("b"))
        case = f"rollback({value})"
        assert_same_outcome(outcome(ref.rollback, 3), outcome(ours.rollback, value), case)
        _same_state(ref, ours, case)


# ------------------------------------------------------------------------ Grammar.concat / union

COMBINED = ['root ::= "a" x\nx ::= "b"+', 'root ::= "c" x\nx ::= "ab" | "cc"', 'root ::= [a-c]*']


@pytest.mark.parametrize("how", ["concat", "union"])
@pytest.mark.parametrize("picks", [(0,), (0, 1), (1, 0, 2), (2, 2)])
def test_grammar_concat_and_union_agree(how: str, picks: tuple[int, ...]) -> None:
    """Grammar.concat / union of grammars whose rule names clash: the same masks as xgrammar's along
    every string of up to 5 bytes over a, b, c (and the same verdict on each)."""
    pair = []
    for module in (xgr, xg2):
        grammars = [module.Grammar.from_ebnf(COMBINED[i]) for i in picks]
        info = module.TokenizerInfo(ENCODED, module.VocabType.RAW, vocab_size=VOCAB_SIZE, stop_token_ids=[STOP])
        pair.append(module.GrammarCompiler(info).compile_grammar(getattr(module.Grammar, how)(*grammars)))
    for n in range(6):
        for text in map("".join, itertools.product("abc", repeat=n)):
            ref, ours = (module.GrammarMatcher(g) for module, g in zip((xgr, xg2), pair))
            assert ours.accept_string(text) == ref.accept_string(text), f"{how}{picks}: {text!r}"
            _same_state(ref, ours, f"{how}{picks} after {text!r}")


def test_grammar_combinations_refuse_what_is_not_a_grammar() -> None:
    g = xg2.Grammar.from_ebnf('root ::= "a"')
    with pytest.raises(TypeError):
        xg2.Grammar.union(g, 'root ::= "b"')
    with pytest.raises(xg2.GrammarError):
        xg2.Grammar.concat()


# ------------------------------------------------------------------------ the empty vocabulary

def test_empty_vocabulary_matches_text_as_xgrammar() -> None:
    """TokenizerInfo([]): no tokens, grammars matched as text (xgrammar's way to test a grammar);
    bitmasks of zero words, and an empty batch, are sizes as in xgrammar."""
    for shape in [(1, 0), (0, 5), (3, 0)]:
        assert tuple(xg2.allocate_token_bitmask(*shape).shape) == tuple(xgr.allocate_token_bitmask(*shape).shape)
    with pytest.raises(ValueError):
        xg2.allocate_token_bitmask(1, -1)        # xgrammar reads -1 as 0; refused here
    pair = []
    for module in (xgr, xg2):
        info = module.TokenizerInfo([])
        assert (info.vocab_size, list(info.stop_token_ids)) == (0, [])
        pair.append(module.GrammarCompiler(info).compile_grammar('root ::= "a" [0-9]* ("." [0-9]+)?'))
    for text in ["", "a", "a12", "a1.5", "a.", "b", "a1.5.2"]:
        ref, ours = (module.GrammarMatcher(g) for module, g in zip((xgr, xg2), pair))
        assert ours.accept_string(text) == ref.accept_string(text), text
        assert ours.is_completed() == ref.is_completed(), text
    ours = xg2.GrammarMatcher(pair[1])
    assert ours.fill_next_token_bitmask(xg2.allocate_token_bitmask(1, 0)) is True   # nothing to write


# ------------------------------------------------------------------------ structural tag repeat

@pytest.mark.parametrize(("lo", "hi"), [(0, -1), (2, -1), (1, 3), (0, 0)])
def test_structural_tag_repeat_bounds_agree(lo: int, hi: int) -> None:
    """`repeat` with `max: -1` is unbounded in xgrammar; every string of up to 8 bytes over a, b is
    judged alike."""
    tag = {"type": "structural_tag", "format": {"type": "repeat", "min": lo, "max": hi,
                                                "content": {"type": "const_string", "value": "ab"}}}
    pair = [module.GrammarCompiler(module.TokenizerInfo([])).compile_structural_tag(tag) for module in (xgr, xg2)]
    for n in range(9):
        for text in map("".join, itertools.product("ab", repeat=n)):
            ref, ours = (module.GrammarMatcher(g) for module, g in zip((xgr, xg2), pair))
            assert ours.accept_string(text) == ref.accept_string(text), text
            assert ours.is_completed() == ref.is_completed(), text


# ------------------------------------------------------------------------ EBNF's Regex macro

REGEX_MACROS = ['root ::= Regex("[a-z]+")', 'root ::= "x" Regex("[0-9]{2}") "y"', 'root ::= Regex("[a-c]+", flags="i")',
                'root ::= Regex("a.b", flags="s")', 'root ::= Regex("(?i)ab") "c"', 'root ::= Regex("(a|bc)*")+ "."']


@pytest.mark.parametrize("src", REGEX_MACROS)
def test_ebnf_regex_macro_agrees(src: str) -> None:
    """xgrammar's `Regex("pattern", flags=...)` inside EBNF: every string of up to 4 characters over
    a small alphabet (letters in both cases, digits, '.', newline) is judged alike. ('.' without
    flag 's' is left out of the alphabet's newline cases: xgrammar's '.' takes a newline, xg2's
    follows Python and ECMAScript.)"""
    pair = [module.GrammarCompiler(module.TokenizerInfo([])).compile_grammar(src) for module in (xgr, xg2)]
    for n in range(5):
        for text in map("".join, itertools.product("abcAB0x.\n", repeat=n)):
            ref, ours = (module.GrammarMatcher(g) for module, g in zip((xgr, xg2), pair))
            assert ours.accept_string(text) == ref.accept_string(text), f"{src}: {text!r}"
            assert ours.is_completed() == ref.is_completed(), f"{src}: {text!r}"


@pytest.mark.parametrize("src", [r'root ::= Regex("\\S+", json_string=true)', 'root ::= Regex(".+", json_string=true)',
                                 'root ::= Regex("a[^b]*", flags="u", json_string=true)',
                                 'root ::= Regex("[a\\\\\\"]+", json_string=false)'])
def test_ebnf_regex_json_string_agrees(src: str) -> None:
    """`json_string=true` keeps the quote, the backslash and the C0 controls out of every character
    the pattern matches (so the text can sit inside a JSON string as it is); flag 'u' changes
    nothing. Every string of up to 4 characters over an alphabet holding them is judged alike."""
    pair = [module.GrammarCompiler(module.TokenizerInfo([])).compile_grammar(src) for module in (xgr, xg2)]
    for n in range(5):
        for text in map("".join, itertools.product('ab"\\\t .', repeat=n)):
            ref, ours = (module.GrammarMatcher(g) for module, g in zip((xgr, xg2), pair))
            assert ours.accept_string(text) == ref.accept_string(text), f"{src}: {text!r}"
            assert ours.is_completed() == ref.is_completed(), f"{src}: {text!r}"


@pytest.mark.parametrize("src", ['root ::= Regex("a", "b")', "root ::= Regex()", 'root ::= Regex("a", foo="i")',
                                 'root ::= Regex("a", json_string="yes")', 'root ::= Regex("a", flags=true)',
                                 'root ::= Regex(abc)',
                                 'root ::= Regex("a", flags="m")', 'root ::= "a" flags="b"',
                                 'root ::= Regex("ab?",)'])
def test_ebnf_regex_macro_refusals_agree(src: str) -> None:
    with pytest.raises(RuntimeError):
        xgr.Grammar.from_ebnf(src)
    with pytest.raises(xg2.GrammarError):
        xg2.Grammar.from_ebnf(src)


# ------------------------------------------------------------------------ signatures engines call

def test_temperatures_and_static_batch_calls_agree(capsys: pytest.CaptureFixture) -> None:
    """`default_temperature` and `temperature`, `BatchGrammarMatcher.batch_fill_temperature`, the
    batch calls xgrammar makes static, `print_converted_ebnf`, apply's `backend`: as in xgrammar."""
    outs = []
    for module in (xgr, xg2):
        info = module.TokenizerInfo(ENCODED, module.VocabType.RAW, vocab_size=VOCAB_SIZE, stop_token_ids=[STOP])
        compiled = module.GrammarCompiler(info).compile_grammar(GRAMMAR)
        warm, plain = module.GrammarMatcher(compiled, default_temperature=0.5), module.GrammarMatcher(compiled)
        temps = torch.full((4,), 9.0)
        module.BatchGrammarMatcher.batch_fill_temperature([warm, plain], temps, [3, 1])
        accepted = module.BatchGrammarMatcher.batch_accept_string([warm, plain], ["ab", "x"])
        module.BatchGrammarMatcher.batch_rollback([warm], 1)
        accepted += module.BatchGrammarMatcher.batch_accept_token([warm], [ENCODED.index(b"ab")])
        module.Grammar.from_regex("a+", print_converted_ebnf=True)
        module.Grammar.from_json_schema({"type": "integer"}, print_converted_ebnf=True)
        printed = capsys.readouterr().out
        logits = torch.zeros(1, VOCAB_SIZE)
        module.apply_token_bitmask_inplace(logits, torch.zeros(1, N_WORDS, dtype=torch.int32), backend="torch_native")
        outs.append((warm.temperature, plain.temperature, temps.tolist(), accepted, torch.isinf(logits).all().item()))
    assert outs[0] == outs[1]
    # (xgrammar prints the converted EBNF from C++, out of capsys' sight; xg2 prints it from Python)
    assert "root ::=" in printed
    with pytest.raises(ValueError):
        xg2.GrammarMatcher(compiled, default_temperature=-1.0)
    with pytest.raises(xg2.UsageError):
        xg2.apply_token_bitmask_inplace(torch.zeros(1, 32), torch.zeros(1, 1, dtype=torch.int32), backend="gpu")


# ------------------------------------------------------------------------ xgrammar.kernels' names

@pytest.mark.parametrize("name", ["apply_token_bitmask_inplace_cpu", "apply_token_bitmask_inplace_torch_compile"])
def test_kernel_modules_mask_as_xgrammars_cpu_kernel(name: str) -> None:
    """xgrammar.kernels' modules by name (the CUDA one takes CUDA tensors, refused here on the CPU):
    each masks what xgrammar's CPU kernel masks, rows by index and a vocabulary cut included."""
    import importlib

    from xgrammar.kernels.apply_token_bitmask_inplace_cpu import apply_token_bitmask_inplace_cpu as ref

    ours = getattr(importlib.import_module(f"xg2.kernels.{name}"), name)
    gen = torch.Generator().manual_seed(0)
    for rows, vocab, indices, vs in [(2, 64, None, None), (3, 100, [0, 2], None), (2, 70, None, 50), (1, 33, [0], 33)]:
        logits = torch.randn(rows, vocab, generator=gen)
        bitmask = torch.randint(-2**31, 2**31 - 1, (rows, (vocab + 31) // 32), dtype=torch.int32, generator=gen)
        a, b = logits.clone(), logits.clone()
        ref(a, bitmask, vs, indices)
        ours(b, bitmask, vs, indices)
        assert torch.equal(a, b), (name, rows, vocab, indices, vs)
    from xg2.kernels.apply_token_bitmask_inplace_cuda import apply_token_bitmask_inplace_cuda

    with pytest.raises(xg2.UsageError):
        apply_token_bitmask_inplace_cuda(torch.zeros(1, 32), torch.zeros(1, 1, dtype=torch.int32))


@pytest.mark.parametrize("src", ['root ::= TagDispatch(loop_after_dispatch=true)',
                                 'root ::= TagDispatch(excludes=("end"), loop_after_dispatch=true)',
                                 'root ::= TagDispatch(("<a>", x), loop_after_dispatch=false)\nx ::= "1"'])
def test_tag_dispatch_without_or_with_tags_agrees(src: str) -> None:
    """TagDispatch with no (tag, rule) pair is free text (with its excludes), as in xgrammar."""
    pair = [module.GrammarCompiler(module.TokenizerInfo([])).compile_grammar(src) for module in (xgr, xg2)]
    for n in range(5):
        for text in map("".join, itertools.product(["a", "e", "n", "d", "<a>", "1", "好"], repeat=n)):
            ref, ours = (module.GrammarMatcher(g) for module, g in zip((xgr, xg2), pair))
            assert ours.accept_string(text) == ref.accept_string(text), f"{src}: {text!r}"
            assert ours.is_completed() == ref.is_completed(), f"{src}: {text!r}"


@pytest.mark.parametrize(("src", "alphabet"), [('root ::= Substring("abc", "de", "fg")', "abcdefgx"),
                                               ('root ::= Substring("a", "", "b", "a", "b")', "ab"),
                                               ("root ::= Substring()", "a"),
                                               ('root ::= "x" Substring("ab", "cd") "y"', "xabcdy"),
                                               ('root ::= Substring("ab") | "z"', "abz")])
def test_substring_macro_agrees(src: str, alphabet: str) -> None:
    """EBNF's Substring(...): any contiguous run of whole chunks, in order (the empty one too);
    every string of up to 6 characters over the alphabet judged as xgrammar judges it."""
    pair = [module.GrammarCompiler(module.TokenizerInfo([])).compile_grammar(src) for module in (xgr, xg2)]
    for n in range(7):
        for text in map("".join, itertools.product(alphabet, repeat=n)):
            ref, ours = (module.GrammarMatcher(g) for module, g in zip((xgr, xg2), pair))
            assert ours.accept_string(text) == ref.accept_string(text), f"{src}: {text!r}"
            assert ours.is_completed() == ref.is_completed(), f"{src}: {text!r}"
    with pytest.raises(xg2.GrammarLimitError):
        xg2.Grammar.from_ebnf("root ::= Substring(" + ", ".join(['"a"'] * 300) + ")")


def test_recursion_depth_settings_agree() -> None:
    """xgrammar's process-wide recursion depth: default, set, context manager, refusals (in xg2
    the value is kept and checked and bounds nothing: xg2 recurses nowhere on its input)."""
    for module in (xgr, xg2):
        default = module.get_max_recursion_depth()
        assert default == 10_000
        with module.max_recursion_depth(1000):
            assert module.get_max_recursion_depth() == 1000
        assert module.get_max_recursion_depth() == default
        for bad in (-1, 100_000_000):
            with pytest.raises(RuntimeError):
                module.set_max_recursion_depth(bad)


TAIL_TEXT_TAGS = [
    {"type": "tag", "begin": "<start>", "end": "<end>", "content": {"type": "sequence", "elements": [
        {"type": "const_string", "value": "[T]"}, {"type": "any_text"}]}},
    {"type": "tag", "begin": "<s>", "end": "<e>", "content": {"type": "or", "elements": [
        {"type": "sequence", "elements": [{"type": "const_string", "value": "X"}, {"type": "any_text"}]},
        {"type": "const_string", "value": "Y"}]}},
    {"type": "tag", "begin": "<s>", "end": "<e>", "content": {"type": "optional", "content": {
        "type": "any_text", "excludes": ["q"]}}},
]


@pytest.mark.parametrize("fmt", TAIL_TEXT_TAGS)
def test_free_text_at_the_end_of_a_tag_content_agrees(fmt: dict) -> None:
    """Free text at the end of a tag's composite content never holds the tag's end (xgrammar's
    end-string detection); every sequence of up to 4 pieces judged as xgrammar judges it."""
    tag = {"type": "structural_tag", "format": fmt}
    pair = [module.GrammarCompiler(module.TokenizerInfo([])).compile_structural_tag(tag) for module in (xgr, xg2)]
    pieces = ["<start>", "<s>", "[T]", "X", "Y", "a", "q", "<end>", "<e>", "<", "e>"]
    for n in range(5):
        for text in map("".join, itertools.product(pieces, repeat=n)):
            ref, ours = (module.GrammarMatcher(g) for module, g in zip((xgr, xg2), pair))
            assert ours.accept_string(text) == ref.accept_string(text), f"{fmt}: {text!r}"
            assert ours.is_completed() == ref.is_completed(), f"{fmt}: {text!r}"
    bordered = {"type": "tag", "begin": "<s>", "end": "aba", "content": {"type": "sequence", "elements": [
        {"type": "const_string", "value": "X"}, {"type": "any_text"}]}}
    with pytest.raises(xg2.StructuralTagError, match="overlaps itself"):
        xg2.GrammarCompiler(xg2.TokenizerInfo([])).compile_structural_tag({"type": "structural_tag", "format": bordered})


# ------------------------------------------------------------------------ vocabulary types

def test_vocab_type_printing_and_detection_agree() -> None:
    """`str(VocabType.X)` and the private `_detect_vocab_type_from_vocab` engines' tests call read
    the same on both engines, for byte-fallback, byte-level, mixed and plain vocabularies."""
    byte_pieces = {f"<0x{b:02X}>": b for b in range(256)} | {"▁hi": 256}
    level = {ch: i for i, ch in enumerate(sorted(xgr.tokenizer_info._BYTE_LEVEL_CHARSET))} | {"Ġhi": 256}
    mixed = level | {k: v + 300 for k, v in byte_pieces.items()}
    plain = {"hello": 0, "##ing": 1, "a": 2}
    for vocab in (byte_pieces, level, mixed, plain, {"<0x41>": 0, "Ġ": 1}):
        ref = xgr.TokenizerInfo._detect_vocab_type_from_vocab(vocab)
        ours = xg2.TokenizerInfo._detect_vocab_type_from_vocab(vocab)
        assert (ref and ref.name) == (ours and ours.name)
    for kind in xgr.VocabType:
        assert str(getattr(xg2.VocabType, kind.name)) == str(kind)


# ------------------------------------------------------------------------ rule temperatures

TEMPERATURE_GRAMMARS = [
    ('root ::= "a" value "z"\nvalue[temperature=0.6] ::= "x"+', ["axxz", "axz"]),
    ('root ::= left | right\nleft[temperature=0.2] ::= "a"+\nright[temperature=0.9] ::= "a" "b"', ["aaa", "ab"]),
    ('root[temperature=0.3] ::= "q" inner "q"\ninner[temperature=1.5] ::= [0-9]+ | "(" root ")"', ["q1q", "q(q23q)q"]),
    ('root ::= (item ",")* "end"\nitem[temperature=0] ::= "k" [a-c]*', ["kab,k,end", "end"]),
]


@pytest.mark.parametrize("src, texts", TEMPERATURE_GRAMMARS)
def test_rule_temperatures_agree(src: str, texts: list[str]) -> None:
    """EBNF's `name[temperature=t]`: `matcher.temperature` after every character, after rollbacks
    and resets, and the draft tree's temperatures, as in xgrammar (whose rule, on paths that
    disagree, is the highest)."""
    vocab = [chr(c) for c in range(32, 127)]
    infos = [module.TokenizerInfo(vocab, vocab_size=len(vocab), stop_token_ids=[]) for module in (xgr, xg2)]
    pair = [module.GrammarCompiler(info).compile_grammar(src) for module, info in zip((xgr, xg2), infos)]
    assert "[temperature=" in str(xg2.Grammar.from_ebnf(str(xg2.Grammar.from_ebnf(src))))
    for default in (None, 0.1):
        for text in texts:
            ms = [module.GrammarMatcher(g, default_temperature=default, max_rollback_tokens=-1)
                  for module, g in zip((xgr, xg2), pair)]
            seen = []
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for ch in text:
                    seen.append([m.temperature for m in ms])
                    assert all(m.accept_token(vocab.index(ch)) for m in ms), (src, text, ch)
                seen.append([m.temperature for m in ms])
                for m in ms:
                    m.rollback(2)
                seen.append([m.temperature for m in ms])
                for m in ms:
                    m.reset()
                seen.append([m.temperature for m in ms])
            for ref, ours in seen:
                assert ours == pytest.approx(ref), (src, text, seen)
            # The draft tree: a chain of the text's tokens from where the matchers stand.
            n = len(text) + 1
            nxt = torch.tensor(list(range(1, n)) + [-1], dtype=torch.int64)
            sib = torch.full((n,), -1, dtype=torch.int64)
            drafts = torch.tensor([0] + [vocab.index(c) for c in text], dtype=torch.int64)
            temps = []
            for m, module in zip(ms, (xgr, xg2)):
                t = torch.zeros(n, dtype=torch.float32)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    m.traverse_draft_tree(nxt, sib, drafts, module.allocate_token_bitmask(n, len(vocab)),
                                          temperatures=t)
                temps.append(t)
            torch.testing.assert_close(temps[1], temps[0])


def test_rule_temperature_refusals_agree() -> None:
    for src in ['root[temperature=-0.1] ::= "a"', 'root[temperature=1e999] ::= "a"',
                'root[temperature=0.1, temperature=0.2] ::= "a"']:
        with pytest.raises(RuntimeError):
            xgr.Grammar.from_ebnf(src)
        with pytest.raises(xg2.GrammarError, match="temperature"):
            xg2.Grammar.from_ebnf(src)


LARK_TEMPERATURES = [
    ('%import common.WS\n%ignore WS\nstart: hot "z"\nhot[temperature=0.6]: "x"', ["x z", "xz"]),
    ('start: "a" value "z"\nvalue[temperature=0.6]: %json {"type": "integer"}', ["a12z"]),
    ('start: (num ",")* num\nnum[temperature=1.25]: /[0-9]+/', ["1,22,3"]),
    ('start: pair+\npair: key "=" val ";"\nkey[temperature=0]: /[a-z]+/\nval[temperature=2e-1]: /[0-9]+/', ["ab=1;c=23;"]),
]


@pytest.mark.parametrize("src, texts", LARK_TEMPERATURES)
def test_lark_rule_temperatures_agree(src: str, texts: list[str]) -> None:
    """Lark's `rule[temperature=t]` on a lexeme or a subgrammar, what is ignored after it, and
    `matcher.temperature` after every character, as in xgrammar."""
    vocab = [chr(c) for c in range(32, 127)]
    infos = [module.TokenizerInfo(vocab, vocab_size=len(vocab), stop_token_ids=[]) for module in (xgr, xg2)]
    pair = [module.GrammarCompiler(info).compile_grammar(module.Grammar.from_lark(src))
            for module, info in zip((xgr, xg2), infos)]
    for text in texts:
        ms = [module.GrammarMatcher(g, default_temperature=0.5) for module, g in zip((xgr, xg2), pair)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for ch in text:
                assert ms[1].temperature == pytest.approx(ms[0].temperature), (src, text, ch)
                assert [m.accept_token(vocab.index(ch)) for m in ms] == [True, True], (src, text, ch)
            assert ms[1].temperature == pytest.approx(ms[0].temperature), (src, text)


@pytest.mark.parametrize("src", ['start[temperature=-0.1]: "a"', 'start[temperature=1e999]: "a"',
                                 'start: complex\ncomplex[temperature=0.5]: "a" child\nchild: "b"',
                                 'start[temperature=0.1, temperature=0.2]: "a"', 'start[temperature=x]: "a"'])
def test_lark_rule_temperature_refusals_agree(src: str) -> None:
    with pytest.raises(RuntimeError):
        xgr.Grammar.from_lark(src)
    with pytest.raises(xg2.GrammarError, match="temperature"):
        xg2.Grammar.from_lark(src)


# ------------------------------------------------------------------------ token edges

TOKEN_VOCAB = ["<s>", "</s>", "aa", "bb", "cc", "dd", "a", "<|x|>", "", "b", "x", "y"]
TOKEN_EDGE_GRAMMARS = [
    "root ::= Token(2, 4)", "root ::= ExcludeToken(2, 4)", 'root ::= Token(2) "bb"', 'root ::= Token(2) | "a" "a"',
    'root ::= Token(0, 1, 7, 8) "bb"', 'root ::= ExcludeToken(2) "bb"', "root ::= Token(2)*",
    'root ::= "a" Token(6) "b"', 'root ::= x Token(3)\nx ::= "a" | "a" "a"', 'root ::= (Token(2) | "b")+ "c"',
    'root ::= TokenTagDispatch((3, body), excludes=(4,))\nbody ::= Token(10, 11) "b"',
    'root ::= TokenTagDispatch((3, body), (5, body), loop_after_dispatch=false)\nbody ::= "aa"',
    'root ::= [a-z]+ loop Token(5) [a-z]+\nloop ::= TokenTagDispatch(excludes=(4, 5))',
]


@pytest.mark.parametrize("src", TOKEN_EDGE_GRAMMARS)
def test_token_edges_agree(src: str) -> None:
    """EBNF's Token(...), ExcludeToken(...) and TokenTagDispatch(...): the mask and the answer of
    accept_token at every step of every sequence of up to 3 tokens, then rollback and fork, as
    in xgrammar."""
    infos = [module.TokenizerInfo(TOKEN_VOCAB) for module in (xgr, xg2)]
    pair = [module.GrammarCompiler(info).compile_grammar(src) for module, info in zip((xgr, xg2), infos)]
    n = len(TOKEN_VOCAB)

    def allowed(module, m) -> list[int]:
        bm = module.allocate_token_bitmask(1, n)
        m.fill_next_token_bitmask(bm)
        return [i for i in range(n) if (int(bm[0, i // 32]) >> (i % 32)) & 1]

    for path in itertools.product(range(n), repeat=3):
        ms = [module.GrammarMatcher(g) for module, g in zip((xgr, xg2), pair)]
        for t in path:
            assert allowed(xg2, ms[1]) == allowed(xgr, ms[0]), (src, path, t)
            ok = [m.accept_token(t) for m in ms]
            assert ok[1] == ok[0], (src, path, t)
            assert ms[1].is_terminated() == ms[0].is_terminated(), (src, path, t)
            if not ok[0] or ms[0].is_terminated():
                break
        else:
            fork = ms[1].fork()
            before = allowed(xgr, ms[0])
            assert allowed(xg2, fork) == before, (src, path, "fork")
            ms[1].rollback(1)
            ms[0].rollback(1)
            assert allowed(xg2, ms[1]) == allowed(xgr, ms[0]), (src, path, "rollback")
            assert allowed(xg2, fork) == before, (src, path, "the fork after the original's rollback")


def test_token_edge_ids_outside_the_vocabulary_are_refused() -> None:
    info = xg2.TokenizerInfo(["a", "b"])
    with pytest.raises(xg2.GrammarError, match="outside the vocabulary"):
        xg2.GrammarCompiler(info).compile_grammar('root ::= Token(2147483647) "a"')
    with pytest.raises(xg2.GrammarError, match="both a trigger and excluded"):
        xg2.Grammar.from_ebnf("root ::= TokenTagDispatch((1, r), excludes=(1,))\nr ::= Token(0)")


STAG_TOKEN_VOCAB = ["<s>", "</s>", "<tool>", "<end>", "<bad>", "hello", "world", "x", "<think>", "</think>"]
STAG_TOKEN_FORMATS = [
    {"type": "tag", "begin": {"type": "token", "token": "<tool>"},
     "content": {"type": "exclude_token", "exclude_tokens": [4]}, "end": {"type": "token", "token": "<end>"}},
    {"type": "sequence", "elements": [
        {"type": "tag", "begin": "<tool>", "content": {"type": "exclude_token", "exclude_tokens": ["<bad>", 7]},
         "end": "<end>"},
        {"type": "exclude_token", "exclude_tokens": [2]}]},
]


@pytest.mark.parametrize("fmt", STAG_TOKEN_FORMATS)
def test_structural_tag_exclude_token_agrees(fmt: dict) -> None:
    """A structural tag's `exclude_token` (one token, any but these and the tag's end token): the
    mask and accept_token at every step of every 4-token sequence, as in xgrammar."""
    tag = {"type": "structural_tag", "format": fmt}
    infos = [module.TokenizerInfo(STAG_TOKEN_VOCAB) for module in (xgr, xg2)]
    pair = [module.GrammarCompiler(info).compile_structural_tag(tag) for module, info in zip((xgr, xg2), infos)]
    n = len(STAG_TOKEN_VOCAB)

    def allowed(module, m) -> list[int]:
        bm = module.allocate_token_bitmask(1, n)
        m.fill_next_token_bitmask(bm)
        return [i for i in range(n) if (int(bm[0, i // 32]) >> (i % 32)) & 1]

    for path in itertools.product([2, 3, 4, 5, 7, 1], repeat=4):
        ms = [module.GrammarMatcher(g) for module, g in zip((xgr, xg2), pair)]
        for t in path:
            assert allowed(xg2, ms[1]) == allowed(xgr, ms[0]), (fmt, path, t)
            ok = [m.accept_token(t) for m in ms]
            assert ok[1] == ok[0], (fmt, path, t)
            if not ok[0] or ms[0].is_terminated():
                break


def test_jump_forward_stops_at_token_edges_and_debug_state_lists_items() -> None:
    """A token edge is not text: the forced string stops before it, also where text is the other
    choice (xgrammar's jump-forward ignores the edge there and forces "q" and "cd", which a
    Token(3) the model may still pick would contradict). `_debug_print_internal_state` lists the
    current state set's items, one ParserState each."""
    info = xg2.TokenizerInfo(TOKEN_VOCAB)
    compiler = xg2.GrammarCompiler(info)
    for src, forced in [('root ::= "ab" Token(3) "cd"', "ab"), ('root ::= "ab" (Token(3) | "q") "cd"', "ab"),
                        ('root ::= "x" ExcludeToken(2) "yy"', "x"), ('root ::= "x" [y] "z"', "xyz")]:
        assert xg2.GrammarMatcher(compiler.compile_grammar(src)).find_jump_forward_string() == forced, src
    # (rules with a temperature stay rules of their own, so the state shows them)
    m = xg2.GrammarMatcher(compiler.compile_grammar('root ::= "a" (b | c)\nb[temperature=1] ::= "x"+ "y"\n'
                                                    'c[temperature=2] ::= "x" "z"'))
    assert m.accept_string("ax")
    state = m._debug_print_internal_state()
    assert state.count("ParserState(") >= 2 and "rule=b" in state and "rule=c" in state, state


# ------------------------------------------------------------------------ captures

CAPTURE_CASES = [
    ('start: "a" v "b"\nv[capture]: /[0-9]+/', ["a123b", "a1b"]),
    ('start: outer\nouter[capture="o"]: "x" inner "!"\ninner[capture="i"]: /[a-z]+/', ["xabc!"]),
    ('start: (item ",")* item\nitem[capture]: /[0-9]+/', ["1,22,333", "7"]),
    ('start: lst\nlst[capture]: ITEM "," lst | ITEM\nITEM: /[0-9]+/', ["1,2,3"]),
    ('start[capture="all"]: "a" /[0-9]+/ "b"', ["a12b"]),
    ('start: a | c\na[capture="a"]: "x" "q"\nc[capture="c"]: "x!"', ["x!", "xq"]),
    ('start: k "=" v\nk[capture, temperature=0.5]: /[a-z]+/\nv[capture="val"]: %json {"type": "integer"}',
     ["ab=12", "z=-3"]),
]


@pytest.mark.parametrize("src, texts", CAPTURE_CASES)
def test_captures_agree(src: str, texts: list[str]) -> None:
    """Lark's `[capture]` / `[capture="name"]`: get_captures (deduplicated and raw) after each
    character, after a rollback, and on a fork, as in xgrammar."""
    vocab = [chr(c) for c in range(32, 127)]
    infos = [module.TokenizerInfo(vocab, stop_token_ids=[]) for module in (xgr, xg2)]
    pair = [module.GrammarCompiler(info).compile_grammar(module.Grammar.from_lark(src))
            for module, info in zip((xgr, xg2), infos)]
    for text in texts:
        ms = [module.GrammarMatcher(g, terminate_without_stop_token=True) for module, g in zip((xgr, xg2), pair)]
        for ch in text:
            assert [m.accept_token(vocab.index(ch)) for m in ms] == [True, True], (src, text, ch)
            for dedup in (True, False):
                assert ms[1].get_captures(deduplicate=dedup) == ms[0].get_captures(deduplicate=dedup), \
                    (src, text, ch, dedup)
        fork, before = ms[1].fork(), ms[1].get_captures(deduplicate=False)
        for m in ms:
            m.rollback(1)
        assert ms[1].get_captures(deduplicate=False) == ms[0].get_captures(deduplicate=False), (src, text)
        assert fork.get_captures(deduplicate=False) == before, (src, text, "the fork keeps its captures")


def test_ebnf_capture_attribute_reads_and_prints() -> None:
    g = xg2.Grammar.from_ebnf('root ::= "a" v "b"\nv[capture] ::= [0-9]+\nw[capture="x-1"] ::= "q"')
    assert 'v[capture="v"] ::=' in str(g) and 'w[capture="x-1"] ::=' in str(g)
    assert str(xg2.Grammar.from_ebnf(str(g))) == str(g)
    m = xg2.GrammarMatcher(xg2.GrammarCompiler(xg2.TokenizerInfo([])).compile_grammar(g))
    assert m.accept_string("a42b") and m.get_captures() == [("v", b"42")]
    for bad in ['root[capture=""] ::= "a"', 'root[capture="a b"] ::= "a"', "root[capture=x] ::= \"a\""]:
        with pytest.raises(xg2.GrammarError, match="capture"):
            xg2.Grammar.from_ebnf(bad)


# ------------------------------------------------------------------------ character budgets

CHAR_BUDGETS = [
    ("ebnf", 'root ::= v ">"\nv[max_chars=2] ::= [^]*'),
    ("ebnf", 'root ::= v ">"\nv[max_chars=0] ::= [a-z]*'),
    ("ebnf", 'root ::= v ("," v)* ">"\nv[max_chars=3] ::= w ("-" w?)?\nw ::= [ab]+'),
    ("lark", 'start: reasoning ">"\nreasoning[max_chars=2]: TEXT\nTEXT: /(\\n|.)*/'),
    ("lark", 'start: value ">"\nvalue[max_chars=3, temperature=0.7]: /[a-z]*/ "!"?'),
    ("lark", 'start: (item ";")+\nitem[max_chars=2, capture]: /[ab]+/ | "c"'),
]


@pytest.mark.parametrize("kind, src", CHAR_BUDGETS)
def test_char_budgets_agree(kind: str, src: str) -> None:
    """`[max_chars=n]`: every string of up to 5 characters over a small alphabet (one of them
    multi-byte) is judged alike by both engines, as a prefix and as a whole output, where the rule
    can end wherever its budget runs out. Where it cannot, xgrammar's budget is best effort: under
    ``v[max_chars=3] ::= w ("-" w)?`` it lets `aa-` in and then lets `v` run past its budget to
    `aa-a`; xg2's budget is the bounded language, so `aa-` is refused (no continuation fits) and
    no text of `v` is longer than 3 (tested in test_ebnf)."""
    pair = [module.GrammarCompiler(module.TokenizerInfo([])).compile_grammar(
        module.Grammar.from_ebnf(src) if kind == "ebnf" else module.Grammar.from_lark(src)) for module in (xgr, xg2)]
    for n in range(6):
        for text in map("".join, itertools.product("ab-,>;!é", repeat=n)):
            ref, ours = (module.GrammarMatcher(g) for module, g in zip((xgr, xg2), pair))
            ref_prefix, our_prefix = ref.accept_string(text), ours.accept_string(text)
            assert (our_prefix and ours.is_completed()) == (ref_prefix and ref.is_completed()), (src, text)
            assert ref_prefix or not our_prefix, (src, text)


# ------------------------------------------------------------------------ token budgets

BUDGET_VOCAB = ["ab ", "a", "b ", "</t>", "1", "<t>", " ", "ab"]
TOKEN_BUDGETS = [
    ("ebnf", 'root ::= "<t>" r "</t>" ans\nr[max_tokens=2] ::= ([a-z]* " ")+\nans ::= "1"'),
    ("ebnf", 'root ::= (r ",")* "1"\nr[max_tokens=1] ::= [ab ]+'),
    ("lark", 'start: "<t>" r "</t>" ans\nr[max_tokens=2]: /([a-z]* )+/\nans: "1"'),
    ("lark", 'start: "<t>" r "</t>"\nr[max_tokens=3, capture]: TEXT\nTEXT: /(\\n|.)*/'),
    ("lark", 'start: r+ "1"\nr[max_tokens=2]: /[a-z]+ /'),
]


@pytest.mark.parametrize("kind, src", TOKEN_BUDGETS)
def test_token_budgets_agree(kind: str, src: str) -> None:
    """`[max_tokens=n]`: once an occurrence has had its tokens, it ends at the first place it can
    (the budget is relaxed while it cannot), per occurrence; strings count no token. Masks and
    accept_token at every step of every token sequence of up to 4, then rollback and fork, as in
    xgrammar."""
    infos = [module.TokenizerInfo(BUDGET_VOCAB, stop_token_ids=[]) for module in (xgr, xg2)]
    pair = [module.GrammarCompiler(info).compile_grammar(
        module.Grammar.from_ebnf(src) if kind == "ebnf" else module.Grammar.from_lark(src))
        for module, info in zip((xgr, xg2), infos)]
    n = len(BUDGET_VOCAB)

    def allowed(module, m) -> list[int]:
        bm = module.allocate_token_bitmask(1, n)
        m.fill_next_token_bitmask(bm)
        return [i for i in range(n) if (int(bm[0, i // 32]) >> (i % 32)) & 1]

    start = [5] if "<t>" in src else []
    for path in itertools.product(range(n), repeat=4):
        ms = [module.GrammarMatcher(g, terminate_without_stop_token=True) for module, g in zip((xgr, xg2), pair)]
        if start and not all(m.accept_token(start[0]) for m in ms):
            continue
        for t in path:
            assert allowed(xg2, ms[1]) == allowed(xgr, ms[0]), (src, path, t)
            ok = [m.accept_token(t) for m in ms]
            assert ok[1] == ok[0], (src, path, t)
            if not ok[0]:
                break
        else:
            fork, before = ms[1].fork(), allowed(xgr, ms[0])
            assert allowed(xg2, fork) == before, (src, path, "fork")
            for m in ms:
                m.rollback(2)
            assert allowed(xg2, ms[1]) == allowed(xgr, ms[0]), (src, path, "rollback")
    # Text accepted as a string counts no token.
    ms = [module.GrammarMatcher(g, terminate_without_stop_token=True) for module, g in zip((xgr, xg2), pair)]
    for m in ms:
        m.accept_string("<t>" if start else "")
        m.accept_string("ab ab ab ")
    assert allowed(xg2, ms[1]) == allowed(xgr, ms[0]), (src, "string")


STAG_BUDGET_VOCAB = ["<think>", "a", "b", "</", "think>", "a</", "é", "</think>", "<eos>", "ab"]
STAG_BUDGETS = [{"max_tokens": 2}, {"max_tokens": 0}, {"max_chars": 2}, {"max_chars": 0},
                {"max_tokens": 2, "max_chars": 3}, {"max_tokens": 1, "excludes": ["b"]}]


@pytest.mark.parametrize("budget", STAG_BUDGETS)
def test_structural_tag_text_budgets_agree(budget: dict) -> None:
    """`any_text` with `max_tokens` / `max_chars` inside a tag: the budget ends the text (the end
    string is forced, over several tokens if need be); masks and accept_token at every step of
    every 4-token sequence after the opening tag, as in xgrammar."""
    tag = {"type": "structural_tag", "format": {"type": "tag", "begin": "<think>",
                                                "content": {"type": "any_text", **budget}, "end": "</think>"}}
    infos = [module.TokenizerInfo(STAG_BUDGET_VOCAB, stop_token_ids=[8]) for module in (xgr, xg2)]
    pair = [module.GrammarCompiler(info).compile_structural_tag(tag) for module, info in zip((xgr, xg2), infos)]
    n = len(STAG_BUDGET_VOCAB)

    def allowed(module, m) -> list[int]:
        bm = module.allocate_token_bitmask(1, n)
        m.fill_next_token_bitmask(bm)
        return [i for i in range(n) if (int(bm[0, i // 32]) >> (i % 32)) & 1]

    for path in itertools.product(range(1, n), repeat=4):
        ms = [module.GrammarMatcher(g) for module, g in zip((xgr, xg2), pair)]
        assert all(m.accept_token(0) for m in ms)
        for t in path:
            assert allowed(xg2, ms[1]) == allowed(xgr, ms[0]), (budget, path, t)
            ok = [m.accept_token(t) for m in ms]
            assert ok[1] == ok[0], (budget, path, t)
            if not ok[0] or ms[0].is_terminated():
                break


def test_structural_tag_budget_before_an_overlapping_end_is_refused() -> None:
    tag = {"type": "structural_tag", "format": {"type": "tag", "begin": "<",
                                                "content": {"type": "any_text", "max_tokens": 2}, "end": "aba"}}
    with pytest.raises(xg2.StructuralTagError, match="could begin in the text"):
        xg2.GrammarCompiler(xg2.TokenizerInfo(["a"])).compile_structural_tag(tag)


def test_any_tokens_without_an_end_agree() -> None:
    """A token-triggered tag whose `any_tokens` content has the end "": the tokens stop anywhere
    and the next trigger token starts the next tag (the content excludes it), as in xgrammar."""
    vocab = ["<s>", "</s>", "<tool>", "hello", "world", "<bad>", "x"]
    tag = {"type": "structural_tag", "format": {
        "type": "token_triggered_tags", "trigger_tokens": ["<tool>"],
        "tags": [{"type": "tag", "begin": {"type": "token", "token": "<tool>"},
                  "content": {"type": "any_tokens", "exclude_tokens": ["<tool>", "<bad>"]}, "end": ""}]}}
    infos = [module.TokenizerInfo(vocab) for module in (xgr, xg2)]
    pair = [module.GrammarCompiler(info).compile_structural_tag(tag) for module, info in zip((xgr, xg2), infos)]
    n = len(vocab)

    def allowed(module, m) -> list[int]:
        bm = module.allocate_token_bitmask(1, n)
        m.fill_next_token_bitmask(bm)
        return [i for i in range(n) if (int(bm[0, i // 32]) >> (i % 32)) & 1]

    for path in itertools.product(range(n), repeat=4):
        ms = [module.GrammarMatcher(g) for module, g in zip((xgr, xg2), pair)]
        for t in path:
            assert allowed(xg2, ms[1]) == allowed(xgr, ms[0]), (path, t)
            ok = [m.accept_token(t) for m in ms]
            assert ok[1] == ok[0], (path, t)
            if not ok[0] or ms[0].is_terminated():
                break
