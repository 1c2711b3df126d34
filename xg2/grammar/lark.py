"""Lark front-end: the dialect of the Lark grammar language xgrammar 0.2.8 reads, lowered to the IR.

A grammar is a sequence of items, one per line::

    start: value (";" value)*       # a rule (lowercase name); `start` is the root
    value: INT | NAME               # rules reference rules and terminals, in any order
    NAME: /[a-z]+/i                 # a terminal (uppercase name): one indivisible lexeme
    %import common.INT              # a terminal of the built-in common library
    %ignore WS                      # text allowed after every lexeme of a rule
    %grammar_options {"allow_initial_skip": true}

An alternative may continue on the next line when that line starts with ``|``; ``#`` and ``//``
start comments. Expressions: sequences, ``|``, ``( )``, ``[ ]`` (optional), the postfix operators
``?`` ``*`` ``+`` ``~ n`` ``~ n..m`` ``{n}`` ``{n,}`` ``{,m}`` ``{n,m}``, string literals with JSON
escapes and an optional ``i`` (ASCII case-insensitive) flag, ranges ``"a".."z"``, regexes
``/.../`` with the flags ``s`` (dot matches newline), ``i`` and ``u`` (accepted, no effect), rule
and terminal references, ``%json {schema}`` (a JSON value of the schema, through the JSON Schema
front-end), ``%lark { grammar }`` (a grammar of its own nested in place) and ``@name`` (a grammar
of `named_grammars`: an xg2 Grammar or Lark text), ``%regex {"substring_chunks": [...]}`` /
``%regex {"substring_chars": "..."}`` (any run of consecutive chunks, or characters, of the
given text, the empty run included). The ``?`` and ``!`` rule prefixes and ``-> alias`` are
accepted and ignored: they only shape parse trees.

Rule attributes, ``name[attr, attr=value, ...]: body``, are read and checked as xgrammar checks
them (names, value kinds, duplicates, combinations; on rules only). ``[suffix=M]`` and
``[stop=M]``, M a string, a regex or a terminal, are built (see :mod:`xg2.grammar.lark_regular`):
the rule matches its terminal-like body then the marker, and ends at the first place where that
is complete. The two differ only in what a capture records, and xg2 records none.

How xgrammar reads it, and so how it is lowered here:

* Regexes follow xgrammar's regex converter where it differs from xg2's own (ECMAScript) reading:
  ``.`` is any character but ``\\n`` (any character with ``s``), ``\\s`` is ``[\\t-\\r \\xa0]``
  (``[\\t-\\r ]`` with the ``i`` flag, for which xgrammar uses another regex engine). The ``i``
  flag folds ASCII letters only, as xgrammar does.
* ``%ignore`` content (every declaration merged) may follow each lexeme of a rule: a string
  literal other than ``""``, a range, a regex, a terminal reference, ``%json``, ``%lark`` and
  ``@name``. It is never inserted inside a terminal, nor before the first lexeme unless the
  option ``allow_initial_skip`` is set; nested and named grammars have their own.
* ``%grammar_options`` declarations are merged by xgrammar so that an option once set to true
  stays true; the same holds here.

Refused with a :class:`~xg2.errors.GrammarError` naming the construct, as xgrammar refuses them:
priorities (``name.2``), templates, ``%declare`` / ``%override`` / ``%extend``, imports from other
libraries than ``common``, ``%regex {"substring_words": ...}``. Refused here although xgrammar
supports them, because xg2 cannot build them honestly: the rule attributes whose meaning lies in
the matcher (``lazy``, ``stop_capture``: xg2's matcher has no lazy matching, and xgrammar's
dynamic tool-call dispatch is built on it; structural tags express the dispatch; ``temperature``,
``capture``, ``max_tokens`` and ``max_chars`` are supported, see Rule and char_budget), a suffix/stop marker on a body that matches any text (xgrammar then lets the text end
without the marker, or makes the rule a dispatch trigger, depending on how the regex is spelled),
and the ``%grammar_options`` ``no_forcing`` and ``allow_invalid_utf8`` set to true.

Special tokens (``<|...|>`` by text, ``<[ids]>``, ``<[^ids]>``, the wildcard ``<[*]>``) are token
edges (ir.TokenSet): one token by id whatever its text, which the matcher crosses by id; the
vocabulary's own special tokens named by text keep the character xg2's grammars name them by
(TokenizerInfo.named_special_tokens). Those by text and the wildcard need `tokenizer_info` (for
`GrammarCompiler.compile_lark`, the compiler's).

Every error is a GrammarError (GrammarLimitError for resource limits) with the 1-based line and
column (in code points) of the offending text; its text reads as xgrammar's Lark errors do,
``Lark error at line L, column C: <what>``, then the line and a caret under the column. The expression parser and the lowering run on
explicit stacks; parenthesis nesting is capped at MAX_NESTING_DEPTH, and ``%lark`` blocks and
``@name`` references inside one another at :data:`MAX_LARK_NESTING`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from xg2.errors import GrammarError, GrammarLimitError
from xg2.grammar import budget
from xg2.grammar.char_budget import committed_within_chars, within_chars
from xg2.grammar.ebnf import MAX_GRAMMAR_BYTES
from xg2.grammar.ir import (
    EPSILON,
    CharClass,
    Choice,
    Expr,
    GrammarIR,
    Literal,
    Repeat,
    Rule,
    RuleRef,
    Seq,
    TokenSet,
)
from xg2.grammar.lark_dispatch import find_dispatches
from xg2.grammar.lark_regular import MAX_MARKER_EXPR, committed_rules, expr_size, substring_rules
from xg2.grammar.lark_syntax import (  # the reading of the text, one layer down
    _ALT,
    _EPS,
    _JSONV,
    _LARK,
    _LEX,
    _NAMED,
    _REF,
    _REP,
    _SEQ,
    _SPECIALV,
    _SUBSTRING,
    _TOKEN_RANGE_RE,
    COMMON_TERMINALS,
    MAX_LARK_NESTING,
    _GrammarAST,
    _Lexer,
    _Parser,
    _Source,
)
from xg2.grammar.optimize import embedded, map_leaves
from xg2.grammar.regex import regex_to_expr
from xg2.grammar.regular import from_expr

__all__ = ["COMMON_TERMINALS", "MAX_LARK_NESTING", "lark_to_ir"]

_NAMED_GRAMMAR_KEY = re.compile(r"[A-Za-z0-9_-]+\Z")

# ---------------------------------------------------------------------------------------------
# Lowering
# ---------------------------------------------------------------------------------------------

def _seq(parts: list[Expr]) -> Expr:
    flat: list[Expr] = []
    for p in parts:
        if isinstance(p, Seq):
            flat.extend(p.items)
        elif p != EPSILON:
            flat.append(p)
    if not flat:
        return EPSILON
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))


def _alt(parts: list[Expr]) -> Expr:
    flat: list[Expr] = []
    for p in parts:
        flat.extend(p.alts if isinstance(p, Choice) else (p,))
    flat = list(dict.fromkeys(flat))
    return flat[0] if len(flat) == 1 else Choice(tuple(flat))


def _repeat(e: Expr, lo: int, hi: int | None) -> Expr:
    if hi == 0 or e == EPSILON:
        return EPSILON
    if (lo, hi) == (1, 1):
        return e
    return Repeat(e, lo, hi)


def _plain_capture(attrs: Any) -> bool:
    """A rule captured (Rule.capture), with at most a temperature besides: built as any rule."""
    return (attrs is not None and attrs.capture is not None and attrs.lazy is None and attrs.marker is None
            and attrs.stop_capture is None and attrs.max_tokens is None and attrs.max_chars is None)


def _literal(e: Expr) -> str | None:
    """The one string `e` matches, if it is a fixed string (literals and one-character classes)."""
    parts = e.items if type(e) is Seq else (e,)
    out = []
    for p in parts:
        if type(p) is Literal:
            out.append(p.text)
        elif type(p) is CharClass and not p.negated and len(p.ranges) == 1 and p.ranges[0][0] == p.ranges[0][1]:
            out.append(chr(p.ranges[0][0]))
        else:
            return None
    return "".join(out)


def _temperature_only(attrs: Any) -> bool:
    """A rule whose one attribute is its sampling temperature (Rule.temperature, which the
    matcher reads): built as a rule of its own, its body a lexeme or a subgrammar."""
    return (attrs is not None and attrs.temperature is not None and attrs.lazy is None and attrs.marker is None
            and attrs.capture is None and attrs.stop_capture is None and attrs.max_tokens is None
            and attrs.max_chars is None)


def _substring_offsets(node: Any) -> list[int]:
    """Where an AST expression holds structured `%regex` directives."""
    out = []
    stack = [node]
    while stack:
        n = stack.pop()
        if n[0] in (_SEQ, _ALT):
            stack.extend(n[1])
        elif n[0] == _REP:
            stack.append(n[2])
        elif n[0] == _SUBSTRING:
            out.append(n[1])
    return sorted(out)


def _rule_refs(e: Expr) -> list[str]:
    """The rules `e` references, each once, in order."""
    out: dict[str, None] = {}
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, RuleRef):
            out[x.name] = None
        elif isinstance(x, Seq):
            stack.extend(x.items)
        elif isinstance(x, Choice):
            stack.extend(x.alts)
        elif isinstance(x, Repeat):
            stack.append(x.expr)
    return list(out)


class _Context:
    """What one call of lark_to_ir shares between the grammar and those nested in it: the rule
    namespace, the named grammars (each lowered once) and the %json schemas (each once)."""

    def __init__(self, named: dict[str, Any], tokenizer_info: Any):
        self.used: set[str] = set()
        self.rules: list[Rule] = []
        self.named = named
        self.named_refs: dict[str, RuleRef] = {}
        self.named_stack: list[str] = []
        self.json_refs: dict[str, RuleRef] = {}
        self.tokenizer_info = tokenizer_info

    def fresh(self, base: str) -> str:
        name = base
        k = 0
        while name in self.used:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        return name

    def embed(self, ir: GrammarIR, base: str) -> RuleRef:
        """The rules of `ir` added under a prefix no rule name starts with yet."""
        k = 0
        while True:
            prefix = f"{base}{k}_"
            if not any(n.startswith(prefix) for n in self.used):
                break
            k += 1
        rules, root = embedded(ir, prefix)
        for r in rules:
            self.used.add(r.name)
        self.rules.extend(rules)
        return root


class _Lowering:
    """One grammar (the top-level one, a %lark block or a named grammar) into the shared context."""

    def __init__(self, ctx: _Context, src: _Source, ast: _GrammarAST, depth: int, top: bool):
        self.ctx = ctx
        self.src = src
        self.ast = ast
        self.depth = depth
        self.top = top
        self.names: dict[str, str] = {}
        self.ignore: RuleRef | None = None
        self._regular_terminals: dict[str, Expr] = {}
        self.markers: dict[str, tuple[str, int | None]] = {}     # suffix/stop rule -> (kind, fixed marker bytes)

    def run(self) -> RuleRef:
        ast, ctx, src = self.ast, self.ctx, self.src
        start = ast.defs.get("start")
        if start is None:
            where = "" if self.top else " in the nested Lark grammar"
            raise src.error(f"no start rule found{where}", ast.off)
        if start.terminal:
            raise src.error("start must be a rule", start.off)
        self.names["start"] = ctx.fresh("root")
        for name in ast.defs:
            if name != "start":
                self.names[name] = ctx.fresh(name)
        self._check_terminals()
        if ast.ignores:
            name = ctx.fresh("lark_ignore")
            self.ignore = RuleRef(name)
            item = _alt([self.lower(node, terminal="%ignore") for node in ast.ignores])
            ctx.rules.append(Rule(name, _repeat(item, 0, None)))
        dispatched = self._dispatches()
        captured = [d for d in ast.defs.values() if d.attrs is not None and d.attrs.capture is not None]
        for d in ast.defs.values():
            budget.check("lowering the grammar")
            if d.name in dispatched and dispatched[d.name] is None:
                continue        # a head or tool of a dispatch (below): built into it, used nowhere else
            if d.common is not None:
                body = regex_to_expr(COMMON_TERMINALS[d.common])
            elif d.name in dispatched:
                body = dispatched[d.name]
            elif d.terminal:
                body = self.lower(d.body, terminal=d.name)
            else:
                if d.attrs is not None:
                    body = self._attributed(d)
                else:
                    body = self.lower(d.body, terminal=None)
                if d is start and ast.initial_skip and self.ignore is not None:
                    body = _seq([self.ignore, body])
            temperature = d.attrs.temperature[1] if d.attrs is not None and d.attrs.temperature else None
            capture = max_tokens = None
            if d.attrs is not None and d.attrs.capture is not None:
                capture = d.attrs.capture[1] or d.name      # `[capture]` alone: named after the rule
            if d.attrs is not None and d.attrs.max_tokens is not None:
                max_tokens = d.attrs.max_tokens[1]
            kind, marker_bytes = self.markers.get(d.name, ("", 0))
            if kind == "stop" and marker_bytes is None and captured:
                raise src.error("a stop rule whose marker is not a fixed string, in a grammar with captures, is not "
                                "supported by xg2: enclosing captures leave a stop marker out, whose length then "
                                "varies", d.attrs.marker[1])
            stop_capture = d.attrs.stop_capture[1] if d.attrs is not None and d.attrs.stop_capture else None
            ctx.rules.append(Rule(self.names[d.name], body, temperature=temperature, capture=capture,
                                  max_tokens=max_tokens, capture_trim=(marker_bytes or 0) if kind else 0,
                                  hide_tail=(marker_bytes or 0) if kind == "stop" else 0, stop_capture=stop_capture))
        return RuleRef(self.names["start"])

    def _dispatches(self) -> dict[str, Expr | None]:
        """xgrammar's dynamic tool-call dispatch (see lark_dispatch): per rule of that shape, its
        TagDispatch; its tools and heads map to None (not built). Shapes whose pieces are not as
        expected (a trigger that is not a fixed string, a tail that is not any text) are left to
        the ordinary lowering, which refuses the heads."""
        out: dict[str, Expr | None] = {}
        for x in find_dispatches(self.ast.defs):
            expr = self._dispatch(x)
            if expr is not None:
                out[x.rule] = expr
                for tool, head, _rest in x.tools:
                    out.setdefault(tool, None)
                    out.setdefault(head, None)
        return out

    def _any_text_ref(self, name: str) -> bool:
        """Whether the rule or terminal `name` (or the one it is an alias of) reads any text."""
        for _ in range(8):
            d = self.ast.defs.get(name)
            if d is None:
                return False
            if d.terminal or d.common is not None:
                try:
                    expr = (regex_to_expr(COMMON_TERMINALS[d.common]) if d.common is not None else
                            self._inlined(self.lower(d.body, terminal=d.name), d.off))
                    return from_expr(expr).complement().is_empty()
                except (GrammarError, ValueError, TypeError):
                    return False
            if d.attrs is not None or d.body is None or d.body[0] != _REF:
                return False
            name = d.body[2]
        return False

    def _trigger(self, head: Any) -> str | None:
        """The fixed string a dispatch head waits for: its marker (suffix/stop over any text), or
        what follows the any text its lazy body begins with; None if it is not one string."""
        try:
            if head.attrs.marker is not None:
                body = self._inlined(self.lower(head.body, terminal=head.name), head.off)
                if not from_expr(body).complement().is_empty():
                    return None
                return _literal(self._inlined(self.lower(head.attrs.marker[2], terminal=head.name), head.off))
            body = self._inlined(self.lower(head.body, terminal=head.name), head.off)
        except (GrammarError, ValueError, TypeError):
            return None
        if type(body) is not Seq or not from_expr(body.items[0]).complement().is_empty():
            return None
        rest = body.items[1:]
        return _literal(rest[0] if len(rest) == 1 else Seq(tuple(rest)))

    def _dispatch(self, x: Any) -> Expr | None:
        from .text import dispatching

        if not self._any_text_ref(x.tail):
            return None
        after: dict[str, list[Expr]] = {}
        for _tool, head, rest in x.tools:
            trigger = self._trigger(self.ast.defs[head])
            if not trigger:
                return None
            node = rest[0] if len(rest) == 1 else (_SEQ, rest)
            after.setdefault(trigger, []).append(self.lower(node, terminal=None) if rest else EPSILON)
        try:
            return dispatching({k: _alt(v) for k, v in after.items()}, (), (), True, True)
        except ValueError as e:
            raise self.src.error(f"tool-call dispatch of rule '{x.rule}': {e}", self.ast.defs[x.rule].off) from None

    def _attributed(self, d: Any) -> Expr:
        """A rule with attributes. Those whose meaning lies in the matcher (captures, token and
        character budgets, sampling temperature, lazy matching) are refused, once the rule is
        known to be well formed; `suffix` / `stop` are built exactly (see lark_regular)."""
        attrs, src = d.attrs, self.src
        if attrs.max_chars is not None and attrs.lazy is None and attrs.marker is None \
                and attrs.stop_capture is None:
            return self._char_budget(d)      # (a max_tokens beside it is Rule.max_tokens)
        if attrs.max_tokens is not None and attrs.lazy is None and attrs.marker is None \
                and attrs.stop_capture is None:
            # its own rule (Rule.max_tokens), the body as any rule's: the matcher ends each
            # occurrence where it can once its tokens are spent
            return self.lower(d.body, terminal=None)
        if _plain_capture(attrs):
            # its own rule (Rule.capture), the body as any rule's: the matcher records each
            # completion of it (GrammarMatcher.get_captures)
            return self.lower(d.body, terminal=None)
        if _temperature_only(attrs):
            if d.body[0] in (_JSONV, _LARK, _NAMED):
                return self.lower(d.body, terminal=None)    # a subgrammar, then what is ignored
            try:
                return self.lower(d.body, terminal=d.name)  # a lexeme: what is ignored follows its uses
            except GrammarError as e:
                if not e.message.startswith("terminal cannot reference rule"):
                    raise
                raise src.error("temperature is only supported on terminals and subgrammars (the body of a "
                                "rule with a temperature may reference terminals only, or be one subgrammar: "
                                "%json, %lark or @name)", attrs.temperature[0]) from None
        if attrs.lazy is not None and attrs.marker is None and attrs.stop_capture is None \
                and attrs.max_chars is None:
            return self._lazy(d)
        if attrs.marker is None:
            # lazy with a character budget (the only combination left without a marker)
            raise src.error("lazy together with max_chars is not supported by xg2 yet", attrs.lazy)
        if attrs.lazy is not None or attrs.marker is not None:
            # The body must be terminal-like: checked before anything else is said about the rule.
            body = self.lower(d.body, terminal=d.name)
            structured = _substring_offsets(d.body) if attrs.marker is not None else []
            if structured:
                raise src.error("structured %regex cannot be used with suffix or stop", structured[0])
        # (`lazy` beside a marker changes nothing: the marker already commits at its first match)
        kind, off, marker_node = attrs.marker
        marker = self.lower(marker_node, terminal=d.name)
        try:
            regular = [self._inlined(e, off) for e in (body, marker)]
            if sum(expr_size(e, MAX_MARKER_EXPR) for e in regular) > MAX_MARKER_EXPR:
                raise GrammarLimitError(f"the body and marker are larger than {MAX_MARKER_EXPR} nodes")
            if attrs.max_chars is not None and kind == "stop":
                raise src.error("a character budget on a stop rule is not supported by xg2 yet (xgrammar counts "
                                "its text but not its marker)", attrs.max_chars[0])
            if attrs.max_chars is not None:
                # a character budget: the marker within it, or the budget's end without it
                root = committed_within_chars(regular[0], regular[1], attrs.max_chars[1], self.ctx.fresh,
                                              f"{self.names[d.name]}_{kind}", self.ctx.rules)
            elif from_expr(regular[0]).complement().is_empty():
                raise src.error(
                    f"a {kind} marker on a rule whose body matches any text is not supported by xg2: xgrammar "
                    "gives such a rule a language of its own (the text may also end without the marker, and a "
                    "rule heading a repeated item becomes a dynamic dispatch), which xg2 does not build", off)
            else:
                root = committed_rules(regular[0], regular[1], self.ctx.fresh, f"{self.names[d.name]}_{kind}",
                                       self.ctx.rules)
        except GrammarLimitError as e:
            raise src.limit_error(f"rule '{d.name}' with a {kind} marker: {e.message}", off) from None
        if root is None:
            raise src.error(f"rule '{d.name}' can never match: no text of its body is followed by its {kind} "
                            "marker", off)
        # A fixed marker's bytes end every match: captures leave them out (the rule's own; for a
        # stop marker, every enclosing one's too). A marker of varying length cannot be cut so.
        # (under a character budget the rule may end without its marker: no fixed end to cut)
        fixed = _literal(regular[1]) if attrs.max_chars is None else None
        self.markers[d.name] = (kind, None if fixed is None else len(fixed.encode("utf-8")))
        if (attrs.capture is not None or attrs.stop_capture is not None) and fixed is None:
            raise src.error("capturing a suffix or stop rule whose marker is not a fixed string is not supported "
                            "by xg2: its captures leave the marker out, whose length then varies",
                            (attrs.capture or attrs.stop_capture)[0])
        return self._lexeme(root, None)

    def _lazy(self, d: Any) -> Expr:
        """`rule[lazy]` on a terminal-like body: the body's texts cut at their first end (the
        body's automaton with no edge out of an accepting state), as xgrammar commits to the
        shortest match. A body that begins with any text is refused: xgrammar then also lets the
        text end without what follows it, or builds a tool-call dispatch around the rule."""
        off, src = d.attrs.lazy, self.src
        body = self._inlined(self.lower(d.body, terminal=d.name), off)
        if type(body) is Seq and len(body.items) > 1 and from_expr(body.items[0]).complement().is_empty():
            raise src.error("the lazy attribute on a body that begins with any text is not supported by xg2: "
                            "xgrammar lets such text end without the rest (or builds a tool-call dispatch on the "
                            "rule), which xg2 does not build", off)
        try:
            if expr_size(body, MAX_MARKER_EXPR) > MAX_MARKER_EXPR:
                raise GrammarLimitError(f"the body is larger than {MAX_MARKER_EXPR} nodes")
            root = committed_rules(body, EPSILON, self.ctx.fresh, f"{self.names[d.name]}_lazy", self.ctx.rules)
        except GrammarLimitError as e:
            raise src.limit_error(f"lazy rule '{d.name}': {e.message}", off) from None
        if root is None:
            raise src.error(f"lazy rule '{d.name}' can never match", off)
        return self._lexeme(root, None)

    def _char_budget(self, d: Any) -> Expr:
        """`rule[max_chars=n]` on a terminal-like body: the body's texts of at most n code points,
        built as a language (char_budget.within_chars)."""
        off, n = d.attrs.max_chars
        src = self.src
        try:
            body = self._inlined(self.lower(d.body, terminal=d.name), off)
        except GrammarError as e:
            if not e.message.startswith(("terminal cannot reference rule", "structured %regex", "%json",
                                         "nested %lark", "named grammars", "special tokens")):
                raise
            raise src.error(f"max_chars is supported by xg2 on terminal-like bodies only (the texts of rule "
                            f"'{d.name}' must be a regular language): {e.message}", off) from None
        try:
            out = within_chars(body, n, self.ctx.fresh, f"{self.names[d.name]}_chars", self.ctx.rules)
        except GrammarLimitError as e:
            raise src.limit_error(f"rule '{d.name}': {e.message}", off) from None
        if out is None:
            raise src.error(f"rule '{d.name}' can never match within max_chars={n}", off)
        return self._lexeme(out, None)

    def _inlined(self, e: Expr, off: int) -> Expr:
        """`e` (lowered in a terminal) with every terminal reference replaced by the terminal's
        own expression, so that it holds no rule. Terminals are acyclic (_check_terminals), and
        each is inlined once (post-order on an explicit stack)."""
        by_rule = {self.names[n]: d for n, d in self.ast.defs.items() if d.terminal}
        done = self._regular_terminals
        lowered: dict[str, Expr] = {}
        for r in _rule_refs(e):
            if r not in by_rule:
                raise self.src.error("structured %regex cannot be used with suffix or stop", off)
        stack: list[tuple[str, bool]] = [(r, False) for r in _rule_refs(e)]
        while stack:
            name, ready = stack.pop()
            if name in done:
                continue
            d = by_rule[name]
            body = lowered.get(name)
            if body is None:
                body = regex_to_expr(COMMON_TERMINALS[d.common]) if d.common is not None else \
                    self.lower(d.body, terminal=d.name)
                lowered[name] = body
            if not ready:
                refs = _rule_refs(body)
                if any(r not in by_rule for r in refs):
                    raise self.src.error("structured %regex cannot be used with suffix or stop", off)
                stack.append((name, True))
                stack.extend((r, False) for r in refs if r not in done)
                continue
            done[name] = map_leaves(body, lambda x: done[x.name] if isinstance(x, RuleRef) else x)
        return map_leaves(e, lambda x: done[x.name] if isinstance(x, RuleRef) else x)

    def _check_terminals(self) -> None:
        """Terminals reference only terminals, and none refers to itself (iterative DFS)."""
        defs = self.ast.defs
        refs: dict[str, list[tuple[str, int]]] = {}
        for d in defs.values():
            if not d.terminal or d.body is None:
                continue
            out = []
            stack = [d.body]
            while stack:
                node = stack.pop()
                tag = node[0]
                if tag == _REF:
                    target = defs.get(node[2])
                    if target is None:
                        raise self.src.error(f"unknown name '{node[2]}'", node[1])
                    if not target.terminal:
                        raise self.src.error(f"terminal '{d.name}' cannot reference rule '{node[2]}'", node[1])
                    out.append((node[2], node[1]))
                elif tag in (_SEQ, _ALT):
                    stack.extend(node[1])
                elif tag == _REP:
                    stack.append(node[2])
            refs[d.name] = out
        state: dict[str, int] = {}     # 1: on the DFS path, 2: done
        for root, first in refs.items():
            if root in state:
                continue
            state[root] = 1
            path = [(root, iter(first))]
            while path:
                name, it = path[-1]
                nxt = next(it, None)
                if nxt is None:
                    state[name] = 2
                    path.pop()
                    continue
                target, off = nxt
                if state.get(target) == 1:
                    raise self.src.error(f"circular reference in terminal '{target}'", off)
                if target not in state and target in refs:
                    state[target] = 1
                    path.append((target, iter(refs[target])))

    def lower(self, node: Any, terminal: str | None) -> Expr:
        """An expression node to IR, post-order on an explicit stack. In a rule (`terminal` None)
        each lexeme is followed by the ignored content; in a terminal (or %ignore) nothing is
        inserted and only terminals may be referenced."""
        out: list[Expr] = []
        work: list[tuple[Any, bool]] = [(node, False)]
        while work:
            n, done = work.pop()
            tag = n[0]
            if tag in (_SEQ, _ALT):
                if not done:
                    work.append((n, True))
                    work.extend((c, False) for c in reversed(n[1]))
                    continue
                k = len(n[1])
                parts = out[-k:]
                del out[-k:]
                out.append(_seq(parts) if tag == _SEQ else _alt(parts))
            elif tag == _REP:
                if not done:
                    work.append((n, True))
                    work.append((n[2], False))
                    continue
                out.append(_repeat(out.pop(), n[3], n[4]))
            elif tag == _EPS:
                out.append(EPSILON)
            else:
                out.append(self._leaf(n, terminal))
        assert len(out) == 1
        return out[0]

    def _leaf(self, n: Any, terminal: str | None) -> Expr:
        tag, off = n[0], n[1]
        src = self.src
        if tag == _LEX:
            return self._lexeme(n[2], terminal)
        if tag == _REF:
            name = n[2]
            d = self.ast.defs.get(name)
            if d is None:
                raise src.error(f"unknown name '{name}'", off)
            ref = RuleRef(self.names[name])
            if terminal is not None and not d.terminal:
                raise src.error(f"terminal cannot reference rule '{name}'", off)
            lexeme = d.terminal or (_temperature_only(d.attrs) and d.body[0] not in (_JSONV, _LARK, _NAMED))
            return self._lexeme(ref, terminal) if lexeme else ref
        if tag == _SUBSTRING:
            return self._lexeme(substring_rules(n[2], self.ctx.fresh, f"{terminal or 'lark'}_substring",
                                                self.ctx.rules), terminal)
        what = {_JSONV: "%json", _LARK: "nested %lark", _NAMED: "named grammars",
                _SPECIALV: "special tokens"}[tag]
        if terminal is not None:
            raise src.error(f"{what} cannot be used in terminals", off)
        if tag == _JSONV:
            return self._lexeme(self._json(n[2], off), terminal)
        if tag == _LARK:
            try:
                root = _Lowering(self.ctx, src, n[2], self.depth + 1, False).run()
            except GrammarError as e:
                raise type(e)(f"failed to compile nested Lark grammar: {e.message}", e.line, e.column) from None
            return self._lexeme(root, terminal)
        if tag == _NAMED:
            return self._lexeme(self._named(n[2], off), terminal)
        return self._lexeme(self._special(n[2], off), terminal)

    def _special(self, text: str, off: int) -> Expr:
        """`<name>` (the tokens whose text it is) or `<[ids]>` / `<[^ids]>` / `<[*]>` (one token by
        id, one not among the ids, any one token): token edges (ir.TokenSet), which the matcher
        crosses by id. The vocabulary's special tokens named by text keep the character xg2's
        grammars name them by (TokenizerInfo.named_special_tokens)."""
        src = self.src
        info = self.ctx.tokenizer_info
        if text.startswith("<[") and text.endswith("]>"):
            body = text[2:-2].strip()
            negated = body.startswith("^")
            if negated:
                body = body[1:].strip()
            parts = [p.strip() for p in body.split(",")]
            if "*" in parts:
                if negated:
                    raise src.error("negated wildcard special token is not supported: it matches no token", off)
                if len(parts) > 1:
                    raise src.error("wildcard cannot be mixed with token ids or ranges", off)
                if info is None:
                    raise src.error("wildcard special token requires tokenizer_info", off)
                return TokenSet((), True)
            if all(not p for p in parts):
                raise src.error("empty numeric special-token range", off)
            found: set[int] = set()
            for part in parts:
                m = _TOKEN_RANGE_RE.fullmatch(part)
                if m is None:
                    raise src.error(f"invalid numeric special-token range '{part}'", off)
                lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
                if hi < lo:
                    raise src.error(f"invalid numeric special-token range '{part}': its start exceeds its end",
                                    off)
                if hi - lo > 1_000_000 or hi >= 2**31:
                    raise src.limit_error(f"special-token range is too large: {lo}-{hi} spans more than "
                                          "1000000 ids", off)
                found.update(range(lo, hi + 1))
            return TokenSet(tuple(sorted(found)), negated)
        if text.startswith("<[") or any(c.isspace() for c in text) or len(text) < 3:
            raise src.error(f"invalid special token {text}", off)
        if info is None:
            raise src.error(f"named special token {text} requires tokenizer_info", off)
        named = info.named_special_tokens
        want = text.encode("utf-8", "surrogatepass")
        ids = [i for i, b in enumerate(info.decoded_vocab) if b == want]
        if not ids:
            raise src.error(f"unknown special token {text}", off)
        chars = [Literal(named[i]) for i in ids if i in named]
        ordinary = tuple(i for i in ids if i not in named)
        return _alt(chars + ([TokenSet(ordinary)] if ordinary else []))

    def _lexeme(self, e: Expr, terminal: str | None) -> Expr:
        if terminal is None and self.ignore is not None:
            return Seq((e, self.ignore))
        return e

    def _json(self, value: Any, off: int) -> RuleRef:
        from xg2.errors import SchemaError

        from .json_schema import json_schema_to_ir

        if not isinstance(value, (dict, bool)):
            raise self.src.error("failed to compile inline JSON schema: the schema must be a JSON object or "
                                 f"boolean, not {json.dumps(value)}", off)
        key = json.dumps(value, sort_keys=True)
        ref = self.ctx.json_refs.get(key)
        if ref is None:
            try:
                ir = json_schema_to_ir(value)
            except GrammarLimitError as e:
                raise self.src.limit_error(f"failed to compile inline JSON schema: {e}", off) from None
            except (SchemaError, GrammarError) as e:
                raise self.src.error(f"failed to compile inline JSON schema: {e}", off) from None
            ref = self.ctx.json_refs[key] = self.ctx.embed(ir, "lark_json")
        return ref

    def _named(self, name: str, off: int) -> RuleRef:
        from .grammar import Grammar

        ctx, src = self.ctx, self.src
        ref = ctx.named_refs.get(name)
        if ref is not None:
            return ref
        if name not in ctx.named:
            raise src.error(f"unknown named grammar '@{name}'", off)
        if name in ctx.named_stack:
            chain = " -> ".join(f"@{n}" for n in [*ctx.named_stack[ctx.named_stack.index(name):], name])
            raise src.error(f"circular named grammar reference: {chain}", off)
        value = ctx.named[name]
        if isinstance(value, Grammar):
            ref = ctx.embed(value.ir, f"{name}_")
        else:
            if self.depth + 1 > MAX_LARK_NESTING:
                raise src.limit_error(f"named grammars nested deeper than {MAX_LARK_NESTING} levels", off)
            ctx.named_stack.append(name)
            try:
                inner = _Source(value)
                ast = _parse(inner, self.depth + 1)
                ref = _Lowering(ctx, inner, ast, self.depth + 1, False).run()
            except GrammarError as e:
                where = f" (line {e.line}, column {e.column} of its text)" if e.line is not None else ""
                raise type(e)(f"in named grammar '@{name}': {e.message}{where}", *src.pos(off)) from None
            finally:
                ctx.named_stack.pop()
        ctx.named_refs[name] = ref
        return ref


def _parse(src: _Source, depth: int) -> _GrammarAST:
    text = src.text
    if len(text) > MAX_GRAMMAR_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_GRAMMAR_BYTES:
        raise GrammarLimitError(f"grammar text exceeds the limit of {MAX_GRAMMAR_BYTES} bytes")
    return _Parser(src, _Lexer(src).tokens()).parse_grammar(depth)


def _checked_named(named_grammars: Mapping[str, Any] | None) -> dict[str, Any]:
    from .grammar import Grammar

    if named_grammars is None:
        return {}
    if not isinstance(named_grammars, Mapping):
        raise TypeError("named_grammars must be a dictionary of names to Grammar objects or Lark strings")
    out = {}
    for name, value in named_grammars.items():
        if not isinstance(name, str):
            raise TypeError("named grammar names must be strings")
        if not _NAMED_GRAMMAR_KEY.match(name):
            raise GrammarError(f"Invalid named grammar name {name!r}: names may contain only letters, digits, "
                               "underscores and hyphens")
        if not isinstance(value, (Grammar, str)):
            raise TypeError("named grammar values must be Grammar instances or Lark strings")
        out[name] = value
    return out


def _locate(e: GrammarError, src: _Source) -> None:
    """Reword a located error as xgrammar words its Lark errors (``Lark error at line L, column
    C: ...``, then the offending line and a caret under the column), so that callers matching on
    that form, as xgrammar's own tests do, read ours alike. The error keeps its type and its
    `line` / `column` attributes."""
    if e.line is None or e.column is None:
        return
    text = f"Lark error at line {e.line}, column {e.column}: {e.message}"
    if 1 <= e.line <= len(src.line_starts):
        begin = src.line_starts[e.line - 1]
        end = src.line_starts[e.line] if e.line < len(src.line_starts) else len(src.text)
        line = src.text[begin:end].rstrip("\r\n")
        if len(line) <= 500:
            text += f"\n{line}\n{' ' * (e.column - 1)}^"
    e.args = (text,)


def lark_to_ir(lark_string: str, tokenizer_info: Any = None,
               named_grammars: Mapping[str, Any] | None = None) -> GrammarIR:
    """The grammar of a Lark text (xgrammar's dialect, see the module notes). `named_grammars`
    maps the names `@name` references use (without the `@`) to xg2 Grammars or Lark texts.
    `tokenizer_info` resolves special tokens (`<|name|>`, `<[ids]>`), which must be special
    tokens of that vocabulary; the grammar is then for that vocabulary only. The root rule is
    `root`, the `start` rule."""
    if not isinstance(lark_string, str):
        raise TypeError(f"lark_string must be a str, not {type(lark_string).__name__}")
    ctx = _Context(_checked_named(named_grammars), tokenizer_info)
    src = _Source(lark_string)
    try:
        ast = _parse(src, 0)
        root = _Lowering(ctx, src, ast, 0, True).run()
    except GrammarError as e:
        _locate(e, src)
        raise
    assert root.name == "root"
    rules = sorted(ctx.rules, key=lambda r: r.name != "root")
    return GrammarIR(rules, "root")

