"""Regex front-end: the common subset of Python ``re`` and ECMAScript regexes, lowered to the grammar IR.

Two callers need regexes with different meanings, so one parser serves both:

* ``Grammar.from_regex`` / ``GrammarCompiler.compile_regex`` follow xgrammar: the regex must match the
  *whole* generated text (``search=False``); ``^`` and ``$`` are then redundant but allowed.
* JSON Schema ``pattern`` is an ECMA-262 *search*: an unanchored pattern may match anywhere in the
  string (``search=True``), so unanchored ends get a prefix/suffix of any code points.

Only constructs that denote a regular language are accepted; the rest (backreferences, lookaround,
word boundaries, inline flags, possessive quantifiers, atomic groups, anchors in the middle) raise
:class:`~xg2.errors.RegexError` with the 1-based column (in code points) of the offending construct,
so a tenant gets a precise message instead of a silently wrong grammar. Where Python and ECMAScript
disagree the ECMAScript meaning wins, because JSON Schema is the main consumer: ``\\d`` and ``\\w`` are
ASCII, ``\\s`` is the ECMAScript white-space set, ``.`` excludes all four line terminators. Where the
two disagree and neither meaning is clearly intended (``[]...]``, ``{,n}``) the pattern is rejected.

Lazy quantifiers describe the same language as greedy ones and are accepted as such. The parser is a
loop over an explicit stack of open groups, and nesting is capped at :data:`MAX_REGEX_DEPTH`, so no
pattern can exhaust the Python stack.
"""

from __future__ import annotations

import functools
import re

from xg2.errors import GrammarLimitError, RegexError
from xg2.grammar.ebnf import MAX_GRAMMAR_BYTES, MAX_REPEAT
from xg2.grammar.ir import (
    EPSILON,
    MAX_CODEPOINT,
    CharClass,
    Choice,
    Expr,
    GrammarIR,
    Literal,
    Repeat,
    Rule,
    Seq,
    complement_ranges,
    normalize_ranges,
)

__all__ = ["ANY_CHAR", "MAX_REGEX_DEPTH", "regex_to_expr", "regex_to_ir"]

MAX_REGEX_DEPTH = 200
"""Deepest group nesting accepted; deeper patterns raise GrammarLimitError."""

ANY_CHAR = CharClass(((0, MAX_CODEPOINT),))
"""Any code point, line terminators included (surrogates are never matched by the lowering)."""

Ranges = tuple[tuple[int, int], ...]

_DIGIT: Ranges = ((0x30, 0x39),)
_WORD: Ranges = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
# ECMAScript WhiteSpace plus LineTerminator (ECMA-262 22.2.2.9, CharacterClassEscape `s`).
_SPACE: Ranges = (
    (0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A), (0x2028, 0x2029),
    (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF),
)
# `.` in ECMAScript (without the s flag) excludes every LineTerminator, not only \n as Python does.
_LINE_TERMINATORS: Ranges = ((0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029))
_DOT = CharClass(_LINE_TERMINATORS, negated=True)

_SHORTHANDS: dict[str, tuple[Ranges, bool]] = {
    "d": (_DIGIT, False), "D": (_DIGIT, True),
    "w": (_WORD, False), "W": (_WORD, True),
    "s": (_SPACE, False), "S": (_SPACE, True),
}
_CONTROL_ESCAPES = {"n": 0x0A, "t": 0x09, "r": 0x0D, "f": 0x0C, "v": 0x0B}
_HEX = frozenset("0123456789abcdefABCDEF")
_QUANTIFIER_RE = re.compile(r"\{([0-9]+)(,([0-9]*))?\}")
_AMBIGUOUS_QUANTIFIER_RE = re.compile(r"\{,[0-9]+\}")
_GROUP_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INLINE_FLAGS_RE = re.compile(r"\(\?[aiLmsux-]+[):]")
# A run of characters that stand for themselves (read in one step: long literal patterns are common).
_PLAIN_RE = re.compile(r"[^\\\[().*+?{|^$\ud800-\udfff]+")


def _err(message: str, index: int) -> RegexError:
    return RegexError(message, 1, index + 1)


def _limit(message: str, index: int) -> GrammarLimitError:
    return GrammarLimitError(message, 1, index + 1)


def _is_surrogate(cp: int) -> bool:
    return 0xD800 <= cp <= 0xDFFF


# ---------------------------------------------------------------------------------------------
# Escapes
# ---------------------------------------------------------------------------------------------

_COUNT_WORDS = {2: "two", 4: "four", 8: "eight"}


def _hex_digits(p: str, i: int, count: int, start: int, what: str) -> int:
    digits = p[i:i + count]
    if len(digits) != count or not set(digits) <= _HEX:
        raise _err(f"{what} must be followed by {_COUNT_WORDS[count]} hexadecimal digits", start)
    return int(digits, 16)


def _escape(p: str, i: int, in_class: bool) -> tuple[int | None, tuple[Ranges, bool] | None, int]:
    """Read the escape whose backslash is at `i`: (code point, None, next) for a single character or
    (None, (ranges, negated), next) for a shorthand class."""
    if i + 1 >= len(p):
        raise _err("pattern ends with a lone backslash", i)
    c = p[i + 1]
    nxt = i + 2
    if c in _SHORTHANDS:
        return None, _SHORTHANDS[c], nxt
    if c in _CONTROL_ESCAPES:
        return _CONTROL_ESCAPES[c], None, nxt
    if c == "b":
        if in_class:  # [\b] is backspace in both dialects
            return 0x08, None, nxt
        raise _err("Word boundary assertion \\b is not supported", i)
    if c == "B":
        raise _err("Word boundary assertion \\B is not supported", i)
    if c == "0":
        if nxt < len(p) and p[nxt].isdigit():
            raise _err("octal escapes are not supported (\\0 followed by a digit)", i)
        return 0, None, nxt
    if c in "123456789":
        raise _err(f"Backreference \\{c} is not supported", i)
    if c == "k":
        raise _err("Backreference \\k<name> is not supported", i)
    if c == "x":
        return _hex_digits(p, nxt, 2, i, "\\x escape"), None, nxt + 2
    if c == "U":  # Python's 8-digit form
        cp = _hex_digits(p, nxt, 8, i, "\\U escape")
        return _check_codepoint(cp, i), None, nxt + 8
    if c == "u":
        if nxt < len(p) and p[nxt] == "{":  # ECMAScript \u{...}
            close = p.find("}", nxt)
            digits = p[nxt + 1:close] if close >= 0 else ""
            if not digits or not set(digits) <= _HEX or len(digits) > 8:
                raise _err("\\u{...} must be followed by 1 to 8 hexadecimal digits and a closing brace", i)
            return _check_codepoint(int(digits, 16), i), None, close + 1
        cp = _hex_digits(p, nxt, 4, i, "\\u escape")
        nxt += 4
        # A surrogate pair spelled as two escapes is one astral code point (as with the u flag).
        if 0xD800 <= cp <= 0xDBFF and p.startswith("\\u", nxt):
            tail = p[nxt + 2:nxt + 6]
            if len(tail) == 4 and set(tail) <= _HEX and 0xDC00 <= int(tail, 16) <= 0xDFFF:
                cp = 0x10000 + ((cp - 0xD800) << 10) + (int(tail, 16) - 0xDC00)
                nxt += 6
        return _check_codepoint(cp, i), None, nxt
    if c == "c":
        if nxt < len(p) and p[nxt].isascii() and p[nxt].isalpha():
            return ord(p[nxt]) % 32, None, nxt + 1
        raise _err("\\c must be followed by an ASCII letter", i)
    if c in "AZzG":
        raise _err(f"the anchor \\{c} is not supported (use ^ or $ at the ends of the pattern)", i)
    if c in "pP":
        raise _err(f"Unicode property escape \\{c}{{...}} is not supported", i)
    if c == "N":
        raise _err("named character escapes (\\N{...}) are not supported", i)
    if c.isascii() and c.isalnum():
        raise _err(f"unknown escape \\{c}", i)
    # Any other character stands for itself after a backslash (metacharacters, '/', '-', ...).
    return _check_codepoint(ord(c), i), None, nxt


def _check_codepoint(cp: int, index: int) -> int:
    if cp > MAX_CODEPOINT:
        raise _err(f"code point {cp:#x} is beyond the Unicode range (above U+10FFFF)", index)
    if _is_surrogate(cp):
        raise _err(f"lone surrogate U+{cp:04X} cannot match well-formed text", index)
    return cp


# ---------------------------------------------------------------------------------------------
# Character classes
# ---------------------------------------------------------------------------------------------

def _class(p: str, i: int) -> tuple[CharClass, int]:
    """Read the class whose '[' is at `i`; return it and the index after its ']'."""
    start = i
    i += 1
    negated = i < len(p) and p[i] == "^"
    if negated:
        i += 1
    if i < len(p) and p[i] == "]":
        raise _err("Empty character class is not allowed in regex: a ']' first in a class is "
                   "ambiguous (an empty class in ECMAScript, a literal in Python); escape it as \\] "
                   "for the literal", i)
    ranges: list[tuple[int, int]] = []
    while True:
        if i >= len(p):
            raise _err("unterminated character class", start)
        if p[i] == "]":
            i += 1
            break
        item_start = i
        cp, shorthand, i = _class_atom(p, i)
        if shorthand is not None:
            sr, sneg = shorthand
            ranges.extend(complement_ranges(sr) if sneg else sr)
            if i + 1 < len(p) and p[i] == "-" and p[i + 1] != "]":
                raise _err("a shorthand class cannot start a range", item_start)
            continue
        assert cp is not None
        if i + 1 < len(p) and p[i] == "-" and p[i + 1] != "]":
            hi_cp, hi_short, i = _class_atom(p, i + 1)
            if hi_short is not None or hi_cp is None:
                raise _err("a shorthand class cannot end a range", item_start)
            if hi_cp < cp:
                raise _err(f"bad range {chr(cp)!r}-{chr(hi_cp)!r}: the start is above the end", item_start)
            ranges.append((cp, hi_cp))
        else:
            ranges.append((cp, cp))
    return CharClass(normalize_ranges(ranges), negated), i


def _class_atom(p: str, i: int) -> tuple[int | None, tuple[Ranges, bool] | None, int]:
    if p[i] == "\\":
        return _escape(p, i, in_class=True)
    return _check_codepoint(ord(p[i]), i), None, i + 1


# ---------------------------------------------------------------------------------------------
# Parser
# ---------------------------------------------------------------------------------------------

class _Frame:
    """An open group (or the whole pattern): finished alternatives and the one being read."""

    __slots__ = ("alts", "anchors", "at_start", "caret", "dead", "dollar", "items", "quantifiable", "start")

    def __init__(self, start: int, at_start: bool = True):
        self.start = start  # index of '(' (-1 for the whole pattern)
        self.at_start = at_start  # nothing can have been read before the group (so '^' may open it)
        self.alts: list[Expr] = []
        self.items: list[Expr] = []
        self.quantifiable = False
        # (starts with ^, ends with $, can never match) per finished alternative; a group's
        # anchors pass to the alternative holding it when all its alternatives have them.
        self.anchors: list[tuple[bool, bool, bool]] = []
        self.caret = False
        self.dollar: int | None = None  # index of a '$' seen in the current alternative
        self.dead = False   # top level: '^' after text, or text after '$' (the alternative matches nothing)

    def end_alternative(self) -> None:
        self.alts.append(_seq(self.items))
        self.anchors.append((self.caret, self.dollar is not None, self.dead))
        self.items = []
        self.quantifiable = False
        self.caret = False
        self.dollar = None
        self.dead = False


def _seq(items: list[Expr]) -> Expr:
    """A sequence with adjacent literals merged, so `abc` is one Literal and not three."""
    out: list[Expr] = []
    run: list[str] = []  # joined once per run: pairwise concatenation is quadratic on long literals
    for item in [*items, None]:
        if isinstance(item, Literal):
            run.append(item.text)
            continue
        text = "".join(run)
        if text:
            out.append(Literal(text))
        run = []
        if item is not None:
            out.append(item)
    if not out:
        return EPSILON
    return out[0] if len(out) == 1 else Seq(tuple(out))


def _choice(alts: list[Expr]) -> Expr:
    unique = list(dict.fromkeys(alts))
    return unique[0] if len(unique) == 1 else Choice(tuple(unique))


def _repeat(expr: Expr, lo: int, hi: int | None) -> Expr:
    if (lo, hi) == (1, 1):
        return expr
    if hi == 0:
        return EPSILON
    return Repeat(expr, lo, hi)


def _open_group(p: str, i: int) -> int:
    """Check the group syntax at '(' (index `i`); return the index of the group's first item."""
    if not p.startswith("(?", i):
        return i + 1
    rest = p[i + 2:i + 4]
    if rest.startswith(":"):
        return i + 3
    if rest in ("<=", "<!"):
        raise _err("Lookbehind assertion (?<= / (?<! is not supported", i)
    if rest.startswith(("=", "!")):
        raise _err("Lookahead assertion (?= / (?! is not supported", i)
    if rest.startswith("P="):
        raise _err("Backreference (?P=name) is not supported", i)
    if rest.startswith(("P<", "<")):
        name_at = i + (4 if rest.startswith("P") else 3)
        m = _GROUP_NAME_RE.match(p, name_at)
        if m is None or not p.startswith(">", m.end()):
            raise _err("bad group name: expected (?<name>...) or (?P<name>...)", i)
        return m.end() + 1
    if rest.startswith(">"):
        raise _err("atomic groups are not supported", i)
    if rest.startswith("#"):
        raise _err("comment groups are not supported", i)
    if rest.startswith("("):
        raise _err("conditional groups are not supported", i)
    if _INLINE_FLAGS_RE.match(p, i):
        raise _err("inline flags such as (?i) are not supported", i)
    raise _err("unsupported group syntax after '(?'", i)


def _parse(p: str, start: int = 0, dot: Expr = _DOT) -> list[tuple[bool, Expr, bool]]:
    """The top-level alternatives as (anchored at start, expression, anchored at end), from index
    `start` (past leading flags); `dot` is what '.' matches."""
    stack = [_Frame(-1)]
    i = start
    n = len(p)
    while i < n:
        c = p[i]
        top = stack[-1]
        if top.dollar is not None and c not in "|$)":
            if len(stack) > 1 or c in "*+?{":
                raise _err("'$' is only supported at the end of the pattern (or of a top-level alternative)",
                           top.dollar)
            top.dead = True     # text after the end of the input: this alternative never matches
            top.dollar = None
        if c == "|":
            top.end_alternative()
            i += 1
            continue
        if c == "^":
            if not top.items and top.at_start:
                top.caret = True
            elif len(stack) == 1 and _min_length(_seq(top.items)) > 0:
                top.dead = True     # the start of the input after some text: never matches
            else:
                raise _err("'^' is only supported at the start of the pattern (or of a top-level "
                           "alternative, or of a group there)", i)
            top.quantifiable = False
            i += 1
            continue
        if c == "$":
            top.dollar = i
            top.quantifiable = False
            i += 1
            continue
        if c == "(":
            if len(stack) > MAX_REGEX_DEPTH:
                raise _limit(f"groups nested deeper than {MAX_REGEX_DEPTH}", i)
            first = _open_group(p, i)
            stack.append(_Frame(i, at_start=top.at_start and not top.items))
            i = first
            continue
        if c == ")":
            if len(stack) == 1:
                raise _err("Unmatched ')': no group is open here", i)
            stack.pop()
            top.end_alternative()
            parent = stack[-1]
            carets = [a for a, _z, _d in top.anchors]
            dollars = [z for _a, z, _d in top.anchors]
            if any(carets) and not all(carets) or any(dollars) and not all(dollars):
                raise _err("'^' or '$' in some alternatives of a group but not all is not supported", top.start)
            if all(carets):
                parent.caret = True
            parent.items.append(_choice(top.alts))
            if all(dollars):
                parent.dollar = i
            parent.quantifiable = not (all(carets) or all(dollars))
            i += 1
            continue
        quant = _quantifier(p, i)
        if quant is not None:
            lo, hi, end = quant
            if not top.quantifiable:
                if top.items and i > 0 and p[i - 1] in "*+?}":
                    raise _err("Two consecutive repetition modifiers are not allowed: nothing to repeat "
                               "before this quantifier (group the first repetition to repeat it)", i)
                raise _err("nothing to repeat before this quantifier", i)
            if end < n and p[end] == "?":
                end += 1  # lazy: the same language
            elif end < n and p[end] == "+":
                raise _err("Two consecutive repetition modifiers are not allowed: possessive quantifiers (a++, a*+) are "
                           "not supported", end)
            top.items[-1] = _repeat(top.items[-1], lo, hi)
            top.quantifiable = False
            i = end
            continue
        if c == "[":
            atom, i = _class(p, i)
        elif c == ".":
            atom, i = dot, i + 1
        elif c == "\\":
            cp, shorthand, i = _escape(p, i, in_class=False)
            if shorthand is not None:
                atom = CharClass(*shorthand)
            else:
                assert cp is not None
                atom = Literal(chr(cp))
        else:
            m = _PLAIN_RE.match(p, i)
            if m is None:  # a '{' that opens no bound, or a lone surrogate
                atom, i = Literal(chr(_check_codepoint(ord(c), i))), i + 1
            else:
                run = m.group()
                # A quantifier after the run applies to its last character only.
                if len(run) > 1 and m.end() < n and p[m.end()] in "*+?{":
                    top.items.append(Literal(run[:-1]))
                    run = run[-1]
                atom, i = Literal(run), m.end()
        top.items.append(atom)
        top.quantifiable = True
    if len(stack) > 1:
        raise _err("Unmatched '(': the group is never closed", stack[-1].start)
    top = stack[0]
    top.end_alternative()
    return [(a, e, z) for (a, z, dead), e in zip(top.anchors, top.alts, strict=True) if not dead]


def _min_length(e: Expr) -> int:
    """The fewest characters a rule-free expression matches (an explicit stack: no recursion)."""
    done: dict[int, int] = {}
    stack: list[tuple[Expr, bool]] = [(e, False)]
    while stack:
        x, ready = stack.pop()
        if id(x) in done:
            continue
        kids = x.items if isinstance(x, Seq) else x.alts if isinstance(x, Choice) else \
            (x.expr,) if isinstance(x, Repeat) else ()
        if not ready and kids:
            stack.append((x, True))
            stack.extend((k, False) for k in kids)
            continue
        if isinstance(x, Literal):
            done[id(x)] = len(x.text)
        elif isinstance(x, CharClass):
            done[id(x)] = 1
        elif isinstance(x, Seq):
            done[id(x)] = sum(done[id(k)] for k in x.items)
        elif isinstance(x, Choice):
            done[id(x)] = min(done[id(k)] for k in x.alts)
        elif isinstance(x, Repeat):
            done[id(x)] = x.min * done[id(x.expr)]
        else:
            done[id(x)] = 0
    return done[id(e)]


def _quantifier(p: str, i: int) -> tuple[int, int | None, int] | None:
    """(min, max, index after) when a quantifier starts at `i`. A '{' that does not open a
    well-formed bound is a literal, as in both dialects."""
    c = p[i]
    if c == "*":
        return 0, None, i + 1
    if c == "+":
        return 1, None, i + 1
    if c == "?":
        return 0, 1, i + 1
    if c != "{":
        return None
    if _AMBIGUOUS_QUANTIFIER_RE.match(p, i):
        raise _err("'{,n}' is ambiguous (a bound in Python, literal text in ECMAScript); write {0,n}", i)
    m = _QUANTIFIER_RE.match(p, i)
    if m is None:
        return None
    digits = [m.group(1)] + ([m.group(3)] if m.group(3) else [])
    if any(len(d) > len(str(MAX_REPEAT)) or int(d) > MAX_REPEAT for d in digits):
        raise _limit(f"repetition bound above {MAX_REPEAT}", i)
    lo = int(m.group(1))
    if m.group(2) is None:
        hi: int | None = lo
    else:
        hi = int(m.group(3)) if m.group(3) else None
    if hi is not None and lo > hi:
        raise _err(f"bad bound {{{lo},{hi}}}: the minimum is above the maximum", i)
    return lo, hi, m.end()


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------

#: Leading flags a pattern may set for the whole of it: `(?i)`, `(?s)`, `(?is)`.
_LEADING_FLAGS_RE = re.compile(r"\(\?([is]+)\)")


@functools.lru_cache(maxsize=512)
def regex_to_expr(pattern: str, *, search: bool = False, flags: str = "") -> Expr:
    """The IR expression for `pattern` over decoded code points.

    ``search=False``: the expression accepts exactly the strings the regex fully matches.
    ``search=True``: JSON Schema ``pattern`` semantics, the strings in which the regex matches
    somewhere; each top-level alternative not anchored by ``^`` (``$``) may be preceded (followed)
    by any code points. `flags` (and a leading ``(?i)``, ``(?s)`` or ``(?is)`` group, the only
    place inline flags are read): ``i`` ignores case (Unicode simple case folding, as Python's
    re.IGNORECASE), ``s`` lets '.' match line terminators too. Results are cached: schemas repeat
    the same patterns.
    """
    if not isinstance(pattern, str):
        raise TypeError("pattern must be a str")
    if len(pattern.encode("utf-8", "surrogatepass")) > MAX_GRAMMAR_BYTES:
        raise GrammarLimitError(f"regex longer than {MAX_GRAMMAR_BYTES} bytes")
    start = 0
    lead = _LEADING_FLAGS_RE.match(pattern)
    if lead is not None:
        flags, start = flags + lead.group(1), lead.end()
    bad = set(flags) - set("is")
    if bad:
        raise RegexError(f"regular-expression flag {min(bad)!r} is not supported (only 'i' and 's' are)", 1, 1)
    alts = _parse(pattern, start, ANY_CHAR if "s" in flags else _DOT)
    if not alts:    # every alternative needs the input to start (end) where it cannot
        return CharClass(())
    if "i" in flags:
        alts = [(a, _ignoring_case(e), z) for a, e, z in alts]
    if not search:
        return _choice([e for _, e, _ in alts])
    anywhere = Repeat(ANY_CHAR, 0, None)
    # Factor the common case (no alternative anchored) so the prefix and suffix appear once.
    if not any(a or z for a, _, z in alts):
        return _seq([anywhere, _choice([e for _, e, _ in alts]), anywhere])
    return _choice([_seq(([] if a else [anywhere]) + [e] + ([] if z else [anywhere]))
                    for a, e, z in alts])


def regex_to_ir(pattern: str, *, search: bool = False, root: str = "root", flags: str = "") -> GrammarIR:
    """`pattern` as a grammar of one rule (see :func:`regex_to_expr` for `search` and `flags`)."""
    return GrammarIR([Rule(root, regex_to_expr(pattern, search=search, flags=flags))], root)


#: What a JSON string cannot hold unescaped: the quote, the backslash and the C0 controls.
_JSON_STRING_FORBIDDEN = ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C))


def inside_json_string(e: Expr) -> Expr:
    """`e` with every character it matches limited to what a JSON string holds unescaped, so the
    text can stand between a JSON string's quotes as it is (xgrammar's ``json_string=true``). A
    literal holding such a character matches nothing (an empty class)."""
    from .optimize import map_leaves

    forbidden = {cp for lo, hi in _JSON_STRING_FORBIDDEN for cp in range(lo, hi + 1)}

    def leaf(x: Expr) -> Expr:
        if isinstance(x, CharClass):
            kept = complement_ranges(normalize_ranges(list(complement_ranges(x.codepoint_ranges()))
                                                      + list(_JSON_STRING_FORBIDDEN)))
            return CharClass(tuple(kept))
        if isinstance(x, Literal) and any(ord(c) in forbidden for c in x.text):
            return CharClass(())
        return x

    return map_leaves(e, leaf)


@functools.lru_cache(maxsize=1)
def _case_variants() -> dict[int, tuple[int, ...]]:
    """Code point -> the other code points it matches ignoring case: the classes of Unicode simple
    case folding (one code point to one), built once from str.lower/upper/casefold."""
    groups: dict[int, set[int]] = {}
    for cp in range(0x20000):          # every cased letter lies in the first two planes
        if 0xD800 <= cp <= 0xDFFF:
            continue
        ch = chr(cp)
        for other in (ch.lower(), ch.upper(), ch.casefold()):
            if len(other) == 1 and other != ch:
                key = ord(other.casefold()) if len(other.casefold()) == 1 else ord(other)
                groups.setdefault(key, {key}).update((cp, ord(other)))
    out: dict[int, tuple[int, ...]] = {}
    for members in groups.values():
        for cp in members:
            out[cp] = tuple(sorted(members - {cp}))
    return out


def _fold_ranges(ranges: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """`ranges` with the case variants of their code points, sorted and merged."""
    variants = _case_variants()
    return normalize_ranges(list(ranges) + [(v, v) for cp in variants if any(lo <= cp <= hi for lo, hi in ranges)
                                            for v in variants[cp]])


def _ignoring_case(e: Expr) -> Expr:
    """`e` with every character matching its case variants too (a negated class excludes them)."""
    from .optimize import map_leaves

    def leaf(x: Expr) -> Expr:
        if isinstance(x, CharClass):
            return CharClass(_fold_ranges(x.codepoint_ranges() if not x.negated else x.ranges), x.negated)
        if isinstance(x, Literal) and x.text:
            parts = [CharClass(_fold_ranges(((ord(c), ord(c)),))) if _case_variants().get(ord(c)) else Literal(c)
                     for c in x.text]
            return parts[0] if len(parts) == 1 else Seq(tuple(parts))
        return x

    return map_leaves(e, leaf)
