"""Time to first mask (TTFM) side by side: xg2, llguidance and xgrammar, each with its default options.

    python benchmarks/bench_ttfm.py [--only toolcalling,multitenant,jsonschemabench,strings,ebnf,fresh_tools]
                                    [--quick] [--with-slow] [--seed 0] [--tokenizer PATH] [--json OUT]

TTFM = compile + new matcher + first ``fill_next_token_bitmask``: the latency a request adds
before its first token can be sampled. One thread, DeepSeek-V3 vocabulary by default. xg2 always
runs as ``xg2.GrammarCompiler(tokenizer_info)``, no keyword argument at all (not the 32 MB cache
or budget overrides of the ``xg2`` configuration of bench_multitenant / bench_toolcalling);
xgrammar as ``GrammarCompiler(info, max_threads=1)`` (its only non-default: one thread);
llguidance with its defaults. The run functions of bench_toolcalling and bench_multitenant take
their compiler from ``make_engine_and_compiler``, and bench_jsonschema's workers from the
adapter's ``json_compiler``: for the duration of these runs only, this script puts in their place
functions returning the compilers above (``default_compilers``, ``_jsb_worker_main``).

Workloads 1, 2 and 5 run in this process, one engine after the other; before each engine's run
whatever the process holds (torch, imported by xgrammar, the vocabulary, the requests) is frozen
out of the garbage collector (``gc.freeze``), so that a collection inside a timed region costs
what the engine's own objects cost, not 0.1-0.2 s.
Each workload prints one Markdown table; a summary of the bars comes last; ``--json OUT`` gets
every figure (written after each workload).

Workloads (``--only`` picks some, in this order):

1. ``toolcalling``: bench_toolcalling's requests (8 registry tools in a Qwen-style
   ``triggered_tags`` structural tag) and teacher-forced model-like outputs, through its
   ``run_engine``; one compiler per engine for all requests. TTFM p50/p99 over the requests
   after the warm-up ones, and the per-token mask mean/p99 along the outputs. xgrammar on the
   first ``xgrammar_requests`` only (its warm-up: half of them).
2. ``multitenant``: bench_multitenant's requests (the ``anyOf`` of 8 tool envelopes) through
   its ``run_engine`` with ``as_text=True``: each schema handed over as ``json.dumps`` text, what
   an HTTP server receives, to xg2 and to llguidance (its options as in bench_multitenant);
   TTFM p50/p99 after the warm-up, per-token mean over the seeded 32-token walks.
3. ``jsonschemabench``: ``bench_jsonschema.py --speed --limit 25`` (first 25 schemas of each
   speed subset, a fresh compiler per schema, schema dicts, its JSON options), driven in-process
   with its worker processes. xgrammar takes seconds per schema: only with ``--with-slow``.
4. ``strings``: ``{"type":"object","properties":{"text":{"type":"string","maxLength":N}},
   "required":["text"]}`` for N = 64, 1024, 65536, each in a fresh process (the bound is new to
   it): compile ms and TTFM, xg2 and llguidance (given the schema with
   ``additionalProperties: false``, the language of xg2's default strict mode); xgrammar (seconds)
   with ``--with-slow``.
5. ``ebnf``: every grammar of the EBNF corpus (benchmarks/grammars) through bench_ebnf's
   ``measure`` (a fresh compiler per compile; median of the repeats; then the per-token walk of
   the samples), after a small unrelated grammar compiled once per engine (imports warm); xg2 and
   llguidance (bench_ebnf's Lark twins); xgrammar with ``--with-slow``.
6. ``fresh_tools``: one request offering 8, 32 or 128 registry tools (seeded draw) in the
   tool-calling structural tag, in a fresh process per (engine, size, repeat): the tokenizer
   loaded and a small unrelated tag compiled first (imports and tables warm, as in
   bench_compile.py), then only compile + matcher + first fill is timed (llguidance's conversion
   to Lark is done before the clock starts); median of the repeats; xg2, llguidance, xgrammar.

``--quick`` runs fewer requests, schemas and repeats (about 2 minutes instead of about 5 on a
2-core machine; ``--with-slow`` adds about 10 minutes to the full run).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import io
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.append(str(HERE.parent))

import bench_ebnf
import bench_jsonschema
import bench_multitenant
import bench_toolcalling
import engines
from bench_compile import WARM_UP
from corpus import load_corpus
from engines import (
    DEFAULT_TOKENIZER,
    EngineUnavailable,
    Vocab,
    load_vocab,
    make_engine,
    make_engines,
    strict_schema,
)

SECTIONS = ("toolcalling", "multitenant", "jsonschemabench", "strings", "ebnf", "fresh_tools")
TOOLS = 8                       # tools per request (toolcalling, multitenant)
WALK_STEPS = 32                 # multitenant: tokens walked per request (bench_multitenant's default)
STRING_LENGTHS = (64, 1024, 65536)
FRESH_SIZES = (8, 32, 128)
WORKER_TIMEOUT_S = 600.0
#: The compiler each engine gets (recorded with the results).
COMPILERS = {"xg2": "GrammarCompiler(info)", "xgrammar": "GrammarCompiler(info, max_threads=1)",
             "llguidance": "none (LLMatcher with its defaults)"}
#: A small tool unrelated to the registry's: the fresh processes compile its tag before the clock starts.
WARM_TOOL = {"name": "warm_up", "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
                                               "required": ["q"]}}


@dataclass(frozen=True)
class Profile:
    requests: int               # toolcalling and multitenant requests
    skip: int                   # of which warm-up
    xgrammar_requests: int      # toolcalling requests xgrammar gets
    jsb_limit: int              # JSONSchemaBench schemas per subset
    repeats: int                # fresh processes per (engine, input): strings, fresh_tools
    ebnf_repeat: int            # compiles per grammar (bench_ebnf --repeat)


FULL = Profile(requests=300, skip=100, xgrammar_requests=30, jsb_limit=25, repeats=3, ebnf_repeat=3)
QUICK = Profile(requests=150, skip=50, xgrammar_requests=10, jsb_limit=10, repeats=1, ebnf_repeat=1)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _f(v: Any, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return f"{v:.{digits}f}"


def md_table(head: list[str], rows: list[list[str]], align: str | None = None) -> str:
    align = align or "|---|" + "---:|" * (len(head) - 1)
    return "\n".join(["| " + " | ".join(head) + " |", align] + ["| " + " | ".join(r) + " |" for r in rows])


def freeze() -> None:
    """Collect, then move every live object out of the collector's reach (gc.freeze): what the
    harness holds (modules such as torch, the vocabulary, the requests, earlier engines' results)
    then costs nothing to a collection inside a timed region, which costs what the engine's own
    objects cost. Without it, a full collection took 0.1-0.2 s here once torch was imported."""
    gc.collect()
    gc.freeze()


def _of(n: int, one: str, many: str) -> str:
    return f"one {one}" if n == 1 else f"median of {n} {many}"


def _median(vals: list[float]) -> float | None:
    return statistics.median(vals) if vals else None


# ------------------------------------------------------------------ default compilers


def default_compiler(engine: engines.Engine) -> Any:
    """The compiler this script gives an engine (COMPILERS): xg2's defaults, xgrammar's on one
    thread, None for llguidance (it has no compiler object)."""
    if engine.name == "xg2":
        return engine.module.GrammarCompiler(engine.info)
    if engine.name == "xgrammar":
        return engine.module.GrammarCompiler(engine.info, max_threads=1)
    return None


@contextlib.contextmanager
def patched(module: Any, attr: str, value: Any) -> Iterator[None]:
    saved = getattr(module, attr)
    setattr(module, attr, value)
    try:
        yield
    finally:
        setattr(module, attr, saved)


def default_compilers(module: Any) -> contextlib.AbstractContextManager:
    """Inside: `module.make_engine_and_compiler(name, vocab)` (bench_toolcalling's and
    bench_multitenant's `run_engine` call it) gives xg2 and xgrammar `default_compiler`;
    llguidance as before (no compiler)."""
    original = module.make_engine_and_compiler

    def factory(name: str, vocab: Vocab) -> tuple[engines.Engine, Any]:
        if name not in ("xg2", "xgrammar"):
            return original(name, vocab)
        engine = make_engine(name, vocab)
        return engine, default_compiler(engine)

    return patched(module, "make_engine_and_compiler", factory)


def _jsb_worker_main(conn: Any, engine_name: str, tokenizer: str, log_path: str, opts: dict) -> None:
    """bench_jsonschema's worker process with `default_compiler` as the adapters' `json_compiler`
    (the spawned process imports bench_jsonschema afresh: this runs there in place of its
    worker_main; the speed job makes a fresh compiler per schema with it)."""
    engines.Xg2Engine.json_compiler = default_compiler
    engines.XGrammarEngine.json_compiler = default_compiler
    bench_jsonschema.worker_main(conn, engine_name, tokenizer, log_path, opts)


# ------------------------------------------------------------------ 1. tool calling


def _slim(rows: list[dict]) -> list[dict]:
    """Per-request rows without the per-token times (their count kept)."""
    return [{k: v for k, v in r.items() if k != "mask_us"} | {"mask_steps": len(r.get("mask_us", []))}
            for r in rows]


def _requests_cell(s: dict, n_rows: int) -> str:
    return f"{s['requests']} (#{s['skip']}–{n_rows - 1})"


def _errors_cell(s: dict) -> str:
    return str(s["errors"]) + (f" ({', '.join(f'{k} {v}' for k, v in s['errors_by_kind'].items())})"
                               if s.get("errors_by_kind") else "")


def section_toolcalling(args: argparse.Namespace, vocab: Vocab) -> dict:
    p = args.profile
    t = time.perf_counter()
    requests = bench_toolcalling.make_requests(p.requests, TOOLS, args.seed, vocab)
    log(f"[toolcalling] {len(requests)} requests made in {time.perf_counter() - t:.1f} s")
    view = bench_toolcalling.MaskView(vocab)
    results = []
    for name in ("xg2", "llguidance", "xgrammar"):
        n = min(p.requests, p.xgrammar_requests) if name == "xgrammar" else p.requests
        freeze()
        t = time.perf_counter()
        try:
            with default_compilers(bench_toolcalling):
                res = bench_toolcalling.run_engine(name, vocab, requests[:n], view, compare=False)
        except EngineUnavailable as exc:
            log(f"[toolcalling] skip {name}: {exc}")
            continue
        for k in ("_digests", "_engine", "_compiler"):
            res.pop(k)
        res["compiler"] = COMPILERS[name]
        if name == "xg2":       # not the `xg2` configuration's compiler options
            res["options"] = dict(engines.Xg2Engine.json_options)
        log(f"[toolcalling] {name}: {n} requests in {time.perf_counter() - t:.1f} s")
        results.append(res)
    summaries = [bench_toolcalling.summary(r, min(p.skip, len(r["rows"]) // 2)) for r in results]
    rows = [[s["engine"], _requests_cell(s, len(r["rows"])), _f(s.get("ttfm_p50_ms")),
             _f(s.get("ttfm_p99_ms")), _f(s.get("ttfm_mean_ms")), _f(s.get("mask_mean_us"), 1),
             _f(s.get("mask_p99_us"), 1), str(s.get("tokens", 0)), _errors_cell(s)]
            for s, r in zip(summaries, results, strict=True)]
    table = md_table(["engine", "requests", "TTFM p50 ms", "TTFM p99 ms", "TTFM mean ms", "mask mean µs",
                      "mask p99 µs", "masks", "errors"], rows, "|---|---|" + "---:|" * 6 + "---|")
    for r in results:
        r["rows"] = _slim(r["rows"])
    return {"title": f"Tool calling: {TOOLS} registry tools per request, structural tag (bench_toolcalling)",
            "table": table, "summaries": {s["engine"]: s for s in summaries},
            "ttfm_by_new_tools": bench_toolcalling.split_by_new_tools(results), "results": results}


def bar_toolcalling(sec: dict) -> tuple[str, bool | None]:
    s = sec["summaries"]
    x, g = s.get("xg2", {}), s.get("llguidance", {})
    if "ttfm_p50_ms" not in x or "ttfm_p50_ms" not in g:
        return "missing figures", None
    ok = x["ttfm_p50_ms"] <= g["ttfm_p50_ms"] and x["ttfm_p99_ms"] < 10
    return (f"xg2 p50 {x['ttfm_p50_ms']:.2f} ms vs llguidance {g['ttfm_p50_ms']:.2f} ms; "
            f"xg2 p99 {x['ttfm_p99_ms']:.2f} ms"), ok


# ------------------------------------------------------------------ 2. multi-tenant schemas as text


def section_multitenant(args: argparse.Namespace, vocab: Vocab) -> dict:
    p = args.profile
    schemas, picks = bench_multitenant.make_requests(p.requests, TOOLS, args.seed)
    reference = make_engine("xg2", vocab)       # token bytes and stop tokens for every engine's walks
    token_bytes, stops = reference.token_bytes(), set(reference.info.stop_token_ids)
    results = []
    for name in ("xg2", "llguidance"):
        freeze()
        t = time.perf_counter()
        try:
            with default_compilers(bench_multitenant):
                res = bench_multitenant.run_engine(name, vocab, schemas, picks, WALK_STEPS, args.seed,
                                                   token_bytes, stops, as_text=True)
        except EngineUnavailable as exc:
            log(f"[multitenant] skip {name}: {exc}")
            continue
        res["compiler"] = COMPILERS[name]
        if name == "xg2":       # not the `xg2` configuration's compiler options
            res["options"] = dict(engines.Xg2Engine.json_options)
        log(f"[multitenant] {name}: {len(schemas)} requests in {time.perf_counter() - t:.1f} s")
        results.append(res)
    skip = min(p.skip, p.requests // 2)
    summaries = [bench_multitenant.summary(r, skip) for r in results]
    rows = []
    for s in summaries:
        rates = (f"{s['hit_rate']:.0%} / {s['partial_rate']:.0%} / {s['miss_rate']:.0%}"
                 if "hit_rate" in s else "")
        rows.append([s["engine"], f"{s['requests']} (#{skip}–{p.requests - 1})", _f(s.get("ttfm_p50_ms")),
                     _f(s.get("ttfm_p99_ms")), _f(s.get("ttfm_mean_ms")), _f(s.get("mask_mean_us"), 1),
                     _f(s.get("mask_p99_us"), 1), rates, str(s["errors"])])
    table = md_table(["engine", "requests", "TTFM p50 ms", "TTFM p99 ms", "TTFM mean ms", "mask mean µs",
                      "mask p99 µs", "pool hits / partial / misses", "errors"], rows,
                     "|---|---|" + "---:|" * 5 + "---|---:|")
    for r in results:
        r["rows"] = _slim(r["rows"])
    return {"title": f"Multi-tenant: anyOf of {TOOLS} tool envelopes as JSON text (bench_multitenant)",
            "table": table, "summaries": {s["engine"]: s for s in summaries}, "results": results}


def bar_multitenant(sec: dict) -> tuple[str, bool | None]:
    x = sec["summaries"].get("xg2", {})
    if "ttfm_p50_ms" not in x:
        return "missing figures", None
    return (f"xg2 p50 {x['ttfm_p50_ms']:.2f} ms, p99 {x['ttfm_p99_ms']:.2f} ms",
            x["ttfm_p50_ms"] < 1 and x["ttfm_p99_ms"] < 5)


# ------------------------------------------------------------------ 3. JSONSchemaBench speed subsets


def section_jsonschemabench(args: argparse.Namespace, vocab: Vocab) -> dict:
    names = ["xg2", "llguidance"] + (["xgrammar"] if args.with_slow else [])
    with tempfile.TemporaryDirectory(prefix="bench_ttfm_") as tmp:
        out = Path(tmp) / "speed.json"
        argv = ["--speed", "--limit", str(args.profile.jsb_limit), "--engines", ",".join(names),
                "--tokenizer", str(args.tokenizer), "--json", str(out),
                "--worker-log", str(Path(tempfile.gettempdir()) / "bench_ttfm_jsonschemabench")]
        detail = io.StringIO()
        with patched(bench_jsonschema, "worker_main", _jsb_worker_main), contextlib.redirect_stdout(detail):
            bench_jsonschema.main(argv)
        payload = json.loads(out.read_text(encoding="utf-8"))
    summary = payload["summary"]
    per, ratios = summary["per_engine"], summary["ratios"]
    rows = []
    for name in payload["engines"]:
        s = per.get(name, {}).get("ALL")
        if s is None:
            continue
        r = ratios.get(f"xg2/{name}", {}).get("ALL")
        rows.append([name, f"{s['schemas']}/{s['total']}", _f(s["ttfm_p50_ms"]), _f(s["ttfm_p99_ms"]),
                     _f(s["mask_mean_us"], 1), _f(s["mask_p99_us"], 1),
                     f"{_f(r['ttfm_p50'])} / {_f(r['ttfm_p99'])} ({r['schemas']})" if r else ""])
    table = md_table(["engine", "compiled", "TTFM p50 ms", "TTFM p99 ms", "mask mean µs", "mask p99 µs",
                      "xg2/engine TTFM p50 / p99 (schemas both compile)"], rows,
                     "|---|---:|---:|---:|---:|---:|---:|")
    schemas = {e: [{k: v for k, v in r.items() if k != "mask_us"} for r in rs]
               for e, rs in payload["schemas"].items()}
    return {"title": (f"JSONSchemaBench speed subsets, first {args.profile.jsb_limit} of each, a fresh "
                      "compiler per schema (bench_jsonschema --speed)"),
            "table": table, "summary": summary, "engine_info": payload.get("engine_info", {}),
            "xg2_source": payload.get("xg2_source", {}), "elapsed_s": payload.get("elapsed_s", {}),
            "schemas": schemas, "detail_markdown": detail.getvalue(),
            "notes": [] if args.with_slow else ["xgrammar not run (`--with-slow`: seconds per schema)"]}


def bar_jsonschemabench(sec: dict) -> tuple[str, bool | None]:
    x = sec["summary"]["per_engine"].get("xg2", {}).get("ALL")
    r = sec["summary"]["ratios"].get("xg2/llguidance", {}).get("ALL")
    g = sec["summary"]["per_engine"].get("llguidance", {}).get("ALL")
    if not x or not r or not g:
        return "missing figures", None
    measured = (f"xg2 p50 {x['ttfm_p50_ms']:.2f} ms vs llguidance {g['ttfm_p50_ms']:.2f} ms (ratio "
                f"{r['ttfm_p50']:.2f} on the {r['schemas']} both compile); xg2 p99 {x['ttfm_p99_ms']:.2f} ms")
    return measured, r["ttfm_p50"] <= 1 and x["ttfm_p99_ms"] < 20


# ------------------------------------------------------------------ fresh processes (4 and 6)


def string_schema(n: int) -> dict:
    return {"type": "object", "properties": {"text": {"type": "string", "maxLength": n}},
            "required": ["text"]}


def tools_tag(n: int, seed: int) -> dict:
    """The tool-calling structural tag over `n` registry tools drawn as bench_multitenant draws them."""
    tools = bench_multitenant.load_tools()
    pick = bench_multitenant.sample_tools(1, n, seed, len(tools))[0]
    return bench_toolcalling.structural_tag([tools[k] for k in pick])


def worker(kind: str, engine_name: str, arg: int, tokenizer: Path, seed: int) -> dict:
    """One fresh process: load the tokenizer and the engine, compile a small unrelated input of the
    same kind, then time compile + matcher + first fill of the input (`kind` strings: maxLength
    `arg`; tools: `arg` registry tools)."""
    vocab = load_vocab(tokenizer)
    engine = make_engine(engine_name, vocab)
    compiler = default_compiler(engine)
    if kind == "strings":
        warm, data = WARM_UP["json"], string_schema(arg)
        if engine.name == "llguidance":      # llguidance has no strict mode: the same language written out
            prepare, compile_ = strict_schema, engine.compile_json_schema
        else:
            prepare, compile_ = (lambda x: x), compiler.compile_json_schema
    elif kind == "tools":
        warm, data = bench_toolcalling.structural_tag([WARM_TOOL]), tools_tag(arg, seed)
        prepare = engine.structural_tag_input     # llguidance: our Lark conversion; others: the tag itself

        def compile_(given: Any) -> Any:
            return engine.compile_structural_tag(given, compiler)
    else:
        raise SystemExit(f"unknown worker kind {kind!r}")
    bitmask = engine.new_bitmask()

    def ttfm(x: Any) -> dict:
        t = time.perf_counter()
        given = prepare(x)
        out = {"prep_ms": (time.perf_counter() - t) * 1e3}
        gc.collect()
        gc.disable()
        try:
            t0 = time.perf_counter()
            handle = compile_(given)
            t1 = time.perf_counter()
            engine.fill(engine.new_matcher(handle), bitmask)
            t2 = time.perf_counter()
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            return out | {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"}
        finally:
            gc.enable()
        return out | {"compile_ms": (t1 - t0) * 1e3, "ttfm_ms": (t2 - t0) * 1e3}

    warm_up = ttfm(warm)
    if "error" in warm_up:
        return {"error": f"warm-up: {warm_up['error']}"}
    return ttfm(data) | {"version": engine.version}


def fresh(kind: str, engine: str, arg: int, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", kind, engine, str(arg),
           "--tokenizer", str(args.tokenizer), "--seed", str(args.seed)]
    try:
        out = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"over {WORKER_TIMEOUT_S:.0f} s"}
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        tail = (out.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"exit {out.returncode}: {tail[:200]}"}
    return json.loads(lines[-1])


def fresh_runs(kind: str, engine: str, arg: int, args: argparse.Namespace) -> dict:
    """`repeats` fresh processes; medians over those without error."""
    runs = [fresh(kind, engine, arg, args) for _ in range(args.profile.repeats)]
    ok = [r for r in runs if "error" not in r]
    res = {"runs": runs, "compile_ms": _median([r["compile_ms"] for r in ok]),
           "ttfm_ms": _median([r["ttfm_ms"] for r in ok]),
           "error": next((r["error"] for r in runs if "error" in r), None)}
    log(f"[{kind}] {arg:>6} {engine:<10} TTFM {_f(res['ttfm_ms'])} ms"
        + (f" ({res['error']})" if res["error"] else ""))
    return res


def _cell(r: dict | None, key: str = "ttfm_ms") -> str:
    if r is None:
        return ""
    if r[key] is None:
        return "error" if r["error"] else "—"
    return _f(r[key])


# ------------------------------------------------------------------ 4. long strings


def section_strings(args: argparse.Namespace, vocab: Vocab) -> dict:
    names = ["xg2", "llguidance"] + (["xgrammar"] if args.with_slow else [])
    data: dict[str, dict[str, dict]] = {}
    for n in STRING_LENGTHS:
        data[str(n)] = {e: fresh_runs("strings", e, n, args) for e in names}
    head = ["maxLength"] + [h for e in names for h in (f"{e} compile ms", f"{e} TTFM ms")]
    rows = [[n] + [c for e in names for c in (_cell(d[e], "compile_ms"), _cell(d[e]))]
            for n, d in data.items()]
    notes = [f"{e} maxLength {n}: {r['error']}" for n, d in data.items() for e, r in d.items() if r["error"]]
    if not args.with_slow:
        notes.insert(0, "xgrammar not run (`--with-slow`: seconds per bound)")
    return {"title": (f"Long strings: a bound new to the process (a fresh process each; "
                      f"{_of(args.profile.repeats, 'process', 'processes')})"),
            "table": md_table(head, rows), "notes": notes, "results": data}


def bar_strings(sec: dict) -> tuple[str, bool | None]:
    vals = {n: d["xg2"]["ttfm_ms"] for n, d in sec["results"].items()}
    if any(v is None for v in vals.values()):
        return "xg2 failed on " + ", ".join(n for n, v in vals.items() if v is None), False
    measured = "xg2 TTFM " + ", ".join(f"{v:.1f}" for v in vals.values()) + " ms"
    return measured, all(v < 5 for v in vals.values())


# ------------------------------------------------------------------ 5. EBNF corpus


def section_ebnf(args: argparse.Namespace, vocab: Vocab) -> dict:
    names = ["xg2", "llguidance"] + (["xgrammar"] if args.with_slow else [])
    engs = make_engines(names, vocab)
    for eng in engs:
        if eng.name != "llguidance":    # the adapter's compile passes max_threads=1: default_compiler instead
            eng.compile = lambda ebnf, eng=eng: default_compiler(eng).compile_grammar(ebnf)
    cases = load_corpus()
    for eng in engs:        # imports and tables warm, whichever workloads ran before (as bench_compile does)
        eng.fill(eng.new_matcher(eng.compile(WARM_UP["ebnf"])), eng.new_bitmask())
    freeze()
    results: dict[str, dict[str, bench_ebnf.Result]] = {}
    for case in cases:
        results[case.name] = {e.name: bench_ebnf.measure(e, case, vocab, args.profile.ebnf_repeat)
                              for e in engs}
        log(f"[ebnf] {case.name:<18} " + "  ".join(f"{k} {_f(r.first_mask_ms)} ms"
                                                   for k, r in results[case.name].items()))
    shown = [e.name for e in engs]
    head = ["grammar"] + [h for e in shown for h in (f"{e} TTFM ms", f"{e} mask mean µs")]
    rows = [[g] + [c for e in shown for c in (_f(r[e].first_mask_ms), _f(r[e].mask_us.get("mean"), 1))]
            for g, r in results.items()]
    maxima = {e: max((r[e].first_mask_ms for r in results.values() if r[e].first_mask_ms is not None),
                     default=None) for e in shown}
    rows.append(["**max**"] + [c for e in shown for c in (_f(maxima[e]), "")])
    notes = [f"{e} / {g}: {err}" for g, r in results.items() for e, res in r.items()
             for err in res.errors[:2]]
    if not args.with_slow:
        notes.insert(0, "xgrammar not run (`--with-slow`: its walks of the samples take about a minute)")
    return {"title": (f"EBNF corpus: a fresh compiler per compile (bench_ebnf; "
                      f"{_of(args.profile.ebnf_repeat, 'compile', 'compiles')}; masks along the samples)"),
            "table": md_table(head, rows), "notes": notes, "max_first_mask_ms": maxima,
            "results": {g: {e: asdict(res) for e, res in r.items()} for g, r in results.items()}}


def bar_ebnf(sec: dict) -> tuple[str, bool | None]:
    rows = {g: r["xg2"]["first_mask_ms"] for g, r in sec["results"].items() if "xg2" in r}
    if not rows or any(v is None for v in rows.values()):
        return "xg2 failed on " + ", ".join(g for g, v in rows.items() if v is None), False
    worst = max(rows, key=rows.__getitem__)
    over = sum(v >= 20 for v in rows.values())
    return f"xg2 max {rows[worst]:.1f} ms ({worst}); {over} of {len(rows)} at 20 ms or more", over == 0


# ------------------------------------------------------------------ 6. fresh tool sets


def section_fresh_tools(args: argparse.Namespace, vocab: Vocab) -> dict:
    names = ["xg2", "llguidance", "xgrammar"]
    data = {str(n): {e: fresh_runs("tools", e, n, args) for e in names} for n in FRESH_SIZES}
    rows = []
    for n, d in data.items():
        x, g = d["xg2"]["ttfm_ms"], d["llguidance"]["ttfm_ms"]
        rows.append([n] + [_cell(d[e]) for e in names] + [_f(x / g) if x is not None and g else "—"])
    notes = [f"{e} {n} tools: {r['error']}" for n, d in data.items() for e, r in d.items() if r["error"]]
    return {"title": (f"First-seen tool sets in a fresh process: one structural tag, TTFM "
                      f"({_of(args.profile.repeats, 'process', 'processes')})"),
            "table": md_table(["tools"] + [f"{e} TTFM ms" for e in names] + ["xg2/llguidance"], rows),
            "notes": notes, "results": data}


def bar_fresh_tools(sec: dict) -> tuple[str, bool | None]:
    cells, ok = [], True
    for n, d in sec["results"].items():
        x, g = d["xg2"]["ttfm_ms"], d["llguidance"]["ttfm_ms"]
        if x is None or g is None:
            cells.append(f"{n}: error")
            ok = False
            continue
        cells.append(f"{n}: {x:.1f} vs {g:.1f}")
        ok = ok and x <= g
    return "xg2 vs llguidance ms, " + "; ".join(cells), ok


# ------------------------------------------------------------------ driver

RUNNERS: dict[str, Callable[[argparse.Namespace, Vocab], dict]] = {
    "toolcalling": section_toolcalling, "multitenant": section_multitenant,
    "jsonschemabench": section_jsonschemabench, "strings": section_strings, "ebnf": section_ebnf,
    "fresh_tools": section_fresh_tools}
BARS: dict[str, tuple[str, Callable[[dict], tuple[str, bool | None]]]] = {
    "toolcalling": ("tool calling: xg2 p50 ≤ llguidance p50, p99 < 10 ms", bar_toolcalling),
    "multitenant": ("multitenant as text: p50 < 1 ms, p99 < 5 ms", bar_multitenant),
    "jsonschemabench": ("JSONSchemaBench: p50 ≤ llguidance's, p99 < 20 ms", bar_jsonschemabench),
    "strings": ("strings: TTFM < 5 ms at every bound", bar_strings),
    "ebnf": ("EBNF: every first mask < 20 ms", bar_ebnf),
    "fresh_tools": ("fresh tools: xg2 ≤ llguidance at 8, 32, 128 tools", bar_fresh_tools),
}


def summary_table(sections: dict[str, dict]) -> tuple[str, list[dict]]:
    bars, rows = [], []
    for name, (bar, judge) in BARS.items():
        if name not in sections:
            measured, ok = "not run", None
        elif "error" in sections[name]:
            measured, ok = f"section failed: {sections[name]['error']}", None
        else:
            measured, ok = judge(sections[name])
        verdict = "—" if ok is None else ("**met**" if ok else "not met")
        bars.append({"section": name, "bar": bar, "measured": measured, "met": ok})
        rows.append([bar, measured, verdict])
    return md_table(["bar", "measured", "verdict"], rows, "|---|---|---|"), bars


def save(path: Path, payload: dict) -> None:
    path.write_text(json.dumps(payload, indent=1, ensure_ascii=False, default=str) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(SECTIONS), help="comma-separated workloads (default: all)")
    ap.add_argument("--quick", action="store_true",
                    help="fewer requests, schemas and repeats (about 2 minutes)")
    ap.add_argument("--with-slow", action="store_true",
                    help="also xgrammar where it takes seconds per input (JSONSchemaBench, strings, EBNF)")
    ap.add_argument("--prefill-ms", type=float, default=0.0,
                    help="toolcalling and multitenant: a pause between each first mask and its walk, standing "
                         "for the model's prefill that a background precompute overlaps (default 0: none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER)
    ap.add_argument("--json", type=Path, help="write every figure here (after each workload)")
    ap.add_argument("--worker", nargs=3, metavar=("KIND", "ENGINE", "ARG"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        kind, engine, arg = args.worker
        print(json.dumps(worker(kind, engine, int(arg), args.tokenizer, args.seed)), flush=True)
        return 0
    only = [s for s in args.only.split(",") if s]
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown:
        raise SystemExit(f"unknown workloads {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    args.profile = QUICK if args.quick else FULL
    bench_toolcalling.PREFILL_S = bench_multitenant.PREFILL_S = args.prefill_ms / 1e3
    started = time.perf_counter()
    vocab = load_vocab(args.tokenizer)
    for module in ("xg2", "llguidance", "xgrammar"):   # imported before the runs, then frozen (see freeze)
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    log(f"tokenizer {args.tokenizer.name} ({vocab.size} tokens); profile {args.profile}")
    payload: dict[str, Any] = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "profile"},
        "profile": asdict(args.profile), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "versions": {"xgrammar": engines.package_version("xgrammar"),
                     "llguidance": engines.package_version("llguidance")},
        "xg2_source": bench_jsonschema._git_state(), "sections": {}}
    for name in SECTIONS:
        if name not in only:
            continue
        t = time.perf_counter()
        try:
            sec = RUNNERS[name](args, vocab)
        except Exception as exc:  # noqa: BLE001 - one failed workload must not lose the others
            log(f"[{name}] failed: {type(exc).__name__}: {exc}")
            sec = {"error": f"{type(exc).__name__}: {exc}"}
        sec["seconds"] = round(time.perf_counter() - t, 1)
        payload["sections"][name] = sec
        if "table" in sec:
            print(f"\n## {sec['title']}\n\n{sec['table']}")
            for note in sec.get("notes", []):
                print(f"- {note}")
            print(flush=True)
        log(f"[{name}] done in {sec['seconds']:.0f} s")
        if args.json:
            save(args.json, payload)
    table, bars = summary_table(payload["sections"])
    payload["bars"] = bars
    payload["seconds"] = round(time.perf_counter() - started, 1)
    print(f"\n## Summary: bars (xg2 with `GrammarCompiler(info)` defaults; {payload['seconds']:.0f} s)"
          f"\n\n{table}")
    if args.json:
        save(args.json, payload)
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
