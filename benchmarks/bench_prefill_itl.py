"""Inter-token latency of running streams while a long prompt arrives (issue 35, point 5: chunked
prefill), on the replica's decoding loop itself (serve.engine.Engine, no Ray or Serve).

    python benchmarks/bench_prefill_itl.py [--model default] [--rounds 3] [--streams 3]
        [--prompt-tokens 2000] [--chunks default,none] [--json out.json]

A few greedy streams decode; once each has a few tokens out, a --prompt-tokens prompt arrives and
is prefilled. Its window runs from its arrival to its first token; every gap between two tokens
of a stream that overlaps the window is an inter-token latency sample. Each --chunks entry is a
`prefill_chunk` setting ("default": serve.engine.PREFILL_CHUNK; "none": the whole prompt in one
forward, as before chunking; or a number). "without" is the same streams for as many steps with
no prompt arriving: the baseline the issue compares against (p99 while a prompt arrives at most
twice the p99 without). Each round also times the prompt alone, nothing decoding, chunked by
default (serve.engine.PREFILL_CHUNK_ALONE) and in one forward. Rounds interleave the settings so the machine's drift falls on all of
them; the figures are pooled over the rounds, with each round's p99 beside them.

One engine serves every run (so its cache has grown to the long prompt before the first measured
round: a warm-up run does that, the growth's one copy is not what is measured), with
--max-batch rows as a replica has (8).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

TEXT = ("The committee met on a grey morning to review the harbour's accounts, the state of the old "
        "lighthouse, and a proposal to widen the northern road before the winter storms arrived. ")


def _percentile(xs: list[float], q: float) -> float:
    """The q-th percentile (nearest rank): with few samples, a real sample, never an interpolation."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def _tokens(tokenizer, n: int, salt: str) -> list[int]:
    text = salt + " "
    ids: list[int] = []
    while len(ids) < n:
        text += TEXT
        ids = tokenizer.encode(text)
    return ids[:n]


async def _one_run(eng, stream_prompts: list[list[int]], long_prompt: list[int] | None, *, warm: int,
                   steps: int) -> dict:
    """Streams start; after `warm` tokens each, the long prompt arrives (or, without one, `steps`
    more tokens are taken); the gaps overlapping the window and the prompt's time to first token."""
    from serve.engine import SamplingParams

    times: list[list[float]] = [[] for _ in stream_prompts]
    gens = [eng.submit(p, SamplingParams(max_tokens=100_000, temperature=0)) for p in stream_prompts]

    async def consume(k: int) -> None:
        async for _ in gens[k]:
            times[k].append(time.perf_counter())

    tasks = [asyncio.ensure_future(consume(k)) for k in range(len(gens))]
    while times and min(map(len, times)) < warm:
        await asyncio.sleep(0.002)
    start = time.perf_counter()
    ttft = None
    if long_prompt is not None:
        chunks0 = eng.counts["prefill_chunks"]
        long = eng.submit(long_prompt, SamplingParams(max_tokens=1, temperature=0))
        async for _ in long:
            ttft = time.perf_counter() - start
        end = start + ttft
        chunks = eng.counts["prefill_chunks"] - chunks0
    else:
        base = [len(t) for t in times]
        while any(len(t) < b + steps for t, b in zip(times, base)):
            await asyncio.sleep(0.002)
        end = time.perf_counter()
        chunks = 0
    for g in gens:
        g.cancel()
    await asyncio.gather(*tasks)
    gaps = [(b - a) * 1e3 for t in times for a, b in itertools.pairwise(t) if b > start and a < end]
    return {"gaps_ms": gaps, "ttft_s": ttft, "window_s": end - start, "chunks": chunks}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default", help="default (SmolLM2-135M-Instruct), tiny, or a path")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--streams", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=2000)
    ap.add_argument("--stream-prompt-tokens", type=int, default=40)
    ap.add_argument("--chunks", default="default,none",
                    help="comma-separated prefill_chunk settings: default, none, or a number")
    ap.add_argument("--warm", type=int, default=4, help="tokens per stream before the window opens")
    ap.add_argument("--without-steps", type=int, default=60, help="steps of the window without a prompt")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--no-alone", dest="alone", action="store_false",
                    help="skip the prompt's time to first token with nothing decoding")
    ap.add_argument("--deadline", type=float, default=900.0, help="no new round after this many seconds")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args(argv)

    import torch

    from serve.engine import PREFILL_CHUNK, PREFILL_CHUNK_ALONE, Engine
    from serve.model import load_model

    t0 = time.perf_counter()
    loaded = load_model(args.model, progress=True)
    settings: list[tuple[str, int | None]] = []
    for name in args.chunks.split(","):
        name = name.strip()
        value = PREFILL_CHUNK if name == "default" else None if name == "none" else int(name)
        settings.append((f"chunk {value}" + (" (default)" if name == "default" else "") if value else "one-shot",
                         value))
    eng_holder: dict = {}

    async def run_all() -> dict:
        eng = Engine(loaded.model, [], max_batch=args.max_batch, vocab_size=loaded.vocab_size)
        eng_holder["eng"] = eng
        streams = [_tokens(loaded.tokenizer, args.stream_prompt_tokens, f"Stream {k}.") for k in range(args.streams)]
        long_prompt = _tokens(loaded.tokenizer, args.prompt_tokens, "Summarise:")
        # warm-up: torch, and the cache grown to the long prompt
        await _one_run(eng, streams, long_prompt, warm=2, steps=0)
        results: dict[str, list[dict]] = {"without": []}
        results.update({name: [] for name, _ in settings})
        alone: dict[str, list[float]] = {"chunked (default)": [], "one-shot": []}
        for rnd in range(args.rounds):
            if rnd and time.perf_counter() - t0 > args.deadline:
                print(f"deadline: {rnd} rounds", flush=True)
                break
            eng.prefill_chunk = PREFILL_CHUNK
            r = await _one_run(eng, streams, None, warm=args.warm, steps=args.without_steps)
            results["without"].append(r)
            line = [f"round {rnd + 1}: without p99 {_percentile(r['gaps_ms'], 99):.0f} ms"]
            for name, value in settings:
                eng.prefill_chunk = value
                eng.prefill_chunk_alone = PREFILL_CHUNK_ALONE if value else None
                r = await _one_run(eng, streams, long_prompt, warm=args.warm, steps=0)
                results[name].append(r)
                line.append(f"{name} p99 {_percentile(r['gaps_ms'], 99):.0f} ms, TTFT {r['ttft_s']:.2f} s")
            if args.alone:
                for name, value in (("chunked (default)", PREFILL_CHUNK_ALONE), ("one-shot", None)):
                    eng.prefill_chunk, eng.prefill_chunk_alone = (PREFILL_CHUNK if value else None), value
                    alone[name].append((await _one_run(eng, [], long_prompt, warm=0, steps=0))["ttft_s"])
                line.append("alone TTFT " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in alone.items()))
            print("; ".join(line), flush=True)
        results["alone"] = alone
        await eng.close()
        return results

    results = asyncio.run(run_all())
    alone = results.pop("alone")
    eng = eng_holder["eng"]
    summary: dict = {"model": args.model, "streams": args.streams, "prompt_tokens": args.prompt_tokens,
                     "stream_prompt_tokens": args.stream_prompt_tokens, "max_batch": args.max_batch,
                     "torch_threads": torch.get_num_threads(), "default_chunk": PREFILL_CHUNK,
                     "rounds": len(results["without"]), "settings": {}}
    base = _percentile([g for r in results["without"] for g in r["gaps_ms"]], 99)
    print(f"\n{args.streams} streams, a {args.prompt_tokens}-token prompt arriving; inter-token gaps pooled "
          f"over {summary['rounds']} rounds (ms)")
    print(f"{'':24} {'n':>5} {'p50':>7} {'p99':>7} {'max':>7} {'p99/without':>12} {'TTFT s':>8} "
          f"{'chunks':>7}  p99 per round")
    for name, runs in results.items():
        gaps = [g for r in runs for g in r["gaps_ms"]]
        ttfts = [r["ttft_s"] for r in runs if r["ttft_s"] is not None]
        row = {"samples": len(gaps), "p50_ms": _percentile(gaps, 50), "p99_ms": _percentile(gaps, 99),
               "max_ms": max(gaps) if gaps else float("nan"),
               "p99_per_round_ms": [_percentile(r["gaps_ms"], 99) for r in runs],
               "ttft_s": statistics.median(ttfts) if ttfts else None, "ttft_per_round_s": ttfts,
               "chunks": runs[0]["chunks"] if runs else 0}
        row["p99_over_without"] = row["p99_ms"] / base if base else float("nan")
        summary["settings"][name] = row
        ttft = f"{row['ttft_s']:8.2f}" if row["ttft_s"] is not None else f"{'':8}"
        print(f"{name:24} {row['samples']:5d} {row['p50_ms']:7.0f} {row['p99_ms']:7.0f} {row['max_ms']:7.0f} "
              f"{row['p99_over_without']:12.2f} {ttft} {row['chunks']:7d}  "
              + " ".join(f"{x:.0f}" for x in row["p99_per_round_ms"]))
    if args.alone:
        summary["alone_ttft_s"] = {k: {"median": statistics.median(v), "per_round": v} for k, v in alone.items() if v}
        print("the prompt alone (nothing decoding), TTFT median: "
              + ", ".join(f"{k} {statistics.median(v):.2f} s" for k, v in alone.items() if v))
    summary["steps"] = eng.exposed_mask_ms()
    summary["elapsed_s"] = time.perf_counter() - t0
    print(f"({summary['elapsed_s']:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
