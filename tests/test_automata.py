"""The C rule-automaton builder (xg2._ext.automata via fsm.determinize) against the Python pipeline
it replaced (fsm.determinize_reference), rule body by rule body over a corpus of real grammars.

The two need not give the same automaton: the C builder fully minimises, the reference does not
always. So the checks are the properties downstream code relies on: the same language (a product
walk over byte intervals and rule symbols), never more nodes, true minimality, a canonical numbering
(any renumbering of the result rebuilds to the identical object), and the same size limits.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED

import xg2
from xg2.grammar import fsm as F
from xg2.grammar.ir import CharClass, Choice, Literal, Repeat, RuleRef, Seq
from xg2.grammar.optimize import inline_small_rules
from xg2.grammar.repetition import compress_repetitions

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = SHARED / "data" / "jsonschemabench"
RECORDS_PER_SUBSET = 10
#: Bounds on the schema corpus that keep this file near 30 s: very large schemas take the front-end
#: seconds each, and one subset (Github_ultra) would otherwise contribute most bodies.
MAX_SCHEMA_CHARS = 60_000
MAX_BODIES_PER_SUBSET = 400


# ---------------------------------------------------------------------------------------------
# Oracles


def _live(fsm: F.RuleFSM) -> set[int]:
    """Nodes from which a final node is reachable: edges into other nodes do not change the language."""
    return F.reaching(fsm, fsm.finals)


def _target(edges, byte):
    for lo, hi, v in edges:
        if lo <= byte <= hi:
            return v
    return None


def same_language(x: F.RuleFSM, y: F.RuleFSM) -> bool:
    """Product walk of two deterministic automata; bytes are compared interval by interval over the
    union of both automata's range boundaries, rule calls symbol by symbol."""
    lx, ly = _live(x), _live(y)
    if (0 in lx) != (0 in ly):
        return False
    if 0 not in lx:
        return True
    seen = {(0, 0)}
    work = [(0, 0)]
    while work:
        p, q = work.pop()
        if (p in x.finals) != (q in y.finals):
            return False
        bx = [e for e in x.byte_edges[p] if e[2] in lx]
        by = [e for e in y.byte_edges[q] if e[2] in ly]
        starts = sorted({e[0] for e in bx + by} | {e[1] + 1 for e in bx + by} - {256})
        pairs = []
        for byte in starts:
            tx, ty = _target(bx, byte), _target(by, byte)
            if (tx is None) != (ty is None):
                return False
            if tx is not None:
                pairs.append((tx, ty))
        rx = {r: v for r, v in x.rule_edges[p] if v in lx}
        ry = {r: v for r, v in y.rule_edges[q] if v in ly}
        if rx.keys() != ry.keys():
            return False
        pairs += [(rx[r], ry[r]) for r in rx]
        for pair in pairs:
            if pair not in seen:
                seen.add(pair)
                work.append(pair)
    return True


def is_deterministic(fsm: F.RuleFSM) -> bool:
    for u in range(fsm.n_nodes):
        ranges = fsm.byte_edges[u]
        if any(a[1] >= b[0] for a, b in itertools.pairwise(ranges)):
            return False
        if any(lo > hi or lo < 0 or hi > 255 for lo, hi, _v in ranges):
            return False
        rules = [r for r, _v in fsm.rule_edges[u]]
        if len(set(rules)) != len(rules):
            return False
    return True


def moore_classes(fsm: F.RuleFSM) -> int:
    """Number of Myhill-Nerode classes by plain Moore refinement (test-sized automata only)."""
    cls = [int(u in fsm.finals) for u in range(fsm.n_nodes)]
    n_cls = len(set(cls))
    while True:
        sigs: dict[tuple, int] = {}
        new = []
        for u in range(fsm.n_nodes):
            bes: list[tuple[int, int, int]] = []
            for lo, hi, v in fsm.byte_edges[u]:
                if bes and bes[-1][1] + 1 == lo and bes[-1][2] == cls[v]:
                    bes[-1] = (bes[-1][0], hi, cls[v])
                else:
                    bes.append((lo, hi, cls[v]))
            sig = (cls[u], tuple(bes), tuple((r, cls[v]) for r, v in fsm.rule_edges[u]))
            new.append(sigs.setdefault(sig, len(sigs)))
        cls = new
        if len(sigs) == n_cls:
            return n_cls
        n_cls = len(sigs)


def nfa_of(fsm: F.RuleFSM, rng: random.Random) -> tuple[F.NFA, int, int]:
    """The automaton as an NFA with nodes renumbered and edges inserted in a shuffled order."""
    n = fsm.n_nodes
    perm = list(range(n + 1))
    rng.shuffle(perm)
    end = perm[n]
    edges = [(u, 0, lo, hi, v) for u in range(n) for lo, hi, v in fsm.byte_edges[u]]
    edges += [(u, 1, r, 0, v) for u in range(n) for r, v in fsm.rule_edges[u]]
    edges += [(u, 2, 0, 0, n) for u in fsm.finals]
    rng.shuffle(edges)
    nfa = F.NFA()
    for _ in range(n + 1):
        nfa.node()
    for u, kind, a, b, v in edges:
        nfa.add(perm[u], kind, a, b, perm[v])
    return nfa, perm[0], end


def _attempt(build, *args):
    try:
        return build(*args)
    except xg2.GrammarLimitError as exc:
        return exc


def build_both(body):
    """(C build from the body, Python reference); the C build from a Python-built NFA must agree
    with the all-C one exactly."""
    refs = F._refs(body)
    index = {name: i for i, name in enumerate(refs)}
    fast = _attempt(F.build_dfa, body, index)
    nfa = _attempt(F.build_nfa, body, index)
    if isinstance(nfa, Exception):
        assert isinstance(fast, Exception) and str(fast) == str(nfa), body
        return fast, nfa
    via_nfa = _attempt(F.determinize, *nfa)
    assert type(fast) is type(via_nfa) and (fast == via_nfa if isinstance(fast, F.RuleFSM)
                                            else str(fast) == str(via_nfa)), body
    return fast, _attempt(F.determinize_reference, *nfa)


def check_body(body, rng: random.Random) -> None:
    fast, ref = build_both(body)
    if isinstance(ref, Exception) or isinstance(fast, Exception):
        assert type(fast) is type(ref) and str(fast) == str(ref), (body, fast, ref)
        return
    if not ref.deterministic:
        assert fast == ref, body
        return
    assert fast.deterministic and is_deterministic(fast), body
    assert fast.n_nodes <= ref.n_nodes, (body, fast.n_nodes, ref.n_nodes)
    assert same_language(fast, ref), body
    # The flag the builder's automata carry (productive_rules and prune trust it) is the walk's.
    if fast.trimmed is not None:
        assert fast.trimmed == (len(_live(fast)) == fast.n_nodes), body
    # Minimal: every node can still reach a final node and no two nodes are equivalent.
    if fast.finals:
        assert len(_live(fast)) == fast.n_nodes, body
    else:
        assert fast == F.RuleFSM([[]], [[]], set()), body
    if fast.n_nodes <= 400:
        assert moore_classes(fast) == fast.n_nodes, body
    if fast.n_nodes == ref.n_nodes:
        assert fast == ref, body  # both minimal, so both canonical forms must coincide
    # Canonical: any renumbering rebuilds to the identical automaton.
    assert F.determinize(*nfa_of(fast, rng)) == fast, body
    assert F.canonical(fast, 0) == fast, body


# ---------------------------------------------------------------------------------------------
# Corpus


def _bodies(ir, as_written: bool = True) -> list:
    """Rule bodies as the compiler lowers them (repetitions compressed, small rules inlined) and,
    if `as_written`, as the front-end wrote them."""
    irs = [ir] if as_written else []
    try:
        irs.append(inline_small_rules(compress_repetitions(ir)))
    except xg2.XG2Error:
        pass
    out = []
    for g in irs:
        for rule in g.rules:
            out.append(rule.body)
            if rule.lookahead is not None:
                out.append(rule.lookahead)
    return out


def _unique(bodies) -> list:
    seen, out = set(), []
    for b in bodies:
        try:
            if b in seen:
                continue
            seen.add(b)
        except RecursionError:  # pathologically deep: just check it
            pass
        out.append(b)
    return out


def ebnf_bodies() -> list:
    from test_masks import GRAMMARS

    texts = [p.read_text(encoding="utf-8") for p in sorted((ROOT / "benchmarks" / "grammars").glob("*.ebnf"))]
    texts += [t for t in GRAMMARS.values() if t is not None]
    irs = [xg2.Grammar.from_ebnf(t).ir for t in texts] + [xg2.Grammar.builtin_json_grammar().ir]
    return _unique(b for ir in irs for b in _bodies(ir))


def schema_bodies() -> list:
    if not SCHEMAS.is_dir():
        pytest.skip(f"{SCHEMAS} not found: JSONSchemaBench lives in ../shared beside the checkout")
    from xg2.grammar.json_schema import json_schema_to_ir

    bodies: list = []
    for path in sorted(SCHEMAS.glob("*.jsonl")):
        subset: list = []
        with path.open(encoding="utf-8") as f:
            for _, line in zip(range(RECORDS_PER_SUBSET), f):
                if len(line) > MAX_SCHEMA_CHARS:
                    continue
                try:
                    ir = json_schema_to_ir(json.loads(line)["schema"], strict_mode=False)
                except xg2.XG2Error:
                    continue
                # As lowered only: schema strings with maxLength are unrolled as written (tens of
                # thousands of states, past MAX_DFA_STATES), which the compiler never builds.
                subset += _bodies(ir, as_written=False)
        bodies += _unique(subset)[:MAX_BODIES_PER_SUBSET]
    return _unique(bodies)


def random_body(rng: random.Random, depth: int = 0):
    """Small random IR over a tiny alphabet (so languages overlap and states merge), with calls,
    multi-byte classes, empty classes and every repetition shape."""
    k = rng.randrange(8 if depth < 4 else 3)
    if k == 0:
        return Literal(rng.choice(["", "a", "b", "ab", "ba", "aab", "é", "中"]))
    if k == 1:
        pool = [(97, 98), (97, 97), (98, 99), (0xE9, 0xE9), (0x4E00, 0x4E2D), (0x1F600, 0x1F64F), (0x80, 0x7FF)]
        ranges = tuple(sorted(rng.sample(pool, rng.randint(0, 2))))
        return CharClass(ranges, negated=rng.random() < 0.15)
    if k == 2:
        return RuleRef(rng.choice("xyz"))
    if k in (3, 4):
        return Seq(tuple(random_body(rng, depth + 1) for _ in range(rng.randint(0, 3))))
    if k in (5, 6):
        return Choice(tuple(random_body(rng, depth + 1) for _ in range(rng.randint(1, 3))))
    lo = rng.randint(0, 2)
    hi = rng.choice([None, lo, lo + 1, lo + 3])
    return Repeat(random_body(rng, depth + 1), lo, hi)


# ---------------------------------------------------------------------------------------------
# Tests


def test_ebnf_corpus_matches_reference():
    rng = random.Random(1)
    bodies = ebnf_bodies()
    assert len(bodies) > 100
    for body in bodies:
        check_body(body, rng)


def test_json_schema_corpus_matches_reference():
    rng = random.Random(2)
    bodies = schema_bodies()
    assert len(bodies) > 100
    for body in bodies:
        check_body(body, rng)


def test_random_bodies_match_reference():
    rng = random.Random(3)
    for _ in range(600):
        check_body(random_body(rng), rng)


def test_equal_languages_give_identical_automata():
    """Differently written, equal languages: the whole point of the canonical numbering."""
    a, b, x = Literal("a"), Literal("b"), RuleRef("x")
    pairs = [
        (Repeat(a, 1, None), Seq((a, Repeat(a, 0, None)))),
        (Repeat(Choice((a, b)), 0, None), Repeat(Seq((Repeat(a, 0, None), Repeat(b, 0, None))), 0, None)),
        (Choice((Seq((a, x)), Seq((b, x)))), Seq((CharClass(((97, 98),)), x))),
        (Repeat(Seq((x, a)), 2, 2), Seq((x, a, x, a))),
        (Repeat(Repeat(a, 0, 2), 0, 3), Repeat(a, 0, 6)),
        (CharClass(((0x100, 0x7FF), (0x80, 0xFF))), CharClass(((0x80, 0x7FF),))),
    ]
    for p, q in pairs:
        fp, fq = build_both(p)[0], build_both(q)[0]
        assert fp == fq, (p, q)


def test_empty_language():
    for body in (CharClass(()), Seq((Literal("a"), CharClass(()))), Choice((CharClass(()), Seq((RuleRef("x"), CharClass(())))))):
        assert build_both(body)[0] == F.RuleFSM([[]], [[]], set())


def test_closure_budget_raises_like_the_reference(monkeypatch):
    # (a trailing "d": a bare repetition of a prefix code is chained without a subset construction)
    body = xg2.Grammar.from_ebnf('root ::= (("a" | "bb"){1,8} "c"){1,8} "d"').ir.rules[0].body
    sizes = []
    for limit in (50, 500, 5_000, 50_000, 500_000):
        monkeypatch.setattr(F, "MAX_CLOSURE_WORK", limit)
        fast, ref = build_both(body)
        assert type(fast) is type(ref), limit
        sizes.append(isinstance(fast, Exception))
        if isinstance(fast, Exception):
            assert str(fast) == str(ref)
            assert "too large to build" in str(fast)
    assert sizes[0] and not sizes[-1]


def test_huge_repetition_raises_quickly():
    ab = Choice((Literal("a"), Literal("bb")))
    nested = Repeat(Repeat(Repeat(ab, 1, 16), 1, 16), 1, 16)
    for body, message in [(nested, "too large to build"),
                          (Repeat(Repeat(Literal("a"), 0, 300), 0, 300), "too large to build"),
                          (Repeat(Repeat(nested, 1, 16), 1, 16), "exceeds 400000 nodes"),
                          (Repeat(Literal("a"), 0, 10**9), "exceeds 400000 nodes")]:
        with pytest.raises(xg2.GrammarLimitError, match=message):
            F.build_dfa(body, {})
        with pytest.raises(xg2.GrammarLimitError, match=message):
            F.determinize(*F.build_nfa(body, {}))


def test_state_limit_falls_back_like_the_reference(monkeypatch):
    body = xg2.Grammar.from_ebnf('root ::= [ab]* "a" [ab]{6} x\nx ::= "x"').ir.rules[0].body
    monkeypatch.setattr(F, "MAX_DFA_STATES", 30)
    fast, ref = build_both(body)
    assert not fast.deterministic and fast == ref
    monkeypatch.setattr(F, "MAX_DFA_STATES", 300)
    fast, ref = build_both(body)
    assert fast.deterministic and same_language(fast, ref)


def test_state_limit_at_its_real_value():
    """2^17 subset states: the real limit trips and the epsilon-free NFA comes back."""
    body = xg2.Grammar.from_ebnf('root ::= [ab]* "a" [ab]{16}').ir.rules[0].body
    fsm = F.build_dfa(body, {})
    assert not fsm.deterministic
    assert fsm == F._epsilon_free(*F.build_nfa(body, {}), F._Budget())
    assert fsm == F.determinize(*F.build_nfa(body, {}))


def test_rule_automaton_uses_the_fast_path():
    F.clear_automata_memo()
    body = Seq((Repeat(Literal("ab"), 1, None), RuleRef("q"), Literal("ab")))
    got = F.rule_automaton(body, {"p": 0, "q": 7})
    want = F.build_dfa(body, {"q": 0})
    assert got.byte_edges == want.byte_edges and got.finals == want.finals
    assert tuple(tuple((7 if r == 0 else r, v) for r, v in es) for es in want.rule_edges) == got.rule_edges


def test_errors_and_threads_leave_the_builder_usable():
    """The C builder is reused between calls; a failed build or builds in other threads (the build
    runs Python code, so threads interleave) must not disturb the next result."""
    from concurrent.futures import ThreadPoolExecutor

    bodies = ebnf_bodies()
    index = {name: i for i, name in enumerate(sorted({n for b in bodies for n in F._refs(b)}))}
    want = [F.build_dfa(b, index) for b in bodies]
    with pytest.raises(KeyError):
        F.build_dfa(Seq((Literal("a"), RuleRef("no such rule"))), {})
    assert [F.build_dfa(b, index) for b in bodies] == want
    with ThreadPoolExecutor(4) as pool:
        for got in pool.map(lambda _: [F.build_dfa(b, index) for b in bodies], range(8)):
            assert got == want


def _deep_size(obj, seen) -> int:
    import sys

    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, (tuple, list, set, frozenset)):
        size += sum(_deep_size(x, seen) for x in obj)
    return size


def test_the_automaton_size_estimate_is_near_what_python_holds():
    """Cache budgets count automata by fsm_nbytes: it must not undercount what they really hold."""
    from xg2.grammar import fsm

    fsm.clear_automata_memo()
    xg2.Grammar.from_json_schema({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40}, "when": {"type": "string", "format": "date-time"},
        "n": {"type": "integer", "minimum": -5, "maximum": 12345}, "tags": {"type": "array", "items": {"enum": ["a", "b"]}}}})
    lowered = xg2.compiler.lower(xg2.Grammar.from_json_schema({"type": "string", "format": "email"}).ir)
    automata = [entry[0] for entry in fsm._AUTOMATA.values()] + list(lowered.fsms)
    real = sum(_deep_size((f.byte_edges, f.rule_edges, f.finals), set()) for f in automata)
    estimate = sum(fsm.fsm_nbytes(f) for f in automata)
    assert 0.9 * real <= estimate <= 2.0 * real


def test_the_automata_memo_is_bounded_by_bytes(monkeypatch):
    from xg2.grammar import fsm

    fsm.clear_automata_memo()
    monkeypatch.setattr(fsm, "MAX_MEMO_AUTOMATA_BYTES", 200_000)
    for k in range(40):
        xg2.compiler.lower(xg2.Grammar.from_json_schema(
            {"type": "object", "properties": {f"k{k}_{i}": {"type": "string", "maxLength": k + i} for i in range(6)}}).ir)
    assert 0 < fsm.automata_memo_bytes() <= 200_000
    assert fsm.automata_memo_bytes() == sum(size for _f, size in fsm._AUTOMATA.values())
    fsm.clear_automata_memo()
    assert fsm.automata_memo_bytes() == 0


@pytest.mark.parametrize("bounds", [(0, 2), (0, 7), (3, 3), (8, 8), (0, 128), (5, 40), (1, 2), (2, 9)])
def test_repeat_chain_is_the_general_builders_automaton(bounds):
    """A repetition of a prefix code is chained copy to copy (automata.repeat_chain): the very
    automaton, numbering and flat tables of the subset construction and minimisation."""
    json_char = xg2.Grammar.from_json_schema({"type": "string", "maxLength": 3}).ir
    char = next(x for r in json_char.rules for x in _nodes(r.body) if type(x) is Repeat).expr
    elems = [char, Literal("ab"), Choice((Literal("a"), Literal("bc"))), CharClass(((0x80, 0x10FFFF),)),
             Seq((Literal("x"), CharClass(((48, 57),))))]
    for elem in elems:
        body = Repeat(elem, *bounds)
        chain = F._repeat_chain(body)
        assert chain is not None, body
        res = F.rule_dfa(body, {}, F._class_sequences, F.MAX_NFA_NODES, F.MAX_DFA_STATES, F.MAX_CLOSURE_WORK)
        general = F._from_minimal(res)
        assert (chain.byte_edges, chain.rule_edges, chain.finals) == (general.byte_edges, general.rule_edges,
                                                                      general.finals), body
        assert all(np.array_equal(a, b) for a, b in zip(chain.flat[:6], general.flat[:6])), body
        assert chain.flat[6:] == general.flat[6:], body


def test_repeat_chain_refuses_what_is_not_a_prefix_code():
    for body in [Repeat(Choice((Literal("a"), Literal("ab"))), 0, 5),     # "a" is a prefix of "ab"
                 Repeat(Repeat(Literal("a"), 0, 2), 0, 5),                # the element may be empty
                 Repeat(Seq((Literal("a"), RuleRef("x"))), 0, 5)]:         # it calls a rule
        assert F._repeat_chain(body) is None, body
    assert F._repeat_chain(Repeat(Literal("a"), 0, 10**9)) is None         # past MAX_DFA_STATES


def _nodes(e):
    stack = [e]
    while stack:
        x = stack.pop()
        yield x
        t = type(x)
        stack.extend(x.items if t is Seq else x.alts if t is Choice else (x.expr,) if t is Repeat else ())


def _future(fsm, key, u):
    """What the rule reads from node u on, written out under a breadth-first numbering from u: the
    reference the node digests are checked against."""
    num, order, out = {u: 0}, [u], []
    i = 0
    while i < len(order):
        x = order[i]
        i += 1
        calls = sorted((key[r], v) for r, v in fsm.rule_edges[x])
        for v in [v for *_, v in fsm.byte_edges[x]] + [v for _k, v in calls]:
            if v not in num:
                num[v] = len(order)
                order.append(v)
        out.append((x in fsm.finals, [(lo, hi, num[v]) for lo, hi, v in fsm.byte_edges[x]],
                    [(k, num[v]) for k, v in calls]))
    return repr(out)


def test_node_digests_name_exactly_what_follows():
    """Two nodes, of one automaton or of two, get one digest exactly when the rule reads the same
    from them on (calls named by callee key): equal digests are what lets call sites under
    different callers share a context."""
    from xg2.grammar.hashing import node_digests

    sources = ['root ::= "{" item ("," item)* "}"\nitem ::= [a-z]+ ":" ("x" | "y" item)',
               'root ::= ("ab" | "cb" | "a" other)* "."\nother ::= "z"',
               'root ::= "(" (root | [0-9]+) ")" [a-c]{0,5}',
               'root ::= "q" ("x" | "y" root) "}" | "(" [0-9]+ ")" [a-c]{0,3}']
    by_digest, by_future, nodes = {}, {}, 0
    for source in sources:
        ir = xg2.Grammar.from_ebnf(source).ir
        index = {r.name: i for i, r in enumerate(ir.rules)}
        key = [bytes([i]) * 16 for i in range(len(ir.rules))]
        for rule in ir.rules:
            fsm = F.rule_automaton(rule.body, index)
            for u, d in enumerate(node_digests(fsm, key)):
                nodes += 1
                future = _future(fsm, key, u)
                assert by_digest.setdefault(d, future) == future, (source, rule.name, u)
                assert by_future.setdefault(future, d) == d, (source, rule.name, u)
    assert len(by_future) < nodes - 5     # the sources share some futures (the ")" tails, "}" ...)


def test_ir_nodes_hash_once_and_pickle_without_it():
    """Composite nodes keep their hash; a pickle must not carry it (string hashes differ between
    processes, and IR crosses processes with a compiled grammar's source)."""
    import pickle

    e = Choice((Seq((Literal("a"), CharClass(((48, 57),)))), Repeat(Literal("b"), 0, 3)))
    same = Choice((Seq((Literal("a"), CharClass(((48, 57),)))), Repeat(Literal("b"), 0, 3)))
    assert hash(e) == hash(same) and e == same and "_hash" in e.__dict__
    back = pickle.loads(pickle.dumps(e))
    assert "_hash" not in back.__dict__ and back == e and hash(back) == hash(e)
    assert len({e, same, Choice((Literal("a"),))}) == 2


def _tree_text(e):
    """_body_key's writing of `e` as a plain tree walk: the reference for the DAG writing."""
    out, calls, stack = [], [], [e]
    while stack:
        x = stack.pop()
        t = type(x)
        if t is Seq:
            out.append(f"S{len(x.items)}")
            stack.extend(reversed(x.items))
        elif t is Choice:
            out.append(f"A{len(x.alts)}")
            stack.extend(reversed(x.alts))
        elif t is Repeat:
            out.append(f"R{x.min},{x.max}")
            stack.append(x.expr)
        elif t is Literal:
            out.append(f"L{len(x.text)}:{x.text}")
        elif t is CharClass:
            out.append(f"C{x.ranges!r}{x.negated:d}")
        elif t is RuleRef:
            out.append("F")
            calls.append(x.name)
        else:
            out.append(F._text_key(x))
    return "\x00".join(out), tuple(calls)


def test_the_dag_writing_is_the_tree_writing():
    """A body past MAX_TREE_STEPS is written walking each shared node once (_written_dag); the key
    must be the very text of the tree walk, shared nodes, remembered texts and all."""
    rng = random.Random(11)
    for _ in range(300):
        b = random_body(rng)
        shared = Seq((b, Choice((b, Literal("z"), Seq((b, RuleRef("r"))))), Repeat(b, 0, 2)))
        assert F._written_dag(shared) == _tree_text(shared), b
        if type(b) in (Seq, Choice, Repeat):
            F._body_key(b)      # b now remembers its text: the DAG writing must use it as it is
            assert F._written_dag(shared) == _tree_text(shared), b
    ir = xg2.Grammar.from_json_schema({"type": "object", "properties": {f"key_{i}": {"type": "string"} for i in range(60)}},
                                      strict_mode=False).ir
    for rule in ir.rules:
        assert F._written_dag(rule.body) == _tree_text(rule.body), rule.name
