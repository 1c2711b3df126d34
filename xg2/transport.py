"""Compiled grammars, modules and mask entries as compact bytes, for another process or for disk.

A blob is a fixed header then a msgpack payload:

    magic "XG2T" | format version (u16) | kind (u8) | engine version (u8 length, UTF-8)
    | vocabulary fingerprint (32 bytes) | checksum (16 bytes) | payload

The kind's high bit says the payload is zlib-compressed (level 1; payloads of 4 kB and more): a
grammar with the entries of its first mask is about 100 kB, which is where Ray stops passing
values inline and goes through its object store (about 0.7 ms more per read), and bitset entries
compress about five to one, so the cache shards hold five times as many items. Decompression is
bounded by the size the format allows.

The checksum is a BLAKE2b digest of everything before it and of the payload, so a blob cut short,
flipped in transit or pasted onto another header is refused before any of it is used. Loading
checks, in order: the magic and the header's length, the checksum, the format version, the engine
version, the kind, the vocabulary; each refusal is a typed error (DeserializeError and its
subclasses) saying what was expected and what was found. Mask entries inside a blob are checked
once more by the core as they are read (token ids in range and ordinary), so even a blob with a
valid checksum cannot let a special token through.

What is carried: a grammar's flat tables, rule names, root, content keys, the mask entries that
belong to it alone (those the entry pool does not hold), the pooled entries its first mask needs
(so that a process loading it builds its first mask without asking anyone else) and the keys of the
other pooled entries built so far (which a cache tier can then fetch, knowing they exist); a module's tables, keys and automata (a
frame links it under contexts of its own, whose keys need the automata); a pool entry's bytes.
The grammar's source (kind and text), when known, rides along so that `CompiledGrammar.grammar`
can be rebuilt on demand.
"""

from __future__ import annotations

import functools
import hashlib
import struct
import zlib
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from . import exception
from .errors import XG2Error

FORMAT_VERSION = 3     # 3: special tokens spelled behind an F8 byte in automata (ir.text_bytes)
MAGIC = b"XG2T"
KIND_GRAMMAR, KIND_MODULE, KIND_ENTRY, KIND_OWN_ENTRIES = 1, 2, 3, 4
_KIND_NAMES = {KIND_GRAMMAR: "compiled grammar", KIND_MODULE: "module", KIND_ENTRY: "mask entry",
               KIND_OWN_ENTRIES: "grammar's own entries"}
_HEAD = struct.Struct("<4sHBB")
_VOCAB_BYTES = 32
_SUM_BYTES = 16
_ZLIB = 0x80                    # the kind byte's flag: the payload is zlib-compressed
_COMPRESS_FROM = 4096
MAX_PAYLOAD_BYTES = 1 << 28     # what a compressed payload may grow to (a corrupted or hostile one stops here)


class DeserializeError(XG2Error, ValueError, exception.DeserializeFormatError):
    """Bytes that are not a blob this engine can load: malformed, truncated or corrupted (the
    checksum does not match), or of another kind than asked for (xgrammar's
    DeserializeFormatError)."""


class DeserializeVersionError(DeserializeError, exception.DeserializeVersionError):
    """A blob written by another format or engine version: its tables or keys may mean something
    else here, so it is refused rather than trusted."""


class VocabularyMismatchError(DeserializeError):
    """A blob built for another vocabulary: its token ids would name other tokens."""


def engine_version() -> str:
    from . import __version__

    return __version__


@functools.lru_cache(maxsize=1)
def build_id() -> str:
    """This build, as 16 hex digits: the package version, the transport format and the compiled
    core. Two builds (a rolling deploy) may lower or fill differently, so the cache tier keeps
    their items apart: shard actors are named by it and every shard key carries it.

    The core is read from the sources it was compiled from (the .pyx and .pxi files installed
    beside it, which the package ships), so that nodes that built the same sources agree; where
    they are absent, from the compiled modules themselves."""
    from . import _ext

    folder = Path(_ext.__file__).parent
    parts = sorted(folder.glob("*.pyx")) + sorted(folder.glob("*.pxi"))
    if not parts:
        parts = sorted(p for p in folder.iterdir() if p.suffix in (".so", ".pyd"))
    h = hashlib.blake2b(f"xg2/{engine_version()}/{FORMAT_VERSION}".encode(), digest_size=8)
    for path in parts:
        h.update(path.name.encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()


def _vocab_digest(fingerprint: str) -> bytes:
    return bytes.fromhex(fingerprint)[:_VOCAB_BYTES].ljust(_VOCAB_BYTES, b"\0")


def _checksum(head: bytes, payload: bytes) -> bytes:
    h = hashlib.blake2b(head, digest_size=_SUM_BYTES)
    h.update(payload)
    return h.digest()


def pack(kind: int, fingerprint: str, payload: bytes, compress: bool = True) -> bytes:
    """`compress` False: stored as is (a blob for a pipe to the parent process, which compression
    would only cost both ends time)."""
    engine = engine_version().encode()
    if compress and len(payload) >= _COMPRESS_FROM:
        kind |= _ZLIB
        payload = zlib.compress(payload, 1)
    head = _HEAD.pack(MAGIC, FORMAT_VERSION, kind, len(engine)) + engine + _vocab_digest(fingerprint)
    return head + _checksum(head, payload) + payload


def _inflate(payload: bytes) -> bytes:
    d = zlib.decompressobj()
    try:
        out = d.decompress(payload, MAX_PAYLOAD_BYTES)
    except zlib.error as e:
        raise DeserializeError(f"malformed compressed payload: {e}") from None
    if d.unused_data:
        raise DeserializeError("compressed payload followed by other bytes")
    if d.unconsumed_tail or not d.eof:
        raise DeserializeError("compressed payload is cut short or larger than the format allows")
    return out


def unpack(data: bytes, kind: int, fingerprint: str) -> bytes:
    """The payload of a blob of `kind` for the vocabulary `fingerprint`, or a typed refusal."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DeserializeError(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) < _HEAD.size or data[:4] != MAGIC:
        raise DeserializeError("not an xg2 blob (bad magic or too short)")
    _magic, version, found_kind, n_engine = _HEAD.unpack_from(data)
    head_len = _HEAD.size + n_engine + _VOCAB_BYTES
    if len(data) < head_len + _SUM_BYTES:
        raise DeserializeError("truncated xg2 blob: the header is cut short")
    head, payload = data[:head_len], data[head_len + _SUM_BYTES:]
    if _checksum(head, payload) != data[head_len: head_len + _SUM_BYTES]:
        raise DeserializeError("xg2 blob checksum mismatch: the bytes are truncated or corrupted")
    if version != FORMAT_VERSION:
        raise DeserializeVersionError(f"blob format version {version}, this engine reads {FORMAT_VERSION}")
    engine = data[_HEAD.size: _HEAD.size + n_engine].decode("utf-8", "replace")
    if engine != engine_version():
        raise DeserializeVersionError(f"blob written by xg2 {engine}, this is xg2 {engine_version()}")
    compressed = found_kind & _ZLIB
    found_kind &= ~_ZLIB
    if found_kind != kind:
        raise DeserializeError(f"expected a {_KIND_NAMES.get(kind, kind)}, got a "
                               f"{_KIND_NAMES.get(found_kind, f'blob of kind {found_kind}')}")
    if data[_HEAD.size + n_engine: head_len] != _vocab_digest(fingerprint):
        raise VocabularyMismatchError("the blob was built for another vocabulary (fingerprints differ)")
    return _inflate(payload) if compressed else payload


# -- payloads --------------------------------------------------------------------------------------

class _Array(msgspec.Struct, array_like=True):
    dtype: str
    shape: tuple[int, ...]
    data: bytes


class _Fsm(msgspec.Struct, array_like=True):
    byte_edges: list[list[tuple[int, int, int]]]
    rule_edges: list[list[tuple[int, int]]]
    finals: list[int]
    deterministic: bool


class _Lowered(msgspec.Struct, array_like=True):
    rule_names: list[str]
    root: int
    arrays: dict[str, _Array]
    rule_keys: list[bytes]
    ctx_keys: list[bytes]
    canon: list[_Array | None]
    follows: dict[int, int]
    fsms: list[_Fsm] | None = None


class GrammarPayload(msgspec.Struct, array_like=True):
    lowered: _Lowered
    entries: dict[int, bytes]                       # node -> entry bytes (the grammar's own entries)
    source: tuple[str, str] | None = None           # (kind, text) to rebuild the Grammar on demand
    warnings: list[tuple[str, str]] = []
    first: dict[bytes, bytes] = {}                  # pool key -> entry: the pooled entries of the first mask
    built: list[bytes] = []                         # pool keys of the other pooled entries built so far


class ModulePayload(msgspec.Struct, array_like=True):
    lowered: _Lowered
    warnings: list[tuple[str, str]] = []


_ENC = msgspec.msgpack.Encoder()
_GRAMMAR_DEC = msgspec.msgpack.Decoder(GrammarPayload)
_MODULE_DEC = msgspec.msgpack.Decoder(ModulePayload)
#: The tables of a lowered grammar and the dtypes the core reads them as.
_TABLE_DTYPES = {
    "node_rule": np.int32, "node_final": np.uint8, "node_pure": np.uint8, "be_start": np.int32,
    "be_lo": np.uint8, "be_hi": np.uint8, "be_target": np.int32, "re_start": np.int32, "re_rule": np.int32,
    "re_target": np.int32, "rule_start": np.int32, "rule_nullable": np.uint8, "rule_follow": np.uint8,
    "ctx_start": np.int32, "ctx_item": np.uint64, "ctx_resume": np.int32,
}
#: Tables only some grammars have (token edges), read in these dtypes when present.
_OPTIONAL_DTYPES = {"token_set_start": np.int32, "token_set_ids": np.int32, "token_set_exclude": np.uint8}
#: The capture tables (GrammarMatcher.get_captures), read in these dtypes when present.
_CAPTURE_DTYPES = {"rule_capture": np.int32, "capture_names": np.uint8, "rule_max_tokens": np.int32,
                   "rule_capture_trim": np.int32, "rule_hide": np.int32, "rule_stop_capture": np.int32}
#: dtypes a table may have (a blob naming another is refused, not handed to numpy).
_DTYPES = frozenset({"<i4", "<u4", "<i8", "<u8", "|u1", "|i1", "<i2", "<u2", "<f8"})


def _array_out(a: np.ndarray) -> _Array:
    a = np.ascontiguousarray(a)
    return _Array(a.dtype.newbyteorder("<").str if a.dtype.byteorder != "|" else a.dtype.str, a.shape,
                  a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes())


#: Each allowed dtype's numpy dtype and its native-order twin (looked up per table: a module has a
#: few dozen small tables, and numpy's own calls dominated reading them).
_DTYPE_OF = {d: (np.dtype(d), np.dtype(d).newbyteorder("=")) for d in _DTYPES}


def _array_in(w: _Array) -> np.ndarray:
    dts = _DTYPE_OF.get(w.dtype)
    if dts is None:
        raise DeserializeError(f"table of unexpected dtype {w.dtype!r}")
    dt, native = dts
    n = 1
    for d in w.shape:
        if d < 0:
            raise DeserializeError("table length does not match its shape")
        n *= d
    if n * dt.itemsize != len(w.data):
        raise DeserializeError("table length does not match its shape")
    a = np.frombuffer(w.data, dt)
    if len(w.shape) != 1:
        a = a.reshape(w.shape)
    return a.astype(native)     # a copy: writable, and not a view of the message


def _lowered_out(lowered: Any, with_fsms: bool, keys: Any = None) -> _Lowered:
    keys = keys if keys is not None else lowered.keys
    fsms = None
    if with_fsms and lowered.fsms is not None:
        fsms = [_Fsm([list(e) for e in f.byte_edges], [list(e) for e in f.rule_edges], sorted(f.finals),
                     bool(f.deterministic)) for f in lowered.fsms]
    return _Lowered(list(lowered.rule_names), int(lowered.root),
                    {k: _array_out(v) for k, v in lowered.arrays.items()},
                    list(keys.rule), list(keys.ctx),
                    [None if c is None else _array_out(np.asarray(c, np.int32)) for c in keys.canon],
                    {int(k): int(v) for k, v in (lowered.follows or {}).items()}, fsms)


def _lowered_in(w: _Lowered) -> Any:
    from .grammar.fsm import RuleFSM
    from .grammar.hashing import GrammarKeys
    from .lowering import LoweredGrammar

    missing = set(_TABLE_DTYPES) - set(w.arrays)
    if missing:
        raise DeserializeError(f"grammar tables lack {sorted(missing)}")
    # In the dtypes the core reads them as (it would convert them the same way), then checked.
    arrays = {}
    for k, v in w.arrays.items():
        a = _array_in(v)
        want = _TABLE_DTYPES.get(k, _OPTIONAL_DTYPES.get(k, _CAPTURE_DTYPES.get(k)))
        if want is not None and a.dtype != want:
            cast = a.astype(want)
            if not np.array_equal(cast.astype(a.dtype), a) or (a.size and (a < 0).any() != (cast < 0).any()):
                raise DeserializeError(f"table {k!r} holds values outside its type")
            a = cast
        arrays[k] = a
    n_rules = len(w.rule_names)
    if not (len(arrays["rule_start"]) == len(w.rule_keys) == len(w.ctx_keys) == len(w.canon) == n_rules):
        raise DeserializeError("grammar tables, rule names and keys disagree on the number of rules")
    if not {len(k) for k in w.rule_keys} <= {16} or not {len(k) for k in w.ctx_keys} <= {16}:
        raise DeserializeError("content keys are 16 bytes")
    if not 0 <= w.root < n_rules:
        raise DeserializeError("root rule out of range")
    _check_tables(arrays, n_rules)
    canon = [None if c is None else _array_in(c) for c in w.canon]
    fsms = None
    if w.fsms is not None:
        fsms = [RuleFSM(tuple(tuple(map(tuple, e)) for e in f.byte_edges),
                        tuple(tuple(map(tuple, e)) for e in f.rule_edges), set(f.finals), f.deterministic)
                for f in w.fsms]
    return LoweredGrammar(list(w.rule_names), fsms, w.root, arrays, GrammarKeys(list(w.rule_keys),
                          list(w.ctx_keys), canon), follows=dict(w.follows))


def _check_tables(a: dict[str, np.ndarray], n_rules: int) -> None:
    """Every index the core follows stays inside its table: the core trusts its tables, so a blob's
    must be checked before they reach it."""
    from .lowering import MAX_RESUMES

    n_nodes = len(a["node_rule"])
    n_be = int(a["be_start"][-1]) if len(a["be_start"]) else -1
    n_re = int(a["re_start"][-1]) if len(a["re_start"]) else -1

    def within(name: str, lo: int, hi: int, length: int | None = None) -> None:
        x = a.get(name)
        if x is None:
            raise DeserializeError(f"grammar tables lack {name!r}")
        if length is not None and len(x) < length:
            raise DeserializeError(f"table {name!r} is too short")
        if x.size and (int(x.min()) < lo or int(x.max()) > hi):
            raise DeserializeError(f"table {name!r} holds an index out of range")

    for name in ("be_start", "re_start"):
        x = a[name]
        if len(x) < n_nodes + 1 or np.any(np.diff(x.astype(np.int64)) < 0) or (x.size and x[0] < 0):
            raise DeserializeError(f"table {name!r} is not a valid offset table")
    sets = [a.get(k) for k in _OPTIONAL_DTYPES]
    if any(x is not None for x in sets):
        start, ids, exclude = sets
        if start is None or ids is None or exclude is None or start.ndim != 1 or len(start) < 1 \
                or int(start[0]) != 0 or int(start[-1]) != len(ids) or bool(np.any(np.diff(start.astype(np.int64)) < 0)) \
                or len(exclude) != len(start) - 1 or (ids.size and int(ids.min()) < 0) \
                or (exclude.size and int(exclude.max()) > 1):
            raise DeserializeError("the token set tables are malformed")
    captures, names = a.get("rule_capture"), a.get("capture_names")
    if (captures is None) != (names is None):
        raise DeserializeError("the capture tables come together")
    if captures is not None:
        try:
            n_names = len(bytes(names).decode("utf-8").split("\0")) if len(names) else 0
        except UnicodeDecodeError:
            raise DeserializeError("capture names are not UTF-8") from None
        for table in (captures, a.get("rule_stop_capture")):
            if table is not None and (table.shape != (n_rules,) or (table.size and (
                    int(table.min()) < -1 or int(table.max()) >= n_names))):
                raise DeserializeError("a capture table names a capture that is not there")
    for name in ("rule_capture_trim", "rule_hide"):
        x = a.get(name)
        if x is not None and (x.shape != (n_rules,) or (x.size and int(x.min()) < 0)):
            raise DeserializeError(f"table {name!r} must hold one byte count per rule")
    budgets = a.get("rule_max_tokens")
    if budgets is not None and (budgets.shape != (n_rules,) or (budgets.size and int(budgets.min()) < -1)):
        raise DeserializeError("table 'rule_max_tokens' must hold one budget (or -1) per rule")
    temps = a.get("rule_temperature")
    if temps is not None and (temps.dtype != np.float64 or temps.shape != (n_rules,) or
                              bool(np.any(~np.isnan(temps) & ~((temps >= 0) & np.isfinite(temps))))):
        raise DeserializeError("table 'rule_temperature' must hold one finite non-negative number (or NaN) per rule")
    within("node_rule", 0, n_rules - 1)
    within("node_final", 0, 1, n_nodes)
    within("node_pure", 0, 3, n_nodes)
    within("be_lo", 0, 255, n_be)
    within("be_hi", 0, 255, n_be)
    within("be_target", 0, n_nodes - 1, n_be)
    within("re_rule", 0, n_rules - 1, n_re)
    within("re_target", 0, n_nodes - 1, n_re)
    within("rule_start", 0, n_nodes - 1)
    within("rule_nullable", 0, 1, n_rules)
    within("rule_follow", 0, 1, n_rules)
    within("ctx_resume", -1, n_nodes - 1, n_rules * MAX_RESUMES)     # the core reads all slots
    cs = a["ctx_start"]
    if len(cs) < n_rules + 1 or np.any(np.diff(cs.astype(np.int64)) < 0) or (cs.size and cs[0] < 0):
        raise DeserializeError("table 'ctx_start' is not a valid offset table")
    items = a.get("ctx_item")
    if items is None or len(items) < int(cs[-1]):
        raise DeserializeError("table 'ctx_item' is too short")
    if items.size and (int((items >> np.uint64(32)).max()) >= n_rules
                       or int((items & np.uint64(0xFFFFFFFF)).max()) >= n_nodes):
        raise DeserializeError("table 'ctx_item' holds an index out of range")


def dump_grammar(compiled: Any, *, rest_apart: bool = False, all_pooled: bool = False,
                 compress: bool = True) -> bytes | tuple[bytes, bytes]:
    """A CompiledGrammar as bytes: tables, keys, its own entries built so far, and its source.
    `rest_apart`: (the grammar with the own entries of its first mask only, the other own entries
    as a blob of their own), so that a cache tier can ship the first part on the compile path and
    the second in the background. `all_pooled`: every pooled entry of its nodes the pool holds
    travels too, not only those of the first mask (a compile worker's whole precompute)."""
    core = compiled._core
    lowered = compiled._lowered
    first: dict[bytes, bytes] = {}
    built: list[bytes] = []
    pool = core._pool
    if pool is not None:
        initial = set(core.initial_nodes())
        for node, key in core.pool_keys().items():
            if node in initial or (all_pooled and key not in first):
                data = pool.dump(key)
                if data is not None:
                    first[key] = data
            elif key in pool:
                built.append(key)
    own = core.built_entries(own_only=True)
    rest: dict[int, bytes] = {}
    if rest_apart:
        initial = set(core.initial_nodes())
        rest = {n: e for n, e in own.items() if n not in initial}
        own = {n: e for n, e in own.items() if n in initial}
    payload = GrammarPayload(_lowered_out(lowered, False), own, compiled._source,
                             [(m, c.__name__) for m, c in compiled._warnings], first, built)
    fingerprint = compiled.tokenizer_info.fingerprint
    blob = pack(KIND_GRAMMAR, fingerprint, _ENC.encode(payload), compress)
    return (blob, pack(KIND_OWN_ENTRIES, fingerprint, _ENC.encode(rest))) if rest_apart else blob


_OWN_DEC = msgspec.msgpack.Decoder(dict[int, bytes])


def load_own_entries(data: bytes, fingerprint: str) -> dict[int, bytes]:
    """node -> entry bytes from `dump_grammar(..., rest_apart=True)`'s second blob."""
    try:
        return _OWN_DEC.decode(unpack(data, KIND_OWN_ENTRIES, fingerprint))
    except msgspec.DecodeError as e:
        raise DeserializeError(f"malformed grammar entries: {e}") from None


def load_grammar(data: bytes, fingerprint: str) -> GrammarPayload:
    """The checked payload of a grammar blob; its `lowered` turned into a LoweredGrammar."""
    try:
        payload = _GRAMMAR_DEC.decode(unpack(data, KIND_GRAMMAR, fingerprint))
    except msgspec.DecodeError as e:
        raise DeserializeError(f"malformed compiled grammar: {e}") from None
    payload.lowered = _lowered_in(payload.lowered)
    return payload


def dump_module(module: Any, fingerprint: str) -> bytes:
    payload = ModulePayload(_lowered_out(module.lowered, True, module.keys),
                            [(m, c.__name__) for m, c in module.warnings])
    return pack(KIND_MODULE, fingerprint, _ENC.encode(payload))


def load_module(data: bytes, fingerprint: str) -> Any:
    from .grammar.hashing import GrammarKeys
    from .lowering import Module

    try:
        payload = _MODULE_DEC.decode(unpack(data, KIND_MODULE, fingerprint))
    except msgspec.DecodeError as e:
        raise DeserializeError(f"malformed module: {e}") from None
    lowered = _lowered_in(payload.lowered)
    keys, lowered._keys = lowered._keys, None
    if lowered.fsms is not None and len(lowered.fsms) != len(lowered.rule_names):
        raise DeserializeError("module automata and rules disagree")
    # its rule keys alone are those of its keys (the contexts are computed over them): not hashed again
    return Module(lowered, [(m, _warning_class(c)) for m, c in payload.warnings], _keys=keys,
                  _rules=GrammarKeys(keys.rule, [], [None if c is None else c.tolist() for c in keys.canon]))


def dump_entry(entry: bytes, fingerprint: str) -> bytes:
    return pack(KIND_ENTRY, fingerprint, entry)


def load_entry(data: bytes, fingerprint: str) -> bytes:
    """The entry bytes of an entry blob (the pool checks them again as it reads them)."""
    return unpack(data, KIND_ENTRY, fingerprint)


def _warning_class(name: str) -> type[Warning]:
    from .errors import SchemaWarning

    return SchemaWarning if name == "SchemaWarning" else UserWarning
