"""Tool calling with a structural tag: xg2, xgrammar and llguidance on the same requests and tokens.

    python benchmarks/bench_toolcalling.py [--requests 500] [--tools 8] [--seed 0] [--skip 100]
        [--engines xg2,xg2-nocache,llguidance,xgrammar] [--xgrammar-requests 50] [--json OUT.json]

**Requests.** Request i offers 8 tools (``--tools``) drawn uniformly without replacement from
``../shared/data/tools/registry.jsonl`` (the same seeded draw as bench_multitenant.py), in a
Qwen-style structural tag in xgrammar's JSON form::

    {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<tool_call>"],
      "tags": [{"type": "tag", "begin": "<tool_call>\\n{\\"name\\": \\"<NAME>\\", \\"arguments\\": ",
                "content": {"type": "json_schema", "json_schema": <the tool's parameters>},
                "end": "}\\n</tool_call>"}, ... one per tool, in draw order ...],
      "at_least_one": false, "stop_after_first": false}}

i.e. free text in which ``<tool_call>`` must start a call of one of the 8 tools whose arguments
follow its schema, any number of calls, text between and after them. One compiler serves all
requests of an engine, on one thread (DeepSeek-V3 vocabulary by default).

**What each engine is given.**

* ``xg2``: ``GrammarCompiler(info, max_threads=1, precompute_budget_ms=0,
  cache_limit_bytes=32 MB).compile_structural_tag(tag)`` with the dict; ``xg2-nocache`` the same
  without compile cache or cross-grammar pool (bench_multitenant.XG2_CONFIGS; ``xg2-background``
  is also accepted). xg2's structural-tag JSON schemas take no options: any whitespace, strict
  mode (a missing ``additionalProperties`` means false), not lenient (a keyword it cannot enforce
  fails the compile; no registry tool does).
* ``xgrammar`` 0.2.8: ``GrammarCompiler(info, max_threads=1, cache_enabled=False)
  .compile_structural_tag(tag)`` with the same dict (also strict, any whitespace; xgrammar relaxes
  what it cannot enforce, and fails on a draft-4 boolean ``exclusiveMinimum``, which one tool has).
* ``llguidance``: ``LLMatcher(tokenizer, grammar)`` where grammar is
  ``grammar_from_lark(StructTag.to_grammar([StructTag(trigger="<tool_call>", begin=<begin>,
  grammar=<schema>, end="}\\n</tool_call>"), ...], assume_special=False))`` — Lark where each
  call is a lazy lexeme ``TEXT "<tool_call>"`` then the rest of the begin, ``%json {schema}`` and
  the end, and ``TEXT: /(.|\\n)*/`` closes the output (``<tool_call>`` is not a special token of
  the vocabulary, hence ``assume_special=False``). Each schema is first written out as strict
  mode reads it (engines.strict_schema: ``additionalProperties: false`` on object schemas that
  do not say otherwise), since llguidance has no such mode; its JSON options are llguidance's
  defaults (flexible whitespace, ``lenient: false``), the ones engines.LLGuidanceEngine uses
  (``llguidance-lenient`` adds ``"x-guidance": {"lenient": true}`` to each schema;
  ``llguidance-noforce`` adds ``%llguidance {"no_forcing": true}``). This conversion is done
  before the clock starts (``prep_ms`` in the rows records its cost, about 0.3 ms).

Differences that remain. Along the outputs (the mask comparison below): llguidance by default
allows only the canonical tokenization of a string the grammar forces (the tag's begin and end,
property names), where xg2 and xgrammar allow every tokenization (``llguidance-noforce`` lifts
this); inside JSON strings llguidance refuses DEL (0x7F) and the ``\\/`` escape; xgrammar's free
text also allows the 375 tokens that cannot begin valid UTF-8 (xg2's and llguidance's free text
is UTF-8). Off the outputs (small cases): llguidance accepts ``\\uXXXX`` escapes only for
control characters; xg2 closes a bare ``{"type": "object"}`` (only ``{}``), xgrammar does not;
xgrammar requires an object for a ``properties``-only schema, xg2 and llguidance do not;
xgrammar ignores ``{"not": {}}`` (llguidance refuses it unless lenient).

**Output.** Per request one model-like output, the same token sequence for every engine: a short
sentence, then one or two calls (35%: two) of the request's tools, joined by ``"\\n"``:
``<tool_call>\\n{"name": "<tool>", "arguments": <args>}\\n</tool_call>``, with ``<args>`` a
seeded instance of the tool's parameters (schema_instances.py; validated with jsonschema;
``json.dumps(..., ensure_ascii=False)``). The text is encoded with the tokenizer
(``add_special_tokens=False``).

**Measured.** Time to first mask (TTFM) = compile + new matcher + first bitmask fill. Then the
output is teacher-forced: before every later token the bitmask is filled (timed), the token is
checked against the mask and accepted (not timed); after the last token one more fill (timed),
where EOS must be allowed, then EOS is accepted. A token outside the mask, a refused token or a
missing EOS is recorded as an error of that engine and request (the walk continues past a mask
miss when the matcher still accepts the token). ``gc.collect()`` runs before each request and
garbage collection is off while it runs. Summaries leave out the first ``--skip`` requests
(warm-up; at most half of an engine's requests); mask figures use the requests walked without
error. TTFM is also split by how many of the request's tools no earlier request had (all
requests). xgrammar runs on the first ``--xgrammar-requests`` only (it compiles about ten times
slower than the others).

**Mask agreement.** Every mask along the way is hashed (tokens below the vocabulary size, added
special tokens left out); each engine's masks are compared with the first engine's, step by
step, and for a few differing requests the first differing mask is rebuilt in both engines to
list tokens only one allows.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import random
import statistics
import sys
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.append(str(HERE.parent))

from bench_multitenant import XG2_CONFIGS, load_tools, make_engine_and_compiler, sample_tools
from engines import DEFAULT_TOKENIZER, Engine, Vocab, load_vocab, percentile
from schema_instances import Unsatisfiable, valid_instance

#: Seconds between a request's first mask and its walk, standing for the model's prefill, which a
#: background precompute overlaps (bench_ttfm.py --prefill-ms); 0: the walk starts at once.
PREFILL_S = 0.0

TRIGGER = "<tool_call>"
END = "}\n</tool_call>"
SENTENCES = [
    "Let me look that up for you.",
    "I'll use {tool} to get this information.",
    "Sure — calling {tool} now.",
    "To answer that, I need to call a tool first.",
    "I'll check the latest data before answering.",
    "好的，我来调用 {tool} 查询一下。",
    "Good question! Let me fetch the details with {tool}.",
    "I can help with that. First, I'll gather what we need.",
]
ERROR_KINDS = ("compile", "mask", "reject", "end")


def begin_of(name: str) -> str:
    return f'{TRIGGER}\n{{"name": "{name}", "arguments": '


def structural_tag(tools: list[dict]) -> dict:
    """The Qwen-style triggered_tags structural tag over `tools` (OpenAI function objects)."""
    tags = [{"type": "tag", "begin": begin_of(t["name"]),
             "content": {"type": "json_schema", "json_schema": t.get("parameters", {})}, "end": END}
            for t in tools]
    return {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": [TRIGGER], "tags": tags,
                                                 "at_least_one": False, "stop_after_first": False}}


@dataclass
class Request:
    i: int
    picks: list[int]
    tools: list[str]
    tag: dict
    text: str = ""
    tokens: list[int] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)   # tools whose arguments could not be made, etc.


def model_output(chosen: list[dict], rng: random.Random, two_calls: float = 0.35) -> tuple[str, list[str], list[str]]:
    """(text, tools called, notes) of a model-like output over `chosen` (function objects): a
    sentence, then one call (two with probability `two_calls`) with seeded valid arguments."""
    wanted = 2 if rng.random() < two_calls else 1
    order = list(chosen)
    rng.shuffle(order)
    calls: list[tuple[str, Any]] = []
    notes = []
    for tool in order:
        if len(calls) == wanted:
            break
        try:
            calls.append((tool["name"], valid_instance(tool.get("parameters", {}), rng)))
        except Unsatisfiable as exc:
            notes.append(f"no arguments for {tool['name']}: {exc}")
    if not calls:
        return "", [], notes + ["no output: no tool's arguments could be made"]
    sentence = rng.choice(SENTENCES).format(tool=calls[0][0])
    text = "\n".join([sentence] + [begin_of(name) + json.dumps(args, ensure_ascii=False) + END
                                  for name, args in calls])
    return text, [name for name, _ in calls], notes


def make_requests(n: int, per_request: int, seed: int, vocab: Vocab, two_calls: float = 0.35) -> list[Request]:
    tools = load_tools()
    out = []
    for i, pick in enumerate(sample_tools(n, per_request, seed, len(tools))):
        chosen = [tools[k] for k in pick]
        req = Request(i, pick, [t["name"] for t in chosen], structural_tag(chosen))
        text, calls, notes = model_output(chosen, random.Random(seed * 1_000_003 + i), two_calls)
        req.notes += notes
        if calls:
            req.text, req.calls = text, calls
            req.tokens = vocab.encode(req.text)
            if vocab.hf.decode(req.tokens, skip_special_tokens=False) != req.text:
                req.notes.append("tokens do not decode to the text")
        out.append(req)
    return out


# ------------------------------------------------------------------ masks


class MaskView:
    """Reads a filled bitmask: one token's bit, and a digest of the comparable part (token ids
    below the vocabulary size, the tokenizer's added/special tokens cleared)."""

    def __init__(self, vocab: Vocab) -> None:
        self.size = vocab.size
        self.special = np.array(sorted(i for i in vocab.hf.get_added_tokens_decoder() if i < vocab.size),
                                dtype=np.int64)

    @staticmethod
    def words(bitmask: Any) -> np.ndarray:
        return np.asarray(bitmask).reshape(-1).view(np.uint32)

    def allows(self, bitmask: Any, token: int) -> bool:
        w = self.words(bitmask)
        return (token >> 5) < len(w) and bool((int(w[token >> 5]) >> (token & 31)) & 1)

    def bits(self, bitmask: Any) -> np.ndarray:
        b = np.unpackbits(self.words(bitmask).view(np.uint8), bitorder="little")[: self.size]
        if len(b) < self.size:
            b = np.concatenate([b, np.zeros(self.size - len(b), dtype=np.uint8)])
        b[self.special] = 0
        return b

    def digest(self, bitmask: Any) -> tuple[bytes, int]:
        """A hash of the comparable bits and how many tokens they allow."""
        bits = self.bits(bitmask)
        return hashlib.blake2b(np.packbits(bits).tobytes(), digest_size=8).digest(), int(bits.sum())


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


def _context(vocab: Vocab, tokens: list[int], step: int) -> str:
    return vocab.hf.decode(tokens[:step], skip_special_tokens=False)[-60:]


# ------------------------------------------------------------------ runs


def run_engine(name: str, vocab: Vocab, requests: list[Request], view: MaskView, compare: bool) -> dict:
    engine, compiler = make_engine_and_compiler(name, vocab)
    xg2_stats = name in XG2_CONFIGS
    bitmask = engine.new_bitmask()
    rows: list[dict] = []
    digests: dict[int, list[tuple[bytes, int]]] = {}
    seen: set[int] = set()
    eos = vocab.eos_id
    for req in requests:
        row: dict[str, Any] = {"i": req.i, "new_tools": len(set(req.picks) - seen)}
        seen |= set(req.picks)
        rows.append(row)
        before = compiler.cache_stats() if xg2_stats else None
        try:
            t = time.perf_counter()
            given = engine.structural_tag_input(req.tag)
            row["prep_ms"] = (time.perf_counter() - t) * 1e3
            gc.collect()
            gc.disable()
            t = time.perf_counter()
            handle = engine.compile_structural_tag(given, compiler)
            matcher = engine.new_matcher(handle)
            engine.fill(matcher, bitmask)
            row["ttfm_ms"] = (time.perf_counter() - t) * 1e3
        except Exception as exc:  # noqa: BLE001 - recorded per request
            gc.enable()
            row.update(error_kind="compile", error=_err(exc))
            continue
        if PREFILL_S:
            time.sleep(PREFILL_S)
        try:
            walk(engine, matcher, bitmask, req, row, view, vocab, eos, digests.setdefault(req.i, []) if compare else None)
        finally:
            gc.enable()
        if xg2_stats:
            after = compiler.cache_stats()
            for k in ("hits", "partial_hits", "misses"):
                row[k] = after[k] - before[k]
            row["cache_bytes"] = compiler.get_cache_size_bytes()
    return {"engine": name, "version": engine.version,
            "options": XG2_CONFIGS.get(name, engine.json_options), "rows": rows,
            "_digests": digests, "_engine": engine, "_compiler": compiler}


def walk(engine: Engine, matcher: Any, bitmask: Any, req: Request, row: dict, view: MaskView, vocab: Vocab,
         eos: int | None, digests: list[tuple[bytes, int]] | None) -> None:
    """Teacher-force the request's tokens; fill (timed) before each but the first (its fill is
    part of TTFM) and once at the end, where EOS must be allowed."""
    times: list[float] = []
    row["mask_us"] = times
    if not req.tokens:
        return
    tokens = req.tokens
    for step in range(len(tokens) + 1):
        if step:
            t = time.perf_counter()
            engine.fill(matcher, bitmask)
            times.append((time.perf_counter() - t) * 1e6)
        if digests is not None:
            digests.append(view.digest(bitmask))
        if step == len(tokens):
            break
        tok = tokens[step]
        allowed = view.allows(bitmask, tok)
        first_miss = not allowed and "error" not in row
        if not allowed:
            row["mask_misses"] = row.get("mask_misses", 0) + 1
        if first_miss:
            row.update(error_kind="mask", error=f"token {step} {vocab.hf.id_to_token(tok)!r} ({tok}) not in the "
                                                f"mask after {_context(vocab, tokens, step)!r}")
        ok = engine.accept(matcher, tok)
        if first_miss:
            row["error"] += " (accepted anyway)" if ok else " (and refused)"
        if not ok:
            if "error" not in row:
                row.update(error_kind="reject", error=f"token {step} {vocab.hf.id_to_token(tok)!r} ({tok}) refused "
                                                      f"after {_context(vocab, tokens, step)!r}")
            return
    if eos is None:
        return
    in_mask = view.allows(bitmask, eos)
    if (not in_mask or not engine.accept_eos(matcher, eos)) and "error" not in row:
        row.update(error_kind="end", error=f"EOS {'refused' if view.allows(bitmask, eos) else 'not in the mask'} "
                                               f"at the end (completed: {engine.is_completed(matcher)})")


def allowed_at(result: dict, req: Request, step: int, view: MaskView) -> np.ndarray | None:
    """Rebuild an engine's mask at `step` of a request's tokens (for the disagreement examples)."""
    engine, compiler = result["_engine"], result["_compiler"]
    try:
        matcher = engine.new_matcher(engine.compile_structural_tag(engine.structural_tag_input(req.tag), compiler))
        bitmask = engine.new_bitmask()
        for tok in req.tokens[:step]:
            if not engine.accept(matcher, tok):
                return None
        engine.fill(matcher, bitmask)
        return view.bits(bitmask)
    except Exception:  # noqa: BLE001
        return None


def agreement(results: list[dict], requests: list[Request], view: MaskView, vocab: Vocab, examples: int) -> list[dict]:
    """Each engine's masks against the first engine's, step by step. A differing step where one
    of the two masks allows a single token is counted apart as *forced* (llguidance, by default,
    allows only the canonical tokenization of a string the grammar forces); the examples are the
    first differing steps that are not forced, if any."""
    if len(results) < 2:
        return []
    ref = results[0]
    out = []
    for res in results[1:]:
        n_req = n_diff_req = n_steps = n_diff_steps = n_forced = 0
        firsts = []
        for i, mine in res["_digests"].items():
            theirs = ref["_digests"].get(i)
            if not theirs:
                continue
            k = min(len(mine), len(theirs))
            n_req += 1
            n_steps += k
            diff = [s for s in range(k) if mine[s][0] != theirs[s][0]]
            if diff:
                n_diff_req += 1
                n_diff_steps += len(diff)
                forced = [s for s in diff if min(mine[s][1], theirs[s][1]) == 1]
                n_forced += len(forced)
                other = [s for s in diff if s not in set(forced)]
                firsts.append((bool(other), i, (other or diff)[0], len(diff)))
        firsts.sort(key=lambda f: not f[0])     # stable: unforced differences first, by request
        entry = {"engine": res["engine"], "reference": ref["engine"], "requests": n_req,
                 "requests_differing": n_diff_req, "steps": n_steps, "steps_differing": n_diff_steps,
                 "steps_differing_forced": n_forced, "examples": []}
        for _, i, step, count in firsts[:examples]:
            req = requests[i]
            a, b = allowed_at(ref, req, step, view), allowed_at(res, req, step, view)
            ex: dict[str, Any] = {"request": i, "step": step, "steps_differing": count,
                                  "after": vocab.hf.decode(req.tokens[:step], skip_special_tokens=False)[-80:]}
            if a is not None and b is not None:
                only_ref, only_res = np.nonzero(a & ~b)[0], np.nonzero(b & ~a)[0]
                ex.update({f"only_{ref['engine']}": len(only_ref), f"only_{res['engine']}": len(only_res),
                           f"only_{ref['engine']}_tokens": [vocab.hf.id_to_token(int(t)) for t in only_ref[:10]],
                           f"only_{res['engine']}_tokens": [vocab.hf.id_to_token(int(t)) for t in only_res[:10]]})
            entry["examples"].append(ex)
        out.append(entry)
    return out


# ------------------------------------------------------------------ summaries


def summary(result: dict, skip: int) -> dict:
    rows = [r for r in result["rows"] if r["i"] >= skip]
    ttfm = sorted(r["ttfm_ms"] for r in rows if "ttfm_ms" in r)
    masks = sorted(t for r in rows if "error" not in r for t in r.get("mask_us", []))
    errors = [r for r in result["rows"] if "error" in r]
    out: dict[str, Any] = {"engine": result["engine"], "requests": len(ttfm), "skip": skip,
                           "errors": len(errors), "errors_by_kind": dict(Counter(r["error_kind"] for r in errors))}
    if ttfm:
        out.update(ttfm_p50_ms=percentile(ttfm, 0.5), ttfm_p99_ms=percentile(ttfm, 0.99),
                   ttfm_mean_ms=statistics.fmean(ttfm))
    if masks:
        out.update(mask_mean_us=statistics.fmean(masks), mask_p50_us=percentile(masks, 0.5),
                   mask_p99_us=percentile(masks, 0.99), mask_max_us=masks[-1], tokens=len(masks))
    prep = [r["prep_ms"] for r in rows if "prep_ms" in r]
    if prep and max(prep) > 0.01:
        out["prep_mean_ms"] = statistics.fmean(prep)
    if rows and "hits" in rows[-1]:
        h, p, m = (sum(r.get(k, 0) for r in rows) for k in ("hits", "partial_hits", "misses"))
        total = max(1, h + p + m)
        out.update(hit_rate=h / total, partial_rate=p / total, miss_rate=m / total,
                   cache_bytes_last=rows[-1]["cache_bytes"])
    examples: dict[str, list[str]] = defaultdict(list)
    for r in errors:
        if len(examples[r["error_kind"]]) < 3:
            examples[r["error_kind"]].append(f"#{r['i']}: {r['error']}")
    out["error_examples"] = dict(examples)
    return out


def split_by_new_tools(results: list[dict]) -> dict[str, dict[int, dict]]:
    out = {}
    for res in results:
        groups: dict[int, list[float]] = defaultdict(list)
        for r in res["rows"]:
            if "ttfm_ms" in r:
                groups[r["new_tools"]].append(r["ttfm_ms"])
        out[res["engine"]] = {k: {"n": len(v), "p50_ms": percentile(sorted(v), 0.5), "mean_ms": statistics.fmean(v)}
                              for k, v in sorted(groups.items())}
    return out


def _f(v: Any, fmt: str) -> str:
    return "" if v is None else format(v, fmt)


def markdown(summaries: list[dict], split: dict, agree: list[dict]) -> str:
    lines = [("| engine | requests | TTFM p50 ms | TTFM p99 ms | TTFM mean ms | mask mean µs | mask p50 µs | "
              "mask p99 µs | tokens | errors (compile / mask / reject / end) | pool hits / partial / misses |"),
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for s in summaries:
        errs = " / ".join(str(s["errors_by_kind"].get(k, 0)) for k in ERROR_KINDS)
        rates = (f"{s['hit_rate']:.1%} / {s['partial_rate']:.1%} / {s['miss_rate']:.1%}" if "hit_rate" in s else "")
        lines.append(f"| {s['engine']} | {s['requests']} (from #{s['skip']}) | {_f(s.get('ttfm_p50_ms'), '.2f')} | "
                     f"{_f(s.get('ttfm_p99_ms'), '.2f')} | {_f(s.get('ttfm_mean_ms'), '.2f')} | "
                     f"{_f(s.get('mask_mean_us'), '.1f')} | {_f(s.get('mask_p50_us'), '.1f')} | "
                     f"{_f(s.get('mask_p99_us'), '.1f')} | {s.get('tokens', 0)} | {errs} | {rates} |")
    engines = list(split)
    news = sorted({k for v in split.values() for k in v})
    lines += ["", ("TTFM by number of new (never seen before) tools in the request, all requests: "
                   "n / p50 ms / mean ms"), "",
              "| new tools | " + " | ".join(engines) + " |", "|---:|" + "---|" * len(engines)]
    for k in news:
        cells = [(f"{c['n']} / {c['p50_ms']:.2f} / {c['mean_ms']:.2f}" if (c := split[e].get(k)) else "")
                 for e in engines]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    if agree:
        lines += ["", ("| masks of | against | requests compared | requests differing | steps differing / compared |"
                       " of which forced |"),
                  "|---|---|---:|---:|---:|---:|"]
        for a in agree:
            lines.append(f"| {a['engine']} | {a['reference']} | {a['requests']} | {a['requests_differing']} | "
                         f"{a['steps_differing']} / {a['steps']} | {a['steps_differing_forced']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--tools", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip", type=int, default=100, help="requests left out of the summary (warm-up)")
    ap.add_argument("--engines", default="xg2,xg2-nocache,llguidance,xgrammar")
    ap.add_argument("--xgrammar-requests", type=int, default=50)
    ap.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER))
    ap.add_argument("--no-compare", action="store_true", help="do not hash and compare masks across engines")
    ap.add_argument("--examples", type=int, default=3, help="disagreement examples per engine pair")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    vocab = load_vocab(Path(args.tokenizer))
    view = MaskView(vocab)
    t = time.perf_counter()
    requests = make_requests(args.requests, args.tools, args.seed, vocab)
    print(f"[requests] {len(requests)} made in {time.perf_counter() - t:.1f} s; mean "
          f"{statistics.fmean(len(r.tokens) for r in requests):.0f} tokens; "
          f"{sum(1 for r in requests if len(r.calls) == 2)} with two calls; "
          f"{sum(1 for r in requests if r.notes)} with notes", file=sys.stderr)
    for r in requests:
        for note in r.notes:
            print(f"[requests] #{r.i}: {note}", file=sys.stderr)
    results = []
    for name in args.engines.split(","):
        n = min(args.requests, args.xgrammar_requests) if name == "xgrammar" else args.requests
        t = time.perf_counter()
        res = run_engine(name, vocab, requests[:n], view, compare=not args.no_compare)
        print(f"[{name}] {n} requests in {time.perf_counter() - t:.1f} s ({res['version']})", file=sys.stderr)
        results.append(res)
    summaries = [summary(r, min(args.skip, len(r["rows"]) // 2)) for r in results]
    split = split_by_new_tools(results)
    agree = agreement(results, requests, view, vocab, args.examples)
    print(markdown(summaries, split, agree))
    for s in summaries:
        for kind, msgs in s["error_examples"].items():
            for m in msgs:
                print(f"- {s['engine']} {kind} error {m}")
    for a in agree:
        for ex in a["examples"]:
            print(f"- {a['engine']} vs {a['reference']}: {json.dumps(ex, ensure_ascii=False)}")
    if args.json:
        for r in results:
            for k in ("_digests", "_engine", "_compiler"):
                r.pop(k)
        reqs = [{k: v for k, v in asdict(r).items() if k not in ("tag", "tokens")} | {"n_tokens": len(r.tokens)}
                for r in requests]
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "summaries": summaries,
                                         "ttfm_by_new_tools": split, "mask_agreement": agree, "requests": reqs,
                                         "results": results}, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
