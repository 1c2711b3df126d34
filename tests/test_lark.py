"""The Lark front-end (xg2.grammar.lark) side by side with xgrammar 0.2.8's `Grammar.from_lark`.

Nothing here is an expected language written by hand: for every grammar of the corpus below (and the
benchmark corpus converted to Lark by benchmarks/ebnf_to_lark.py), every string of a generated set
(all short strings over the grammar's alphabet, the positive samples, and their truncations, single
deletions and insertions) is judged by both engines: `accept_string` and then `is_completed`, with
an empty vocabulary. A few grammars also compare whole token masks step by step on a small
vocabulary of single bytes and a few multi-byte tokens (as tests/test_conventions.py's `ENCODED`).

Errors are compared too where both engines refuse: a malformed grammar raises xg2.GrammarError, at
the line and column xgrammar names for the same input, worded so that xgrammar's key phrases read
alike. Where xg2 refuses what xgrammar accepts (special tokens by id, the rule attributes whose
meaning lies in the matcher, a regex escape with no meaning in xg2's regex dialect) or reports a
different position, the test says why.
"""

from __future__ import annotations

import itertools
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import xgrammar as xgr

import xg2
from xg2.grammar.ebnf import MAX_NESTING_DEPTH
from xg2.grammar.lark import MAX_LARK_NESTING, lark_to_ir

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from corpus import grammar_names, load_case
from ebnf_to_lark import convert

# ------------------------------------------------------------------------------------------ corpus

#: (name, Lark source, alphabet of the generated strings, positive samples[, named grammars]).
#: Named grammars: Lark text, or ("ebnf", text) for a Grammar built from EBNF in each engine.
CORPUS: list[tuple] = [
    ("alternatives", 'start: "a" | "b" | "cd"', "abcd", ["a", "cd"]),
    ("groups", 'start: ("a" | "b") "c" ("d" "e" | "f")', "abcdef", ["acde", "bcf"]),
    ("quantifiers", 'start: "a"? "b"* "c"+', "abc", ["c", "abbcc", "bc"]),
    ("optional_brackets", 'start: ["a" "b"] "c" ["d" | "e"]\n', "abcde", ["c", "abcd", "ce"]),
    ("tilde_repetition", 'start: "a"~2 "b" ~ 1..3 ("c" | "d")~0..2', "abcd", ["aab", "aabbbcd"]),
    ("brace_repetition", 'start: "a"{2} "b"{1,2} "c"{2,} "d"{,1} "e"{,} "f"{0}', "abcdef",
     ["aabcc", "aabbcccde", "aabccee"]),
    ("zero_and_nested_repetition", 'start: ("x" "y"?)~0..2 ["z"]* "w"{0,0}', "xyzw", ["xyx", "zz", ""]),
    ("string_escapes", r'start: "\"" "\\" "\n" "\t" "\u00e9" "\ud83d\ude00" "\/" "\b\f\r"',
     '"\\\n\té😀/\b\f\r', ['"\\\n\té😀/\b\f\r']),
    ("case_insensitive_literals", 'start: "yes"i | "No-1"i "!"', "yesYESnoNO-1!", ["yEs", "nO-1!", "NO-1!"]),
    ("ranges", 'start: "a".."c" "0" .. "2" "α".."γ"', "abcd0123αβγδ", ["a0α", "c2γ"]),
    ("regex_basic", r'start: /[a-c]+/ /x?y{1,2}/ /(p|q)*/', "abcxypq", ["ay", "abcxyypq"]),
    ("regex_dot_and_s_flag", r'start: /a.b/ | /c.d/s | /[.]/', "abcd.\n\u2028x", ["axb", "c\nd", "a\u2028b", "."]),
    ("regex_i_flag", r'start: /[a-c]x|[^b]/i "-" /k.+/is', "abcxABCX-kK\n", ["aX-kk", "A-k\n", "C-K\nK"]),
    ("regex_i_flag_shorthands", r'start: /\s\S/i | /[^\s]x/i | /[\S]/i', "a \xa0\x0bx\u1680",
     [" a", "\x0b\xa0", "ax", "\xa0x"]),
    ("json_objects_and_arrays", ('%ignore " "\nstart: %json {"type": "object", "properties": {"a": {"type": '
     '"array", "items": {"type": "number"}}, "b": {"enum": [true, null]}}, "required": ["a"]} ";"'),
     '{}[]"ab:,1.-e ;', ['{"a": []};', '{"a":[1,-2.5e1],"b":null} ;', '{ "a" : [ 1 ] , "b" : true };']),
    ("regex_shorthands", r'start: /\s\S/ | /\d\w/ | /[\s]/ | /[^\S]x/ | /[\S]/',
     "a1_ \t\x0b\xa0\u1680x", ["\xa0a", "1_", "\x0b", " x"]),
    ("regex_anchors_and_slash", r'start: /^ab$/ | /a\/b/ | /c\.d/', "abcd/.", ["ab", "a/b", "c.d"]),
    ("terminals_any_order", 'start: A B\nB: C "y"\nA: C+\nC: "x" | "z"', "xyz", ["xxy", "zxzy"]),
    ("recursive_rules", 'start: value\nvalue: "x" | "(" value ")" | "[" (value ("," value)*)? "]"',
     "x()[],", ["x", "((x))", "[x,(x)]", "[]"]),
    ("ignore_ws_doc_example", ('%import common.INT\n%import common.WS\n%ignore WS\n\nstart: item ("," item)*\n'
     'item: "id=" INT'), "id=1, \n", ["id=1", "id=1, id=42", "id=1 ,id=2 , id=3", "id=1\n"]),
    ("ignore_not_inside_terminals", '%ignore " "\nstart: a B\na: "x" "y"?\nB: "b" "c"',
     "xybc ", ["xbc", "x y bc", "xy bc "]),
    ("ignore_merged", '%ignore " "\n%ignore /;+/\n%ignore "#" "!"\nstart: "a" "b"', "ab ;#!",
     ["ab", "a ;; b", "a#!b;"]),
    ("allow_initial_skip", ('%grammar_options {"allow_initial_skip": true}\n%ignore " "\nstart: a\n'
     'a: "x" start?'), "x ", [" x", " x x", "x  x "]),
    ("initial_skip_option_sticks", ('%grammar_options {"allow_initial_skip": true}\n'
     '%grammar_options {"allow_initial_skip": false}\n%ignore "_"\nstart: "a" "b"'), "ab_", ["_a_b"]),
    ("ignore_after_empty_things", '%ignore " "\nstart: "" E "a" e /x?/ "b"{0} "c"\nE: ""\ne:', "aexbc ",
     [" ac", "a x c", "ac "]),
    ("ignore_in_groups_and_repeats", '%ignore " "\nstart: ("a" B)~2 [C] (D | "e")*\nB: "b"\nC: "c"\nD: "d"',
     "abcde ", ["abab", "a b ab c d e", "ababde"]),
    ("ignore_empty", '%ignore\nstart: "a" "b"', "ab ", ["ab"]),
    ("common_numbers", ('start: SIGNED_NUMBER "," NUMBER "," DECIMAL "," _EXP "," HEXDIGIT\n'
     '%import common (SIGNED_NUMBER, NUMBER, DECIMAL, _EXP, HEXDIGIT)'), "-+1.e5,aF",
     ["-1.5e+3,2,.5,e1,a", "+1,1.,1.,E-1,F", "1e5,3e1,0.0,e9,0"]),
    ("common_floats_ints", ('start: FLOAT | SIGNED_FLOAT "!" | SIGNED_INT "?" | INT "i" | DIGIT "d"\n'
     '%import common (FLOAT, SIGNED_FLOAT, SIGNED_INT, INT, DIGIT)'), "-1.e!?id",
     ["1.e1", "-.1!", "-1?", "11i", "1d", "1e1"]),
    ("common_names_strings", ('start: CNAME " " WORD " " ESCAPED_STRING " " LETTER LCASE_LETTER UCASE_LETTER\n'
     '%import common (CNAME, WORD, ESCAPED_STRING, LETTER, LCASE_LETTER, UCASE_LETTER)'), 'a_1B "\\\n',
     ['a_1 B "x\\"" BaB', '_ a "" aaA', 'a ab "\\\\\n" aaB']),
    ("common_whitespace_comments", ('start: WS_INLINE? NEWLINE CR? LF SH_COMMENT CPP_COMMENT C_COMMENT SQL_COMMENT\n'
     '%import common (WS_INLINE, NEWLINE, CR, LF, SH_COMMENT, CPP_COMMENT, C_COMMENT, SQL_COMMENT)'),
     " \n\r#/*-x", [" \n\n#x//x/**/--x", "\r\n\r\n#//x/*x*/--", "\n\r\n#x//x/* ** */--x"]),
    ("import_alias_after_use", ('start: N WORD x\n%import common.INT -> N\n%import common.WORD\n'
     '%import common.WS -> x\n%ignore "_"'), "1a _", ["1a ", "1_a_ _"]),
    ("comments_and_continuations", ('start: "a" // comment\n  # another\n\n  | "b" # trailing\n  | "c"\n'
     '  // no more'), "abc", ["a", "b", "c"]),
    ("aliases_and_prefixes", '?start: x -> one\n  | "b" -> two\n  | ("c" -> three)\n!x: "a"\n?Y: "y"',
     "abcy", ["a", "b", "c"]),
    ("names_with_hyphens_underscores", 'start: my-rule _T __t2\nmy-rule: "a"\n_T: "b"\n__t2: "c"', "abc",
     ["abc"]),
    ("empty_alternatives", 'start: | "a" | ("b" | ) "c"\n  |', "abc", ["", "a", "c", "bc"]),
    ("empty_start", 'start:', "a", [""]),
    ("colliding_names", '%ignore " "\nstart: root lark_ignore\nroot: "x"\nlark_ignore: "y"', "xy ", ["xy", "x y "]),
    ("json_inline", ('%ignore " "\nstart: "<" %json {"type": "object", "properties": {"a": {"type": "integer"}},\n'
     '  "required": ["a"]} ">" %json {"type": "string"}\n'), '<>{"a:1} ',
     ['<{"a":1}>""', '< { "a" : 11 } > "a"', '<{"a": 1}>"{"']),
    ("json_repeated", 'start: (%json {"type":"integer"} ";")~1..2 %json true', '1;-2{}"', ["1;2;1", "1;{}", '-1;""']),
    ("lark_nested", ('%ignore " "\nstart: "[" %lark {\n  %ignore "_"\n  start: a "y"\n  a: "x" | "(" a ")"\n} "]" a\n'
     'a: "z"'), "[]xy_() z", ["[x_y] z", "[(x)y]z", "[ (_x)_y_ ] z"]),
    ("lark_nested_one_line", 'start: %lark { start: "x" | "}" }~2 | "q"\n', "x}q", ["xx", "}x", "q"]),
    ("lark_nested_initial_skip", ('start: "[" %lark {\n%grammar_options {"allow_initial_skip": true}\n'
     '%ignore "_"\nstart: "x"\n} "]"'), "[x_]", ["[_x_]", "[x]"]),
    ("named_lark_grammars", '%ignore " "\nstart: "[" @inner "]" @inner?', "[]xy_ ",
     ["[x]", "[ x_y ] x", "[x]x_y"], {"inner": '%ignore "_"\nstart: "x" "y"?'}),
    ("named_chain_and_ebnf", 'start: @a "|" @b', "xyz|", ["xy|z", "xyy|z"],
     {"a": 'start: "x" @c', "c": 'start: "y"+', "b": ("ebnf", 'root ::= "z" r?\nr ::= "z"')}),
    ("ambiguous_split", 'start: A A\nA: /a+/', "ab", ["aa", "aaaa"]),
    ("deep_parentheses", "start: " + "(" * 60 + '"a"' + ")" * 60 + "+", "a", ["a", "aa"]),
    # A rule ending at a marker commits at the first place where its body then its marker ends.
    ("stop_suffix_markers", ('start: "<" a ">" b c\na[stop="!!"]: /[a-z!]{1,4}/\nb[suffix=/x+y/]: /[xy]*/\n'
     'c[stop=END]: AB+\nAB: "a" | "b"\nEND: "ab" | "!"'), "<>a!xyb", ["<!a!!>xxyaab", "<a!!>yxyb!"]),
    ("stop_suffix_flags_and_ignore", '%ignore " "\nstart: r ";" q\nr[suffix="aa"i]: /[ab]{0,4}/\nq[stop=/b?c/s]: "a"+',
     "abAc; ", ["aa;ac", "bAa ; ac", "baA;abc", "aa ;aac"]),
    ("stop_overlapping_marker", 'start: r r "z"\nr[stop="aba"]: /[ab]*/', "abz", ["abaabaz", "babaabaz"]),
    ("stop_nullable_and_repeated", ('start: (r "z")+ q\nr[suffix=M]: /[ab!]{0,3}/\nM: "!" | "b!"\n'
     'q[stop=/a?b*/]: "a"*'), "ab!z", ["!z", "ab!z!z", "a!zb!z"]),
    ("structured_regex", ('start: %regex {"substring_chunks":["ab","c","","de"]} ";" S\n'
     'S: %regex {"substring_chars":"xyz"}'), "abcde;xyz", [";", "abc;xy", "cde;z", "c;yz"]),
]

#: Cases whose source xg2 refuses on purpose: (source, fragment of the message, why).
REFUSED = [
    ('start: head\nhead[lazy]: TEXT "<end>"\nTEXT: /(\\n|.)*/', "lazy attribute on a body that begins with any",
     "xgrammar lets such text end without the marker, or builds a tool-call dispatch on it"),
    ('start: v "z"\nv[capture="x", suffix=/b+/]: /[a-z]*/', "not a fixed string",
     "a capture leaves its rule's marker out, which a marker of varying length does not allow"),
    ('start: v\nv[max_chars=2]: w\nw: /[a-z]+/', "max_chars is supported by xg2 on terminal-like bodies only",
     "xgrammar counts at run time; xg2 builds the bounded language, which needs a regular body"),
    ('start: v "z"\nv[stop=/x+/, stop_capture="m"]: /[a-z]*/', "not a fixed string",
     "the marker's text is what stop_capture records; a marker of varying length has no fixed end"),
    ('start: v "z"\nv[stop="b"]: /(\\n|.)*/', "matches any text",
     "xgrammar lets free text end without the marker (a TagDispatch), chosen by the regex's spelling"),
    ('start: v "z"\nv[suffix="b"]: /(a|[^a])*/', "matches any text",
     "any text by meaning: xgrammar's language then hangs on the spelling, so xg2 refuses every such body"),
    ('start: tool* tail "!"\ntail: TEXT\ntool: head "x"\nhead[suffix="<t>"]: TEXT\nTEXT: /(\\n|.)*/',
     "matches any text", "not the dispatch's shape (something follows the tail): the head's own language"),
]

# ---------------------------------------------------------------------------------------- helpers


def _named(named: dict | None, module):
    if not named:
        return None
    return {k: module.Grammar.from_ebnf(v[1]) if isinstance(v, tuple) else v for k, v in named.items()}


def _strings(alphabet: str, positives: list[str], budget: int = 700) -> list[str]:
    """Short strings over the alphabet (as many lengths as fit the budget), the positives, their
    prefixes, and each positive with one character deleted or one alphabet character inserted."""
    out: dict[str, None] = {}
    chars = sorted(set(alphabet))
    for n in range(10):
        if len(out) + len(chars) ** n > budget:
            break
        out.update(dict.fromkeys("".join(t) for t in itertools.product(chars, repeat=n)))
    for p in positives:
        out[p] = None
        for k in range(len(p) + 1):
            out[p[:k]] = None
            if k < len(p):
                out[p[:k] + p[k + 1:]] = None
            for c in chars:
                out[p[:k] + c + p[k:]] = None
    return list(out)


_EMPTY = {}


def _compiler(module):
    if module not in _EMPTY:
        _EMPTY[module] = module.GrammarCompiler(module.TokenizerInfo([]))
    return _EMPTY[module]


def _judge(module, grammar, strings: list[str]) -> list[tuple[bool, bool]]:
    compiled = _compiler(module).compile_grammar(grammar)
    matcher = module.GrammarMatcher(compiled)
    out = []
    for s in strings:
        matcher.reset()
        accepted = matcher.accept_string(s)
        out.append((accepted, accepted and matcher.is_completed()))
    return out


def _compare_languages(source: str, alphabet: str, positives: list[str], named=None) -> None:
    ref = xgr.Grammar.from_lark(source, named_grammars=_named(named, xgr))
    ours = xg2.Grammar.from_lark(source, named_grammars=_named(named, xg2))
    strings = _strings(alphabet, positives)
    a, b = _judge(xgr, ref, strings), _judge(xg2, ours, strings)
    for p in positives:
        assert a[strings.index(p)] == (True, True), f"xgrammar rejects the positive sample {p!r}"
    wrong = [(s, x, y) for s, x, y in zip(strings, a, b) if x != y]
    assert not wrong, (f"{len(wrong)} of {len(strings)} strings judged differently "
                       "((accepted, completed): xgrammar vs xg2):\n"
                       + "\n".join(f"  {s!r}: {x} vs {y}" for s, x, y in wrong[:12]) + f"\nxg2's grammar:\n{ours}")


# ------------------------------------------------------------------------------ languages compared


@pytest.mark.parametrize("case", CORPUS, ids=[c[0] for c in CORPUS])
def test_language_matches_xgrammar(case) -> None:
    _name, source, alphabet, positives, *named = case
    _compare_languages(source, alphabet, positives, named[0] if named else None)


_BRACED_HEX = re.compile(r"\\x\{([0-9A-Fa-f]+)\}")


def _portable_hex(lark: str) -> str:
    """The converter writes code points as llguidance's `\\x{HH}`; xgrammar 0.2.8 reads that as the
    letter x repeated HH (decimal) times, and xg2 refuses it (see test_braced_hex_escape_refused).
    Both read `\\uHHHH` alike, and a character above U+FFFF written as itself."""
    def sub(m: re.Match) -> str:
        cp = int(m.group(1), 16)
        return f"\\u{cp:04x}" if cp <= 0xFFFF else chr(cp)
    return _BRACED_HEX.sub(sub, lark)


def _benchmark_cases() -> list[tuple[str, str, tuple[str, ...]]]:
    out = []
    for name in grammar_names():
        case = load_case(name)
        out.append((name, _portable_hex(convert(case.ebnf).lark), case.samples))
    return out


BENCHMARK = _benchmark_cases()


@pytest.mark.parametrize("case", BENCHMARK, ids=[c[0] for c in BENCHMARK])
def test_benchmark_conversions_match_xgrammar(case) -> None:
    """benchmarks/ebnf_to_lark.py's conversions of the EBNF corpus: the samples (xgrammar accepts
    them, see the check in _compare_languages), their prefixes and one-character edits."""
    name, source, samples = case
    samples = [s for s in samples if len(s) <= 400][:6]
    alphabet = "".join(sorted({c for s in samples for c in s}))
    ref = xgr.Grammar.from_lark(source)
    ours = xg2.Grammar.from_lark(source)
    strings = [*samples]
    for p in samples:
        for k in range(0, len(p) + 1, max(1, len(p) // 25)):
            strings += [p[:k], p[:k] + p[k + 1:]] + [p[:k] + c + p[k:] for c in alphabet[:: max(1, len(alphabet) // 8)]]
    strings = list(dict.fromkeys(strings))
    a, b = _judge(xgr, ref, strings), _judge(xg2, ours, strings)
    for s in samples:
        assert a[strings.index(s)] == (True, True), f"{name}: xgrammar rejects a sample"
    wrong = [(s, x, y) for s, x, y in zip(strings, a, b) if x != y]
    assert not wrong, f"{name}: " + "; ".join(f"{s[-40:]!r}: {x} vs {y}" for s, x, y in wrong[:5])


# -------------------------------------------------------------------------------- masks compared

ENCODED = [bytes([b]) for b in range(256)] + [b"ab", b"abc", b"cc", b"</s>", b"", b"id=", b", ", b"  ", b"x_y"]
STOP = ENCODED.index(b"</s>")
VOCAB_SIZE = len(ENCODED) + 5
MASK_CASES = ["ignore_ws_doc_example", "ignore_in_groups_and_repeats", "regex_i_flag", "json_inline",
              "lark_nested", "named_lark_grammars", "allow_initial_skip", "common_names_strings"]


def _bits(bitmask) -> np.ndarray:
    arr = np.asarray(bitmask.numpy() if hasattr(bitmask, "numpy") else bitmask)
    return np.unpackbits(arr.reshape(-1).view(np.uint8), bitorder="little")[:VOCAB_SIZE].astype(bool)


@pytest.mark.parametrize("name", MASK_CASES)
def test_masks_match_xgrammar(name: str) -> None:
    _name, source, _alphabet, positives, *named = next(c for c in CORPUS if c[0] == name)
    named = named[0] if named else None
    engines = []
    for module in (xgr, xg2):
        info = module.TokenizerInfo(ENCODED, module.VocabType.RAW, vocab_size=VOCAB_SIZE, stop_token_ids=[STOP])
        compiled = module.GrammarCompiler(info).compile_grammar(
            module.Grammar.from_lark(source, named_grammars=_named(named, module)))
        engines.append((module, compiled, module.allocate_token_bitmask(1, VOCAB_SIZE)))
    for sample in positives:
        matchers = [module.GrammarMatcher(compiled) for module, compiled, _ in engines]
        for step, byte in enumerate([*sample.encode(), None]):
            masks = []
            for (_module, _compiled, mask), m in zip(engines, matchers):
                m.fill_next_token_bitmask(mask, 0)
                masks.append(_bits(mask))
            diff = np.flatnonzero(masks[0] ^ masks[1])
            assert not diff.size, (f"{name}: sample {sample!r}, step {step}: masks differ on "
                                   f"{[ENCODED[i] if i < len(ENCODED) else i for i in diff[:8]]}")
            token = STOP if byte is None else byte
            assert [m.accept_token(token) for m in matchers] == [True, True]


# --------------------------------------------------------------------------------- xg2 API wiring


def test_compile_lark_caches_and_serializes() -> None:
    compiler = xg2.GrammarCompiler(xg2.TokenizerInfo(ENCODED, vocab_size=VOCAB_SIZE, stop_token_ids=[STOP]))
    named = {"n": 'start: "x"', "g": xg2.Grammar.from_ebnf('root ::= "y"')}
    source = 'start: @n @g "z"'
    first = compiler.compile_lark(source, named_grammars=named)
    assert compiler.compile_lark(source, named_grammars=dict(reversed(named.items()))) is first
    assert compiler.compile_lark(source, named_grammars={**named, "n": 'start: "q"'}) is not first
    loaded = compiler.deserialize(first.serialize())
    assert str(loaded.grammar) == str(xg2.Grammar.from_lark(source, named_grammars=named))
    matcher = xg2.GrammarMatcher(first)
    assert matcher.accept_string("xyz") and matcher.is_completed()
    with pytest.raises(TypeError):
        compiler.compile_lark(source, named_grammars={"n": 3})
    with pytest.raises(TypeError):
        compiler.compile_lark(b"start: a")


def test_signature_matches_xgrammar() -> None:
    import inspect

    ours = inspect.signature(xg2.Grammar.from_lark)
    ref = inspect.signature(xgr.Grammar.from_lark)
    assert list(ours.parameters) == list(ref.parameters)
    assert [p.kind for p in ours.parameters.values()] == [p.kind for p in ref.parameters.values()]
    ours = inspect.signature(xg2.GrammarCompiler.compile_lark)
    ref = inspect.signature(xgr.GrammarCompiler.compile_lark)
    assert list(ours.parameters) == list(ref.parameters)


def test_named_grammar_compiled_once() -> None:
    ir = lark_to_ir('start: @n @n %lark {\nstart: @n\n}', named_grammars={"n": 'start: "x" a\na: "y"'})
    assert sum(r.body == xg2.grammar.ir.Literal("y") for r in ir.rules) == 1


# ------------------------------------------------------------------------------------------ errors

_POSITION = re.compile(r"Lark error at line (\d+), column (\d+)")

#: Malformed grammars both engines refuse, at the same line and column.
BAD = [
    'start: "a"\n  "b"',                        # a continuation line must start with '|'
    'start: ("a"\n "b")',                       # no line break inside a group
    'start: "a"**',
    'start: "a"{3,2}',
    'start: "a"~3..2',
    'start: "a"{}',
    'start: "a"~',
    'start: "a"~1..',
    'start: "a" | ("b"',
    'start: "a")',
    'start: ["a")',
    'start: "a"\n}',
    'start: "a" ;',
    'start: "a" . "b"',
    'start\n: "a"',
    'start: "a" -> foo "b"',
    'start: "a" -> "b"',
    'start: a\na: "x"\na: "y"',                 # duplicate definition
    'start: INT\n%import common.INT\n%import common.INT',
    'start: FOO\n%import common.FOO',
    'start: X\n%import other.X',
    'start: INT\n%import common',
    'start: b',                                 # undefined rule
    'start: B',                                 # undefined terminal
    'start: "a"\n%ignore Z',
    'a: "x"',                                   # no start rule
    '%import common.INT -> start',
    '',
    'start: "a\\x41"',                          # JSON escapes only
    'start: "\\ud83d"',
    'start: "a\\q"',
    'start: "a\n',
    "start: 'a'",
    'start: "λ"i',
    'start: "ab".."z"',
    'start: "a"i.."z"',
    'start: "z".."a"',
    'start: /a/m',
    'start: /a/x',
    'start: /[/]/',
    'start: "a"ii',
    'start.2: A\nA.3: "a"',
    'start: _sep{"a", ","}\n_sep{x, s}: x (s x)*',
    '%declare FOO\nstart: "a"',
    '%override start: "a"',
    '%foo\nstart: "a"',
    '%grammar_options {"foo": true}\nstart: "a"',
    '%grammar_options {"allow_initial_skip": 1}\nstart: "a"',
    '%grammar_options [1]\nstart: "a"',
    'start: %json {',
    'start: %json 5',
    'start: A\nA: %json {"type":"integer"}',
    'start: "[" %lark\n{\nstart: "x"\n}',
    'start: A\nA: %lark {\nstart: "x"\n}',
    'start: A\nA: @x',
    'start: @x',
    'start: @ x',
    '?!start: "x"',
    'start: "a" %ignore " "',
    '%import\nstart: "a"',
    'start: INT\n%import common.INT extra',
    'start: INT WS\n%import common (INT, WS,)',
    # rule attributes, checked as xgrammar checks them before xg2 refuses what it does not implement
    'start[budget=10]: "a"',
    'start[capture=""]: "a"',
    'start[capture="a b"]: "a"',
    'start[capture, capture]: "a"',
    'TOKEN[lazy]: /a/\nstart: TOKEN',
    'start: head\nhead[suffix=""]: TEXT\nTEXT: /(\\n|.)*/',
    'start: head\nhead[suffix=end]: TEXT\nTEXT: /(\\n|.)*/',
    'start: head\nhead[stop="x",stop="y"]: TEXT\nTEXT: /(\\n|.)*/',
    'start: head\nhead[stop_capture="marker"]: TEXT\nTEXT: /(\\n|.)*/',
    'start: head\nhead[stop="x", stop_capture=MARKER]: TEXT\nTEXT: /(\\n|.)*/',
    'start: head\nhead[suffix="y", stop="x"]: TEXT\nTEXT: /(\\n|.)*/',
    'start: item\nitem[suffix=/end/i]: /[a-z]*/',
    'start: head\nhead[suffix=MISSING]: TEXT\nTEXT: /(\\n|.)*/',
    'start: r\nr[stop="!"]: sub\nsub: /[a-z]*/',
    'start: thing\nthing[lazy]: "a" thing | "b"',
    'start[max_tokens=0]: "a"',
    # other forms xgrammar names
    'start::0: "a"',
    'start: foo::0',
    'start: "a" %if enabled',
    'start: A & B\nA: "a"\nB: "b"',
    'start: ~/[a]/',
    'start: -',
    'start: "a" ! "b"',
    'start: "a"{-1,}',
    'start: <bad token>',
    'start: <[1-2-3]>',
    'start: <[3-1]>',
    'start: <[,]>',
    'start: <[*,1]>',
    'start: <[^*]>',
    'start: <|tool|>',
    'start: %regex []',
    'start: %regex {"unknown":"abc"}',
    'start: %regex {}',
    'start: %regex {"substring_chars":"abc","substring_chunks":["a"]}',
    'start: %regex {"substring_chunks":["a",1]}',
    'start: %regex {"substring_words":"abc def"}',
    'start: r "z"\nr[stop="!"]: %regex {"substring_chars":"ab"}',
    '%grammar_options {"no_forcing": true}\nstart: "a"',
    '%grammar_options {"allow_invalid_utf8": true}\nstart: "a"',
]


@pytest.mark.parametrize("source", BAD)
def test_errors_match_xgrammar(source: str) -> None:
    with pytest.raises(RuntimeError) as ref:
        xgr.Grammar.from_lark(source)
    with pytest.raises(xg2.GrammarError) as ours:
        xg2.Grammar.from_lark(source)
    assert isinstance(ours.value, (RuntimeError, ValueError))
    line, column = map(int, _POSITION.search(str(ref.value)).groups())
    assert (ours.value.line, ours.value.column) == (line, column), f"{ours.value} / xgrammar: {ref.value}"
    # The message reads as xgrammar's does: the place first, then what is wrong.
    assert str(ours.value).startswith(f"Lark error at line {line}, column {column}: ")


#: Errors whose reason xgrammar's own tests look for (a fragment of its message), said in xg2's words.
WORDED = [
    ('start[budget=10]: "a"', "attribute 'budget' is not supported"),
    ('start[capture=""]: "a"', "capture name must not be empty"),
    ('start[capture="a b"]: "a"', "capture name must only contain letters, digits"),
    ('start[capture, capture]: "a"', "capture attribute is specified more than once"),
    ('TOKEN[lazy]: /a/\nstart: TOKEN', "attributes are only supported on rules"),
    ('start: head\nhead[suffix=""]: TEXT\nTEXT: /a/', "suffix must not be empty"),
    ('start: head\nhead[stop=end]: TEXT\nTEXT: /a/', "stop terminal name must be uppercase"),
    ('start: head\nhead[stop="x", suffix="y"]: TEXT\nTEXT: /a/', "suffix cannot be combined with stop"),
    ('start: head\nhead[stop_capture="m"]: TEXT\nTEXT: /a/', "stop_capture requires stop or suffix"),
    ('start: item\nitem[suffix=/end/i]: /[a-z]*/', "flag 'i' is not supported with suffix or stop attributes"),
    ('start: thing\nthing[lazy]: "a" thing | "b"', "terminal cannot reference rule"),
    ('start[max_tokens=0]: "a"', "max_tokens must be positive"),
    ('start::0: "a"', "parametric grammar is not supported"),
    ('start: "a" %if enabled', "parametric %if conditions are not supported"),
    ('start: A & B\nA: "a"\nB: "b"', "intersection '&' is not supported"),
    ("start: ~/[a]/", "complement '~' is not supported"),
    ('start: "a"{-1,}', "invalid repetition count"),
    ('start: "a"{999999999999999999999}', "invalid repetition count"),
    ("start: /[abc/", "failed to compile regular expression"),
    ("start: %json []", "failed to compile inline JSON schema"),
    ('start: %lark { item: "a" }', "failed to compile nested Lark grammar"),
    ("start: <[1-2-3]>", "invalid numeric special-token range"),
    ("start: <[,]>", "empty numeric special-token range"),
    ("start: <[0-1000001]>", "special-token range is too large"),
    ("start: <|tool|>", "named special token <|tool|> requires tokenizer_info"),
    ("start: %regex []", "%regex value must be an object"),
    ('start: %regex {"unknown":"abc"}', "unknown field 'unknown' in %regex"),
    ('start: %regex {"substring_chunks":"abc"}', "substring_chunks must be an array of strings"),
    ('%grammar_options {"no_forcing": true}\nstart: "a"', "%grammar_options option 'no_forcing' is not supported"),
    ('%grammar_options []\nstart: "a"', "%grammar_options value must be an object"),
]


@pytest.mark.parametrize("source,fragment", WORDED)
def test_errors_are_worded_like_xgrammar(source: str, fragment: str) -> None:
    with pytest.raises(RuntimeError) as ref:
        xgr.Grammar.from_lark(source)
    assert fragment in str(ref.value)
    with pytest.raises(xg2.GrammarError) as ours:
        xg2.Grammar.from_lark(source)
    assert fragment in str(ours.value)


def test_error_shows_the_line_and_a_caret() -> None:
    with pytest.raises(xg2.GrammarError) as e:
        xg2.Grammar.from_lark('# comment\r\nstart: "a"\r\nitem missing')
    assert str(e.value) == "Lark error at line 3, column 6: expected ':' after rule name\nitem missing\n     ^"
    assert (e.value.line, e.value.column, e.value.message) == (3, 6, "expected ':' after rule name")


def test_marker_rules_are_regular_rules() -> None:
    """A suffix/stop rule becomes right-linear rules of its committed language: no attribute is
    left for the matcher, and suffix and stop give the same language."""
    texts = {kind: str(xg2.Grammar.from_lark(f'start: r "c"\nr[{kind}="b"]: /[a-z]{{2,5}}/'))
             for kind in ("suffix", "stop")}
    assert "[" not in texts["stop"].split("::=")[0]
    m = xg2.GrammarMatcher(_compiler(xg2).compile_grammar(xg2.Grammar.from_lark(
        'start: r "c"\nr[stop="b"]: /[a-z]{2,5}/')))
    assert m.accept_string("abbc") and m.is_completed()
    assert texts["suffix"].replace("suffix", "stop") == texts["stop"]


def test_large_structured_regex() -> None:
    source = "".join(chr(0x1000 + i) for i in range(4000))
    g = xg2.Grammar.from_lark(f'start: %regex {{"substring_chars":"{source}"}}')
    m = xg2.GrammarMatcher(_compiler(xg2).compile_grammar(g))
    assert m.accept_string(source[50:100]) and m.is_completed()
    assert not m.accept_string("x")


def test_marker_automaton_is_bounded() -> None:
    with pytest.raises(xg2.GrammarLimitError) as e:
        xg2.Grammar.from_lark('start: r\nr[stop="!"]: /(a|b)*a(a|b){12}/')
    assert e.value.line == 2


#: Both refuse, but xg2 names another place: (source, xg2's line and column, why).
BAD_ELSEWHERE = [
    # xgrammar points at the start of the definition; xg2 at the reference to the rule.
    ('start: A\nA: a\na: "x"', (2, 4), "the offending reference"),
    # xgrammar points at the definition closing the cycle; xg2 at the reference that closes it.
    ('start: A\nA: B\nB: A', (3, 4), "the reference that closes the cycle"),
    ('start: A\nA: "x" A?', (2, 8), "the reference that closes the cycle"),
    # xgrammar points at the count after the second `~`; xg2 at the quantifier that cannot follow.
    ('start: "a"~2~3', (1, 13), "the second quantifier"),
]


@pytest.mark.parametrize("source,where,why", BAD_ELSEWHERE)
def test_errors_at_a_more_precise_place(source: str, where: tuple[int, int], why: str) -> None:
    with pytest.raises(RuntimeError):
        xgr.Grammar.from_lark(source)
    with pytest.raises(xg2.GrammarError) as ours:
        xg2.Grammar.from_lark(source)
    assert (ours.value.line, ours.value.column) == where, why


@pytest.mark.parametrize("source,fragment,why", REFUSED)
def test_refused_constructs(source: str, fragment: str, why: str) -> None:
    """xgrammar accepts these (with a vocabulary for named special tokens); xg2 cannot build
    them honestly and says so, naming the construct and its place."""
    info = xgr.TokenizerInfo(["a", "<|tool|>", "b"])
    xgr.Grammar.from_lark(source, tokenizer_info=info)
    with pytest.raises(xg2.GrammarError, match=fragment) as ours:
        xg2.Grammar.from_lark(source, tokenizer_info=xg2.TokenizerInfo(["a", "<|tool|>", "b"]))
    assert ours.value.line is not None and ours.value.column is not None, why


@pytest.mark.parametrize("pattern,text,ours,why", [
    (r"[\^a]", "b", False, "xgrammar reads an escaped caret first in a class as negation: [^a]"),
    (r"a\0b", "a\0b", True, "xgrammar drops the NUL character of \\0 (the pattern becomes ab)"),
])
def test_regex_bugs_not_copied(pattern: str, text: str, ours: bool, why: str) -> None:
    """Deliberate differences: xgrammar 0.2.8 misreads these regexes; xg2 reads them as Python
    and ECMAScript do."""
    def judge(module):
        m = module.GrammarMatcher(_compiler(module).compile_grammar(module.Grammar.from_lark(f"start: /{pattern}/")))
        return m.accept_string(text) and m.is_completed()
    assert (judge(xg2), judge(xgr)) == (ours, not ours), why


def _special_token_engines(vocab: list[bytes], source: str, size: int, specials: list[int], stop: int) -> list:
    engines = []
    for module, extra in ((xgr, {}), (xg2, {"special_token_ids": specials})):
        info = module.TokenizerInfo(vocab, module.VocabType.RAW, vocab_size=size, stop_token_ids=[stop], **extra)
        engines.append((module.GrammarMatcher(module.GrammarCompiler(info).compile_lark(source)),
                        module.allocate_token_bitmask(1, size)))
    return engines


def _masks(engines: list, size: int) -> list[np.ndarray]:
    out = []
    for m, mask in engines:
        m.fill_next_token_bitmask(mask, 0)
        arr = np.asarray(mask.numpy() if hasattr(mask, "numpy") else mask)
        out.append(np.unpackbits(arr.reshape(-1).view(np.uint8), bitorder="little")[:size].astype(bool))
    return out


def test_special_tokens_match_xgrammar() -> None:
    """A vocabulary's special tokens, named by text or id, compared mask by mask. xg2 requires
    them to be special tokens of its TokenizerInfo (xgrammar 0.2.8 has no such notion for a
    vocabulary given as a list, and requires any token by id). The single bytes are ASCII only
    here: see test_special_token_spelled_by_bytes for the others."""
    vocab = ENCODED[:128] + [bytes([b]) for b in range(128, 256) if b != 0xED] + ENCODED[256:]
    vocab += [b"<|tool|>", b"<|x|>"]
    tool, x = len(vocab) - 2, len(vocab) - 1
    stop = vocab.index(b"</s>")
    size = len(vocab) + 3
    source = f'%ignore " "\nstart: "a" <|tool|> ("b" | <[{x}]>) <[{tool},{x}]>~2 "c"'
    engines = _special_token_engines(vocab, source, size, [tool, x], stop)
    for token in [ord("a"), ord(" "), tool, x, ord(" "), tool, tool, ord("c"), ord(" "), stop]:
        masks = _masks(engines, size)
        assert (masks[0] == masks[1]).all(), f"masks differ before token {token}: {np.flatnonzero(masks[0] ^ masks[1])}"
        assert [m.accept_token(token) for m, _ in engines] == [True, True]
    with pytest.raises(xg2.GrammarError, match="tokenizer_info"):
        xg2.Grammar.from_lark("start: <|tool|>")


def test_special_token_spelled_by_bytes() -> None:
    """Where the grammar requires a special token, no ordinary token may start spelling it: its
    stand-in character is read behind a byte no ordinary token holds (ir.text_bytes; it used to be
    a surrogate's UTF-8, ED A0 80, which the byte token 0xED could begin)."""
    vocab = [*ENCODED, b"<|tool|>"]
    tool = len(vocab) - 1
    size = len(vocab) + 3
    engines = _special_token_engines(vocab, 'start: "a" <|tool|>', size, [tool], STOP)
    for m, _ in engines:
        assert m.accept_token(ord("a"))
    masks = _masks(engines, size)
    assert not masks[1][0xED], "xg2 allows the byte token 0xED where only the special token may come"


def test_braced_hex_escape_refused() -> None:
    """Deliberate difference: xgrammar 0.2.8 reads `/\\x{41}/` as `x{41}` (41 letters x) and fails
    on `[\\x{41}-\\x{43}]`; llguidance, whose dialect it follows, means the code point U+0041. xg2
    refuses the escape rather than guess."""
    assert str(xgr.Grammar.from_lark(r"start: /\x{3}/")).count("{3, 3}") == 1
    with pytest.raises(xg2.GrammarError, match="hexadecimal digits") as ours:
        xg2.Grammar.from_lark(r"start: /\x{3}/")
    assert (ours.value.line, ours.value.column) == (1, 9)


def test_regex_errors_point_into_the_grammar() -> None:
    """A regex xg2's regex front-end refuses (a backreference, which xgrammar refuses too) is
    reported at its place in the Lark text."""
    with pytest.raises(RuntimeError):
        xgr.Grammar.from_lark('start: "x"\n  | /(a)\\1/')
    with pytest.raises(xg2.GrammarError, match="(?i)backreference") as ours:
        xg2.Grammar.from_lark('start: "x"\n  | /(a)\\1/')
    assert (ours.value.line, ours.value.column) == (2, 9)


def test_deep_nesting_is_a_limit_error() -> None:
    deep = "start: " + "(" * (MAX_NESTING_DEPTH + 5) + '"a"' + ")" * (MAX_NESTING_DEPTH + 5)
    with pytest.raises(xg2.GrammarLimitError) as e:
        xg2.Grammar.from_lark(deep)
    assert e.value.line == 1
    deep = "start: " + "[" * 100_000
    with pytest.raises(xg2.GrammarLimitError):
        xg2.Grammar.from_lark(deep)
    nested = "start: " + "%lark {\nstart: " * (MAX_LARK_NESTING + 2) + '"x"' + "\n}" * (MAX_LARK_NESTING + 2)
    with pytest.raises(xg2.GrammarLimitError):
        xg2.Grammar.from_lark(nested)
    chain = {f"g{i}": f"start: @g{i + 1}" for i in range(200)}
    chain["g200"] = 'start: "x"'
    with pytest.raises(xg2.GrammarLimitError):
        xg2.Grammar.from_lark("start: @g0", named_grammars=chain)
    with pytest.raises(xg2.GrammarLimitError):
        xg2.Grammar.from_lark('start: %json ' + "[" * 5000 + "]" * 5000)
    with pytest.raises(xg2.GrammarLimitError):
        xg2.Grammar.from_lark('start: "a"{100001}')


def test_undefined_names_and_circular_named_grammars() -> None:
    for source, name in [('start: a\na: b "x"', "b"), ('start: "x"\n%ignore Q', "Q"),
                         ('start: A\nA: "x" Q', "Q"), ('start: %lark {\nstart: q\n}', "q")]:
        with pytest.raises(xg2.GrammarError, match=f"unknown name '{name}'"):
            xg2.Grammar.from_lark(source)
    with pytest.raises(xg2.GrammarError, match="circular named grammar reference: @x -> @y -> @x"):
        xg2.Grammar.from_lark("start: @x", named_grammars={"x": "start: @y", "y": "start: @x"})
    with pytest.raises(xg2.GrammarError, match="unknown named grammar '@z'") as e:
        xg2.Grammar.from_lark('start: "a" @z')
    assert (e.value.line, e.value.column) == (1, 12)
    with pytest.raises(xg2.GrammarError, match="Invalid named grammar name"):
        xg2.Grammar.from_lark('start: "a"', named_grammars={"b d": 'start: "x"'})


def test_garbage_never_crashes() -> None:
    """Random byte soup and truncations of corpus grammars raise GrammarError or give a grammar."""
    rng = np.random.default_rng(7)
    pieces = ['start', ':', '"a"', '/x/', '(', ')', '[', ']', '|', '*', '~', '2', '..', '{', '}', ',', '%json',
              '%lark', '%ignore', '%import', 'common.INT', '->', '\n', ' ', 'A', '@n', '<', '>', '"\\', '/', '#']
    sources = ["".join(rng.choice(pieces, size=rng.integers(1, 25))) for _ in range(400)]
    sources += [c[1][:k] for c in CORPUS for k in range(0, len(c[1]), 7)]
    for source in sources:
        try:
            xg2.Grammar.from_lark(source, named_grammars={"n": 'start: "q"'})
        except xg2.GrammarError:
            pass


@pytest.mark.parametrize("source", ["start: <[0,2]> | <|tool|>", "start: <[0-2,1-3,3]>", "start: <[^1,3]>",
                                    "start: <[*]>", "start: <[0]> <[2-3]>", 'start: "a" <|tool|>+ "b"',
                                    "start: (<[^0]> | <[0]> <[1]>)*"])
def test_special_tokens_by_id_and_text_agree(source: str) -> None:
    """`<[ids]>`, `<[^ids]>`, `<[*]>` and `<text>` are token edges: one token by id (or by its
    exact text), whatever its text; masks and accept_token as in xgrammar at every step of every
    sequence of up to 3 tokens."""
    import itertools

    vocab = ["a", "<|tool|>", "b", "ab", "c"]
    infos = [module.TokenizerInfo(vocab, stop_token_ids=[4]) for module in (xgr, xg2)]
    pair = [module.GrammarCompiler(info).compile_grammar(module.Grammar.from_lark(source, tokenizer_info=info))
            for module, info in zip((xgr, xg2), infos)]

    def allowed(module, m) -> list[int]:
        bm = module.allocate_token_bitmask(1, len(vocab))
        m.fill_next_token_bitmask(bm)
        return [i for i in range(len(vocab)) if (int(bm[0, i // 32]) >> (i % 32)) & 1]

    for path in itertools.product(range(len(vocab)), repeat=3):
        ms = [module.GrammarMatcher(g) for module, g in zip((xgr, xg2), pair)]
        for t in path:
            assert allowed(xg2, ms[1]) == allowed(xgr, ms[0]), (source, path, t)
            ok = [m.accept_token(t) for m in ms]
            assert ok[1] == ok[0], (source, path, t)
            if not ok[0] or ms[0].is_terminated():
                break


@pytest.mark.parametrize("source", ['start: head "!"\nhead[lazy]: TEXT* "<end>"\nTEXT: /[a-z]/',
                                    'start: head "!"\nhead[lazy]: AB+ "<end>"\nAB: "a" | "b"',
                                    'start: head "!"\nhead[lazy]: ("a"|"b")* "<end>"',
                                    'start: (head ";")+\nhead[lazy]: /[ab]+c+/'])
def test_lazy_rules_commit_at_the_shortest_match(source: str) -> None:
    """`rule[lazy]` on a terminal-like body ends at the body's first end (committed, as xgrammar):
    every string of up to 6 characters over the grammar's alphabet is judged alike."""
    pair = [module.GrammarCompiler(module.TokenizerInfo([])).compile_grammar(module.Grammar.from_lark(source))
            for module in (xgr, xg2)]
    for n in range(7):
        for text in map("".join, itertools.product(["a", "b", "c", "<end>", "!", ";"], repeat=n)):
            ref, ours = (module.GrammarMatcher(g) for module, g in zip((xgr, xg2), pair))
            assert ours.accept_string(text) == ref.accept_string(text), (source, text)
            assert ours.is_completed() == ref.is_completed(), (source, text)


DISPATCH_GRAMMARS = [
    (('start: tool* tail\ntail: TEXT\ntool_head[lazy]: TEXT "<t>"\ntool: tool_head %json {"type": "integer"} "</t>"\n'
     'TEXT: /(\\n|.)*/'), ["a", "<t>", "12", "</t>", "<t", "x"]),
    (('start: (foo | bar)* tail\ntail: TEXT\nfoo_head[lazy]: TEXT "<f"\nfoo: foo_head "=a>" /[a-z]+/ "</f>"\n'
     'bar_head[lazy]: TEXT "<f"\nbar: bar_head "=b>" /[0-9]+/ "</f>"\nTEXT: /(\\n|.)*/'),
     ["<f", "=a>", "=b>", "x", "1", "</f>"]),
    ('start: tool* tail\ntail: TEXT\nhead[lazy]: /(\\n|.)*<c>/\ntool: head /[0-9]+/ "</c>"\nTEXT: /(\\n|.)*/',
     ["<c>", "1", "</c>", "z", "<c"]),
    (('start: tool* tail\ntail: FREE\nhead[suffix="<t>"]: FREE\ntool: head /[a-z]+/ "</t>"\nFREE: TEXT\n'
     'TEXT: /(\\n|.)*/'), ["<t>", "ab", "</t>", "1", "<"]),
]


@pytest.mark.parametrize("source, pieces", DISPATCH_GRAMMARS)
def test_tool_call_dispatch_agrees(source: str, pieces: list[str]) -> None:
    """xgrammar's dynamic tool-call dispatch (`(tool | ...)* tail` with lazy or marker heads over
    any text), read as a TagDispatch: every concatenation of up to 4 pieces is judged alike, as a
    prefix and as a whole."""
    pair = [module.GrammarCompiler(module.TokenizerInfo([])).compile_grammar(module.Grammar.from_lark(source))
            for module in (xgr, xg2)]
    for n in range(5):
        for parts in itertools.product(pieces, repeat=n):
            text = "".join(parts)
            ref, ours = (module.GrammarMatcher(g) for module, g in zip((xgr, xg2), pair))
            assert ours.accept_string(text) == ref.accept_string(text), (source, text)
            assert ours.is_completed() == ref.is_completed(), (source, text)


MARKER_CAPTURES = [
    ('start[capture="outer"]: r "z"\nr[capture="inner", suffix="!"]: /[a-z]*/', ["xy!z", "!z"]),
    ('start[capture="outer"]: r "z"\nr[capture="inner", stop="!"]: /[a-z]*/', ["xy!z"]),
    ('start[capture="outer"]: r "z"\nr[capture="inner", stop="💥"]: /[a-z]*/', ["xy💥z"]),
    ('start[capture="outer"]: item item "z"\nitem[stop="!"]: /[ab]*/', ["a!b!z", "!!z"]),
    ('start[capture="outer"]: item item "z"\nitem[suffix="!"]: /[ab]*/', ["a!b!z"]),
    ('start: a | c\na[capture="a"]: b "q"\nb[stop="!"]: "x"\nc[capture="c"]: "x!"', ["x!", "x!q"]),
    ('start[capture="outer"]: r "z"\nr[capture="inner", lazy, stop="!"]: /[ab]*/', ["a!z"]),
    ('start[capture="outer"]: r "z"\nr[capture="inner", stop="<e>", stop_capture="m"]: /[a-z]*/', ["ab<e>z"]),
    ('start: r "z"\nr[suffix="!!", stop_capture="marker"]: /[ab]*/', ["ab!!z", "!!z"]),
]


@pytest.mark.parametrize("source, texts", MARKER_CAPTURES)
def test_marker_captures_agree(source: str, texts: list[str]) -> None:
    """Captures around suffix/stop rules with a fixed marker: a rule's own capture leaves its
    marker out, a stop marker is left out of every capture it lies inside (not of captures on
    other parse branches), and `stop_capture` records the marker itself; get_captures after each
    character, raw and deduplicated, as xgrammar."""
    pair = [module.GrammarCompiler(module.TokenizerInfo([])).compile_grammar(module.Grammar.from_lark(source))
            for module in (xgr, xg2)]
    for text in texts:
        ms = [module.GrammarMatcher(g, terminate_without_stop_token=True) for module, g in zip((xgr, xg2), pair)]
        for ch in text:
            oks = [m.accept_string(ch) for m in ms]
            assert oks[1] == oks[0], (source, text, ch)
            if not oks[0]:
                break
            for dedup in (True, False):
                assert ms[1].get_captures(deduplicate=dedup) == ms[0].get_captures(deduplicate=dedup), \
                    (source, text, ch, dedup)


def test_a_varying_marker_cannot_be_captured_around() -> None:
    for source in ['start: r "z"\nr[capture, suffix=/!+/]: /[a-z]*/',
                   'start[capture]: r "z"\nr[stop=/!+/]: /[a-z]*/']:
        with pytest.raises(xg2.GrammarError, match="not a fixed string"):
            xg2.Grammar.from_lark(source)


@pytest.mark.parametrize("source", ['start: r "!"\nr[max_chars=2, suffix=">"]: TEXT\nTEXT: /(\\n|.)*/',
                                    'start: r "!"\nr[max_chars=2, suffix=">"]: /[a-z]*/'])
def test_marker_rules_with_a_char_budget_agree(source: str) -> None:
    """`r[max_chars=n, suffix=M]`: the marker within the budget, or, once the budget is spent
    before it, the rule ends without it where its body could (any text: anywhere); every string
    of up to 5 characters as xgrammar, for one-character markers. (A longer marker that the budget
    runs out inside: xgrammar lets it finish past the budget, xg2's budget stays strict; a stop
    rule's budget leaves its marker out: refused yet.)"""
    pair = [module.GrammarCompiler(module.TokenizerInfo([])).compile_grammar(module.Grammar.from_lark(source))
            for module in (xgr, xg2)]
    for n in range(6):
        for text in map("".join, itertools.product("ab<>!", repeat=n)):
            ref, ours = (module.GrammarMatcher(g) for module, g in zip((xgr, xg2), pair))
            assert (ours.accept_string(text) and ours.is_completed()) == (ref.accept_string(text)
                                                                           and ref.is_completed()), (source, text)


def test_every_combination_of_rule_attributes_builds_or_is_refused() -> None:
    """No combination of up to three rule attributes, on a regular body, on any text or on a rule
    reference, crashes: each builds (and compiles) or raises a located GrammarError."""
    attrs = ["lazy", "capture", 'capture="x"', "max_tokens=2", "max_chars=2", "temperature=0.5", 'suffix="!"',
             'stop="!"', "suffix=/!+/", 'stop_capture="m"']
    bodies = ["/[ab]+/", "TEXT", '"a" s']
    info = xg2.TokenizerInfo(["a", "b", "!", "z"])
    compiler = xg2.GrammarCompiler(info)
    for k in (1, 2, 3):
        for combo in itertools.combinations(attrs, k):
            for body in bodies:
                src = f'start: r "z"\nr[{", ".join(combo)}]: {body}\ns: "b"\nTEXT: /(\\n|.)*/'
                try:
                    compiler.compile_grammar(xg2.Grammar.from_lark(src, tokenizer_info=info))
                except xg2.GrammarError as e:
                    assert e.line is not None, src
