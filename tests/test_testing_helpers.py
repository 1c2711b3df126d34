"""xg2.testing against xgrammar.testing: the same answers for the same inputs."""

from __future__ import annotations

import itertools

import torch
import xgrammar as xgr
import xgrammar.testing as xgt

import xg2
import xg2.testing as ours


def test_bool_masks_and_bitmasks_agree() -> None:
    gen = torch.Generator().manual_seed(0)
    for rows, vocab in [(1, 1), (2, 31), (3, 32), (2, 33), (4, 100), (1, 129)]:
        mask = torch.rand(rows, vocab, generator=gen) < 0.5
        packed = ours.bool_mask_to_bitmask(mask)
        assert torch.equal(packed, xgt.bool_mask_to_bitmask(mask))
        for size in (None, vocab):
            assert torch.equal(ours.bitmask_to_bool_mask(packed, size), xgt.bitmask_to_bool_mask(packed, size))


def test_string_judgements_agree() -> None:
    grammars = ['root ::= "a" [0-9]* ("." [0-9]+)?', 'root ::= ("ab" | "c")+', 'root ::= [a-c]{2,3}']
    for g in grammars:
        for n in range(5):
            for text in map("".join, itertools.product("abc.0", repeat=n)):
                for term in (True, False):
                    assert ours._is_grammar_accept_string(g, text, require_termination=term) == \
                        xgt._is_grammar_accept_string(g, text, require_termination=term), (g, text, term)


def test_bitmask_readers_agree() -> None:
    vocab = [b"a", b"b", b"ab", b"c", b"</s>"]
    for module, helpers in ((xgr, xgt), (xg2, ours)):
        info = module.TokenizerInfo(vocab, stop_token_ids=[4])
        matcher = module.GrammarMatcher(module.GrammarCompiler(info).compile_grammar('root ::= "a" "b"'))
        bm = module.allocate_token_bitmask(2, info.vocab_size)
        matcher.fill_next_token_bitmask(bm, 1)
        first = helpers._get_masked_tokens_from_bitmask(bm, info.vocab_size, 1), \
            helpers._is_single_token_bitmask(bm, info.vocab_size, 1)
        matcher.accept_token(0)
        matcher.fill_next_token_bitmask(bm, 0)
        second = helpers._get_masked_tokens_from_bitmask(bm, info.vocab_size, 0), \
            helpers._is_single_token_bitmask(bm, info.vocab_size, 0)
        if module is xgr:
            ref = (first, second)
    assert (first, second) == ref
    assert second[1] == (True, 1)       # after "a", only "b"


def test_allow_empty_rule_ids_agree() -> None:
    """`_get_allow_empty_rule_ids`: the rules that accept the empty string, numbered as written
    (where xgrammar's normalisation adds rules of its own, for a repeated group, its numbers go
    on past the written ones; these grammars add none)."""
    for src in ['root ::= rule1 rule2 | "abc"\nrule1 ::= "abc" | ""\nrule2 ::= "def" rule3 | ""\nrule3 ::= "ghi"',
                'root ::= rule1 rule3\nrule1 ::= "abc" | ""\nrule2 ::= "def" | ""\nrule3 ::= rule1 rule2',
                'root ::= [a]* [b]* rule1\nrule1 ::= [abc]* [def]*']:
        ref = xgt._get_allow_empty_rule_ids(xgr.GrammarCompiler(xgr.TokenizerInfo([])).compile_grammar(src))
        assert ours._get_allow_empty_rule_ids(xg2.GrammarCompiler(xg2.TokenizerInfo([])).compile_grammar(src)) == ref
