"""The tool-calling workload of bench_runtime.py: requests as GrammarRuntime specs, with model-like outputs.

A request offers 8 tools drawn uniformly without replacement from ``<shared>/data/tools/registry.jsonl``
(bench_multitenant.sample_tools, seeded) as ``{"grammar": {"type": "tools", "tools": [...]}}`` with
each tool ``{"type": "function", "function": <the registry record's function>}``: ToolsSpec's
defaults, the qwen_3 format with reasoning disabled. Its output is built exactly as
bench_toolcalling.make_requests builds one (its sentences, ``begin_of`` and ``END``; arguments from
schema_instances.valid_instance): a short sentence, then one call (two 35% of the time) of the
request's tools, joined by ``"\\n"``, tokenized with the ``tokenizers`` library
(``add_special_tokens=False``). Draw i's output uses bench_toolcalling's seed for request i, so the
first draws are that benchmark's requests; further outputs for a tool set (`output_for`) take
seeds of their own.

``<shared>`` is ``$XG2_SHARED_DIR``, else the ``shared`` directory beside the checkout.
"""

from __future__ import annotations

import json
import os
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_multitenant import sample_tools
from bench_toolcalling import model_output

SHARED = Path(os.environ.get("XG2_SHARED_DIR") or Path(__file__).resolve().parents[2] / "shared")
TOKENIZER = SHARED / "tokenizers" / "deepseek_v3_tokenizer.json"
REGISTRY = SHARED / "data" / "tools" / "registry.jsonl"
#: Tools per request, and the share of outputs with two calls (bench_toolcalling's).
TOOLS_PER_REQUEST = 8
TWO_CALLS = 0.35


def load_tools(path: Path = REGISTRY) -> list[dict]:
    """The registry's tools as OpenAI tool objects, in file order."""
    with path.open(encoding="utf-8") as f:
        return [{"type": "function", "function": json.loads(line)["function"]} for line in f if line.strip()]


@dataclass
class Request:
    """One request: its tool set (`set_id`: the draw it came from), spec, output text and tokens."""

    set_id: int
    picks: tuple[int, ...]
    spec: dict
    text: str = ""
    tokens: list[int] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class Workload:
    """Distinct seeded tool sets over the registry, and outputs for them."""

    def __init__(self, tokenizer: Any, seed: int, tools: list[dict] | None = None):
        self.tokenizer = tokenizer        # a tokenizers.Tokenizer
        self.seed = seed
        self.tools = load_tools() if tools is None else tools
        self._sets: list[tuple[int, tuple[int, ...]]] = []      # (draw index, picks), distinct
        self._next = 0                    # tool sets taken so far

    def tool_sets(self, n: int) -> list[tuple[int, tuple[int, ...]]]:
        """The first `n` distinct tool sets of the seeded draw, each with its draw index."""
        want = max(n, 1)
        while len(self._sets) < n:
            seen = set()
            self._sets = []
            for i, pick in enumerate(sample_tools(2 * want + 16, TOOLS_PER_REQUEST, self.seed, len(self.tools))):
                names = {self.tools[k]["function"]["name"] for k in pick}
                key = frozenset(pick)
                if key in seen or len(names) < len(pick):
                    continue
                seen.add(key)
                self._sets.append((i, tuple(pick)))
            want *= 2
        return self._sets[:n]

    def spec(self, picks: tuple[int, ...]) -> dict:
        return {"grammar": {"type": "tools", "tools": [self.tools[k] for k in picks]}}

    def request(self, set_id: int, picks: tuple[int, ...], output_seed: int) -> Request:
        req = Request(set_id, picks, self.spec(picks))
        chosen = [self.tools[k]["function"] for k in picks]
        req.text, req.calls, req.notes = model_output(chosen, random.Random(output_seed), TWO_CALLS)
        if req.text:
            req.tokens = self.tokenizer.encode(req.text, add_special_tokens=False).ids
        return req

    def take(self, n: int) -> list[Request]:
        """Requests for the next `n` distinct tool sets not taken before (sets whose output could
        not be made are passed over), each with bench_toolcalling's output for its draw index."""
        out: list[Request] = []
        while len(out) < n:
            set_id, picks = self.tool_sets(self._next + 1)[self._next]
            self._next += 1
            req = self.request(set_id, picks, self.seed * 1_000_003 + set_id)
            if req.tokens:
                out.append(req)
        return out

    def output_for(self, base: Request, n: int) -> Request:
        """Another output (the `n`-th, seeded apart from bench_toolcalling's) for `base`'s tool set."""
        for attempt in range(8):
            req = self.request(base.set_id, base.picks, (self.seed * 1_000_003 + base.set_id) * 7919 + 65_537
                               + 1_000 * n + attempt)
            if req.tokens:
                return req
        return base
