"""Do fills wait for background work? Per-token fill means with default options against
`background_precompute=False`, one compiler, grammars compiled one after another.

    python benchmarks/bench_fill_isolation.py [--rounds 3] [--prefill-ms 40] [--schemas 60]
                                              [--tokenizer PATH] [--json OUT]

For each corpus (the EBNF grammars of benchmarks/grammars with their samples; JSONSchemaBench
schemas with their valid test documents, members in schema order) and each configuration, one
compiler compiles every grammar in turn; after each compile the samples are replayed token by
token and only `fill_next_token_bitmask` is timed (a refused token ends that sample, the same in
both configurations). Three figures per grammar:

* `own`: the grammar's fills after a gap of `--prefill-ms` following its compile. That gap is
  the model's prefill, which the background precompute is designed to overlap (its budget is the
  same 40 ms); `--prefill-ms 0` shows the fills that start while it still runs.
* `beside`: the previous grammar's fills (its entries built by now) replayed while this grammar's
  background precompute runs: the measure of one grammar's work reaching another's fills.
* the same `beside` replay with `background_precompute=False`, where nothing runs beside it.

Configurations alternate round by round (`--rounds`), and each figure is the median over rounds
of the per-grammar mean, so a noisy spell of the machine hits both.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))

from corpus import load_corpus
from engines import DEFAULT_TOKENIZER, load_vocab

DATA_DIR = HERE.parent.parent / "shared" / "data" / "jsonschemabench"
SUBSETS = ["Github_easy", "Github_medium", "Glaiveai2K", "JsonSchemaStore", "Kubernetes", "Snowplow"]
CONFIGS = {"defaults": {}, "no_background": {"background_precompute": False}}


def ebnf_cases(vocab: Any) -> list[dict]:
    return [{"name": c.name, "kind": "ebnf", "source": c.ebnf, "samples": [vocab.encode(s) for s in c.samples]}
            for c in load_corpus()]


def schema_cases(vocab: Any, per_subset: int) -> list[dict]:
    from bench_jsonschema import load_records, schema_order

    out = []
    for rec in load_records(DATA_DIR, SUBSETS, None, None):
        docs = [t["data"] for t in rec.get("tests", []) if t.get("valid")]
        if not docs or sum(c["name"].startswith(rec["subset"] + "/") for c in out) >= per_subset:
            continue
        texts = [json.dumps(schema_order(d, [rec["schema"]], rec["schema"]), ensure_ascii=False) for d in docs[:3]]
        out.append({"name": rec["id"], "kind": "json", "source": rec["schema"],
                    "samples": [vocab.encode(t) for t in texts]})
    return out


def replay(xg2: Any, compiled: Any, samples: list[list[int]], bitmask: Any) -> list[float]:
    """Seconds of each fill over the samples."""
    out = []
    for tokens in samples:
        m = xg2.GrammarMatcher(compiled)
        for t in tokens:
            t0 = time.perf_counter()
            m.fill_next_token_bitmask(bitmask, 0)
            out.append(time.perf_counter() - t0)
            if not m.accept_token(t):
                break
    return out


def run_config(xg2: Any, info: Any, cases: list[dict], options: dict, prefill_s: float) -> dict[str, dict]:
    compiler = xg2.GrammarCompiler(info, **options)
    bitmask = xg2.allocate_token_bitmask(1, info.vocab_size)
    out: dict[str, dict] = {}
    previous = None
    for case in cases:
        try:
            if case["kind"] == "ebnf":
                compiled = compiler.compile_grammar(case["source"])
            else:
                compiled = compiler.compile_json_schema(case["source"], any_whitespace=True, strict_mode=False)
        except xg2.XG2Error as e:
            out[case["name"]] = {"error": f"{type(e).__name__}: {e}"}
            continue
        beside = replay(xg2, previous[0], previous[1], bitmask) if previous is not None else []
        if prefill_s:
            time.sleep(prefill_s)
        own = replay(xg2, compiled, case["samples"], bitmask)
        out[case["name"]] = {"own_us": 1e6 * statistics.fmean(own) if own else None, "fills": len(own),
                             "beside_us": 1e6 * statistics.fmean(beside) if beside else None}
        previous = (compiled, case["samples"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prefill-ms", type=float, default=40.0)
    ap.add_argument("--schemas", type=int, default=10, help="JSONSchemaBench schemas per subset")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    import xg2

    vocab = load_vocab(args.tokenizer)
    info = xg2.TokenizerInfo.from_huggingface(str(vocab.path))
    corpora = {"ebnf": ebnf_cases(vocab), "jsonschemabench": schema_cases(vocab, args.schemas)}
    runs: dict[str, dict[str, list[dict]]] = {c: {k: [] for k in CONFIGS} for c in corpora}
    for r in range(args.rounds):
        for config, options in (CONFIGS.items() if r % 2 == 0 else reversed(CONFIGS.items())):
            for corpus, cases in corpora.items():
                runs[corpus][config].append(run_config(xg2, info, cases, options, args.prefill_ms / 1e3))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)

    summary: dict[str, Any] = {"prefill_ms": args.prefill_ms, "rounds": args.rounds, "corpora": {}}
    for corpus, cases in corpora.items():
        rows = []
        for case in cases:
            name = case["name"]
            fig: dict[str, Any] = {"grammar": name}
            for config in CONFIGS:
                got = [run[name] for run in runs[corpus][config] if name in run]
                if any("error" in g for g in got):
                    fig["error"] = next(g["error"] for g in got if "error" in g)
                    break
                for what in ("own_us", "beside_us"):
                    vals = [g[what] for g in got if g.get(what) is not None]
                    fig[f"{config}.{what}"] = statistics.median(vals) if vals else None
            rows.append(fig)
        summary["corpora"][corpus] = _report(corpus, rows)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=1))
    return 0


def _report(corpus: str, rows: list[dict]) -> dict[str, Any]:
    ok = [r for r in rows if "error" not in r and r.get("defaults.own_us") and r.get("no_background.own_us")]
    print(f"\n{corpus}: {len(ok)} grammars ({len(rows) - len(ok)} not compiled or without fills)")
    print(f"{'grammar':40s} {'own: defaults':>14s} {'no bg':>9s} {'ratio':>6s}   "
          f"{'beside: defaults':>16s} {'no bg':>9s} {'ratio':>6s}")
    own_ratios, beside_ratios = [], []
    for r in ok:
        ro = r["defaults.own_us"] / r["no_background.own_us"]
        own_ratios.append(ro)
        b_d, b_n = r.get("defaults.beside_us"), r.get("no_background.beside_us")
        rb = b_d / b_n if b_d and b_n else None
        if rb is not None:
            beside_ratios.append(rb)
        print(f"{r['grammar'][:40]:40s} {r['defaults.own_us']:14.1f} {r['no_background.own_us']:9.1f} {ro:6.2f}   "
              f"{(b_d or 0):16.1f} {(b_n or 0):9.1f} {(rb or 0):6.2f}")
    total_d = sum(r["defaults.own_us"] * 1 for r in ok)
    total_n = sum(r["no_background.own_us"] * 1 for r in ok)
    out = {"grammars": len(ok), "rows": rows,
           "own_geomean_ratio": statistics.geometric_mean(own_ratios) if own_ratios else None,
           "own_sum_of_means_ratio": total_d / total_n if total_n else None,
           "beside_geomean_ratio": statistics.geometric_mean(beside_ratios) if beside_ratios else None,
           "own_within_10pct": sum(x <= 1.1 for x in own_ratios)}
    print(f"own fills, defaults / no background: geomean {out['own_geomean_ratio']:.3f}, "
          f"sum of means {out['own_sum_of_means_ratio']:.3f}, within 10%: {out['own_within_10pct']} of {len(ok)}")
    if beside_ratios:
        print(f"another grammar's fills beside a background precompute: geomean ratio {out['beside_geomean_ratio']:.3f}")
    return out


if __name__ == "__main__":
    sys.exit(main())
