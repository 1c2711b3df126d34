"""JSON Schema negation: `not`, `if`/`then`/`else` and overlapping `oneOf` as positive schemas.

A grammar has no complement, but a schema's complement can mostly be written as another schema:
a schema is a conjunction of keywords, each constraining only the values of its own type, so
``not {k1, k2, ...}`` is the union of "a value of another type" and, per keyword, "a value of
that keyword's type that breaks it". Most keywords break into positive ones (`minLength: 3` into
`maxLength: 2`; `required: [a]` into "member a absent"; `properties: {a: S}` into "member a present
with a value under not S"), the boolean applicators into each other, and what is left are *leaf
negations* that the typed lowerings enforce themselves:

* strings: ``not`` of `pattern`, `format`, and string `enum`/`const` (the complement of a regular
  language, computed on automata: regular.py);
* integers: ``not`` of `multipleOf` and of numeric `enum`/`const` (remainder automata, or the
  values listed when the range is small);
* objects: ``not`` of `patternProperties`, `propertyNames` and `additionalProperties`: "some member
  whose key is in a language has a value under a schema" (a witness member, json_object.py).

The complement is itself valid JSON Schema (leaf negations stay `not`s), so the validator that
filters listed values reads it unchanged. Forms with no such rewrite (`uniqueItems`, unevaluated
keywords, recursive references, numbers that are not integers) give ``_CANNOT`` and the caller
raises the usual typed error.
"""

from __future__ import annotations

from typing import Any

from ..errors import SchemaError
from .ir import Expr
from .json_common import _CANNOT, ANNOTATIONS, CONDITIONS, MEMBER_KEYWORDS, ONE_OF_OVERLAP, TYPES, _ptr
from .schema_merge import both as _both

#: Keywords under `not` that a typed lowering enforces itself, by the type they constrain.
STRING_LEAVES = frozenset({"pattern", "format"})
INTEGER_LEAVES = frozenset({"multipleOf"})
OBJECT_LEAVES = frozenset({"patternProperties", "propertyNames", "additionalProperties", "properties"})
#: Most disjuncts one complement may have before it is refused (it is crossed with others later).
MAX_COMPLEMENT_PARTS = 256


def _value_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "integer" if isinstance(v, int) or v.is_integer() else "number"
    if isinstance(v, str):
        return "string"
    return "array" if isinstance(v, list) else "object"


def leaf_domain(neg: Any) -> str | None:
    """The type whose lowering enforces ``not neg`` itself ("string", "integer" or "object"), or
    None when `neg` is no leaf. A leaf is one keyword of those above (an `enum`/`const` of strings
    or of integers), or an `anyOf` of leaves of one domain (how two merged `not`s meet)."""
    if not isinstance(neg, dict):
        return None
    keys = [k for k in neg if k not in ANNOTATIONS]
    if len(keys) != 1:
        return None
    k = keys[0]
    v = neg[k]
    if k == "anyOf" and isinstance(v, list) and v:
        domains = {leaf_domain(b) for b in v}
        return domains.pop() if len(domains) == 1 and None not in domains else None
    if k in STRING_LEAVES:
        return "string"
    if k in INTEGER_LEAVES:
        return "integer"
    if k in ("enum", "const"):
        values = v if k == "enum" else [v]
        if not isinstance(values, list) or not values:
            return None
        kinds = {_value_type(x) for x in values}
        if kinds == {"string"}:
            return "string"
        if kinds == {"integer"}:
            return "integer"
        return None
    if k in OBJECT_LEAVES:
        if k == "properties":
            return None     # only as part of an additionalProperties leaf (below)
        return "object"
    return None


def object_leaf_domain(neg: Any) -> bool:
    """An additionalProperties leaf: the names and patterns it is relative to, and the schema."""
    if not isinstance(neg, dict):
        return False
    keys = {k for k in neg if k not in ANNOTATIONS}
    return "additionalProperties" in keys and keys <= {"properties", "patternProperties", "additionalProperties"}


def is_leaf(neg: Any) -> bool:
    return leaf_domain(neg) is not None or object_leaf_domain(neg)


def leaf_kind(neg: Any) -> str | None:
    if object_leaf_domain(neg):
        return "object"
    if isinstance(neg, dict) and isinstance(neg.get("anyOf"), list) and len(neg) == 1:
        kinds = {leaf_kind(b) for b in neg["anyOf"]}
        return kinds.pop() if len(kinds) == 1 and None not in kinds else None
    return leaf_domain(neg)


def leaves(neg: dict) -> list[dict]:
    """The leaves of a leaf negation (the branches of its `anyOf`, flattened)."""
    if set(neg) - ANNOTATIONS == {"anyOf"}:
        return [x for b in neg["anyOf"] for x in leaves(b)]
    return [neg]


#: The types whose lowering enforces a leaf negation of each kind (json_negation.py).
_LEAF_TYPES = {"string": {"string"}, "integer": {"integer", "number"}, "object": {"object"}}

def _schema_dependencies(schema: dict) -> list[str]:
    """The keys of draft 4-7 `dependencies` whose value is a schema that says more than `required`
    (the object lowering tracks the others as dependentRequired)."""
    deps = schema.get("dependencies")
    if not isinstance(deps, dict):
        return []
    return [a for a, v in deps.items() if isinstance(v, (dict, bool)) and v is not True
            and not (isinstance(v, dict) and set(v) - ANNOTATIONS <= {"required"})]

_UNEVALUATED = frozenset({"unevaluatedProperties", "unevaluatedItems"})


class NegationLowering:
    """The complement of a schema as a schema; a mixin of the converter (uses `resolve`, `types`,
    `unsupported`, `enter`)."""

    def complement(self, s: Any, ptr: str, seen: tuple = ()) -> Any:
        """A schema valid exactly where `s` is not (leaf negations kept as `not`), or _CANNOT."""
        if s is True:
            return False
        if s is False:
            return True
        if not isinstance(s, dict):
            raise SchemaError("a schema must be an object or a boolean", ptr)
        self.enter(ptr)
        try:
            return self._complement(self.alone(s), ptr, seen)
        finally:
            self.level -= 1

    def _complement(self, s: dict, ptr: str, seen: tuple) -> Any:
        s = {k: v for k, v in s.items() if k not in ANNOTATIONS}
        parts: list[Any] = []

        def add(x: Any) -> bool:
            if x is _CANNOT:
                return False
            if x is not False:
                parts.append(x)
            return True

        def typed(t: str | list, **kw: Any) -> dict:
            return {"type": t, **kw}

        if "$ref" in s:
            target, where = self.resolve(s["$ref"], _ptr(ptr, "$ref"))
            if where in seen:
                return _CANNOT      # the complement of a recursive schema is recursive too
            if not add(self.complement(target, where, (*seen, where))):
                return _CANNOT
        if "type" in s:
            ts = set(self.types(s, ptr))
            if "number" in ts:
                ts.add("integer")
            if "integer" in ts and "number" not in ts:
                # numbers that are not integers: only their plain decimal spellings are written
                parts.append(typed("number", **{"not": {"multipleOf": 1}}))
            other = [t for t in TYPES if t not in ts and t not in ("integer", "number")]
            if "number" not in ts and "integer" not in ts:
                other.append("number")
            if other:
                parts.append(typed(other))
        prefix_len = None
        if "prefixItems" in s:
            prefix = s["prefixItems"]
            rest, rest_kw = s.get("items"), "items"
        elif isinstance(s.get("items"), list):
            prefix = s["items"]
            rest, rest_kw = s.get("additionalItems"), "additionalItems"
        else:
            prefix, rest, rest_kw = [], s.get("items"), "items"
        if not isinstance(prefix, list):
            raise SchemaError("prefixItems must be an array", _ptr(ptr, "prefixItems"))
        prefix_len = len(prefix)
        for i, sub in enumerate(prefix):
            n = self.complement(sub, _ptr(ptr, "prefixItems" if "prefixItems" in s else "items", i), seen)
            if n is _CANNOT:
                return _CANNOT
            if n is not False:
                parts.append(typed("array", minItems=i + 1, prefixItems=[True] * i + [n]))
        if rest is not None:
            n = self.complement(rest, _ptr(ptr, rest_kw), seen)
            if n is _CANNOT:
                return _CANNOT
            if n is not False:
                if prefix_len:
                    return _CANNOT  # "some item after the prefix breaks it": no counting form yet
                parts.append(typed("array", contains=n))
        for k, v in s.items():
            where = _ptr(ptr, k)
            if k in ("type", "$ref", "prefixItems", "items", "additionalItems"):
                continue
            if k in ("enum", "const"):
                values = v if k == "enum" else [v]
                if not isinstance(values, list):
                    raise SchemaError("enum must be an array", where)
                if not add(self.complement_values(values, s)):
                    return _CANNOT
            elif k == "minLength" and isinstance(v, int) and v > 0:
                parts.append(typed("string", maxLength=v - 1))
            elif k == "maxLength" and isinstance(v, int):
                parts.append(typed("string", minLength=v + 1))
            elif k == "pattern":
                parts.append(typed("string", **{"not": {"pattern": v}}))
            elif k == "format":
                if isinstance(v, str) and self.format_of(v) is not None:   # else an annotation
                    parts.append(typed("string", **{"not": {"format": v}}))
            elif k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
                if isinstance(v, bool):
                    continue        # draft 4: read with its bound
                excl = s.get("exclusiveMinimum" if k == "minimum" else "exclusiveMaximum") is True
                if k in ("minimum", "exclusiveMinimum"):
                    parts.append(typed("number", **({"maximum": v} if k == "exclusiveMinimum" or excl
                                                     else {"exclusiveMaximum": v})))
                else:
                    parts.append(typed("number", **({"minimum": v} if k == "exclusiveMaximum" or excl
                                                    else {"exclusiveMinimum": v})))
            elif k == "multipleOf":
                parts.append(typed("number", **{"not": {"multipleOf": v}}))
            elif k == "required":
                if not isinstance(v, list):
                    raise SchemaError("required must be an array of strings", where)
                parts += [typed("object", properties={name: False}) for name in v]
            elif k in ("properties", "patternProperties"):
                if not isinstance(v, dict):
                    raise SchemaError(f"{k} must be an object", where)
                for name, sub in v.items():
                    n = self.complement(sub, _ptr(where, name), seen)
                    if n is _CANNOT:
                        return _CANNOT
                    if n is False:
                        continue
                    if k == "properties":     # the member is there, its value under the complement
                        parts.append(typed("object", required=[name], properties={name: n}))
                    else:                     # some member whose key matches: a leaf (json_object.py)
                        parts.append(typed("object", **{"not": {"patternProperties": {name: sub}}}))
            elif k == "additionalProperties":
                n = self.complement(v, where, seen)
                if n is _CANNOT:
                    return _CANNOT
                if n is not False:
                    leaf = {"additionalProperties": v}
                    if s.get("properties"):
                        leaf["properties"] = {name: True for name in s["properties"]}
                    if s.get("patternProperties"):
                        leaf["patternProperties"] = {p: True for p in s["patternProperties"]}
                    parts.append(typed("object", **{"not": leaf}))
            elif k == "propertyNames":
                n = self.complement(v, where, seen)
                if n is _CANNOT:
                    return _CANNOT
                if n is not False:
                    parts.append(typed("object", **{"not": {"propertyNames": v}}))
            elif k == "minProperties" and isinstance(v, int) and v > 0:
                parts.append(typed("object", maxProperties=v - 1))
            elif k == "maxProperties" and isinstance(v, int):
                parts.append(typed("object", minProperties=v + 1))
            elif k == "minItems" and isinstance(v, int) and v > 0:
                parts.append(typed("array", maxItems=v - 1))
            elif k == "maxItems" and isinstance(v, int):
                parts.append(typed("array", minItems=v + 1))
            elif k in ("dependentRequired", "dependencies", "dependentSchemas"):
                if not isinstance(v, dict):
                    raise SchemaError(f"{k} must be an object", where)
                for a, need in v.items():
                    if isinstance(need, list):
                        parts += [typed("object", required=[a], properties={b: False}) for b in need]
                        continue
                    n = self.complement(need, _ptr(where, a), seen)
                    if n is _CANNOT:
                        return _CANNOT
                    if n is not False:
                        parts.append({"allOf": [typed("object", required=[a]), n]})
            elif k == "contains":
                lo = s.get("minContains", 1)
                hi = s.get("maxContains")
                if lo == 0 and hi is None:
                    continue
                if lo == 1 and hi is None:
                    n = self.complement(v, where, seen)
                    if n is _CANNOT:
                        return _CANNOT
                    parts.append(typed("array", items=n))
                    continue
                if lo > 0:
                    parts.append(typed("array", contains=v, minContains=0, maxContains=lo - 1))
                if hi is not None:
                    parts.append(typed("array", contains=v, minContains=hi + 1))
            elif k in ("minContains", "maxContains"):
                continue        # read with `contains`
            elif k == "allOf":
                for i, sub in enumerate(v):
                    if not add(self.complement(sub, _ptr(where, i), seen)):
                        return _CANNOT
            elif k == "anyOf":
                subs = [self.complement(sub, _ptr(where, i), seen) for i, sub in enumerate(v)]
                if any(x is _CANNOT for x in subs):
                    return _CANNOT
                if all(x is not False for x in subs):
                    parts.append({"allOf": subs})
            elif k == "oneOf":
                subs = [self.complement(sub, _ptr(where, i), seen) for i, sub in enumerate(v)]
                if any(x is _CANNOT for x in subs):
                    return _CANNOT
                if all(x is not False for x in subs):
                    parts.append({"allOf": subs})       # none holds
                parts += [{"allOf": [a, b]} for i, a in enumerate(v) for b in v[i + 1:]]  # two hold
            elif k == "not":
                parts.append(v)
            elif k == "if":
                if "then" in s:
                    n = self.complement(s["then"], _ptr(ptr, "then"), seen)
                    if n is _CANNOT:
                        return _CANNOT
                    if n is not False:
                        parts.append({"allOf": [v, n]})
                if "else" in s:
                    n = self.complement(s["else"], _ptr(ptr, "else"), seen)
                    ni = self.complement(v, where, seen)
                    if n is _CANNOT or ni is _CANNOT:
                        return _CANNOT
                    if n is not False and ni is not False:
                        parts.append({"allOf": [ni, n]})
            elif k in ("then", "else"):
                continue
            elif k == "uniqueItems":
                if v is True:
                    return _CANNOT
            elif k in ("unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef"):
                return _CANNOT
            # other keywords are annotations or not standard: they constrain nothing
            if len(parts) > MAX_COMPLEMENT_PARTS:
                return _CANNOT
        if not parts:
            return False
        return parts[0] if len(parts) == 1 else {"anyOf": parts}

    def complement_values(self, values: list, s: dict) -> Any:
        """Every value not listed, by type: the listed types' other values as leaf negations."""
        kinds: dict[str, list] = {}
        for x in values:
            kinds.setdefault(_value_type(x), []).append(x)
        if "number" in kinds and "integer" in kinds:
            kinds["number"] += kinds.pop("integer")
        parts: list[Any] = []
        unlisted = [t for t in ("null", "boolean", "object", "array", "string") if t not in kinds]
        if "number" not in kinds and "integer" not in kinds:
            unlisted.append("number")
        if unlisted:
            parts.append({"type": unlisted})
        if "boolean" in kinds:
            left = [b for b in (True, False) if b not in kinds["boolean"]]
            if left:
                parts.append({"enum": left})
        if "string" in kinds:
            parts.append({"type": "string", "not": {"enum": kinds["string"]}})
        if "integer" in kinds:
            parts.append({"type": "number", "not": {"multipleOf": 1}})      # numbers that are not integers
            parts.append({"type": "integer", "not": {"enum": kinds["integer"]}})
        if "number" in kinds:
            return _CANNOT      # a non-integer number has many spellings: no leaf form yet
        if "object" in kinds or "array" in kinds:
            return _CANNOT
        if not parts:
            return False
        return parts[0] if len(parts) == 1 else {"anyOf": parts}

    def leaf_applies(self, schema: dict, ptr: str) -> bool:
        """Whether the schema's `not` is a leaf negation its typed lowering enforces (json_negation.py):
        a leaf of a domain that holds every type the schema allows."""
        kind = leaf_kind(schema["not"])
        return kind is not None and set(self.types(schema, ptr)) <= _LEAF_TYPES[kind]

    def lower_not(self, schema: dict, ptr: str, d: int) -> Expr | None:
        """`not` as the complement of its schema (json_negation.py), met with the rest."""
        rest = {k: v for k, v in schema.items() if k != "not"}
        # `not` evaluates no member or item: the rest settles its unevaluated keywords first
        rest = self.close_unevaluated(rest, ptr)
        comp = self.complement(schema["not"], _ptr(ptr, "not"))
        if comp is _CANNOT:
            self.unsupported("not", _ptr(ptr, "not"), "this form of 'not' has no positive equivalent that can be "
                             "enforced")
            return self.lower(rest, ptr, d)   # lenient: not enforced
        if comp is False:
            return self.nothing("'not' of a schema every value meets", _ptr(ptr, "not"))
        if comp is True:
            return self.lower(rest, ptr, d)
        return self.lower(self.merge(rest, comp, ptr), ptr, d)

    def lower_conditions(self, schema: dict, ptr: str, d: int) -> Expr | None:
        """`if`/`then`/`else` as ``(if and then) or (not if and else)``, for every such group.

        Beside unevaluated keywords (one group): where `if` holds, its members (items) and those of
        `then` count as evaluated, so that branch is merged whole and closed when lowered; where it
        fails only those of `else` do, so that branch is closed before the complement joins it."""
        groups = [*([{g: schema[g] for g in ("if", "then", "else") if g in schema}] if "if" in schema else []),
                  *schema.get(CONDITIONS, [])]
        rest = {k: v for k, v in schema.items() if k not in ("if", "then", "else", CONDITIONS)}
        if _UNEVALUATED & set(schema):
            if len(groups) != 1:
                schema = self.close_unevaluated(schema, ptr)   # refused (or dropped, lenient)
                rest = {k: v for k, v in schema.items() if k not in ("if", "then", "else", CONDITIONS)}
            else:
                cond, then, other = groups[0]["if"], groups[0].get("then", True), groups[0].get("else", True)
                ncond = self.complement(cond, _ptr(ptr, "if"))
                if ncond is _CANNOT:
                    self.unsupported("if", _ptr(ptr, "if"), "'if' whose negation has no positive form that can be "
                                     "enforced (needed for its 'else', or for values where it fails)")
                    return self.lower(rest, ptr, d)
                branches = [self.merge(rest, {"allOf": [cond, then]}, ptr)]     # `rest` holds: it closes them
                if other is not False and ncond is not False:
                    closed = self.close_unevaluated(self.merge(rest, {} if other is True else other, ptr), ptr)
                    branches.append({"allOf": [closed, ncond]})
                return self.lower({"anyOf": branches}, ptr, d)
        conj = []
        for group in groups:
            where = _ptr(ptr, "if")
            cond, then, other = group["if"], group.get("then", True), group.get("else", True)
            if then is True and other is True:
                continue
            ncond = self.complement(cond, where)
            if ncond is _CANNOT:
                self.unsupported("if", where, "'if' whose negation has no positive form that can be enforced (needed "
                                 "for its 'else', or for values where it fails)")
                continue    # lenient: not enforced
            conj.append({"anyOf": [{"allOf": [cond, then]}, {"allOf": [ncond, other]}]})
        if not conj:
            return self.lower(rest, ptr, d)
        return self.lower(self.merge(rest, {"allOf": conj}, ptr), ptr, d)

    def lower_dependent_schemas(self, schema: dict, ptr: str, d: int) -> Expr | None:
        """dependentSchemas (and draft 4-7 `dependencies` with schemas): for each key, the member
        is absent, or present and the whole object meets the schema (whose members then count as
        evaluated; the trigger itself is not named, so that it does not count)."""
        rest = dict(schema)
        deps = dict(rest.pop("dependentSchemas", {}))
        if not isinstance(deps, dict):
            raise SchemaError("dependentSchemas must be an object", _ptr(ptr, "dependentSchemas"))
        old = _schema_dependencies(schema)
        if old:
            rest["dependencies"] = {a: v for a, v in schema["dependencies"].items() if a not in old}
            if not rest["dependencies"]:
                rest.pop("dependencies")
            for a in old:
                deps[a] = _both(deps.get(a, True), schema["dependencies"][a])
        named = not _UNEVALUATED & set(schema)     # the trigger first in member order, where that is harmless
        conj = [{"anyOf": [{"properties": {a: False}},
                           {"allOf": [{"required": [a], **({"properties": {a: True}} if named else {})}, sub]}]}
                for a, sub in deps.items() if sub is not True]
        if not conj:
            return self.lower(rest, ptr, d)
        return self.lower(self.merge(rest, {"allOf": conj}, ptr), ptr, d)

    def exactly_one(self, subs: list, ptr: str, context: dict) -> list:
        """oneOf's branches made disjoint: each met with the complement of every branch it may
        overlap (those not shown disjoint by `overlaps`). Unsupported when a complement has no
        positive form."""
        pairs = self.overlaps(subs, ptr, context)
        if not pairs:
            return subs
        # Beside unevaluated keywords the members a complement names are not evaluated by it: each
        # branch is merged with the schema around the oneOf and closed before the complements join.
        closing = bool(_UNEVALUATED & set(context))
        out = []
        for i, b in enumerate(subs):
            others = [j for j in range(len(subs)) if (min(i, j), max(i, j)) in pairs]
            if not others or b is False:
                out.append(b)
                continue
            comps = [self.complement(subs[j], _ptr(ptr, "oneOf", j)) for j in others]
            if any(c is _CANNOT for c in comps):
                self.unsupported("oneOf", _ptr(ptr, "oneOf"), ONE_OF_OVERLAP)
                return subs     # lenient: anyOf
            if any(c is False for c in comps):
                continue        # a branch every value meets: no other branch can hold alone
            if closing:
                b = self.close_unevaluated(self.merge(context, {} if b is True else b, ptr), ptr)
            out.append({"allOf": [True if b is True else b, *[c for c in comps if c is not True]]})
        return out or [False]

    def overlaps(self, subs: list, ptr: str, context: dict | None = None) -> set[tuple[int, int]]:
        """The pairs of oneOf branches (i < j) not shown disjoint: by types (the branch's own and
        those `context`, the schema holding the oneOf, merges in), listed values, a required
        property whose schemas are disjoint, or closed objects (`disjoint`). Conservative: a pair it
        cannot tell apart is listed."""
        branches = []
        for i, b in enumerate(subs):
            where = _ptr(ptr, "oneOf", i)
            b = self.flatten(b, where)
            if b is False:
                branches.append(None)
                continue
            b = b if isinstance(b, dict) else {}
            if context is not None:
                shared = {k: context[k] for k in ("type", *MEMBER_KEYWORDS, "required") if k in context}
                if shared:
                    b = self.merge(shared, b, where)
            branches.append((b, where))
        checker = self.checker()
        return {(i, j) for i, x in enumerate(branches) for j in range(i + 1, len(branches))
                if x is not None and branches[j] is not None
                and not self.disjoint(x[0], branches[j][0], checker, x[1], branches[j][1])}
