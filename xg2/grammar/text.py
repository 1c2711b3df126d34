"""Free text that stops at the first end string and never contains an excluded one.

Structural tags wrap free text (`any_text`) in tags, `<think>` … `</think>`: the text runs until the
first occurrence of an end string, which closes the tag, and must not contain the excluded strings.
That language is regular: an Aho–Corasick automaton over the end and excluded strings reads the text,
an excluded string kills it, an end string finishes it. The IR holds it as one `FreeText` leaf (the
strings themselves), which the automaton builder lowers straight into NFA states from the graph
`text_graph` builds here: linear in the automaton. Written out as a regular expression instead
(state elimination), words with distinct first letters that also occur inside other words made an
expression of hundreds of thousands of nodes for a few dozen states. The rule automaton built from
it is one minimal automaton whose main state loops on every character that starts no string: the
mask builder then accepts the tokens of ordinary text as whole trie subtrees.
"""

from __future__ import annotations

import functools

from .ir import EPSILON, CharClass, Choice, Expr, FreeText, Literal, Repeat, Seq

#: Largest text automaton built (states: one per distinct prefix of the strings, plus two).
MAX_TEXT_STATES = 512


def text_until(ends: tuple[str, ...], excludes: tuple[str, ...] = (), tokens: tuple[str, ...] = ()) -> Expr | None:
    """Text followed by one of `ends` (their first occurrence ends it), or, without ends, any text;
    no excluded string occurs in either. `tokens`: the characters of special tokens the text may
    also hold (see TokenizerInfo.named_special_tokens; those in the strings are read as part of
    them). None when the language is empty."""
    ends = tuple(sorted(set(ends)))
    excludes = tuple(sorted(set(excludes) - set(ends)))   # an end string ends the text before it could hold one
    node = FreeText(ends, excludes, tuple(sorted(set(tokens))))
    return node if text_graph(node) is not None else None


@functools.lru_cache(maxsize=256)
def text_graph(node: FreeText) -> tuple[int, int, int, tuple[tuple[int, int, Expr], ...]] | None:
    """The automaton of a FreeText as (number of states, start, final, edges (p, q, label)): each
    label is a character, a class or epsilon, so lowering it is linear in the automaton. None when
    the language is empty."""
    from ..errors import GrammarLimitError

    ends, excludes, tokens = node.ends, node.excludes, node.tokens
    patterns = sorted(set(ends) | set(excludes))
    if any(not p for p in patterns):
        raise ValueError("end and excluded strings must not be empty")
    goto, fail, depth = _aho_corasick(patterns)
    if len(goto) + 2 > MAX_TEXT_STATES:
        raise GrammarLimitError(f"free text with more than {MAX_TEXT_STATES} string prefixes")
    out: list[set[str]] = [set() for _ in goto]
    for p in patterns:
        s = 0
        for ch in p:
            s = goto[s][ch]
        out[s].add(p)
    order = sorted(range(len(goto)), key=depth.__getitem__)
    for s in order:                     # a state also matches what its fallback matches
        if s:
            out[s] |= out[fail[s]]
    excluded, ending = set(excludes), set(ends)
    dead = {s for s in range(len(goto)) if out[s] & excluded}
    done = {s for s in range(len(goto)) if s not in dead and out[s] & ending}
    alphabet = sorted({ch for p in patterns for ch in p})
    others: Expr = CharClass(tuple((ord(c), ord(c)) for c in alphabet), negated=True)
    free_tokens = sorted(set(tokens) - set(alphabet))
    if free_tokens:
        others = Choice((others, _chars(free_tokens)))
    n = len(goto)
    start, final, hub, hub_b = n, n + 1, n + 2, n + 3
    # edges[p][q]: the expression of the characters (or epsilon) leading from p to q
    edges: dict[int, dict[int, Expr]] = {s: {} for s in range(n + 4)}
    edges[start][0] = EPSILON
    # Hubs read the first character of a string as the root does. A state that reads a first
    # character as the root does (no string goes on with it from there) hands over to a hub by
    # epsilon instead of an edge per first character (fewer edges, and the states of different
    # strings do not all reach each other).
    # `hub` reads the first characters no string goes on with anywhere (every state hands over to
    # it); `hub_b` the others, for the states where none of them goes on.
    steps = {s: {ch: _step(goto, fail, s, ch) for ch in alphabet} for s in range(n) if s not in dead and s not in done}
    firsts = set(goto[0])
    deviate = {s: {ch for ch in firsts if st[ch] != goto[0][ch]} for s, st in steps.items()}
    busy = set().union(*deviate.values())      # first characters some string goes on with
    for ch in sorted(firsts):
        t = goto[0][ch]
        if t not in dead:
            _add(edges, hub_b if ch in busy else hub, t, _chars([ch]))
    for s in range(n):
        if s in dead:
            continue
        if s in done:
            edges[s][final] = EPSILON       # the end string is read: the text is over
            continue
        if not ends:
            edges[s][final] = EPSILON       # no end string: the text may stop anywhere
        _add(edges, s, hub, EPSILON)
        routed = firsts - busy
        if not deviate[s]:
            _add(edges, s, hub_b, EPSILON)
            routed = firsts
        by_target: dict[int, list[str]] = {}
        for ch, t in steps[s].items():
            if t not in dead and ch not in routed:
                by_target.setdefault(t, []).append(ch)
        for t, chars in by_target.items():
            _add(edges, s, t, _chars(chars))
        if 0 not in dead:
            _add(edges, s, 0, others)
    for q in (hub, hub_b):
        if not edges[q]:                # a hub that reads nothing leads nowhere
            for e in edges.values():
                e.pop(q, None)
    flat = tuple((p, q, e) for p, out_edges in edges.items() for q, e in out_edges.items())
    succ: dict[int, list[int]] = {}
    for p, q, _e in flat:
        succ.setdefault(p, []).append(q)
    seen, work = {start}, [start]
    while work:
        for q in succ.get(work.pop(), ()):
            if q not in seen:
                seen.add(q)
                work.append(q)
    if final not in seen:
        return None
    return n + 4, start, final, flat


def dispatching(after: dict[str, Expr | None], excludes: tuple[str, ...] = (), stops: tuple[str, ...] = (),
                stop_at_end: bool = True, loop: bool = True, tokens: tuple[str, ...] = ()) -> Expr:
    """TagDispatch's language: free text in which the first occurrence of a key (of `after`) is
    followed by that key's expression (a key mapped to None cannot occur), then free text again
    (`loop`) or the end of it; free text
    ends at the end of the output (`stop_at_end`) and/or after its first stop string (`stops`).
    Free text never holds an excluded string; it may hold the special tokens `tokens` (as in
    `text_until`). ValueError when keys lie inside one another (which
    one would fire is not settled yet) or when no text can end."""
    keys = tuple(after)
    for a in keys:
        for b in keys + stops:
            if (a != b and a in b) or (b in stops and b in a):
                raise ValueError(f"the strings {a!r} and {b!r} lie inside one another, which is not supported yet")
    segments = []
    for key, then in after.items():
        if then is None:
            continue
        head = text_until((key,), excludes + tuple(k for k in keys if k != key) + stops, tokens)
        if head is not None:
            segments.append(Seq((head, then)))
    ends = []
    if stop_at_end:
        ends.append(text_until((), excludes + keys + stops, tokens))
    if stops:
        ends.append(text_until(stops, excludes + keys, tokens))
    ends = [e for e in ends if e is not None]
    if not ends:
        raise ValueError("no text can end without an excluded string")
    tail = ends[0] if len(ends) == 1 else Choice(tuple(ends))
    if not segments:
        return tail
    segment = segments[0] if len(segments) == 1 else Choice(tuple(segments))
    return Seq((Repeat(segment, 0, None), tail)) if loop else Choice((tail, segment))


def _aho_corasick(patterns: list[str]) -> tuple[list[dict[str, int]], list[int], list[int]]:
    goto: list[dict[str, int]] = [{}]
    depth = [0]
    for p in patterns:
        s = 0
        for ch in p:
            if ch not in goto[s]:
                goto.append({})
                depth.append(depth[s] + 1)
                goto[s][ch] = len(goto) - 1
            s = goto[s][ch]
    fail = [0] * len(goto)
    queue = list(goto[0].values())
    i = 0
    while i < len(queue):
        s = queue[i]
        i += 1
        for ch, t in goto[s].items():
            queue.append(t)
            f = fail[s]
            while f and ch not in goto[f]:
                f = fail[f]
            fail[t] = goto[f][ch] if ch in goto[f] and goto[f][ch] != t else 0
    return goto, fail, depth


def _step(goto: list[dict[str, int]], fail: list[int], s: int, ch: str) -> int:
    while s and ch not in goto[s]:
        s = fail[s]
    return goto[s].get(ch, 0)


def _chars(chars: list[str]) -> Expr:
    """One of the characters; surrogates (special tokens) as literals, since no class matches one."""
    plain = [c for c in chars if not 0xD800 <= ord(c) <= 0xDFFF]
    alts: list[Expr] = [Literal(c) for c in chars if 0xD800 <= ord(c) <= 0xDFFF]
    if len(plain) == 1:
        alts.insert(0, Literal(plain[0]))
    elif plain:
        alts.insert(0, CharClass(tuple((ord(c), ord(c)) for c in plain)))
    return alts[0] if len(alts) == 1 else Choice(tuple(alts))


def _add(edges: dict[int, dict[int, Expr]], p: int, q: int, e: Expr) -> None:
    old = edges[p].get(q)
    if old is None:
        edges[p][q] = e
    else:
        edges[p][q] = Choice((*(old.alts if isinstance(old, Choice) else (old,)), e))
