"""Token bitmasks: allocation and application to logits, for numpy arrays and torch tensors.

A bitmask is int32 of shape (batch, ceil(vocab_size / 32)); bit (i % 32) of word i // 32 is set when
token i is allowed. `apply_token_bitmask_inplace` follows xgrammar's call convention exactly (engines
such as vLLM and SGLang call it with xgrammar's semantics; a difference is a wrong mask in production).
Torch tensors on any device go through plain torch ops, so a CUDA tensor is masked on its own device
without a host copy; numpy arrays get the same semantics (xgrammar itself takes only torch tensors).
"""

from __future__ import annotations

import importlib.util
import operator
import sys
import threading
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._ext import bitmask as bitmask_ext
from ..errors import UsageError

_torch_lock = threading.Lock()
_torch_state: list[Any] = []      # [torch module or None] once the first import has finished


def _torch() -> Any:
    """torch if installed, else None; imported on first need (importing it costs seconds).

    The first import runs under a lock: while one thread is still initialising torch,
    ``"torch" in sys.modules`` is already true and the module is half built, so another thread must
    wait for the import rather than look it up.
    """
    if not _torch_state:
        with _torch_lock:
            if not _torch_state:
                module = None
                if importlib.util.find_spec("torch") is not None:
                    import torch as module
                _torch_state.append(module)
    return _torch_state[0]


def is_torch_tensor(x: Any) -> bool:
    # getattr: torch may be half initialised by another thread; no tensor exists before its class does.
    tensor_type = getattr(sys.modules.get("torch"), "Tensor", None)
    return tensor_type is not None and isinstance(x, tensor_type)


def get_bitmask_shape(batch_size: int, vocab_size: int) -> tuple[int, int]:
    """(batch_size, int32 words for vocab_size bits). Zero is a size (an empty batch, or the empty
    vocabulary of a TokenizerInfo([]) used to match text), as in xgrammar; a negative one is
    refused, where xgrammar reads vocab_size -1 as 0."""
    if batch_size < 0 or vocab_size < 0:
        raise UsageError(f"batch_size and vocab_size must not be negative, got {batch_size} and {vocab_size}")
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


_NUMPY_LOGITS = (np.dtype(np.float32), np.dtype(np.float16))
_TORCH_LOGITS = ("torch.float32", "torch.float16", "torch.bfloat16")


def _row_list(indices: Any) -> list[int]:
    """Indices as ints. A list, tuple, numpy array or tensor all mean the rows they hold (xgrammar's
    CPU kernel ignores a tuple or an array and masks every row; its GPU kernel honours them)."""
    if is_torch_tensor(indices) or isinstance(indices, np.ndarray):
        if indices.ndim != 1:
            raise UsageError("indices must be one-dimensional")
        indices = indices.tolist()
    if not isinstance(indices, Sequence) or isinstance(indices, (str, bytes)):
        raise TypeError("indices must be a list, tuple, numpy array or tensor of ints")
    return [operator.index(i) for i in indices]


def _check_and_shape(logits: Any, bitmask: Any, vocab_size: int | None,
                     indices: Sequence[int] | Any | None) -> tuple[Any, Any, int, list[int] | None]:
    """The checks xgrammar makes, in its order: the 2-D views, the vocabulary size, the rows."""
    is_np = isinstance(logits, np.ndarray)
    if is_np:
        if not isinstance(bitmask, np.ndarray):
            raise UsageError("logits and bitmask should be on the same device (both numpy arrays or both tensors)")
        logits_ok, bitmask_ok = logits.dtype in _NUMPY_LOGITS, bitmask.dtype == np.int32
    elif is_torch_tensor(logits):
        if not is_torch_tensor(bitmask) or bitmask.device != logits.device:
            where = bitmask.device if is_torch_tensor(bitmask) else type(bitmask).__name__
            raise UsageError(f"logits and bitmask should be on the same device; got {logits.device} and {where}")
        logits_ok, bitmask_ok = str(logits.dtype) in _TORCH_LOGITS, str(bitmask.dtype) == "torch.int32"
    else:
        raise TypeError("logits must be a numpy array or a torch tensor")
    if not bitmask_ok:
        raise UsageError(f"bitmask must be of type int32, not {bitmask.dtype}")
    if logits.ndim not in (1, 2):
        raise UsageError(f"logits should be 1D or 2D, but got {logits.ndim}D")
    if bitmask.ndim not in (1, 2):
        raise UsageError(f"bitmask should be 1D or 2D, but got {bitmask.ndim}D")
    if not logits_ok:
        raise UsageError(f"logits must be of type float32, float16 or bfloat16, not {logits.dtype}")
    logits_2d = logits[None] if logits.ndim == 1 else logits
    bitmask_2d = bitmask[None] if bitmask.ndim == 1 else bitmask
    width, covered = logits_2d.shape[1], bitmask_2d.shape[1] * 32
    if vocab_size is None:
        if covered < width:
            warnings.warn(f"The bitmask covers only {covered} tokens but logits have {width}, so "
                          f"logits[..., {covered}:] are left unmasked. Allocate the bitmask with the "
                          "full vocab size, or pass vocab_size explicitly.", stacklevel=3)
        vocab_size = min(width, covered)
    vocab_size = operator.index(vocab_size)
    if vocab_size < 0:
        # xgrammar masks nothing here; a negative size is never meant, and masking nothing is silent.
        raise UsageError(f"vocab_size must not be negative, got {vocab_size}")
    if vocab_size > covered or vocab_size > width:
        raise UsageError(f"vocab_size {vocab_size} exceeds the bitmask ({covered} tokens) or the "
                         f"logits ({width} tokens)")
    if indices is None:
        if logits_2d.shape[0] != bitmask_2d.shape[0]:
            raise UsageError(f"when indices is not provided, logits and bitmask need the same batch size; "
                             f"got {logits_2d.shape[0]} and {bitmask_2d.shape[0]}")
        return logits_2d, bitmask_2d, vocab_size, None
    rows = _row_list(indices)
    limit = min(logits_2d.shape[0], bitmask_2d.shape[0])
    for i in rows:
        if not 0 <= i < limit:
            raise UsageError(f"index {i} is out of range for logits of {logits_2d.shape[0]} rows and a "
                             f"bitmask of {bitmask_2d.shape[0]} rows")
    return logits_2d, bitmask_2d, vocab_size, rows


_KINDS = {"float32": bitmask_ext.FLOAT32, "float16": bitmask_ext.FLOAT16, "torch.float32": bitmask_ext.FLOAT32,
          "torch.float16": bitmask_ext.FLOAT16, "torch.bfloat16": bitmask_ext.BFLOAT16}


def _mask_on_cpu(logits: Any, bitmask: Any, vocab_size: int, rows: list[int] | None) -> bool:
    """The C kernel, for host memory whose rows are contiguous (the usual case); False leaves the
    work to the vectorised forms below (strided views, other devices)."""
    if isinstance(logits, np.ndarray):
        if (logits.strides[1] != logits.itemsize or bitmask.strides[1] != 4 or bitmask.strides[0] % 4
                or not logits.flags.writeable or logits.strides[0] < 0 or bitmask.strides[0] < 0
                or (logits.shape[0] > 1 and logits.strides[0] < logits.shape[1] * logits.itemsize)):
            return False
        kind = _KINDS[str(logits.dtype)]
        address, row_bytes = logits.ctypes.data, logits.strides[0]
        mask_address, mask_row_words = bitmask.ctypes.data, bitmask.strides[0] // 4
    else:
        if (logits.device.type != "cpu" or logits.stride(1) != 1 or bitmask.stride(1) != 1
                or (logits.shape[0] > 1 and logits.stride(0) < logits.shape[1])):
            return False            # rows that overlap (an expanded tensor) are left to torch's checks
        kind = _KINDS[str(logits.dtype)]
        address, row_bytes = logits.data_ptr(), logits.stride(0) * logits.element_size()
        mask_address, mask_row_words = bitmask.data_ptr(), bitmask.stride(0)
    picked = np.arange(logits.shape[0], dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
    bitmask_ext.mask_rows(address, row_bytes, kind, mask_address, mask_row_words, picked, vocab_size)
    return True


#: xgrammar's kernel names: xg2 has one path per device (see the module docstring).
APPLY_BACKENDS = ("auto", "cpu", "cuda", "triton", "torch_compile", "torch_native")


def apply_token_bitmask_inplace(logits: Any, bitmask: Any, *, vocab_size: int | None = None,
                                indices: Sequence[int] | Any | None = None, backend: str = "auto") -> None:
    """Set the logits of disallowed tokens to -inf, in place, with xgrammar's semantics.

    `logits` is (batch, V) or (V,), float32, float16 or bfloat16; `bitmask` is int32 (batch, W) or
    (W,). For each row i (every row, or each i in `indices`), logits[i, :vocab_size] is masked by
    bitmask[i]: the bitmask rows line up with the logits rows, and a free request's row is simply not
    listed. Columns at or past `vocab_size` (default min(V, 32 * W)) are left as they are.
    `backend`: xgrammar's kernel choice, accepted for its signature; the tensors' device picks the
    path here (a name other than xgrammar's is a UsageError).
    """
    if backend not in APPLY_BACKENDS:
        raise UsageError(f"backend must be one of {', '.join(APPLY_BACKENDS)}, got {backend!r}")
    logits_2d, bitmask_2d, vs, rows = _check_and_shape(logits, bitmask, vocab_size, indices)
    if vs == 0 or rows == []:
        return
    if _mask_on_cpu(logits_2d, bitmask_2d, vs, rows):
        return
    n_words = (vs + 31) // 32
    if isinstance(logits_2d, np.ndarray):
        words = bitmask_2d[:, :n_words] if rows is None else bitmask_2d[rows, :n_words]
        bits = np.unpackbits(np.ascontiguousarray(words, dtype="<i4").view(np.uint8), axis=1, bitorder="little")
        banned = bits[:, :vs] == 0
        target = logits_2d[:, :vs]
        if rows is None:
            target[banned] = -np.inf
        else:
            sub = target[rows]
            sub[banned] = -np.inf
            target[rows] = sub
        return
    _torch_mask(logits_2d, bitmask_2d, vs, rows)


def _torch_mask(logits_2d: Any, bitmask_2d: Any, vs: int, rows: list[int] | None) -> None:
    """The masking in torch ops on the tensors' device (CUDA included: no host copy)."""
    torch = _torch()
    n_words = (vs + 31) // 32
    device = logits_2d.device
    words = bitmask_2d[:, :n_words]
    if rows is not None:
        idx = torch.tensor(rows, dtype=torch.long, device=device)
        words = words.index_select(0, idx)
    shifts = torch.arange(32, dtype=torch.int32, device=device)
    banned = ((words.unsqueeze(-1) >> shifts) & 1).reshape(words.shape[0], -1)[:, :vs] == 0
    target = logits_2d[:, :vs]
    if rows is None:
        target.masked_fill_(banned, float("-inf"))
    else:
        target[idx] = target.index_select(0, idx).masked_fill_(banned, float("-inf"))
