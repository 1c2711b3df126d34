"""What a tenant asks the runtime for: a grammar spec (typed msgspec structs) and session options.

A spec is data, so it can cross a process boundary (a Ray call, an HTTP body) and be validated on
the way in with msgspec. Its content key names the compiled grammar: concurrent requests with the
same key share one compile (single-flight), the runtime's compile cache and the cache shards keep
compiled grammars under it. The key is a 128-bit BLAKE2b digest of the spec's canonical bytes
(msgpack of the struct: field order fixed by the struct, a schema's member order kept, since member
order changes the language) with the kind and the engine's grammar options.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

import msgspec

from ..compiler import CompiledGrammar, GrammarCompiler


class JSONSchemaSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="json_schema"):
    """A JSON Schema (an object, a boolean, or its JSON text) with xgrammar's options."""

    schema: Any
    any_whitespace: bool = True
    indent: int | None = None
    separators: tuple[str, str] | None = None
    strict_mode: bool = True
    max_whitespace_cnt: int | None = None
    any_order: bool = False

    def compile(self, compiler: GrammarCompiler) -> CompiledGrammar:
        return compiler.compile_json_schema(
            self.schema, any_whitespace=self.any_whitespace, indent=self.indent, separators=self.separators,
            strict_mode=self.strict_mode, max_whitespace_cnt=self.max_whitespace_cnt, any_order=self.any_order)


class EBNFSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="ebnf"):
    grammar: str
    root_rule_name: str = "root"

    def compile(self, compiler: GrammarCompiler) -> CompiledGrammar:
        return compiler.compile_grammar(self.grammar, root_rule_name=self.root_rule_name)


class RegexSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="regex"):
    pattern: str

    def compile(self, compiler: GrammarCompiler) -> CompiledGrammar:
        return compiler.compile_regex(self.pattern)


class StructuralTagSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="structural_tag"):
    """xgrammar's structural-tag JSON (an object or its text)."""

    structural_tag: Any

    def compile(self, compiler: GrammarCompiler) -> CompiledGrammar:
        return compiler.compile_structural_tag(self.structural_tag)


class ToolsSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="tools"):
    """An OpenAI request's `tools` and `tool_choice`, constrained by a model's tool-call format
    (xg2.get_model_structural_tag: qwen_3, llama, deepseek_r1, harmony, ...)."""

    tools: list[Any]
    tool_choice: Any = "auto"
    model: str = "qwen_3"
    parallel_tool_calls: bool = True
    reasoning: Literal["enabled", "disabled", "auto"] = "disabled"
    any_whitespace: bool = True             # False: the arguments' JSON without whitespace

    def compile(self, compiler: GrammarCompiler) -> CompiledGrammar:
        from ..grammar.model_formats import get_model_structural_tag

        tag = get_model_structural_tag(self.model, self.tools, self.tool_choice, reasoning=self.reasoning,
                                       parallel_tool_calls=self.parallel_tool_calls,
                                       any_whitespace=self.any_whitespace)
        return compiler.compile_structural_tag(tag)


GrammarSpec = JSONSchemaSpec | EBNFSpec | RegexSpec | StructuralTagSpec | ToolsSpec


class SessionOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """GrammarMatcher's options, per session."""

    override_stop_tokens: list[int] | None = None
    terminate_without_stop_token: bool = False
    max_rollback_tokens: int = -1


class SessionSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One request: its grammar, the tenant it belongs to, the matcher's options."""

    grammar: GrammarSpec
    tenant: str = "default"
    options: SessionOptions = SessionOptions()


_ENCODER = msgspec.msgpack.Encoder()
_SPEC_DECODER = msgspec.json.Decoder(SessionSpec)
_SPEC_CONVERT = SessionSpec


def content_key(grammar: GrammarSpec) -> bytes:
    """128-bit content key of a grammar spec (see the module note)."""
    return hashlib.blake2b(_ENCODER.encode(grammar), digest_size=16).digest()


def as_session_spec(spec: Any) -> SessionSpec:
    """A SessionSpec from itself, a grammar spec, a dict or JSON text; msgspec.ValidationError
    (a SpecError through the runtime) names the JSON path of what is wrong."""
    if isinstance(spec, SessionSpec):
        return spec
    if isinstance(spec, (JSONSchemaSpec, EBNFSpec, RegexSpec, StructuralTagSpec, ToolsSpec)):
        return SessionSpec(spec)
    if isinstance(spec, (str, bytes)):
        return _SPEC_DECODER.decode(spec)
    return msgspec.convert(spec, _SPEC_CONVERT)
