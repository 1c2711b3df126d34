"""xgrammar's torch_compile kernel name: the same masking in plain torch ops on the tensors' device
(apply_token_bitmask_inplace's non-CPU path), for callers that import it by this name."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import UsageError
from . import _check_and_shape, _torch_mask, is_torch_tensor


def apply_token_bitmask_inplace_torch_compile(logits: Any, bitmask: Any, vocab_size: int | None = None,
                                              indices: Sequence[int] | Any | None = None) -> None:
    if not is_torch_tensor(logits) or not is_torch_tensor(bitmask):
        raise UsageError("the torch kernel takes torch tensors")
    logits_2d, bitmask_2d, vs, rows = _check_and_shape(logits, bitmask, vocab_size, indices)
    if vs and rows != []:
        _torch_mask(logits_2d, bitmask_2d, vs, rows)
