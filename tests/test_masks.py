"""The cached mask must equal the reference mask exactly: every token checked by running the parser
over its bytes from the current state (accept, then roll back)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import longest_match

import xg2

GRAMMARS = {
    "left_recursive": r'''
root ::= expr
expr ::= expr "+" term | expr "-" term | term
term ::= term "*" factor | factor
factor ::= [0-9]+ | "(" expr ")"
''',
    "ambiguous": r'''
root ::= s
s ::= s s | "a" | "ab" | "b" | "aa"
''',
    "nullable": r'''
root ::= a b c "!"
a ::= "x"?
b ::= c c
c ::= ("y" | "")*
''',
    "unicode": r'''
root ::= item+
item ::= [一-龥]+ | [à-ÿ] | "😀" | [\u0041-\u005A]{2} | [^\x00-\x7f一-龥]
''',
    "repetition": r'''
root ::= "a"{3} "b"{2,} c{1,4} d{0,2}
c ::= "c" | "cc"
d ::= [xy]
''',
    "compressed": r'''
root ::= "<" [a-c]{2,40} ">" ("xy" | "y"){20,}
''',
    "bounded_text": r'''
root ::= "\"" ([^"\\\x00-\x1f] | "\\" ["\\/bfnrt]){3,40} "\"" ("," [^"\\\x00-\x1f]{0,12} ".")?
''',
    "bounded_open": r'''
root ::= "<" [^<>\x00-\x1f]{12} (more | [^<>\x00-\x1f]{0,18}) ">" text ">"
more ::= [^>\x00-\x1f]* "."
text ::= [^<>\x00-\x1f]{12,30}
''',
    "chain_rule": r'''
root ::= "<" w tail ">" v ">"
w ::= [^<>\x00-\x1f]{30}
v ::= [^<>\x00-\x1f]{30}
tail ::= [^<>\x00-\x1f]*
''',
    "tag_dispatch": r'''
root ::= TagDispatch(("<f=", call), ("<think>", think), stop_str=("<|end|>"), excludes=("<bad>"))
call ::= [a-z]+ ">" [0-9]+ "</f>"
think ::= [^<]* "</think>"
''',
    "lookahead": r'''
root ::= (word " ")* word "."
word ::= [a-z]+ (= [ .])
''',
    "right_recursive": r'''
root ::= list
list ::= "(" items ")"
items ::= "" | item items
item ::= [a-z] | list | " "
''',
    "json": None,
}

SAMPLES = {
    "left_recursive": "12+(3*4)-5*(6+7)",
    "ambiguous": "aabab",
    "nullable": "xyyy!",
    "unicode": "中文àAB😀ä",
    "repetition": "aaabbbccccy",
    "compressed": "<" + "abc" * 13 + "a>" + "xyy" * 11,
    "bounded_text": '"Hello, wörld \\"quoted\\" text that is long"' + ",short é.",
    "bounded_open": "<" + "the quick brown fox, 中文 ü" * 2 + ".>" + "a b c d e f g h" + ">",
    "chain_rule": "<" + "abc" * 11 + " xy>" + "ab" * 15 + ">",
    "tag_dispatch": "Hi <f=add>12</f> and <think>hmm</think> done <f=x>3</f>!<|end|>",
    "lookahead": "ab cd ef.",
    "right_recursive": "(a (b c) (d (e)))",
    "json": '{"a": [1, -2.5e3, true], "b\\"": {"c": null}, "d": "ü"}',
}


def compile_(info, name):
    compiler = xg2.GrammarCompiler(info)
    if GRAMMARS[name] is None:
        return compiler.compile_builtin_json_grammar()
    return compiler.compile_grammar(GRAMMARS[name])


def unpack(bitmask, n):
    arr = bitmask.numpy() if hasattr(bitmask, "numpy") else bitmask
    bits = np.unpackbits(arr[0].astype("<i4").view(np.uint8), bitorder="little")
    return bits[:n].astype(bool)


def reference_mask(matcher: xg2.GrammarMatcher, info: xg2.TokenizerInfo, candidates) -> np.ndarray:
    ref = np.zeros(info.vocab_size, dtype=bool)
    for t in candidates:
        if matcher.accept_token(int(t)):
            ref[t] = True
            matcher.rollback(1)
    return ref


def check_walk(info, name, token_ids, candidates, max_steps=None):
    compiled = compile_(info, name)
    matcher = xg2.GrammarMatcher(compiled)
    bitmask = xg2.allocate_token_bitmask(1, info.vocab_size)
    steps = token_ids if max_steps is None else token_ids[:max_steps]
    for step, t in enumerate(list(steps) + [None]):
        matcher.fill_next_token_bitmask(bitmask)
        got = unpack(bitmask, info.vocab_size)
        ref = reference_mask(matcher, info, candidates)
        diff = np.nonzero(got != ref)[0]
        assert diff.size == 0, (name, step, [(int(i), info.decoded_vocab[i], bool(got[i])) for i in diff[:10]])
        if t is None:
            break
        assert matcher.accept_token(t), (name, step, t)


def greedy_tokenize(info, text: str) -> list[int]:
    """Longest-match tokenization over the decoded vocabulary (ordinary tokens only)."""
    special = set(info.special_token_ids) | set(info.stop_token_ids)
    table: dict[bytes, int] = {}
    for i, b in enumerate(info.decoded_vocab):
        if b and i not in special:
            table.setdefault(b, i)
    return longest_match(table, text.encode())


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_small_vocab_matches_reference(small_info, name):
    ids = greedy_tokenize(small_info, SAMPLES[name])
    check_walk(small_info, name, ids, range(small_info.vocab_size))


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_deepseek_matches_reference(deepseek_info, deepseek_tokenizer, name):
    ids = deepseek_tokenizer.encode(SAMPLES[name], add_special_tokens=False).ids
    special = set(deepseek_info.special_token_ids)
    candidates = [i for i in range(deepseek_info.vocab_size) if i not in special]
    check_walk(deepseek_info, name, ids, candidates, max_steps=4)


def test_stop_token_only_when_complete(small_info):
    compiled = xg2.GrammarCompiler(small_info).compile_grammar('root ::= "ab" "c"?')
    m = xg2.GrammarMatcher(compiled)
    stop = small_info.stop_token_ids[0]
    bm = xg2.allocate_token_bitmask(1, small_info.vocab_size)
    m.fill_next_token_bitmask(bm)
    assert not unpack(bm, small_info.vocab_size)[stop]
    assert not m.accept_token(stop)
    assert m.accept_string("ab")
    m.fill_next_token_bitmask(bm)
    assert unpack(bm, small_info.vocab_size)[stop]
    assert m.accept_token(stop) and m.is_terminated()
    assert not m.accept_token(ord("c"))


def test_padding_and_special_never_allowed():
    info = xg2.TokenizerInfo(["a", "b", "", "</s>"], xg2.VocabType.RAW, vocab_size=70, stop_token_ids=[3])
    compiled = xg2.GrammarCompiler(info).compile_grammar('root ::= [a-z]*')
    m = xg2.GrammarMatcher(compiled)
    bm = xg2.allocate_token_bitmask(1, 70)
    m.fill_next_token_bitmask(bm)
    allowed = unpack(bm, 70)
    assert list(np.nonzero(allowed)[0]) == [0, 1, 3]


CORPUS = Path(__file__).resolve().parents[1] / "benchmarks" / "grammars"


@pytest.mark.parametrize("name", sorted(GRAMMARS) + sorted(p.stem for p in CORPUS.glob("*.ebnf")))
def test_entries_do_not_depend_on_memo_history(deepseek_info, name):
    """Mask entries built after many others (shared transition memo) equal entries built fresh."""
    from xg2._ext.core import CompiledCore

    # The class trie on the compile path, so that every entry of both cores walks the same trie
    # (the byte trie and a class trie may split a node's tokens between accepted and uncertain
    # differently; the masks are the same, see test_entry_pool).
    compiler = xg2.GrammarCompiler(deepseek_info, precompute_budget_ms=0, background_precompute=False)
    if name in GRAMMARS:
        compiled = (compiler.compile_builtin_json_grammar() if GRAMMARS[name] is None
                    else compiler.compile_grammar(GRAMMARS[name]))
    else:
        compiled = compiler.compile_grammar((CORPUS / f"{name}.ebnf").read_text(encoding="utf-8"))
    shared = compiled._core
    nodes = [n for n, _w in shared.scannable_nodes()][:60]
    built = {n: shared.entry_tokens(n) for n in nodes}
    lowered = compiled._lowered
    for n in reversed(nodes):
        fresh = CompiledCore(shared.vocab, lowered.arrays, lowered.root, shared.class_trie)
        acc, unc = fresh.entry_tokens(n)
        np.testing.assert_array_equal(acc, built[n][0])
        np.testing.assert_array_equal(unc, built[n][1])
