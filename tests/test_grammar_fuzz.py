"""Seeded grammar fuzzing (benchmarks/fuzz_grammars.py) on a small vocabulary: no grammar hangs the
compiler or a walk, every error xg2 raises is typed, and the grammar fuzzing first found hanging the
compiler now fails with the typed deadline error in time. The full run (DeepSeek-V3's vocabulary,
default deadlines, 300 grammars) is in benchmarks/README.md, "Grammar fuzzing"."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

import xg2

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import fuzz_grammars as fz

#: Tighter deadlines than the defaults, so that the corpus runs in seconds.
OPTIONS = {"compile_timeout_ms": 1000, "fill_timeout_ms": 200}
STEPS = 20
MARGIN_S = 4.0
LIMIT_S = fz.case_limit_s(OPTIONS, STEPS, MARGIN_S)      # 1 + 20 x 2 x 0.2 + 4 = 13 s a case
SEED = 7
N = 40


def _vocab() -> tuple:
    """Every byte, a few tokens that run across the generator's literals, and a stop token."""
    vocab = [bytes([b]) for b in range(256)]
    vocab += [w.encode() for w in ["aé", "ab", "éé", "aaaa", "aéa", "éa", "ba", "a\n"]]
    vocab += [b"</s>"]
    return ("raw", vocab, [len(vocab) - 1])


@pytest.fixture(scope="module")
def fuzz_results():
    cases = fz.corpus(N, SEED)
    t0 = time.perf_counter()
    results = fz.run_corpus(cases, _vocab(), OPTIONS, seed=SEED, steps=STEPS, limit_s=LIMIT_S)
    return cases, results, time.perf_counter() - t0


def test_the_generator_is_seeded_bounded_and_covers_the_dialect():
    t0 = time.perf_counter()
    grammars = [fz.generate(fz.case_seed(3, i)) for i in range(300)]
    assert time.perf_counter() - t0 < 2.0
    assert grammars == [fz.generate(fz.case_seed(3, i)) for i in range(300)]
    assert len(set(grammars)) == len(grammars)
    assert fz.corpus(5, 3, known=False) == [(f"gen-3-{i}", grammars[i]) for i in range(5)]
    assert max(len(g) for g in grammars) < 4000
    text = "\n".join(grammars)
    for feature in ("[^]", "[^", '""', "é", "\\n", "\\x", "\\u", "*", "+", "?", " | ", "{1000}", ",1000}",
                    "r1", "r2", "r3", "((", "){"):
        assert feature in text, feature
    bounds = [int(b) for b in re.findall(r"\{(\d+)", text)]
    assert max(bounds) == 1000 and min(bounds) == 0
    # Recursion: a rule referring to itself, and two rules referring to each other.
    self_ref = mutual = 0
    for g in grammars:
        bodies = dict(line.split(" ::= ", 1) for line in g.splitlines() if " ::= " in line)
        refs = {name: set(re.findall(r"(?<![\w\"\\])(root|r[1-3])(?![\w\"])", body)) for name, body in bodies.items()}
        self_ref += any(name in r for name, r in refs.items())
        mutual += any(b in refs.get(a, ()) and a in refs.get(b, ()) for a in refs for b in refs if a < b)
    assert self_ref > 100 and mutual > 30, (self_ref, mutual)
    # The dialect is xg2's: the grammars parse, except the few the generator breaks on purpose.
    parsed = bad = 0
    for g in grammars:
        try:
            xg2.Grammar.from_ebnf(g)
            parsed += 1
        except xg2.GrammarError:
            bad += 1
    assert parsed >= 0.8 * len(grammars), (parsed, bad)


def test_no_grammar_hangs_and_every_error_is_typed(fuzz_results):
    cases, results, took = fuzz_results
    assert [r.name for r in results] == [name for name, _ in cases]
    bugs = [r for r in results if r.outcome in fz.BUGS]
    assert not bugs, "\n\n".join(fz.describe_bug(r) for r in bugs)
    for r in results:
        assert r.wall_s < LIMIT_S, r.name
        if r.outcome in (fz.COMPILE_ERROR, fz.WALK_ERROR, fz.FILL_TIMEOUT):
            assert r.typed, r.error_class
        if r.outcome == fz.COMPILE_ERROR:
            assert r.compile_s < 1.0 + 3.0, (r.name, r.compile_s)      # stopped near the deadline (a busy machine: +3 s)
    counts = fz.summarize(results, OPTIONS)["counts"]
    # The corpus exercises the engine, not only its parser: most grammars compile and are walked.
    assert counts.get(fz.OK, 0) >= N // 2, counts
    assert sum(r.steps for r in results) >= 200
    assert took < 60, took


def test_the_hostile_grammars_fail_with_typed_deadline_errors(fuzz_results):
    _, results, _ = fuzz_results
    by_name = {r.name: r for r in results}
    hostile = by_name["hostile"]
    if hostile.outcome == fz.COMPILE_ERROR:
        assert hostile.error_class == "xg2.grammar.budget.CompileTimeout", hostile.error
        assert "compile budget of 1000 ms" in hostile.error
        assert 0.9 < hostile.compile_s < 1.0 + 3.0
    else:       # compiled: then its walk was bounded like any other
        assert hostile.outcome in (fz.OK, fz.FILL_TIMEOUT), hostile.outcome
        assert hostile.wall_s < LIMIT_S
    later = by_name["hostile-later"]
    assert later.outcome in (fz.FILL_TIMEOUT, fz.OK), fz.describe_bug(later)
    if later.outcome == fz.FILL_TIMEOUT:
        assert later.error_class == "xg2.errors.FillTimeoutError"
        assert later.fill_max_s < 0.2 + 1.0


def test_the_watchdog_reports_a_hang_and_goes_on():
    """With no compile deadline the hostile grammar runs past the watchdog: the case is a hang, its
    worker's stacks are kept, and a new worker runs the next case."""
    cases = [("hostile", fz.HOSTILE), ("simple", 'root ::= "a" [0-9]+')]
    t0 = time.perf_counter()
    results = fz.run_corpus(cases, _vocab(), {"compile_timeout_ms": None, "fill_timeout_ms": 200}, steps=5,
                            limit_s=1.0)
    assert time.perf_counter() - t0 < 30
    hang, simple = results
    assert hang.outcome == fz.HANG, (hang.outcome, hang.compile_s)
    assert "compile_grammar" in hang.traceback, hang.traceback
    assert simple.outcome == fz.OK and simple.steps >= 2
    assert fz.summarize(results)["bugs"] == 1
