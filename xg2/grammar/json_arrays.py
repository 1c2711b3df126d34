"""JSON Schema arrays: positional items, counts, `contains` with its bounds, `uniqueItems`.

A mixin of the converter (json_schema._Converter), split off along the array seam. Plain arrays
are a prefix of positional items and a repetition of the rest; `contains` and `uniqueItems` make
the array an automaton written as rules (json_common.state_rules) over how many items matched
or which values have been written.
"""

from __future__ import annotations

from typing import Any

from ..errors import GrammarLimitError, SchemaError
from .ir import Expr, Repeat, RuleRef, Seq
from .ir import choice as _choice
from .ir import seq as _seq
from .json_common import (
    _CANNOT,
    EMPTY,
    MORE_CONTAINS,
    UNEVALUATED_ITEMS,
    _listed_values,
    _opt,
    _ptr,
    state_rules,
)
from .schema_merge import both as _both
from .validator import json_equal

#: Most values items may take for uniqueItems to be enforced (rules over subsets: 2**n).
MAX_UNIQUE_VALUES = 10

#: Most (position, count) states of an array under `contains`.
MAX_CONTAINS_STATES = 4096


class ArrayLowering:
    """The array half of the converter; see the module notes."""

    def finite_values(self, s: Any, ptr: str) -> list | None:
        """Every value of `s` when they are few (listed, or only booleans and null), else None."""
        s = self.flatten(s, ptr)
        if s is False:
            return []
        if s is True or not isinstance(s, dict):
            return None
        values, _where = _listed_values(s, ptr)
        if values is None:
            if not set(self.types(s, ptr)) <= {"boolean", "null"}:
                return None
            values = [True, False, None]
        checker = self.checker()
        out: list = []
        for v in values:
            if checker.valid(v, s, ptr) and not any(json_equal(v, w) for w in out):
                out.append(v)
        return out if len(out) <= MAX_UNIQUE_VALUES else None

    def unique_array(self, schema: dict, prefix: list, rest: Any, lo: int, hi: int | None, ptr: str, d: int):
        """uniqueItems over items that take few values: rules over which values have been written
        (each at most once). _CANNOT after the typed error in lenient mode (the array is then
        lowered without it)."""
        where = _ptr(ptr, "uniqueItems")
        values = None if prefix or "contains" in schema or self.xml_at(d) else self.finite_values(rest, ptr)
        if values is None:
            self.unsupported("uniqueItems", where, "uniqueItems is enforced where the items take at most "
                             f"{MAX_UNIQUE_VALUES} values (listed, booleans, null) and there are no "
                             "prefixItems or contains")
            return _CANNOT
        if hi is None or hi > len(values):
            hi = len(values)
        if lo > hi:
            return self.nothing(f"minItems {lo} with uniqueItems, but the items take only {len(values)} values",
                                ptr)
        items = [self.add_rule("item", self.const(v, d + 1, ptr)) for v in values]

        def body(state, used: int) -> Expr | None:
            n = used.bit_count()
            alts: list[Expr | None] = [EMPTY] if n and n >= lo else []
            if n < hi:
                lead = self.sep(d) if n else EMPTY
                alts += [_seq(lead, item, state(used | 1 << i)) for i, item in enumerate(items)
                         if item is not None and not used >> i & 1]
            return _choice(alts)

        start = state_rules(self.new_name, self.rules, "unique_items", (0,), body)
        out: list[Expr | None] = [_seq(self.open("[", d), start, self.close("]", d))] if hi > 0 else []
        if lo == 0:
            out.append(self.empty("[]", d))
        return _choice(out)

    def contains_array(self, group: dict, prefix: list, prefix_ptr: str, rest: Any, rest_ptr: str, lo: int,
                       hi: int | None, ptr: str, d: int, uneval: Any = None) -> Expr | None:
        """An array under `contains` with minContains/maxContains: rules over (items written, items
        matching counted up to what the bounds need). Each position's schema splits into its
        matching values and, when there is a maximum, the others (the complement of `contains`);
        without one any item may be read as not matching, so at least the minimum really match.
        `uneval` (unevaluatedItems): what an item after the prefix that does not match must meet."""
        where = _ptr(ptr, "contains")
        want = group["contains"]
        mn = self.bound(group, "minContains", ptr, 1)
        mx = self.bound(group, "maxContains", ptr, None)
        if mx is not None and mn > mx:
            return self.nothing(f"minContains is greater than maxContains: {mn} > {mx}", ptr)
        other = True
        if mx is not None:
            other = self.complement(want, where)
            if other is _CANNOT:
                relaxed = {x: v for x, v in group.items() if x != "maxContains"}
                return self.unsupported("maxContains", _ptr(ptr, "maxContains"), "maxContains of a schema whose "
                                        "complement has no positive form that can be enforced",
                                        fallback=self.contains_array(relaxed, prefix, prefix_ptr, rest, rest_ptr,
                                                                     lo, hi, ptr, d, uneval))
        k = len(prefix)
        cap = mn if mx is None else mx
        last = max(k, lo, 1) if hi is None else hi     # positions from `last` on are alike (hi: none left)
        if (last + 1) * (cap + 1) > MAX_CONTAINS_STATES:
            raise GrammarLimitError(f"contains on an array with {last} counted positions and counts up to {cap} "
                                    f"needs more than {MAX_CONTAINS_STATES} states", pointer=where)
        items: dict[tuple[int, bool], Expr | None] = {}

        def item(p: int, match: bool) -> Expr | None:
            at = min(p, k)
            if (at, match) not in items:
                base, bp = (prefix[at], _ptr(prefix_ptr, at)) if at < k else (rest, rest_ptr)
                both = _both(base, want if match else other)
                if not match and at >= k and uneval is not None:
                    both = _both(both, uneval)
                items[at, match] = self.add_rule("item", self.lower(both, bp, d + 1)) if both is not False else None
            return items[at, match]

        def body(state, p: int, c: int) -> Expr | None:
            def at(p2: int, c2: int) -> RuleRef:
                return state(min(p2, last) if hi is None else p2, c2)

            alts: list[Expr | None] = []
            if p > 0 and p >= lo and c >= mn:
                alts.append(EMPTY)
            if hi is None or p < hi:
                lead = self.sep(d) if p > 0 else EMPTY
                w = item(p, True)
                if w is not None and (mx is None or c < mx):
                    alts.append(_seq(lead, w, at(p + 1, min(c + 1, cap))))
                n = item(p, False)
                if n is not None:
                    alts.append(_seq(lead, n, at(p + 1, c)))
            return _choice(alts)

        start = state_rules(self.new_name, self.rules, "contains_items", (0, 0), body)
        out: list[Expr | None] = [_seq(self.open("[", d), start, self.close("]", d))]
        if lo == 0 and mn == 0:
            out.append(self.empty("[]", d))
        return _choice(out)

    def array(self, schema: dict, ptr: str, d: int) -> Expr | None:
        items = schema.get("items")
        if "prefixItems" in schema:
            prefix = schema["prefixItems"]
            prefix_ptr = _ptr(ptr, "prefixItems")
            rest = items if "items" in schema else (not self.strict)
            rest_ptr = _ptr(ptr, "items")
        elif isinstance(items, list):
            prefix, prefix_ptr = items, _ptr(ptr, "items")
            rest = schema.get("additionalItems", not self.strict)
            rest_ptr = _ptr(ptr, "additionalItems")
        else:
            prefix, prefix_ptr = [], ""
            rest = items if "items" in schema else True
            rest_ptr = _ptr(ptr, "items")
        if not isinstance(prefix, list):
            raise SchemaError("prefixItems must be an array", prefix_ptr)
        for i, s in enumerate(prefix):
            if not isinstance(s, (dict, bool)):
                raise SchemaError(f"{prefix_ptr.rsplit('/', 1)[-1]} must be an array of objects or booleans "
                                  "(each one a schema)", _ptr(prefix_ptr, i))
        if not isinstance(rest, (dict, bool)):
            raise SchemaError(f"{rest_ptr.rsplit('/', 1)[-1]} must be a boolean or an object (a schema)", rest_ptr)
        lo = self.bound(schema, "minItems", ptr, 0)
        hi = self.bound(schema, "maxItems", ptr, None)
        if self.xml_at(d):
            # items are elements; a style that cannot write unconstrained values leaves an array
            # that says nothing of its items empty (as xgrammar does)
            if self.xml.names is None and rest is True and "items" not in schema and "additionalItems" not in schema:
                rest = False
            item = self.xml_element
        else:
            def item(_name, s, p, depth):
                return self.lower(s, p, depth)
        if schema.get("uniqueItems") is True:
            out = self.unique_array(schema, prefix, rest, lo, hi, ptr, d)
            if out is not _CANNOT:
                return out
        groups = [*([{g: schema[g] for g in ("contains", "minContains", "maxContains") if g in schema}]
                    if "contains" in schema else []), *schema.get(MORE_CONTAINS, [])]
        uneval = schema.get(UNEVALUATED_ITEMS)
        if uneval is None:      # with unevaluatedItems even minContains 0 matters: it evaluates
            groups = [g for g in groups if not (g.get("minContains", 1) == 0 and "maxContains" not in g)]
        if groups:
            if self.xml_at(d) or len(groups) > 1:
                self.unsupported("contains", _ptr(ptr, "contains"), "more than one contains on one array"
                                 if len(groups) > 1 else "contains in an XML style")
            else:
                return self.contains_array(groups[0], prefix, prefix_ptr, rest, rest_ptr, lo, hi, ptr, d, uneval)
        elems: list[Expr | None] = []
        for i, s in enumerate(prefix):
            e = item(None, s, _ptr(prefix_ptr, i), d + 1)
            elems.append(self.add_rule("item", e))
        r = self.add_rule("item", item(None, rest, rest_ptr, d + 1))
        # the longest allowed array: stop at the first unsatisfiable position
        cap = hi
        for i, e in enumerate(elems):
            if e is None:
                cap = i if cap is None else min(cap, i)
                break
        if r is None:
            cap = len(elems) if cap is None else min(cap, len(elems))
        if cap is not None and lo > cap:
            if hi is not None and lo > hi:
                return self.nothing(f"minItems is greater than maxItems: {lo} > {hi}", ptr)
            if r is None and cap == len(elems):
                return self.nothing("minItems is greater than the number of prefixItems, but additional items are "
                                    f"not allowed: {lo} > {len(elems)}", ptr)
            return self.nothing(f"minItems is {lo}, but item {cap} accepts no value", _ptr(prefix_ptr, cap))
        sep = self.sep(d)
        k = min(len(elems), cap) if cap is not None else len(elems)
        # rest part after the prefix
        if r is not None and (cap is None or cap > k):
            more_min = max(lo - k, 0)
            more_max = None if cap is None else cap - k
            if k == 0:
                first = _seq(r, Repeat(Seq((sep, r)), max(more_min - 1, 0), None if more_max is None else more_max - 1))
                nonempty = first
            else:
                nonempty = None
            rest_tail = Repeat(Seq((sep, r)), more_min, more_max)
        else:
            nonempty = None
            rest_tail = EMPTY
        if k > 0:
            tail_expr: Expr = rest_tail
            for i in range(k - 1, 0, -1):
                step = _seq(sep, elems[i], tail_expr)
                tail_expr = step if i < lo else _opt(step)
                if i % 50 == 0:
                    tail_expr = self.add_rule("items_tail", tail_expr)
            nonempty = _seq(elems[0], tail_expr)
        out: list[Expr | None] = []
        if nonempty is not None and (cap is None or cap > 0):
            out.append(_seq(self.open("[", d), nonempty, self.close("]", d)))
        if lo == 0:
            out.append(self.empty("[]", d))
        return _choice(out)
