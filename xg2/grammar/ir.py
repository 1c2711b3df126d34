"""The grammar IR every front-end lowers to.

A grammar is a list of named rules whose bodies are small expression trees over Unicode code points.
Everything after the IR (FSM lowering, hashing, the Cython core) is shared by all front-ends, so the
IR is deliberately tiny: literals, character classes, sequences, choices, bounded repetition and rule
references. Expressions are frozen dataclasses so that structurally equal sub-expressions compare and
hash equal, which the lowering uses to share work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

MAX_CODEPOINT = 0x10FFFF


@dataclass(frozen=True)
class Literal:
    """A fixed string; matched as its UTF-8 bytes (empty string is epsilon)."""

    text: str


@dataclass(frozen=True)
class CharClass:
    """A set of code points as sorted, disjoint, inclusive ranges; `negated` complements it."""

    ranges: tuple[tuple[int, int], ...]
    negated: bool = False

    def codepoint_ranges(self) -> tuple[tuple[int, int], ...]:
        """The ranges actually matched, normalised and with negation applied (no surrogates)."""
        merged: list[list[int]] = []
        for lo, hi in sorted(self.ranges):
            if merged and lo <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        if self.negated:
            out = []
            nxt = 0
            for lo, hi in merged:
                if lo > nxt:
                    out.append([nxt, lo - 1])
                nxt = hi + 1
            if nxt <= MAX_CODEPOINT:
                out.append([nxt, MAX_CODEPOINT])
            merged = out
        return tuple((lo, hi) for lo, hi in merged)


@dataclass(frozen=True)
class Seq:
    items: tuple[Expr, ...]


@dataclass(frozen=True)
class Choice:
    alts: tuple[Expr, ...]


@dataclass(frozen=True)
class Repeat:
    """`expr{min,max}`; `max is None` means unbounded (`*` is {0,}, `+` is {1,}, `?` is {0,1})."""

    expr: Expr
    min: int
    max: int | None


@dataclass(frozen=True)
class RuleRef:
    name: str


Expr = Union[Literal, CharClass, Seq, Choice, Repeat, RuleRef]  # noqa: UP007 (runtime alias)


@dataclass
class Rule:
    name: str
    body: Expr
    lookahead: Expr | None = None


@dataclass
class GrammarIR:
    rules: list[Rule] = field(default_factory=list)
    root: str = "root"

    def rule_map(self) -> dict[str, Rule]:
        return {r.name: r for r in self.rules}


EPSILON = Literal("")
