"""What the JSON Schema converter and its object lowering share: limits, keyword sets, the JSON
text pieces strings are made of, and JSON pointer helpers. A module of its own so that the object
lowering (json_object.py) and the converter (json_schema.py) can both import it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .ir import CharClass, Choice, Expr, Literal, Repeat, Seq

#: Largest accepted minItems/maxItems/minLength/maxLength.
MAX_BOUND = 1_000_000
#: Most properties of an object with `any_order`, and most object states (entries x counts) overall.
MAX_ANY_ORDER = 10
MAX_OBJECT_STATES = 20_000
#: Most properties taking part in dependentRequired/dependencies in one object (states grow as 2**n).
MAX_TRACKED_DEPENDENCIES = 8
#: Most patternProperties in one object (key regions grow as 2**n).
MAX_KEY_PATTERNS = 4
#: Most branches made by merging two anyOf (or oneOf) keywords (the product of their lengths).
MAX_CROSS_BRANCHES = 64
#: How deep `oneOf` disjointness follows required members into their schemas.
MAX_DISJOINT_DEPTH = 4
#: Nested schemas (including `$ref` hops and `enum` values) the converter descends before giving up.
MAX_SCHEMA_DEPTH = 128
#: Dicts and lists nested in the whole schema document before it is refused unread: a schema level
#: takes at most two (`properties` and a name, `allOf` and a list), so a document past this many
#: holds schemas or values past MAX_SCHEMA_DEPTH (or unused definitions that deep).
MAX_SCHEMA_NESTING = 4 * MAX_SCHEMA_DEPTH
#: Deepest container nesting accepted with `indent` and `any_whitespace=False`.
MAX_INDENT_DEPTH = 20

ANNOTATIONS = frozenset({
    "title", "description", "examples", "default", "$schema", "$id", "id", "$comment", "deprecated",
    "readOnly", "writeOnly", "$defs", "definitions",
    # 2020-12 makes the content keywords annotations: a validator need not decode the string
    "contentEncoding", "contentMediaType", "contentSchema",
})
UNSUPPORTED = frozenset({
    "unevaluatedItems",
    "dependentSchemas", "contains", "minContains", "maxContains", "not", "if", "then",
    "else", "$dynamicRef", "$recursiveRef", "$dynamicAnchor", "$recursiveAnchor", "$anchor",
})
HANDLED = frozenset({
    "type", "enum", "const", "properties", "required", "additionalProperties", "items",
    "prefixItems", "additionalItems", "minItems", "maxItems", "minLength", "maxLength", "anyOf",
    "oneOf", "allOf", "$ref", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "uniqueItems", "pattern", "format", "multipleOf", "patternProperties", "propertyNames",
    "minProperties", "maxProperties", "dependentRequired", "dependencies", "unevaluatedProperties",
})
#: Keywords whose meaning depends on each other: merged as one function from a key (an index) to
#: the schema its member (its item) must meet.
MEMBER_KEYWORDS = ("properties", "patternProperties", "additionalProperties")
ITEM_KEYWORDS = ("items", "prefixItems", "additionalItems")
#: Bounds two merged schemas combine by keeping the tighter one (True: the larger is tighter).
BOUNDS = {"minItems": True, "minLength": True, "minProperties": True, "minimum": True, "exclusiveMinimum": True,
          "maxItems": False, "maxLength": False, "maxProperties": False, "maximum": False, "exclusiveMaximum": False}
#: Keywords that make an object name or bound its members: with strict_mode, an object that has
#: none of them is open (xgrammar's choice, compared side by side in the tests).
CLOSING = ("properties", "patternProperties", "required", "minProperties", "maxProperties", "dependentRequired",
           "dependentSchemas", "dependencies", "unevaluatedProperties", "\x00presence")
#: The error for a oneOf whose exactly-one condition cannot be enforced.
ONE_OF_OVERLAP = ("oneOf whose branches may overlap (exactly-one cannot be enforced; use anyOf if overlap is "
                  "acceptable)")
TYPES = ("null", "boolean", "object", "array", "string", "number", "integer")

NEVER = CharClass(())  # the empty language
#: A string value with nothing constraining it, written raw (see `_Converter.raw_value`).
RAW_TEXT = CharClass(((0, 0x10FFFF),), negated=True)


@dataclass(frozen=True)
class XMLStyle:
    """How a model's XML tool-call format writes one top-level argument: `open` (its parts are
    joined by optional whitespace; `{name}` is the argument's name, `{kind}` one of `kinds`, for a
    raw text value or a JSON one), the value, then `close`. String-only values are raw text, every
    other value is JSON; `pad`: a constrained raw value may sit between one newline each side, as
    the model's template writes it and its parser strips."""

    open: tuple[str, ...]
    close: str
    kinds: tuple[str, str] = ("", "")
    pad: bool = False


XML_STYLES = {
    "qwen_xml": XMLStyle(("<parameter={name}>",), "</parameter>", pad=True),
    "minimax_xml": XMLStyle(('<parameter name="{name}">',), "</parameter>"),
    "glm_xml": XMLStyle(("<arg_key>{name}</arg_key>", "<arg_value>"), "</arg_value>"),
    "deepseek_xml": XMLStyle(('<\uff5cDSML\uff5cparameter name="{name}" string="{kind}">',), "</\uff5cDSML\uff5cparameter>",
                             ("true", "false")),
}
#: Argument names when the schema does not list them.
XML_NAME = Seq((CharClass(((0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))),
                Repeat(CharClass(((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))), 0, None)))
EMPTY = Literal("")
HEX = CharClass(((0x30, 0x39), (0x41, 0x46), (0x61, 0x66)))
SHORT_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
UNESCAPED = CharClass(((0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)), negated=True)
#: `\\uXXXX` after the backslash: a code point that is not a surrogate, or a surrogate pair written as
#: two escapes (high then low); a lone surrogate is not a Unicode character, so it is never accepted.
U_ESCAPE = Seq((Literal("u"), Choice((
    Seq((CharClass(((0x30, 0x39), (0x41, 0x43), (0x61, 0x63), (0x45, 0x46), (0x65, 0x66))), HEX, HEX, HEX)),
    Seq((CharClass(((0x44, 0x44), (0x64, 0x64))), CharClass(((0x30, 0x37),)), HEX, HEX)),
    Seq((CharClass(((0x44, 0x44), (0x64, 0x64))), CharClass(((0x38, 0x39), (0x41, 0x42), (0x61, 0x62))), HEX, HEX,
         Literal("\\u"), CharClass(((0x44, 0x44), (0x64, 0x64))), CharClass(((0x43, 0x46), (0x63, 0x66))), HEX, HEX)),
))))
ESCAPE = Seq((Literal("\\"), Choice((CharClass(tuple((ord(c), ord(c)) for c in sorted(SHORT_ESCAPES))), U_ESCAPE))))
CHAR = Choice((UNESCAPED, ESCAPE))


def _ptr(base: str, *parts: Any) -> str:
    out = base
    for p in parts:
        out += "/" + str(p).replace("~", "~0").replace("/", "~1")
    return out


def _opt(e: Expr | None) -> Expr:
    return EMPTY if e is None else Repeat(e, 0, 1)


def _canon_str(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


# --- converter ------------------------------------------------------------------------------------

_CANNOT = object()
#: Internal keyword carrying a oneOf/anyOf over required-sets down to the object lowering.
PRESENCE = "\x00presence"
