"""Differential test: xg2's token bitmasks must equal xgrammar's, bit for bit.

For every grammar of the benchmark corpus (benchmarks/grammars) and four real
vocabularies (DeepSeek-V3 byte-level BPE, Mistral v3 SentencePiece with byte
fallback, o200k_base and Qwen tiktoken raw-byte vocabularies), walk the tokens
of each sample and, at every step, compare the two engines' whole masks (stop
and special token ids included); then accept the token in both. Each sample is
also accepted whole as text, where the mask must allow the stop tokens and
nothing the grammar cannot continue with, and the stop token must end both.
Compared are the bits of every id below the vocabulary size; the bits of the
last word past it belong to no token (xgrammar leaves them set in masks it
builds from the tokens it rejects, xg2 clears them).

Both engines get the same vocabulary through ``TokenizerInfo(encoded_vocab,
vocab_type, vocab_size=..., stop_token_ids=...)``.  Steps per sample are capped
(``MAX_STEPS``) to keep the module within a few minutes on 2 cores.

xgrammar and numpy are declared test dependencies (with the tokenizer libraries) and xg2 is the package under
test: an import failure of any of them fails this module, never skips it.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
import tiktoken
import tokenizers
import xgrammar as xgr
from tiktoken.load import load_tiktoken_bpe

import xg2

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
sys.path.insert(0, str(BENCH))

from conftest import SHARED, longest_match
from corpus import grammar_names, load_case

TOKENIZERS = SHARED / "tokenizers"

# Per-sample step caps: the first N tokens of every sample are compared.  A few
# grammars make xgrammar itself slow (~0.5 s per mask on a 200k vocabulary for
# `unicode` and `ambiguous`), so they get smaller caps to keep the module short.
MAX_STEPS = {"deepseek_v3": 40, "mistral_v3": 60, "o200k_base": 40, "qwen": 40}
HEAVY_GRAMMAR_STEPS = {"unicode": 4, "ambiguous": 4, "json": 12}
VOCABS = tuple(MAX_STEPS)


def step_cap(vocab_name: str, grammar: str) -> int:
    cap = MAX_STEPS[vocab_name]
    if grammar in HEAVY_GRAMMAR_STEPS:
        scale = 2 if vocab_name == "mistral_v3" else 1
        cap = min(cap, HEAVY_GRAMMAR_STEPS[grammar] * scale)
    return cap
GRAMMARS = tuple(grammar_names())


# ---------------------------------------------------------------- vocabularies


class Vocab:
    """An encoded vocabulary (as both engines take it) plus a tokenizer for samples."""

    def __init__(self, name, encoded, vocab_type: str, stop_ids, encode):
        self.name = name
        self.encoded = encoded
        self.vocab_type = vocab_type
        self.stop_ids = list(stop_ids)
        self.encode = encode
        self.size = len(encoded)

    def info(self, module):
        return module.TokenizerInfo(self.encoded, getattr(module.VocabType, self.vocab_type),
                                    vocab_size=self.size, stop_token_ids=self.stop_ids)


def _require(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"vocabulary file {path} not found")
    return path


def _deepseek() -> Vocab:
    tok = tokenizers.Tokenizer.from_file(str(_require(TOKENIZERS / "deepseek_v3_tokenizer.json")))
    vocab = tok.get_vocab(with_added_tokens=True)
    encoded = [""] * (max(vocab.values()) + 1)
    for piece, idx in vocab.items():
        encoded[idx] = piece
    eos = tok.token_to_id("<｜end▁of▁sentence｜>")
    return Vocab("deepseek_v3", encoded, "BYTE_LEVEL", [eos],
                 lambda text: tok.encode(text, add_special_tokens=False).ids)


def _greedy_encoder(pieces: list[bytes], skip: set[int]):
    """Longest-match tokenization over raw byte pieces (any spelling of the text is a
    valid token path for a matcher; it need not be the canonical BPE one)."""
    table = {p: i for i, p in enumerate(pieces) if p and i not in skip}

    def encode(text: str) -> list[int]:
        return longest_match(table, text.encode("utf-8"))

    return encode


def _mistral() -> Vocab:
    sp = spm.SentencePieceProcessor(model_file=str(_require(TOKENIZERS / "mistral_v3_sentencepiece.model")))
    encoded = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    special = {i for i in range(len(encoded)) if sp.is_control(i) or sp.is_unknown(i)}
    raw = []
    for i, piece in enumerate(encoded):
        if sp.is_byte(i):
            raw.append(bytes([int(piece[3:5], 16)]))
        else:
            raw.append(piece.replace("\u2581", " ").encode("utf-8"))
    # SentencePiece's own encoder adds a dummy-prefix space; tokenize greedily instead.
    return Vocab("mistral_v3", encoded, "BYTE_FALLBACK", [sp.eos_id()], _greedy_encoder(raw, special))


def _tiktoken(name: str, filename: str) -> Vocab:
    ranks = load_tiktoken_bpe(str(_require(TOKENIZERS / filename)))
    encoded = [b""] * (max(ranks.values()) + 1)
    for piece, idx in ranks.items():
        encoded[idx] = piece
    eos = len(encoded)
    encoded.append(b"<|endoftext|>")
    pattern = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    enc = tiktoken.Encoding(name=f"test_{name}", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
    return Vocab(name, encoded, "RAW", [eos], lambda text: enc.encode(text, disallowed_special=()))


@functools.cache
def get_vocab(name: str) -> Vocab:
    if name == "deepseek_v3":
        return _deepseek()
    if name == "mistral_v3":
        return _mistral()
    if name == "o200k_base":
        return _tiktoken(name, "o200k_base.tiktoken")
    if name == "qwen":
        return _tiktoken(name, "qwen.tiktoken")
    raise KeyError(name)


@functools.cache
def get_infos(name: str):
    vocab = get_vocab(name)
    return vocab.info(xgr), vocab.info(xg2)


def _bits(bitmask, size: int):
    arr = np.asarray(bitmask.numpy() if hasattr(bitmask, "numpy") else bitmask)
    return np.unpackbits(arr.reshape(-1).view(np.uint8), bitorder="little")[:size].astype(bool)


def _describe(vocab: Vocab, ids) -> str:
    shown = [f"{i}:{vocab.encoded[i]!r}" for i in ids[:8]]
    return ", ".join(shown) + (f", ... ({len(ids)} ids)" if len(ids) > 8 else "")


# ------------------------------------------------------------------------ test


def _compare(vocab: Vocab, ref_mask, our_mask, where: str, tokens=()) -> None:
    a, b = _bits(ref_mask, vocab.size), _bits(our_mask, vocab.size)
    diff = np.flatnonzero(a ^ b)
    if diff.size:
        prefix = b"".join(vocab.encoded[t] if isinstance(vocab.encoded[t], bytes)
                          else vocab.encoded[t].encode() for t in tokens)
        only_ref = [int(i) for i in diff if a[i]]
        only_ours = [int(i) for i in diff if b[i]]
        pytest.fail(
            f"{where} (after {prefix[-60:]!r}): masks differ on {diff.size} ids\n"
            f"  allowed only by xgrammar: {_describe(vocab, only_ref)}\n"
            f"  allowed only by xg2:      {_describe(vocab, only_ours)}"
        )


@pytest.mark.parametrize("vocab_name", VOCABS)
def test_tokenizer_info_matches_xgrammar(vocab_name: str) -> None:
    """The ids whose mask bits are special (never allowed) or stops (allowed at the end) agree."""
    ref, ours = get_infos(vocab_name)
    assert ours.vocab_size == ref.vocab_size
    assert list(ours.stop_token_ids) == list(ref.stop_token_ids)
    assert sorted(ours.special_token_ids) == sorted(ref.special_token_ids)


@pytest.mark.parametrize("grammar", GRAMMARS)
@pytest.mark.parametrize("vocab_name", VOCABS)
def test_bitmask_matches_xgrammar(vocab_name: str, grammar: str) -> None:
    vocab = get_vocab(vocab_name)
    ref_info, our_info = get_infos(vocab_name)
    case = load_case(grammar)

    ref_compiled = xgr.GrammarCompiler(ref_info, max_threads=1).compile_grammar(case.ebnf)
    our_compiled = xg2.GrammarCompiler(our_info, max_threads=1).compile_grammar(case.ebnf)
    ref_mask = xgr.allocate_token_bitmask(1, vocab.size)
    our_mask = xg2.allocate_token_bitmask(1, vocab.size)

    for sample_idx, sample in enumerate(case.samples):
        tokens = vocab.encode(sample)[: step_cap(vocab_name, grammar)]
        ref = xgr.GrammarMatcher(ref_compiled)
        ours = xg2.GrammarMatcher(our_compiled)
        for step, token in enumerate(tokens):
            ref.fill_next_token_bitmask(ref_mask, 0)
            ours.fill_next_token_bitmask(our_mask, 0)
            _compare(vocab, ref_mask, our_mask, f"{grammar} / {vocab_name}: sample {sample_idx}, step {step}",
                     tokens[:step])
            assert _bits(ref_mask, vocab.size)[token], \
                f"{grammar}/{vocab_name}: sample token {token} not allowed by xgrammar at step {step}"
            assert ref.accept_token(token), f"xgrammar rejected token {token} at step {step}"
            assert ours.accept_token(token), f"xg2 rejected token {token} at step {step}"

        # The end of the whole sample: the grammar may end here, so the stop tokens' bits are set
        # (with whatever could still continue), and a stop token ends both matchers.
        ref = xgr.GrammarMatcher(ref_compiled)
        ours = xg2.GrammarMatcher(our_compiled)
        assert ref.accept_string(sample), f"xgrammar rejected sample {sample_idx} of {grammar}"
        assert ours.accept_string(sample), f"xg2 rejected sample {sample_idx} of {grammar}"
        assert ours.is_completed() == ref.is_completed()
        ref.fill_next_token_bitmask(ref_mask, 0)
        ours.fill_next_token_bitmask(our_mask, 0)
        _compare(vocab, ref_mask, our_mask, f"{grammar} / {vocab_name}: end of sample {sample_idx}")
        assert _bits(ref_mask, vocab.size)[vocab.stop_ids].any(), "the end of a sample allows a stop token"
        stop = vocab.stop_ids[0]
        assert ours.accept_token(stop) == ref.accept_token(stop)
        assert ours.is_terminated() == ref.is_terminated()
