"""The cross-grammar pool of mask entries (XGrammar 2 §3.3).

Entries are keyed by content, never by grammar: (rule key, canonical node, context key), see
`grammar/hashing.py`. Two grammars that share a sub-structure in the same surroundings share its
entries outright (a perfect hit); under other surroundings the entry of the same automaton node
still fixes every token the automaton decides alone, so a new entry only walks the others (a
partial hit). The pool holds one tokenizer's entries (a compiler's), is safe to use from many
threads, and stays within a byte budget by evicting the least recently used entries. Entries hold
token ids only, nothing of the text a tenant sent.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from ._ext.core import PooledEntry, Vocab

#: Bytes of the automaton part of a key (rule key and canonical node); the rest is the context key.
FSM_KEY_BYTES = 20
KEY_BYTES = 36


class EntryPool:
    def __init__(self, vocab: Vocab, fingerprint: str, limit_bytes: int = -1):
        self.vocab = vocab
        self.fingerprint = fingerprint
        self._limit = limit_bytes
        self._entries: OrderedDict[bytes, PooledEntry] = OrderedDict()
        self._by_fsm: dict[bytes, bytes] = {}   # automaton part -> key of its latest entry
        self._lock = threading.Lock()
        self.nbytes = 0
        self.hits = self.partial_hits = self.misses = self.evictions = 0

    def lookup(self, key: bytes, fsm_key: bytes | None) -> tuple[PooledEntry | None, PooledEntry | None]:
        """(the entry of `key`, None) on a perfect hit; else (None, an entry of the same automaton
        node under another context, or None; always None without `fsm_key`)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return entry, None
            other = self._by_fsm.get(fsm_key) if fsm_key is not None else None
            donor = self._entries.get(other) if other is not None else None
            if donor is not None:
                self.partial_hits += 1
            else:
                self.misses += 1
            return None, donor

    def store(self, key: bytes, fsm_key: bytes | None, entry: PooledEntry, partial: bool = False) -> None:
        """Keep `entry` under `key`; with `fsm_key`, it may also serve as a donor for partial hits
        (entries whose inside-the-rule verdicts depend on their context must not)."""
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:       # two grammars built it at once; keep the newer
                self.nbytes -= old.nbytes
            self._entries[key] = entry
            if fsm_key is not None:
                self._by_fsm[fsm_key] = key
            self.nbytes += entry.nbytes
            self._evict()

    def set_limit(self, limit_bytes: int) -> None:
        with self._lock:
            self._limit = limit_bytes
            self._evict()

    def _evict(self) -> None:
        while self._limit >= 0 and self.nbytes > self._limit and self._entries:
            key, entry = self._entries.popitem(last=False)
            self.nbytes -= entry.nbytes
            self.evictions += 1
            fsm_key = key[:FSM_KEY_BYTES]
            if self._by_fsm.get(fsm_key) == key:
                del self._by_fsm[fsm_key]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._by_fsm.clear()
            self.nbytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"entries": len(self._entries), "bytes": self.nbytes, "hits": self.hits,
                    "partial_hits": self.partial_hits, "misses": self.misses, "evictions": self.evictions}

    # -- transport: entries travel between processes as bytes --------------------------------
    def dump(self, key: bytes) -> bytes | None:
        """The compact bytes of one entry (None if absent), for another process's pool."""
        with self._lock:
            entry = self._entries.get(key)
        return None if entry is None else entry.to_bytes()

    def keys(self) -> list[bytes]:
        with self._lock:
            return list(self._entries)

    def load(self, key: bytes, data: bytes) -> None:
        """Add an entry another process built for the same tokenizer; ValueError if malformed."""
        if len(key) != KEY_BYTES:
            raise ValueError(f"pool keys are {KEY_BYTES} bytes, got {len(key)}")
        self.store(key, key[:FSM_KEY_BYTES], PooledEntry.from_bytes(data, self.vocab))
