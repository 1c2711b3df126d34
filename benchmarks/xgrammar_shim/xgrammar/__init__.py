"""An ``xgrammar`` import shim over xg2, for running xgrammar's own test suite against xg2.

Put the *parent* of this package first on ``PYTHONPATH`` (``benchmarks/xgrammar_shim``) and
``import xgrammar`` yields xg2. It is a measuring device (see ``benchmarks/xgrammar_suite.py``),
not an API layer to ship: it adds no behaviour of its own beyond the small test helpers below.

What it maps
------------
* the top level: ``from xg2 import *`` (xg2's public API, which already uses xgrammar's names),
  plus the submodules below as attributes;
* xgrammar's modules that xg2 has a twin of, by the same name, are xg2's module (the same module
  object): ``exception``, ``contrib`` (so ``contrib.hf``), and, when this xg2 has them,
  ``builtin_structural_tag``, ``openai_tool_call_schema``, ``structural_tag``;
* ``xgrammar.structural_tag``, when xg2 has no ``xg2.structural_tag``, is
  ``xg2.grammar.structural_tag`` (the module xg2's public ``StructuralTag`` and its format classes
  live in, and the one ``Grammar.from_structural_tag`` documents);
* ``xgrammar.builtin_structural_tag``, when xg2 has no twin, holds xg2's
  ``get_model_structural_tag`` and ``register_model_structural_tag``;
* ``xgrammar.grammar``, ``.compiler``, ``.matcher``, ``.tokenizer_info``: small modules holding the
  xg2 objects of the same xgrammar names, only those xg2 has. ``tokenizer_info`` also holds
  ``_BYTE_LEVEL_CHARSET``, the 256 characters of the GPT-2 byte-to-unicode alphabet (a fixed,
  engine-independent table, computed here);
* ``xgrammar.testing``: ``xg2.testing``'s names when this xg2 has that module, then, for the names
  it lacks, the helpers written here on xg2's public API only (see below).

Everything else that xgrammar has and xg2 does not is simply absent, so a test that needs it fails
with the AttributeError / ImportError it would get from any engine lacking it. Notably absent:
``bitmask_dtype``, the triton and mlx kernels, ``xgrammar.tokenizer_info``'s
other private names, and (in an xg2 without the twin modules above) ``get_builtin_structural_tag``,
``normalize_tool_choice``, the per-model ``get_*_structural_tag`` functions and
``xgrammar.openai_tool_call_schema``.

``xgrammar.testing``
--------------------
Written here on xg2's public API (used for a name only when ``xg2.testing`` lacks it):
``_is_grammar_accept_string``, ``_get_matcher_from_grammar``,
``_get_matcher_from_grammar_and_tokenizer_info``, ``_get_masked_tokens_from_bitmask``,
``_is_single_token_bitmask``, ``bool_mask_to_bitmask`` / ``_bool_mask_to_bitmask``,
``bitmask_to_bool_mask``, ``_traverse_draft_tree`` (``GrammarMatcher.traverse_draft_tree``),
``_json_schema_to_ebnf`` (``str(Grammar.from_json_schema(...))``; for an XML ``json_format`` such as
``"qwen_xml"``, ``str(Grammar.from_structural_tag(...))`` of a ``json_schema`` format with that
``style``, which xg2 supports for some styles and refuses for the others) and ``_regex_to_ebnf``
(``str(Grammar.from_regex(...))``). The last two return *xg2's* printed EBNF, so
tests comparing them with xgrammar's exact text fail, as they should.

Not implementable on xg2's public API (and absent from ``xg2.testing``), so each raises
NotImplementedError naming itself when called (they are defined, rather than left out, only so
that a test file's module-level import of them does not also fail that file's other tests):
``GrammarFunctor`` (its passes), ``_is_rule_fsm_accept_string``, ``_print_grammar_fsms``.
(``_ebnf_to_grammar_no_normalization``, ``_get_allow_empty_rule_ids``, ``_generate_range_regex`` and
``_generate_float_regex`` are xg2.testing's.)
"""

from __future__ import annotations

import importlib
import json
import sys
import types
from typing import Any

import xg2
import xg2.exception
import xg2.grammar.structural_tag as _xg2_structural_tag
from xg2 import *
from xg2 import (
    BatchGrammarMatcher,
    CompiledGrammar,
    Grammar,
    GrammarCompiler,
    GrammarMatcher,
    StructuralTagItem,
    TokenizerInfo,
    VocabType,
    allocate_token_bitmask,
    apply_token_bitmask_inplace,
    get_bitmask_shape,
    get_model_structural_tag,
    register_model_structural_tag,
    reset_token_bitmask,
)

__version__ = "xg2-shim+" + getattr(xg2, "__version__", "unknown")
SHIM_OF = "xg2"


def _submodule(name: str, doc: str, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(f"{__name__}.{name}", doc)
    mod.__dict__.update(attrs)
    sys.modules[mod.__name__] = mod
    globals()[name] = mod
    return mod


def _alias(name: str, module: types.ModuleType) -> types.ModuleType:
    sys.modules[f"{__name__}.{name}"] = module
    globals()[name] = module
    return module


# ---------------------------------------------------------------------------------------------
# Submodules that are xg2 modules.

def _xg2_twin(name: str) -> types.ModuleType | None:
    """xg2's module of xgrammar's name `name`, if this xg2 has one."""
    try:
        return importlib.import_module(f"xg2.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"xg2.{name}":
            raise
        return None


exception = _alias("exception", xg2.exception)
structural_tag = _alias("structural_tag", _xg2_twin("structural_tag") or _xg2_structural_tag)
for _name in ("builtin_structural_tag", "openai_tool_call_schema"):
    _twin = _xg2_twin(_name)
    if _twin is not None:
        _alias(_name, _twin)


contrib = _alias("contrib", xg2.contrib)  # its `hf` is imported on first attribute access
if _xg2_twin("kernels") is not None and hasattr(xg2.kernels, "__path__"):
    kernels = _alias("kernels", xg2.kernels)     # a package: its kernel modules import by their names
    import importlib as _importlib

    for _name in ("apply_token_bitmask_inplace_cpu", "apply_token_bitmask_inplace_cuda",
                  "apply_token_bitmask_inplace_torch_compile"):
        _alias(f"kernels.{_name}", _importlib.import_module(f"xg2.kernels.{_name}"))


# ---------------------------------------------------------------------------------------------
# Submodules holding xg2 objects under xgrammar's module names (only what xg2 has).

_submodule("grammar", "xg2's Grammar under xgrammar.grammar", Grammar=Grammar,
           StructuralTagItem=StructuralTagItem)
_submodule("compiler", "xg2's compiler under xgrammar.compiler", GrammarCompiler=GrammarCompiler,
           CompiledGrammar=CompiledGrammar)
_submodule("matcher", "xg2's matcher and bitmask functions under xgrammar.matcher",
           GrammarMatcher=GrammarMatcher, BatchGrammarMatcher=BatchGrammarMatcher,
           allocate_token_bitmask=allocate_token_bitmask,
           apply_token_bitmask_inplace=apply_token_bitmask_inplace,
           get_bitmask_shape=get_bitmask_shape, reset_token_bitmask=reset_token_bitmask)
if "builtin_structural_tag" not in globals():
    _submodule("builtin_structural_tag", "xg2's model structural tags under xgrammar's module name",
               get_model_structural_tag=get_model_structural_tag,
               register_model_structural_tag=register_model_structural_tag)


def _gpt2_byte_alphabet() -> frozenset:
    """The 256 characters GPT-2-style byte-level vocabularies spell bytes with: printable Latin-1
    bytes stand for themselves, the other bytes are moved, in order, to U+0100 and up."""
    printable = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    chars, shifted = set(), 0
    for b in range(256):
        if b in printable:
            chars.add(chr(b))
        else:
            chars.add(chr(0x100 + shifted))
            shifted += 1
    return frozenset(chars)


_submodule("tokenizer_info", "xg2's TokenizerInfo under xgrammar.tokenizer_info",
           TokenizerInfo=TokenizerInfo, VocabType=VocabType,
           _BYTE_LEVEL_CHARSET=_gpt2_byte_alphabet())


# ---------------------------------------------------------------------------------------------
# xgrammar.testing: helpers built on xg2's public API.


def _as_grammar(grammar: Grammar | str) -> Grammar:
    return Grammar.from_ebnf(grammar) if isinstance(grammar, str) else grammar


def _t_get_matcher_from_grammar_and_tokenizer_info(
    grammar: Grammar | str, tokenizer_info: TokenizerInfo | None = None, **kwargs: Any
) -> GrammarMatcher:
    info = TokenizerInfo([]) if tokenizer_info is None else tokenizer_info
    compiled = GrammarCompiler(info).compile_grammar(_as_grammar(grammar))
    return GrammarMatcher(compiled, **kwargs)


def _t_get_matcher_from_grammar(grammar: Grammar | str, **kwargs: Any) -> GrammarMatcher:
    # An empty vocabulary has no stop token, so the matcher ends where the grammar does.
    kwargs.setdefault("terminate_without_stop_token", True)
    return _t_get_matcher_from_grammar_and_tokenizer_info(grammar, None, **kwargs)


def _t_is_grammar_accept_string(
    grammar: Grammar | str,
    input_str: str | bytes,
    *,
    debug_print: bool = False,
    print_time: bool = False,
    require_termination: bool = True,
) -> bool:
    matcher = _t_get_matcher_from_grammar(grammar)
    if not matcher.accept_string(input_str):
        return False
    return matcher.is_completed() if require_termination else True


def _row_words(bitmask: Any, index: int):
    import numpy as np

    arr = bitmask.cpu().numpy() if hasattr(bitmask, "cpu") else np.asarray(bitmask)
    row = arr[index] if arr.ndim == 2 else arr
    return np.ascontiguousarray(row, dtype=np.int32).view(np.uint32)


def _allowed_flags(bitmask: Any, vocab_size: int, index: int):
    import numpy as np

    words = _row_words(bitmask, index)
    bits = (words[:, None] >> np.arange(32, dtype=np.uint32)[None, :]) & 1
    return bits.reshape(-1)[:vocab_size].astype(bool)


def _t_get_masked_tokens_from_bitmask(bitmask: Any, vocab_size: int, index: int = 0) -> list[int]:
    import numpy as np

    return np.flatnonzero(~_allowed_flags(bitmask, vocab_size, index)).tolist()


def _t_is_single_token_bitmask(bitmask: Any, vocab_size: int, index: int = 0) -> tuple[bool, int]:
    import numpy as np

    allowed = np.flatnonzero(_allowed_flags(bitmask, vocab_size, index))
    return (True, int(allowed[0])) if len(allowed) == 1 else (False, -1)


def _t_bool_mask_to_bitmask(bool_mask: Any) -> Any:
    """Pack a boolean allow-mask along its last axis into int32 words (bit i of word w is token
    32*w+i); padding past the mask's length is allowed (1)."""
    import torch

    mask = bool_mask.to(torch.bool)
    n = mask.shape[-1]
    pad = (-n) % 32
    if pad:
        mask = torch.cat([mask, mask.new_ones(*mask.shape[:-1], pad)], dim=-1)
    words = mask.reshape(*mask.shape[:-1], -1, 32).to(torch.int64)
    weights = torch.tensor([1 << i for i in range(32)], dtype=torch.int64, device=mask.device)
    packed = (words * weights).sum(dim=-1)
    packed = torch.where(packed >= (1 << 31), packed - (1 << 32), packed)
    return packed.to(torch.int32)


def _t_bitmask_to_bool_mask(bit_mask: Any, vocab_size: int | None = None) -> Any:
    import torch

    words = bit_mask.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(32, dtype=torch.int64, device=bit_mask.device)
    bits = (words.unsqueeze(-1) >> shifts) & 1
    out = bits.reshape(*bit_mask.shape[:-1], -1).to(torch.bool)
    return out if vocab_size is None else out[..., :vocab_size]


def _t_traverse_draft_tree(retrieve_next_token: Any, retrieve_next_sibling: Any, draft_tokens: Any,
                           matcher: GrammarMatcher, allocate_token_bitmask: Any,
                           time_threshold: float = -1.0) -> bool:
    return matcher.traverse_draft_tree(retrieve_next_token, retrieve_next_sibling, draft_tokens,
                                       allocate_token_bitmask, time_threshold)


def _t_json_schema_to_ebnf(schema: Any, *, any_whitespace: bool = True, indent: int | None = None,
                           separators: tuple[str, str] | None = None,
                           max_whitespace_cnt: int | None = None, strict_mode: bool = True,
                           json_format: str = "json", any_order: bool = False) -> str:
    if json_format != "json":
        # The XML parameter styles of tool calling: xg2 has them as the `style` of a structural
        # tag's json_schema format (the same styles xgrammar's JSONSchemaFormat takes).
        if indent is not None or separators is not None or not strict_mode:
            raise NotImplementedError(
                f"xgrammar.testing._json_schema_to_ebnf(json_format={json_format!r}) with "
                "indent/separators/strict_mode=False has no xg2 counterpart")
        if isinstance(schema, str):
            schema = json.loads(schema)
        elif isinstance(schema, type) and hasattr(schema, "model_json_schema"):
            schema = schema.model_json_schema()
        fmt: dict = {"type": "json_schema", "json_schema": schema, "style": json_format,
                     "any_order": any_order}
        if max_whitespace_cnt is not None:
            fmt["max_whitespace_cnt"] = max_whitespace_cnt
        return str(Grammar.from_structural_tag({"type": "structural_tag", "format": fmt}))
    return str(Grammar.from_json_schema(schema, any_whitespace=any_whitespace, indent=indent,
                                        separators=separators, strict_mode=strict_mode,
                                        max_whitespace_cnt=max_whitespace_cnt, any_order=any_order))


def _t_regex_to_ebnf(regex: str, with_rule_name: bool = True) -> str:
    text = str(Grammar.from_regex(regex))
    if not with_rule_name and text.startswith("root ::= "):
        text = text[len("root ::= "):]
    return text


def _unavailable(name: str):
    def stub(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"xgrammar.testing.{name} is not available on xg2's public API")

    stub.__name__ = name
    stub.__qualname__ = name
    return stub


class _GrammarFunctor:
    """xgrammar's grammar passes; xg2 exposes none of them publicly."""

    structure_normalizer = staticmethod(_unavailable("GrammarFunctor.structure_normalizer"))
    rule_inliner = staticmethod(_unavailable("GrammarFunctor.rule_inliner"))
    byte_string_fuser = staticmethod(_unavailable("GrammarFunctor.byte_string_fuser"))
    dead_code_eliminator = staticmethod(_unavailable("GrammarFunctor.dead_code_eliminator"))
    lookahead_assertion_analyzer = staticmethod(_unavailable("GrammarFunctor.lookahead_assertion_analyzer"))
    grammar_optimizer = staticmethod(_unavailable("GrammarFunctor.grammar_optimizer"))
    fsm_builder = staticmethod(_unavailable("GrammarFunctor.fsm_builder"))
    repetition_normalizer = staticmethod(_unavailable("GrammarFunctor.repetition_normalizer"))


_GrammarFunctor.__name__ = _GrammarFunctor.__qualname__ = "GrammarFunctor"

TESTING_IMPLEMENTED = (
    "_is_grammar_accept_string", "_get_matcher_from_grammar",
    "_get_matcher_from_grammar_and_tokenizer_info", "_get_masked_tokens_from_bitmask",
    "_is_single_token_bitmask", "bool_mask_to_bitmask", "_bool_mask_to_bitmask",
    "bitmask_to_bool_mask", "_traverse_draft_tree", "_json_schema_to_ebnf", "_regex_to_ebnf",
)
TESTING_UNAVAILABLE = (
    "GrammarFunctor", "_is_rule_fsm_accept_string", "_print_grammar_fsms",
)

_HERE_HELPERS = dict(
    _is_grammar_accept_string=_t_is_grammar_accept_string,
    _get_matcher_from_grammar=_t_get_matcher_from_grammar,
    _get_matcher_from_grammar_and_tokenizer_info=_t_get_matcher_from_grammar_and_tokenizer_info,
    _get_masked_tokens_from_bitmask=_t_get_masked_tokens_from_bitmask,
    _is_single_token_bitmask=_t_is_single_token_bitmask,
    bool_mask_to_bitmask=_t_bool_mask_to_bitmask,
    _bool_mask_to_bitmask=_t_bool_mask_to_bitmask,
    bitmask_to_bool_mask=_t_bitmask_to_bool_mask,
    _traverse_draft_tree=_t_traverse_draft_tree,
    _json_schema_to_ebnf=_t_json_schema_to_ebnf,
    _regex_to_ebnf=_t_regex_to_ebnf,
    GrammarFunctor=_GrammarFunctor,
    **{name: _unavailable(name) for name in TESTING_UNAVAILABLE if name != "GrammarFunctor"},
)

_xg2_testing = _xg2_twin("testing")
testing = _submodule(
    "testing",
    "xgrammar.testing: xg2.testing's names, then helpers written on xg2's public API (see the "
    "package docstring)",
    TESTING_IMPLEMENTED=TESTING_IMPLEMENTED,
    TESTING_UNAVAILABLE=TESTING_UNAVAILABLE,
)
if _xg2_testing is not None:
    testing.__dict__.update({k: v for k, v in vars(_xg2_testing).items() if not k.startswith("__")})
#: which helper each xgrammar.testing name is: "xg2.testing", "shim" or "unavailable"
TESTING_SOURCE = {}
for _name, _obj in _HERE_HELPERS.items():
    if _name in testing.__dict__ and _xg2_testing is not None:
        TESTING_SOURCE[_name] = "xg2.testing"
        continue
    testing.__dict__[_name] = _obj
    TESTING_SOURCE[_name] = "unavailable" if _name in TESTING_UNAVAILABLE else "shim"
if TESTING_SOURCE.get("bool_mask_to_bitmask") == "xg2.testing":  # the underscored alias follows it
    testing._bool_mask_to_bitmask = testing.bool_mask_to_bitmask
    TESTING_SOURCE["_bool_mask_to_bitmask"] = "xg2.testing"
testing.TESTING_SOURCE = TESTING_SOURCE
