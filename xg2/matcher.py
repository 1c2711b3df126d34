"""GrammarMatcher: the per-request loop (fill mask, accept token, roll back) over the Cython core."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ._ext.core import MatcherCore
from .compiler import CompiledGrammar
from .kernels import is_torch_tensor

#: Upper bound on the jump-forward string, in bytes.
MAX_JUMP_FORWARD_BYTES = 4096


def _row_address(bitmask: Any, index: int, n_words: int) -> int:
    """Address of row `index` of an int32 CPU bitmask, after checking shape, dtype and layout."""
    if isinstance(bitmask, np.ndarray):
        if bitmask.dtype != np.int32:
            raise TypeError("bitmask must have dtype int32")
        arr = bitmask if bitmask.ndim == 2 else bitmask.reshape(1, -1)
        if not arr.flags.c_contiguous or not arr.flags.writeable:
            raise ValueError("bitmask must be a writeable C-contiguous array")
        base = arr.ctypes.data
        width, rows, itemsize = arr.shape[1], arr.shape[0], 4
    elif is_torch_tensor(bitmask):
        if str(bitmask.dtype) != "torch.int32":
            raise TypeError("bitmask must have dtype torch.int32")
        if bitmask.device.type != "cpu":
            raise ValueError("fill_next_token_bitmask writes a CPU bitmask; copy it to the device afterwards")
        arr = bitmask if bitmask.dim() == 2 else bitmask.reshape(1, -1)
        if not arr.is_contiguous():
            raise ValueError("bitmask must be contiguous")
        base = arr.data_ptr()
        width, rows, itemsize = arr.shape[1], arr.shape[0], 4
    else:
        raise TypeError("bitmask must be a numpy array or a torch tensor")
    if not 0 <= index < rows:
        raise IndexError(f"bitmask row {index} out of range for {rows} rows")
    if width < n_words:
        raise ValueError(f"bitmask has {width} words per row; the vocabulary needs {n_words}")
    return base + index * width * itemsize, width


class GrammarMatcher:
    """Matches one generation against a compiled grammar, token by token."""

    def __init__(self, compiled_grammar: CompiledGrammar, *,
                 override_stop_tokens: int | Sequence[int] | None = None,
                 terminate_without_stop_token: bool = False, max_rollback_tokens: int = -1):
        if not isinstance(compiled_grammar, CompiledGrammar):
            raise TypeError("compiled_grammar must be an xg2.CompiledGrammar")
        self._vocab_size = compiled_grammar.tokenizer_info.vocab_size
        if override_stop_tokens is None:
            stops = list(compiled_grammar.tokenizer_info.stop_token_ids)
        else:
            stops = [override_stop_tokens] if isinstance(override_stop_tokens, int) else list(override_stop_tokens)
            if any(not 0 <= int(t) < self._vocab_size for t in stops):
                raise ValueError("override_stop_tokens must be token ids within the vocabulary")
        self._compiled = compiled_grammar
        self._stop_ids = [int(t) for t in stops]
        self._core = MatcherCore(compiled_grammar._core, self._stop_ids)
        self._n_words = (self._vocab_size + 31) // 32
        self._last_row: tuple | None = None     # (tensor, index, data_ptr, shape, strides, address, width)
        self._terminate_without_stop = terminate_without_stop_token
        self._max_rollback = max_rollback_tokens

    @property
    def compiled_grammar(self) -> CompiledGrammar:
        return self._compiled

    @property
    def stop_token_ids(self) -> list[int]:
        return list(self._stop_ids)

    @property
    def max_rollback_tokens(self) -> int:
        return self._max_rollback

    def accept_token(self, token_id: int, *, debug_print: bool = False) -> bool:
        """Advance by one token; a disallowed token returns False and leaves the state unchanged."""
        if self.is_terminated():
            return False
        ok = self._core.accept_token(int(token_id))
        if ok and self._max_rollback >= 0:
            self._core.forget_history(self._max_rollback)
        return bool(ok)

    def accept_string(self, input_str: str | bytes, *, debug_print: bool = False) -> bool:
        """Advance by raw text (not tokens); False and no change if the text does not fit."""
        if self.is_terminated():
            return False
        data = input_str.encode("utf-8") if isinstance(input_str, str) else bytes(input_str)
        ok = self._core.accept_bytes(data)
        if ok and self._max_rollback >= 0:
            self._core.forget_history(self._max_rollback)
        return bool(ok)

    def fill_next_token_bitmask(self, bitmask: Any, index: int = 0, *, debug_print: bool = False) -> bool:
        """Write the allowed next tokens into row `index`; the mask is computed without the GIL.

        After termination nothing is allowed and False is returned.
        """
        last = self._last_row
        if (last is not None and last[0] is bitmask and last[1] == index and bitmask.data_ptr() == last[2]
                and bitmask.shape == last[3] and bitmask.stride() == last[4]):
            address, width = last[5], last[6]      # the same torch bitmask as last time, unchanged
        else:
            address, width = _row_address(bitmask, index, self._n_words)
            if is_torch_tensor(bitmask):
                self._last_row = (bitmask, index, bitmask.data_ptr(), bitmask.shape, bitmask.stride(), address, width)
        self._core.fill_bitmask(address, width)
        return not self._core.terminated

    def is_terminated(self) -> bool:
        if self._core.terminated:
            return True
        return self._terminate_without_stop and self._core.can_end() and not self._core.allowed_bytes()

    def is_completed(self) -> bool:
        """The grammar could end here (a stop token would be accepted) or has ended."""
        return bool(self._core.terminated or self._core.can_end())

    def rollback(self, num_tokens: int = 1) -> None:
        self._core.rollback(int(num_tokens))

    def reset(self) -> None:
        self._core.reset()

    def find_jump_forward_string(self) -> str:
        """The longest text the grammar forces from here (cut to whole UTF-8 characters)."""
        start = self._core.n_sets
        out = bytearray()
        try:
            while len(out) < MAX_JUMP_FORWARD_BYTES and not self._core.can_end():
                allowed = self._core.allowed_bytes()
                if len(allowed) != 1:
                    break
                b = next(iter(allowed))
                if not self._core.push_byte(b):
                    break
                out.append(b)
        finally:
            self._core.pop_to(start)
        for cut in range(min(4, len(out)) + 1):  # drop an unfinished trailing UTF-8 sequence
            try:
                return bytes(out[: len(out) - cut]).decode("utf-8")
            except UnicodeDecodeError:
                continue
        return ""
