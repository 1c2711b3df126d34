"""Tests of xg2.tokenizer: exact token bytes, special/stop detection, padding, bad input, and
agreement with xgrammar 0.2.8 on real vocabularies (when xgrammar is importable)."""

from __future__ import annotations

import base64
import json
import os
import pickle
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from anywhere without installing xg2
    sys.path.insert(0, str(REPO))

from conftest import SHARED

from xg2.errors import TokenizerError
from xg2.tokenizer import TokenizerInfo, VocabType

TOKENIZERS = SHARED / "tokenizers"
DEEPSEEK = TOKENIZERS / "deepseek_v3_tokenizer.json"
CLAUDE = TOKENIZERS / "claude_v1_tokenizer.json"
CL100K = TOKENIZERS / "cl100k_base.tiktoken"
O200K = TOKENIZERS / "o200k_base.tiktoken"
QWEN = TOKENIZERS / "qwen.tiktoken"
MISTRAL = TOKENIZERS / "mistral_v3_sentencepiece.model"

# GPT-2 bytes_to_unicode, written out independently of the module under test.
_PRINTABLE = [*range(33, 127), *range(161, 173), *range(174, 256)]
GPT2_CHAR = {b: chr(b) for b in _PRINTABLE}
GPT2_CHAR.update({b: chr(256 + k) for k, b in enumerate(b for b in range(256) if b not in GPT2_CHAR)})


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"real vocabulary {path.name} not found in {TOKENIZERS}")
    return path


def load_xgrammar():
    warnings.simplefilter("ignore")
    return pytest.importorskip("xgrammar")


def ordinary_ids(info: TokenizerInfo) -> list[int]:
    excluded = set(info.special_token_ids) | set(info.stop_token_ids)
    return [i for i in range(len(info.decoded_vocab)) if i not in excluded]


def read_ranks(path: Path) -> dict[bytes, int]:
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line.strip():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


# ----------------------------------------------------------------------------------------------
# Real vocabularies


@pytest.fixture(scope="module")
def deepseek() -> TokenizerInfo:
    return TokenizerInfo.from_huggingface(need(DEEPSEEK))


@pytest.fixture(scope="module")
def claude() -> TokenizerInfo:
    return TokenizerInfo.from_huggingface(need(CLAUDE))


@pytest.fixture(scope="module")
def mistral() -> TokenizerInfo:
    pytest.importorskip("sentencepiece")
    return TokenizerInfo.from_sentencepiece(need(MISTRAL))


def test_deepseek_bytes_and_tokens(deepseek: TokenizerInfo) -> None:
    vocab = json.loads(DEEPSEEK.read_text(encoding="utf-8"))["model"]["vocab"]
    dv = deepseek.decoded_vocab
    assert deepseek.vocab_type == VocabType.BYTE_LEVEL
    assert deepseek.vocab_size == len(dv) == 129280
    assert deepseek.add_prefix_space is False
    assert dv[vocab["Ġthe"]] == b" the"
    assert dv[vocab["Ċ"]] == b"\n"
    assert dv[vocab["ä½łå¥½"]] == "你好".encode()
    # an added special token stands for its own text, as in xgrammar
    assert dv[0] == "<｜begin▁of▁sentence｜>".encode()
    assert deepseek.token_bytes(vocab["Ġthe"]) == b" the"
    # every single-byte token of the base vocabulary is present and exact
    singles = {dv[vocab[GPT2_CHAR[b]]] for b in range(256)}
    assert singles == {bytes([b]) for b in range(256)}


def test_deepseek_special_and_stop(deepseek: TokenizerInfo) -> None:
    spec = json.loads(DEEPSEEK.read_text(encoding="utf-8"))
    added_special = {t["id"] for t in spec["added_tokens"] if t["special"]}
    added_plain = {t["id"] for t in spec["added_tokens"] if not t["special"]}
    assert deepseek.stop_token_ids == [1]  # <｜end▁of▁sentence｜>
    special = set(deepseek.special_token_ids)
    assert special == added_special - {1}
    assert len(special) == 1229
    assert 1 not in special and 0 in special and 2 in special
    assert not special & added_plain  # e.g. <think>, tool-call markers stay ordinary text
    assert deepseek.decoded_vocab[128821] == b"<think>"


def test_deepseek_loads_fast() -> None:
    need(DEEPSEEK)
    start = time.perf_counter()
    TokenizerInfo.from_huggingface(str(DEEPSEEK))
    elapsed = time.perf_counter() - start
    assert elapsed < 2.0, f"loading DeepSeek-V3 took {elapsed:.2f}s"


def test_deepseek_padding_and_truncation() -> None:
    padded = TokenizerInfo.from_huggingface(need(DEEPSEEK), vocab_size=129280 + 256)
    assert padded.vocab_size == 129536
    assert len(padded.decoded_vocab) == 129536  # factories pad the decoded vocab, as xgrammar
    assert padded.decoded_vocab[129300] == b""
    assert padded.special_token_ids[-256:] == list(range(129280, 129536))
    assert padded.token_bytes(129500) == b""
    assert padded.fingerprint != TokenizerInfo.from_huggingface(DEEPSEEK).fingerprint
    # smaller than the tokenizer: tokens above it are dropped (xgrammar's case 3)
    small = TokenizerInfo.from_huggingface(DEEPSEEK, vocab_size=128000)
    assert small.vocab_size == len(small.decoded_vocab) == 128000
    assert max(small.special_token_ids) < 128000 and small.stop_token_ids == [1]


def test_deepseek_inputs_agree() -> None:
    tokenizers = pytest.importorskip("tokenizers")
    a = TokenizerInfo.from_huggingface(str(need(DEEPSEEK)))
    b = TokenizerInfo.from_huggingface(tokenizers.Tokenizer.from_file(str(DEEPSEEK)))
    c = TokenizerInfo.from_huggingface(DEEPSEEK, stop_token_ids=[1])
    assert a.fingerprint == b.fingerprint == c.fingerprint
    d = TokenizerInfo.from_huggingface(DEEPSEEK, stop_token_ids=1)
    assert d.fingerprint == a.fingerprint


def test_claude(claude: TokenizerInfo) -> None:
    vocab = json.loads(CLAUDE.read_text(encoding="utf-8"))["model"]["vocab"]
    assert claude.vocab_type == VocabType.BYTE_LEVEL
    assert claude.vocab_size == 65000
    assert claude.decoded_vocab[vocab["Ġthe"]] == b" the"
    # xgrammar finds no stop token here; xg2 falls back to the added special <EOT>
    assert claude.stop_token_ids == [0]
    assert claude.special_token_ids == [1, 2, 3, 4]
    assert claude.decoded_vocab[:5] == [b"<EOT>", b"<META>", b"<META_START>", b"<META_END>", b"<SOS>"]


def test_tiktoken_files() -> None:
    for path, size in ((CL100K, 100256), (O200K, 199998), (QWEN, 151643)):
        info = TokenizerInfo.from_tiktoken(need(path))
        assert info.vocab_type == VocabType.RAW
        assert info.vocab_size == size
        assert info.stop_token_ids == [] and info.special_token_ids == []
        assert b" the" in info.decoded_vocab[:1000]
    cl = TokenizerInfo.from_tiktoken(CL100K)
    assert cl.decoded_vocab[279] == b" the"


def test_tiktoken_special_tokens_and_holes() -> None:
    harmony = {
        "<|endoftext|>": 199999,
        "<|start|>": 200006,
        "<|end|>": 200007,
        "<|message|>": 200008,
        "<|channel|>": 200005,
        "<|return|>": 200002,
        "<|call|>": 200012,
    }
    info = TokenizerInfo.from_tiktoken(need(O200K), special_tokens=harmony)
    assert info.vocab_size == 200013
    assert info.decoded_vocab[290] == b" the"
    assert info.decoded_vocab[200008] == b"<|message|>"
    assert info.stop_token_ids == [199999]  # by name (xgrammar's list)
    special = set(info.special_token_ids)
    assert set(harmony.values()) - {199999} <= special
    assert 199998 in special and 200001 in special  # holes decode to b"" and are special
    assert info.decoded_vocab[200001] == b""
    given = TokenizerInfo.from_tiktoken(O200K, special_tokens=harmony, stop_token_ids=[200002, 200012])
    assert given.stop_token_ids == [200002, 200012]
    assert 199999 in given.special_token_ids
    padded = TokenizerInfo.from_tiktoken(O200K, special_tokens=harmony, vocab_size=201088)
    assert padded.vocab_size == 201088 and padded.special_token_ids[-1] == 201087
    with pytest.raises(TokenizerError, match="out of range"):  # a padding id is not a stop token
        TokenizerInfo.from_tiktoken(O200K, special_tokens=harmony, vocab_size=201088, stop_token_ids=[201000])
    with pytest.raises(TokenizerError, match="out of range"):  # nor a token dropped by vocab_size
        TokenizerInfo.from_tiktoken(O200K, special_tokens=harmony, vocab_size=200000, stop_token_ids=[200002])


def test_tiktoken_qwen_ordinary_eos_name_is_not_a_stop() -> None:
    qwen_specials = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}
    info = TokenizerInfo.from_tiktoken(need(QWEN), special_tokens=qwen_specials)
    assert info.decoded_vocab[128247] == b"</s>"  # an ordinary text token in Qwen's vocabulary
    assert info.stop_token_ids == [151643]
    assert 128247 not in info.special_token_ids
    # the plain constructor keeps xgrammar's rule (every token named like a stop token)
    plain = TokenizerInfo(info.decoded_vocab, VocabType.RAW)
    assert plain.stop_token_ids == [128247, 151643]


def test_tiktoken_encoding() -> None:
    tiktoken = pytest.importorskip("tiktoken")
    ranks = read_ranks(need(CL100K))
    enc = tiktoken.Encoding(
        "cl100k_test",
        pat_str=r"\S+|\s+",
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": 100257, "<|fim_prefix|>": 100258},
    )
    info = TokenizerInfo.from_tiktoken(enc)
    assert info.vocab_size == 100259
    assert info.stop_token_ids == [100257]
    assert info.special_token_ids == [100256, 100258]
    assert info.decoded_vocab[:1000] == TokenizerInfo.from_tiktoken(CL100K).decoded_vocab[:1000]


def test_mistral_sentencepiece(mistral: TokenizerInfo) -> None:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(MISTRAL))
    dv = mistral.decoded_vocab
    assert mistral.vocab_type == VocabType.BYTE_FALLBACK
    assert mistral.vocab_size == len(dv) == 32768
    assert mistral.add_prefix_space is True
    assert mistral.stop_token_ids == [2]
    assert dv[sp.piece_to_id("▁the")] == b" the"
    assert dv[sp.piece_to_id("<0x0A>")] == b"\n"
    assert dv[sp.piece_to_id("<0xFF>")] == b"\xff"
    byte_ids = [i for i in range(sp.get_piece_size()) if sp.is_byte(i)]
    assert sorted(dv[i] for i in byte_ids) == [bytes([b]) for b in range(256)]
    control = {i for i in range(sp.get_piece_size()) if sp.is_control(i)}
    assert set(mistral.special_token_ids) == (control | {sp.unk_id()}) - {2}
    assert dv[sp.piece_to_id("[INST]")] == b"[INST]"
    again = TokenizerInfo.from_sentencepiece(sp)
    assert again.fingerprint == mistral.fingerprint
    from_bytes = TokenizerInfo.from_sentencepiece(MISTRAL.read_bytes())
    assert from_bytes.fingerprint == mistral.fingerprint


# ----------------------------------------------------------------------------------------------
# Agreement with xgrammar 0.2.8


def compare_with_xgrammar(ours: TokenizerInfo, ref) -> None:
    ours_vocab, ref_vocab = ours.decoded_vocab, ref.decoded_vocab
    assert len(ours_vocab) == len(ref_vocab)
    assert ours.vocab_size == ref.vocab_size
    assert int(ours.vocab_type) == ref.vocab_type.value
    assert ours.add_prefix_space == ref.add_prefix_space
    bad = [i for i in ordinary_ids(ours) if ours_vocab[i] != ref_vocab[i]]
    assert not bad, [(i, ours_vocab[i], ref_vocab[i]) for i in bad[:5]]
    # xgrammar's special tokens (empty tokens and padding) are special in xg2 too
    assert set(ref.special_token_ids) <= set(ours.special_token_ids)


@pytest.mark.parametrize("path", [DEEPSEEK, CLAUDE], ids=["deepseek", "claude"])
def test_huggingface_matches_xgrammar(path: Path) -> None:
    xgr = load_xgrammar()
    transformers = pytest.importorskip("transformers")
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(need(path)))
    ref = xgr.TokenizerInfo.from_huggingface(hf)
    ours = TokenizerInfo.from_huggingface(path)
    compare_with_xgrammar(ours, ref)
    assert ours.decoded_vocab == ref.decoded_vocab  # special tokens too
    if path == DEEPSEEK:
        assert ours.stop_token_ids == ref.stop_token_ids == [1]
    else:  # xgrammar detects no stop token for this vocabulary
        assert ref.stop_token_ids == [] and ours.stop_token_ids == [0]
    ours_tf = TokenizerInfo.from_huggingface(hf)
    assert ours_tf.fingerprint == ours.fingerprint
    padded_ref = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=ref.vocab_size + 64)
    padded = TokenizerInfo.from_huggingface(hf, vocab_size=ref.vocab_size + 64)
    compare_with_xgrammar(padded, padded_ref)


@pytest.mark.parametrize("path", [CL100K, O200K, QWEN], ids=["cl100k", "o200k", "qwen"])
def test_tiktoken_matches_xgrammar(path: Path) -> None:
    xgr = load_xgrammar()
    ranks = read_ranks(need(path))
    eot = len(ranks) + 1  # leaves a hole at len(ranks)
    vocab = [b""] * (eot + 1)
    for token, rank in ranks.items():
        vocab[rank] = token
    vocab[eot] = b"<|endoftext|>"
    ref = xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, stop_token_ids=[eot])
    ours = TokenizerInfo.from_tiktoken(path, special_tokens={"<|endoftext|>": eot})
    compare_with_xgrammar(ours, ref)
    assert ours.decoded_vocab == ref.decoded_vocab
    assert ours.stop_token_ids == ref.stop_token_ids == [eot]
    assert ours.special_token_ids == ref.special_token_ids == [len(ranks)]
    # the plain constructor detects stop tokens by name like xgrammar, on every token
    assert TokenizerInfo(vocab).stop_token_ids == xgr.TokenizerInfo(vocab).stop_token_ids


def test_sentencepiece_matches_xgrammar(mistral: TokenizerInfo) -> None:
    xgr = load_xgrammar()
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(MISTRAL))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    ref = xgr.TokenizerInfo(
        pieces, xgr.VocabType.BYTE_FALLBACK, stop_token_ids=[sp.eos_id()], add_prefix_space=True
    )
    compare_with_xgrammar(mistral, ref)
    assert mistral.decoded_vocab == ref.decoded_vocab
    assert mistral.stop_token_ids == ref.stop_token_ids
    ours_plain = TokenizerInfo(pieces, VocabType.BYTE_FALLBACK, stop_token_ids=2, add_prefix_space=True)
    assert ours_plain.decoded_vocab == ref.decoded_vocab
    assert ours_plain.special_token_ids == ref.special_token_ids == []


HAND_VOCABS = [
    (VocabType.RAW, ["a", "bc", " d", "é", "</s>", "", "<|endoftext|>", "\u2581x", "<0x41>"]),
    (VocabType.RAW, [b"a", b"\xff\xfe", b"", b"<eos>", b"\xe2\x96\x81"]),
    (
        VocabType.BYTE_FALLBACK,
        ["<unk>", "<s>", "</s>", "<0x00>", "<0x0A>", "<0xFF>", "▁the", "▁", "▁▁", "a▁b", "<0x41", "<0x4G>x"],
    ),
    (VocabType.BYTE_FALLBACK, [b"<0x41>", b"\xe2\x96\x81hi", b"\xff", b"</s>"]),
    (
        VocabType.BYTE_LEVEL,
        ["Ġthe", "Ċ", "ĠĠ", "Ã©", "é", "a b", "<|im_end|>", "<｜end▁of▁sentence｜>", "", "ĀāĂ", "Ń", "ł"],
    ),
    (VocabType.BYTE_LEVEL, [b"\xc4\xa0a", b"\xff\xfe", b"<eos>", b"plain"]),
]


@pytest.mark.parametrize("vocab_type,vocab", HAND_VOCABS)
def test_hand_vocab_matches_xgrammar(vocab_type: VocabType, vocab: list) -> None:
    xgr = load_xgrammar()
    ref = xgr.TokenizerInfo(vocab, xgr.VocabType(int(vocab_type)), vocab_size=len(vocab) + 3)
    ours = TokenizerInfo(vocab, vocab_type, vocab_size=len(vocab) + 3)
    assert ours.decoded_vocab == ref.decoded_vocab
    assert ours.stop_token_ids == ref.stop_token_ids
    assert ours.special_token_ids == ref.special_token_ids
    ref2 = xgr.TokenizerInfo(vocab, xgr.VocabType(int(vocab_type)), stop_token_ids=[0, 0, 1])
    ours2 = TokenizerInfo(vocab, vocab_type, stop_token_ids=[0, 0, 1])
    assert ours2.stop_token_ids == ref2.stop_token_ids == [0, 1]
    assert ours2.special_token_ids == ref2.special_token_ids


def test_all_byte_level_characters_match_xgrammar() -> None:
    xgr = load_xgrammar()
    vocab = [chr(c) for c in range(400)] + ["".join(GPT2_CHAR[b] for b in range(256))]
    ref = xgr.TokenizerInfo(vocab, xgr.VocabType.BYTE_LEVEL, stop_token_ids=[])
    ours = TokenizerInfo(vocab, VocabType.BYTE_LEVEL, stop_token_ids=[])
    # xgrammar reads the token as a C string, so U+0000 (not in the alphabet: it stands for
    # itself) decodes to b"" there; xg2 gives the byte, as the Hugging Face ByteLevel decoder.
    assert ref.decoded_vocab[0] == b"" and ours.decoded_vocab[0] == b"\x00"
    assert ours.decoded_vocab[1:] == ref.decoded_vocab[1:]
    assert ours.decoded_vocab[-1] == bytes(range(256))


# ----------------------------------------------------------------------------------------------
# Hand-built vocabularies: edge cases


def test_byte_level_alphabet() -> None:
    vocab = [GPT2_CHAR[b] for b in range(256)]
    info = TokenizerInfo(vocab, VocabType.BYTE_LEVEL)
    assert info.decoded_vocab == [bytes([b]) for b in range(256)]
    assert info.special_token_ids == [] and info.stop_token_ids == []
    info = TokenizerInfo(["Ġthe", "Ã©", "é", "a b", "<|im_end|>", "ĠĊ"], VocabType.BYTE_LEVEL)
    assert info.decoded_vocab == [b" the", "é".encode(), b"\xe9", b"a b", b"<|im_end|>", b" \n"]


def test_byte_fallback_pieces() -> None:
    vocab = ["<0x00>", "<0x0A>", "<0xFF>", "<0xab>", "▁hello", "▁", "<0x4G>", "<0x41", "a▁b▁"]
    info = TokenizerInfo(vocab, VocabType.BYTE_FALLBACK, add_prefix_space=True)
    assert info.decoded_vocab == [
        b"\x00",
        b"\n",
        b"\xff",
        b"\xab",
        b" hello",
        b" ",
        b"<0x4G>",
        b"<0x41",
        b"a b ",
    ]
    assert info.add_prefix_space is True


def test_raw_and_mixed() -> None:
    info = TokenizerInfo(["a", b"\xff", bytearray(b"x"), "▁", "Ġ"])
    assert info.decoded_vocab == [b"a", b"\xff", b"x", "▁".encode(), "Ġ".encode()]
    assert info.vocab_type == VocabType.RAW


def test_stop_and_special_rules() -> None:
    vocab = ["a", "</s>", "", "<|eot_id|>", "<pad>", "b"]
    info = TokenizerInfo(vocab)
    assert info.stop_token_ids == [1, 3]  # detected by name
    assert info.special_token_ids == [2]  # empty token
    info = TokenizerInfo(vocab, stop_token_ids=[5, 2], special_token_ids=[4, 5], vocab_size=8)
    assert info.stop_token_ids == [2, 5]
    assert info.special_token_ids == [4, 6, 7]  # stop ids never special; padding is
    info = TokenizerInfo(vocab, stop_token_ids=[])
    assert info.stop_token_ids == []
    info = TokenizerInfo(vocab, vocab_type=1, stop_token_ids=4)  # int vocab type, int stop id
    assert info.vocab_type == VocabType.BYTE_FALLBACK and info.stop_token_ids == [4]


def test_xgrammar_vocab_type_accepted() -> None:
    xgr = load_xgrammar()
    info = TokenizerInfo(["Ġa"], xgr.VocabType.BYTE_LEVEL)
    assert info.vocab_type == VocabType.BYTE_LEVEL and info.decoded_vocab == [b" a"]


def test_fingerprint() -> None:
    a = TokenizerInfo(["a", "b", "</s>"])
    b = TokenizerInfo([b"a", b"b", b"</s>"], VocabType.RAW, stop_token_ids=[2])
    assert a.fingerprint == b.fingerprint and len(a.fingerprint) == 64
    assert TokenizerInfo(["a", "b", "</s>"], stop_token_ids=[1]).fingerprint != a.fingerprint
    assert TokenizerInfo(["a", "c", "</s>"]).fingerprint != a.fingerprint
    assert TokenizerInfo(["a", "b", "</s>"], vocab_size=4).fingerprint != a.fingerprint
    assert TokenizerInfo(["ab", "", "</s>"]).fingerprint != TokenizerInfo(["a", "b", "</s>"]).fingerprint
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from xg2.tokenizer import TokenizerInfo;"
        "print(TokenizerInfo(['a', 'b', '</s>']).fingerprint)"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code, str(REPO)], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.strip() == a.fingerprint


def test_pickle_and_metadata_roundtrip() -> None:
    vocab = ["<s>", "</s>", "▁a", "<0x41>", ""]
    info = TokenizerInfo(
        vocab, VocabType.BYTE_FALLBACK, vocab_size=7, add_prefix_space=True, special_token_ids=[0]
    )
    again = pickle.loads(pickle.dumps(info))
    assert again.fingerprint == info.fingerprint and again.decoded_vocab == info.decoded_vocab
    meta = info.dump_metadata()
    assert json.loads(meta)["stop_token_ids"] == [1]
    rebuilt = TokenizerInfo.from_vocab_and_metadata(vocab, meta)
    assert rebuilt.fingerprint == info.fingerprint
    with pytest.raises(TokenizerError):
        TokenizerInfo.from_vocab_and_metadata(vocab, "{not json")
    with pytest.raises(TokenizerError):
        TokenizerInfo.from_vocab_and_metadata(vocab, '{"vocab_type": 1}')


def test_sorted_vocab() -> None:
    info = TokenizerInfo(["ab", "a", "</s>", "", "abc", "b"], special_token_ids=[5])
    assert info.sorted_token_ids == [1, 0, 4]
    assert info.sorted_common_prefix_lengths == [0, 1, 2]


def test_decoded_vocab_is_a_copy() -> None:
    info = TokenizerInfo(["a", "b"])
    info.decoded_vocab.append(b"zzz")
    info.stop_token_ids.append(1)
    assert info.decoded_vocab == [b"a", b"b"] and info.stop_token_ids == []


# ----------------------------------------------------------------------------------------------
# Hand-built tokenizer.json files


def write_tokenizer(tmp_path: Path, spec: dict, name: str = "tokenizer.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(spec), encoding="utf-8")
    return path


def bpe_spec(vocab: dict, *, added=(), decoder=None, normalizer=None, pre_tokenizer=None) -> dict:
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": c,
                "special": s,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
            }
            for i, c, s in added
        ],
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": None,
        "decoder": decoder,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "vocab": vocab,
            "merges": [],
        },
    }


LLAMA2_DECODER = {
    "type": "Sequence",
    "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0},
    ],
}
LLAMA2_NORMALIZER = {
    "type": "Sequence",
    "normalizers": [
        {"type": "Prepend", "prepend": "▁"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
    ],
}


def test_tokenizer_json_byte_fallback(tmp_path: Path) -> None:
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<0x0A>": 3, "▁hi": 4, "i": 5, "▁": 6}
    spec = bpe_spec(
        vocab,
        added=[(0, "<unk>", True), (1, "<s>", True), (2, "</s>", True)],
        decoder=LLAMA2_DECODER,
        normalizer=LLAMA2_NORMALIZER,
    )
    info = TokenizerInfo.from_huggingface(write_tokenizer(tmp_path, spec))
    assert info.vocab_type == VocabType.BYTE_FALLBACK
    assert info.add_prefix_space is True
    assert info.decoded_vocab == [b"<unk>", b"<s>", b"</s>", b"\n", b" hi", b"i", b" "]
    assert info.stop_token_ids == [2] and info.special_token_ids == [0, 1]


def test_tokenizer_json_metaspace_and_unigram(tmp_path: Path) -> None:
    spec = bpe_spec(
        {},
        decoder={"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True},
        pre_tokenizer={"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": True},
    )
    spec["model"] = {"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0], ["▁a", -1.0], ["b", -2.0]]}
    spec["added_tokens"] = [{"id": 0, "content": "<unk>", "special": True}]
    info = TokenizerInfo.from_huggingface(write_tokenizer(tmp_path, spec))
    assert info.vocab_type == VocabType.BYTE_FALLBACK
    assert info.add_prefix_space is True
    assert info.decoded_vocab == [b"<unk>", b" a", b"b"]
    assert info.special_token_ids == [0] and info.stop_token_ids == []


def test_tokenizer_json_config_eos_holes_and_json_string(tmp_path: Path) -> None:
    vocab = {GPT2_CHAR[b]: b for b in range(256)}
    vocab["Ġthe"] = 256
    spec = bpe_spec(
        vocab,
        added=[(300, "<|im_end|>", True), (301, "<|endoftext|>", True), (302, "<tool_call>", False)],
        decoder={"type": "ByteLevel"},
    )
    path = write_tokenizer(tmp_path, spec)
    info = TokenizerInfo.from_huggingface(path)
    assert info.vocab_type == VocabType.BYTE_LEVEL
    assert info.vocab_size == 303
    assert info.decoded_vocab[256] == b" the" and info.decoded_vocab[302] == b"<tool_call>"
    assert info.stop_token_ids == [301]  # by name
    assert info.special_token_ids == [*range(257, 300), 300]  # holes and the other special token
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|im_end|>"}}))
    from_dir = TokenizerInfo.from_huggingface(tmp_path)  # a folder holding tokenizer.json
    assert from_dir.stop_token_ids == [300] and 301 in from_dir.special_token_ids
    as_text = TokenizerInfo.from_huggingface(json.dumps(spec))
    assert as_text.fingerprint == info.fingerprint


def test_tokenizer_json_vocab_overrides_decoder(tmp_path: Path) -> None:
    vocab = {f"<0x{b:02X}>": b for b in range(256)}
    vocab["▁a"] = 256
    spec = bpe_spec(vocab, decoder={"type": "ByteLevel"})  # wrong decoder, as xgrammar 0.2.8 handles
    info = TokenizerInfo.from_huggingface(write_tokenizer(tmp_path, spec))
    assert info.vocab_type == VocabType.BYTE_FALLBACK
    assert info.decoded_vocab[256] == b" a" and info.decoded_vocab[10] == b"\n"


@pytest.mark.parametrize(
    "decoder,normalizer,pre_tokenizer",
    [
        (LLAMA2_DECODER, LLAMA2_NORMALIZER, None),
        (
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            None,
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        ),
        (None, None, None),
    ],
)
def test_tokenizer_json_metadata_matches_xgrammar(tmp_path: Path, decoder, normalizer, pre_tokenizer) -> None:
    xgr = load_xgrammar()
    transformers = pytest.importorskip("transformers")
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "a": 3, "b": 4, "▁a": 5, "Ġb": 6}
    spec = bpe_spec(
        vocab,
        added=[(0, "<unk>", True), (1, "<s>", True), (2, "</s>", True)],
        decoder=decoder,
        normalizer=normalizer,
        pre_tokenizer=pre_tokenizer,
    )
    path = write_tokenizer(tmp_path, spec)
    ref = xgr.TokenizerInfo.from_huggingface(transformers.PreTrainedTokenizerFast(tokenizer_file=str(path)))
    ours = TokenizerInfo.from_huggingface(path)
    assert int(ours.vocab_type) == ref.vocab_type.value
    assert ours.add_prefix_space == ref.add_prefix_space
    assert ours.decoded_vocab == ref.decoded_vocab
    assert ours.stop_token_ids == ref.stop_token_ids == [2]


# ----------------------------------------------------------------------------------------------
# Bad input


# (An empty list is a vocabulary, as in xgrammar: see test_conventions.py.)
@pytest.mark.parametrize("vocab", ["abc", b"abc", None, 5, {"a": 0}, ["a", 3], ["a", None], ["\ud800"]])
def test_bad_vocab(vocab) -> None:
    with pytest.raises(TokenizerError):
        TokenizerInfo(vocab)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"vocab_type": 7},
        {"vocab_type": "BYTES"},
        {"vocab_type": None},
        {"vocab_type": True},
        {"vocab_size": 1},
        {"vocab_size": 0},
        {"vocab_size": -3},
        {"vocab_size": "10"},
        {"vocab_size": True},
        {"stop_token_ids": [3]},
        {"stop_token_ids": [-1]},
        {"stop_token_ids": 2.0},
        {"stop_token_ids": ["1"]},
        {"stop_token_ids": "1"},
        {"stop_token_ids": [2], "vocab_size": 5},  # a padding id is never a stop token
        {"add_prefix_space": "yes"},
        {"special_token_ids": [9]},
        {"vocab_size": 10**12},
    ],
)
def test_bad_arguments(kwargs) -> None:
    with pytest.raises(TokenizerError):
        TokenizerInfo(["a", "b"], **kwargs)


def test_errors_are_value_errors() -> None:
    with pytest.raises(ValueError, match="out of range"):
        TokenizerInfo(["a", "b"], stop_token_ids=[5])


def test_bad_huggingface_inputs(tmp_path: Path) -> None:
    cases = {
        "missing": tmp_path / "nope.json",
        "folder without tokenizer.json": tmp_path,
    }
    (tmp_path / "bad.json").write_text("{ not json")
    cases["malformed"] = tmp_path / "bad.json"
    (tmp_path / "list.json").write_text("[1, 2]")
    cases["not an object"] = tmp_path / "list.json"
    (tmp_path / "novocab.json").write_text('{"model": {"type": "BPE"}}')
    cases["no vocab"] = tmp_path / "novocab.json"
    (tmp_path / "badid.json").write_text('{"model": {"vocab": {"a": -1}}}')
    cases["negative id"] = tmp_path / "badid.json"
    (tmp_path / "badadded.json").write_text('{"model": {"vocab": {"a": 0}}, "added_tokens": [{"id": "x"}]}')
    cases["bad added token"] = tmp_path / "badadded.json"
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00garbage")
    cases["binary"] = tmp_path / "binary.json"
    for what, path in cases.items():
        with pytest.raises(TokenizerError):
            TokenizerInfo.from_huggingface(path)
            pytest.fail(what)
    with pytest.raises(TokenizerError):
        TokenizerInfo.from_huggingface(12345)
    with pytest.raises(TokenizerError):
        TokenizerInfo.from_huggingface(object())
    with pytest.raises(TokenizerError):
        TokenizerInfo.from_huggingface('{"model": {"vocab": {"a": 0}}}', stop_token_ids=[])
    with pytest.raises(TokenizerError):
        TokenizerInfo.from_huggingface('{"model": {"vocab": {"a": 0}}}', stop_token_ids=[4])
    with pytest.raises(TokenizerError, match="without a token"):
        TokenizerInfo.from_huggingface('{"model": {"vocab": {"a": 0, "b": 1000000000}}}')
    with pytest.raises(TokenizerError, match="without a token"):
        TokenizerInfo.from_huggingface('{"model": {"vocab": {"a": 0}}}', vocab_size=10**9)
    with pytest.raises(TokenizerError):
        TokenizerInfo.from_huggingface('{"model": {"vocab": {}}}')
    info = TokenizerInfo.from_huggingface('{"model": {"vocab": {"a": 0, "b": 1}}}', stop_token_ids=1)
    assert info.vocab_type == VocabType.RAW and info.stop_token_ids == [1]


def test_bad_tiktoken_inputs(tmp_path: Path) -> None:
    good = base64.b64encode(b"hi").decode()
    files = {
        "missing": None,
        "bad base64": "!!!! 0\n",
        "bad rank": f"{good} x\n",
        "negative rank": f"{good} -1\n",
        "three fields": f"{good} 0 1\n",
        "duplicate token": f"{good} 0\n{good} 1\n",
        "duplicate rank": f"{good} 0\n{base64.b64encode(b'yo').decode()} 0\n",
        "empty": "\n\n",
    }
    for what, text in files.items():
        path = tmp_path / f"{what.replace(' ', '_')}.tiktoken"
        if text is not None:
            path.write_text(text)
        with pytest.raises(TokenizerError):
            TokenizerInfo.from_tiktoken(path)
            pytest.fail(what)
    path = tmp_path / "ok.tiktoken"
    path.write_text(f"{good} 0\n{base64.b64encode(b'yo').decode()} 1\n")
    assert TokenizerInfo.from_tiktoken(path).decoded_vocab == [b"hi", b"yo"]
    for kwargs in (
        {"special_tokens": {"<|x|>": 1}},
        {"special_tokens": {"<|x|>": -2}},
        {"special_tokens": [("<|x|>", 3)]},
        {"special_tokens": {b"<|x|>": 3}},
        {"special_tokens": {"<|x|>": 10**10}},
        {"stop_token_ids": [7]},
        {"stop_token_ids": []},
    ):
        with pytest.raises(TokenizerError):
            TokenizerInfo.from_tiktoken(path, **kwargs)
    with pytest.raises(TokenizerError):
        TokenizerInfo.from_tiktoken(3.5)


def test_bad_sentencepiece_inputs(tmp_path: Path) -> None:
    pytest.importorskip("sentencepiece")
    (tmp_path / "junk.model").write_bytes(b"definitely not a protobuf" * 10)
    for source in (tmp_path / "missing.model", tmp_path / "junk.model", b"\x00\x01junk", 42):
        with pytest.raises(TokenizerError):
            TokenizerInfo.from_sentencepiece(source)
    with pytest.raises(TokenizerError):
        TokenizerInfo.from_sentencepiece(need(MISTRAL), stop_token_ids=[40000])


class _FakeSlowTokenizer:
    """Stands for a transformers tokenizer without a tokenizers backend."""

    def __init__(self, **attrs) -> None:
        self.__dict__.update(attrs)

    def get_vocab(self) -> dict:
        return {}


def test_slow_transformers_tokenizers(mistral: TokenizerInfo) -> None:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(MISTRAL))
    info = TokenizerInfo.from_huggingface(_FakeSlowTokenizer(sp_model=sp, eos_token_id=2))
    assert info.fingerprint == mistral.fingerprint
    info = TokenizerInfo.from_huggingface(_FakeSlowTokenizer(sp_model=sp, eos_token_id=3), vocab_size=32800)
    assert info.stop_token_ids == [3] and info.vocab_size == 32800 and 2 in info.special_token_ids
    tiktoken = pytest.importorskip("tiktoken")
    enc = tiktoken.Encoding(
        "cl100k_test",
        pat_str=r"\S+|\s+",
        mergeable_ranks=read_ranks(need(CL100K)),
        special_tokens={"<|endoftext|>": 100257, "<|im_end|>": 100258},
    )
    info = TokenizerInfo.from_huggingface(_FakeSlowTokenizer(tokenizer=enc, eos_token_id=100258))
    assert info.vocab_type == VocabType.RAW and info.stop_token_ids == [100258]
    assert info.special_token_ids == [100256, 100257]
    with pytest.raises(TokenizerError, match="unsupported"):
        TokenizerInfo.from_huggingface(_FakeSlowTokenizer())
