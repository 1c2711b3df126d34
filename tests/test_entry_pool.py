"""The cross-grammar entry pool and the content keys behind it: equal structures share entries,
different ones never do, and every mask stays the one of an engine with every optimisation off."""

from __future__ import annotations

import itertools
import json
import random
import threading
from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED

import xg2
from xg2.grammar.ebnf import parse_ebnf
from xg2.grammar.hashing import grammar_keys
from xg2.grammar.repetition import REPEAT_THRESHOLD
from xg2.lowering import lower

REGISTRY = SHARED / "data" / "tools" / "registry.jsonl"


def reference_compiler(info):
    """Every optimisation off: no pool, every entry built at compile time, repetitions unrolled."""
    return xg2.GrammarCompiler(info, cache_enabled=False, cross_grammar_cache=False, jit=False,
                               repetition_compression=False)


def unpack(bitmask, n):
    return np.unpackbits(np.asarray(bitmask)[0].astype("<i4").view(np.uint8), bitorder="little")[:n].astype(bool)


def assert_same_walks(info, a, b, seed=0, walks=3, steps=60):
    """Random walks through `a` and `b` side by side: the masks must agree at every step."""
    rng = random.Random(seed)
    ba = xg2.allocate_token_bitmask(1, info.vocab_size)
    bb = xg2.allocate_token_bitmask(1, info.vocab_size)
    stops = set(info.stop_token_ids)
    for _ in range(walks):
        ma, mb = xg2.GrammarMatcher(a), xg2.GrammarMatcher(b)
        for step in range(steps):
            ma.fill_next_token_bitmask(ba)
            mb.fill_next_token_bitmask(bb)
            got, want = unpack(ba, info.vocab_size), unpack(bb, info.vocab_size)
            diff = np.nonzero(got != want)[0]
            assert diff.size == 0, (step, [(int(t), info.decoded_vocab[t], bool(got[t])) for t in diff[:8]])
            allowed = [int(t) for t in np.nonzero(got)[0] if t not in stops]
            if not allowed:
                break
            t = rng.choice(allowed)
            assert ma.accept_token(t) and mb.accept_token(t)


def keys_of(ebnf: str) -> dict[str, tuple[bytes, bytes]]:
    lowered = lower(parse_ebnf(ebnf))
    keys = grammar_keys(lowered.fsms, lowered.root)
    return {name: (keys.rule[i], keys.ctx[i]) for i, name in enumerate(lowered.rule_names)}


# --- keys ----------------------------------------------------------------------------------------

def test_renamed_and_reordered_rules_hash_equal():
    a = keys_of('root ::= "<" list ">"\nlist ::= item ("," item)*\nitem ::= [0-9]+ | "(" list ")"')
    b = keys_of('root ::= "<" xs ">"\nn ::= "(" xs ")" | [0-9]+\nxs ::= n ("," n)*')
    assert a["list"] == b["xs"] and a["item"] == b["n"] and a["root"] == b["root"]


def test_front_ends_agree_on_equal_automata():
    regex = xg2.Grammar.from_regex("[a-f0-9]{2,5}-x")
    lowered = lower(regex.ir)
    from_regex = grammar_keys(lowered.fsms, lowered.root).rule[lowered.root]
    ebnf = keys_of('root ::= [0-9a-f] [a-f0-9] [0-9a-f]? [0-9a-f]? [0-9a-f]? "-x"')
    assert ebnf["root"][0] == from_regex


def test_cycle_members_keys_cover_the_whole_cycle():
    # Same shapes, other wiring: "a" calls b in both, but b calls c in one and a in the other.
    one = keys_of('root ::= a\na ::= "x" b | "y"\nb ::= "z" c | "w"\nc ::= "z" a | "w"')
    two = keys_of('root ::= a\na ::= "x" b | "y"\nb ::= "z" a | "w"\nc ::= "z" b | "w"')
    assert one["a"][0] != two["a"][0]


def test_contexts_follow_what_comes_next():
    w = '\nw ::= [a-z]+ | "(" w ")"'     # recursive, so never inlined
    a = keys_of('root ::= w "." w ";"' + w)
    b = keys_of('root ::= "x" w "." w ";"' + w)
    c = keys_of('root ::= w "!"' + w)
    assert a["w"] == b["w"]                 # same rule, same followers: a perfect hit
    assert a["w"][0] == c["w"][0] and a["w"][1] != c["w"][1]   # same rule, other lookahead


def _random_grammar(rng: random.Random) -> str:
    names = ["r0", "r1", "r2", "r3"][: rng.randint(2, 4)]

    def expr(depth: int) -> str:
        roll = rng.random()
        if depth > 2 or roll < 0.35:
            return rng.choice(['"a"', '"b"', '"ab"', "[ab]", '""'])
        if roll < 0.55:
            return rng.choice(names)
        if roll < 0.75:
            return f"{expr(depth + 1)} {expr(depth + 1)}"
        if roll < 0.9:
            return f"({expr(depth + 1)} | {expr(depth + 1)})"
        return f"({expr(depth + 1)}){rng.choice('*+?')}"

    # Every rule calls another one, so that few are small call-free rules that get inlined.
    rules = [f"{n} ::= {expr(1)} {rng.choice(names)} {expr(2)} | {rng.choice(['a', 'b'])!r}".replace("'", '"')
             for n in names]
    return "root ::= r0\n" + "\n".join(rules)


def _language(compiler, ebnf: str, rule: str, strings: list[str]) -> tuple[bool, ...]:
    text = ebnf.replace("root ::= r0", f"root ::= {rule}")
    compiled = compiler.compile_grammar(text)
    out = []
    for s in strings:
        m = xg2.GrammarMatcher(compiled)
        out.append(m.accept_string(s) and m.is_completed())
    return tuple(out)


def test_equal_keys_mean_equal_languages_in_a_random_corpus(small_info):
    """Over random grammars with recursion, rules with equal keys accept the same strings (up to
    length 5), and equal keys only occur for equal canonical automata."""
    rng = random.Random(7)
    strings = ["".join(p) for n in range(6) for p in itertools.product("ab", repeat=n)]
    compiler = xg2.GrammarCompiler(small_info, precompute_budget_ms=0)
    by_key: dict[bytes, tuple[str, str]] = {}
    n_keys = n_shared = 0
    for _ in range(300):
        text = _random_grammar(rng)
        try:
            lowered = lower(parse_ebnf(text))
        except xg2.GrammarError:
            continue
        keys = grammar_keys(lowered.fsms, lowered.root)
        for i, name in enumerate(lowered.rule_names):
            if name == "root" or not name.startswith("r"):
                continue
            n_keys += 1
            seen = by_key.setdefault(keys.rule[i], (text, name))
            if seen != (text, name):
                n_shared += 1
                assert _language(compiler, text, name, strings) == _language(compiler, *seen, strings), \
                    (text, name, seen)
    assert n_keys > 200 and n_shared > 10     # the corpus does exercise equal keys


# --- sharing and exactness -----------------------------------------------------------------------

def test_grammars_share_entries_and_masks_stay_exact(small_info):
    compiler = xg2.GrammarCompiler(small_info, precompute_budget_ms=0)
    reference = reference_compiler(small_info)
    one = 'root ::= "{" pair ("," pair)* "}"\npair ::= key ":" val\nkey ::= [a-z]+\nval ::= [0-9]+ | "(" key ")"'
    two = 'root ::= "{" p ("," p)* "}"\nval ::= "(" k ")" | [0-9]+\np ::= k ":" val\nk ::= [a-z]+'
    a = compiler.compile_grammar(one)
    assert_same_walks(small_info, a, reference.compile_grammar(one))
    before = compiler.cache_stats()
    b = compiler.compile_grammar(two)
    assert_same_walks(small_info, b, reference.compile_grammar(two))
    after = compiler.cache_stats()
    assert after["hits"] > before["hits"] and after["misses"] == before["misses"]


def test_partial_hits_give_the_masks_of_a_fresh_compile(small_info):
    compiler = xg2.GrammarCompiler(small_info, precompute_budget_ms=0)
    reference = reference_compiler(small_info)
    word = '\nw ::= [a-z]+ ("-" [a-z]+)* | "(" w ")"\n'
    texts = ['root ::= (w " ")* w "."' + word, 'root ::= "<" w ("," w)* ">"' + word,
             'root ::= w ":" [0-9]+' + word, 'root ::= ("ab" | w) "))"' + word]
    for seed, text in enumerate(texts):
        assert_same_walks(small_info, compiler.compile_grammar(text), reference.compile_grammar(text), seed=seed)
    assert compiler.cache_stats()["partial_hits"] > 0


def test_tool_envelopes_share_entries_on_a_real_vocabulary(deepseek_info):
    if not REGISTRY.exists():
        pytest.skip(f"{REGISTRY} not found: the tool registry lives in ../shared beside the checkout")
    tools = [json.loads(line)["function"] for line in REGISTRY.open()][:4]
    compiler = xg2.GrammarCompiler(deepseek_info, precompute_budget_ms=0)
    reference = xg2.GrammarCompiler(deepseek_info, cache_enabled=False, cross_grammar_cache=False)
    for seed, pick in enumerate([tools[:3], tools[1:][::-1], [tools[2], tools[0]]]):   # other sets, same tools
        schema = {"anyOf": [{"type": "object", "properties": {"name": {"const": t["name"]},
                                                              "arguments": t["parameters"]},
                             "required": ["name", "arguments"], "additionalProperties": False} for t in pick]}
        assert_same_walks(deepseek_info, compiler.compile_json_schema(schema, lenient=True),
                          reference.compile_json_schema(schema, lenient=True), seed=seed, walks=3, steps=60)
    assert compiler.cache_stats()["hits"] > 0


def test_eviction_under_a_small_budget_keeps_masks_exact(small_info):
    limit = 3000      # below one grammar's working memory: grammars go at once, then entries
    compiler = xg2.GrammarCompiler(small_info, precompute_budget_ms=0, cache_limit_bytes=limit)
    reference = reference_compiler(small_info)
    for k in range(6):
        text = f'root ::= "{k}" (w " ")* w "."\nw ::= [a-z]{{1,{k + 2}}} | "(" w ")"'
        assert_same_walks(small_info, compiler.compile_grammar(text), reference.compile_grammar(text), seed=k)
        assert compiler.get_cache_size_bytes() <= limit
    assert compiler.cache_stats()["evictions"] > 0


def test_entries_travel_as_bytes(small_info):
    text = 'root ::= "[" (v ("," v)*)? "]"\nv ::= [0-9]+ | "\\"" [a-z]* "\\"" | root'
    one = xg2.GrammarCompiler(small_info, jit=False)
    one.compile_grammar(text)
    pool = one.entry_pool
    two = xg2.GrammarCompiler(small_info, precompute_budget_ms=0)
    for key in pool.keys():  # noqa: SIM118 - a pool, not a dict
        two.entry_pool.load(key, pool.dump(key))
    assert two.get_cache_size_bytes() == pool.nbytes
    compiled = two.compile_grammar(text)
    assert_same_walks(small_info, compiled, reference_compiler(small_info).compile_grammar(text))
    assert two.cache_stats()["misses"] == 0 and two.cache_stats()["hits"] > 0

    key = pool.keys()[0]
    data = pool.dump(key)
    for bad in (data[:20], b"XXXX" + data[4:], data + b"\0\0\0\0"):
        with pytest.raises(ValueError):
            two.entry_pool.load(key, bad)
    with pytest.raises(ValueError):
        two.entry_pool.load(key[:10], data)
    stop = small_info.stop_token_ids[0]          # well-formed, but it would let a stop token through
    forged = np.array([0x45324758, 0, 1, 0, 0, 0, 0, 0, stop], "<i4").tobytes()
    with pytest.raises(ValueError, match="not ordinary"):
        two.entry_pool.load(key, forged)


def test_grammars_keep_their_entries_when_the_pool_drops_them(small_info):
    """Entries are shared by reference: a pool cleared (or evicting) under a live grammar leaves
    that grammar's entries intact, and the next grammar builds them again."""
    text = 'root ::= "{" (k ":" v ("," k ":" v)*)? "}"\nk ::= "\\"" [a-z]+ "\\""\nv ::= [0-9]+ | k | root'
    compiler = xg2.GrammarCompiler(small_info, precompute_budget_ms=0)
    first = compiler.compile_grammar(text)
    reference = reference_compiler(small_info).compile_grammar(text)
    assert_same_walks(small_info, first, reference, seed=1)
    pool = compiler.entry_pool
    assert len(pool) > 0 and len(pool.keys()) == len(pool)
    pool.clear()
    assert len(pool) == 0 and pool.nbytes == 0 and pool.keys() == []
    assert pool.dump(b"\0" * 36) is None
    assert_same_walks(small_info, first, reference, seed=2)      # its own entries, still alive
    compiler.clear_cache()
    before = compiler.cache_stats()["misses"]
    assert_same_walks(small_info, compiler.compile_grammar(text), reference, seed=3)
    assert compiler.cache_stats()["misses"] > before and len(pool) > 0


def test_threads_share_one_pool(small_info):
    compiler = xg2.GrammarCompiler(small_info, precompute_budget_ms=0)
    reference = reference_compiler(small_info)
    texts = [f'root ::= "{k}" w ";" [0-9]{{0,{k + 1}}}\nw ::= [a-z]+ | "(" w ")"' for k in range(8)]
    wanted = [reference.compile_grammar(t) for t in texts]
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for j in range(3):
                i = (k + j) % len(texts)
                assert_same_walks(small_info, compiler.compile_grammar(texts[i]), wanted[i], seed=k * 10 + j,
                                  walks=2, steps=30)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    stats = compiler.cache_stats()
    assert stats["hits"] + stats["partial_hits"] > 0


# --- partial JIT and repetition compression ------------------------------------------------------

def test_precompute_top_k_and_background(small_info):
    text = 'root ::= (a | b | c)+\na ::= "x" [0-9]+\nb ::= "y" [a-z]+ "."\nc ::= "(" root ")"'
    k1 = xg2.GrammarCompiler(small_info, precompute_top_k=1, cross_grammar_cache=False,
                             background_precompute=False).compile_grammar(text)
    k3 = xg2.GrammarCompiler(small_info, precompute_top_k=3, cross_grammar_cache=False,
                             background_precompute=False).compile_grammar(text)
    assert k3._core.n_entries == k1._core.n_entries + 2
    bg = xg2.GrammarCompiler(small_info, background_precompute=True, precompute_budget_ms=1000).compile_grammar(text)
    assert bg._precomputed.wait(60)
    assert bg._core.n_entries > k1._core.n_entries
    assert_same_walks(small_info, bg, reference_compiler(small_info).compile_grammar(text))


CORPUS = Path(__file__).resolve().parents[1] / "benchmarks" / "grammars"


@pytest.mark.parametrize("name", ["sexpr", "nullable", "unicode", "markdown_outline"])
def test_class_trie_built_in_the_background_keeps_the_masks(deepseek_info, name):
    """A grammar whose class trie the compiler had not built starts on the byte trie and changes
    over when the background precompute has built it: the masks along random walks are those of
    a grammar that walked the class trie from the start, and of the reference."""
    text = (CORPUS / f"{name}.ebnf").read_text(encoding="utf-8")
    late = xg2.GrammarCompiler(deepseek_info).compile_grammar(text)
    early = xg2.GrammarCompiler(deepseek_info, background_precompute=False).compile_grammar(text)
    assert_same_walks(deepseek_info, late, early, seed=3, walks=2, steps=40)
    assert late._precomputed.wait(30)
    assert (late._core.class_trie is None) == (early._core.class_trie is None)
    assert_same_walks(deepseek_info, late, reference_compiler(deepseek_info).compile_grammar(text), seed=4,
                      walks=2, steps=40)


@pytest.mark.parametrize(("m", "n"), [(0, 10 * REPEAT_THRESHOLD + 5), (REPEAT_THRESHOLD - 1, 12 * REPEAT_THRESHOLD + 1),
                                      (7 * REPEAT_THRESHOLD + 1, 11 * REPEAT_THRESHOLD)])
def test_compressed_repetitions_mask_like_unrolled_ones(small_info, m, n):
    text = f'root ::= "<" ("x" | "yz"){{{m},{n}}} ">"'
    compressed = xg2.GrammarCompiler(small_info).compile_grammar(text)
    unrolled = reference_compiler(small_info).compile_grammar(text)
    assert compressed._lowered.n_nodes < unrolled._lowered.n_nodes
    bitmask = xg2.allocate_token_bitmask(1, small_info.vocab_size)
    other = xg2.allocate_token_bitmask(1, small_info.vocab_size)
    a, b = xg2.GrammarMatcher(compressed), xg2.GrammarMatcher(unrolled)
    assert a.accept_string("<") and b.accept_string("<")
    for count in range(n + 1):      # every count, the edges m-1, m, n and n+1 among them
        a.fill_next_token_bitmask(bitmask)
        b.fill_next_token_bitmask(other)
        assert np.array_equal(np.asarray(bitmask), np.asarray(other)), count
        ch = "x" if count % 3 else "yz"
        assert a.accept_string(ch) == b.accept_string(ch) == (count < n), count


def test_long_string_masks_like_unrolled_on_the_real_vocabulary(deepseek_info):
    """A bounded JSON string walked to the counts around its compressed part and its bounds (words,
    CJK, escapes; DeepSeek-V3 tokens): every mask equals the unrolled grammar's."""
    n, t = 2 * REPEAT_THRESHOLD + 37, REPEAT_THRESHOLD
    schema = {"type": "object", "properties": {"s": {"type": "string", "minLength": 3, "maxLength": n}},
              "required": ["s"]}
    fast = xg2.GrammarCompiler(deepseek_info, precompute_budget_ms=0).compile_json_schema(schema)
    slow = xg2.GrammarCompiler(deepseek_info, precompute_budget_ms=0, cache_enabled=False, cross_grammar_cache=False,
                               repetition_compression=False).compile_json_schema(schema)
    assert fast._lowered.follows, "the compressed counter declares what may follow it"
    ids = {b: i for i, b in enumerate(deepseek_info.decoded_vocab)}
    palette = [(ids[w.encode()], c) for w, c in [("the", 3), (" quick", 6), ("中文", 2), (" ü", 2), ("\\\"", 1),
                                                   ("\\n", 1), (" ", 1), ("文", 1)]]
    rng = random.Random(3)
    ba = xg2.allocate_token_bitmask(1, deepseek_info.vocab_size)
    bb = xg2.allocate_token_bitmask(1, deepseek_info.vocab_size)
    for target in (2, 3, n - t - 1, n - t, n - t + 1, n - 1, n):
        ma, mb = xg2.GrammarMatcher(fast), xg2.GrammarMatcher(slow)
        assert ma.accept_string('{"s": "') and mb.accept_string('{"s": "')
        count = 0
        while True:
            ma.fill_next_token_bitmask(ba)
            mb.fill_next_token_bitmask(bb)
            got, want = unpack(ba, deepseek_info.vocab_size), unpack(bb, deepseek_info.vocab_size)
            diff = np.nonzero(got != want)[0]
            assert diff.size == 0, (target, count, [(deepseek_info.decoded_vocab[i], bool(got[i])) for i in diff[:8]])
            fits = [(tok, c) for tok, c in palette if count + c <= target]
            if not fits:
                break
            tok, c = rng.choice(fits)
            assert ma.accept_token(tok) and mb.accept_token(tok)
            count += c
        closing = ids[b'"}']
        assert bool(got[closing]) == (count >= 3)


# --- linked grammars ------------------------------------------------------------------------------

def _tools(n):
    if not REGISTRY.exists():
        pytest.skip(f"{REGISTRY} not found: the tool registry lives in ../shared beside the checkout")
    return [json.loads(line)["function"] for line in REGISTRY.open()][:n]


def _envelopes(tools, rebase=True):
    def params(t, j):
        text = json.dumps(t["parameters"])
        return json.loads(text.replace('"$ref": "#/', f'"$ref": "#/anyOf/{j}/properties/arguments/')) if rebase \
            else t["parameters"]

    return {"anyOf": [{"type": "object", "properties": {"name": {"const": t["name"]}, "arguments": params(t, j)},
                       "required": ["name", "arguments"], "additionalProperties": False}
                      for j, t in enumerate(tools)]}


def test_linked_anyof_masks_like_the_whole_schema(deepseek_info):
    tools = _tools(60)
    with_refs = [t for t in tools if "$ref" in json.dumps(t["parameters"])]
    rng = random.Random(11)
    linked = xg2.GrammarCompiler(deepseek_info, precompute_budget_ms=0)
    whole = xg2.GrammarCompiler(deepseek_info, cache_enabled=False, cross_grammar_cache=False)
    for k in range(3):
        pick = rng.sample(tools, 4) + with_refs[:1]
        schema = _envelopes(pick)
        compiled = linked.compile_json_schema(schema, lenient=True)
        assert compiled._lowered.fsms is None          # it was linked, not lowered whole
        assert_same_walks(deepseek_info, compiled, whole.compile_json_schema(schema, lenient=True), seed=k,
                          walks=2, steps=50)
    assert linked.cache_stats()["hits"] > 0


def test_linked_modules_are_reused_and_report_like_the_whole_schema(small_info):
    compiler = xg2.GrammarCompiler(small_info, precompute_budget_ms=0)
    a = {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0}}, "required": ["x"]}
    b = {"type": "object", "properties": {"y": {"type": "array", "not": {"uniqueItems": True}}}}
    with pytest.warns(xg2.SchemaWarning, match=r"/anyOf/1/properties/y/not"):
        compiler.compile_json_schema({"anyOf": [a, b]}, lenient=True)
    with pytest.warns(xg2.SchemaWarning, match=r"/anyOf/0/properties/y/not"):   # a reused module, moved
        compiler.compile_json_schema({"anyOf": [b, a]}, lenient=True)
    with pytest.warns(xg2.SchemaWarning, match=r"/anyOf/1/properties/y/not"):   # served by the cache: said again
        compiler.compile_json_schema({"anyOf": [a, b]}, lenient=True)
    with pytest.warns(xg2.SchemaWarning, match=r"/anyOf/2/properties/y/not"):   # a repeated branch counts
        compiler.compile_json_schema({"anyOf": [a, a, b]}, lenient=True)
    assert len(compiler._modules) == 2
    with pytest.raises(xg2.SchemaError, match=r"/anyOf/1/properties/y/not"):
        compiler.compile_json_schema({"anyOf": [a, b]})              # strict: the whole schema reports it
    bad_ref = {"anyOf": [a, {"$ref": "#/$defs/z"}], "$defs": {"z": a}}
    compiled = compiler.compile_json_schema(bad_ref)                  # not linkable ($defs): compiled whole
    assert compiled._lowered.fsms is not None
