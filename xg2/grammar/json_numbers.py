"""JSON Schema numbers: integers and numbers under bounds, `multipleOf` and `not`.

A mixin of the converter (json_schema._Converter), split off along the number seam: the
languages themselves are built digit by digit in numbers.py; this part reads the keywords,
chooses between listing values, remainder automata and ranges, and meets integers with what
`not` excludes (json_negation.py's leaves) on automata (regular.py).
"""

from __future__ import annotations

import json
import math

from ..errors import GrammarLimitError, SchemaError
from .alternation import MAX_INLINE_CHARS, factor_literals
from .ir import CharClass, Choice, Expr, Literal, Repeat, Seq
from .ir import choice as _choice
from .json_common import ANNOTATIONS, _ptr
from .json_negation import leaves
from .json_object import _key_dfa
from .numbers import INTEGER, NUMBER, decimal_places, decimal_range, int_multiple, int_range, to_decimal
from .regular import intersect, residue_dfa, to_rules

#: Most integers listed for a bounded range under `not` (beyond it: a remainder automaton).
MAX_LISTED_INTEGERS = 4096

#: Largest modulus of the remainder automaton for integers under `not`.
MAX_DIVISOR = 2048

#: Numbers that are not integers, in plain decimal notation (a fraction with a non-zero digit;
#: with SHORT_DECIMAL, few enough digits that a double reads it as no integer either).
NON_INTEGER = Seq((Repeat(Literal("-"), 0, 1), Choice((Literal("0"), Seq((CharClass(((0x31, 0x39),)),
                  Repeat(CharClass(((0x30, 0x39),)), 0, None))))), Literal("."), Repeat(CharClass(((0x30, 0x39),)), 0, None),
                  CharClass(((0x31, 0x39),)), Repeat(CharClass(((0x30, 0x39),)), 0, None)))

#: At most 15 significant digits: a double keeps such a fraction apart from every integer, so
#: validators that read numbers as doubles agree that it is not one.
SHORT_DECIMAL = Seq((Repeat(Literal("-"), 0, 1), Repeat(CharClass(((0x2E, 0x2E), (0x30, 0x39))), 1, 16)))

#: `integers_as_numbers`: a zero fraction, and a non-negative exponent, after an integer.
_DIGIT = CharClass(((0x30, 0x39),))

ZERO_FRACTION = Repeat(Seq((Literal("."), Repeat(Literal("0"), 1, None))), 0, 1)

NONNEGATIVE_EXPONENT = Repeat(Seq((CharClass(((0x45, 0x45), (0x65, 0x65))), Repeat(Literal("+"), 0, 1),
                                   Repeat(_DIGIT, 1, None))), 0, 1)

def _decimal_lcm(a: float, b: float) -> float | int:
    """The least common multiple of two positive decimals (exact: both scaled to integers), as an
    int when it is whole and otherwise as the float whose shortest spelling it is."""
    x, y = to_decimal(a), to_decimal(b)
    places = max(-x.as_tuple().exponent, -y.as_tuple().exponent, 0)
    scale = 10 ** places
    out = to_decimal(math.lcm(int(x * scale), int(y * scale))) / scale
    return int(out) if out == out.to_integral_value() else float(out)

def _integer_step(step) -> int:
    """The integers that are multiples of p/q are the multiples of p / gcd(p, q)."""
    num, den = step.as_integer_ratio()
    return num // math.gcd(num, den)


class NumberLowering:
    """The number half of the converter; see the module notes."""

    def numeric_bounds(self, schema: dict, ptr: str):
        """(lo, lo_inclusive, hi, hi_inclusive) as exact decimals, from the draft 6+ keywords and the
        draft 4 boolean `exclusiveMinimum`/`exclusiveMaximum`."""
        def num(k):
            v = schema[k]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v)):
                raise SchemaError(f"{k} must be a finite number", _ptr(ptr, k))
            return to_decimal(v)

        lo = hi = None
        lo_incl = hi_incl = True
        if "minimum" in schema:
            lo, lo_incl = num("minimum"), schema.get("exclusiveMinimum") is not True
        if "maximum" in schema:
            hi, hi_incl = num("maximum"), schema.get("exclusiveMaximum") is not True
        if not isinstance(schema.get("exclusiveMinimum", False), bool):
            v = num("exclusiveMinimum")
            if lo is None or v >= lo:
                lo, lo_incl = v, False
        if not isinstance(schema.get("exclusiveMaximum", False), bool):
            v = num("exclusiveMaximum")
            if hi is None or v <= hi:
                hi, hi_incl = v, False
        return lo, lo_incl, hi, hi_incl

    def multiple_of(self, schema: dict, ptr: str):
        if "multipleOf" not in schema:
            return None
        v = schema["multipleOf"]
        where = _ptr(ptr, "multipleOf")
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise SchemaError(f"multipleOf {json.dumps(v)} is no number (Value must be a number)", where)
        if not math.isfinite(v):
            raise SchemaError("multipleOf must be a finite number", where)
        if v <= 0:
            raise SchemaError(f"multipleOf must be greater than 0, not {v}", where)
        return to_decimal(v)

    def integer(self, schema: dict, ptr: str) -> Expr | None:
        """Integers under the schema's bounds, multipleOf and `not`: canonical, or with
        `integers_as_numbers` also with a zero fraction (``3.0``), and, when nothing bounds them,
        with a non-negative exponent (``1e2``, ``1.0E+3``): spellings whose value is integral."""
        out = self._integer(schema, ptr)
        if out is None or not self.integers_as_numbers:
            return out
        plain = not any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                              "multipleOf", "not"))
        return Seq((out, ZERO_FRACTION, *([NONNEGATIVE_EXPONENT] if plain else [])))

    def _integer(self, schema: dict, ptr: str) -> Expr | None:
        lo, lo_incl, hi, hi_incl = self.numeric_bounds(schema, ptr)
        ilo = None if lo is None else (math.floor(lo) + 1 if not lo_incl and lo == math.floor(lo) else math.ceil(lo))
        ihi = None if hi is None else (math.ceil(hi) - 1 if not hi_incl and hi == math.ceil(hi) else math.floor(hi))
        step = self.multiple_of(schema, ptr)
        if step is not None and step != step.to_integral_value():
            step = to_decimal(_integer_step(step))
        if "not" in schema:
            return self.integer_excluding(ilo, ihi, 1 if step is None else int(step), leaves(schema["not"]), ptr)
        if step is None or step == 1:
            if ilo is None and ihi is None:
                return self.cached(("integer",), "integer", lambda: INTEGER)
            return int_range(ilo, ihi)
        try:
            out = int_multiple(int(step), ilo, ihi, self.new_name, self.rules)
            return out if out is not None else self.nothing(
                f"no integer in [{ilo}, {ihi}] is a multiple of {step} (the range contains no multipleOf value)", _ptr(ptr, "multipleOf"))
        except ValueError:
            # bounds away from zero: the remainder automaton met with the range's (integer_excluding)
            return self.integer_excluding(ilo, ihi, int(step), [], ptr)

    def integer_excluding(self, lo: int | None, hi: int | None, step: int, excluded: list[dict],
                          ptr: str) -> Expr | None:
        """Canonical integers in [lo, hi], multiples of `step`, and none of the `excluded` leaves
        (`multipleOf`, integer `enum`/`const`): listed when few, else a remainder automaton met
        with the range's and the listed values' automata (regular.py)."""
        banned: set[int] = set()
        moduli: list[int] = []
        for leaf in excluded:
            (k, v), = ((k, v) for k, v in leaf.items() if k not in ANNOTATIONS)
            if k == "multipleOf":
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                    raise SchemaError("multipleOf must be a number greater than 0", _ptr(ptr, "not", "multipleOf"))
                moduli.append(_integer_step(to_decimal(v)))
            else:
                banned.update(int(x) for x in (v if k == "enum" else [v]))
        if 1 in moduli:
            return self.nothing("'not' of a multipleOf every integer meets", _ptr(ptr, "not"))

        def ok(x: int) -> bool:
            return x % step == 0 and x not in banned and all(x % m for m in moduli)

        if lo is not None and hi is not None and (hi - lo) // step <= MAX_LISTED_INTEGERS:
            first = -(-lo // step) * step
            alts = [Literal(str(x)) for x in range(first, hi + 1, step) if ok(x)]
            return _choice(factor_literals(alts, self.add_rule, MAX_INLINE_CHARS)) if alts else self.nothing(
                f"no integer in [{lo}, {hi}] meets multipleOf and 'not'", ptr)
        modulus = math.lcm(step, *moduli)
        if modulus > MAX_DIVISOR:
            kw = "not" if excluded else "multipleOf"
            return self.unsupported(kw, _ptr(ptr, kw), f"multipleOf over a wide range needs remainders modulo "
                                    f"{modulus}, more than {MAX_DIVISOR}", fallback=int_range(lo, hi))
        try:
            dfa = residue_dfa(modulus, lambda r: r % step == 0 and all(r % m for m in moduli))
            if lo is not None or hi is not None:
                rng = int_range(lo, hi)
                if rng is None:
                    return None
                dfa = intersect(dfa, _key_dfa(rng))
            if banned:
                spelled = [str(x) for x in sorted(banned)] + (["-0"] if 0 in banned else [])
                dfa = intersect(dfa, _key_dfa(Choice(tuple(Literal(t) for t in spelled))).complement())
        except GrammarLimitError as exc:
            raise GrammarLimitError(f"{exc.message} (integers under 'not')", pointer=ptr) from None
        return self.cached_or_none(("integer_automaton", dfa), "integer",
                                   lambda: to_rules(dfa, lambda cc: cc, self.new_name, self.rules))

    def number(self, schema: dict, ptr: str) -> Expr | None:
        lo, lo_incl, hi, hi_incl = self.numeric_bounds(schema, ptr)
        step = self.multiple_of(schema, ptr)
        bounded = lo is not None or hi is not None
        if "not" in schema and (step is None or step == step.to_integral_value()):
            # the integers apart (integer() reads the leaves), then the numbers that are not
            # integers, which no integer multipleOf or integer enum excludes
            for leaf in leaves(schema["not"]):
                v = leaf.get("multipleOf", 1)
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and \
                        to_decimal(v) != to_decimal(v).to_integral_value():
                    return self.unsupported("not", _ptr(ptr, "not"), "'not' of a fractional multipleOf on numbers",
                                            fallback=self.number({k: x for k, x in schema.items() if k != "not"}, ptr))
            ints = self.integer(schema, ptr)
            if step is not None:
                return ints
            rng = decimal_range(lo, lo_incl, hi, hi_incl) if bounded else None
            if bounded and rng is None:
                return ints

            def fractions():
                dfa = intersect(_key_dfa(NON_INTEGER), _key_dfa(SHORT_DECIMAL))
                return to_rules(dfa if rng is None else intersect(dfa, _key_dfa(rng)), lambda cc: cc,
                                self.new_name, self.rules)
            return _choice([ints, self.cached_or_none(("fractions", lo, lo_incl, hi, hi_incl), "fraction", fractions)])
        if step is not None and step == step.to_integral_value():
            return self.integer(schema, ptr)  # a number that is a multiple of an integer is an integer
        if step is not None:
            places = -step.normalize().as_tuple().exponent
            if step.normalize() == to_decimal(10) ** -places and not bounded:
                return decimal_places(places)
            fallback = decimal_range(lo, lo_incl, hi, hi_incl) if bounded else NUMBER
            return self.unsupported("multipleOf", _ptr(ptr, "multipleOf"),
                                    "multipleOf on numbers is enforced only for powers of ten without bounds",
                                    fallback=fallback)
        if not bounded:
            return self.cached(("number",), "number", lambda: NUMBER)
        return decimal_range(lo, lo_incl, hi, hi_incl)
