"""Property tests: random walks through allowed tokens never dead-end, and rollback restores masks."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_masks import GRAMMARS, compile_, unpack

import xg2

WALK_SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))


def allowed_ids(matcher, info, bitmask):
    matcher.fill_next_token_bitmask(bitmask)
    return np.nonzero(unpack(bitmask, info.vocab_size))[0]


@WALK_SETTINGS
@given(name=st.sampled_from(sorted(GRAMMARS)), data=st.data())
def test_random_walk_never_dead_ends(small_info, name, data):
    compiled = compile_(small_info, name)
    matcher = xg2.GrammarMatcher(compiled)
    bitmask = xg2.allocate_token_bitmask(1, small_info.vocab_size)
    stop = small_info.stop_token_ids[0]
    for _ in range(30):
        allowed = allowed_ids(matcher, small_info, bitmask)
        assert allowed.size > 0, "dead end: nothing allowed and not terminated"
        t = int(data.draw(st.sampled_from(list(allowed))))
        assert matcher.accept_token(t)
        if t == stop:
            assert matcher.is_terminated()
            break


@WALK_SETTINGS
@given(name=st.sampled_from(sorted(GRAMMARS)), data=st.data())
def test_rollback_restores_exact_mask(small_info, name, data):
    compiled = compile_(small_info, name)
    matcher = xg2.GrammarMatcher(compiled)
    bitmask = xg2.allocate_token_bitmask(1, small_info.vocab_size)
    stop = small_info.stop_token_ids[0]
    history = [allowed_ids(matcher, small_info, bitmask)]
    for _ in range(12):
        choices = [t for t in history[-1] if t != stop]
        if not choices:
            break
        assert matcher.accept_token(int(data.draw(st.sampled_from(choices))))
        history.append(allowed_ids(matcher, small_info, bitmask))
    k = data.draw(st.integers(0, len(history) - 1))
    matcher.rollback(k)
    np.testing.assert_array_equal(allowed_ids(matcher, small_info, bitmask), history[len(history) - 1 - k])


def test_rejected_token_leaves_state_unchanged(small_info):
    compiled = compile_(small_info, "json")
    matcher = xg2.GrammarMatcher(compiled)
    bitmask = xg2.allocate_token_bitmask(1, small_info.vocab_size)
    assert matcher.accept_string('{"a": ')
    before = allowed_ids(matcher, small_info, bitmask)
    assert not matcher.accept_token(small_info.decoded_vocab.index(b"}"))
    np.testing.assert_array_equal(allowed_ids(matcher, small_info, bitmask), before)


def test_reset_and_jump_forward(small_info):
    compiled = xg2.GrammarCompiler(small_info).compile_grammar('root ::= "<think>" [a-z]* "</think>" | "xyz"')
    matcher = xg2.GrammarMatcher(compiled)
    assert matcher.find_jump_forward_string() == ""
    assert matcher.accept_string("<th")
    assert matcher.find_jump_forward_string() == "ink>"
    assert matcher.accept_string("ink>ab</")
    assert matcher.find_jump_forward_string() == "think>"
    matcher.reset()
    assert matcher.accept_string("xyz") and matcher.is_completed()


def test_max_rollback_tokens_bounds_history(small_info):
    compiled = compile_(small_info, "json")
    matcher = xg2.GrammarMatcher(compiled, max_rollback_tokens=2)
    for ch in '[1, 2':
        assert matcher.accept_token(small_info.decoded_vocab.index(ch.encode()))
    matcher.rollback(2)
    try:
        matcher.rollback(1)
    except ValueError as e:
        assert "roll back" in str(e)
    else:
        raise AssertionError("rollback beyond max_rollback_tokens must raise")
