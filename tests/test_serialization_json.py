"""xgrammar's JSON forms (serialize_json / deserialize_json) of TokenizerInfo, Grammar and
CompiledGrammar: round trips, a compiled grammar read in another process giving the same masks, and
the refusals an engine's except clauses written for xgrammar catch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import xg2
from xg2.exception import DeserializeFormatError, DeserializeVersionError, InvalidJSONError

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from corpus import grammar_names, load_case

SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}, "tags": {"type": "array", "items": {"enum": ["a", "b"]}},
                                           "note": {"type": "string", "maxLength": 8}},
          "required": ["id"], "additionalProperties": False}
TAG = {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<f"], "tags": [
    {"type": "tag", "begin": "<f>", "content": {"type": "json_schema", "json_schema": SCHEMA}, "end": "</f>"}]}}


def _masks(matcher: xg2.GrammarMatcher, data: bytes, info: xg2.TokenizerInfo) -> list[bytes]:
    """The mask before each byte of `data`, fed one byte at a time as text."""
    bm = xg2.allocate_token_bitmask(1, info.vocab_size)
    out = []
    for i in range(len(data) + 1):
        matcher.fill_next_token_bitmask(bm, 0)
        out.append(bm.numpy().tobytes())
        if i < len(data):
            assert matcher.accept_string(data[i:i + 1])
    return out


def test_tokenizer_info_round_trip(json_info, deepseek_info):
    for info in (json_info, deepseek_info):
        back = xg2.TokenizerInfo.deserialize_json(info.serialize_json())
        assert back.fingerprint == info.fingerprint
        assert back.decoded_vocab == info.decoded_vocab
        assert (back.vocab_type, back.vocab_size, back.add_prefix_space) == \
            (info.vocab_type, info.vocab_size, info.add_prefix_space)
        assert back.stop_token_ids == info.stop_token_ids
        assert back.special_token_ids == info.special_token_ids


@pytest.mark.parametrize("name", grammar_names())
def test_grammar_round_trip_corpus(name):
    g = xg2.Grammar.from_ebnf(load_case(name).ebnf)
    assert str(xg2.Grammar.deserialize_json(g.serialize_json())) == str(g)


def test_grammar_round_trip_other_sources(json_info):
    for g in (xg2.Grammar.from_json_schema(json.dumps(SCHEMA)), xg2.Grammar.from_regex(r"[a-z]{2,5}\d+"),
              xg2.Grammar.from_structural_tag(TAG), xg2.Grammar.builtin_json_grammar(),
              xg2.Grammar.from_ebnf('start ::= "x" start | "y"', root_rule_name="start")):
        back = xg2.Grammar.deserialize_json(g.serialize_json())
        # the same grammar as its printed EBNF read back (a front-end's character classes print in
        # the order they were written, read-back ones in code-point order)
        assert str(back) == str(xg2.Grammar.from_ebnf(str(g), root_rule_name=g.ir.root))
        c = xg2.GrammarCompiler(json_info)
        text = {"start": b"xxy"}.get(g.ir.root, None)
        if text is not None:
            assert xg2.GrammarMatcher(c.compile_grammar(back)).accept_string(text)


def test_compiled_grammar_in_another_process_gives_the_same_masks(json_info, tmp_path):
    """The JSON of a compiled grammar and of its TokenizerInfo, read by a fresh interpreter: the
    masks along a document equal the writer's."""
    compiled = xg2.GrammarCompiler(json_info).compile_json_schema(json.dumps(SCHEMA))
    doc = b'{"id": 7, "tags": ["a", "b"], "note": "hi\\n"}'
    want = _masks(xg2.GrammarMatcher(compiled), doc, json_info)
    (tmp_path / "info.json").write_text(json_info.serialize_json())
    (tmp_path / "grammar.json").write_text(compiled.serialize_json())
    reader = f"""
import hashlib, sys
sys.path.insert(0, {str(REPO)!r})
import xg2
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_serialization_json import _masks
info = xg2.TokenizerInfo.deserialize_json(open({str(tmp_path / "info.json")!r}).read())
compiled = xg2.CompiledGrammar.deserialize_json(open({str(tmp_path / "grammar.json")!r}).read(), info)
for m in _masks(xg2.GrammarMatcher(compiled), {doc!r}, info):
    print(hashlib.sha256(m).hexdigest())
"""
    out = subprocess.run([sys.executable, "-c", reader], capture_output=True, text=True, timeout=300, cwd=REPO,
                         check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    import hashlib

    assert out.stdout.split() == [hashlib.sha256(m).hexdigest() for m in want]


def test_compiled_structural_tag_round_trip(json_info):
    compiled = xg2.GrammarCompiler(json_info).compile_structural_tag(TAG)
    back = xg2.CompiledGrammar.deserialize_json(compiled.serialize_json(), json_info)
    doc = b'text <f>{"id": 1}</f> more'
    assert _masks(xg2.GrammarMatcher(back), doc, json_info) == _masks(xg2.GrammarMatcher(compiled), doc, json_info)
    assert str(back.grammar) == str(compiled.grammar)


def test_refusals_have_xgrammars_names(json_info, deepseek_info):
    good = xg2.Grammar.from_regex("a+").serialize_json()
    compiled = xg2.GrammarCompiler(json_info).compile_regex("a+").serialize_json()
    with pytest.raises(InvalidJSONError):
        xg2.Grammar.deserialize_json("{not json")
    with pytest.raises(DeserializeVersionError):
        xg2.Grammar.deserialize_json(good.replace(xg2.get_serialization_version(), "xg2-json-0"))
    with pytest.raises(DeserializeFormatError):        # another kind
        xg2.TokenizerInfo.deserialize_json(good)
    with pytest.raises(DeserializeFormatError):        # a field of the wrong type
        xg2.Grammar.deserialize_json(json.dumps({**json.loads(good), "ebnf": 3}))
    with pytest.raises(DeserializeFormatError):        # EBNF that does not parse
        xg2.Grammar.deserialize_json(json.dumps({**json.loads(good), "ebnf": "root ::= ("}))
    with pytest.raises(DeserializeFormatError):        # another vocabulary
        xg2.CompiledGrammar.deserialize_json(compiled, deepseek_info)
    with pytest.raises(DeserializeFormatError):        # a damaged blob
        obj = json.loads(compiled)
        blob = obj["blob"]
        xg2.CompiledGrammar.deserialize_json(json.dumps({**obj, "blob": blob[:-8] + "AAAAAAA="}), json_info)
    with pytest.raises(DeserializeFormatError):
        xg2.TokenizerInfo.deserialize_json(json.dumps({**json.loads(json_info.serialize_json()),
                                                       "decoded_vocab": [1, 2]}))
    for err in (InvalidJSONError, DeserializeFormatError):
        assert issubclass(err, RuntimeError)


def test_masks_after_round_trip_of_a_tokenizer(json_info):
    """A compiled grammar read with the TokenizerInfo that came back from JSON (same fingerprint)."""
    back = xg2.TokenizerInfo.deserialize_json(json_info.serialize_json())
    compiled = xg2.GrammarCompiler(json_info).compile_grammar('root ::= "ab"+')
    again = xg2.CompiledGrammar.deserialize_json(compiled.serialize_json(), back)
    m = xg2.GrammarMatcher(again)
    assert m.accept_string("abab") and m.is_completed()
    assert np.array_equal(np.frombuffer(b"".join(_masks(m, b"", back)), np.uint8),
                          np.frombuffer(b"".join(_masks(xg2.GrammarMatcher(compiled), b"abab", json_info)[-1:]), np.uint8))


def test_a_padded_vocabulary_comes_back_the_same() -> None:
    """A TokenizerInfo whose vocab_size passes its vocabulary (padding ids) reads back the same:
    its decoded vocabulary (not padded out), its JSON, its fingerprint and its special tokens."""
    import xg2

    vocab = ["1", "212", "a", "A", "b", "一", "-", "aBc", "abc"]
    for size in (None, 10, 64):
        info = xg2.TokenizerInfo(vocab, vocab_type=xg2.VocabType.BYTE_FALLBACK, vocab_size=size,
                                 stop_token_ids=[0, 1], add_prefix_space=True)
        back = xg2.TokenizerInfo.deserialize_json(info.serialize_json())
        assert back.decoded_vocab == info.decoded_vocab
        assert back.serialize_json() == info.serialize_json()
        assert back.fingerprint == info.fingerprint
        assert back.special_token_ids == info.special_token_ids and back.vocab_size == info.vocab_size
