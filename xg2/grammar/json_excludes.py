"""Excluded strings in JSON Schema content: the `excludes` of a structural tag's `json_schema` format.

A model's tool-call parser cuts a call at its closing tag, so the text generated for the arguments
must not hold `</tool_call>` (or, in an XML style, `</parameter>`) where the parser would read it;
a caller names its closing tags in `excludes` (the model formats do not yet: see the cost below).

What is matched (as in xgrammar): the text of string content as it is written. That is a JSON string
between its quotes, escapes as they are (`<\\/tool_call>` is not `</tool_call>`, `\\u00ab` holds
`ab`); an XML raw value; a property name as written (JSON-escaped, or entity-escaped where an XML
style escapes names). Within content every kind is exact: free strings, strings under
minLength/maxLength, pattern or format, listed values (an enum or const alternative any of whose
strings or keys holds an excluded string, decoded or written, is dropped), listed and free names,
names under patternProperties/propertyNames, at any depth.

Quotes, JSON punctuation, numbers and literals, XML tags and the padding around values are never
part of a match. The excluded strings that such text could spell, or that could run from content
into it, are refused (`ExcludesError`), since the model's parser would read them all the same:

* one that JSON text outside strings could spell (white space, ``{}[],:``, numbers, true, false,
  null, the layout's separators, next to one another): `1`, `, `, `true`, `e}` (but not `ta`);
* one holding ``"``: it could run across a string's quotes (``x"`` after a value ending in x);
* in an XML style: one that starts or ends with white space (the padding around values; xgrammar
  refuses these too), holds the last character of a value's opening tag (``>``) before its end or
  the first character of the closing tag (``<``; ``]`` in minimax_m3_xml) after its start, or could
  run from the tag text around an argument name into the name.

Listed names (and the names in listed values) are checked in place: one whose tag text around it
would hold an excluded string overlapping the name is dropped like a name holding one.

How: free JSON strings are free text between escapes when no excluded string holds a backslash or
begins with a character an escape ends with (`text_until`, one automaton); everything else is the
language as written (a `regular.KeyDFA`) met with the automaton of texts holding no excluded
string (`regular.avoiding`), written back as right-linear rules, and only where the language could
hold one (a pattern of digits is left as it is, and so is a constrained XML raw value, which holds
no `<`). Free XML raw text is `text_until` its closing tag.

Cost: a length bound that could hold an excluded string is one rule per (length, prefix of the
excluded strings) pair: exact, but its masks cost milliseconds a token on a large vocabulary (one
rule call per character, no two alike), and past `regular.MAX_STATES` states (about 250 characters
of bound for `</tool_call>`) it is refused with a GrammarLimitError at the string's schema.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from ..errors import GrammarLimitError, SchemaError
from .ir import CharClass, Choice, Expr, Literal, Repeat, Seq
from .json_common import CHAR, ESCAPE, XMLStyle, _canon_str
from .regular import KeyDFA, avoiding, from_expr, intersect, spelled, to_rules
from .text import MAX_TEXT_STATES, text_until

#: Characters JSON writes outside strings on their own (the layout's separators join them) ...
JSON_OUTSIDE = frozenset(" \t\n\r{}[],:0123456789+-.eE")
#: ... and its literals.
JSON_LITERALS = ("true", "false", "null")
#: What a JSON escape holds after its backslash (`\\n`, `\\/`, `\\u00e9`): a string that begins with
#: one of these could begin inside an escape.
ESCAPE_TAILS = frozenset('"\\/bfnrtu0123456789abcdefABCDEF')
_WS = frozenset(" \t\n\r")
#: A JSON string's character, with `"` (never raw in one) standing for any escape.
_UNIT = CharClass(((0, 0x1F), (0x5C, 0x5C)), negated=True)
_CONTROLS = tuple(chr(c) for c in range(0x20))
#: Most distinct prefixes of the excluded strings: free text also avoids the 34 characters a JSON
#: string cannot hold raw, within the text automaton's limit.
MAX_PREFIXES = MAX_TEXT_STATES - 40


class ExcludesError(SchemaError):
    """An excluded string that cannot be kept out exactly; `index` is its place in the list."""

    def __init__(self, message: str, index: int):
        super().__init__(message, "")
        self.index = index


def _leaf_ranges(e: Expr) -> list[tuple[int, int]] | None:
    """The code points the texts of a rule-free expression may hold (None: unknown)."""
    out: list[tuple[int, int]] = []
    seen = {id(e)}
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, Literal):
            out += [(ord(c), ord(c)) for c in x.text]
        elif isinstance(x, CharClass):
            out += x.codepoint_ranges()
        elif isinstance(x, (Seq, Choice, Repeat)):
            for k in x.items if isinstance(x, Seq) else x.alts if isinstance(x, Choice) else (x.expr,):
                if id(k) not in seen:
                    seen.add(id(k))
                    stack.append(k)
        else:
            return None
    return out


def _unit_spelling(cc: CharClass) -> Expr:
    """A class of `_UNIT`s as JSON text: its characters, and any escape for the stand-in `"`."""
    ranges = cc.codepoint_ranges()
    if not any(lo <= 0x22 <= hi for lo, hi in ranges):
        return cc
    rest = tuple((a, b) for lo, hi in ranges for a, b in ((lo, min(hi, 0x21)), (max(lo, 0x23), hi)) if a <= b)
    return Choice((CharClass(rest), ESCAPE)) if rest else ESCAPE


def _same(cc: CharClass) -> Expr:
    return cc


def _straddles(e: str, before: str, after: str, inside: Callable[[str, bool, bool], bool]) -> bool:
    """Whether `e` can occur as x + y + z around a name: y a nonempty part of the name that
    `inside(y, x != "", z != "")` allows, x the end of the text `before` it (or more), z the start of
    the text `after` it (or more), x or z not empty."""
    n = len(e)
    for i in range(n):
        x = e[:i]
        if x and not (before.endswith(x) or x.endswith(before)):
            continue
        for j in range(i + 1, n + 1):
            z = e[j:]
            if (x or z) and (not z or after.startswith(z) or z.startswith(after)) and inside(e[i:j], bool(x), bool(z)):
                return True
    return False


def _templates(xml: XMLStyle) -> list[tuple[str, str]]:
    """The (before, after) texts around a name in the style's tags, for every type marker."""
    out = []
    for piece in (*xml.open, xml.close):
        if "{name}" in piece:
            for marker in xml.markers():
                before, _, after = piece.replace("{kind}", marker).partition("{name}")
                out.append((before, after))
    return list(dict.fromkeys(out))


def _xml_problem(e: str, xml: XMLStyle) -> str | None:
    if e[0] in _WS or e[-1] in _WS:
        return ("an excluded string must not start or end with formatting whitespace: XML styles write white "
                "space around values")
    lasts = {p.replace("{kind}", m)[-1] for p in (*xml.open, *xml.item_open) for m in xml.markers()}
    if any(c in lasts for c in e[:-1]):
        return "it could run from the opening tag of a value into the value"
    if xml.until()[0] in e[1:]:
        return "it could run from a value into its closing tag"
    if xml.names is not None:
        ranges = _leaf_ranges(xml.names) or [(0, 0x10FFFF)]
        escaped = {ch for ch, _ in xml.escapes}
        extra = {c for _, entity in xml.escapes for c in entity}

        def name_char(c: str) -> bool:
            return c in extra or (c not in escaped and any(lo <= ord(c) <= hi for lo, hi in ranges))

        for before, after in _templates(xml):
            if _straddles(e, before, after, lambda y, _x, _z: all(map(name_char, y))):
                return "it could run from the tag around an argument name into the name"
    return None


@functools.lru_cache(maxsize=64)
def _outside(layout: str) -> KeyDFA:
    """JSON text without strings, loosely: its characters and literals in any order."""
    chars = sorted(JSON_OUTSIDE | set(layout))
    atoms = Choice((CharClass(tuple((ord(c), ord(c)) for c in chars)), *map(Literal, JSON_LITERALS)))
    return from_expr(Repeat(atoms, 0, None))


def _spelled_outside(e: str, layout: str) -> bool:
    """Whether JSON text outside strings could hold `e`."""
    if not set(e) <= JSON_OUTSIDE | set(layout) | set("".join(JSON_LITERALS)):
        return False
    return not intersect(_outside(layout), avoiding([e]).complement()).is_empty()


def check_excludes(excludes, xml: XMLStyle | None, layout: str = "") -> tuple[str, ...]:
    """The excluded strings, checked (see the module notes); `layout`: the characters of the
    separators and indent JSON is written with."""
    if isinstance(excludes, str):
        raise TypeError("excludes must be a sequence of strings")
    excludes = list(excludes)
    trie: dict = {}
    size = 0
    for i, e in enumerate(excludes):
        if not isinstance(e, str) or not e:
            raise ExcludesError("an excluded string must be a non-empty string", i)
        node = trie
        for ch in e:
            if ch not in node:
                node[ch] = {}
                size += 1
                if size > MAX_PREFIXES:
                    raise GrammarLimitError(f"excluded strings with more than {MAX_PREFIXES} distinct prefixes")
            node = node[ch]
    out = []
    for i, e in enumerate(excludes):
        problem = None
        if '"' in e:
            problem = "it holds '\"', so it could run across a JSON string's quotes"
        elif xml is not None and (e[0] in _WS or e[-1] in _WS):
            problem = _xml_problem(e, xml)      # the padding first: the likelier thing to fix
        elif _spelled_outside(e, layout):
            problem = "JSON text outside strings (numbers, literals, punctuation, white space) could spell it"
        elif xml is not None:
            problem = _xml_problem(e, xml)
        if problem is not None:
            raise ExcludesError(f"excluded string {e!r} cannot be kept out of the value: {problem}", i)
        out.append(e)
    return tuple(dict.fromkeys(out))


class Excluder:
    """Keeps excluded strings out of the string content a converter builds (see the module notes);
    the converter passes its rule naming (`fresh`) and rule list to the methods that write rules."""

    def __init__(self, excludes, xml: XMLStyle | None, layout: str = ""):
        self.strings = check_excludes(excludes, xml, layout)
        self.xml = xml
        self.noe = avoiding(self.strings)
        self.contains = self.noe.complement()
        self.escape_safe = all("\\" not in e and e[0] not in ESCAPE_TAILS for e in self.strings)
        self.memo: dict[tuple, Expr | None] = {}

    def holds(self, text: str) -> bool:
        return any(e in text for e in self.strings)

    # listed strings -------------------------------------------------------------------------------
    def key_ok(self, key: str) -> bool:
        """A listed JSON key: neither its value nor its (canonical) spelling holds one."""
        return not self.holds(key) and not self.holds(_canon_str(key)[1:-1])

    def name_ok(self, name: str) -> bool:
        """A listed XML name: neither it nor its spelling holds one, nor does its tag text where
        it overlaps the name."""
        xml = self.xml
        written = xml.spell(name)
        if self.holds(name) or self.holds(written):
            return False

        def inside(y: str, x: bool, z: bool) -> bool:
            return y == written if x and z else written.startswith(y) if x else written.endswith(y)
        return not any(_straddles(e, before, after, inside) for e in self.strings for before, after in _templates(xml))

    def value_ok(self, value, xml: bool = False) -> bool:
        """A listed value none of whose strings holds one, decoded or as written: JSON (`xml`
        False) or the elements of a recursive XML style (raw strings, spelled names)."""
        stack = [value]
        while stack:
            v = stack.pop()
            if isinstance(v, str):
                if self.holds(v) or (not xml and self.holds(_canon_str(v)[1:-1])):
                    return False
            elif isinstance(v, dict):
                if not all(self.name_ok(k) if xml else self.key_ok(k) for k in v):
                    return False
                stack.extend(v.values())
            elif isinstance(v, list):
                stack.extend(v)
        return True

    # languages ------------------------------------------------------------------------------------
    def json_content(self, lo: int, hi: int | None, fresh, rules: list) -> Expr | None:
        """The text between a JSON string's quotes, lo..hi characters, holding none."""
        if self.escape_safe:
            if (lo, hi) == (0, None):
                # no excluded string can run into or out of an escape: free text between escapes
                text = text_until((), (*self.strings, '"', "\\", *_CONTROLS))
                return Seq((text, Repeat(Seq((ESCAPE, text)), 0, None)))
            return self.avoid(Repeat(_UNIT, lo, hi), fresh, rules, _unit_spelling, Repeat(CHAR, lo, hi))
        return self.avoid(Repeat(CHAR, lo, hi), fresh, rules)

    def raw_text(self, stop: str) -> Expr | None:
        """Free XML raw text up to and with `stop` (the closing tag, never part of a match)."""
        if any(e in stop for e in self.strings):
            text = text_until((), (*self.strings, stop))
            return None if text is None else Seq((text, Literal(stop)))
        return text_until((stop,), self.strings)

    def avoid(self, e: Expr, fresh, rules: list, spell: Callable[[CharClass], Expr] = _same,
              original: Expr | None = None) -> Expr | None:
        """`e` (rule-free, over the written text) without the texts that hold one; `spell` writes the
        characters of `e` (`original` is what to return when nothing need be taken out)."""
        kept = e if original is None else original
        key = (e, spell.__name__, kept)
        if key not in self.memo:
            ranges = _leaf_ranges(e)
            if ranges is not None and not any(all(any(lo <= ord(c) <= hi for lo, hi in ranges) for c in x)
                                              for x in self.strings):
                self.memo[key] = kept     # it cannot spell any of them
            else:
                self.memo[key] = self.avoid_dfa(from_expr(e), fresh, rules, lambda: kept, spell)
        return self.memo[key]

    def avoid_spelled(self, d: KeyDFA, spell: Callable[[CharClass], Expr], fresh, rules: list) -> Expr | None:
        """The language of `d` (decoded names) written through `spell`, without the texts that hold one."""
        return self.avoid_dfa(spelled(d, spell), fresh, rules, lambda: to_rules(d, spell, fresh, rules))

    def avoid_dfa(self, d: KeyDFA, fresh, rules: list, unchanged: Callable[[], Expr | None],
                  spell: Callable[[CharClass], Expr] = _same) -> Expr | None:
        if intersect(d, self.contains).is_empty():
            return unchanged()
        kept = intersect(d, self.noe)
        key = (kept, spell.__name__)
        if key not in self.memo:
            self.memo[key] = to_rules(kept, spell, lambda _hint: fresh("clear_text"), rules)
        return self.memo[key]


__all__ = ["Excluder", "ExcludesError", "check_excludes"]
