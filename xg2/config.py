"""Process-wide settings under xgrammar's names (``xgrammar.config``).

xgrammar bounds the depth of its recursive C++ algorithms with a process-wide maximum recursion
depth. xg2 recurses nowhere on its input (grammars, schemas and tags are read and lowered on
explicit stacks; nesting is bounded per front-end, see ``ebnf.MAX_NESTING_DEPTH`` and
``json_common.MAX_SCHEMA_DEPTH``), so the value is kept and checked, for code written against
xgrammar, and changes nothing.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from .errors import UsageError

#: xgrammar's default and its upper bound.
DEFAULT_MAX_RECURSION_DEPTH = 10_000
MAX_RECURSION_DEPTH_LIMIT = 1_000_000

_lock = threading.Lock()
_depth: int | None = None


def _from_environment() -> int:
    text = os.environ.get("XGRAMMAR_MAX_RECURSION_DEPTH", "")
    if text.isdigit() and 0 < int(text) <= MAX_RECURSION_DEPTH_LIMIT:
        return int(text)
    return DEFAULT_MAX_RECURSION_DEPTH


def get_max_recursion_depth() -> int:
    """The value set, else ``XGRAMMAR_MAX_RECURSION_DEPTH`` (a positive integer up to 1,000,000),
    else 10,000, as in xgrammar."""
    with _lock:
        return _from_environment() if _depth is None else _depth


def set_max_recursion_depth(max_recursion_depth: int) -> None:
    """Set the value (1 to 1,000,000; otherwise a UsageError, a RuntimeError as in xgrammar)."""
    global _depth
    if isinstance(max_recursion_depth, bool) or not isinstance(max_recursion_depth, int) \
            or not 0 < max_recursion_depth <= MAX_RECURSION_DEPTH_LIMIT:
        raise UsageError(f"max_recursion_depth must be an integer in [1, {MAX_RECURSION_DEPTH_LIMIT}], "
                         f"got {max_recursion_depth!r}")
    with _lock:
        _depth = max_recursion_depth


@contextmanager
def max_recursion_depth(temp_depth: int) -> Iterator[None]:
    """The value set to `temp_depth` inside the block, restored after it."""
    previous = get_max_recursion_depth()
    set_max_recursion_depth(temp_depth)
    try:
        yield
    finally:
        set_max_recursion_depth(previous)
