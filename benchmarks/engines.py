"""Engine adapters shared by the benchmarks: one small interface over xg2, xgrammar and llguidance.

The benchmarks compare engines step by step (compile, new matcher, fill a mask, accept a token,
finish with EOS), so each engine is wrapped once here rather than in every script; the wrappers
differ only where the engines' APIs do (llguidance has no compiler object and consumes tokens on
an `LLMatcher`, whose copies serve as new matchers).
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, ClassVar

# llguidance uses a rayon pool only for batched mask computation; pin it anyway.
os.environ.setdefault("RAYON_NUM_THREADS", "1")

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

DEFAULT_TOKENIZER = REPO.parent / "shared" / "tokenizers" / "deepseek_v3_tokenizer.json"
EOS_CANDIDATES = ("<｜end▁of▁sentence｜>", "<|endoftext|>", "<|end_of_text|>", "<|eot_id|>", "</s>", "<|im_end|>", "<eos>")
ALL_ENGINES = ("xg2", "xgrammar", "llguidance")
#: Engines that can also run in lenient mode ("<engine>-lenient": keywords they cannot enforce are
#: relaxed with a warning instead of failing the compile; xgrammar always behaves that way).
LENIENT_ENGINES = ("xg2", "llguidance")
KNOWN_ENGINES = ALL_ENGINES + tuple(f"{e}-lenient" for e in LENIENT_ENGINES)


class EngineUnavailable(RuntimeError):
    pass


def package_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "?"


def percentile(sorted_vals: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (NaN when empty), so that p99 of a few
    hundred steps is an observed step, not an interpolation."""
    if not sorted_vals:
        return math.nan
    k = min(len(sorted_vals) - 1, max(0, math.ceil(q * len(sorted_vals)) - 1))
    return sorted_vals[k]


# ----------------------------------------------------------------- tokenizer


@dataclass
class Vocab:
    path: Path
    hf: Any  # tokenizers.Tokenizer
    fast: Any  # transformers.PreTrainedTokenizerFast
    eos_id: int | None

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    @property
    def size(self) -> int:
        """Token ids the tokenizer can produce (added tokens included); engines built from the
        tokenizer alone are given this size so that every engine's bitmask has the same width."""
        return self.hf.get_vocab_size(with_added_tokens=True)


def load_vocab(path: Path) -> Vocab:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    hf = Tokenizer.from_file(str(path))
    eos = next((t for t in EOS_CANDIDATES if hf.token_to_id(t) is not None), None)
    fast = PreTrainedTokenizerFast(tokenizer_object=hf, eos_token=eos)
    return Vocab(path, hf, fast, hf.token_to_id(eos) if eos else None)


# ------------------------------------------------------------------- engines


class Engine:
    """Common adapter interface."""

    name = "?"
    vocab_size = 0
    version = "?"
    #: Exceptions the engine raises on purpose for a grammar/schema it will not compile.
    typed_errors: tuple[type[BaseException], ...] = (Exception,)
    #: Options passed to the JSON Schema compiler, recorded with the results.
    json_options: ClassVar[dict[str, Any]] = {}

    def compile(self, ebnf: str) -> Any:
        raise NotImplementedError

    def compile_json_schema(self, schema: Any, compiler: Any = None, **options: Any) -> Any:
        raise NotImplementedError

    def structural_tag_input(self, tag: Any) -> Any:
        """What the engine is given for a structural tag in xgrammar's JSON form (a dict): the tag
        itself, or the engine's own grammar for it (our conversion, done outside any timing)."""
        return tag

    def compile_structural_tag(self, tag: Any, compiler: Any = None) -> Any:
        """A structural tag (a dict in xgrammar's form, or what `structural_tag_input` made of one)."""
        raise NotImplementedError

    def json_compiler(self) -> Any:
        """A compiler object to reuse for several schemas (None when the engine has none)."""
        return None

    def new_matcher(self, handle: Any) -> Any:
        raise NotImplementedError

    def new_bitmask(self) -> Any:
        raise NotImplementedError

    def fill(self, matcher: Any, bitmask: Any) -> None:
        raise NotImplementedError

    def accept(self, matcher: Any, token_id: int) -> bool:
        raise NotImplementedError

    def is_completed(self, matcher: Any) -> bool:
        raise NotImplementedError

    def accept_eos(self, matcher: Any, eos_id: int) -> bool:
        """End the generation with EOS; True when the matcher took it and has stopped."""
        raise NotImplementedError


class _XGrammarLike(Engine):
    """xgrammar and xg2 share one API."""

    module: Any
    json_options: ClassVar[dict[str, Any]] = {"any_whitespace": True, "strict_mode": False}
    #: Extra GrammarCompiler keywords (e.g. xg2's precompute_budget_ms for an ablation).
    compiler_options: ClassVar[dict[str, Any]] = {}

    def compile(self, ebnf: str) -> Any:
        # A fresh compiler per grammar: no compile cache survives between grammars.
        compiler = self.module.GrammarCompiler(self.info, max_threads=1, **self.compiler_options)
        return compiler.compile_grammar(ebnf)

    def json_compiler(self) -> Any:
        # No compile cache: schemas must not be served from each other's results (and a cache
        # over thousands of schemas would only grow).
        return self.module.GrammarCompiler(self.info, **{"max_threads": 1, "cache_enabled": False,
                                                        **self.compiler_options})

    def compile_json_schema(self, schema: Any, compiler: Any = None, **options: Any) -> Any:
        compiler = compiler if compiler is not None else self.json_compiler()
        return compiler.compile_json_schema(schema, **{**self.json_options, **options})

    def compile_structural_tag(self, tag: Any, compiler: Any = None) -> Any:
        # `json_options` do not apply: the JSON Schemas inside a tag are compiled with the
        # structural tag's own settings (any whitespace, strict mode, not lenient).
        compiler = compiler if compiler is not None else self.json_compiler()
        return compiler.compile_structural_tag(tag)

    def new_matcher(self, handle: Any) -> Any:
        return self.module.GrammarMatcher(handle)

    def new_bitmask(self) -> Any:
        return self.module.allocate_token_bitmask(1, self.vocab_size)

    def fill(self, matcher: Any, bitmask: Any) -> None:
        matcher.fill_next_token_bitmask(bitmask, 0)

    def accept(self, matcher: Any, token_id: int) -> bool:
        return bool(matcher.accept_token(token_id))

    def is_completed(self, matcher: Any) -> bool:
        return bool(matcher.is_completed())

    def accept_eos(self, matcher: Any, eos_id: int) -> bool:
        return bool(matcher.accept_token(eos_id)) and bool(matcher.is_terminated())


class XGrammarEngine(_XGrammarLike):
    name = "xgrammar"

    def __init__(self, vocab: Vocab, vocab_size: int | None = None) -> None:
        try:
            import xgrammar
        except ImportError as exc:
            raise EngineUnavailable(f"xgrammar not importable: {exc}") from exc
        self.module = xgrammar
        self.version = package_version("xgrammar")
        kwargs = {"vocab_size": vocab_size} if vocab_size else {}
        self.info = xgrammar.TokenizerInfo.from_huggingface(vocab.fast, **kwargs)
        self.vocab_size = self.info.vocab_size


class Xg2Engine(_XGrammarLike):
    name = "xg2"

    def __init__(self, vocab: Vocab, vocab_size: int | None = None) -> None:
        try:
            import xg2
        except Exception as exc:
            raise EngineUnavailable(f"xg2 not importable: {exc!r}") from exc
        missing = [n for n in ("TokenizerInfo", "GrammarCompiler", "GrammarMatcher", "allocate_token_bitmask")
                   if not hasattr(xg2, n)]
        if missing:
            raise EngineUnavailable(f"xg2 lacks {', '.join(missing)} (core not built yet?)")
        self.module = xg2
        self.version = f"{getattr(xg2, '__version__', '?')} ({Path(xg2.__file__).parent})"
        self.typed_errors = (xg2.XG2Error,)
        try:
            self.info = xg2.TokenizerInfo.from_huggingface(str(vocab.path))
        except TypeError:
            self.info = xg2.TokenizerInfo.from_huggingface(vocab.fast)
        self.vocab_size = self.info.vocab_size

    def token_bytes(self) -> list[bytes]:
        """Bytes of every token id, as the matcher sees them (for decoding random walks)."""
        return list(self.info.decoded_vocab)


class LLGuidanceEngine(Engine):
    name = "llguidance"
    #: llguidance's own defaults: flexible whitespace (`[\x20\x0A\x0D\x09]+` between tokens),
    #: `additionalProperties` as the schema says (allowed when absent), `lenient: false` (an
    #: unimplemented keyword is an error, as in xg2), `coerce_one_of: false`.
    json_options: ClassVar[dict[str, Any]] = {}
    #: Grammar options (`%llguidance {...}`) for the Lark grammars we write (EBNF twins, structural
    #: tags). `llguidance-noforce` sets `no_forcing`: where the grammar forces a string, every
    #: tokenization of it is allowed (by default only the canonical one, as forced tokens).
    lark_options: ClassVar[dict[str, Any]] = {}

    def __init__(self, vocab: Vocab, vocab_size: int | None) -> None:
        try:
            import llguidance
            import llguidance.hf
            import llguidance.numpy
        except ImportError as exc:
            raise EngineUnavailable(f"llguidance not importable: {exc}") from exc
        self.llg = llguidance
        self.llnp = llguidance.numpy
        self.version = package_version("llguidance")
        self.tok = llguidance.hf.from_tokenizer(vocab.fast, n_vocab=vocab_size)
        self.vocab_size = self.tok.vocab_size
        self._lark: dict[str, str] = {}

    def lark_for(self, ebnf: str) -> str:
        # EBNF -> Lark conversion is our own preprocessing, done outside timing.
        if ebnf not in self._lark:
            from ebnf_to_lark import ebnf_to_lark

            self._lark[ebnf] = ebnf_to_lark(ebnf)
        return self._lark[ebnf]

    def _matcher(self, grammar: str) -> Any:
        matcher = self.llg.LLMatcher(self.tok, grammar, log_level=0)
        if matcher.is_error():
            raise RuntimeError(matcher.get_error())
        return matcher  # prototype; new matchers are deep copies

    def _from_lark(self, lark: str) -> str:
        head = f"%llguidance {json.dumps(self.lark_options)}\n" if self.lark_options else ""
        return self.llg.LLMatcher.grammar_from_lark(head + lark)

    def compile(self, ebnf: str) -> Any:
        return self._matcher(self._from_lark(self.lark_for(ebnf)))

    def compile_json_schema(self, schema: Any, compiler: Any = None, **options: Any) -> Any:
        opts = {**self.json_options, **options}
        return self._matcher(self.llg.LLMatcher.grammar_from_json_schema(schema, defaults=opts or None))

    def structural_tag_input(self, tag: Any) -> str:
        """The llguidance grammar for a structural tag in xgrammar's JSON form: Lark text from
        `llguidance.StructTag.to_grammar` (`assume_special=False`: the triggers are plain text, as
        in xgrammar), one `StructTag` per tag, its JSON Schema written out as xgrammar's strict mode
        reads it (`strict_schema`) and given `json_options` as its top-level `x-guidance`.

        Only the form llguidance can express is converted: `triggered_tags` whose tags have string
        begin/end and `json_schema` content (style `json`), without `at_least_one`,
        `stop_after_first` or `excludes`; anything else raises NotImplementedError."""
        fmt = tag.get("format", {}) if isinstance(tag, dict) and tag.get("type") == "structural_tag" else {}
        keys = set(fmt) - {"type", "triggers", "tags", "at_least_one", "stop_after_first", "excludes"}
        if (fmt.get("type") != "triggered_tags" or keys or fmt.get("at_least_one") or fmt.get("stop_after_first")
                or fmt.get("excludes")):
            raise NotImplementedError("llguidance: only plain triggered_tags structural tags are converted")
        tags = []
        for t in fmt["tags"]:
            content = t.get("content", {})
            if (not isinstance(t.get("begin"), str) or not isinstance(t.get("end"), str)
                    or content.get("type") != "json_schema" or set(content) - {"type", "json_schema", "style"}
                    or content.get("style", "json") != "json"):
                raise NotImplementedError("llguidance: a tag must be string begin/end around a json_schema")
            trigger = next((x for x in fmt["triggers"] if t["begin"].startswith(x)), None)
            if trigger is None:
                raise ValueError(f"tag begin {t['begin']!r} starts with no trigger")
            schema = strict_schema(content["json_schema"])
            if self.json_options:
                schema = {"x-guidance": dict(self.json_options), **(schema if isinstance(schema, dict) else {})}
            tags.append(self.llg.StructTag(trigger=trigger, begin=t["begin"], grammar=schema, end=t["end"]))
        return self._from_lark(self.llg.StructTag.to_grammar(tags, assume_special=False))

    def compile_structural_tag(self, tag: Any, compiler: Any = None) -> Any:
        return self._matcher(tag if isinstance(tag, str) else self.structural_tag_input(tag))

    def new_matcher(self, handle: Any) -> Any:
        return handle.deep_copy()

    def new_bitmask(self) -> Any:
        return self.llnp.allocate_token_bitmask(1, self.vocab_size)

    def fill(self, matcher: Any, bitmask: Any) -> None:
        self.llnp.fill_next_token_bitmask(matcher, bitmask, 0)

    def accept(self, matcher: Any, token_id: int) -> bool:
        return bool(matcher.consume_token(token_id)) and not matcher.is_error()

    def is_completed(self, matcher: Any) -> bool:
        return bool(matcher.is_accepting())

    def accept_eos(self, matcher: Any, eos_id: int) -> bool:
        if not matcher.is_accepting():
            return False
        return bool(matcher.consume_token(eos_id)) and not matcher.is_error() and bool(matcher.is_stopped())


#: Keywords whose value is one subschema, a list of subschemas, or a map of names to subschemas.
_SUBSCHEMA = ("additionalProperties", "items", "additionalItems", "contains", "propertyNames", "not", "if", "then",
              "else", "unevaluatedItems", "unevaluatedProperties")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def strict_schema(schema: Any) -> Any:
    """`schema` with what xg2's (and xgrammar's) strict mode assume written out, for an engine
    without that mode: `additionalProperties: false` on every object schema (one with `properties`,
    `required` or an object type) that says nothing about further members, and no items past
    `prefixItems` (or a draft-4 `items` list) unless `items`/`additionalItems` allow them.
    Annotations and values (`enum`, `const`, `default`, ...) are kept as they are."""
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k in _SUBSCHEMA_MAPS and isinstance(v, dict):
            out[k] = {name: strict_schema(sub) for name, sub in v.items()}
        elif k in _SUBSCHEMA_LISTS and isinstance(v, list):
            out[k] = [strict_schema(sub) for sub in v]
        elif k in _SUBSCHEMA and isinstance(v, dict):
            out[k] = strict_schema(v)
        else:
            out[k] = v
    t = schema.get("type")
    objectish = t == "object" or (isinstance(t, list) and "object" in t) or "properties" in schema or "required" in schema
    if objectish and "additionalProperties" not in schema and "unevaluatedProperties" not in schema:
        out["additionalProperties"] = False
    if "prefixItems" in schema and "items" not in schema:
        out["items"] = False
    elif isinstance(schema.get("items"), list) and "additionalItems" not in schema:
        out["additionalItems"] = False
    return out


def make_engine(name: str, vocab: Vocab, vocab_size: int | None = None) -> Engine:
    """One engine by name; `vocab_size` fixes the bitmask width (default: what the engine derives)."""
    if name == "llguidance-noforce":
        engine = make_engine("llguidance", vocab, vocab_size)
        engine.name = name
        engine.lark_options = {**engine.lark_options, "no_forcing": True}
        return engine
    base, lenient, _ = name.partition("-lenient")
    if lenient and base in LENIENT_ENGINES and not _:
        engine = make_engine(base, vocab, vocab_size)
        engine.name = name
        engine.json_options = {**engine.json_options, "lenient": True}
        return engine
    if name == "xg2":
        return Xg2Engine(vocab)
    if name == "xgrammar":
        return XGrammarEngine(vocab, vocab_size)
    if name == "llguidance":
        return LLGuidanceEngine(vocab, vocab_size)
    raise SystemExit(f"unknown engine {name!r}; choose from {', '.join(KNOWN_ENGINES)}")


def make_engines(names: list[str], vocab: Vocab) -> list[Engine]:
    """The engines that import, in order; llguidance takes its vocabulary size from the engine
    before it so that all bitmasks have one width."""
    engines: list[Engine] = []
    size_hint: int | None = None
    for name in names:
        try:
            eng = make_engine(name, vocab, size_hint if name.startswith("llguidance") else None)
        except EngineUnavailable as exc:
            print(f"[skip] {name}: {exc}", file=sys.stderr)
            continue
        size_hint = size_hint or eng.vocab_size
        engines.append(eng)
    return engines
