"""Markdown tables from `bench_jsonschema.py --json` results (compliance or speed).

    python benchmarks/report_jsonschema.py results.json [more.json ...] [--out merged.json]

Several files (e.g. one run per engine) are merged engine by engine, later files winning; every
figure is recomputed from the per-schema records, so merged and single runs read the same.
The summaries live here (and are imported by the benchmark) so that both agree by construction.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import sys
from collections import Counter
from typing import Any

from engines import ALL_ENGINES, percentile


def reason_key(r: dict) -> str:
    """One short, groupable reason why a schema is not compliant for an engine: the error without
    its JSON pointer, or the first kind of misjudged test (with the keyword an accepted invalid
    document breaks, or a note when a rejected valid document passes once reordered)."""
    status = r["status"]
    if status in ("error", "crash"):
        msg = re.sub(r" \(at [^()]*\)$", "", r.get("error", "")).strip()
        msg = re.sub(r"\s+", " ", msg)[:160]
        return f"{status}: {r.get('error_type', '?')}: {msg}"
    if status == "timeout":
        return "timeout: compile"
    if "phase_failure" in r and len(r.get("tests", [])) < r["n_tests"]:
        return "test phase: " + r["phase_failure"].split(":")[0]
    for t in r.get("tests", []):
        if t["right"]:
            continue
        if t["verdict"] == "error":
            return "matcher error: " + t.get("detail", "").split(":")[0]
        if t["valid"]:
            if t.get("order_sensitive"):
                return "valid doc rejected: member order differs from the schema"
            return "valid doc " + ("rejected" if t["verdict"] == "rejected" else "cannot end")
        return f"invalid doc accepted: {t.get('broken_keyword', '?')}"
    for mode, w in r.get("walks", {}).items():
        if w.get("bugs"):
            return f"walk ({mode}): {w['bugs'][0]['kind']}"
        if w.get("unsound"):
            return f"unsound walk ({mode}): " + w["unsound"][0]["reason"].split(":")[0]
    return "ok"


def is_compliant(r: dict, key: str = "right") -> bool:
    """Compiled, and every labelled test judged right (vacuously true for a schema without tests)."""
    if r["status"] != "ok":
        return False
    tests = r.get("tests", [])
    return len(tests) == r["n_tests"] and all(t[key] for t in tests)


def compliance_summary(results: list[dict]) -> dict:
    """Counts per subset (and `ALL`) for one engine."""
    out: dict[str, dict] = {}
    for r in results:
        for key in (r["subset"], "ALL"):
            s = out.setdefault(key, {
                "schemas": 0, "compiled": 0, "compile_errors": 0, "crashes": 0, "timeouts": 0,
                "test_phase_failures": 0, "no_tests": 0, "tests": 0, "tests_right": 0, "tests_right_any_order": 0,
                "valid": 0, "valid_accepted": 0, "invalid": 0, "invalid_rejected": 0, "compliant": 0,
                "compliant_any_order": 0, "matcher_errors": 0, "roundtrip_mismatch": 0, "mask_disagree": 0})
            s["schemas"] += 1
            s["no_tests"] += r["n_tests"] == 0
            status = r["status"]
            s["compiled"] += status == "ok"
            s["compile_errors"] += status == "error"
            s["crashes"] += status == "crash"
            s["timeouts"] += status == "timeout"
            s["test_phase_failures"] += "phase_failure" in r
            for t in r.get("tests", []):
                s["tests"] += 1
                s["tests_right"] += t["right"]
                s["tests_right_any_order"] += t["right_any_order"]
                s["matcher_errors"] += t["verdict"] == "error"
                s["roundtrip_mismatch"] += "roundtrip" in t
                s["mask_disagree"] += "mask_disagree" in t
                if t["valid"]:
                    s["valid"] += 1
                    s["valid_accepted"] += t["right"]
                else:
                    s["invalid"] += 1
                    s["invalid_rejected"] += t["right"]
            if status == "ok":
                s["compliant"] += is_compliant(r)
                s["compliant_any_order"] += is_compliant(r, "right_any_order")
    return out


def walk_summary(results: list[dict]) -> dict:
    out: dict[str, Any] = {}
    for mode in ("nonstrict", "strict"):
        s = {"schemas": 0, "walks_done": 0, "valid": 0, "oneof_only": 0, "unfinished": 0, "unsound": 0, "bugs": 0,
             "validator_errors": 0, "not_compiled": 0}
        for r in results:
            w = r.get("walks", {}).get(mode)
            if w is None:
                continue
            if "compile" in w:
                s["not_compiled"] += 1
                continue
            s["schemas"] += 1
            s["walks_done"] += w["done"]
            s["valid"] += w["valid"]
            s["oneof_only"] += w.get("oneof_only", 0)
            s["unfinished"] += w["unfinished"]
            s["unsound"] += len(w["unsound"])
            s["bugs"] += len(w["bugs"])
            s["validator_errors"] += w["validator_error"] is not None
        if s["schemas"]:
            out[mode] = s
    return out




def speed_summary(payload: dict) -> dict:
    """TTFM and mask statistics per engine and subset, and xg2's ratios to each peer, both over
    the schemas that both engines compile (and whose document both walk to the end)."""
    per: dict[str, dict[str, dict]] = {}
    rows = {e: {r["id"]: r for r in rs} for e, rs in payload["schemas"].items()}

    def stats(recs: list[dict]) -> dict:
        ttfm = sorted(r["ttfm_ms"] for r in recs)
        masks = sorted(x for r in recs for x in r.get("mask_us", []))
        return {"schemas": len(recs), "ttfm_p50_ms": percentile(ttfm, 0.5), "ttfm_p99_ms": percentile(ttfm, 0.99),
                "mask_mean_us": statistics.fmean(masks) if masks else math.nan,
                "mask_p99_us": percentile(masks, 0.99), "mask_steps": len(masks)}

    for e, rs in payload["schemas"].items():
        ok = [r for r in rs if r["status"] == "ok"]
        per[e] = {}
        for sub in sorted({r["subset"] for r in rs}) + ["ALL"]:
            sel = [r for r in ok if sub in ("ALL", r["subset"])]
            per[e][sub] = stats(sel) | {"total": sum(1 for r in rs if sub in ("ALL", r["subset"]))}
    ratios: dict[str, dict] = {}
    for other in ("xgrammar", "llguidance"):
        if "xg2" not in rows or other not in rows:
            continue
        both = [i for i, r in rows["xg2"].items() if r["status"] == "ok" and rows[other].get(i, {}).get("status") == "ok"]
        ratios[f"xg2/{other}"] = {}
        for sub in sorted({rows["xg2"][i]["subset"] for i in both}) + ["ALL"]:
            ids = [i for i in both if sub in ("ALL", rows["xg2"][i]["subset"])]
            walked = [i for i in ids if not rows["xg2"][i].get("error") and not rows[other][i].get("error")]
            a = stats([rows["xg2"][i] for i in ids])
            b = stats([rows[other][i] for i in ids])
            am = stats([rows["xg2"][i] for i in walked])
            bm = stats([rows[other][i] for i in walked])
            per_schema = [rows["xg2"][i]["ttfm_ms"] / rows[other][i]["ttfm_ms"] for i in ids
                          if rows[other][i]["ttfm_ms"] > 0]

            def ratio(x: float, y: float) -> float:
                return x / y if y and not math.isnan(x) and not math.isnan(y) else math.nan

            ratios[f"xg2/{other}"][sub] = {
                "schemas": len(ids), "walked": len(walked),
                "ttfm_p50": ratio(a["ttfm_p50_ms"], b["ttfm_p50_ms"]),
                "ttfm_p99": ratio(a["ttfm_p99_ms"], b["ttfm_p99_ms"]),
                "ttfm_geomean": math.exp(statistics.fmean(math.log(x) for x in per_schema)) if per_schema else math.nan,
                "mask_mean": ratio(am["mask_mean_us"], bm["mask_mean_us"]),
                "mask_p99": ratio(am["mask_p99_us"], bm["mask_p99_us"]),
            }
    return {"per_engine": per, "ratios": ratios}




def _f(v: Any, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.{digits}f}"


def _engines(payload: dict) -> list[str]:
    return [e for e in ALL_ENGINES if e in payload["schemas"]] + \
        [e for e in payload["schemas"] if e not in ALL_ENGINES]


def _subsets(payload: dict) -> list[str]:
    order = payload.get("subsets") or []
    seen = {r["subset"] for rs in payload["schemas"].values() for r in rs}
    return [s for s in order if s in seen] + sorted(seen - set(order))


def compliance_markdown(payload: dict, top: int = 25) -> str:
    engines = _engines(payload)
    summ = {e: compliance_summary(payload["schemas"][e]) for e in engines}
    subsets = _subsets(payload)
    no_tests = summ[engines[0]]["ALL"]["no_tests"] if engines else 0
    lines = ["## JSONSchemaBench compliance", ""]
    head = "| subset | schemas |" + "".join(f" {e} compiled | {e} err/crash/t.o. | {e} tests right | {e} compliant |"
                                             for e in engines)
    lines += [head, "|---|---:|" + "---:|---:|---:|---:|" * len(engines)]
    for sub in subsets + ["ALL"]:
        n = summ[engines[0]][sub]["schemas"] if engines else 0
        row = f"| {'**ALL**' if sub == 'ALL' else sub} | {n} |"
        for e in engines:
            s = summ[e].get(sub)
            if s is None:
                row += " - | - | - | - |"
                continue
            row += (f" {s['compiled']} | {s['compile_errors']}/{s['crashes']}/{s['timeouts']} "
                    f"| {s['tests_right']}/{s['tests']} | {s['compliant']} |")
        lines.append(row)
    lines += ["", ("*compiled*: compiled within the time limit; *err*: a typed compile error (for xgrammar and "
              "llguidance any Python exception), *crash*: for xg2 an untyped exception, for every engine a "
              "dead worker; *t.o.*: compile time limit. *tests right*: valid documents accepted and ended with "
              "EOS plus invalid documents rejected, over the tests of compiled schemas. *compliant*: compiled "
              f"and no test misjudged (a schema without tests counts when it compiles; {no_tests} of the "
              f"{summ[engines[0]]['ALL']['schemas'] if engines else 0} schemas have no tests).")]
    lines += ["", ("| engine | valid accepted | invalid rejected | tests right, any member order "
              "| compliant, any member order | matcher errors | test-phase time-outs/deaths | tokenization round-trip failures |"),
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for e in engines:
        s = summ[e]["ALL"]
        lines.append(f"| {e} | {s['valid_accepted']}/{s['valid']} | {s['invalid_rejected']}/{s['invalid']} "
                     f"| {s['tests_right_any_order']}/{s['tests']} | {s['compliant_any_order']} | {s['matcher_errors']} "
                     f"| {s['test_phase_failures']} | {s['roundtrip_mismatch']} |")
    lines += ["", ("*any member order*: a document rejected as written is judged again with its object members "
              "reordered as the schema lists them (all three engines fix that order).")]
    if "xg2" in payload["schemas"]:
        walks = walk_summary(payload["schemas"]["xg2"])
        if walks:
            lines += ["", "### xg2 random walks (soundness)", "",
                      ("| strict_mode | schemas | walks ended | valid | oneOf exclusivity only | unsound | unfinished (discarded) "
                      "| matcher bugs | validator errors | not compiled |"), "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
            for mode, w in walks.items():
                lines.append(f"| {mode == 'strict'} | {w['schemas']} | {w['walks_done']} | {w['valid']} | {w['oneof_only']} "
                             f"| {w['unsound']} | {w['unfinished']} | {w['bugs']} | {w['validator_errors']} "
                             f"| {w['not_compiled']} |")
        reasons = Counter(reason_key(r) for r in payload["schemas"]["xg2"])
        reasons.pop("ok", None)
        lines += ["", f"### Why xg2 schemas are not compliant (top {top})", "", "| schemas | reason |", "|---:|---|"]
        for reason, n in reasons.most_common(top):
            cell = reason.replace("|", "\\|")
            lines.append(f"| {n} | {cell} |")
    return "\n".join(lines)


def speed_markdown(payload: dict) -> str:
    summary = speed_summary(payload)
    engines = _engines(payload)
    subsets = _subsets(payload)
    lines = ["## JSONSchemaBench speed (one thread)", "",
             "| subset |" + "".join(f" {e} compiled | {e} TTFM p50 ms | {e} TTFM p99 ms | {e} mask mean µs "
                                   f"| {e} mask p99 µs |" for e in engines),
             "|---|" + "---:|---:|---:|---:|---:|" * len(engines)]
    for sub in subsets + ["ALL"]:
        row = f"| {'**ALL**' if sub == 'ALL' else sub} |"
        for e in engines:
            s = summary["per_engine"][e].get(sub)
            if s is None:
                row += " - | - | - | - | - |"
                continue
            row += (f" {s['schemas']}/{s['total']} | {_f(s['ttfm_p50_ms'])} | {_f(s['ttfm_p99_ms'])} "
                    f"| {_f(s['mask_mean_us'])} | {_f(s['mask_p99_us'])} |")
        lines.append(row)
    for key, per in summary["ratios"].items():
        lines += ["", f"### {key} (schemas both compile; <1 means xg2 is faster)", "",
                  ("| subset | schemas | TTFM p50 | TTFM p99 | TTFM geomean of per-schema ratios | docs walked "
                  "| mask mean | mask p99 |"), "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for sub in subsets + ["ALL"]:
            r = per.get(sub)
            if r is None:
                continue
            lines.append(f"| {'**ALL**' if sub == 'ALL' else sub} | {r['schemas']} | {_f(r['ttfm_p50'], 2)} "
                         f"| {_f(r['ttfm_p99'], 2)} | {_f(r['ttfm_geomean'], 2)} | {r['walked']} "
                         f"| {_f(r['mask_mean'], 2)} | {_f(r['mask_p99'], 2)} |")
    return "\n".join(lines)


def merge(payloads: list[dict]) -> dict:
    out = dict(payloads[0])
    out["schemas"] = {}
    out["engine_info"] = {}
    for p in payloads:
        if p.get("mode") != out.get("mode"):
            raise SystemExit("cannot merge compliance and speed results")
        out["schemas"].update(p["schemas"])
        out["engine_info"].update(p.get("engine_info", {}))
        out["subsets"] = list(dict.fromkeys([*out.get("subsets", []), *p.get("subsets", [])]))
        for key in ("xg2_failures", "walks", "note", "xg2_source"):
            if key in p and "xg2" in p["schemas"]:
                out[key] = p[key]
    if out.get("mode") == "speed":
        out["summary"] = speed_summary(out)
    else:
        out["summary"] = {e: compliance_summary(rs) for e, rs in out["schemas"].items()}
    return out


def main(argv: list[str]) -> None:
    out = None
    if "--out" in argv:
        i = argv.index("--out")
        out, argv = argv[i + 1], argv[:i] + argv[i + 2:]
    paths = argv
    if not paths:
        raise SystemExit(__doc__)
    payloads = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            payloads.append(json.load(f))
    payload = merge(payloads)
    if out:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=1, ensure_ascii=False)
    info = ", ".join(f"{e} {i.get('version', '?')}" for e, i in payload["engine_info"].items())
    print(f"Tokenizer `{payload['tokenizer'].rsplit('/', 1)[-1]}`; engines: {info}.\n")
    print(speed_markdown(payload) if payload["mode"] == "speed" else compliance_markdown(payload))


if __name__ == "__main__":
    main(sys.argv[1:])
