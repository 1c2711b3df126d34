"""What the load-test tenants send and how they judge the answers: tool sets, schemas and grammars
drawn deterministically from the shared data, and the checks a client makes of a response.

Plain Python (no locust, no gevent, no Ray), so the checks are tested on their own and the run
script can read the same constants. Everything drawn is a function of a seed: the same seed gives
the same pools, so two runs (or two processes) send the same grammars and share their cache
entries.

- Tool sets: `ToolPool` builds set `i` of a pool on demand from its own RNG (seeded by the pool's
  seed and `i`), 4-64 tools of the registry, cut to a prompt budget (the tiny model takes 2048
  tokens). Users draw set indices with a Zipf law (`ZipfIndex`): a few hot sets, a long tail of sets
  seen once in a run.
- Schemas: `SchemaPool` keeps the small jsonschemabench schemas that xg2's JSON Schema front end
  accepts (checked here, offline, in about a second) and that jsonschema can check locally (no
  remote `$ref`), shuffled by the seed, also drawn with a Zipf law.
- Grammars: EBNF (`guided_grammar`) and regex (`guided_regex`) cases, each with an independent
  Python check of its language (not xg2's matcher: the check should not share the engine's bugs).
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import os
import random
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

#: The failure kinds a request can end with, and the counted outcomes that are not failures.
FAILURE_KINDS = ("invalid_output", "http_4xx", "http_5xx", "timeout", "connection", "stream_error")
#: "refused": a hostile tenant's request answered with the 4xx its input deserves (a success).
OUTCOMES = ("ok", "truncated", "unsupported", "refused", "retried", *FAILURE_KINDS)

#: What the OpenAI spec allows as a function name (the registry's are cleaned to it).
TOOL_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def shared_dir() -> Path:
    """../shared beside the checkout, or $XG2_SHARED_DIR."""
    env = os.environ.get("XG2_SHARED_DIR")
    path = Path(env) if env else HERE.parent.parent / "shared"
    if not (path / "data").is_dir():
        raise FileNotFoundError(f"{path}/data not found: set XG2_SHARED_DIR to the shared data's parent")
    return path


# ------------------------------------------------------------------------------------------------
# Zipf draws
# ------------------------------------------------------------------------------------------------

class ZipfIndex:
    """Indices 0..n-1 with P(i) proportional to 1 / (i + 1) ** s."""

    def __init__(self, n: int, s: float = 1.1):
        if n < 1:
            raise ValueError("n must be at least 1")
        self.n, self.s = n, s
        acc, self.cum = 0.0, []
        for i in range(n):
            acc += 1.0 / (i + 1) ** s
            self.cum.append(acc)

    def draw(self, rng: random.Random) -> int:
        return min(bisect.bisect_left(self.cum, rng.random() * self.cum[-1]), self.n - 1)

    def p(self, i: int) -> float:
        return (1.0 / (i + 1) ** self.s) / self.cum[-1]


# ------------------------------------------------------------------------------------------------
# JSON Schema checks, as a client would make them
# ------------------------------------------------------------------------------------------------

def _format_checker(cls: Any) -> Any:
    """The draft's format checker, restricted to the formats xg2 generates (the others are
    annotations, as JSON Schema 2019+ makes every format by default). Without xg2 installed, no
    format is asserted."""
    import jsonschema

    try:
        from xg2.grammar.formats import FORMAT_PATTERNS
    except ImportError:
        return None
    base = cls.FORMAT_CHECKER
    checker = jsonschema.FormatChecker(formats=())
    for name in FORMAT_PATTERNS:
        if name in base.checkers:
            checker.checkers[name] = base.checkers[name]
    return checker


def validator_for(schema: Any) -> Any:
    """A jsonschema validator of the schema's declared draft (2020-12 by default)."""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=_format_checker(cls))


def _has_remote_ref(doc: Any) -> bool:
    if isinstance(doc, dict):
        ref = doc.get("$ref")
        if isinstance(ref, str) and not ref.startswith("#"):
            return True
        return any(_has_remote_ref(v) for v in doc.values())
    if isinstance(doc, list):
        return any(_has_remote_ref(v) for v in doc)
    return False


def schema_usable(schema: Any) -> bool:
    """Whether a client can check outputs against the schema here (a valid schema of its draft,
    no reference to fetch) and xg2's front end takes it (offline: no vocabulary needed)."""
    import jsonschema

    if not isinstance(schema, dict) or _has_remote_ref(schema):
        return False
    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        cls.check_schema(schema)
    except Exception:       # noqa: BLE001 - any refusal: not a schema to load-test with
        return False
    try:
        import xg2
    except ImportError:
        return True         # the server's 400s are then counted as "unsupported" at run time
    try:
        xg2.Grammar.from_json_schema(schema, any_whitespace=False)
    except Exception:       # noqa: BLE001
        return False
    return True


# ------------------------------------------------------------------------------------------------
# Tool sets
# ------------------------------------------------------------------------------------------------

def _strip_annotations(doc: Any) -> Any:
    """The schema without the keywords that only describe (descriptions, titles, examples,
    `$schema`): what a client trimming its prompt sends; the language is the same."""
    if isinstance(doc, dict):
        out = {}
        for k, v in doc.items():
            if k in ("description", "title", "examples", "$schema", "$comment") and not isinstance(v, dict):
                continue
            if k in ("enum", "const", "default"):           # values, not schemas
                out[k] = v
            elif k in ("properties", "patternProperties", "$defs", "definitions") and isinstance(v, dict):
                out[k] = {name: _strip_annotations(sub) for name, sub in v.items()}
            else:
                out[k] = _strip_annotations(v)
        return out
    if isinstance(doc, list):
        return [_strip_annotations(v) for v in doc]
    return doc


def estimate_tokens(text: str) -> int:
    """A conservative token count of prompt text (SmolLM2's tokenizer gives 3 to 4 characters a
    token on JSON, and about 2 tokens a CJK character)."""
    ascii_chars = sum(1 for c in text if ord(c) < 128)
    return math.ceil(ascii_chars / 2.8) + 2 * (len(text) - ascii_chars)


def load_registry_tools(shared: Path | None = None) -> list[dict]:
    """The registry's tools as OpenAI tools (name, short description, parameters without
    annotations), keeping those a client can check (valid schema, plain name) and xg2 accepts."""
    shared = shared or shared_dir()
    out = []
    seen = set()
    with open(shared / "data" / "tools" / "registry.jsonl", encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            fn = rec["function"]
            name = fn.get("name", "")
            if not rec.get("metaschema_valid", True) or not TOOL_NAME_RE.match(name) or name in seen:
                continue
            params = _strip_annotations(fn.get("parameters") or {"type": "object"})
            if len(json.dumps(params, separators=(",", ":"))) > 700 or not schema_usable(params):
                continue
            seen.add(name)
            desc = " ".join((fn.get("description") or "").split())
            out.append({"type": "function", "function": {"name": name, "description": desc[:60],
                                                         "parameters": params}})
    return out


@dataclass
class ToolSet:
    index: int
    tools: list[dict]
    validators: dict[str, Any] = field(default_factory=dict, repr=False)

    def validator(self, name: str) -> Any:
        v = self.validators.get(name)
        if v is None:
            params = next(t["function"]["parameters"] for t in self.tools if t["function"]["name"] == name)
            v = self.validators[name] = validator_for(params)
        return v

    @property
    def names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]

    @property
    def easy(self) -> list[str]:
        """The tools a call of which can be short (no required argument): a random model finishes
        those within a small max_tokens, where it rarely closes a free string."""
        return [t["function"]["name"] for t in self.tools if not t["function"]["parameters"].get("required")]


class ToolPool:
    """`size` tool sets, set `i` built on first use from Random((seed, i)): a size drawn
    log-uniformly in [min_tools, max_tools], then that many tools of the registry within the
    prompt budget (`budget_tokens`, estimated): a large set takes the tools that fit its share of
    the budget, without their descriptions when it must, and is cut when even those do not fit
    (the tiny model's 2048 positions hold about 30 tools, the default model's 4096 about 60)."""

    def __init__(self, tools: list[dict], *, seed: int = 0, size: int = 1000, min_tools: int = 4,
                 max_tools: int = 64, budget_tokens: int = 1700):
        if len(tools) < min_tools:
            raise ValueError(f"{len(tools)} usable tools; a set needs {min_tools}")
        self.seed, self.size = seed, size
        self.min_tools, self.max_tools, self.budget_tokens = min_tools, max_tools, budget_tokens
        bare = [{"type": "function", "function": {k: v for k, v in t["function"].items() if k != "description"}}
                for t in tools]
        self.variants = [tools, bare]
        self.costs = [[estimate_tokens(json.dumps(t, ensure_ascii=False)) + 1 for t in ts] for ts in self.variants]
        self._sets: dict[int, ToolSet] = {}

    def get(self, i: int) -> ToolSet:
        s = self._sets.get(i)
        if s is None:
            rng = random.Random(f"tools/{self.seed}/{i}")
            want = round(math.exp(rng.uniform(math.log(self.min_tools), math.log(self.max_tools + 0.49))))
            share = self.budget_tokens / want
            n = len(self.variants[0])
            for variant, costs in zip(self.variants, self.costs):
                fits = [j for j in range(n) if costs[j] <= share]
                if len(fits) >= want:
                    break
            else:                   # not even bare tools fit their share: the cheapest, cut below
                fits = sorted(range(n), key=costs.__getitem__)[:max(want, self.min_tools)]
            picked, cost = [], 0
            for j in rng.sample(fits, len(fits)):
                if len(picked) >= want:
                    break
                if cost + costs[j] <= self.budget_tokens:
                    picked.append(j)
                    cost += costs[j]
            s = self._sets[i] = ToolSet(i, [variant[j] for j in picked])
        return s


# ------------------------------------------------------------------------------------------------
# Schemas
# ------------------------------------------------------------------------------------------------

#: jsonschemabench subsets drawn from (Handwritten is left out: nearly all of its feature tests are
#: refused by design).
SCHEMA_SUBSETS = ("Github_trivial", "Github_easy", "Github_medium", "Glaiveai2K", "JME", "Synthesized",
                  "Snowplow", "Kubernetes", "WashingtonPost", "MCPspec", "JsonSchemaStore", "BFCL")


@dataclass
class Schema:
    id: str
    schema: Any
    _validator: Any = field(default=None, repr=False)

    @property
    def validator(self) -> Any:
        if self._validator is None:
            self._validator = validator_for(self.schema)
        return self._validator


class SchemaPool:
    """The usable schemas of at most `max_bytes` (compact JSON), shuffled by the seed."""

    def __init__(self, *, seed: int = 0, max_bytes: int = 1200, subsets: Iterable[str] = SCHEMA_SUBSETS,
                 shared: Path | None = None, limit: int | None = 600):
        shared = shared or shared_dir()
        rows = []
        for sub in subsets:
            path = shared / "data" / "jsonschemabench" / f"{sub}.jsonl"
            if not path.exists():
                continue
            with open(path, encoding="utf-8") as f:
                for line in f:
                    rec = json.loads(line)
                    s = rec["schema"]
                    if len(json.dumps(s, separators=(",", ":"), ensure_ascii=False)) <= max_bytes:
                        rows.append((rec["id"], s))
        rows.sort(key=lambda r: r[0])
        random.Random(f"schemas/{seed}").shuffle(rows)
        self.schemas: list[Schema] = []
        self.skipped = 0
        for sid, s in rows:
            if limit is not None and len(self.schemas) >= limit:
                break
            if schema_usable(s):
                self.schemas.append(Schema(sid, s))
            else:
                self.skipped += 1
        if not self.schemas:
            raise ValueError("no usable schema")
        self.refused: set[str] = set()      # the server answered 400 for these: not sent again


# ------------------------------------------------------------------------------------------------
# Grammars with an independent check
# ------------------------------------------------------------------------------------------------

def _balanced(text: str) -> bool:
    depth = 0
    for c in text:
        if c not in "()":
            return False
        depth += 1 if c == "(" else -1
        if depth < 0:
            return False
    return depth == 0


def _arith(text: str) -> bool:
    """expr ::= term ("+" term)*; term ::= [0-9]+ | "(" expr ")" (iteratively: no recursion limit)."""
    pos, n = 0, len(text)
    stack = 0
    while True:
        # a term
        while pos < n and text[pos] == "(":
            stack += 1
            pos += 1
        start = pos
        while pos < n and text[pos].isascii() and text[pos].isdigit():
            pos += 1
        if pos == start:
            return False
        while True:
            if pos < n and text[pos] == "+":
                pos += 1
                break
            if pos < n and text[pos] == ")" and stack > 0:
                stack -= 1
                pos += 1
                continue
            return pos == n and stack == 0


@dataclass(frozen=True)
class GrammarCase:
    name: str
    kind: str                   # "ebnf" (guided_grammar) or "regex" (guided_regex)
    grammar: str
    check: Callable[[str], bool]
    prompt: str


def _regex_check(pattern: str) -> Callable[[str], bool]:
    rx = re.compile(pattern)
    return lambda s: rx.fullmatch(s) is not None


REGEX_CASES = [
    GrammarCase(f"regex-{name}", "regex", pattern, _regex_check(pattern), prompt)
    for name, pattern, prompt in [
        ("date", r"[0-9]{4}-[0-9]{2}-[0-9]{2}", "Today's date is "),
        ("code", r"[a-c]{2,4}-[0-9]{1,2}", "The code is "),
        ("colours", r"(red|green|blue)( (red|green|blue)){0,3}", "Colours: "),
        ("email", r"[a-z]{1,8}@[a-z]{1,8}\.(com|org|net)", "Contact: "),
        ("phone", r"\+?[0-9]{1,3}-[0-9]{3}-[0-9]{4}", "Phone: "),
        ("scalar", r"(true|false|null|-?[0-9]{1,5})", "Value: "),
        ("name", r"[A-Z][a-z]{1,10}( [A-Z][a-z]{1,10}){0,2}", "Name: "),
        ("hex", r"0x[0-9a-f]{2,8}", "Address: "),
    ]
]

EBNF_CASES = [
    GrammarCase("ebnf-answer", "ebnf", 'root ::= "yes" | "no" | "maybe"',
                _regex_check(r"yes|no|maybe"), "Answer: "),
    GrammarCase("ebnf-date", "ebnf",
                'root ::= d d d d "-" d d "-" d d\nd ::= [0-9]',
                _regex_check(r"[0-9]{4}-[0-9]{2}-[0-9]{2}"), "Date: "),
    GrammarCase("ebnf-pairs", "ebnf",
                'root ::= pair ("," pair)*\npair ::= key "=" num\nkey ::= [a-z] [a-z]?\nnum ::= [0-9] [0-9]?',
                _regex_check(r"[a-z]{1,2}=[0-9]{1,2}(,[a-z]{1,2}=[0-9]{1,2})*"), "Settings: "),
    GrammarCase("ebnf-intlist", "ebnf",
                'root ::= "[" (num ("," num)*)? "]"\nnum ::= "-"? [0-9] [0-9]?',
                _regex_check(r"\[(-?[0-9]{1,2}(,-?[0-9]{1,2})*)?\]"), "List: "),
    GrammarCase("ebnf-arith", "ebnf",
                'root ::= expr\nexpr ::= term ("+" term)*\nterm ::= [0-9]+ | "(" expr ")"',
                _arith, "Sum: "),
    GrammarCase("ebnf-parens", "ebnf", 'root ::= "" | "(" root ")" root', _balanced, "Parens: "),
    GrammarCase("ebnf-kv-json", "ebnf",
                'root ::= "{" ws "\\"k\\"" ws ":" ws val ws "}"\nval ::= "true" | "false" | [0-9]+\n'
                'ws ::= [ ]?',
                _regex_check(r'\{ ?"k" ?: ?(true|false|[0-9]+) ?\}'), "Object: "),
]

GRAMMAR_CASES = REGEX_CASES + EBNF_CASES


# ------------------------------------------------------------------------------------------------
# Response checks
# ------------------------------------------------------------------------------------------------

@dataclass
class Verdict:
    kind: str                   # "ok", "truncated" or "invalid_output"
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.kind != "invalid_output"


OK = Verdict("ok")


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0][:160] if str(e) else type(e).__name__


def check_json_output(finish: str | None, text: str | None, validator: Any) -> Verdict:
    """A json_schema answer: a finished one must parse and validate; one cut at max_tokens is
    "truncated"."""
    if finish == "length":
        return Verdict("truncated")
    if finish != "stop":
        return Verdict("invalid_output", f"finish_reason {finish!r}")
    try:
        value = json.loads(text or "")
    except ValueError as e:
        return Verdict("invalid_output", f"not JSON: {_first_line(e)}")
    errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        at = "/" + "/".join(map(str, e.absolute_path))
        return Verdict("invalid_output", f"does not validate at {at}: {e.message[:140]}")
    return OK


def check_tool_output(finish: str | None, content: str | None, calls: list[dict], tool_set: ToolSet,
                      tool_choice: Any) -> Verdict:
    """A tools answer (calls as OpenAI dicts: {"function": {"name", "arguments"}}). With
    `finish_reason` "tool_calls" every call names a tool of the request (the named one when
    tool_choice names one) and its arguments parse and validate; so do the whole calls an answer
    cut by the token limit ("length") gives before the one it was cut in. `auto` may answer in
    text (without a half-written call in it); `required` and named ones must call, or be cut
    ("truncated")."""
    mode = tool_choice if isinstance(tool_choice, str) else "named"
    named = tool_choice["function"]["name"] if mode == "named" else None
    if finish == "tool_calls" or (finish == "length" and calls):
        if not calls:
            return Verdict("invalid_output", "finish_reason tool_calls without tool calls")
        names = set(tool_set.names)
        for call in calls:
            fn = call.get("function") or {}
            name = fn.get("name")
            if name not in names:
                return Verdict("invalid_output", f"call of {name!r}, not a tool of the request")
            if named is not None and name != named:
                return Verdict("invalid_output", f"call of {name!r}, tool_choice named {named!r}")
            try:
                args = json.loads(fn.get("arguments") or "")
            except ValueError as e:
                return Verdict("invalid_output", f"{name}: arguments are not JSON: {_first_line(e)}")
            errors = list(tool_set.validator(name).iter_errors(args))
            if errors:
                e = errors[0]
                at = "/" + "/".join(map(str, e.absolute_path))
                return Verdict("invalid_output", f"{name}: arguments do not validate at {at}: {e.message[:120]}")
        return OK if finish == "tool_calls" else Verdict("truncated")
    if calls:
        return Verdict("invalid_output", f"tool calls with finish_reason {finish!r}")
    if finish == "length":
        return Verdict("truncated")
    if finish != "stop":
        return Verdict("invalid_output", f"finish_reason {finish!r}")
    if mode != "auto":
        return Verdict("invalid_output", f"tool_choice {mode}: finished without a tool call")
    if content and "<tool_call>" in content:
        return Verdict("invalid_output", "a finished answer holds an unparsed <tool_call> block")
    return OK


def check_grammar_output(finish: str | None, text: str | None, case: GrammarCase) -> Verdict:
    if finish == "length":
        return Verdict("truncated")
    if finish != "stop":
        return Verdict("invalid_output", f"finish_reason {finish!r}")
    if not case.check(text or ""):
        return Verdict("invalid_output", f"{case.name}: {text!r:.120} is not in the grammar's language")
    return OK


# ------------------------------------------------------------------------------------------------
# Server-sent events
# ------------------------------------------------------------------------------------------------

# ------------------------------------------------------------------------------------------------
# What a hostile tenant sends (loadtests' HostileTenant, and hostile_costs.py)
# ------------------------------------------------------------------------------------------------

HOSTILE_KINDS = ("slow_schema", "huge_tools", "too_many_tools", "deep", "malformed", "bad_json", "oversized")


def slow_schema(rng: random.Random) -> dict:
    """A schema never seen before that is as slow to compile as the limits allow: hundreds of
    optional members, or an anyOf of hundreds of objects (fresh names: no cache can help)."""
    tag = rng.randrange(1 << 40)
    if rng.random() < 0.5:
        return {"type": "object", "properties": {f"p{tag}_{i}": {"type": rng.choice(["string", "integer", "boolean"])}
                                                 for i in range(rng.randint(250, 400))}}
    return {"anyOf": [{"type": "object", "properties": {f"k{tag}_{j}_{i}": {"type": "integer"} for i in range(6)},
                       "required": [f"k{tag}_{j}_0"]} for j in range(rng.randint(150, 250))]}


def deep_body(model: str, depth: int) -> bytes:
    """A chat request whose schema nests `depth` arrays, written without recursion (json.dumps
    recurses per level and fails past about 990)."""
    head = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})[:-1]
    return (head + ', "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": '
            + '{"type": "array", "items": ' * depth + '{"type": "string"}' + "}" * depth + "}}}").encode()


def hostile_body(kind: str, rng: random.Random, model: str, tools: list[dict]) -> dict | bytes:
    """One hostile request body of `kind` (HOSTILE_KINDS); `tools` a registry tool set to inflate.
    Its expected answer is a 4xx with an OpenAI error body, or an answer when it stays within the
    limits (max_tokens 1)."""
    msgs = [{"role": "user", "content": "hi"}]
    if kind == "slow_schema":
        return {"model": model, "messages": msgs, "max_tokens": 1, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": slow_schema(rng)}}}
    if kind in ("huge_tools", "too_many_tools"):
        n = 64 if kind == "huge_tools" else rng.randint(129, 300)
        big = [{"type": "function", "function": {**t["function"], "name": f"{t['function']['name']}_{i}",
                                                  "description": "x" * 2000}}
               for i, t in enumerate(itertools.islice(itertools.cycle(tools), n))]
        return {"model": model, "messages": msgs, "tools": big, "tool_choice": "required", "max_tokens": 1}
    if kind == "deep":
        return deep_body(model, rng.randint(300, 3000))
    if kind == "malformed":
        return rng.choice([{"model": model, "messages": 5}, {"model": model, "messages": msgs, "max_tokens": -3},
                           {"model": model, "messages": msgs, "tool_choice": {"type": "function"}},
                           {"model": model, "messages": msgs, "response_format": {"type": "json_schema", "json_schema": {
                               "name": "x", "schema": {"$ref": "#/definitions/missing"}}}}])
    if kind == "bad_json":
        return b'{"model": "xg2", "messages": [{"role": "user", "content": "hi"}' + b"]" * rng.randint(0, 3)
    if kind == "oversized":
        return b'{"model": "xg2", "messages": [{"role": "user", "content": "' + b"a" * (5 << 20) + b'"}]}'
    raise ValueError(f"unknown hostile kind {kind!r}; one of {', '.join(HOSTILE_KINDS)}")


class StreamError(Exception):
    """A stream that is not well formed, cut before [DONE], or that carried an error event."""


def sse_data(chunks: Iterable[bytes | str]) -> Iterator[str]:
    """The `data:` payloads of a server-sent event stream, from its raw chunks."""
    buf = ""
    for chunk in chunks:
        buf += chunk.decode("utf-8", "replace") if isinstance(chunk, bytes) else chunk
        while True:
            cut = buf.find("\n\n")
            if cut < 0:
                break
            event, buf = buf[:cut], buf[cut + 2:]
            data = [line[5:].lstrip(" ") for line in event.splitlines() if line.startswith("data:")]
            if data:
                yield "\n".join(data)
    if buf.strip():
        raise StreamError(f"stream ends inside an event: {buf[:80]!r}")


@dataclass
class Assembled:
    """A streamed answer put back together."""

    content: str = ""
    tool_calls: list[dict] = field(default_factory=list)
    finish_reason: str | None = None
    completion_tokens: int | None = None
    first_token_at: float | None = None     # time.perf_counter() of the first content or call
    done: bool = False


def assemble(payloads: Iterable[str], clock: Callable[[], float]) -> Assembled:
    """Reassemble chat (`delta.content`, `delta.tool_calls`) or completion (`text`) chunks; raises
    StreamError for an error event, a malformed chunk, or a stream without [DONE]."""
    out = Assembled()
    calls: dict[int, dict] = {}
    parts: list[str] = []
    for data in payloads:
        if data == "[DONE]":
            out.done = True
            break
        try:
            chunk = json.loads(data)
        except ValueError:
            raise StreamError(f"a chunk is not JSON: {data[:80]!r}") from None
        if "error" in chunk:
            err = chunk["error"] or {}
            raise StreamError(f"error event: {err.get('code')}: {str(err.get('message'))[:120]}")
        usage = chunk.get("usage")
        if usage:
            out.completion_tokens = usage.get("completion_tokens")
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta")
            piece = (delta.get("content") if delta is not None else choice.get("text")) or ""
            if piece:
                parts.append(piece)
                if out.first_token_at is None:
                    out.first_token_at = clock()
            for tc in (delta or {}).get("tool_calls") or ():
                if out.first_token_at is None:
                    out.first_token_at = clock()
                slot = calls.setdefault(tc.get("index", 0), {"id": None, "function": {"name": "", "arguments": ""}})
                slot["id"] = tc.get("id") or slot["id"]
                fn = tc.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
            if choice.get("finish_reason"):
                out.finish_reason = choice["finish_reason"]
    if not out.done:
        raise StreamError("the stream ended without [DONE]")
    out.content = "".join(parts)
    out.tool_calls = [calls[i] for i in sorted(calls)]
    return out
