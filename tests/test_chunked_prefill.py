"""Chunked prefill (issue 35, point 5), on the tiny model: a prompt run in chunks, alone or in
the same forward as other rows' decoding steps, leaves the cache and the logits a one-shot
prefill would (so greedy outputs are the same), also while the cache grows and rows move; the
running streams get a step between any two chunks; a request cancelled, gone or failing
mid-prompt frees its row and changes nothing for the others."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from serve.engine import PREFILL_CHUNK, PREFILL_CHUNK_ALONE, Engine, GenerationError, SamplingParams
from serve.slots import SlotModel

GREEDY = SamplingParams(max_tokens=8, temperature=0)


def _prompt(loaded, n: int, salt: int = 0) -> list[int]:
    """n token ids of ordinary text (different texts for different salts)."""
    words = " ".join(f"word{salt}_{i}" for i in range(n))
    ids = loaded.tokenizer.encode(words)
    assert len(ids) >= n
    return ids[:n]


def _reference(loaded, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return loaded.model(torch.tensor([ids])).logits[0, -1]


# -- the cache: serve/slots.py -----------------------------------------------------------------------

@pytest.mark.parametrize("n", [5, 16, 64])         # shorter than, equal to, four times a chunk of 16
def test_a_prompt_prefilled_in_chunks_gives_the_one_shot_logits(loaded, n):
    ids = _prompt(loaded, n)
    whole = SlotModel(loaded.model, max_rows=2, initial_len=8)
    chunked = SlotModel(loaded.model, max_rows=2, initial_len=8)     # grows while the prompt goes in
    with torch.inference_mode():
        want = whole.prefill(1, ids)
        for start in range(0, n, 16):
            got = chunked.prefill(1, ids[start:start + 16])
    assert chunked.lengths == whole.lengths == [0, n]
    assert torch.allclose(got, want, atol=1e-5)
    assert torch.allclose(got, _reference(loaded, ids), atol=1e-4)
    assert torch.allclose(chunked.k[:, 1, :, :n], whole.k[:, 1, :, :n], atol=1e-5)
    assert torch.allclose(chunked.v[:, 1, :, :n], whole.v[:, 1, :, :n], atol=1e-5)
    # and the sequence goes on the same: greedy tokens identical
    with torch.inference_mode():
        chunked.move(1, 0)
        whole.move(1, 0)
        a, b = int(got.argmax()), int(want.argmax())
        for _ in range(5):
            assert a == b
            a, b = int(chunked.decode([a])[0].argmax()), int(whole.decode([b])[0].argmax())


def test_chunks_beside_decoding_rows_leave_every_row_right_while_the_cache_grows(loaded):
    """Two rows decode while a 50-token prompt goes into row 2 in chunks of 7 in the same
    forwards; the cache starts at 8 positions and grows (by copying) several times on the way.
    Every decoded row's logits and the prompt's last logits are transformers' own."""
    lm = SlotModel(loaded.model, max_rows=4, initial_len=8)
    seqs = [_prompt(loaded, 6, salt=1), _prompt(loaded, 3, salt=2)]
    prompt = _prompt(loaded, 50, salt=3)
    with torch.inference_mode():
        for row, ids in enumerate(seqs):
            lm.prefill(row, ids)
        for start in range(0, len(prompt), 7):
            nxt = [int(_reference(loaded, s).argmax()) for s in seqs]
            logits = lm.forward(nxt, 2, prompt[start:start + 7])
            assert logits.shape[0] == 3
            for r, s in enumerate(seqs):
                s.append(nxt[r])
                assert torch.allclose(logits[r], _reference(loaded, s), atol=1e-4), (start, r)
            assert torch.allclose(logits[2], _reference(loaded, prompt[:start + 7]), atol=1e-4), start
            assert lm.lengths[:3] == [len(seqs[0]), len(seqs[1]), min(start + 7, len(prompt))]
        assert lm.capacity >= 64
        # the prompt's row joins the decoding ones
        seqs.append(prompt)
        nxt = [int(_reference(loaded, s).argmax()) for s in seqs]
        logits = lm.decode(nxt)
        for r, s in enumerate(seqs):
            s.append(nxt[r])
            assert torch.allclose(logits[r], _reference(loaded, s), atol=1e-4), r


def test_a_failed_forward_leaves_the_rows_as_they_were(loaded):
    """A forward that raises (here: a token id past the vocabulary in the prompt chunk) moves no
    row's length: the decoded rows step again as if it had never run."""
    lm = SlotModel(loaded.model, max_rows=3, initial_len=8)
    seq = _prompt(loaded, 5)
    with torch.inference_mode():
        lm.prefill(0, seq)
        lm.prefill(1, [1, 2, 3])
        before = list(lm.lengths)
        with pytest.raises(IndexError):
            lm.forward([7], 1, [10 ** 9])
        assert lm.lengths == before
        logits = lm.decode([7])
    assert torch.allclose(logits[0], _reference(loaded, [*seq, 7]), atol=1e-4)


# -- the decoding loop: serve/engine.py -------------------------------------------------------------

async def _drain(gen) -> list[int]:
    return [t async for t in gen]


def _record_forwards(eng: Engine, delay: float = 0.0) -> list[tuple[int, int, int]]:
    """(decoded rows, prompt tokens, prompt row) of every forward the engine runs; each forward
    with prompt tokens in it takes `delay` seconds more."""
    calls: list[tuple[int, int, int]] = []
    real = eng.lm.forward

    def forward(tokens, row=-1, ids=()):
        calls.append((len(tokens), len(ids), row))
        if ids and delay:
            time.sleep(delay)
        return real(tokens, row, ids)

    eng.lm.forward = forward
    return calls


def _check_forwards(eng: Engine, loaded) -> list[str]:
    """Compare every logits row the engine's forwards give with transformers' for the same tokens
    (each active row's prompt and the tokens fed to it so far; a prompt's last chunk's row with
    the prompt): the mismatches found. (Outputs alone would miss some mistakes on the tiny
    model: its random attention is all but uniform, so its tokens hardly depend on positions.)"""
    bad: list[str] = []
    fed: dict[int, list[int]] = {}
    real = eng.lm.forward

    def forward(tokens, row=-1, ids=()):
        # on the forward thread, while the loop awaits it: the active list is the step's
        active = list(eng._active)
        head = eng._pending[0] if ids else None
        logits = real(tokens, row, ids)
        for k, (g, t) in enumerate(zip(active, tokens)):
            seq = fed.setdefault(id(g), list(g.prompt))
            seq.append(t)
            if not torch.allclose(logits[k], _reference(loaded, seq), atol=1e-4):
                bad.append(f"row {k} after {len(seq)} tokens")
        last = head is not None and head.prefilled + len(ids) == len(head.prompt)
        if last and not torch.allclose(logits[-1], _reference(loaded, head.prompt), atol=1e-4):
            bad.append(f"the prompt of {len(head.prompt)} tokens")
        return logits

    eng.lm.forward = forward
    return bad


def _solo(loaded, prompt: list[int], params: SamplingParams = GREEDY) -> list[int]:
    """The request's tokens alone on an engine, its prompt in one forward (as before chunking)."""
    async def run():
        eng = Engine(loaded.model, [], max_batch=1, vocab_size=loaded.vocab_size, prefill_chunk=None,
                     prefill_chunk_alone=None)
        tokens = await _drain(eng.submit(prompt, params))
        await eng.close()
        return tokens

    return asyncio.run(run())


def test_chunks_are_small_beside_decoding_rows_and_bigger_alone(loaded):
    """Chunked by default; a prompt with nothing decoding beside it goes in by bigger chunks (no
    stream waits on it), one arriving while another decodes by small ones."""
    eng = Engine(loaded.model, [], max_batch=2, vocab_size=loaded.vocab_size)
    assert eng.prefill_chunk == PREFILL_CHUNK and 1 <= PREFILL_CHUNK <= PREFILL_CHUNK_ALONE < 4096
    assert eng.prefill_chunk_alone == PREFILL_CHUNK_ALONE
    for bad in ({"prefill_chunk": 0}, {"prefill_chunk_alone": 0}):
        with pytest.raises(ValueError):
            Engine(loaded.model, [], max_batch=2, vocab_size=loaded.vocab_size, **bad)

    async def run():
        eng = Engine(loaded.model, [], max_batch=2, vocab_size=loaded.vocab_size, prefill_chunk=4,
                     prefill_chunk_alone=16)
        calls = _record_forwards(eng)
        a = eng.submit(_prompt(loaded, 40, salt=1), SamplingParams(max_tokens=30, temperature=0))
        tokens_a = a.__aiter__()
        await tokens_a.__anext__()
        b = eng.submit(_prompt(loaded, 10, salt=2), GREEDY)
        await asyncio.gather(_drain(b), _drain(tokens_a))
        await eng.close()
        return calls

    calls = asyncio.run(run())
    assert [(rows, n) for rows, n, _ in calls if n] == [(0, 16), (0, 16), (0, 8), (1, 4), (1, 4), (1, 2)]


@pytest.mark.parametrize("chunk", [1, 5, 16, None])
def test_requests_arriving_together_give_their_solo_tokens_in_arrival_order(loaded, chunk):
    """Five prompts of 3 to 40 tokens arrive at once on three rows: each is prefilled in chunks
    (one request's chunk per step, first come first served) and its tokens, greedy or seeded
    (which a small change of the logits would change), are the ones it gets alone with a one-shot
    prefill; none is overtaken by a later one."""
    prompts = [_prompt(loaded, n, salt=n) for n in (40, 3, 16, 17, 33)]
    params = [GREEDY if k % 2 else SamplingParams(max_tokens=8, temperature=1.0, seed=k) for k in range(5)]
    want = [_solo(loaded, p, ps) for p, ps in zip(prompts, params)]

    async def run():
        eng = Engine(loaded.model, [], max_batch=3, vocab_size=loaded.vocab_size, prefill_chunk=chunk,
                     prefill_chunk_alone=chunk)
        bad = _check_forwards(eng, loaded)
        calls = _record_forwards(eng)
        gens = [eng.submit(p, ps) for p, ps in zip(prompts, params)]
        got = await asyncio.gather(*map(_drain, gens))
        await eng.close()
        return gens, got, calls, bad

    gens, got, calls, bad = asyncio.run(run())
    assert not bad
    assert got == want
    firsts = [g.first_token_s + g.submitted for g in gens[:3]]      # the first three had rows at once
    assert firsts == sorted(firsts)
    size = chunk or 40
    assert all(n <= size for _, n, _ in calls)
    assert sum(n for _, n, _ in calls) == sum(map(len, prompts))


def test_running_streams_get_a_step_between_any_two_chunks(loaded):
    """A stream decodes while a 60-token prompt arrives (chunks of 8): every chunk rides in a
    forward with the stream's step, and the stream's tokens keep coming while the prompt goes
    in; a request that arrives behind the long prompt waits for it (first come, first served)."""
    running, long, short = _prompt(loaded, 4, salt=1), _prompt(loaded, 60, salt=2), _prompt(loaded, 3, salt=3)

    async def run():
        eng = Engine(loaded.model, [], max_batch=4, vocab_size=loaded.vocab_size, prefill_chunk=8)
        calls = _record_forwards(eng, delay=0.01)
        a = eng.submit(running, SamplingParams(max_tokens=60, temperature=0))
        tokens_a = a.__aiter__()
        seen = [await tokens_a.__anext__()]
        b = eng.submit(long, GREEDY)
        c = eng.submit(short, GREEDY)
        task_b = asyncio.ensure_future(_drain(b))
        while b.first_token_s is None:
            seen.append(await tokens_a.__anext__())
        during = len(seen) - 1
        seen += [t async for t in tokens_a]
        got_b, got_c = await task_b, await _drain(c)
        await eng.close()
        return calls, during, seen, got_b, got_c, b, c

    calls, during, seen, got_b, got_c, b, c = asyncio.run(run())
    long_calls = [(rows, n) for rows, n, _ in calls if n and n != len(short)][1:]     # after A's own prompt
    assert [n for _, n in long_calls] == [8] * 7 + [4]
    assert all(rows == 1 for rows, _ in long_calls)     # A decoded in the same forward as each chunk
    assert during >= len(long_calls) - 1                # A's tokens came out while the prompt went in
    assert seen == _solo(loaded, running, SamplingParams(max_tokens=60, temperature=0))
    assert got_b == _solo(loaded, long) and got_c == _solo(loaded, short)
    assert b.first_token_s + b.submitted <= c.first_token_s + c.submitted


def test_a_prompt_row_moves_when_running_requests_end_mid_prompt(loaded):
    """Two short requests decode while a long prompt is prefilled in the row after theirs; the
    first one ends mid-prompt, the rows are packed, and the prompt's row moves with its chunks
    so far: its output is still its solo greedy output."""
    p1, p2, long = _prompt(loaded, 3, salt=1), _prompt(loaded, 5, salt=2), _prompt(loaded, 48, salt=3)
    moves: list[tuple[int, int]] = []

    async def run():
        eng = Engine(loaded.model, [], max_batch=3, vocab_size=loaded.vocab_size, prefill_chunk=6)
        real = eng.lm.move
        eng.lm.move = lambda src, dst: (moves.append((src, dst)), real(src, dst))[1]
        a = eng.submit(p1, SamplingParams(max_tokens=6, temperature=0))
        c = eng.submit(p2, SamplingParams(max_tokens=30, temperature=0))
        first_c = c.__aiter__()
        head = [await first_c.__anext__()]
        b = eng.submit(long, GREEDY)
        got = await asyncio.gather(_drain(a), _drain(b), _drain(first_c))
        idle = eng.idle()
        await eng.close()
        return got[0], got[1], head + got[2], idle

    got_a, got_b, got_c, idle = asyncio.run(run())
    assert (2, 1) in moves                  # the prompt's row followed the active ones down
    assert got_a == _solo(loaded, p1, SamplingParams(max_tokens=6, temperature=0))
    assert got_c == _solo(loaded, p2, SamplingParams(max_tokens=30, temperature=0))
    assert got_b == _solo(loaded, long)
    assert idle


@pytest.mark.parametrize("how", ["cancelled", "session closed", "prefill error"])
def test_a_request_ending_mid_prompt_frees_its_row_and_touches_no_other(loaded, runtime, how):
    """B's 80-token prompt goes in by chunks of 8 beside A's steps; midway B is cancelled (its
    client went), its grammar session is closed under it, or its next chunk's forward fails.
    B ends alone (cancelled, or a GenerationError); A's tokens are its solo tokens; B's row is
    given back and the engine serves the next request in it."""
    pa, pb, pc = _prompt(loaded, 4, salt=1), _prompt(loaded, 80, salt=2), _prompt(loaded, 6, salt=3)
    params_a = SamplingParams(max_tokens=40, temperature=0)

    async def run():
        eng = Engine(loaded.model, [], runtime=runtime, max_batch=2, vocab_size=loaded.vocab_size,
                     prefill_chunk=8)
        calls = _record_forwards(eng, delay=0.02)
        if how == "prefill error":
            real = eng.lm.forward

            def failing(tokens, row=-1, ids=()):
                if sum(n for _, n, _ in calls if n > 4) >= 32 and len(ids) == 8:
                    raise RuntimeError("out of memory (injected)")
                return real(tokens, row, ids)

            eng.lm.forward = failing
        session = await runtime.open({"grammar": {"type": "regex", "pattern": "[a-z ]+"}})
        a = eng.submit(pa, params_a)
        task_a = asyncio.ensure_future(_drain(a))
        b = eng.submit(pb, GREEDY, session)
        error = None
        try:
            if how == "prefill error":
                await _drain(b)
            else:
                while sum(n for _, n, _ in calls if n > 4) < 24:        # three chunks of B in
                    await asyncio.sleep(0.005)
                if how == "cancelled":
                    b.cancel()
                runtime.close(session)
                await _drain(b)
        except GenerationError as e:
            error = e
        runtime.close(session)
        # B's row (1) was given back while A still decodes in row 0
        held = list(eng.lm.lengths), [g is a for g in eng._active], len(eng._pending)
        got_a = await task_a
        c = eng.submit(pc, GREEDY)
        got_c = await _drain(c)
        await eng.close()
        return b, error, got_a, got_c, held, calls

    b, error, got_a, got_c, (lengths, active, pending), calls = asyncio.run(run())
    b_tokens = sum(n for _, n, _ in calls if n > 6)
    assert 16 <= b_tokens < len(pb)          # B stopped midway
    if how == "cancelled":
        assert b.finish_reason == "cancelled" and error is None
    else:
        assert b.finish_reason == "error" and isinstance(error, GenerationError), error
    assert b.completion_tokens == 0
    assert got_a == _solo(loaded, pa, params_a)
    assert got_c == _solo(loaded, pc)
    assert lengths[1] == 0 and active == [True] and pending == 0


def test_a_prompt_with_a_bad_token_fails_alone_beside_running_streams(loaded):
    """A real prefill error (a token id past the vocabulary) in a forward shared with a running
    stream: that request fails with a GenerationError, the stream is not touched."""
    pa = _prompt(loaded, 4, salt=1)
    params = SamplingParams(max_tokens=20, temperature=0)

    async def run():
        eng = Engine(loaded.model, [], max_batch=2, vocab_size=loaded.vocab_size, prefill_chunk=4)
        a = eng.submit(pa, params)
        first = a.__aiter__()
        head = [await first.__anext__()]
        b = eng.submit([5, 6, 7, 8, 9, 10 ** 9], GREEDY)
        try:
            await _drain(b)
            error = None
        except GenerationError as e:
            error = e
        rest = [t async for t in first]
        await eng.close()
        return head + rest, error, b

    got_a, error, b = asyncio.run(run())
    assert error is not None and "prefill failed" in str(error) and b.finish_reason == "error"
    assert got_a == _solo(loaded, pa, params)
