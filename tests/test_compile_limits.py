"""Compile time on ordinary large inputs and the compile deadline (issue 15 §7).

The inputs here are the §7 ones at sizes that keep the tests fast on a small vocabulary; the
full-size comparison with xgrammar is benchmarks/bench_compile.py. Each one either compiles with
the right language or raises a typed error, and the structures that used to grow faster than the
input (object tails, TagDispatch's free text) are checked to grow linearly.
"""

from __future__ import annotations

import json
import threading

import pytest

import xg2
from xg2.grammar import budget
from xg2.grammar.ebnf import parse_ebnf, print_ebnf
from xg2.grammar.fsm import _body_key, build_nfa, rule_automaton
from xg2.grammar.grammar import Grammar
from xg2.grammar.ir import FreeText, GrammarIR, Literal, Repeat, Rule, RuleRef, Seq, text_bytes
from xg2.grammar.optimize import expr_size, inline_small_rules
from xg2.grammar.repetition import compress_repetitions, nullable_rule_names
from xg2.grammar.text import dispatching, text_until


@pytest.fixture(scope="module")
def compiler(json_info):
    # No deadline for the language tests: a loaded test machine must not turn them into limit errors.
    return xg2.GrammarCompiler(json_info, compile_timeout_ms=None)


def accepts(compiled, text: str) -> bool:
    m = xg2.GrammarMatcher(compiled)
    return m.accept_string(text) and m.is_completed()


def optional_object(n: int) -> dict:
    kinds = ({"type": "string"}, {"type": "integer"}, {"type": "boolean"})
    return {"type": "object", "properties": {f"p{i}": kinds[i % 3] for i in range(n)}}


def chain(n: int) -> str:
    return "root ::= r0\n" + "".join(f'r{i} ::= "a" r{i + 1} | "b"\n' for i in range(n)) + f'r{n} ::= "end"\n'


def grammar_size(ir) -> int:
    return sum(expr_size(r.body) for r in ir.rules)


# --- the deadline -----------------------------------------------------------------------------

def test_default_deadline_is_a_few_seconds(json_info):
    c = xg2.GrammarCompiler(json_info)
    assert 1000 <= c.compile_timeout_ms <= 10_000
    assert xg2.GrammarCompiler(json_info, compile_timeout_ms=None).compile_timeout_ms is None
    for bad in (0, -5):
        with pytest.raises(ValueError):
            xg2.GrammarCompiler(json_info, compile_timeout_ms=bad)


@pytest.mark.parametrize("kind", ["json", "ebnf", "regex", "tag"])
def test_tiny_budget_raises_and_the_compiler_stays_usable(json_info, kind):
    c = xg2.GrammarCompiler(json_info, compile_timeout_ms=1)
    huge = {
        "json": (c.compile_json_schema, optional_object(400), "a JSON Schema"),
        "ebnf": (c.compile_grammar, chain(3000), "an EBNF grammar"),
        "regex": (c.compile_regex, "|".join(f"word{i}x{i * 7 % 13}" for i in range(6000)), "a regex"),
        "tag": (c.compile_structural_tag, {"type": "structural_tag", "format": {
            "type": "triggered_tags", "triggers": ["<f>"], "excludes": [f"stop{i}" for i in range(40)],
            "tags": [{"begin": "<f>", "content": {"type": "json_schema", "json_schema": optional_object(300)},
                      "end": "</f>"}]}}, "a structural tag"),
    }
    call, data, what = huge[kind]
    with pytest.raises(xg2.GrammarLimitError) as info:
        call(data)
    assert "1 ms" in str(info.value) and what in str(info.value)
    assert c.cache_stats()["grammars"] == 0           # nothing half-built was kept
    assert not budget.expired()                        # the deadline ended with the compile
    # Usable afterwards, from this thread and another (no lock left held), with a budget it fits in.
    c.compile_timeout_ms = 60_000
    done = []
    worker = threading.Thread(target=lambda: done.append(c.compile_grammar('root ::= "x" [0-9]+')))
    worker.start()
    worker.join(30)
    assert done and accepts(done[0], "x12") and not accepts(done[0], "x")
    compiled = call(data)
    assert c.cache_stats()["grammars"] >= 1
    if kind == "json":
        assert accepts(compiled, '{"p0": "a", "p399": "b"}') and not accepts(compiled, '{"p399": "b", "p0": "a"}')


def test_deadline_applies_to_jit_false_precompute(json_info):
    """With jit=False every entry is built at compile time: that is compile work, under the deadline."""
    c = xg2.GrammarCompiler(json_info, jit=False, compile_timeout_ms=1)
    with pytest.raises(xg2.GrammarLimitError, match="compile budget"):
        c.compile_json_schema(optional_object(200))


def test_checks_are_free_outside_a_compile():
    """A grammar built directly (no compiler) has no deadline: nothing to check against."""
    budget.check("anything")
    assert not budget.expired()
    assert Grammar.from_ebnf(chain(50)).ir.root == "root"


def test_nested_deadlines_keep_the_outer_one():
    with budget.deadline(60_000, "outer"), budget.deadline(0.001, "inner"):
        budget.check("nested")          # the inner, tighter one is ignored: one compile, one budget


# --- the §7 inputs ---------------------------------------------------------------------------

def test_object_members_are_linear():
    """Object tails used to list every later member in each state: quadratic rules, cubic time."""
    small = grammar_size(Grammar.from_json_schema(optional_object(150)).ir)
    large = grammar_size(Grammar.from_json_schema(optional_object(600)).ir)
    assert large < 4.6 * small


def test_object_with_300_optional_properties(compiler):
    compiled = compiler.compile_json_schema(optional_object(300))
    doc = {f"p{i}": ["s", 1, True][i % 3] for i in range(0, 300, 7)}
    assert accepts(compiled, json.dumps(doc))
    assert accepts(compiled, "{}")
    assert accepts(compiled, '{"p299": true}')
    assert not accepts(compiled, '{"p7": 1, "p0": "s"}')        # schema order
    assert not accepts(compiled, '{"p0": "s", "p0": "t"}')      # no member twice
    assert not accepts(compiled, '{"p1": "s"}')                 # p1 is an integer


def test_object_members_with_required_and_bounds(compiler):
    schema = {"type": "object", "properties": {k: {"type": "integer"} for k in "abcde"},
              "required": ["b", "d"], "maxProperties": 3}
    compiled = compiler.compile_json_schema(schema)
    for doc, ok in [({"b": 1, "d": 2}, True), ({"a": 1, "b": 1, "d": 2}, True), ({"b": 1, "c": 1, "d": 2}, True),
                    ({"a": 1, "b": 1, "c": 1, "d": 2}, False), ({"b": 1}, False), ({"d": 1}, False),
                    ({"b": 1, "d": 2, "e": 3}, True), ({"a": 1, "d": 2}, False)]:
        assert accepts(compiled, json.dumps(doc)) == ok, doc


def test_chain_of_3000_tail_calling_rules(compiler):
    compiled = compiler.compile_grammar(chain(3000))
    assert accepts(compiled, "a" * 2999 + "b")
    assert accepts(compiled, "a" * 3000 + "end")
    assert not accepts(compiled, "a" * 3001 + "b")


def test_enum_of_many_strings(compiler):
    values = [f"value-{i:05d}-{i * 2654435761 % 100000:05d}" for i in range(8000)]
    compiled = compiler.compile_json_schema({"enum": values})
    for v in values[::997]:
        assert accepts(compiled, json.dumps(v))
    assert not accepts(compiled, json.dumps("value-00001-00000"))
    assert not accepts(compiled, json.dumps(values[5][:-1]))


def test_long_alternation_of_literals(compiler):
    words = [f"keyword_{i}_{i * 7919 % 1000}" for i in range(3000)]
    compiled = compiler.compile_grammar("root ::= " + " | ".join(json.dumps(w) for w in words) + "\n")
    assert all(accepts(compiled, w) for w in words[::211])
    assert not accepts(compiled, "keyword_1_")


WORDS = ("apple", "banana", "cherry", "delta", "echo", "foxtrot", "golf", "hotel")


@pytest.mark.parametrize("excludes", [WORDS, ("<|im_start|>", "<|im_end|>", "</think>", "<tool_response>",
                                               "</tool_response>", "<|endoftext|>", "[TOOL_CALLS]", "```")])
def test_tag_dispatch_with_8_excluded_strings(compiler, excludes):
    """Free text excluding words with distinct first letters was an exponential expression (over
    10^8 nodes written out for these eight words, 480,000 with shared first characters); as a
    FreeText leaf its automaton is built from the text automaton's states, linear in the strings."""
    nfa, _start, _end = build_nfa(dispatching({"<t>": None}, excludes), {})
    assert nfa.n_nodes < 40 * (sum(map(len, excludes)) + 10)
    grammar = ('root ::= TagDispatch(("<t>", call), stop_eos=true, excludes=('
               + ", ".join(json.dumps(w) for w in excludes) + '))\ncall ::= "x</t>"\n')
    compiled = compiler.compile_grammar(grammar)
    assert accepts(compiled, "some text <t>x</t> more")
    for w in excludes:
        assert not accepts(compiled, f"a {w} b")
        assert accepts(compiled, f"a {w[:-1]} b")


def test_text_until_with_excluded_words_matches_a_direct_check():
    """The hubs that keep the expression small must not change the language: brute force over
    short strings of the letters involved."""
    from itertools import product

    excludes = ("ab", "ba", "abc", "ca")
    expr = text_until(("cc",), excludes)
    compiled = xg2.GrammarCompiler(xg2.TokenizerInfo([bytes([b]) for b in range(256)] + [b"</s>"],
                                                    xg2.VocabType.RAW, stop_token_ids=[256]))
    g = compiled.compile_grammar(xg2.Grammar(xg2.grammar.ir.GrammarIR([xg2.grammar.ir.Rule("root", expr)])))
    for n in range(7):
        for letters in product("abcx", repeat=n):
            s = "".join(letters)
            end = s.find("cc")
            want = end >= 0 and end + 2 == len(s) and not any(w in s[:end + 2] for w in excludes if w != "cc")
            assert accepts(g, s) == want, s


def _first_end(text: str, ends: tuple[str, ...], excludes: tuple[str, ...]) -> bool:
    """Direct check: `text` holds no excluded string and ends at its first end string (or, with no
    end strings, is any such text)."""
    for i in range(1, len(text) + 1):
        if any(text[:i].endswith(x) for x in excludes):
            return False
        if any(text[:i].endswith(e) for e in ends):
            return i == len(text)
    return not ends


@pytest.mark.parametrize(("ends", "excludes", "tokens"), [
    ((), ("ab", "bc", "ca", "cab"), ()),                     # distinct first letters, each inside another
    (("ba",), ("ab", "bc", "ca", "cab"), ()),
    (("cc", "ab"), ("abc", "b"), ()),
    (("a",), ("bab", "cbc", "aa"), ("\ud800",)),             # a special token the text may hold
    ((), ("a\ud800b",), ("\ud800",)),                        # ... or that lies inside an excluded string
    (("abab", "cbc"), ("bb", "cab"), ()),
])
def test_free_text_leaf_matches_a_direct_check(ends, excludes, tokens):
    """The FreeText leaf's automaton (lowered from the text automaton's states, not from a written
    expression) against a direct check over every string of up to 7 characters."""
    from itertools import product

    expr = text_until(ends, excludes, tokens)
    assert isinstance(expr, FreeText)
    fsm = rule_automaton(expr, {})
    assert fsm.deterministic
    letters = sorted({c for w in ends + excludes for c in w} | set(tokens) | {"x"})
    for n in range(8):
        for chars in product(letters, repeat=n):
            s = "".join(chars)
            want = _first_end(s, ends, excludes)
            assert fsm.accepts(text_bytes(s)) == want, (s, want)   # special tokens' characters as automata read them


def test_free_text_leaf_in_rules_with_calls_compiles_the_same_language(compiler):
    """A FreeText inside a body that also calls rules and repeats it past the compression threshold
    (the Python Thompson construction lowers such bodies) and through inlining."""
    text = text_until(("</t>",), ("ab", "ba"))
    ir = GrammarIR([Rule("root", Repeat(Seq((Literal("<t>"), RuleRef("t"), RuleRef("k"))), 0, 300)),
                    Rule("t", text), Rule("k", Literal("!"))])
    ir = compress_repetitions(inline_small_rules(ir))
    g = compiler.compile_grammar(Grammar(ir))
    assert accepts(g, "<t>xyz</t>!<t>a b</t>!")
    assert accepts(g, "")
    assert not accepts(g, "<t>xabz</t>!")
    assert not accepts(g, "<t>x</t>y</t>!")
    assert not accepts(g, "<t>x</t>")
    assert accepts(g, "<t></t>!" * 300) and not accepts(g, "<t></t>!" * 301)


def test_free_text_leaf_is_a_canonical_key_and_prints_back():
    a = text_until(("b", "a"), ("y", "x", "y"))
    assert a == text_until(("a", "b"), ("x", "y")) and a == FreeText(("a", "b"), ("x", "y"))
    assert text_until(("abcabc",), ("bca",)) is None        # every text reaching the end holds "bca"
    assert _body_key(a) == _body_key(text_until(("a", "b"), ("x", "y")))
    assert _body_key(a) != _body_key(text_until(("a", "b"), ("x",)))
    assert _body_key(a) != _body_key(Literal(_body_key(a)[0][0].decode()))
    assert "t" in nullable_rule_names(GrammarIR([Rule("root", RuleRef("t")), Rule("t", text_until((), ("x",)))]))
    assert "t" not in nullable_rule_names(GrammarIR([Rule("root", RuleRef("t")), Rule("t", a)]))
    ir = parse_ebnf('root ::= "<" FreeText(ends=("a\\"", ">"), excludes=("x",)) r\nr ::= "!"\n')
    assert ir.rules[0].body.items[1] == text_until(("a\"", ">"), ("x",))
    assert parse_ebnf(print_ebnf(ir)) == ir
    tagged = parse_ebnf('root ::= TagDispatch(("<a>", a), excludes=("zz", "q"))\na ::= "1"\n')
    assert parse_ebnf(print_ebnf(tagged)) == tagged
    for bad in ('FreeText(ends=(""))', 'FreeText(ends=("a"), ends=("b"))', 'FreeText(stop=("a"))',
                'FreeText(ends=("a" "b"))', 'FreeText(ends=("a")', 'FreeText(ends=(x))',
                'FreeText(ends=("ab"), excludes=("b"))'):
        with pytest.raises(xg2.GrammarError):
            parse_ebnf(f"root ::= {bad}\n")
