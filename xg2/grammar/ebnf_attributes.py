"""EBNF rule attributes (``name[attr, ...] ::= ...``): reading them, and building those that
change the rule's language (``max_chars``, ``lazy``) once every rule is read.

``temperature``, ``capture`` and ``max_tokens`` are kept on the rule (Rule) for the lowering and
the matcher; xgrammar's other attributes are refused by name, never ignored.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from ..errors import GrammarLimitError
from .ir import EPSILON, Expr, Rule, Seq

if TYPE_CHECKING:
    from .ebnf import _Source

#: `name[...] ::=`: a bracket group right after a rule's name (no space) and before its '::='.
_ATTR_GROUP_RE = re.compile(r"\[([^\]\n]*)\](?=[ \t]*::=)")
_ATTR_ITEM_RE = re.compile(r'[ \t]*([A-Za-z_][A-Za-z0-9_]*)[ \t]*(?:=[ \t]*("(?:[^"\\]|\\.)*"|[^,\s"]+))?[ \t]*(,|\Z)')
_NUMBER_RE = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\Z")
#: xgrammar's rule attributes that xg2 reads but does not enforce yet (refused, not ignored).
_UNSUPPORTED_ATTRS = frozenset({"suffix", "stop", "stop_capture"})


def _rule_attributes(src: _Source, pos: int, inner: str) -> dict[str, object]:
    """The attributes of the group `[inner]` at `pos`: ``temperature=<number>`` (finite,
    non-negative), the sampling temperature inside the rule, and ``capture`` / ``capture="name"``
    (Rule.capture). xgrammar's other attributes are refused by name: accepting them unenforced
    would silently under-constrain the grammar."""
    out: dict[str, object] = {}
    at = 0
    base = pos + 1
    while at < len(inner):
        m = _ATTR_ITEM_RE.match(inner, at)
        if m is None:
            raise src.error("malformed rule attributes: expected name or name=value, separated by commas",
                            base + at)
        name, value, off = m.group(1), m.group(2), base + m.start(1)
        if name in out:
            raise src.error(f"{name} attribute is specified more than once", off)
        if name == "temperature":
            if value is None or not _NUMBER_RE.match(value):
                raise src.error("expected a number after temperature=", off)
            t = float(value)
            if not math.isfinite(t) or t < 0:
                raise src.error("temperature must be a finite non-negative number", off)
            out[name] = t
        elif name == "lazy":
            if value is not None:
                raise src.error("lazy takes no value", off)
            out[name] = True
        elif name == "max_tokens":
            if value is None or not value.isdigit() or len(value) > 9 or int(value) == 0:
                raise src.error("max_tokens takes a positive integer", off)
            out[name] = int(value)
        elif name == "max_chars":
            if value is None or not value.isdigit() or len(value) > 9:
                raise src.error("max_chars takes a non-negative integer", off)
            out[name] = int(value)
        elif name == "capture":
            label = "" if value is None else value[1:-1] if value.startswith('"') else None
            if label is None or (label and not re.fullmatch(r"[A-Za-z0-9_-]+", label)):
                raise src.error("capture takes a name in quotes: letters, digits, underscores and hyphens", off)
            if value is not None and not label:
                raise src.error("capture name must not be empty", off)
            out[name] = label
        elif name in _UNSUPPORTED_ATTRS:
            raise src.error(f"the rule attribute '{name}' is not supported by xg2 yet (temperature, capture, lazy, max_chars and max_tokens are)",
                            off)
        else:
            raise src.error(f"unknown rule attribute '{name}'", off)
        at = m.end()
        if m.group(3) == "" and at < len(inner):
            raise src.error("malformed rule attributes", base + at)
    return out


def _with_char_budgets(rules: list[Rule], budgets: dict[str, tuple[int, int, bool]], src: _Source) -> list[Rule]:
    """Each rule with ``[max_chars=n]`` and/or ``[lazy]``: its body, with the rules it calls
    written in (they must not recurse: these are built into a regular language), bounded to n
    code points (see char_budget) and/or cut at its first end (lazy: committed to the shortest
    match, as xgrammar; see lark_regular.committed_rules). The rules it calls stay as they are for
    their other callers."""
    from .char_budget import within_chars
    from .lark_regular import committed_rules
    from .optimize import substitute
    from .regular import from_expr

    by_name = {r.name: r for r in rules}
    extra: list[Rule] = []
    taken = set(by_name)

    def fresh(base: str) -> str:
        k = len(taken)
        while f"{base}_{k}" in taken:
            k += 1
        taken.add(f"{base}_{k}")
        return f"{base}_{k}"

    out = []
    for r in rules:
        if r.name not in budgets:
            out.append(r)
            continue
        n, off, lazy = budgets[r.name]
        # The called rules written in, innermost first, on an explicit stack (a call back into a
        # rule being written in is recursion: not a regular language).
        written: dict[str, Expr] = {}
        stack: list[tuple[str, bool]] = [(r.name, False)]
        open_: set[str] = set()
        while stack:
            name, ready = stack.pop()
            if name in written:
                continue
            refs = sorted(_refs_of(by_name[name].body))
            if not ready:
                if name in open_:
                    raise src.error(f"max_chars on rule '{r.name}', whose text is not a regular language "
                                    f"(rule '{name}' calls itself)", off)
                open_.add(name)
                stack.append((name, True))
                stack.extend((x, False) for x in refs if x not in written)
                continue
            open_.discard(name)
            written[name] = substitute(by_name[name].body, {x: written[x] for x in refs})
        what = "lazy" if n < 0 else "max_chars"
        try:
            body: Expr | None = written[r.name]
            if lazy:
                if type(body) is Seq and len(body.items) > 1 and from_expr(body.items[0]).complement().is_empty():
                    raise src.error(f"lazy on rule '{r.name}', whose body begins with any text, is not supported by "
                                    "xg2 (xgrammar lets such text end without the rest)", off)
                body = committed_rules(body, EPSILON, fresh, f"{r.name}_lazy", extra)
            if lazy and n >= 0:
                raise src.error(f"lazy and max_chars together on rule '{r.name}' are not supported yet", off)
            if n >= 0:
                body = within_chars(body, n, fresh, f"{r.name}_chars", extra)
        except GrammarLimitError as e:
            raise src.limit_error(f"{what} on rule '{r.name}': {e.message}", off) from None
        except (ValueError, TypeError, AttributeError):
            raise src.error(f"{what} on rule '{r.name}' needs a body of text (a regular language without "
                            "token sets)", off) from None
        if body is None:
            raise src.error(f"rule '{r.name}' can never match" + (f" within max_chars={n}" if n >= 0 else ""), off)
        out.append(Rule(r.name, body, r.lookahead, r.follow, r.temperature, r.capture, r.max_tokens, r.capture_trim, r.hide_tail,
                  r.stop_capture))
    return out + extra


def _refs_of(e: Expr) -> set[str]:
    from .optimize import expr_refs

    return expr_refs(e)
