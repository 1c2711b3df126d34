"""Pieces of JSON Schema merging that need no converter state (see json_schema.py).

Merging two schemas into one valid exactly where both are is sound keyword by keyword only for
keywords that mean the same whatever sits beside them. `items` applies after `prefixItems` (or a
draft 4-2019 `items` array, with `additionalItems`), so the item keywords of two schemas are merged
as what they define together: a schema per position. The member keywords get the same treatment in
the converter, which has the pattern automata.
"""

from __future__ import annotations

from typing import Any

from ..errors import SchemaError
from .validator import json_equal


def both(x: Any, y: Any) -> Any:
    """A schema for "valid under x and under y"."""
    if x is True or json_equal(x, y):
        return y
    if y is True:
        return x
    if x is False or y is False:
        return False
    return {"allOf": [x, y]}


def _item_schemas(s: dict, ptr: str) -> tuple[list, Any]:
    """Pop a schema's item keywords as (the schemas of the first positions, the schema of the rest
    or None); `additionalItems` means something only after a draft 4-2019 `items` array."""
    if "prefixItems" in s:
        prefix, rest = s.pop("prefixItems"), s.pop("items", None)
        s.pop("additionalItems", None)
    elif isinstance(s.get("items"), list):
        prefix, rest = s.pop("items"), s.pop("additionalItems", None)
    else:
        prefix, rest = [], s.pop("items", None)
        s.pop("additionalItems", None)
    if not isinstance(prefix, list):
        raise SchemaError("prefixItems must be an array", ptr + "/prefixItems")
    return prefix, rest


def merge_items(a: dict, b: dict, ptr: str = "") -> None:
    """Move the item keywords of `b` into `a`, for arrays valid under both: position by position,
    each side's rest schema applying from the end of its own prefix."""
    (pa, ra), (pb, rb) = _item_schemas(a, ptr), _item_schemas(b, ptr)

    def at(prefix: list, rest: Any, i: int) -> Any:
        return prefix[i] if i < len(prefix) else (True if rest is None else rest)

    prefix = [both(at(pa, ra, i), at(pb, rb, i)) for i in range(max(len(pa), len(pb)))]
    if prefix:
        a["prefixItems"] = prefix
    if ra is not None or rb is not None:
        a["items"] = both(True if ra is None else ra, True if rb is None else rb)
