"""XML argument styles of the JSON Schema front-end: a tool's arguments written as XML members (the
styles of `json_common.XML_STYLES`), mixed into the converter of json_schema.py (as json_object.py's
object lowering is). Strings are raw text up to the closing tag, other values JSON or, in a
recursive style, elements; members the schema does not list take the style's names."""

from __future__ import annotations

from typing import Any

from ..errors import SchemaError
from .ir import CharClass, Expr, Literal, Repeat, RuleRef
from .ir import choice as _choice
from .ir import seq as _seq
from .json_common import (
    _CANNOT,
    ANNOTATIONS,
    EMPTY,
    HANDLED,
    ONE_OF_OVERLAP,
    RAW_TEXT,
    TYPES,
    UNSUPPORTED,
    _branches,
    _inert,
    _json_type,
    _listed_values,
    _ptr,
    _without_lt,
)
from .optimize import map_leaves
from .regular import to_rules


class XMLLowering:
    """The XML half of the converter; see the module notes."""

    # A member (or, in a recursive style, an array item) is an opening tag, a body and the rest of
    # its closing tag. The opening tag may carry a marker of the value's JSON type (XMLStyle.kinds),
    # so a member is one alternative per marker, each with the part of the schema the marker
    # covers: its strings written raw, everything else JSON, or elements again in a recursive style.
    # A body ends with the style's `stop` string (the start of the closing tag, which raw text
    # cannot hold); the rest of the closing tag follows it.

    def opening(self, name: Expr | None, marker: str) -> Expr:
        """The opening of a member called `name` (None: of an array item) whose value has `marker`."""
        parts: list[Expr] = []
        for i, piece in enumerate(self.xml.open if name is not None else self.xml.item_open):
            if i:
                parts.append(self.xml_ws)
            before, has_name, after = piece.replace("{kind}", marker).partition("{name}")
            parts += [Literal(before), name, Literal(after)] if has_name else [Literal(before)]
        return _seq(*parts)

    def closing_rest(self, name: str | None) -> str:
        """What follows a body (which ends with `stop`) to close a member called `name`, or with
        None an array item."""
        close = self.xml.item_close if name is None else self.xml.close.replace("{name}", self.xml.spell(name))
        return close[len(self.xml.until()):]

    def xml_element(self, name: str | Expr | None, schema: Any, ptr: str, d: int) -> Expr | None:
        """A member called `name` (a listed name, or an expression for the names of the others)
        or, with None, an array item, whose value at depth d meets `schema`."""
        if isinstance(name, str):
            self.check_element_name(name, ptr)
            label: Expr | None = Literal(self.xml.spell(name))
            rest = self.closing_rest(name)
        else:
            label = name
            if name is not None and "{name}" in self.xml.close:
                raise SchemaError("a name the schema does not list cannot be closed in this XML style", ptr)
            rest = self.closing_rest(None) if name is None else self.xml.close[len(self.xml.until()):]
        alts = []
        for marker in self.xml.markers():
            body = self.xml_body(schema, ptr, d, marker)
            if body is not None:
                alts.append(_seq(self.opening(label, marker), body, Literal(rest)))
        return _choice(alts)

    def xml_listed_arguments(self, values: list, schema: dict, ptr: str, where: str) -> Expr | None:
        """Listed arguments of an XML style. Each object is the closed object of its members, each
        member its listed value: the same values, written as members (in any order when the object
        lowering allows it). A value that is no object cannot be written as arguments."""
        checker = self.checker()
        kept = [v for v in values if isinstance(v, dict) and checker.valid(v, schema, ptr)
                and (self.excl is None or self.excl.value_ok(v, True))]
        if not any(isinstance(v, dict) for v in values):
            raise SchemaError("the arguments of an XML style must be an object; no listed value is one", where)
        if not kept:
            return self.nothing("every listed argument object is ruled out by the rest of the schema or the "
                                "excluded strings", where)
        return _choice([self.lower({"type": "object", "properties": {k: {"const": x} for k, x in v.items()},
                                    "required": list(v), "additionalProperties": False}, where, 0) for v in kept])

    def check_element_name(self, name: str, ptr: str) -> None:
        """A listed name must read back from its tag: where the style writes it as the tag's own
        name (`<{name}>`, unescaped), a blank one, one that starts like a closing tag or one that
        holds a tag delimiter would be parsed as something else; and no style writes a lone
        surrogate (no UTF-8 holds one)."""
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise SchemaError(f"element name {name!r} is not valid Unicode (it holds a lone surrogate)", ptr) from None
        if not any(piece.endswith("<{name}>") for piece in self.xml.open):
            return
        if not name.strip():
            raise SchemaError(f"element name {name!r} cannot be blank in this XML style (it is the tag's name)", ptr)
        if name.startswith("/") or any(c in name for c in "<>"):
            raise SchemaError(f"element name {name!r} cannot be read back from its tag in this XML style (it "
                              "starts with '/' or holds '<' or '>')", ptr)

    def xml_body(self, schema: Any, ptr: str, d: int, marker: str) -> Expr | None:
        """The body of a value at depth d meeting `schema` and of a JSON type the style marks with
        `marker`, up to and with `stop` (None: no such value). Bodies of unconstrained values and of
        references are rules of their own, which is also what ends recursion."""
        if isinstance(schema, dict) and not any(k in HANDLED or k in UNSUPPORTED for k in schema):
            schema = True   # annotations and unknown keywords only
        if schema is True:
            if self.xml.names is None:
                raise SchemaError("this XML style cannot write values of unconstrained schemas: such a value may be "
                                  "elements with any names, which it cannot close (its closing tags repeat the name)", ptr)
            return self.cached_or_none(("xml_any", marker), "xml_any", lambda: self.xml_typed_body(True, ptr, d, marker))
        if isinstance(schema, dict) and "$ref" in schema and not set(schema) - ANNOTATIONS - {"$ref"}:
            target, where = self.resolve(schema["$ref"], _ptr(ptr, "$ref"))
            return self.cached_or_none(("xml_ref", where, marker), "xml_" + (where.split("/")[-1] or "root"),
                                       lambda: self.xml_body(target, where, d, marker))
        return self.xml_typed_body(schema, ptr, d, marker)

    def xml_typed_body(self, schema: Any, ptr: str, d: int, marker: str) -> Expr | None:
        types = [t for t in TYPES if self.xml.kind(t) == marker]
        alts: list[Expr | None] = []
        free_text = False
        if "string" in types:
            raw = self.raw_string(self.restrict(schema, ["string"], ptr), ptr)
            if raw is RAW_TEXT:
                from .text import text_until

                until = self.xml.until()
                text = text_until((until,)) if self.excl is None else \
                    self.excluded(lambda: self.excl.raw_text(until), ptr)
                alts.append(text)
                free_text = text is not None
            elif raw is not None:
                pad = Repeat(Literal("\n"), 0, 1) if self.xml.pad else EMPTY
                alts.append(_seq(pad, raw, pad, Literal(self.xml.until())))
        others = [t for t in types if t != "string"]
        # A parser reads a value up to the closing tag: free text there already holds every other
        # value a flat style can write (a recursive one nests elements, which free text cannot).
        if others and not (free_text and not self.xml.recursive):
            part = self.restrict(schema, others, ptr)
            value = None if part is None else self.lower(part, ptr, d)
            if value is not None:
                # containers of a recursive style are elements between whitespace already
                padded = self.xml.json_pad and not (self.xml.recursive and set(others) <= {"object", "array"})
                alts.append(_seq(self.xml_ws, value, self.xml_ws, Literal(self.xml.until())) if padded
                            else _seq(value, Literal(self.xml.until())))
        return _choice(alts)

    def restrict(self, schema: Any, types: list[str], ptr: str) -> dict | None:
        """`schema` and the values of `types` (None: nothing)."""
        if schema is True:
            return {"type": list(types)}
        if schema is False:
            return None
        if not isinstance(schema, dict):
            raise SchemaError("a schema must be an object or a boolean", ptr)
        if "type" in schema:
            self.types(schema, ptr)     # a bad type is an error, not an empty intersection
        return self.merge(schema, {"type": list(types)}, ptr)

    def raw_string(self, schema: Any, ptr: str) -> Expr | None:
        """The strings `schema` allows as raw text: RAW_TEXT when nothing constrains them, else their
        language (None: no string). A constrained value holds no "<", so that it cannot run into
        the closing tag (nor take the next arguments with it); listed values are kept exactly."""
        if schema is None or schema is False:
            return None
        if schema is True:
            return RAW_TEXT
        if not isinstance(schema, dict):
            raise SchemaError("a schema must be an object or a boolean", ptr)
        self.enter(ptr)
        try:
            values, _where = _listed_values(schema, ptr)
            if values is not None:
                checker = self.checker()
                return _choice([Literal(v) for v in values if isinstance(v, str) and checker.valid(v, schema, ptr)
                                and (self.excl is None or not self.excl.holds(v))])
            if "$ref" in schema:
                return self.raw_string(self.inline_ref(schema, ptr), ptr)
            if "allOf" in schema:
                return self.raw_string(self.merge_all_of(schema, ptr), ptr)
            if "string" not in self.types(schema, ptr):
                return None
            if "not" in schema and not self.leaf_applies(schema, ptr):
                rest = {k: v for k, v in schema.items() if k != "not"}
                comp = self.complement(schema["not"], _ptr(ptr, "not"))
                if comp is _CANNOT:
                    self.unsupported("not", _ptr(ptr, "not"), "this form of 'not' has no positive equivalent that "
                                     "can be enforced")
                    return self.raw_string(rest, ptr)
                if comp is False:
                    return None
                return self.raw_string(rest if comp is True else self.merge(rest, comp, ptr), ptr)
            for k in schema:
                if k in UNSUPPORTED and not _inert(k, schema):
                    self.unsupported(k, _ptr(ptr, k))
            for kw in ("anyOf", "oneOf"):
                if kw in schema:
                    subs, rest = _branches(schema, kw, ptr)
                    if kw == "oneOf" and not self.one_of_disjoint(subs, ptr, rest):
                        self.unsupported("oneOf", _ptr(ptr, kw), ONE_OF_OVERLAP)
                    alts = []
                    for i, sub in enumerate(subs):
                        p = _ptr(ptr, kw, i)
                        if sub is False:
                            continue
                        key = self.ref_branch_key(sub, rest, p) if isinstance(sub, dict) else None
                        if key is not None and key in self.raw_open:
                            # The union is back at itself: strings are flat, so what it adds by the
                            # way round is already among the other branches (the least fixed point).
                            continue
                        if key is not None:
                            self.raw_open.add(key)
                        try:
                            alts.append(self.raw_string(self.merge(rest, {} if sub is True else sub, p), p))
                        finally:
                            self.raw_open.discard(key)
                    return RAW_TEXT if RAW_TEXT in alts else _choice(alts)
            value = self.string_value(schema, ptr, raw=True)
            if value is None or value is RAW_TEXT:
                return value
            if isinstance(value, RuleRef):    # an automaton's rules (string_automaton): already without '<'
                if self.excl is not None:
                    return self.unsupported("not", ptr, "excluded strings in a raw string under 'not' or two "
                                            "patterns cannot be enforced", fallback=value)
                return value
            value = map_leaves(value, _without_lt)
            return value if self.excl is None else self.avoid(value, ptr)
        finally:
            self.level -= 1

    def xml_obj(self, schema: dict, ptr: str, d: int) -> Expr | None:
        """An object written as XML members: the listed ones in order (or any order), then those
        the schema does not list (additionalProperties, patternProperties, propertyNames), whose
        names are the style's names other than the listed ones."""
        addl, names = self.object_names(schema, ptr)
        if self.xml.names is None:
            # No other names can be written. An object the schema leaves open takes its listed
            # members only (as xgrammar does); asking for other members is an error.
            for kw in ("patternProperties", "propertyNames", "additionalProperties"):
                if kw in schema and schema[kw] is not False:
                    raise SchemaError(f"{kw}: this XML style takes fixed object property names only (its closing "
                                      "tags repeat the name, so members the schema does not list cannot be "
                                      "written)", _ptr(ptr, kw))
            if not self.strict and addl is not False:
                # without strict_mode the object is open, and closing it here would drop members
                raise SchemaError("this XML style takes fixed object property names only, so an object left open "
                                  "(strict_mode=False) cannot be written", ptr)
            addl = False
        allowed = self.key_language(schema.get("propertyNames", True), _ptr(ptr, "propertyNames"))
        entries = self.named_members(schema, ptr, names, allowed,
                                     lambda k, own, p: self.add_rule(f"m_{k}", self.xml_element(k, own, p, d + 1)),
                                     None if self.excl is None else self.excl.name_ok)
        if entries is None:
            return None
        extra = self.xml_others(schema, names, addl, ptr, d, allowed)
        if extra is _CANNOT:
            return None
        return self.object_of(schema, ptr, d, entries, extra)

    def xml_others(self, schema: dict, names: list[str], addl: Any, ptr: str, d: int, allowed: Any):
        """One member whose name the schema does not list: the names split into regions by the
        patterns that match them, each region's value under its patterns' schemas (or
        additionalProperties); None when there is none, _CANNOT when propertyNames rules out a
        required name."""

        if allowed is not None and any(not allowed.accepts(k) for k in schema.get("required", [])):
            return _CANNOT
        pats = self.pattern_languages(schema, ptr)
        if addl is False and not pats or self.xml.names is None:
            return None
        members: list[Expr | None] = []
        for region, value_schema, matched in self.regions(pats, addl, names, allowed, self.xml.names):
            if value_schema is False:
                continue
            def names(r=region):
                if self.excl is None:
                    return to_rules(r, self.spell_class, self.new_name, self.rules)
                return self.excluded(lambda: self.excl.avoid_spelled(r, self.spell_class, self.new_name, self.rules), ptr)
            key = self.cached(("xml_names", region), "name", names)
            members.append(self.xml_element(key, value_schema, ptr if matched else _ptr(ptr, "additionalProperties"),
                                            d + 1))
        return self.add_rule("m_other", _choice(members))

    def spell_class(self, cc: CharClass) -> Expr:
        """Name characters as the style writes them (some as entities)."""
        out: list[Expr] = []
        ranges = list(cc.ranges)
        for ch, entity in self.xml.escapes:
            c = ord(ch)
            if any(lo <= c <= hi for lo, hi in ranges):
                out.append(Literal(entity))
                ranges = [(a, b) for lo, hi in ranges for a, b in ((lo, min(hi, c - 1)), (max(lo, c + 1), hi)) if a <= b]
        if not out:
            return cc
        if ranges:
            out.insert(0, CharClass(tuple(ranges)))
        return _choice(out)

    def xml_const(self, v: dict | list, d: int, ptr: str) -> Expr | None:
        """A listed object or array of a recursive style, as the elements it is written as."""
        pairs = list(v.items()) if isinstance(v, dict) else [(None, x) for x in v]
        if not pairs:
            return self.empty("{}", d)
        parts: list[Expr | None] = [self.open("{", d)]
        for i, (k, x) in enumerate(pairs):
            if k is not None:
                self.check_element_name(k, ptr)
            if i:
                parts.append(self.sep(d))
            t = _json_type(x)
            if t == "string":
                pad = Repeat(Literal("\n"), 0, 1) if self.xml.pad else EMPTY
                body = _seq(pad, Literal(x), pad, Literal(self.xml.until()))
            elif t in ("object", "array"):
                body = _seq(self.xml_const(x, d + 1, ptr), Literal(self.xml.until()))
            elif self.xml.json_pad:
                body = _seq(self.xml_ws, self.const(x, d + 1, ptr), self.xml_ws, Literal(self.xml.until()))
            else:
                body = _seq(self.const(x, d + 1, ptr), Literal(self.xml.until()))
            label = None if k is None else Literal(self.xml.spell(k))
            parts.append(_seq(self.opening(label, self.xml.kind(t)), body, Literal(self.closing_rest(k))))
        parts.append(self.close("}", d))
        return _seq(*parts)

