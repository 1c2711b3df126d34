"""Multi-tenant load on the OpenAI-compatible ingress (issue 18), for locust:

    locust -f loadtests/locustfile.py --headless -u 8 -r 2 -t 60s --host http://127.0.0.1:8000

(`python loadtests/run.py` starts the application and runs this for you.) Tenant classes, each user
with its tenant's API key (`lt-<class>-<n>`, `XG2_LT_KEYS` keys per class, so tenants share
grammars by content):

- `ToolAgent`: tool sets of 4-64 registry tools, Zipf-drawn from a seeded pool (a few hot sets, a
  long tail seen once), `tool_choice` auto / required / named;
- `Extractor`: jsonschemabench schemas (Zipf-drawn) as `response_format` json_schema, without
  whitespace;
- `GrammarUser`: `guided_regex` and `guided_grammar` (EBNF) completions on /v1/completions;
- `StreamingChatter`: streamed chat, free text or a schema; the other classes stream a fraction
  (`XG2_LT_STREAM_FRACTION`) of their requests too.

Every answer is checked as a client would (loadtests/workload.py): a finished output that does not
parse, validate or match is a failure event of kind `invalid_output`; an output cut at
`max_tokens` is counted as `truncated` (a success). Other failure kinds: `http_4xx`, `http_5xx`,
`timeout` (the whole request, stream included, is bounded by `XG2_LT_TIMEOUT`), `connection`,
`stream_error`. Like OpenAI's client, a request that gets 408/409/429/5xx, a connection error or a
stream cut before [DONE] is retried (twice, with backoff); each such attempt is a failure event of
kind `retried`. A schema the server refuses as unsupported (400 at the schema) is counted as
`unsupported` and not sent again.

Each request's outcome is appended to the JSON lines file `XG2_LT_EVENTS` (when set) for the run
script: times, latency, time to first token, tokens, kind, message.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import gevent
from geventhttpclient.response import HTTPParseError
from locust import FastHttpUser, between, events, task

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workload as w

SEED = int(os.environ.get("XG2_LT_SEED", "0"))
TIMEOUT_S = float(os.environ.get("XG2_LT_TIMEOUT", "60"))
MAX_TOKENS = tuple(int(x) for x in os.environ.get("XG2_LT_MAX_TOKENS", "48,96").split(","))
PROMPT_BUDGET = int(os.environ.get("XG2_LT_PROMPT_BUDGET", "2000"))
STREAM_FRACTION = float(os.environ.get("XG2_LT_STREAM_FRACTION", "0.25"))
MODEL = os.environ.get("XG2_LT_MODEL", "xg2")
KEYS_PER_CLASS = int(os.environ.get("XG2_LT_KEYS", "2"))
EVENTS_PATH = os.environ.get("XG2_LT_EVENTS")
RETRIES = int(os.environ.get("XG2_LT_RETRIES", "2"))
TOOL_POOL = int(os.environ.get("XG2_LT_TOOL_POOL", "1000"))
ZIPF_S = float(os.environ.get("XG2_LT_ZIPF_S", "1.1"))
EASY_NAMED = float(os.environ.get("XG2_LT_EASY_NAMED", "0.5"))

# The load shape, when one is asked for (locust uses the shape class it finds in this module).
_SHAPE = os.environ.get("XG2_LT_SHAPE", "")
if _SHAPE == "step":
    from shapes import StepShape  # noqa: F401
elif _SHAPE == "soak":
    from shapes import SoakShape  # noqa: F401
elif _SHAPE:
    raise SystemExit(f"XG2_LT_SHAPE={_SHAPE!r}: expected step or soak")

RETRYABLE_STATUS = {408, 409, 429}
#: 400 codes meaning "xg2 does not take this schema" (not a client bug): counted, not failed.
UNSUPPORTED_CODES = {"invalid_schema", "grammar_limit_exceeded", "unsupported_schema"}


# ------------------------------------------------------------------------------------------------
# The workload's data, loaded once per process
# ------------------------------------------------------------------------------------------------

class Data:
    _lock = threading.Lock()
    tools: w.ToolPool | None = None
    schemas: w.SchemaPool | None = None
    tool_zipf: w.ZipfIndex | None = None
    schema_zipf: w.ZipfIndex | None = None

    @classmethod
    def load(cls) -> None:
        with cls._lock:
            if cls.tools is None:
                cls.tools = w.ToolPool(w.load_registry_tools(), seed=SEED, size=TOOL_POOL,
                                       budget_tokens=PROMPT_BUDGET)
                cls.tool_zipf = w.ZipfIndex(TOOL_POOL, ZIPF_S)
                cls.schemas = w.SchemaPool(seed=SEED)
                cls.schema_zipf = w.ZipfIndex(len(cls.schemas.schemas), ZIPF_S)


# ------------------------------------------------------------------------------------------------
# Outcomes: locust events, and a JSON line each for the run script
# ------------------------------------------------------------------------------------------------

class Recorder:
    """The JSON lines of a run: one per attempt (`type` "request"), the user count every two
    seconds (`type` "users"), and the run's start and end."""

    def __init__(self, path: str | None):
        self.f = open(path, "a", encoding="utf-8", buffering=1) if path else None  # noqa: SIM115
        self.counts: dict[str, int] = {k: 0 for k in w.OUTCOMES}

    def write(self, rec: dict) -> None:
        if self.f is not None:
            self.f.write(json.dumps(rec, ensure_ascii=False) + "\n")

    def request(self, rec: dict) -> None:
        self.counts[rec["kind"]] = self.counts.get(rec["kind"], 0) + 1
        self.write({"type": "request", **rec})

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
            self.f = None


RECORDER = Recorder(EVENTS_PATH)


class OutputError(Exception):
    """A failure event's exception: its text starts with the kind ("invalid_output: ...")."""


@events.init.add_listener
def _on_init(environment: Any, **_: Any) -> None:
    Data.load()


@events.test_start.add_listener
def _on_test_start(environment: Any, **_: Any) -> None:
    RECORDER.write({"type": "start", "t": time.time(), "seed": SEED, "timeout_s": TIMEOUT_S,
                    "tool_pool": TOOL_POOL, "schemas": len(Data.schemas.schemas), "shape": _SHAPE or None})

    def users() -> None:
        while True:
            runner = environment.runner
            if runner is not None:
                RECORDER.write({"type": "users", "t": time.time(), "n": runner.user_count})
            gevent.sleep(2.0)

    environment._xg2_users = gevent.spawn(users)


@events.test_stop.add_listener
def _on_test_stop(environment: Any, **_: Any) -> None:
    g = getattr(environment, "_xg2_users", None)
    if g is not None:
        g.kill(block=False)
    RECORDER.write({"type": "stop", "t": time.time(), "counts": RECORDER.counts,
                    "refused_schemas": sorted(Data.schemas.refused) if Data.schemas else []})


@events.quitting.add_listener
def _on_quitting(environment: Any, **_: Any) -> None:
    RECORDER.close()


# ------------------------------------------------------------------------------------------------
# The users
# ------------------------------------------------------------------------------------------------

def _error_of(body: bytes | None) -> dict:
    try:
        err = json.loads(body or b"{}").get("error") or {}
        return err if isinstance(err, dict) else {"message": str(err)}
    except (ValueError, AttributeError):
        return {"message": (body or b"")[:120].decode("utf-8", "replace")}


class Tenant(FastHttpUser):
    """A tenant's user: its key, its RNG, and the request loop with the checks and retries."""

    abstract = True
    wait_time = between(0.1, 0.6)
    network_timeout = TIMEOUT_S
    connection_timeout = 5.0
    _numbers: ClassVar[dict[str, itertools.count]] = {}

    def on_start(self) -> None:
        cls = type(self).__name__
        n = next(self._numbers.setdefault(cls, itertools.count()))
        self.rng = random.Random(f"{SEED}/{cls}/{n}")
        self.key = f"lt-{cls.lower()}-{n % KEYS_PER_CLASS}"
        self.headers = {"Authorization": f"Bearer {self.key}"}

    # -- one request ---------------------------------------------------------------------------
    def max_tokens(self) -> int:
        return self.rng.randint(MAX_TOKENS[0], MAX_TOKENS[-1])

    def call(self, path: str, body: dict | bytes, name: str, judge: Any, *, stream: bool = False,
             unsupported: Any = None, extra: dict | None = None) -> str:
        """POST `body`; `judge(finish, content, tool_calls)` gives the Verdict of an answer;
        `unsupported(error)` says whether a 400 is a refusal to count rather than a failure.
        Returns the final outcome's kind."""
        if stream:
            body = {**body, "stream": True, "stream_options": {"include_usage": True}}
            name += " (stream)"
        for attempt in range(RETRIES + 1):
            start, t0 = time.time(), time.perf_counter()
            kind, msg, info = self._attempt(path, body, stream, judge, unsupported, t0)
            ms = (time.perf_counter() - t0) * 1e3
            retry = info.pop("retryable", False) and attempt < RETRIES
            final = "retried" if retry else kind
            failed = final in w.FAILURE_KINDS or final == "retried"
            exc = OutputError(f"{final}: {msg}" if final != "retried" else f"retried: {kind}: {msg}") if failed \
                else None
            self.environment.events.request.fire(
                request_type="POST", name=name, response_time=ms, response_length=info.get("length", 0),
                exception=exc, context={"tenant": self.key}, response=None, url=path, start_time=start)
            RECORDER.request({"t": time.time(), "start": start, "user": type(self).__name__, "tenant": self.key,
                              "name": name, "kind": final, "cause": kind if retry else None, "status": info.get("status"),
                              "ms": ms, "attempt": attempt, "msg": msg[:300] if msg else None, **extra_of(info, extra)})
            if not retry:
                return final
            gevent.sleep(0.5 * 2 ** attempt * (0.5 + self.rng.random()))
        return "retried"

    def _attempt(self, path: str, body: dict, stream: bool, judge: Any, unsupported: Any,
                 t0: float) -> tuple[str, str, dict]:
        info: dict[str, Any] = {}
        timer = gevent.Timeout(TIMEOUT_S)
        timer.start()
        try:
            raw_body = {"data": body, "headers": {**self.headers, "Content-Type": "application/json"}} \
                if isinstance(body, bytes) else {"json": body, "headers": self.headers}
            resp = self.client.request("POST", path, stream=stream, catch_response=True,
                                       **raw_body)      # not entered: no event of its own
            err = getattr(resp, "error", None) or resp.request_meta.get("exception")
            status = resp.status_code
            info["status"] = status
            if status == 0 or (err is not None and status < 400):
                return self._transport_error(err, timer, info)
            if status >= 400:
                content = resp.content
                info["length"] = len(content or b"")
                error = _error_of(content)
                msg = f"{status} {error.get('code')}: {str(error.get('message'))[:160]}"
                if status == 400 and unsupported is not None and unsupported(error):
                    return "unsupported", msg, info
                if 400 <= status < 500 and judge is REFUSAL_EXPECTED:     # 429 too: it is not retried
                    if not isinstance(error.get("message"), str) or not error.get("message"):
                        return "invalid_output", f"{status} without an OpenAI error body: {content[:120]!r}", info
                    return "refused", msg, info
                info["retryable"] = status in RETRYABLE_STATUS or status >= 500
                return ("http_5xx" if status >= 500 else "http_4xx"), msg, info
            if stream:
                chunks = resp.iter_content(4096, decode_content=False)
                try:
                    a = w.assemble(w.sse_data(chunks), time.perf_counter)
                    for _ in chunks:        # to the end of the body: the connection is reused
                        pass
                except w.StreamError as e:
                    # a stream cut before [DONE] (not an error event) is retried, as a connection error
                    info["retryable"] = "without [DONE]" in str(e) or "inside an event" in str(e)
                    return "stream_error", str(e), info
                except HTTPParseError as e:     # the connection closed mid-body (a replica or proxy died)
                    info["retryable"] = True
                    return "stream_error", f"the stream was cut: {type(e).__name__}: {str(e)[:120]}", info
                finish, content, calls = a.finish_reason, a.content, a.tool_calls
                info["tokens"] = a.completion_tokens
                if a.first_token_at is not None:
                    info["ttft_ms"] = (a.first_token_at - t0) * 1e3
                info["length"] = len(content)
            else:
                raw = resp.content
                info["length"] = len(raw or b"")
                try:
                    data = json.loads(raw)
                    choice = data["choices"][0]
                except (ValueError, KeyError, IndexError, TypeError):
                    return "invalid_output", f"not an OpenAI response: {(raw or b'')[:120]!r}", info
                info["tokens"] = (data.get("usage") or {}).get("completion_tokens")
                finish = choice.get("finish_reason")
                msg_ = choice.get("message")
                content = msg_.get("content") if msg_ is not None else choice.get("text")
                calls = (msg_ or {}).get("tool_calls") or []
            verdict = judge(finish, content, calls)
            info["finish"] = finish
            return verdict.kind, verdict.message, info
        except gevent.Timeout as t:
            if t is not timer:
                raise
            return "timeout", f"no complete answer within {TIMEOUT_S:g} s", info
        except (OSError, ConnectionError, HTTPParseError) as e:    # (a body cut short: "Incomplete response")
            return self._transport_error(e, timer, info)
        finally:
            timer.cancel()

    @staticmethod
    def _transport_error(err: BaseException | None, timer: Any, info: dict) -> tuple[str, str, dict]:
        if err is timer or isinstance(err, (socket.timeout, TimeoutError, gevent.Timeout)):
            return "timeout", f"no complete answer within {TIMEOUT_S:g} s ({type(err).__name__})", info
        info["retryable"] = True
        return "connection", f"{type(err).__name__}: {str(err)[:160]}", info


def extra_of(info: dict, extra: dict | None) -> dict:
    out = {k: info[k] for k in ("ttft_ms", "tokens", "finish") if info.get(k) is not None}
    if extra:
        out.update(extra)
    return out


ASKS = ["What's the weather like in Paris today?", "Find me recent news about solar panels.",
        "Look up the population of Tokyo.", "Book a table for two tomorrow at 8pm.",
        "Convert 100 US dollars to euros.", "Summarise the latest commit in my repository.",
        "What should I do next? Use a tool."]


class ToolAgent(Tenant):
    """Agents with Zipf-drawn tool sets and tool_choice auto / required / named."""

    weight = 3

    @task
    def call_tools(self) -> None:
        i = Data.tool_zipf.draw(self.rng)
        ts = Data.tools.get(i)
        mode = self.rng.choice(("auto", "required", "named"))
        choice: Any = mode
        if mode == "named":     # half the time a tool that takes no required argument, when there is one
            names = ts.easy if ts.easy and self.rng.random() < EASY_NAMED else ts.names
            choice = {"type": "function", "function": {"name": self.rng.choice(names)}}
        body = {"model": MODEL, "messages": [{"role": "user", "content": self.rng.choice(ASKS)}],
                "tools": ts.tools, "tool_choice": choice, "max_tokens": self.max_tokens(),
                "temperature": 0.8, "seed": self.rng.randrange(1 << 31)}
        self.call("/v1/chat/completions", body, f"tools {mode}",
                  lambda f, c, calls: w.check_tool_output(f, c, calls, ts, choice),
                  stream=self.rng.random() < STREAM_FRACTION, extra={"tool_set": i, "tools": len(ts.tools)})


def _schema_refused(error: dict) -> bool:
    param = error.get("param") or ""
    return error.get("code") in UNSUPPORTED_CODES or param.startswith("/response_format/json_schema/schema")


class _Extraction:
    """Schema requests, for the classes that send them."""

    def pick_schema(self) -> w.Schema | None:
        pool = Data.schemas
        for _ in range(8):
            s = pool.schemas[Data.schema_zipf.draw(self.rng)]
            if s.id not in pool.refused:
                return s
        return None

    def extract(self, name: str, stream: bool) -> None:
        s = self.pick_schema()
        if s is None:
            return
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Fill in a plausible record as JSON."}],
                "response_format": {"type": "json_schema", "json_schema": {"name": "record", "schema": s.schema}},
                "structured_outputs": {"disable_any_whitespace": True},
                "max_tokens": self.max_tokens(), "temperature": 0.8, "seed": self.rng.randrange(1 << 31)}
        kind = self.call("/v1/chat/completions", body, name,
                         lambda f, c, _calls: w.check_json_output(f, c, s.validator),
                         stream=stream, unsupported=_schema_refused, extra={"schema": s.id})
        if kind == "unsupported":
            Data.schemas.refused.add(s.id)


class Extractor(_Extraction, Tenant):
    """JSON extraction with jsonschemabench schemas, no whitespace."""

    weight = 2

    @task
    def json_schema(self) -> None:
        self.extract("json_schema", self.rng.random() < STREAM_FRACTION)


class GrammarUser(Tenant):
    """Regex and EBNF completions."""

    weight = 2

    @task
    def complete(self) -> None:
        case = self.rng.choice(w.GRAMMAR_CASES)
        field = "guided_regex" if case.kind == "regex" else "guided_grammar"
        body = {"model": MODEL, "prompt": case.prompt, field: case.grammar, "max_tokens": self.max_tokens(),
                "temperature": 0.9, "seed": self.rng.randrange(1 << 31)}
        self.call("/v1/completions", body, f"grammar {case.kind}",
                  lambda f, c, _calls: w.check_grammar_output(f, c, case),
                  stream=self.rng.random() < STREAM_FRACTION, extra={"grammar": case.name})


class StreamingChatter(_Extraction, Tenant):
    """Streamed chat: free text half the time (checked for a well-formed stream), a schema the
    other half."""

    weight = 1

    @task
    def chat(self) -> None:
        if self.rng.random() < 0.5:
            self.extract("chat json_schema", True)
            return
        body = {"model": MODEL, "messages": [{"role": "user", "content": self.rng.choice(
            ["Write one sentence about the sea.", "Name three colours.", "Tell me a short joke."])}],
            "max_tokens": self.max_tokens(), "temperature": 0.8, "seed": self.rng.randrange(1 << 31)}

        def judge(finish: str | None, content: str | None, calls: list) -> w.Verdict:
            if finish not in ("stop", "length") or calls:
                return w.Verdict("invalid_output", f"free chat: finish_reason {finish!r}, {len(calls)} calls")
            return w.Verdict("truncated") if finish == "length" else w.OK

        self.call("/v1/chat/completions", body, "chat", judge, stream=True)


# ------------------------------------------------------------------------------------------------
# A hostile tenant (XG2_LT_HOSTILE users of it; none by default)
# ------------------------------------------------------------------------------------------------

def REFUSAL_EXPECTED(finish: str | None, content: str | None, calls: list) -> w.Verdict:
    """The judge of a hostile request: a 4xx with an OpenAI error body is its expected answer
    (`refused`); an answer at all is fine too (what it sent was within the limits after all)."""
    return w.Verdict("ok")


HOSTILE = int(os.environ.get("XG2_LT_HOSTILE", "0"))
# every kind once, slow schemas twice (what costs the others most), unless told otherwise
HOSTILE_KINDS = tuple(os.environ.get("XG2_LT_HOSTILE_KINDS", ",".join(("slow_schema", *w.HOSTILE_KINDS))).split(","))


if HOSTILE:
    class HostileTenant(Tenant):
        """Sends, as fast as it is answered, what a service must refuse or bound without the other
        tenants noticing: schemas built to be slow to compile, tool sets past the limit or huge,
        nesting past the depth limit, malformed and oversized bodies. Every answer must be a 4xx
        with an OpenAI error (`refused`) or, for what is within the limits, an answer (max_tokens 1)."""

        fixed_count = HOSTILE
        wait_time = between(0.1, 0.6)      # the rate of the other tenants: hostile in what it sends, not how often

        @task
        def attack(self) -> None:
            rng = self.rng
            what = rng.choice(HOSTILE_KINDS)
            body = w.hostile_body(what, rng, MODEL, Data.tools.get(rng.randrange(TOOL_POOL)).tools)
            self.call("/v1/chat/completions", body, f"hostile {what}", REFUSAL_EXPECTED)
