"""The Lark front-end's reading of the text: source positions, the lexer, and the parser into an
AST of items and small expression tuples; literals and regexes are lowered to IR as they are read
(xgrammar's case folding and regex reading). The dialect is described in :mod:`xg2.grammar.lark`."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from xg2.errors import GrammarError, GrammarLimitError
from xg2.grammar import budget
from xg2.grammar.ebnf import _NEWLINE_RE, MAX_NESTING_DEPTH, MAX_REPEAT, _Source
from xg2.grammar.ir import (
    CharClass,
    Expr,
    Literal,
    Seq,
)
from xg2.grammar.json_common import MAX_SCHEMA_NESTING
from xg2.grammar.optimize import map_leaves
from xg2.grammar.regex import normalize_ranges, regex_to_expr

__all__: list[str] = []


MAX_LARK_NESTING = 32
"""Deepest nesting of ``%lark`` blocks and ``@name`` references inside one another."""

#: The `common` library, in xg2's regex dialect (explicit classes: no `.` or `\\s` to reinterpret).
_FLOAT = r"(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+"
COMMON_TERMINALS: dict[str, str] = {
    "DIGIT": r"[0-9]",
    "HEXDIGIT": r"[a-fA-F0-9]",
    "INT": r"[0-9]+",
    "SIGNED_INT": r"[+-]?[0-9]+",
    "DECIMAL": r"[0-9]+\.[0-9]*|\.[0-9]+",
    "_EXP": r"[eE][+-]?[0-9]+",
    "FLOAT": _FLOAT,
    "SIGNED_FLOAT": rf"[+-]?(?:{_FLOAT})",
    "NUMBER": rf"{_FLOAT}|[0-9]+",
    "SIGNED_NUMBER": rf"[+-]?(?:{_FLOAT}|[0-9]+)",
    "ESCAPED_STRING": r'"(?:[^"\\]|\\[^\n])*"',
    "LCASE_LETTER": r"[a-z]",
    "UCASE_LETTER": r"[A-Z]",
    "LETTER": r"[A-Za-z]",
    "WORD": r"[A-Za-z]+",
    "CNAME": r"[_A-Za-z][_A-Za-z0-9]*",
    "WS_INLINE": r"[ \t]+",
    "WS": r"[ \t\f\r\n]+",
    "CR": r"\r",
    "LF": r"\n",
    "NEWLINE": r"(?:\r?\n)+",
    "SH_COMMENT": r"#[^\n]*",
    "CPP_COMMENT": r"//[^\n]*",
    "C_COMMENT": r"/\*[^*]*\*+(?:[^/*][^*]*\*+)*/",
    "SQL_COMMENT": r"--[^\n]*",
}

_REGEX_FLAGS = frozenset("siu")
# xgrammar's regex converter: \s is [\t\n\v\f\r \xa0]; `.` is any character but \n (or any at all).
# With the i flag xgrammar hands the pattern to another regex engine, whose \s lacks \xa0.
_SPACE_IN_CLASS = (r"\t-\r \xa0", r"\t-\r ")
_NONSPACE_IN_CLASS = (r"\x00-\x08\x0e-\x1f!-\x9f\xa1-\U0010ffff", r"\x00-\x08\x0e-\x1f!-\U0010ffff")
_DOT = r"[^\n]"
_DOT_ALL = r"[\x00-\U0010ffff]"

# Source positions: the EBNF front-end's _Source (offset -> line and column, typed errors).


# ---------------------------------------------------------------------------------------------
# Lexer
# ---------------------------------------------------------------------------------------------

# Token kinds; punctuation tokens are their own text.
_NAME, _INT, _STR, _REGEX, _DIRECTIVE, _JSON, _AT, _SPECIAL, _NL, _EOF = (
    "name", "integer", "string", "regex", "directive", "JSON value", "@name", "special token",
    "end of line", "end of input")

_TOKEN_RE = re.compile(
    r"""
    (?P<ws>[ \t\f\v]+|(?:\#|//)[^\r\n]*)
    | (?P<nl>\r\n|\r|\n)
    | (?P<name>[A-Za-z_][A-Za-z0-9_-]*)
    | (?P<int>[0-9]+)
    | (?P<punct>->|\.\.|[:|()\[\]?*+~{},.!=-])
    | (?P<directive>%[A-Za-z_][A-Za-z0-9_]*)
    """,
    re.VERBOSE,
)
_JSON_WS_RE = re.compile(r"[ \t\r\n\f\v]*")
_AT_RE = re.compile(r"@([A-Za-z0-9_-]*)")
_FLAGS_RE = re.compile(r"[A-Za-z]*")
_SCALAR_DECODER = json.JSONDecoder()
_SURROGATE_RE = re.compile("[\ud800-\udfff]")
_PLAIN_STRING_RE = re.compile('"[^"\\\\\x00-\x1f\ud800-\udfff]*"')
#: The options of %grammar_options, with why xg2 refuses those it does not implement (set to true).
_GRAMMAR_OPTIONS = {
    "allow_initial_skip": "",
    "no_forcing": "xg2 does not change how its matcher forces text",
    "allow_invalid_utf8": "xg2's grammars match valid UTF-8 text only",
}
_CAPTURE_NAME_RE = re.compile(r"[A-Za-z0-9_-]+")
_TOKEN_RANGE_RE = re.compile(r"\s*([0-9]{1,10})(?:\s*-\s*([0-9]{1,10}))?\s*")


@dataclass(slots=True)
class _Tok:
    kind: str
    off: int
    value: Any = None


def _shown(c: str) -> str:
    return repr(c) if c.isprintable() else f"U+{ord(c):04X}"


class _Lexer:
    def __init__(self, src: _Source):
        self.src = src
        self.text = src.text

    def tokens(self) -> list[_Tok]:
        text, src = self.text, self.src
        n = len(text)
        toks: list[_Tok] = []
        append = toks.append
        match = _TOKEN_RE.match
        pos = 0
        while pos < n:
            if not len(toks) & 1023:
                budget.check("reading the grammar")
            m = match(text, pos)
            if m is not None:
                group = m.lastgroup
                if group == "nl":
                    append(_Tok(_NL, pos))
                elif group == "name":
                    append(_Tok(_NAME, pos, m.group()))
                elif group == "int":
                    append(_Tok(_INT, pos, m.group()))
                elif group == "punct":
                    append(_Tok(m.group(), pos))
                elif group == "directive":
                    name = m.group()
                    append(_Tok(_DIRECTIVE, pos, name))
                    if name in ("%json", "%grammar_options", "%regex"):
                        value, end = self._json_value(m.end(), name, pos)
                        append(_Tok(_JSON, pos, value))
                        pos = end
                        continue
                pos = m.end()
                continue
            c = text[pos]
            if c == '"':
                value, pos = self._string(pos)
                append(value)
            elif c == "/":
                value, pos = self._regex(pos)
                append(value)
            elif c == "@":
                at = _AT_RE.match(text, pos)
                if not at.group(1):
                    raise src.error("empty grammar reference after '@'", pos)
                append(_Tok(_AT, pos, at.group(1)))
                pos = at.end()
            elif c == "<":
                end = text.find(">", pos)
                line_end = _NEWLINE_RE.search(text, pos)
                if end < 0 or (line_end is not None and line_end.start() < end):
                    raise src.error("unterminated special token", pos)
                append(_Tok(_SPECIAL, pos, text[pos:end + 1]))
                pos = end + 1
            elif c == "&":
                raise src.error("intersection '&' is not supported", pos)
            else:
                raise src.error(f"unexpected character {_shown(c)}", pos)
        append(_Tok(_EOF, n))
        return _join_lines(toks)

    def _string(self, start: int) -> tuple[_Tok, int]:
        """A string literal: JSON string syntax, then an optional `i` flag (one letter)."""
        text, src = self.text, self.src
        n = len(text)
        plain = _PLAIN_STRING_RE.match(text, start)
        if plain is not None:       # the common case: no escape to decode
            pos = plain.end()
            ci = pos < n and text[pos] == "i"
            return _Tok(_STR, start, (text[start + 1:pos - 1], ci)), pos + ci
        pos = start + 1
        while True:
            if pos >= n or text[pos] in "\r\n":
                raise src.error("unterminated string literal", start)
            c = text[pos]
            if c == '"':
                break
            pos += 2 if c == "\\" else 1
        raw = text[start:pos + 1]
        pos += 1
        try:
            value = json.loads(raw)
        except ValueError as e:
            msg = getattr(e, "msg", str(e))
            raise src.error(f"invalid string literal: {msg}", start) from None
        if _SURROGATE_RE.search(value):
            raise src.error("invalid string literal: a lone surrogate is not text", start)
        ci = pos < n and text[pos] == "i"
        return _Tok(_STR, start, (value, ci)), pos + ci

    def _regex(self, start: int) -> tuple[_Tok, int]:
        """`/pattern/flags`: the pattern runs to the first unescaped slash (classes included, as
        in xgrammar); `\\/` in it stands for a slash."""
        text, src = self.text, self.src
        n = len(text)
        pos = start + 1
        while True:
            if pos >= n:
                raise src.error("unterminated regular expression", start)
            c = text[pos]
            if c == "/":
                break
            pos += 2 if c == "\\" else 1
        pattern = text[start + 1:pos]
        flags = _FLAGS_RE.match(text, pos + 1).group()
        for f in flags:
            if f not in _REGEX_FLAGS:
                raise src.error(f"regular-expression flag '{f}' is not supported (only s, i and u are)", start)
        return _Tok(_REGEX, start, (pattern, flags, start + 1)), pos + 1 + len(flags)

    def _json_value(self, pos: int, directive: str, at: int) -> tuple[Any, int]:
        """The JSON value after %json or %grammar_options (it may span lines): (value, end)."""
        text, src = self.text, self.src
        pos = _JSON_WS_RE.match(text, pos).end()
        what = f"failed to parse JSON value after {directive}"
        if pos >= len(text):
            raise src.error(f"{what}: the input ends", at)
        if text[pos] not in "{[":
            try:
                value, end = _SCALAR_DECODER.raw_decode(text, pos)
            except ValueError as e:
                raise src.error(f"{what}: {getattr(e, 'msg', e)}", at) from None
            return value, end
        depth = 0
        k = pos
        n = len(text)
        in_string = False
        while k < n:
            c = text[k]
            if in_string:
                if c == "\\":
                    k += 1
                elif c == '"':
                    in_string = False
            elif c == '"':
                in_string = True
            elif c in "{[":
                depth += 1
                if depth > MAX_SCHEMA_NESTING:
                    raise src.limit_error(f"JSON value after {directive} nested deeper than {MAX_SCHEMA_NESTING} levels",
                                    k)
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    break
            k += 1
        else:
            raise src.error(f"{what}: unterminated JSON value", at)
        try:
            value = json.loads(text[pos:k + 1])
        except RecursionError:
            raise src.limit_error(f"JSON value after {directive} nested too deeply to decode", at) from None
        except ValueError as e:
            raise src.error(f"{what}: {getattr(e, 'msg', e)}", at) from None
        return value, k + 1


def _join_lines(toks: list[_Tok]) -> list[_Tok]:
    """Line ends kept once each, except before a line starting with `|` (a continued rule)."""
    out: list[_Tok] = []
    k = 0
    n = len(toks)
    while k < n:
        tok = toks[k]
        if tok.kind != _NL:
            out.append(tok)
            k += 1
            continue
        j = k
        while toks[j].kind == _NL:
            j += 1
        if toks[j].kind != "|":
            out.append(tok)
        k = j
    return out


# ---------------------------------------------------------------------------------------------
# Parser: items, and expressions as small tuples
# ---------------------------------------------------------------------------------------------

# Expression nodes: (LEX, off, expr) an anonymous lexeme already in IR; (EPS,); (REF, off, name);
# (SEQ, items); (ALT, alts); (REP, off, node, lo, hi); (JSON, off, value); (LARK, off, grammar);
# (NAMED, off, name); (SPECIAL, off, text); (SUBSTRING, off, units) a structured %regex: the
# contiguous runs of `units` (chunks or characters), empty included.
_LEX, _EPS, _REF, _SEQ, _ALT, _REP, _JSONV, _LARK, _NAMED, _SPECIALV, _SUBSTRING = range(11)
_EPS_NODE = (_EPS,)
_ENDS = frozenset({_NL, _EOF, "}"})


#: A number as an attribute value (temperature): sign, fraction and exponent included.
_NUMBER_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?(?![\w.])")


@dataclass
class _Attrs:
    """A rule's `[...]` attributes, validated; each value is kept with the offset of its name
    (stop_capture: of its value, where xgrammar reports a stop_capture without a marker). `marker` is ("suffix" | "stop", offset, value) where value is (LEX, off, expr) for a string or
    regex, or (REF, off, NAME) for a terminal."""

    off: int
    lazy: int | None = None
    capture: tuple[int, str] | None = None
    stop_capture: tuple[int, str] | None = None
    max_tokens: tuple[int, int] | None = None
    max_chars: tuple[int, int] | None = None
    temperature: tuple[int, float] | None = None
    marker: tuple[str, int, Any] | None = None


@dataclass
class _Def:
    name: str
    terminal: bool
    off: int                    # the item's start (duplicates and cycles are reported there)
    body: Any = None            # expression node, or None for an import
    common: str | None = None   # the common terminal an import names
    attrs: _Attrs | None = None


@dataclass
class _GrammarAST:
    off: int
    defs: dict[str, _Def] = field(default_factory=dict)
    ignores: list[Any] = field(default_factory=list)
    initial_skip: bool = False


def _is_terminal_name(name: str) -> bool:
    stripped = name.lstrip("_")
    return bool(stripped) and stripped[0].isupper()


@dataclass(slots=True)
class _Frame:
    kind: str       # "top", "(" or "["
    off: int
    alts: list = field(default_factory=list)
    items: list = field(default_factory=list)
    quantifiable: bool = False
    aliased: bool = False


def _group(items: list) -> Any:
    if not items:
        return _EPS_NODE
    return items[0] if len(items) == 1 else (_SEQ, items)


def _close(frame: _Frame) -> Any:
    alts = [*frame.alts, _group(frame.items)]
    return alts[0] if len(alts) == 1 else (_ALT, alts)


class _Parser:
    def __init__(self, src: _Source, toks: list[_Tok]):
        self.src = src
        self.toks = toks
        self.i = 0

    def error(self, message: str, tok: _Tok | None = None) -> GrammarError:
        return self.src.error(message, (tok or self.toks[self.i]).off)

    def parse_grammar(self, depth: int, block: _Tok | None = None) -> _GrammarAST:
        """Items up to the end of input (or, for a `%lark {` block, up to its `}`)."""
        toks = self.toks
        ast = _GrammarAST(0 if block is None else block.off)
        while True:
            budget.check("parsing the grammar")
            tok = toks[self.i]
            if tok.kind == _NL:
                self.i += 1
                continue
            if tok.kind == _EOF:
                if block is not None:
                    raise self.error("expected '}' after nested Lark grammar")
                return ast
            if tok.kind == "}":
                if block is None:
                    raise self.error("unexpected '}' outside a %lark block")
                self.i += 1
                return ast
            if tok.kind == _DIRECTIVE:
                self._directive(ast, depth)
            elif tok.kind in (_NAME, "?", "!"):
                self._definition(ast, depth)
            else:
                raise self.error("expected rule or terminal name")
            end = toks[self.i]
            if end.kind == "}" and block is not None:
                continue
            if end.kind not in (_NL, _EOF):
                raise self.error("expected end of grammar item", end)

    def _define(self, ast: _GrammarAST, d: _Def) -> None:
        if d.name in ast.defs:
            raise self.src.error(f"duplicate rule or terminal '{d.name}'", d.off)
        ast.defs[d.name] = d

    def _definition(self, ast: _GrammarAST, depth: int) -> None:
        toks = self.toks
        start = toks[self.i]
        if start.kind in ("?", "!"):
            self.i += 1
        tok = toks[self.i]
        if tok.kind != _NAME:
            raise self.error("expected rule or terminal name", start)
        name = str(tok.value)
        self.i += 1
        nxt = toks[self.i]
        if nxt.kind == ".":
            raise self.error("rule and terminal priorities are not supported", nxt)
        if nxt.kind == "{":
            raise self.error("Lark templates are not supported", nxt)
        attrs = None
        if nxt.kind == "[":
            if _is_terminal_name(name):
                raise self.error("attributes are only supported on rules, not on terminals", nxt)
            attrs = self._attributes()
            nxt = toks[self.i]
        if nxt.kind == ":" and toks[self.i + 1].kind == ":" and toks[self.i + 1].off == nxt.off + 1:
            raise self.error("parametric grammar is not supported", nxt)
        if nxt.kind != ":":
            raise self.error("expected ':' after rule name", nxt)
        self.i += 1
        body = self.expression(depth)
        self._define(ast, _Def(name, _is_terminal_name(name), start.off, body, attrs=attrs))

    def _attributes(self) -> _Attrs:
        """`[name, name=value, ...]` after a rule name (self.i at the `[`), checked as far as the
        text alone allows: names, value kinds, duplicates and combinations."""
        toks = self.toks
        attrs = _Attrs(toks[self.i].off)
        self.i += 1
        while True:
            tok = toks[self.i]
            if tok.kind != _NAME:
                raise self.error("expected rule attribute name")
            key = str(tok.value)
            self.i += 1
            has_value = toks[self.i].kind == "="
            if has_value:
                self.i += 1
            value = toks[self.i]
            if key == "lazy":
                if has_value:
                    raise self.error("the lazy attribute takes no value", tok)
                if attrs.lazy is not None:
                    raise self.error("lazy attribute is specified more than once", tok)
                attrs.lazy = tok.off
            elif key in ("capture", "stop_capture"):
                if getattr(attrs, key) is not None:
                    raise self.error(f"{key} attribute is specified more than once", tok)
                if not has_value and key == "capture":
                    attrs.capture = (tok.off, "")      # a capture named after the rule
                else:
                    if not has_value or value.kind != _STR or value.value[1]:
                        raise self.error(f"expected string literal after {key}=", value)
                    label = value.value[0]
                    if not label:
                        raise self.error("capture name must not be empty", value)
                    if not _CAPTURE_NAME_RE.fullmatch(label):
                        raise self.error("capture name must only contain letters, digits, underscores and "
                                         "hyphens", value)
                    setattr(attrs, key, (value.off if key == "stop_capture" else tok.off, label))
                    self.i += 1
            elif key in ("max_tokens", "max_chars"):
                if getattr(attrs, key) is not None:
                    raise self.error(f"{key} attribute is specified more than once", tok)
                if not has_value or value.kind != _INT:
                    raise self.error(f"expected integer after {key}=", value)
                digits = str(value.value).lstrip("0") or "0"
                if len(digits) > 9:
                    raise self.error(f"{key} value {value.value} is too large", value)
                if int(digits) == 0 and key == "max_tokens":     # (a rule of no characters is the empty text)
                    raise self.error(f"{key} must be positive", value)
                setattr(attrs, key, (tok.off, int(digits)))
                self.i += 1
            elif key == "temperature":
                if attrs.temperature is not None:
                    raise self.error("temperature attribute is specified more than once", tok)
                # Read from the text: a sign, a fraction or an exponent spans several tokens.
                number = _NUMBER_RE.match(self.src.text, value.off) if has_value else None
                if number is None:
                    raise self.error("expected number after temperature=", value)
                while toks[self.i].off < number.end() and toks[self.i].kind != _EOF:
                    self.i += 1
                t = float(number.group())
                if not math.isfinite(t) or t < 0:
                    raise self.error("temperature must be a finite non-negative number", value)
                attrs.temperature = (tok.off, t)
            elif key in ("suffix", "stop"):
                if attrs.marker is not None:
                    other = attrs.marker[0]
                    if other == key:
                        raise self.error(f"{key} attribute is specified more than once", tok)
                    raise self.error(f"{key} cannot be combined with {other}", tok)
                if not has_value:
                    raise self.error(f"expected '=' and a marker after {key}", value)
                attrs.marker = (key, tok.off, self._marker(key, value))
                self.i += 1
            else:
                raise self.error(f"rule attribute '{key}' is not supported", tok)
            if toks[self.i].kind == ",":
                self.i += 1
                continue
            if toks[self.i].kind != "]":
                raise self.error("expected ']' after rule attributes")
            self.i += 1
            break
        if attrs.stop_capture is not None and attrs.marker is None:
            raise self.src.error("stop_capture requires stop or suffix", attrs.stop_capture[0])
        return attrs

    def _marker(self, key: str, value: _Tok) -> Any:
        """The marker of `suffix=` / `stop=`: a string (optionally `i`), a regex (flag `s` only) or
        a terminal name."""
        src = self.src
        if value.kind == _STR:
            text, ci = value.value
            if not text:
                raise self.error(f"{key} must not be empty", value)
            return (_LEX, value.off, _case_insensitive(src, text, value.off) if ci else Literal(text))
        if value.kind == _REGEX:
            pattern, flags, at = value.value
            if "i" in flags:
                raise self.error("regular-expression flag 'i' is not supported with suffix or stop attributes",
                                 value)
            return (_LEX, value.off, _regex(src, pattern, flags, at))
        if value.kind == _NAME:
            name = str(value.value)
            if not _is_terminal_name(name):
                raise self.error(f"{key} terminal name must be uppercase", value)
            return (_REF, value.off, name)
        raise self.error(f"expected string literal, regular expression, or uppercase terminal name after {key}=",
                         value)

    def _directive(self, ast: _GrammarAST, depth: int) -> None:
        toks = self.toks
        tok = toks[self.i]
        name = tok.value
        self.i += 1
        if name == "%import":
            self._import(ast, tok)
        elif name == "%ignore":
            ast.ignores.append(self.expression(depth))
        elif name == "%grammar_options":
            value = toks[self.i].value
            self.i += 1
            if not isinstance(value, dict):
                raise self.error("%grammar_options value must be an object", tok)
            for key, v in value.items():
                if key not in _GRAMMAR_OPTIONS:
                    raise self.error(f"unknown %grammar_options option '{key}'", tok)
                if not isinstance(v, bool):
                    raise self.error(f"{key} must be a boolean", tok)
                if key != "allow_initial_skip":
                    if v:
                        raise self.error(f"%grammar_options option '{key}' is not supported: "
                                         f"{_GRAMMAR_OPTIONS[key]}", tok)
                    continue
                # xgrammar merges the declarations so that an option set once stays set
                ast.initial_skip = ast.initial_skip or v
        elif name in ("%json", "%lark", "%regex"):
            raise self.error(f"{name} is an expression: use it inside a rule", tok)
        else:
            raise self.error(f"directive {name} is not supported", tok)

    def _import(self, ast: _GrammarAST, directive: _Tok) -> None:
        """`%import common.NAME [-> ALIAS]` or `%import common (NAME, ...)`."""
        toks = self.toks
        path: list[str] = []
        tok = toks[self.i]
        if tok.kind != _NAME:
            raise self.error("expected import path")
        path.append(str(tok.value))
        self.i += 1
        while toks[self.i].kind == "." and toks[self.i + 1].kind == _NAME:
            path.append(str(toks[self.i + 1].value))
            self.i += 2
        if toks[self.i].kind == "(" and len(path) == 1:
            if path[0] != "common":
                raise self.src.error(f"unknown import library '{path[0]}': only common can be imported",
                                     directive.off)
            self.i += 1
            while True:
                tok = toks[self.i]
                if tok.kind != _NAME:
                    raise self.error("expected imported terminal name")
                self._import_one(ast, str(tok.value), str(tok.value), directive)
                self.i += 1
                if toks[self.i].kind == ",":
                    self.i += 1
                    continue
                if toks[self.i].kind != ")":
                    raise self.error("expected ')' after import list")
                self.i += 1
                return
        dotted = ".".join(path)
        if len(path) != 2 or path[0] != "common":
            raise self.src.error(f"unknown common import '{dotted}'", directive.off)
        alias = path[1]
        if toks[self.i].kind == "->":
            self.i += 1
            tok = toks[self.i]
            if tok.kind != _NAME:
                raise self.error("expected import alias")
            alias = str(tok.value)
            self.i += 1
        self._import_one(ast, path[1], alias, directive)

    def _import_one(self, ast: _GrammarAST, name: str, alias: str, directive: _Tok) -> None:
        if name not in COMMON_TERMINALS:
            raise self.src.error(f"unknown common import 'common.{name}'", directive.off)
        self._define(ast, _Def(alias, True, directive.off, None, name))

    def expression(self, depth: int) -> Any:
        """An expression up to the end of its item (end of line, input or `%lark` block)."""
        src, toks = self.src, self.toks
        stack = [_Frame("top", toks[self.i].off)]
        while True:
            tok = toks[self.i]
            kind = tok.kind
            top = stack[-1]
            if top.aliased and kind not in ("|", ")", "]") and kind not in _ENDS:
                raise self.error("expected end of grammar item")
            if kind == _STR:
                text, ci = tok.value
                self.i += 1
                if toks[self.i].kind == "..":
                    node = self._range(tok)
                elif ci:
                    node = (_LEX, tok.off, _case_insensitive(src, text, tok.off)) if text else _EPS_NODE
                else:
                    node = (_LEX, tok.off, Literal(text)) if text else _EPS_NODE
                top.items.append(node)
                top.quantifiable = True
            elif kind == _REGEX:
                self.i += 1
                top.items.append((_LEX, tok.off, _regex(src, *tok.value)))
                top.quantifiable = True
            elif kind == _NAME:
                self.i += 1
                top.items.append((_REF, tok.off, str(tok.value)))
                top.quantifiable = True
            elif kind == _AT:
                self.i += 1
                top.items.append((_NAMED, tok.off, str(tok.value)))
                top.quantifiable = True
            elif kind == _SPECIAL:
                self.i += 1
                top.items.append((_SPECIALV, tok.off, str(tok.value)))
                top.quantifiable = True
            elif kind == _DIRECTIVE and tok.value == "%json":
                self.i += 2
                top.items.append((_JSONV, tok.off, toks[self.i - 1].value))
                top.quantifiable = True
            elif kind == _DIRECTIVE and tok.value == "%regex":
                self.i += 2
                top.items.append((_SUBSTRING, tok.off, _substring_units(src, toks[self.i - 1].value, tok.off)))
                top.quantifiable = True
            elif kind == _DIRECTIVE and tok.value == "%lark":
                self.i += 1
                brace = toks[self.i]
                if brace.kind != "{":
                    raise self.error("expected '{' after %lark")
                if depth + 1 > MAX_LARK_NESTING:
                    raise src.limit_error(f"%lark blocks nested deeper than {MAX_LARK_NESTING} levels", tok.off)
                self.i += 1
                top.items.append((_LARK, tok.off, self.parse_grammar(depth + 1, tok)))
                top.quantifiable = True
            elif kind in ("(", "["):
                if len(stack) > MAX_NESTING_DEPTH:
                    raise src.limit_error(f"groups nested deeper than {MAX_NESTING_DEPTH} levels", tok.off)
                stack.append(_Frame(kind, tok.off))
                self.i += 1
            elif kind in (")", "]"):
                if top.kind == "top":
                    raise self.error("expected end of grammar item")
                if (top.kind == "(") != (kind == ")"):
                    raise self.error("expected ')' after group" if top.kind == "(" else
                                     "expected ']' after optional group")
                self.i += 1
                node = _close(top)
                if top.kind == "[":
                    node = (_REP, top.off, node, 0, 1)
                stack.pop()
                stack[-1].items.append(node)
                stack[-1].quantifiable = True
            elif kind == "|":
                top.alts.append(_group(top.items))
                top.items = []
                top.quantifiable = False
                top.aliased = False
                self.i += 1
            elif kind == "->":
                self.i += 1
                if toks[self.i].kind != _NAME:
                    raise self.error("expected alias name after '->'")
                self.i += 1
                top.aliased = True
                top.quantifiable = False
            elif kind in ("?", "*", "+", "~", "{"):
                if not top.quantifiable:
                    if kind == "~":
                        raise self.error("complement '~' is not supported")
                    raise self.error("expected grammar expression")
                lo, hi = self._quantifier()
                item = top.items[-1]
                off = item[1] if len(item) > 1 and isinstance(item[1], int) else tok.off
                if hi is not None and hi < lo:
                    raise src.error("repetition end must be greater than or equal to start", off)
                top.items[-1] = (_REP, off, item, lo, hi)
                top.quantifiable = False
            elif kind in _ENDS:
                if top.kind != "top":
                    raise self.error("expected ')' after group" if top.kind == "(" else
                                     "expected ']' after optional group")
                return _close(top)
            elif kind == _DIRECTIVE and tok.value == "%if":
                raise self.error("parametric %if conditions are not supported")
            elif kind == _DIRECTIVE:
                raise self.error(f"a directive ({tok.value}) must start its own line")
            elif kind == ":" and toks[self.i + 1].kind == ":":
                raise self.error("parametric grammar is not supported")
            elif kind in ("-", "!"):
                raise self.error(f"unexpected '{kind}' character")
            else:
                raise self.error("expected grammar expression")

    def _range(self, first: _Tok) -> Any:
        """`"a".."z"`; self.i at the `..`."""
        toks = self.toks
        self.i += 1
        last = toks[self.i]
        if last.kind != _STR:
            raise self.error("expected a string after '..'")
        self.i += 1
        (lo_text, lo_ci), (hi_text, hi_ci) = first.value, last.value
        if lo_ci or hi_ci:
            raise self.error("flags are not allowed on character ranges", first)
        if len(lo_text) != 1 or len(hi_text) != 1:
            raise self.error("character range endpoints must be one character", first)
        lo, hi = ord(lo_text), ord(hi_text)
        if lo > hi:
            raise self.error("character range start must not exceed end", first)
        return (_LEX, first.off, CharClass(((lo, hi),)))

    def _count(self) -> int:
        tok = self.toks[self.i]
        if tok.kind != _INT:
            raise self.error("expected integer")
        digits = str(tok.value).lstrip("0") or "0"
        if len(digits) > len(str(MAX_REPEAT)) or int(digits) > MAX_REPEAT:
            raise self.src.limit_error(f"invalid repetition count {tok.value}: xg2's limit is {MAX_REPEAT}", tok.off)
        self.i += 1
        return int(digits)

    def _quantifier(self) -> tuple[int, int | None]:
        toks = self.toks
        kind = toks[self.i].kind
        self.i += 1
        if kind == "?":
            return 0, 1
        if kind == "*":
            return 0, None
        if kind == "+":
            return 1, None
        if kind == "~":
            lo = self._count()
            if toks[self.i].kind == "..":
                self.i += 1
                return lo, self._count()
            return lo, lo
        # `{n}`, `{n,}`, `{,m}`, `{n,m}`, `{,}`
        tok = toks[self.i]
        if tok.kind == "-":
            raise self.error("invalid repetition count: counts are not negative")
        if tok.kind not in (_INT, ",", "}"):
            raise self.error("Lark templates are not supported", toks[self.i - 1])
        lo = self._count() if tok.kind == _INT else 0
        if tok.kind != _INT and toks[self.i].kind != ",":
            raise self.error("expected integer")
        if toks[self.i].kind == "}":
            self.i += 1
            return lo, lo
        if toks[self.i].kind != ",":
            raise self.error("expected ',' or '}' in repetition")
        self.i += 1
        hi = None if toks[self.i].kind == "}" else self._count()
        if toks[self.i].kind != "}":
            raise self.error("expected '}' after repetition")
        self.i += 1
        return lo, hi


# ---------------------------------------------------------------------------------------------
# Lexemes: case-insensitive literals and regexes
# ---------------------------------------------------------------------------------------------

def _substring_units(src: _Source, value: Any, off: int) -> tuple[str, ...]:
    """The units of a structured `%regex {...}`: its one field, `substring_chunks` (strings) or
    `substring_chars` (a string, read by code point)."""
    if not isinstance(value, dict):
        raise src.error("%regex value must be an object", off)
    for key in value:
        if key not in ("substring_chunks", "substring_chars", "substring_words"):
            raise src.error(f"unknown field '{key}' in %regex", off)
    if not value:
        raise src.error("no fields set on %regex", off)
    if len(value) > 1:
        raise src.error("only one field can be set on %regex", off)
    if "substring_words" in value:
        raise src.error("substring_words is not supported yet: it needs a notion of word boundaries", off)
    if "substring_chars" in value:
        chars = value["substring_chars"]
        if not isinstance(chars, str):
            raise src.error("substring_chars must be a string", off)
        if _SURROGATE_RE.search(chars):
            raise src.error("substring_chars must be text: it holds a lone surrogate", off)
        return tuple(chars)
    chunks = value["substring_chunks"]
    if not isinstance(chunks, list) or not all(isinstance(c, str) for c in chunks):
        raise src.error("substring_chunks must be an array of strings", off)
    if any(_SURROGATE_RE.search(c) for c in chunks):
        raise src.error("substring_chunks must be text: a chunk holds a lone surrogate", off)
    return tuple(chunks)


def _fold_char(c: str) -> Expr:
    if c.isascii() and c.isalpha():
        a, b = sorted((ord(c.lower()), ord(c.upper())))
        return CharClass(((a, a), (b, b)))
    return Literal(c)


def _fold_literal(text: str) -> Expr:
    """`text` with every ASCII letter matched in either case."""
    out: list[Expr] = []
    run: list[str] = []
    for c in text:
        x = _fold_char(c)
        if isinstance(x, Literal):
            run.append(c)
            continue
        if run:
            out.append(Literal("".join(run)))
            run = []
        out.append(x)
    if run:
        out.append(Literal("".join(run)))
    return out[0] if len(out) == 1 else Seq(tuple(out))


def _fold_class(c: CharClass) -> CharClass:
    """A class that also holds the other case of its ASCII letters (before any negation, as a
    case-insensitive regex engine matches: `[^a]` then rejects `A` too)."""
    extra = []
    for lo, hi in c.ranges:
        for base, other in ((0x41, 0x61), (0x61, 0x41)):
            a, b = max(lo, base), min(hi, base + 25)
            if a <= b:
                extra.append((a - base + other, b - base + other))
    if not extra:
        return c
    return CharClass(normalize_ranges([*c.ranges, *extra]), c.negated)


def _fold_case(e: Expr) -> Expr:
    return map_leaves(e, lambda x: _fold_literal(x.text) if isinstance(x, Literal) and x.text
                      else _fold_class(x) if isinstance(x, CharClass) else x)


def _case_insensitive(src: _Source, text: str, off: int) -> Expr:
    if not text.isascii():
        raise src.error("case-insensitive string literals currently support ASCII characters only", off)
    return _fold_literal(text)


def _xgrammar_pattern(p: str, dotall: bool, ignore_case: bool = False) -> tuple[str, list[int]]:
    """The pattern in xg2's regex dialect with xgrammar's meaning of `.` and `\\s`/`\\S`, and for
    each character of it the index of the character of `p` it comes from."""
    space, nonspace = _SPACE_IN_CLASS[ignore_case], _NONSPACE_IN_CLASS[ignore_case]
    out: list[str] = []
    origin: list[int] = []

    def emit(s: str, at: int) -> None:
        out.append(s)
        origin.extend([at] * len(s))

    in_class = False
    class_start = -1
    i, n = 0, len(p)
    while i < n:
        c = p[i]
        if c == "\\" and i + 1 < n:
            d = p[i + 1]
            ranged = in_class and p.startswith("-", i + 2) and not p.startswith("-]", i + 2)
            if d in "sS" and not ranged:  # (`\s-x` in a class: left to the regex parser to refuse)
                if in_class:
                    emit(space if d == "s" else nonspace, i)
                else:
                    emit(f"[{space}]" if d == "s" else f"[^{space}]", i)
            else:
                emit(p[i:i + 2], i)
            i += 2
            continue
        if in_class:
            if c == "]" and not (i == class_start or (i == class_start + 1 and p[class_start] == "^")):
                in_class = False
            emit(c, i)
        elif c == "[":
            in_class = True
            class_start = i + 1
            emit(c, i)
        elif c == ".":
            emit(_DOT_ALL if dotall else _DOT, i)
        else:
            emit(c, i)
        i += 1
    return "".join(out), origin


def _regex(src: _Source, pattern: str, flags: str, off: int) -> Expr:
    """A `/pattern/flags` lexeme; `off` is where the pattern starts in the grammar."""
    from xg2.errors import RegexError

    text, origin = _xgrammar_pattern(pattern, "s" in flags, "i" in flags)
    try:
        expr = regex_to_expr(text)
    except (RegexError, GrammarLimitError) as e:
        at = len(pattern)
        if e.column is not None and 0 < e.column <= len(origin):
            at = origin[e.column - 1]
        error = GrammarLimitError if isinstance(e, GrammarLimitError) else GrammarError
        raise error(f"failed to compile regular expression: {e.message}", *src.pos(off + at)) from None
    return _fold_case(expr) if "i" in flags else expr


