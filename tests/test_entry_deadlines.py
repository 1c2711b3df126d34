"""A hostile grammar stalls nobody: one node's mask entry can cost minutes (its Earley sets
explode), so the C core stops an entry build at the compile's deadline, and a fill at its own
budget, failing only the matchers that needed it."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

import xg2
from xg2.grammar import budget

#: Found by fuzzing (issue 34): three rules, `{0,1000}` over a doubled self-reference; building the
#: first mask's entry takes far longer than any compile deadline.
HOSTILE = r'''root ::= (((("é"){5,40}){2})* | (((root | r1 | ""))*)+)
r1 ::= ((r2 (root | "" | [a-z]) | (("a" | "ab") | "a" "\n" [^]) | "é")){1,}
r2 ::= (("a" "é" "" root){0,3} | r1 ((r2){2}){0,1000} | r1 ([a-z]){2})
'''

#: The same rules behind a first byte no multi-byte token starts with: the first mask is cheap, the
#: entries after it explode.
HOSTILE_LATER = r'''root ::= "\x01" h
h ::= (((("é"){5,40}){2})* | (((h | r1 | ""))*)+)
r1 ::= ((r2 (h | "" | [a-z]) | (("a" | "ab") | "a" "\n" [^]) | "é")){1,}
r2 ::= (("a" "é" "" h){0,3} | r1 ((r2){2}){0,1000} | r1 ([a-z]){2})
'''


@pytest.fixture(scope="module")
def hostile_info():
    """Bytes, and tokens that run deep into the hostile rules (the walk then meets the explosion)."""
    vocab = [bytes([b]) for b in range(256)]
    vocab += [w.encode() for w in ["aé", "aéa", "aéaé", "ab", "aab", "éé", "ééé", "éééé", "aa", "aaaa", "ab\n",
                                   "a\nb", "éa", "ba", "aéaéaéaé"]]
    vocab += [b"</s>"]
    return xg2.TokenizerInfo(vocab, xg2.VocabType.RAW, stop_token_ids=[len(vocab) - 1])


def test_an_exploding_first_mask_raises_the_typed_deadline_error_in_time(hostile_info):
    for background in (True, False):
        c = xg2.GrammarCompiler(hostile_info, compile_timeout_ms=1500, background_precompute=background)
        t0 = time.perf_counter()
        with pytest.raises(xg2.GrammarLimitError, match="compile budget of 1500 ms") as info:
            c.compile_grammar(HOSTILE)
        took = time.perf_counter() - t0
        assert isinstance(info.value, budget.CompileTimeout)
        assert took < 1.5 + 1.5, took      # stopped inside the entry build, not after it
        assert c.cache_stats()["grammars"] == 0
        assert not budget.expired()
        # The compiler is usable afterwards (its builder's lock was given back).
        ok = c.compile_grammar('root ::= "a" [0-9]+')
        m = xg2.GrammarMatcher(ok)
        assert m.accept_string("a12")


def _hostile_later(info, **options):
    c = xg2.GrammarCompiler(info, background_precompute=False, precompute_budget_ms=0.0, **options)
    g = c.compile_grammar(HOSTILE_LATER)
    m = xg2.GrammarMatcher(g)
    assert m.accept_token(1)        # b"\x01"
    return c, m


def test_a_fill_over_exploding_entries_fails_alone_within_its_budget(hostile_info):
    c, bad = _hostile_later(hostile_info, fill_timeout_ms=300)
    good = xg2.GrammarMatcher(c.compile_grammar('root ::= "a" [0-9]+'))
    bm = xg2.allocate_token_bitmask(2, hostile_info.vocab_size)
    t0 = time.perf_counter()
    with pytest.raises(xg2.FillTimeoutError) as info:
        bad.fill_next_token_bitmask(bm, 0)
    assert time.perf_counter() - t0 < 3.0      # 0.3 s of CPU; unbounded, minutes
    assert info.value.rows == [0]
    # In a batch, the other row is written and only the hostile position is reported.
    bm[:] = -1
    with pytest.raises(xg2.FillTimeoutError) as info:
        xg2.BatchGrammarMatcher().batch_fill_next_token_bitmask([good, bad], bm)
    assert info.value.rows == [1]
    assert not bm[1].any()                     # the failed row is all zeros, never all-allowed
    bits = np.unpackbits(bm[0].numpy().view(np.uint8), bitorder="little")[:hostile_info.vocab_size]
    assert bits[ord("a")] and not bits[ord("b")]
    # Failing the same way later (nothing half-built was kept), and as quickly.
    t0 = time.perf_counter()
    with pytest.raises(xg2.FillTimeoutError):
        bad.fill_next_token_bitmask(bm, 0)
    assert time.perf_counter() - t0 < 3.0
    # The good matcher goes on.
    assert good.accept_string("a1")


def test_fill_timeout_is_checked_and_can_be_lifted(hostile_info):
    assert xg2.GrammarCompiler(hostile_info).fill_timeout_ms == 500.0
    for bad in (0, -1, float("nan")):
        with pytest.raises(xg2.UsageError):
            xg2.GrammarCompiler(hostile_info, fill_timeout_ms=bad)
    c = xg2.GrammarCompiler(hostile_info, fill_timeout_ms=None)
    m = xg2.GrammarMatcher(c.compile_grammar('root ::= "a" [0-9]+'))
    m.fill_next_token_bitmask(xg2.allocate_token_bitmask(1, hostile_info.vocab_size))


def test_a_costly_session_fails_alone_in_the_runtime(hostile_info):
    """GrammarRuntime.fill says which sessions failed, by their position in its argument (None
    entries included), and writes every other row."""
    import asyncio

    from xg2.actors import GrammarRuntime
    from xg2.actors.spec import EBNFSpec, RegexSpec, SessionSpec

    compiler = xg2.GrammarCompiler(hostile_info, fill_timeout_ms=300, precompute_budget_ms=0.0)
    rt = GrammarRuntime(hostile_info, compiler=compiler)

    async def run():
        good = await rt.open(SessionSpec(RegexSpec("a[0-9]+"), tenant="a"))
        bad = await rt.open(SessionSpec(EBNFSpec(HOSTILE_LATER), tenant="b"))
        assert rt.accept([bad], [1]) == [True]
        bm = xg2.allocate_token_bitmask(3, hostile_info.vocab_size)
        with pytest.raises(xg2.FillTimeoutError) as info:
            rt.fill([None, bad, good], bm)
        assert info.value.rows == [1]
        assert bm[2].any() and not bm[1].any()
        with pytest.raises(xg2.FillTimeoutError) as info:
            await rt.submit_fill([good, None, bad], bm)
        assert info.value.rows == [2]
        rt.fill([good], bm)         # the runtime goes on
        rt.close(good)
        rt.close(bad)

    try:
        asyncio.run(run())
    finally:
        rt.shutdown()


def test_builds_past_the_deadline_leave_the_core_usable_from_other_threads(hostile_info):
    c, _ = _hostile_later(hostile_info, fill_timeout_ms=200)
    compiled = c.compile_grammar(HOSTILE_LATER)
    outcome = []

    def fill():
        m = xg2.GrammarMatcher(compiled)
        m.accept_token(1)
        try:
            m.fill_next_token_bitmask(xg2.allocate_token_bitmask(1, hostile_info.vocab_size))
            outcome.append("filled")
        except xg2.FillTimeoutError:
            outcome.append("timeout")

    threads = [threading.Thread(target=fill) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert outcome == ["timeout", "timeout"]


def test_an_accept_whose_closures_explode_stops_at_the_fill_budget():
    """Accepting bytes into the hostile rules costs more with every byte (0.4 s, 0.9 s, 2 s... on
    this machine without a budget): past the fill budget the accept raises FillTimeoutError and the
    matcher is as it was before the call."""
    vocab = [bytes([b]) for b in range(256)] + [b"</s>"]
    info = xg2.TokenizerInfo(vocab, xg2.VocabType.RAW, stop_token_ids=[256])
    c = xg2.GrammarCompiler(info, background_precompute=False, precompute_budget_ms=0.0, fill_timeout_ms=200)
    m = xg2.GrammarMatcher(c.compile_grammar(HOSTILE_LATER))
    assert m.accept_token(1)
    stopped = None
    for i, ch in enumerate("aéaéaéaéababaéaéaéé" * 2):
        t0 = time.perf_counter()
        try:
            assert m.accept_string(ch)
        except xg2.FillTimeoutError:
            stopped = i
        assert time.perf_counter() - t0 < 3.0      # 0.2 s of CPU; unbounded, seconds and growing
        if stopped is not None:
            break
    assert stopped is not None and stopped > 0
    # The state is the one before the failed accept: a byte the grammar refuses there is refused,
    # and the accepted prefix rolls back token by token as before.
    assert not m.accept_string("\x02")
    m.rollback(stopped)
    assert m.accept_string("a")


def test_a_mask_host_ends_only_the_session_whose_mask_is_too_costly():
    """The mask service's host: in one step of two sessions, the hostile one comes back ended and
    failed (closed, an all-zero row), the other with its mask; the host goes on."""
    from xg2.actors.host import MatcherHost
    from xg2.errors import SessionError

    vocab = [bytes([b]) for b in range(256)] + [b"</s>"]
    info = xg2.TokenizerInfo(vocab, xg2.VocabType.RAW, stop_token_ids=[256])
    compiler = xg2.GrammarCompiler(info, fill_timeout_ms=200, precompute_budget_ms=0.0)
    host = MatcherHost(info, compiler=compiler)

    async def run():
        good = (await host.open("t", {"grammar": {"type": "regex", "pattern": "a[0-9]+"}}))["session"]
        bad = (await host.open("t", {"grammar": {"type": "ebnf", "grammar": HOSTILE_LATER}}))["session"]
        out = await host.step("t", [good, bad], [ord("a"), 1])
        assert out["accepted"] == [True, True] and out["ended"] == [False, True] and out["failed"] == [False, True]
        assert out["masks"][0].any() and not out["masks"][1].any()
        with pytest.raises(SessionError):
            await host.step("t", [bad], [None])          # closed with its failure
        out = await host.step("t", [good], [ord("1")])
        assert out["accepted"] == [True] and out["failed"] == [False]

    try:
        asyncio.run(run())
    finally:
        host.runtime.shutdown()
