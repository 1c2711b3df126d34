"""GrammarRuntime (in process, no Ray): sessions from typed specs, single-flight compiles with a
deadline and a negative cache, per-tenant quotas, idle reaping, and batched decode steps that write
exactly what each session's own matcher writes."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import random
import threading
import time

import msgspec
import numpy as np
import pytest
import torch
from conftest import SAMPLE_EBNF, SAMPLE_REGEX, SAMPLE_TOOLS, SHARED, longest_match

import xg2
from xg2.actors import (
    EBNFSpec,
    GrammarRuntime,
    JSONSchemaSpec,
    RegexSpec,
    SessionOptions,
    SessionSpec,
    StructuralTagSpec,
    ToolsSpec,
    content_key,
)
from xg2.errors import QuotaError, SessionError, SpecError

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"enum": ["a", "bc"]}}},
          "required": ["name"]}
EBNF, REGEX, TOOLS = SAMPLE_EBNF, SAMPLE_REGEX, SAMPLE_TOOLS
TAG = {"type": "structural_tag", "format": {"type": "sequence", "elements": [
    {"type": "const_string", "value": "Answer: "},
    {"type": "json_schema", "json_schema": {"type": "object", "properties": {"ok": {"type": "boolean"}},
                                            "required": ["ok"]}}]}}
SPECS = [JSONSchemaSpec(SCHEMA), EBNFSpec(EBNF), RegexSpec(REGEX), ToolsSpec(TOOLS), StructuralTagSpec(TAG)]


def _guarded(fn, timeout: float):
    """fn() on a daemon thread: its value, or its exception re-raised here; an AssertionError if it
    has not returned within `timeout` seconds (a deadlock fails its test instead of the run)."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised on the test's thread
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise AssertionError(f"no answer within {timeout:g} s: the runtime is wedged (deadlock)")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def run(coro, timeout: float = 15.0):
    return _guarded(lambda: asyncio.run(coro), timeout)


@pytest.fixture
def make_runtime():
    made: list[GrammarRuntime] = []

    def make(info, **kwargs) -> GrammarRuntime:
        rt = GrammarRuntime(info, **kwargs)
        made.append(rt)
        return rt

    yield make
    for rt in made:
        try:
            _guarded(rt.shutdown, 2.0)
        except AssertionError:
            pass        # a runtime the test found wedged (its own failure says so) cannot shut down


def _width(info) -> int:
    return (info.vocab_size + 31) // 32


def _allowed(session, info) -> list[int]:
    """The ordinary tokens the session's own matcher allows next (stop tokens left out)."""
    bitmask = np.zeros((1, _width(info)), np.int32)
    session.matcher.fill_next_token_bitmask(bitmask)
    bits = np.unpackbits(bitmask[0].view(np.uint8), bitorder="little")[: info.vocab_size]
    return [t for t in np.flatnonzero(bits).tolist() if t not in info.stop_token_ids]


def _matcher_mask(matcher, info) -> np.ndarray:
    bitmask = np.zeros((1, _width(info)), np.int32)
    matcher.fill_next_token_bitmask(bitmask)
    return bitmask[0].copy()


def _mask(session, info) -> np.ndarray:
    return _matcher_mask(session.matcher, info)


def _walk(rt, session, info, steps: int, rng: random.Random) -> None:
    for _ in range(steps):
        allowed = _allowed(session, info)
        if not allowed:
            return
        assert rt.accept([session], [rng.choice(allowed)]) == [True]


async def _open_walked(rt, info, n: int, seed: int, specs=SPECS) -> list:
    """n sessions over mixed grammars, each walked a different number of random allowed tokens."""
    rng = random.Random(seed)
    sessions = []
    for k in range(n):
        s = await rt.open(SessionSpec(specs[k % len(specs)], tenant=f"t{k % 3}"))
        _walk(rt, s, info, rng.randrange(14), rng)
        sessions.append(s)
    return sessions


def _expected_rows(sessions, info, n_rows: int, indices=None, sentinel: int = 7) -> np.ndarray:
    expected = np.full((n_rows, _width(info)), sentinel, np.int32)
    for k, s in enumerate(sessions):
        if s is not None:
            s.matcher.fill_next_token_bitmask(expected, k if indices is None else indices[k])
    return expected


class CountingCompiler(xg2.GrammarCompiler):
    """A compiler that counts its compiles and can take its time over them."""

    def __init__(self, *args, delay: float = 0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.delay = delay
        self.calls = 0

    def _slow(self):
        self.calls += 1
        time.sleep(self.delay)

    def compile_regex(self, regex):
        self._slow()
        return super().compile_regex(regex)

    def compile_grammar(self, grammar, **kwargs):
        self._slow()
        return super().compile_grammar(grammar, **kwargs)

    def compile_json_schema(self, schema, **kwargs):
        self._slow()
        return super().compile_json_schema(schema, **kwargs)

    def compile_structural_tag(self, structural_tag):
        self._slow()
        return super().compile_structural_tag(structural_tag)


# -- opening -----------------------------------------------------------------------------------------

def test_open_from_every_spec_form_shares_one_compile(json_info, make_runtime):
    rt = make_runtime(json_info)
    grammar = RegexSpec(REGEX)
    forms = [
        SessionSpec(grammar),
        grammar,
        {"grammar": {"type": "regex", "pattern": REGEX}, "tenant": "dict"},
        json.dumps({"grammar": {"type": "regex", "pattern": REGEX}, "tenant": "text"}),
        json.dumps({"grammar": {"type": "regex", "pattern": REGEX}}).encode(),
    ]

    async def main():
        return [await rt.open(f) for f in forms]

    sessions = run(main())
    assert [s.tenant for s in sessions] == ["default", "default", "dict", "text", "default"]
    assert len({id(s.compiled_grammar) for s in sessions}) == 1
    assert all(s.key == content_key(grammar) for s in sessions)
    assert rt.stats["compiles"] == 1 and rt.stats["grammar_hits"] == 4
    assert len({s.id for s in sessions}) == len(sessions)
    assert all(rt.session(s.id) is s for s in sessions)
    assert rt.open_sessions() == 5 and rt.open_sessions("dict") == 1 and rt.open_sessions("default") == 3
    tokens = longest_match({bytes(t): i for i, t in enumerate(json_info.decoded_vocab[:-1])}, b"ab@cd.org")
    assert rt.accept(sessions, [tokens[0]] * 5) == [True] * 5


def test_every_spec_kind_opens_and_masks_like_a_direct_compile(json_info, make_runtime):
    rt = make_runtime(json_info)
    compiler = xg2.GrammarCompiler(json_info)
    direct = [compiler.compile_json_schema(SCHEMA), compiler.compile_grammar(EBNF), compiler.compile_regex(REGEX),
              compiler.compile_structural_tag(xg2.get_model_structural_tag("qwen_3", TOOLS, "auto",
                                                                           reasoning="disabled")),
              compiler.compile_structural_tag(TAG)]

    async def main():
        return [await rt.open(spec) for spec in SPECS]

    for s, compiled in zip(run(main()), direct):
        np.testing.assert_array_equal(_mask(s, json_info), _matcher_mask(xg2.GrammarMatcher(compiled), json_info))


def test_session_options_reach_the_matcher(json_info, make_runtime):
    rt = make_runtime(json_info)
    options = SessionOptions(override_stop_tokens=[ord("!")], terminate_without_stop_token=True,
                             max_rollback_tokens=1)
    s = run(rt.open(SessionSpec(RegexSpec("ab"), tenant="x", options=options)))
    assert s.matcher.stop_token_ids == [ord("!")] and s.matcher.max_rollback_tokens == 1
    assert rt.accept([s], [ord("a")]) == [True]
    assert rt.accept([s], [ord("b")]) == [True]
    assert s.is_terminated()            # terminate_without_stop_token: done once the grammar is
    plain = run(rt.open(SessionSpec(RegexSpec("ab"), tenant="x")))
    assert plain.compiled_grammar is s.compiled_grammar         # options are per session, not per grammar
    assert plain.matcher.stop_token_ids == json_info.stop_token_ids


@pytest.mark.parametrize("spec, pointer", [
    ({"grammar": {"type": "nope"}}, "/grammar/type"),
    ({"grammar": {"type": "json_schema"}}, "/grammar"),
    ({"grammar": {"type": "regex", "pattern": 5}}, "/grammar/pattern"),
    ({"grammar": {"type": "regex", "pattern": "a", "flags": "i"}}, "/grammar"),
    ({"grammar": {"type": "regex", "pattern": "a"}, "options": {"max_rollback_tokens": "x"}},
     "/options/max_rollback_tokens"),
    ({"grammar": {"type": "regex", "pattern": "a"}, "options": {"override_stop_tokens": [1, "x"]}},
     "/options/override_stop_tokens/1"),
    ({"grammar": {"type": "tools", "tools": [], "reasoning": "maybe"}}, "/grammar/reasoning"),
    ('{"grammar": {"type": "ebnf", "grammar": "root ::= \\"a\\""}, "tenant": 3}', "/tenant"),
    ('{"grammar": ', ""),
    (b"\xff", ""),
])
def test_malformed_specs_raise_spec_error_with_a_pointer(json_info, make_runtime, spec, pointer):
    rt = make_runtime(json_info)
    with pytest.raises(SpecError) as err:
        run(rt.open(spec))
    assert err.value.pointer == pointer
    assert err.value.message
    assert rt.open_sessions() == 0 and rt.stats["compiles"] == 0


@pytest.mark.parametrize("spec", [
    {"grammar": {"type": "regex", "pattern": "a"}, "bogus": 1},     # an unknown field at the top
    {"tenant": "x"},                                               # no grammar at all
    [1, 2],
    7,
])
def test_malformed_specs_at_the_top_level_point_at_the_whole_spec(json_info, make_runtime, spec):
    """msgspec says nothing of where for an error at the root (no " - at `$...`" suffix): the
    pointer is then the whole document (""), and the message is msgspec's."""
    rt = make_runtime(json_info)
    with pytest.raises(SpecError) as err:
        run(rt.open(spec))
    assert err.value.pointer == "", err.value.pointer
    assert err.value.message


def test_compile_refuses_a_malformed_spec_with_spec_error(json_info, make_runtime):
    rt = make_runtime(json_info)
    grammar = run(rt.compile({"type": "regex", "pattern": REGEX}))
    assert run(rt.compile(RegexSpec(REGEX))) is grammar
    assert run(rt.compile(SessionSpec(RegexSpec(REGEX), tenant="t"))) is grammar
    with pytest.raises(SpecError) as err:
        run(rt.compile({"type": "nope"}))
    assert err.value.pointer == "/grammar/type"


@pytest.mark.parametrize("spec, error", [
    (JSONSchemaSpec({"type": "nonsense"}), xg2.SchemaError),
    (JSONSchemaSpec({"type": "object", "properties": {"a": {"minimum": "x"}}}), xg2.SchemaError),
    (EBNFSpec('root ::= "a" undefined_rule'), xg2.GrammarError),
    (RegexSpec("(a"), xg2.RegexError),
    (ToolsSpec(TOOLS, model="no_such_model"), xg2.ModelFormatError),
])
def test_bad_grammars_raise_their_typed_error_and_hold_no_slot(json_info, make_runtime, spec, error):
    rt = make_runtime(json_info)
    with pytest.raises(error):
        run(rt.open(SessionSpec(spec, tenant="bad")))
    assert rt.open_sessions() == 0 and rt.open_sessions("bad") == 0


def test_a_bad_schema_error_says_where(json_info, make_runtime):
    rt = make_runtime(json_info)
    with pytest.raises(xg2.SchemaError) as err:
        run(rt.open({"grammar": {"type": "json_schema", "schema": {"type": "object", "properties": {
            "a": {"type": "nonsense"}}}}}))
    assert err.value.pointer == "/properties/a/type"


# -- single flight, negative cache, deadline ------------------------------------------------------------

def test_concurrent_opens_of_one_spec_share_one_compile(json_info, make_runtime):
    rt = make_runtime(json_info)
    spec = JSONSchemaSpec({"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(30)}})

    async def main():
        return await asyncio.gather(*(rt.open(SessionSpec(spec, tenant=f"t{k % 2}")) for k in range(8)))

    sessions = run(main())
    assert rt.stats["compiles"] == 1
    assert rt.stats["compile_shared"] + rt.stats["grammar_hits"] == 7
    assert len({id(s.compiled_grammar) for s in sessions}) == 1
    assert rt.open_sessions() == 8


def test_concurrent_opens_wait_on_the_compile_in_flight(json_info, make_runtime):
    compiler = CountingCompiler(json_info, delay=0.3)
    rt = make_runtime(json_info, compiler=compiler)

    async def main():
        options = [SessionOptions(), SessionOptions(max_rollback_tokens=3)]
        return await asyncio.gather(*(rt.open(SessionSpec(RegexSpec(REGEX), tenant=f"t{k % 3}",
                                                          options=options[k % 2])) for k in range(8)))

    t0 = time.monotonic()
    sessions = run(main())
    assert time.monotonic() - t0 < 2.0       # one compile of 0.3 s, not eight in a row
    assert compiler.calls == 1
    assert rt.stats["compiles"] == 1 and rt.stats["compile_shared"] == 7
    assert len({id(s.compiled_grammar) for s in sessions}) == 1


def test_a_failed_spec_is_refused_without_compiling_until_its_ttl(json_info, make_runtime):
    compiler = CountingCompiler(json_info)
    rt = make_runtime(json_info, compiler=compiler, failure_ttl_s=0.3)
    bad = JSONSchemaSpec({"type": "nonsense"})

    async def attempt():
        with pytest.raises(xg2.SchemaError) as err:
            await rt.open(bad)
        return err.value

    first = run(attempt())
    second = run(attempt())
    assert compiler.calls == 1 and rt.stats["compiles"] == 1 and rt.stats["failures_refused"] == 1
    assert second is not first and type(second) is type(first) and second.pointer == first.pointer
    other = JSONSchemaSpec({"type": "nonsense", "title": "another spec"})
    with pytest.raises(xg2.SchemaError):
        run(rt.open(other))               # another key: compiled on its own
    assert compiler.calls == 2
    time.sleep(0.35)
    run(attempt())                        # past the TTL: compiled again
    assert compiler.calls == 3 and rt.stats["compiles"] == 3 and rt.stats["failures_refused"] == 1
    run(attempt())                        # and remembered again
    assert compiler.calls == 3 and rt.stats["failures_refused"] == 2
    assert rt.open_sessions() == 0


@pytest.mark.parametrize("spec, error", [
    (JSONSchemaSpec({"type": "object", "properties": {"a": {"type": "nonsense"}}}), xg2.SchemaError),
    (ToolsSpec(TOOLS, tool_choice={"type": "function", "function": {"name": "zz"}}), xg2.ModelFormatError),
    (StructuralTagSpec({"type": "structural_tag", "format": {"type": "nope"}}), xg2.StructuralTagError),
    (RegexSpec("(a"), xg2.RegexError),
    (EBNFSpec('root ::= "a" undefined_rule'), xg2.GrammarError),
])
def test_a_refused_failure_reads_like_the_original(json_info, make_runtime, spec, error):
    """The negative cache raises a copy of the error the compile raised: the same class, fields and
    text (the tenant sees one message whether its retry compiled or was refused)."""
    rt = make_runtime(json_info)
    errors = []
    for _ in range(2):
        with pytest.raises(error) as err:
            run(rt.open(spec))
        errors.append(err.value)
    assert rt.stats["failures_refused"] == 1
    first, second = errors
    assert type(second) is type(first)
    assert vars(second) == vars(first)
    assert str(second) == str(first)


def _huge_ebnf(n: int = 20000) -> str:
    """Thousands of rules: about two seconds to compile here without a deadline."""
    return ("root ::= r0\n" + "\n".join(f'r{i} ::= "a{i}" r{i + 1} | "b"' for i in range(n))
            + f'\nr{n} ::= "z"')


def test_a_compile_past_the_deadline_raises_and_the_runtime_serves_others(json_info, make_runtime):
    rt = make_runtime(json_info, compile_timeout_s=0.05)
    slow = SessionSpec(EBNFSpec(_huge_ebnf()), tenant="slow")
    t0 = time.monotonic()
    with pytest.raises(xg2.GrammarLimitError):
        run(rt.open(slow))
    assert time.monotonic() - t0 < 1.0
    assert rt.open_sessions("slow") == 0
    s = run(rt.open(SessionSpec(RegexSpec("[ab]+c"), tenant="slow")))      # compiled fresh, in time
    assert rt.accept([s], [ord("a")]) == [True]
    with pytest.raises(xg2.GrammarLimitError):
        run(rt.open(slow))
    assert rt.open_sessions("slow") == 1


def test_an_open_stops_waiting_at_the_deadline_and_the_compile_still_lands(json_info, make_runtime):
    """The open's own wait has the deadline too (here the compiler has none): the open raises
    CompileTimeout, frees its slot, and the compile, which goes on, is kept for the next open."""
    compiler = CountingCompiler(json_info, delay=0.5, compile_timeout_ms=None)
    rt = make_runtime(json_info, compiler=compiler, compile_timeout_s=0.1, max_sessions_per_tenant=1)
    t0 = time.monotonic()
    with pytest.raises(xg2.GrammarLimitError):
        run(rt.open(RegexSpec(REGEX)))
    assert time.monotonic() - t0 < 0.45
    assert rt.open_sessions("default") == 0
    time.sleep(0.6)
    s = run(rt.open(RegexSpec(REGEX)))
    assert compiler.calls == 1 and rt.stats["grammar_hits"] == 1
    assert s.compiled_grammar is not None


def test_a_compile_that_ends_at_once_does_not_wedge_the_runtime(json_info, make_runtime):
    """A fresh runtime's first compile starts a worker thread inside `submit`, and a compile that
    fails at once (here a malformed regex) can end before the runtime attaches its done callback;
    the callback then runs on the opening thread, which must not be holding the runtime's lock (at
    a381c90 it was: the open hung for good, and the runtime with it)."""
    rt = make_runtime(json_info)
    with pytest.raises(xg2.RegexError):
        run(rt.open(RegexSpec("(a")), timeout=3)
    s = run(rt.open(RegexSpec(REGEX)), timeout=3)
    assert rt.accept([s], [ord("a")]) == [True]


class _AtOnce(concurrent.futures.Executor):
    """An executor whose futures are done when `submit` returns (as a fast worker can make them)."""

    def submit(self, fn, /, *args, **kwargs):
        future = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as e:  # noqa: BLE001 - the future carries it
            future.set_exception(e)
        return future


def test_a_compile_done_before_its_callback_is_attached_does_not_deadlock(json_info, make_runtime):
    """The same race made certain: every compile is over when `submit` returns."""
    rt = make_runtime(json_info)
    rt._compile_pool = _AtOnce()
    s = run(rt.open(RegexSpec(REGEX)), timeout=3)
    assert rt.stats["compiles"] == 1 and rt.session(s.id) is s


# -- quotas, lifetime ------------------------------------------------------------------------------------

def test_a_tenant_at_its_quota_is_refused_and_others_are_not(json_info, make_runtime):
    rt = make_runtime(json_info, max_sessions_per_tenant=3)

    async def main():
        mine = [await rt.open(SessionSpec(SPECS[k], tenant="a")) for k in range(3)]
        with pytest.raises(QuotaError):
            await rt.open(SessionSpec(SPECS[0], tenant="a"))
        theirs = await rt.open(SessionSpec(SPECS[0], tenant="b"))
        assert rt.open_sessions("a") == 3 and rt.open_sessions("b") == 1
        rt.close(mine[1])
        again = await rt.open(SessionSpec(SPECS[0], tenant="a"))
        with pytest.raises(QuotaError):
            await rt.open(SessionSpec(SPECS[1], tenant="a"))
        return mine, theirs, again

    run(main())
    assert rt.open_sessions() == 4


def test_a_burst_cannot_pass_the_quota(json_info, make_runtime):
    rt = make_runtime(json_info, max_sessions_per_tenant=3, compiler=CountingCompiler(json_info, delay=0.1))

    async def main():
        return await asyncio.gather(*(rt.open(SessionSpec(RegexSpec(REGEX), tenant="a")) for _ in range(5)),
                                    return_exceptions=True)

    out = run(main())
    assert sum(isinstance(o, QuotaError) for o in out) == 2
    assert sum(not isinstance(o, BaseException) for o in out) == 3
    assert rt.open_sessions("a") == 3


def test_failed_compiles_do_not_leak_slots(json_info, make_runtime):
    rt = make_runtime(json_info, max_sessions_per_tenant=2)

    async def main():
        for k in range(6):
            with pytest.raises((xg2.SchemaError, xg2.RegexError)):
                await rt.open(SessionSpec(JSONSchemaSpec({"type": "nonsense"}) if k % 2 else RegexSpec("(a"),
                                          tenant="a"))
            with pytest.raises(SpecError):
                await rt.open({"grammar": {"type": "regex"}, "tenant": "a"})
        with pytest.raises(xg2.UsageError):
            await rt.restore(SessionSpec(RegexSpec("ab"), tenant="a"), [ord("b")])
        return [await rt.open(SessionSpec(RegexSpec(REGEX), tenant="a")) for _ in range(2)]

    assert len(run(main())) == 2
    assert rt.open_sessions("a") == 2
    with pytest.raises(QuotaError):
        run(rt.open(SessionSpec(RegexSpec(REGEX), tenant="a")))


def test_idle_sessions_are_reaped_and_then_refused(json_info, make_runtime):
    rt = make_runtime(json_info, idle_timeout_s=0.1)
    a, b = run(_open_walked(rt, json_info, 2, seed=1))
    bitmask = np.full((2, _width(json_info)), 7, np.int32)
    assert rt.reap_idle(now=time.monotonic() + 10) == 2
    assert rt.stats["sessions_reaped"] == 2 and rt.open_sessions() == 0
    assert rt.open_sessions(a.tenant) == 0 and rt.open_sessions(b.tenant) == 0
    for call in (lambda: rt.session(a.id), lambda: rt.accept([a], [0]), lambda: rt.rollback([a], 1),
                 lambda: rt.fill([a, b], bitmask), lambda: rt.submit_fill([b], bitmask),
                 lambda: run(rt.fork(a))):
        with pytest.raises(SessionError):
            call()
    assert (bitmask == 7).all()
    rt.close([a, b])      # closing a reaped session again is harmless
    assert rt.open_sessions() == 0


def test_reaping_spares_sessions_in_use(json_info, make_runtime):
    rt = make_runtime(json_info, idle_timeout_s=60)
    stale, busy = run(_open_walked(rt, json_info, 2, seed=2))
    stale.last_used -= 100
    assert rt.reap_idle(now=time.monotonic() + 2) == 1
    assert stale.closed and not busy.closed
    assert rt.session(busy.id) is busy
    with pytest.raises(SessionError):
        rt.session(stale.id)


def test_calls_on_a_reaped_session_raise_session_error(json_info, make_runtime):
    """The runtime's contract for idle_timeout_s: a reaped session is closed, and calls on it then
    raise SessionError, its own methods included."""
    rt = make_runtime(json_info, idle_timeout_s=0.1)
    s = run(rt.open(RegexSpec(REGEX)))
    rt.reap_idle(now=time.monotonic() + 10)
    assert s.closed
    for call in (s.is_completed, s.is_terminated, lambda: s.compiled_grammar):
        with pytest.raises(SessionError):
            call()


def test_sessions_are_invisible_to_other_tenants(json_info, make_runtime):
    rt = make_runtime(json_info)
    s = run(rt.open(SessionSpec(RegexSpec(REGEX), tenant="alice")))
    assert rt.session(s.id) is s and rt.session(s.id, tenant="alice") is s
    with pytest.raises(SessionError) as theirs:
        rt.session(s.id, tenant="mallory")
    with pytest.raises(SessionError) as missing:
        rt.session("0" * 24, tenant="mallory")
    assert str(theirs.value).replace(s.id, "ID") == str(missing.value).replace("0" * 24, "ID")


def test_closing_twice_is_harmless_and_frees_one_slot(json_info, make_runtime):
    rt = make_runtime(json_info, max_sessions_per_tenant=2)
    a, b = (run(rt.open(SessionSpec(RegexSpec(REGEX), tenant="t"))) for _ in range(2))
    rt.close(a)
    rt.close(a)
    rt.close([a, a])
    assert rt.open_sessions("t") == 1 and rt.open_sessions() == 1
    run(rt.open(SessionSpec(RegexSpec(REGEX), tenant="t")))
    with pytest.raises(QuotaError):          # the second close did not free b's slot
        run(rt.open(SessionSpec(RegexSpec(REGEX), tenant="t")))
    assert not b.closed


# -- batch steps ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 8, 40])
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_fill_writes_what_single_fills_write(json_info, make_runtime, n, backend):
    rt = make_runtime(json_info, fill_threads=1)
    sessions = run(_open_walked(rt, json_info, n, seed=n))
    width = _width(json_info)

    def target(a):
        return a if backend == "numpy" else torch.from_numpy(a)

    plain = np.full((n, width), 7, np.int32)
    rt.fill(sessions, target(plain))
    np.testing.assert_array_equal(plain, _expected_rows(sessions, json_info, n))
    assert len({row.tobytes() for row in plain}) > min(1, n - 1)

    rows = list(range(n + 3))
    random.Random(n).shuffle(rows)
    indices = rows[:n]
    got = np.full((n + 3, width), 7, np.int32)
    rt.fill(sessions, target(got), indices)
    np.testing.assert_array_equal(got, _expected_rows(sessions, json_info, n + 3, indices))  # padding stays 7


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_fill_leaves_the_rows_of_none_sessions_alone(json_info, make_runtime, backend):
    rt = make_runtime(json_info)
    sessions = run(_open_walked(rt, json_info, 12, seed=5))
    holes = [s if k % 3 else None for k, s in enumerate(sessions)]
    width = _width(json_info)
    got = np.full((12, width), 7, np.int32)
    rt.fill(holes, got if backend == "numpy" else torch.from_numpy(got))
    np.testing.assert_array_equal(got, _expected_rows(holes, json_info, 12))
    assert (got[::3] == 7).all()

    indices = [11 - k for k in range(12)]
    got = np.full((12, width), 7, np.int32)
    rt.fill(holes, got if backend == "numpy" else torch.from_numpy(got), indices)
    np.testing.assert_array_equal(got, _expected_rows(holes, json_info, 12, indices))
    assert (got[[11 - k for k in range(0, 12, 3)]] == 7).all()

    untouched = np.full((3, width), 7, np.int32)
    rt.fill([None, None, None], untouched)
    assert (untouched == 7).all()


@pytest.mark.parametrize("n", [70, 300])
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_fill_split_over_threads(json_info, make_runtime, backend, n):
    rt = make_runtime(json_info, fill_threads=2)
    sessions = run(_open_walked(rt, json_info, n, seed=n))
    assert len(rt._jobs(0, _width(json_info), [s._core for s in sessions], np.arange(n))) == 2
    width = _width(json_info)
    rows = list(range(2, n + 2))
    expected = _expected_rows(sessions, json_info, n + 2, rows)
    got = np.full((n + 2, width), 7, np.int32)
    bitmask = got if backend == "numpy" else torch.from_numpy(got)
    plain = np.full((n, width), 7, np.int32)
    plain_bitmask = plain if backend == "numpy" else torch.from_numpy(plain)
    for _ in range(3):      # the same bitmasks again (a torch tensor's checks are then remembered)
        got.fill(7)
        rt.fill(sessions, bitmask, rows)
        np.testing.assert_array_equal(got, expected)
        got.fill(7)
        handle = rt.submit_fill(sessions, bitmask, rows)
        handle.wait()
        assert handle.done()
        np.testing.assert_array_equal(got, expected)
        plain.fill(7)
        rt.fill(sessions, plain_bitmask)
        np.testing.assert_array_equal(plain, expected[2:])
        plain.fill(7)
        rt.submit_fill(sessions, plain_bitmask).wait()
        np.testing.assert_array_equal(plain, expected[2:])


def test_a_remembered_torch_bitmask_is_checked_again_when_it_changes(json_info, make_runtime):
    rt = make_runtime(json_info)
    sessions = run(_open_walked(rt, json_info, 4, seed=8))
    width = _width(json_info)
    t = torch.full((4, width), 7, dtype=torch.int32)
    rt.fill(sessions, t)
    t.resize_(4, width - 1)       # same tensor object, same storage, another shape
    t.fill_(7)
    with pytest.raises(xg2.UsageError):
        rt.fill(sessions, t)
    assert (t == 7).all()
    t2 = torch.full((2, width), 7, dtype=torch.int32)
    with pytest.raises(xg2.UsageError):
        rt.fill(sessions, t2)      # fewer rows than sessions
    assert (t2 == 7).all()


def test_submit_fill_gives_the_rows_fill_gives(json_info, make_runtime):
    rt = make_runtime(json_info, fill_threads=2)
    sessions = run(_open_walked(rt, json_info, 40, seed=9))
    expected = _expected_rows(sessions, json_info, 40)
    got = np.full((40, _width(json_info)), 7, np.int32)
    rt.submit_fill(sessions, got).wait(timeout=10)
    np.testing.assert_array_equal(got, expected)

    async def awaited():
        out = torch.full((40, _width(json_info)), 7, dtype=torch.int32)
        await rt.submit_fill(sessions, out)
        return out.numpy()

    np.testing.assert_array_equal(run(awaited()), expected)


@pytest.mark.parametrize("make_bad", [
    lambda n, w: np.full((n, w), 7, np.int64),
    lambda n, w: np.full((n, w), 7, np.uint32),
    lambda n, w: np.full((n, w + 1), 7, np.int32),
    lambda n, w: np.full((n, w - 1), 7, np.int32),
    lambda n, w: np.full((n, 1, w), 7, np.int32),
    lambda n, w: np.full((n * w,), 7, np.int32),
    lambda n, w: np.asfortranarray(np.full((n, w), 7, np.int32)),
    lambda n, w: np.full((n, 2 * w), 7, np.int32)[:, ::2],
    lambda n, w: np.full((n - 1, w), 7, np.int32),
    lambda n, w: torch.full((n, w), 7, dtype=torch.int64),
    lambda n, w: torch.full((n, w, 1), 7, dtype=torch.int32),
    lambda n, w: torch.full((w, n), 7, dtype=torch.int32).t(),
], ids=["int64", "uint32", "wide", "narrow", "3-D", "1-D", "fortran", "strided", "few rows", "torch int64",
        "torch 3-D", "torch transposed"])
def test_a_bad_bitmask_is_refused_and_nothing_is_written(json_info, make_runtime, make_bad):
    rt = make_runtime(json_info)
    sessions = run(_open_walked(rt, json_info, 3, seed=4))
    bad = make_bad(3, _width(json_info))
    with pytest.raises(xg2.UsageError):
        rt.fill(sessions, bad)
    with pytest.raises(xg2.UsageError):
        rt.submit_fill(sessions, bad)
    assert (bad == 7).all()


def test_bad_rows_and_indices_are_refused_and_nothing_is_written(json_info, make_runtime):
    rt = make_runtime(json_info)
    sessions = run(_open_walked(rt, json_info, 3, seed=6))
    bitmask = np.full((4, _width(json_info)), 7, np.int32)
    for indices in ([0, 1, 4], [0, -1, 2], [0, 1]):
        with pytest.raises(xg2.UsageError):
            rt.fill(sessions, bitmask, indices)
    with pytest.raises(xg2.UsageError):
        rt.fill(sessions + sessions, bitmask)          # six sessions, four rows
    assert (bitmask == 7).all()


def test_a_session_past_its_stop_token_cannot_be_filled(json_info, make_runtime):
    rt = make_runtime(json_info)
    done = run(rt.open(RegexSpec("ab")))
    other = run(rt.open(RegexSpec(REGEX)))
    stop = json_info.stop_token_ids[0]
    assert rt.accept([done, done, done], [ord("a"), ord("b"), stop]) == [True, True, True]
    assert done.is_terminated()
    bitmask = np.full((2, _width(json_info)), 7, np.int32)
    with pytest.raises(xg2.UsageError):
        rt.fill([other, done], bitmask)
    with pytest.raises(xg2.UsageError):
        rt.submit_fill([other, done], bitmask)
    assert (bitmask == 7).all()
    rt.fill([other, None], bitmask)      # the others are fine on their own
    assert not (bitmask[0] == 7).all() and (bitmask[1] == 7).all()


def test_a_closed_session_cannot_be_filled(json_info, make_runtime):
    rt = make_runtime(json_info)
    a, b = run(_open_walked(rt, json_info, 2, seed=7))
    rt.close(b)
    bitmask = np.full((2, _width(json_info)), 7, np.int32)
    with pytest.raises(SessionError):
        rt.fill([a, b], bitmask)
    assert (bitmask == 7).all()


def test_accept_reports_per_session_and_a_refused_token_changes_nothing(json_info, make_runtime):
    rt = make_runtime(json_info)
    a = run(rt.open(RegexSpec(REGEX)))
    b = run(rt.open(EBNFSpec(EBNF)))
    assert rt.accept([b], [ord("(")]) == [True]
    before_a, before_b = _mask(a, json_info), _mask(b, json_info)
    assert rt.accept([a, b, None], [ord("x"), ord("x"), 0]) == [True, False, False]
    assert a.tokens == [ord("x")] and b.tokens == [ord("(")]
    assert not np.array_equal(_mask(a, json_info), before_a)
    np.testing.assert_array_equal(_mask(b, json_info), before_b)
    assert rt.accept([a, b], [np.int64(ord("y")), np.int32(ord("1"))]) == [True, True]
    assert b.tokens == [ord("("), ord("1")]
    with pytest.raises(xg2.UsageError):
        rt.accept([a, b], [ord("x")])


def test_rollback_returns_to_an_earlier_mask(json_info, make_runtime):
    rt = make_runtime(json_info)
    a = run(rt.open(RegexSpec(REGEX)))
    b = run(rt.open(EBNFSpec(EBNF)))
    masks_a, masks_b = [_mask(a, json_info)], [_mask(b, json_info)]
    for ta, tb in zip(b"abc@", b"(1+2"):
        assert rt.accept([a, b], [ta, tb]) == [True, True]
        masks_a.append(_mask(a, json_info))
        masks_b.append(_mask(b, json_info))
    rt.rollback([a, b], [3, 1])
    assert a.tokens == list(b"a") and b.tokens == list(b"(1+")
    np.testing.assert_array_equal(_mask(a, json_info), masks_a[1])
    np.testing.assert_array_equal(_mask(b, json_info), masks_b[3])
    rt.rollback([a, b])              # one each
    np.testing.assert_array_equal(_mask(a, json_info), masks_a[0])
    np.testing.assert_array_equal(_mask(b, json_info), masks_b[2])
    rt.rollback([a, b], 0)
    assert a.tokens == [] and b.tokens == list(b"(1")
    with pytest.raises(xg2.UsageError):
        rt.rollback([a, b], [1])


def test_rollback_past_the_limit_changes_nothing(json_info, make_runtime):
    rt = make_runtime(json_info)
    s = run(rt.open(SessionSpec(RegexSpec(REGEX), options=SessionOptions(max_rollback_tokens=1))))
    assert rt.accept([s, s], [ord("a"), ord("b")]) == [True, True]
    before = _mask(s, json_info)
    with pytest.raises(xg2.UsageError):
        rt.rollback([s], 2)
    assert s.tokens == list(b"ab")
    np.testing.assert_array_equal(_mask(s, json_info), before)


def test_fork_copies_the_state_and_forks_diverge_independently(json_info, make_runtime):
    rt = make_runtime(json_info)
    s = run(rt.open(SessionSpec(JSONSchemaSpec(SCHEMA), tenant="f")))
    table = {bytes(t): i for i, t in enumerate(json_info.decoded_vocab[:-1])}
    assert all(rt.accept([s], [t]) == [True] for t in longest_match(table, b'{"name": "a'))
    left, right = run(rt.fork(s, n=2))
    assert rt.open_sessions("f") == 3
    assert left.id != right.id != s.id and left.tenant == right.tenant == "f"
    assert left.tokens == right.tokens == s.tokens and left.tokens is not s.tokens
    assert left.compiled_grammar is s.compiled_grammar
    for f in (left, right):
        np.testing.assert_array_equal(_mask(f, json_info), _mask(s, json_info))
    original = _mask(s, json_info)
    assert rt.accept([left, right], [ord("b"), ord('"')]) == [True, True]
    assert rt.accept([right], [ord(",")]) == [True]
    np.testing.assert_array_equal(_mask(s, json_info), original)
    assert not np.array_equal(_mask(left, json_info), _mask(right, json_info))
    assert s.tokens == left.tokens[:-1] == right.tokens[:-2]
    bitmask = np.full((3, _width(json_info)), 7, np.int32)
    rt.fill([s, left, right], bitmask)
    np.testing.assert_array_equal(bitmask, _expected_rows([s, left, right], json_info, 3))


def test_restore_replays_and_a_refused_replay_leaves_nothing_open(json_info, make_runtime):
    rt = make_runtime(json_info)
    s = run(rt.open(SessionSpec(EBNFSpec(EBNF), tenant="r")))
    rt.accept([s] * 5, list(b"((1+2"))
    assert s.tokens == list(b"((1+2")
    copy = run(rt.restore(s.spec, s.tokens))
    np.testing.assert_array_equal(_mask(copy, json_info), _mask(s, json_info))
    as_dict = run(rt.restore({"grammar": {"type": "ebnf", "grammar": EBNF}, "tenant": "r"}, np.array(s.tokens)))
    np.testing.assert_array_equal(_mask(as_dict, json_info), _mask(s, json_info))
    assert rt.open_sessions() == 3 and rt.open_sessions("r") == 3
    with pytest.raises(xg2.UsageError, match="position 2"):
        run(rt.restore(s.spec, list(b"((x")))
    assert rt.open_sessions() == 3 and rt.open_sessions("r") == 3


def test_cache_bytes_stay_within_their_budgets(json_info, make_runtime):
    rt = make_runtime(json_info, grammar_cache_bytes=2_500_000, cache_limit_bytes=8_000_000)

    async def main():
        for k in range(15):
            schema = {"type": "object", "properties": {f"p{k}_{i}": {"type": "string"} for i in range(20)}}
            s = await rt.open(JSONSchemaSpec(schema))
            figures = rt.cache_bytes()      # the budgets hold where they are enforced: at each compile
            assert figures["grammars_budget"] == 2_500_000 and figures["compiler_budget"] == 8_000_000
            assert 0 < figures["grammars"] <= 2_500_000
            # tables and the entry builder's C working memory (about 0.3-0.9 MB each here) are counted
            assert figures["grammars"] > sum(g.tables_bytes for g in rt._grammars.values()) + 100_000
            assert figures["compiler"] <= 8_000_000
            _walk(rt, s, json_info, 12, random.Random(k))
            assert 0 < rt.cache_bytes()["grammars"] <= 2_500_000      # also after the walk grew it
            rt.close(s)
        return schema

    last = run(main())
    assert 1 < len(rt._grammars) < 15
    compiles = rt.stats["compiles"]
    run(rt.open(JSONSchemaSpec(last)))             # the newest is still kept
    assert rt.stats["compiles"] == compiles
    first = {"type": "object", "properties": {f"p0_{i}": {"type": "string"} for i in range(20)}}
    run(rt.open(JSONSchemaSpec(first)))            # the oldest was let go
    assert rt.stats["compiles"] == compiles + 1


def test_a_budget_below_one_grammar_still_keeps_one(json_info, make_runtime):
    rt = make_runtime(json_info, grammar_cache_bytes=1)
    run(rt.open(RegexSpec(REGEX)))
    run(rt.open(RegexSpec(REGEX)))
    assert rt.stats["compiles"] == 1 and rt.stats["grammar_hits"] == 1
    run(rt.open(EBNFSpec(EBNF)))
    assert len(rt._grammars) == 1 and rt.cache_bytes()["grammars"] > 1


def test_shutdown_closes_every_session(json_info):
    rt = GrammarRuntime(json_info)
    sessions = run(_open_walked(rt, json_info, 4, seed=10))
    rt.shutdown()
    assert rt.open_sessions() == 0 and all(s.closed for s in sessions)
    with pytest.raises(SessionError):
        rt.accept(sessions[:1], [0])


def test_content_keys(json_info):
    assert content_key(RegexSpec("ab")) == content_key(msgspec.convert({"type": "regex", "pattern": "ab"},
                                                                       RegexSpec))
    assert content_key(RegexSpec("ab")) != content_key(EBNFSpec("ab"))
    assert content_key(JSONSchemaSpec({"a": 1, "b": 2})) != content_key(JSONSchemaSpec({"b": 2, "a": 1}))
    assert content_key(JSONSchemaSpec(SCHEMA)) != content_key(JSONSchemaSpec(SCHEMA, indent=2))
    assert len(content_key(RegexSpec("ab"))) == 16


# -- a real vocabulary, real tools -------------------------------------------------------------------

def _registry_tools(names: set[str], extra: int) -> list[dict]:
    path = SHARED / "data/tools/registry.jsonl"
    if not path.exists():
        pytest.skip(f"{path} not found")
    tools = []
    with open(path, encoding="utf-8") as f:
        for k, line in enumerate(f):
            fn = json.loads(line)["function"]
            if fn["name"] in names or (k % 97 == 5 and len(tools) < extra + len(names)):
                tools.append({"type": "function", "function": fn})
    return tools


def test_tool_calls_step_by_step_on_a_real_vocabulary(deepseek_info, deepseek_tokenizer, make_runtime):
    tools = _registry_tools({"bing_search", "fetch_webpage"}, extra=4)
    rt = make_runtime(deepseek_info)
    text = ('I will look it up.<tool_call>\n{"name": "bing_search", "arguments": {"query": "巴黎 天气", '
            '"num_results": 5}}\n</tool_call>\n<tool_call>\n{"name": "fetch_webpage", "arguments": '
            '{"result_id": "r-2"}}\n</tool_call>')
    tokens = deepseek_tokenizer.encode(text, add_special_tokens=False).ids

    async def main():
        auto = await rt.open(SessionSpec(ToolsSpec(tools), tenant="a"))
        required = await rt.open({"grammar": {"type": "tools", "tools": tools, "tool_choice": "required"},
                                  "tenant": "b"})
        return auto, required

    auto, required = run(main())
    assert auto.compiled_grammar is not required.compiled_grammar
    call = '<tool_call>\n{"name": "fetch_webpage", "arguments": {"result_id": "x-1"}}\n</tool_call>'
    paths = [tokens, deepseek_tokenizer.encode(call, add_special_tokens=False).ids]
    starts = [0, 3]                     # `required` joins late, at its own first step
    bitmask = torch.full((2, _width(deepseek_info)), 7, dtype=torch.int32)
    for k in range(max(len(paths[0]), starts[1] + len(paths[1]))):
        steps = [(s, path[k - at]) if 0 <= k - at < len(path) else (None, 0)
                 for s, path, at in zip((auto, required), paths, starts)]
        sessions = [s for s, _t in steps]
        bitmask.fill_(7)
        rt.fill(sessions, bitmask)
        np.testing.assert_array_equal(bitmask.numpy(), _expected_rows(sessions, deepseek_info, 2))
        assert rt.accept(sessions, [t for _s, t in steps]) == [s is not None for s in sessions]
    assert auto.is_completed() and required.is_completed()
    stop = deepseek_info.stop_token_ids[0]
    assert rt.accept([auto, required], [stop, stop]) == [True, True] and auto.is_terminated()
    free_text = deepseek_tokenizer.encode("Just an answer.", add_special_tokens=False).ids
    probe = run(rt.restore(SessionSpec(ToolsSpec(tools, tool_choice="required"), tenant="b"), []))
    assert rt.accept([probe], free_text[:1]) == [False]     # a call is required: no free text first


def test_a_bad_tool_is_a_typed_error_with_its_pointer(deepseek_info, make_runtime):
    tools = _registry_tools({"bing_search"}, extra=0)
    rt = make_runtime(deepseek_info, max_sessions_per_tenant=1)
    bad = tools + [{"type": "function", "function": {"name": "broken", "parameters": {"type": "nonsense"}}}]
    with pytest.raises(xg2.XG2Error) as err:
        run(rt.open(SessionSpec(ToolsSpec(bad), tenant="t")))
    assert "nonsense" in str(err.value) and getattr(err.value, "pointer", "")
    with pytest.raises(xg2.ModelFormatError) as err:
        run(rt.open(SessionSpec(ToolsSpec(tools, tool_choice={"type": "function", "function": {"name": "zz"}}),
                                tenant="t")))
    assert err.value.pointer == "/tool_choice"
    assert rt.open_sessions("t") == 0
    run(rt.open(SessionSpec(ToolsSpec(tools), tenant="t")))


def test_one_tenant_cannot_hold_every_compile_worker(json_info, make_runtime):
    """With two workers, a tenant compiles one spec at a time (its others wait for it), so another
    tenant's compile starts at once; the gates work across event loops."""
    import threading

    rt = make_runtime(json_info, compile_workers=2)
    assert rt.max_compiles_per_tenant == 1
    started: list[str] = []
    release = threading.Event()
    real = rt._compile_blocking

    def slow(grammar, key, *rest):
        started.append(grammar.pattern)
        if grammar.pattern.startswith("slow"):
            release.wait(10)
        return real(grammar, key, *rest)

    rt._compile_blocking = slow

    async def burst(loop_no: int):
        hog = [asyncio.ensure_future(rt.open({"grammar": {"type": "regex", "pattern": f"slow{loop_no}{i}"},
                                              "tenant": "hog"})) for i in range(3)]
        await asyncio.sleep(0.2)
        assert [p for p in started if p.startswith(f"slow{loop_no}")] == [f"slow{loop_no}0"]   # one at a time
        other = await asyncio.wait_for(rt.open({"grammar": {"type": "regex", "pattern": f"x{loop_no}"},
                                                "tenant": "other"}), 5)
        assert other.tenant == "other"
        release.set()
        sessions = await asyncio.gather(*hog)
        release.clear()
        rt.close([other, *sessions])

    run(burst(0))
    run(burst(1))       # a second event loop: the tenant's gate is made anew for it


def test_waiting_compiles_go_to_the_tenant_that_compiled_least_lately(json_info, make_runtime):
    """One worker, busy; a tenant that has used seconds of compile time lately queued first, a
    quiet tenant after it: the quiet one's compile runs first (the busy one's when none waits)."""
    rt = make_runtime(json_info, compile_workers=1)
    gate, order = threading.Event(), []

    def job(name):
        if name == "first":
            end = time.thread_time() + 0.15
            while time.thread_time() < end:     # CPU time, which is what a tenant is charged
                pass
            gate.wait(10)                       # waiting is not
        order.append(name)
        return name

    with rt._lock:
        first = rt._queue_compile("someone", False, job, "first")
    rt._compile_pool.submit(rt._next_compile)
    time.sleep(0.3)                                     # the worker holds "first"
    rt._usage["hostile"] = (5.0, time.monotonic())      # five seconds of compiles just now
    with rt._lock:
        noisy = rt._queue_compile("hostile", False, job, "hostile")
        quiet = rt._queue_compile("quiet", False, job, "quiet")
    rt._compile_pool.submit(rt._next_compile)
    rt._compile_pool.submit(rt._next_compile)
    gate.set()
    assert [f.result(10) for f in (first, noisy, quiet)] == ["first", "hostile", "quiet"]
    assert order == ["first", "quiet", "hostile"]
    now = time.monotonic()
    assert rt._tenant_usage("quiet", now) < 0.1 < rt._tenant_usage("someone", now) < 0.3     # its CPU, not its wait
    assert 4.0 < rt._tenant_usage("hostile", now) < 5.1                                 # and decaying
