"""`Grammar`: the front-end-independent grammar object users pass to the compiler."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .builtin import JSON_EBNF
from .ebnf import parse_ebnf, print_ebnf
from .ir import GrammarIR


class Grammar:
    """An immutable grammar in the shared IR; `str()` gives normalised EBNF."""

    def __init__(self, ir: GrammarIR):
        self._ir = ir
        self._text: str | None = None

    @property
    def ir(self) -> GrammarIR:
        return self._ir

    @staticmethod
    def from_ebnf(ebnf_string: str, *, root_rule_name: str = "root") -> Grammar:
        if not isinstance(ebnf_string, str):
            raise TypeError("ebnf_string must be a str")
        return Grammar(parse_ebnf(ebnf_string, root_rule_name=root_rule_name))

    @staticmethod
    def from_json_schema(schema: Any, *, any_whitespace: bool = True, indent: int | None = None,
                         separators: tuple[str, str] | None = None, strict_mode: bool = True,
                         max_whitespace_cnt: int | None = None, print_converted_ebnf: bool = False,
                         any_order: bool = False, lenient: bool = False, format_assertion: bool = True,
                         schema_store: Mapping[str, Any] | None = None,
                         string_escapes: str = "non_ascii", integers_as_numbers: bool = False) -> Grammar:
        """A JSON Schema (dict, JSON text, or a pydantic model class) as a grammar. Option meanings
        follow xgrammar's `compile_json_schema`; `any_order` lets object members come in any order;
        `lenient` turns keywords that cannot be enforced into `SchemaWarning`s instead of errors;
        `format_assertion=False` reads `format` as an annotation only; `schema_store` maps URIs to
        the documents remote `$ref`s may point into; `string_escapes="all"` accepts ``\\uXXXX`` for
        printable ASCII in constrained strings too; `integers_as_numbers` accepts integers written
        as ``3.0`` or ``1e2``; `print_converted_ebnf` prints the grammar's
        EBNF (xgrammar's debugging aid)."""
        from .json_schema import json_schema_to_ir

        if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
            schema = schema.model_json_schema()
        grammar = Grammar(json_schema_to_ir(schema, any_whitespace=any_whitespace, indent=indent,
                                            separators=separators, strict_mode=strict_mode,
                                            max_whitespace_cnt=max_whitespace_cnt, any_order=any_order,
                                            lenient=lenient, format_assertion=format_assertion,
                                            schema_store=schema_store, string_escapes=string_escapes,
                                            integers_as_numbers=integers_as_numbers))
        if print_converted_ebnf:
            print(grammar)
        return grammar

    @staticmethod
    def from_regex(regex_string: str, *, print_converted_ebnf: bool = False) -> Grammar:
        """A grammar whose language is the strings `regex_string` fully matches (xgrammar's
        semantics); the supported dialect and its errors are described in :mod:`xg2.grammar.regex`.
        `print_converted_ebnf` prints the grammar's EBNF."""
        from .regex import regex_to_ir

        if not isinstance(regex_string, str):
            raise TypeError("regex_string must be a str")
        grammar = Grammar(regex_to_ir(regex_string))
        if print_converted_ebnf:
            print(grammar)
        return grammar

    @staticmethod
    def from_lark(lark_string: str, *, tokenizer_info: Any = None,
                  named_grammars: dict[str, Grammar | str] | None = None) -> Grammar:
        """A grammar in xgrammar's Lark dialect (its root is the `start` rule); `named_grammars`
        gives the grammars `@name` references embed (xg2 Grammars or Lark texts, keys without the
        `@`). The dialect, and what is refused and why, is described in :mod:`xg2.grammar.lark`.
        `tokenizer_info` resolves special tokens (`<|name|>`, `<[ids]>`; the grammar is then
        for that vocabulary only)."""
        from .lark import lark_to_ir

        return Grammar(lark_to_ir(lark_string, tokenizer_info, named_grammars))

    @staticmethod
    def from_structural_tag(*args: Any, **kwargs: Any) -> Grammar:
        """xgrammar's structural tag (a dict, JSON text or pydantic objects) as a grammar; see
        :mod:`xg2.grammar.structural_tag` for the formats lowered. Also xgrammar's deprecated
        ``(tags, triggers)`` form (a list of StructuralTagItem and a list of trigger strings),
        which engines' backends still build. Token-level formats need `tokenizer_info` (second
        argument or keyword; the grammar is then for that vocabulary only). Bad tags raise
        `StructuralTagError` with the JSON pointer of the element at fault."""
        from .structural_tag import structural_tag_arguments, structural_tag_to_ir

        tag, tokenizer_info = structural_tag_arguments(args, kwargs)
        return Grammar(structural_tag_to_ir(tag, tokenizer_info))

    @staticmethod
    def concat(*grammars: Grammar) -> Grammar:
        """The language of each grammar in turn (xgrammar's Grammar.concat)."""
        return Grammar._combined(grammars, "concat")

    @staticmethod
    def union(*grammars: Grammar) -> Grammar:
        """The language of any of the grammars (xgrammar's Grammar.union)."""
        return Grammar._combined(grammars, "union")

    @staticmethod
    def _combined(grammars: tuple, how: str) -> Grammar:
        """A new root over the grammars' rules, each grammar's renamed under a prefix of its own."""
        from ..errors import GrammarError
        from .ir import Choice, Rule, Seq
        from .optimize import embedded

        if len(grammars) == 1 and isinstance(grammars[0], (list, tuple)):
            grammars = tuple(grammars[0])       # xgrammar's C++ binding takes a list too
        if not grammars:
            raise GrammarError(f"Grammar.{how} needs at least one grammar")
        rules: list[Rule] = []
        roots = []
        for i, g in enumerate(grammars):
            if not isinstance(g, Grammar):
                raise TypeError(f"Grammar.{how} takes Grammar objects, got {type(g).__name__}")
            part, root = embedded(g.ir, f"{how}{i}_")
            rules.extend(part)
            roots.append(root)
        body = roots[0] if len(roots) == 1 else (Seq if how == "concat" else Choice)(tuple(roots))
        return Grammar(GrammarIR([Rule("root", body), *rules], "root"))

    @staticmethod
    def builtin_json_grammar() -> Grammar:
        return Grammar.from_ebnf(JSON_EBNF)

    def serialize_json(self) -> str:
        """xgrammar's JSON form (see xg2.serialization): the grammar's EBNF and root rule."""
        from ..serialization import grammar_to_json

        return grammar_to_json(self)

    @staticmethod
    def deserialize_json(json_string: str) -> Grammar:
        from ..serialization import grammar_from_json

        return grammar_from_json(json_string)

    def to_string(self) -> str:
        if self._text is None:
            self._text = print_ebnf(self._ir)
        return self._text

    def __str__(self) -> str:
        return self.to_string()

    def __repr__(self) -> str:
        return f"Grammar({self.to_string()!r})"
