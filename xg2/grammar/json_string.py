"""From a language of decoded strings to the language of their JSON spellings (the text between quotes).

JSON Schema constrains the *value* of a string (``pattern``, ``format``, ``const``...), but the model
generates its *JSON text*. :func:`json_string_body` bridges the two for any IR expression over decoded
code points, so every string front-end can be written over plain characters.

Which spellings are accepted: the canonical one, as ``json.dumps(s, ensure_ascii=False)`` and
``JSON.stringify`` write it.

* A code point JSON allows raw (anything but ``"``, ``\\`` and U+0000-U+001F) is written raw;
  ``\\uXXXX`` for such characters is *not* accepted: it is never needed, and one spelling per
  character keeps the grammar small and the model's choices unambiguous.
* ``"`` and ``\\`` are written ``\\"`` and ``\\\\``.
* Control characters with a short escape are written ``\\b \\f \\n \\r \\t``; the others
  ``\\u00XX``, with the hex digits in either case.
* ``/`` may be written raw or as ``\\/``, both spellings being common in the wild.
"""

from __future__ import annotations

import functools

from xg2.grammar.ir import CharClass, Choice, Expr, Literal, Repeat, RuleRef, Seq
from xg2.grammar.regex import normalize_ranges

__all__ = ["json_string_body"]

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


def _u_escape(controls: list[int]) -> Expr | None:
    """``\\u00XX`` for the given controls (all below U+0020), grouped by the high hex digit."""
    alts = []
    for high in (0, 1):
        low = sorted(c & 0xF for c in controls if c >> 4 == high)
        if low:
            alts.append(Seq((Literal(str(high)), _hex_digit_class(low))))
    if not alts:
        return None
    return Seq((Literal("\\u00"), alts[0] if len(alts) == 1 else Choice(tuple(alts))))


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
def _class_body(cc: CharClass) -> Expr:
    """One raw class plus only the escapes the class needs: ``\\`` + [escape letters], ``\\u00XX``.
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
    u = _u_escape([cp for cp in range(0x20) if cp not in _SHORT_ESCAPES and has(cp)])
    if u is not None:
        alts.append(u)
    if not alts:
        return CharClass(())
    return alts[0] if len(alts) == 1 else Choice(tuple(alts))


def _literal_body(text: str) -> Expr:
    items: list[Expr] = []
    buf: list[str] = []

    def flush() -> None:
        if buf:
            items.append(Literal("".join(buf)))
            buf.clear()

    for ch in text:
        cp = ord(ch)
        if ch == '"' or ch == "\\":
            buf.append("\\" + ch)
        elif cp in _SHORT_ESCAPES:
            buf.append("\\" + _SHORT_ESCAPES[cp])
        elif cp < 0x20:
            flush()
            u = _u_escape([cp])
            assert u is not None
            items.append(u)
        elif ch == "/":
            flush()
            items.append(Choice((Literal("/"), Literal("\\/"))))
        else:
            buf.append(ch)
    flush()
    if not items:
        return Literal("")
    return items[0] if len(items) == 1 else Seq(tuple(items))


def json_string_body(expr: Expr) -> Expr:
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
            done[id(e)] = _literal_body(e.text)
        elif isinstance(e, CharClass):
            done[id(e)] = _class_body(e)
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
