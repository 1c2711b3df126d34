"""The README's main job: constrain bundled grammars over a real vocabulary and report speed.

    python -m xg2.demo [--tokenizer PATH]

By default it reads the DeepSeek-V3 tokenizer from ../shared/tokenizers beside the checkout.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import xg2

DEFAULT_TOKENIZER = Path(__file__).resolve().parents[2] / "shared" / "tokenizers" / "deepseek_v3_tokenizer.json"

TOOL_CALL_EBNF = r'''
root ::= "<tool_call>" ws "{" ws "\"name\"" ws ":" ws name ws "," ws "\"arguments\"" ws ":" ws args ws "}" ws "</tool_call>"
name ::= "\"get_weather\"" | "\"search\""
args ::= "{" ws (pair (ws "," ws pair)*)? ws "}"
pair ::= "\"" [a-z_]+ "\"" ws ":" ws value
value ::= "\"" [^"\\\x00-\x1f]* "\"" | "-"? [0-9]+ ("." [0-9]+)? | "true" | "false"
ws ::= [ \n]*
'''

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city"]}}}
#: (name, how to compile, a text the model writes)
JOBS = [
    ("builtin JSON", lambda c: c.compile_builtin_json_grammar(),
     '{"city": "Paris", "days": [1, 2, 3], "metric": true, "note": "bring an umbrella"}'),
    ("tool call (EBNF)", lambda c: c.compile_grammar(TOOL_CALL_EBNF),
     '<tool_call> {"name": "get_weather", "arguments": {"city": "Zürich", "days": 3}} </tool_call>'),
    ("reasoning and a tool call (DeepSeek-V3.1's format)",
     lambda c: c.compile_structural_tag(xg2.get_model_structural_tag("deepseek_v3_1", [WEATHER])),
     ("The user asks about Zürich; I will look it up.</think>Let me check."
      '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Zürich", "days": 3}'
      "<｜tool▁call▁end｜><｜tool▁calls▁end｜>")),
]


def run(tokenizer_path: Path) -> None:
    from tokenizers import Tokenizer

    t0 = time.perf_counter()
    info = xg2.TokenizerInfo.from_huggingface(str(tokenizer_path))
    compiler = xg2.GrammarCompiler(info, max_threads=1)
    tok = Tokenizer.from_file(str(tokenizer_path))
    print(f"vocabulary {tokenizer_path.name}: {info.vocab_size} tokens, {info.vocab_type.name}, "
          f"ready in {(time.perf_counter() - t0) * 1e3:.0f} ms")
    bitmask = xg2.allocate_token_bitmask(1, info.vocab_size, backend="numpy")
    for name, compile_, text in JOBS:
        t0 = time.perf_counter()
        compiled = compile_(compiler)
        matcher = xg2.GrammarMatcher(compiled)
        matcher.fill_next_token_bitmask(bitmask)
        first = time.perf_counter() - t0
        ids = tok.encode(text, add_special_tokens=False).ids
        times, counts = [], []
        for t in ids:
            s = time.perf_counter()
            matcher.fill_next_token_bitmask(bitmask)
            times.append(time.perf_counter() - s)
            allowed = np.unpackbits(bitmask[0].view(np.uint8), bitorder="little")[: info.vocab_size]
            counts.append(int(allowed.sum()))
            if not allowed[t] or not matcher.accept_token(t):
                raise SystemExit(f"{name}: token {t} was not allowed")
        us = np.array(times) * 1e6
        print(f"\n[{name}] {len(ids)} tokens, completed={matcher.is_completed()}")
        print(f"  time to first mask {first * 1e3:.2f} ms; per-token mask mean {us.mean():.1f} us, "
              f"p50 {np.median(us):.1f} us, p99 {np.percentile(us, 99):.1f} us, max {us.max():.1f} us")
        for i in (0, 1, len(ids) // 2, len(ids) - 1):
            print(f"  step {i:3d}: {counts[i]:6d} tokens allowed, chose {tok.decode([ids[i]])!r}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER, help="HF tokenizer.json")
    args = ap.parse_args(argv)
    if not args.tokenizer.exists():
        raise SystemExit(f"tokenizer not found: {args.tokenizer} (pass --tokenizer PATH to a tokenizer.json)")
    run(args.tokenizer)


if __name__ == "__main__":
    main()
