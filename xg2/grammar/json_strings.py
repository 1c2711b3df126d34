"""JSON Schema strings: length bounds, `pattern`, `format` and what `not` excludes.

A mixin of the converter (json_schema._Converter), split off along the string seam. A string's
value is constrained over decoded characters and then spelled as JSON (json_string.py): length
bounds fold into a pattern's one repetition where its structure allows (`_with_length`);
otherwise patterns, formats, bounds and the leaves of `not` are met on automata over code points
(regular.py) and written back as rules.
"""

from __future__ import annotations

from ..errors import GrammarError, GrammarLimitError, SchemaError
from .ir import CharClass, Choice, Expr, Literal, Repeat, Seq
from .ir import choice as _choice
from .json_common import _CANNOT, ANNOTATIONS, CHAR, MORE_STRINGS, NEVER, RAW_TEXT, _ptr
from .json_negation import leaves
from .json_object import _key_dfa
from .regex import ANY_CHAR, regex_to_expr
from .regular import KeyDFA, intersect, to_rules


def _length_range(e: Expr) -> tuple[int, int | None] | None:
    """(min, max) number of characters of the strings of a rule-free expression (None: unbounded)."""
    if isinstance(e, Literal):
        return len(e.text), len(e.text)
    if isinstance(e, CharClass):
        return 1, 1
    if isinstance(e, Seq):
        lo, hi = 0, 0
        for x in e.items:
            a, b = _length_range(x)
            lo, hi = lo + a, None if hi is None or b is None else hi + b
        return lo, hi
    if isinstance(e, Choice):
        ranges = [_length_range(x) for x in e.alts]
        return min(a for a, _ in ranges), None if any(b is None for _, b in ranges) else max(b for _, b in ranges)
    if isinstance(e, Repeat):
        a, b = _length_range(e.expr)
        return a * e.min, None if e.max is None or b is None else b * e.max
    raise TypeError(f"unexpected {e!r}")

def _with_length(e: Expr, lo: int, hi: int | None):
    """`e` restricted to strings of lo..hi characters: `e` itself when the bounds cannot cut, the
    bounds folded into the one variable-length repetition of a fixed-width element (per
    alternative), None when nothing fits, or _CANNOT when the structure does not allow it exactly."""
    a, b = _length_range(e)
    if a >= lo and (hi is None or (b is not None and b <= hi)):
        return e
    if b is not None and b < lo or hi is not None and a > hi:
        return None
    if isinstance(e, Choice):
        alts = [_with_length(x, lo, hi) for x in e.alts]
        if any(x is _CANNOT for x in alts):
            return _CANNOT
        alts = [x for x in alts if x is not None]
        return Choice(tuple(alts)) if len(alts) > 1 else (alts[0] if alts else None)
    items = list(e.items) if isinstance(e, Seq) else [e]
    ranges = [_length_range(x) for x in items]
    variable = [i for i, (x, y) in enumerate(ranges) if x != y]
    if len(variable) != 1 or not isinstance(items[variable[0]], Repeat):
        return _CANNOT
    i = variable[0]
    rep = items[i]
    w, w2 = _length_range(rep.expr)
    if w != w2 or w == 0:
        return _CANNOT
    fixed = sum(x for j, (x, _) in enumerate(ranges) if j != i)
    new_min = max(rep.min, -(-(lo - fixed) // w))
    new_max = (hi - fixed) // w if hi is not None else None
    if rep.max is not None:
        new_max = rep.max if new_max is None else min(new_max, rep.max)
    if new_max is not None and new_min > new_max:
        return None
    items[i] = Repeat(rep.expr, new_min, new_max)
    return Seq(tuple(items)) if len(items) > 1 else items[0]


class StringLowering:
    """The string half of the converter; see the module notes."""

    def string(self, lo: int = 0, hi: int | None = None, ptr: str | None = None) -> Expr:
        if self.excl is not None:
            def build():
                content = self.excluded(lambda: self.excl.json_content(lo, hi, self.new_name, self.rules),
                                        self.where if ptr is None else ptr)
                return None if content is None else Seq((Literal('"'), content, Literal('"')))
            return self.cached_or_none(("string", lo, hi), "string" if (lo, hi) == (0, None) else f"string_{lo}_{hi}",
                                       build)
        if (lo, hi) == (0, None):
            return self.cached(("string",), "string", lambda: Seq((Literal('"'), Repeat(CHAR, 0, None), Literal('"'))))
        # One rule per bound pair: every member with the same bounds shares its automaton, and so its
        # mask entries (a schema often repeats `maxLength: 128` hundreds of times).
        return self.cached(("string", lo, hi), f"string_{lo}_{hi}",
                           lambda: Seq((Literal('"'), Repeat(CHAR, lo, hi), Literal('"'))))

    def string_value(self, schema: dict, ptr: str, raw: bool = False) -> Expr | None:
        """A string under minLength/maxLength/pattern/format. Pattern and format constrain the decoded
        value (as regexes over characters), lowered to their JSON spelling (or, `raw`, left as they
        are: RAW_TEXT when nothing constrains them); the length bounds are folded into them where
        the structure allows it (see `_with_length`)."""
        def plain(lo: int, hi: int | None) -> Expr:
            if not raw:
                return self.string(lo, hi, ptr)
            return RAW_TEXT if (lo, hi) == (0, None) else Repeat(ANY_CHAR, lo, hi)

        lo = self.bound(schema, "minLength", ptr, 0)
        hi = self.bound(schema, "maxLength", ptr, None)
        if hi is not None and lo > hi:
            return None
        values: list[Expr] = []
        fmt = schema.get("format")
        if fmt is not None:
            if not isinstance(fmt, str):
                raise SchemaError("format must be a string", _ptr(ptr, "format"))
            fx = self.format_of(fmt)  # unknown formats are annotations, as the specification says
            if fx is not None:
                values.append(fx)
        if "pattern" in schema:
            pattern = schema["pattern"]
            if not isinstance(pattern, str):
                raise SchemaError("pattern must be a string", _ptr(ptr, "pattern"))
            try:
                values.append(regex_to_expr(pattern, search=True))
            except GrammarLimitError:
                raise
            except GrammarError as exc:
                return self.unsupported("pattern", _ptr(ptr, "pattern"), f"pattern {pattern!r}: {exc}",
                                        fallback=plain(lo, hi))
        for i, more in enumerate(schema.get(MORE_STRINGS, [])):
            (k, v), = more.items()
            where = _ptr(ptr, "allOf", i, k)
            if not isinstance(v, str):
                raise SchemaError(f"{k} must be a string", where)
            try:
                extra = self.format_of(v) if k == "format" else regex_to_expr(v, search=True)
            except GrammarLimitError:
                raise
            except GrammarError as exc:
                return self.unsupported(k, where, f"{k} {v!r}: {exc}", fallback=plain(lo, hi))
            if extra is not None:
                values.append(extra)
        excluded = leaves(schema["not"]) if "not" in schema else []
        if excluded or len(values) > 1:
            return self.attempt(lambda: self.string_automaton(values, lo, hi, excluded, ptr, raw), "not" if excluded
                                else "pattern", ptr, lambda: self.quoted(values[0], 0, None, ptr, raw) if values
                                else plain(lo, hi))
        if not values:
            return plain(lo, hi)
        return self.quoted(values[0], lo, hi, ptr, raw)

    def string_automaton(self, values: list[Expr], lo: int, hi: int | None, excluded: list[dict], ptr: str,
                         raw: bool = False) -> Expr | None:
        """A string meeting every pattern/format in `values`, the length bounds, and none of the
        `excluded` leaves (`pattern`, `format`, string `enum`/`const`): the languages met and
        complemented on automata over the decoded text (regular.py), then spelled as JSON (or,
        `raw`, as raw text without `<`). For what the plain path cannot build: two patterns, a
        length bound a pattern's structure does not carry, a negation."""
        dfa = None

        def meet(x: KeyDFA) -> None:
            nonlocal dfa
            dfa = x if dfa is None else intersect(dfa, x)

        try:
            for v in values:
                meet(_key_dfa(v))
            if lo > 0 or hi is not None:
                meet(_key_dfa(Repeat(ANY_CHAR, lo, hi)))
            if raw:
                meet(_key_dfa(Repeat(CharClass(((0x3C, 0x3C),), negated=True), 0, None)))
            for leaf in excluded:
                (k, v), = ((k, v) for k, v in leaf.items() if k not in ANNOTATIONS)
                if k == "pattern":
                    try:
                        e = regex_to_expr(v, search=True)
                    except GrammarLimitError:
                        raise
                    except GrammarError as exc:
                        return self.unsupported("not", _ptr(ptr, "not"), f"pattern {v!r}: {exc}", fallback=None)
                elif k == "format":
                    e = self.format_of(v) if isinstance(v, str) else None
                    if e is None:
                        return None     # a format that is an annotation: every string has it
                else:
                    e = _choice([Literal(x) for x in (v if k == "enum" else [v])]) or NEVER
                meet(_key_dfa(e).complement())
        except GrammarLimitError as exc:
            if exc.pointer is not None:
                raise
            raise GrammarLimitError(f"{exc.message} (the string language of pattern, format, length and 'not' "
                                    "met on an automaton)", pointer=ptr) from None
        if dfa is None:
            dfa = _key_dfa(Repeat(ANY_CHAR, 0, None))
        if raw:
            return to_rules(dfa, lambda cc: cc, self.new_name, self.rules)

        def build():
            if self.excl is None:
                body = to_rules(dfa, self.spell, self.new_name, self.rules)
            else:
                body = self.excluded(lambda: self.excl.avoid_spelled(dfa, self.spell, self.new_name,
                                                                     self.rules), ptr)
            return None if body is None else Seq((Literal('"'), body, Literal('"')))
        return self.cached_or_none(("string_automaton", dfa), "string_value", build)

    def quoted(self, value: Expr, lo: int, hi: int | None, ptr: str, raw: bool = False) -> Expr | None:
        if lo > 0 or hi is not None:
            limited = _with_length(value, lo, hi)
            if limited is _CANNOT:
                return self.attempt(lambda: self.string_automaton([value], lo, hi, [], ptr, raw), "maxLength", ptr,
                                    lambda: self.quoted(value, 0, None, ptr, raw))
            if limited is None:
                return None
            value = limited
        if raw:
            return value
        body = self.spell(value)
        if self.excl is not None:
            body = self.avoid(body, ptr)
            if body is None:
                return None
        return self.cached(("quoted", body), "string_value", lambda: Seq((Literal('"'), body, Literal('"'))))
