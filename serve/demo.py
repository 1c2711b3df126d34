"""The main job: start the application with its defaults, serve a short multi-tenant scenario
through the official `openai` client, check every answer as a client would, and shut down.

    xg2 demo [--model default|tiny|PATH] [--port 8000]

Four tenants (API keys) at once: two agents with tool sets from the shared tool registry (the
second reuses the first's tool sets, so its grammars come from the cache), one extracting JSON
with json-mode-eval schemas, one chatting with streaming. Each request prints its latency, time to
first token where streamed, its output and whether it validated; then the cache hits across
tenants from the replica's statistics.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema

HERE = Path(__file__).resolve().parent
_FALLBACK_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city.",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                                          "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "description": "Search the web.", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}, "max_results": {"type": "integer"}},
        "required": ["query"]}}},
]
_FALLBACK_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                    "required": ["name", "age"]}


def shared_dir() -> Path | None:
    env = os.environ.get("XG2_SHARED_DIR")
    for path in ([Path(env)] if env else []) + [HERE.parent.parent / "shared"]:
        if (path / "data").is_dir():
            return path
    return None


def tool_sets(shared: Path | None, rng: random.Random, n: int = 3, size: int = 4) -> list[list[dict]]:
    if shared is None:
        return [_FALLBACK_TOOLS] * n
    tools = []
    with open(shared / "data" / "tools" / "registry.jsonl", encoding="utf-8") as f:
        for line in f:
            t = json.loads(line)
            fn = t["function"]
            if fn.get("description", "").isascii() and len(json.dumps(fn["parameters"])) < 600:
                tools.append({"type": "function", "function": {k: fn[k] for k in ("name", "description", "parameters")
                                                               if k in fn}})
    return [rng.sample(tools, size) for _ in range(n)]


def schemas(shared: Path | None, rng: random.Random, n: int = 3) -> list[dict]:
    if shared is None:
        return [_FALLBACK_SCHEMA] * n
    with open(shared / "data" / "json-mode-eval.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    small = [r["schema"] for r in rows if len(json.dumps(r["schema"])) < 500]
    return rng.sample(small, n)


def check_tool_calls(message: Any, tools: list[dict]) -> str:
    by_name = {t["function"]["name"]: t["function"].get("parameters", {}) for t in tools}
    if not message.tool_calls:
        return "no tool call"
    for call in message.tool_calls:
        if call.function.name not in by_name:
            return f"unknown tool {call.function.name}"
        try:
            jsonschema.validate(json.loads(call.function.arguments), by_name[call.function.name])
        except (ValueError, jsonschema.ValidationError) as e:
            return f"invalid arguments: {str(e).splitlines()[0][:80]}"
    return "valid"


#: The demo's tenants; each gets a fresh random key per run, and the report reads the figures of all
#: of them with an admin key (serve/keys.py).
TENANTS = ("acme", "globex", "initech", "umbrella")


def demo_keys() -> tuple[dict[str, str], str]:
    """(tenant -> key, admin key), fresh for this run."""
    import secrets

    return {t: f"{t}-{secrets.token_urlsafe(18)}" for t in TENANTS}, f"admin-{secrets.token_urlsafe(18)}"


async def run_scenario(url: str, rng: random.Random, out: Any = sys.stdout,
                       keys: dict[str, str] | None = None) -> dict:
    import openai

    keys = keys or {t: f"{t}-key" for t in TENANTS}

    shared = shared_dir()
    sets = tool_sets(shared, rng)
    extraction = schemas(shared, rng)
    results: list[dict] = []

    async def agent(key: str, tools: list[dict], ask: str) -> None:
        c = openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0, timeout=300)
        t0 = time.perf_counter()
        r = await c.chat.completions.create(
            model="xg2", messages=[{"role": "user", "content": ask}], tools=tools, tool_choice="required",
            max_tokens=160, temperature=0)
        msg = r.choices[0].message
        verdict = check_tool_calls(msg, tools) if r.choices[0].finish_reason == "tool_calls" else \
            f"cut at max_tokens ({r.choices[0].finish_reason})"
        shown = "; ".join(f"{c.function.name}({c.function.arguments})" for c in msg.tool_calls or []) or msg.content \
            or "(cut inside its first call: no whole call, and the server returns no half of one)"
        results.append({"tenant": _tenant(keys, key), "kind": f"tools x{len(tools)}", "ms": (time.perf_counter() - t0) * 1e3,
                        "ttft_ms": None, "output": shown, "valid": verdict})

    async def extractor(key: str, schema: dict) -> None:
        c = openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0, timeout=300)
        t0 = time.perf_counter()
        r = await c.chat.completions.create(
            model="xg2", messages=[{"role": "user", "content": "Fill in a plausible example record as JSON."}],
            response_format={"type": "json_schema", "json_schema": {"name": "record", "schema": schema}},
            max_tokens=200, temperature=0, extra_body={"structured_outputs": {"disable_any_whitespace": True}})
        text = r.choices[0].message.content
        try:
            jsonschema.validate(json.loads(text), schema)
            verdict = "valid"
        except (ValueError, jsonschema.ValidationError) as e:
            verdict = ("cut at max_tokens" if r.choices[0].finish_reason == "length"
                       else f"INVALID: {str(e).splitlines()[0][:80]}")
        results.append({"tenant": _tenant(keys, key), "kind": "json_schema", "ms": (time.perf_counter() - t0) * 1e3,
                        "ttft_ms": None, "output": text, "valid": verdict})

    async def chatter(key: str, ask: str) -> None:
        c = openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0, timeout=300)
        t0 = time.perf_counter()
        first = None
        parts = []
        stream = await c.chat.completions.create(model="xg2", messages=[{"role": "user", "content": ask}],
                                                 max_tokens=48, temperature=0.7, seed=1, stream=True)
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or (time.perf_counter() - t0) * 1e3
                parts.append(chunk.choices[0].delta.content)
        results.append({"tenant": _tenant(keys, key), "kind": "chat, streamed", "ms": (time.perf_counter() - t0) * 1e3,
                        "ttft_ms": first, "output": "".join(parts), "valid": "n/a (free text)"})

    asks = ["What's the weather like in Paris today?", "Find me recent news about solar panels.",
            "Look up the population of Tokyo."]
    # round 1: tenants that bring their tool sets and schemas first
    await asyncio.gather(*(agent(keys["acme"], s, a) for s, a in zip(sets, asks)),
                         *(extractor(keys["globex"], s) for s in extraction),
                         chatter(keys["umbrella"], "Write one sentence about the sea."))
    # round 2: another tenant with the same tool sets (their grammars are cached now), and new asks
    await asyncio.gather(*(agent(keys["initech"], s, a) for s, a in zip(sets, reversed(asks))),
                         chatter(keys["umbrella"], "Name three colours."))
    for r in results:
        ttft = f", first token {r['ttft_ms']:.0f} ms" if r["ttft_ms"] else ""
        output = r["output"] if len(r["output"] or "") < 160 else r["output"][:157] + "..."
        print(f"[{r['tenant']:<12}] {r['kind']:<14} {r['ms']:7.0f} ms{ttft}  {r['valid']}\n    {output!r}", file=out)
    return {"results": results}


def _tenant(keys: dict[str, str], key: str) -> str:
    return next((t for t, k in keys.items() if k == key), "?")


def report_cache(base: str, out: Any = sys.stdout, admin_key: str | None = None) -> dict:
    import urllib.request

    headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
    with urllib.request.urlopen(urllib.request.Request(f"{base}/v1/xg2/stats", headers=headers)) as r:
        stats = json.loads(r.read())
    rt = stats["runtime"]
    print("\ncache across tenants (this replica):", file=out)
    print(f"  grammars compiled here: {rt['compiles'] - rt['tier_grammar_hits']}, found in the replica's cache: "
          f"{rt['grammar_hits']}, read from the cache shards: {rt['tier_grammar_hits']}, "
          f"shared with a compile in flight: {rt['compile_shared']}", file=out)
    by_tenant: dict[str, list[float]] = {}
    for rec in stats["recent"]:
        by_tenant.setdefault(rec["tenant"], []).append(rec["compile_ms"])
    for tenant, ms in by_tenant.items():
        print(f"  tenant {tenant}: grammar ready in {', '.join(f'{m:.1f}' for m in ms)} ms", file=out)
    steps = stats.get("steps") or {}
    if steps:
        print(f"  decode steps: forward {steps['forward_ms']:.1f} ms, mask fill {steps['fill_ms']:.3f} ms (beside "
              f"the forward), mask time exposed {steps['mask_exposed_ms']:.3f} ms per step", file=out)
    return stats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="xg2 demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    from .cli import Server
    from .keys import KeyRing

    keys, admin = demo_keys()
    ring = KeyRing([(k, t, False) for t, k in keys.items()] + [(admin, "operator", True)])
    with Server(model=args.model, port=args.port, api_keys=ring) as server:
        print(f"\nxg2 is serving {args.model} at {server.url}; running the scenario\n", flush=True)
        res = asyncio.run(run_scenario(server.url, random.Random(args.seed), keys=keys))
        report_cache(server.url.removesuffix("/v1"), admin_key=admin)
    bad = [r for r in res["results"] if r["valid"].startswith(("INVALID", "invalid", "unknown"))]
    print(f"\n{len(res['results'])} requests, {len(bad)} invalid outputs; shut down cleanly.")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
