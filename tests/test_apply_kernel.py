"""The CPU masking kernel (xg2/_ext/bitmask.pyx) against xgrammar's plain-torch kernel, over the
layouts an engine hands it: contiguous rows, rows of a wider buffer, a transposed view (left to the
vectorised path), numpy arrays, every logits dtype, masks that allow almost everything or almost
nothing, row subsets, and a vocab_size that ends inside a bitmask word."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xgrammar as xgr

import xg2

V = 1000
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _mask(rng: np.random.Generator, rows: int, allowed: float) -> torch.Tensor:
    bits = rng.random((rows, ((V + 31) // 32) * 32)) < allowed
    words = np.packbits(bits.reshape(rows, -1, 32), axis=-1, bitorder="little").view("<i4")
    return torch.from_numpy(words.reshape(rows, -1).astype(np.int32))


def _reference(logits: torch.Tensor, bitmask: torch.Tensor, **kw) -> torch.Tensor:
    out = logits.clone()
    xgr.apply_token_bitmask_inplace(out, bitmask, backend="torch_native", **kw)
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("allowed", [0.002, 0.5, 0.998])
@pytest.mark.parametrize("indices", [None, [0, 2, 5], [4]])
@pytest.mark.parametrize("vocab_size", [None, V - 7])
def test_contiguous_and_row_strided_logits(dtype, allowed, indices, vocab_size):
    rng = np.random.default_rng(hash((str(dtype), allowed, str(indices), vocab_size)) % 2**32)
    bitmask = _mask(rng, 6, allowed)
    logits = torch.from_numpy(rng.standard_normal((6, V)).astype(np.float32)).to(dtype)
    kw = {"indices": indices, "vocab_size": vocab_size}
    expected = _reference(logits, bitmask, **kw)

    ours = logits.clone()
    xg2.apply_token_bitmask_inplace(ours, bitmask, **kw)
    assert torch.equal(ours, expected)

    wide = torch.zeros((6, V + 40), dtype=dtype)        # rows of a wider buffer: stride(0) > V
    wide[:, :V] = logits
    xg2.apply_token_bitmask_inplace(wide[:, :V], bitmask, **kw)
    assert torch.equal(wide[:, :V], expected)
    assert not wide[:, V:].any()                          # nothing written past the view's rows

    transposed = logits.t().contiguous().t()              # columns contiguous: the vectorised path
    xg2.apply_token_bitmask_inplace(transposed, bitmask, **kw)
    assert torch.equal(transposed, expected)

    if dtype != torch.bfloat16:
        array = logits.numpy().copy()
        xg2.apply_token_bitmask_inplace(array, bitmask.numpy(), **kw)
        np.testing.assert_array_equal(array, expected.numpy())


def test_one_row_and_a_bitmask_row_view():
    rng = np.random.default_rng(1)
    bitmask = _mask(rng, 3, 0.3)
    logits = torch.from_numpy(rng.standard_normal(V).astype(np.float32))
    expected = _reference(logits[None], bitmask[1:2])[0]
    ours = logits.clone()
    xg2.apply_token_bitmask_inplace(ours, bitmask[1])
    assert torch.equal(ours, expected)
