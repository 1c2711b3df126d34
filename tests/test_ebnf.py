"""Tests for the EBNF front-end (xg2.grammar.ebnf) and the built-in JSON grammar."""

from __future__ import annotations

import random

import pytest

from xg2.errors import GrammarError, GrammarLimitError
from xg2.grammar.builtin import JSON_EBNF
from xg2.grammar.ebnf import (
    MAX_GRAMMAR_BYTES,
    MAX_NESTING_DEPTH,
    MAX_REPEAT,
    parse_ebnf,
    print_ebnf,
)
from xg2.grammar.ir import (
    EPSILON,
    CharClass,
    Choice,
    FreeText,
    GrammarIR,
    Literal,
    Repeat,
    Rule,
    RuleRef,
    Seq,
)

# ----------------------------------------------------------------------------------------------
# helpers


def body(text: str, rule: str = "root"):
    """The body of `rule` in the grammar `text`."""
    return parse_ebnf(text).rule_map()[rule].body


def root_body(expr_text: str):
    return body(f"root ::= {expr_text}")


def L(s: str) -> Literal:
    return Literal(s)


def CC(*ranges, negated: bool = False) -> CharClass:
    return CharClass(tuple(ranges), negated)


def c(ch: str) -> tuple[int, int]:
    return (ord(ch), ord(ch))


def r(lo: str, hi: str) -> tuple[int, int]:
    return (ord(lo), ord(hi))


def assert_error(text: str, line: int, column: int, match: str = "", *, cls=GrammarError, **kw):
    with pytest.raises(cls, match=match) as info:
        parse_ebnf(text, **kw)
    err = info.value
    assert (err.line, err.column) == (line, column), f"{err} (expected {line}:{column})"
    return err


def matches(ir: GrammarIR, s: str) -> bool:
    """Tiny backtracking recogniser over the IR, for checking grammars in tests (no lookahead)."""
    rules = ir.rule_map()

    def ends(e, i):
        if isinstance(e, Literal):
            if s.startswith(e.text, i):
                yield i + len(e.text)
        elif isinstance(e, CharClass):
            if i < len(s) and any(lo <= ord(s[i]) <= hi for lo, hi in e.codepoint_ranges()):
                yield i + 1
        elif isinstance(e, RuleRef):
            yield from ends(rules[e.name].body, i)
        elif isinstance(e, Seq):
            yield from seq(e.items, 0, i)
        elif isinstance(e, Choice):
            for alt in e.alts:
                yield from ends(alt, i)
        elif isinstance(e, Repeat):
            yield from rep(e, 0, i)
        elif isinstance(e, FreeText):
            for j in range(i, len(s) + 1):
                if free_text(s[i:j], e):
                    yield j
        else:  # pragma: no cover
            raise TypeError(e)

    def free_text(t, e):
        """Whether `t` is text up to the first end string holding no excluded one (a direct check)."""
        for k in range(1, len(t) + 1):
            if any(t[:k].endswith(x) for x in e.excludes):
                return False
            if any(t[:k].endswith(x) for x in e.ends):
                return k == len(t)
        return not e.ends

    def seq(items, k, i):
        if k == len(items):
            yield i
            return
        for j in ends(items[k], i):
            yield from seq(items, k + 1, j)

    def rep(e, count, i):
        if count >= e.min:
            yield i
        if e.max is None or count < e.max:
            for j in ends(e.expr, i):
                if j == i and count >= e.min:
                    continue  # an empty iteration cannot lead anywhere new
                yield from rep(e, count + 1, j)

    return any(end == len(s) for end in ends(rules[ir.root].body, 0))


# ----------------------------------------------------------------------------------------------
# rules, names, comments, layout


def test_simple_rule():
    ir = parse_ebnf('root ::= "hello"')
    assert ir == GrammarIR(rules=[Rule("root", L("hello"))], root="root")


def test_multiline_rules_comments_and_forward_references():
    text = """
    # leading comment
    root ::= greeting   # trailing comment
             " " name   # the body continues on this line
           | "bye"
    greeting ::= "hi" | "hello" # "not a string"
    name ::= [a-z]+
    # comment at end of file without newline"""
    ir = parse_ebnf(text)
    assert [rule.name for rule in ir.rules] == ["root", "greeting", "name"]
    assert ir.rule_map()["root"].body == Choice(
        (Seq((RuleRef("greeting"), L(" "), RuleRef("name"))), L("bye"))
    )
    assert ir.rule_map()["greeting"].body == Choice((L("hi"), L("hello")))
    assert ir.rule_map()["name"].body == Repeat(CC(r("a", "z")), 1, None)


def test_hash_inside_string_is_not_a_comment():
    assert root_body('"a#b" # real comment') == L("a#b")


def test_rule_names_allow_letters_digits_underscore_dash_dot():
    ir = parse_ebnf('root ::= a-b.c_9 _x .y\na-b.c_9 ::= "1"\n_x ::= "2"\n.y ::= "3"')
    assert ir.rule_map()["root"].body == Seq((RuleRef("a-b.c_9"), RuleRef("_x"), RuleRef(".y")))


def test_root_first_and_custom_root_name():
    ir = parse_ebnf('a ::= "x"\nstart ::= a b\nb ::= "y"', root_rule_name="start")
    assert ir.root == "start"
    assert [rule.name for rule in ir.rules] == ["start", "a", "b"]


def test_recursion_is_allowed():
    ir = parse_ebnf('root ::= root "a" | "a"')
    assert ir.rules[0].body == Choice((Seq((RuleRef("root"), L("a"))), L("a")))


def test_crlf_and_cr_line_endings():
    ir = parse_ebnf('root ::= a\r\na ::= "x"\rb ::= "y"')
    assert [rule.name for rule in ir.rules] == ["root", "a", "b"]


# ----------------------------------------------------------------------------------------------
# string literals


@pytest.mark.parametrize(
    "escaped, expected",
    [
        (r"\n", "\n"),
        (r"\t", "\t"),
        (r"\r", "\r"),
        (r"\"", '"'),
        (r"\\", "\\"),
        (r"\'", "'"),
        (r"\[", "["),
        (r"\]", "]"),
        (r"\-", "-"),
        (r"\/", "/"),
        (r"\?", "?"),
        (r"\b\f\v\a\0\e", "\b\f\v\a\0\x1b"),
        (r"\x41", "A"),
        (r"\x7f", "\x7f"),
        (r"\x41B", "\u041b"),  # xgrammar reads \x greedily
        (r"\x1F600", "\U0001f600"),
        (r"\u00e9", "é"),
        (r"\u4E00", "一"),
        (r"\U0001F600", "\U0001f600"),
        (r"\U0010FFFF", "\U0010ffff"),
        ("中文😀", "中文😀"),
        ("a\tb", "a\tb"),  # a raw tab is allowed
    ],
)
def test_string_escapes(escaped, expected):
    assert root_body(f'"{escaped}"') == L(expected)


def test_empty_string_is_epsilon():
    assert root_body('""') == EPSILON
    assert root_body('"a" "" "b"') == Seq((L("a"), L("b")))
    assert root_body('"a" ""') == L("a")
    assert root_body('"" ""') == EPSILON


def test_adjacent_literals_are_kept_as_sequence():
    assert root_body('"a" "b"') == Seq((L("a"), L("b")))


# ----------------------------------------------------------------------------------------------
# character classes


@pytest.mark.parametrize(
    "cls, expected",
    [
        ("[a]", CC(c("a"))),
        ("[abc]", CC(r("a", "c"))),  # adjacent code points are merged
        ("[a-z]", CC(r("a", "z"))),
        ("[a-zA-Z0-9_]", CC(r("0", "9"), r("A", "Z"), c("_"), r("a", "z"))),
        ("[^0-9]", CC(r("0", "9"), negated=True)),
        ("[^]", CC(negated=True)),
        ("[]", CC()),
        ("[-a]", CC(c("-"), c("a"))),
        ("[a-]", CC(c("-"), c("a"))),
        ("[a\\-z]", CC(c("-"), c("a"), c("z"))),
        ("[+--]", CC(r("+", "-"))),
        ("[a^]", CC(c("^"), c("a"))),
        ("[\\^a]", CC(c("^"), c("a"))),
        ("[\\]\\\\]", CC(r("\\", "]"))),
        ("[[]", CC(c("["))),
        ("[\\[\\]]", CC(c("["), c("]"))),
        ('["]', CC(c('"'))),
        ("[\\n\\t\\r ]", CC(r("\t", "\n"), c("\r"), c(" "))),
        ("[\\x00-\\x1f]", CC((0, 0x1F))),
        ("[\\u4e00-\\u9fa5]", CC((0x4E00, 0x9FA5))),
        ("[一-龥]", CC((0x4E00, 0x9FA5))),
        ("[😀-😂]", CC((0x1F600, 0x1F602))),
        ("[a-cb-d]", CC(r("a", "d"))),
        ("[z-za-a]", CC(c("a"), c("z"))),
        ("[a-b-c]", CC(c("-"), r("a", "c"))),  # a-b, then '-' and 'c' singly
        ("[.*+?(){}|$/]", CC(c("$"), r("(", "+"), r(".", "/"), c("?"), r("{", "}"))),
    ],
)
def test_character_classes(cls, expected):
    assert root_body(cls) == expected


def test_repeated_and_similar_classes_are_lexed_independently():
    assert root_body("[a\\]] [a\\]] [a] [^a] [a\\]]") == Seq(
        (CC(c("]"), c("a")), CC(c("]"), c("a")), CC(c("a")), CC(c("a"), negated=True), CC(c("]"), c("a")))
    )
    # A bad class is reported even after an identical-looking good prefix was seen.
    assert_error("root ::= [a] [a] [z-a]", 1, 19, "greater than")


# ----------------------------------------------------------------------------------------------
# grouping, alternation, quantifiers, flattening


@pytest.mark.parametrize(
    "text, expected",
    [
        ('"a"*', Repeat(L("a"), 0, None)),
        ('"a"+', Repeat(L("a"), 1, None)),
        ('"a"?', Repeat(L("a"), 0, 1)),
        ('"a"{3}', Repeat(L("a"), 3, 3)),
        ('"a"{0}', Repeat(L("a"), 0, 0)),
        ('"a"{2,}', Repeat(L("a"), 2, None)),
        ('"a"{2,5}', Repeat(L("a"), 2, 5)),
        ('"a"{ 2 , 5 }', Repeat(L("a"), 2, 5)),
        ('"a"{2, -1}', Repeat(L("a"), 2, None)),  # the form xgrammar's printer emits
        ('"a"{007}', Repeat(L("a"), 7, 7)),
        (f'"a"{{{MAX_REPEAT}}}', Repeat(L("a"), MAX_REPEAT, MAX_REPEAT)),
        (f'"a"{{0,{MAX_REPEAT}}}', Repeat(L("a"), 0, MAX_REPEAT)),
        ("[a-z]*", Repeat(CC(r("a", "z")), 0, None)),
        ('("a" "b")*', Repeat(Seq((L("a"), L("b"))), 0, None)),
        ('("a" | "b")+', Repeat(Choice((L("a"), L("b"))), 1, None)),
        ('("a"*)+', Repeat(Repeat(L("a"), 0, None), 1, None)),
        ('"a" "b"* "c"', Seq((L("a"), Repeat(L("b"), 0, None), L("c")))),
    ],
)
def test_quantifiers(text, expected):
    assert root_body(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ('("a")', L("a")),
        ('((("a")))', L("a")),
        ('("a" "b") "c"', Seq((L("a"), L("b"), L("c")))),
        ('"a" ("b" ("c" "d"))', Seq((L("a"), L("b"), L("c"), L("d")))),
        ('"a" | ("b" | "c")', Choice((L("a"), L("b"), L("c")))),
        ('("a" | "b") | "c"', Choice((L("a"), L("b"), L("c")))),
        ('("a" | "b") "c"', Seq((Choice((L("a"), L("b"))), L("c")))),
        ("()", EPSILON),
        ("( )", EPSILON),
        ('"a" () "b"', Seq((L("a"), L("b")))),
        ('"a" | ()', Choice((L("a"), EPSILON))),
        ('"a" | ""', Choice((L("a"), EPSILON))),
        ("()*", Repeat(EPSILON, 0, None)),
    ],
)
def test_grouping_and_flattening(text, expected):
    assert root_body(text) == expected


def test_no_single_item_seq_or_choice_anywhere():
    ir = parse_ebnf(JSON_EBNF)

    def walk(e):
        if isinstance(e, Seq):
            assert len(e.items) >= 2
            for item in e.items:
                assert not isinstance(item, Seq)
                walk(item)
        elif isinstance(e, Choice):
            assert len(e.alts) >= 2
            for alt in e.alts:
                assert not isinstance(alt, Choice)
                walk(alt)
        elif isinstance(e, Repeat):
            walk(e.expr)

    for rule in ir.rules:
        walk(rule.body)


# ----------------------------------------------------------------------------------------------
# lookahead assertions


def test_lookahead_goes_into_rule():
    ir = parse_ebnf('root ::= a "x"\na ::= [0-9]+ (= "x")')
    rule = ir.rule_map()["a"]
    assert rule.body == Repeat(CC(r("0", "9")), 1, None)
    assert rule.lookahead == L("x")
    assert ir.rule_map()["root"].lookahead is None


def test_lookahead_with_choice_sequence_and_rule_refs():
    ir = parse_ebnf('root ::= "a" | "b" (= [ \\n]* "," | b)\nb ::= "}"')
    rule = ir.rules[0]
    assert rule.body == Choice((L("a"), L("b")))
    assert rule.lookahead == Choice((Seq((Repeat(CC(c("\n"), c(" ")), 0, None), L(","))), RuleRef("b")))


def test_lookahead_followed_by_another_rule():
    ir = parse_ebnf('root ::= a (= "x")\na ::= "y"')
    assert ir.rules[0].lookahead == L("x")
    assert ir.rules[1] == Rule("a", L("y"))


# ----------------------------------------------------------------------------------------------
# errors: lexical


@pytest.mark.parametrize(
    "text, line, column, match",
    [
        ('root ::= "abc', 1, 10, "unterminated string"),
        ('root ::= "a"\n  | "b\n', 2, 5, "unterminated string"),
        ('root ::= "a\\"', 1, 10, "unterminated string"),
        ("root ::= [a-z", 1, 10, "unterminated character class"),
        ("root ::= [a-z\n]", 1, 10, "unterminated character class"),
        ('root ::= "a\\q"', 1, 12, "invalid escape"),
        ('root ::= "a\\', 1, 10, "unterminated string"),
        ('root ::= "a\\\n"', 1, 10, "unterminated string"),
        ("root ::= [a\\", 1, 10, "unterminated character class"),
        ('root ::= "\\u12"', 1, 11, "exactly 4 hex digits"),
        ('root ::= "\\U0001F60"', 1, 11, "exactly 8 hex digits"),
        ('root ::= "\\xg"', 1, 11, "hex digits"),
        ("root ::= [\\d]", 1, 11, "shorthand class"),
        ('root ::= "\\w"', 1, 11, "shorthand class"),
        ('root ::= "\\U00110000"', 1, 11, "above U\\+10FFFF"),
        ('root ::= "\\x110000"', 1, 11, "above U\\+10FFFF"),
        ('root ::= "\\uD800"', 1, 11, "surrogate"),
        ('root ::= "ab\\udfff"', 1, 13, "surrogate"),
        ("root ::= [\\ud800-\\udbff]", 1, 11, "surrogate"),
        ('root ::= "x" @', 1, 14, "unexpected character '@'"),
        ('root ::= "x" : "y"', 1, 14, "unexpected ':'"),
        ('root = "x"', 1, 6, "unexpected character '='"),
        ('root ::= "x"\n\n   ~', 3, 4, "unexpected character"),
    ],
)
def test_lexical_errors(text, line, column, match):
    assert_error(text, line, column, match)


def test_raw_surrogate_in_string_is_rejected():
    assert_error('root ::= "a\ud800"', 1, 12, "surrogate")


def test_column_counts_code_points():
    assert_error('root ::= "一二三" nope', 1, 16, "'nope' is not defined")


def test_crlf_positions():
    assert_error('root ::= "a"\r\n\r\nb ::= c', 3, 7, "'c' is not defined")
    assert_error('root ::= "a"\rb ::= c', 2, 7, "'c' is not defined")


# ----------------------------------------------------------------------------------------------
# errors: syntax


@pytest.mark.parametrize(
    "text, line, column, match",
    [
        # missing or misplaced '::='
        ('root "a"', 1, 6, "expected '::='"),
        ('"a"\nroot ::= "b"', 1, 1, "expected a rule definition"),
        ('::= "a"', 1, 1, "'::=' must follow a rule name"),
        ('root ::= "a" ::= "b"', 1, 14, "'::=' must follow a rule name"),
        ('root ::= "a" b ::= "c"', 1, 14, "beginning of a line"),
        # parentheses
        ('root ::= "a")', 1, 13, "unbalanced"),
        ('root ::= ("a"', 1, 10, "unclosed '\\('"),
        ('root ::= (("a")\nb ::= "c"', 1, 10, "unclosed '\\('"),
        ('root ::= ("a" ("b")', 1, 10, "unclosed"),
        # dangling / doubled operators
        ('root ::= *"a"', 1, 10, "nothing to repeat"),
        ('root ::= "a" | +', 1, 16, "nothing to repeat"),
        ('root ::= ("a" | ?)', 1, 17, "nothing to repeat"),
        ("root ::= ({2})", 1, 11, "nothing to repeat"),
        ('root ::= "a"+?', 1, 14, "cannot follow another quantifier"),
        ('root ::= "a"**', 1, 14, "cannot follow another quantifier"),
        ('root ::= "a"{2}*', 1, 16, "cannot follow another quantifier"),
        # empty alternatives (xgrammar rejects them; write "" or () instead)
        ('root ::= | "a"', 1, 10, "empty alternative"),
        ('root ::= "a" || "b"', 1, 15, "empty alternative"),
        ('root ::= "a" |', 1, 14, "empty alternative"),
        ('root ::= "a" |\nb ::= "c"', 1, 14, "empty alternative"),
        ('root ::= ("a" | )', 1, 15, "empty alternative"),
        ('root ::= ( | "a")', 1, 12, "empty alternative"),
        ("root ::=", 1, 6, "empty body"),
        ('root ::=\nb ::= "x"', 1, 6, "empty body"),
        ('root ::= # nothing\n\nb ::= "x"', 1, 6, "empty body"),
        # repetition ranges
        ('root ::= "a"{3,2}', 1, 16, "greater than upper bound"),
        ('root ::= "a"{,2}', 1, 14, "lower bound"),
        ('root ::= "a"{}', 1, 14, "expected an integer"),
        ('root ::= "a"{x}', 1, 14, "expected an integer"),
        ('root ::= "a"{1', 1, 15, "expected ',' or '}'"),
        ('root ::= "a"{1,2', 1, 17, "expected '}'"),
        ('root ::= "a"{1;2}', 1, 15, "unexpected character"),
        ('root ::= "a" 5', 1, 14, "unexpected integer 5"),
        ('root ::= "a" }', 1, 14, "unexpected '}'"),
        ('root ::= "a" ,', 1, 14, "unexpected ','"),
        # lookahead placement
        ('root ::= "a" (= "b") "c"', 1, 22, "last element"),
        ('root ::= "a" (= "b") (= "c")', 1, 22, "last element"),
        ('root ::= ("a" (= "b"))', 1, 15, "only allowed at the end"),
        ('root ::= "a" (= "b" (= "c"))', 1, 21, "only allowed at the end"),
        ('root ::= "a" (=)', 1, 14, "empty lookahead"),
        ('root ::= "a" (= "b"', 1, 14, "unclosed '\\(='"),
        ('root ::= "a" ( = "b")', 1, 16, "unexpected character '='"),
        ('root ::= (= "b")', 1, 6, "empty body"),
        ('root ::= "a" (= "b" |)', 1, 21, "empty alternative"),
        # character class ranges
        ("root ::= [z-a]", 1, 11, "greater than"),
        ("root ::= [abz-a]", 1, 13, "greater than"),
        ("root ::= [龥-一]", 1, 11, "greater than"),
        ("root ::= [\\x7f-\\x00]", 1, 11, "greater than"),
    ],
)
def test_syntax_errors(text, line, column, match):
    assert_error(text, line, column, match)


def test_error_message_includes_position():
    with pytest.raises(GrammarError) as info:
        parse_ebnf('root ::= "a" |')
    assert "line 1, column 14" in str(info.value)
    assert isinstance(info.value, ValueError)


# ----------------------------------------------------------------------------------------------
# errors: semantic


def test_undefined_rule_reference():
    assert_error('root ::= "a"\n    "b" missing', 2, 9, "rule 'missing' is not defined")


def test_undefined_rule_in_lookahead():
    assert_error('root ::= "a" (= nope)', 1, 17, "'nope' is not defined")


def test_undefined_rule_hints_missing_assign():
    err = assert_error('root ::= "a"\nb "c"', 2, 1, "'b' is not defined")
    assert "missing '::='" in err.message


def test_dot_is_not_a_wildcard():
    err = assert_error("root ::= . ", 1, 10, "'\\.' is not defined")
    assert "[^]" in err.message


def test_token_macros_read_print_and_refuse():
    """Token(...) / ExcludeToken(...) read into token sets (sorted, distinct) that print back and
    read again the same; malformed ones are located errors."""
    ir = parse_ebnf('root ::= Token(5, 3, 5) ExcludeToken() | ExcludeToken(9)')
    text = print_ebnf(ir)
    assert "Token(3, 5) ExcludeToken()" in text and "ExcludeToken(9)" in text
    assert parse_ebnf(text).rule_map() == ir.rule_map()
    assert_error("root ::= Token()", 1, 10, "at least one token id")
    assert_error('root ::= Token("a")', 1, 16, "token ids")
    assert_error("root ::= Token(1 2)", 1, 18, "expected ',' or '\\)'")
    assert_error("root ::= Token(99999999999)", 1, 16, "too large")
    assert_error("root ::= TokenTagDispatch((1, root), excludes=(1,))", 1, 10, "both a trigger and excluded")


_DISPATCH_RULES = 'a_r ::= [0-9]\nb_r ::= "x"\n'
_DISPATCH_TEXTS = ("", "hi", "<a>1", "hi<a>1", "hi<a>1 bye", "<a>1<b>x", "x<a>1y<b>xz", "<a>", "x<a", "<a>1<a>2", "zz",
                   "<b>y")


@pytest.mark.parametrize(("loop", "accepted"), [
    ("true", {"", "hi", "<a>1", "hi<a>1", "hi<a>1 bye", "<a>1<b>x", "x<a>1y<b>xz", "x<a", "<a>1<a>2"}),
    ("false", {"", "hi", "<a>1", "hi<a>1", "x<a"}),
])
def test_tag_dispatch(loop, accepted):
    """xgrammar's TagDispatch, as xgrammar 0.2.8 decides these strings."""
    ir = parse_ebnf(f'root ::= TagDispatch(("<a>", a_r), ("<b>", b_r), loop_after_dispatch={loop}, '
                    f'excludes=("zz"))\n' + _DISPATCH_RULES)
    for text in _DISPATCH_TEXTS:
        assert matches(ir, text) == (text in accepted), text
    assert parse_ebnf(print_ebnf(ir)) == ir


def test_tag_dispatch_stop_strings():
    ir = parse_ebnf('root ::= TagDispatch(("<a>", a_r), stop_eos=false, stop_str=("END", "STOP")) "."\n'
                    + _DISPATCH_RULES)
    for text, ok in [("hiEND.", True), ("hi<a>1 STOP.", True), ("hi.", False), ("END.", True), ("hiEND more.", False),
                     ("<a>1<a>2END.", True), ("hi<a>END.", False)]:
        assert matches(ir, text) == ok, text
    both = parse_ebnf('root ::= TagDispatch(("<a>", a_r), stop_str=("END",))\n' + _DISPATCH_RULES)
    assert matches(both, "hi") and matches(both, "hiEND") and not matches(both, "hiEND!")


@pytest.mark.parametrize(("args", "column", "words"), [
    ('("<a>", nope)', 30, "'nope' is not defined"),
    ('("", a_r)', 23, "must not be empty"),
    ('("<a>", a_r), ("<a>", a_r)', 37, "given twice"),
    ('("<a>", a_r), loop=true', 36, "unknown or repeated"),
    ('("<a>", a_r), stop_eos=maybe', 45, "true or false"),
    ('("<a>", a_r), stop_eos=false', 10, "stop string"),
    ('("<a>", a_r), ("x<a>", a_r)', 10, "inside one another"),
    ('("<a>" a_r)', 29, "expected"),
    ("stop_eos=false", 10, "stop string"),     # (no pair at all is free text, as in xgrammar)
])
def test_tag_dispatch_errors(args, column, words):
    assert_error(f"root ::= TagDispatch({args})\n" + _DISPATCH_RULES, 1, column, words)


def test_duplicate_rule():
    assert_error('root ::= a\na ::= "x"\na ::= "y"', 3, 1, "'a' is defined more than once")


def test_missing_root_rule():
    assert_error('a ::= "x"', 1, 1, "root rule 'root' is not defined")
    assert_error('root ::= "x"', 1, 1, "root rule 'main'", root_rule_name="main")
    assert_error("", 1, 1, "root rule")
    assert_error("# only a comment\n", 1, 1, "root rule")


# ----------------------------------------------------------------------------------------------
# errors: limits


@pytest.mark.parametrize(
    "text, column",
    [
        (f'root ::= "a"{{{MAX_REPEAT + 1}}}', 14),
        (f'root ::= "a"{{{MAX_REPEAT + 1},}}', 14),
        (f'root ::= "a"{{0,{MAX_REPEAT + 1}}}', 16),
        ('root ::= "a"{0,99999999999999999999999999}', 16),
        ('root ::= "a"{99999999999999999999999999,1}', 14),
    ],
)
def test_repeat_bound_limit(text, column):
    err = assert_error(text, 1, column, "exceeds the limit", cls=GrammarLimitError)
    assert isinstance(err, GrammarError)


def test_grammar_size_limit():
    ok_prefix = 'root ::= "a"\n#'
    text = ok_prefix + "x" * (MAX_GRAMMAR_BYTES - len(ok_prefix))
    assert len(text.encode()) == MAX_GRAMMAR_BYTES
    assert parse_ebnf(text).rules[0].body == L("a")
    with pytest.raises(GrammarLimitError, match="exceeds the limit"):
        parse_ebnf(text + "x")


def test_grammar_size_limit_counts_utf8_bytes():
    text = 'root ::= "a"\n#' + "é" * (MAX_GRAMMAR_BYTES // 2)
    assert len(text) < MAX_GRAMMAR_BYTES < len(text.encode())
    with pytest.raises(GrammarLimitError):
        parse_ebnf(text)


def test_nesting_depth_limit():
    depth = MAX_NESTING_DEPTH
    assert parse_ebnf("root ::= " + "(" * depth + '"a"' + ")" * depth).rules[0].body == L("a")
    deeper = "root ::= " + "(" * (depth + 1) + '"a"' + ")" * (depth + 1)
    assert_error(deeper, 1, 10 + depth, "nested deeper", cls=GrammarLimitError)


def test_lookahead_counts_towards_nesting_depth():
    depth = MAX_NESTING_DEPTH
    text = 'root ::= "b" (= ' + "(" * (depth - 1) + '"a"' + ")" * (depth - 1) + ")"
    assert parse_ebnf(text).rules[0].lookahead == L("a")
    text = 'root ::= "b" (= ' + "(" * depth + '"a"' + ")" * depth + ")"
    assert_error(text, 1, 17 + depth - 1, "nested deeper", cls=GrammarLimitError)


def test_very_deep_nesting_does_not_blow_the_python_stack():
    # Far beyond the limit: must be a clean GrammarLimitError, not a RecursionError.
    text = "root ::= " + "(" * 200_000 + '"a"' + ")" * 200_000
    with pytest.raises(GrammarLimitError):
        parse_ebnf(text)


def test_deep_alternating_ir_parses_and_prints():
    # ("a" ("b" | ("a" ("b" | ... )))) keeps its depth in the IR: Seq/Choice alternate.
    depth = MAX_NESTING_DEPTH // 2
    text = "root ::= " + '("a" ("b" | ' * depth + '"c"' + "))" * depth
    ir = parse_ebnf(text)
    printed = print_ebnf(ir)
    assert printed.startswith('root ::= "a" ("b" | "a" ("b" | ')
    assert print_ebnf(parse_ebnf(printed)) == printed


# ----------------------------------------------------------------------------------------------
# printer


@pytest.mark.parametrize(
    "expr, expected",
    [
        (L("abc"), '"abc"'),
        (EPSILON, '""'),
        (L('say "hi" \\ bye'), r'"say \"hi\" \\ bye"'),
        (L("a\nb\tc\rd"), r'"a\nb\tc\rd"'),
        (L("\x00\x01\x1b\x7f"), r'"\u0000\u0001\u001b\u007f"'),
        (L("\x01A"), r'"\u0001A"'),  # fixed-width escape: never swallows the next hex digit
        (L("\u00a0\u2028"), r'"\u00a0\u2028"'),
        (L("\U000e0001"), r'"\U000e0001"'),
        (L("é中😀"), '"é中😀"'),
        (L("[]-^#|"), '"[]-^#|"'),
        (CC(r("a", "z")), "[a-z]"),
        (CC(r("a", "z"), negated=True), "[^a-z]"),
        (CC(negated=True), "[^]"),
        (CC(), "[]"),
        (CC(c("-"), c("\\"), c("]"), c("^"), c("[")), r"[\-\\\]\^\[]"),
        (CC((0, 0x1F), c('"')), r'[\u0000-\u001f"]'),
        (CC((0x4E00, 0x9FA5)), "[一-龥]"),
        (RuleRef("x.y-z"), "x.y-z"),
        (Repeat(L("a"), 0, None), '"a"*'),
        (Repeat(L("a"), 1, None), '"a"+'),
        (Repeat(L("a"), 0, 1), '"a"?'),
        (Repeat(L("a"), 3, 3), '"a"{3}'),
        (Repeat(L("a"), 2, None), '"a"{2,}'),
        (Repeat(L("a"), 1, 1), '"a"{1}'),
        (Repeat(L("a"), 2, 7), '"a"{2,7}'),
        (Repeat(Repeat(L("a"), 0, None), 1, None), '("a"*)+'),
        (Repeat(Seq((L("a"), L("b"))), 0, 1), '("a" "b")?'),
        (Repeat(Choice((L("a"), L("b"))), 0, 1), '("a" | "b")?'),
        (Seq((L("a"), Choice((L("b"), L("c"))), L("d"))), '"a" ("b" | "c") "d"'),
        (Choice((Seq((L("a"), L("b"))), L("c"))), '"a" "b" | "c"'),
    ],
)
def test_print_expressions(expr, expected):
    ir = GrammarIR(rules=[Rule("root", expr)])
    assert print_ebnf(ir) == f"root ::= {expected}\n"


def test_print_root_first_and_lookahead():
    ir = GrammarIR(
        rules=[
            Rule("a", Repeat(CC(r("0", "9")), 1, None), Choice((L(","), L("}")))),
            Rule("root", Seq((RuleRef("a"), L(",")))),
        ]
    )
    assert print_ebnf(ir) == 'root ::= a ","\na ::= [0-9]+ (= "," | "}")\n'


def test_print_is_deterministic():
    ir = parse_ebnf(JSON_EBNF)
    assert print_ebnf(ir) == print_ebnf(parse_ebnf(JSON_EBNF))


def test_print_rejects_unwritable_rule_names():
    with pytest.raises(GrammarError):
        print_ebnf(GrammarIR(rules=[Rule("bad name", L("a"))], root="bad name"))


# ----------------------------------------------------------------------------------------------
# round trips


ROUND_TRIP_GRAMMARS = [
    'root ::= "a"',
    'root ::= ""',
    "root ::= ()",
    'root ::= "a" | "b" "c" | ("d" | "e")* "f"{2,} "g"{3} "h"{0,4}',
    "root ::= [^\\]\\-\\\\^a-z] [一-龥]+ [\\x00-\\x1f]? [^]",
    'root ::= "\\"\\\\\\n\\t\\r\\u0001\\u00a0é😀\\U000e0001"',
    'root ::= a b\na ::= "x" (= "y" | b)\nb ::= "y"+ (= [\\n ])',
    'root ::= (("a"*)+)? ("b" ("c" | "d"))*',
    'x ::= "1"\nroot ::= x x\ny ::= root',
]


@pytest.mark.parametrize("text", ROUND_TRIP_GRAMMARS)
def test_round_trip(text):
    ir = parse_ebnf(text)
    printed = print_ebnf(ir)
    assert parse_ebnf(printed) == ir
    assert print_ebnf(parse_ebnf(printed)) == printed


def test_round_trip_with_custom_root():
    ir = parse_ebnf('a ::= "x" start\nstart ::= "y"', root_rule_name="start")
    assert parse_ebnf(print_ebnf(ir), root_rule_name="start") == ir


def test_round_trip_json_grammar():
    ir = parse_ebnf(JSON_EBNF)
    assert parse_ebnf(print_ebnf(ir)) == ir


_CHAR_POOL = 'ab"\\\n\t\r\x00\x01\x7f ]-^[é中😀\u00a0\U000e0001#|()'


def _random_expr(rng: random.Random, names: list[str], depth: int):
    kinds = ["lit", "cls", "ref"] + (["seq", "choice", "repeat"] * 2 if depth < 4 else [])
    kind = rng.choice(kinds)
    if kind == "lit":
        return L("".join(rng.choice(_CHAR_POOL) for _ in range(rng.randint(0, 4))))
    if kind == "cls":
        ranges = []
        for _ in range(rng.randint(0, 3)):
            lo = ord(rng.choice(_CHAR_POOL))
            hi = ord(rng.choice(_CHAR_POOL))
            ranges.append((min(lo, hi), max(lo, hi)))
        return CharClass(tuple(ranges), rng.random() < 0.3)
    if kind == "ref":
        return RuleRef(rng.choice(names))
    if kind == "repeat":
        lo = rng.randint(0, 3)
        hi = rng.choice([None, lo, lo + rng.randint(0, 3)])
        return Repeat(_random_expr(rng, names, depth + 1), lo, hi)
    children = tuple(_random_expr(rng, names, depth + 1) for _ in range(rng.randint(1, 3)))
    return Seq(children) if kind == "seq" else Choice(children)


@pytest.mark.parametrize("seed", range(200))
def test_random_ir_round_trip(seed):
    """Printing any IR gives parseable text; the parsed (normal-form) IR then round-trips."""
    rng = random.Random(seed)
    names = ["root", "a", "b-c", "d.e"]
    rules = [
        Rule(
            name,
            _random_expr(rng, names, 0),
            _random_expr(rng, names, 0) if rng.random() < 0.3 else None,
        )
        for name in names
    ]
    ir = GrammarIR(rules=rules)
    once = parse_ebnf(print_ebnf(ir))
    assert [rule.name for rule in once.rules] == names
    assert parse_ebnf(print_ebnf(once)) == once
    assert print_ebnf(parse_ebnf(print_ebnf(once))) == print_ebnf(once)
    # Lookahead assertions survive printing.
    for rule, orig in zip(once.rules, rules):
        assert (rule.lookahead is None) == (orig.lookahead is None)


# ----------------------------------------------------------------------------------------------
# real grammars


def test_json_grammar_rules():
    ir = parse_ebnf(JSON_EBNF)
    rules = ir.rule_map()
    assert ir.root == "root" and ir.rules[0].name == "root"
    assert {
        "root",
        "value",
        "object",
        "member",
        "array",
        "string",
        "char",
        "escape",
        "hex",
        "number",
        "integer",
        "fraction",
        "exponent",
        "ws",
    } <= set(rules)
    assert rules["root"].body == Choice((RuleRef("object"), RuleRef("array")))
    assert rules["ws"].body == Repeat(CC(r("\t", "\n"), c("\r"), c(" ")), 0, None)
    assert rules["value"].body == Choice(
        (
            RuleRef("object"),
            RuleRef("array"),
            RuleRef("string"),
            RuleRef("number"),
            L("true"),
            L("false"),
            L("null"),
        )
    )
    # Raw control characters, '"' and '\' are excluded from unescaped string characters.
    raw_char = rules["char"].body.alts[0]
    assert raw_char == CharClass(((0, 0x1F), c('"'), c("\\")), negated=True)


@pytest.mark.parametrize(
    "doc",
    [
        "0",
        "-0",
        "12",
        "-3.25e+10",
        "1E5",
        "0.5",
        "true",
        "false",
        "null",
        '""',
        '"a\\"b\\\\c\\/d\\b\\f\\n\\r\\t\\u00E9z"',
        '"é中😀"',
        "[]",
        "[ ]",
        "{}",
        '{ "a" : 1 , "b" : [true, null, {"c": "d"}] }',
        "[[[[]]]]",
    ],
)
def test_json_grammar_accepts(doc):
    # Any JSON value matches `value`; the root (like xgrammar's builtin) takes an object or array only.
    assert matches(parse_ebnf(JSON_EBNF, root_rule_name="value"), doc)
    assert matches(parse_ebnf(JSON_EBNF), doc) == (doc[0] in "[{")


def test_json_root_has_no_surrounding_whitespace():
    assert not matches(parse_ebnf(JSON_EBNF), " [1]")
    assert not matches(parse_ebnf(JSON_EBNF), "[1] ")


@pytest.mark.parametrize(
    "doc",
    [
        "",
        "01",
        "-",
        "1.",
        ".5",
        "1e",
        "+1",
        "tru",
        "[1,]",
        "[,1]",
        '{"a"}',
        '{"a":1,}',
        "{a:1}",
        '"unterminated',
        '"bad \\x escape"',
        '"\\u12"',
        '"raw\ncontrol"',
        '"raw\x00nul"',
        "'single'",
        "[1] [2]",
        "\f1",
    ],
)
def test_json_grammar_rejects(doc):
    assert not matches(parse_ebnf(JSON_EBNF), doc)


def test_gbnf_style_arithmetic_grammar():
    text = r"""
root ::= expr ("=" expr)*
expr ::= term ([-+*/] term)*
term ::= num | "(" expr ")"
num  ::= [0-9]+
"""
    ir = parse_ebnf(text)
    assert matches(ir, "1+2")
    assert matches(ir, "(3*4)-5=7")
    assert not matches(ir, "1+")
    assert ir.rule_map()["expr"].body == Seq(
        (
            RuleRef("term"),
            Repeat(
                Seq((CC(r("*", "+"), c("-"), c("/")), RuleRef("term"))),
                0,
                None,
            ),
        )
    )


def test_xgrammar_doc_string_grammar():
    text = r"""
root   ::= "\"" char* "\""
char   ::= [^"\\\x00-\x1f] | "\\" escape
escape ::= ["\\/bfnrt] | "u" [0-9A-Fa-f]{4}
"""
    ir = parse_ebnf(text)
    assert matches(ir, '"hello"')
    assert matches(ir, '"line1\\nline2"')
    assert matches(ir, '"\\u00e9"')
    assert not matches(ir, '"bad\\q"')
    assert not matches(ir, '"open')


# ------------------------------------------------------------------------ tail recursion

TAIL_RECURSIVE = r'''
root ::= "\"" chars "\"" | "[" items
chars ::= "" | [^"\\] chars | "\\" ["n\\] chars
items ::= "]" | "a" items | "b" "," items
'''


def test_tail_recursion_becomes_repetition() -> None:
    """Self-calls only at the ends of alternatives become a loop (Arden's rule), so a long string
    costs the parser one automaton, not one open call per character; other rules stay."""
    from itertools import product

    import xg2
    from xg2.grammar.ir import any_node
    from xg2.grammar.optimize import tail_recursion_as_repetition

    ir = parse_ebnf(TAIL_RECURSIVE)
    out = tail_recursion_as_repetition(ir).rule_map()
    for name in ("chars", "items"):
        assert not any_node(out[name].body, lambda n, name=name: n == RuleRef(name)), name
    assert out["root"] == ir.rule_map()["root"]
    # Not rewritten: a self-call that is not last, or no way out of the recursion.
    for src in ['root ::= "a" root "b" | "c"', 'root ::= "a" r\nr ::= "b" r']:
        ir2 = parse_ebnf(src)
        assert tail_recursion_as_repetition(ir2) is ir2

    compiled = xg2.GrammarCompiler(xg2.TokenizerInfo([])).compile_grammar(TAIL_RECURSIVE)

    def accepts(text: str) -> bool:
        m = xg2.GrammarMatcher(compiled)
        return m.accept_string(text) and m.is_completed()

    def reference(text: str) -> bool:   # the language, written out by hand
        if text.startswith("["):
            body = text[1:]
            while body[:1] == "a" or body[:2] == "b,":
                body = body[1:] if body[0] == "a" else body[2:]
            return body == "]"
        if len(text) < 2 or text[0] != '"' or text[-1] != '"':
            return False
        inner, i = text[1:-1], 0
        while i < len(inner):
            if inner[i] == "\\":
                if inner[i + 1:i + 2] not in ('"', "n", "\\"):
                    return False
                i += 2
            elif inner[i] == '"':
                return False
            else:
                i += 1
        return True

    for n in range(6):
        for chars in product('"\\nab,[]', repeat=n):
            text = "".join(chars)
            assert accepts(text) == reference(text), text
    assert accepts('"' + "x\\n" * 5000 + '"')
    assert accepts("[" + "ab," * 5000 + "]")


def test_char_budget_is_the_bounded_language() -> None:
    """`[max_chars=n]` bounds the code points of the rule's whole text, the rules it calls
    included, strictly (a prefix that no continuation within the budget completes is refused);
    a rule that calls itself cannot have one (its text is not a regular language)."""
    import xg2

    g = xg2.GrammarCompiler(xg2.TokenizerInfo([])).compile_grammar(
        'root ::= v ">"\nv[max_chars=3] ::= w ("-" w)?\nw ::= [aé]+')
    for text, whole, prefix in [("aé>", True, True), ("a-a>", True, True), ("aa-", False, False),
                                ("aa-a>", False, False), ("éé", False, True), ("aaaa", False, False)]:
        m = xg2.GrammarMatcher(g)
        assert m.accept_string(text) == prefix, text
        assert (prefix and m.is_completed()) == whole, text
    assert_error('root ::= v\nv[max_chars=2] ::= "a" v | "b"', 2, 1, "calls itself")
    assert_error('root ::= v\nv[max_chars=x] ::= "a"', 2, 3, "non-negative integer")


@pytest.mark.parametrize("src", ['root ::= "<" r ">"\nr[lazy] ::= [a-z] [a-z]*', 'root ::= "<" r ">"\nr[lazy] ::= [a-z]+',
                                 'root ::= r "z"\nr[lazy] ::= Substring("ab")', 'root ::= (r ";")+\nr[lazy] ::= w "c"+\nw ::= [ab]+'])
def test_lazy_rules_agree_with_xgrammar(src: str) -> None:
    """EBNF's `[lazy]`: the rule ends at its body's first end (committed to the shortest match),
    the rules it calls written in; every string of up to 5 characters judged as xgrammar does."""
    import itertools

    import xgrammar as xgr

    import xg2

    pair = [module.GrammarCompiler(module.TokenizerInfo([])).compile_grammar(src) for module in (xgr, xg2)]
    for n in range(6):
        for text in map("".join, itertools.product("abc<>;z", repeat=n)):
            ref, ours = (module.GrammarMatcher(g) for module, g in zip((xgr, xg2), pair))
            assert ours.accept_string(text) == ref.accept_string(text), (src, text)
            assert ours.is_completed() == ref.is_completed(), (src, text)


@pytest.mark.parametrize("pattern", [r"a\\b", r"(a)\\1", "(?<=a)b", "[]", r"\\uZZ", "+a"])
def test_regex_macro_errors_come_at_compile_time_as_in_xgrammar(pattern: str) -> None:
    """A Regex(...) whose pattern xg2 cannot build is read (the grammar prints back as written)
    and refused when compiled, with the rule and the pattern's column, where xgrammar refuses it:
    at first use."""
    import xgrammar as xgr

    import xg2

    src = f'root ::= "x" Regex("{pattern}")'
    for module in (xgr, xg2):
        grammar = module.Grammar.from_ebnf(src)
        with pytest.raises(RuntimeError, match="Failed to build the automaton for rule root"):
            module.GrammarCompiler(module.TokenizerInfo([])).compile_grammar(grammar)
    ours = xg2.Grammar.from_ebnf(src)
    assert str(xg2.Grammar.from_ebnf(str(ours))) == str(ours) and f'Regex("{pattern}")' in str(ours)
    with pytest.raises(xg2.GrammarError) as info:
        xg2.GrammarCompiler(xg2.TokenizerInfo([])).compile_grammar(ours)
    assert (info.value.line, info.value.column) == (1, 14)


@pytest.mark.parametrize("trigger", ["abc", "abcq"])
def test_tag_dispatch_refuses_an_excluded_prefix_of_a_trigger(trigger: str) -> None:
    """An excluded string that begins a trigger would keep the trigger from ever being written
    (the dispatch would silently never fire): refused, as xgrammar refuses it."""
    assert_error(f'root ::= TagDispatch(("{trigger}", body), excludes=("abc"))\nbody ::= "!"', 1, 10,
                 "must not be a prefix of trigger")


def test_every_combination_of_rule_attributes_reads_or_is_refused() -> None:
    """EBNF's rule attributes, up to three at once, on a regular body, a rule reference and a
    recursive rule: each grammar compiles or raises a located GrammarError, never anything else."""
    import itertools

    import xg2

    attrs = ["lazy", "capture", 'capture="x"', "max_tokens=2", "max_chars=2", "temperature=0.5", "suffix=\"!\"",
             "bogus"]
    bodies = ["[ab]+", '"a" s', '"a" r | "b"']
    compiler = xg2.GrammarCompiler(xg2.TokenizerInfo(["a", "b", "z"]))
    for k in (1, 2, 3):
        for combo in itertools.combinations(attrs, k):
            for body in bodies:
                src = f'root ::= r "z"\nr[{", ".join(combo)}] ::= {body}\ns ::= "b"'
                try:
                    compiler.compile_grammar(xg2.Grammar.from_ebnf(src))
                except xg2.GrammarError as e:
                    assert e.line is not None, src
