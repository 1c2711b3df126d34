"""Long strings: `{"type": "string", "maxLength": N}` inside an object, xg2 only.

    python benchmarks/bench_long_strings.py [--lengths 64,1024,65536]

Per N: compile time the first time the process sees that bound, compile time of another schema
with the same bound (the string's automata memoised), the first mask, then one text of
min(N, 2000) - 5 characters (words, escapes, CJK; seeded) walked token by token (DeepSeek-V3
tokens), timing every mask: once through the first grammar (cold: every mask entry is built on
first visit, no precompute budget) and once through the second (warm: its entries come from the
compiler's cross-grammar cache).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.append(str(HERE.parent))

import xg2

TOKENIZER = HERE.parent.parent / "shared" / "tokenizers" / "deepseek_v3_tokenizer.json"
WORDS = ['the', 'quick', 'brown', 'fox', 'jumps', 'over', 'a', 'lazy', 'dog', 'while', '42', 'numbers,', 'commas', 'and', '\\"quotes\\"', 'appear;', 'ünïcode', '中文', 'too']


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="64,1024,65536")
    args = ap.parse_args()
    from tokenizers import Tokenizer

    info = xg2.TokenizerInfo.from_huggingface(str(TOKENIZER))
    tok = Tokenizer.from_file(str(TOKENIZER))
    bitmask = xg2.allocate_token_bitmask(1, info.vocab_size)
    rng = random.Random(0)
    xg2.GrammarCompiler(info).compile_json_schema({"type": "string"})   # warm the process, not the bounds
    print("| maxLength | compile ms (first) | compile ms (same bound again) | first mask ms | tokens |"
          " cold mask mean / p50 / p99 µs | warm mask mean / p50 / p99 µs |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n in (int(x) for x in args.lengths.split(",")):
        def schema(name: str, n: int = n) -> dict:
            return {"type": "object", "properties": {name: {"type": "string", "maxLength": n}}, "required": [name]}

        compiler = xg2.GrammarCompiler(info, precompute_budget_ms=0)
        t0 = time.perf_counter()
        compiled = compiler.compile_json_schema(schema("text"))
        t1 = time.perf_counter()
        matcher = xg2.GrammarMatcher(compiled)
        matcher.fill_next_token_bitmask(bitmask)
        t2 = time.perf_counter()
        again = compiler.compile_json_schema(schema("other"))
        t3 = time.perf_counter()
        body = ""
        while len(body) < min(n, 2000) - 5:
            body += rng.choice(WORDS) + " "
        body = body[: min(n, 2000) - 5]
        cold = walk(xg2.GrammarMatcher(compiled), tok.encode('{"text": "' + body + '"}', add_special_tokens=False).ids,
                    bitmask)
        warm = walk(xg2.GrammarMatcher(again), tok.encode('{"other": "' + body + '"}', add_special_tokens=False).ids,
                    bitmask)
        print(f"| {n} | {(t1 - t0) * 1e3:.1f} | {(t3 - t2) * 1e3:.1f} | {(t2 - t1) * 1e3:.2f} | {len(cold)} |"
              f" {stats(cold)} | {stats(warm)} |")


def walk(matcher, ids: list[int], bitmask) -> list[float]:
    """Per-token mask times (µs) along `ids`."""
    times = []
    for t in ids:
        a = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask)
        times.append((time.perf_counter() - a) * 1e6)
        if not matcher.accept_token(t):
            raise SystemExit(f"token {t} rejected")
    return sorted(times)


def stats(times: list[float]) -> str:
    return f"{np.mean(times):.0f} / {times[len(times) // 2]:.0f} / {times[int(0.99 * len(times))]:.0f}"


if __name__ == "__main__":
    main()
