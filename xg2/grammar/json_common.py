"""What the JSON Schema converter and its object lowering share: limits, keyword sets, the JSON
text pieces strings are made of, and JSON pointer helpers. A module of its own so that the object
lowering (json_object.py) and the converter (json_schema.py) can both import it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..errors import SchemaError
from .ir import CharClass, Choice, Expr, Literal, Repeat, Rule, RuleRef, Seq

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
    # anchors name a subschema for references, which schema_refs.py has made local pointers
    "$anchor", "$dynamicAnchor", "\x00documents",
})
UNSUPPORTED = frozenset({
    "$dynamicRef", "$recursiveRef", "$recursiveAnchor",
})
HANDLED = frozenset({
    "type", "enum", "const", "properties", "required", "additionalProperties", "items",
    "prefixItems", "additionalItems", "minItems", "maxItems", "minLength", "maxLength", "anyOf",
    "oneOf", "allOf", "$ref", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "uniqueItems", "pattern", "format", "multipleOf", "patternProperties", "propertyNames",
    "minProperties", "maxProperties", "dependentRequired", "dependencies", "unevaluatedProperties",
    "unevaluatedItems", "not", "if", "then", "else", "contains", "minContains", "maxContains",
    "dependentSchemas",
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
#: A string value with nothing constraining it, written raw (see `_Converter.raw_string`).
RAW_TEXT = CharClass(((0, 0x10FFFF),), negated=True)


@dataclass(frozen=True)
class XMLStyle:
    """How a model's XML tool-call format writes its arguments.

    A member is `open` (its parts joined by optional whitespace; `{name}` is the member's name,
    spelled through `escapes`, `{kind}` the marker `kinds` gives the value's JSON type), the value,
    then `close` (which may repeat `{name}`). String values are raw text, others JSON; in a
    `recursive` style objects and arrays below the arguments are written as elements too, an
    array's items between `item_open` and `item_close`. Raw text never holds `stop` (the start of
    `close` unless said otherwise): the model's parser reads a value up to it. `pad`: a constrained
    raw value may sit between one newline each side, as the template writes it and the parser
    strips; `json_pad`: whitespace may surround a JSON value. `names`: the (decoded) names of members
    the schema does not list, or None when the style cannot write them (a closing tag that repeats
    a name is beyond a context-free grammar)."""

    open: tuple[str, ...]
    close: str
    kinds: tuple[tuple[str, str], ...] = ()
    pad: bool = False
    recursive: bool = False
    item_open: tuple[str, ...] = ()
    item_close: str = ""
    stop: str = ""
    json_pad: bool = True
    escapes: tuple[tuple[str, str], ...] = ()
    names: Expr | None = None

    def kind(self, t: str) -> str:
        """The marker written for a value of JSON type `t` ("" in a style without markers)."""
        return dict(self.kinds).get(t, "")

    def markers(self) -> tuple[str, ...]:
        """The markers in the order of TYPES (one "" in a style without them)."""
        return tuple(dict.fromkeys(self.kind(t) for t in TYPES))

    def spell(self, name: str) -> str:
        for ch, entity in self.escapes:
            name = name.replace(ch, entity)
        return name

    def until(self) -> str:
        return self.stop or self.close


#: Argument names when the schema does not list them.
XML_NAME = Seq((CharClass(((0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))),
                Repeat(CharClass(((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))), 0, None)))
_DSML = "\uff5cDSML\uff5c"
_MINIMAX_NS = "]<]minimax[>["
#: Entity spellings of the characters an XML attribute value cannot hold as they are ("&" first).
_ATTR_ESCAPES = (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ('"', "&quot;"))
XML_STYLES = {
    "qwen_xml": XMLStyle(("<parameter={name}>",), "</parameter>", pad=True, names=XML_NAME),
    "minimax_xml": XMLStyle(('<parameter name="{name}">',), "</parameter>", names=XML_NAME),
    # MiMo-V2: Qwen's tags, the value right between them (the parser keeps it as it is: no padding).
    "mimo_xml": XMLStyle(("<parameter={name}>",), "</parameter>", json_pad=False, names=XML_NAME),
    "glm_xml": XMLStyle(("<arg_key>{name}</arg_key>", "<arg_value>"), "</arg_value>", names=XML_NAME),
    # DeepSeek V3.2/V4 DSML: string="true" marks a raw string, "false" a JSON value.
    "deepseek_xml": XMLStyle((f'<{_DSML}parameter name="{{name}}" string="{{kind}}">',), f"</{_DSML}parameter>",
                             tuple((t, "true" if t == "string" else "false") for t in TYPES), names=XML_NAME),
    # DeepSeek V4.1: the same tags with a space after the DSML marker (SGLang's DeepSeekV41Detector).
    "deepseek_v4_1_xml": XMLStyle((f'<{_DSML} parameter name="{{name}}" string="{{kind}}">',),
                                  f"</{_DSML} parameter>",
                                  tuple((t, "true" if t == "string" else "false") for t in TYPES), names=XML_NAME),
    # Kimi K3: the type attribute names the value's JSON type, integers as "number" (as SGLang's
    # structural tag and the model's template write it); attribute values escape & and ".
    "kimi_k3_xml": XMLStyle(('<|open|>argument key="{name}" type="{kind}"<|sep|>',), "<|close|>argument<|sep|>",
                            tuple((t, "number" if t == "integer" else t) for t in TYPES),
                            escapes=(_ATTR_ESCAPES[0], _ATTR_ESCAPES[3]), names=XML_NAME),
    # Cohere (cmd5 nested XML): every value is a <cofl:value> element, typed raw (a string), json (a
    # scalar), dict (named child elements) or list (unnamed ones); names are entity-escaped.
    "cohere_xml": XMLStyle(('<cofl:value name="{name}" type="{kind}">',), "</cofl:value>",
                           (("null", "json"), ("boolean", "json"), ("object", "dict"), ("array", "list"),
                            ("string", "raw"), ("number", "json"), ("integer", "json")),
                           recursive=True, item_open=('<cofl:value type="{kind}">',), item_close="</cofl:value>",
                           escapes=_ATTR_ESCAPES, names=Repeat(CharClass(((0, 0),), negated=True), 1, None)),
    # MiniMax M3: each member is an element named after it, every tag behind the namespace marker;
    # objects nest, array items are <item> elements, JSON scalars are written bare.
    "minimax_m3_xml": XMLStyle((_MINIMAX_NS + "<{name}>",), _MINIMAX_NS + "</{name}>", recursive=True,
                               item_open=(_MINIMAX_NS + "<item>",), item_close=_MINIMAX_NS + "</item>",
                               stop=_MINIMAX_NS, json_pad=False),
}
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
#: Internal keywords holding the `if`/`then`/`else` groups and `contains` groups of merged
#: schemas beyond the first (each a list of dicts with those keywords; merging concatenates them).
CONDITIONS = "\x00conditions"
MORE_CONTAINS = "\x00contains"
#: Internal keyword listing the members a `not` asks for among those a schema does not name, as
#: (key automaton, value schema) pairs (json_object.py).
FOUND = "\x00found"
#: Internal keyword holding the `pattern`s and `format`s of merged schemas beyond the first (a list
#: of one-keyword dicts): a string meets them all.
MORE_STRINGS = "\x00strings"
#: Internal keyword: unevaluatedItems beside `contains` (items after the prefix that do not match
#: `contains` meet it), read by the contains automaton.
UNEVALUATED_ITEMS = "\x00unevaluated_items"


# --- small helpers shared by the JSON and the XML lowerings ------------------------------------

def _branches(schema: dict, kw: str, ptr: str) -> tuple[list, dict]:
    """The branches of `anyOf` / `oneOf` (a non-empty list, checked) and the schema without them."""
    subs = schema[kw]
    if not isinstance(subs, list) or not subs:
        raise SchemaError(f"{kw} must be a non-empty array", _ptr(ptr, kw))
    return subs, {k: v for k, v in schema.items() if k != kw}


def _inert(keyword: str, schema: dict) -> bool:
    """A keyword that means nothing without its partner (`then`/`else` without `if`, the contains
    counts without `contains`): nothing to enforce, so nothing to refuse."""
    partner = {"then": "if", "else": "if", "minContains": "contains", "maxContains": "contains"}.get(keyword)
    return partner is not None and partner not in schema


def _without_lt(e: Expr) -> Expr:
    if not isinstance(e, CharClass):
        return e
    if e.negated:
        return CharClass((*e.ranges, (0x3C, 0x3C)), negated=True)
    return CharClass(tuple((lo, hi) for a, b in e.ranges for lo, hi in ((a, min(b, 0x3B)), (max(a, 0x3D), b)) if lo <= hi))


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    return "array" if isinstance(v, list) else "object"


def _listed_values(schema: dict, ptr: str) -> tuple[list | None, str]:
    """The values a schema lists itself (`const`, `enum`, or those of an `allOf` branch), which
    bound its language to a finite set; (None, "") when it lists none."""
    for branch, where in [(schema, ptr)] + [(b, _ptr(ptr, "allOf", i)) for i, b in enumerate(schema.get("allOf", []))
                                            if isinstance(schema.get("allOf"), list)]:
        if not isinstance(branch, dict):
            continue
        if "const" in branch:
            return [branch["const"]], _ptr(where, "const")
        if "enum" in branch:
            if not isinstance(branch["enum"], list):
                raise SchemaError("enum must be an array", _ptr(where, "enum"))
            return branch["enum"], _ptr(where, "enum")
    return None, ""


def state_rules(new_name, rules: list, hint: str, start: tuple, body) -> RuleRef:
    """An automaton as rules, one per state reachable from `start`: `body(state, *key)` is the
    state's expression, reaching other states through `state(*key) -> RuleRef` (each state's
    rule made once, its body built from a work list: no recursion)."""
    refs: dict[tuple, RuleRef] = {}
    pending: list[tuple] = []

    def state(*key) -> RuleRef:
        if key not in refs:
            refs[key] = RuleRef(new_name(hint))
            pending.append(key)
        return refs[key]

    first = state(*start)
    i = 0
    while i < len(pending):
        key = pending[i]
        rules.append(Rule(refs[key].name, body(state, *key) or NEVER))
        i += 1
    return first
