"""GrammarCompiler and CompiledGrammar: from IR to the flat tables the Cython core runs on."""

from __future__ import annotations

import contextlib
import functools
import json
import queue
import threading
import time
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import msgspec
import numpy as np

from ._ext.core import ClassTrie, CompiledCore, EntryPool, Vocab
from .errors import TokenizerError, UsageError, XG2Error
from .grammar import budget
from .grammar.grammar import Grammar
from .grammar.ir import SPECIAL_LEAD, text_bytes
from .lowering import LoweredGrammar, Module, byte_classes, link, link_frame, lower
from .tokenizer import TokenizerInfo

#: Default `compile_timeout_ms`: a few seconds. Every ordinary large input measured here (hundreds
#: of properties, thousands of rules or alternatives, long regexes, tags with excluded strings;
#: benchmarks/bench_compile.py) compiles in well under half a second, so the deadline never fires
#: on them even on a loaded machine, while a tenant's pathological input cannot hold a compile
#: thread for longer than a request's time to first token is worth.
DEFAULT_COMPILE_TIMEOUT_MS = 5000.0
#: Default `fill_timeout_ms`: the CPU time one fill may spend building a mask entry it lacks (and an
#: accept, or a fill's checks of uncertain tokens, in the parser). The costliest entries of the
#: corpora measured here (benchmarks/) build in tens of milliseconds; a hostile grammar's can take
#: minutes, and a fill stalls its whole batch while it builds. Past the budget the fill fails that
#: session alone (FillTimeoutError). CPU time, not wall time: a busy machine slows a legitimate
#: build without making it fail.
DEFAULT_FILL_TIMEOUT_MS = 500.0


#: Default `cache_limit_bytes`. xgrammar's default is no limit; here, unbounded, the caches of a
#: compiler serving the tool-calling benchmark held 854 MB after 300 requests and those of the
#: multi-tenant one 2.5 GB (every new tool set adds tables and pool entries): a process that
#: serves for days needs a bound by default. Past it the pool's entries go first (see _evict).
DEFAULT_CACHE_LIMIT_BYTES = 1 << 30
#: GrammarCompiler.reuse's counters.
REUSE_COUNTS = ("modules_local", "modules_shards", "modules_lowered", "entries_needed", "entries_local",
                "entries_shards")


class MustLower(Exception):
    """A link-only compile (GrammarCompiler.linking_only) met something it would have to lower:
    a module found neither in the compiler nor in its second tier, or a grammar that is not a frame
    of modules. Nothing of the attempt is counted; the spec is lowered elsewhere."""


def _budgeted(what: str):
    """A public compile method run under its compiler's deadline (see grammar/budget.py)."""
    def wrap(method):
        @functools.wraps(method)
        def run(self, *args, **kwargs):
            with budget.deadline(self.compile_timeout_ms, what):
                return method(self, *args, **kwargs)
        return run
    return wrap


class CompiledGrammar:
    """A grammar lowered for one tokenizer, with its mask entries built on first visit (JIT)."""

    def __init__(self, grammar: Grammar | Callable[[], Grammar], tokenizer_info: TokenizerInfo,
                 lowered: LoweredGrammar, core: CompiledCore):
        self._grammar = grammar     # or how to make it: a linked grammar never needs its IR
        self._tokenizer_info = tokenizer_info
        self._lowered = lowered
        self._core = core
        self._precomputed = threading.Event()   # set once compile-time precomputation is over
        self._warnings: list[tuple[str, type[Warning]]] = []   # said again when a cache serves it
        self._tables_bytes: int | None = None
        self._source: tuple[str, str] | None = None    # (kind, text) the grammar is rebuilt from
        self._built_keys: list[bytes] | None = None    # loaded: pool keys its writer had built
        self._pending_entries: dict[int, bytes] | None = None   # loaded: entries installed after the first mask
        self._precompute_budget_ms: float | None = None         # None: the compiler's
        self._tier_found: int | None = None     # first-mask entries a second tier had (None: not asked)
        self._tier_modules = 0      # its modules that came from a second tier (see ShardedCache.prefetch)
        self._tier_examined: tuple[int, set] | None = None    # pool keys a tier's publisher has looked at
        # where a runtime got it (see GrammarRuntime: "compiled" or "shards") and, compiled, what
        # its compile found where (GrammarCompiler.reuse's counts)
        self._origin = "compiled"
        self._reuse: dict[str, int] | None = None
        self._make_trie: Callable[[], ClassTrie | None] | None = None   # its class trie, to build in the background

    @property
    def grammar(self) -> Grammar:
        if not isinstance(self._grammar, Grammar):
            if self._grammar is None:
                raise UsageError("this compiled grammar was loaded from bytes that carry no source")
            self._grammar = self._grammar()
        return self._grammar

    def serialize(self, *, all_entries: bool = False) -> bytes:
        """Compact bytes (xg2.transport): tables, content keys, the entries that belong to this
        grammar alone and those of its first mask, and the source. `GrammarCompiler.deserialize`
        reads them in any process with the same vocabulary and engine version; the other pooled
        entries travel on their own (`GrammarCompiler.entry_pool`, or a cache tier), or with
        `all_entries` in these bytes too."""
        from . import transport

        return transport.dump_grammar(self, all_pooled=all_entries)

    def serialize_json(self) -> str:
        """xgrammar's JSON form (see xg2.serialization), without the vocabulary, which
        deserialize_json is given."""
        from .serialization import compiled_grammar_to_json

        return compiled_grammar_to_json(self)

    @staticmethod
    def deserialize_json(json_string: str, tokenizer_info: TokenizerInfo) -> CompiledGrammar:
        """The compiled grammar of serialize_json(), for `tokenizer_info` (the one it was written
        for, else DeserializeFormatError); it joins a reading compiler of the vocabulary (see
        xg2.serialization; GrammarCompiler.deserialize joins your own)."""
        from .serialization import compiled_grammar_from_json

        return compiled_grammar_from_json(json_string, tokenizer_info)

    @property
    def tokenizer_info(self) -> TokenizerInfo:
        return self._tokenizer_info

    @property
    def memory_size_bytes(self) -> int:
        """What it holds (see held_bytes) plus the mask entries built so far (pooled ones included)."""
        return int(self._core.cache_bytes) + self.held_bytes

    @property
    def tables_bytes(self) -> int:
        """The part that does not change once compiled: tables, and automata and keys kept beside them."""
        if self._tables_bytes is None:
            self._tables_bytes = (int(sum(a.nbytes for a in self._lowered.arrays.values()))
                                  + self._lowered.python_bytes)
        return self._tables_bytes

    @property
    def held_bytes(self) -> int:
        """Everything but the entries, now: the tables, and the C working memory (parsers and
        transition memo) of the entry builder, which grows as entries are built."""
        return self.tables_bytes + int(self._core.heap_bytes)

    @property
    def rule_hashes(self) -> dict[str, str]:
        """Content key of each rule (hex): equal for equal structures in any grammar."""
        return dict(zip(self._lowered.rule_names, (k.hex() for k in self._lowered.keys.rule)))


_VOCAB_LOCK = threading.Lock()
_VOCABS: dict[str, Vocab] = {}
_MAX_VOCABS = 8


def vocab_core(info: TokenizerInfo) -> Vocab:
    """The core's view of a vocabulary (sorted tokens and byte trie), built once per distinct vocabulary."""
    with _VOCAB_LOCK:
        core = _VOCABS.get(info.fingerprint)
        if core is None:
            decoded = info.decoded_vocab
            special = set(info.special_token_ids)
            stops = set(info.stop_token_ids)
            # A token holding a byte UTF-8 never uses (F8-FF) is never allowed: no text has it, and
            # the spelling of special tokens starts with one (ir.text_bytes).
            ordinary = [i for i, b in enumerate(decoded) if b and i not in special and i not in stops
                        and max(b) < SPECIAL_LEAD]
            # Special tokens a grammar can name walk the parser as their character there; no
            # other grammar allows them (see TokenizerInfo.named_special_tokens).
            for i, ch in info.named_special_tokens.items():
                decoded[i] = text_bytes(ch)
                ordinary.append(i)
            ordinary.sort(key=decoded.__getitem__)
            try:
                core = Vocab(list(decoded), info.vocab_size, ordinary, sorted(stops))
            except ValueError as e:
                raise TokenizerError(str(e)) from e
            core.token_sample  # noqa: B018 - built here, once per vocabulary, not in a compile
            if len(_VOCABS) >= _MAX_VOCABS:
                _VOCABS.pop(next(iter(_VOCABS)))
            _VOCABS[info.fingerprint] = core
        return core


#: Keywords that do not constrain a value (a top-level `anyOf` next to them can be linked).
_ANNOTATIONS = frozenset({"title", "description", "$schema", "$id", "$comment", "examples", "default"})
_ENCODER = msgspec.json.Encoder()


def _warn(said: list[tuple[str, type[Warning]]]) -> None:
    for message, category in said:
        warnings.warn(message, category, stacklevel=4)


def _localize_refs(branch: dict, prefix: str) -> dict | None:
    """A copy of `branch` with its references into itself (`prefix/...`) made relative to it, so
    that it is a schema of its own; None if any reference points elsewhere."""
    root = dict(branch)
    stack: list[dict | list] = [root]
    while stack:
        node = stack.pop()
        for k, v in list(node.items() if isinstance(node, dict) else enumerate(node)):
            if k == "$ref" and isinstance(node, dict):
                if not isinstance(v, str) or not (v == prefix or v.startswith(prefix + "/")):
                    return None
                node[k] = "#" + v[len(prefix):]
            elif isinstance(v, (dict, list)):
                node[k] = dict(v) if isinstance(v, dict) else list(v)
                stack.append(node[k])
    return root


#: Walk the class trie only when it is at most this fraction of the byte trie.
CLASS_TRIE_MAX_RATIO = 0.6
#: Build a class trie only when a sample of tokens collapses to at most this fraction of distinct
#: class sequences (a cheap stand-in for the size of the trie).
CLASS_TRIE_MAX_SAMPLE_RATIO = 0.7
#: Class tries a compiler keeps (grammars with equal byte classes share one).
MAX_CLASS_TRIES = 64


def _class_trie_of(vocab: Vocab, classes: bytes, tries: dict[bytes, ClassTrie | None],
                   lock: threading.Lock) -> ClassTrie | None:
    """The class trie of `classes` from a compiler's `tries`, built and kept there if missing
    (None when a token sample shows it would not be much smaller than the byte trie)."""
    with lock:
        if classes in tries:
            return tries[classes]
    sample = vocab.token_sample
    trie = None
    if len({t.translate(classes) for t in sample}) <= CLASS_TRIE_MAX_SAMPLE_RATIO * len(sample):
        trie = ClassTrie(vocab, np.frombuffer(classes, dtype=np.uint8))
        if trie.n_nodes > CLASS_TRIE_MAX_RATIO * vocab.n_trie:
            trie = None
    with lock:
        if len(tries) >= MAX_CLASS_TRIES:
            tries.pop(next(iter(tries)))
        tries[classes] = trie
    return trie


class _Running:
    """The core whose background precompute runs now (read by the compiler that queues the next)."""

    __slots__ = ("core",)

    def __init__(self) -> None:
        self.core: CompiledCore | None = None


def _precompute_worker(jobs: queue.SimpleQueue, running: _Running) -> None:
    """A compiler's background precompute thread; None (put when the compiler is collected) ends it.

    The newest grammar's job goes first: a job is cancelled between two entries when another is
    queued (GrammarCompiler._precompute), and goes back to the end of the queue with what is left
    of its budget. Why: the grammar compiled last is the one whose first fills are about to come,
    while the older ones' requests are decoding already; queued behind an older job, a new grammar's
    fills built the entries themselves, on the byte trie (its class trie not built yet)."""
    while True:
        job = jobs.get()
        if job is None:
            return
        core, t0, budget_ms, top_k, timeout_ms, done, pending, make_trie = job
        again = False
        running.core = core
        try:
            if make_trie is not None:   # built here, not on the compile path (see GrammarCompiler._compile)
                core.use_class_trie(make_trie())
            core.start_background()     # a builder of its own: the fills never wait for it
            _load_entries(core, pending)
            # One entry build may run past the budget, not past what any compile may take.
            _precompute_costliest(core, t0, budget_ms, top_k, background=True,
                                  hard_deadline=0.0 if timeout_ms is None else time.perf_counter() + timeout_ms / 1e3)
            again = core.resume_background() and time.perf_counter() < t0 + budget_ms / 1e3
        except MemoryError:
            pass    # what was not built is built on first visit; the next jobs must still run
        finally:
            running.core = None
            if again:
                jobs.put((core, t0, budget_ms, top_k, timeout_ms, done, None, None))
            else:
                core.end_background()
                done.set()


def _load_entries(core: CompiledCore, entries: dict[int, bytes] | None) -> None:
    """Install entries a serialized grammar carried (node -> bytes); one that does not load is
    simply built when needed."""
    last_yield = time.perf_counter()
    for node, data in (entries or {}).items():
        now = time.perf_counter()
        if now - last_yield > 0.002:    # give up the GIL now and then (this runs beside compiles and fills)
            time.sleep(0)
            last_yield = time.perf_counter()
        try:
            core.load_entry(node, data)
        except (ValueError, MemoryError):
            pass


def _precompute_costliest(core: CompiledCore, t0: float, budget_ms: float, top_k: int | None,
                          background: bool = False, hard_deadline: float = 0.0) -> None:
    """Costliest first, by an estimate of the trie they reach, since those are the ones a
    mid-generation build would stall on; one predicted to overrun the budget (counted from
    `t0`) is left for later. All in C without the GIL (CompiledCore.precompute_costliest);
    `background`: with the builder the core lent the background thread."""
    core.precompute_costliest(t0 + budget_ms / 1e3, -1 if top_k is None else top_k, background, hard_deadline)


def _named_key(named: Any) -> tuple | None:
    """The named grammars of a Lark compile as cache-key text: per name, ("lark", text) or, for a
    Grammar, ("ebnf", normalised text, root). Values of other types are left to the front-end to
    refuse (None: not cached)."""
    if named is None:
        return ()
    if not isinstance(named, dict):
        return None
    out = []
    for name, value in named.items():
        if isinstance(value, str):
            out.append((str(name), "lark", value))
        elif isinstance(value, Grammar):
            out.append((str(name), "ebnf", str(value), value.ir.root))
        else:
            return None
    return tuple(sorted(out))


def _source_of(key: tuple) -> tuple[str, str] | None:
    """The source a compile cache key names, as (kind, text) for a serialized grammar."""
    if key[0] == "lark":
        named = {n: {"lark": v[0]} if kind == "lark" else {"ebnf": v[0], "root_rule_name": v[1]}
                 for n, kind, *v in key[2]}
        try:
            return ("lark", msgspec.json.encode({"grammar": key[1], "named_grammars": named}).decode())
        except UnicodeEncodeError:      # a lone surrogate (in a comment): no source to carry
            return None
    if key[0] == "ebnf":
        return ("ebnf", msgspec.json.encode({"grammar": key[1], "root_rule_name": key[2]}).decode())
    if key[0] == "regex":
        return ("regex", key[1])
    if key[0] in ("structural_tag", "structural_tag_whole"):
        return ("structural_tag", key[1])
    if key[0] == "builtin_json":
        return ("builtin_json", "")
    if key[0] == "json":
        names = ("any_whitespace", "indent", "separators", "strict_mode", "max_whitespace_cnt", "any_order",
                 "lenient", "format_assertion", "string_escapes", "integers_as_numbers")
        options: dict[str, Any] = dict(zip(names, key[2], strict=True))
        if len(key) > 3 and key[3] is not None:
            options["schema_store"] = msgspec.Raw(key[3])      # the registered documents travel too
        return ("json_schema", msgspec.json.encode({"schema": msgspec.Raw(key[1]), "options": options}).decode())
    return None


def _grammar_from_source(source: tuple[str, str], tokenizer_info: TokenizerInfo) -> Grammar:
    kind, text = source
    if kind == "regex":
        return Grammar.from_regex(text)
    if kind == "builtin_json":
        return Grammar.builtin_json_grammar()
    if kind == "structural_tag":
        return Grammar.from_structural_tag(text, tokenizer_info)
    spec = msgspec.json.decode(text)
    if kind == "ebnf":
        return Grammar.from_ebnf(spec["grammar"], root_rule_name=spec["root_rule_name"])
    if kind == "lark":
        named = {n: v["lark"] if "lark" in v else Grammar.from_ebnf(v["ebnf"], root_rule_name=v["root_rule_name"])
                 for n, v in spec["named_grammars"].items()}
        return Grammar.from_lark(spec["grammar"], tokenizer_info=tokenizer_info, named_grammars=named)
    if kind == "json_schema":
        options = spec["options"]
        if options.get("separators") is not None:
            options["separators"] = tuple(options["separators"])
        return Grammar.from_json_schema(spec["schema"], **options)
    raise UsageError(f"a serialized grammar's source of unknown kind {kind!r}")


class GrammarCompiler:
    """Compiles grammars for one tokenizer.

    Two caches share `cache_limit_bytes` (default 1 GiB; -1: unbounded): compiled grammars by their normalised
    text (`cache_enabled`), and the cross-grammar pool of mask entries (`cross_grammar_cache`),
    through which every grammar this compiler builds reuses the entries of sub-structures it has
    seen before. Partial JIT: compile builds the entries of the first mask and returns; the
    costliest others are built within `precompute_budget_ms` (and at most `precompute_top_k` of
    them) by a background thread, with a builder of its own so that fills never wait for it, while
    the model prefills, the newest grammar's first (`background_precompute=False` builds them on the
    compile path instead);
    the rest are built on first visit. `jit=False` builds every entry at compile
    time and `repetition_compression=False` unrolls every bounded repetition: with both, and
    without the pool, the engine runs with every optimisation off (masks are the same).
    Every compile (front-end, automata, keys, the first mask's entries, and with `jit=False` all
    of them) stops with GrammarLimitError past `compile_timeout_ms` (None: no limit); the compiler
    keeps nothing of it and stays usable. A fill that must build an entry it lacks, or an accept,
    stops past `fill_timeout_ms` of its thread's CPU time (None: no limit) with FillTimeoutError for
    that matcher alone.
    """

    def __init__(self, tokenizer_info: TokenizerInfo, *, max_threads: int = 8, cache_enabled: bool = True,
                 cache_limit_bytes: int = DEFAULT_CACHE_LIMIT_BYTES, precompute_budget_ms: float = 40.0,
                 precompute_top_k: int | None = None, background_precompute: bool = True,
                 jit: bool = True, cross_grammar_cache: bool = True, repetition_compression: bool = True,
                 compile_timeout_ms: float | None = DEFAULT_COMPILE_TIMEOUT_MS,
                 fill_timeout_ms: float | None = DEFAULT_FILL_TIMEOUT_MS):
        if not isinstance(tokenizer_info, TokenizerInfo):
            raise TypeError("tokenizer_info must be an xg2.TokenizerInfo")
        if max_threads < 1:
            raise UsageError("max_threads must be at least 1")
        if precompute_top_k is not None and precompute_top_k < 0:
            raise UsageError("precompute_top_k must be at least 0")
        if compile_timeout_ms is not None and not compile_timeout_ms > 0:
            raise UsageError("compile_timeout_ms must be positive (or None for no limit)")
        if fill_timeout_ms is not None and not fill_timeout_ms > 0:
            raise UsageError("fill_timeout_ms must be positive (or None for no limit)")
        self.compile_timeout_ms = compile_timeout_ms
        self.fill_timeout_ms = fill_timeout_ms
        self.tokenizer_info = tokenizer_info
        self.max_threads = max_threads
        self.cache_enabled = cache_enabled
        self.cache_limit_bytes = cache_limit_bytes
        self.precompute_budget_ms = precompute_budget_ms
        self.precompute_top_k = precompute_top_k
        self.background_precompute = background_precompute
        self.jit = jit
        self.repetition_compression = repetition_compression
        self._cache: dict[tuple, CompiledGrammar] = {}
        self._modules: OrderedDict[tuple, Module] = OrderedDict()
        self._held_bytes = 0      # tables of the cached grammars and modules (entries: the pool)
        self._heap_known: dict[tuple, int] = {}  # cached grammar -> its working memory when last read
        self._heap_sum = 0                         # their sum (see _heap_bytes)
        self._lock = threading.Lock()
        self._vocab = vocab_core(tokenizer_info)
        self._pool = (EntryPool(self._vocab, tokenizer_info.fingerprint, cache_limit_bytes)
                      if cross_grammar_cache else None)
        self._class_tries: dict[bytes, ClassTrie | None] = {}
        self._horizons: dict[bytes, bool] = {}      # literal -> no token reads past it
        self._vocab_blob: bytes | None = None       # every token's bytes end to end, for _impassable
        self._vocab_ends: np.ndarray | None = None
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        self._running = _Running()
        self.last_compile_seconds: float | None = None
        #: A second cache tier (xg2.actors): called with the pool keys of a new grammar's first
        #: mask that this pool lacks, before that mask is built; it loads what it finds into
        #: `entry_pool` and says how many. Called on the compiling thread (the tier fetches the others in the
        #: background, as the precompute builds them: partial JIT).
        self.entry_source: Callable[[list[bytes]], int] | None = None
        #: The same tier for modules: `fetch(keys)` gets those it holds in one batch, `take(key)`
        #: hands one over (or None), `publish(key, module)` sends a module built here.
        self.module_source: Any = None
        #: What compiles here found where (read by the runtime's reuse figures): modules found in
        #: this compiler's cache, taken from the second tier, or lowered; pool keys of first masks
        #: needed, found in the pool, found in the second tier. Deserialized grammars are not
        #: counted (their writer counted them).
        self.reuse: dict[str, int] = dict.fromkeys(REUSE_COUNTS, 0)
        self._local = threading.local()     # `tally`: a link-only compile's counts, kept if it succeeds

    @contextlib.contextmanager
    def linking_only(self) -> Iterator[dict[str, int]]:
        """Within it, this thread's compiles only link what exists: a structural tag's (or a tool
        set's) frame is lowered, its modules must come from this compiler or its second tier, and
        anything else to lower raises MustLower. Yields the attempt's reuse counts, added to
        `reuse` only when the compile succeeds.

        Why: a replica whose compiles run in worker processes links a set of known tools on its
        own compile thread in a few milliseconds, rather than paying a worker's round trip and the
        grammar's serialization both ways for work that lowers nothing."""
        tally = dict.fromkeys(REUSE_COUNTS, 0)
        self._local.tally = tally
        try:
            yield tally
        finally:
            self._local.tally = None
        with self._lock:        # reached only when the compile succeeded
            for k, v in tally.items():
                self.reuse[k] += v

    def _count(self, name: str, n: int = 1) -> None:
        tally = getattr(self._local, "tally", None)
        (tally if tally is not None else self.reuse)[name] += n

    def _must_lower(self) -> None:
        if getattr(self._local, "tally", None) is not None:
            raise MustLower

    def _core_of(self, arrays: dict, root: int, trie: ClassTrie | None, pool: EntryPool | None,
                 keys: Any) -> CompiledCore:
        core = CompiledCore(self._vocab, arrays, root, trie, pool, keys)
        core.fill_timeout_s = 0.0 if self.fill_timeout_ms is None else self.fill_timeout_ms / 1e3
        return core

    @property
    def entry_pool(self) -> EntryPool | None:
        return self._pool

    @_budgeted("an EBNF grammar")
    def compile_grammar(self, grammar: str | Grammar, *, root_rule_name: str = "root") -> CompiledGrammar:
        if isinstance(grammar, str):
            text = grammar
            return self._compile_source(("ebnf", text, root_rule_name),
                                        lambda: Grammar.from_ebnf(text, root_rule_name=root_rule_name))
        if not isinstance(grammar, Grammar):
            raise TypeError("grammar must be EBNF text or an xg2.Grammar")
        return self._compile(grammar)

    @_budgeted("a regex")
    def compile_regex(self, regex: str) -> CompiledGrammar:
        if not isinstance(regex, str):
            raise TypeError("regex_string must be a str")
        return self._compile_source(("regex", regex), lambda: Grammar.from_regex(regex))

    @_budgeted("a Lark grammar")
    def compile_lark(self, lark_string: str, *,
                     named_grammars: dict[str, Grammar | str] | None = None) -> CompiledGrammar:
        """A grammar in xgrammar's Lark dialect (see Grammar.from_lark; special tokens are
        resolved in this compiler's vocabulary), compiled and cached by its text and the named
        grammars' (Lark text, or a Grammar's normalised EBNF and root)."""
        if not isinstance(lark_string, str):
            raise TypeError("lark_string must be a str")
        info = self.tokenizer_info      # for special tokens, as xgrammar's compile_lark
        named_key = _named_key(named_grammars)
        if named_key is None:   # not a dict of texts and Grammars: the front-end says what is wrong
            return self._compile(Grammar.from_lark(lark_string, tokenizer_info=info, named_grammars=named_grammars))
        return self._compile_source(("lark", lark_string, named_key), lambda: Grammar.from_lark(
            lark_string, tokenizer_info=info, named_grammars=named_grammars))

    @_budgeted("a JSON Schema")
    def compile_json_schema(self, schema: Any, *, any_whitespace: bool = True, indent: int | None = None,
                            separators: tuple[str, str] | None = None, strict_mode: bool = True,
                            max_whitespace_cnt: int | None = None, any_order: bool = False,
                            lenient: bool = False, format_assertion: bool = True,
                            schema_store: Mapping[str, Any] | None = None,
                            string_escapes: str = "non_ascii", integers_as_numbers: bool = False
                            ) -> CompiledGrammar:
        options = {"any_whitespace": any_whitespace, "indent": indent, "separators": separators,
                   "strict_mode": strict_mode, "max_whitespace_cnt": max_whitespace_cnt, "any_order": any_order,
                   "lenient": lenient, "format_assertion": format_assertion, "schema_store": schema_store,
                   "string_escapes": string_escapes, "integers_as_numbers": integers_as_numbers}
        if isinstance(schema, (str, bytes)):
            # JSON text (what a server receives) takes the path of the document it holds: the same
            # cache key and the linked path for anyOf tool sets. Text that does not decode is left
            # to the front-end, which says why with its typed error.
            try:
                schema = json.loads(schema)
            except (ValueError, RecursionError):
                pass
        branches = self._linkable_branches(schema) if schema_store is None else None
        if branches is not None:
            compiled = self._compile_linked(schema, branches, options)
            if compiled is not None:
                return compiled
        key = self._schema_key(schema, options)
        if key is not None:
            return self._compile_source(key, lambda: Grammar.from_json_schema(schema, **options))
        return self._compile(Grammar.from_json_schema(schema, **options))

    @staticmethod
    def _schema_key(schema: Any, options: dict[str, Any]) -> tuple | None:
        """The compile cache's key of a schema: its JSON text and the options; None when it has
        none (a pydantic class, values JSON cannot hold) or when compiling it warns (lenient mode:
        the warnings are said again on every compile, which a cache hit would skip)."""
        if options["lenient"] or not isinstance(schema, (dict, bool, str)):
            return None
        try:
            store = options.get("schema_store")
            rest = tuple(v for k, v in options.items() if k != "schema_store")
            return ("json", _ENCODER.encode(schema), rest, None if store is None else _ENCODER.encode(dict(store)))
        except (TypeError, ValueError, OverflowError, RecursionError):   # the front-end says what is wrong
            return None

    def _compile_source(self, key: tuple, build: Callable[[], Grammar]) -> CompiledGrammar:
        """Compiled and cached by the source text (`key`): printing a large grammar to key the
        cache cost as much as compiling it, and a hit then skips the front-end too."""
        hit = self._cached(key)
        if hit is not None:
            return hit
        self._must_lower()
        return self._compile(build(), key, _source_of(key))

    def _linkable_branches(self, schema: Any) -> list[tuple[dict, bytes]] | None:
        """The branches of a top-level `anyOf` with their JSON text, when each is a schema of its
        own (no `$ref`, which could point anywhere in the document) and nothing else constrains
        the value; else None."""
        if self._pool is None or not isinstance(schema, dict) or not isinstance(schema.get("anyOf"), list):
            return None
        if len(schema["anyOf"]) < 2 or any(k not in _ANNOTATIONS for k in schema if k != "anyOf"):
            return None
        out = []
        for i, branch in enumerate(schema["anyOf"]):
            if not isinstance(branch, dict):
                return None
            try:
                text = _ENCODER.encode(branch)
            except (TypeError, ValueError, OverflowError, RecursionError):
                return None     # nested too deep to encode: lowering the whole schema reports where
            if b'"$ref"' in text:
                branch = _localize_refs(branch, f"#/anyOf/{i}")
                if branch is None:
                    return None
                text = _ENCODER.encode(branch)
            out.append((branch, text))
        return out

    def _compile_linked(self, schema: dict, branches: list[tuple[dict, bytes]],
                        options: dict[str, Any]) -> CompiledGrammar | None:
        """`anyOf` branches lowered once each as modules and linked (linking.py); None when a
        branch cannot be a module (or fails: the whole schema is then compiled to report it
        with its full pointer)."""
        t0 = time.perf_counter()
        opts = tuple(options.values())
        key = ("anyOf", opts, tuple(text for _branch, text in branches))
        hit = self._cached(key)
        if hit is not None:
            _warn(hit._warnings)
            return hit
        self._fetch_modules([(opts, text) for _branch, text in branches])
        modules = []
        said = []
        first: dict[bytes, int] = {}      # a branch text -> where it first occurs
        for i, (branch, text) in enumerate(branches):
            if text in first:
                continue            # a branch written twice: one module
            first[text] = i
            module = self._module((opts, text), lambda branch=branch: Grammar.from_json_schema(branch, **options))
            if module is None:
                return None
            said += [(m.replace(" (at /)", f" (at /anyOf/{i})").replace(" (at /", f" (at /anyOf/{i}/"), c)
                     for m, c in module.warnings]
            modules.append(module)
        _warn(said)
        lowered = link(modules)
        with self._lock:
            trie = self._class_tries.get(byte_classes(lowered.arrays))   # no trie built on this path
        core = self._core_of(lowered.arrays, lowered.root, trie, self._pool, lowered.core_keys())
        compiled = CompiledGrammar(lambda: Grammar.from_json_schema(schema, **options), self.tokenizer_info,
                                   lowered, core)
        compiled._warnings = said
        compiled._tier_modules = sum(m.from_tier for m in modules)
        compiled._source = _source_of(("json", _ENCODER.encode(schema),
                                       tuple(v for k, v in options.items() if k != "schema_store")))
        return self._finish(key, compiled, t0)

    def _module(self, key: tuple, build: Callable[[], Grammar], keep_fsms: bool = False) -> Module | None:
        """The module of a sub-grammar, lowered once per key (None if it cannot be one)."""
        with self._lock:
            module = self._modules.pop(key, None)
            if module is not None:
                self._modules[key] = module
                self._count("modules_local")
                return module
        if self.module_source is not None:
            module = self.module_source.take(key)
            if module is not None and (module.lowered.fsms is not None or not keep_fsms):
                module.from_tier = True
                with self._lock:
                    self._keep(self._modules, key, module, module.nbytes)
                    self._evict()
                self._count("modules_shards")
                return module
        self._must_lower()
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                lowered = lower(build().ir, compress=self.repetition_compression, max_token_bytes=self._vocab.max_depth)
        except budget.CompileTimeout:
            raise
        except XG2Error:
            return None     # the whole schema is compiled next, which reports it with its full pointer
        module = Module(lowered, [(str(w.message), w.category) for w in caught])
        if not module.linkable:
            return None
        module.keys  # noqa: B018 - computed once here, outside any request that reuses the module
        if not keep_fsms:
            lowered.fsms = None     # linking needs the tables and keys only; the automata stay memoised
        self._count("modules_lowered")
        with self._lock:
            self._keep(self._modules, key, module, module.nbytes)
            self._evict()
        if self.module_source is not None:
            self.module_source.publish(key, module)
        return module

    def _fetch_modules(self, keys: list[tuple]) -> None:
        """Ask the second tier, in one batch, for the modules of `keys` this compiler lacks."""
        if self.module_source is None:
            if any(k not in self._modules for k in keys):
                self._must_lower()
            return
        with self._lock:
            missing = list(dict.fromkeys(k for k in keys if k not in self._modules))
        if not missing:
            return
        if getattr(self._local, "tally", None) is None:
            self.module_source.fetch(missing)
        elif self.module_source.fetch(missing, all_or_nothing=True) < len(missing):
            raise MustLower     # a link-only compile: none loaded, since one must be lowered anyway

    @_budgeted("a structural tag")
    def compile_structural_tag(self, *args: Any, **kwargs: Any) -> CompiledGrammar:
        """A structural tag (xgrammar's JSON: dict, JSON text or pydantic objects), compiled; or
        xgrammar's deprecated ``(tags, triggers)`` form (StructuralTagItem list, trigger list),
        which vLLM's and SGLang's backends still send. With the entry pool on, its JSON Schemas are
        modules lowered once per compiler and linked into the tag's frame (linking.link_frame)."""
        from .grammar.structural_tag import structural_tag_arguments, to_json

        tag, info = structural_tag_arguments(args, kwargs)
        if info is not None:
            raise TypeError("compile_structural_tag takes no tokenizer_info: the compiler's is used")
        if self._pool is not None:
            compiled = self._compile_framed(tag)
            if compiled is not None:
                return compiled
        return self._compile_source(("structural_tag_whole", to_json(tag)),
                                    lambda: Grammar.from_structural_tag(tag, self.tokenizer_info))

    def _impassable(self, literal: bytes) -> bool:
        """Whether no token of the vocabulary reads past `literal` (holds it with a byte after it)."""
        with self._lock:
            known = self._horizons.get(literal)
            if self._vocab_blob is None:
                tokens = self.tokenizer_info.decoded_vocab
                self._vocab_blob = b"".join(tokens)
                self._vocab_ends = np.cumsum([len(t) for t in tokens])
        if known is None:
            blob, ends = self._vocab_blob, self._vocab_ends
            known, at = True, blob.find(literal)
            while at >= 0:              # an occurrence inside one token with a byte after it?
                k = int(np.searchsorted(ends, at, side="right"))
                if at + len(literal) < ends[k]:
                    known = False
                    break
                at = blob.find(literal, at + 1)
            with self._lock:
                self._horizons[literal] = known
        return known

    def _compile_framed(self, tag: Any) -> CompiledGrammar | None:
        """The tag's frame (its schemas as stubs) with the schemas' modules linked in; None when
        there is nothing to link or a schema cannot be a module (the whole tag is compiled next,
        which reports an error with its full pointer)."""
        from .grammar.json_schema import json_schema_to_ir
        from .grammar.structural_tag import structural_tag_to_ir, to_json

        t0 = time.perf_counter()
        key = ("structural_tag", to_json(tag))
        hit = self._cached(key)
        if hit is not None:
            return hit
        stubs: dict[str, tuple[bytes, tuple]] = {}
        gates: dict[str, str] = {}
        ir = structural_tag_to_ir(tag, self.tokenizer_info, stubs, gates)
        if not stubs:
            return None
        self._fetch_modules([("structural_tag", text) for text, _args in stubs.values()])
        modules = {}
        for name, (text, (schema, style, any_order, max_ws, any_ws)) in stubs.items():
            module = self._module(("structural_tag", text), lambda s=schema, st=style, a=any_order, w=max_ws, aw=any_ws:
                                  Grammar(json_schema_to_ir(s, style=st, any_order=a, max_whitespace_cnt=w,
                                                            any_whitespace=aw)), keep_fsms=True)
            if module is None or module.lowered.fsms is None or module.lowered.arrays["rule_nullable"][module.lowered.root]:
                return None
            modules[name] = module
        frame = lower(ir, compress=self.repetition_compression, max_token_bytes=self._vocab.max_depth,
                      keep=frozenset(stubs) | frozenset(gates))
        index = {n: i for i, n in enumerate(frame.rule_names)}
        lowered = link_frame(frame, {index[n]: m for n, m in modules.items()}, self._impassable,
                             {index[n]: text_bytes(t) for n, t in gates.items() if n in index})
        with self._lock:
            trie = self._class_tries.get(byte_classes(lowered.arrays))
        core = self._core_of(lowered.arrays, lowered.root, trie, self._pool, lowered.core_keys())
        compiled = CompiledGrammar(lambda: Grammar.from_structural_tag(tag, self.tokenizer_info), self.tokenizer_info,
                                   lowered, core)
        compiled._source = _source_of(key)
        compiled._tier_modules = sum(m.from_tier for m in modules.values())
        # The first mask is the frame's (its opening tags, the names of its tools), whose pool keys
        # cover the whole frame: only this very frame could have put them in the shards, and the
        # runtime asked the shards for its grammar already. A read of them on the compile path
        # is a round trip that misses, each time.
        return self._finish(key, compiled, t0, ask_tier=False)

    @_budgeted("the built-in JSON grammar")
    def compile_builtin_json_grammar(self) -> CompiledGrammar:
        return self._compile_source(("builtin_json",), Grammar.builtin_json_grammar)

    def _cached(self, key: tuple) -> CompiledGrammar | None:
        if not self.cache_enabled:
            return None
        with self._lock:
            hit = self._cache.pop(key, None)
            if hit is not None:
                self._cache[key] = hit      # most recently used last
            return hit

    def _finish(self, key: tuple | None, compiled: CompiledGrammar, t0: float,
                counted: bool = True, ask_tier: bool = True) -> CompiledGrammar:
        """Fetch what another tier holds, precompute, time, and keep the compiled grammar (within
        the caches' byte budget). `counted`: a grammar lowered here (its first mask's entries
        count in `reuse`). `ask_tier` False: the first mask's entries are not asked of the second
        tier (a frame's: see _compile_framed)."""
        if self._pool is not None and (counted or self.entry_source is not None):
            core = compiled._core
            needed = core.pool_keys(core.initial_nodes()).values()
            wanted = [k for k in needed if k not in self._pool]
            found = 0
            if wanted and self.entry_source is not None:
                found = compiled._tier_found = self.entry_source(wanted) if ask_tier else 0
            if counted:
                self._count("entries_needed", len(needed))
                self._count("entries_local", len(needed) - len(wanted))
                self._count("entries_shards", found)
        self._precompute(compiled, t0)
        self.last_compile_seconds = time.perf_counter() - t0
        with self._lock:
            if self.cache_enabled:
                self._keep(self._cache, key, compiled, compiled.tables_bytes)
            self._evict()
        return compiled

    def _keep(self, cache: dict, key: tuple, value: Any, nbytes: int) -> None:
        """Store in one of the compiler's caches, keeping the running total of their tables."""
        old = cache.pop(key, None)
        if old is not None:     # two threads built the same thing; keep the newer
            self._held_bytes -= old.tables_bytes if isinstance(old, CompiledGrammar) else old.nbytes
        cache[key] = value
        self._held_bytes += nbytes

    def _compile(self, grammar: Grammar, key: tuple | None = None,
                 source: tuple[str, str] | None = None) -> CompiledGrammar:
        """`key`: the source's cache key (else the grammar's normalised text, computed only here)."""
        self._must_lower()
        if key is None and self.cache_enabled:
            key = (str(grammar), grammar.ir.root)
            hit = self._cached(key)
            if hit is not None:
                return hit
        t0 = time.perf_counter()
        lowered = lower(grammar.ir, compress=self.repetition_compression, max_token_bytes=self._vocab.max_depth)
        keys = lowered.core_keys() if self._pool is not None else None
        classes = byte_classes(lowered.arrays)
        with self._lock:
            known = classes in self._class_tries
        later = not known and self.background_precompute and self.jit
        # A class trie not built yet (a walk of the whole vocabulary: 5-10 ms) is built by the
        # background precompute, which hands it to the core; the first mask walks the byte trie
        # (the same entries, measured faster than building the trie first).
        trie = None if later else _class_trie_of(self._vocab, classes, self._class_tries, self._lock)
        core = self._core_of(lowered.arrays, lowered.root, trie, self._pool, keys)
        compiled = CompiledGrammar(grammar, self.tokenizer_info, lowered, core)
        compiled._source = source
        if later:
            compiled._make_trie = functools.partial(_class_trie_of, self._vocab, classes, self._class_tries,
                                                    self._lock)
        return self._finish(key, compiled, t0)

    @_budgeted("a serialized grammar")
    def deserialize(self, data: bytes, *, precompute: bool = True) -> CompiledGrammar:
        """A CompiledGrammar from `CompiledGrammar.serialize()` bytes, joined to this compiler's entry
        pool. `precompute=False` builds the entries of the first mask only (a cache tier that brings
        the others the writer built says so: building them here too would race it for the CPU). Refused with a DeserializeError (xg2.transport) when the bytes are malformed, truncated
        or corrupted, or were written by another engine version or for another vocabulary."""
        from . import transport

        t0 = time.perf_counter()
        payload = transport.load_grammar(data, self.tokenizer_info.fingerprint)
        lowered = payload.lowered
        with self._lock:
            trie = self._class_tries.get(byte_classes(lowered.arrays))
        try:
            core = self._core_of(lowered.arrays, lowered.root, trie, self._pool,
                                lowered.core_keys() if self._pool is not None else None)
            initial = set(core.initial_nodes())     # the first mask's now, the others with the precompute
            pending = {}
            for node, entry in payload.entries.items():
                if node in initial:
                    core.load_entry(node, entry)
                else:
                    pending[node] = entry
            if self._pool is not None:
                for key, entry in payload.first.items():
                    if key not in self._pool:
                        self._pool.load(key, entry)
        except (ValueError, IndexError) as e:
            raise transport.DeserializeError(f"compiled grammar refused: {e}") from None
        source = payload.source
        compiled = CompiledGrammar(None if source is None else functools.partial(_grammar_from_source, source, self.tokenizer_info),
                                   self.tokenizer_info, lowered, core)
        compiled._source = source
        compiled._warnings = [(m, transport._warning_class(c)) for m, c in payload.warnings]
        compiled._built_keys = payload.built
        compiled._pending_entries = pending
        compiled._precompute_budget_ms = None if precompute else 0.0
        return self._finish(None, compiled, t0, counted=False)

    def _precompute(self, compiled: CompiledGrammar, t0: float) -> None:
        """Partial JIT: the entries the first mask needs now, then the costliest others (see
        `_precompute_costliest`), here or in a background thread."""
        core = compiled._core
        budget_ms = self.precompute_budget_ms if compiled._precompute_budget_ms is None else compiled._precompute_budget_ms
        for node in core.initial_nodes():      # one C call per node, which stops at the deadline itself
            budget.check("the first mask's entries")
            core.precompute([node], budget.ends_at())
        if not self.jit:
            _load_entries(core, compiled._pending_entries)
            compiled._pending_entries = None
            for node, _width in core.scannable_nodes():
                budget.check("mask entries (jit=False)")
                core.precompute([node], budget.ends_at())
        elif self.background_precompute:
            # One worker per compiler, the newest grammar first (see _precompute_worker); the budget
            # counts from the compile, so a job that waited past it (its prefill is over) is skipped. The worker
            # holds the queue, not the compiler: when the compiler goes, a finalizer tells it to stop.
            with self._lock:
                if self._worker is None:
                    self._worker = threading.Thread(target=_precompute_worker, args=(self._jobs, self._running),
                                                    name="xg2-precompute", daemon=True)
                    self._worker.start()
                    weakref.finalize(self, self._jobs.put, None)
            self._jobs.put((core, time.perf_counter(), budget_ms, self.precompute_top_k, self.compile_timeout_ms,
                            compiled._precomputed, compiled._pending_entries, compiled._make_trie))
            older = self._running.core
            if older is not None:
                older.cancel_background()       # this grammar's first fills come next (see _precompute_worker)
            compiled._pending_entries = None
            compiled._make_trie = None
            return
        else:
            _load_entries(core, compiled._pending_entries)
            compiled._pending_entries = None
            _precompute_costliest(core, t0, budget_ms, self.precompute_top_k, hard_deadline=budget.ends_at())
        compiled._precomputed.set()

    def _evict(self) -> None:
        """Over the budget, pool entries past half of it go first, then the least recently used
        compiled grammars, then modules; the pool may then fill what is left (with self._lock).

        Why the pool first: it fills every byte it is given (the background precompute adds
        entries after each compile), so with the tables evicted first, each new module pushed an
        older one out and a tool seen again was lowered again (measured with a 32 MB budget on
        the tool-calling run: 87 modules kept instead of 661, time to first mask 9.3 ms against
        5.7). A module or grammar costs a lowering to rebuild, an entry one trie walk."""
        if self.cache_limit_bytes < 0:
            return
        if self._pool is None:
            while self._cache and sum(c.memory_size_bytes for c in self._cache.values()) > self.cache_limit_bytes:
                self._cache.pop(next(iter(self._cache)))
            return
        heap = self._heap_bytes(fresh=False)
        over = self._held_bytes + heap + self._pool.nbytes - self.cache_limit_bytes
        if over > 0 and self._pool.nbytes > self.cache_limit_bytes // 2:
            self._pool.set_limit(max(self.cache_limit_bytes // 2, self._pool.nbytes - over))
        while self._cache and self._held_bytes + heap + self._pool.nbytes > self.cache_limit_bytes:
            key = next(iter(self._cache))
            old = self._cache.pop(key)
            self._held_bytes -= old.tables_bytes
            gone = self._heap_known.pop(key, 0)
            self._heap_sum -= gone
            heap -= gone
        while self._modules and self._held_bytes + heap + self._pool.nbytes > self.cache_limit_bytes:
            self._held_bytes -= self._modules.popitem(last=False)[1].nbytes
        self._pool.set_limit(max(0, self.cache_limit_bytes - self._held_bytes - heap))

    def _heap_bytes(self, fresh: bool = True) -> int:
        """The cached grammars' C working memory (it grows after they are cached, as their entries
        are built). `fresh=False`: only the few most recently used grammars are read again (the
        ones whose entries are being built) and the others count as last read; a sum over every
        cached grammar on every compile cost 0.2 ms of time to first mask with 400 cached, and
        grows with the cache."""
        if fresh:
            self._heap_known = {k: int(c._core.heap_bytes) for k, c in self._cache.items()}
            self._heap_sum = sum(self._heap_known.values())
            return self._heap_sum
        for i, key in enumerate(reversed(self._cache)):
            if i == 8:
                break
            now = int(self._cache[key]._core.heap_bytes)
            self._heap_sum += now - self._heap_known.get(key, 0)
            self._heap_known[key] = now
        return self._heap_sum

    def get_cache_size_bytes(self) -> int:
        """Bytes held by the caches: the pool's entries and the cached grammars' tables (without
        the pool, the cached grammars' own entries)."""
        with self._lock:
            self._evict()       # the working memory of entry builds grew since the last compile
            if self._pool is None:
                return sum(c.memory_size_bytes for c in self._cache.values())
            return self._pool.nbytes + self._held_bytes + self._heap_bytes()

    def cache_stats(self) -> dict[str, int]:
        """Pool counters: entries, bytes, hits, partial_hits, misses, evictions; plus grammars."""
        out = self._pool.stats() if self._pool is not None else {
            "entries": 0, "bytes": 0, "hits": 0, "partial_hits": 0, "misses": 0, "evictions": 0}
        with self._lock:
            out["grammars"] = len(self._cache)
        return out

    def clear_cache(self) -> None:
        with self._lock:
            self._cache.clear()
            self._heap_known.clear()
            self._heap_sum = 0
            self._modules.clear()
            self._held_bytes = 0
        if self._pool is not None:
            self._pool.clear()
