"""The replica's decoding loop (serve.engine) and its row-per-sequence cache (serve.slots), in
process on the tiny model: the same logits and tokens as transformers, rows moved and the cache
grown while other sequences decode, constrained outputs always inside their grammar."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import torch

from serve.engine import Engine, SamplingParams
from serve.slots import SlotModel

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
          "required": ["ok", "n"], "additionalProperties": False}


def test_slot_forward_gives_transformers_logits_while_rows_move_and_grow(loaded):
    lm = SlotModel(loaded.model, max_rows=3, initial_len=8)       # grows past 8 during the test
    seqs = [loaded.tokenizer.encode(t) for t in ("Hello there, my friend", "One two", "A much longer prompt " * 3)]
    with torch.inference_mode():
        for row, ids in enumerate(seqs):
            lm.prefill(row, ids)
        for step in range(6):
            if step == 3:               # the middle sequence ends: the last row moves into its place
                lm.move(2, 1)
                seqs = [seqs[0], seqs[2]]
            nxt = [int(loaded.model(torch.tensor([s])).logits[0, -1].argmax()) for s in seqs]
            logits = lm.decode(nxt)
            for r, s in enumerate(seqs):
                s.append(nxt[r])
                want = loaded.model(torch.tensor([s])).logits[0, -1]
                assert torch.allclose(logits[r], want, atol=1e-4), (step, r)
    assert lm.capacity > 8


def test_greedy_generation_is_transformers_greedy(loaded):
    prompt = loaded.tokenizer.encode("The weather today")

    async def run():
        eng = Engine(loaded.model, [], max_batch=2, vocab_size=loaded.vocab_size)
        tokens = [t async for t in eng.submit(prompt, SamplingParams(max_tokens=10, temperature=0))]
        await eng.close()
        return tokens

    want = loaded.model.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False, min_new_tokens=10,
                                 eos_token_id=None)[0, len(prompt):].tolist()
    assert asyncio.run(run()) == want


def test_constrained_batch_with_arrivals_cancels_and_seeds(loaded, runtime):
    """Eight constrained and two free requests with different lengths (rows come and go), one
    cancelled midway: every finished output validates, every cut one is a prefix the grammar
    accepts, and a seed gives the same tokens whatever the batch."""
    prompt = loaded.tokenizer.encode(loaded.chat_format.render([{"role": "user", "content": "JSON please"}]))
    grammar = {"grammar": {"type": "json_schema", "schema": SCHEMA, "any_whitespace": False}}

    async def one(eng, seed, max_tokens, constrained=True, cancel_after=None):
        session = await runtime.open(grammar) if constrained else None
        gen = eng.submit(prompt, SamplingParams(max_tokens=max_tokens, seed=seed), session)
        out = []
        async for t in gen:
            out.append(t)
            if cancel_after is not None and len(out) == cancel_after:
                gen.cancel()
                break
        if session is not None:
            runtime.close(session)
        return gen.finish_reason if cancel_after is None else "cancelled", out

    async def run():
        eng = Engine(loaded.model, loaded.eos_token_ids, runtime=runtime, max_batch=4, vocab_size=loaded.vocab_size)
        jobs = [one(eng, s, 10 + 7 * s) for s in range(8)] + [one(eng, 99, 12, False), one(eng, 5, 40, True, 3)]
        results = await asyncio.gather(*jobs)
        alone = await one(eng, 3, 10 + 7 * 3)
        stats = eng.exposed_mask_ms()
        await eng.close()
        return results, alone, stats

    results, alone, stats = asyncio.run(run())
    finished = 0
    for finish, tokens in results[:8]:
        text = loaded.tokenizer.decode(tokens)
        if finish == "stop":
            jsonschema.validate(json.loads(text), SCHEMA)
            finished += 1
        else:
            assert finish == "length"
            session = asyncio.run(runtime.open(grammar))
            assert session.matcher.accept_string(text), text
            runtime.close(session)
    assert finished >= 2
    assert results[8][0] == "length" and len(results[8][1]) == 12
    assert results[9][0] == "cancelled" and len(results[9][1]) == 3
    assert alone == results[3]              # the same seed alone gives the same tokens
    assert stats["steps"] > 0 and stats["mask_exposed_ms"] >= 0
