"""Turn a `bench_ebnf.py --json` result into a Markdown table checked against the engine-core bar.

    python benchmarks/report.py results.json

Per grammar: xg2's time to first mask and per-token mask mean / p99, the peers' means, and whether
xg2 meets the bar of the engine-core issue (mean no more than the better peer, p99 under 1 ms,
time to first mask under 50 ms).
"""

from __future__ import annotations

import json
import sys


def main(path: str) -> None:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    by = {(r["engine"], r["grammar"]): r for r in data["results"]}
    grammars = sorted({g for _e, g in by})
    print("| grammar | xg2 first mask ms | xg2 mean µs | xg2 p99 µs | xgrammar mean µs | llguidance mean µs "
          "| xgrammar first mask ms | llguidance first mask ms | mean ≤ best peer | p99 < 1 ms | first mask < 50 ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    met = {"mean": 0, "p99": 0, "ttfm": 0}
    for g in grammars:
        x = by.get(("xg2", g))
        if x is None:
            continue
        peers = [by[(e, g)] for e in ("xgrammar", "llguidance") if (e, g) in by]
        best = min(p["mask_us"]["mean"] for p in peers) if peers else float("inf")
        ok_mean = x["mask_us"]["mean"] <= best
        ok_p99 = x["mask_us"]["p99"] < 1000
        ok_ttfm = x["first_mask_ms"] < 50
        met["mean"] += ok_mean
        met["p99"] += ok_p99
        met["ttfm"] += ok_ttfm

        def peer(e: str, key: str, g: str = g) -> str:
            r = by.get((e, g))
            if r is None:
                return "-"
            return f"{r['mask_us']['mean']:.1f}" if key == "mean" else f"{r['first_mask_ms']:.1f}"

        print(f"| {g} | {x['first_mask_ms']:.1f} | {x['mask_us']['mean']:.1f} | {x['mask_us']['p99']:.1f} "
              f"| {peer('xgrammar', 'mean')} | {peer('llguidance', 'mean')} | {peer('xgrammar', 'ttfm')} "
              f"| {peer('llguidance', 'ttfm')} | {'yes' if ok_mean else 'no'} | {'yes' if ok_p99 else 'no'} "
              f"| {'yes' if ok_ttfm else 'no'} |")
    n = len(grammars)
    print(f"\nMet on {met['mean']}/{n} (mean), {met['p99']}/{n} (p99), {met['ttfm']}/{n} (first mask).")


if __name__ == "__main__":
    main(sys.argv[1])
