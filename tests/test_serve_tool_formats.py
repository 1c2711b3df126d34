"""Every tool-call format the server can constrain, read back by the server (issue 35): a replica
in process serving a tiny model on DeepSeek-V3's vocabulary (harmony's markers added as its special
tokens), its tool format set to each registered one in turn, as a replica of that family's model
would have it. The model writes at random, or what the format's chat template writes (its sampler
following the template's tokens where the grammar allows them). Calls come back as OpenAI's
`message.tool_calls` and, streamed, as `delta.tool_calls`, with no markup left in the text; calls
cut by `max_tokens` give `length`."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import jsonschema
import pytest
import torch
from conftest import shared_file
from test_model_formats import MODELS, render
from transformers import PreTrainedTokenizerFast

import serve.engine
import xg2
from serve import protocol as p
from serve.chat import TemplateChatFormat
from serve.model import LoadedModel, _tiny_model
from serve.replica import Replica, ReplicaOptions, _held_markers, _StreamSplit
from xg2.actors.spec import ToolsSpec

HARMONY_TOKENS = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>", "<|call|>", "<|return|>"]
#: Arguments every grammar-valid output of which is short: the random model cannot wander.
SCHEMA = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"enum": [1, 2]}},
          "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}},
         {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {},
                                                                          "additionalProperties": False}}}]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if tools %}{% for t in tools %}{{ t.function.name }}\n{% endfor %}{% endif %}<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def served():
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(shared_file("deepseek_v3_tokenizer.json")),
                                        eos_token="<｜end▁of▁sentence｜>")
    tokenizer.add_special_tokens({"additional_special_tokens": HARMONY_TOKENS})
    tokenizer.chat_template = TEMPLATE
    model = _tiny_model(tokenizer, torch.float32).eval()
    loaded = LoadedModel(model=model, tokenizer=tokenizer, name="tiny-deepseek", vocab_size=model.config.vocab_size,
                         eos_token_ids=[tokenizer.eos_token_id], chat_format=TemplateChatFormat(tokenizer))
    replica = Replica(ReplicaOptions(model="tiny-deepseek", max_len=512), loaded=loaded)
    yield replica, loaded
    asyncio.run(replica.close())


def _chat(replica, fmt_loaded, **body) -> dict | list[dict]:
    replica.loaded = fmt_loaded
    body = {"model": "tiny-deepseek", "messages": [{"role": "user", "content": "Weather in Rome?"}],
            "tools": TOOLS, "temperature": 0, **body}

    async def go():
        out = await replica.chat("t", json.dumps(body).encode())
        if isinstance(out, bytes):
            return json.loads(out)
        events = []
        async for event in out:
            data = event.decode().removeprefix("data: ").strip()
            if data and data != "[DONE]":
                events.append(json.loads(data))
        return events

    return asyncio.run(go())


def _markup_free(model: str, text: str | None) -> None:
    for marker in xg2.model_output_hold(model):
        assert not marker or marker not in (text or ""), (model, text)


#: Kimi K3 writes a response channel of free text before its tools channel, which a random model
#: never closes (the template-following model below writes it).
FORCED = [m for m in MODELS if m != "kimi_k3"]


@pytest.mark.parametrize("model", FORCED)
def test_forced_calls_of_a_random_model_come_back_parsed(served, model):
    """Whatever a random model writes under a forced call, within its format (streamed reading is
    checked by the template-following model below and piece by piece above)."""
    replica, loaded = served
    fmt = dataclasses.replace(loaded, tool_format=model)
    body = {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "max_tokens": 200,
            "structured_outputs": {"disable_any_whitespace": True}}
    whole = _chat(replica, fmt, **body)
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "tool_calls", (model, choice)
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_") and call["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMA)
    _markup_free(model, choice["message"]["content"])


@pytest.mark.parametrize("model", ["qwen_3", "llama", "deepseek_v3_2", "harmony", "kimi_k3", "cohere"])
def test_calls_cut_by_max_tokens_give_length_and_no_markup(served, model):
    replica, loaded = served
    fmt = dataclasses.replace(loaded, tool_format=model)
    for stream in (False, True):
        out = _chat(replica, fmt, tool_choice="required", max_tokens=4, stream=stream)
        if stream:
            deltas = [e["choices"][0] for e in out if e["choices"]]
            finish = deltas[-1]["finish_reason"]
            content = "".join(d["delta"].get("content") or "" for d in deltas)
            calls = [tc for d in deltas for tc in d["delta"].get("tool_calls") or ()]
        else:
            choice = out["choices"][0]
            finish, content, calls = choice["finish_reason"], choice["message"]["content"], \
                choice["message"].get("tool_calls", [])
        assert finish == "length" and not calls, (model, stream, out)
        _markup_free(model, content)


def test_reasoning_comes_apart_from_the_text(served):
    replica, loaded = served
    fmt = dataclasses.replace(loaded, tool_format="qwen_3")
    body = {"tool_choice": "auto", "max_tokens": 24, "chat_template_kwargs": {"enable_thinking": True}}
    whole = _chat(replica, fmt, **body)["choices"][0]
    events = _chat(replica, fmt, stream=True, **body)
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
    if whole["finish_reason"] == "length" and not whole["message"].get("reasoning_content"):
        assert whole["message"]["content"] in (None, "") and not reasoning     # cut inside its reasoning
    else:
        assert whole["message"]["reasoning_content"] == reasoning
    assert "</think>" not in (whole["message"]["content"] or "")
    assert p.FinishReason is not None


@pytest.mark.parametrize("model", MODELS)
def test_streamed_text_is_what_the_whole_output_reads(model):
    """What a stream sends piece by piece (text held from where a call may begin, reasoning once
    it closes) adds up to what the whole output reads, for the output each template writes."""
    reasoning = "disabled" if model in ("llama", "kimi", "exaone") else "enabled"
    text = "" if model in ("cohere", "harmony") else "Checking the weather.\n"
    calls = [("get_weather", {"city": "Rome", "days": 2})]
    full = render(model, calls, reasoning="Let me see." if reasoning == "enabled" else "", text=text)
    spec = ToolsSpec(TOOLS, "auto", model, True, reasoning)
    hold = max((len(m) for m in _held_markers(spec)), default=1) - 1
    split, deltas = _StreamSplit(model, spec), []
    for n in range(1, len(full) + 1):
        deltas += split.step(full[:n], max(0, n - hold))
    whole = xg2.read_model_output(model, full, TOOLS, reasoning)
    deltas += split.end(whole)
    assert "".join(d.content for d in deltas if isinstance(d.content, str)) == (whole.content or "")
    assert "".join(d.reasoning_content for d in deltas if isinstance(d.reasoning_content, str)) == \
        (whole.reasoning or "")
    assert [(c.name, c.arguments) for c in whole.calls] == calls


@pytest.mark.parametrize("model", MODELS)
def test_what_the_template_writes_comes_back_parsed(served, model, monkeypatch):
    """A model that writes what its chat template writes (the sampler picks the template's next
    token whenever the grammar allows it, as a trained model would): every format, Kimi K3's
    included, comes back as the calls the template wrote, whole and streamed."""
    replica, loaded = served
    calls = [("get_weather", {"city": "Rome", "days": 2}), ("now", {})]
    calls = calls[:1] if model == "harmony" else calls
    script = loaded.tokenizer.encode(render(model, calls, reasoning=""), add_special_tokens=False)
    eos = loaded.eos_token_ids[0]
    real = serve.engine._sample

    def scripted(logits, gens):
        picked = real(logits, gens)
        for k, g in enumerate(gens):
            want = script[g.completion_tokens] if g.completion_tokens < len(script) else eos
            if torch.isfinite(logits[k, want]):
                picked[k] = want
        return picked

    monkeypatch.setattr(serve.engine, "_sample", scripted)
    fmt = dataclasses.replace(loaded, tool_format=model)
    body = {"tool_choice": "required", "max_tokens": len(script) + 8,
            "chat_template_kwargs": {"enable_thinking": False}}
    whole = _chat(replica, fmt, **body)["choices"][0]
    assert whole["finish_reason"] == "tool_calls", (model, whole)
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in whole["message"]["tool_calls"]]
    assert got == calls and not whole["message"]["content"], (model, whole)
    events = _chat(replica, fmt, stream=True, **body)
    deltas = [e["choices"][0] for e in events if e["choices"]]
    streamed = [(tc["function"]["name"], json.loads(tc["function"]["arguments"]))
                for d in deltas for tc in d["delta"].get("tool_calls") or ()]
    assert streamed == calls and deltas[-1]["finish_reason"] == "tool_calls"
    assert not "".join(d["delta"].get("content") or "" for d in deltas)
