"""xg2.transport: compiled grammars, modules and mask entries as checked bytes.

A grammar deserialized into another compiler (another process's, in effect) masks exactly as the
original at every step of a token path, with or without the pool's entries moved along; every blob
that is not one this engine wrote for this vocabulary, whole and unchanged, is refused with a typed
DeserializeError, never loaded and never a crash (cases that could crash the core run in a forked
child, so a crash fails one test instead of ending the run).
"""

from __future__ import annotations

import json
import os
import select
import signal
import time
from collections.abc import Callable

import msgspec
import numpy as np
import pytest
from conftest import SAMPLE_EBNF, SAMPLE_REGEX, SAMPLE_TOOLS, SHARED, longest_match

import xg2
from xg2 import transport
from xg2.transport import DeserializeError, DeserializeVersionError, VocabularyMismatchError

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"enum": ["a", "bc"]}}},
          "required": ["name"]}
ANY_OF = {"title": "either", "anyOf": [
    {"type": "integer", "minimum": 0},
    {"type": "object", "properties": {"x": {"type": "string"}, "y": {"type": "boolean"}}, "required": ["x"]},
    {"type": "array", "items": {"type": "number"}, "maxItems": 3}]}
EBNF, REGEX, TOOLS = SAMPLE_EBNF, SAMPLE_REGEX, SAMPLE_TOOLS
TOOL_TEXT = 'Let me see.<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": -3}}\n</tool_call>'


def _qwen_tag():
    return xg2.get_model_structural_tag("qwen_3", TOOLS, "auto", reasoning="disabled")


#: name -> (compile on a compiler, text of a path through it)
CASES: dict[str, tuple[Callable, str]] = {
    "ebnf": (lambda c: c.compile_grammar(EBNF), "((1+23)+(4))"),
    "regex": (lambda c: c.compile_regex(REGEX), "abc@example.com"),
    "json_schema": (lambda c: c.compile_json_schema(SCHEMA), '{"name": "ab\\"c", "n": -12, "tags": ["a", "bc"]}'),
    "any_of_linked": (lambda c: c.compile_json_schema(ANY_OF), '{"x": "hi", "y": true}'),
    "structural_tag": (lambda c: c.compile_structural_tag(_qwen_tag()), TOOL_TEXT),
    "builtin_json": (lambda c: c.compile_builtin_json_grammar(), '{"k": [1, 2.5e+3, null, "v"]}'),
}


def _table(info: xg2.TokenizerInfo) -> dict[bytes, int]:
    skip = set(info.stop_token_ids) | set(info.special_token_ids)
    return {bytes(t): i for i, t in enumerate(info.decoded_vocab) if t and i not in skip}


def _path(info: xg2.TokenizerInfo, text: str) -> list[int]:
    return longest_match(_table(info), text.encode())


def masks_along(compiled: xg2.CompiledGrammar, tokens: list[int]) -> np.ndarray:
    """The mask before each token of the path, the one after it, and a last row telling whether
    the stop token was then accepted (as a row of its own so that one comparison covers it)."""
    info = compiled.tokenizer_info
    matcher = xg2.GrammarMatcher(compiled)
    bitmask = xg2.allocate_token_bitmask(1, info.vocab_size, backend="numpy")
    rows = []
    for t in tokens:
        matcher.fill_next_token_bitmask(bitmask)
        rows.append(bitmask[0].copy())
        assert matcher.accept_token(t), f"the path's token {t} was refused"
    matcher.fill_next_token_bitmask(bitmask)
    rows.append(bitmask[0].copy())
    done = matcher.accept_token(info.stop_token_ids[0])
    rows.append(np.full_like(bitmask[0], int(done)))
    return np.stack(rows)


def assert_same_masks(a: xg2.CompiledGrammar, b: xg2.CompiledGrammar, tokens: list[int]) -> None:
    ma, mb = masks_along(a, tokens), masks_along(b, tokens)
    assert ma[-1, 0] == 1, "the path should end where the grammar may end"
    assert len({row.tobytes() for row in ma[:-1]}) > 1, "masks that never change test nothing"
    np.testing.assert_array_equal(ma, mb)


# -- round trips -----------------------------------------------------------------------------------

@pytest.mark.parametrize("case", sorted(CASES))
def test_round_trip_into_a_fresh_compiler_masks_like_the_original(json_info, case):
    build, text = CASES[case]
    source = xg2.GrammarCompiler(json_info)
    original = build(source)
    tokens = _path(json_info, text)
    data = original.serialize()
    assert isinstance(data, bytes) and data[:4] == transport.MAGIC
    target = xg2.GrammarCompiler(json_info)
    loaded = target.deserialize(data)
    assert loaded is not original and loaded.tokenizer_info is json_info
    assert_same_masks(original, loaded, tokens)
    assert str(loaded.grammar) == str(original.grammar)
    # Once more from the copy, into a third compiler.
    again = xg2.GrammarCompiler(json_info).deserialize(loaded.serialize())
    assert_same_masks(original, again, tokens)


def test_any_of_takes_the_linked_path_and_the_tag_its_framed_one(json_info):
    """The two cases above that are meant to exercise linked grammars really do (their tables are
    linked from modules, so they carry no automata of their own)."""
    compiler = xg2.GrammarCompiler(json_info)
    linked = compiler.compile_json_schema(ANY_OF)
    framed = compiler.compile_structural_tag(_qwen_tag())
    assert linked._lowered.fsms is None and framed._lowered.fsms is None
    assert len(compiler._modules) == 3 + 2       # three branches, two tools' parameters
    assert linked._source[0] == "json_schema" and framed._source[0] == "structural_tag"


@pytest.mark.parametrize("case", ["json_schema", "any_of_linked", "structural_tag"])
def test_pool_entries_moved_across_are_used_by_the_deserialized_grammar(json_info, case):
    build, text = CASES[case]
    tokens = _path(json_info, text)
    source = xg2.GrammarCompiler(json_info)
    original = build(source)
    expected = masks_along(original, tokens)          # builds the path's entries into source's pool
    keys = set(original._core.pool_keys().values())
    assert keys
    moved = {}
    for key in keys:
        entry = source.entry_pool.dump(key)
        if entry is not None:       # through an entry blob, as between processes
            moved[key] = transport.load_entry(transport.dump_entry(entry, json_info.fingerprint),
                                              json_info.fingerprint)
            assert moved[key] == entry
    assert moved
    target = xg2.GrammarCompiler(json_info, precompute_budget_ms=0)
    for key, entry in moved.items():
        target.entry_pool.load(key, entry)
    assert all(key in target.entry_pool for key in moved)
    loaded = target.deserialize(original.serialize())
    np.testing.assert_array_equal(masks_along(loaded, tokens), expected)
    stats = target.entry_pool.stats()
    assert stats["hits"] > 0 and stats["misses"] == 0, stats     # every entry on the path came across


def test_own_entries_ride_along_and_are_installed(json_info):
    """Without the pool every entry is the grammar's own: the blob carries those built so far, and
    the deserialized grammar holds the same bytes for those nodes before any mask is asked for."""
    tokens = _path(json_info, CASES["json_schema"][1])
    source = xg2.GrammarCompiler(json_info, cross_grammar_cache=False)
    original = source.compile_json_schema(SCHEMA)
    masks_along(original, tokens)
    built = original._core.built_entries(own_only=True)
    assert built
    for target in (xg2.GrammarCompiler(json_info, cross_grammar_cache=False, precompute_budget_ms=0),
                   xg2.GrammarCompiler(json_info, precompute_budget_ms=0)):
        loaded = target.deserialize(original.serialize())
        assert loaded._precomputed.wait(10)    # those past the first mask: the background precompute's
        held = loaded._core.built_entries(own_only=False)
        assert {node: held.get(node) for node in built} == built
        np.testing.assert_array_equal(masks_along(loaded, tokens), masks_along(original, tokens))


def test_own_entries_beyond_the_first_mask_can_travel_apart(json_info):
    """dump_grammar(rest_apart=True): the grammar with its first mask's own entries, and the others
    as a blob of their own; together they are every own entry, and installed they mask the same."""
    fp = json_info.fingerprint
    tokens = _path(json_info, CASES["json_schema"][1])
    original = xg2.GrammarCompiler(json_info, cross_grammar_cache=False).compile_json_schema(SCHEMA)
    assert original._precomputed.wait(60)      # no entry added between `own` and the blobs
    masks_along(original, tokens)
    own = original._core.built_entries(own_only=True)
    initial = set(original._core.initial_nodes())
    blob, rest_blob = transport.dump_grammar(original, rest_apart=True)
    first = transport.load_grammar(blob, fp).entries
    rest = transport.load_own_entries(rest_blob, fp)
    assert set(first) == set(own) & initial and rest and not set(rest) & initial
    assert {**first, **rest} == own
    target = xg2.GrammarCompiler(json_info, cross_grammar_cache=False, precompute_budget_ms=0)
    loaded = target.deserialize(blob)
    assert set(loaded._core.built_entries(own_only=False)) == initial
    for node, data in rest.items():
        loaded._core.load_entry(node, data)
    assert loaded._core.built_entries(own_only=False) == own
    np.testing.assert_array_equal(masks_along(loaded, tokens), masks_along(original, tokens))
    with pytest.raises(DeserializeError, match="expected a compiled grammar"):
        target.deserialize(rest_blob)
    with pytest.raises(DeserializeError, match="own entries"):
        transport.load_own_entries(blob, fp)
    with pytest.raises(DeserializeError):
        transport.load_own_entries(rest_blob[:-1], fp)


def test_the_first_masks_pooled_entries_ride_along(json_info):
    """A grammar's blob carries the pooled entries of its first mask (a fresh process builds that
    mask from them, asking no one) and the keys of the other pooled entries built so far."""
    fp = json_info.fingerprint
    tokens = _path(json_info, CASES["json_schema"][1])
    source = xg2.GrammarCompiler(json_info)
    original = source.compile_json_schema(SCHEMA)
    # the background precompute done: else it still adds entries to the pool between the blob and
    # the check below (seen with the machine busy)
    assert original._precomputed.wait(60)
    masks_along(original, tokens)
    payload = transport.load_grammar(original.serialize(), fp)
    core = original._core
    keys = core.pool_keys()
    initial = set(core.initial_nodes())
    assert set(payload.first) == {keys[n] for n in initial if n in keys} != set()
    assert all(payload.first[k] == source.entry_pool.dump(k) for k in payload.first)
    assert set(payload.built) == {k for n, k in keys.items() if n not in initial and k in source.entry_pool}
    assert payload.built
    target = xg2.GrammarCompiler(json_info, precompute_budget_ms=0)
    loaded = target.deserialize(original.serialize())
    assert all(k in target.entry_pool for k in payload.first)
    assert target.entry_pool.stats()["misses"] == 0        # the first mask came with the grammar
    assert_same_masks(original, loaded, tokens)


def test_a_grammar_without_source_loads_but_cannot_rebuild_its_grammar(json_info):
    compiler = xg2.GrammarCompiler(json_info)
    original = compiler.compile_grammar(xg2.Grammar.from_ebnf(EBNF))
    loaded = xg2.GrammarCompiler(json_info).deserialize(original.serialize())
    assert_same_masks(original, loaded, _path(json_info, "((1+23)+(4))"))
    with pytest.raises(xg2.UsageError):
        loaded.grammar   # noqa: B018


LENIENT_ANY_OF = {"anyOf": [
    {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
    {"type": "object", "properties": {"y": {"type": "array", "not": {"uniqueItems": True}}}}]}


def test_warnings_ride_along(json_info):
    """A linked grammar keeps the warnings its modules gave, to say again when it is served; so
    does its copy."""
    with pytest.warns(xg2.SchemaWarning, match="/anyOf/1/"):
        original = xg2.GrammarCompiler(json_info).compile_json_schema(LENIENT_ANY_OF, lenient=True)
    assert original._warnings
    loaded = xg2.GrammarCompiler(json_info).deserialize(original.serialize())
    assert loaded._warnings == original._warnings
    assert_same_masks(original, loaded, _path(json_info, '{"y": ["ab"]}'))


@pytest.mark.parametrize("wrap", [bytearray, memoryview])
def test_bytes_like_inputs_are_read(json_info, wrap):
    original = xg2.GrammarCompiler(json_info).compile_regex(REGEX)
    loaded = xg2.GrammarCompiler(json_info).deserialize(wrap(original.serialize()))
    assert_same_masks(original, loaded, _path(json_info, "abc@example.com"))


def _registry_tools(n: int) -> list[dict]:
    path = SHARED / "data/tools/registry.jsonl"
    if not path.exists():
        pytest.skip(f"{path} not found")
    wanted = {"bing_search", "fetch_webpage"}
    tools = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            fn = json.loads(line)["function"]
            if fn["name"] in wanted or len(tools) < n:
                tools.append({"type": "function", "function": fn})
            if len(tools) >= n and wanted <= {t["function"]["name"] for t in tools}:
                break
    return tools


def test_real_vocabulary_tool_calls_round_trip(deepseek_info, deepseek_tokenizer):
    tools = _registry_tools(6)
    tag = xg2.get_model_structural_tag("qwen_3", tools, "auto", reasoning="disabled")
    original = xg2.GrammarCompiler(deepseek_info).compile_structural_tag(tag)
    text = ('I will search.<tool_call>\n{"name": "bing_search", "arguments": {"query": "天气 Paris", '
            '"num_results": 3}}\n</tool_call>\n<tool_call>\n{"name": "fetch_webpage", "arguments": '
            '{"result_id": "r-17"}}\n</tool_call>')
    tokens = deepseek_tokenizer.encode(text, add_special_tokens=False).ids
    loaded = xg2.GrammarCompiler(deepseek_info).deserialize(original.serialize())
    assert_same_masks(original, loaded, tokens)
    assert str(loaded.grammar) == str(original.grammar)


# -- refusals --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_blob(json_info) -> bytes:
    return xg2.GrammarCompiler(json_info).compile_regex("a[bc]+d").serialize()


def test_another_vocabulary_is_refused(json_info, small_info, small_blob):
    with pytest.raises(VocabularyMismatchError):
        xg2.GrammarCompiler(small_info).deserialize(small_blob)
    with pytest.raises(VocabularyMismatchError):
        transport.load_grammar(small_blob, small_info.fingerprint)


def test_another_engine_version_is_refused(json_info, small_blob, monkeypatch):
    compiler = xg2.GrammarCompiler(json_info)
    monkeypatch.setattr(transport, "engine_version", lambda: "0.0.9-other")
    with pytest.raises(DeserializeVersionError, match=xg2.__version__):      # read by another engine
        compiler.deserialize(small_blob)
    foreign = xg2.GrammarCompiler(json_info).compile_regex("a[bc]+d").serialize()   # written by it
    monkeypatch.undo()
    with pytest.raises(DeserializeVersionError, match="0.0.9-other"):
        compiler.deserialize(foreign)
    forged = transport.pack(transport.KIND_GRAMMAR, json_info.fingerprint,
                            transport.unpack(small_blob, transport.KIND_GRAMMAR, json_info.fingerprint))
    assert compiler.deserialize(forged) is not None      # the same payload under this engine's header


def test_another_format_version_is_refused(json_info, small_blob, monkeypatch):
    compiler = xg2.GrammarCompiler(json_info)
    monkeypatch.setattr(transport, "FORMAT_VERSION", transport.FORMAT_VERSION + 1)
    newer = xg2.GrammarCompiler(json_info).compile_regex("a[bc]+d").serialize()
    with pytest.raises(DeserializeVersionError):       # this blob, read by a newer reader
        compiler.deserialize(small_blob)
    monkeypatch.undo()
    with pytest.raises(DeserializeVersionError):       # a newer blob, read here
        compiler.deserialize(newer)


def test_large_payloads_travel_compressed_and_a_bad_stream_is_refused(json_info, monkeypatch):
    """Payloads from 4 kB on are zlib-compressed; a compressed stream that is cut short, malformed or
    inflates past the format's bound is refused even under a valid checksum (anyone can forge one)."""
    import zlib

    fp = json_info.fingerprint
    payload = bytes(range(256)) * 64
    blob = transport.pack(transport.KIND_ENTRY, fp, payload)
    assert len(blob) < len(payload) // 4
    assert transport.unpack(blob, transport.KIND_ENTRY, fp) == payload
    small = transport.pack(transport.KIND_ENTRY, fp, b"x" * 100)
    assert transport.unpack(small, transport.KIND_ENTRY, fp) == b"x" * 100

    def forged(body: bytes) -> bytes:         # a compressed payload under a header and checksum of its own
        engine = transport.engine_version().encode()
        head = transport._HEAD.pack(transport.MAGIC, transport.FORMAT_VERSION,
                                    transport.KIND_ENTRY | transport._ZLIB, len(engine)) + engine
        head += transport._vocab_digest(fp)
        return head + transport._checksum(head, body) + body

    whole = zlib.compress(payload, 1)
    for body in (whole[:-5], b"not zlib at all", whole + b"trailing"):
        with pytest.raises(DeserializeError):
            transport.unpack(forged(body), transport.KIND_ENTRY, fp)
    monkeypatch.setattr(transport, "MAX_PAYLOAD_BYTES", len(payload) - 1)
    with pytest.raises(DeserializeError, match="larger than the format allows"):
        transport.unpack(forged(whole), transport.KIND_ENTRY, fp)


def test_every_truncation_is_refused(json_info, small_blob):
    compiler = xg2.GrammarCompiler(json_info)
    for n in range(len(small_blob)):
        with pytest.raises(DeserializeError):
            compiler.deserialize(small_blob[:n])
    with pytest.raises(DeserializeError):
        compiler.deserialize(small_blob + b"\0")      # and so is anything past the end


@pytest.mark.parametrize("bit", [0x01, 0x80])
def test_every_flipped_byte_is_refused(json_info, small_blob, bit):
    compiler = xg2.GrammarCompiler(json_info)
    for i in range(len(small_blob)):
        data = bytearray(small_blob)
        data[i] ^= bit
        with pytest.raises(DeserializeError):
            compiler.deserialize(bytes(data))


def test_blobs_of_another_kind_are_refused(json_info, small_blob):
    compiler = xg2.GrammarCompiler(json_info)
    compiler.compile_structural_tag(_qwen_tag())
    module_blob = transport.dump_module(next(iter(compiler._modules.values())), json_info.fingerprint)
    entry_blob = transport.dump_entry(b"\0" * 40, json_info.fingerprint)
    fp = json_info.fingerprint
    for blob in (module_blob, entry_blob):
        with pytest.raises(DeserializeError, match="expected a compiled grammar") as err:
            compiler.deserialize(blob)
        assert type(err.value) is DeserializeError
    with pytest.raises(DeserializeError, match="expected a module"):
        transport.load_module(small_blob, fp)
    with pytest.raises(DeserializeError, match="expected a mask entry"):
        transport.load_entry(module_blob, fp)


@pytest.mark.parametrize("value", ["XG2T text", None, 7, [1, 2], np.zeros(8, np.uint8)])
def test_non_bytes_are_refused(json_info, value):
    with pytest.raises(DeserializeError):
        xg2.GrammarCompiler(json_info).deserialize(value)


def test_refusals_are_value_errors_and_xg2_errors():
    for cls in (DeserializeError, DeserializeVersionError, VocabularyMismatchError):
        assert issubclass(cls, ValueError) and issubclass(cls, xg2.XG2Error) and issubclass(cls, DeserializeError)
    # and xgrammar's names for them, so an engine's except clauses written for xgrammar catch them
    assert issubclass(DeserializeError, xg2.exception.DeserializeFormatError)
    assert issubclass(DeserializeVersionError, xg2.exception.DeserializeVersionError)


# -- payloads with a valid checksum ------------------------------------------------------------------

def _in_child(fn: Callable[[], object]) -> str:
    """Run `fn` in a forked child: "accepted", "refused: ..." (a DeserializeError), "other: ..."
    (any other exception), or "crashed: ..." if the child died (a segfault in the core)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:       # pragma: no cover - the child
        os.close(read)
        try:
            try:
                fn()
                out = "accepted"
            except DeserializeError as e:
                out = f"refused: {e}"
            except BaseException as e:  # noqa: BLE001 - reported to the parent
                out = f"other: {type(e).__name__}: {e}"
            os.write(write, out.encode("utf-8", "replace"))
        finally:
            os._exit(0)
    os.close(write)
    chunks = []
    deadline = time.monotonic() + 120       # a child that hangs (a lock held at the fork) fails, never wedges
    while select.select([read], [], [], max(0.0, deadline - time.monotonic()))[0]:
        chunk = os.read(read, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    else:
        os.kill(pid, signal.SIGKILL)
    os.close(read)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return f"crashed: signal {os.WTERMSIG(status)}"
    return b"".join(chunks).decode()


def _payload(blob: bytes, fingerprint: str) -> transport.GrammarPayload:
    return msgspec.msgpack.decode(transport.unpack(blob, transport.KIND_GRAMMAR, fingerprint),
                                  type=transport.GrammarPayload)


def _table_of(p: transport.GrammarPayload, name: str) -> np.ndarray:
    return transport._array_in(p.lowered.arrays[name]).copy()


def _set_table(p: transport.GrammarPayload, name: str, a: np.ndarray) -> None:
    p.lowered.arrays[name] = transport._array_out(a)


def _poke(name: str, where: int, value: Callable[[transport.GrammarPayload], int]):
    def tamper(p):
        a = _table_of(p, name)
        a[where] = value(p)
        _set_table(p, name, a)
    return tamper


def _n_nodes(p) -> int:
    return len(_table_of(p, "node_rule"))


def _n_rules(p) -> int:
    return len(p.lowered.rule_names)


def _cut(name: str, keep: Callable[[transport.GrammarPayload], int]):
    def tamper(p):
        _set_table(p, name, _table_of(p, name)[: keep(p)])
    return tamper


def _set_raw(name: str, dtype: str, shape: tuple, data: bytes):
    def tamper(p):
        p.lowered.arrays[name] = transport._Array(dtype, shape, data)
    return tamper


def _drop(name: str):
    def tamper(p):
        del p.lowered.arrays[name]
    return tamper


def _ctx_item_rule(p):
    items = _table_of(p, "ctx_item")
    items[0] = (np.uint64(_n_rules(p) + 3) << np.uint64(32)) | (items[0] & np.uint64(0xFFFFFFFF))
    _set_table(p, "ctx_item", items)


def _ctx_item_node(p):
    items = _table_of(p, "ctx_item")
    items[0] = (items[0] & ~np.uint64(0xFFFFFFFF)) | np.uint64(_n_nodes(p) + 5)
    _set_table(p, "ctx_item", items)


def _reverse_offsets(p):
    _set_table(p, "be_start", _table_of(p, "be_start")[::-1].copy())


def _root(p):
    p.lowered.root = _n_rules(p)


def _short_key(p):
    p.lowered.rule_keys[0] = p.lowered.rule_keys[0][:8]


def _extra_rule_name(p):
    p.lowered.rule_names.append("ghost")


#: Tamperings of a valid grammar's payload (checksum recomputed): each names a table index out of
#: range or a table the core cannot read as it is, and must be refused.
TAMPERED = {
    "be_target past the nodes": _poke("be_target", 0, lambda p: _n_nodes(p) + 7),
    "be_target negative": _poke("be_target", -1, lambda p: -1),
    "re_rule past the rules": _poke("re_rule", 0, lambda p: _n_rules(p)),
    "re_target past the nodes": _poke("re_target", 0, lambda p: 1 << 20),
    "node_rule past the rules": _poke("node_rule", 1, lambda p: _n_rules(p) + 1),
    "rule_start past the nodes": _poke("rule_start", 0, lambda p: _n_nodes(p)),
    "ctx_resume past the nodes": _poke("ctx_resume", 0, lambda p: _n_nodes(p) + 2),
    "ctx_resume below -1": _poke("ctx_resume", 0, lambda p: -5),
    "ctx_resume one slot per rule, not four": _cut("ctx_resume", _n_rules),
    "ctx_resume empty": _cut("ctx_resume", lambda p: 0),
    "ctx_item names a rule past the rules": _ctx_item_rule,
    "ctx_item names a node past the nodes": _ctx_item_node,
    "ctx_start past ctx_item": _poke("ctx_start", -1, lambda p: 1 << 16),
    "be_start past be_target": _poke("be_start", -1, lambda p: 1 << 16),
    "re_start past re_rule": _poke("re_start", -1, lambda p: 1 << 16),
    "be_start decreasing": _reverse_offsets,
    "node_final short": _cut("node_final", lambda p: 1),
    "node_pure out of range": _poke("node_pure", 0, lambda p: 9),
    "be_lo wider than a byte": lambda p: _set_table(p, "be_lo", _table_of(p, "be_lo").astype("<i4") + 300),
    "root past the rules": _root,
    "a key of 8 bytes": _short_key,
    "more rule names than rules": _extra_rule_name,
    "a float table": _set_raw("be_target", "<f8", (1,), b"\0" * 8),
    "shape and data disagree": _set_raw("be_target", "<i4", (5,), b"\0" * 12),
    "a negative shape": _set_raw("be_target", "<i4", (-1, -3), b"\0" * 12),
    "a negative rule temperature": _set_raw("rule_temperature", "<f8", (1,), np.array([-1.0]).tobytes()),
    "rule temperatures for too few rules": _set_raw("rule_temperature", "<f8", (1,), np.array([0.5]).tobytes()),
    "rule temperatures as integers": _set_raw("rule_temperature", "<i4", (1,), b"\0" * 4),
    "no node_final": _drop("node_final"),
    "no be_lo": _drop("be_lo"),
    "no ctx_item": _drop("ctx_item"),
}


@pytest.mark.parametrize("case", sorted(TAMPERED))
def test_tampered_tables_with_a_valid_checksum_are_refused(json_info, case):
    fp = json_info.fingerprint
    original = xg2.GrammarCompiler(json_info).compile_grammar(EBNF)
    payload = _payload(original.serialize(), fp)
    TAMPERED[case](payload)
    blob = transport.pack(transport.KIND_GRAMMAR, fp, msgspec.msgpack.encode(payload))

    def load_and_step():
        loaded = xg2.GrammarCompiler(json_info).deserialize(blob)
        masks_along(loaded, _path(json_info, "((1+23)+(4))"))

    outcome = _in_child(load_and_step)
    assert outcome.startswith("refused"), f"{case}: {outcome}"


@pytest.mark.parametrize("dtype", ["<i8", "<i4", "<u4"])
def test_ctx_item_of_another_integer_dtype_is_read_or_refused_never_an_error(json_info, dtype):
    """The blob format lets a table name any of the integer dtypes in transport._DTYPES: a context
    table in another one (values all valid) must be converted or refused, not raise from numpy."""
    fp = json_info.fingerprint
    original = xg2.GrammarCompiler(json_info).compile_grammar(EBNF)
    payload = _payload(original.serialize(), fp)
    items = _table_of(payload, "ctx_item")
    if dtype == "<i4":
        items = (items >> np.uint64(32)) * np.uint64(0)     # all rule 0, node 0: still in range
    _set_table(payload, "ctx_item", items.astype(dtype))
    blob = transport.pack(transport.KIND_GRAMMAR, fp, msgspec.msgpack.encode(payload))
    outcome = _in_child(lambda: xg2.GrammarCompiler(json_info).deserialize(blob))
    assert outcome == "accepted" or outcome.startswith("refused"), outcome


def _own_entries_case(json_info):
    """A grammar compiled without the pool (every entry its own, so the blob carries them all), a
    path through it, its masks along the path, and its payload."""
    original = xg2.GrammarCompiler(json_info, cross_grammar_cache=False).compile_json_schema(SCHEMA)
    tokens = _path(json_info, CASES["json_schema"][1])
    expected = masks_along(original, tokens)
    payload = _payload(original.serialize(), json_info.fingerprint)
    assert payload.entries
    return original, tokens, expected, payload


def _list_entry(payload, nodes) -> tuple[int, bytearray]:
    """One of `nodes` whose entry lists its tokens (kind 0, at least one), and the entry's bytes."""
    for node in nodes:
        data = payload.entries[node]
        head = np.frombuffer(data[:32], "<i4")
        if head[1] == 0 and head[2] > 0:
            return node, bytearray(data)
    raise AssertionError("no entry of the list kind")


def _bad_entry(data: bytearray, case: str, info) -> bytes:
    if case == "garbage":
        return b"\x01\x02\x03"
    if case == "truncated":
        return bytes(data[:-2])
    if case == "bad magic":
        return b"\0\0\0\0" + bytes(data[4:])
    out = bytearray(data)
    out[32:36] = np.int32(info.stop_token_ids[0] if case == "stop token" else info.vocab_size).tobytes()
    return bytes(out)


@pytest.mark.parametrize("where, case", [
    (where, case) for where in ("first mask", "later")
    for case in ("stop token", "token id past the vocabulary", "garbage", "truncated", "bad magic")
] + [("out of range", "a node past the nodes"), ("out of range", "a node that holds no entry")])
def test_tampered_entries_are_refused_or_left_out(json_info, where, case):
    """A blob's own entries are read by the core, which refuses bad ones: those of the first mask
    with the grammar (the blob is then refused), the others after it (compiler._load_entries: one
    that does not load is built when needed). Either way a bad entry never gets in: the blob is
    refused, or the grammar masks exactly as the original."""
    fp = json_info.fingerprint
    original, tokens, expected, payload = _own_entries_case(json_info)
    initial = set(original._core.initial_nodes())
    bad = None
    if where == "out of range":
        _node, data = _list_entry(payload, payload.entries)
        if case == "a node past the nodes":
            payload.entries[10**6] = bytes(data)
        else:
            be_start = _table_of(payload, "be_start")
            empty = [n for n in range(len(be_start) - 1) if be_start[n + 1] == be_start[n]]
            assert empty
            payload.entries[empty[0]] = bytes(data)
    else:
        node, data = _list_entry(payload, [n for n in payload.entries if (n in initial) == (where == "first mask")])
        bad = payload.entries[node] = _bad_entry(data, case, json_info)
    blob = transport.pack(transport.KIND_GRAMMAR, fp, msgspec.msgpack.encode(payload))

    def load_and_compare():
        loaded = xg2.GrammarCompiler(json_info).deserialize(blob)
        if not np.array_equal(masks_along(loaded, tokens), expected):
            raise AssertionError("the masks differ from the original's")
        if bad is not None and bad in loaded._core.built_entries(own_only=False).values():
            raise AssertionError("the bad entry was installed")

    outcome = _in_child(load_and_compare)
    assert outcome == "accepted" or outcome.startswith("refused"), f"{where}, {case}: {outcome}"
    if where == "first mask":
        assert outcome.startswith("refused"), outcome     # read with the grammar: the blob is refused


@pytest.mark.parametrize("case", ["stop token", "garbage", "a key of 10 bytes"])
def test_tampered_first_mask_pool_entries_are_refused_or_left_out(json_info, case):
    """The pooled entries of the first mask ride along (payload.first) and go into the loading
    compiler's pool: a bad one must not."""
    fp = json_info.fingerprint
    original = xg2.GrammarCompiler(json_info).compile_json_schema(SCHEMA)
    tokens = _path(json_info, CASES["json_schema"][1])
    expected = masks_along(original, tokens)
    payload = _payload(original.serialize(), fp)
    assert payload.first
    key, data = next(iter(payload.first.items()))
    head = np.frombuffer(data[:32], "<i4")
    assert head[1] == 0 and head[2] > 0, "a list entry"
    if case == "a key of 10 bytes":
        del payload.first[key]
        key, bad = key[:10], data
    else:
        bad = _bad_entry(bytearray(data), case, json_info)
    payload.first[key] = bad
    blob = transport.pack(transport.KIND_GRAMMAR, fp, msgspec.msgpack.encode(payload))

    def load_and_compare():
        target = xg2.GrammarCompiler(json_info)
        loaded = target.deserialize(blob)
        if not np.array_equal(masks_along(loaded, tokens), expected):
            raise AssertionError("the masks differ from the original's")
        if target.entry_pool.dump(key) == bad:
            raise AssertionError("the bad entry went into the pool")

    outcome = _in_child(load_and_compare)
    assert outcome == "accepted" or outcome.startswith("refused"), f"{case}: {outcome}"


def test_an_untampered_payload_repacked_loads(json_info):
    """The tampering tests' own control: decoding and re-encoding a payload changes nothing."""
    _original, tokens, expected, payload = _own_entries_case(json_info)
    blob = transport.pack(transport.KIND_GRAMMAR, json_info.fingerprint, msgspec.msgpack.encode(payload))
    outcome = _in_child(lambda: np.testing.assert_array_equal(
        masks_along(xg2.GrammarCompiler(json_info).deserialize(blob), tokens), expected))
    assert outcome == "accepted", outcome


@pytest.mark.parametrize("payload", [b"", b"\xc1", b"\x93\x01\x02\x03", msgspec.msgpack.encode({"a": 1}),
                                     msgspec.msgpack.encode([[], {}, None, []])])
def test_malformed_payloads_with_a_valid_checksum_are_refused(json_info, payload):
    blob = transport.pack(transport.KIND_GRAMMAR, json_info.fingerprint, payload)
    outcome = _in_child(lambda: xg2.GrammarCompiler(json_info).deserialize(blob))
    assert outcome.startswith("refused"), outcome


# -- modules -----------------------------------------------------------------------------------------

def _assert_same_module(a, b) -> None:
    la, lb = a.lowered, b.lowered
    assert la.rule_names == lb.rule_names and la.root == lb.root
    assert (la.follows or {}) == (lb.follows or {})
    assert la.arrays.keys() == lb.arrays.keys()
    for name in la.arrays:
        assert la.arrays[name].dtype == lb.arrays[name].dtype, name
        np.testing.assert_array_equal(la.arrays[name], lb.arrays[name], err_msg=name)
    ka, kb = a.keys, b.keys
    assert ka.rule == kb.rule and ka.ctx == kb.ctx
    assert len(ka.canon) == len(kb.canon)
    for ca, cb in zip(ka.canon, kb.canon):
        assert (ca is None) == (cb is None)
        if ca is not None:
            np.testing.assert_array_equal(ca, cb)
    assert (la.fsms is None) == (lb.fsms is None)
    if la.fsms is not None:
        for fa, fb in zip(la.fsms, lb.fsms, strict=True):
            assert [sorted(e) for e in fa.byte_edges] == [sorted(e) for e in fb.byte_edges]
            assert [sorted(e) for e in fa.rule_edges] == [sorted(e) for e in fb.rule_edges]
            assert set(fa.finals) == set(fb.finals) and bool(fa.deterministic) == bool(fb.deterministic)
    assert [(m, c) for m, c in a.warnings] == [(m, c) for m, c in b.warnings]


@pytest.mark.parametrize("case", ["structural_tag", "any_of_linked"])
def test_module_round_trip_keeps_tables_and_keys_and_links_the_same(json_info, case):
    build, text = CASES[case]
    fp = json_info.fingerprint
    source = xg2.GrammarCompiler(json_info)
    original = build(source)
    assert source._modules
    if case == "structural_tag":
        assert all(m.lowered.fsms is not None for m in source._modules.values())   # frames need automata
    loaded = {}
    for key, module in source._modules.items():
        blob = transport.dump_module(module, fp)
        loaded[key] = transport.load_module(blob, fp)
        _assert_same_module(module, loaded[key])
    target = xg2.GrammarCompiler(json_info)
    for key, module in loaded.items():
        target._modules[key] = module
    relinked = build(target)
    assert all(target._modules[key] is module for key, module in loaded.items())   # used, not rebuilt
    assert_same_masks(original, relinked, _path(json_info, text))


def test_module_warnings_ride_along(json_info):
    fp = json_info.fingerprint
    compiler = xg2.GrammarCompiler(json_info)
    with pytest.warns(xg2.SchemaWarning):
        compiler.compile_json_schema(LENIENT_ANY_OF, lenient=True)
    warned = [m for m in compiler._modules.values() if m.warnings]
    assert warned
    loaded = transport.load_module(transport.dump_module(warned[0], fp), fp)
    assert loaded.warnings == warned[0].warnings
    assert all(issubclass(c, xg2.SchemaWarning) for _m, c in loaded.warnings)


def test_module_refusals(json_info, small_info):
    fp = json_info.fingerprint
    compiler = xg2.GrammarCompiler(json_info)
    compiler.compile_structural_tag(_qwen_tag())
    module = next(iter(compiler._modules.values()))
    blob = transport.dump_module(module, fp)
    with pytest.raises(VocabularyMismatchError):
        transport.load_module(blob, small_info.fingerprint)
    for n in range(0, len(blob), max(1, len(blob) // 200)):
        with pytest.raises(DeserializeError):
            transport.load_module(blob[:n], fp)
    payload = msgspec.msgpack.decode(transport.unpack(blob, transport.KIND_MODULE, fp), type=transport.ModulePayload)
    assert payload.lowered.fsms is not None
    payload.lowered.fsms = payload.lowered.fsms[:-1]
    with pytest.raises(DeserializeError, match="automata"):
        transport.load_module(transport.pack(transport.KIND_MODULE, fp, msgspec.msgpack.encode(payload)), fp)


def test_entry_blob_round_trip_and_refusals(json_info, small_info):
    fp = json_info.fingerprint
    compiler = xg2.GrammarCompiler(json_info)
    masks_along(compiler.compile_json_schema(SCHEMA), _path(json_info, CASES["json_schema"][1]))
    key = compiler.entry_pool.keys()[0]
    entry = compiler.entry_pool.dump(key)
    blob = transport.dump_entry(entry, fp)
    assert transport.load_entry(blob, fp) == entry
    with pytest.raises(VocabularyMismatchError):
        transport.load_entry(blob, small_info.fingerprint)
    flipped = bytearray(blob)
    flipped[-1] ^= 0x10
    with pytest.raises(DeserializeError, match="checksum"):
        transport.load_entry(bytes(flipped), fp)
