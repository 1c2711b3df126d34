"""The grammar IR every front-end lowers to.

A grammar is a list of named rules whose bodies are small expression trees over Unicode code points.
Everything after the IR (FSM lowering, hashing, the Cython core) is shared by all front-ends, so the
IR is deliberately tiny: literals, character classes, sequences, choices, bounded repetition, rule
references, and one leaf for free text that stops at and avoids given strings (text.py). Expressions
are frozen dataclasses so that structurally equal sub-expressions compare and hash equal, which the
lowering uses to share work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Union

MAX_CODEPOINT = 0x10FFFF

#: The byte that opens the spelling of a special token inside automata (see `text_bytes`): no
#: UTF-8 text holds it, and the vocabulary core lets no ordinary token hold it.
SPECIAL_LEAD = 0xF8


def text_bytes(text: str) -> bytes:
    """The bytes automata read for IR text: UTF-8, except that each surrogate code point (the
    character standing for a named special token, see TokenizerInfo.named_special_tokens) is
    SPECIAL_LEAD and two bytes of its index. Spelled as UTF-8-style surrogates (ED A0 ..), a special
    token could be written out by ordinary byte tokens (a lone ED is a valid start of Hangul);
    behind a byte that no allowed token holds, only the special token itself reads it."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        out = bytearray()
        for ch in text:
            cp = ord(ch)
            if 0xD800 <= cp <= 0xDFFF:
                k = cp - 0xD800
                out += bytes((SPECIAL_LEAD, 0x80 | (k >> 6), 0x80 | (k & 0x3F)))
            else:
                out += ch.encode("utf-8")
        return bytes(out)


def _cached_hash(self) -> int:
    """A node's hash, computed once: IR is immutable, and a tuple's hash walks the whole
    subtree every time, so a choice that deduplicates alternatives built bottom-up (a trie of
    object keys, an enum) used to hash each subtree once per level above it."""
    h = self.__dict__.get("_hash")
    if h is None:
        d = self.__dict__       # (which also holds memos such as _body_key's "_written")
        h = hash((type(self).__name__, *[d[f] for f in self.__dataclass_fields__]))
        self.__dict__["_hash"] = h
    return h


def _state_without_hash(self) -> dict:
    """Pickled state without the cached hash: string hashes differ between processes."""
    state = dict(self.__dict__)
    state.pop("_hash", None)
    return state


@dataclass(frozen=True)
class Literal:
    """A fixed string; matched as its UTF-8 bytes (empty string is epsilon)."""

    text: str


@dataclass(frozen=True)
class CharClass:
    """A set of code points as sorted, disjoint, inclusive ranges; `negated` complements it."""

    ranges: tuple[tuple[int, int], ...]
    negated: bool = False
    __hash__ = _cached_hash
    __getstate__ = _state_without_hash

    def codepoint_ranges(self) -> tuple[tuple[int, int], ...]:
        """The ranges actually matched, normalised and with negation applied (no surrogates)."""
        merged = normalize_ranges(self.ranges)
        return complement_ranges(merged) if self.negated else merged


def normalize_ranges(ranges) -> tuple[tuple[int, int], ...]:
    """Sorted, merged, inclusive ranges: the form CharClass expects and equality relies on."""
    merged: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return tuple((lo, hi) for lo, hi in merged)


def complement_ranges(ranges: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """The complement within all code points of normalised `ranges`."""
    out = []
    nxt = 0
    for lo, hi in ranges:
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CODEPOINT:
        out.append((nxt, MAX_CODEPOINT))
    return tuple(out)


@dataclass(frozen=True)
class Seq:
    items: tuple[Expr, ...]
    __hash__ = _cached_hash
    __getstate__ = _state_without_hash


@dataclass(frozen=True)
class Choice:
    alts: tuple[Expr, ...]
    __hash__ = _cached_hash
    __getstate__ = _state_without_hash


@dataclass(frozen=True)
class Repeat:
    """`expr{min,max}`; `max is None` means unbounded (`*` is {0,}, `+` is {1,}, `?` is {0,1})."""

    expr: Expr
    min: int
    max: int | None
    __hash__ = _cached_hash
    __getstate__ = _state_without_hash


@dataclass(frozen=True)
class RuleRef:
    name: str


@dataclass(frozen=True)
class FreeText:
    """Text up to and including the first occurrence of one of `ends` (any text when there are
    none) that holds none of `excludes`; it may also hold the special-token characters `tokens`
    (surrogates, see text.py). A leaf: the automaton builder lowers it to its states directly,
    since as an expression of the other nodes it can be hundreds of thousands of nodes. The
    strings are sorted and distinct (text.text_until builds it so), which makes equal nodes equal."""

    ends: tuple[str, ...]
    excludes: tuple[str, ...] = ()
    tokens: tuple[str, ...] = ()


@dataclass(frozen=True)
class TokenSet:
    """One token whose id is in `ids` (`exclude`: one token whose id is not), whatever its text:
    xgrammar's token edges (EBNF's ``Token(...)`` / ``ExcludeToken(...)``). Stop tokens and tokens
    without text never count. `ids` is sorted and distinct. Lowering numbers a grammar's sets
    (TokenSlot) and reads each as TOKEN_LEAD and two bytes of its number: no text holds that byte,
    so only the matcher's token step crosses it (see MatcherCore.accept_token)."""

    ids: tuple[int, ...]
    exclude: bool = False


@dataclass(frozen=True)
class TokenSlot:
    """A TokenSet as lowering numbers it within one grammar: what automata are built from (the
    set itself lives in the grammar's tables, so equal automata stay equal across grammars)."""

    index: int


@dataclass(frozen=True)
class Unbuildable:
    """A part of a grammar that was read but cannot be built (EBNF's ``Regex(...)`` with a
    pattern that is no regular language xg2 builds): its source, printed back as it was, and the
    error it raises when the grammar is compiled (xgrammar reports such patterns at first use,
    so reading the grammar succeeds)."""

    source: str
    message: str
    line: int
    column: int


#: The byte that opens a token edge inside automata (then two bytes 0x80 | 6 bits of the slot).
TOKEN_LEAD = 0xF9
#: Most distinct token sets one grammar may hold.
MAX_TOKEN_SETS = 4096


def token_slot_bytes(index: int) -> bytes:
    return bytes((TOKEN_LEAD, 0x80 | (index >> 6), 0x80 | (index & 0x3F)))


Expr = Union[Literal, CharClass, Seq, Choice, Repeat, RuleRef, FreeText, TokenSet, TokenSlot, Unbuildable]  # noqa: UP007


@dataclass
class Rule:
    name: str
    body: Expr
    lookahead: Expr | None = None
    #: (rule F, n): wherever this rule ends, any prefix of a string of F with at most n elements
    #: can follow in the parse (set by repetition compression, see repetition.py; the mask builder
    #: then accepts tokens that read into F without looking at the callers).
    follow: tuple[str, int] | None = None
    #: The sampling temperature while the parse is inside this rule (EBNF's and Lark's
    #: ``[temperature=...]`` rule attribute, see GrammarMatcher.temperature); None: the caller's.
    #: Such a rule is never inlined, so the parser can tell when it is inside it.
    temperature: float | None = None
    #: The name each completion of this rule is recorded under (Lark's and EBNF's ``[capture]``
    #: attribute, see GrammarMatcher.get_captures); such a rule is never inlined either.
    capture: str | None = None
    #: At most this many tokens inside each occurrence of this rule, where it can end (xgrammar's
    #: ``[max_tokens=n]``, enforced by the matcher: see MatcherCore._enforce_budgets); kept a rule.
    max_tokens: int | None = None
    #: Bytes left out at the end of this rule's own captures (the marker of a suffix/stop rule).
    capture_trim: int = 0
    #: Bytes at the end of each completion left out of every enclosing capture (a stop marker).
    hide_tail: int = 0
    #: The capture name each completion's marker (its last `capture_trim` or `hide_tail` bytes) is
    #: recorded under (Lark's ``stop_capture``).
    stop_capture: str | None = None


@dataclass
class GrammarIR:
    rules: list[Rule] = field(default_factory=list)
    root: str = "root"

    def rule_map(self) -> dict[str, Rule]:
        return {r.name: r for r in self.rules}


EPSILON = Literal("")


def seq(*items: Expr | None) -> Expr | None:
    """A sequence for front-ends that build languages bottom-up, with None standing for the empty
    language: it absorbs the sequence; epsilons drop out; one item stands for itself."""
    if any(i is None for i in items):
        return None
    flat = [i for i in items if i != EPSILON]
    if not flat:
        return EPSILON
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))


def choice(alts: list[Expr | None]) -> Expr | None:
    """A choice with None (the empty language) and duplicate alternatives dropped; None if none is left."""
    # A set, not list membership: a choice of thousands of alternatives (an enum, an object's
    # members) would cost a quadratic number of deep comparisons.
    out = list(dict.fromkeys(a for a in alts if a is not None))
    if not out:
        return None
    return out[0] if len(out) == 1 else Choice(tuple(out))


#: Nodes a walk visits as a tree before it visits each shared node once instead: front-ends share
#: sub-expressions, and a walk of a DAG as a tree can take exponential time (free text written out
#: as an expression once did); below this a plain tree walk is cheaper than the memo by identity.
MAX_TREE_STEPS = 8_192


def any_node(e: Expr, test: Callable[[Expr], bool]) -> bool:
    """Whether `test` holds for some node of `e`, each shared node visited once: expressions are
    DAGs (front-ends reuse sub-expressions), and walking one as a tree can take exponential time."""
    seen = {id(e)}
    stack = [e]
    while stack:
        x = stack.pop()
        if test(x):
            return True
        t = type(x)
        for k in x.items if t is Seq else x.alts if t is Choice else (x.expr,) if t is Repeat else ():
            if id(k) not in seen:
                seen.add(id(k))
                stack.append(k)
    return False
