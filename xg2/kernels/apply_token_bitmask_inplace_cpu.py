"""xgrammar's CPU kernel name: apply_token_bitmask_inplace on CPU tensors or numpy arrays only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import UsageError
from . import apply_token_bitmask_inplace, is_torch_tensor


def apply_token_bitmask_inplace_cpu(logits: Any, bitmask: Any, vocab_size: int | None = None,
                                    indices: Sequence[int] | Any | None = None) -> None:
    """The C loop over the bitmask words, without the GIL; a tensor on another device is refused."""
    for name, x in (("logits", logits), ("bitmask", bitmask)):
        if is_torch_tensor(x) and x.device.type != "cpu":
            raise UsageError(f"{name} must be on the CPU for the CPU kernel, not {x.device}")
    apply_token_bitmask_inplace(logits, bitmask, vocab_size=vocab_size, indices=indices)
