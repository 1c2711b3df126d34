"""Bad requests, generated: schemathesis against the application's OpenAPI document.

    python loadtests/openapi_fuzz.py                       # starts the tiny app on a free loopback port
    python loadtests/openapi_fuzz.py --url http://127.0.0.1:8000 --key sk-...   # a running app

Schemathesis (its CLI, `schemathesis run`, in a child process) reads `GET /openapi.json` (served
by the ingress as by the model replicas: the same document) and sends generated requests to every
route: bodies that fit the document and bodies that do not (wrong types, missing fields, values
out of bounds, odd JSON), in its examples, coverage and fuzzing phases. Its checks are
`not_a_server_error` (no status >= 500) and `openai_error_object` (defined here: every 4xx body
is OpenAI's error object, ``{"error": {"message": str, "type": str, "param": ..., "code": ...}}``).

This module is also the child's hooks module (SCHEMATHESIS_HOOKS, registered only when
XG2_FUZZ_RECORD names a file): besides the check, every response is recorded there (operation,
status, whether a 4xx body was an OpenAI error object), and `max_tokens` values a generated body
asks for are brought down to at most MAX_TOKENS (a value past the server's limit is left as it
is: the server refuses it), so that the run stays bounded in time. The parent reads the record and
prints the summary: requests, statuses (per route), server errors, non-OpenAI 4xx bodies; it exits
non-zero when there is either.

`--examples` bounds the fuzzing phase per route and mode (positive, negative); about 1,100
requests at the default 300, in three to four minutes on two cores.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: `max_tokens` (and `max_completion_tokens`, `max_output_tokens`) past this and up to LIMIT are
#: brought down to it.
MAX_TOKENS = 8
#: The server's `max_tokens_limit` (ReplicaOptions' default): values past it are left for the
#: server to refuse.
LIMIT = 4096
#: The tiny app's options: a small default `max_tokens` for bodies that give none.
APP_OPTIONS = {"default_max_tokens": MAX_TOKENS}
RECORD_ENV = "XG2_FUZZ_RECORD"


def is_openai_error(body: bytes) -> bool:
    """Whether `body` is OpenAI's error object: {"error": {"message": str, "type": str, "param":
    str | null, "code": str | null}} (param and code present; other fields allowed)."""
    try:
        doc = json.loads(body)
    except ValueError:
        return False
    err = doc.get("error") if isinstance(doc, dict) else None
    return (isinstance(err, dict) and isinstance(err.get("message"), str) and isinstance(err.get("type"), str)
            and "param" in err and "code" in err
            and all(err[k] is None or isinstance(err[k], str) for k in ("param", "code")))


# ------------------------------------------------------------------------------------------------
# The child's hooks (schemathesis imports this module by SCHEMATHESIS_HOOKS)
# ------------------------------------------------------------------------------------------------

def _clamp(body: Any) -> None:
    if isinstance(body, dict):
        for field in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
            value = body.get(field)
            if type(value) is int and MAX_TOKENS < value <= LIMIT:
                body[field] = MAX_TOKENS


def _register_hooks(record_path: str) -> None:
    import schemathesis

    lock = threading.Lock()
    record = open(record_path, "a", buffering=1, encoding="utf-8")     # noqa: SIM115 - open for the run

    @schemathesis.hook
    def before_call(context: Any, case: Any, kwargs: Any) -> None:
        _clamp(case.body)

    @schemathesis.hook
    def after_call(context: Any, case: Any, response: Any) -> None:
        status = response.status_code
        entry: dict[str, Any] = {"op": f"{case.method.upper()} {case.path}", "status": status}
        if 400 <= status < 500 and case.method.upper() != "HEAD":     # (a HEAD answer has no body)
            entry["openai"] = is_openai_error(response.content)
            if entry["openai"]:
                entry["code"] = json.loads(response.content)["error"]["code"]
        if status >= 500 or entry.get("openai") is False:
            entry["body"] = response.content[:300].decode("utf-8", "replace")
            try:
                entry["request"] = json.dumps(case.body)[:300]
            except (TypeError, ValueError):
                entry["request"] = repr(case.body)[:300]
        with lock:
            record.write(json.dumps(entry) + "\n")

    @schemathesis.check
    def openai_error_object(ctx: Any, response: Any, case: Any) -> bool | None:
        """Every 4xx body is OpenAI's error object."""
        if (400 <= response.status_code < 500 and case.method.upper() != "HEAD"
                and not is_openai_error(response.content)):
            raise AssertionError(f"a {response.status_code} whose body is not an OpenAI error object: "
                                 f"{response.content[:200]!r}")
        return None


if os.environ.get(RECORD_ENV):
    _register_hooks(os.environ[RECORD_ENV])


# ------------------------------------------------------------------------------------------------
# The parent: the run and its summary
# ------------------------------------------------------------------------------------------------

def run_schemathesis(base: str, *, key: str = "sk-fuzz", examples: int = 300, seed: int = 1, workers: int = 2,
                     max_time: int = 600, phases: str = "examples,coverage,fuzzing",
                     log: Path | None = None) -> dict[str, Any]:
    """Runs schemathesis against the application at `base` (http://HOST:PORT, its document at
    /openapi.json) and returns the summary (see `summarize`); `log` receives schemathesis's own
    output. Bounded: `examples` per route and mode in the fuzzing phase, `max_time` in all (the
    child is ended past it)."""
    with tempfile.TemporaryDirectory(prefix="xg2-fuzz-") as tmp:
        record = Path(tmp) / "record.jsonl"
        record.touch()
        env = {**os.environ, RECORD_ENV: str(record), "SCHEMATHESIS_HOOKS": "loadtests.openapi_fuzz",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        cmd = [sys.executable, "-m", "schemathesis.cli", "run", f"{base}/openapi.json",
               "--checks", "not_a_server_error,openai_error_object", "--phases", phases,
               "--max-examples", str(examples), "--seed", str(seed), "--workers", str(workers),
               "--header", f"Authorization: Bearer {key}", "--suppress-health-check", "all",
               "--request-timeout", "60", "--generation-database", "none", "--no-color",
               "--continue-on-failure", "--output-sanitize", "false"]
        t0 = time.monotonic()
        with open(log or os.devnull, "w") as out:
            try:    # cwd: a scratch folder, so that nothing is left in the work tree
                proc = subprocess.run(cmd, cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT,
                                      timeout=max_time, check=False)
                code: int | None = proc.returncode
            except subprocess.TimeoutExpired:
                code = None
        summary = summarize([json.loads(line) for line in record.read_text().splitlines() if line])
    summary.update(seconds=round(time.monotonic() - t0, 1), schemathesis_exit=code, examples=examples, seed=seed)
    return summary


def summarize(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Requests, statuses (in all and per route), the 4xx error codes, server errors and 4xx bodies
    that are not OpenAI error objects (a few of each kept, with the request)."""
    statuses = collections.Counter(str(e["status"]) for e in entries)
    per_route: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for e in entries:
        per_route[e["op"]][str(e["status"])] += 1
    codes = collections.Counter(str(e["code"]) for e in entries if "code" in e)
    server = [e for e in entries if e["status"] >= 500]
    not_openai = [e for e in entries if e.get("openai") is False]
    return {"requests": len(entries), "statuses": dict(sorted(statuses.items())),
            "per_route": {op: dict(sorted(c.items())) for op, c in sorted(per_route.items())},
            "error_codes": dict(codes.most_common()),
            "server_errors": len(server), "non_openai_4xx": len(not_openai),
            "server_error_samples": server[:5], "non_openai_4xx_samples": not_openai[:5]}


def report(summary: dict[str, Any]) -> str:
    lines = [(f"schemathesis: {summary['requests']} requests in {summary['seconds']} s "
              f"(--max-examples {summary['examples']}, --seed {summary['seed']}; "
              f"schemathesis exit {summary['schemathesis_exit']})"),
             "statuses: " + ", ".join(f"{k}: {v}" for k, v in summary["statuses"].items())]
    for op, counts in summary["per_route"].items():
        lines.append(f"  {op}: " + ", ".join(f"{k}: {v}" for k, v in counts.items()))
    lines.append("4xx error codes: " + ", ".join(f"{k}: {v}" for k, v in summary["error_codes"].items()))
    lines.append(f"server errors (>= 500): {summary['server_errors']}")
    lines.append(f"4xx bodies that are not OpenAI error objects: {summary['non_openai_4xx']}")
    for e in summary["server_error_samples"] + summary["non_openai_4xx_samples"]:
        lines.append(f"  {e['op']} {e['status']}: {e.get('body')!r} <- {e.get('request')}")
    return "\n".join(lines)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="a running application (http://HOST:PORT); default: start the tiny app here")
    ap.add_argument("--key", default="sk-fuzz", help="the API key sent (Authorization: Bearer KEY)")
    ap.add_argument("--examples", type=int, default=300, help="fuzzing examples per route and mode")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--max-time", type=int, default=600, help="seconds for the whole schemathesis run")
    ap.add_argument("--router", default="affinity", choices=("affinity", "default"),
                    help="the app started here: through the ingress (affinity) or straight to the replicas")
    ap.add_argument("--log", type=Path, help="schemathesis's own output (default: not kept)")
    ap.add_argument("--json", type=Path, help="write the summary here too")
    args = ap.parse_args(argv)
    kwargs: dict[str, Any] = {"key": args.key, "examples": args.examples, "seed": args.seed,
                              "workers": args.workers, "max_time": args.max_time, "log": args.log}
    if args.url:
        summary = run_schemathesis(args.url.rstrip("/").removesuffix("/v1"), **kwargs)
    else:
        sys.path.insert(0, str(ROOT))
        from serve.cli import Server

        with Server(model="tiny", port=_free_port(), progress=False, mask_service=False, shards=1,
                    options={**APP_OPTIONS, "router": args.router}) as server:
            summary = run_schemathesis(server.url.removesuffix("/v1"), **kwargs)
    print(report(summary))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    return 1 if summary["server_errors"] or summary["non_openai_4xx"] or not summary["requests"] else 0


if __name__ == "__main__":
    sys.exit(main())
