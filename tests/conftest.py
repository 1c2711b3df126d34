"""Shared fixtures: real vocabularies from ../shared beside the checkout, and a small hand-made one.

`XG2_SHARED_DIR` points the tests at another copy of the shared data; setting it to a missing
directory shows which tests need the real data (they skip, saying so) and that the rest run without it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Ray reads this when it is first imported (a test module may import it while being collected):
# with it, every Ray the tests start takes 127.0.0.1 as its node's address and listens on the
# loopback only (by default it takes the machine's address and listens on every interface).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

SHARED = Path(os.environ.get("XG2_SHARED_DIR") or Path(__file__).resolve().parents[1].parent / "shared")
TOKENIZERS = SHARED / "tokenizers"


def shared_file(name: str) -> Path:
    path = TOKENIZERS / name
    if not path.exists():
        pytest.skip(f"{path} not found: the real vocabularies live in ../shared beside the checkout")
    return path


def longest_match(table: dict[bytes, int], data: bytes) -> list[int]:
    """Longest-match tokenization of `data` over a byte -> token id table. Any spelling of a text is
    a valid token path for a matcher; it need not be the tokenizer's canonical one."""
    longest = max(map(len, table))
    out, pos = [], 0
    while pos < len(data):
        for n in range(min(longest, len(data) - pos), 0, -1):
            idx = table.get(data[pos:pos + n])
            if idx is not None:
                out.append(idx)
                pos += n
                break
        else:
            raise AssertionError(f"byte {data[pos]:#x} has no token")
    return out


@pytest.fixture(scope="session")
def deepseek_info():
    import xg2

    return xg2.TokenizerInfo.from_huggingface(str(shared_file("deepseek_v3_tokenizer.json")))


@pytest.fixture(scope="session")
def small_info():
    """Every single byte that can start or continue UTF-8, plus multi-byte tokens that cross structure."""
    import xg2

    vocab = [bytes([b]) for b in range(256)]
    vocab += [w.encode() for w in [
        "ab", "abc", "ba", "1+", "+2", "12", "(1", "1)", "))", "((", '{"', '":', '",', '"}', "true", "false",
        "null", ", ", ": ", "  ", "\n ", "ä", "一二", "中文", "😀", "xy", "yx", "x=", "=y", "aaa", "bbb",
        "<think>", "</think>", "a b", " a", "b ", "-1", "0.", ".5", "e+", "1e", '\\"', "\\u00", '"a', 'a"',
    ]]
    vocab += [b"\xe4", b"\xe4\xb8", b"\xf0\x9f"]
    vocab += ["</s>"]
    return xg2.TokenizerInfo(vocab, xg2.VocabType.RAW, stop_token_ids=[len(vocab) - 1])


#: Pieces of JSON text a real vocabulary would hold as single tokens, so that tokens cross structure
#: (a key's quote and colon, a value and the comma after it) as they do with a model's tokenizer.
JSON_PIECES = [
    '{"', '"}', '":', '": ', '",', '", "', '":"', '"]', '["', '[{', '}]', '},', '}, {', '],', ', ', ': ', ',"',
    "true", "false", "null", "tr", "ue", "nu", "ll", "fal", "se", "-1", "0.", ".5", "e+", "e-", "1e", "10",
    "00", "123", "  ", "    ", "\n", "\n  ", "\n    ", '\\"', "\\n", "\\u", "\\u00", "\\\\", "name", "type",
    "id", "value", "a", "ab", "abc", '"a', 'a"', "é", "ä", "一", "中文", "😀", "http", "://", ".com", "@",
]


@pytest.fixture(scope="session")
def json_info():
    """A small vocabulary for language tests that need no real tokenizer: every single byte (so any
    UTF-8 text has a path) plus common JSON pieces, and a stop token."""
    import xg2

    vocab = [bytes([b]) for b in range(256)]
    vocab += [w.encode() for w in dict.fromkeys(JSON_PIECES) if len(w.encode()) > 1]
    vocab += [b"</s>"]
    return xg2.TokenizerInfo(vocab, xg2.VocabType.RAW, stop_token_ids=[len(vocab) - 1])


@pytest.fixture(scope="session")
def byte_compiler():
    """Every byte a token and a stop token (id 256): JSON Schema tests judge documents without a
    real vocabulary."""
    import xg2

    vocab = [bytes([b]) for b in range(256)] + [b"</s>"]
    return xg2.GrammarCompiler(xg2.TokenizerInfo(vocab, xg2.VocabType.RAW, stop_token_ids=[256]))


@pytest.fixture(scope="session")
def format_checker():
    """jsonschema's format checker, with every format xg2 implements present: a checker exists only
    when its optional package imports, and a missing one would judge every string valid, letting a
    test that compares against it pass without checking anything."""
    import jsonschema

    from xg2.grammar.formats import FORMAT_PATTERNS

    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    missing = sorted(set(FORMAT_PATTERNS) - set(checker.checkers))
    assert not missing, f"jsonschema has no checker for {missing}: install the test extra (jsonschema[format-nongpl])"
    return checker


@pytest.fixture(scope="session")
def deepseek_tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(shared_file("deepseek_v3_tokenizer.json")))


#: gpt-oss's special tokens after the o200k ranks (the o200k_harmony encoding), the ones its chat
#: format uses; `<|return|>` and `<|call|>` end a generation.
HARMONY_SPECIALS = {"<|startoftext|>": 199998, "<|endoftext|>": 199999, "<|return|>": 200002,
                    "<|constrain|>": 200003, "<|channel|>": 200005, "<|start|>": 200006, "<|end|>": 200007,
                    "<|message|>": 200008, "<|call|>": 200012}
#: o200k's pre-tokenizer split (words with their leading punctuation, 1-3 digit runs, punctuation
#: runs, newlines, spaces).
O200K_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@pytest.fixture(scope="session")
def harmony_info():
    """gpt-oss's vocabulary: o200k plus its special tokens, `<|return|>` and `<|call|>` as stops."""
    import xg2

    return xg2.TokenizerInfo.from_tiktoken(str(shared_file("o200k_base.tiktoken")), special_tokens=HARMONY_SPECIALS,
                                           stop_token_ids=[200002, 200012])


@pytest.fixture(scope="session")
def harmony_encoding():
    """gpt-oss's tokenizer (tiktoken), special tokens included."""
    tiktoken = pytest.importorskip("tiktoken")
    from tiktoken.load import load_tiktoken_bpe

    ranks = load_tiktoken_bpe(str(shared_file("o200k_base.tiktoken")))
    return tiktoken.Encoding("o200k_harmony", pat_str=O200K_SPLIT, mergeable_ranks=ranks, special_tokens=HARMONY_SPECIALS)


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray for the whole test session (starting one costs seconds), started the way
    `xg2 serve` starts its own (serve.local_ray.LocalRay: on the loopback, only the components needed,
    nothing in its start that a busy machine makes fail), and stopped at the end with every
    process it started."""
    os.environ.setdefault("RAY_SERVE_PROXY_HEALTH_CHECK_PERIOD_S", "2")     # as serve.cli.Server sets them
    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
    import ray

    from serve.local_ray import LocalRay

    local = None
    if not ray.is_initialized():
        local = LocalRay(num_cpus=2, namespace="xg2-tests", log_to_driver=False).start()
    yield ray
    if local is not None:
        local.stop()
    else:
        ray.shutdown()


@pytest.fixture(scope="session")
def serve_local(ray_local):
    """Serve started once on the session's Ray (its controller and HTTP proxy cost some 6 s to
    start), on the loopback; yields its HTTP port. A Server started in a test finds it, serves
    behind its proxy and leaves it running when it stops (serve.cli.Server)."""
    import socket

    from ray import serve

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config={"log_level": "WARNING"})
    yield port
    serve.shutdown()


#: Small sample grammars the runtime and transport tests share.
SAMPLE_EBNF = 'root ::= "(" expr ")"\nexpr ::= [0-9]+ | expr "+" expr | "(" expr ")"'
SAMPLE_REGEX = r"[a-z]{1,8}@[a-z]+\.(com|org)"
SAMPLE_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"]}}},
]


@pytest.fixture(scope="module")
def loaded():
    """The tiny random model (serve/model.py), for the engine and request tests."""
    from serve.model import load_model

    return load_model("tiny", progress=False)


@pytest.fixture(scope="module")
def runtime(loaded):
    """A grammar runtime on the tiny model's vocabulary, one per test module."""
    from serve.model import tokenizer_info
    from xg2.actors import GrammarRuntime

    rt = GrammarRuntime(tokenizer_info(loaded))
    yield rt
    rt.shutdown()
