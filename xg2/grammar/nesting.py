"""Depth of tenant-sent JSON documents, measured without recursion.

Decoders and converters downstream (msgspec, pydantic, our own lowering) descend into nested
containers with the interpreter's stack; a document nested a few thousand levels deep would end in
an untyped RecursionError. Measuring first, with an explicit stack, turns that into a typed limit
error with the pointer of the first container past the limit.
"""

from __future__ import annotations

from typing import Any

from ..errors import GrammarLimitError


def _escape(key: Any) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def check_nesting(document: Any, limit: int, what: str, base: str = "") -> None:
    """Raise GrammarLimitError when dicts and lists in `document` nest more than `limit` deep."""
    stack: list[tuple[Any, int, str]] = [(document, 1, base)]
    while stack:
        value, depth, pointer = stack.pop()
        if depth > limit:
            raise GrammarLimitError(f"{what} nested deeper than {limit} levels", pointer=pointer)
        if isinstance(value, dict):
            children = value.items()
        elif isinstance(value, (list, tuple)):
            children = enumerate(value)
        else:
            continue
        for key, child in children:
            if isinstance(child, (dict, list, tuple)):
                stack.append((child, depth + 1, f"{pointer}/{_escape(key)}"))
