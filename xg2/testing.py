"""Helpers for tests and debugging (xgrammar's ``testing`` module, where it makes sense for xg2).

Public in xgrammar: ``bool_mask_to_bitmask``, ``bitmask_to_bool_mask``. The underscored helpers are
the ones engines' and users' test suites call (judging a string against a grammar, reading a
filled bitmask, a draft-tree walk); they are built on xg2's public API only.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from .compiler import GrammarCompiler
from .errors import SchemaJSONError, UsageError
from .grammar.grammar import Grammar
from .matcher import GrammarMatcher
from .tokenizer import TokenizerInfo

__all__ = ["bitmask_to_bool_mask", "bool_mask_to_bitmask"]


def _torch() -> Any:
    import torch

    return torch


def bool_mask_to_bitmask(bool_mask: Any) -> Any:
    """A (batch, V) boolean allow-mask (True: allowed) packed into an int32 bitmask (batch,
    ceil(V / 32)); bits past V are set, as xgrammar pads them."""
    torch = _torch()
    if bool_mask.dim() != 2:
        raise UsageError(f"bool_mask must be 2-D (batch, vocab), got {bool_mask.dim()}-D")
    mask = bool_mask.to(torch.bool)
    pad = (-mask.shape[1]) % 32
    if pad:
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], pad)], dim=1)
    weights = torch.tensor([1 << i for i in range(32)], dtype=torch.int64, device=mask.device)
    words = (mask.view(mask.shape[0], -1, 32).to(torch.int64) * weights).sum(dim=2)
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


def bitmask_to_bool_mask(bit_mask: Any, vocab_size: int | None = None) -> Any:
    """The boolean allow-mask of an int32 bitmask on the CPU (cut to `vocab_size` when given)."""
    torch = _torch()
    if bit_mask.device.type != "cpu":
        raise UsageError("bit_mask must be on the CPU")
    if bit_mask.dtype != torch.int32:
        raise UsageError(f"bit_mask must be int32, not {bit_mask.dtype}")
    bits = np.unpackbits(np.ascontiguousarray(bit_mask.numpy()).view(np.uint8), bitorder="little")
    out = torch.from_numpy(bits.reshape(*bit_mask.shape[:-1], bit_mask.shape[-1] * 32).astype(bool))
    return out if vocab_size is None else out[..., :vocab_size]


def _get_matcher_from_grammar_and_tokenizer_info(grammar: Grammar | str, tokenizer_info: TokenizerInfo | None = None,
                                                 **kwargs: Any) -> GrammarMatcher:
    """A matcher for `grammar` (EBNF text or a Grammar) over `tokenizer_info` (default: the empty
    vocabulary, for matching text)."""
    info = TokenizerInfo([]) if tokenizer_info is None else tokenizer_info
    compiled = GrammarCompiler(info, cache_enabled=False).compile_grammar(grammar)
    return GrammarMatcher(compiled, **kwargs)


def _get_matcher_from_grammar(grammar: Grammar | str, **kwargs: Any) -> GrammarMatcher:
    """A text matcher (empty vocabulary) that ends where the grammar can end."""
    kwargs.setdefault("terminate_without_stop_token", True)
    return _get_matcher_from_grammar_and_tokenizer_info(grammar, None, **kwargs)


def _is_grammar_accept_string(grammar: Grammar | str, input_str: str | bytes, *, debug_print: bool = False,
                              print_time: bool = False, require_termination: bool = True) -> bool:
    """Whether `grammar` accepts the text (whole, unless `require_termination` is False)."""
    matcher = _get_matcher_from_grammar(grammar)
    if not matcher.accept_string(input_str):
        return False
    return matcher.is_terminated() if require_termination else True


def _row_bits(bitmask: Any, vocab_size: int, index: int) -> np.ndarray:
    arr = bitmask.cpu().numpy() if hasattr(bitmask, "cpu") else np.asarray(bitmask)
    row = arr[index] if arr.ndim == 2 else arr
    bits = np.unpackbits(np.ascontiguousarray(row, dtype=np.int32).view(np.uint8), bitorder="little")
    return bits[:vocab_size].astype(bool)


def _get_masked_tokens_from_bitmask(bitmask: Any, vocab_size: int, index: int = 0) -> list[int]:
    """The ids a filled bitmask row rejects."""
    return np.flatnonzero(~_row_bits(bitmask, vocab_size, index)).tolist()


def _is_single_token_bitmask(bitmask: Any, vocab_size: int, index: int = 0) -> tuple[bool, int]:
    """(True, id) when the row allows exactly one token, else (False, -1)."""
    allowed = np.flatnonzero(_row_bits(bitmask, vocab_size, index))
    return (True, int(allowed[0])) if len(allowed) == 1 else (False, -1)


def _traverse_draft_tree(retrieve_next_token: Any, retrieve_next_sibling: Any, draft_tokens: Any,
                         matcher: GrammarMatcher, bitmask: Any, time_threshold: float = -1.0) -> bool:
    """GrammarMatcher.traverse_draft_tree with xgrammar's argument order for this helper."""
    return matcher.traverse_draft_tree(retrieve_next_token, retrieve_next_sibling, draft_tokens, bitmask,
                                       time_threshold)


def _json_schema_to_ebnf(schema: Any, *, any_whitespace: bool = True, indent: int | None = None,
                         separators: tuple[str, str] | None = None, max_whitespace_cnt: int | None = None,
                         strict_mode: bool = True, json_format: str = "json", any_order: bool = False) -> str:
    """xg2's EBNF for a schema; `json_format` another style than "json" (an XML style of tool
    arguments) goes through a structural tag of that style, or, with options a structural tag does
    not carry (the JSON layout of values, `strict_mode=False`), straight through the converter of
    that style (the same language)."""
    if json_format != "json":
        # the schema as Grammar.from_json_schema takes it: JSON text or a pydantic model class too
        if isinstance(schema, (str, bytes)):
            try:
                schema = json.loads(schema)
            except ValueError as exc:
                raise SchemaJSONError(f"schema is not valid JSON: {exc}", "") from None
        elif isinstance(schema, type) and hasattr(schema, "model_json_schema"):
            schema = schema.model_json_schema()
    if json_format != "json" and (not strict_mode or not any_whitespace or indent is not None or separators is not None):
        from .grammar.json_schema import json_schema_to_ir

        return str(Grammar(json_schema_to_ir(schema, any_whitespace=any_whitespace, indent=indent, separators=separators,
                                             strict_mode=strict_mode, max_whitespace_cnt=max_whitespace_cnt,
                                             any_order=any_order, style=json_format)))
    if json_format == "json":
        return str(Grammar.from_json_schema(schema, any_whitespace=any_whitespace, indent=indent,
                                            separators=separators, strict_mode=strict_mode,
                                            max_whitespace_cnt=max_whitespace_cnt, any_order=any_order))
    fmt = {"type": "json_schema", "json_schema": schema, "style": json_format, "any_order": any_order,
           "max_whitespace_cnt": max_whitespace_cnt}
    return str(Grammar.from_structural_tag({"type": "structural_tag", "format": fmt}))


def _regex_to_ebnf(regex: str, with_rule_name: bool = True) -> str:
    """xg2's EBNF for a regex (the body alone without `with_rule_name`)."""
    text = str(Grammar.from_regex(regex))
    return text if with_rule_name or not text.startswith("root ::= ") else text[len("root ::= "):]


def _expr_regex(e: Any) -> str:
    """An IR expression of character classes, literals, sequences, choices and repeats in Python's
    `re` dialect."""
    from .grammar.ir import CharClass, Choice, Literal, Repeat, Seq

    def char(c: int) -> str:
        return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" if c < 0x10000 else f"\\U{c:08x}"

    if isinstance(e, Literal):
        return "".join(char(ord(c)) if not (c.isascii() and c.isalnum()) else c for c in e.text)
    if isinstance(e, CharClass):
        body = "".join(char(a) if a == b else f"{char(a)}-{char(b)}" for a, b in e.ranges)
        return f"[{'^' if e.negated else ''}{body}]" if body or e.negated else "(?!)"
    if isinstance(e, Choice):
        return "(?:" + "|".join(_expr_regex(a) for a in e.alts) + ")"
    if isinstance(e, Seq):
        return "".join(_expr_regex(a) for a in e.items)
    if isinstance(e, Repeat):
        return f"(?:{_expr_regex(e.expr)}){{{e.min},{'' if e.max is None else e.max}}}"
    raise UsageError(f"no regex form for {type(e).__name__}")


def _generate_range_regex(start: int | None, end: int | None) -> str:
    """The integers in [start, end] (None: unbounded) as xg2 writes them, as an anchored regex.
    xg2's own language (`-0` is the integer 0), not xgrammar's text for it."""
    from .grammar.numbers import int_range

    e = int_range(start, end)
    return "^(?!)$" if e is None else f"^{_expr_regex(e)}$"


def _generate_float_regex(start: float | None, end: float | None, exclusive_start: bool = False,
                          exclusive_end: bool = False) -> str:
    """The plain decimals in the range (None: unbounded) as xg2 accepts them for a bounded
    `number`, as an anchored regex: any number of fraction digits, exact at the bounds (xgrammar's
    helper caps fractions at six digits and writes other text)."""
    from .grammar.numbers import NUMBER, decimal_range, to_decimal

    if start is None and end is None:
        e = NUMBER
    else:
        e = decimal_range(None if start is None else to_decimal(start), not exclusive_start,
                          None if end is None else to_decimal(end), not exclusive_end)
    return "^(?!)$" if e is None else f"^{_expr_regex(e)}$"


def _ebnf_to_grammar_no_normalization(ebnf_string: str, root_rule_name: str = "root") -> Grammar:
    """The grammar as written (xgrammar's helper parses without its normalisation passes; xg2's
    reader runs none, so this is Grammar.from_ebnf)."""
    return Grammar.from_ebnf(ebnf_string, root_rule_name=root_rule_name)


def _get_allow_empty_rule_ids(compiled_grammar: Any) -> list[int]:
    """The numbers of the rules that accept the empty string, rules numbered as the grammar lists
    them (its root first, then the others in the order they were written). xgrammar numbers the
    rules of its normalised grammar, which can add some (for a repeated group) after these."""
    from .grammar.repetition import nullable_rule_names

    ir = compiled_grammar.grammar.ir
    nullable = nullable_rule_names(ir)
    return [i for i, rule in enumerate(ir.rules) if rule.name in nullable]
