"""JSON Schema objects: members in order or in any order, counts, dependencies, and the key
regions that `patternProperties`, `propertyNames` and `additionalProperties` divide the key space
into. A mixin of the converter (json_schema._Converter), split off along the object seam: it uses the
converter's layout, rule and reference methods through `self`."""

from __future__ import annotations

import functools
from typing import Any

from ..errors import GrammarError, GrammarLimitError, SchemaError
from .ir import CharClass, Choice, Expr, Literal, Repeat, Rule, RuleRef, Seq
from .ir import choice as _choice
from .ir import seq as _seq
from .json_common import (
    _CANNOT,
    ANNOTATIONS,
    CHAR,
    CLOSING,
    CONDITIONS,
    EMPTY,
    FOUND,
    MAX_ANY_ORDER,
    MAX_KEY_PATTERNS,
    MAX_OBJECT_STATES,
    MAX_SCHEMA_DEPTH,
    MAX_TRACKED_DEPENDENCIES,
    MORE_CONTAINS,
    MORE_STRINGS,
    NEVER,
    PRESENCE,
    SHORT_ESCAPES,
    U_ESCAPE,
    UNEVALUATED_ITEMS,
    _canon_str,
    _ptr,
    state_rules,
)
from .json_negation import leaves
from .regex import regex_to_expr
from .regular import KeyDFA, finite_strings, intersect, to_rules
from .regular import _determinize as determinize
from .regular import from_expr as regular_from_expr
from .schema_merge import both as _both


@functools.lru_cache(maxsize=1024)
def _key_dfa(e: Expr) -> KeyDFA:
    return regular_from_expr(e)


@functools.lru_cache(maxsize=4096)
def _spelling(c: str) -> Expr:
    """The JSON spellings of one key character (`/` may be escaped)."""
    out = [Literal(_canon_str(c)[1:-1])]
    if c == "/":
        out.append(Literal("\\/"))
    return _choice(out)


@functools.lru_cache(maxsize=4096)
def _key_exits(codes: tuple[int, ...]) -> tuple[Expr, Expr | None]:
    """How a string leaves an excluded-key trie node whose children are `codes`: (the ASCII
    characters and escapes that are no child, the non-ASCII characters that are none when some
    child is non-ASCII, else None). Keys share letters, so the same nodes come again and again."""
    children = {chr(x) for x in codes}
    taken = CharClass(((0, 0x1F), (0x22, 0x22), (0x5C, 0x5C), *((x, x) for x in codes), (0x80, 0x10FFFF)))
    other: list[Expr] = [CharClass(taken.codepoint_ranges(), negated=True)]
    short = [e for e, v in SHORT_ESCAPES.items() if v not in children]
    if short:
        other.append(Seq((Literal("\\"), CharClass(tuple(sorted((ord(e), ord(e)) for e in short))))))
    if not codes:
        other.append(Seq((Literal("\\"), U_ESCAPE)))
    wide = [x for x in codes if x >= 0x80]
    return _choice(other), (CharClass(((0, 0x7F), *((x, x) for x in wide)), negated=True) if wide else None)


#: The rest of a key once it is none of the listed ones, as one expression (with excluded strings,
#: the key is met with their automaton, which reads no rules).
_REST = Seq((Repeat(CHAR, 0, None), Literal('"')))
_WIDE_REST = Seq((CharClass(((0, 0x7F),), negated=True), _REST))



def _trie(keys) -> dict:
    """The keys as nested dicts, one level per character; "" marks where a key ends."""
    trie: dict = {}
    for k in keys:
        node = trie
        for c in k:
            node = node.setdefault(c, {})
        node[""] = True
    return trie

def _string_excluding(keys: list[str], rest: Expr, nonascii_rest: Expr, make_rule) -> Expr:
    """A JSON string whose value is none of `keys` (spelt canonically; see the module notes).

    `rest` is the rest of any string once it has left the keys' trie and `nonascii_rest` a non-ASCII
    character followed by `rest`, both shared rules: the trie's nodes then do not each carry a copy
    of the string loop or of the UTF-8 automaton, which made these rules the slowest to compile."""
    trie = _trie(keys)
    # post-order over the trie without recursion; every 50th level becomes its own rule so the
    # expression nesting stays shallow for very long keys
    built: dict[int, Expr] = {}
    stack: list[tuple[dict, int, bool]] = [(trie, 0, False)]
    while stack:
        node, depth, ready = stack.pop()
        children = [c for c in node if c]
        if not ready:
            stack.append((node, depth, True))
            stack.extend((node[c], depth + 1, False) for c in children)
            continue
        alts: list[Expr] = []
        if "" not in node:
            alts.append(Literal('"'))
        for c in children:
            alts.append(Seq((_spelling(c), built.pop(id(node[c])))))
        other, wide = _key_exits(tuple(sorted(ord(c) for c in children)))
        alts.append(Seq((other, rest)))
        alts.append(nonascii_rest if wide is None else Seq((wide, rest)))
        # distinct by construction (each begins with other characters): no deduplicating choice,
        # which hashed every new alternative of every trie node
        expr = Choice(tuple(alts))
        built[id(node)] = make_rule("key_part", expr) if depth % 50 == 49 else expr
    return Seq((Literal('"'), built[id(trie)]))


def _excluding_dfa(keys: list[str]) -> KeyDFA:
    """The automaton of `_string_excluding(keys, _REST, _WIDE_REST, ...)`, built with one copy of the
    rest of the string, to which every trie node leaves: in the expression each node has its own
    copy, which subset construction keeps apart (tens of thousands of states for forty long keys,
    where the trie has about a thousand nodes)."""
    trie = _trie(keys)
    start, end, rest, root = 0, 1, 2, 3
    pieces: list[tuple[Expr, int, int]] = [(Literal('"'), start, root), (_REST, rest, end)]
    n = 4
    stack = [(trie, root)]
    while stack:
        node, at = stack.pop()
        children = sorted(c for c in node if c)
        if "" not in node:
            pieces.append((Literal('"'), at, end))
        for c in children:
            pieces.append((_spelling(c), at, n))
            stack.append((node[c], n))
            n += 1
        other, wide = _key_exits(tuple(ord(c) for c in children))
        pieces.append((other, at, rest))
        pieces.append((CharClass(((0, 0x7F),), negated=True) if wide is None else wide, at, rest))
    return determinize(pieces, n, start, {end})


#: Most members that must exist among the members a schema does not name (each a `not` of
#: patternProperties, propertyNames or additionalProperties); the run's states grow as 2**n.
MAX_FOUND = 3
#: Most keys, beyond the named ones, that an object's other members can take for each key to be
#: written at most once (rules over which have been written: 2**n of them).
MAX_DISTINCT_KEYS = 8


def _has_schema_dependencies(s: dict) -> bool:
    deps = s.get("dependencies")
    return isinstance(deps, dict) and any(isinstance(v, dict) and set(v) - ANNOTATIONS - {"required"}
                                          or v is False for v in deps.values())


class ObjectLowering:
    """The object half of the converter; see the module notes."""

    def close_unevaluated(self, s: dict, ptr: str) -> dict:
        """`s` with its `unevaluatedProperties` turned into `additionalProperties` and its
        `unevaluatedItems` into the keyword for the items after the evaluated ones.

        The keywords see the members (items) evaluated by `s` and by the in-place subschemas it
        holds, so `s` is first flattened (`$ref` and `allOf` merged in, which closes their own
        keywords the same way). Then `unevaluatedProperties` means `additionalProperties`, or
        nothing if `s` has one: that keyword evaluates every member the others leave; likewise
        `unevaluatedItems` means the items after the positional ones, or nothing if those are
        already covered. `anyOf`/`oneOf`, `if` and schema dependencies (and `contains`, for items)
        would make the evaluated set depend on which subschemas hold, so there they are not
        supported (`not` evaluates nothing: its complement is met after closing)."""
        if not isinstance(s, dict) or ("unevaluatedProperties" not in s and "unevaluatedItems" not in s):
            return s
        if "unevaluatedItems" in s and not isinstance(s["unevaluatedItems"], (bool, dict)):
            raise SchemaError("unevaluatedItems must be a boolean or an object (a schema)", _ptr(ptr, "unevaluatedItems"))
        for _ in range(MAX_SCHEMA_DEPTH):
            if "$ref" in s:
                s = self.inline_ref(s, ptr)
            elif "allOf" in s:
                s = self.merge_all_of(s, ptr)
                if s is None:
                    return {"not": {}}
            else:
                break
        else:
            raise GrammarLimitError(f"schema nested deeper than {MAX_SCHEMA_DEPTH} levels", pointer=ptr)
        s = dict(s)
        for kw in ("unevaluatedProperties", "unevaluatedItems"):
            if kw not in s:
                continue
            extra = s.pop(kw)
            blocker = next((k for k in ("anyOf", "oneOf", "contains", "if", "dependentSchemas", CONDITIONS) if k in s
                            and (k != "contains" or kw == "unevaluatedItems")), None)
            if blocker is None and _has_schema_dependencies(s):
                blocker = "dependencies"
            if blocker == "contains" and not any(k in s for k in ("anyOf", "oneOf", "if", CONDITIONS, MORE_CONTAINS)):
                # items that match `contains` are evaluated: the others (after the prefix) meet
                # `extra`, which the contains automaton reads (json_schema.contains_array)
                if "items" not in s and not (isinstance(s.get("items"), list) and "additionalItems" in s):
                    s[UNEVALUATED_ITEMS] = extra
                continue
            if blocker is not None:
                self.unsupported(kw, _ptr(ptr, kw), f"{kw} next to {blocker} (the evaluated "
                                 f"{'members' if kw == 'unevaluatedProperties' else 'items'} depend on which "
                                 "subschemas hold)")
                continue
            if kw == "unevaluatedProperties":
                if "additionalProperties" not in s:
                    s["additionalProperties"] = extra
            elif "prefixItems" not in s and isinstance(s.get("items"), list):
                s.setdefault("additionalItems", extra)   # the array form of `items`
            else:
                s.setdefault("items", extra)       # 2020-12: `items` follows `prefixItems`
        return s

    def object_names(self, schema: dict, ptr: str) -> tuple[Any, list[str]]:
        """(additionalProperties, the names the schema names), properties and required checked:
        names are the listed ones, the required ones and those a presence branch requires (strict
        mode closes the object to these; a named key's own schema is what JSON Schema gives it)."""
        props = schema.get("properties", {})
        if not isinstance(props, dict):
            raise SchemaError("properties must be an object", _ptr(ptr, "properties"))
        required = schema.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise SchemaError("required must be an array of strings", _ptr(ptr, "required"))
        addl = schema.get("additionalProperties", self.open_by_default(schema))
        named = [*required, *(k for group in schema.get(PRESENCE, ("", ()))[1] for k in group)]
        for kw in ("dependentRequired", "dependencies"):    # tracked members: named, so they can be counted
            spec = schema.get(kw)
            if isinstance(spec, dict):
                for a, need in spec.items():
                    if isinstance(need, dict) and set(need) - ANNOTATIONS <= {"required"}:
                        need = need.get("required", [])
                    if isinstance(need, list) and all(isinstance(b, str) for b in need):
                        named += [*need, a]
        return addl, list(props) + [r for r in dict.fromkeys(named) if r not in props]

    def named_members(self, schema: dict, ptr: str, names: list[str], allowed: Any, member_of,
                      name_ok=None) -> list | None:
        """(key, member rule, required) for each named key, its schema met with the patterns that
        claim it and ruled out by propertyNames or by `name_ok` (an excluded string in the key as
        written); `member_of(key, schema, pointer)` builds the member. None when a required member
        cannot be written."""
        props, required = schema.get("properties", {}), schema.get("required", [])
        addl_ptr = _ptr(ptr, "additionalProperties")
        claims = self.claimed_by_patterns(schema, names, ptr)
        entries: list[tuple[str, Expr, bool]] = []
        for k in names:
            if k in props:
                p = _ptr(ptr, "properties", k)
                own = props[k]
            else:
                p = addl_ptr
                own = schema.get("additionalProperties", True) if k not in claims else True
            for extra_schema in claims.get(k, ()):
                own = _both(own, extra_schema)
            if allowed is not None and not allowed.accepts(k):
                own = False     # propertyNames rules the key out, listed or not
            if name_ok is not None and not name_ok(k):
                own = False     # the key (as written) holds an excluded string
            member = member_of(k, own, p)
            if member is None:
                if k in required:
                    return None
                continue
            entries.append((k, member, k in required))
        return entries

    def object_of(self, schema: dict, ptr: str, d: int, entries: list, extra: Expr | None,
                  found: Expr | None = None) -> Expr | None:
        """The object of its named members and the member for the others (`extra`; `found`: one of
        them that must be there), under min/maxProperties, the dependencies and the presence
        branches."""
        lo = self.bound(schema, "minProperties", ptr, 0)
        hi = self.bound(schema, "maxProperties", ptr, None)
        if hi is not None and lo > hi:
            return self.nothing(f"minProperties is greater than maxProperties: {lo} > {hi}", ptr)
        needed = sum(req for _k, _m, req in entries)
        if hi is not None and needed > hi:
            return self.nothing(f"maxProperties is less than the number of required properties: {hi} < {needed}", ptr)
        most = len(entries) + (len(found[1]) if found is not None and found[2] else 0)
        if extra is None and (found is None or found[2]) and lo > most:
            return self.nothing("minProperties is greater than the number of properties, but additional properties "
                                f"aren't allowed: {lo} > {most}", ptr)
        deps = self.dependencies(schema, [k for k, _m, _r in entries], ptr)
        if deps is None:
            return None
        presence = None
        if PRESENCE in schema:
            mode, sets = schema[PRESENCE]
            index = {k: i for i, (k, _m, _r) in enumerate(entries)}
            # every key of a group is named, so one missing from the entries cannot appear at all
            presence = (mode, [{index[k] for k in group} for group in sets if all(k in index for k in group)])
        return self.members(entries, extra, lo, hi, d, ptr, deps, presence, found)

    def place_witness(self, schema: dict, rest: dict, ptr: str, d: int) -> Expr | None:
        """The first witness of `schema`'s `not` on each named member it fits, or among the others."""
        first, *others = leaves(schema["not"])
        if others:
            rest["not"] = others[0] if len(others) == 1 else {"anyOf": others}
        keys, value = self.witness(first, ptr)
        if value is _CANNOT:
            return self.unsupported("not", _ptr(ptr, "not"), "the value a 'not' asks a member to have has no "
                                    "positive form that can be enforced",
                                    fallback=self.lower({**rest, "type": "object"}, ptr, d))
        if value is False:
            return self.nothing("'not' asks for a member no value fits", _ptr(ptr, "not"))
        _addl, names = self.object_names(rest, ptr)
        alts = [self.lower(self.merge({**rest, "type": "object"}, {"required": [k], "properties": {k: value}}, ptr),
                           ptr, d) for k in names if keys.accepts(k)]
        alts.append(self.lower({**rest, "type": "object", FOUND: [*rest.get(FOUND, []), (keys, value)]}, ptr, d))
        return _choice(alts)

    def meet_witnesses(self, ws: list) -> tuple[KeyDFA, Any] | None:
        """One member meeting every witness in `ws`: keys in all their languages, value under all
        their schemas (None when no key is in all)."""
        keys, value = ws[0]
        for k2, v2 in ws[1:]:
            keys = intersect(keys, k2)
            value = _both(value, v2)
        return None if keys.is_empty() or value is False else (keys, value)

    def witness(self, leaf: dict, ptr: str) -> tuple[KeyDFA, Any]:
        """What ``not leaf`` asks of an object (json_negation.py): a member whose key is in the
        returned language and whose value meets the returned schema (or _CANNOT as the schema)."""
        where = _ptr(ptr, "not")
        universe = _key_dfa(Repeat(CharClass(((0, 0x10FFFF),)), 0, None))
        if "propertyNames" in leaf:
            names = self.key_language(leaf["propertyNames"], _ptr(where, "propertyNames"))
            return (_key_dfa(NEVER) if names is None else names.complement()), True
        if "patternProperties" in leaf and "additionalProperties" not in leaf:
            (pat, sub), = leaf["patternProperties"].items()
            dfa, _sub, _w = self.pattern_languages({"patternProperties": {pat: sub}}, where)[0]
            return dfa, self.complement(sub, _ptr(where, "patternProperties", pat))
        keys = universe
        listed = [k for k in leaf.get("properties", {})]
        if listed:
            keys = intersect(keys, _key_dfa(Choice(tuple(Literal(k) for k in listed))).complement())
        for dfa, _sub, _w in self.pattern_languages({"patternProperties": leaf.get("patternProperties", {})}, where):
            keys = intersect(keys, dfa.complement())
        return keys, self.complement(leaf["additionalProperties"], _ptr(where, "additionalProperties"))

    def obj(self, schema: dict, ptr: str, d: int) -> Expr | None:
        """An object written as JSON (XML-style arguments are the converter's `xml_obj`).

        Leaf negations under `not` each ask for a member that must exist (a *witness*): one of the
        named members whose key fits (that member then required, its value also under the
        witness's schema), or one of the others. The first is placed each way in turn and the
        rest recursively; those placed among the others wait in FOUND, and the others' run is then
        an automaton over which of them have been met (one member may meet several)."""
        if "not" in schema:
            rest = {k: v for k, v in schema.items() if k != "not"}
            return self.attempt(lambda: self.place_witness(schema, rest, ptr, d), "not", ptr,
                                lambda: self.lower({**rest, "type": "object"}, ptr, d))
        addl, names = self.object_names(schema, ptr)
        addl_ptr = _ptr(ptr, "additionalProperties")
        allowed = self.key_language(schema.get("propertyNames", True), _ptr(ptr, "propertyNames"))

        def member_of(k: str, own: Any, p: str) -> Expr | None:
            value = self.lower(own, p, d + 1)
            return None if value is None else self.add_rule(f"m_{k}", Seq((self.string_literal(k), self.colon(), value)))

        entries = self.named_members(schema, ptr, names, allowed, member_of,
                                     None if self.excl is None else self.excl.key_ok)
        if entries is None:
            return None
        extra = None
        wanted = schema.get(FOUND, [])
        if len(wanted) > MAX_FOUND:
            raise GrammarLimitError(f"more than {MAX_FOUND} members that must exist among the members the schema does "
                                    "not name", pointer=_ptr(ptr, "not"))
        kinds: dict[int, Expr] = {}     # subset of the wanted members met -> a member meeting them
        few = self.few_other_keys(schema, names, addl, ptr, allowed)
        if few is not None:
            # few other keys: each written at most once (a key twice is one member to a JSON reader)
            distinct: dict[str, dict[int, Expr]] = {}
            claims = self.claimed_by_patterns(schema, few, ptr)
            for key in few:
                if self.excl is not None and not self.excl.key_ok(key):
                    continue    # the key as written holds an excluded string
                own = True if key in claims else addl
                for sub in claims.get(key, ()):
                    own = _both(own, sub)
                per: dict[int, Expr] = {}
                for mask in range(1 << len(wanted)):
                    both = self.meet_witnesses([w for i, w in enumerate(wanted) if mask >> i & 1]) if mask else None
                    if mask and (both is None or not both[0].accepts(key)):
                        continue
                    member = member_of(key, own if not mask else _both(own, both[1]), addl_ptr)
                    if member is not None:
                        per[mask] = member
                if per:
                    distinct[key] = per
            return self.object_of(schema, ptr, d, entries, None,
                                  ((1 << len(wanted)) - 1, distinct, True) if distinct or wanted else None)
        if "patternProperties" in schema or "propertyNames" in schema:
            extra = self.key_regions(schema, names, addl, ptr, d, allowed)
            if extra is _CANNOT:
                return None
            for mask in range(1, 1 << len(wanted)):
                both = self.meet_witnesses([w for i, w in enumerate(wanted) if mask >> i & 1])
                if both is not None:
                    member = self.key_regions(schema, names, addl, ptr, d, allowed, both)
                    if member is not None:
                        kinds[mask] = member
            addl_value = None
        else:
            addl_value = self.lower(addl, addl_ptr, d + 1)
            for mask in range(1, 1 << len(wanted)):
                both = self.meet_witnesses([w for i, w in enumerate(wanted) if mask >> i & 1])
                if both is None or addl_value is None:
                    continue
                keys = both[0]
                if names:
                    keys = intersect(keys, _key_dfa(Choice(tuple(Literal(k) for k in names))).complement())
                if keys.is_empty():
                    continue
                value = self.lower(_both(addl, both[1]), addl_ptr, d + 1)
                if value is None:
                    continue
                if self.excl is None:
                    key = self.cached(("key", keys), "key", lambda keys=keys: to_rules(
                        keys, self.spell, self.new_name, self.rules))
                else:
                    key = self.cached(("key", keys), "key", lambda keys=keys: self.excluded(
                        lambda: self.excl.avoid_spelled(keys, self.spell, self.new_name, self.rules), addl_ptr))
                if key is not None:
                    kinds[mask] = self.add_rule("m_found", Seq((Literal('"'), key, Literal('"'), self.colon(), value)))
        found = ((1 << len(wanted)) - 1, kinds, False) if wanted else None
        if addl_value is not None and self.excl is not None:
            # a key that is none of the names and holds no excluded string (any free string without names)
            def other_key():
                return self.excluded(lambda: self.excl.avoid_dfa(
                    _excluding_dfa(names), self.new_name, self.rules,
                    lambda: _string_excluding(names, _REST, _WIDE_REST, lambda _hint, x: x)), addl_ptr)
            key = self.cached_or_none(("key_excluding", tuple(names)), "other_key", other_key) if names else self.string()
            extra = None if key is None else self.add_rule("m_other", Seq((key, self.colon(), addl_value)))
        elif addl_value is not None:
            rest = self.cached(("string_rest",), "string_rest", lambda: Seq((Repeat(CHAR, 0, None), Literal('"'))))
            wide = self.cached(("string_wide_rest",), "string_wide_rest",
                               lambda: Seq((CharClass(((0, 0x7F),), negated=True), rest)))
            key = self.cached(("key_excluding", tuple(names)), "other_key",
                              lambda: _string_excluding(names, rest, wide, self.add_rule))
            extra = self.add_rule("m_other", Seq((key, self.colon(), addl_value)))
        return self.object_of(schema, ptr, d, entries, extra, found)

    def found_run(self, extra: Expr | None, found: tuple[int, dict[int, Expr]], sep: Expr, lead: Expr | None,
                  lo: int, hi: int | None) -> Expr | None:
        """A run of the other members (the first after `lead`, or nothing when `lead` is None; the
        rest after `sep`), between max(lo, 1) and hi of them, that meets every wanted member:
        rules over (which have been met, how many members so far, capped at what the bounds need)."""
        need, kinds, distinct = found
        if distinct:
            return self.distinct_run(need, kinds, sep, lead, lo, hi)
        if not kinds or (hi is not None and hi < 1):
            return None
        cap = max(lo, 1) if hi is None else hi     # the first member (after `lead`) stays apart

        def body(state, met: int, c: int) -> Expr | None:
            nxt = min(c + 1, cap) if hi is None else c + 1
            alts: list[Expr | None] = []
            if met == need and c >= lo and c > 0:
                alts.append(EMPTY)
            if hi is None or c < hi:
                before = sep if c > 0 else (EMPTY if lead is None else lead)
                if extra is not None:
                    alts.append(Seq((before, extra, state(met, nxt))))
                alts += [Seq((before, member, state(met | mask, nxt))) for mask, member in kinds.items()
                         if mask & ~met]
            return _choice(alts)

        return state_rules(self.new_name, self.rules, "found", (0, 0), body)

    def distinct_run(self, need: int, keys: dict[str, dict[int, Expr]], sep: Expr, lead: Expr | None,
                     lo: int, hi: int | None) -> Expr | None:
        """The other members when their keys are few (`keys`: key -> {wanted members met: member}):
        rules over (keys written, wanted members met), each key at most once, between lo and hi
        members; empty only after `lead` (a member already written)."""
        order = list(keys)

        def body(state, used: int, met: int) -> Expr | None:
            n = used.bit_count()
            alts: list[Expr | None] = []
            if met == need and n >= lo and (n > 0 or lead is not None):
                alts.append(EMPTY)
            if hi is None or n < hi:
                before = sep if n else (EMPTY if lead is None else lead)
                for i, key in enumerate(order):
                    if not used >> i & 1:
                        alts += [Seq((before, member, state(used | 1 << i, met | mask)))
                                 for mask, member in keys[key].items()]
            return _choice(alts)

        return state_rules(self.new_name, self.rules, "others", (0, 0), body)

    def few_other_keys(self, schema: dict, names: list[str], addl: Any, ptr: str, allowed: KeyDFA | None):
        """The keys other members may have, when patternProperties/propertyNames leave only a few
        (at most MAX_DISTINCT_KEYS, and with additionalProperties false where no pattern
        matches), else None."""
        if "patternProperties" not in schema and "propertyNames" not in schema or self.any_order:
            return None
        pats = self.pattern_languages(schema, ptr)
        union = None
        for region, value_schema, _matched in self.regions(pats, addl, names, allowed,
                                                            Repeat(CharClass(((0, 0x10FFFF),)), 0, None)):
            if value_schema is False:
                continue
            union = region if union is None else intersect(union.complement(), region.complement()).complement()
        if union is None:
            return None
        if len(union.moves) > 4 * MAX_DISTINCT_KEYS * 16:
            return None
        keys = finite_strings(union, MAX_DISTINCT_KEYS)
        return keys or None

    def lower_allows_extra(self, schema: dict) -> bool:
        return schema.get("additionalProperties", self.open_by_default(schema)) is not False or \
            bool(schema.get("patternProperties"))

    def open_by_default(self, schema: dict) -> bool:
        """Whether members the schema does not name are allowed when it says nothing about them:
        strict_mode forbids them, but an object that names and bounds no member stays open, as in
        xgrammar (a tool's free-form parameters)."""
        return not self.strict or not any(k in schema for k in CLOSING)

    def dependencies(self, schema: dict, names: list[str], ptr: str) -> dict[int, set[int]] | None:
        """dependentRequired (and draft 4-7 `dependencies` in array form, or schema form holding only
        `required`) as entry indices: present a => present each b. None when a dependency names
        a property that cannot appear, which makes its trigger impossible only if required."""
        out: dict[int, set[int]] = {}
        index = {k: i for i, k in enumerate(names)}
        for kw in ("dependentRequired", "dependencies"):
            spec = schema.get(kw, {})
            if not isinstance(spec, dict):
                raise SchemaError(f"{kw} must be an object", _ptr(ptr, kw))
            for a, need in spec.items():
                where = _ptr(ptr, kw, a)
                if isinstance(need, dict) and set(need) - ANNOTATIONS <= {"required"}:
                    need = need.get("required", [])
                if need is True:
                    continue
                if not isinstance(need, list) or not all(isinstance(b, str) for b in need):
                    return self.unsupported(kw, where, f"{kw} with a schema cannot be enforced", fallback={})
                if a not in index or any(b not in index for b in need):
                    if a in schema.get("required", []) and any(b not in index for b in need):
                        return None
                    if a in index or self.lower_allows_extra(schema):
                        return self.unsupported(kw, where, f"{kw} involving a property that is not listed in "
                                                "properties cannot be enforced", fallback={})
                    continue  # the trigger can never be written
                out.setdefault(index[a], set()).update(index[b] for b in need if b != a)
        return out

    def members(self, entries: list[tuple[str, Expr, bool]], extra: Expr | None, lo: int, hi: int | None,
                d: int, ptr: str, deps: dict[int, set[int]] | None = None,
                presence: tuple[str, list[set[int]]] | None = None, found: Expr | None = None) -> Expr | None:
        """The object body as an automaton of rules over (what has been written, how many members).

        In schema order (the default), a state is the last named entry written; with `any_order`,
        the set of named entries written (additional members may then come anywhere). Counting
        members, for minProperties/maxProperties, stops at the largest bound that matters.
        `found`: (all, kinds) when members that must exist are among the others: `kinds` maps a
        set of them (bit mask) to a member meeting those; the others' run must meet `all`."""
        sep = self.sep(d)
        if found is not None and self.any_order:
            return self.unsupported("not", ptr, "'not' asking for a member among the unnamed ones, with any_order")
        n = len(entries)
        cap = hi if hi is not None else lo
        required = [i for i, (_k, _m, req) in enumerate(entries) if req]
        deps = deps or {}
        tracked = {i for a, bs in deps.items() for i in (a, *bs)}
        if presence is not None:
            tracked |= {i for group in presence[1] for i in group}

        def present_ok(written: int) -> bool:
            if presence is None:
                return True
            held = sum(all(written >> i & 1 for i in group) for group in presence[1])
            return held == 1 if presence[0] == "oneOf" else held >= 1
        if len(tracked) > MAX_TRACKED_DEPENDENCIES:
            raise GrammarLimitError(f"dependencies among more than {MAX_TRACKED_DEPENDENCIES} properties (at {ptr or '/'})")
        if self.any_order:
            states = (1 << n) * (cap + 1)
            if n > MAX_ANY_ORDER or states > MAX_OBJECT_STATES:
                raise GrammarLimitError(f"any_order object with {n} properties and property counts up to {cap} "
                                        f"needs more than {MAX_OBJECT_STATES} states (at {ptr or '/'})")
        elif n * (cap + 1) > MAX_OBJECT_STATES:
            raise GrammarLimitError(f"object with {n} properties and property counts up to {cap} needs more "
                                    f"than {MAX_OBJECT_STATES} states (at {ptr or '/'})")

        def clamp(c: int) -> int:
            return min(c, cap) if hi is None else c

        def room(c: int) -> bool:
            return hi is None or c < hi

        refs: dict[tuple[int, int, int], RuleRef] = {}
        pending: list[tuple[int, int, int]] = []
        skip_refs: dict[tuple[int, int, int], RuleRef] = {}
        skip_pending: list[tuple[int, int, int]] = []

        def state(key: tuple[int, int, int]) -> RuleRef:
            if key not in refs:
                refs[key] = RuleRef(self.new_name("tail"))
                pending.append(key)
            return refs[key]

        if self.any_order:
            def follow(mask: int, c: int, _w: int = 0) -> list[Expr | None]:
                alts: list[Expr | None] = []
                done = all(mask >> i & 1 for i in required) and c >= lo and present_ok(mask)
                if done and all(mask >> b & 1 for a, bs in deps.items() if mask >> a & 1 for b in bs):
                    alts.append(EMPTY)
                if room(c):
                    alts += [Seq((sep, entries[j][1], state((mask | 1 << j, clamp(c + 1), 0))))
                             for j in range(n) if not mask >> j & 1]
                    if extra is not None:
                        alts.append(Seq((sep, extra, state((mask, clamp(c + 1), 0)))))
                return alts

            first = [Seq((entries[j][1], state((1 << j, clamp(1), 0)))) for j in range(n)]
            if extra is not None:
                first.append(Seq((extra, state((0, clamp(1), 0)))))
        else:
            def nexts(i: int, c: int, written: int, lead: Expr | None) -> list[Expr | None]:
                """What may come after entry i (-1: nothing yet), with c members and the tracked
                entries `written`; `lead` is the separator (None before the first member)."""
                later = [r for r in required if r > i]
                owed = {b for a, bs in deps.items() if written >> a & 1 for b in bs if not written >> b & 1}
                alts: list[Expr | None] = []
                if not later and not owed and present_ok(written):
                    if found is not None:
                        run = self.found_run(extra, found, sep, lead, max(0, lo - c), None if hi is None else hi - c)
                        if run is not None:
                            alts.append(run)
                    elif extra is not None and (lead is not None or c < (hi if hi is not None else c + 1)):
                        more_min = max(0, lo - c)
                        more_max = None if hi is None else hi - c
                        if lead is not None:
                            alts.append(Repeat(Seq((sep, extra)), more_min, more_max))
                        elif more_max is None or more_max > 0:
                            alts.append(Seq((extra, Repeat(Seq((sep, extra)), max(0, more_min - 1),
                                                           None if more_max is None else more_max - 1))))
                    elif c >= lo and lead is not None:
                        alts.append(EMPTY)
                if room(c) and i + 1 < n:
                    alts.append(_seq(lead or EMPTY, skips((i + 1, c, written))))
                return alts

            def skip_chain(j: int, c: int, written: int) -> list[Expr | None]:
                """The next entry written is j or a later one: j and what may follow it, or (when j
                may be left out) the same choice from j + 1 on. A chain of one rule per entry,
                rather than a state per entry that lists every later entry, keeps an object's
                grammar linear in its member count."""
                alts: list[Expr | None] = []
                if not any(b < j and not written >> b & 1 for b in deps.get(j, ())):
                    now = written | (1 << j if j in tracked else 0)
                    alts.append(_seq(entries[j][1], _choice(nexts(j, clamp(c + 1), now, sep))))
                owed = any(written >> a & 1 and not written >> j & 1 for a, bs in deps.items() if j in bs)
                if j + 1 < n and not entries[j][2] and not owed:     # a required or owed entry cannot be skipped
                    alts.append(skips((j + 1, c, written)))
                return alts

            def skips(key: tuple[int, int, int]) -> Expr:
                if key not in skip_refs:
                    skip_refs[key] = RuleRef(self.new_name("members"))
                    skip_pending.append(key)
                return skip_refs[key]

            first = nexts(-1, 0, 0, None)
        if hi == 0:
            first = []
        k = 0
        while k < len(pending):  # building one state's body may create others
            key = pending[k]
            self.rules.append(Rule(refs[key].name, _choice(follow(*key)) or NEVER))
            k += 1
        k = 0
        while k < len(skip_pending):
            skey = skip_pending[k]
            self.rules.append(Rule(skip_refs[skey].name, _choice(skip_chain(*skey)) or NEVER))
            k += 1
        out: list[Expr | None] = []
        body = _choice(first)
        if body is not None:
            out.append(_seq(self.open("{", d), body, self.close("}", d)))
        if not required and lo == 0 and present_ok(0) and (found is None or found[0] == 0):
            out.append(self.empty("{}", d))
        return _choice(out)

    def pattern_languages(self, schema: dict, ptr: str) -> list[tuple[KeyDFA, Any, str]]:
        pats = schema.get("patternProperties", {})
        if not isinstance(pats, dict):
            raise SchemaError("patternProperties must be an object", _ptr(ptr, "patternProperties"))
        if len(pats) > MAX_KEY_PATTERNS:
            raise GrammarLimitError(f"more than {MAX_KEY_PATTERNS} patternProperties", pointer=_ptr(ptr, "patternProperties"))
        out = []
        for pat, sub in pats.items():
            where = _ptr(ptr, "patternProperties", pat)
            try:
                out.append((_key_dfa(regex_to_expr(pat, search=True)), sub, where))
            except GrammarLimitError:
                raise
            except GrammarError as exc:
                raise SchemaError(f"pattern {pat!r}: {exc}", where) from None
        return out

    def claimed_by_patterns(self, schema: dict, names: list[str], ptr: str) -> dict[str, list]:
        """Per named key, the patternProperties schemas whose pattern matches it (they apply too)."""
        claims: dict[str, list] = {}
        for dfa, sub, _where in self.pattern_languages(schema, ptr):
            for k in names:
                if dfa.accepts(k):
                    claims.setdefault(k, []).append(sub)
        return claims

    def regions(self, pats: list, addl: Any, names: list[str], allowed: KeyDFA | None, universe: Expr | KeyDFA):
        """(region, its value schema, whether a pattern matched it) for each non-empty region of
        the keys in `universe` other than `names` (within propertyNames), split by the patterns
        that match them: a region's value is the conjunction of its patterns' schemas, or
        additionalProperties where none matches (regions need intersections and complements, see
        regular.py)."""
        base = universe if isinstance(universe, KeyDFA) else _key_dfa(universe)
        if names:
            base = intersect(base, _key_dfa(Choice(tuple(Literal(k) for k in names))).complement())
        if allowed is not None:
            base = intersect(base, allowed)
        for picked in range(1 << len(pats)):
            region = base
            schemas = []
            for i, (dfa, sub, _where) in enumerate(pats):
                region = intersect(region, dfa if picked >> i & 1 else dfa.complement())
                if picked >> i & 1:
                    schemas.append(sub)
            if region.is_empty():
                continue
            value_schema = addl if not schemas else schemas[0]
            for sub in schemas[1:]:
                value_schema = _both(value_schema, sub)
            yield region, value_schema, bool(schemas)

    def key_regions(self, schema: dict, names: list[str], addl: Any, ptr: str, d: int, allowed: KeyDFA | None,
                    witness: tuple[KeyDFA, Any] | None = None):
        """Members whose key is not a named property: the keys split into regions by which
        patterns match them (regions need intersections and complements, see regular.py), each
        region's value under the conjunction of its patterns' schemas, or additionalProperties
        where none matches; all keys restricted by propertyNames. _CANNOT when a named required
        key is ruled out by propertyNames. With `witness` (keys, schema): only those keys, the
        values also under that schema."""
        pats = self.pattern_languages(schema, ptr)
        if allowed is not None:
            required = schema.get("required", [])
            if any(not allowed.accepts(k) for k in required):
                return _CANNOT
        members: list[Expr] = []
        universe = Repeat(CharClass(((0, 0x10FFFF),)), 0, None) if witness is None else witness[0]
        for region, value_schema, matched in self.regions(pats, addl, names, allowed, universe):
            if witness is not None:
                value_schema = _both(value_schema, witness[1])
            value = self.lower(value_schema, ptr if matched else _ptr(ptr, "additionalProperties"), d + 1)
            if value is None:
                continue
            # one key rule per key language: objects with the same patterns share its mask entries
            def keys(r=region):
                if self.excl is None:
                    return to_rules(r, self.spell, self.new_name, self.rules)
                return self.excluded(lambda: self.excl.avoid_spelled(r, self.spell, self.new_name, self.rules),
                                     ptr)
            key = self.cached(("key", region), "key", keys)
            members.append(Seq((Literal('"'), key, Literal('"'), self.colon(), value)))
        return self.add_rule("m_found" if witness else "m_other", _choice(members)) if members else None

    def key_language(self, names_schema: Any, ptr: str) -> KeyDFA | None:
        """The keys `propertyNames` allows, as an automaton (None: every key)."""
        if names_schema is True or names_schema == {}:
            return None
        if names_schema is False:
            return _key_dfa(NEVER)
        if not isinstance(names_schema, dict):
            raise SchemaError("propertyNames must be an object or a boolean (a schema)", ptr)
        if "$ref" in names_schema:
            names_schema = self.inline_ref(names_schema, ptr)
        parts: list[Expr] = []
        out = None
        for k, v in names_schema.items():
            if k in ANNOTATIONS:
                continue
            if k == "allOf" and isinstance(v, list):    # as merged allOf members leave it
                self.enter(ptr)
                try:
                    for i, sub in enumerate(v):
                        dfa = self.key_language(sub, _ptr(ptr, "allOf", i))
                        if dfa is not None:
                            out = dfa if out is None else intersect(out, dfa)
                finally:
                    self.level -= 1
                continue
            if k in ("not", "anyOf"):
                # keys are strings: `not` is the complement among them, `anyOf` the union
                self.enter(ptr)
                try:
                    subs = [self.key_language(sub, _ptr(ptr, k, *([i] if k == "anyOf" else [])))
                            for i, sub in enumerate(v if k == "anyOf" and isinstance(v, list) else [v])]
                finally:
                    self.level -= 1
                every = _key_dfa(Repeat(CharClass(((0, 0x10FFFF),)), 0, None))
                if k == "not":
                    dfa = _key_dfa(NEVER) if subs[0] is None else subs[0].complement()
                elif any(x is None for x in subs):
                    continue
                else:
                    none = every
                    for x in subs:
                        none = intersect(none, x.complement())
                    dfa = none.complement()
                out = dfa if out is None else intersect(out, dfa)
                continue
            if k == "type":
                if "string" not in ([v] if isinstance(v, str) else v):
                    return _key_dfa(NEVER)
            elif k in ("enum", "const"):
                values = v if k == "enum" else [v]
                parts.append(_choice([Literal(x) for x in values if isinstance(x, str)]) or NEVER)
            elif k == "pattern":
                parts.append(regex_to_expr(v, search=True))
            elif k == MORE_STRINGS:
                for more in v:
                    (kk, vv), = more.items()
                    fx = regex_to_expr(vv, search=True) if kk == "pattern" else self.format_of(vv)
                    if fx is not None:
                        parts.append(fx)
            elif k == "format":
                fx = self.format_of(v)
                if fx is not None:
                    parts.append(fx)
            elif k in ("minLength", "maxLength"):
                lo = self.bound(names_schema, "minLength", ptr, 0)
                hi = self.bound(names_schema, "maxLength", ptr, None)
                parts.append(Repeat(CharClass(((0, 0x10FFFF),)), lo, hi))
            else:
                return self.unsupported(k, _ptr(ptr, k), f"propertyNames keyword {k!r} cannot be enforced")
        for part in parts:
            dfa = _key_dfa(part)
            out = dfa if out is None else intersect(out, dfa)
        return out
