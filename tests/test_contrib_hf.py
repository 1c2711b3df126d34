"""transformers' generate() constrained by xg2.contrib.hf.LogitsProcessor: a small random Llama
over the DeepSeek-V3 vocabulary, a batch of prompts, one grammar for all rows or one per row; every
output is a complete document the grammar (and jsonschema, for schemas) accepts."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch
import transformers
from conftest import shared_file
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

import xg2
from xg2.contrib.hf import LogitsProcessor

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "k": {"enum": ["red", "green"]}, "ok": {"type": "boolean"}},
          "required": ["n", "k", "ok"], "additionalProperties": False}
REGEX = r"[A-Z]{2}-[0-9]{3}"


@pytest.fixture(scope="module")
def setup():
    tok = PreTrainedTokenizerFast(tokenizer_file=str(shared_file("deepseek_v3_tokenizer.json")))
    info = xg2.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok))
    stop = info.stop_token_ids[0]
    tok.pad_token_id = stop
    torch.manual_seed(0)
    # a model vocabulary padded past the tokenizer's, as real checkpoints often are
    config = LlamaConfig(vocab_size=len(tok) + 64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                         eos_token_id=stop, pad_token_id=stop, bos_token_id=None)
    model = LlamaForCausalLM(config).eval()
    return tok, info, model, xg2.GrammarCompiler(info)


def _generate(setup, processor, prompts: list[str], **kw) -> list[str]:
    tok, info, model, _ = setup
    tok.padding_side = "left"
    batch = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**batch, logits_processor=transformers.LogitsProcessorList([processor]),
                             max_new_tokens=60, pad_token_id=info.stop_token_ids[0], **kw)
    new = out[:, batch["input_ids"].shape[1]:]
    texts = []
    for row in new.tolist():
        assert info.stop_token_ids[0] in row, "the generation did not reach the stop token"
        texts.append(tok.decode(row[:row.index(info.stop_token_ids[0])]))
    return texts


@pytest.mark.parametrize("sample", [False, True])
def test_one_schema_for_a_batch(setup, sample):
    compiled = setup[3].compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)
    kw = {"do_sample": True, "top_k": 50} if sample else {"do_sample": False}
    torch.manual_seed(1)
    texts = _generate(setup, LogitsProcessor(compiled), ["Give JSON:", "Another one please:", "x"], **kw)
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMA)


def test_one_grammar_per_row_and_reuse(setup):
    compiler = setup[3]
    grammars = [compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False), compiler.compile_regex(REGEX),
                compiler.compile_grammar('root ::= "yes" | "no" | "maybe later"')]
    processor = LogitsProcessor(grammars)
    for attempt in range(2):        # the same processor for a second generate() call
        torch.manual_seed(attempt)
        texts = _generate(setup, processor, ["a", "bb", "ccc"], do_sample=True)
        jsonschema.validate(json.loads(texts[0]), SCHEMA)
        assert re.fullmatch(REGEX, texts[1]), texts[1]
        assert texts[2] in ("yes", "no", "maybe later"), texts[2]


def test_padded_columns_are_masked_and_mismatches_refused(setup):
    tok, info, model, compiler = setup
    processor = LogitsProcessor(compiler.compile_regex("a+"))
    scores = torch.zeros(2, model.config.vocab_size)
    ids = torch.zeros(2, 3, dtype=torch.long)
    out = processor(ids, scores)
    assert torch.isinf(out[:, info.vocab_size:]).all()
    assert torch.isfinite(out[0]).sum() == torch.isfinite(out[1]).sum() > 0
    with pytest.raises(xg2.UsageError):
        LogitsProcessor([compiler.compile_regex("a"), compiler.compile_regex("b")])(
            torch.zeros(3, 2, dtype=torch.long), torch.zeros(3, model.config.vocab_size))
    refused = tok.convert_tokens_to_ids("b")
    with pytest.raises(xg2.UsageError):     # a token the grammar refuses, sampled anyway
        processor(torch.tensor([[0, 0, 0, refused]] * 2), torch.zeros(2, model.config.vocab_size))
    with pytest.raises(TypeError):
        LogitsProcessor("not a grammar")
