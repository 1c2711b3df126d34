"""xgrammar's dynamic tool-call dispatch in Lark, read as a TagDispatch.

xgrammar gives one shape of Lark grammar a meaning of its own: a rule ``(tool_1 | ... | tool_k)*
tail`` where ``tail`` is any text and each ``tool_i`` is ``head_i rest_i`` with ``head_i[lazy]``
(or ``[suffix=...]`` / ``[stop=...]``) being any text up to a trigger string. Read literally,
any text may hold the trigger anywhere; xgrammar reads it as the model does: free text in which a
trigger always starts its tool call, and the call must then follow (``text <tool_call>free
text</tool_call>`` is refused). That is exactly xg2's TagDispatch (text.dispatching): free text,
each trigger followed by its rest, then free text again, ending anywhere in free text.

`find_dispatches` recognises the shape on the grammar's syntax tree; the Lark lowering builds the
dispatch for the rule and skips the heads, which then serve nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .lark_syntax import _ALT, _REF, _REP, _SEQ


@dataclass
class Dispatch:
    """A rule read as a dispatch: per tool, (its head's name, the rest of its body's nodes)."""

    rule: str
    tools: list[tuple[str, str, list[Any]]]     # (tool name, head name, rest nodes)
    tail: str


def _refs(node: Any) -> list[str]:
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        tag = n[0]
        if tag == _REF:
            out.append(n[2])
        elif tag in (_SEQ, _ALT):
            stack.extend(n[1])
        elif tag == _REP:
            stack.append(n[2])
    return out


def find_dispatches(defs: dict[str, Any]) -> list[Dispatch]:
    """The rules of `defs` (name -> _Def) shaped as a dispatch whose tools and heads serve nowhere
    else (so the heads, whose literal language differs, need never be built)."""
    users: dict[str, set[str]] = {}
    for name, d in defs.items():
        if d.body is not None:
            for r in _refs(d.body):
                users.setdefault(r, set()).add(name)
    found = []
    for name, d in defs.items():
        if d.terminal or d.attrs is not None or d.body is None or d.body[0] != _SEQ or len(d.body[1]) != 2:
            continue
        rep, tail = d.body[1]
        if rep[0] != _REP or rep[3] != 0 or rep[4] is not None or tail[0] != _REF:
            continue
        inner = rep[2]
        refs = [inner] if inner[0] == _REF else list(inner[1]) if inner[0] == _ALT else []
        if not refs or any(r[0] != _REF for r in refs):
            continue
        tools = []
        for r in refs:
            tool = defs.get(r[2])
            if tool is None or tool.terminal or tool.attrs is not None or tool.body is None \
                    or tool.body[0] != _SEQ or tool.body[1][0][0] != _REF:
                break
            head = defs.get(tool.body[1][0][2])
            if head is None or head.terminal or head.attrs is None or not _is_head(head.attrs):
                break
            if users.get(tool.name, set()) - {name} or users.get(head.name, set()) - {tool.name}:
                break       # used elsewhere too: the literal language is needed there
            tools.append((tool.name, head.name, list(tool.body[1][1:])))
        else:
            found.append(Dispatch(name, tools, tail[2]))
    return found


def _is_head(attrs: Any) -> bool:
    """A head's attributes: `lazy`, or a suffix/stop marker, and nothing else that matters."""
    return ((attrs.lazy is not None or attrs.marker is not None) and attrs.capture is None
            and attrs.stop_capture is None and attrs.max_tokens is None and attrs.max_chars is None)
