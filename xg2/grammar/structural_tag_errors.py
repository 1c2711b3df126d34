"""Messages for structural tags that do not fit the format types.

msgspec checks the types of a structural tag while it decodes, and says what went wrong in terms of
JSON types (``Expected `bool`, got `str```). A user who wrote the tag thinks in formats and their
fields, so this module restates the error in those terms: which format, which field, what the
field holds (``at_least_one must be a boolean, got "yes"``). It reads the declared types of the
format structs, so a new field or format is described without a table to keep in step; only the
formats' display names are listed here. The JSON pointer stays with the error, not the message.
"""

from __future__ import annotations

import json
import re
import types
import typing
from typing import Any

import msgspec

#: Display names of formats whose `type` does not read well with its underscores replaced.
_LABELS = {"const_string": "ConstString", "json_schema": "JSON schema", "qwen_xml_parameter": "Qwen XML parameter",
           "any_text": "Any text", "or": "Or"}

_SIMPLE = {str: ("a string", "strings"), bool: ("a boolean", "booleans"), int: ("an integer", "integers"),
           float: ("a number", "numbers"), dict: ("an object", "objects"), type(None): ("null", "nulls"),
           Any: ("a value", "values")}


def _tag_of(cls: type) -> str | None:
    config = getattr(cls, "__struct_config__", None)
    return config.tag if config is not None and isinstance(config.tag, str) else None


def _is_struct(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, msgspec.Struct)


def _union_args(t: Any) -> tuple:
    if typing.get_origin(t) in (typing.Union, types.UnionType):
        return typing.get_args(t)
    return ()


def _is_format_union(t: Any) -> bool:
    """The union of every format (a slot that takes any format)."""
    args = _union_args(t)
    return len(args) > 2 and all(_is_struct(a) and _tag_of(a) for a in args)


def label(cls: type) -> str:
    """How a message names a format: "Triggered tags format", "Structural tag"."""
    tag = _tag_of(cls)
    if tag == "structural_tag":
        return "Structural tag"
    if tag is None:
        return cls.__name__
    name = _LABELS.get(tag) or tag.replace("_", " ").capitalize()
    return f"{name} format"


def describe(t: Any, plural: bool = False) -> str:
    """A declared type in words: "a string", "an array of tag formats"."""
    if typing.get_origin(t) is typing.Annotated:
        base, *meta = typing.get_args(t)
        bounds = {k: getattr(m, k) for m in meta if isinstance(m, msgspec.Meta) for k in ("ge", "le", "min_length")}
        if base is int and bounds.get("ge") == 0 and bounds.get("le") == 2**31 - 1:
            return "non-negative 32-bit integers" if plural else "a non-negative 32-bit integer"
        if base is str and bounds.get("min_length") == 1:
            return "non-empty strings" if plural else "a non-empty string"
        return describe(base, plural)
    if t in _SIMPLE:
        return _SIMPLE[t][plural]
    if _is_format_union(t):
        return "formats" if plural else "a format"
    if _is_struct(t):
        name = label(t)[0].lower() + label(t)[1:]
        return f"{name}s" if plural else f"{_article(name)} {name}"
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is typing.Literal:
        return "one of " + ", ".join(json.dumps(a) for a in args)
    if origin is list:
        inner = describe(args[0], plural=True) if args else "values"
        return f"arrays of {inner}" if plural else f"an array of {inner}"
    if origin is tuple:
        inner = " and ".join(describe(a) for a in args)
        return f"pairs of {inner}" if plural else f"a pair of {inner}"
    if origin is dict:
        return "objects" if plural else "an object"
    union = _union_args(t)
    if union:
        words = [describe(a, plural) for a in union]
        return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]
    return "values" if plural else "a value"


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeio" else "a"


def _shown(value: Any) -> str:
    """The offending value as the user wrote it, kept short."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, (list, tuple)):
        return f"an array of {len(value)} item{'s' * (len(value) != 1)}"
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        return type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def _struct_of(t: Any, value: Any) -> type | None:
    """The struct a value is read as, where the declared type `t` has one: the format its "type"
    names, in a slot that takes several."""
    if _is_struct(t):
        return t
    structs = [a for a in _union_args(t) if _is_struct(a)]
    if not structs or not isinstance(value, dict):
        return None
    if len(structs) == 1:
        return structs[0]
    return next((s for s in structs if _tag_of(s) == value.get("type")), None)


def _fields(cls: type) -> dict[str, msgspec.structs.FieldInfo]:
    return {f.encode_name: f for f in msgspec.structs.fields(cls)}


class _Slot(typing.NamedTuple):
    owner: type | None      # the struct whose field holds the value (None: the document itself)
    field: str | None       # that field
    items: tuple[int, ...]  # where the value lies within the field's arrays (none: the field itself)
    declared: Any           # the declared type of the value
    value: Any


def _slot(root: type, data: Any, parts: list) -> _Slot | None:
    """What the value at `parts` is, walking the declared types alongside the data."""
    slot = _Slot(None, None, (), root, data)
    for p in parts:
        t, value = slot.declared, slot.value
        cls = _struct_of(t, value)
        if cls is not None and isinstance(p, str):
            info = _fields(cls).get(p)
            declared = info.type if info is not None else (str if p == "type" else None)
            slot = _Slot(cls, p, (), declared, value.get(p))
            continue
        args = _union_args(t) or (t,)
        seq = next((a for a in args if typing.get_origin(a) in (list, tuple)), None)
        if seq is None or not isinstance(p, int) or not isinstance(value, (list, tuple)) or p >= len(value):
            return None
        inner = typing.get_args(seq)
        declared = inner[0] if typing.get_origin(seq) is list else (inner[p] if p < len(inner) else None)
        slot = _Slot(slot.owner, slot.field, (*slot.items, p), declared, value[p])
    return slot


def _required(cls: type, field: str) -> bool:
    info = _fields(cls).get(field)
    return info is not None and info.required


def explain(message: str, root: type, data: Any, parts: list) -> str:
    """msgspec's `message` about the value at `parts` of `data` (read as `root`), in the words of
    formats and fields; msgspec's own words where the value's place is not known."""
    parent = _slot(root, data, parts[:-1]) if parts else None
    if parent is not None and parts[-1] == "type" and _is_format_union(parent.declared):
        value = parent.value.get("type") if isinstance(parent.value, dict) else None
        if not isinstance(value, str):
            return f"Format's type must be a string, got {_shown(value)}"
        known = sorted(_tag_of(a) for a in _union_args(parent.declared))
        return f"Format type not recognized: {value or _shown(value)} (known: {', '.join(known)})"
    slot = _slot(root, data, parts)
    if slot is None:
        return message
    if message == "Object missing required field `type`" and _is_format_union(slot.declared):
        return "Invalid format: a format must have a type field naming its kind"
    missing = re.match(r"Object missing required field `(.+)`$", message)
    if missing:
        cls = _struct_of(slot.declared, slot.value)
        name = missing.group(1)
        if cls is None:
            return message
        if name == "type":
            if _tag_of(cls) == "structural_tag":
                return 'Structural tag must have a type field "structural_tag"'
            return "Invalid format: a format must have a type field naming its kind"
        declared = _fields(cls)[name].type
        return f"{label(cls)} must have {_article(name)} {name} field with {describe(declared)}"
    unknown = re.match(r"Object contains unknown field `(.+)`$", message)
    if unknown:
        cls = _struct_of(slot.declared, slot.value)
        what = label(cls) if cls is not None else "The object"
        return f"{what} has no field {unknown.group(1)!r}"
    if slot.owner is None:
        return f"Structural tag must be an object, got {_shown(slot.value)}"
    if slot.field == "type" and not slot.items:
        if _tag_of(slot.owner) == "structural_tag":
            return 'Structural tag\'s type must be a string "structural_tag"'
        # a slot that takes one kind of format (a tag in a list of tags, a token as a begin)
        return f"{label(slot.owner)}'s type must be {json.dumps(_tag_of(slot.owner))}, got {_shown(slot.value)}"
    if _is_format_union(slot.declared) and not isinstance(slot.value, dict):
        return f"Format must be an object, got {_shown(slot.value)}"
    if len(slot.items) == 1:
        return (f"{label(slot.owner)}'s {slot.field} must be {describe(slot.declared, True)}; item {slot.items[0]} "
                f"is {_shown(slot.value)}")
    if slot.items:
        place = slot.field + "".join(f"[{i}]" for i in slot.items)
        return (f"{label(slot.owner)}'s {slot.field} must be {describe(_fields(slot.owner)[slot.field].type)}; "
                f"{place} is {_shown(slot.value)}")
    if _required(slot.owner, slot.field):
        return (f"{label(slot.owner)} must have {_article(slot.field)} {slot.field} field with "
                f"{describe(slot.declared)}, got {_shown(slot.value)}")
    return f"{slot.field} must be {describe(slot.declared)}, got {_shown(slot.value)}"
