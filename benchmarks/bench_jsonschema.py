"""JSONSchemaBench: compliance, soundness and speed of xg2, xgrammar and llguidance on JSON Schemas.

    python benchmarks/bench_jsonschema.py [--subsets A,B] [--limit N] [--engines ...] [--walks K]
                                          [--json OUT] [--failures OUT]          # compliance
    python benchmarks/bench_jsonschema.py --speed [--subsets ...] [--limit N] [--json OUT]  # speed

Compliance: every engine compiles every schema (any whitespace, additional properties allowed
unless the schema says otherwise) and walks the DeepSeek-V3 tokens of every labelled test document
through its matcher; a valid document must be accepted and end with EOS, an invalid one must be
rejected somewhere or be unable to end.  With ``--walks K`` xg2 also draws K random token walks per
compiled schema and validates their text with the ``jsonschema`` package (soundness).

Speed (``--speed``): time to first mask (compile + first mask, from the schema dict) and per-token
mask time over the schema's first valid test document, one thread per engine.

Each engine runs in its own worker process, one at a time, with a time limit per schema (a hung or
crashed compile cannot stop the run).  See benchmarks/README.md for the option choices.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import multiprocessing as mp
import os
import random
import re
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
if importlib.util.find_spec("xg2") is None:
    # Fall back to the source checkout; a PYTHONPATH entry (e.g. a snapshot of xg2) wins.
    sys.path.append(str(REPO))

from engines import ALL_ENGINES, DEFAULT_TOKENIZER, KNOWN_ENGINES, Engine, load_vocab, make_engine, percentile
from report_jsonschema import (
    compliance_markdown,
    compliance_summary,
    is_compliant,
    reason_key,
    speed_markdown,
    speed_summary,
    walk_summary,
)

DATA_DIR = REPO.parent / "shared" / "data" / "jsonschemabench"
ALL_SUBSETS = (
    "Github_trivial", "Github_easy", "Github_medium", "Github_hard", "Github_ultra", "Glaiveai2K",
    "JsonSchemaStore", "Kubernetes", "Snowplow", "WashingtonPost", "MCPspec", "Handwritten",
    "Synthesized", "JME", "BFCL",
)
SPEED_SUBSETS = ("Github_easy", "Github_medium", "Github_hard", "Glaiveai2K", "Kubernetes", "Snowplow")

#: Random walks: probability of taking EOS when it is allowed, of restricting the choice to
#: "structural" tokens (those containing a quote, bracket, brace or comma, which close strings
#: and containers), and the step cap beyond which a walk is discarded as unfinished.
WALK_P_END = 0.3
WALK_P_STRUCTURAL = 0.5
WALK_MAX_STEPS = 400
STRUCTURAL_BYTES = frozenset(b'"]},')
#: Characters of a document or walk text kept in reports.
TEXT_KEEP = 600


def load_records(data_dir: Path, subsets: list[str], limit: int | None, ids: set[str] | None) -> list[dict]:
    """Records in file order (the data README's fixed shuffle), `limit` per subset; key order is kept."""
    records = []
    for subset in subsets:
        path = data_dir / f"{subset}.jsonl"
        if not path.exists():
            raise SystemExit(f"{path} not found (see {DATA_DIR.parent / 'README.md'})")
        n = 0
        with path.open(encoding="utf-8") as f:
            for line in f:
                if limit is not None and n >= limit:
                    break
                rec = json.loads(line)
                if ids and rec["id"] not in ids:
                    continue
                records.append(rec)
                n += 1
    return records


# ------------------------------------------------------------ documents in schema order


def _pointer(root: Any, ref: str) -> Any:
    node = root
    for part in ref[1:].lstrip("/").split("/") if ref not in ("#", "") else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _applicable(schema: Any, root: Any, data: Any, budget: list[int]) -> list[dict]:
    """The schemas that constrain `data` together: local `$ref`s followed, every `allOf` member,
    and of each `anyOf`/`oneOf` the branch whose `properties` name most of the document's members
    (the first on a tie), since that is the branch an engine's walk would have taken."""
    if not isinstance(schema, dict) or budget[0] <= 0:
        return []
    budget[0] -= 1
    out = [schema]
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        out += _applicable(_pointer(root, ref), root, data, budget)
    for sub in schema.get("allOf", []) if isinstance(schema.get("allOf"), list) else []:
        out += _applicable(sub, root, data, budget)
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if not isinstance(branches, list) or not branches:
            continue
        expanded = [_applicable(b, root, data, budget) for b in branches]

        def score(subs: list[dict]) -> int:
            if not isinstance(data, dict):
                return 0
            named = {k for s in subs if isinstance(s.get("properties"), dict) for k in s["properties"]}
            return len(named & data.keys())

        out += max(expanded, key=score)
    return out


def _search(pattern: str, key: str) -> bool:
    """Whether a `patternProperties` regex matches a key (Python's dialect stands in for ECMA 262)."""
    try:
        return re.search(pattern, key) is not None
    except (re.error, TypeError):
        return False


def schema_order(data: Any, schemas: list[Any], root: Any, depth: int = 0) -> Any:
    """`data` with object members reordered as the engines emit them: names from `properties`
    (then `required`) in schema order first, other members after in their own order.  All three
    engines fix member order this way, so a valid document written in another order is rejected
    by all of them; this reordering tells such rejections apart from real misjudgements."""
    if depth > 64:
        return data
    subs = [x for s in schemas for x in _applicable(s, root, data, [200])]
    if isinstance(data, dict):
        order: list[str] = []
        for s in subs:
            if isinstance(s.get("properties"), dict):
                order.extend(k for k in s["properties"] if k not in order)
        for s in subs:
            if isinstance(s.get("required"), list):
                order.extend(k for k in s["required"] if isinstance(k, str) and k not in order)
        keys = [k for k in order if k in data] + [k for k in data if k not in order]
        out = {}
        for k in keys:
            child = [s["properties"][k] for s in subs if isinstance(s.get("properties"), dict) and k in s["properties"]]
            child += [v for s in subs if isinstance(s.get("patternProperties"), dict)
                      for pat, v in s["patternProperties"].items() if _search(pat, k)]
            child += [s["additionalProperties"] for s in subs if isinstance(s.get("additionalProperties"), dict)]
            out[k] = schema_order(data[k], child, root, depth + 1)
        return out
    if isinstance(data, list):
        res = []
        for i, x in enumerate(data):
            child = []
            for s in subs:
                pre = s.get("prefixItems") if isinstance(s.get("prefixItems"), list) else \
                    s.get("items") if isinstance(s.get("items"), list) else None
                if pre is not None and i < len(pre):
                    child.append(pre[i])
                elif isinstance(s.get("items"), dict):
                    child.append(s["items"])
            res.append(schema_order(x, child, root, depth + 1))
        return res
    return data


#: Schema keywords whose value maps names to schemas, and keywords whose value is data.
NAME_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"})
DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})


def one_of_as_any_of(node: Any, names: bool = False) -> Any:
    """The schema with every `oneOf` read as `anyOf`: xg2 documents oneOf as non-exclusive, so a
    walk that fails only the exclusivity of a oneOf is an approximation, not unsoundness; a
    walk is excused exactly when it validates against this relaxed schema."""
    if isinstance(node, list):
        return [one_of_as_any_of(x) for x in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for k, v in node.items():
        if names:
            out[k] = one_of_as_any_of(v)
        elif k in DATA_KEYWORDS:
            out[k] = v
        elif k != "oneOf" or not isinstance(v, list):
            out[k] = one_of_as_any_of(v, names=k in NAME_MAPS)
    if not names and isinstance(node.get("oneOf"), list):
        alternatives = one_of_as_any_of(node["oneOf"])
        if "anyOf" in out:
            out["allOf"] = [*out.get("allOf", []), {"anyOf": alternatives}]
        else:
            out["anyOf"] = alternatives
    return out


# --------------------------------------------------------------------- worker side


def _validator(schema: Any, formats: bool) -> Any:
    """A jsonschema validator for the schema's declared draft (2020-12 when none is declared)."""
    import jsonschema

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        return cls(schema, format_checker=cls.FORMAT_CHECKER if formats else None)


def _failed_keyword(validator: Any, data: Any) -> str:
    """The JSON Schema keyword an invalid document breaks (jsonschema's best match), to group the
    invalid documents an engine wrongly accepts by the keyword it does not enforce."""
    import jsonschema

    try:
        err = jsonschema.exceptions.best_match(validator.iter_errors(data))
    except Exception as exc:  # noqa: BLE001 - an unresolvable $ref etc.
        return f"(validator error: {type(exc).__name__})"
    return str(err.validator) if err is not None else "(valid per jsonschema)"


class WorkerState:
    def __init__(self, engine: Engine, vocab: Any, opts: dict) -> None:
        self.engine = engine
        self.vocab = vocab
        self.opts = opts
        self.compiler = engine.json_compiler()
        self.eos = vocab.eos_id
        self._walk_tables: Any = None

    def walk_tables(self) -> Any:
        import numpy as np

        if self._walk_tables is None:
            tb = self.engine.token_bytes()
            structural = np.array([bool(STRUCTURAL_BYTES.intersection(b)) for b in tb], dtype=bool)
            stops = list(getattr(self.engine.info, "stop_token_ids", [self.eos]))
            self._walk_tables = (tb, structural, stops)
        return self._walk_tables


def _judge(st: WorkerState, handle: Any, text: str, check_masks: bool) -> dict:
    """Walk the tokens of `text` through a fresh matcher, then EOS."""
    eng = st.engine
    enc = st.vocab.hf.encode(text, add_special_tokens=False)
    ids = enc.ids
    out: dict[str, Any] = {"n_tokens": len(ids)}
    if st.vocab.hf.decode(ids, skip_special_tokens=False) != text:
        out["roundtrip"] = False
    m = eng.new_matcher(handle)
    bitmask = eng.new_bitmask() if check_masks else None
    for pos, tok in enumerate(ids):
        if check_masks:
            import numpy as np

            eng.fill(m, bitmask)
            in_mask = bool((np.asarray(bitmask).reshape(-1)[tok >> 5] >> (tok & 31)) & 1)
        ok = eng.accept(m, tok)
        if check_masks and ok != in_mask:
            out["mask_disagree"] = f"token {pos} ({tok}) in mask: {in_mask}, accepted: {ok}"
        if not ok:
            start, end = enc.offsets[pos]
            out["verdict"] = "rejected"
            out["pos"] = pos
            out["detail"] = f"token {pos} {text[start:end]!r} rejected after {text[max(0, start - 80):start]!r}"
            return out
    out["verdict"] = "accepted" if eng.accept_eos(m, st.eos) else "incomplete"
    if out["verdict"] == "incomplete":
        out["detail"] = f"cannot end after {text[-80:]!r}"
    return out


def _compliance_tests(st: WorkerState, handle: Any, rec: dict) -> list[dict]:
    schema = rec["schema"]
    detailed = st.engine.name.startswith("xg2")
    validator = None
    results = []
    for i, t in enumerate(rec["tests"]):
        valid = bool(t["valid"])
        text = json.dumps(t["data"], ensure_ascii=False)
        try:
            r = _judge(st, handle, text, st.opts["check_masks"])
        except Exception as exc:  # noqa: BLE001 - a crash inside the matcher is a finding
            r = {"verdict": "error", "detail": f"{type(exc).__name__}: {exc}"[:TEXT_KEEP],
                 "traceback": traceback.format_exc()[-2000:]}
        accepted = r["verdict"] == "accepted"
        r["i"] = i
        r["valid"] = valid
        r["right"] = accepted == valid and r["verdict"] != "error"
        any_order = accepted
        if not accepted and r["verdict"] != "error":
            try:
                reordered = json.dumps(schema_order(t["data"], [schema], schema), ensure_ascii=False)
            except RecursionError:
                reordered = text
            if reordered != text:
                try:
                    any_order = _judge(st, handle, reordered, False)["verdict"] == "accepted"
                except Exception:  # noqa: BLE001 - reported by the plain judgement already
                    any_order = False
                r["order_sensitive"] = any_order
        r["right_any_order"] = any_order == valid and r["verdict"] != "error"
        if detailed and not r["right"]:
            r["text"] = text[:TEXT_KEEP]
            if accepted and not valid:
                if validator is None:
                    validator = _validator(schema, formats=True)
                r["broken_keyword"] = _failed_keyword(validator, t["data"])
        if r["right"] and not detailed:
            r.pop("detail", None)
        results.append(r)
    return results


def _walk(st: WorkerState, handle: Any, rng: random.Random) -> tuple[str, Any]:
    """One random walk: ("done", bytes) | ("unfinished", None) | ("dead_end"|"disagree", detail)."""
    import numpy as np

    eng = st.engine
    tb, structural, stops = st.walk_tables()
    m = eng.new_matcher(handle)
    bitmask = eng.new_bitmask()
    out = bytearray()
    for _step in range(WALK_MAX_STEPS):
        eng.fill(m, bitmask)
        bits = np.unpackbits(np.asarray(bitmask).reshape(-1).view(np.uint8), bitorder="little")[: eng.vocab_size]
        bits = bits.astype(bool)
        stop_ok = [s for s in stops if s < bits.size and bits[s]]
        bits[[s for s in stops if s < bits.size]] = False
        if stop_ok and (rng.random() < WALK_P_END or not bits.any()):
            if not eng.accept(m, stop_ok[0]):
                return "disagree", f"stop token {stop_ok[0]} in mask but rejected after {bytes(out)[-200:]!r}"
            return "done", bytes(out)
        if not bits.any():
            return "dead_end", f"nothing allowed after {bytes(out)[-200:]!r}"
        if rng.random() < WALK_P_STRUCTURAL and (bits & structural).any():
            bits &= structural
        cand = np.flatnonzero(bits)
        tok = int(cand[rng.randrange(cand.size)])
        if not eng.accept(m, tok):
            return "disagree", f"token {tok} {tb[tok]!r} in mask but rejected after {bytes(out)[-200:]!r}"
        out += tb[tok]
    return "unfinished", None


def _relaxed_valid(schema: Any, doc: Any, formats: bool) -> bool:
    """Valid once oneOf is read as anyOf (see `one_of_as_any_of`)."""
    if '"oneOf"' not in json.dumps(schema):
        return False
    try:
        return _validator(one_of_as_any_of(schema), formats).is_valid(doc)
    except Exception:  # noqa: BLE001 - the relaxed schema cannot be evaluated either
        return False


def _walks(st: WorkerState, handle: Any, rec: dict, mode: str) -> dict:
    k, seed, formats = st.opts["walks"], st.opts["seed"], st.opts["format_checker"]
    rng = random.Random(f"{seed}/{rec['id']}/{mode}")
    stats: dict[str, Any] = {"done": 0, "valid": 0, "oneof_only": 0, "unfinished": 0, "unsound": [], "bugs": [],
                             "validator_error": None}
    try:
        validator = _validator(rec["schema"], formats)
    except Exception as exc:  # noqa: BLE001 - a schema the validator cannot load
        stats["validator_error"] = f"{type(exc).__name__}: {exc}"[:300]
        validator = None
    for _ in range(k):
        try:
            kind, payload = _walk(st, handle, rng)
        except Exception as exc:  # noqa: BLE001 - an exception inside the matcher is a bug to report
            kind, payload = "exception", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}"
        if kind == "unfinished":
            stats["unfinished"] += 1
            continue
        if kind != "done":
            stats["bugs"].append({"kind": kind, "detail": payload})
            continue
        stats["done"] += 1
        try:
            text = payload.decode("utf-8")
        except UnicodeDecodeError:
            stats["unsound"].append({"reason": "invalid UTF-8", "text": repr(payload[:TEXT_KEEP])})
            continue
        try:
            doc = json.loads(text)
        except ValueError as exc:
            stats["unsound"].append({"reason": f"not JSON: {exc}", "text": text[:TEXT_KEEP]})
            continue
        if validator is None:
            continue
        try:
            errors = list(validator.iter_errors(doc))
        except Exception as exc:  # noqa: BLE001 - unresolvable $ref, bad regex in the schema...
            stats["validator_error"] = f"{type(exc).__name__}: {exc}"[:300]
            continue
        if errors and _relaxed_valid(rec["schema"], doc, formats):
            stats["oneof_only"] += 1
        elif errors:
            import jsonschema

            best = jsonschema.exceptions.best_match(iter(errors))
            stats["unsound"].append({"reason": f"{best.validator}: {best.message}"[:TEXT_KEEP],
                                     "path": "/".join(map(str, best.absolute_path)), "text": text[:TEXT_KEEP]})
        else:
            stats["valid"] += 1
    return stats


def _compile(st: WorkerState, schema: Any, compiler: Any = None, **options: Any) -> tuple[Any, dict]:
    eng = st.engine
    t0 = time.perf_counter()
    try:
        handle = eng.compile_json_schema(schema, compiler if compiler is not None else st.compiler, **options)
    except eng.typed_errors as exc:
        return None, {"status": "error", "error_type": type(exc).__name__, "error": str(exc)[:TEXT_KEEP]}
    except Exception as exc:  # noqa: BLE001 - an untyped exception is a crash, reported as such
        return None, {"status": "crash", "error_type": type(exc).__name__, "error": str(exc)[:TEXT_KEEP],
                      "traceback": traceback.format_exc()[-3000:]}
    return handle, {"status": "ok", "compile_ms": (time.perf_counter() - t0) * 1e3}


def _compliance_job(st: WorkerState, rec: dict, send: Any) -> None:
    handle, info = _compile(st, rec["schema"])
    send(("compiled", info))
    if handle is None:
        return
    send(("tests", _compliance_tests(st, handle, rec)))
    if st.opts["walks"] > 0 and st.engine.name == "xg2":
        walks = {"nonstrict": _walks(st, handle, rec, "nonstrict")}
        del handle
        if st.opts["strict_walks"]:
            strict, sinfo = _compile(st, rec["schema"], strict_mode=True)
            walks["strict"] = _walks(st, strict, rec, "strict") if strict is not None else {"compile": sinfo}
        send(("walks", walks))


def _speed_job(st: WorkerState, rec: dict, send: Any) -> None:
    eng = st.engine
    ttfm, compile_ms = [], []
    handle = None
    for _ in range(st.opts["repeat"]):
        # Compiler and bitmask are per-tokenizer / per-batch state: made before the clock starts.
        compiler = eng.json_compiler() if st.opts["fresh_compiler"] else st.compiler
        bitmask = eng.new_bitmask()
        handle = None
        gc.collect()
        t0 = time.perf_counter_ns()
        try:
            handle = eng.compile_json_schema(rec["schema"], compiler)
            t1 = time.perf_counter_ns()
            m = eng.new_matcher(handle)
            eng.fill(m, bitmask)
            t2 = time.perf_counter_ns()
        except eng.typed_errors as exc:
            send(("compiled", {"status": "error", "error_type": type(exc).__name__, "error": str(exc)[:TEXT_KEEP]}))
            return
        except Exception as exc:  # noqa: BLE001
            send(("compiled", {"status": "crash", "error_type": type(exc).__name__, "error": str(exc)[:TEXT_KEEP]}))
            return
        compile_ms.append((t1 - t0) / 1e6)
        ttfm.append((t2 - t0) / 1e6)
    send(("compiled", {"status": "ok", "compile_ms": statistics.median(compile_ms),
                       "ttfm_ms": statistics.median(ttfm)}))
    doc = next((t["data"] for t in rec["tests"] if t["valid"]), None)
    res: dict[str, Any] = {"mask_us": []}
    if doc is not None:
        text = json.dumps(doc, ensure_ascii=False)
        ids = st.vocab.encode(text)
        bitmask = eng.new_bitmask()
        m = eng.new_matcher(handle)
        times = res["mask_us"]
        gc.collect()
        gc.disable()
        try:
            for pos, tok in enumerate(ids):
                t0 = time.perf_counter_ns()
                eng.fill(m, bitmask)
                times.append((time.perf_counter_ns() - t0) / 1e3)
                if not eng.accept(m, tok):
                    res["error"] = f"token {pos} of the first valid document rejected"
                    break
            else:
                t0 = time.perf_counter_ns()
                eng.fill(m, bitmask)  # the mask at the end, where EOS becomes legal
                times.append((time.perf_counter_ns() - t0) / 1e3)
                if not eng.accept_eos(m, st.eos):
                    res["error"] = "first valid document cannot end"
        finally:
            gc.enable()
    send(("tests", res))


def worker_main(conn: Any, engine_name: str, tokenizer: str, log_path: str, opts: dict) -> None:
    """Worker process: load the vocabulary and one engine, then run jobs sent by the parent."""
    with contextlib.suppress(OSError):
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 2)  # engine chatter and native crash messages go to the log, not the progress
        sys.stderr = os.fdopen(2, "w", buffering=1)
    vocab = load_vocab(Path(tokenizer))
    engine = make_engine(engine_name, vocab, vocab.size)
    if engine_name.startswith("llguidance") and opts.get("llguidance_options"):
        engine.json_options = {**engine.json_options, **opts["llguidance_options"]}
    if engine_name.startswith("xg2") and opts.get("xg2_compiler_options"):
        engine.compiler_options = dict(opts["xg2_compiler_options"])
    if engine_name.startswith("xg2") and opts.get("xg2_schema_options"):
        engine.json_options = {**engine.json_options, **opts["xg2_schema_options"]}
    st = WorkerState(engine, vocab, opts)
    conn.send(("ready", {"version": engine.version, "vocab_size": engine.vocab_size, "eos_id": vocab.eos_id,
                         "json_options": dict(engine.json_options)}))
    while True:
        job = conn.recv()
        if job is None:
            return
        kind, rec = job
        if kind == "compliance":
            _compliance_job(st, rec, conn.send)
        else:
            _speed_job(st, rec, conn.send)
        conn.send(("done", None))


# --------------------------------------------------------------------- parent side


class WorkerDied(RuntimeError):
    pass


class WorkerTimeout(RuntimeError):
    pass


class Worker:
    """One engine worker process; restarted after a timeout or a death."""

    def __init__(self, engine: str, args: argparse.Namespace, opts: dict) -> None:
        self.engine = engine
        self.args = args
        self.opts = opts
        self.proc: Any = None
        self.conn: Any = None
        self.info: dict = {}
        self.log = f"{args.worker_log}.{engine}.log"

    def start(self) -> None:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker_main, args=(child, self.engine, str(self.args.tokenizer),
                                                          self.log, self.opts), daemon=True)
        self.proc.start()
        child.close()
        self.conn = parent
        kind, info = self.recv(300)
        if kind != "ready":
            raise RuntimeError(f"{self.engine} worker did not start: {kind}")
        self.info = info

    def recv(self, timeout: float) -> tuple[str, Any]:
        if not self.conn.poll(timeout):
            raise WorkerTimeout(f"no answer in {timeout:g} s")
        try:
            return self.conn.recv()
        except (EOFError, OSError) as exc:
            self.proc.join(5)
            raise WorkerDied(f"worker died (exit code {self.proc.exitcode})") from exc

    def send(self, job: Any) -> None:
        self.conn.send(job)

    def kill(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            self.proc.kill()
        if self.proc is not None:
            self.proc.join(10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            with contextlib.suppress(OSError):
                self.send(None)
            self.proc.join(30)
        self.kill()

    def run(self, kind: str, rec: dict, timeouts: dict[str, float]) -> dict:
        """Send one job and collect its messages until "done".  `timeouts[m]` is how long to wait
        after message `m` ("start" for the first); a timeout or a death ends the job there
        (recorded as `failed_phase` and `failure`) and the worker is restarted for the next job."""
        if self.proc is None:
            self.start()
        out: dict[str, Any] = {}
        self.send((kind, rec))
        last = "start"
        while True:
            try:
                got, payload = self.recv(timeouts.get(last, 60.0))
            except (WorkerTimeout, WorkerDied) as exc:
                out["failed_phase"] = NEXT_PHASE.get(last, last)
                out["failure"] = "timeout" if isinstance(exc, WorkerTimeout) else "died"
                out["failure_detail"] = str(exc)
                self.kill()
                return out
            if got == "done":
                return out
            out[got] = payload
            last = got


#: The phase a worker is in after sending a message (for reporting where a job failed).
NEXT_PHASE = {"start": "compile", "compiled": "tests", "tests": "walks", "walks": "finish"}


def _schema_result(rec: dict, msgs: dict) -> dict:
    """Flatten one job's messages into the per-schema record of the results file."""
    r: dict[str, Any] = {"id": rec["id"], "subset": rec["subset"], "n_tests": len(rec["tests"])}
    comp = msgs.get("compiled")
    if comp is None:
        r["status"] = "timeout" if msgs.get("failure") == "timeout" else "crash"
        r["error"] = msgs.get("failure_detail", "")
        return r
    r.update({k: v for k, v in comp.items() if k != "status"})
    r["status"] = comp["status"]
    if comp["status"] != "ok":
        return r
    if "failed_phase" in msgs:
        r["phase_failure"] = f"{msgs['failure']} in {msgs['failed_phase']}: {msgs.get('failure_detail', '')}"
    if "tests" in msgs:
        r["tests"] = msgs["tests"]
    if "walks" in msgs:
        r["walks"] = msgs["walks"]
    return r


def xg2_failures(results: list[dict]) -> list[dict]:
    """Every xg2 schema that is not compliant or has an unsound walk, with the reason."""
    out = []
    for r in results:
        unsound = {m: w["unsound"] + w["bugs"] for m, w in r.get("walks", {}).items() if w.get("unsound") or w.get("bugs")}
        if is_compliant(r) and not unsound and "phase_failure" not in r:
            continue
        f: dict[str, Any] = {"id": r["id"], "subset": r["subset"], "status": r["status"], "reason": reason_key(r)}
        if r["status"] != "ok":
            f["error"] = f"{r.get('error_type', '')}: {r.get('error', '')}"
            if "traceback" in r:
                f["traceback"] = r["traceback"]
        else:
            if "phase_failure" in r:
                f["phase_failure"] = r["phase_failure"]
            f["misjudged"] = [{k: t[k] for k in ("i", "valid", "verdict", "detail", "order_sensitive", "broken_keyword",
                                                  "text", "traceback") if k in t}
                              for t in r.get("tests", []) if not t["right"]]
        if unsound:
            f["unsound_walks"] = unsound
        out.append(f)
    return out


def _progress(engine: str, subset: str, done: int, total: int, s: dict, t0: float) -> None:
    print(f"[{engine}] {subset:<16} {done:>4}/{total:<4} compiled {s.get('compiled', 0):>4} "
          f"err {s.get('compile_errors', 0):>3} crash {s.get('crashes', 0):>3} timeout {s.get('timeouts', 0):>3} "
          f"compliant {s.get('compliant', 0):>4}  ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)


def run_compliance(args: argparse.Namespace, records: list[dict], engines: list[str], payload: dict) -> None:
    opts = {"llguidance_options": args.llguidance_options, "xg2_compiler_options": args.xg2_compiler_options,
            "xg2_schema_options": args.xg2_schema_options,
            "check_masks": args.check_masks, "walks": args.walks, "seed": args.seed,
            "strict_walks": not args.no_strict_walks, "format_checker": args.format_checker}
    timeouts = {"start": args.compile_timeout, "compiled": args.test_timeout, "tests": args.walk_timeout}
    for name in engines:
        worker = Worker(name, args, opts)
        t0 = time.time()
        try:
            worker.start()
        except Exception as exc:  # noqa: BLE001 - an engine that cannot load is skipped
            print(f"[skip] {name}: {exc}", file=sys.stderr)
            worker.kill()
            continue
        payload["engine_info"][name] = worker.info
        results: list[dict] = []
        last = time.time()
        by_subset: dict[str, int] = {}
        totals = {s: sum(r["subset"] == s for r in records) for s in {r["subset"] for r in records}}
        for rec in records:
            msgs = worker.run("compliance", rec, timeouts)
            res = _schema_result(rec, msgs)
            results.append(res)
            sub = rec["subset"]
            by_subset[sub] = by_subset.get(sub, 0) + 1
            if "failure" in msgs:
                print(f"[{name}] {rec['id']}: {msgs['failure']} in {msgs['failed_phase']}", file=sys.stderr)
            if by_subset[sub] == totals[sub] or time.time() - last > 15:
                _progress(name, sub, by_subset[sub], totals[sub], compliance_summary(
                    [r for r in results if r["subset"] == sub]).get(sub, {}), t0)
                last = time.time()
        worker.stop()
        payload["schemas"][name] = results
        payload["summary"][name] = compliance_summary(results)
        if name == "xg2":
            payload["walks"] = walk_summary(results)
            payload["xg2_failures"] = xg2_failures(results)
        payload["elapsed_s"][name] = round(time.time() - t0, 1)
        save(args, payload)


def run_speed(args: argparse.Namespace, records: list[dict], engines: list[str], payload: dict) -> None:
    opts = {"llguidance_options": args.llguidance_options, "xg2_compiler_options": args.xg2_compiler_options,
            "xg2_schema_options": args.xg2_schema_options,
            "repeat": args.repeat,
            "fresh_compiler": not args.reuse_compiler}
    timeouts = {"start": args.compile_timeout * args.repeat, "compiled": args.test_timeout}
    for name in engines:
        worker = Worker(name, args, opts)
        t0 = time.time()
        try:
            worker.start()
        except Exception as exc:  # noqa: BLE001
            print(f"[skip] {name}: {exc}", file=sys.stderr)
            worker.kill()
            continue
        payload["engine_info"][name] = worker.info
        results = []
        last = time.time()
        for n, rec in enumerate(records, 1):
            msgs = worker.run("speed", rec, timeouts)
            r = _schema_result(rec, msgs)
            r.pop("tests", None)
            t = msgs.get("tests")
            if t is not None:
                times = sorted(t["mask_us"])
                r["mask_us"] = [round(x, 2) for x in t["mask_us"]]
                r["n_tokens"] = len(times)
                if times:
                    r["mask_mean_us"] = statistics.fmean(times)
                    r["mask_p99_us"] = percentile(times, 0.99)
                    r["mask_max_us"] = times[-1]
                if "error" in t:
                    r["error"] = t["error"]
            results.append(r)
            if n == len(records) or time.time() - last > 15:
                ok = sum(x["status"] == "ok" for x in results)
                print(f"[{name}] {n}/{len(records)} compiled {ok} ({time.time() - t0:.0f} s)", file=sys.stderr,
                      flush=True)
                last = time.time()
        worker.stop()
        payload["schemas"][name] = results
        payload["elapsed_s"][name] = round(time.time() - t0, 1)
        payload["summary"] = speed_summary(payload)
        save(args, payload)


def save(args: argparse.Namespace, payload: dict) -> None:
    if args.json:
        args.json.write_text(json.dumps(payload, indent=1, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
    if args.mode == "compliance" and "xg2_failures" in payload:
        path = args.failures or (args.json.with_suffix(".xg2_failures.json") if args.json else None)
        if path:
            path.write_text(json.dumps(payload["xg2_failures"], indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def _git_state() -> dict:
    try:
        import xg2

        where = Path(xg2.__file__).resolve().parent
    except Exception:  # noqa: BLE001
        return {}
    info = {"xg2_path": str(where)}
    try:
        head = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], check=False, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "."], check=False,
                               capture_output=True, text=True, timeout=10)
        if head.returncode == 0:
            info["git_head"] = head.stdout.strip()
            info["git_dirty"] = bool(dirty.stdout.strip())
    except (OSError, subprocess.TimeoutExpired):
        pass
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--speed", action="store_true", help="speed mode instead of compliance")
    ap.add_argument("--data", type=Path, default=DATA_DIR, help="directory of <Subset>.jsonl files")
    ap.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER, help="HF tokenizer.json")
    ap.add_argument("--engines", default=",".join(ALL_ENGINES))
    ap.add_argument("--subsets", default="", help="comma-separated (default: all 15, or the 6 speed subsets)")
    ap.add_argument("--limit", type=int, help="first N records of each subset")
    ap.add_argument("--ids", default="", help="only these record ids (comma-separated)")
    ap.add_argument("--compile-timeout", type=float, default=20.0, help="seconds per schema compile")
    ap.add_argument("--test-timeout", type=float, default=120.0, help="seconds for one schema's tests")
    ap.add_argument("--walk-timeout", type=float, default=180.0, help="seconds for one schema's walks")
    ap.add_argument("--walks", type=int, default=0, help="xg2 random walks per compiled schema")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-strict-walks", action="store_true", help="skip the walks with strict_mode=True")
    ap.add_argument("--format-checker", action="store_true", help="validate walk texts with format assertions")
    ap.add_argument("--check-masks", action="store_true",
                    help="compliance: also fill the mask before each token and check it agrees with accept")
    ap.add_argument("--repeat", type=int, default=1, help="speed: cold compiles per schema (median)")
    ap.add_argument("--reuse-compiler", action="store_true",
                    help="speed: one compiler per engine (cache off) instead of a fresh one per schema")
    ap.add_argument("--json", type=Path, help="write all results here")
    ap.add_argument("--failures", type=Path, help="xg2 failure list (default: <json>.xg2_failures.json)")
    ap.add_argument("--llguidance-options", type=json.loads, default=None,
                    help='JsonCompileOptions for llguidance, e.g. \'{"coerce_one_of": true}\' (default: its defaults)')
    ap.add_argument("--xg2-schema-options", type=json.loads, default=None,
                    help='xg2 compile_json_schema options (JSON), e.g. \'{"format_assertion": false}\'')
    ap.add_argument("--xg2-compiler-options", type=json.loads, default=None,
                    help='extra xg2 GrammarCompiler keywords, e.g. \'{"precompute_budget_ms": 0}\'')
    ap.add_argument("--note", default="", help="free text stored with the results (e.g. which xg2 commit)")
    ap.add_argument("--worker-log", default="/tmp/bench_jsonschema_worker", help="worker stderr log prefix")
    args = ap.parse_args(argv)
    args.mode = "speed" if args.speed else "compliance"

    subsets = [s for s in args.subsets.split(",") if s] or list(SPEED_SUBSETS if args.speed else ALL_SUBSETS)
    ids = {i for i in args.ids.split(",") if i} or None
    records = load_records(args.data, subsets, args.limit, ids)
    engines = [e for e in args.engines.split(",") if e]
    for e in engines:
        if e not in KNOWN_ENGINES:
            raise SystemExit(f"unknown engine {e!r}; choose from {', '.join(KNOWN_ENGINES)}")
    print(f"{args.mode}: {len(records)} schemas from {len(subsets)} subsets; engines {', '.join(engines)}",
          file=sys.stderr)
    payload: dict[str, Any] = {
        "mode": args.mode, "tokenizer": str(args.tokenizer), "subsets": subsets, "engines": engines,
        "limit": args.limit, "note": args.note, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "xg2_source": _git_state(),
        "options": {k: v for k, v in vars(args).items() if k not in ("json", "failures", "data", "tokenizer")},
        "engine_info": {}, "schemas": {}, "summary": {}, "elapsed_s": {},
    }
    if args.speed:
        run_speed(args, records, engines, payload)
        print(speed_markdown(payload))
    else:
        run_compliance(args, records, engines, payload)
        print(compliance_markdown(payload))
    if args.json:
        print(f"\nwrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
