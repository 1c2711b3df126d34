"""Model outputs read back (xg2.read_model_output) from the same definition as their grammars:
for every registered format, what the model's chat template writes is accepted by the format's
grammar on a real vocabulary and read back into the calls, reasoning and text it was written from;
an output cut anywhere gives no markup as text and only whole calls; a template names its format.
The random walks of test_model_formats compare this reader with the model's own parsers."""

from __future__ import annotations

import pytest
from test_model_formats import MODELS, Formats, render

import xg2
from xg2.grammar.model_output import TEMPLATE_SIGNS

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"},
        "opts": {"type": "object", "properties": {"units": {"enum": ["C", "F"]},
                                                  "hours": {"type": "array", "items": {"type": "number"}}}}},
    "required": ["city"]}}}
NOW = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}
TOOLS = [WEATHER, NOW]
ONE = [("get_weather", {"city": "Paris & <Lyon> \"x\"", "days": 3, "opts": {"units": "C", "hours": [1.5, 2]}})]
TWO = [*ONE, ("now", {})]
@pytest.fixture(scope="module")
def formats(deepseek_info, deepseek_tokenizer, harmony_info, harmony_encoding):
    return Formats(deepseek_info, deepseek_tokenizer, harmony_info, harmony_encoding)


#: Formats without reasoning in their output, and those whose turn holds no text before calls.
NO_REASONING = {"llama", "kimi", "exaone"}
NO_TEXT = {"cohere", "harmony"}


def _cases(model: str):
    for calls in ([ONE] if model == "harmony" else [ONE, TWO]):
        for reasoning in ("disabled", "enabled"):
            if reasoning == "enabled" and model in NO_REASONING:
                continue
            for text in ("",) if model in NO_TEXT else ("", "Checking the weather. "):
                yield calls, reasoning, text


@pytest.mark.parametrize("model", MODELS)
def test_what_the_template_writes_is_accepted_and_read_back(formats, model):
    for calls, reasoning, text in _cases(model):
        thought = "I should call the tool." if reasoning == "enabled" else ""
        out = render(model, calls, reasoning=thought, text=text)
        assert formats.accepts(model, TOOLS, out, check_masks=False, reasoning=reasoning), (model, out)
        read = xg2.read_model_output(model, out, TOOLS, reasoning)
        assert [(c.name, c.arguments) for c in read.calls] == calls, (model, out)
        assert (read.reasoning or "") == thought and (read.content or "") == text.strip(), (model, out, read)
        assert not read.cut


@pytest.mark.parametrize("model", MODELS)
def test_an_output_cut_anywhere_gives_whole_calls_and_no_markup(model):
    reasoning = "disabled" if model in NO_REASONING else "enabled"
    text = "" if model in NO_TEXT else "Hi. "
    calls = ONE if model == "harmony" else TWO
    full = render(model, calls, reasoning="" if reasoning == "disabled" else "hmm", text=text)
    hold = xg2.model_output_hold(model)
    for n in range(len(full)):
        read = xg2.read_model_output(model, full[:n], TOOLS, reasoning)
        got = [(c.name, c.arguments) for c in read.calls]
        assert got == calls[:len(got)], (model, full[:n])
        if read.content:
            assert not any(h and h in read.content for h in hold), (model, full[:n], read.content)
        if len(got) < len(calls) and n > len(full) - 10:
            assert read.cut, (model, full[:n])          # cut inside the last call: said so


@pytest.mark.parametrize("model", ["qwen_3", "llama", "deepseek_v3_1", "kimi", "harmony"])
def test_no_free_whitespace_in_arguments_when_asked(formats, model):
    """any_whitespace=False (the server's disable_any_whitespace) leaves the arguments xgrammar's
    fixed separators only, as it does a response format's JSON."""
    call = [("get_weather", {"city": "Rome", "days": 2})]
    fixed = render(model, call, reasoning="")
    loose = fixed.replace('{"city": "Rome", "days": 2}', '{ "city": "Rome",\n  "days": 2}')
    assert fixed != loose
    options = {"reasoning": "disabled", "tool_choice": "required"}
    for text in (fixed, loose):
        assert formats.accepts(model, TOOLS, text, check_masks=False, **options)
    assert formats.accepts(model, TOOLS, fixed, check_masks=False, any_whitespace=False, **options)
    assert not formats.accepts(model, TOOLS, loose, check_masks=False, any_whitespace=False, **options)


def test_a_template_names_its_format():
    # what each family's template writes, in a few words around the signs
    for name, signs in TEMPLATE_SIGNS:
        template = "{% for m in messages %}" + " ... ".join(signs) + "{% endfor %}"
        assert xg2.tool_format_of_template(template) == name
    assert xg2.tool_format_of_template("{{ messages }}<|im_start|>assistant") is None
    assert xg2.tool_format_of_template(None) is None
    assert {name for name, _ in TEMPLATE_SIGNS} == set(MODELS) - {"mimo"}


def test_a_format_without_a_reader_and_an_unknown_one_are_typed_errors():
    with pytest.raises(xg2.ModelFormatError, match="Unknown format"):
        xg2.read_model_output("no_such_model", "x")

    @xg2.register_model_structural_tag("test_plain_only")
    def plain(req):
        return {"type": "any_text"}

    with pytest.raises(xg2.ModelFormatError, match="no output reader"):
        xg2.read_model_output("test_plain_only", "x")

    @xg2.register_model_output_reader("test_plain_only", hold=())
    def read(text, tools, reasoning):
        return xg2.ModelOutput(content=text)

    assert xg2.read_model_output("test_plain_only", "x").content == "x"
    assert xg2.model_output_hold("test_plain_only") == ()
