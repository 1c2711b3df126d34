"""JSON Schema front-end: lower a JSON Schema to the grammar IR (xgrammar's `compile_json_schema` shape).

`json_schema_to_ir(schema, ...)` returns a :class:`GrammarIR` whose language is the set of JSON texts
valid under the schema, written with the chosen layout. The supported keywords and the exact
semantics are listed in the README ("JSON Schema"). The converter is one class made of mixins,
one per seam: objects (json_object.py), strings (json_strings.py), arrays (json_arrays.py),
numbers (json_numbers.py), negation and conditionals (json_negation.py: `not`, `if`, overlapping
`oneOf`, `dependentSchemas` as positive schemas), XML-style arguments (json_xml.py); references
are made local pointers before lowering (schema_refs.py). This module holds the layout, the rule
bookkeeping, merging (allOf, `$ref` siblings, union branches) and the dispatch by keyword. A
schema that lists its values (enum/const) keeps the values valid under all of it, so every
keyword is exact there. Annotations and non-standard keywords are ignored; anything else raises
:class:`SchemaError` with its JSON pointer, or warns (:class:`SchemaWarning`) and is relaxed in
lenient mode.

Exactness notes (documented restrictions; everything else is exact):

* Object members appear in the order of `properties` (then `required` names not listed in
  `properties`), unless `any_order`; additional members come after the named ones.
* Property names, `enum`/`const` strings and strings under `pattern`/`format` take the raw
  spelling, the short escapes and `\\uXXXX` for characters outside printable ASCII
  (`string_escapes="all"`: for every character). Free strings accept every escape.
* `integer` values are written without fraction or exponent (`integers_as_numbers`: also `3.0`,
  and unbounded `1e2`); bounded or `multipleOf` numbers in plain decimal notation (no exponent);
  numbers that `not` keeps apart from integers in plain decimal with at most 15 digits.
* `oneOf` is exact: branches that may overlap are each met with the others' complements
  (json_negation.py); a complement with no positive form is an error (lenient: anyOf).
* allOf members (and `$ref` targets, and the branches of an `anyOf` with the keywords beside it)
  are merged keyword by keyword; keywords that depend on their siblings are merged as the function
  they define together (the schema of each item position; of each member key, from `properties`,
  `patternProperties` and `additionalProperties`), exactly or not at all. Two `anyOf` (or disjoint
  `oneOf`) meet as the pairs of their branches, two `not`s as `not` of their `anyOf`.
* `strict_mode` closes an object to the keys it names (`properties`, `required`, patterns) and an
  array to its `prefixItems`; an object that names and bounds no member (no `properties`,
  `patternProperties`, `required`, min/maxProperties, dependencies, `additionalProperties` or
  `unevaluatedProperties`) stays open, as in xgrammar.
* `multipleOf` is decided in exact decimal arithmetic, as the specification says; the `jsonschema`
  package divides binary floats and so rejects some true multiples (0.3 for `multipleOf: 0.1`).
* A key may be written twice among additional members when their keys are many (a grammar cannot
  tell them apart; neither can xgrammar's): `minProperties` counts the members written. When
  patterns leave at most a few other keys, each is written at most once.
* Length bounds count code points; a surrogate pair written as two escapes is one character, and a
  lone surrogate escape is never accepted.
* With `indent` and `any_whitespace=False` the layout depends on nesting depth; values nested more
  than :data:`MAX_INDENT_DEPTH` containers deep are then not accepted.
* The root value has no surrounding whitespace.
* Nesting is bounded: more than :data:`MAX_SCHEMA_DEPTH` nested schemas (counting `$ref` hops and
  merges) raise :class:`GrammarLimitError`; bounds above :data:`MAX_BOUND` do too.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping
from typing import Any

from ..errors import GrammarLimitError, SchemaError, SchemaJSONError, SchemaWarning
from . import budget
from .alternation import MAX_INLINE_CHARS, factor_literals
from .formats import format_expr
from .ir import CharClass, Choice, Expr, GrammarIR, Literal, Repeat, Rule, RuleRef, Seq
from .ir import choice as _choice
from .ir import seq as _seq
from .json_arrays import ArrayLowering
from .json_common import (
    _CANNOT,
    ANNOTATIONS,
    BOUNDS,
    CONDITIONS,
    EMPTY,
    FOUND,
    HANDLED,
    ITEM_KEYWORDS,
    MAX_ANY_ORDER,
    MAX_BOUND,
    MAX_CROSS_BRANCHES,
    MAX_DISJOINT_DEPTH,
    MAX_INDENT_DEPTH,
    MAX_SCHEMA_DEPTH,
    MAX_SCHEMA_NESTING,
    MEMBER_KEYWORDS,
    MORE_CONTAINS,
    MORE_STRINGS,
    NEVER,
    PRESENCE,
    TYPES,
    UNEVALUATED_ITEMS,
    UNSUPPORTED,
    XML_STYLES,
    _branches,
    _canon_str,
    _inert,
    _listed_values,
    _ptr,
)
from .json_excludes import Excluder
from .json_negation import NegationLowering, _schema_dependencies
from .json_numbers import ZERO_FRACTION, NumberLowering, _decimal_lcm
from .json_object import ObjectLowering
from .json_string import ESCAPES, json_string_body, json_string_literal
from .json_strings import StringLowering
from .json_xml import XMLLowering
from .nesting import check_nesting
from .numbers import NUMBER
from .regular import intersect
from .schema_merge import both as _both
from .schema_merge import merge_items as _merge_items
from .schema_refs import MISSING, follow, link_references
from .validator import MAX_VALIDATION_DEPTH, Validator, json_equal

__all__ = ["MAX_BOUND", "MAX_INDENT_DEPTH", "MAX_SCHEMA_DEPTH", "json_schema_to_ir"]

class _Converter(XMLLowering, ObjectLowering, StringLowering, ArrayLowering, NumberLowering, NegationLowering):
    def __init__(self, root: Any, any_whitespace: bool, indent: int | str | None,
                 separators: tuple[str, str] | None, strict_mode: bool, max_whitespace_cnt: int | None,
                 any_order: bool = False, lenient: bool = False, style: str = "json", excludes=(),
                 format_assertion: bool = True, string_escapes: str = "non_ascii",
                 integers_as_numbers: bool = False):
        if style != "json" and style not in XML_STYLES:
            raise SchemaError(f"style {style!r} is not supported yet (supported: json, {', '.join(XML_STYLES)})", "")
        self.xml = XML_STYLES.get(style)
        self.root = root
        self.format_assertion = format_assertion
        if string_escapes not in ESCAPES:
            raise ValueError(f"string_escapes must be one of {', '.join(ESCAPES)}, not {string_escapes!r}")
        self.escapes = string_escapes
        self.integers_as_numbers = integers_as_numbers
        self.any_order = any_order
        self.lenient = lenient
        self.any_ws = any_whitespace
        if isinstance(indent, int) and not isinstance(indent, bool):
            if indent < 0:
                raise ValueError("indent must be non-negative")
            indent = " " * indent
        elif indent is not None and not isinstance(indent, str):
            raise TypeError("indent must be an int, a str or None")
        self.indent = indent
        if separators is None:
            separators = (",", ": ") if indent is not None else (", ", ": ")
        if len(separators) != 2 or not all(isinstance(s, str) for s in separators):
            raise TypeError("separators must be a pair of strings")
        self.item_sep, self.key_sep = separators
        # strings string content never holds (json_excludes.py); checked before anything is lowered
        self.excl = Excluder(excludes, self.xml, self.item_sep + self.key_sep + (indent or "")) if excludes else None
        self.strict = strict_mode
        if max_whitespace_cnt is not None and (max_whitespace_cnt < 0 or max_whitespace_cnt > MAX_BOUND):
            raise GrammarLimitError(f"max_whitespace_cnt must be between 0 and {MAX_BOUND}")
        self.ws = Repeat(CharClass(((9, 10), (13, 13), (32, 32))), 0, max_whitespace_cnt)
        # around an XML style's elements: any run, or without any_whitespace one character at most
        # (the templates write a newline there, or nothing)
        self.xml_ws = self.ws if any_whitespace else Repeat(CharClass(((9, 10), (13, 13), (32, 32))), 0,
                                                              min(1, max_whitespace_cnt if max_whitespace_cnt is not None
                                                                  else 1))
        self.depth_layout = indent is not None and not any_whitespace
        self.rules: list[Rule] = []
        self.names: set[str] = set()
        self.next_suffix: dict[str, int] = {}
        self.cache: dict[Any, str] = {}
        self.empty_keys: set[Any] = set()
        self.level = 0
        self.where = ""     # the schema being lowered, for an error that has no better pointer
        # drafts 4 to 7: "$ref" stands alone, the keywords beside it are ignored
        draft = root.get("$schema") if isinstance(root, dict) else None
        self.ref_alone = isinstance(draft, str) and any(f"draft-0{n}/" in draft for n in (3, 4, 6, 7))
        self.raw_open: set[tuple] = set()   # ref branches whose raw strings are being built (json_xml.py)
        self.why_empty: tuple[str, str] | None = None   # the first part found to accept nothing

    # layout -----------------------------------------------------------------------------------
    def dkey(self, d: int) -> int:
        """The part of the depth that changes how a value is spelled (rules are shared across the rest)."""
        return d if self.depth_layout else int(d == 0) if self.xml else 0

    def xml_at(self, d: int) -> bool:
        """Whether a container at depth d is written as XML elements: the arguments (depth 0) in
        every XML style, and every object and array in a recursive one."""
        return self.xml is not None and (d == 0 or self.xml.recursive)

    def open(self, ch: str, d: int) -> Expr:
        if self.xml_at(d):     # XML elements (members, items) between whitespace
            return self.xml_ws
        if self.any_ws:
            return Seq((Literal(ch), self.ws))
        if self.indent is not None:
            return Literal(ch + "\n" + self.indent * (d + 1))
        return Literal(ch)

    def close(self, ch: str, d: int) -> Expr:
        if self.xml_at(d):
            return self.xml_ws
        if self.any_ws:
            return Seq((self.ws, Literal(ch)))
        if self.indent is not None:
            return Literal("\n" + self.indent * d + ch)
        return Literal(ch)

    def empty(self, pair: str, d: int) -> Expr:
        if self.xml_at(d):
            # Nested and unmarked (minimax_m3_xml), white space alone would read as a string.
            return self.xml_ws if d == 0 or self.xml.kinds else EMPTY
        if self.any_ws:
            return Seq((Literal(pair[0]), self.ws, Literal(pair[1])))
        return Literal(pair)

    def sep(self, d: int) -> Expr:
        if self.xml_at(d):
            return self.xml_ws
        if self.any_ws:
            return Seq((self.ws, Literal(self.item_sep.strip(" \t\n\r")), self.ws))
        if self.indent is not None:
            return Literal(self.item_sep + "\n" + self.indent * (d + 1))
        return Literal(self.item_sep)

    def colon(self) -> Expr:
        if self.any_ws:
            return Seq((self.ws, Literal(self.key_sep.strip(" \t\n\r")), self.ws))
        return Literal(self.key_sep)

    def too_deep(self, d: int) -> bool:
        return self.depth_layout and d >= MAX_INDENT_DEPTH

    def unsupported(self, keyword: str, pointer: str, reason: str | None = None, fallback: Expr | None = None):
        """A keyword that cannot be enforced: SchemaError, or in lenient mode a SchemaWarning and
        `fallback` (the schema without that keyword)."""
        message = reason or f"unsupported keyword {keyword!r}"
        if not self.lenient:
            raise SchemaError(message, pointer)
        warnings.warn(f"{message} (at {pointer or '/'}); not enforced", SchemaWarning, stacklevel=2)
        return fallback

    def attempt(self, build, keyword: str, pointer: str, fallback):
        """`build()`; in lenient mode a limit it hits (a keyword enforced exactly costs too much)
        warns and gives `fallback()` instead, the converter's rules and caches as they were."""
        if not self.lenient:
            return build()
        saved = (len(self.rules), dict(self.cache), set(self.names), dict(self.next_suffix), set(self.empty_keys),
                 self.level)
        try:
            return build()
        except budget.CompileTimeout:
            raise
        except GrammarLimitError as exc:
            n, self.cache, self.names, self.next_suffix, self.empty_keys, self.level = saved
            del self.rules[n:]
            warnings.warn(f"{exc.message} (at {exc.pointer or pointer or '/'}); {keyword!r} not enforced",
                          SchemaWarning, stacklevel=2)
            return fallback()

    def spell(self, e: Expr) -> Expr:
        """The JSON spellings of the decoded strings `e` matches (json_string.py, `string_escapes`)."""
        return json_string_body(e, self.escapes)

    def string_literal(self, text: str) -> Expr:
        """A JSON string holding `text`: in any spelling (json_string.py), or canonically where
        excluded strings are kept out (they are checked against the canonical spelling)."""
        if self.excl is not None:
            return Literal(_canon_str(text))
        return json_string_literal(text, self.escapes)

    def format_of(self, name: Any) -> Expr | None:
        """The language a `format` asserts, or None where it is an annotation: a format the
        front-end does not know, or every format with `format_assertion=False`."""
        return format_expr(name) if self.format_assertion and isinstance(name, str) else None

    def nothing(self, reason: str, pointer: str) -> None:
        """No value: a part of a schema may be empty (in one branch of a union, say); if the whole
        schema turns out so, the error names the first such part and why."""
        if self.why_empty is None:
            self.why_empty = (reason, pointer)

    # rules ------------------------------------------------------------------------------------
    def new_name(self, hint: str) -> str:
        # Names must print as EBNF (the compile cache keys on the printed grammar): ASCII only.
        base = "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in hint[:40])
        if not base or base[0].isdigit():
            base = "r" + base
        budget.check("JSON Schema rules")       # every rule the converter writes passes here
        i = self.next_suffix.get(base, 1)     # names below it are taken: no quadratic probing
        name = base if i == 1 else f"{base}_{i}"
        while name in self.names or name == "root":
            i += 1
            name = f"{base}_{i}"
        self.next_suffix[base] = i
        self.names.add(name)
        return name

    def add_rule(self, hint: str, body: Expr | None) -> Expr | None:
        if body is None:
            return None
        if isinstance(body, RuleRef):
            return body
        name = self.new_name(hint)
        self.rules.append(Rule(name, body))
        return RuleRef(name)

    def cached(self, key: Any, hint: str, build) -> Expr | None:
        """A rule built once per key; the name is reserved before building so recursion works."""
        if key in self.cache:
            name = self.cache[key]
            return None if name is None else RuleRef(name)
        name = self.new_name(hint)
        self.cache[key] = name
        rule = Rule(name, NEVER)
        self.rules.append(rule)
        body = build()
        if body is None:
            body = NEVER
        rule.body = body
        return RuleRef(name)

    def cached_or_none(self, key: Any, hint: str, build) -> Expr | None:
        """`cached`, but None rather than a rule that matches nothing when the language built is
        empty (a reference made while the rule is being built stays a reference)."""
        def note():
            body = build()
            if body is None:
                self.empty_keys.add(key)
            return body
        ref = self.cached(key, hint, note)
        return None if key in self.empty_keys else ref

    # excluded strings --------------------------------------------------------------------------
    def excluded(self, build, ptr: str):
        """`build()` (a language kept clear of the excluded strings), a limit it hits pointed at `ptr`."""
        try:
            return build()
        except budget.CompileTimeout:
            raise
        except GrammarLimitError as exc:
            if exc.pointer is not None:
                raise
            raise GrammarLimitError(f"{exc.message}: too large to keep the excluded strings out exactly",
                                    pointer=ptr) from None

    def avoid(self, e: Expr, ptr: str) -> Expr | None:
        """`e` (rule-free, the text as written) without the texts that hold an excluded string."""
        return self.excluded(lambda: self.excl.avoid(e, self.new_name, self.rules), ptr)

    # generic values ---------------------------------------------------------------------------
    def any_value(self, d: int) -> Expr | None:
        if self.xml_at(d):
            if d:   # every value of a recursive style is lowered through its element (xml_body)
                raise SchemaError("internal: an unconstrained value inside XML elements", self.where)
            # free-form arguments: any names, any values
            return self.cached(("xml_arguments",), "xml_arguments", lambda: self.xml_obj({}, "", 0))

        def build():
            alts: list[Expr | None] = [Literal("null"), Literal("true"), Literal("false"),
                                       self.cached(("number",), "number", lambda: NUMBER), self.string()]
            if not self.too_deep(d):
                member = Seq((self.string(), self.colon(), self.any_value(d + 1)))
                alts.append(Choice((self.empty("{}", d), Seq((self.open("{", d), member, Repeat(Seq((self.sep(d), member)), 0, None), self.close("}", d))))))
                item = self.any_value(d + 1)
                alts.append(Choice((self.empty("[]", d), Seq((self.open("[", d), item, Repeat(Seq((self.sep(d), item)), 0, None), self.close("]", d))))))
            return _choice(alts)
        return self.cached(("any", self.dkey(d)), f"any_value_{self.dkey(d)}" if self.depth_layout else "any_value", build)

    def const(self, v: Any, d: int, ptr: str) -> Expr | None:
        self.enter(ptr)
        try:
            if isinstance(v, (dict, list)) and self.xml_at(d):
                return self.xml_const(v, d, ptr)
            if isinstance(v, dict):
                if not v:
                    return self.empty("{}", d)
                if self.too_deep(d):
                    return None
                if 1 < len(v) <= MAX_ANY_ORDER:
                    # JSON objects are unordered: the members in any order (an automaton over
                    # which have been written, json_object.py)
                    entries = []
                    for k, x in v.items():
                        value = self.const(x, d + 1, ptr)
                        if value is None:
                            return None
                        entries.append((k, self.add_rule(f"m_{k}", Seq((self.string_literal(k), self.colon(), value))),
                                        True))
                    saved, self.any_order = self.any_order, True
                    try:
                        return self.members(entries, None, len(v), len(v), d, ptr)
                    finally:
                        self.any_order = saved
                parts: list[Expr | None] = [self.open("{", d)]
                for i, (k, x) in enumerate(v.items()):
                    if i:
                        parts.append(self.sep(d))
                    parts += [self.string_literal(k), self.colon(), self.const(x, d + 1, ptr)]
                parts.append(self.close("}", d))
                return _seq(*parts)
            if isinstance(v, list):
                if not v:
                    return self.empty("[]", d)
                if self.too_deep(d):
                    return None
                parts = [self.open("[", d)]
                for i, x in enumerate(v):
                    if i:
                        parts.append(self.sep(d))
                    parts.append(self.const(x, d + 1, ptr))
                parts.append(self.close("]", d))
                return _seq(*parts)
            if isinstance(v, float) and not math.isfinite(v):
                raise SchemaError("non-finite number in enum/const", ptr)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and float(v).is_integer():
                text = Literal(str(int(v)))     # -2.0 is the integer -2, written as integers are
                return Seq((text, ZERO_FRACTION)) if self.integers_as_numbers else text
            if isinstance(v, str):
                return self.string_literal(v)
            return Literal(json.dumps(v, ensure_ascii=False))
        finally:
            self.level -= 1

    def obj(self, schema: dict, ptr: str, d: int) -> Expr | None:
        if self.xml_at(d):
            if "not" in schema:
                schema = self.unsupported("not", _ptr(ptr, "not"), "'not' asking for a member cannot be enforced "
                                          "in an XML style", fallback={k: v for k, v in schema.items() if k != "not"})
            return self.xml_obj(schema, ptr, d)
        return super().obj(schema, ptr, d)

    # schema lowering --------------------------------------------------------------------------
    def checker(self) -> Validator:
        """A validator for listed values, with the stack the lowering has left it: each nested
        schema costs the lowering about 4 interpreter frames and the validator about 6."""
        return Validator(self.root, self.resolve, max(8, min(MAX_VALIDATION_DEPTH, (700 - 4 * self.level) // 6)),
                         self.ref_alone, self.format_assertion)

    def enter(self, ptr: str) -> None:
        self.level += 1
        self.where = ptr
        if self.level > MAX_SCHEMA_DEPTH:
            self.level -= 1
            raise GrammarLimitError(f"schema nested deeper than {MAX_SCHEMA_DEPTH} levels", pointer=ptr)

    def resolve(self, ref: Any, ptr: str) -> tuple[Any, str]:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise SchemaError(f"unsupported $ref {ref!r} (only local '#...' references)", ptr)
        from urllib.parse import unquote
        frag = unquote(ref[1:])
        if frag and not frag.startswith("/"):
            raise SchemaError(f"unsupported $ref {ref!r} (anchors are not supported)", ptr)
        node = follow(self.root, frag)
        if node is MISSING:
            raise SchemaError(f"$ref {ref!r} does not resolve", ptr)
        return node, frag

    def inline_ref(self, schema: dict, ptr: str) -> dict:
        """`schema` with its `$ref` replaced by the (merged) referenced schema."""
        target, where = self.resolve(schema["$ref"], _ptr(ptr, "$ref"))
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        if target is True:
            return rest
        if not isinstance(target, dict):
            raise SchemaError("cannot combine a false $ref target with other keywords", _ptr(ptr, "$ref"))
        self.enter(where)
        try:
            return self.merge(rest, target, ptr)
        finally:
            self.level -= 1

    def alone(self, s: Any) -> Any:
        """`s` as its draft reads it: before 2019-09 a `$ref` hides the keywords beside it."""
        if self.ref_alone and isinstance(s, dict) and "$ref" in s and len(s) > 1:
            return {"$ref": s["$ref"]}
        return s

    def merge(self, a: dict, b: dict, ptr: str) -> dict:
        """One schema valid exactly where both `a` and `b` are (or SchemaError)."""
        a, b = self.alone(a), self.alone(b)
        self.enter(ptr)
        try:
            return self._merge(a, b, ptr)
        finally:
            self.level -= 1

    def merge_all_of(self, schema: dict, ptr: str) -> dict | None:
        """`schema` with its allOf members merged in; None when a member is false."""
        subs = schema["allOf"]
        if not isinstance(subs, list) or not subs:
            raise SchemaError("allOf must be a non-empty array", _ptr(ptr, "allOf"))
        merged = {k: v for k, v in schema.items() if k != "allOf"}
        for i, s in enumerate(subs):
            if s is False:
                return None
            if s is True:
                continue
            if not isinstance(s, dict):
                raise SchemaError("a schema must be an object or a boolean", _ptr(ptr, "allOf", i))
            merged = self.merge(merged, s, _ptr(ptr, "allOf", i))
        return merged

    def merge_members(self, a: dict, b: dict, ptr: str) -> None:
        """Move the member keywords of `b` into `a`, for members valid under both.

        Each side maps a key to a schema: its `properties` entry, else `additionalProperties`,
        and the schema of every pattern that matches. Listed keys get both sides' schemas exactly.
        Other keys keep both maps' patterns; a side's `additionalProperties` must also reach the
        keys that only the other side's patterns match, so it joins each such pattern whose keys
        no pattern of its own side matches, and the merge is unsupported when a pattern's keys
        are partly matched (no pattern spells that region)."""
        props, pats, addl, langs = [], [], [], []
        for side in (a, b):
            p, pp = side.pop("properties", {}), side.pop("patternProperties", {})
            if not isinstance(p, dict):
                raise SchemaError("properties must be an object", _ptr(ptr, "properties"))
            props.append(p)
            pats.append(pp)
            addl.append(side.pop("additionalProperties", None))
            langs.append(self.pattern_languages({"patternProperties": pp}, ptr))

        def member(side: int, key: str) -> Any:
            own = props[side].get(key, None)
            matched = [sub for dfa, sub, _where in langs[side] if dfa.accepts(key)]
            if own is None:
                own = True if matched or addl[side] is None else addl[side]
            for sub in matched:
                own = _both(own, sub)
            return own

        merged_props = {k: _both(member(0, k), member(1, k)) for k in dict.fromkeys([*props[0], *props[1]])}
        merged_pats: dict[str, Any] = {}
        for side in (0, 1):
            other = 1 - side
            others = None
            for dfa, _sub, _where in langs[other]:
                others = dfa if others is None else intersect(others.complement(), dfa.complement()).complement()
            for (pattern, sub), (dfa, _s, where) in zip(pats[side].items(), langs[side]):
                extra = addl[other]
                if extra is not None and extra is not True and extra != {} and others is not None:
                    if intersect(dfa, others.complement()).is_empty():
                        extra = None        # every key it matches is matched on the other side too
                    elif not intersect(dfa, others).is_empty():
                        self.unsupported("patternProperties", where, "patternProperties merged with a schema whose "
                                         "own patterns match part of its keys and whose additionalProperties "
                                         "applies to the rest")
                        extra = None
                if extra is not None:
                    sub = _both(sub, extra)
                merged_pats[pattern] = _both(merged_pats.get(pattern, True), sub)
        if merged_props:
            a["properties"] = merged_props
        if merged_pats:
            a["patternProperties"] = merged_pats
        if addl[0] is not None or addl[1] is not None:
            a["additionalProperties"] = _both(True if addl[0] is None else addl[0], True if addl[1] is None else addl[1])

    def _merge(self, a: dict, b: dict, ptr: str) -> dict:
        # `b` is a subschema of `a` (allOf member, $ref target, branch): its unevaluatedProperties
        # sees only its own members, so it is settled before the members of `a` join them.
        b = self.close_unevaluated(b, ptr)
        for k in b:
            if k in UNSUPPORTED and not _inert(k, b):
                self.unsupported(k, _ptr(ptr, k))
        # inline references first so that properties keep the order they are written in (a target
        # may itself be a reference with siblings: followed, a bounded number of hops)
        for _ in range(MAX_SCHEMA_DEPTH):
            if "$ref" in a and any(k in HANDLED for k in b):
                a = self.inline_ref(a, ptr)
            elif "$ref" in b and any(k in HANDLED for k in a):
                b = self.inline_ref(b, ptr)
            else:
                break
        else:
            raise GrammarLimitError(f"more than {MAX_SCHEMA_DEPTH} $ref hops merging the schemas", pointer=ptr)
        out = {k: v for k, v in a.items() if k not in ANNOTATIONS}
        bb = {k: v for k, v in b.items() if k not in ANNOTATIONS}
        # keywords that depend on their siblings are combined as the functions they define (a
        # member's or an item's schema), never keyword by keyword
        if any(k in out for k in MEMBER_KEYWORDS) and any(k in bb for k in MEMBER_KEYWORDS):
            self.merge_members(out, bb, ptr)
        if any(k in out for k in ITEM_KEYWORDS) and any(k in bb for k in ITEM_KEYWORDS):
            _merge_items(out, bb, ptr)
        # a second `if` (or `contains`) group waits in a list of its own, lowered with the first
        for group, more in ((("if", "then", "else"), CONDITIONS), (("contains", "minContains", "maxContains"),
                                                                    MORE_CONTAINS)):
            for side in (out, bb):
                if group[0] not in side:
                    for g in group[1:]:
                        side.pop(g, None)   # inert without its partner
            if group[0] in out and group[0] in bb and not all(json_equal(out.get(g), bb.get(g)) for g in group):
                out[more] = [*out.get(more, []), {g: bb.pop(g) for g in group if g in bb}]
            if more in bb:
                out[more] = [*out.get(more, []), *bb.pop(more)]
        if UNEVALUATED_ITEMS in out and UNEVALUATED_ITEMS in bb:
            self.unsupported("unevaluatedItems", _ptr(ptr, "unevaluatedItems"), "two unevaluatedItems beside "
                             "contains in merged schemas")
            bb.pop(UNEVALUATED_ITEMS)
        for more in (FOUND, MORE_STRINGS):
            if more in bb:
                out[more] = [*out.get(more, []), *bb.pop(more)]
        for k in ("pattern", "format"):     # a second one waits in a list, met on automata
            if k in out and k in bb and not json_equal(out[k], bb[k]):
                out[MORE_STRINGS] = [*out.get(MORE_STRINGS, []), {k: bb.pop(k)}]
        for k, v in bb.items():
            if k not in out or json_equal(out[k], v):
                out[k] = v
            elif k == "type":
                ta = out[k] if isinstance(out[k], list) else [out[k]]
                tb = v if isinstance(v, list) else [v]
                both = [t for t in ta if t in tb or (t == "integer" and "number" in tb)]
                both += [t for t in tb if t == "integer" and "number" in ta and t not in both]
                out[k] = both
            elif k == "required":
                if not isinstance(out[k], list) or not isinstance(v, list):
                    raise SchemaError("required must be an array of strings", _ptr(ptr, k))
                out[k] = list(dict.fromkeys(list(out[k]) + list(v)))
            elif k in BOUNDS and not (k in ("minimum", "maximum") and _bool_excl(out, bb)):
                if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (out[k], v)):
                    raise SchemaError(f"{k} must be a number", _ptr(ptr, k))
                out[k] = max(out[k], v) if BOUNDS[k] else min(out[k], v)
            elif k in ("enum", "const"):
                va = out[k] if k == "enum" else [out[k]]
                vb = v if k == "enum" else [v]
                if not isinstance(va, list) or not isinstance(vb, list):
                    raise SchemaError("enum must be an array", _ptr(ptr, k))
                out[k] = [x for x in va if any(json_equal(x, y) for y in vb)]
                if k == "const":
                    out["enum"] = out.pop(k)
            elif k == "allOf":
                out[k] = list(out[k]) + list(v)
            elif k == "propertyNames":
                out[k] = _both(out[k], v)   # every name is checked by both
            elif k == "dependentRequired" and isinstance(out[k], dict) and isinstance(v, dict) and all(
                    isinstance(x, list) for x in (*out[k].values(), *v.values())):
                out[k] = {a: list(dict.fromkeys([*out[k].get(a, []), *v.get(a, [])])) for a in {**out[k], **v}}
            elif k in ("anyOf", "oneOf"):
                out[k] = self.cross_branches(k, out[k], v, ptr)
            elif k == PRESENCE:
                # a second condition on which members are present: back to its union, lowered later
                mode, sets = v
                out["allOf"] = [*out.get("allOf", []), {mode: [{"required": list(g)} for g in sets]}]
            elif k == "not":
                if self.complement(v, _ptr(ptr, k)) is _CANNOT:
                    self.unsupported(k, _ptr(ptr, k), "this form of 'not' has no positive equivalent that can be "
                                     "enforced")    # lenient: this one is dropped, the other kept
                else:
                    out[k] = {"anyOf": [out[k], v]}  # neither holds
            elif k == "dependentSchemas" and isinstance(out[k], dict) and isinstance(v, dict):
                out[k] = {a: _both(out[k].get(a, True), v.get(a, True)) for a in {**out[k], **v}}
            elif k == "multipleOf" and all(isinstance(x, (int, float)) and not isinstance(x, bool) and
                                           math.isfinite(x) and x > 0 for x in (out[k], v)):
                out[k] = _decimal_lcm(out[k], v)     # multiples of both: of their least common multiple
            elif k not in HANDLED and k not in UNSUPPORTED:
                continue  # non-standard keywords are ignored, so two spellings never conflict
            elif k in UNSUPPORTED:
                self.unsupported(k, _ptr(ptr, k))  # lenient: the first one is kept (and not enforced)
            else:
                raise SchemaError(f"cannot combine conflicting {k!r} keywords", _ptr(ptr, k))
        if "const" in out and "enum" in out:
            c = out.pop("const")
            out["enum"] = [x for x in out["enum"] if json_equal(x, c)]
        return out

    def lower(self, schema: Any, ptr: str, d: int) -> Expr | None:
        schema = self.alone(schema)
        self.enter(ptr)
        try:
            return self._lower(schema, ptr, d)
        finally:
            self.level -= 1

    def _lower(self, schema: Any, ptr: str, d: int) -> Expr | None:
        if schema is True:
            return self.any_value(d)
        if schema is False:
            return None
        if not isinstance(schema, dict):
            raise SchemaError("a schema must be an object or a boolean", ptr)
        values, where = _listed_values(schema, ptr)
        if values is not None and self.xml and d == 0:
            return self.xml_listed_arguments(values, schema, ptr, where)
        if values is not None:
            # The schema names its values: keep those valid under all of it (every keyword counts,
            # including the ones with no grammar form).
            checker = self.checker()
            alts = [self.const(v, d, where) for v in values if checker.valid(v, schema, ptr)
                    and (self.excl is None or self.excl.value_ok(v, self.xml_at(d)))]
            return _choice(factor_literals([a for a in alts if a is not None], self.add_rule, MAX_INLINE_CHARS))
        if "not" in schema and not self.leaf_applies(schema, ptr):
            return self.attempt(lambda: self.lower_not(schema, ptr, d), "not", ptr,
                                lambda: self.lower({k: v for k, v in schema.items() if k != "not"}, ptr, d))
        if "if" in schema or CONDITIONS in schema:
            return self.attempt(lambda: self.lower_conditions(schema, ptr, d), "if", ptr,
                                lambda: self.lower({k: v for k, v in schema.items()
                                                    if k not in ("if", "then", "else", CONDITIONS)}, ptr, d))
        if "dependentSchemas" in schema or _schema_dependencies(schema):
            return self.attempt(lambda: self.lower_dependent_schemas(schema, ptr, d), "dependentSchemas", ptr,
                                lambda: self.lower({k: v for k, v in schema.items() if k != "dependentSchemas"
                                                    and (k != "dependencies" or not _schema_dependencies(schema))},
                                                   ptr, d))
        for k in schema:
            if k in UNSUPPORTED and not _inert(k, schema):
                self.unsupported(k, _ptr(ptr, k))
        if schema.get("uniqueItems", False) not in (True, False):
            raise SchemaError("uniqueItems must be a boolean", _ptr(ptr, "uniqueItems"))
        keys = [k for k in schema if k in HANDLED and (k != "uniqueItems" or schema[k] is True)]
        if not keys:
            return self.any_value(d)
        if "$ref" in schema:
            target, where = self.resolve(schema["$ref"], _ptr(ptr, "$ref"))
            rest = {k: v for k, v in schema.items() if k != "$ref" and k in HANDLED}
            if not rest:
                return self.cached(("ref", where, self.dkey(d)), "ref_" + (where.split("/")[-1] or "root"),
                                   lambda: self.lower(target, where, d))
            if target is False:
                return None
            if target is True:
                return self.lower(rest, ptr, d)
            if not isinstance(target, dict):
                raise SchemaError("a schema must be an object or a boolean", where)
            return self.lower(self.merge(rest, target, ptr), ptr, d)
        if "allOf" in schema:
            merged = self.merge_all_of(schema, ptr)
            return None if merged is None else self.lower(merged, ptr, d)
        for kw in ("anyOf", "oneOf"):
            if kw in schema:
                subs, rest = _branches(schema, kw, ptr)
                sets = _presence_sets(subs)
                if sets is not None and len(sets) > 1 and PRESENCE not in rest:
                    # branches that only require properties: a condition on which members are
                    # present, enforced by the object's states (exactly one / at least one holds)
                    kept = self.types(rest, ptr)
                    if kw == "oneOf":  # a non-object satisfies every branch, so not exactly one
                        kept = ["object"] if "object" in kept else []
                    rest["type"] = kept
                    return self.lower({**rest, PRESENCE: (kw, sets)}, ptr, d)
                def union(subs: list, kw: str = kw, rest: dict = rest) -> Expr | None:
                    alts = []
                    for i, s in enumerate(subs):
                        p = _ptr(ptr, kw, i)
                        if s is False:
                            continue
                        if s is True:
                            s = {}
                        if not isinstance(s, dict):
                            raise SchemaError("a schema must be an object or a boolean", p)
                        if not any(k in HANDLED for k in rest):
                            alts.append(self.lower(s, p, d))
                            continue
                        key = self.ref_branch_key(s, rest, p)
                        if key is None:
                            alts.append(self.lower(self.merge(rest, s, p), p, d))
                        else:
                            alts.append(self.cached_or_none(
                                (*key, self.dkey(d)), "ref_" + (key[1].split("/")[-1] or "root"),
                                lambda s=s, p=p, rest=rest: self.lower(self.merge(rest, s, p), p, d)))
                    return _choice(alts)
                if kw == "oneOf":
                    return self.attempt(lambda subs=subs, rest=rest: union(self.exactly_one(subs, ptr, rest)),
                                        "oneOf", _ptr(ptr, kw), lambda subs=subs: union(subs))
                return union(subs)
        return self.typed(self.close_unevaluated(schema, ptr), ptr, d)

    def ref_branch_key(self, s: dict, rest: dict, ptr: str) -> tuple | None:
        """The identity of a `$ref` branch merged with the keywords beside its union, or None when
        the branch is no reference. A reference that leads back to the same union with the same
        keywords beside it is then the same language again: a rule (or, for raw text, nothing new),
        where inlining it would unfold the cycle without end."""
        if "$ref" not in s:
            return None
        _target, where = self.resolve(s["$ref"], _ptr(ptr, "$ref"))
        try:
            text = json.dumps([rest, {k: v for k, v in s.items() if k != "$ref"}], sort_keys=True)
        except (TypeError, ValueError):
            return None
        return ("ref_branch", where, text)

    def cross_branches(self, kw: str, xs: Any, ys: Any, ptr: str) -> list:
        """Branches for "one of `xs` and one of `ys`": their pairwise conjunctions. For `oneOf`
        that is exact when each list is disjoint (then so are the pairs)."""
        if not isinstance(xs, list) or not isinstance(ys, list) or not xs or not ys:
            raise SchemaError(f"{kw} must be a non-empty array", _ptr(ptr, kw))
        if kw == "oneOf":
            xs, ys = self.exactly_one(xs, ptr, {}), self.exactly_one(ys, ptr, {})
        out = [_both(x, y) for x in xs for y in ys if _types_meet(x, y)]
        if len(out) > MAX_CROSS_BRANCHES:
            raise GrammarLimitError(f"combining two {kw} keywords needs {len(out)} branches, more "
                                    f"than the limit of {MAX_CROSS_BRANCHES}", pointer=_ptr(ptr, kw))
        return out or [False]

    def one_of_disjoint(self, subs: list, ptr: str, context: dict | None = None) -> bool:
        """Whether no value can satisfy two branches, shown by types (the branch's own and those of
        `context`, the schema holding the oneOf), listed values, a required property whose schemas
        are disjoint, or closed objects; then oneOf is anyOf. Conservative: False when it cannot tell."""
        return not self.overlaps(subs, ptr, context)

    def flatten(self, b: Any, where: str) -> Any:
        """`b` with its `$ref`s and `allOf`s merged in (False when that leaves nothing valid)."""
        for _ in range(MAX_SCHEMA_DEPTH):
            if isinstance(b, dict) and "$ref" in b:
                b = self.inline_ref(b, where)
            elif isinstance(b, dict) and "allOf" in b:
                b = self.merge_all_of(b, where)
                if b is None:
                    return False
            else:
                return b
        raise GrammarLimitError(f"schema nested deeper than {MAX_SCHEMA_DEPTH} levels", pointer=where)

    def disjoint(self, a: dict, b: dict, checker: Validator, pa: str, pb: str, depth: int = 0) -> bool:
        ta, tb = set(self.types(a, pa)), set(self.types(b, pb))
        for t in (ta, tb):
            if "number" in t:
                t.add("integer")
        shared = ta & tb
        if not shared:
            return True
        for x, y, px, py in ((a, b, pa, pb), (b, a, pb, pa)):
            values, _ = _listed_values(x, px)
            if values is not None and not any(checker.valid(v, x, px) and checker.valid(v, y, py) for v in values):
                return True
        if shared != {"object"}:
            return False
        props_a, props_b = a.get("properties", {}), b.get("properties", {})
        if not isinstance(props_a, dict) or not isinstance(props_b, dict):
            return False
        for name in set(a.get("required", [])) & set(b.get("required", [])):
            # a member both require, whose schemas share no value (its other constraints, such as
            # patternProperties, only narrow it further)
            sa = self.flatten(props_a.get(name, True), _ptr(pa, "properties", name))
            sb = self.flatten(props_b.get(name, True), _ptr(pb, "properties", name))
            if sa is False or sb is False:
                return True
            if isinstance(sa, dict) and isinstance(sb, dict) and depth < MAX_DISJOINT_DEPTH and self.disjoint(
                    sa, sb, checker, _ptr(pa, "properties", name), _ptr(pb, "properties", name), depth + 1):
                return True
        for x, y in ((a, b), (b, a)):
            # y's own keywords close it to its properties: x's values have a member y forbids
            closed = y.get("additionalProperties") is False and not y.get("patternProperties")
            if closed and any(name not in y.get("properties", {}) for name in x.get("required", [])):
                return True

        def shut(x: dict, y: dict) -> bool:
            """strict_mode writes x's values with only the keys x names: none has a member y requires."""
            if x.get("additionalProperties", self.open_by_default(x)) is not False or x.get("patternProperties"):
                return False
            return any(name not in x.get("properties", {}) and name not in x.get("required", [])
                       for name in y.get("required", []))
        return shut(a, b) and shut(b, a)

    def types(self, schema: dict, ptr: str) -> list[str]:
        t = schema.get("type", list(TYPES))
        ts = [t] if isinstance(t, str) else t
        if not isinstance(ts, list) or any(x not in TYPES for x in ts):
            raise SchemaError(f"invalid type {t!r}", _ptr(ptr, "type"))
        return ts

    def typed(self, schema: dict, ptr: str, d: int) -> Expr | None:
        ts = self.types(schema, ptr)
        if self.xml and d == 0:
            if "object" in ts:
                ts = ["object"]
            elif "array" in ts and self.xml.recursive:
                ts = ["array"]      # a nested style writes items as elements at the top too
            else:
                raise SchemaError("the arguments of an XML style must be an object", _ptr(ptr, "type"))
        alts: list[Expr | None] = []
        for t in dict.fromkeys(ts):
            if t == "null":
                alts.append(Literal("null"))
            elif t == "boolean":
                alts.append(Choice((Literal("true"), Literal("false"))))
            elif t == "string":
                alts.append(self.string_value(schema, ptr))
            elif t == "number":
                alts.append(self.number(schema, ptr))
            elif t == "integer":
                if "number" not in ts:
                    alts.append(self.integer(schema, ptr))
            elif t == "object":
                alts.append(None if self.too_deep(d) else self.obj(schema, ptr, d))
            elif t == "array":
                alts.append(None if self.too_deep(d) else self.array(schema, ptr, d))
        return _choice(alts)

    def bound(self, schema: dict, kw: str, ptr: str, default: int | None) -> int | None:
        if kw not in schema:
            return default
        v = schema[kw]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
            raise SchemaError(f"{kw} must be an integer, not {json.dumps(v)}", _ptr(ptr, kw))
        if v < 0:
            raise SchemaError(f"{kw} must be a non-negative integer, not {v}", _ptr(ptr, kw))
        if v > MAX_BOUND:
            raise GrammarLimitError(f"{kw} {v} exceeds the limit of {MAX_BOUND}", pointer=_ptr(ptr, kw))
        return int(v)


def _declared_types(x: Any) -> set[str] | None:
    if x is False:
        return set()
    if not isinstance(x, dict) or "type" not in x:
        return None
    t = x["type"]
    ts = set([t] if isinstance(t, str) else t if isinstance(t, list) else [])
    if "number" in ts:
        ts.add("integer")
    return ts


def _types_meet(x: Any, y: Any) -> bool:
    """False when two schemas' own `type`s share no value (their conjunction is empty)."""
    tx, ty = _declared_types(x), _declared_types(y)
    return tx is None and ty is None or (tx is None and bool(ty)) or (ty is None and bool(tx)) or bool(tx and ty and tx & ty)


def _presence_sets(subs: list) -> list[tuple[str, ...]] | None:
    """The required-sets of branches that only say `required` (None if any branch says more)."""
    out = []
    for b in subs:
        if not isinstance(b, dict) or set(b) - ANNOTATIONS != {"required"} or not isinstance(b["required"], list) \
                or not all(isinstance(k, str) for k in b["required"]):
            return None
        out.append(tuple(b["required"]))
    return out


def _bool_excl(a: dict, b: dict) -> bool:
    return any(isinstance(s.get(k), bool) for s in (a, b) for k in ("exclusiveMinimum", "exclusiveMaximum"))


def json_schema_to_ir(schema: dict | bool | str, *, any_whitespace: bool = True, indent: int | None = None,
                      separators: tuple[str, str] | None = None, strict_mode: bool = True,
                      max_whitespace_cnt: int | None = None, any_order: bool = False,
                      lenient: bool = False, style: str = "json", excludes=(),
                      schema_store: Mapping[str, Any] | None = None, format_assertion: bool = True,
                      string_escapes: str = "non_ascii", integers_as_numbers: bool = False) -> GrammarIR:
    """Lower a JSON Schema (a dict, a bool, or its JSON text) to grammar IR; see the module notes.
    `style` other than json: the top-level object written as a model's XML tool-call arguments
    (XML_STYLES), and in the recursive styles (cohere_xml, minimax_m3_xml) every object and array
    within it too. `excludes`: strings that string content (values and names, as written) never
    holds (json_excludes.py; ExcludesError, a SchemaError, for one that cannot be kept out exactly).
    `schema_store`: documents (URI to schema) that references may point into (schema_refs.py);
    `format_assertion`: whether `format` constrains strings (the default; the text generated is
    then of the format the schema names) or is an annotation only (any string); `string_escapes`:
    which characters of constrained strings (keys, listed values, patterns, formats) may also be
    written as ``\\uXXXX`` — "non_ascii" (all but printable ASCII, as serializers write them) or
    "all"; free strings take every escape either way. `integers_as_numbers`: integers (and listed
    integral numbers) may also be written with a zero fraction (``3.0``) and, unbounded, with a
    non-negative exponent (``1e2``), as JSON Schema counts those integers too."""
    if isinstance(schema, (str, bytes)):
        try:
            schema = json.loads(schema)
        except RecursionError:
            # The decoder recurses; a document this deep is past MAX_SCHEMA_DEPTH many times over.
            raise GrammarLimitError("schema text nested too deeply to decode", pointer="") from None
        except ValueError as exc:
            raise SchemaJSONError(f"schema is not valid JSON: {exc}", "") from None
    # Before any walk of the whole document (embedded resources, references): those would pay for
    # a document nested far past what the converter accepts anyway.
    check_nesting(schema, MAX_SCHEMA_NESTING, "schema")
    schema = link_references(schema, schema_store, lenient)      # every $ref a pointer into `schema`
    conv = _Converter(schema, any_whitespace, indent, separators, strict_mode, max_whitespace_cnt, any_order,
                      lenient, style, excludes, format_assertion, string_escapes, integers_as_numbers)
    try:
        body = conv.lower(schema, "", 0)
    except RecursionError:
        # Every descent is bounded (MAX_SCHEMA_DEPTH, the validator's and the regex parser's
        # depths), but they can stack up past the interpreter's limit together; the caller's
        # own stack counts too. Nothing is kept from the converter.
        raise GrammarLimitError("schema nested too deep for the interpreter's stack", pointer=conv.where) from None
    if body is None:
        if conv.why_empty is not None:
            reason, pointer = conv.why_empty
            raise SchemaError(f"the schema accepts no JSON value: {reason}", pointer)
        raise SchemaError("the schema accepts no JSON value", "")
    return GrammarIR(rules=[Rule("root", body), *conv.rules], root="root")
