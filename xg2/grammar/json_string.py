"""From a language of decoded strings to the language of their JSON spellings (the text between quotes).

JSON Schema constrains the *value* of a string (``pattern``, ``format``, ``const``...), but the model
generates its *JSON text*. :func:`json_string_body` bridges the two for any IR expression over decoded
code points, so every string front-end can be written over plain characters.

A string is judged by its value however the model spelled it, as serializers write it
(``json.dumps`` with or without ``ensure_ascii``, ``JSON.stringify``):

* a code point JSON allows raw (anything but ``"``, ``\\`` and U+0000-U+001F) raw;
* a code point outside printable ASCII also as ``\\uXXXX`` (hex digits in either case), one
  outside the Basic Multilingual Plane as its surrogate pair ``\\uD8xx\\uDCxx``; a lone
  surrogate is never a character. With ``escapes="all"``, printable ASCII too (``\\u0041``),
  which no serializer writes and which makes every character of a key or listed value a choice;
* the short escapes ``\\" \\\\ \\/ \\b \\f \\n \\r \\t`` for their characters.
"""

from __future__ import annotations

import functools

from xg2.grammar.ir import CharClass, Choice, Expr, Literal, Repeat, RuleRef, Seq
from xg2.grammar.regex import normalize_ranges

__all__ = ["ESCAPES", "json_string_body", "json_string_literal"]

#: The `escapes` modes: which characters may also be written as ``\\uXXXX``.
ESCAPES = ("non_ascii", "all")
_PRINTABLE_ASCII = ((0x20, 0x7E),)

_SHORT_ESCAPES = {0x08: "b", 0x09: "t", 0x0A: "n", 0x0C: "f", 0x0D: "r"}
# What JSON allows unescaped in a string: everything but controls, '"' and '\'.
_RAW_HOLES = ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C))
_HEX_DIGITS = "0123456789abcdef"


def _hex_digit_class(nibbles: list[int]) -> Expr:
    """One hex digit among `nibbles`, in either case."""
    chars = {ord(_HEX_DIGITS[v]) for v in nibbles} | {ord(_HEX_DIGITS[v].upper()) for v in nibbles}
    if len(chars) == 1:
        return Literal(chr(next(iter(chars))))
    return CharClass(normalize_ranges((c, c) for c in chars))


def _hex_range(lo: int, hi: int, width: int = 4) -> Expr:
    """`width` hex digits (either case) whose value lies in [lo, hi], the way a numeric range is
    written digit by digit: the partial first and last leading digits, the full ones between."""
    if width == 1:
        return _hex_digit_class(list(range(lo, hi + 1)))
    size = 16 ** (width - 1)
    a, b = lo // size, hi // size
    if a == b:
        return Seq((_hex_digit_class([a]), _hex_range(lo % size, hi % size, width - 1)))
    alts: list[Expr] = []
    if lo % size:
        alts.append(Seq((_hex_digit_class([a]), _hex_range(lo % size, size - 1, width - 1))))
        a += 1
    last = b if hi % size == size - 1 else b - 1
    if a <= last:
        alts.append(Seq((_hex_digit_class(list(range(a, last + 1))), Repeat(_hex_digit_class(list(range(16))),
                                                                             width - 1, width - 1))))
    if last < b:
        alts.append(Seq((_hex_digit_class([b]), _hex_range(0, hi % size, width - 1))))
    return alts[0] if len(alts) == 1 else Choice(tuple(alts))


def _u_escapes(ranges) -> Expr | None:
    """``\\uXXXX`` spellings of the code points in `ranges`: BMP ones directly (surrogates are no
    characters), the others as surrogate pairs."""
    alts: list[Expr] = []
    for lo, hi in ranges:
        for a, b in ((lo, min(hi, 0xD7FF)), (max(lo, 0xE000), min(hi, 0xFFFF))):
            if a <= b:
                alts.append(Seq((Literal("\\u"), _hex_range(a, b))))
        a, b = max(lo, 0x10000) - 0x10000, hi - 0x10000
        if a > b:
            continue
        ha, hb = a >> 10, b >> 10
        pieces = [(ha, a & 0x3FF, 0x3FF if hb > ha else b & 0x3FF)]
        if hb > ha + 1:
            pieces.append((ha + 1, 0, 0x3FF, hb - 1))     # whole high surrogates: any low one
        if hb > ha:
            pieces.append((hb, 0, b & 0x3FF))
        for piece in pieces:
            high = _hex_range(0xD800 + piece[0], 0xD800 + (piece[3] if len(piece) == 4 else piece[0]))
            low = _hex_range(0xDC00 + piece[1], 0xDC00 + piece[2])
            alts.append(Seq((Literal("\\u"), high, Literal("\\u"), low)))
    if not alts:
        return None
    return alts[0] if len(alts) == 1 else Choice(tuple(alts))


def _subtract(ranges, holes) -> tuple[tuple[int, int], ...]:
    out = []
    for lo, hi in ranges:
        for hlo, hhi in holes:
            if hhi < lo or hlo > hi:
                continue
            if hlo > lo:
                out.append((lo, hlo - 1))
            lo = hhi + 1
            if lo > hi:
                break
        if lo <= hi:
            out.append((lo, hi))
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def _class_body(cc: CharClass, every: bool = False) -> Expr:
    """One raw class, the short escapes the class needs, and ``\\uXXXX`` for all of it.
    Memoised: patterns and formats repeat the same classes, and IR expressions are immutable."""
    ranges = cc.codepoint_ranges()
    ascii_cps = {cp for lo, hi in ranges if lo < 0x80 for cp in range(lo, min(hi, 0x7F) + 1)}
    has = ascii_cps.__contains__  # every code point asked about below is ASCII

    alts: list[Expr] = []
    raw = _subtract(ranges, _RAW_HOLES)
    if raw:
        alts.append(CharClass(raw))
    letters = [ch for cp, ch in ((0x22, '"'), (0x5C, "\\"), (0x2F, "/")) if has(cp)]
    letters += [ch for cp, ch in _SHORT_ESCAPES.items() if has(cp)]
    if letters:
        tail: Expr = Literal(letters[0]) if len(letters) == 1 else \
            CharClass(normalize_ranges((ord(ch), ord(ch)) for ch in letters))
        alts.append(Seq((Literal("\\"), tail)))
    u = _u_escapes(ranges if every else _subtract(ranges, _PRINTABLE_ASCII))
    if u is not None:
        alts.append(u)
    if not alts:
        return CharClass(())
    return alts[0] if len(alts) == 1 else Choice(tuple(alts))


@functools.lru_cache(maxsize=8192)
def _char_body(ch: str, every: bool) -> Expr:
    return _class_body(CharClass(((ord(ch), ord(ch)),)), every)


@functools.lru_cache(maxsize=8192)
def _literal_body(text: str, every: bool = False) -> Expr:
    """A literal's spellings: character by character, where a character has more than one
    (runs of printable ASCII other than ``"``, ``\\`` and ``/`` stay one literal unless `every`)."""
    items: list[Expr] = []
    run: list[str] = []
    for ch in text:
        if not every and " " <= ch <= "~" and ch not in '"\\/':
            run.append(ch)
            continue
        if run:
            items.append(Literal("".join(run)))
            run = []
        items.append(_char_body(ch, every))
    if run:
        items.append(Literal("".join(run)))
    if not items:
        return Literal("")
    return items[0] if len(items) == 1 else Seq(tuple(items))


def json_string_literal(text: str, escapes: str = "non_ascii") -> Expr:
    """A JSON string holding exactly `text`, in the spellings `escapes` allows (quotes included)."""
    body = _literal_body(text, escapes == "all")
    if type(body) is Literal:
        return Literal(f'"{body.text}"')      # one spelling: the canonical literal itself
    return Seq((Literal('"'), body, Literal('"')))


def json_string_body(expr: Expr, escapes: str = "non_ascii") -> Expr:
    """The JSON spellings (without the surrounding quotes) of the strings `expr` matches.

    Works bottom-up with an explicit stack, so deep expressions cannot exhaust the Python stack.
    Rule references cannot be mapped (their rule describes decoded text, not JSON text) and raise
    TypeError: callers inline string-valued rules before escaping them.
    """
    done: dict[int, Expr] = {}
    stack: list[tuple[Expr, bool]] = [(expr, False)]
    while stack:
        e, children_done = stack.pop()
        if id(e) in done:
            continue
        if isinstance(e, Literal):
            done[id(e)] = _literal_body(e.text, escapes == "all")
        elif isinstance(e, CharClass):
            done[id(e)] = _class_body(e, escapes == "all")
        elif isinstance(e, RuleRef):
            raise TypeError(f"cannot JSON-escape a reference to rule {e.name!r}")
        else:
            if isinstance(e, Seq):
                children = e.items
            elif isinstance(e, Choice):
                children = e.alts
            elif isinstance(e, Repeat):
                children = (e.expr,)
            else:  # pragma: no cover - the IR is closed
                raise TypeError(f"unknown IR node {e!r}")
            if not children_done:
                stack.append((e, True))
                stack.extend((c, False) for c in children if id(c) not in done)
                continue
            mapped = tuple(done[id(c)] for c in children)
            if isinstance(e, Seq):
                done[id(e)] = Seq(mapped)
            elif isinstance(e, Choice):
                done[id(e)] = Choice(mapped)
            else:
                done[id(e)] = Repeat(mapped[0], e.min, e.max)
    return done[id(expr)]
