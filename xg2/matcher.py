"""GrammarMatcher: the per-request loop (fill mask, accept token, roll back) over the Cython core."""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._ext.core import MatcherCore
from .compiler import CompiledGrammar
from .errors import UsageError
from .kernels import is_torch_tensor

#: Upper bound on the jump-forward string, in bytes.
MAX_JUMP_FORWARD_BYTES = 4096


_log = logging.getLogger("xg2")


def _int_arg(value: Any, name: str) -> int:
    """An int argument as xgrammar takes it: a Python int (bool included) or a numpy integer; a float,
    a string or a 0-d array is a TypeError, never silently converted."""
    if isinstance(value, (int, np.integer)):
        return int(value)
    raise TypeError(f"{name} must be an int, not {type(value).__name__}")


def cpu_bitmask(bitmask: Any) -> tuple[int, tuple[int, ...]]:
    """(address, shape) of an int32 bitmask the core can write: on the CPU, C-contiguous, writeable
    (xgrammar ignores strides and writes outside a strided view's rows; here it is refused)."""
    if isinstance(bitmask, np.ndarray):
        if bitmask.dtype != np.int32:
            raise UsageError(f"bitmask must have dtype int32, not {bitmask.dtype}")
        if not bitmask.flags.c_contiguous or not bitmask.flags.writeable:
            raise UsageError("bitmask must be a writeable C-contiguous array")
        return bitmask.ctypes.data, bitmask.shape
    if is_torch_tensor(bitmask):
        if str(bitmask.dtype) != "torch.int32":
            raise UsageError(f"bitmask must have dtype torch.int32, not {bitmask.dtype}")
        if bitmask.device.type != "cpu":
            raise UsageError("the bitmask is filled on the CPU; copy it to the device afterwards")
        if not bitmask.is_contiguous():
            raise UsageError("bitmask must be contiguous")
        return bitmask.data_ptr(), tuple(bitmask.shape)
    raise TypeError("bitmask must be a numpy array or a torch tensor")


def _tree_array(values: Any, name: str, dtypes: tuple) -> np.ndarray:
    """A 1-D integer tensor or array of a draft tree, as a numpy array of one of `dtypes`."""
    a = values.numpy() if is_torch_tensor(values) and values.device.type == "cpu" else values
    if not isinstance(a, np.ndarray):
        raise UsageError(f"{name} must be a 1-D CPU tensor or array")
    if a.ndim != 1 or a.dtype.type not in dtypes:
        raise UsageError(f"{name} must be 1-D of dtype {' or '.join(np.dtype(d).name for d in dtypes)}, "
                         f"got {a.ndim}-D {a.dtype}")
    return a


def _row_address(bitmask: Any, index: int, n_words: int) -> tuple[int, int]:
    """Address of row `index` of an int32 CPU bitmask, after the checks xgrammar makes.

    The bitmask is (rows, n_words), or a single row (n_words,) with index 0, exactly as wide as the
    vocabulary needs. A 3-D or a flattened batch is refused, not taken as one wide row.
    """
    base, shape = cpu_bitmask(bitmask)
    if len(shape) == 1:
        if shape[0] != n_words:
            raise UsageError(f"a 1-D bitmask is one row of {n_words} words; got {shape[0]} "
                             "(a batch of rows must be 2-D)")
        if index != 0:
            raise UsageError(f"the index must be 0 for a 1-D bitmask, got {index}")
        return base, n_words
    if len(shape) != 2 or shape[1] != n_words:
        raise UsageError(f"bitmask shape {shape} is not (batch_size, {n_words})")
    if not 0 <= index < shape[0]:
        raise UsageError(f"bitmask row {index} out of range for {shape[0]} rows")
    return base + index * n_words * 4, n_words


def check_temperatures(temperatures: Any, n: int) -> None:
    """What xgrammar asks of a temperatures tensor: 1-D float32 on the CPU, `n` entries or more."""
    dtype = str(getattr(temperatures, "dtype", ""))
    shape = tuple(getattr(temperatures, "shape", ()))
    if dtype not in ("torch.float32", "float32") or len(shape) != 1 \
            or getattr(getattr(temperatures, "device", None), "type", "cpu") != "cpu":
        raise UsageError(f"the temperatures tensor must be 1-D float32 on the CPU, got {dtype or type(temperatures)} "
                         f"of shape {shape}")
    if shape[0] < n:
        raise UsageError(f"the temperatures tensor has {shape[0]} entries, fewer than the {n} needed")


class GrammarMatcher:
    """Matches one generation against a compiled grammar, token by token."""

    def __init__(self, compiled_grammar: CompiledGrammar, *,
                 override_stop_tokens: int | Sequence[int] | None = None,
                 terminate_without_stop_token: bool = False, max_rollback_tokens: int = -1,
                 default_temperature: float | None = None):
        if not isinstance(compiled_grammar, CompiledGrammar):
            raise TypeError("compiled_grammar must be an xg2.CompiledGrammar")
        self._vocab_size = compiled_grammar.tokenizer_info.vocab_size
        if override_stop_tokens is None:
            stops = list(compiled_grammar.tokenizer_info.stop_token_ids)
        else:
            stops = [override_stop_tokens] if isinstance(override_stop_tokens, int) else list(override_stop_tokens)
            if any(not 0 <= int(t) < self._vocab_size for t in stops):
                raise UsageError("override_stop_tokens must be token ids within the vocabulary")
        self._compiled = compiled_grammar
        self._stop_ids = [int(t) for t in stops]
        self._core = MatcherCore(compiled_grammar._core, self._stop_ids)
        self._n_words = (self._vocab_size + 31) // 32
        self._last_row: tuple | None = None     # (tensor, index, data_ptr, shape, strides, address, width)
        self._terminate_without_stop = terminate_without_stop_token
        self._max_rollback = max_rollback_tokens
        if default_temperature is not None and not (isinstance(default_temperature, (int, float))
                                                    and 0 <= default_temperature < float("inf")):
            raise UsageError("default_temperature must be a finite non-negative number or None")
        self._default_temperature = None if default_temperature is None else float(default_temperature)
        self._warned_temperatures = False
        self._captures: list[tuple] = []       # see _record_captures and get_captures
        self._hidden: list[tuple] = []
        self._capture_table = compiled_grammar._lowered.arrays.get("rule_capture")

    @property
    def compiled_grammar(self) -> CompiledGrammar:
        return self._compiled

    @property
    def stop_token_ids(self) -> list[int]:
        return list(self._stop_ids)

    @property
    def max_rollback_tokens(self) -> int:
        return self._max_rollback

    @property
    def temperature(self) -> float | None:
        """The sampling temperature for the next token (xgrammar's): inside a rule that sets one
        (EBNF's and Lark's ``name[temperature=t]``), the innermost such rule's, else the matcher's
        `default_temperature`. Where the parse may go on along several paths (say the end of a
        hot rule and text after it), a rule's temperature wins over the default, and of several
        rules' the highest: the least restrictive choice, so no path is starved of samples (a
        warning says so, once). These are xgrammar's rules, checked side by side."""
        temps = self._compiled._lowered.arrays.get("rule_temperature")
        if temps is None:
            return self._default_temperature
        lo, hi, _outside = self._core.temperature_range(temps)
        if math.isnan(hi):
            return self._default_temperature
        if lo != hi and not self._warned_temperatures:
            self._warned_temperatures = True
            warnings.warn(f"Multiple active grammar paths specify different temperatures ({lo} to {hi}); "
                          "using the highest", RuntimeWarning, stacklevel=2)
        return hi

    def accept_token(self, token_id: int, *, debug_print: bool = False) -> bool:
        """Advance by one token; False and no change if the grammar does not allow it here.

        As in xgrammar, an id outside the vocabulary or of a special token is a rejected token
        (False, logged), and a non-integer is a TypeError.
        """
        token_id = _int_arg(token_id, "token_id")
        if self._core.terminated:
            return False
        if not 0 <= token_id < self._vocab_size:
            _log.warning("token id %d is out of range [0, %d); rejecting it", token_id, self._vocab_size)
            return False
        # the common case inline (a token's cost): without captures the core enforces any budget
        ok = self._core.accept_token(token_id) if self._capture_table is None else \
            self._accept_capturing(self._core.accept_token, token_id)
        if ok and self._max_rollback >= 0:
            self._core.forget_history(self._max_rollback)
        return bool(ok)

    def accept_string(self, input_str: str | bytes, *, debug_print: bool = False) -> bool:
        """Advance by raw text (not tokens); False and no change if the text does not fit."""
        if self._core.terminated:
            return False
        data = input_str.encode("utf-8") if isinstance(input_str, str) else bytes(input_str)
        ok = self._core.accept_bytes(data) if self._capture_table is None else \
            self._accept_capturing(self._core.accept_bytes, data)
        if ok and self._max_rollback >= 0:
            self._core.forget_history(self._max_rollback)
        return bool(ok)

    def _accept_capturing(self, step, unit) -> bool:
        """`step(unit, enforce=False)` on the core, then the captures it completed recorded and
        only then the budgets enforced, as the core would have done in one step."""
        before = self._core.n_sets
        ok = step(unit, False)
        if ok:
            self._record_captures(before)
            self._core.enforce_budgets()
        return ok

    def _record_captures(self, first: int) -> None:
        """The captured rules (and stop rules, whose markers enclosing captures leave out) that
        completed in the state sets from `first` on (the text just accepted): captures as
        (capture number, start set, end of its text, end set, occurrence), stop markers as (end
        set, bytes, the occurrences they lie inside)."""
        arrays = self._compiled._lowered.arrays
        captures, hide = self._capture_table, arrays.get("rule_hide")
        marks, trim = arrays.get("rule_stop_capture"), arrays.get("rule_capture_trim")
        mask = captures >= 0
        if marks is not None:
            mask = mask | (marks >= 0)
        if hide is not None:
            mask = mask | (hide > 0)
        found = self._core.completions(first, np.where(mask, 0, -1).astype(np.int32))
        events = []
        for rule, start, end, item, top in found:
            occurrence = (rule, -1 if top else start)
            marker = int(max(trim[rule], hide[rule])) if trim is not None else 0
            if captures[rule] >= 0:             # the rule's text, its own marker left out
                events.append((int(captures[rule]), start, end - (int(trim[rule]) if trim is not None else 0), end,
                               occurrence))
            if marks is not None and marks[rule] >= 0:      # the marker itself
                events.append((int(marks[rule]), end - marker, end, end, (rule, "marker")))
            if hide is not None and hide[rule] > 0:
                self._hidden.append((end, int(hide[rule]), frozenset(self._core.occurrences_above(item))))
        # within a set, the shorter occurrence (the later start) first, as xgrammar lists them
        self._captures.extend(sorted(events, key=lambda e: (e[3], -e[1], e[0])))

    def get_captures(self, deduplicate: bool = True) -> list[tuple[str, bytes]]:
        """What the grammar's captured rules (``[capture]`` / ``[capture="name"]``) matched in the
        text accepted so far, as (name, bytes), in the order they ended. Every completion is an
        event (a rule ``/[0-9]+/`` completes after each digit); `deduplicate` keeps, of the
        completions of one occurrence (the same name and start), the longest. Only accepted text
        counts: masks record nothing, and rollback forgets what it undoes."""
        arrays = self._compiled._lowered.arrays
        if "capture_names" not in arrays:
            return []
        names = bytes(arrays["capture_names"]).decode("utf-8").split("\0")
        events = self._captures
        if deduplicate:
            longest: dict[tuple[int, int], tuple] = {}
            for e in events:
                key = (e[0], e[1])
                if key not in longest or e[3] > longest[key][3]:
                    longest[key] = e
            kept = set(longest.values())
            events = [e for e in dict.fromkeys(events) if e in kept]
        out = []
        for c, start, stop, _end, occurrence in events:
            text = bytearray(self._core.history(start, max(start, stop)))
            # stop markers inside this occurrence: left out, last first so offsets hold
            for h_end, n, inside in sorted(self._hidden, reverse=True):
                if occurrence in inside and start <= h_end - n and h_end <= stop:
                    del text[h_end - n - start:h_end - start]
            out.append((names[c], bytes(text)))
        return out

    def fill_next_token_bitmask(self, bitmask: Any, index: int = 0, *, debug_print: bool = False) -> bool:
        """Write the allowed next tokens into row `index`; the mask is computed without the GIL.

        Refused with UsageError, nothing written, as xgrammar refuses them: a bitmask that is not
        int32 on the CPU, not (rows, words) or one (words,) row, a row index out of range, and a mask
        asked for after the stop token was accepted.
        """
        index = _int_arg(index, "index")
        if self._core.terminated:
            raise UsageError("the matcher has accepted the stop token; there is no next token mask")
        last = self._last_row
        if (last is not None and last[0] is bitmask and last[1] == index and bitmask.data_ptr() == last[2]
                and bitmask.shape == last[3] and bitmask.stride() == last[4]):
            address, width = last[5], last[6]      # the same torch bitmask as last time, unchanged
        else:
            address, width = _row_address(bitmask, index, self._n_words)
            if is_torch_tensor(bitmask):
                self._last_row = (bitmask, index, bitmask.data_ptr(), bitmask.shape, bitmask.stride(), address, width)
        self._core.fill_bitmask(address, width)
        return True

    def is_terminated(self) -> bool:
        """The stop token was accepted; with `terminate_without_stop_token`, the grammar could end
        here (xgrammar's meaning: tokens that continue the grammar are still accepted)."""
        if self._core.terminated:
            return True
        return self._terminate_without_stop and self._core.can_end()

    def is_completed(self) -> bool:
        """The grammar could end here (a stop token would be accepted) or has ended."""
        return bool(self._core.terminated or self._core.can_end())

    def rollback(self, num_tokens: int = 1) -> None:
        """Undo the last `num_tokens` accepted tokens (a non-integer is a TypeError).

        More than were accepted is a UsageError, as in xgrammar; so is a negative count, which
        xgrammar ignores (a silent no-op would hide the caller's bug).
        """
        num_tokens = _int_arg(num_tokens, "num_tokens")
        held = self._core.num_tokens
        if not 0 <= num_tokens <= held:
            raise UsageError(f"cannot roll back {num_tokens} tokens; {held} can be rolled back")
        self._core.rollback(num_tokens)
        if self._captures or self._hidden:
            n = self._core.n_sets
            self._captures = [e for e in self._captures if e[3] < n]
            self._hidden = [e for e in self._hidden if e[0] < n]

    def reset(self) -> None:
        self._core.reset()
        self._captures = []
        self._hidden = []

    def fork(self) -> GrammarMatcher:
        """An independent matcher in this one's state (accepted tokens, rollback history, stop
        tokens and options), as xgrammar's fork: a speculative branch or a beam explores on from
        here without disturbing this one. Costs a replay of the accepted bytes (memoised)."""
        other = GrammarMatcher.__new__(GrammarMatcher)
        other.__dict__.update(self.__dict__)
        other._core = self._core.fork()
        other._captures, other._hidden = list(self._captures), list(self._hidden)
        other._last_row = None
        return other

    def traverse_draft_tree(self, retrieve_next_token: Any, retrieve_next_sibling: Any, draft_tokens: Any,
                            token_bitmask: Any, time_threshold: float = -1.0,
                            temperatures: Any = None) -> bool:
        """Masks for every node of a speculative draft tree in one call (xgrammar's signature, the
        order of SGLang's tree walk): node 0 is where the matcher stands; a node is visited when
        its token is allowed by its parent's mask, and then its row of `token_bitmask` gets the
        mask after its token. Every other row of the first len(tree) is zeroed: refused nodes,
        nodes after a stop token, and nodes under a refused one (which xgrammar leaves as they
        were: a stale row there would allow every token).
        The tree is first-child / next-sibling arrays (int64, -1 for none). The matcher ends where
        it started. False if `time_threshold` seconds (> 0) ran out before the walk ended.

        Refused with UsageError: arrays of other lengths or dtypes, indices out of range, a node
        reached twice (a cycle would never end), fewer bitmask rows than nodes.
        `temperatures`, when given (1-D float32, one or more entries per node), gets each visited
        node's `temperature` after its token, and -1 elsewhere or where there is none."""
        nxt = _tree_array(retrieve_next_token, "retrieve_next_token", (np.int64,))
        sib = _tree_array(retrieve_next_sibling, "retrieve_next_sibling", (np.int64,))
        drafts = _tree_array(draft_tokens, "draft_tokens", (np.int64, np.int32))
        n = len(nxt)
        if n == 0 or len(sib) != n or len(drafts) != n:
            raise UsageError(f"the tree arrays must have one equal, non-zero length; got {len(nxt)}, "
                             f"{len(sib)}, {len(drafts)}")
        for name, a in (("retrieve_next_token", nxt), ("retrieve_next_sibling", sib)):
            if ((a < -1) | (a >= n)).any():
                raise UsageError(f"{name} holds an index outside [-1, {n})")
        _, shape = cpu_bitmask(token_bitmask)
        if len(shape) != 2 or shape[0] < n or shape[1] != self._n_words:
            raise UsageError(f"token_bitmask must be ({n} or more, {self._n_words}), got {tuple(shape)}")
        if temperatures is not None:
            check_temperatures(temperatures, n)
        seen, todo = bytearray(n), [0]          # a tree: no node reached twice from the root
        while todo:
            x = todo.pop()
            if seen[x]:
                raise UsageError(f"the draft tree reaches node {x} twice")
            seen[x] = 1
            todo.extend(int(y) for y in (nxt[x], sib[x]) if y >= 0)
        rows = token_bitmask if isinstance(token_bitmask, np.ndarray) else token_bitmask.numpy()
        rows[:n] = 0
        if temperatures is not None:
            temperatures[:n] = -1.0
        deadline = time.perf_counter() + time_threshold if time_threshold > 0 else None
        core, pushed = self._core, 0
        stack = [(0, -1, 0)]        # (node, parent, step): 0 visit, 1 roll back then sibling, 2 sibling
        while stack:
            node, parent, step = stack.pop()
            if step == 0:
                token = int(drafts[node])
                if node != 0:
                    if deadline is not None and time.perf_counter() > deadline:
                        core.rollback(pushed)
                        return False
                    allowed = (0 <= token < self._vocab_size
                               and (int(rows[parent, token >> 5]) >> (token & 31)) & 1)
                    if not allowed or not core.accept_token(token):
                        if sib[node] >= 0:
                            stack.append((int(sib[node]), parent, 0))
                        continue
                    pushed += 1
                stack.append((node, parent, 1 if node != 0 else 2))
                if not core.terminated:
                    self.fill_next_token_bitmask(token_bitmask, node)
                    if temperatures is not None:
                        t = self.temperature
                        temperatures[node] = -1.0 if t is None else t
                    if nxt[node] >= 0:
                        stack.append((int(nxt[node]), node, 0))
            else:
                if step == 1:
                    core.rollback(1)
                    pushed -= 1
                if sib[node] >= 0:
                    stack.append((int(sib[node]), parent, 0))
        return True

    def _debug_print_internal_state(self) -> str:
        """The parser's current state set, one ``ParserState(...)`` per item (rule, node of its
        automaton, the set it started in), as xgrammar's debugging helper of the same name
        returns it: how many items the parse keeps, and what they wait for."""
        names = self._compiled._lowered.rule_names
        lines = [f"ParserState(rule={names[r]}, node={node - int(self._compiled._lowered.arrays['rule_start'][r])}, "
                 f"origin={'root' if top else origin})" for r, node, origin, top in self._core.top_items()]
        return f"GrammarMatcher(tokens={self._core.num_tokens}, terminated={self.is_terminated()})\n" + "\n".join(lines)

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
                if b >= 0xF8:       # a special token's or a token edge's own byte: not text
                    break
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
