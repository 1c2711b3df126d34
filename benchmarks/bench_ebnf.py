"""Side-by-side benchmark of xg2, xgrammar and llguidance on the EBNF corpus.

    python benchmarks/bench_ebnf.py [--tokenizer PATH] [--engines xg2,xgrammar,llguidance]
                                    [--grammars a,b] [--repeat N] [--json OUT]

For every engine and grammar it measures

* compile ms      -- cold grammar compilation (fresh compiler / no cache);
* first mask ms   -- compile + new matcher + first ``fill_next_token_bitmask``;
* per-token mask  -- for each sample, tokenized with the HF ``tokenizers``
  library, the time of each mask fill (only the fill is timed; the sampled
  token is then accepted); mean / p50 / p99 / max in microseconds.

Every engine runs on one thread.  See benchmarks/README.md for details.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(REPO))  # `import xg2` from a source checkout

from corpus import GrammarCase, load_corpus
from engines import ALL_ENGINES, DEFAULT_TOKENIZER, Engine, Vocab, load_vocab, make_engines
from engines import percentile as _percentile

# ------------------------------------------------------------------ measuring


@dataclass
class Result:
    engine: str
    grammar: str
    compile_ms: float | None = None
    first_mask_ms: float | None = None
    mask_us: dict[str, float] = field(default_factory=dict)
    steps: int = 0
    tokens: int = 0
    errors: list[str] = field(default_factory=list)


def measure(engine: Engine, case: GrammarCase, vocab: Vocab, repeat: int) -> Result:
    res = Result(engine.name, case.name)
    compile_times, first_times = [], []
    handle = None
    for _ in range(max(1, repeat)):
        gc.collect()
        try:
            t0 = time.perf_counter_ns()
            handle = engine.compile(case.ebnf)
            t1 = time.perf_counter_ns()
            matcher = engine.new_matcher(handle)
            bitmask = engine.new_bitmask()
            engine.fill(matcher, bitmask)
            t2 = time.perf_counter_ns()
        except Exception as exc:  # noqa: BLE001
            res.errors.append(f"compile failed: {exc}")
            return res
        compile_times.append((t1 - t0) / 1e6)
        first_times.append((t2 - t0) / 1e6)
    res.compile_ms = statistics.median(compile_times)
    res.first_mask_ms = statistics.median(first_times)

    samples_us: list[float] = []
    bitmask = engine.new_bitmask()
    for idx, sample in enumerate(case.samples):
        tokens = vocab.encode(sample)
        res.tokens += len(tokens)
        matcher = engine.new_matcher(handle)
        ok = True
        for pos, tok in enumerate(tokens):
            t0 = time.perf_counter_ns()
            engine.fill(matcher, bitmask)
            samples_us.append((time.perf_counter_ns() - t0) / 1e3)
            if not engine.accept(matcher, tok):
                res.errors.append(f"sample {idx}: token {pos} (id {tok}, {vocab.hf.id_to_token(tok)!r}) rejected")
                ok = False
                break
        if ok:
            t0 = time.perf_counter_ns()
            engine.fill(matcher, bitmask)  # the mask at the end, where EOS is allowed
            samples_us.append((time.perf_counter_ns() - t0) / 1e3)
            if (not engine.is_completed(matcher) and vocab.eos_id is not None
                    and not engine.accept(matcher, vocab.eos_id)):
                res.errors.append(f"sample {idx}: not complete at the end")
    samples_us.sort()
    res.steps = len(samples_us)
    if samples_us:
        res.mask_us = {
            "mean": statistics.fmean(samples_us),
            "p50": _percentile(samples_us, 0.50),
            "p99": _percentile(samples_us, 0.99),
            "max": samples_us[-1],
        }
    return res


# ------------------------------------------------------------------ reporting


def _fmt(v: float | None, width: int, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-".rjust(width)
    return f"{v:{width}.{digits}f}"


COLS = ("comp_ms", "first_ms", "mean_us", "p50_us", "p99_us", "max_us", "err")


def print_table(results: dict[tuple[str, str], Result], engines: list[str], grammars: list[str]) -> None:
    gw = max(8, *(len(g) for g in grammars))
    cw = 9
    group = cw * len(COLS)
    print("".ljust(gw) + "".join(f" | {e:^{group}}" for e in engines))
    head = "".join(f"{c:>{cw}}" for c in COLS)
    print("grammar".ljust(gw) + "".join(f" | {head}" for _ in engines))
    print("-" * (gw + len(engines) * (group + 3)))
    for g in grammars:
        row = g.ljust(gw)
        for e in engines:
            r = results.get((e, g))
            if r is None:
                row += " | " + "".ljust(group)
                continue
            m = r.mask_us
            cells = [
                _fmt(r.compile_ms, cw, 2), _fmt(r.first_mask_ms, cw, 2),
                _fmt(m.get("mean"), cw), _fmt(m.get("p50"), cw), _fmt(m.get("p99"), cw), _fmt(m.get("max"), cw),
                f"{len(r.errors):>{cw}}",
            ]
            row += " | " + "".join(cells)
        print(row)


def _geomean(vals: list[float]) -> float:
    vals = [v for v in vals if v and v > 0 and not math.isnan(v)]
    return math.exp(statistics.fmean(math.log(v) for v in vals)) if vals else math.nan


def summarize(results: dict[tuple[str, str], Result], engines: list[str], grammars: list[str]) -> dict[str, Any]:
    metrics = {
        "compile_ms": lambda r: r.compile_ms,
        "first_mask_ms": lambda r: r.first_mask_ms,
        "mask_mean_us": lambda r: r.mask_us.get("mean"),
        "mask_p99_us": lambda r: r.mask_us.get("p99"),
    }
    summary: dict[str, Any] = {}
    for other in ("xgrammar", "llguidance"):
        if "xg2" not in engines or other not in engines:
            continue
        key = f"xg2/{other}"
        summary[key] = {}
        for mname, get in metrics.items():
            ratios = []
            for g in grammars:
                a, b = results.get(("xg2", g)), results.get((other, g))
                if a and b and get(a) and get(b):
                    ratios.append(get(a) / get(b))
            summary[key][mname] = {"geomean": _geomean(ratios), "min": min(ratios, default=math.nan),
                                   "max": max(ratios, default=math.nan)}
    return summary


def print_summary(summary: dict[str, Any], results: dict[tuple[str, str], Result]) -> None:
    print()
    errors = [(k, r.errors) for k, r in sorted(results.items()) if r.errors]
    for (eng, g), errs in errors:
        for e in errs[:3]:
            print(f"[error] {eng} / {g}: {e}")
        if len(errs) > 3:
            print(f"[error] {eng} / {g}: ... {len(errs) - 3} more")
    if not summary:
        print("summary: ratios need xg2 and xgrammar/llguidance results")
        return
    print("summary (geometric mean over grammars of the ratio; <1 means xg2 is faster):")
    for key, per_metric in summary.items():
        parts = [f"{m} {v['geomean']:.2f}x (range {v['min']:.2f}-{v['max']:.2f})" for m, v in per_metric.items()]
        print(f"  {key}: " + "; ".join(parts))


# ----------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER, help="HF tokenizer.json")
    ap.add_argument("--engines", default=",".join(ALL_ENGINES))
    ap.add_argument("--grammars", default="", help="comma-separated subset of the corpus")
    ap.add_argument("--repeat", type=int, default=3, help="cold compiles per grammar (median reported)")
    ap.add_argument("--json", type=Path, help="write all figures to this file")
    args = ap.parse_args(argv)

    cases = load_corpus([g for g in args.grammars.split(",") if g] or None)
    vocab = load_vocab(args.tokenizer)
    engines = make_engines([e for e in args.engines.split(",") if e], vocab)
    if not engines:
        print("no engine available", file=sys.stderr)
        return 1
    print(f"tokenizer: {args.tokenizer.name} (eos id {vocab.eos_id}); engines: "
          + ", ".join(f"{e.name} (vocab {e.vocab_size})" for e in engines), file=sys.stderr)

    results: dict[tuple[str, str], Result] = {}
    for case in cases:
        for eng in engines:
            res = measure(eng, case, vocab, args.repeat)
            results[(eng.name, case.name)] = res
            print(f"  {case.name:<18} {eng.name:<10} compile {_fmt(res.compile_ms, 8, 2)} ms  "
                  f"mean {_fmt(res.mask_us.get('mean'), 8)} us  errors {len(res.errors)}", file=sys.stderr)

    names = [e.name for e in engines]
    grammars = [c.name for c in cases]
    print()
    print_table(results, names, grammars)
    summary = summarize(results, names, grammars)
    print_summary(summary, results)

    if args.json:
        payload = {
            "tokenizer": str(args.tokenizer),
            "engines": names,
            "repeat": args.repeat,
            "results": [r.__dict__ for r in results.values()],
            "summary": summary,
        }
        args.json.write_text(json.dumps(payload, indent=2, default=str) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
