"""Replays of the call sequences vLLM's and SGLang's xgrammar backends make, against xg2 and xgrammar
side by side: at every step both engines must give the same masks, accept and refuse the same tokens,
and agree on termination and jump-forward text.

The sequences follow how the two backends drive xgrammar (their structured-output managers):

* vLLM: a `TokenizerInfo.from_huggingface(tokenizer, vocab_size=...)`, one compiler for all
  requests; each request kind compiled as the backend compiles it (a schema with `any_whitespace`
  on and off, a plain JSON object, EBNF, a regex, structural tags in the legacy
  `(tags, triggers)` form and in the current JSON form); one batch bitmask for all rows, each
  request filling its rows by index; with speculative decoding, `validate_tokens` (accept each
  draft token until one is refused, then roll them all back), a mask per draft position with the
  tokens accepted in between, then a rollback of what the masks advanced; then the scheduled
  tokens accepted; at the end the stop token and `is_terminated()`.
* SGLang: the same compiles plus the built-in JSON grammar; `find_jump_forward_string` at each
  step; `jump_and_retokenize` (roll back to the common prefix of the old and the re-tokenized
  output, accept the rest); a matcher copy per request (`fork` here, a new matcher in SGLang).

The outputs walked are valid documents tokenized by the real DeepSeek-V3 tokenizer, with
mutations of the drafts (a wrong token in the middle), so refusals are exercised too.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import xgrammar as xgr
from conftest import shared_file
from transformers import PreTrainedTokenizerFast

import xg2

BATCH = 4          # rows of the batch bitmask; each request fills the row of its slot
DRAFT = 3          # speculative tokens per step


@pytest.fixture(scope="module")
def hf_tokenizer():
    return PreTrainedTokenizerFast(tokenizer_file=str(shared_file("deepseek_v3_tokenizer.json")))


@pytest.fixture(scope="module")
def compilers(hf_tokenizer):
    """(xgrammar's, xg2's) compiler, each built the way vLLM's backend builds it."""
    out = []
    for mod in (xgr, xg2):
        info = mod.TokenizerInfo.from_huggingface(hf_tokenizer, vocab_size=len(hf_tokenizer))
        out.append(mod.GrammarCompiler(info, max_threads=2, cache_enabled=True))
    return tuple(out)


WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
# (No string length bounds nor minimum: xgrammar refuses escapes in a bounded string, `"\n"` under
# maxLength 20, where xg2 counts the escape as the one character it stands for, as JSON Schema does;
# xg2 allows `-0` under minimum 0, the integer 0.)
PERSON = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age"], "additionalProperties": False}
LEGACY_TAG = {"structures": [{"begin": "<function=get_weather>", "schema": WEATHER, "end": "</function>"},
                             {"begin": "<function=person>", "schema": PERSON, "end": "</function>"}],
              "triggers": ["<function="]}
CURRENT_TAG = {"type": "structural_tag", "format": {
    "type": "triggered_tags", "triggers": ["<tool_call>"],
    "tags": [{"type": "tag", "begin": "<tool_call>", "content": {"type": "json_schema", "json_schema": WEATHER},
              "end": "</tool_call>"}]}}
EBNF = 'root ::= "ans: " item (", " item)*\nitem ::= [a-z]+ | [0-9]+ "." [0-9]+'

#: (case, how to compile it with a compiler of either engine, a valid output)
CASES = {
    "json_schema": (lambda m, c: c.compile_json_schema(json.dumps(PERSON), any_whitespace=True),
                    '{"name": "Ada Lovelace", "age": 36, "tags": ["math", "poetry"]}'),
    "json_schema_compact": (lambda m, c: c.compile_json_schema(json.dumps(PERSON), any_whitespace=False),
                            '{"name": "Ada", "age": 36, "tags": []}'),   # xgrammar's separators
    "json_object": (lambda m, c: c.compile_json_schema('{"type": "object"}', any_whitespace=True),
                    '{"a": [1, 2.5, {"b": null}], "c": "d"}'),
    "builtin_json": (lambda m, c: c.compile_builtin_json_grammar(), '[true, {"k": "v"}]'),
    "ebnf": (lambda m, c: c.compile_grammar(EBNF), "ans: abc, 12.5, xyz"),
    "regex": (lambda m, c: c.compile_regex(r"(\d{3})-(\d{4}) [A-Z][a-z]+"), "555-1234 Alice"),
    "legacy_structural_tag": (
        lambda m, c: c.compile_structural_tag(
            [m.StructuralTagItem(begin=s["begin"], schema=json.dumps(s["schema"]), end=s["end"])
             for s in LEGACY_TAG["structures"]], LEGACY_TAG["triggers"]),
        'Let me check. <function=get_weather>{"city": "Paris", "unit": "c"}</function> Done.'),
    "legacy_structural_tag_converted": (
        lambda m, c: c.compile_structural_tag(m.StructuralTag.from_legacy_structural_tag(
            [m.StructuralTagItem(begin=s["begin"], schema=json.dumps(s["schema"]), end=s["end"])
             for s in LEGACY_TAG["structures"]], LEGACY_TAG["triggers"])),
        'x <function=person>{"name": "Bo", "age": 3}</function>'),
    "structural_tag": (lambda m, c: c.compile_structural_tag(json.dumps(CURRENT_TAG)),
                       'ok <tool_call>{"city": "Rome", "unit": "f"}</tool_call>'),
}


def _utf8_prefix(data: bytes) -> bool:
    """Whether `data` is UTF-8 text, or UTF-8 text cut inside its last character."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.reason == "unexpected end of data"
    return True


def _bits(bitmask, row: int, vocab_size: int) -> np.ndarray:
    words = bitmask[row].numpy().view(np.uint32)
    return np.unpackbits(words.view(np.uint8), bitorder="little")[:vocab_size]


class Twin:
    """One request on both engines: each call made on both, every answer compared."""

    def __init__(self, compilers, case: str, row: int, max_rollback: int):
        compile_, _ = CASES[case]
        self.case, self.row = case, row
        self.grammars = [compile_(m, c) for m, c in zip((xgr, xg2), compilers)]
        self.matchers = [m.GrammarMatcher(g, max_rollback_tokens=max_rollback)
                         for m, g in zip((xgr, xg2), self.grammars)]
        self.vocab_size = compilers[1].tokenizer_info.vocab_size
        self.special = set(compilers[1].tokenizer_info.special_token_ids)
        self.token_bytes = compilers[1].tokenizer_info.decoded_vocab
        self.text: list[bytes] = []         # the bytes of the tokens accepted, for the UTF-8 check
        self.xgrammar_mask_misses: set[int] = set()
        self.log: list[str] = []

    def same(self, what: str, a, b):
        assert a == b, f"{self.case}: {what} differs after {self.log[-6:]}: xgrammar {a!r}, xg2 {b!r}"
        return a

    def accept(self, token: int) -> bool:
        self.log.append(f"accept {token}")
        ok = self.same(f"accept_token({token})", *(m.accept_token(token) for m in self.matchers))
        if ok:
            self.text.append(self.token_bytes[token])
        return ok

    def rollback(self, k: int) -> None:
        self.log.append(f"rollback {k}")
        for m in self.matchers:
            m.rollback(k)
        del self.text[len(self.text) - k:]

    def fill(self, bitmasks, row: int) -> None:
        """Both masks, compared bit for bit. Three differences are allowed, each checked token by
        token rather than assumed. Two are deliberate in xg2: it never allows a special token of
        its TokenizerInfo (xgrammar, which finds none in this tokenizer, lets them into JSON
        strings and free text), nor a token after which the output is no longer UTF-8 (xgrammar's
        free text takes any bytes). The third is xgrammar's mistake: a token its mask leaves out
        although its own matcher accepts it there (and so does xg2's)."""
        self.log.append(f"fill row {row}")
        for m, bm in zip(self.matchers, bitmasks):
            m.fill_next_token_bitmask(bm, row)
        a, b = (_bits(bm, row, self.vocab_size) for bm in bitmasks)
        if np.array_equal(a, b):
            return
        diff = np.nonzero(a != b)[0]
        special = self.special
        unexplained = []
        before = b"".join(self.text)
        for t in diff.tolist():
            if t in special and not b[t]:
                continue
            if a[t] and not b[t] and not _utf8_prefix(before + self.token_bytes[t]):
                continue
            if b[t] and not a[t] and self._accepts(0, t) and self._accepts(1, t):
                self.xgrammar_mask_misses.add(t)
                continue
            unexplained.append(t)
        if unexplained:
            raise AssertionError(f"{self.case}: masks differ after {self.log[-6:]} at {len(unexplained)} ids, "
                                 f"first {unexplained[:8]} (xgrammar {a[unexplained[:8]].tolist()})")

    def _accepts(self, engine: int, token: int) -> bool:
        """Whether engine's matcher accepts `token` now (probed, then rolled back)."""
        m = self.matchers[engine]
        if m.accept_token(token):
            m.rollback(1)
            return True
        return False

    def terminated(self) -> bool:
        return self.same("is_terminated()", *(m.is_terminated() for m in self.matchers))

    def jump_forward(self) -> str:
        return self.same("find_jump_forward_string()", *(m.find_jump_forward_string() for m in self.matchers))

    def validate_tokens(self, tokens: list[int]) -> list[int]:
        """vLLM's XgrammarGrammar.validate_tokens: the longest accepted prefix, state unchanged."""
        accepted = []
        for t in tokens:
            if not self.accept(t):
                break
            accepted.append(t)
        if accepted:
            self.rollback(len(accepted))
        return accepted


def _bitmasks(vocab_size: int):
    return [xgr.allocate_token_bitmask(BATCH + DRAFT, vocab_size),
            xg2.allocate_token_bitmask(BATCH + DRAFT, vocab_size)]


def _mutated(drafts: list[int], rng: random.Random, vocab_size: int) -> list[int]:
    """Drafts with, half of the time, one token replaced by a random one (a wrong guess)."""
    drafts = list(drafts)
    if drafts and rng.random() < 0.5:
        drafts[rng.randrange(len(drafts))] = rng.randrange(vocab_size)
    return drafts


@pytest.mark.parametrize("case", sorted(CASES))
def test_vllm_speculative_decoding_sequence(compilers, hf_tokenizer, case):
    """vLLM with speculative decoding: validate drafts, a mask per draft position with the accepted
    drafts advanced, roll back, accept the scheduled tokens; the stop token at the end."""
    rng = random.Random(case)
    twin = Twin(compilers, case, row=1, max_rollback=DRAFT)
    tokens = hf_tokenizer.encode(CASES[case][1], add_special_tokens=False)
    stop = compilers[1].tokenizer_info.stop_token_ids[0]
    bitmasks = _bitmasks(twin.vocab_size)
    pos = 0
    while pos < len(tokens):
        drafts = _mutated(tokens[pos + 1:pos + 1 + DRAFT], rng, twin.vocab_size)
        valid = twin.validate_tokens(drafts)
        advanced = 0
        for i, t in enumerate(valid + [None]):      # vLLM's grammar_bitmask: one row per position
            twin.fill(bitmasks, twin.row + i)
            if t is None or twin.terminated():
                break
            assert twin.accept(t)
            advanced += 1
        if advanced:
            twin.rollback(advanced)
        # the scheduler keeps the sampled token and the drafts that agree with the target output
        kept = [tokens[pos]]
        for t, want in zip(valid, tokens[pos + 1:]):
            if t != want:
                break
            kept.append(t)
        for t in kept:
            assert twin.accept(t), f"{case}: a token of the valid output was refused"
        pos += len(kept)
    twin.fill(bitmasks, twin.row)
    assert twin.accept(stop)
    assert twin.terminated()
    assert not twin.accept(tokens[0])        # nothing after the stop token


@pytest.mark.parametrize("case", sorted(CASES))
def test_sglang_decode_sequence(compilers, hf_tokenizer, case):
    """SGLang: a copy of the matcher per request, jump-forward text at each step, and
    jump_and_retokenize (roll back to the common prefix of the old and new ids, accept the rest)."""
    twin = Twin(compilers, case, row=0, max_rollback=200)
    twin.matchers = [m.fork() for m in twin.matchers]          # SGLang copies the matcher per request
    tokens = hf_tokenizer.encode(CASES[case][1], add_special_tokens=False)
    bitmasks = _bitmasks(twin.vocab_size)
    for pos, t in enumerate(tokens):
        twin.fill(bitmasks, twin.row)
        twin.jump_forward()
        assert twin.accept(t)
        if pos == len(tokens) // 2:
            # re-tokenize the output so far after a jump-forward: the last token split in bytes
            old = tokens[:pos + 1]
            text = hf_tokenizer.decode(old[-1:])
            new = old[:-1] + [hf_tokenizer.convert_tokens_to_ids(tok)
                              for tok in hf_tokenizer.tokenize(text)]
            k = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
            if k < len(old):
                twin.rollback(len(old) - k)
            for t2 in new[k:]:
                assert twin.accept(t2)
            twin.fill(bitmasks, twin.row)
    twin.fill(bitmasks, twin.row)
    assert twin.accept(compilers[1].tokenizer_info.stop_token_ids[0])
    assert twin.terminated()


@pytest.mark.parametrize("case", ["json_schema", "ebnf", "legacy_structural_tag"])
def test_forks_continue_independently_and_match_xgrammar(compilers, hf_tokenizer, case):
    """xgrammar's fork(): the fork starts in the parent's state; each then goes its own way (the
    parent to the end, the fork rolled back and taken elsewhere) with masks equal to xgrammar's."""
    twin = Twin(compilers, case, row=0, max_rollback=-1)
    tokens = hf_tokenizer.encode(CASES[case][1], add_special_tokens=False)
    bitmasks = _bitmasks(twin.vocab_size)
    half = len(tokens) // 2
    for t in tokens[:half]:
        assert twin.accept(t)
    fork = Twin.__new__(Twin)
    fork.__dict__.update(twin.__dict__)
    fork.matchers = [m.fork() for m in twin.matchers]
    fork.log = list(twin.log) + ["fork"]
    fork.text = list(twin.text)
    fork.fill(bitmasks, 0)
    for t in tokens[half:]:
        assert twin.accept(t)
        twin.fill(bitmasks, 0)
    fork.fill(bitmasks, 1)                 # the parent's steps did not move the fork
    fork.rollback(min(2, half))            # the fork's history came with it
    fork.fill(bitmasks, 1)
    for t in tokens[half - min(2, half):]:
        assert fork.accept(t)
    fork.fill(bitmasks, 1)
    stop = compilers[1].tokenizer_info.stop_token_ids[0]
    assert fork.accept(stop) and fork.terminated()
    assert not twin.terminated()           # the fork's stop token did not end the parent
    assert twin.accept(stop) and twin.terminated()
    refork = twin.matchers[1].fork()       # a fork of a finished matcher is finished
    assert refork.is_terminated() and not refork.accept_token(tokens[0])


def test_reset_returns_to_the_first_mask(compilers, hf_tokenizer):
    twin = Twin(compilers, "json_schema", row=0, max_rollback=-1)
    bitmasks = _bitmasks(twin.vocab_size)
    twin.fill(bitmasks, 0)
    first = _bits(bitmasks[1], 0, twin.vocab_size).copy()
    for t in hf_tokenizer.encode(CASES["json_schema"][1], add_special_tokens=False)[:5]:
        assert twin.accept(t)
    for m in twin.matchers:
        m.reset()
    twin.fill(bitmasks, 0)
    assert np.array_equal(first, _bits(bitmasks[1], 0, twin.vocab_size))


def test_errors_are_caught_by_xgrammars_except_clauses(compilers):
    """Engines wrap compiles in `except RuntimeError` (xgrammar's errors are RuntimeErrors) and
    catch xgrammar's named exceptions; xg2's typed errors are caught by the same clauses, with the
    same split as xgrammar makes between its names."""
    c = compilers[1]
    bad = {
        "ebnf": lambda: c.compile_grammar("root ::= ("),
        "regex": lambda: c.compile_regex("(a"),
        "schema": lambda: c.compile_json_schema('{"type": "foo"}'),
        "schema text": lambda: c.compile_json_schema("{bad"),
        "tag": lambda: c.compile_structural_tag({"type": "structural_tag", "format": {"type": "nope"}}),
        "tag text": lambda: c.compile_structural_tag("{bad"),
        "legacy tag schema": lambda: c.compile_structural_tag(
            [xg2.StructuralTagItem(begin="<f>", schema="{bad", end="</f>")], ["<f>"]),
    }
    for what, call in bad.items():
        with pytest.raises(RuntimeError):
            call()
    for what in ("schema text", "tag text", "legacy tag schema"):
        with pytest.raises(xg2.exception.InvalidJSONError):
            bad[what]()
    for what in ("tag", "tag text", "legacy tag schema"):
        with pytest.raises(xg2.exception.InvalidStructuralTagError):
            bad[what]()
    with pytest.raises(xg2.StructuralTagError) as e:       # and keeps its pointer
        bad["legacy tag schema"]()
    assert e.value.pointer == "/tags/0/schema"
    with pytest.raises(RuntimeError):                      # as xgrammar refuses the same text
        compilers[0].compile_json_schema("{bad")


def test_legacy_structural_tag_forms_are_one_grammar(compilers):
    """The legacy form given positionally, by keyword, with dict or text schemas, through
    StructuralTag.from_legacy_structural_tag or Grammar.from_structural_tag, is one language."""
    c = compilers[1]
    items_text = [xg2.StructuralTagItem(begin=s["begin"], schema=json.dumps(s["schema"]), end=s["end"])
                  for s in LEGACY_TAG["structures"]]
    items_dict = [xg2.StructuralTagItem(begin=s["begin"], schema=s["schema"], end=s["end"])
                  for s in LEGACY_TAG["structures"]]
    triggers = LEGACY_TAG["triggers"]
    forms = [
        c.compile_structural_tag(items_text, triggers),
        c.compile_structural_tag(tags=items_dict, triggers=triggers),
        c.compile_structural_tag(xg2.StructuralTag.from_legacy_structural_tag(items_text, triggers)),
        c.compile_grammar(xg2.Grammar.from_structural_tag(items_dict, triggers)),
    ]
    assert len({str(f.grammar) for f in forms}) == 1
    ok = 'a <function=person>{"name": "X", "age": 1}</function> b'
    for f in forms:
        m = xg2.GrammarMatcher(f)
        assert m.accept_string(ok) and m.is_completed()
        assert not xg2.GrammarMatcher(f).accept_string('<function=person>{"name": 1}')
    assert items_text[0].schema_ == items_text[0].schema     # xgrammar's attribute name
    with pytest.raises(TypeError):
        c.compile_structural_tag(items_text)                 # tags without triggers
    with pytest.raises(xg2.StructuralTagError) as e:
        c.compile_structural_tag([{"begin": 1, "schema": {}, "end": ""}], triggers)
    assert e.value.pointer == "/tags/0/begin"


def _random_tree(rng: random.Random, n: int, path: list[int], vocab_size: int):
    """A draft tree of `n` nodes as (first child, next sibling, tokens) int64 tensors: each node
    hangs under an earlier one; a node at depth d drafts the d-th token of `path` most of the time
    (so branches get accepted), else a random token."""
    import torch

    parent, depth = [-1], [0]
    for i in range(1, n):
        p = rng.randrange(i)
        parent.append(p)
        depth.append(depth[p] + 1)
    nxt, sib = [-1] * n, [-1] * n
    last_child: dict[int, int] = {}
    for i in range(1, n):
        p = parent[i]
        if p in last_child:
            sib[last_child[p]] = i
        else:
            nxt[p] = i
        last_child[p] = i
    tokens = [0] + [path[depth[i] - 1] if depth[i] - 1 < len(path) and rng.random() < 0.7
                    else rng.randrange(vocab_size) for i in range(1, n)]
    return (torch.tensor(nxt, dtype=torch.int64), torch.tensor(sib, dtype=torch.int64),
            torch.tensor(tokens, dtype=torch.int64))


def _walk_reference(matcher, nxt, sib, tokens, bitmask, node=0, parent=-1):
    """The tree walk step by step with public calls (SGLang's order), on small trees only."""
    t = int(tokens[node])
    accepted = node == 0 or bool((int(bitmask[parent, t // 32]) >> (t % 32)) & 1)
    if accepted:
        if node != 0:
            assert matcher.accept_token(t)
        if not matcher.is_terminated():
            matcher.fill_next_token_bitmask(bitmask, node)
            if nxt[node] != -1:
                _walk_reference(matcher, nxt, sib, tokens, bitmask, int(nxt[node]), node)
        if node != 0:
            matcher.rollback(1)
    if sib[node] != -1:
        _walk_reference(matcher, nxt, sib, tokens, bitmask, int(sib[node]), parent)


@pytest.mark.parametrize("case", ["json_schema", "ebnf", "structural_tag"])
def test_traverse_draft_tree_matches_step_by_step_and_xgrammar(compilers, hf_tokenizer, case):
    """On random trees from random points of a valid output: xg2's traverse_draft_tree gives the
    rows the step-by-step walk gives, and xgrammar's traverse_draft_tree the same rows (up to the
    checked differences of Twin.fill); the matcher ends where it started."""
    import torch

    rng = random.Random(case)
    twin = Twin(compilers, case, row=0, max_rollback=-1)
    tokens = hf_tokenizer.encode(CASES[case][1], add_special_tokens=False)
    vs = twin.vocab_size
    for trial in range(12):
        start = rng.randrange(len(tokens))
        for m in twin.matchers:
            m.reset()
        twin.text = []
        for t in tokens[:start]:
            assert twin.accept(t)
        nxt, sib, drafts = _random_tree(rng, rng.randrange(1, 17), tokens[start:], vs)
        n = len(nxt)
        # SGLang zeroes the rows first; xgrammar leaves the rows of nodes under a refused one as
        # they were, xg2 zeroes every row it is given (a stale row would allow everything)
        ours = torch.full((n, (vs + 31) // 32), -1, dtype=torch.int32)
        theirs = torch.zeros_like(ours)
        ref = torch.zeros_like(ours)
        assert twin.matchers[1].traverse_draft_tree(nxt, sib, drafts, ours) is True
        assert twin.matchers[0].traverse_draft_tree(nxt, sib, drafts, theirs) is True
        _walk_reference(twin.matchers[1], nxt.tolist(), sib.tolist(), drafts, ref)
        assert torch.equal(ours, ref), f"{case} trial {trial}: traverse_draft_tree differs from the walk"
        twin.fill(_bitmasks(vs), 0)         # both matchers back where they started
        parents = {int(c): p for p in range(n) for c in _children(nxt, sib, p)}
        for node in range(n):               # row by row against xgrammar (parents come first)
            a, b = (_bits(bm, node, vs) for bm in (theirs, ours))
            if np.array_equal(a, b):
                continue
            if node and not (a.any() and b.any()):
                # one engine visited the node, the other did not: the parent's bit for its token
                # must differ, a difference already checked at the parent
                t, p = int(drafts[node]), parents[node]
                assert _bits(theirs, p, vs)[t] != _bits(ours, p, vs)[t], \
                    f"{case} trial {trial}: node {node} visited by one engine only"
                continue
            _check_at(twin, parents, drafts, node)    # the differences Twin.fill allows, checked there


def _children(nxt, sib, p: int):
    c = int(nxt[p])
    while c != -1:
        yield c
        c = int(sib[c])


def _check_at(twin, parents: dict, drafts, node: int) -> None:
    """Walk the twin to `node` (the tokens on its path) and compare the masks there with Twin.fill's
    checks (it raises on a difference it cannot explain); then back."""
    path, x = [], node
    while x != 0:
        path.append(int(drafts[x]))
        x = parents[x]
    for t in reversed(path):
        assert twin.accept(t)
    twin.fill(_bitmasks(twin.vocab_size), 0)
    twin.rollback(len(path))


def test_traverse_draft_tree_refusals_and_timeout(compilers):
    import torch

    g = compilers[1].compile_grammar(EBNF)
    m = xg2.GrammarMatcher(g)
    vs = compilers[1].tokenizer_info.vocab_size
    bm = xg2.allocate_token_bitmask(4, vs)
    i64 = {"dtype": torch.int64}
    ok = (torch.tensor([1, 2, -1], **i64), torch.tensor([-1, -1, -1], **i64), torch.tensor([0, 5, 6], **i64))
    for bad in [(ok[0], torch.tensor([-1, -1], **i64), ok[2]),                 # lengths
                (ok[0], ok[1].to(torch.int32), ok[2]),                         # dtype
                (torch.tensor([1, 5, -1], **i64), ok[1], ok[2]),               # index out of range
                (torch.tensor([1, 2, 1], **i64), ok[1], ok[2])]:               # a cycle
        with pytest.raises(xg2.UsageError):
            m.traverse_draft_tree(*bad, bm)
    with pytest.raises(xg2.UsageError):
        m.traverse_draft_tree(*ok, xg2.allocate_token_bitmask(2, vs))         # too few rows
    # a long chain with a tiny time budget stops early, the root row filled, the matcher unmoved
    chain_tokens = [0] + [ord("a") for _ in range(199)]
    chain = (torch.tensor(list(range(1, 200)) + [-1], **i64), torch.full((200,), -1, **i64),
             torch.tensor(chain_tokens, **i64))
    rows = xg2.allocate_token_bitmask(200, vs)
    before = xg2.allocate_token_bitmask(1, vs)
    m.fill_next_token_bitmask(before, 0)
    assert m.traverse_draft_tree(*chain, rows, time_threshold=1e-7) is False
    assert torch.equal(rows[0], before[0])
    after = xg2.allocate_token_bitmask(1, vs)
    m.fill_next_token_bitmask(after, 0)
    assert torch.equal(before, after)
    temps = torch.zeros(3, dtype=torch.float32)
    assert m.traverse_draft_tree(*ok, bm, temperatures=temps) is True
    assert temps.tolist() == [-1.0, -1.0, -1.0]         # no temperature anywhere
    warm = xg2.GrammarMatcher(g, default_temperature=0.5)
    assert warm.traverse_draft_tree(*ok, bm, temperatures=temps) is True
    visited = [bool(bm[i].any()) for i in range(3)]
    assert temps.tolist() == [0.5 if v else -1.0 for v in visited] and visited[0]
