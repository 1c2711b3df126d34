"""JSON forms of TokenizerInfo, Grammar and CompiledGrammar (xgrammar's serialize_json /
deserialize_json), so an engine that caches or ships compiled grammars through JSON switches by
import.

Each form is a JSON object with the kind of object and the serialization version; a reader refuses
another version (DeserializeVersionError) rather than guess, text that is not JSON
(InvalidJSONError), and anything else it does not expect (DeserializeFormatError), all three with
the names of ``xg2.exception``. A compiled grammar carries the binary blob of
``CompiledGrammar.serialize()`` (itself versioned, checksummed and bound to its vocabulary by a
fingerprint) in base64; it is not readable by xgrammar, nor xgrammar's by xg2: the two engines'
tables have nothing in common.
"""

from __future__ import annotations

import base64
import binascii
import json
import threading
import weakref
from typing import TYPE_CHECKING, Any

from .exception import InvalidJSONError
from .transport import DeserializeError, DeserializeVersionError

if TYPE_CHECKING:
    from .compiler import CompiledGrammar, GrammarCompiler
    from .grammar.grammar import Grammar
    from .tokenizer import TokenizerInfo

#: The version of the JSON forms; a reader takes this one only.
SERIALIZATION_VERSION = "xg2-json-1"


class SerializedJSONError(DeserializeError, InvalidJSONError):
    """A serialized form that is not JSON text."""


def get_serialization_version() -> str:
    """The version written into, and required of, every JSON form (xgrammar's function)."""
    return SERIALIZATION_VERSION


def _dump(kind: str, body: dict[str, Any]) -> str:
    return json.dumps({"kind": kind, "__VERSION__": SERIALIZATION_VERSION, **body}, separators=(",", ":"))


def _load(text: Any, kind: str) -> dict[str, Any]:
    if not isinstance(text, (str, bytes, bytearray)):
        raise TypeError(f"a serialized {kind} is JSON text, not {type(text).__name__}")
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise SerializedJSONError(f"serialized {kind} is not valid JSON: {e}") from None
    if not isinstance(obj, dict) or "__VERSION__" not in obj:
        raise DeserializeError(f"not a serialized {kind}: a JSON object with __VERSION__ is expected")
    if obj["__VERSION__"] != SERIALIZATION_VERSION:
        raise DeserializeVersionError(f"serialized by version {obj['__VERSION__']!r}, this reader takes "
                                      f"{SERIALIZATION_VERSION!r}")
    if obj.get("kind") != kind:
        raise DeserializeError(f"expected a serialized {kind}, got {obj.get('kind')!r}")
    return obj


def _field(obj: dict[str, Any], name: str, typ: type, kind: str) -> Any:
    value = obj.get(name)
    if not isinstance(value, typ) or (typ is not bool and isinstance(value, bool)):
        raise DeserializeError(f"serialized {kind}: field {name!r} is missing or of the wrong type")
    return value


# -- TokenizerInfo ---------------------------------------------------------------------------------


def tokenizer_info_to_json(info: TokenizerInfo) -> str:
    """The decoded vocabulary (each token's bytes as a latin-1 string: exact, and plain JSON) and
    the metadata; the special tokens are kept, as they decide what grammars may allow."""
    return _dump("tokenizer_info", {
        "vocab_type": int(info.vocab_type),
        "vocab_size": info.vocab_size,
        "add_prefix_space": info.add_prefix_space,
        "stop_token_ids": list(info.stop_token_ids),
        "special_token_ids": list(info.special_token_ids),
        "decoded_vocab": [t.decode("latin-1") for t in info.decoded_vocab],
    })


def tokenizer_info_from_json(text: Any) -> TokenizerInfo:
    from .tokenizer import TokenizerInfo, VocabType

    kind = "tokenizer_info"
    obj = _load(text, kind)
    vocab = _field(obj, "decoded_vocab", list, kind)
    if not all(isinstance(t, str) for t in vocab):
        raise DeserializeError("serialized tokenizer_info: decoded_vocab holds a non-string")
    try:
        decoded = [t.encode("latin-1") for t in vocab]
        # The vocabulary exactly as it was (ids past it are padding up to vocab_size, as they were):
        # the same tokenizer, down to its fingerprint.
        info = TokenizerInfo.__new__(TokenizerInfo)
        info._setup(decoded, VocabType(_field(obj, "vocab_type", int, kind)),
                    _field(obj, "vocab_size", int, kind), _field(obj, "stop_token_ids", list, kind),
                    [i for i in _field(obj, "special_token_ids", list, kind) if not (isinstance(i, int)
                                                                                       and i >= len(decoded))],
                    _field(obj, "add_prefix_space", bool, kind),
                    detect_stop_among=None)
        return info
    except (ValueError, TypeError, UnicodeEncodeError) as e:
        raise DeserializeError(f"serialized tokenizer_info refused: {e}") from None


# -- Grammar ---------------------------------------------------------------------------------------


def grammar_to_json(grammar: Grammar) -> str:
    """The grammar's EBNF (xg2's printing, which reads back as the same grammar) and its root."""
    return _dump("grammar", {"ebnf": str(grammar), "root_rule_name": grammar.ir.root})


def grammar_from_json(text: Any) -> Grammar:
    from .errors import GrammarError
    from .grammar.grammar import Grammar

    kind = "grammar"
    obj = _load(text, kind)
    try:
        return Grammar.from_ebnf(_field(obj, "ebnf", str, kind),
                                 root_rule_name=_field(obj, "root_rule_name", str, kind))
    except GrammarError as e:
        raise DeserializeError(f"serialized grammar refused: {e}") from None


# -- CompiledGrammar -------------------------------------------------------------------------------

#: Reading compilers by vocabulary, while something holds them (weak: a module-level compiler
#: would keep its caches and its background thread for the life of the process).
_compilers: weakref.WeakValueDictionary[str, GrammarCompiler] = weakref.WeakValueDictionary()
_compilers_lock = threading.Lock()


def _compiler_for(info: TokenizerInfo) -> GrammarCompiler:
    """A compiler for deserialize_json, which xgrammar gives a TokenizerInfo only: grammars read
    while an earlier reading compiler of the vocabulary is alive share its entry pool."""
    from .compiler import GrammarCompiler

    with _compilers_lock:
        compiler = _compilers.get(info.fingerprint)
        if compiler is None:
            compiler = GrammarCompiler(info, cache_enabled=False)
            _compilers[info.fingerprint] = compiler
        return compiler


def compiled_grammar_to_json(compiled: CompiledGrammar) -> str:
    """The blob of CompiledGrammar.serialize() in base64 (the grammar's own entries and its first
    mask's ride along; pooled ones are built again on first visit), with the vocabulary's
    fingerprint, which the blob checks again."""
    return _dump("compiled_grammar", {
        "tokenizer_fingerprint": compiled.tokenizer_info.fingerprint,
        "blob": base64.b64encode(compiled.serialize()).decode("ascii"),
    })


def compiled_grammar_from_json(text: Any, tokenizer_info: TokenizerInfo,
                               compiler: GrammarCompiler | None = None) -> CompiledGrammar:
    """`compiler`: the one to join (its entry pool and caches); by default a reading compiler of
    the vocabulary (see _compiler_for).
    A grammar written for another vocabulary is refused (DeserializeFormatError)."""
    kind = "compiled_grammar"
    obj = _load(text, kind)
    if _field(obj, "tokenizer_fingerprint", str, kind) != tokenizer_info.fingerprint:
        raise DeserializeError("the compiled grammar was serialized for another vocabulary")
    try:
        blob = base64.b64decode(_field(obj, "blob", str, kind), validate=True)
    except binascii.Error as e:
        raise DeserializeError(f"serialized compiled_grammar: the blob is not base64: {e}") from None
    if compiler is None:
        compiler = _compiler_for(tokenizer_info)
    elif compiler.tokenizer_info.fingerprint != tokenizer_info.fingerprint:
        raise ValueError("the compiler is for another vocabulary than tokenizer_info")
    return compiler.deserialize(blob)
