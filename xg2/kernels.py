"""Token bitmasks: allocation and application to logits, for numpy arrays and torch tensors.

A bitmask is int32 of shape (batch, ceil(vocab_size / 32)); bit (i % 32) of word i // 32 is set when
token i is allowed. Torch tensors on any device go through torch ops, so a CUDA tensor is masked on
its own device without a host copy.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np


def _torch():
    """torch if installed (imported on first need: importing it costs seconds), else None."""
    if "torch" in sys.modules:
        return sys.modules["torch"]
    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    return torch


def is_torch_tensor(x: Any) -> bool:
    return "torch" in sys.modules and isinstance(x, sys.modules["torch"].Tensor)


def get_bitmask_shape(batch_size: int, vocab_size: int) -> tuple[int, int]:
    if batch_size < 1 or vocab_size < 1:
        raise ValueError("batch_size and vocab_size must be positive")
    return (batch_size, (vocab_size + 31) // 32)


def allocate_token_bitmask(batch_size: int, vocab_size: int, *, backend: str = "auto") -> Any:
    """All-allowed bitmask; a torch tensor when torch is installed (as xgrammar returns), else numpy."""
    shape = get_bitmask_shape(batch_size, vocab_size)
    torch = None if backend == "numpy" else _torch()
    if torch is None:
        if backend == "torch":
            raise ImportError("torch is not installed")
        return np.full(shape, -1, dtype=np.int32)
    return torch.full(shape, -1, dtype=torch.int32)


def reset_token_bitmask(bitmask: Any) -> None:
    bitmask.fill(-1) if isinstance(bitmask, np.ndarray) else bitmask.fill_(-1)


def _unpack_numpy(bitmask: np.ndarray, vocab_size: int) -> np.ndarray:
    bits = np.unpackbits(bitmask.astype("<i4").view(np.uint8), axis=-1, bitorder="little")
    return bits[..., :vocab_size].astype(bool)


def _unpack_torch(bitmask: Any, vocab_size: int) -> Any:
    torch = sys.modules["torch"]
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(*bitmask.shape[:-1], -1)[..., :vocab_size].bool()


def apply_token_bitmask_inplace(logits: Any, bitmask: Any, *, vocab_size: int | None = None,
                                indices: Sequence[int] | None = None) -> None:
    """Set logits of disallowed tokens to -inf, in place.

    `logits` is (batch, V) or (V,); `bitmask` is (batch, W) or (W,). `indices` picks the logits rows
    to mask, each masked by the bitmask row of the same position (xgrammar's convention). Tokens at or
    beyond `vocab_size` (default: the smaller of the logits width and 32 * W) are masked out.
    """
    is_np = isinstance(logits, np.ndarray)
    if is_np != isinstance(bitmask, np.ndarray):
        raise TypeError("logits and bitmask must both be numpy arrays or both torch tensors")
    if logits.ndim not in (1, 2) or bitmask.ndim not in (1, 2):
        raise ValueError("logits and bitmask must be 1-D or 2-D")
    if logits.ndim == 1:
        logits_2d, bitmask_2d = logits[None], bitmask.reshape(1, -1)
    else:
        logits_2d, bitmask_2d = logits, bitmask if bitmask.ndim == 2 else bitmask.reshape(1, -1)
    width = logits_2d.shape[-1]
    vs = min(width, bitmask_2d.shape[-1] * 32) if vocab_size is None else vocab_size
    if vs > width or vs > bitmask_2d.shape[-1] * 32:
        raise ValueError("vocab_size exceeds the logits or the bitmask width")
    rows = list(range(logits_2d.shape[0])) if indices is None else list(indices)
    if indices is None and bitmask_2d.shape[0] != logits_2d.shape[0]:
        raise ValueError("bitmask and logits have different batch sizes")
    if indices is not None and len(rows) > bitmask_2d.shape[0]:
        raise ValueError("more indices than bitmask rows")
    masks = bitmask_2d[: len(rows)] if indices is not None else bitmask_2d
    if is_np:
        allowed = _unpack_numpy(masks, vs)
        sub = logits_2d[rows]
        sub[:, :vs][~allowed] = -np.inf
        sub[:, vs:] = -np.inf
        logits_2d[rows] = sub
    else:
        torch = sys.modules["torch"]
        allowed = _unpack_torch(masks.to(logits.device), vs)
        idx = torch.as_tensor(rows, device=logits.device, dtype=torch.long)
        sub = logits_2d.index_select(0, idx)
        sub[:, :vs].masked_fill_(~allowed, float("-inf"))
        sub[:, vs:] = float("-inf")
        logits_2d.index_copy_(0, idx, sub)
