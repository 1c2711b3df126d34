"""TokenizerInfo: what every token id of a model's vocabulary stands for, as exact bytes.

The API copies xgrammar's ``TokenizerInfo`` / ``VocabType`` (names, constructor shape, factories,
properties), so an engine integration ports by changing an import. Three encodings of a vocabulary
are understood:

* ``RAW``: the token is its own text (``str`` is UTF-8 encoded) or raw ``bytes`` (tiktoken).
* ``BYTE_FALLBACK``: SentencePiece pieces; ``▁`` (U+2581) stands for a space and ``<0xNN>`` for the
  single raw byte NN.
* ``BYTE_LEVEL``: GPT-2 byte-level BPE; every byte is spelled with one character of the
  byte-to-unicode alphabet (``Ġ`` = space, ``Ċ`` = newline, ...). A token that is not spelled in
  that alphabet (e.g. an added token such as ``<｜end▁of▁sentence｜>``) stands for its own UTF-8
  text, exactly as the Hugging Face ``ByteLevel`` decoder and xgrammar treat it.

Token classes:

* stop tokens (``stop_token_ids``): end the generation; a grammar allows them once it can end.
* special tokens (``special_token_ids``): never allowed by a grammar mask. These are the tokens
  that decode to no bytes (holes in the id space), the padding ids ``[len(vocab), vocab_size)``,
  and, when the source says so, control / added special tokens. Stop tokens are never listed as
  special, even when the tokenizer marks them special.

``decoded_vocab`` follows xgrammar: special tokens decode to their text (``b"<s>"``), holes to
``b""``.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import json
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from xg2.errors import TokenizerError

#: Special tokens named in grammars are spelled there as one surrogate code point each, from here
#: (see TokenizerInfo.named_special_tokens); the surrogate range bounds how many can be named.
SPECIAL_CHAR_BASE = 0xD800
MAX_NAMED_SPECIALS = 0x800

__all__ = ["TokenizerInfo", "VocabType"]


class VocabType(enum.IntEnum):
    """How the strings of an encoded vocabulary spell bytes (values as in xgrammar)."""

    RAW = 0
    BYTE_FALLBACK = 1
    BYTE_LEVEL = 2

    # Printed as xgrammar's plain Enum prints ("VocabType.RAW"), not as the bare number IntEnum
    # gives since Python 3.11: logs and test ids read the same on both engines.
    __str__ = enum.Enum.__str__


# Stop tokens recognised by name when none are given; the same set xgrammar uses
# (LLaMA-2 ``</s>``, LLaMA-3 ``<|end_of_text|>``/``<|eot_id|>``, GPT/Phi-2/Qwen ``<|endoftext|>``,
# Gemma ``<eos>``/``<end_of_turn>``, DeepSeek ``<｜end▁of▁sentence｜>``).
DETECTION_STOP_TOKENS: frozenset[bytes] = frozenset(
    s.encode("utf-8")
    for s in (
        "</s>",
        "<|end_of_text|>",
        "<|eot_id|>",
        "<|endoftext|>",
        "<eos>",
        "<|eos|>",
        "<end_of_turn>",
        "<｜end▁of▁sentence｜>",
    )
)

# Consulted only when none of DETECTION_STOP_TOKENS is found (xgrammar finds nothing then):
# ChatML ``<|im_end|>``, Phi-3 ``<|end|>``, Harmony ``<|return|>``, older Claude ``<EOT>``.
FALLBACK_STOP_TOKENS: frozenset[bytes] = frozenset(
    s.encode("utf-8") for s in ("<|im_end|>", "<|end|>", "<|return|>", "<EOT>", "<|EOT|>")
)

_SPACE_MARK = "\u2581"  # "▁", SentencePiece's space
_SPACE_MARK_BYTES = _SPACE_MARK.encode("utf-8")
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
# Ids beyond the tokens actually present (padding, holes) are bounded, so that a stray huge id or
# vocab_size is a clear error rather than a giant allocation.
MAX_UNUSED_IDS = 1 << 20


def _byte_level_alphabet() -> list[str]:
    """GPT-2 ``bytes_to_unicode``: entry b is the character that spells byte b."""
    kept = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    kept_set = set(kept)
    alphabet = [""] * 256
    for b in kept:
        alphabet[b] = chr(b)
    shifted = 0
    for b in range(256):
        if b not in kept_set:
            alphabet[b] = chr(256 + shifted)
            shifted += 1
    return alphabet


_BYTE_LEVEL_ALPHABET: list[str] = _byte_level_alphabet()
_BYTE_LEVEL_CHARSET: frozenset[str] = frozenset(_BYTE_LEVEL_ALPHABET)
# str.translate table: alphabet character -> the latin-1 character of its byte; any other
# character below 256 -> U+FFFF, so that encoding the result as latin-1 fails exactly when the
# token is not spelled in the alphabet (characters >= 324 are left alone and fail as well).
_BYTE_LEVEL_TABLE: dict[int, str] = {c: "\uffff" for c in range(256)}
_BYTE_LEVEL_TABLE.update({ord(ch): chr(b) for b, ch in enumerate(_BYTE_LEVEL_ALPHABET)})
_BYTE_LEVEL_DELETE: dict[int, None] = {ord(ch): None for ch in _BYTE_LEVEL_ALPHABET}


# --------------------------------------------------------------------------------------------
# Decoding one token


def _as_text(token: str | bytes, index: int) -> str | bytes:
    if isinstance(token, str):
        return token
    if isinstance(token, (bytes, bytearray, memoryview)):
        return bytes(token)
    raise TokenizerError(f"encoded_vocab[{index}] must be str or bytes, not {type(token).__name__}")


def _utf8(token: str, index: int) -> bytes:
    try:
        return token.encode("utf-8")
    except UnicodeEncodeError as e:
        raise TokenizerError(f"encoded_vocab[{index}] is not valid Unicode text: {e}") from None


def _decode_raw(token: str | bytes, index: int) -> bytes:
    return token if isinstance(token, bytes) else _utf8(token, index)


def _decode_byte_level(token: str | bytes, index: int) -> bytes:
    if isinstance(token, bytes):
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            return token  # not text in the alphabet: stands for itself
    else:
        text = token
    try:
        return text.translate(_BYTE_LEVEL_TABLE).encode("latin-1")
    except UnicodeEncodeError:
        # Not spelled in the byte-level alphabet (an added token): its own UTF-8 text.
        return token if isinstance(token, bytes) else _utf8(token, index)


def _decode_byte_fallback(token: str | bytes, index: int) -> bytes:
    if len(token) == 6:
        text = token if isinstance(token, str) else token.decode("latin-1")
        m = _BYTE_PIECE.fullmatch(text)
        if m:
            return bytes((int(m.group(1), 16),))
    if isinstance(token, bytes):
        return token.replace(_SPACE_MARK_BYTES, b" ")
    return _utf8(token.replace(_SPACE_MARK, " "), index)


_DECODERS = {
    VocabType.RAW: _decode_raw,
    VocabType.BYTE_FALLBACK: _decode_byte_fallback,
    VocabType.BYTE_LEVEL: _decode_byte_level,
}


def _decode_vocab(encoded_vocab: Sequence[str | bytes], vocab_type: VocabType) -> list[bytes]:
    decode = _DECODERS[vocab_type]
    out: list[bytes] = []
    append = out.append
    for i, token in enumerate(encoded_vocab):
        if type(token) is not str:
            token = _as_text(token, i)
        append(decode(token, i))
    return out


# --------------------------------------------------------------------------------------------
# Argument checking


def _check_vocab_type(vocab_type: Any) -> VocabType:
    if isinstance(vocab_type, VocabType):
        return vocab_type
    if isinstance(vocab_type, str):
        try:
            return VocabType[vocab_type.upper()]
        except KeyError:
            pass
    elif isinstance(vocab_type, enum.Enum) and isinstance(vocab_type.value, int):
        # e.g. xgrammar.VocabType, a plain Enum with the same values
        return _check_vocab_type(vocab_type.value)
    elif isinstance(vocab_type, int) and not isinstance(vocab_type, bool):
        try:
            return VocabType(vocab_type)
        except ValueError:
            pass
    raise TokenizerError(
        f"vocab_type must be a VocabType (RAW, BYTE_FALLBACK or BYTE_LEVEL), got {vocab_type!r}"
    )


def _check_int(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise TokenizerError(f"{what} must be an int, got bool")
    if isinstance(value, int):
        return int(value)
    index = getattr(type(value), "__index__", None)  # numpy integers
    if index is None:
        raise TokenizerError(f"{what} must be an int, got {type(value).__name__}")
    return int(index(value))


def _check_id_list(ids: Any, what: str) -> list[int] | None:
    """None stays None; an int becomes [int]; otherwise an iterable of ints."""
    if ids is None:
        return None
    if isinstance(ids, (str, bytes)):
        raise TokenizerError(f"{what} must be an int or a list of ints, got {type(ids).__name__}")
    if not isinstance(ids, Iterable):
        return [_check_int(ids, what)]
    return [_check_int(i, f"every entry of {what}") for i in ids]


def _check_vocab_size(vocab_size: Any, minimum: int | None) -> int | None:
    if vocab_size is None:
        return None
    size = _check_int(vocab_size, "vocab_size")
    if size <= 0:
        raise TokenizerError(f"vocab_size must be positive, got {size}")
    if minimum is not None and size < minimum:
        raise TokenizerError(
            f"vocab_size ({size}) must be at least the number of tokens in the vocabulary ({minimum})"
        )
    return size


def _check_unused_ids(size: int, used: int, what: str) -> None:
    if size - used > MAX_UNUSED_IDS:
        raise TokenizerError(
            f"{what} ({size}) leaves {size - used} ids without a token; at most {MAX_UNUSED_IDS} "
            "are supported"
        )


def _check_bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise TokenizerError(f"{what} must be a bool, got {type(value).__name__}")
    return value


def _fspath(source: Any) -> str | None:
    if isinstance(source, (str, os.PathLike)):
        try:
            path = os.fspath(source)
        except TypeError:
            return None
        return path.decode() if isinstance(path, bytes) else path
    return None


def _read_bytes(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise TokenizerError(f"cannot read {what} {path!r}: {e.strerror or e}") from None


def _detect_stop_ids(decoded: Sequence[bytes], candidates: Iterable[int]) -> list[int]:
    """Stop tokens by name among `candidates`: xgrammar's names first, then the fallback names."""
    candidates = list(candidates)
    for names in (DETECTION_STOP_TOKENS, FALLBACK_STOP_TOKENS):
        found = sorted({i for i in candidates if decoded[i] in names})
        if found:
            return found
    return []


# --------------------------------------------------------------------------------------------
# TokenizerInfo


class TokenizerInfo:
    """The decoded vocabulary of a model plus its stop and special tokens.

    Parameters
    ----------
    encoded_vocab
        Token i's string as the tokenizer stores it (see ``VocabType``); ``str`` or ``bytes``.
    vocab_type
        How ``encoded_vocab`` spells bytes.
    vocab_size
        The model's vocabulary size (size of the logits / token mask); defaults to
        ``len(encoded_vocab)``. Larger values pad: ids in ``[len(encoded_vocab), vocab_size)``
        are special (never allowed).
    stop_token_ids
        Stop token id(s). When None, tokens named like a stop token (``</s>``,
        ``<|endoftext|>``, ``<|eot_id|>``, ``<｜end▁of▁sentence｜>``, ... as in xgrammar) are used.
    add_prefix_space
        Whether the tokenizer prepends a space to the text before tokenizing (SentencePiece style).
    special_token_ids
        (xg2 extension) Ids of tokens that a grammar must never allow, e.g. control tokens. Tokens
        decoding to no bytes are always special. Ids that are also stop tokens are ignored.
    """

    __slots__ = (
        "_add_prefix_space",
        "_by_text",
        "_decoded",
        "_fingerprint",
        "_named",
        "_sorted",
        "_special_ids",
        "_stop_ids",
        "_vocab_size",
        "_vocab_type",
    )

    def __init__(
        self,
        encoded_vocab: list[str] | list[bytes],
        vocab_type: VocabType = VocabType.RAW,
        *,
        vocab_size: int | None = None,
        stop_token_ids: list[int] | int | None = None,
        add_prefix_space: bool = False,
        special_token_ids: Iterable[int] | None = None,
    ) -> None:
        if isinstance(encoded_vocab, (str, bytes, Mapping)) or not isinstance(encoded_vocab, Sequence):
            raise TokenizerError(
                f"encoded_vocab must be a list of str or bytes, got {type(encoded_vocab).__name__}"
            )
        vocab_type = _check_vocab_type(vocab_type)
        decoded = _decode_vocab(encoded_vocab, vocab_type)
        self._setup(
            decoded,
            vocab_type,
            vocab_size,
            stop_token_ids,
            special_token_ids,
            add_prefix_space,
            detect_stop_among=None,
        )

    # -- construction helpers ---------------------------------------------------------------

    @classmethod
    def _from_decoded(
        cls,
        decoded: list[bytes],
        vocab_type: VocabType,
        *,
        vocab_size: int | None,
        stop_token_ids: list[int] | None,
        special_token_ids: Iterable[int],
        add_prefix_space: bool,
        detect_stop_among: Iterable[int] | None,
        drop_out_of_range: bool = False,
    ) -> TokenizerInfo:
        """Build from an already decoded vocabulary (factories): a vocab_size below its length
        truncates it, one above pads it with b"" tokens."""
        self = cls.__new__(cls)
        vocab_size = _check_vocab_size(vocab_size, None)
        if vocab_size is not None and vocab_size < len(decoded):
            # Case 3 of xgrammar's from_huggingface: the tokenizer has tokens the model's
            # lm_head does not (e.g. padded image tokens); they are dropped.
            decoded = decoded[:vocab_size]
            n = vocab_size
            special_token_ids = [i for i in special_token_ids if i < n]
            if detect_stop_among is not None:
                detect_stop_among = [i for i in detect_stop_among if i < n]
        if stop_token_ids is not None:
            # Stop tokens are real tokens: never a dropped or a padding id. Ids derived from the
            # tokenizer (its EOS) are dropped when out of range, ids given by the user raise.
            n = len(decoded)
            bad = [i for i in stop_token_ids if not 0 <= i < n]
            if bad and not drop_out_of_range:
                raise TokenizerError(f"stop_token_ids {bad} out of range: token ids are in [0, {n})")
            stop_token_ids = [i for i in stop_token_ids if 0 <= i < n]
        if vocab_size is not None and vocab_size > len(decoded):
            _check_unused_ids(vocab_size, len(decoded), "vocab_size")
            # As xgrammar's from_huggingface: the decoded vocabulary covers the whole model
            # vocabulary, padding ids decoding to b"" (and so special).
            decoded = decoded + [b""] * (vocab_size - len(decoded))
        self._setup(
            decoded,
            vocab_type,
            vocab_size,
            stop_token_ids,
            special_token_ids,
            add_prefix_space,
            detect_stop_among=detect_stop_among,
        )
        return self

    def _setup(
        self,
        decoded: list[bytes],
        vocab_type: VocabType,
        vocab_size: Any,
        stop_token_ids: Any,
        special_token_ids: Any,
        add_prefix_space: Any,
        *,
        detect_stop_among: Iterable[int] | None,
    ) -> None:
        n = len(decoded)
        size = _check_vocab_size(vocab_size, n)
        size = n if size is None else size
        _check_unused_ids(size, n, "vocab_size")
        add_prefix_space = _check_bool(add_prefix_space, "add_prefix_space")

        stops = _check_id_list(stop_token_ids, "stop_token_ids")
        if stops is None:
            among = range(n) if detect_stop_among is None else detect_stop_among
            stops = _detect_stop_ids(decoded, among)
        else:
            bad = [i for i in stops if not 0 <= i < n]
            if bad:
                raise TokenizerError(
                    f"stop_token_ids {bad} out of range: token ids are in [0, {n})"
                    + (f" (ids from {n} to {size - 1} are padding)" if size > n else "")
                )
            stops = sorted(set(stops))

        specials = set(_check_id_list(special_token_ids, "special_token_ids") or ())
        bad = sorted(i for i in specials if not 0 <= i < size)
        if bad:
            raise TokenizerError(f"special_token_ids {bad[:10]} out of range [0, {size})")
        specials.update(i for i, token in enumerate(decoded) if not token)
        specials.difference_update(stops)
        special_list = sorted(specials)
        special_list.extend(range(n, size))

        self._vocab_type = vocab_type
        self._vocab_size = size
        self._add_prefix_space = add_prefix_space
        self._decoded = decoded
        self._stop_ids = stops
        self._special_ids = special_list
        self._fingerprint: str | None = None
        self._sorted: tuple[list[int], list[bytes], list[int]] | None = None
        self._named: dict[int, str] | None = None
        self._by_text: dict[bytes, int] | None = None

    # -- properties (xgrammar's) ---------------------------------------------------------------

    @property
    def vocab_type(self) -> VocabType:
        """How the encoded vocabulary spells bytes."""
        return self._vocab_type

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary size: the size of the token mask."""
        return self._vocab_size

    @property
    def add_prefix_space(self) -> bool:
        """Whether the tokenizer prepends a space to the text before tokenizing."""
        return self._add_prefix_space

    @property
    def decoded_vocab(self) -> list[bytes]:
        """The bytes of every token id (a fresh list): ids ``[0, len(encoded_vocab))`` for the
        constructor, ``[0, vocab_size)`` for the ``from_*`` factories (padding ids are b""), as in
        xgrammar."""
        return list(self._decoded)

    @property
    def stop_token_ids(self) -> list[int]:
        """Stop token ids, ascending."""
        return list(self._stop_ids)

    @property
    def special_token_ids(self) -> list[int]:
        """Ids a grammar never allows (control tokens, holes, padding), ascending; no stop ids."""
        return list(self._special_ids)

    # -- xg2 additions ------------------------------------------------------------------------

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes of one token (b"" for padding ids)."""
        token_id = _check_int(token_id, "token_id")
        if not 0 <= token_id < self._vocab_size:
            raise TokenizerError(f"token id {token_id} out of range [0, {self._vocab_size})")
        return self._decoded[token_id] if token_id < len(self._decoded) else b""

    @property
    def named_special_tokens(self) -> dict[int, str]:
        """The special tokens a grammar can name (token-level structural tags), each with the
        character that stands for it inside grammars: a surrogate code point. UTF-8 text has no
        surrogates and no character class matches one, so a grammar allows a special token exactly
        where it names it. The first MAX_NAMED_SPECIALS special tokens with text, by id."""
        if self._named is None:
            ids = [i for i in self._special_ids if i < len(self._decoded) and self._decoded[i]]
            self._named = {i: chr(SPECIAL_CHAR_BASE + k) for k, i in enumerate(ids[:MAX_NAMED_SPECIALS])}
        return self._named

    def find_token(self, token: int | str) -> int:
        """The id of a token given by id or by its text (a special token first, when an ordinary
        token has the same text)."""
        if isinstance(token, str):
            if self._by_text is None:       # the first id of each text, special and stop ids first
                first = [*self._special_ids, *self._stop_ids, *range(len(self._decoded))]
                by_text: dict[bytes, int] = {}
                for i in first:
                    if i < len(self._decoded) and self._decoded[i]:
                        by_text.setdefault(self._decoded[i], i)
                self._by_text = by_text
            found = self._by_text.get(token.encode("utf-8"))
            if found is None:
                raise TokenizerError(f"no token has the text {token!r}")
            return found
        token = _check_int(token, "token id")
        if not 0 <= token < self._vocab_size:
            raise TokenizerError(f"token id {token} out of range [0, {self._vocab_size})")
        return token

    @property
    def fingerprint(self) -> str:
        """Hex SHA-256 over vocab type, vocab size, add_prefix_space, decoded vocab, special
        and stop ids; equal for equal vocabularies in any process (a cache key)."""
        if self._fingerprint is None:
            h = hashlib.sha256()
            header = {
                "format": "xg2.TokenizerInfo/1",
                "vocab_type": int(self._vocab_type),
                "vocab_size": self._vocab_size,
                "add_prefix_space": self._add_prefix_space,
                "num_tokens": len(self._decoded),
                "stop_token_ids": self._stop_ids,
                "special_token_ids": self._special_ids,
            }
            h.update(json.dumps(header, sort_keys=True, separators=(",", ":")).encode())
            h.update(b"\0")
            h.update(b"".join(len(t).to_bytes(4, "little") + t for t in self._decoded))
            self._fingerprint = h.hexdigest()
        return self._fingerprint

    def _sorted_vocab(self) -> tuple[list[int], list[bytes], list[int]]:
        if self._sorted is None:
            excluded = set(self._special_ids)
            excluded.update(self._stop_ids)
            order = sorted(
                (i for i in range(len(self._decoded)) if i not in excluded),
                key=self._decoded.__getitem__,
            )
            tokens = [self._decoded[i] for i in order]
            lcp = [0] * len(tokens)
            for k in range(1, len(tokens)):
                a, b = tokens[k - 1], tokens[k]
                m = min(len(a), len(b))
                j = 0
                while j < m and a[j] == b[j]:
                    j += 1
                lcp[k] = j
            self._sorted = (order, tokens, lcp)
        return self._sorted

    @property
    def sorted_token_ids(self) -> list[int]:
        """Ordinary token ids (neither special nor stop) sorted by their bytes (as xgrammar's
        sorted decoded vocab), for prefix-sharing walks over the vocabulary."""
        return list(self._sorted_vocab()[0])

    @property
    def sorted_common_prefix_lengths(self) -> list[int]:
        """For ``sorted_token_ids[k]``, the length of the byte prefix it shares with entry k-1
        (0 for k = 0)."""
        return list(self._sorted_vocab()[2])

    def dump_metadata(self) -> str:
        """JSON metadata, as xgrammar's plus ``special_token_ids``; see from_vocab_and_metadata."""
        return json.dumps(
            {
                "vocab_type": int(self._vocab_type),
                "vocab_size": self._vocab_size,
                "add_prefix_space": self._add_prefix_space,
                "stop_token_ids": self._stop_ids,
                "special_token_ids": [i for i in self._special_ids if i < len(self._decoded)],
            },
            separators=(",", ":"),
        )

    @staticmethod
    def from_vocab_and_metadata(encoded_vocab: list[str] | list[bytes], metadata: str) -> TokenizerInfo:
        """Rebuild from an encoded vocabulary and the string of ``dump_metadata()``."""
        try:
            meta = json.loads(metadata)
        except (TypeError, ValueError) as e:
            raise TokenizerError(f"metadata is not valid JSON: {e}") from None
        if not isinstance(meta, dict):
            raise TokenizerError("metadata must be a JSON object")
        missing = [
            k for k in ("vocab_type", "vocab_size", "add_prefix_space", "stop_token_ids") if k not in meta
        ]
        if missing:
            raise TokenizerError(f"metadata lacks {', '.join(missing)}")
        return TokenizerInfo(
            encoded_vocab,
            _check_vocab_type(meta["vocab_type"]),
            vocab_size=meta["vocab_size"],
            stop_token_ids=meta["stop_token_ids"],
            add_prefix_space=meta["add_prefix_space"],
            special_token_ids=meta.get("special_token_ids"),
        )

    def serialize_json(self) -> str:
        """xgrammar's JSON form (see xg2.serialization): the decoded vocabulary and metadata."""
        from .serialization import tokenizer_info_to_json

        return tokenizer_info_to_json(self)

    @staticmethod
    def deserialize_json(json_string: str) -> TokenizerInfo:
        """The TokenizerInfo of serialize_json(); refusals are xg2.exception's Deserialize*Error
        and InvalidJSONError."""
        from .serialization import tokenizer_info_from_json

        return tokenizer_info_from_json(json_string)

    def __repr__(self) -> str:
        return (
            f"TokenizerInfo(vocab_type={self._vocab_type.name}, vocab_size={self._vocab_size}, "
            f"tokens={len(self._decoded)}, stop_token_ids={self._stop_ids}, "
            f"special={len(self._special_ids)}, add_prefix_space={self._add_prefix_space})"
        )

    def __getstate__(self) -> dict[str, Any]:
        return {
            "vocab_type": int(self._vocab_type),
            "vocab_size": self._vocab_size,
            "add_prefix_space": self._add_prefix_space,
            "decoded": self._decoded,
            "stop": self._stop_ids,
            "special": self._special_ids,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._vocab_type = VocabType(state["vocab_type"])
        self._vocab_size = state["vocab_size"]
        self._add_prefix_space = state["add_prefix_space"]
        self._decoded = state["decoded"]
        self._stop_ids = state["stop"]
        self._special_ids = state["special"]
        self._fingerprint = None
        self._sorted = None
        self._named = None
        self._by_text = None

    @staticmethod
    def _detect_vocab_type_from_vocab(vocab: Mapping[str, int]) -> VocabType | None:
        """The encoding the vocabulary (token string -> id) itself shows, or None when it shows
        none (xgrammar's private helper of the same name, which its tests call): byte pieces
        ``<0xNN>`` mean BYTE_FALLBACK, the byte-level alphabet BYTE_LEVEL."""
        return _vocab_type_from_vocab(vocab, True)

    # -- factories ------------------------------------------------------------------------------

    @staticmethod
    def from_huggingface(
        tokenizer: Any,
        *,
        vocab_size: int | None = None,
        stop_token_ids: list[int] | int | None = None,
    ) -> TokenizerInfo:
        """From a Hugging Face tokenizer: a ``tokenizers.Tokenizer``, the path of a
        ``tokenizer.json`` (or of a folder holding one), or a transformers tokenizer.

        The vocab type comes from the tokenizer's decoder (``ByteLevel`` -> BYTE_LEVEL,
        ``ByteFallback``/``Metaspace`` -> BYTE_FALLBACK, else RAW), overridden when the vocabulary
        itself clearly says otherwise (as xgrammar 0.2.8). Added tokens flagged special are
        special. Stop tokens, when not given: the transformers tokenizer's ``eos_token_id``, else
        the ``eos_token`` of a ``tokenizer_config.json`` next to the file, else added tokens
        named like a stop token (see ``DETECTION_STOP_TOKENS``, then ``FALLBACK_STOP_TOKENS``).
        ``vocab_size`` smaller than the tokenizer's drops the tokens above it.
        """
        stops = _check_id_list(stop_token_ids, "stop_token_ids")
        if stops is not None and not stops:
            raise TokenizerError("stop_token_ids cannot be empty")
        return _HFLoader(tokenizer).build(vocab_size, stops)

    @staticmethod
    def from_tiktoken(
        ranks_file_or_encoding: Any,
        *,
        special_tokens: Mapping[str, int] | None = None,
        vocab_size: int | None = None,
        stop_token_ids: list[int] | int | None = None,
    ) -> TokenizerInfo:
        """From a tiktoken ``.tiktoken`` ranks file (``base64-token rank`` per line) or a
        ``tiktoken.Encoding``. The vocabulary is RAW bytes; ``special_tokens`` (text -> id; for an
        Encoding, added to its own) are special, and their text is their decoded bytes. Ids not
        used by any token decode to b"" and are special. Stop tokens, when not given: special
        tokens named like a stop token."""
        stops = _check_id_list(stop_token_ids, "stop_token_ids")
        if stops is not None and not stops:
            raise TokenizerError("stop_token_ids cannot be empty")
        if special_tokens is not None and not isinstance(special_tokens, Mapping):
            raise TokenizerError(
                f"special_tokens must be a dict of str -> int, got {type(special_tokens).__name__}"
            )

        path = _fspath(ranks_file_or_encoding)
        specials: dict[str, int] = {}
        if path is not None:
            ranks = _read_tiktoken_ranks(path)
        elif hasattr(ranks_file_or_encoding, "decode_single_token_bytes"):
            ranks, specials = _tiktoken_encoding_tables(ranks_file_or_encoding)
        else:
            raise TokenizerError(
                "from_tiktoken expects a path to a .tiktoken ranks file or a tiktoken.Encoding, "
                f"got {type(ranks_file_or_encoding).__name__}"
            )
        for text, token_id in (special_tokens or {}).items():
            if not isinstance(text, str):
                raise TokenizerError(f"special token {text!r} must be a str")
            specials[text] = _check_int(token_id, f"the id of special token {text!r}")

        size = max(ranks.values(), default=-1) + 1
        if specials:
            size = max(size, max(specials.values()) + 1)
        if size == 0:
            raise TokenizerError("the tiktoken vocabulary is empty")
        _check_unused_ids(size, len(ranks) + len(specials), "the largest token id + 1")
        decoded = [b""] * size
        for token, rank in ranks.items():
            decoded[rank] = token
        special_ids: list[int] = []
        for text, token_id in specials.items():
            if token_id < 0:
                raise TokenizerError(f"special token {text!r} has a negative id {token_id}")
            if decoded[token_id]:
                raise TokenizerError(
                    f"special token {text!r} has id {token_id}, already used by token {decoded[token_id]!r}"
                )
            decoded[token_id] = text.encode("utf-8")
            special_ids.append(token_id)
        return TokenizerInfo._from_decoded(
            decoded,
            VocabType.RAW,
            vocab_size=vocab_size,
            stop_token_ids=stops,
            special_token_ids=special_ids,
            add_prefix_space=False,
            detect_stop_among=special_ids,
        )

    @staticmethod
    def from_sentencepiece(
        model_path_or_processor: Any,
        *,
        vocab_size: int | None = None,
        stop_token_ids: list[int] | int | None = None,
    ) -> TokenizerInfo:
        """From a SentencePiece model (a ``.model`` path, its serialized bytes, or a
        ``sentencepiece.SentencePieceProcessor``). BYTE_FALLBACK: ``▁`` is a space and byte pieces
        ``<0xNN>`` are one raw byte. Control, unknown and unused pieces are special. The default
        stop token is the model's EOS id."""
        stops = _check_id_list(stop_token_ids, "stop_token_ids")
        if stops is not None and not stops:
            raise TokenizerError("stop_token_ids cannot be empty")
        sp = _load_sentencepiece(model_path_or_processor)
        n = sp.get_piece_size()
        if n <= 0:
            raise TokenizerError("the SentencePiece model has no pieces")
        decoded: list[bytes] = []
        special_ids: list[int] = []
        for i in range(n):
            piece = sp.id_to_piece(i)
            if sp.is_byte(i):
                m = _BYTE_PIECE.fullmatch(piece)
                if m is None:
                    raise TokenizerError(f"byte piece {i} is {piece!r}, not of the form <0xNN>")
                decoded.append(bytes((int(m.group(1), 16),)))
                continue
            decoded.append(piece.replace(_SPACE_MARK, " ").encode("utf-8"))
            if sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i):
                special_ids.append(i)
        detect_among: list[int] | None = special_ids
        if stops is None:
            eos = sp.eos_id()
            if 0 <= eos < n:
                stops = [eos]
                detect_among = None
        try:
            first = sp.encode("a", out_type=str)
            add_prefix_space = bool(first) and first[0].startswith(_SPACE_MARK)
        except (RuntimeError, TypeError, ValueError):  # pragma: no cover - exotic models
            add_prefix_space = True
        return TokenizerInfo._from_decoded(
            decoded,
            VocabType.BYTE_FALLBACK,
            vocab_size=vocab_size,
            stop_token_ids=stops,
            special_token_ids=special_ids,
            add_prefix_space=add_prefix_space,
            detect_stop_among=detect_among,
            drop_out_of_range=detect_among is None,
        )


# --------------------------------------------------------------------------------------------
# tiktoken


if sys.version_info >= (3, 11):

    def _a2b_base64_strict(data: bytes) -> bytes:
        return binascii.a2b_base64(data, strict_mode=True)

else:  # pragma: no cover - Python 3.10

    def _a2b_base64_strict(data: bytes) -> bytes:
        return base64.b64decode(data, validate=True)


def _read_tiktoken_ranks(path: str) -> dict[bytes, int]:
    data = _read_bytes(path, "tiktoken ranks file")
    ranks: dict[bytes, int] = {}
    a2b = _a2b_base64_strict
    for lineno, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        try:
            if len(parts) != 2:
                raise ValueError("expected two fields")
            token, rank = a2b(parts[0]), int(parts[1])
            if rank < 0:
                raise ValueError("negative rank")
        except (ValueError, binascii.Error) as e:
            raise TokenizerError(f"{path!r} line {lineno} is not 'base64-token rank': {e}") from None
        if token in ranks:
            raise TokenizerError(f"{path!r} line {lineno}: token {token!r} listed twice")
        ranks[token] = rank
    if len(set(ranks.values())) != len(ranks):
        raise TokenizerError(f"{path!r}: two tokens share a rank")
    return ranks


def _tiktoken_encoding_tables(enc: Any) -> tuple[dict[bytes, int], dict[str, int]]:
    ranks = getattr(enc, "_mergeable_ranks", None)
    specials = getattr(enc, "_special_tokens", None)
    if isinstance(ranks, dict) and isinstance(specials, dict):
        return dict(ranks), dict(specials)
    # Public API only: walk the ids.
    special_map = {s: enc.encode_single_token(s) for s in getattr(enc, "special_tokens_set", ())}
    special_id_set = set(special_map.values())
    ranks = {}
    for i in range(enc.n_vocab):
        if i in special_id_set:
            continue
        try:
            ranks[enc.decode_single_token_bytes(i)] = i
        except KeyError:
            continue  # hole
    return ranks, special_map


# --------------------------------------------------------------------------------------------
# SentencePiece


def _load_sentencepiece(source: Any) -> Any:
    if hasattr(source, "id_to_piece") and hasattr(source, "get_piece_size"):
        return source
    path = _fspath(source)
    if path is None and not isinstance(source, (bytes, bytearray)):
        raise TokenizerError(
            "from_sentencepiece expects a .model path, its bytes or a SentencePieceProcessor, "
            f"got {type(source).__name__}"
        )
    try:
        import sentencepiece
    except ImportError as e:  # pragma: no cover - dependency missing
        raise TokenizerError("reading a SentencePiece model needs the sentencepiece package") from e
    proto = _read_bytes(path, "SentencePiece model") if path is not None else bytes(source)
    sp = sentencepiece.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(proto)
    except (RuntimeError, OSError, ValueError, TypeError) as e:
        where = repr(path) if path is not None else "the given bytes"
        raise TokenizerError(f"{where} is not a SentencePiece model: {e}") from None
    return sp


# --------------------------------------------------------------------------------------------
# Hugging Face


def _decoder_parts(node: Any, key: str) -> list[dict[str, Any]]:
    """A component of tokenizer.json (decoder, normalizer, pre_tokenizer) as a flat list."""
    if not isinstance(node, dict):
        return []
    if node.get("type") == "Sequence":
        out: list[dict[str, Any]] = []
        for child in node.get(key) or ():
            out.extend(_decoder_parts(child, key))
        return out
    return [node]


def _detect_vocab_type(spec: dict[str, Any]) -> VocabType:
    """xgrammar's rule (the first ByteLevel/ByteFallback of the decoder), then xg2 extensions:
    a Metaspace decoder or a ▁ -> space Replace is BYTE_FALLBACK, a ByteLevel pre-tokenizer is
    BYTE_LEVEL."""
    decoders = _decoder_parts(spec.get("decoder"), "decoders")
    for d in decoders:
        if d.get("type") == "ByteLevel":
            return VocabType.BYTE_LEVEL
        if d.get("type") == "ByteFallback":
            return VocabType.BYTE_FALLBACK
    for d in decoders:
        if d.get("type") == "Metaspace":
            return VocabType.BYTE_FALLBACK
        if d.get("type") == "Replace" and d.get("content") == " ":
            pattern = d.get("pattern")
            if isinstance(pattern, dict) and pattern.get("String") == _SPACE_MARK:
                return VocabType.BYTE_FALLBACK
    for p in _decoder_parts(spec.get("pre_tokenizer"), "pretokenizers"):
        if p.get("type") == "ByteLevel":
            return VocabType.BYTE_LEVEL
    return VocabType.RAW


def _detect_add_prefix_space(spec: dict[str, Any]) -> bool:
    """xgrammar's rule: a ``Prepend("▁")`` normalizer, or a Metaspace pre-tokenizer that prepends
    (``prepend_scheme`` always/first; older files say ``add_prefix_space: true``)."""
    for n in _decoder_parts(spec.get("normalizer"), "normalizers"):
        if n.get("type") == "Prepend" and n.get("prepend") == _SPACE_MARK:
            return True
    for p in _decoder_parts(spec.get("pre_tokenizer"), "pretokenizers"):
        if p.get("type") == "Metaspace":
            scheme = p.get("prepend_scheme")
            if scheme in ("always", "first"):
                return True
            if scheme is None and p.get("add_prefix_space") is True:
                return True
    return False


def _vocab_type_from_vocab(vocab: Mapping[str, int], check_level: bool) -> VocabType | None:
    """What the vocabulary itself says (xgrammar 0.2.8): >= 128 ``<0xNN>`` pieces mean
    BYTE_FALLBACK; >= 128 single-character tokens of the byte-level alphabet with >= 99% of all
    tokens spelled in it mean BYTE_LEVEL; else None."""
    if sum(f"<0x{b:02X}>" in vocab for b in range(256)) >= 128:
        return VocabType.BYTE_FALLBACK
    if not check_level or sum(ch in vocab for ch in _BYTE_LEVEL_CHARSET) < 128:
        return None
    spelled = sum(1 for token in vocab if not token.translate(_BYTE_LEVEL_DELETE))
    return VocabType.BYTE_LEVEL if spelled >= 0.99 * len(vocab) else None


class _HFLoader:
    """Collects vocab (token -> id), added tokens, the tokenizer spec and the EOS from any of the
    accepted Hugging Face inputs."""

    def __init__(self, source: Any) -> None:
        self.vocab: dict[str, int] = {}
        self.special_ids: set[int] = set()
        self.added_ids: set[int] = set()
        self.spec: dict[str, Any] = {}
        self.eos_id: int | str | None = None  # an id, or a token text from tokenizer_config.json
        self.backend: Any = None  # a tokenizers.Tokenizer, when at hand
        self.delegate: TokenizerInfo | None = None
        self._source = source
        self._load(source)

    # -- inputs

    def _load(self, source: Any) -> None:
        path = _fspath(source)
        if path is not None:
            if isinstance(source, str) and source.lstrip().startswith("{"):
                self._load_spec(self._parse_json(source, "the tokenizer JSON string"))
                return
            if os.path.isdir(path):
                path = os.path.join(path, "tokenizer.json")
            data = _read_bytes(path, "tokenizer file")
            self._load_spec(self._parse_json(data, repr(path)))
            self.eos_id = self._eos_from_config(os.path.dirname(path))
            return
        if hasattr(source, "backend_tokenizer"):  # transformers PreTrainedTokenizerFast
            self._load_tokenizer(source.backend_tokenizer)
            self._load_transformers_extras(source)
            return
        if (
            hasattr(source, "get_vocab")
            and hasattr(source, "to_str")
            and hasattr(source, "get_added_tokens_decoder")
        ):  # tokenizers.Tokenizer
            self._load_tokenizer(source)
            return
        if hasattr(source, "get_vocab"):  # transformers slow tokenizer
            self._load_slow(source)
            return
        raise TokenizerError(
            "from_huggingface expects a tokenizers.Tokenizer, a path to tokenizer.json or a "
            f"transformers tokenizer, got {type(source).__name__}"
        )

    @staticmethod
    def _parse_json(data: str | bytes, where: str) -> dict[str, Any]:
        try:
            spec = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise TokenizerError(f"{where} is not valid JSON: {e}") from None
        if not isinstance(spec, dict):
            raise TokenizerError(f"{where} is not a tokenizer.json object")
        return spec

    def _load_spec(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        model = spec.get("model")
        if not isinstance(model, dict) or "vocab" not in model:
            raise TokenizerError("tokenizer.json has no model.vocab")
        raw = model["vocab"]
        vocab: dict[str, int] = {}
        if isinstance(raw, dict):  # BPE, WordPiece, WordLevel
            for token, token_id in raw.items():
                if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
                    raise TokenizerError(f"tokenizer.json: token {token!r} has id {token_id!r}")
                vocab[token] = token_id
        elif isinstance(raw, list):  # Unigram: [[piece, score], ...]
            for token_id, entry in enumerate(raw):
                if not isinstance(entry, (list, tuple)) or not entry or not isinstance(entry[0], str):
                    raise TokenizerError(f"tokenizer.json: model.vocab[{token_id}] is {entry!r}")
                vocab[entry[0]] = token_id
        else:
            raise TokenizerError("tokenizer.json: model.vocab is neither an object nor a list")
        for entry in spec.get("added_tokens") or ():
            if (
                not isinstance(entry, dict)
                or not isinstance(entry.get("content"), str)
                or isinstance(entry.get("id"), bool)
                or not isinstance(entry.get("id"), int)
                or entry["id"] < 0
            ):
                raise TokenizerError(f"tokenizer.json: bad added token {entry!r}")
            vocab[entry["content"]] = entry["id"]
            self.added_ids.add(entry["id"])
            if entry.get("special"):
                self.special_ids.add(entry["id"])
        self.vocab = vocab

    def _load_tokenizer(self, tok: Any) -> None:
        self.backend = tok
        try:
            self.vocab = dict(tok.get_vocab(with_added_tokens=True))
            added = tok.get_added_tokens_decoder()
        except Exception as e:  # noqa: BLE001 - the tokenizers package raises plain Exception
            raise TokenizerError(f"cannot read the tokenizer's vocabulary: {e}") from None
        for token_id, added_token in added.items():
            self.added_ids.add(int(token_id))
            if getattr(added_token, "special", False):
                self.special_ids.add(int(token_id))
        spec: dict[str, Any] = {}
        try:
            for key in ("decoder", "normalizer", "pre_tokenizer"):
                component = getattr(tok, key)
                spec[key] = None if component is None else json.loads(component.__getstate__())
        except Exception:  # noqa: BLE001 - no JSON state on this component: use the whole tokenizer
            spec = json.loads(tok.to_str())
        self.spec = spec

    def _load_transformers_extras(self, tok: Any) -> None:
        vocab = tok.get_vocab() if callable(getattr(tok, "get_vocab", None)) else None
        if isinstance(vocab, dict):
            self.vocab.update(vocab)
        for token_id in getattr(tok, "all_special_ids", None) or ():
            if isinstance(token_id, int) and token_id >= 0:
                self.special_ids.add(token_id)
        for token_id, added_token in (getattr(tok, "added_tokens_decoder", None) or {}).items():
            self.added_ids.add(int(token_id))
            if getattr(added_token, "special", False):
                self.special_ids.add(int(token_id))
        eos = getattr(tok, "eos_token_id", None)
        if isinstance(eos, int) and eos >= 0:
            self.eos_id = eos

    def _load_slow(self, tok: Any) -> None:
        sp = getattr(tok, "sp_model", None) or getattr(getattr(tok, "tokenizer", None), "sp_model", None)
        enc = getattr(tok, "tokenizer", None)
        if sp is not None and hasattr(sp, "id_to_piece"):
            self.delegate = TokenizerInfo.from_sentencepiece(sp)
        elif enc is not None and hasattr(enc, "decode_single_token_bytes"):
            self.delegate = TokenizerInfo.from_tiktoken(enc)
        else:
            raise TokenizerError(f"unsupported transformers tokenizer {type(tok).__name__}")
        eos = getattr(tok, "eos_token_id", None)
        if isinstance(eos, int) and eos >= 0:
            self.eos_id = eos

    @staticmethod
    def _eos_from_config(folder: str) -> str | None:
        """The eos_token of a tokenizer_config.json next to tokenizer.json, if any (its id is
        resolved against the vocabulary later)."""
        path = os.path.join(folder or ".", "tokenizer_config.json")
        if not os.path.isfile(path):
            return None
        try:
            with open(path, "rb") as f:
                config = json.load(f)
        except (OSError, ValueError):
            return None
        eos = config.get("eos_token") if isinstance(config, dict) else None
        if isinstance(eos, dict):
            eos = eos.get("content")
        return eos if isinstance(eos, str) else None

    # -- building

    def build(self, vocab_size: int | None, stops: list[int] | None) -> TokenizerInfo:
        if self.delegate is not None:
            d = self.delegate
            if stops is None and self.eos_id is not None:
                stops = [self.eos_id]
            return TokenizerInfo._from_decoded(
                list(d._decoded),
                d._vocab_type,
                vocab_size=vocab_size,
                stop_token_ids=stops if stops is not None else d._stop_ids,
                # the delegate's own stop tokens (EOS control piece, special tiktoken token) are
                # special when the tokenizer names another stop token
                special_token_ids=[i for i in (*d._special_ids, *d._stop_ids) if i < len(d._decoded)],
                add_prefix_space=d._add_prefix_space,
                detect_stop_among=None,
            )
        vocab = self.vocab
        if not vocab:
            raise TokenizerError("the tokenizer's vocabulary is empty")
        vocab_type = _detect_vocab_type(self.spec)
        add_prefix_space = _detect_add_prefix_space(self.spec)
        evidence = _vocab_type_from_vocab(
            vocab,
            check_level=vocab_type != VocabType.BYTE_LEVEL,
        )
        if evidence is not None and evidence != vocab_type:
            vocab_type = evidence
            add_prefix_space = self._prefix_space_by_encoding(vocab_type, add_prefix_space)

        n = max(len(vocab), max(vocab.values()) + 1)
        _check_unused_ids(n, len(vocab), "the largest token id + 1")
        encoded: list[str] = [""] * n
        for token, token_id in vocab.items():
            encoded[token_id] = token
        decoded = _decode_vocab(encoded, vocab_type)

        eos = self.eos_id
        if isinstance(eos, str):  # from tokenizer_config.json
            eos = vocab.get(eos)
        detect_among: list[int] | None = None
        drop = False
        if stops is None and eos is not None:
            stops, drop = [eos], True
        elif stops is None:
            detect_among = sorted(self.added_ids) if self.added_ids else list(range(n))
        return TokenizerInfo._from_decoded(
            decoded,
            vocab_type,
            vocab_size=vocab_size,
            stop_token_ids=stops,
            special_token_ids=sorted(self.special_ids),
            add_prefix_space=add_prefix_space,
            detect_stop_among=detect_among,
            drop_out_of_range=drop,
        )

    def _prefix_space_by_encoding(self, vocab_type: VocabType, default: bool) -> bool:
        """As xgrammar when the vocabulary overrides the decoder: encode "a" and look for a
        leading space marker."""
        tok = self.backend
        if tok is None:
            try:
                import tokenizers

                tok = tokenizers.Tokenizer.from_str(json.dumps(self.spec))
            except Exception:  # noqa: BLE001 - tokenizers raises plain Exception
                return default
        try:
            tokens = tok.encode("a", add_special_tokens=False).tokens
        except Exception:  # noqa: BLE001 - tokenizers raises plain Exception
            return default
        if not tokens:
            return False
        return tokens[0].startswith(_SPACE_MARK if vocab_type == VocabType.BYTE_FALLBACK else "Ġ")
