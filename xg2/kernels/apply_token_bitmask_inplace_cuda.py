"""xgrammar's CUDA kernel name: apply_token_bitmask_inplace on CUDA tensors, through torch ops on
the device (no host copy); xg2 ships no CUDA source of its own."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import UsageError
from . import apply_token_bitmask_inplace, is_torch_tensor


def apply_token_bitmask_inplace_cuda(logits: Any, bitmask: Any, vocab_size: int | None = None,
                                     indices: Sequence[int] | Any | None = None) -> None:
    for name, x in (("logits", logits), ("bitmask", bitmask)):
        if not is_torch_tensor(x) or x.device.type != "cuda":
            raise UsageError(f"{name} must be a CUDA tensor for the CUDA kernel")
    apply_token_bitmask_inplace(logits, bitmask, vocab_size=vocab_size, indices=indices)
