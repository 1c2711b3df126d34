"""Convert grammars in xgrammar's EBNF dialect to llguidance's Lark dialect.

Only the constructs used by the benchmark corpus are supported: rules
``name ::= expr``, ``#`` comments, string literals, character classes (with
ranges, negation and ``\\x``/``\\u``/``\\U`` escapes), grouping, alternation,
the postfix operators ``* + ?`` and the bounds ``{m}``, ``{m,}``, ``{m,n}``, and
a trailing lookahead assertion ``(= expr)``.

Mapping
-------
* A rule that is *regular* (not part of a reference cycle and referring only to
  regular rules) becomes a Lark terminal ``T_NAME`` (one lexeme, compiled to a
  regex by llguidance).  A terminal never matches the empty string: it holds
  ``L(rule) \\ {""}`` and references to a nullable rule are written ``T_NAME?``.
* Every other rule becomes a lowercase Lark rule ``r_name``; inside it, a
  regular sequence keeps one lexeme per item, and every other maximal regular
  sub-expression (repetition, alternation) becomes a literal, a ``/regex/`` or
  an anonymous terminal ``T_ANON_k`` (llguidance's docs advise against
  repeating single-character lexemes in rules).
* A comment ``# lark-rule: a b`` in the EBNF keeps the regular rules ``a`` and
  ``b`` as Lark rules instead of terminals, for the rare rule that must not be
  one greedy lexeme (see below).
* No ``%ignore`` is emitted, so lexemes must be adjacent, as in the EBNF.
* The lookahead assertion has no Lark counterpart (llguidance does not support
  lookarounds) and is dropped; the Lark grammar then accepts a superset of the
  EBNF language.  ``convert`` reports dropped lookaheads in ``notes``.

llguidance's lexer is greedy at lexeme boundaries, so for grammars whose
lexemes could end at several places the two engines may split text differently;
the corpus samples are verified with both engines by ``verify_corpus.py``.

Usage: ``python benchmarks/ebnf_to_lark.py FILE.ebnf`` prints the Lark grammar.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field

# --------------------------------------------------------------------------- AST


@dataclass(frozen=True)
class Str:
    text: str


@dataclass(frozen=True)
class Cls:
    ranges: tuple[tuple[int, int], ...]
    negated: bool


@dataclass(frozen=True)
class Ref:
    name: str


@dataclass(frozen=True)
class Term:
    """The terminal ``T_name`` of a regular rule: L(name) minus the empty string."""

    name: str


@dataclass(frozen=True)
class Seq:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Alt:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Rep:
    item: Node
    lo: int
    hi: int | None  # None = unbounded


Node = Str | Cls | Ref | Term | Seq | Alt | Rep


@dataclass
class Rule:
    name: str
    body: Node
    lookahead: Node | None = None


# ------------------------------------------------------------------------ parser


class EbnfSyntaxError(ValueError):
    pass


class _Parser:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0

    # -- lexical helpers
    def _skip(self) -> None:
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c in " \t\r\n":
                self.i += 1
            elif c == "#":
                while self.i < len(s) and s[self.i] != "\n":
                    self.i += 1
            else:
                break

    def _peek(self) -> str:
        self._skip()
        return self.s[self.i] if self.i < len(self.s) else ""

    def _error(self, msg: str) -> EbnfSyntaxError:
        line = self.s.count("\n", 0, self.i) + 1
        return EbnfSyntaxError(f"line {line}: {msg}")

    def _ident_at(self, pos: int) -> tuple[str, int] | None:
        s = self.s
        if pos < len(s) and (s[pos].isalpha() or s[pos] == "_"):
            end = pos + 1
            while end < len(s) and (s[end].isalnum() or s[end] in "_-."):
                end += 1
            return s[pos:end], end
        return None

    def _at_rule_start(self) -> bool:
        self._skip()
        hit = self._ident_at(self.i)
        if hit is None:
            return False
        j = hit[1]
        while j < len(self.s) and self.s[j] in " \t":
            j += 1
        return self.s.startswith("::=", j)

    def _escape(self) -> str:
        # self.s[self.i] is the character after the backslash
        s = self.s
        c = s[self.i]
        self.i += 1
        simple = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "f": "\f", "v": "\v", "b": "\b", "a": "\a"}
        if c in simple:
            return simple[c]
        width = {"x": 2, "u": 4, "U": 8}.get(c)
        if width is not None:
            digits = s[self.i : self.i + width]
            if len(digits) != width or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise self._error(f"bad \\{c} escape")
            self.i += width
            return chr(int(digits, 16))
        return c

    def _string(self) -> Str:
        s = self.s
        quote = s[self.i]
        self.i += 1
        out = []
        while True:
            if self.i >= len(s):
                raise self._error("unterminated string")
            c = s[self.i]
            self.i += 1
            if c == quote:
                return Str("".join(out))
            if c == "\\":
                out.append(self._escape())
            else:
                out.append(c)

    def _class_char(self) -> str:
        c = self.s[self.i]
        self.i += 1
        if c == "\\":
            return self._escape()
        return c

    def _char_class(self) -> Cls:
        s = self.s
        self.i += 1  # [
        negated = False
        if self.i < len(s) and s[self.i] == "^":
            negated = True
            self.i += 1
        ranges: list[tuple[int, int]] = []
        while True:
            if self.i >= len(s):
                raise self._error("unterminated character class")
            if s[self.i] == "]":
                self.i += 1
                break
            lo = self._class_char()
            if self.i + 1 < len(s) and s[self.i] == "-" and s[self.i + 1] != "]":
                self.i += 1
                hi = self._class_char()
            else:
                hi = lo
            if ord(hi) < ord(lo):
                raise self._error(f"bad range {lo!r}-{hi!r}")
            ranges.append((ord(lo), ord(hi)))
        return Cls(tuple(ranges), negated)

    def _number(self) -> int:
        self._skip()
        start = self.i
        while self.i < len(self.s) and self.s[self.i].isdigit():
            self.i += 1
        if start == self.i:
            raise self._error("expected a number")
        return int(self.s[start : self.i])

    # -- grammar
    def parse(self) -> list[Rule]:
        rules: list[Rule] = []
        while self._peek():
            if not self._at_rule_start():
                raise self._error("expected `name ::=`")
            name, self.i = self._ident_at(self.i)  # type: ignore[misc]
            self._skip()
            self.i += 3  # ::=
            body = self._alternation()
            lookahead = None
            if self._peek() == "(" and self.s[self.i + 1 :].lstrip().startswith("="):
                self.i += 1
                self._skip()
                self.i += 1  # =
                lookahead = self._alternation()
                if self._peek() != ")":
                    raise self._error("expected `)` after lookahead")
                self.i += 1
            rules.append(Rule(name, body, lookahead))
        return rules

    def _alternation(self) -> Node:
        items = [self._sequence()]
        while self._peek() == "|":
            self.i += 1
            items.append(self._sequence())
        return items[0] if len(items) == 1 else Alt(tuple(items))

    def _sequence(self) -> Node:
        items: list[Node] = []
        while True:
            c = self._peek()
            if c in ("", "|", ")") or self._at_rule_start():
                break
            if c == "(" and self.s[self.i + 1 :].lstrip().startswith("="):
                break  # lookahead assertion
            items.append(self._postfix())
        if not items:
            return Str("")
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def _postfix(self) -> Node:
        node = self._primary()
        while True:
            c = self._peek()
            if c == "*":
                self.i += 1
                node = Rep(node, 0, None)
            elif c == "+":
                self.i += 1
                node = Rep(node, 1, None)
            elif c == "?":
                self.i += 1
                node = Rep(node, 0, 1)
            elif c == "{":
                self.i += 1
                lo = self._number()
                hi: int | None = lo
                if self._peek() == ",":
                    self.i += 1
                    hi = None if self._peek() == "}" else self._number()
                if self._peek() != "}":
                    raise self._error("expected `}`")
                self.i += 1
                node = Rep(node, lo, hi)
            else:
                return node

    def _primary(self) -> Node:
        c = self._peek()
        if c in "\"'":
            return self._string()
        if c == "[":
            return self._char_class()
        if c == "(":
            self.i += 1
            node = self._alternation()
            if self._peek() != ")":
                raise self._error("expected `)`")
            self.i += 1
            return node
        hit = self._ident_at(self.i)
        if hit is None:
            raise self._error(f"unexpected character {c!r}")
        name, self.i = hit
        return Ref(name)


def parse_ebnf(text: str) -> list[Rule]:
    return _Parser(text).parse()


# ---------------------------------------------------------------------- analysis


def _refs(node: Node) -> set[str]:
    if isinstance(node, Ref):
        return {node.name}
    if isinstance(node, (Seq, Alt)):
        out: set[str] = set()
        for item in node.items:
            out |= _refs(item)
        return out
    if isinstance(node, Rep):
        return _refs(node.item)
    return set()


@dataclass
class _Analysis:
    rules: dict[str, Rule]
    regular: set[str] = field(default_factory=set)
    nullable_rules: set[str] = field(default_factory=set)

    def nullable(self, node: Node) -> bool:
        if isinstance(node, Str):
            return node.text == ""
        if isinstance(node, (Cls, Term)):
            return False
        if isinstance(node, Ref):
            return node.name in self.nullable_rules
        if isinstance(node, Seq):
            return all(self.nullable(i) for i in node.items)
        if isinstance(node, Alt):
            return any(self.nullable(i) for i in node.items)
        assert isinstance(node, Rep)
        return node.lo == 0 or self.nullable(node.item)

    def is_regular(self, node: Node) -> bool:
        return all(r in self.regular for r in _refs(node))


def _analyse(rules: list[Rule], keep_rules: set[str] = frozenset()) -> _Analysis:
    table = {r.name: r for r in rules}
    for r in rules:
        for ref in _refs(r.body) | (_refs(r.lookahead) if r.lookahead else set()):
            if ref not in table:
                raise EbnfSyntaxError(f"rule {r.name!r} refers to undefined rule {ref!r}")
    an = _Analysis(table)
    # nullable: fixpoint
    changed = True
    while changed:
        changed = False
        for r in rules:
            if r.name not in an.nullable_rules and an.nullable(r.body):
                an.nullable_rules.add(r.name)
                changed = True
    # regular: rules whose reachable reference graph has no cycle
    state: dict[str, int] = {}  # 1 = visiting, 2 = done

    def visit(name: str) -> bool:
        st = state.get(name)
        if st == 1:
            return False
        if st == 2:
            return name in an.regular
        state[name] = 1
        ok = name not in keep_rules
        for ref in sorted(_refs(table[name].body)):
            if not visit(ref):
                ok = False
        state[name] = 2
        if ok:
            an.regular.add(name)
        return ok

    for r in rules:
        visit(r.name)
    # a rule on a cycle may have been marked regular while the cycle was open
    # only through a path that was already "visiting"; recompute to a fixpoint.
    changed = True
    while changed:
        changed = False
        for name in list(an.regular):
            if not all(ref in an.regular for ref in _refs(table[name].body)):
                an.regular.discard(name)
                changed = True
    return an


# ---------------------------------------------------------------------- emission


def _has_seq(node: Node) -> bool:
    if isinstance(node, Seq):
        return True
    if isinstance(node, Alt):
        return any(_has_seq(i) for i in node.items)
    if isinstance(node, Rep):
        return _has_seq(node.item)
    return False


def _nonempty(an: _Analysis, node: Node) -> Node | None:
    """An expression for L(node) minus the empty string (None if that is empty).

    ``node`` must be regular.
    """
    if isinstance(node, Ref):
        body_ne = _nonempty(an, an.rules[node.name].body)
        return None if body_ne is None else Term(node.name)
    if not an.nullable(node):
        return node
    if isinstance(node, Str):
        return None  # the empty string
    if isinstance(node, Alt):
        alts = [a for a in (_nonempty(an, i) for i in node.items) if a is not None]
        if not alts:
            return None
        return alts[0] if len(alts) == 1 else Alt(tuple(alts))
    if isinstance(node, Seq):
        # every item is nullable: ne(a b...) = ne(a) b... | ne(b...)
        first, rest = node.items[0], node.items[1:]
        options: list[Node] = []
        first_ne = _nonempty(an, first)
        if first_ne is not None:
            options.append(Seq((first_ne, *rest)) if rest else first_ne)
        if rest:
            rest_ne = _nonempty(an, Seq(rest) if len(rest) > 1 else rest[0])
            if rest_ne is not None:
                options.append(rest_ne)
        if not options:
            return None
        return options[0] if len(options) == 1 else Alt(tuple(options))
    assert isinstance(node, Rep)
    if node.hi == 0:
        return None
    inner = _nonempty(an, node.item)
    if inner is None:
        return None
    if not an.nullable(node.item):
        return _rep(node.item, max(node.lo, 1), node.hi)
    return _rep(inner, 1, node.hi)


def _rep(item: Node, lo: int, hi: int | None) -> Node:
    return item if lo == hi == 1 else Rep(item, lo, hi)


def _regex_char(cp: int) -> str:
    c = chr(cp)
    if c.isascii() and c.isalnum():
        return c
    return f"\\x{{{cp:X}}}"


def _cls_regex(node: Cls) -> str:
    parts = []
    for lo, hi in node.ranges:
        parts.append(_regex_char(lo) if lo == hi else f"{_regex_char(lo)}-{_regex_char(hi)}")
    return "/[" + ("^" if node.negated else "") + "".join(parts) + "]/"


def _str_lark(text: str) -> str:
    if all(c.isprintable() and c not in '"\\' for c in text):
        return '"' + text + '"'
    if all(c.isprintable() or c in "\n\t\r" for c in text):
        return json.dumps(text, ensure_ascii=False)
    return "/" + "".join(_regex_char(ord(c)) for c in text) + "/"


def _rep_suffix(lo: int, hi: int | None) -> str:
    if (lo, hi) == (0, None):
        return "*"
    if (lo, hi) == (1, None):
        return "+"
    if (lo, hi) == (0, 1):
        return "?"
    if hi is None:
        return f"{{{lo},}}"
    if lo == hi:
        return f"{{{lo}}}"
    return f"{{{lo},{hi}}}"


def _term_name(rule: str) -> str:
    return "T_" + rule.upper().replace("-", "_").replace(".", "_")


def _rule_name(rule: str) -> str:
    return "r_" + rule.lower().replace("-", "_").replace(".", "_")


class _Emitter:
    def __init__(self, an: _Analysis) -> None:
        self.an = an
        self.anon: dict[str, str] = {}  # terminal body -> name

    def _group(self, text: str) -> str:
        return text if text and all(c.isalnum() or c in "_" for c in text) else f"({text})"

    def term(self, node: Node) -> str:
        """Terminal-expression syntax for a regular node (may be "" for epsilon)."""
        an = self.an
        if an.nullable(node):
            ne = _nonempty(an, node)
            return "" if ne is None else f"({self.term(ne)})?"
        if isinstance(node, Str):
            return _str_lark(node.text)
        if isinstance(node, Cls):
            return _cls_regex(node)
        if isinstance(node, (Ref, Term)):
            return _term_name(node.name)
        if isinstance(node, Seq):
            return " ".join(t for t in (self.term(i) for i in node.items) if t)
        if isinstance(node, Alt):
            return "(" + " | ".join(self.term(i) for i in node.items) + ")"
        assert isinstance(node, Rep)
        return self._group(self.term(node.item)) + _rep_suffix(node.lo, node.hi)

    def _lexeme(self, node: Node) -> str:
        """A single lexeme for a non-nullable regular node."""
        if isinstance(node, Str):
            return _str_lark(node.text)
        if isinstance(node, Cls):
            return _cls_regex(node)
        if isinstance(node, (Ref, Term)):
            return _term_name(node.name)
        body = self.term(node)
        name = self.anon.get(body)
        if name is None:
            name = f"T_ANON_{len(self.anon)}"
            self.anon[body] = name
        return name

    def cfg(self, node: Node, top: bool = False) -> str:
        # Sequences (also inside groups) keep one lexeme per item: merging them
        # would let llguidance's greedy lexer swallow text that the following
        # lexeme needs (e.g. `"{" ws "}"` versus `"{" ws member`).
        """Rule-expression syntax (may be "" for epsilon)."""
        an = self.an
        if an.is_regular(node) and not _has_seq(node):
            ne = _nonempty(an, node)
            if ne is None:
                return ""
            lex = self._lexeme(ne)
            return lex + "?" if an.nullable(node) else lex
        if isinstance(node, Ref):
            return _rule_name(node.name)
        if isinstance(node, Seq):
            return " ".join(t for t in (self.cfg(i) for i in node.items) if t)
        if isinstance(node, Alt):
            body = " | ".join(self.cfg(i) for i in node.items)
            return body if top else f"({body})"
        assert isinstance(node, Rep)
        inner = self.cfg(node.item)
        if not inner:
            return ""
        return self._group(inner) + _rep_suffix(node.lo, node.hi)


@dataclass
class Conversion:
    lark: str
    notes: list[str]


LARK_RULE_DIRECTIVE = re.compile(r"^\s*#\s*lark-rule:\s*(.*)$", re.MULTILINE)


def convert(ebnf: str, root: str = "root") -> Conversion:
    rules = parse_ebnf(ebnf)
    keep = {name for m in LARK_RULE_DIRECTIVE.finditer(ebnf) for name in m.group(1).split()}
    an = _analyse(rules, keep)
    if root not in an.rules:
        raise EbnfSyntaxError(f"no rule named {root!r}")
    notes = [f"lookahead of rule {r.name!r} dropped" for r in rules if r.lookahead is not None]
    em = _Emitter(an)
    start = em.cfg(Ref(root)) or '""'
    lines = [f"start: {start}"]
    for r in rules:
        if r.name in an.regular:
            continue
        lines.append(f"{_rule_name(r.name)}: {em.cfg(r.body, top=True)}")
    for r in rules:
        if r.name not in an.regular:
            continue
        ne = _nonempty(an, r.body)
        if ne is not None:
            lines.append(f"{_term_name(r.name)}: {em.term(ne)}")
    for body, name in em.anon.items():
        lines.append(f"{name}: {body}")
    return Conversion("\n".join(lines) + "\n", notes)


def ebnf_to_lark(ebnf: str, root: str = "root") -> str:
    return convert(ebnf, root).lark


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as fh:
        conv = convert(fh.read())
    sys.stdout.write(conv.lark)
    for note in conv.notes:
        print(f"// note: {note}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
