"""The mask service ("xg2-masks") with two replicas: sessions routed to the replica that holds them,
the same masks as an in-process runtime, and a replica's death costing only its own sessions.

The application is deployed alone on the session's Ray (no model application, no cache shards: the
tiny model's vocabulary, compiles in each host's own processes), once for the module.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from conftest import SAMPLE_EBNF, SAMPLE_REGEX

from xg2.errors import SessionError, SessionLostError

APP = "xg2-masks-test"
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
          "required": ["ok", "n"], "additionalProperties": False}
#: (spec, text) per engine: each engine's sessions walk their text token by token.
CASES = [
    ({"grammar": {"type": "json_schema", "schema": SCHEMA}}, '{"ok": true, "n": 42}'),
    ({"grammar": {"type": "regex", "pattern": SAMPLE_REGEX}}, "abc@xy.com"),
    ({"grammar": {"type": "ebnf", "grammar": SAMPLE_EBNF}}, "(1+(2+3))"),
    ({"grammar": {"type": "json_schema", "schema": {"type": "array", "items": {"type": "integer"}}}}, "[1, 22, 333]"),
]


@pytest.fixture(scope="module")
def loaded():
    from serve.model import load_model

    return load_model("tiny", progress=False)


@pytest.fixture(scope="module")
def reference(loaded):
    """An in-process runtime on the same vocabulary: the masks the service must give."""
    from serve.model import tokenizer_info
    from xg2.actors import GrammarRuntime

    rt = GrammarRuntime(tokenizer_info(loaded))
    yield rt
    rt.shutdown()


@pytest.fixture(scope="module")
def handle(serve_local, loaded):
    from ray import serve

    from serve.app import build_masks

    h = serve.run(build_masks({"model": "tiny", "shards": 0, "replicas": 2}), name=APP, route_prefix=None)
    yield h
    serve.delete(APP)


def _walk(reference, loaded, spec: dict, text: str) -> tuple[list[int], list[np.ndarray]]:
    """The text's tokens and the in-process masks before each of them (and after the last)."""
    session = asyncio.run(reference.open(spec))
    tokens = loaded.tokenizer.encode(text, add_special_tokens=False)
    width = (loaded.vocab_size + 31) // 32
    masks = []
    try:
        for t in [*tokens, None]:
            row = np.zeros((1, width), np.int32)
            reference.fill([session], row)
            masks.append(row[0])
            if t is not None:
                assert reference.accept([session], [t]) == [True], f"{text!r} is not in its grammar"
    finally:
        reference.close(session)
    return tokens, masks


def test_sessions_of_engines_spread_over_replicas_give_the_in_process_masks(handle, loaded, reference):
    """Four engines (StepClients over the Serve handle) bind two to each replica; every row of
    their packed steps (direct calls on the replica's host) equals the in-process runtime's, and
    so does every row through the handle (`step_rows`, routed by session id to the holder). A
    tenant reaches only its own sessions, by either path."""
    from xg2.actors.host import StepClient, session_tag

    walks = [_walk(reference, loaded, spec, text) for spec, text in CASES]
    engines = [StepClient(handle, f"engine-{k}", loaded.vocab_size) for k in range(len(CASES))]
    ids = [[c.open(spec) for _ in range(2)] for c, (spec, _text) in zip(engines, CASES)]
    tags = [c.tag for c in engines]
    assert len(set(tags)) == 2 and sorted(tags.count(t) for t in set(tags)) == [2, 2], tags
    assert all(session_tag(sid) == c.tag for c, mine in zip(engines, ids) for sid in mine)
    for c, mine, (_tokens, masks) in zip(engines, ids, walks):
        assert all(np.array_equal(c.mask(sid), masks[0]) for sid in mine)

    steps = max(len(tokens) for tokens, _ in walks)
    last: list = [None] * len(engines)
    for step in range(steps + 1):
        for k, (c, mine, (tokens, masks)) in enumerate(zip(engines, ids, walks)):
            if step > len(tokens):
                continue
            # session 0 steps directly on the host (StepClient), session 1 through Serve's routing
            rows, accepted, ended = c.step(mine[:1], [last[k]])
            assert accepted == [True] and ended == [False]
            assert np.array_equal(rows[0], masks[step]), (CASES[k][1], step)
            out = handle.step_rows.remote(f"engine-{k}", mine[1:], [last[k]]).result()
            assert out["accepted"] == [True] and np.array_equal(out["masks"][0], masks[step])
            last[k] = tokens[step] if step < len(tokens) else None

    with pytest.raises(SessionError):       # another tenant, directly on the host
        StepClient(handle, "mallory", loaded.vocab_size).step(ids[0][:1], [None])
    with pytest.raises(SessionError):       # and through Serve's routing
        handle.step_rows.remote("mallory", ids[1][1:], [None]).result()
    assert handle.close.remote("mallory", ids[2]).result() == 0
    for k, (c, mine) in enumerate(zip(engines, ids)):
        assert c.close(mine[:1]) == 1
        assert handle.close.remote(f"engine-{k}", mine[1:]).result() == 1
    stats = handle.broadcast("stats").results(timeout_s=60)
    assert sorted(s["replica"]["tag"] for s in stats) == sorted(set(tags))
    assert sum(s["open_sessions"] for s in stats) == 0


def test_a_tagged_host_names_its_sessions_and_refuses_another_tags(json_info):
    """A host with a tag gives out `<tag>.<id>`; ids of another tag are lost sessions (every one the
    call names is listed), an untagged id is an unknown one, closing a lost one is a no-op, and a
    fork stays under the tag. The router reads the same ids out of each method's arguments."""
    from serve.masks import request_sessions
    from xg2.actors.host import MatcherHost, StepClient, session_tag

    host = MatcherHost(json_info, tag="r1")
    spec = {"grammar": {"type": "regex", "pattern": "(ab)+"}}

    async def run():
        sid = (await host.open("t", spec))["session"]
        assert session_tag(sid) == "r1" and sid.startswith("r1.")
        gone = ["r0." + sid[3:], "r9.x"]
        with pytest.raises(SessionLostError) as e:
            await host.step("t", [sid, *gone], [None, None, None])
        assert e.value.session_ids == gone and isinstance(e.value, SessionError)
        with pytest.raises(SessionLostError):
            await host.fork("t", gone[0])
        with pytest.raises(SessionError) as e:
            await host.rollback("t", [sid[3:]])                 # the runtime's own id is no caller's id
        assert not isinstance(e.value, SessionLostError)
        assert await host.close("t", gone) == 0
        forks = await host.fork("t", sid, 2)
        assert all(session_tag(f) == "r1" for f in forks)
        client = StepClient(None, "t", json_info.vocab_size)
        rows, accepted, _ = client.read([sid], await host.step_packed("t", client.request([sid], [None])))
        assert accepted == [True] and rows.shape == (1, (json_info.vocab_size + 31) // 32)
        assert request_sessions("step_packed", ["t", client.request([sid], [None])], {}) == [sid]
        assert request_sessions("step_rows", ["t", [sid, "x"], [None, None]], {}) == [sid, "x"]
        assert request_sessions("close", ["t"], {"session_ids": [sid]}) == [sid]
        assert request_sessions("fork", ["t", sid, 2], {}) == [sid]
        assert request_sessions("open", ["t", spec, True], {}) == []
        assert await host.close("t", [sid, *forks]) == 3
        host.runtime.shutdown()

    asyncio.run(run())
    with pytest.raises(Exception, match="tag"):
        MatcherHost(json_info, tag="a.b")


def test_the_drivers_row_reader_matches_the_bits(json_info):
    """The load driver picks the k-th allowed token from per-word bit counts; it must be the k-th
    set bit of the row below the vocabulary size, bits past it ignored."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "loadtests" / "mask_driver.py"
    spec = importlib.util.spec_from_file_location("loadtests_mask_driver", path)
    driver = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = driver         # its dataclasses look their module up
    spec.loader.exec_module(driver)
    rng = np.random.default_rng(7)
    for vocab, density in [(1000, 0.01), (1000, 0.5), (64, 1.0), (49_152, 0.001), (33, 0.9)]:
        width = (vocab + 31) // 32
        bits = rng.random(32 * width) < density
        row = np.packbits(bits, bitorder="little").view("<i4").astype(np.int32)
        allowed = np.flatnonzero(bits[:vocab])
        view = driver.RowView(row, vocab)
        assert view.size == allowed.size
        assert [view.kth(k) for k in range(allowed.size)] == allowed.tolist()
        assert all(view.allows(int(t)) == bits[t] for t in rng.integers(0, vocab, 50))


def _replica_actor(tag: str):
    import ray

    return ray.get_actor(f"SERVE_REPLICA::{APP}#xg2-masks#{tag}", namespace="serve")


def test_a_killed_replica_loses_only_its_sessions(handle, loaded, reference):
    """Kill one replica: its sessions raise SessionLostError naming them (on its host directly,
    and through Serve's routing), closing them is a no-op; the other replica's sessions go on
    with the same masks, and the engine that lost its sessions opens new ones on a running
    replica."""
    import ray

    from xg2.actors.host import StepClient

    (spec, text), (spec2, text2) = CASES[0], CASES[1]
    tokens, masks = _walk(reference, loaded, spec, text)
    tokens2, masks2 = _walk(reference, loaded, spec2, text2)
    doomed, survivor = StepClient(handle, "engine-a", loaded.vocab_size), StepClient(handle, "engine-b",
                                                                                      loaded.vocab_size)
    lost_ids = [doomed.open(spec), doomed.open(spec)]
    kept = survivor.open(spec2)
    # Each binds to the replica this process bound fewest to, among those Serve's router offers:
    # on a busy machine it may offer one only (the other's queue-length probe late), so a few
    # more clients are tried before that counts as a failure.
    for attempt in range(4):
        if survivor.tag != doomed.tag:
            break
        survivor.close([kept])
        survivor = StepClient(handle, f"engine-b{attempt}", loaded.vocab_size)
        kept = survivor.open(spec2)
    if survivor.tag == doomed.tag:
        pytest.fail(f"every client bound to replica {doomed.tag}")
    assert doomed.step(lost_ids, [None, None])[1] == [True, True]
    rows, _, _ = survivor.step([kept], [tokens2[0]])
    assert np.array_equal(rows[0], masks2[1])

    ray.kill(_replica_actor(doomed.tag), no_restart=True)
    deadline = time.monotonic() + 60
    while True:                         # the replica's host goes with it (it owns the actor)
        try:
            doomed.step(lost_ids, [tokens[0], tokens[0]])
        except SessionLostError as e:
            assert sorted(e.session_ids) == sorted(lost_ids)
            break
        assert time.monotonic() < deadline, "the killed replica's host still answers"
        time.sleep(0.2)
    with pytest.raises(SessionLostError) as e:          # through Serve: routed to a running replica
        handle.step_rows.remote("engine-a", lost_ids[:1], [None]).result(timeout_s=60)
    assert e.value.session_ids == lost_ids[:1]
    with pytest.raises(SessionLostError):
        handle.fork.remote("engine-a", lost_ids[0], 1).result(timeout_s=60)
    assert doomed.close(lost_ids) == 0
    assert handle.close.remote("engine-a", lost_ids).result(timeout_s=60) == 0

    for step, t in enumerate(tokens2[1:], start=2):     # the other replica's session goes on
        rows, accepted, _ = survivor.step([kept], [t])
        assert accepted == [True] and np.array_equal(rows[0], masks2[step])
    fresh = doomed.open(spec)           # binds anew, to a running replica
    assert doomed.tag != lost_ids[0].partition(".")[0]
    assert np.array_equal(doomed.mask(fresh), masks[0])
    rows, accepted, _ = doomed.step([fresh], [tokens[0]])
    assert accepted == [True] and np.array_equal(rows[0], masks[1])
    assert doomed.close([fresh]) == 1 and survivor.close([kept]) == 1
