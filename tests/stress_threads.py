"""Many threads compiling and filling masks on one compiler, checked against a single-threaded run.

Run by tests/test_thread_safety.py in a child process (with PYTHONFAULTHANDLER set, so a crash in
the core prints every thread's stack instead of killing the test runner silently); runnable by hand:
`python tests/stress_threads.py --threads 8 --rounds 3`. Serving compiles on a pool and fills on many
threads at once, so this is the shape checked: one GrammarCompiler with a byte budget small enough
that the entry pool evicts while other threads' grammars still hold its entries, compiles of the same
grammar racing each other, fills into rows of shared bitmasks without the GIL, rollbacks, and the
cyclic garbage collector running often, from its own thread as well.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import xg2

STEPS = 40


def vocabulary() -> xg2.TokenizerInfo:
    """Every byte, JSON pieces and a few thousand pseudo-words, so entries are big enough to evict."""
    from conftest import JSON_PIECES

    rng = random.Random(7)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789_\" {}[]:,.-"
    words = {"".join(rng.choice(alphabet) for _ in range(rng.randint(2, 6))) for _ in range(3000)}
    vocab = [bytes([b]) for b in range(256)]
    vocab += [w.encode() for w in dict.fromkeys([*JSON_PIECES, *sorted(words)]) if len(w.encode()) > 1]
    vocab.append(b"</s>")
    return xg2.TokenizerInfo(vocab, xg2.VocabType.RAW, stop_token_ids=[len(vocab) - 1])


def tool(i: int) -> dict:
    rng = random.Random(i)
    props = {f"p{i}_{k}": rng.choice([{"type": "string"}, {"type": "integer", "minimum": 0},
                                       {"type": "array", "items": {"type": "number"}},
                                       {"enum": ["red", "green", f"c{i}"]}, {"type": "boolean"}])
             for k in range(rng.randint(1, 4))}
    return {"type": "object", "properties": props, "required": sorted(props)[:1]}


def workload() -> list[tuple[str, object]]:
    """Schemas, tool-calling tags over overlapping tool sets (their schemas share pool entries), EBNF
    and regexes."""
    jobs: list[tuple[str, object]] = [("schema", tool(i)) for i in range(10)]
    for k in range(8):
        tools = [(i * 3 + k) % 10 for i in range(3)]
        jobs.append(("tag", {"type": "structural_tag", "format": {
            "type": "triggered_tags", "triggers": ["<tool"],
            "tags": [{"type": "tag", "begin": f"<tool={i}>", "end": "</tool>",
                      "content": {"type": "json_schema", "json_schema": tool(i)}} for i in tools]}}))
    jobs.append(("ebnf", 'root ::= "(" expr ")"\nexpr ::= [0-9]+ | expr "+" expr | "(" expr ")"'))
    jobs.append(("regex", r"[a-z]{2,8}@[a-z]+\.(com|org|net)"))
    jobs.append(("schema", {"type": "array", "items": {"anyOf": [tool(1), tool(2), {"type": "null"}]},
                            "maxItems": 4}))
    return jobs


def compile_job(compiler: xg2.GrammarCompiler, kind: str, spec: object) -> xg2.CompiledGrammar:
    if kind == "schema":
        return compiler.compile_json_schema(json.dumps(spec))
    if kind == "tag":
        return compiler.compile_structural_tag(spec)
    if kind == "ebnf":
        return compiler.compile_grammar(spec)
    return compiler.compile_regex(spec)


def reference(info: xg2.TokenizerInfo, jobs: list) -> list[tuple[list[int], list[bytes]]]:
    """Per job: a random walk's tokens and the mask before each, from one thread on its own compiler."""
    compiler = xg2.GrammarCompiler(info)
    out = []
    for n, (kind, spec) in enumerate(jobs):
        rng = random.Random(n)
        matcher = xg2.GrammarMatcher(compile_job(compiler, kind, spec))
        bitmask = xg2.allocate_token_bitmask(1, info.vocab_size, backend="numpy")
        tokens, masks = [], []
        stop = info.stop_token_ids[0]
        while not matcher.is_terminated() and len(tokens) < STEPS:
            matcher.fill_next_token_bitmask(bitmask, 0)
            masks.append(bitmask[0].tobytes())
            bits = np.unpackbits(bitmask[0].view(np.uint8), bitorder="little")[: info.vocab_size]
            allowed = np.flatnonzero(bits)
            choices = [t for t in allowed.tolist() if t != stop] or allowed.tolist()
            token = rng.choice(choices)
            assert matcher.accept_token(token)
            tokens.append(token)
        out.append((tokens, masks))
    return out


def replay(compiler, jobs, expected, order, bitmask, row, errors) -> None:
    for n in order:
        kind, spec = jobs[n]
        tokens, masks = expected[n]
        matcher = xg2.GrammarMatcher(compile_job(compiler, kind, spec))
        for step, token in enumerate(tokens):
            matcher.fill_next_token_bitmask(bitmask, row)
            if bitmask[row].tobytes() != masks[step]:
                errors.append(f"job {n} ({kind}) step {step}: the mask differs from the single-threaded run")
                return
            if not matcher.accept_token(token):
                errors.append(f"job {n} ({kind}) step {step}: token {token} refused")
                return
            if step % 7 == 3:          # roll back and take the same token again
                matcher.rollback(1)
                matcher.fill_next_token_bitmask(bitmask, row)
                if bitmask[row].tobytes() != masks[step]:
                    errors.append(f"job {n} ({kind}) step {step}: the mask after a rollback differs")
                    return
                matcher.accept_token(token)


def run(threads: int, rounds: int, cache_limit_bytes: int, seed: int) -> int:
    info = vocabulary()
    jobs = workload()
    expected = reference(info, jobs)
    gc.set_threshold(50, 5, 5)                      # collections all the time, in every thread
    compiler = xg2.GrammarCompiler(info, cache_limit_bytes=cache_limit_bytes)
    errors: list[str] = []
    stop = threading.Event()

    def collector() -> None:
        while not stop.is_set():
            gc.collect()
            time.sleep(0.005)

    def worker(k: int) -> None:
        rng = random.Random(seed * 1000 + k)
        bitmask = xg2.allocate_token_bitmask(4, info.vocab_size, backend="numpy")
        try:
            for _ in range(rounds):
                order = list(range(len(jobs)))
                rng.shuffle(order)
                replay(compiler, jobs, expected, order, bitmask, k % 4, errors)
        except Exception as exc:       # noqa: BLE001 - every failure is reported, then the run fails
            errors.append(f"thread {k}: {type(exc).__name__}: {exc}")

    gc_thread = threading.Thread(target=collector, daemon=True)
    gc_thread.start()
    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    stop.set()
    gc_thread.join()
    stats = compiler.cache_stats()
    print(f"jobs={len(jobs)} threads={threads} rounds={rounds} pool={stats} errors={len(errors)}")
    for e in errors[:20]:
        print("ERROR", e)
    if stats["evictions"] == 0:
        print("ERROR the entry pool never evicted: the budget does not exercise eviction")
        return 1
    return 1 if errors else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cache-limit-bytes", type=int, default=300_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    return run(args.threads, args.rounds, args.cache_limit_bytes, args.seed)


if __name__ == "__main__":
    sys.exit(main())
