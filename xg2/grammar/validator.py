"""A JSON Schema validator for the values a schema names itself (`enum`, `const`).

When a schema lists its values, the exact language is those values that validate under the *whole*
schema, whatever else it says (`not`, `if`/`then`, `uniqueItems`, `dependencies`...). Deciding that
per value is plain validation, so these keywords are exact there even though most of them have no
grammar form. Patterns and formats are matched with the same automata the grammar uses, so the
two never disagree about a regex.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

from ..errors import GrammarLimitError, SchemaError
from .formats import format_expr
from .fsm import rule_automaton
from .ir import text_bytes
from .json_common import CONDITIONS, FOUND, MORE_CONTAINS, MORE_STRINGS, PRESENCE, UNEVALUATED_ITEMS
from .regex import regex_to_expr

#: Nested schema applications before giving up (recursive `$ref`s on deep values). Each costs about
#: 6 interpreter frames, so this stays well within Python's default limit of 1000.
MAX_VALIDATION_DEPTH = 100

_TYPE_CHECKS = {
    "null": lambda v: v is None,
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()),
}
#: Keywords with no effect on validity.
_ANNOTATIONS = frozenset({
    "title", "description", "examples", "default", "$schema", "$id", "id", "$comment", "deprecated",
    "readOnly", "writeOnly", "$defs", "definitions", "contentEncoding", "contentMediaType", "contentSchema",
    "$anchor", "$dynamicAnchor", "\x00documents",
})


def json_equal(a: Any, b: Any) -> bool:
    """JSON value equality: 1 == 1.0, but true != 1; objects unordered, arrays ordered. Iterative:
    values come from tenants and may nest deeper than the interpreter's stack."""
    work = [(a, b)]
    while work:
        a, b = work.pop()
        if a is b and not isinstance(a, float):
            continue
        if isinstance(a, bool) or isinstance(b, bool):
            if not (isinstance(a, bool) and isinstance(b, bool) and a == b):
                return False
        elif isinstance(a, (int, float)) and isinstance(b, (int, float)):
            if a != b:
                return False
        elif isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b):
                return False
            work.extend(zip(a, b))
        elif isinstance(a, dict) and isinstance(b, dict):
            if a.keys() != b.keys():
                return False
            work.extend((a[k], b[k]) for k in a)
        elif type(a) is not type(b) or a != b:
            return False
    return True


def _scalar_key(v: Any) -> tuple | None:
    """A hashable key equal exactly when two scalars are JSON-equal (1 and 1.0 alike, true not 1);
    None for arrays and objects."""
    if v is None:
        return ("null",)
    if isinstance(v, bool):
        return ("bool", v)
    if isinstance(v, (int, float)):
        return ("number", v)
    if isinstance(v, str):
        return ("string", v)
    return None


def _matches(expr, text: str) -> bool:
    return rule_automaton(expr, {}).accepts(text_bytes(text))


class Validator:
    """Validates instances against subschemas of one root schema (for local `$ref`s)."""

    def __init__(self, root: Any, resolve, max_depth: int = MAX_VALIDATION_DEPTH, ref_alone: bool = False,
                 formats: bool = True):
        self.root = root
        self.formats = formats      # format_assertion: formats are checked (else annotations)
        self.ref_alone = ref_alone  # drafts 4 to 7: the keywords beside a `$ref` are ignored
        self.max_depth = max_depth
        self.resolve = resolve  # (ref, pointer) -> (target schema, its pointer)
        self._enums: dict[int, tuple[list, set]] = {}  # id(enum list) -> (the list, its scalar keys)

    def in_enum(self, x: Any, values: list) -> bool:
        """`x` is one of `values`; scalars by a set built once per list (a schema's listed values
        are each checked against the whole schema, enum included, so a scan would be quadratic)."""
        entry = self._enums.get(id(values))
        if entry is None or entry[0] is not values:
            entry = self._enums[id(values)] = (values, {k for k in map(_scalar_key, values) if k is not None})
        key = _scalar_key(x)
        if key is not None:
            return key in entry[1]
        return any(json_equal(x, e) for e in values)

    def valid(self, value: Any, schema: Any, ptr: str, depth: int = 0) -> bool:
        if depth > self.max_depth:
            raise GrammarLimitError(f"validation nested deeper than {self.max_depth} levels", pointer=ptr)
        if schema is True or schema == {}:
            return True
        if schema is False:
            return False
        if not isinstance(schema, dict):
            raise SchemaError("a schema must be an object or a boolean", ptr)
        if self.ref_alone and "$ref" in schema:
            return self._keyword("$ref", schema["$ref"], value, schema, ptr, depth + 1)
        return all(self._keyword(k, v, value, schema, ptr, depth + 1) for k, v in schema.items())

    def _keyword(self, k: str, v: Any, x: Any, s: dict, ptr: str, depth: int) -> bool:
        p = f"{ptr}/{k}"
        sub = self.valid
        if k in _ANNOTATIONS or k.startswith("x-") or k in ("then", "else", "additionalItems", "minContains",
                                                             "maxContains", "unevaluatedItems"):
            return self._deferred(k, x, s, ptr, depth)
        if k == "$ref":
            target, where = self.resolve(v, p)
            return sub(x, target, where, depth)
        if k.startswith("\x00"):
            return self._internal(k, v, x, ptr, depth)
        if k == "type":
            types = [v] if isinstance(v, str) else v
            if not isinstance(types, list) or any(t not in _TYPE_CHECKS for t in types):
                raise SchemaError(f"invalid type {v!r}", p)
            return any(_TYPE_CHECKS[t](x) for t in types)
        if k == "enum":
            if not isinstance(v, list):
                raise SchemaError("enum must be an array", p)
            return self.in_enum(x, v)
        if k == "const":
            return json_equal(x, v)
        if k in ("allOf", "anyOf", "oneOf"):
            if not isinstance(v, list) or not v:
                raise SchemaError(f"{k} must be a non-empty array", p)
            results = (sub(x, b, f"{p}/{i}", depth) for i, b in enumerate(v))
            if k == "allOf":
                return all(results)
            if k == "anyOf":
                return any(results)
            return sum(results) == 1
        if k == "not":
            return not sub(x, v, p, depth)
        if k == "if":
            if sub(x, v, p, depth):
                return sub(x, s.get("then", True), f"{ptr}/then", depth)
            return sub(x, s.get("else", True), f"{ptr}/else", depth)
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            return self._numeric(k, v, x, s, p)
        if isinstance(x, str):
            return self._string(k, v, x, p)
        if isinstance(x, list):
            return self._array(k, v, x, s, ptr, depth)
        if isinstance(x, dict):
            return self._object(k, v, x, s, ptr, depth)
        return self._known(k, p)

    def _internal(self, k: str, v: Any, x: Any, ptr: str, depth: int) -> bool:
        """The converter's own keywords, which merged schemas carry (json_common.py)."""
        if k in (CONDITIONS, MORE_CONTAINS, MORE_STRINGS):
            return all(self.valid(x, group, ptr, depth) for group in v)
        if k == UNEVALUATED_ITEMS:      # never on listed values: it is set after their filtering
            raise SchemaError("internal: unevaluated items on a listed value", ptr)
        if not isinstance(x, dict):
            return True
        if k == PRESENCE:
            mode, sets = v
            held = sum(all(name in x for name in group) for group in sets)
            return held == 1 if mode == "oneOf" else held >= 1
        if k == FOUND:
            return all(any(keys.accepts(name) and self.valid(value, schema, ptr, depth) for name, value in x.items())
                       for keys, schema in v)
        raise SchemaError(f"internal keyword {k!r} unknown to the validator", ptr)

    def _deferred(self, k: str, x: Any, s: dict, ptr: str, depth: int) -> bool:
        """Keywords evaluated together with another one (`then`/`else` with `if`, `additionalItems`
        with `items`, `min/maxContains` with `contains`); `unevaluatedItems` is not supported."""
        if k == "unevaluatedItems":
            raise SchemaError("unsupported keyword 'unevaluatedItems'", f"{ptr}/{k}")
        return True

    @staticmethod
    def _known(k: str, p: str) -> bool:
        if k.startswith("$"):  # $dynamicRef and friends
            raise SchemaError(f"unsupported keyword {k!r}", p)
        return True  # a keyword for another type, or unknown (ignored, as validators do)

    def _numeric(self, k: str, v: Any, x: float, s: dict, p: str) -> bool:
        if k in ("multipleOf", "maximum", "minimum", "exclusiveMaximum", "exclusiveMinimum"):
            if isinstance(v, bool):
                return True  # draft 4 exclusive flags, read with their bound
            if not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v)):
                raise SchemaError(f"{k} must be a number", p)
        if isinstance(x, float) and not math.isfinite(x):
            return False
        xd, vd = _dec(x), (_dec(v) if not isinstance(v, bool) and isinstance(v, (int, float)) else None)
        if k == "multipleOf":
            return vd > 0 and (xd / vd) == (xd / vd).to_integral_value()
        if k == "maximum":
            return xd < vd if s.get("exclusiveMaximum") is True else xd <= vd
        if k == "minimum":
            return xd > vd if s.get("exclusiveMinimum") is True else xd >= vd
        if k == "exclusiveMaximum":
            return vd is None or xd < vd
        if k == "exclusiveMinimum":
            return vd is None or xd > vd
        return self._known(k, p)

    def _string(self, k: str, v: Any, x: str, p: str) -> bool:
        if k == "maxLength":
            return len(x) <= v
        if k == "minLength":
            return len(x) >= v
        if k == "pattern":
            return _matches(regex_to_expr(v, search=True), x)
        if k == "format":
            expr = format_expr(v) if isinstance(v, str) and self.formats else None
            return expr is None or _matches(expr, x)
        return self._known(k, p)

    def _array(self, k: str, v: Any, x: list, s: dict, ptr: str, depth: int) -> bool:
        p = f"{ptr}/{k}"
        sub = self.valid
        if k == "maxItems":
            return len(x) <= v
        if k == "minItems":
            return len(x) >= v
        if k == "uniqueItems":
            return not v or all(not json_equal(x[i], x[j]) for i in range(len(x)) for j in range(i))
        if k == "prefixItems":
            return all(sub(e, t, f"{p}/{i}", depth) for i, (e, t) in enumerate(zip(x, v)))
        if k == "items":
            if isinstance(v, list):  # draft 4-2019 tuple form, with additionalItems
                rest = s.get("additionalItems", True)
                return all(sub(e, v[i] if i < len(v) else rest, f"{p}/{i}", depth) for i, e in enumerate(x))
            start = len(s.get("prefixItems", []))
            return all(sub(e, v, p, depth) for e in x[start:])
        if k == "contains":
            n = sum(sub(e, v, p, depth) for e in x)
            return s.get("minContains", 1) <= n <= s.get("maxContains", math.inf)
        return self._known(k, p)

    def _object(self, k: str, v: Any, x: dict, s: dict, ptr: str, depth: int) -> bool:
        p = f"{ptr}/{k}"
        sub = self.valid
        if k == "maxProperties":
            return len(x) <= v
        if k == "minProperties":
            return len(x) >= v
        if k == "required":
            return all(name in x for name in v)
        if k == "properties":
            return all(sub(x[name], t, f"{p}/{name}", depth) for name, t in v.items() if name in x)
        if k == "patternProperties":
            return all(sub(x[name], t, f"{p}/{pat}", depth) for pat, t in v.items() for name in x
                       if _matches(regex_to_expr(pat, search=True), name))
        if k in ("additionalProperties", "unevaluatedProperties"):
            if k == "unevaluatedProperties" and any(c in s for c in ("allOf", "anyOf", "oneOf", "$ref", "if",
                                                                     "dependentSchemas", "dependencies")):
                raise SchemaError("unsupported keyword 'unevaluatedProperties' next to subschemas", p)
            if k == "unevaluatedProperties" and "additionalProperties" in s:
                return True  # additionalProperties has evaluated every member
            named = s.get("properties", {})
            pats = [regex_to_expr(q, search=True) for q in s.get("patternProperties", {})]
            return all(sub(val, v, p, depth) for name, val in x.items()
                       if name not in named and not any(_matches(q, name) for q in pats))
        if k == "propertyNames":
            return all(sub(name, v, p, depth) for name in x)
        if k in ("dependencies", "dependentRequired", "dependentSchemas"):
            for name, dep in v.items():
                if name not in x:
                    continue
                ok = all(d in x for d in dep) if isinstance(dep, list) else sub(x, dep, f"{p}/{name}", depth)
                if not ok:
                    return False
            return True
        return self._known(k, p)


def _dec(v: float) -> Decimal:
    return Decimal(v) if isinstance(v, int) else Decimal(repr(v))
