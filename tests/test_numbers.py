"""Numeric languages (numbers.py): bounds and multipleOf exact against Decimal arithmetic."""

from __future__ import annotations

import random
from decimal import Decimal

import pytest

import xg2
from xg2.grammar.fsm import rule_automaton
from xg2.grammar.ir import GrammarIR, Rule
from xg2.grammar.numbers import decimal_places, decimal_range, int_multiple, int_range


def _member(expr):
    fsm = rule_automaton(expr, {})
    return lambda text: fsm.accepts(text.encode())


def _candidates() -> set[str]:
    rng = random.Random(7)
    out = {"0", "-0", "0.0", "-0.0", "0.5", "1", "1.0", "1.5", "2", "10", "9.99", "10.01", "-1", "-0.5",
           "-1.5", "0.25", "0.2500", "12.5"}
    for _ in range(1500):
        whole = str(rng.choice([0, 1, 2, 5, 9, 10, 12, 99, 100, 123, 1000]) + rng.randrange(3))
        frac = "" if rng.random() < 0.3 else "." + "".join(rng.choice("0123456789") for _ in range(rng.randrange(1, 5)))
        out.add(("-" if rng.random() < 0.4 else "") + whole + frac)
    return out


@pytest.mark.parametrize("lo,lo_incl,hi,hi_incl", [
    ("0", True, "1", True), ("0", False, "1", False), ("0.25", True, "12.5", False), ("-1.5", True, "2", True),
    ("-10", False, "-0.5", True), (None, True, "9.99", True), ("10.01", True, None, True),
    ("-0.5", False, None, True), ("0", True, "0", True), ("1.5", True, "1.5", True), ("0.1", False, "0.2", False),
    (None, True, "0", False), ("0", False, None, True), ("-2", True, "-1", False)])
def test_decimal_range(lo, lo_incl, hi, hi_incl):
    low = None if lo is None else Decimal(lo)
    high = None if hi is None else Decimal(hi)
    expr = decimal_range(low, lo_incl, high, hi_incl)
    accepts = _member(expr) if expr is not None else (lambda _t: False)
    for text in _candidates():
        v = Decimal(text)
        want = (low is None or (v >= low if lo_incl else v > low)) and (high is None or (v <= high if hi_incl else v < high))
        assert accepts(text) == want, text


@pytest.mark.parametrize("lo,hi", [(None, None), (0, None), (-5, 17), (3, 3), (-100, -7), (None, -3), (12, None)])
def test_int_range(lo, hi):
    accepts = _member(int_range(lo, hi))
    for v in range(-1200, 1200):
        assert accepts(str(v)) == ((lo is None or v >= lo) and (hi is None or v <= hi)), v
    assert not accepts("01") and not accepts("1.0")


@pytest.mark.parametrize("div,lo,hi", [(3, None, None), (7, 0, None), (5, 1, None), (4, None, 0), (10, -3, None),
                                       (6, -50, 50), (25, 0, 50000)])
def test_int_multiple(small_info, div, lo, hi):
    rules: list[Rule] = []
    names = iter(range(10**6))
    expr = int_multiple(div, lo, hi, lambda hint: f"{hint}_{next(names)}", rules)
    compiled = xg2.GrammarCompiler(small_info, cache_enabled=False).compile_grammar(
        xg2.Grammar(GrammarIR([Rule("root", expr), *rules])))
    for v in [*range(-130, 130), 49975, 50000, 50025, -50000, 123456789]:
        m = xg2.GrammarMatcher(compiled)
        got = m.accept_string(str(v)) and m.is_completed()
        assert got == (v % div == 0 and (lo is None or v >= lo) and (hi is None or v <= hi)), v


def test_int_multiple_wide_range_away_from_zero_is_refused():
    with pytest.raises(ValueError):
        int_multiple(7, 10, 10**9, str, [])


@pytest.mark.parametrize("places", [0, 2])
def test_decimal_places(places):
    accepts = _member(decimal_places(places))
    for text in ["1", "1.5", "1.25", "1.250", "1.255", "-0.01", "1.0", "1.00", "7.5000"]:
        d = Decimal(text)
        assert accepts(text) == (d * 10**places == int(d * 10**places)), text


def test_testing_regex_helpers_print_the_number_languages():
    """xg2.testing's range helpers print xg2's own number languages as Python regexes: a value
    matches exactly when it is in range (any fraction digits; `-0` is 0)."""
    import re
    from decimal import Decimal

    from xg2.testing import _generate_float_regex, _generate_range_regex

    texts = ["0", "-0", "-0.0", "1", "1.5", "1.50", "2", "-2", "-2.0", "3.999999", "4", "4.0000001", "-4.1",
             "12", "16", "17", "0.000001", "-0.5", "5.75", "5.7500", "5.751", "6"]
    for lo, hi, lo_x, hi_x in [(-4.0, 4.0, False, False), (1.5, 5.75, False, False), (None, -1.5, False, False),
                               (0, None, True, False), (-0.5, 0.5, False, True), (10.5, 2.5, False, False)]:
        rx = re.compile(_generate_float_regex(lo, hi, exclusive_start=lo_x, exclusive_end=hi_x))
        for t in texts:
            v = Decimal(t)
            ok = (lo is None or (v > Decimal(repr(lo)) if lo_x else v >= Decimal(repr(lo)))) and \
                 (hi is None or (v < Decimal(repr(hi)) if hi_x else v <= Decimal(repr(hi))))
            assert bool(rx.fullmatch(t)) == ok, (lo, hi, t)
    for lo, hi in [(12, 16), (-5, 10), (None, -2), (100, None), (5, 4)]:
        rx = re.compile(_generate_range_regex(lo, hi))
        for t in [str(i) for i in range(-20, 120)] + ["-0", "1.0", "007"]:
            digits = t.removeprefix("-")
            canonical = digits.isdigit() and (digits == "0" or not digits.startswith("0"))
            ok = canonical and (lo is None or int(t) >= lo) and (hi is None or int(t) <= hi)
            assert bool(rx.fullmatch(t)) == ok, (lo, hi, t)
