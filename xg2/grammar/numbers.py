"""Languages of JSON numbers with exact numeric constraints (JSON Schema bounds and `multipleOf`).

Bounds are enforced on the value, not approximated by digit counts: the grammar for `[lo, hi]` is
built digit by digit from the decimal expansions of the bounds, the way one writes a regex for a
numeric range by hand. Integers are written canonically (no leading zeros, no fraction, no exponent,
`-0` allowed). A bounded `number` is written in plain decimal notation (`-12.50`, not `1.25e1`):
with an exponent the same value has unboundedly many spellings whose digits no longer line up with
the bounds; this is the documented restriction.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from ..errors import GrammarLimitError
from .ir import CharClass, Choice, Expr, Literal, Repeat, Rule, RuleRef, Seq
from .ir import choice as _choice
from .ir import seq as _seq

#: Largest number of decimal digits in a bound.
MAX_BOUND_DIGITS = 400
#: Largest `multipleOf` divisor enforced with a remainder automaton (one rule per remainder).
MAX_DIVISOR = 1024
#: Largest number of values enumerated for a bounded `multipleOf`.
MAX_ENUMERATED = 2048

EMPTY = Literal("")
DIGIT = CharClass(((0x30, 0x39),))
NONZERO = CharClass(((0x31, 0x39),))
DIGITS = Repeat(DIGIT, 0, None)
NATURAL = Choice((Literal("0"), Seq((NONZERO, DIGITS))))
INTEGER = Seq((Repeat(Literal("-"), 0, 1), NATURAL))
NUMBER = Seq((
    Repeat(Literal("-"), 0, 1),
    NATURAL,
    Repeat(Seq((Literal("."), Repeat(DIGIT, 1, None))), 0, 1),
    Repeat(Seq((CharClass(((0x45, 0x45), (0x65, 0x65))), Repeat(CharClass(((0x2B, 0x2B), (0x2D, 0x2D))), 0, 1),
                Repeat(DIGIT, 1, None))), 0, 1),
))


def _digit_class(lo: int, hi: int) -> Expr:
    return Literal(str(lo)) if lo == hi else CharClass(((0x30 + lo, 0x30 + hi),))


def _check_digits(*values: int | Decimal | None) -> None:
    for v in values:
        if v is not None and len(str(abs(v))) > MAX_BOUND_DIGITS:
            raise GrammarLimitError(f"numeric bound has more than {MAX_BOUND_DIGITS} digits")


# --- integers -------------------------------------------------------------------------------------

def _same_len_range(x: str, y: str) -> Expr | None:
    """Digit strings of len(x) == len(y) between x and y inclusive (leading zeros allowed here)."""
    if not x:
        return EMPTY
    if x > y:
        return None
    if x[0] == y[0]:
        return _seq(Literal(x[0]), _same_len_range(x[1:], y[1:]))
    n = len(x) - 1
    if x[1:] == "0" * n and y[1:] == "9" * n:
        return _seq(_digit_class(int(x[0]), int(y[0])), *([Repeat(DIGIT, n, n)] if n else []))
    alts = [_seq(Literal(x[0]), _same_len_range(x[1:], "9" * n))]
    if int(y[0]) - int(x[0]) > 1:
        alts.append(_seq(_digit_class(int(x[0]) + 1, int(y[0]) - 1), *([Repeat(DIGIT, n, n)] if n else [])))
    alts.append(_seq(Literal(y[0]), _same_len_range("0" * n, y[1:])))
    return _choice(alts)


def natural_range(a: int, b: int | None) -> Expr | None:
    """Canonical decimal naturals in [a, b] (b None: unbounded); a >= 0."""
    if b is not None and a > b:
        return None
    alts: list[Expr | None] = []
    la = len(str(a))
    top = len(str(b)) if b is not None else la
    for n in range(la, top + 1):
        lo = max(a, 10 ** (n - 1) if n > 1 else 0)
        hi = 10 ** n - 1 if b is None else min(b, 10 ** n - 1)
        if lo <= hi:
            alts.append(_same_len_range(str(lo), str(hi)))
    if b is None:
        alts.append(Seq((NONZERO, Repeat(DIGIT, la, None))))
    return _choice(alts)


def int_range(lo: int | None, hi: int | None) -> Expr | None:
    """Canonical JSON integers in [lo, hi] (None: unbounded on that side); None if empty."""
    _check_digits(lo, hi)
    if lo is None and hi is None:
        return INTEGER
    if lo is not None and hi is not None and lo > hi:
        return None
    alts: list[Expr | None] = []
    if hi is None or hi >= 0:
        alts.append(natural_range(max(lo, 0) if lo is not None else 0, hi))
    if lo is None or lo < 0:
        mag_lo = 1 if hi is None or hi >= 0 else -hi
        alts.append(_seq(Literal("-"), natural_range(mag_lo, None if lo is None else -lo)))
    if (lo is None or lo <= 0) and (hi is None or hi >= 0):
        alts.append(Literal("-0"))
    return _choice(alts)


def int_multiple(divisor: int, lo: int | None, hi: int | None, fresh, rules: list[Rule]) -> Expr | None:
    """Canonical JSON integers in [lo, hi] divisible by `divisor`, or None if there are none.

    Few values: enumerated. Otherwise a remainder automaton over the digits, one rule per remainder
    (named by `fresh(hint) -> str`, appended to `rules`); it carries bounds only where they cut at
    zero (after rounding them to multiples: `minimum: 0`, `exclusiveMinimum: 0`, and the mirror
    images). Other combinations raise ValueError, for the caller to report against the keyword."""
    if divisor <= 0:
        raise ValueError("multipleOf must be positive")
    _check_digits(lo, hi)
    lo_m = None if lo is None else -(-lo // divisor) * divisor
    hi_m = None if hi is None else (hi // divisor) * divisor
    if divisor == 1:
        return int_range(lo_m, hi_m)
    if lo_m is not None and hi_m is not None:
        if lo_m > hi_m:
            return None
        if (hi_m - lo_m) // divisor < MAX_ENUMERATED:
            return _choice([Literal(str(v)) for v in range(lo_m, hi_m + 1, divisor)]
                           + ([Literal("-0")] if lo_m <= 0 <= hi_m else []))
    if divisor > MAX_DIVISOR:
        raise ValueError(f"multipleOf {divisor} over a wide range (the limit is {MAX_DIVISOR})")
    if lo_m not in (None, 0, divisor) or hi_m not in (None, 0, -divisor):
        raise ValueError("multipleOf over a wide range bounded away from zero")
    names = [fresh(f"mod{divisor}_{r}") for r in range(divisor)]

    def by_remainder(r: int, digits: range) -> list[Expr]:
        groups: dict[int, list[int]] = {}
        for d in digits:
            groups.setdefault((10 * r + d) % divisor, []).append(d)
        return [Seq((CharClass(tuple((0x30 + d, 0x30 + d) for d in ds)), RuleRef(names[t])))
                for t, ds in sorted(groups.items())]

    for r in range(divisor):
        rules.append(Rule(names[r], _choice(([EMPTY] if r == 0 else []) + by_remainder(r, range(10)))))
    positive = _choice(by_remainder(0, range(1, 10)))
    zero_ok = (lo_m is None or lo_m <= 0) and (hi_m is None or hi_m >= 0)
    alts: list[Expr | None] = []
    if zero_ok:
        alts += [Literal("0"), Literal("-0")]
    if hi_m is None:
        alts.append(positive)
    if lo_m is None:
        alts.append(Seq((Literal("-"), positive)))
    return _choice(alts)


# --- decimals -------------------------------------------------------------------------------------

def _frac(lo: str, lo_incl: bool, hi: str | None, hi_incl: bool) -> tuple[bool, Expr | None]:
    """Digit strings s with 0.lo <= 0.s <= 0.hi (strict where not incl; hi None: no upper bound).

    Returns whether the empty string belongs, and an expression for the non-empty ones. Recursion
    depth is the number of digits of the bounds (capped by MAX_BOUND_DIGITS)."""
    lo_zero = not lo.strip("0")
    hi_zero = hi is not None and not hi.strip("0")
    empty_ok = lo_zero and lo_incl and (hi is None or not hi_zero or hi_incl)
    if hi_zero:
        return empty_ok, Repeat(Literal("0"), 1, None) if empty_ok else None
    if lo_zero and hi is None:
        return empty_ok, Seq((DIGIT, DIGITS)) if lo_incl else Seq((Repeat(Literal("0"), 0, None), NONZERO, DIGITS))
    lo0 = int(lo[0]) if lo else 0
    hi0 = int(hi[0]) if hi is not None else 9
    alts: list[Expr | None] = []
    if hi is not None and lo0 == hi0:
        alts.append(_seq(Literal(str(lo0)), _opt_with(*_frac(lo[1:], lo_incl, hi[1:], hi_incl))))
    else:
        alts.append(_seq(Literal(str(lo0)), _opt_with(*_frac(lo[1:], lo_incl, None, True))))
        top = hi0 - 1 if hi is not None else 9
        if lo0 + 1 <= top:
            alts.append(Seq((_digit_class(lo0 + 1, top), DIGITS)))
        if hi is not None:
            alts.append(_seq(Literal(str(hi0)), _opt_with(*_frac("", True, hi[1:], hi_incl))))
    return empty_ok, _choice(alts)


def _opt_with(empty: bool, rest: Expr | None) -> Expr | None:
    if rest is None:
        return EMPTY if empty else None
    return Repeat(rest, 0, 1) if empty else rest


def _fraction_suffix(empty: bool, rest: Expr | None) -> Expr | None:
    """The JSON spelling: nothing (value 0) or '.' and at least one digit."""
    return _choice([EMPTY if empty else None, _seq(Literal("."), rest) if rest is not None else None])


def _split(v: Decimal) -> tuple[int, str]:
    """Integer part and fraction digits (no trailing zeros) of a non-negative decimal."""
    whole = int(v)
    frac = format(v - whole, "f").partition(".")[2].rstrip("0")
    return whole, frac


def _magnitude(a: Decimal, a_incl: bool, b: Decimal | None, b_incl: bool) -> Expr | None:
    """Plain decimal spellings (no sign) of values in [a, b] (strict where not incl); a >= 0."""
    if b is not None and (a > b or (a == b and not (a_incl and b_incl))):
        return None
    wa, fa = _split(a)
    if b is not None:
        wb, fb = _split(b)
        if wa == wb:
            return _seq(Literal(str(wa)), _fraction_suffix(*_frac(fa, a_incl, fb, b_incl)))
    alts = [_seq(Literal(str(wa)), _fraction_suffix(*_frac(fa, a_incl, None, True)))]
    any_frac = _fraction_suffix(True, Seq((DIGIT, DIGITS)))
    if b is None:
        alts.append(_seq(natural_range(wa + 1, None), any_frac))
    else:
        if wb - 1 >= wa + 1:
            alts.append(_seq(natural_range(wa + 1, wb - 1), any_frac))
        alts.append(_seq(Literal(str(wb)), _fraction_suffix(*_frac("", True, fb, b_incl))))
    return _choice(alts)


def to_decimal(v: float) -> Decimal:
    try:
        return Decimal(v) if isinstance(v, int) else Decimal(repr(v))
    except InvalidOperation as exc:  # pragma: no cover - floats from JSON are finite here
        raise ValueError(str(exc)) from None


def decimal_range(lo: Decimal | None, lo_incl: bool, hi: Decimal | None, hi_incl: bool) -> Expr | None:
    """Plain-decimal JSON numbers v with lo <= v <= hi (strict where not incl); None if empty."""
    _check_digits(lo, hi)
    zero = Decimal(0)
    alts: list[Expr | None] = []
    if hi is None or hi >= zero:
        a, a_incl = (zero, True) if lo is None or lo < zero else (lo, lo_incl)
        alts.append(_magnitude(a, a_incl, hi, hi_incl))
    if lo is None or lo < zero or (lo == zero and lo_incl):
        if hi is None or hi > zero:
            a, a_incl = zero, True
        else:
            a, a_incl = -hi, hi_incl
        alts.append(_seq(Literal("-"), _magnitude(a, a_incl, None if lo is None else -lo, lo_incl)))
    return _choice(alts)


def decimal_places(places: int) -> Expr:
    """Plain-decimal JSON numbers with at most `places` significant fraction digits (the multiples
    of 10**-places); trailing zeros beyond them are allowed."""
    frac = Seq((Literal("."), Repeat(DIGIT, 1, places), Repeat(Literal("0"), 0, None))) if places else \
        Seq((Literal("."), Repeat(Literal("0"), 1, None)))
    return Seq((Repeat(Literal("-"), 0, 1), NATURAL, Repeat(frac, 0, 1)))


__all__ = ["INTEGER", "MAX_BOUND_DIGITS", "NUMBER", "decimal_places", "decimal_range", "int_multiple",
           "int_range", "natural_range", "to_decimal"]
