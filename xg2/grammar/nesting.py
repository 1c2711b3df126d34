"""Depth of tenant-sent JSON documents, measured without recursion.

Decoders and converters downstream (msgspec, pydantic, our own lowering) descend into nested
containers with the interpreter's stack, and walks that carry a pointer per node cost memory that
grows with the square of the depth; a document nested a few thousand levels deep would end in an
untyped RecursionError or exhaust memory. Measuring first, with an explicit stack and one small
link per container, turns that into a typed limit error with the pointer of the first container
past the limit.
"""

from __future__ import annotations

from typing import Any

from ..errors import GrammarLimitError


def _escape(key: Any) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def _pointer(link: tuple | None, base: str) -> str:
    parts: list[str] = []
    while link is not None:
        link, key = link
        parts.append(_escape(key))
    return base + "".join("/" + p for p in reversed(parts))


def check_nesting(document: Any, limit: int, what: str, base: str = "") -> None:
    """Raise GrammarLimitError when dicts and lists in `document` nest more than `limit` deep."""
    # (container, its depth, link to it: (link to its parent, key) or None for the root)
    stack: list[tuple[Any, int, tuple | None]] = [(document, 1, None)]
    while stack:
        value, depth, link = stack.pop()
        if isinstance(value, dict):
            children = value.items()
        elif isinstance(value, (list, tuple)):
            children = enumerate(value)
        else:
            continue
        if depth > limit:
            raise GrammarLimitError(f"{what} nested deeper than {limit} levels", pointer=_pointer(link, base))
        for key, child in children:
            if isinstance(child, (dict, list, tuple)):
                stack.append((child, depth + 1, (link, key)))
