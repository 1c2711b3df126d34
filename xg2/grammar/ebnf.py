"""EBNF front-end: xgrammar's EBNF dialect (a superset of llama.cpp GBNF) to and from the grammar IR.

Syntax accepted by :func:`parse_ebnf`::

    name ::= body            # a rule; the name must be the first token on its line
    body := alt ("|" alt)*   # alternatives; an empty alternative is an error (use "" or ())
    alt  := item+            # a sequence
    item := atom quantifier?
    atom := "literal" | [class] | [^class] | name | ( body ) | ( ) | TagDispatch(...) | FreeText(...)
          | Regex(...) | Substring(...) | Token(id, ...) | ExcludeToken(id, ...) | TokenTagDispatch(...)
    quantifier := * | + | ? | {m} | {m,} | {m,n}
    name ::= body (= body)   # optional lookahead assertion, only at the very end of a rule
    name[temperature=t] ::= body   # the sampling temperature inside the rule (Rule.temperature)

``Token(...)`` is one token among the ids, whatever its text; ``ExcludeToken(...)`` one token not
among them; ``TokenTagDispatch((id, rule), ..., excludes=(id, ...), loop_after_dispatch=true)``
tokens one at a time where a trigger token is followed by its rule (see ir.TokenSet).

``FreeText(ends=("s", ...), excludes=("s", ...))`` is xg2's own: text up to the first end string
(any text without ends) that holds no excluded string, the form TagDispatch and structural tags'
free text print as (their language written as an expression can be hundreds of thousands of nodes).

Names are ASCII letters, digits, ``_``, ``-`` and ``.``, not starting with a digit (so ``.`` is a
name character, not a wildcard, exactly as in xgrammar). ``#`` starts a comment that runs to the end
of the line. A rule body may span several lines; a new rule starts where ``name ::=`` appears.

Escapes (in string literals and character classes alike): ``\\n \\r \\t \\b \\f \\v \\a \\0 \\e``,
``\\" \\' \\\\ \\? \\/``, the regex punctuation ``\\^ \\$ \\. \\* \\+ \\( \\) \\[ \\] \\{ \\} \\| \\-``,
``\\xH...`` (one or more hex digits, read greedily as in xgrammar), ``\\uHHHH`` and
``\\UHHHHHHHH``. Escapes denote Unicode code points; surrogates and values above U+10FFFF are
rejected.

Every error is a :class:`~xg2.errors.GrammarError` (or :class:`~xg2.errors.GrammarLimitError` for
resource limits) carrying the 1-based line and column (counted in code points) of the offending
text. The parser is iterative (an explicit stack), so deeply nested input cannot exhaust the Python
stack; nesting is capped at :data:`MAX_NESTING_DEPTH`.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

from xg2.errors import GrammarError, GrammarLimitError
from xg2.grammar import budget
from xg2.grammar.ir import (
    EPSILON,
    MAX_CODEPOINT,
    CharClass,
    Choice,
    Expr,
    FreeText,
    GrammarIR,
    Literal,
    Repeat,
    Rule,
    RuleRef,
    Seq,
    TokenSet,
    Unbuildable,
    normalize_ranges,
)

from .ebnf_attributes import _ATTR_GROUP_RE, _rule_attributes, _with_char_budgets

__all__ = [
    "MAX_GRAMMAR_BYTES",
    "MAX_NESTING_DEPTH",
    "MAX_REPEAT",
    "parse_ebnf",
    "print_ebnf",
]

MAX_REPEAT = 100_000
"""Largest bound allowed in ``{m}``, ``{m,}`` and ``{m,n}``."""

MAX_GRAMMAR_BYTES = 4 * 1024 * 1024
"""Largest grammar text accepted, in UTF-8 bytes."""

MAX_NESTING_DEPTH = 1000
"""Deepest parenthesis nesting accepted (``(`` and ``(=`` both count)."""


MAX_SUBSTRING_CHUNKS = 256
"""Most chunks a Substring(...) takes (its automaton grows with the square of their number)."""

# ---------------------------------------------------------------------------------------------
# Lexer
# ---------------------------------------------------------------------------------------------

# Token kinds.
_NAME = "name"
_RULENAME = "rule name"
_ASSIGN = "'::='"
_STRING = "string"
_CLASS = "character class"
_INT = "integer"
_LPAREN = "'('"
_LOOKAHEAD = "'(='"
_RPAREN = "')'"
_PIPE = "'|'"
_STAR = "'*'"
_PLUS = "'+'"
_QUESTION = "'?'"
_LBRACE = "'{'"
_RBRACE = "'}'"
_COMMA = "','"
_EQUALS = "'='"
_ATTRS = "rule attributes"
_EOF = "end of input"

_PUNCT = {
    "(": _LPAREN,
    ")": _RPAREN,
    "|": _PIPE,
    "*": _STAR,
    "+": _PLUS,
    "?": _QUESTION,
    "{": _LBRACE,
    "}": _RBRACE,
    ",": _COMMA,
    "=": _EQUALS,
}

# The common tokens in one pattern; strings with escapes, classes and errors are lexed by hand.
_TOKEN_RE = re.compile(
    r"""
    (?P<ws>(?:[ \t\r\n]+|\#[^\r\n]*)+)
    | (?P<name>[A-Za-z_.\-][A-Za-z0-9_.\-]*)
    | (?P<str>"[^"\\\r\n\ud800-\udfff]*")
    | (?P<lookahead>\(=)
    | (?P<punct>[()|*+?{},=])
    | (?P<int>[0-9]+)
    | (?P<assign>::=)
    """,
    re.VERBOSE,
)
_NEWLINE_RE = re.compile(r"\r\n|\r|\n")
# The extent of a character class: up to the first unescaped ']' (escapes never contain ']').
_CLASS_EXTENT_RE = re.compile(r"\[(?:[^\]\\\r\n]|\\[^\r\n])*\]")
# A run of characters inside a string literal that need no special handling.
_STR_PLAIN_RE = re.compile(r'[^"\\\r\n\ud800-\udfff]+')

_SIMPLE_ESCAPES = {
    "n": 0x0A,
    "r": 0x0D,
    "t": 0x09,
    "b": 0x08,
    "f": 0x0C,
    "v": 0x0B,
    "a": 0x07,
    "0": 0x00,
    "e": 0x1B,
}
# Characters that stand for themselves after a backslash.
_SELF_ESCAPES = frozenset("\"'\\?/^$.*+()[]{}|-")
_SHORTHAND_CLASSES = frozenset("dDsSwW")
_HEX = frozenset("0123456789abcdefABCDEF")


@dataclass(slots=True)
class _Token:
    kind: str
    off: int
    value: object = None


class _Source:
    """The grammar text plus offset -> (line, column) conversion."""

    def __init__(self, text: str):
        self.text = text
        self.line_starts = [0] + [m.end() for m in _NEWLINE_RE.finditer(text)]

    def pos(self, off: int) -> tuple[int, int]:
        line = bisect.bisect_right(self.line_starts, off)
        return line, off - self.line_starts[line - 1] + 1

    def line_of(self, off: int) -> int:
        return bisect.bisect_right(self.line_starts, off)

    def error(self, message: str, off: int) -> GrammarError:
        line, col = self.pos(off)
        return GrammarError(message, line, col)

    def limit_error(self, message: str, off: int) -> GrammarLimitError:
        line, col = self.pos(off)
        return GrammarLimitError(message, line, col)


def _check_codepoint(src: _Source, cp: int, off: int) -> int:
    if cp > MAX_CODEPOINT:
        raise src.error(f"invalid code point U+{cp:X} (above U+10FFFF)", off)
    if 0xD800 <= cp <= 0xDFFF:
        raise src.error(f"invalid code point U+{cp:04X} (surrogate)", off)
    return cp


def _read_escape(src: _Source, pos: int) -> tuple[int, int]:
    """Read the escape sequence starting at the backslash at `pos`; return (code point, end)."""
    text = src.text
    if pos + 1 >= len(text):
        raise src.error("incomplete escape sequence", pos)
    c = text[pos + 1]
    if c in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[c], pos + 2
    if c in _SELF_ESCAPES:
        return ord(c), pos + 2
    if c == "x":
        end = pos + 2
        while end < len(text) and text[end] in _HEX:
            end += 1
        if end == pos + 2:
            raise src.error("invalid escape '\\x': expected hex digits", pos)
        return _check_codepoint(src, int(text[pos + 2 : end], 16), pos), end
    if c in ("u", "U"):
        width = 4 if c == "u" else 8
        digits = text[pos + 2 : pos + 2 + width]
        if len(digits) != width or any(d not in _HEX for d in digits):
            raise src.error(f"invalid escape '\\{c}': expected exactly {width} hex digits", pos)
        return _check_codepoint(src, int(digits, 16), pos), pos + 2 + width
    if c in _SHORTHAND_CLASSES:
        raise src.error(
            f"shorthand class '\\{c}' is not supported; write the ranges explicitly",
            pos,
        )
    shown = c if c.isprintable() else f"U+{ord(c):04X}"
    raise src.error(f"invalid escape sequence '\\{shown}'", pos)


def _lex_string(src: _Source, start: int) -> tuple[str, int]:
    text = src.text
    n = len(text)
    pos = start + 1
    parts: list[str] = []
    while True:
        m = _STR_PLAIN_RE.match(text, pos)
        if m:
            parts.append(m.group())
            pos = m.end()
        if pos >= n or text[pos] in "\r\n":
            raise src.error("unterminated string literal", start)
        c = text[pos]
        if c == '"':
            return "".join(parts), pos + 1
        if c == "\\":
            if pos + 1 >= n or text[pos + 1] in "\r\n":
                raise src.error("unterminated string literal", start)
            cp, pos = _read_escape(src, pos)
            parts.append(chr(cp))
        else:  # a raw surrogate code point
            raise src.error(f"invalid code point U+{ord(c):04X} (surrogate)", pos)


_DASH = -1  # marker for an unescaped '-' inside a character class


def _lex_class(src: _Source, start: int) -> tuple[CharClass, int]:
    text = src.text
    n = len(text)
    pos = start + 1
    negated = False
    if pos < n and text[pos] == "^":
        negated = True
        pos += 1
    items: list[tuple[int, int]] = []  # (code point or _DASH, offset)
    while True:
        if pos >= n or text[pos] in "\r\n":
            raise src.error("unterminated character class", start)
        c = text[pos]
        if c == "]":
            pos += 1
            break
        if c == "\\":
            if pos + 1 >= n or text[pos + 1] in "\r\n":
                raise src.error("unterminated character class", start)
            cp, end = _read_escape(src, pos)
            items.append((cp, pos))
            pos = end
        elif c == "-":
            items.append((_DASH, pos))
            pos += 1
        else:
            items.append((_check_codepoint(src, ord(c), pos), pos))
            pos += 1
    ranges: list[tuple[int, int]] = []
    j = 0
    while j < len(items):
        cp, off = items[j]
        lo = ord("-") if cp == _DASH else cp
        if j + 2 < len(items) and items[j + 1][0] == _DASH:
            hi_cp = items[j + 2][0]
            hi = ord("-") if hi_cp == _DASH else hi_cp
            if lo > hi:
                raise src.error(
                    f"invalid character range: U+{lo:04X} is greater than U+{hi:04X}",
                    off,
                )
            ranges.append((lo, hi))
            j += 3
        else:
            ranges.append((lo, lo))
            j += 1
    return CharClass(normalize_ranges(ranges), negated), pos


def _tokenize(src: _Source) -> list[_Token]:
    text = src.text
    n = len(text)
    toks: list[_Token] = []
    append = toks.append
    match = _TOKEN_RE.match
    class_cache: dict[str, CharClass] = {}
    pos = 0
    while pos < n:
        if not len(toks) & 1023:
            budget.check("reading the grammar")
        m = match(text, pos)
        if m is not None:
            group = m.lastgroup
            end = m.end()
            if group == "ws":
                pass
            elif group == "name":
                append(_Token(_NAME, pos, m.group()))
            elif group == "str":
                value = text[pos + 1 : end - 1]
                append(_Token(_STRING, pos, value))
            elif group == "punct":
                append(_Token(_PUNCT[m.group()], pos))
            elif group == "int":
                append(_Token(_INT, pos, m.group()))
            elif group == "assign":
                append(_Token(_ASSIGN, pos))
            else:  # "lookahead"
                append(_Token(_LOOKAHEAD, pos))
            pos = end
            continue
        c = text[pos]
        if c == '"':  # a string with escapes (or an invalid one)
            value, end = _lex_string(src, pos)
            append(_Token(_STRING, pos, value))
            pos = end
        elif c == "[" and toks and toks[-1].kind == _NAME and toks[-1].off + len(str(toks[-1].value)) == pos \
                and (len(toks) == 1 or src.line_of(toks[-2].off) != src.line_of(toks[-1].off)) \
                and (attrs := _ATTR_GROUP_RE.match(text, pos)) is not None:
            append(_Token(_ATTRS, pos, _rule_attributes(src, pos, attrs.group(1))))
            pos = attrs.end()
        elif c == "[":
            # Grammars repeat the same classes ([0-9], [ \t\n]...): lex each distinct one once.
            extent = _CLASS_EXTENT_RE.match(text, pos)
            key = extent.group() if extent is not None else None
            cls = class_cache.get(key) if key is not None else None
            if cls is None:
                cls, end = _lex_class(src, pos)
                if key is not None:
                    class_cache[key] = cls
            else:
                end = extent.end()
            append(_Token(_CLASS, pos, cls))
            pos = end
        elif c == ":":
            raise src.error("unexpected ':' (did you mean '::='?)", pos)
        else:
            shown = repr(c) if c.isprintable() else f"U+{ord(c):04X}"
            raise src.error(f"unexpected character {shown}", pos)
    append(_Token(_EOF, n))
    # '=' names an argument of TagDispatch, FreeText or Regex and means nothing anywhere else.
    depth = 0           # parentheses open inside a TagDispatch(...), FreeText(...) or Regex(...)
    for i, tok in enumerate(toks):
        if depth:
            depth += (tok.kind in (_LPAREN, _LOOKAHEAD)) - (tok.kind == _RPAREN)
        elif tok.kind == _LPAREN and i and toks[i - 1].kind == _NAME \
                and toks[i - 1].value in ("TagDispatch", "TokenTagDispatch", "FreeText", "Regex"):
            depth = 1
        elif tok.kind == _EQUALS:
            raise src.error("unexpected character '='", tok.off)
    # A name directly followed by '::=' starts a rule; it must be the first token on its line.
    for i, tok in enumerate(toks):
        if tok.kind != _ASSIGN:
            continue
        at = i - 1 if i >= 2 and toks[i - 1].kind == _ATTRS else i      # past a name's attributes
        if at == 0 or toks[at - 1].kind != _NAME:
            raise src.error("'::=' must follow a rule name", tok.off)
        name_tok = toks[at - 1]
        if at >= 2 and src.line_of(toks[at - 2].off) == src.line_of(name_tok.off):
            raise src.error(
                f"rule name '{name_tok.value}' must be at the beginning of a line",
                name_tok.off,
            )
        name_tok.kind = _RULENAME
    return toks


# ---------------------------------------------------------------------------------------------
# Parser
# ---------------------------------------------------------------------------------------------


def _make_seq(items: list[Expr]) -> Expr:
    """A sequence with nested sequences spliced in and epsilons dropped."""
    flat: list[Expr] = []
    for item in items:
        if isinstance(item, Seq):
            flat.extend(item.items)
        elif isinstance(item, Literal) and item.text == "":
            continue
        else:
            flat.append(item)
    if not flat:
        return EPSILON
    if len(flat) == 1:
        return flat[0]
    return Seq(tuple(flat))


def _make_choice(alts: list[Expr]) -> Expr:
    flat: list[Expr] = []
    for alt in alts:
        if isinstance(alt, Choice):
            flat.extend(alt.alts)
        else:
            flat.append(alt)
    if len(flat) == 1:
        return flat[0]
    return Choice(tuple(flat))


@dataclass(slots=True)
class _Frame:
    kind: str  # "body", "group" or "lookahead"
    open_off: int  # offset of '::=', '(' or '(='
    alts: list[Expr] = field(default_factory=list)
    items: list[Expr] = field(default_factory=list)
    last_pipe_off: int = -1
    quantifiable: bool = False  # the last item may still take a quantifier


class _Parser:
    def __init__(self, src: _Source, toks: list[_Token], rule_names: set[str]):
        self.src = src
        self.toks = toks
        self.rule_names = rule_names
        self.i = 0
        # rule -> (max_chars or -1, offset, lazy): the attributes built into the rule's language
        self.char_budgets: dict[str, tuple[int, int, bool]] = {}

    def _finish(self, frame: _Frame, rule_name: str) -> Expr:
        if not frame.items:
            if frame.alts:
                raise self.src.error("empty alternative after '|'", frame.last_pipe_off)
            if frame.kind == "body":
                raise self.src.error(f"rule '{rule_name}' has an empty body", frame.open_off)
            raise self.src.error("empty lookahead assertion", frame.open_off)
        return _make_choice([*frame.alts, _make_seq(frame.items)])

    def _parse_repeat_range(self) -> tuple[int, int | None]:
        """Parse `{m}`, `{m,}` or `{m,n}`; self.i is at the '{'."""
        src, toks = self.src, self.toks
        self.i += 1
        tok = toks[self.i]
        if tok.kind == _COMMA:
            raise src.error("repetition needs a lower bound: write {0,n} instead of {,n}", tok.off)
        lo = self._bound(tok)
        self.i += 1
        tok = toks[self.i]
        if tok.kind == _RBRACE:
            self.i += 1
            return lo, lo
        if tok.kind != _COMMA:
            raise src.error(f"expected ',' or '}}' in repetition, found {tok.kind}", tok.off)
        self.i += 1
        tok = toks[self.i]
        if tok.kind == _RBRACE:
            self.i += 1
            return lo, None
        # xgrammar's printer writes {m, -1} for "unbounded"; accept it.
        if tok.kind == _NAME and tok.value == "-1":
            hi: int | None = None
        else:
            hi = self._bound(tok)
            if hi < lo:
                raise src.error(
                    f"repetition lower bound {lo} is greater than upper bound {hi}",
                    tok.off,
                )
        self.i += 1
        tok = toks[self.i]
        if tok.kind != _RBRACE:
            raise src.error(f"expected '}}' to close repetition, found {tok.kind}", tok.off)
        self.i += 1
        return lo, hi

    def _bound(self, tok: _Token) -> int:
        if tok.kind != _INT:
            raise self.src.error(f"expected an integer in repetition, found {tok.kind}", tok.off)
        digits = str(tok.value).lstrip("0")
        if len(digits) > len(str(MAX_REPEAT)) or int(digits or "0") > MAX_REPEAT:
            raise self.src.limit_error(
                f"repetition bound {tok.value} exceeds the limit of {MAX_REPEAT}",
                tok.off,
            )
        return int(digits or "0")

    def _tag_dispatch(self) -> Expr:
        """`TagDispatch(("tag", rule), ..., stop_eos=true, stop_str=("s", ...),
        loop_after_dispatch=true, excludes=("s", ...))`, self.i at its name: free text in which
        a tag's first occurrence is followed by its rule (see text.dispatching)."""
        from .text import dispatching

        src, toks = self.src, self.toks
        start = toks[self.i].off
        self.i += 2
        after: dict[str, Expr | None] = {}
        opts: dict[str, object] = {"stop_eos": True, "stop_str": (), "loop_after_dispatch": True, "excludes": ()}
        seen: set[str] = set()

        def take(kind: str, what: str) -> _Token:
            tok = toks[self.i]
            if tok.kind != kind:
                raise src.error(f"expected {what} in TagDispatch, got {tok.kind}", tok.off)
            self.i += 1
            return tok

        while toks[self.i].kind != _RPAREN:
            tok = toks[self.i]
            if tok.kind == _LPAREN:            # ("tag", rule)
                self.i += 1
                tag = take(_STRING, "a tag string")
                take(_COMMA, "','")
                rule = take(_NAME, "a rule name")
                take(_RPAREN, "')'")
                if not tag.value:
                    raise src.error("a TagDispatch tag must not be empty", tag.off)
                if tag.value in after:
                    raise src.error(f"tag {tag.value!r} given twice", tag.off)
                if rule.value not in self.rule_names:
                    raise src.error(f"rule '{rule.value}' is not defined", rule.off)
                after[str(tag.value)] = RuleRef(str(rule.value))
            elif tok.kind == _NAME and toks[self.i + 1].kind == _EQUALS:
                name = str(tok.value)
                if name not in opts or name in seen:
                    raise src.error(f"unknown or repeated TagDispatch argument '{name}'", tok.off)
                seen.add(name)
                self.i += 2
                if name in ("stop_eos", "loop_after_dispatch"):
                    value = take(_NAME, "true or false")
                    if value.value not in ("true", "false"):
                        raise src.error(f"'{name}' takes true or false", value.off)
                    opts[name] = value.value == "true"
                else:
                    take(_LPAREN, "'('")
                    strings = []
                    while toks[self.i].kind != _RPAREN:
                        s = take(_STRING, "a string")
                        if not s.value:
                            raise src.error(f"the strings of '{name}' must not be empty", s.off)
                        strings.append(str(s.value))
                        if toks[self.i].kind != _RPAREN:
                            take(_COMMA, "','")
                    self.i += 1
                    opts[name] = tuple(strings)
            else:
                raise src.error(f"unexpected {tok.kind} in TagDispatch", tok.off)
            if toks[self.i].kind != _RPAREN:
                take(_COMMA, "','")
        self.i += 1
        if not opts["stop_eos"] and not opts["stop_str"]:
            raise src.error("TagDispatch needs stop_eos=true or a stop string to end", start)
        for tag in after:
            for x in opts["excludes"]:  # type: ignore[attr-defined]
                if tag.startswith(x):   # the free text could never reach the trigger
                    raise src.error(f"Exclude string must not be a prefix of trigger string: {tag} (the excluded "
                                    f"{x!r} would keep the trigger from ever being written)", start)
        try:
            expr = dispatching(after, opts["excludes"], opts["stop_str"], opts["stop_eos"], opts["loop_after_dispatch"])
        except ValueError as e:
            raise src.error(str(e), start) from None
        # In the form the parser gives its own text, so that printing and parsing again gives
        # the same IR (parse_ebnf's promise).
        text = f"tag_dispatch ::= {_print_expr(expr)}\n"
        sub = _Source(text)
        return _Parser(sub, _tokenize(sub), self.rule_names | {"tag_dispatch"}).parse_rule().body

    def _token_tag_dispatch(self) -> Expr:
        """`TokenTagDispatch((token_id, rule), ..., excludes=(id, ...), loop_after_dispatch=true)`,
        self.i at its name: tokens one at a time, any but the excluded and the triggers; a
        trigger token is followed by its rule, then (looping) more of the same, or the end. As
        token sets: ``(ExcludeToken(T + E) | Token(t1) r1 | ...)*``, or without the loop
        ``ExcludeToken(T + E)* (Token(t1) r1 | ...)?``."""
        src, toks = self.src, self.toks
        start = toks[self.i].off
        self.i += 2
        after: dict[int, RuleRef] = {}
        excludes: set[int] = set()
        loop, seen = True, set()

        def take(kind: str, what: str) -> _Token:
            tok = toks[self.i]
            if tok.kind != kind:
                raise src.error(f"expected {what} in TokenTagDispatch, got {tok.kind}", tok.off)
            self.i += 1
            return tok

        def token_id(tok: _Token) -> int:
            if len(str(tok.value)) > 10 or int(str(tok.value)) >= 2**31:
                raise src.error(f"token id {tok.value} is too large", tok.off)
            return int(str(tok.value))

        while toks[self.i].kind != _RPAREN:
            tok = toks[self.i]
            if tok.kind == _LPAREN:            # (token_id, rule)
                self.i += 1
                trigger = take(_INT, "a trigger token id")
                take(_COMMA, "','")
                rule = take(_NAME, "a rule name")
                take(_RPAREN, "')'")
                t = token_id(trigger)
                if t in after:
                    raise src.error(f"trigger token {t} given twice", trigger.off)
                if rule.value not in self.rule_names:
                    raise src.error(f"rule '{rule.value}' is not defined", rule.off)
                after[t] = RuleRef(str(rule.value))
            elif tok.kind == _NAME and toks[self.i + 1].kind == _EQUALS and tok.value not in seen \
                    and tok.value in ("excludes", "loop_after_dispatch"):
                seen.add(str(tok.value))
                self.i += 2
                if tok.value == "loop_after_dispatch":
                    value = take(_NAME, "true or false")
                    if value.value not in ("true", "false"):
                        raise src.error("'loop_after_dispatch' takes true or false", value.off)
                    loop = value.value == "true"
                else:
                    take(_LPAREN, "'('")
                    while toks[self.i].kind != _RPAREN:
                        excludes.add(token_id(take(_INT, "a token id")))
                        if toks[self.i].kind != _RPAREN:
                            take(_COMMA, "','")
                    self.i += 1
            else:
                raise src.error(f"unexpected {tok.kind} in TokenTagDispatch (arguments: (token_id, rule) pairs, "
                                "excludes=(...), loop_after_dispatch=...)", tok.off)
            if toks[self.i].kind != _RPAREN:
                take(_COMMA, "','")
        self.i += 1
        overlap = sorted(excludes & set(after))
        if overlap:
            raise src.error(f"token {overlap[0]} is both a trigger and excluded in TokenTagDispatch", start)
        plain = TokenSet(tuple(sorted(excludes | set(after))), True)
        branches = [Seq((TokenSet((t,)), r)) for t, r in sorted(after.items())]
        if loop:
            return Repeat(_make_choice([plain, *branches]), 0, None)
        tail = [Repeat(_make_choice(branches), 0, 1)] if branches else []
        return _make_seq([Repeat(plain, 0, None), *tail])

    def _regex(self) -> Expr:
        """xgrammar's `Regex("pattern")` / `Regex("pattern", flags="is")` macro, self.i at its
        name: the pattern's expression in place (regex.regex_to_expr; '.' stops at line ends
        unless flag 's' is given, 'i' ignores case)."""
        from ..errors import RegexError
        from .regex import inside_json_string, regex_to_expr

        src, toks = self.src, self.toks
        start = toks[self.i].off
        self.i += 2
        pattern = toks[self.i]
        if pattern.kind == _RPAREN or (pattern.kind == _STRING and toks[self.i + 1].kind == _COMMA
                                       and toks[self.i + 2].kind == _STRING):
            raise src.error("Regex expects exactly one string argument", pattern.off)
        if pattern.kind != _STRING:
            raise src.error("Regex pattern must be a string literal", pattern.off)
        self.i += 1
        flags, json_string, seen = "", False, set()
        while toks[self.i].kind == _COMMA:
            name = toks[self.i + 1]
            if name.kind != _NAME or toks[self.i + 2].kind != _EQUALS:
                raise src.error("Regex expects exactly one string argument", name.off)
            if name.value not in ("flags", "json_string") or name.value in seen:
                what = "repeats" if name.value in seen else "does not support"
                raise src.error(f"Regex {what} the named argument {name.value}", name.off)
            seen.add(name.value)
            value = toks[self.i + 3]
            if name.value == "flags":
                if value.kind != _STRING:
                    raise src.error("Regex's flags must be a string such as \"i\" or \"is\"", value.off)
                flags = str(value.value)
                bad = sorted(set(flags) - set("isu"))
                if bad:
                    raise src.error(f"regular-expression flag {bad[0]!r} is not supported (only i, s and u "
                                    "are)", value.off)
                flags = flags.replace("u", "")   # patterns are always read as code points
            else:
                if value.kind != _NAME or value.value not in ("true", "false"):
                    raise src.error("Regex's json_string must be a boolean (true or false)", value.off)
                json_string = value.value == "true"
            self.i += 4
        if toks[self.i].kind != _RPAREN:
            raise src.error(f"expected ')' after Regex's arguments, got {toks[self.i].kind}", toks[self.i].off)
        self.i += 1
        try:
            expr = regex_to_expr(str(pattern.value), flags=flags)
        except RegexError as e:
            # Read, not built: the grammar compiles to this error (as xgrammar's, at first use).
            line, col = src.pos(start)
            return Unbuildable(src.text[start:toks[self.i - 1].off + 1], f"in Regex: {e.message} (column "
                               f"{e.column} of the pattern)", line, col)
        return inside_json_string(expr) if json_string else expr

    def _token_set(self, exclude: bool) -> Expr:
        """xgrammar's `Token(id, ...)` (one token among these ids, whatever its text) and
        `ExcludeToken(id, ...)` (one token not among them), self.i at the name: a TokenSet."""
        src, toks = self.src, self.toks
        name = "ExcludeToken" if exclude else "Token"
        start = toks[self.i].off
        self.i += 2
        ids: set[int] = set()
        while toks[self.i].kind != _RPAREN:
            tok = toks[self.i]
            if tok.kind != _INT:
                raise src.error(f"{name} takes token ids (non-negative integers), got {tok.kind}", tok.off)
            if len(str(tok.value)) > 10 or int(str(tok.value)) >= 2**31:
                raise src.error(f"token id {tok.value} is too large", tok.off)
            ids.add(int(str(tok.value)))
            self.i += 1
            if toks[self.i].kind == _COMMA:
                self.i += 1
            elif toks[self.i].kind != _RPAREN:
                raise src.error(f"expected ',' or ')' in {name}, got {toks[self.i].kind}", toks[self.i].off)
        self.i += 1
        if not ids and not exclude:
            raise src.error("Token needs at least one token id", start)
        return TokenSet(tuple(sorted(ids)), exclude)

    def _substring(self) -> Expr:
        """xgrammar's `Substring("c1", "c2", ...)` macro, self.i at its name: any contiguous run of
        the chunks in their order, each chunk whole (the empty run included). Written as the
        choice of each chunk followed by an optional run of the next ones: linear in the chunks."""
        src, toks = self.src, self.toks
        start = toks[self.i].off
        self.i += 2
        chunks: list[str] = []
        while toks[self.i].kind != _RPAREN:
            tok = toks[self.i]
            if tok.kind != _STRING:
                raise src.error(f"Substring takes string literals, got {tok.kind}", tok.off)
            chunks.append(str(tok.value))
            self.i += 1
            if toks[self.i].kind == _COMMA:
                self.i += 1
            elif toks[self.i].kind != _RPAREN:
                raise src.error(f"expected ',' or ')' in Substring, got {toks[self.i].kind}", toks[self.i].off)
        self.i += 1
        chunks = [c for c in chunks if c]       # an empty chunk changes no run
        if len(chunks) > MAX_SUBSTRING_CHUNKS:
            raise src.limit_error(f"Substring with more than {MAX_SUBSTRING_CHUNKS} chunks", start)
        rest: Expr = EPSILON                    # the runs that may follow chunk j-1
        starts: list[Expr] = []
        for chunk in reversed(chunks):
            run = Seq((Literal(chunk), rest)) if rest != EPSILON else Literal(chunk)
            starts.append(run)
            rest = Repeat(run, 0, 1)
        return Choice((EPSILON, *reversed(starts))) if starts else EPSILON

    def _free_text(self) -> Expr:
        """`FreeText(ends=("s", ...), excludes=("s", ...))`, self.i at its name: the IR leaf of
        text.text_until, written so that the printed form of TagDispatch and of structural tags'
        free text parses back to the same IR."""
        from .text import text_until

        src, toks = self.src, self.toks
        start = toks[self.i].off
        self.i += 2
        args: dict[str, tuple[str, ...]] = {}
        while toks[self.i].kind != _RPAREN:
            tok = toks[self.i]
            if tok.kind != _NAME or tok.value not in ("ends", "excludes") or tok.value in args \
                    or toks[self.i + 1].kind != _EQUALS or toks[self.i + 2].kind != _LPAREN:
                raise src.error("FreeText takes ends=(\"s\", ...) and excludes=(\"s\", ...)", tok.off)
            self.i += 3
            strings = []
            while toks[self.i].kind != _RPAREN:
                s = toks[self.i]
                if s.kind != _STRING:
                    raise src.error(f"expected a string in FreeText, got {s.kind}", s.off)
                if not s.value:
                    raise src.error("the strings of FreeText must not be empty", s.off)
                strings.append(str(s.value))
                self.i += 1
                if toks[self.i].kind == _COMMA:
                    self.i += 1
                elif toks[self.i].kind != _RPAREN:
                    raise src.error(f"expected ',' or ')' in FreeText, got {toks[self.i].kind}", toks[self.i].off)
            self.i += 1
            args[str(tok.value)] = tuple(strings)
            if toks[self.i].kind == _COMMA:
                self.i += 1
        self.i += 1
        try:
            expr = text_until(args.get("ends", ()), args.get("excludes", ()))
        except ValueError as e:
            raise src.error(str(e), start) from None
        if expr is None:
            raise src.error("no FreeText can end without an excluded string", start)
        return expr

    def parse_rule(self) -> Rule:
        """Parse one rule; self.i is at its name."""
        src, toks = self.src, self.toks
        name_tok = toks[self.i]
        name = str(name_tok.value)
        self.i += 1
        attrs: dict[str, object] = {}
        if toks[self.i].kind == _ATTRS:
            attrs = toks[self.i].value      # type: ignore[assignment]
            self.i += 1
        stack = [_Frame("body", toks[self.i].off)]
        self.i += 1
        body: Expr | None = None
        lookahead: Expr | None = None
        while True:
            tok = toks[self.i]
            top = stack[-1]
            kind = tok.kind
            if kind == _STRING:
                top.items.append(Literal(str(tok.value)) if tok.value else EPSILON)
                top.quantifiable = True
                self.i += 1
            elif kind == _CLASS:
                assert isinstance(tok.value, CharClass)
                top.items.append(tok.value)
                top.quantifiable = True
                self.i += 1
            elif kind == _NAME:
                ref = str(tok.value)
                if ref == "TagDispatch" and ref not in self.rule_names and toks[self.i + 1].kind == _LPAREN:
                    top.items.append(self._tag_dispatch())
                    top.quantifiable = True
                    continue
                if ref == "Regex" and ref not in self.rule_names and toks[self.i + 1].kind == _LPAREN:
                    top.items.append(self._regex())
                    top.quantifiable = True
                    continue
                if ref == "TokenTagDispatch" and ref not in self.rule_names and toks[self.i + 1].kind == _LPAREN:
                    top.items.append(self._token_tag_dispatch())
                    top.quantifiable = True
                    continue
                if ref in ("Token", "ExcludeToken") and ref not in self.rule_names \
                        and toks[self.i + 1].kind == _LPAREN:
                    top.items.append(self._token_set(ref == "ExcludeToken"))
                    top.quantifiable = True
                    continue
                if ref == "Substring" and ref not in self.rule_names and toks[self.i + 1].kind == _LPAREN:
                    top.items.append(self._substring())
                    top.quantifiable = True
                    continue
                if ref == "FreeText" and ref not in self.rule_names and toks[self.i + 1].kind == _LPAREN:
                    top.items.append(self._free_text())
                    top.quantifiable = True
                    continue
                if ref not in self.rule_names:
                    hint = ""
                    if ref == ".":
                        hint = " (there is no '.' wildcard; [^] matches any character)"
                    elif src.line_of(toks[self.i - 1].off) != src.line_of(tok.off):
                        hint = " (missing '::=' after a rule name?)"
                    raise src.error(f"rule '{ref}' is not defined{hint}", tok.off)
                top.items.append(RuleRef(ref))
                top.quantifiable = True
                self.i += 1
            elif kind in (_STAR, _PLUS, _QUESTION, _LBRACE):
                if not top.quantifiable:
                    what = "{...}" if kind == _LBRACE else kind.strip("'")
                    if top.items:
                        msg = f"quantifier '{what}' cannot follow another quantifier; use parentheses"
                    else:
                        msg = f"quantifier '{what}' has nothing to repeat"
                    raise src.error(msg, tok.off)
                if kind == _STAR:
                    lo, hi = 0, None
                    self.i += 1
                elif kind == _PLUS:
                    lo, hi = 1, None
                    self.i += 1
                elif kind == _QUESTION:
                    lo, hi = 0, 1
                    self.i += 1
                else:
                    lo, hi = self._parse_repeat_range()
                top.items[-1] = Repeat(top.items[-1], lo, hi)
                top.quantifiable = False
            elif kind in (_LPAREN, _LOOKAHEAD):
                if len(stack) > MAX_NESTING_DEPTH:
                    raise src.limit_error(
                        f"parentheses nested deeper than {MAX_NESTING_DEPTH} levels",
                        tok.off,
                    )
                if kind == _LOOKAHEAD:
                    if top.kind != "body":
                        raise src.error(
                            "a lookahead assertion '(=' is only allowed at the end of a rule",
                            tok.off,
                        )
                    body = self._finish(top, name)
                    stack.append(_Frame("lookahead", tok.off))
                else:
                    stack.append(_Frame("group", tok.off))
                self.i += 1
            elif kind == _RPAREN:
                if top.kind == "body":
                    raise src.error("unbalanced ')'", tok.off)
                self.i += 1
                if top.kind == "lookahead":
                    lookahead = self._finish(top, name)
                    nxt = toks[self.i]
                    if nxt.kind not in (_RULENAME, _EOF):
                        raise src.error(
                            "a lookahead assertion must be the last element of a rule",
                            nxt.off,
                        )
                    break
                if not top.items and not top.alts:
                    result: Expr = EPSILON  # "( )" is the empty string
                else:
                    result = self._finish(top, name)
                stack.pop()
                stack[-1].items.append(result)
                stack[-1].quantifiable = True
            elif kind == _PIPE:
                if not top.items:
                    raise src.error("empty alternative before '|'", tok.off)
                top.alts.append(_make_seq(top.items))
                top.items = []
                top.last_pipe_off = tok.off
                top.quantifiable = False
                self.i += 1
            elif kind in (_RULENAME, _EOF):
                if top.kind != "body":
                    what = "'(='" if top.kind == "lookahead" else "'('"
                    raise src.error(f"unclosed {what}", top.open_off)
                body = self._finish(top, name)
                break
            else:  # _INT, _COMMA, _RBRACE
                shown = f"integer {tok.value}" if kind == _INT else kind
                raise src.error(f"unexpected {shown}", tok.off)
        assert body is not None
        capture = attrs.get("capture")
        if "max_chars" in attrs or "lazy" in attrs:
            self.char_budgets[name] = (int(attrs.get("max_chars", -1)), name_tok.off,  # type: ignore[arg-type]
                                       bool(attrs.get("lazy")))
        return Rule(name, body, lookahead, temperature=attrs.get("temperature"),  # type: ignore[arg-type]
                    capture=None if capture is None else str(capture) or name,
                    max_tokens=attrs.get("max_tokens"))  # type: ignore[arg-type]


def parse_ebnf(text: str, root_rule_name: str = "root") -> GrammarIR:
    """Parse an EBNF grammar into the IR.

    The returned rules are ordered root first, then the others in definition order, so that
    ``parse_ebnf(print_ebnf(ir)) == ir`` for every IR this function returns.
    """
    if not isinstance(text, str):
        raise TypeError(f"grammar text must be str, not {type(text).__name__}")
    if len(text) > MAX_GRAMMAR_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_GRAMMAR_BYTES:
        raise GrammarLimitError(f"grammar text exceeds the limit of {MAX_GRAMMAR_BYTES} bytes")
    src = _Source(text)
    toks = _tokenize(src)

    first = toks[0]
    if first.kind == _NAME:
        raise src.error(f"expected '::=' after rule name '{first.value}'", toks[1].off)
    if first.kind not in (_RULENAME, _EOF):
        raise src.error(f"expected a rule definition 'name ::= ...', found {first.kind}", first.off)
    rule_names: set[str] = set()
    for tok in toks:
        if tok.kind == _RULENAME:
            if tok.value in rule_names:
                raise src.error(f"rule '{tok.value}' is defined more than once", tok.off)
            rule_names.add(str(tok.value))
    if root_rule_name not in rule_names:
        raise GrammarError(f"the root rule '{root_rule_name}' is not defined", 1, 1)

    parser = _Parser(src, toks, rule_names)
    rules: list[Rule] = []
    # Each rule body runs up to the next rule name, so every iteration starts at one.
    while toks[parser.i].kind != _EOF:
        budget.check("parsing the grammar")
        rules.append(parser.parse_rule())
    if parser.char_budgets:
        rules = _with_char_budgets(rules, parser.char_budgets, src)
    # Stable sort: root first, the others in definition order.
    rules.sort(key=lambda r: r.name != root_rule_name)
    return GrammarIR(rules=rules, root=root_rule_name)


# ---------------------------------------------------------------------------------------------
# Printer
# ---------------------------------------------------------------------------------------------

_NAMED_OUT = {0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}
_FULL_NAME_RE = re.compile(r"[A-Za-z_.\-][A-Za-z0-9_.\-]*\Z")


def _escape_cp(cp: int, specials: str) -> str:
    ch = chr(cp)
    if ch in specials:
        return "\\" + ch
    if cp in _NAMED_OUT:
        return _NAMED_OUT[cp]
    if ch.isprintable():
        return ch
    # Fixed-width escapes only: the greedy '\x' form could swallow a following hex digit.
    return f"\\u{cp:04x}" if cp <= 0xFFFF else f"\\U{cp:08x}"


def _print_literal(text: str) -> str:
    return '"' + "".join(_escape_cp(ord(c), '"\\') for c in text) + '"'


def _print_class(cc: CharClass) -> str:
    specials = "\\]-^["
    parts = ["[^" if cc.negated else "["]
    for lo, hi in cc.ranges:
        parts.append(_escape_cp(lo, specials))
        if hi != lo:
            parts.append("-")
            parts.append(_escape_cp(hi, specials))
    parts.append("]")
    return "".join(parts)


def _quantifier(lo: int, hi: int | None) -> str:
    if hi is None:
        return "*" if lo == 0 else "+" if lo == 1 else f"{{{lo},}}"
    if (lo, hi) == (0, 1):
        return "?"
    return f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}"


# Printing contexts: how tightly the surrounding syntax binds.
_CTX_TOP = 0  # rule body / inside parentheses: anything goes
_CTX_SEQ_ITEM = 1  # an item of a sequence: choices need parentheses
_CTX_POSTFIX = 2  # operand of a quantifier: only atoms go bare


def _print_expr(root: Expr) -> str:
    """Render an expression; iterative so deep IR cannot overflow the Python stack."""
    out: list[str] = []
    # Work items: ("expr", expr, ctx) to render, or ("text", s) to emit.
    work: list[tuple] = [("expr", root, _CTX_TOP)]
    while work:
        item = work.pop()
        if item[0] == "text":
            out.append(item[1])
            continue
        _, e, ctx = item
        if isinstance(e, Literal):
            out.append(_print_literal(e.text))
        elif isinstance(e, CharClass):
            out.append(_print_class(e))
        elif isinstance(e, RuleRef):
            out.append(e.name)
        elif isinstance(e, TokenSet):
            out.append(f"{'ExcludeToken' if e.exclude else 'Token'}({', '.join(map(str, e.ids))})")
        elif isinstance(e, Unbuildable):
            out.append(e.source)
        elif isinstance(e, FreeText):
            args = [f"{k}=({', '.join(map(_print_literal, v))})" for k, v in
                    (("ends", e.ends), ("excludes", e.excludes), ("tokens", e.tokens)) if v]
            out.append(f"FreeText({', '.join(args)})")
        elif isinstance(e, Repeat):
            todo: list[tuple] = [
                ("expr", e.expr, _CTX_POSTFIX),
                ("text", _quantifier(e.min, e.max)),
            ]
            # "x**" is rejected, so a quantified operand needs parentheses.
            if ctx == _CTX_POSTFIX:
                todo = [("text", "("), *todo, ("text", ")")]
            work.extend(reversed(todo))
        elif isinstance(e, (Seq, Choice)):
            children = e.items if isinstance(e, Seq) else e.alts
            if not children:
                out.append('""' if isinstance(e, Seq) else "[]")
                continue
            paren = ctx == _CTX_POSTFIX or (isinstance(e, Choice) and ctx == _CTX_SEQ_ITEM)
            sep = " " if isinstance(e, Seq) else " | "
            child_ctx = _CTX_SEQ_ITEM if isinstance(e, Seq) else _CTX_TOP
            todo = [("text", "(")] if paren else []
            for k, child in enumerate(children):
                if k:
                    todo.append(("text", sep))
                todo.append(("expr", child, child_ctx))
            if paren:
                todo.append(("text", ")"))
            work.extend(reversed(todo))
        else:
            raise TypeError(f"not an IR expression: {e!r}")
    return "".join(out)


def print_ebnf(ir: GrammarIR) -> str:
    """Print the IR as normalised EBNF, one rule per line, root rule first.

    ``parse_ebnf(print_ebnf(ir), ir.root) == ir`` holds for IR in the parser's normal form (root
    first, nested sequences/choices flattened, sorted merged character-class ranges); any other
    IR prints to an equivalent grammar.
    """
    rules = sorted(ir.rules, key=lambda r: r.name != ir.root)
    lines = []
    for rule in rules:
        if not _FULL_NAME_RE.match(rule.name):
            raise GrammarError(f"rule name {rule.name!r} cannot be written in EBNF")
        parts = ([f"max_tokens={rule.max_tokens}"] if rule.max_tokens is not None else []) + \
            ([f"temperature={rule.temperature!r}"] if rule.temperature is not None else []) + \
            ([f'capture="{rule.capture}"'] if rule.capture is not None else [])
        attrs = f"[{', '.join(parts)}]" if parts else ""
        line = f"{rule.name}{attrs} ::= {_print_expr(rule.body)}"
        if rule.lookahead is not None:
            line += f" (= {_print_expr(rule.lookahead)})"
        lines.append(line)
    return "\n".join(lines) + "\n"
