"""Lowering of IR rule bodies to byte-level finite automata.

Each rule becomes one automaton whose edges read a byte range or call another rule. Code points are
lowered to UTF-8 byte sequences here, so the core only ever sees bytes. Construction goes through an
epsilon-NFA (Thompson style), then a subset construction that treats every rule reference as one more
input symbol, then minimisation and a canonical breadth-first numbering. Canonical numbering is what
lets equal rule structures in different grammars map node to node (XGrammar 2, Alg. 1).

All of it runs in C (`xg2._ext.automata`, through `build_dfa`), because a large schema has hundreds
of rules and the Python version cost milliseconds per rule. `build_nfa` here is the Python twin of
the C Thompson construction, needed by the rare fallback past MAX_DFA_STATES; the Python pipeline
(`determinize_reference`, `minimize`) stays as the oracle the tests compare against.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from .._ext.automata import minimal_dfa, reach_back, repeat_chain, rule_dfa
from ..errors import GrammarLimitError
from . import budget as deadline
from .alternation import MIN_TRIE_LITERALS, factor_literals
from .ir import (
    MAX_TREE_STEPS,
    CharClass,
    Choice,
    Expr,
    FreeText,
    Literal,
    Repeat,
    RuleRef,
    Seq,
    TokenSlot,
    any_node,
    text_bytes,
    token_slot_bytes,
)
from .text import text_graph

#: Upper bound on automaton nodes built for one rule (before minimisation).
MAX_NFA_NODES = 400_000
#: Subset construction gives up (keeps the epsilon-free NFA) past this many states.
MAX_DFA_STATES = 20_000
#: Work budget (NFA nodes visited in epsilon closures) for building one rule's automaton; past it the
#: grammar is rejected with GrammarLimitError instead of compiling for minutes.
MAX_CLOSURE_WORK = 4_000_000
#: Edges (byte and rule) an epsilon-free fallback automaton may have. Past MAX_DFA_STATES the NFA is
#: kept without epsilon edges, and every later pass (pruning, content keys, tables, the core) is
#: linear in its size: found by fuzzing, rules of 300k nodes and 600k edges took 5-27 s to compile
#: past this point, where any legitimate grammar measured here stays under a few thousand.
MAX_FALLBACK_EDGES = 150_000

_TOO_LARGE = "a rule's automaton is too large to build (nested or very large repetition bounds)"


class _Budget:
    def __init__(self, left: int | None = None) -> None:
        self.left = MAX_CLOSURE_WORK if left is None else left
        self.calls = 0

    def spend(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise GrammarLimitError(_TOO_LARGE)
        self.calls += 1 + n // 64       # the deadline is read as often per unit of work as per call
        if self.calls >= 256:
            self.calls = 0
            deadline.check("automaton construction")

_UTF8_BOUNDS = ((0, 0x7F, 1), (0x80, 0x7FF, 2), (0x800, 0xFFFF, 3), (0x10000, 0x10FFFF, 4))


def _utf8_sequences(lo: int, hi: int) -> list[list[tuple[int, int]]]:
    """Byte-range sequences whose concatenations are exactly the UTF-8 encodings of [lo, hi]."""
    out: list[list[tuple[int, int]]] = []
    # Surrogates are not code points of well-formed UTF-8.
    if lo <= 0xDFFF and hi >= 0xD800:
        if lo < 0xD800:
            out += _utf8_sequences(lo, 0xD7FF)
        if hi > 0xDFFF:
            out += _utf8_sequences(0xE000, hi)
        return out
    for blo, bhi, n in _UTF8_BOUNDS:
        a, b = max(lo, blo), min(hi, bhi)
        if a <= b:
            _split_same_length(a, b, n, out)
    return out


@functools.lru_cache(maxsize=4096)
def _class_sequences(cc: CharClass) -> tuple[tuple[tuple[int, int], ...], ...]:
    """UTF-8 byte-range sequences of a character class (cached: classes repeat under {m,n})."""
    return tuple(tuple(seq) for lo, hi in cc.codepoint_ranges() for seq in _utf8_sequences(lo, hi))


def _split_same_length(lo: int, hi: int, n: int, out: list) -> None:
    """Split [lo, hi] (all encoded in n bytes) into ranges whose byte sequences are rectangular."""
    stack = [(lo, hi)]
    while stack:
        a, b = stack.pop()
        if n == 1:
            out.append([(a, b)])
            continue
        for i in range(1, n):
            m = (1 << (6 * i)) - 1
            if (a & ~m) != (b & ~m):
                if (a & m) != 0:
                    stack.append(((a | m) + 1, b))
                    stack.append((a, a | m))
                    break
                if (b & m) != m:
                    stack.append(((b & ~m), b))
                    stack.append((a, (b & ~m) - 1))
                    break
        else:
            ea, eb = chr(a).encode("utf-8"), chr(b).encode("utf-8")
            out.append([(ea[k], eb[k]) for k in range(n)])


class NFA:
    """Epsilon-NFA under construction, kept as one flat list of ints, five per edge: source, kind,
    a, b, target (kind 0 byte range [a,b], 1 call of rule a, 2 epsilon). The flat form is what the C
    builder reads without per-node Python lists; `edges` regroups it for the Python paths."""

    __slots__ = ("_edges", "flat", "n_nodes")

    def __init__(self) -> None:
        self.flat: list[int] = []
        self.n_nodes = 0
        self._edges: list[list[tuple[int, int, int, int]]] | None = None

    def node(self) -> int:
        if self.n_nodes >= MAX_NFA_NODES:
            raise GrammarLimitError(f"rule automaton exceeds {MAX_NFA_NODES} nodes")
        self.n_nodes += 1
        self._edges = None
        return self.n_nodes - 1

    def add(self, u: int, kind: int, a: int, b: int, v: int) -> None:
        self.flat += (u, kind, a, b, v)
        self._edges = None

    @property
    def edges(self) -> list[list[tuple[int, int, int, int]]]:
        """Per node, its edges (kind, a, b, target) in insertion order (built once, then cached)."""
        if self._edges is None:
            edges: list[list[tuple[int, int, int, int]]] = [[] for _ in range(self.n_nodes)]
            f = self.flat
            for i in range(0, len(f), 5):
                edges[f[i]].append((f[i + 1], f[i + 2], f[i + 3], f[i + 4]))
            self._edges = edges
        return self._edges


def build_nfa(body: Expr, rule_index: dict[str, int]) -> tuple[NFA, int, int]:
    """Thompson construction with an explicit work stack (no recursion on deep expressions)."""
    nfa = NFA()
    start, end = nfa.node(), nfa.node()
    stack: list[tuple[Expr, int, int]] = [(body, start, end)]
    while stack:
        e, s, t = stack.pop()
        if isinstance(e, (Literal, TokenSlot)):
            data = text_bytes(e.text) if type(e) is Literal else token_slot_bytes(e.index)
            cur = s
            for i, byte in enumerate(data):
                nxt = t if i == len(data) - 1 else nfa.node()
                nfa.add(cur, 0, byte, byte, nxt)
                cur = nxt
            if not data:
                nfa.add(s, 2, 0, 0, t)
        elif isinstance(e, CharClass):
            for seq in _class_sequences(e):
                cur = s
                for i, (a, b) in enumerate(seq):
                    nxt = t if i == len(seq) - 1 else nfa.node()
                    nfa.add(cur, 0, a, b, nxt)
                    cur = nxt
        elif isinstance(e, Seq):
            if not e.items:
                nfa.add(s, 2, 0, 0, t)
                continue
            cur = s
            for i, item in enumerate(e.items):
                nxt = t if i == len(e.items) - 1 else nfa.node()
                stack.append((item, cur, nxt))
                cur = nxt
        elif isinstance(e, Choice):
            for alt in e.alts:
                stack.append((alt, s, t))
        elif isinstance(e, Repeat):
            cur = s
            for _ in range(e.min):
                nxt = nfa.node()
                stack.append((e.expr, cur, nxt))
                cur = nxt
            if e.max is None:
                loop = nfa.node()
                nfa.add(cur, 2, 0, 0, loop)
                back = nfa.node()
                stack.append((e.expr, loop, back))
                nfa.add(back, 2, 0, 0, loop)
                nfa.add(loop, 2, 0, 0, t)
            else:
                # Each optional copy may exit straight to the end.
                for _ in range(e.max - e.min):
                    nfa.add(cur, 2, 0, 0, t)
                    nxt = nfa.node()
                    stack.append((e.expr, cur, nxt))
                    cur = nxt
                nfa.add(cur, 2, 0, 0, t)
        elif isinstance(e, RuleRef):
            nfa.add(s, 1, rule_index[e.name], 0, t)
        elif isinstance(e, FreeText):
            graph = text_graph(e)
            if graph is None:       # the empty language: no way from s to t
                continue
            n_states, first, last, edges = graph
            nodes = [nfa.node() for _ in range(n_states)]   # fresh: loops back to the start stay inside
            nfa.add(s, 2, 0, 0, nodes[first])
            nfa.add(nodes[last], 2, 0, 0, t)
            for p, q, label in edges:
                stack.append((label, nodes[p], nodes[q]))
        else:  # pragma: no cover - the IR is closed
            raise TypeError(f"unknown IR node {e!r}")
    return nfa, start, end


class FlatEdges:
    """An automaton's byte edges held as its flat tables (edges per node, lo, hi, target), written
    out as the tuples of `RuleFSM.byte_edges` the first time something reads them. The chains of
    `automata.repeat_chain` come this way: an unrolled string bound is thousands of edges that the
    compile path itself reads through the flat tables only."""

    __slots__ = ("_flat", "_n", "_tuples")

    def __init__(self, counts, lo, hi, target) -> None:
        self._flat = (counts, lo, hi, target)
        self._n = len(counts)
        self._tuples: tuple | None = None

    def written(self) -> bool:
        return self._tuples is not None

    def tuples(self) -> tuple[tuple[tuple[int, int, int], ...], ...]:
        if self._tuples is None:
            import numpy as np

            counts, lo, hi, target = self._flat
            edges = list(zip(lo.tolist(), hi.tolist(), target.tolist()))
            ends = np.cumsum(counts).tolist()
            self._tuples = tuple(tuple(edges[a:b]) for a, b in zip([0, *ends[:-1]], ends))
        return self._tuples

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, u):
        return self.tuples()[u]

    def __iter__(self):
        return iter(self.tuples())

    def __eq__(self, other) -> bool:
        return self.tuples() == (other.tuples() if isinstance(other, FlatEdges) else other)

    __hash__ = None     # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self.tuples())

    def __reduce__(self):
        return (tuple, (self.tuples(),))     # pickled as the tuples it stands for


@dataclass(slots=True)
class RuleFSM:
    """A rule's automaton with nodes numbered canonically from 0 (the start node).

    byte_edges[n]: sorted (lo, hi, target); rule_edges[n]: sorted (rule, target); finals: set of nodes.
    `deterministic` is False when the subset construction was abandoned for size.

    The edges are kept as tuples of tuples whatever they were given as: automata are memoised
    for the life of the process, and lists stay tracked by the cyclic garbage collector (hundreds
    of thousands of them after a few hundred schemas made each full collection cost ~0.3 s),
    while tuples of numbers drop out of its sight.
    """

    byte_edges: tuple[tuple[tuple[int, int, int], ...], ...]
    rule_edges: tuple[tuple[tuple[int, int], ...], ...]
    finals: set[int]
    deterministic: bool = True
    # Memos, not part of the automaton's value (equality and repr ignore them):
    pure: tuple[bool, ...] | None = field(default=None, compare=False, repr=False)   # pure_nodes()
    trimmed: bool | None = field(default=None, compare=False, repr=False)      # trimmed()
    flat: tuple | None = field(default=None, compare=False, repr=False)        # byte_tables()
    # Content keys (hashing.py) depend on the automaton and its callees' keys only: a memoised
    # automaton and its renumbered copies share `keys_memo`, looked up by the callees' keys in
    # `callees` order (the rules this copy calls, by index, in the memoised automaton's order).
    callees: list[int] | None = field(default=None, compare=False, repr=False)
    keys_memo: dict | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if type(self.byte_edges) is not tuple and type(self.byte_edges) is not FlatEdges:
            self.byte_edges = tuple(map(tuple, self.byte_edges))
        if type(self.rule_edges) is not tuple:
            self.rule_edges = tuple(map(tuple, self.rule_edges))

    @property
    def n_nodes(self) -> int:
        return len(self.byte_edges)

    def accepts(self, data: bytes) -> bool:
        """Whether a call-free automaton reads exactly `data` (front-ends use it to decide
        membership of names and values in the languages they build)."""
        node = 0
        for byte in data:
            for lo, hi, target in self.byte_edges[node]:
                if lo <= byte <= hi:
                    node = target
                    break
            else:
                return False
        return node in self.finals


def _eps_closure(nfa: NFA, seeds) -> frozenset[int]:
    edges = nfa.edges
    seen = set(seeds)
    work = list(seeds)
    while work:
        u = work.pop()
        for kind, _a, _b, v in edges[u]:
            if kind == 2 and v not in seen:
                seen.add(v)
                work.append(v)
    return frozenset(seen)


def _split_ranges(ranges: list[tuple[int, int, object]]) -> list[tuple[int, int, frozenset]]:
    """Disjoint byte intervals with the set of targets reached on each."""
    points = sorted({r[0] for r in ranges} | {r[1] + 1 for r in ranges})
    out: list[tuple[int, int, frozenset]] = []
    for i in range(len(points) - 1):
        lo, hi = points[i], points[i + 1] - 1
        tgt = frozenset(v for a, b, v in ranges if a <= lo and hi <= b)
        if not tgt:
            continue
        if out and out[-1][1] + 1 == lo and out[-1][2] == tgt:
            out[-1] = (out[-1][0], hi, tgt)
        else:
            out.append((lo, hi, tgt))
    return out


def rule_automaton(body: Expr, rule_index: dict[str, int]) -> RuleFSM:
    """The minimal automaton of a rule body, memoised by content across grammars.

    Front-ends emit the same bodies again and again (JSON strings, numbers, whitespace, the same
    property member in many schemas), and building an automaton in Python costs far more than
    looking it up. The memo is keyed by the body with calls numbered locally (not by name); the
    result is renumbered to this grammar's rule indices. Memoised automata are shared,
    so nothing downstream may mutate a RuleFSM in place.
    """
    if type(body) is Choice and len(body.alts) >= MIN_TRIE_LITERALS:
        alts = factor_literals(list(body.alts))     # thousands of keywords: built as a trie
        if len(alts) < len(body.alts):
            body = alts[0] if len(alts) == 1 else Choice(tuple(alts))
    key, refs = _body_key(body)
    fsm = _memo_automaton(body, key, refs)
    if not refs:
        return fsm
    remap = [rule_index[n] for n in refs]
    if fsm.keys_memo is None:
        fsm.keys_memo = {}
    return RuleFSM(fsm.byte_edges, tuple(tuple(sorted([(remap[r], v) for r, v in edges])) if edges else ()
                                         for edges in fsm.rule_edges),
                   fsm.finals, fsm.deterministic, pure_nodes(fsm), trimmed(fsm), byte_tables(fsm),
                   remap, fsm.keys_memo)


def _purity(fsm: RuleFSM, counts=None, target=None):
    """Per node, the core's purity bits: 1 when no call is reachable from it, 2 when it makes no
    call itself (both only in deterministic automata)."""
    import numpy as np

    out = np.array(pure_nodes(fsm, counts, target), np.uint8)
    if fsm.deterministic:
        out |= np.array([0 if e else 2 for e in fsm.rule_edges], np.uint8)
    return out


def byte_tables(fsm: RuleFSM) -> tuple:
    """(edges per node, lo, hi, target, final per node, pure per node, nodes with calls, a digest of
    the finals and byte edges), memoised: everything of the automaton that does not name other
    rules, ready to be copied into a grammar's flat tables (memoised automata come back in every
    grammar that has their body)."""
    if fsm.flat is None:
        import numpy as np

        edges = [e for node in fsm.byte_edges for e in node]
        arr = np.array(edges, dtype=np.int64).reshape(-1, 3)
        _set_tables(fsm, np.fromiter(map(len, fsm.byte_edges), np.int32, fsm.n_nodes), arr[:, 0].astype(np.uint8),
                    arr[:, 1].astype(np.uint8), arr[:, 2].astype(np.int32))
    return fsm.flat


def _set_tables(fsm: RuleFSM, counts, lo, hi, target) -> None:
    import numpy as np

    final = np.zeros(fsm.n_nodes, np.uint8)
    final[list(fsm.finals)] = 1
    h = hashlib.blake2b(digest_size=16)
    for part in (bytes([fsm.deterministic]), final, counts.astype("<i4"), lo, hi, target.astype("<i4")):
        h.update(part)
    fsm.flat = (counts, lo, hi, target, final, _purity(fsm, counts, target),
                tuple(u for u, e in enumerate(fsm.rule_edges) if e), h.digest())


def trimmed(fsm: RuleFSM) -> bool:
    """Whether a final node is reachable from every node when every call can complete."""
    if fsm.trimmed is None:
        if fsm.flat is not None:    # the flat tables: the walk in C
            calls = [(u, v) for u, edges in enumerate(fsm.rule_edges) for _r, v in edges]
            fsm.trimmed = all(reach_back(fsm.flat[0], fsm.flat[3], calls, fsm.finals))
        else:
            fsm.trimmed = len(reaching(fsm, fsm.finals)) == fsm.n_nodes
    return fsm.trimmed


def pure_nodes(fsm: RuleFSM, counts=None, target=None) -> tuple[bool, ...]:
    """Per node: the rule is a plain deterministic automaton from here on (no call is reachable).
    `counts`, `target`: the automaton's flat byte edges, when known (the walk is then in C)."""
    if fsm.pure is None:
        if not fsm.deterministic:
            fsm.pure = (False,) * fsm.n_nodes
        else:
            calls = [u for u in range(fsm.n_nodes) if fsm.rule_edges[u]]
            if not calls:
                fsm.pure = (True,) * fsm.n_nodes
            elif counts is not None:
                fsm.pure = tuple(not f for f in reach_back(counts, target, [], calls))
            else:
                impure = reaching(fsm, calls, [[] for _ in range(fsm.n_nodes)])
                fsm.pure = tuple(u not in impure for u in range(fsm.n_nodes))
    return fsm.pure


def fsm_nbytes(fsm: RuleFSM) -> int:
    """What an automaton holds as Python objects, estimated from its size: a node's tuple of edges
    and an edge's tuple of small ints cost about 70 and 100 bytes (measured with a deep getsizeof
    over the automata of a few hundred tool-calling grammars: within 15% of this)."""
    be = fsm.byte_edges
    if type(be) is FlatEdges and not be.written():     # arrays: about 10 bytes an edge, 16 a node
        return 400 + 10 * len(fsm.flat[1]) + 16 * fsm.n_nodes + 60 * len(fsm.finals)
    edges = sum(map(len, be)) + sum(map(len, fsm.rule_edges))
    return 400 + 70 * 2 * len(be) + 100 * edges + 60 * len(fsm.finals)


#: Memoised rule automata, most recently used last, keyed by `_body_key` and the names called,
#: with their estimated bytes; bounded by count and by bytes (the memo lives as long as the
#: process, so a stream of tenants' new schemas must not grow it past a fixed size).
_AUTOMATA: OrderedDict[tuple[bytes, tuple[int, ...]], tuple[RuleFSM, int]] = OrderedDict()
_AUTOMATA_LOCK = threading.Lock()
MAX_MEMO_AUTOMATA = 8192
MAX_MEMO_AUTOMATA_BYTES = 64 << 20
_automata_bytes = 0


def _memo_automaton(body: Expr, key: tuple[bytes, tuple[int, ...]], refs: tuple[str, ...]) -> RuleFSM:
    global _automata_bytes
    with _AUTOMATA_LOCK:
        hit = _AUTOMATA.get(key)
        if hit is not None:
            _AUTOMATA.move_to_end(key)
            return hit[0]
    fsm = build_dfa(body, {n: i for i, n in enumerate(refs)}, _has_text(key[0]))
    size = fsm_nbytes(fsm)
    with _AUTOMATA_LOCK:
        old = _AUTOMATA.pop(key, None)
        if old is not None:
            _automata_bytes -= old[1]
        _AUTOMATA[key] = (fsm, size)
        _automata_bytes += size
        while len(_AUTOMATA) > 1 and (len(_AUTOMATA) > MAX_MEMO_AUTOMATA
                                      or _automata_bytes > MAX_MEMO_AUTOMATA_BYTES):
            _automata_bytes -= _AUTOMATA.popitem(last=False)[1][1]
    return fsm


def automata_memo_bytes() -> int:
    """Estimated bytes of the process's memoised automata (see fsm_nbytes)."""
    return _automata_bytes


def clear_automata_memo() -> None:
    global _automata_bytes
    with _AUTOMATA_LOCK:
        _AUTOMATA.clear()
        _automata_bytes = 0


def _body_key(e: Expr) -> tuple[tuple[bytes, tuple[int, ...]], tuple[str, ...]]:
    """A body written out in prefix form with counts and lengths (so it reads back one way only),
    calls written without their names, with the local number (in `refs`) of each call in order
    beside it; and the names it calls, sorted, which the local numbers index.

    The key leaves names out so that bodies equal up to the names they call share one automaton
    (a chain of thousands of rules `r_i ::= "a" r_j | "b"` builds it once). The memo keeps these
    bytes rather than the bodies: a body is a tree of IR objects, each one tracked by the cyclic
    garbage collector, and thousands of memoised bodies made every full collection slower.
    Writing it out also costs less than the recursive hash of the dataclasses. A composite body
    remembers what it was written as (IR is immutable, and front-ends share sub-expressions
    between rules and schemas): a walk that meets it again copies the text."""
    written = _write_tree(e, None, MAX_TREE_STEPS)
    if written is None:         # a DAG much larger as a tree: each node walked once
        written = _written_dag(e)
    text, calls = written
    if type(e) in _COMPOSITE and len(text) <= MAX_WRITTEN:
        e.__dict__["_written"] = written
    refs = tuple(sorted(set(calls)))
    local = {n: i for i, n in enumerate(refs)}
    return (text_bytes(text), tuple(local[n] for n in calls)), refs


def _class_text(x: CharClass) -> str:
    """A class as _body_key writes it, remembered by the class (front-ends share their classes,
    and the repr of the ranges was a fifth of the writing)."""
    text = f"C{x.ranges!r}{x.negated:d}"
    x.__dict__["_written"] = text
    return text


def _text_key(x: FreeText) -> str:
    """A FreeText as _body_key writes it: its strings' reprs (which hold no NUL, the separator);
    the strings are sorted and distinct in the node, so equal nodes write the same text."""
    return f"T{(x.ends, x.excludes, x.tokens)!r}"


def _has_text(key: bytes) -> bool:
    """Whether a body written as `key` may hold a FreeText, which only the Python Thompson
    construction lowers (a literal holding the same bytes only costs the slower path)."""
    return key.startswith(b"T(") or b"\x00T(" in key


def _written_dag(e: Expr) -> tuple[str, tuple[str, ...]]:
    """What _body_key writes for `e`, each sub-expression walked once: free text excluding strings
    is a DAG whose tree is hundreds of times larger. Nodes with more than one parent (and those
    that remember their text) are written once, children first, and each stretch between them as
    a tree. Writing every node from its children's texts instead copied each text once per level
    above it: 7 ms for the 4,000-node trie of an object's 91 excluded keys, 3.5 ms this way."""
    if type(e) not in _COMPOSITE:
        return _write_tree(e, None)
    parents: dict[int, int] = {}
    seen: set[int] = set()
    order: list[Expr] = []          # composite nodes, children first
    stack: list[tuple[Expr, bool]] = [(e, False)]
    while stack:
        x, done = stack.pop()
        if done:
            order.append(x)
            continue
        if id(x) in seen:
            continue
        seen.add(id(x))
        if x is not e and "_written" in x.__dict__:
            order.append(x)
            continue
        stack.append((x, True))
        for k in (x.items if type(x) is Seq else x.alts if type(x) is Choice else (x.expr,)):
            if type(k) in _COMPOSITE:
                parents[id(k)] = parents.get(id(k), 0) + 1
                if id(k) not in seen:
                    stack.append((k, False))
    memo: dict[int, tuple[str, tuple[str, ...]]] = {}
    for x in order:
        known = x.__dict__.get("_written") if x is not e else None
        if known is not None:
            memo[id(x)] = known
        elif x is e or parents[id(x)] > 1:
            memo[id(x)] = _write_tree(x, memo)
    return memo[id(e)]


_COMPOSITE = (Seq, Choice, Repeat)


def _write_tree(x: Expr, memo: dict[int, tuple[str, tuple[str, ...]]] | None,
                limit: int | None = None) -> tuple[str, tuple[str, ...]] | None:
    """_body_key's writing of `x` as a tree walk: the text, and the names it calls in order. A
    composite node below `x` that remembers its text (or is written in `memo`) is copied, not
    walked. None when the walk passes `limit` steps."""
    out: list[str] = []
    calls: list[str] = []
    stack = [x]
    steps = 0
    while stack:
        steps += 1
        if limit is not None and steps > limit:
            return None
        y = stack.pop()
        t = type(y)
        if t is Literal:
            out.append(f"L{len(y.text)}:{y.text}")
        elif t is CharClass:
            out.append(y.__dict__.get("_written") or _class_text(y))
        elif t is RuleRef:
            out.append("F")
            calls.append(y.name)
        elif t is FreeText:
            out.append(_text_key(y))
        elif t is TokenSlot:
            out.append(f"T{y.index}")
        else:
            known = memo.get(id(y)) if memo is not None and y is not x else None
            if known is None:
                known = y.__dict__.get("_written")
            if known is not None:
                out.append(known[0])
                calls.extend(known[1])
            elif t is Seq:
                out.append(f"S{len(y.items)}")
                stack.extend(reversed(y.items))
            elif t is Choice:
                out.append(f"A{len(y.alts)}")
                stack.extend(reversed(y.alts))
            else:
                out.append(f"R{y.min},{y.max}")
                stack.append(y.expr)
    return "\x00".join(out), tuple(calls)


#: Longest text a body keeps of itself (see `_body_key`).
MAX_WRITTEN = 1 << 16


def _refs(e: Expr) -> tuple[str, ...]:
    """The names a body calls, sorted."""
    return _body_key(e)[1]


def build_dfa(body: Expr, rule_index: dict[str, int], text: bool | None = None) -> RuleFSM:
    """`determinize(*build_nfa(body, rule_index))` with the NFA built in C as well.

    After the C subset construction and minimisation, the Python Thompson construction was the
    larger cost per rule (a Python object per edge). The NFA is still built in Python for the rare
    fallback past MAX_DFA_STATES, which needs it, and for bodies holding a FreeText (`text`: whether
    the body may hold one; None: look), which only the Python construction lowers.
    """
    if text is None:
        text = _holds_text(body)
    if text:
        return determinize(*build_nfa(body, rule_index))
    if type(body) is Repeat and body.max is not None and body.max >= 2:
        chain = _repeat_chain(body)
        if chain is not None:
            return chain
    res = rule_dfa(body, rule_index, _class_sequences, MAX_NFA_NODES, MAX_DFA_STATES, MAX_CLOSURE_WORK)
    if isinstance(res, tuple):
        return _from_minimal(res)
    if res == -3:
        raise GrammarLimitError(f"rule automaton exceeds {MAX_NFA_NODES} nodes")
    if res < 0:
        raise GrammarLimitError(_TOO_LARGE)
    nfa, start, end = build_nfa(body, rule_index)
    return _epsilon_free(nfa, start, end, _Budget(res))


def _repeat_chain(body: Repeat) -> RuleFSM | None:
    """`e{m,n}` as n copies of e's memoised automaton chained end to start (automata.repeat_chain),
    when e calls no rule and its strings form a prefix code (one final node, without edges); None
    otherwise. An unrolled string bound is thousands of nodes that the subset construction and the
    minimisation took milliseconds over, to arrive at this very chain."""
    key, refs = _body_key(body.expr)
    if refs or _has_text(key[0]):
        return None
    try:
        elem = _memo_automaton(body.expr, key, refs)
    except GrammarLimitError:
        return None     # the general build names the limit the whole body runs into
    if not elem.deterministic or len(elem.finals) != 1 or 0 in elem.finals:
        return None
    (final,) = elem.finals
    counts, lo, hi, target = byte_tables(elem)[:4]
    if counts[final] or elem.n_nodes < 2:
        return None
    res = repeat_chain(counts, lo, hi, target, final, body.min, body.max, MAX_DFA_STATES)
    return None if res is None else _from_minimal(res)


def _holds_text(body: Expr) -> bool:
    """Whether a FreeText occurs in `body`."""
    return any_node(body, lambda x: type(x) is FreeText)


def determinize(nfa: NFA, start: int, end: int) -> RuleFSM:
    """The minimal DFA of the NFA, canonically numbered, built in C.

    Same result shape and limits as `determinize_reference`: past MAX_DFA_STATES subset states the
    epsilon-free NFA is kept (deterministic=False), and the closure work budget raises
    GrammarLimitError. The DFA is fully minimal (never larger than the reference's) and equal
    languages give identical automata.
    """
    res = minimal_dfa(nfa.flat, nfa.n_nodes, start, end, MAX_DFA_STATES, MAX_CLOSURE_WORK)
    if isinstance(res, tuple):
        return _from_minimal(res)
    if res < 0:
        raise GrammarLimitError(_TOO_LARGE)
    return _epsilon_free(nfa, start, end, _Budget(res))


def _from_minimal(res: tuple) -> RuleFSM:
    """The RuleFSM of the C builder's result, its byte tables taken from the flat copy it made."""
    import numpy as np

    byte_edges, rule_edges, finals, flat = res
    counts, lo, hi, target = (np.frombuffer(flat[0], np.int32), np.frombuffer(flat[1], np.uint8),
                              np.frombuffer(flat[2], np.uint8), np.frombuffer(flat[3], np.int32))
    # Trimmed by construction: the builder drops every node from which no final node is reachable
    # (calls counted as symbols), and with a final node left the start is one of the living.
    fsm = RuleFSM(FlatEdges(counts, lo, hi, target) if byte_edges is None else byte_edges, rule_edges, finals,
                  trimmed=bool(finals))
    _set_tables(fsm, counts, lo, hi, target)
    return fsm


def determinize_reference(nfa: NFA, start: int, end: int) -> RuleFSM:
    """The Python pipeline `determinize` replaced: subset construction, SCC-based minimize, canonical
    numbering. Kept as the oracle of the differential tests (tests/test_automata.py)."""
    budget = _Budget()
    start_set = _eps_closure(nfa, [start])
    index = {start_set: 0}
    order = [start_set]
    byte_edges: list[list[tuple[int, int, int]]] = []
    rule_edges: list[list[tuple[int, int]]] = []
    finals: set[int] = set()
    i = 0
    while i < len(order):
        if len(order) > MAX_DFA_STATES:
            return _epsilon_free(nfa, start, end, budget)
        cur = order[i]
        budget.spend(len(cur))
        if end in cur:
            finals.add(i)
        ranges = []
        rules: dict[int, set[int]] = {}
        for u in cur:
            for kind, a, b, v in nfa.edges[u]:
                if kind == 0:
                    ranges.append((a, b, v))
                elif kind == 1:
                    rules.setdefault(a, set()).add(v)
        bes = []
        for lo, hi, tgt in _split_ranges(ranges):
            closure = _eps_closure(nfa, tgt)
            j = index.get(closure)
            if j is None:
                j = index[closure] = len(order)
                order.append(closure)
            bes.append((lo, hi, j))
        res = []
        for r in sorted(rules):
            closure = _eps_closure(nfa, rules[r])
            j = index.get(closure)
            if j is None:
                j = index[closure] = len(order)
                order.append(closure)
            res.append((r, j))
        byte_edges.append(bes)
        rule_edges.append(res)
        i += 1
    return minimize(RuleFSM(byte_edges, rule_edges, finals))


def _epsilon_free(nfa: NFA, start: int, end: int, budget: _Budget) -> RuleFSM:
    """Fallback for automata whose subset construction explodes: an NFA without epsilon edges."""
    n = len(nfa.edges)
    byte_edges: list[list[tuple[int, int, int]]] = []
    rule_edges: list[list[tuple[int, int]]] = []
    finals = set()
    edges = nfa.edges
    kept = 0
    for u in range(n):
        closure = _eps_closure(nfa, [u])
        budget.spend(len(closure) + sum(len(edges[w]) for w in closure))
        bes, res = set(), set()
        for w in closure:
            for kind, a, b, v in edges[w]:
                if kind == 0:
                    bes.add((a, b, v))
                elif kind == 1:
                    res.add((a, v))
        if end in closure:
            finals.add(u)
        byte_edges.append(sorted(bes))
        rule_edges.append(sorted(res))
        kept += len(bes) + len(res)
        if kept > MAX_FALLBACK_EDGES:
            raise GrammarLimitError(_TOO_LARGE)
    fsm = RuleFSM(byte_edges, rule_edges, finals, deterministic=False)
    return canonical(fsm, start)


def strongly_connected(n: int, succ: list[list[int]]) -> list[list[int]]:
    """Tarjan's algorithm without recursion; components come out successors-first."""
    index = [-1] * n
    low = [0] * n
    on = [False] * n
    stack: list[int] = []
    comps: list[list[int]] = []
    counter = 0
    for root in range(n):
        if index[root] >= 0:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on[v] = True
            if i < len(succ[v]):
                work.append((v, i + 1))
                w = succ[v][i]
                if index[w] < 0:
                    work.append((w, 0))
                elif on[w]:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on[w] = False
                    comp.append(w)
                    if w == v:
                        break
                comps.append(comp)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return comps


def _signature(fsm: RuleFSM, u: int, cls) -> tuple:
    """Finality plus edges with targets replaced by their classes (adjacent equal ranges merged)."""
    bes: list[tuple] = []
    for lo, hi, v in fsm.byte_edges[u]:
        c = cls(v)
        if bes and bes[-1][1] + 1 == lo and bes[-1][2] == c:
            bes[-1] = (bes[-1][0], hi, c)
        else:
            bes.append((lo, hi, c))
    return (u in fsm.finals, tuple(bes), tuple((r, cls(v)) for r, v in fsm.rule_edges[u]))


def _canonical_component(fsm: RuleFSM, rep: dict, local: dict, members: set, cls: list) -> tuple:
    best = None
    for start in sorted(rep):
        number = {start: 0}
        order = [start]
        parts = []
        i = 0
        while i < len(order):
            u = rep[order[i]]
            i += 1
            for v in [v for *_x, v in fsm.byte_edges[u]] + [v for _r, v in fsm.rule_edges[u]]:
                if v in members and local[v] not in number:
                    number[local[v]] = len(order)
                    order.append(local[v])
            parts.append(_signature(fsm, u, lambda v, number=number: ("in", number[local[v]]) if v in members
                                    else ("out", cls[v])))
        cand = ("cycle", tuple(parts))
        if best is None or cand < best[0]:
            best = (cand, order)
    return best


def minimize(fsm: RuleFSM) -> RuleFSM:
    """Merge equivalent states, one strongly connected component at a time, successors first.

    States outside cycles get their class in one pass from their successors' final classes (bounded
    repetitions unroll into long acyclic chains, where round-based refinement would need one round
    per state); inside a cyclic component, Moore refinement runs on that component alone. States of
    different cyclic components are never merged, which keeps the result correct if not always
    minimal.
    """
    n = fsm.n_nodes
    succ = [sorted({v for *_x, v in fsm.byte_edges[u]} | {v for _r, v in fsm.rule_edges[u]}) for u in range(n)]
    cls: list[int] = [-1] * n
    global_sigs: dict[tuple, int] = {}
    n_cls = 0
    for comp in strongly_connected(n, succ):
        members = set(comp)
        if len(comp) == 1 and comp[0] not in succ[comp[0]]:
            u = comp[0]
            sig = _signature(fsm, u, cls.__getitem__)
            if sig not in global_sigs:
                global_sigs[sig] = n_cls
                n_cls += 1
            cls[u] = global_sigs[sig]
            continue
        local = {u: int(u in fsm.finals) for u in comp}
        n_local = len(set(local.values()))
        while True:
            sigs: dict[tuple, int] = {}
            new_local = {}
            for u in comp:
                sig = _signature(fsm, u, lambda v, local=local, members=members: ("in", local[v]) if v in members
                                 else ("out", cls[v]))
                new_local[u] = sigs.setdefault(sig, len(sigs))
            local = new_local
            if len(sigs) == n_local:
                break
            n_local = len(sigs)
        # Equal cyclic components (the same loop inlined twice) share classes through a canonical
        # form: the smallest breadth-first serialisation over the choice of start group.
        rep = {}
        for u in comp:
            rep.setdefault(local[u], u)
        key, order = _canonical_component(fsm, rep, local, members, cls) if n_local <= 64 else (None, None)
        if key is not None and key in global_sigs:
            base = global_sigs[key]
            number = {g: i for i, g in enumerate(order)}
            for u in comp:
                cls[u] = base + number[local[u]]
            continue
        if key is not None:
            global_sigs[key] = n_cls
            number = {g: i for i, g in enumerate(order)}
            for u in comp:
                cls[u] = n_cls + number[local[u]]
        else:
            for u in comp:
                cls[u] = n_cls + local[u]
        n_cls += n_local
        # An acyclic state that behaves like a loop state (the first `x` of `x+`) joins its class.
        for u in rep.values():
            global_sigs.setdefault(_signature(fsm, u, cls.__getitem__), cls[u])
    # Build the quotient automaton.
    rep: dict[int, int] = {}
    for u in range(n):
        rep.setdefault(cls[u], u)
    byte_edges = [[] for _ in range(n_cls)]
    rule_edges = [[] for _ in range(n_cls)]
    finals = set()
    for c, u in rep.items():
        bes = byte_edges[c]
        for lo, hi, v in fsm.byte_edges[u]:
            t = cls[v]
            if bes and bes[-1][1] + 1 == lo and bes[-1][2] == t:
                bes[-1] = (bes[-1][0], hi, t)
            else:
                bes.append((lo, hi, t))
        rule_edges[c] = [(r, cls[v]) for r, v in fsm.rule_edges[u]]
        if u in fsm.finals:
            finals.add(c)
    return canonical(RuleFSM(byte_edges, rule_edges, finals), cls[0])


def canonical(fsm: RuleFSM, start: int) -> RuleFSM:
    """Renumber breadth-first from `start` following edges in sorted order; drop unreachable nodes."""
    order = [start]
    num = {start: 0}
    i = 0
    while i < len(order):
        u = order[i]
        i += 1
        if not i & 1023:        # an epsilon-free fallback can have many nodes of many edges
            deadline.check("automaton construction")
        for _lo, _hi, v in sorted(fsm.byte_edges[u]):
            if v not in num:
                num[v] = len(order)
                order.append(v)
        for _r, v in sorted(fsm.rule_edges[u]):
            if v not in num:
                num[v] = len(order)
                order.append(v)
    byte_edges, rule_edges = [], []
    for k, u in enumerate(order):
        if not (k + 1) & 1023:
            deadline.check("automaton construction")
        byte_edges.append(sorted((lo, hi, num[v]) for lo, hi, v in fsm.byte_edges[u]))
        rule_edges.append(sorted((r, num[v]) for r, v in fsm.rule_edges[u]))
    finals = {num[u] for u in fsm.finals if u in num}
    return RuleFSM(byte_edges, rule_edges, finals, fsm.deterministic)


def reaching(fsm: RuleFSM, targets, rule_edges=None) -> set[int]:
    """Nodes from which some node in `targets` is reachable (rule edges: `rule_edges` if given,
    else the automaton's own; pass empty lists to follow byte edges only)."""
    rule_edges = fsm.rule_edges if rule_edges is None else rule_edges
    pred: list[list[int]] = [[] for _ in range(fsm.n_nodes)]
    for u in range(fsm.n_nodes):
        if not (u + 1) & 1023:
            deadline.check("automaton construction")
        for _lo, _hi, v in fsm.byte_edges[u]:
            pred[v].append(u)
        for _r, v in rule_edges[u]:
            pred[v].append(u)
    out = set(targets)
    work = list(out)
    while work:
        v = work.pop()
        for u in pred[v]:
            if u not in out:
                out.add(u)
                work.append(u)
    return out


def prune(fsm: RuleFSM, live_rules: set[int]) -> RuleFSM:
    """Remove calls to rules that accept nothing and nodes from which no final node is reachable."""
    n = fsm.n_nodes
    if trimmed(fsm) and all(r in live_rules for edges in fsm.rule_edges for r, _v in edges):
        return fsm  # the common case, known without a walk for memoised automata
    rule_edges = []
    for u in range(n):
        if not (u + 1) & 1023:      # an epsilon-free fallback can have many nodes of many edges
            deadline.check("automaton construction")
        rule_edges.append([(r, v) for r, v in fsm.rule_edges[u] if r in live_rules])
    alive = reaching(fsm, fsm.finals, rule_edges)
    if len(alive) == n and all(len(a) == len(b) for a, b in zip(rule_edges, fsm.rule_edges)):
        return fsm
    if 0 not in alive:
        return RuleFSM([[]], [[]], set(), fsm.deterministic)
    byte_edges = []
    for u in range(n):
        if not (u + 1) & 1023:
            deadline.check("automaton construction")
        byte_edges.append([e for e in fsm.byte_edges[u] if e[2] in alive] if u in alive else [])
        rule_edges[u] = [e for e in rule_edges[u] if e[1] in alive] if u in alive else []
    return canonical(RuleFSM(byte_edges, rule_edges, fsm.finals & alive, fsm.deterministic), 0)


def nullable_rules(fsms: list[RuleFSM]) -> set[int]:
    """Rules that can complete without reading a byte (least fixpoint)."""
    nullable: set[int] = set()
    changed = True
    while changed:
        changed = False
        for r, fsm in enumerate(fsms):
            if r in nullable:
                continue
            seen = {0}
            work = [0]
            while work:
                u = work.pop()
                for rr, v in fsm.rule_edges[u]:
                    if rr in nullable and v not in seen:
                        seen.add(v)
                        work.append(v)
            if seen & fsm.finals:
                nullable.add(r)
                changed = True
    return nullable


def productive_rules(fsms: list[RuleFSM]) -> set[int]:
    """Rules whose language is non-empty (least fixpoint)."""
    # A trimmed automaton that calls nothing reaches a final node from its start: no walk needed
    # (the C builder's automata are trimmed, and most rules call nothing).
    live: set[int] = {r for r, f in enumerate(fsms) if f.trimmed and f.finals and not any(f.rule_edges)}
    changed = True
    while changed:
        changed = False
        for r, fsm in enumerate(fsms):
            if r in live:
                continue
            seen = {0}
            work = [0]
            finals = fsm.finals
            while work:
                u = work.pop()
                if u in finals:     # a final node is reachable: no need to see the rest
                    live.add(r)
                    changed = True
                    break
                for _lo, _hi, v in fsm.byte_edges[u]:
                    if v not in seen:
                        seen.add(v)
                        work.append(v)
                for rr, v in fsm.rule_edges[u]:
                    if rr in live and v not in seen:
                        seen.add(v)
                        work.append(v)
    return live
