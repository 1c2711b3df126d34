"""Compile time of ordinary large inputs: xg2 vs xgrammar (vs llguidance), issue 15 §7.

    python benchmarks/bench_compile.py [--tokenizer PATH] [--engines xg2,xgrammar,llguidance]
                                       [--cases a,b] [--repeat N] [--timeout S] [--json OUT]

A server compiles whatever schema a tenant sends; an input that is merely big (hundreds of
properties, a long enum, a long rule chain) must not stall it. Each (engine, case, run) runs in a
fresh process, so no compile cache, memo or warmed allocator of an earlier case helps a later one;
the tokenizer is loaded and the compiler constructed before the clock starts, and the time is that
of the compile call alone, with each engine's default options (xg2's includes its compile-time
precompute of the first mask). A run that passes `--timeout` is reported as over it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(REPO))

from engines import DEFAULT_TOKENIZER

#: Strings a chat template uses, for TagDispatch's excluded strings (the first n of them).
TEMPLATE_STRINGS = ("<|im_start|>", "<|im_end|>", "</think>", "<tool_response>", "</tool_response>",
                    "<|endoftext|>", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>")


def _object(n: int) -> dict:
    kinds = ({"type": "string"}, {"type": "integer"}, {"type": "boolean"}, {"type": "number"},
             {"type": "array", "items": {"type": "string"}})
    return {"type": "object", "properties": {f"field_{i}": kinds[i % len(kinds)] for i in range(n)}}


def _nested(depth: int) -> dict:
    schema: dict = {"type": "object", "properties": {"leaf": {"type": "string"}}, "required": ["leaf"]}
    for i in range(depth):
        schema = {"type": "object", "properties": {f"level_{i}": schema, "id": {"type": "integer"},
                                                     "tags": {"type": "array", "items": {"type": "string"}}},
                  "required": [f"level_{i}"]}
    return schema


def _chain(n: int) -> str:
    lines = ["root ::= r0"]
    lines += [f'r{i} ::= "a{i % 10}" r{i + 1} | "b"' for i in range(n)]
    lines.append(f'r{n} ::= "end"')
    return "\n".join(lines) + "\n"


#: Excluded words with distinct first letters that also occur inside other words: the hardest
#: shape for free text written as one expression (see grammar/text.py).
WORDS = ("apple", "banana", "cherry", "delta", "echo", "foxtrot", "golf", "hotel")


def _triggered_tags(n_excludes: int, strings: tuple[str, ...] = TEMPLATE_STRINGS) -> dict:
    """A tool-calling structural tag whose free text must not hold the first n of `strings`
    (TagDispatch with excluded strings underneath)."""
    call = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"]}
    return {"type": "structural_tag", "format": {
        "type": "triggered_tags", "triggers": ["<tool_call>"],
        "tags": [{"begin": "<tool_call>", "content": {"type": "json_schema", "json_schema": call},
                  "end": "</tool_call>"}],
        "excludes": list(strings[:n_excludes])}}


def _alternation(n: int) -> str:
    return "root ::= " + " | ".join(f'"keyword_{i}_{i * 7919 % 1000}"' for i in range(n)) + "\n"


def _regex() -> str:
    # An ordinary large pattern: a log line with alternatives, bounded repetitions and classes.
    words = "|".join(f"svc{i:03d}" for i in range(300))
    return (r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|[+-]\d{2}:\d{2}) "
            r"(DEBUG|INFO|WARN|ERROR|FATAL) \[(" + words + r")\] "
            r"([a-z][a-z0-9_]{0,31}=(\"[^\"\n]{0,64}\"|[0-9]{1,12}|[a-z]{1,16}) ){0,12}"
            r"[A-Za-z0-9 ,.:;'()-]{0,200}")


WARM_UP = {"json": {"type": "object", "properties": {"a": {"type": "string"}}}, "ebnf": 'root ::= "a" [0-9]*\n',
           "regex": "[a-z]+[0-9]?", "tag": {
    "type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<a>"], "excludes": ["<b>"], "tags": [
        {"begin": "<a>", "content": {"type": "json_schema", "json_schema": {"type": "integer"}}, "end": "</a>"}]}}}


def cases() -> dict[str, tuple[str, object]]:
    """name -> (kind, input); kind is json, ebnf, regex or tag (a structural tag)."""
    return {
        "object_300_optional": ("json", _object(300)),
        "object_500_optional": ("json", _object(500)),
        "enum_50000_strings": ("json", {"enum": [f"value-{i:05d}-{i * 2654435761 % 100000:05d}" for i in range(50000)]}),
        "nested_objects_40": ("json", _nested(40)),
        "ebnf_chain_3000": ("ebnf", _chain(3000)),
        "triggered_tags_6_excludes": ("tag", _triggered_tags(6)),
        "triggered_tags_8_excludes": ("tag", _triggered_tags(8)),
        "triggered_tags_8_words": ("tag", _triggered_tags(8, WORDS)),
        "alternation_5000_literals": ("ebnf", _alternation(5000)),
        "regex_log_line": ("regex", _regex()),
    }


# ------------------------------------------------------------------ one run (child process)


def run_one(engine: str, case: str, tokenizer: Path) -> dict:
    kind, data = cases()[case]

    def prepare(x):
        return x
    if engine == "xg2":
        import xg2

        info = xg2.TokenizerInfo.from_huggingface(str(tokenizer))
        compiler = xg2.GrammarCompiler(info)
        call = {"json": compiler.compile_json_schema, "ebnf": compiler.compile_grammar,
                "regex": compiler.compile_regex, "tag": compiler.compile_structural_tag}[kind]
        errors: tuple[type[BaseException], ...] = (xg2.XG2Error,)
    elif engine == "xgrammar":
        import warnings

        import xgrammar
        from transformers import PreTrainedTokenizerFast

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            info = xgrammar.TokenizerInfo.from_huggingface(PreTrainedTokenizerFast(tokenizer_file=str(tokenizer)))
        compiler = xgrammar.GrammarCompiler(info)
        call = {"json": compiler.compile_json_schema, "ebnf": compiler.compile_grammar,
                "regex": compiler.compile_regex, "tag": compiler.compile_structural_tag}[kind]
        errors = (RuntimeError, ValueError)
    elif engine == "llguidance":
        import llguidance
        import llguidance.hf
        from transformers import PreTrainedTokenizerFast

        tok = llguidance.hf.from_tokenizer(PreTrainedTokenizerFast(tokenizer_file=str(tokenizer)))
        if kind == "tag":       # excluded strings: no llguidance form (see engines.structural_tag_input)
            return {"error": "not converted: excludes", "skip": True}
        if kind == "json":
            def call(x):
                return _llg(llguidance, tok, llguidance.LLMatcher.grammar_from_json_schema(x))
        elif kind == "regex":
            def call(x):
                return _llg(llguidance, tok, llguidance.LLMatcher.grammar_from_regex(x))
        else:
            from ebnf_to_lark import ebnf_to_lark

            def prepare(x):     # our conversion to Lark, outside the timing
                return llguidance.LLMatcher.grammar_from_lark(ebnf_to_lark(x))
            try:
                data = prepare(data)
            except Exception as e:  # noqa: BLE001 - TagDispatch has no Lark form here
                return {"error": f"not converted: {type(e).__name__}", "skip": True}

            def call(x):
                return _llg(llguidance, tok, x)
        errors = (RuntimeError, ValueError)
    else:
        raise SystemExit(f"unknown engine {engine}")
    # A server has its modules imported and its tables warm: one small input of the same kind first.
    call(prepare(WARM_UP[kind]))
    t0 = time.perf_counter()
    try:
        call(data)
    except errors as e:
        return {"seconds": time.perf_counter() - t0, "error": f"{type(e).__name__}: {str(e)[:120]}"}
    return {"seconds": time.perf_counter() - t0}


def _llg(llguidance, tok, grammar):
    matcher = llguidance.LLMatcher(tok, grammar, log_level=0)
    if matcher.is_error():
        raise RuntimeError(matcher.get_error())
    return matcher


# ------------------------------------------------------------------ driver


def measure(engine: str, case: str, tokenizer: Path, timeout: float) -> dict:
    cmd = [sys.executable, __file__, "--worker", engine, case, "--tokenizer", str(tokenizer)]
    try:
        out = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout + 30)
    except subprocess.TimeoutExpired:
        return {"seconds": None, "error": f"over {timeout:.0f} s"}
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        tail = (out.stderr.strip().splitlines() or ["?"])[-1]
        return {"seconds": None, "error": f"exit {out.returncode}: {tail[:120]}"}
    return json.loads(lines[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER)
    ap.add_argument("--engines", default="xg2,xgrammar")
    ap.add_argument("--cases", default=",".join(cases()))
    ap.add_argument("--repeat", type=int, default=1, help="fresh processes per engine and case (median)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds before a run is given up")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--worker", nargs=2, metavar=("ENGINE", "CASE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(run_one(args.worker[0], args.worker[1], args.tokenizer)), flush=True)
        return 0
    engines = [e for e in args.engines.split(",") if e]
    names = [c for c in args.cases.split(",") if c]
    unknown = set(names) - set(cases())
    if unknown:
        raise SystemExit(f"unknown cases: {', '.join(sorted(unknown))}")
    results: dict[str, dict[str, dict]] = {}
    for name in names:
        results[name] = {}
        for engine in engines:
            runs = [measure(engine, name, args.tokenizer, args.timeout) for _ in range(max(1, args.repeat))]
            secs = [r["seconds"] for r in runs if r.get("seconds") is not None]
            results[name][engine] = {"seconds": statistics.median(secs) if secs else None,
                                     "error": next((r["error"] for r in runs if "error" in r), None)}
            print(f"  {name:28s} {engine:10s} {_cell(results[name][engine])}", file=sys.stderr, flush=True)
    _table(results, engines)
    if args.json:
        args.json.write_text(json.dumps({"tokenizer": str(args.tokenizer), "results": results}, indent=1))
    return 0


def _cell(r: dict) -> str:
    if r["seconds"] is None:
        return f"— ({r['error']})" if r["error"] else "—"
    return f"{r['seconds'] * 1e3:9.1f} ms"


def _table(results: dict[str, dict[str, dict]], engines: list[str]) -> None:
    head = ["case"] + [f"{e} ms" for e in engines] + (["xg2/xgrammar"] if {"xg2", "xgrammar"} <= set(engines) else [])
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    notes = []
    for name, row in results.items():
        cells = [name]
        for e in engines:
            r = row[e]
            if r["seconds"] is None:
                cells.append("n/a" if r["error"] and "not converted" in r["error"] else "error")
                if r["error"] and "not converted" not in r["error"]:
                    notes.append(f"{name} / {e}: {r['error']}")
            else:
                cells.append(f"{r['seconds'] * 1e3:.0f}")
                if r["error"]:
                    notes.append(f"{name} / {e}: {r['error']}")
        if len(head) > len(engines) + 1:
            a, b = row["xg2"]["seconds"], row["xgrammar"]["seconds"]
            cells.append(f"{a / b:.2f}" if a is not None and b else "—")
        print("| " + " | ".join(cells) + " |")
    for n in notes:
        print(f"- {n}")


if __name__ == "__main__":
    raise SystemExit(main())
