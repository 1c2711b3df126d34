# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The C core: a byte-level Earley parser over per-rule automata and the adaptive token-mask cache.

Everything inside the `nogil` functions touches only C data. Items pack into one 64-bit word:
bits 0-30 the global automaton node (the rule is implied), bit 31 the "top" flag, bits 32-63 the
origin (index of the state set where the item's rule was predicted). A top item stands for the start
of the parse, so its completion means "the parse can end here"; the mask builder reuses the flag for
the rule whose entry it builds and for the context it checks leftover bytes against.
"""

from libc.stdint cimport uint8_t, int8_t, int32_t, uint32_t, int64_t, uint64_t, uintptr_t
from libc.stdlib cimport malloc, realloc, free, calloc, qsort
from libc.string cimport memset, memcpy, memcmp, memmove

cdef extern from "<sched.h>" nogil:
    int sched_yield()

from cpython.ref cimport PyObject
from cpython.pythread cimport (PyThread_type_lock, PyThread_allocate_lock, PyThread_free_lock,
                               PyThread_acquire_lock, PyThread_release_lock, WAIT_LOCK)
cimport numpy as cnp
import sys

import numpy as np

cnp.import_array()

ctypedef uint64_t item_t

cdef enum:
    NODE_MASK = 0x7FFFFFFF
    TOP_BIT = 0x80000000

cdef enum:
    MAX_TOKEN_BYTES = 4096
    MEMO_MAX_ITEMS = 1 << 22
    MEMO_MAX_TRANSITIONS = 1 << 21
    MCACHE_SLOTS = 8
    MAX_RESUMES = 4
    CERTAIN_WORK_LIMIT = 65536
    MCACHE_MIN_CHECKS = 32
    MAX_FREE_SCRATCH = 4

cdef extern from *:
    int __builtin_ctzll(unsigned long long) nogil
    int __builtin_popcountll(unsigned long long) nogil

# ---------------------------------------------------------------------------------------------
# Grammar tables
# ---------------------------------------------------------------------------------------------

cdef struct GrammarC:
    int32_t n_nodes
    int32_t n_rules
    const int32_t* node_rule
    const uint8_t* node_final
    const int32_t* be_start
    const uint8_t* be_lo
    const uint8_t* be_hi
    const int32_t* be_target
    const int32_t* re_start
    const int32_t* re_rule
    const int32_t* re_target
    const int32_t* rule_start
    const uint8_t* rule_nullable
    const int32_t* ctx_start
    const uint64_t* ctx_item
    const uint8_t* node_pure      # bit 0: deterministic, and no rule call reachable inside its rule;
                                  # bit 1: deterministic, and no rule call at this node
    const int32_t* ctx_resume     # per rule, MAX_RESUMES slots: the caller nodes calls resume at (-1: unused)
    const uint8_t* rule_follow    # 1: slot 0 of ctx_resume is the start of the rule's declared follow


# ---------------------------------------------------------------------------------------------
# Earley parser state: a stack of state sets with a dedup table for the open (last) set
# ---------------------------------------------------------------------------------------------

cdef struct Parser

# ---------------------------------------------------------------------------------------------
# Transition memo: state sets interned by content, and (set, byte) -> set transitions
#
# A set's identity is its items with each origin replaced by the identity of the origin set (or
# SELF for the set itself, or the fixed index of a static set), so equal identities behave the same
# for every future byte. Walks over the vocabulary trie revisit the same identities constantly
# (inside a string, an identifier, a number), and a memo hit replaces predict/complete by a copy.
# ---------------------------------------------------------------------------------------------

cdef enum:
    ORIGIN_SELF = 0xFFFFFFFF
    ORIGIN_STATIC = 0x80000000
    DENSE_IDS = 1 << 16
    SMALL_SLOTS = 4096

cdef struct Memo:
    item_t* pool
    int64_t pool_len
    int64_t pool_cap
    int64_t* id_off
    int32_t* id_len
    uint8_t* id_top
    uint64_t* id_hash
    int32_t* id_text      # a "text" node among the set's items, -1 none, -2 not looked up yet
    int32_t n_ids
    int32_t cap_ids
    int32_t* ih_slot
    uint32_t ih_mask
    uint64_t* th_key
    int32_t* th_val
    uint32_t th_mask
    int64_t th_count
    int32_t* dense        # byte transitions of the first DENSE_IDS ids: dense[id * 256 + byte]
    int32_t dense_cap
    uint64_t small_key[SMALL_SLOTS]   # direct-mapped front for the hashed (completion) transitions
    int32_t small_val[SMALL_SLOTS]


cdef int m_init(Memo* m) noexcept nogil:
    # Small to start with (every compiled grammar and every matcher has a memo; they grow on demand).
    m.pool_cap = 1 << 10
    m.cap_ids = 1 << 8
    m.ih_mask = (1 << 9) - 1
    m.th_mask = (1 << 10) - 1
    m.pool = <item_t*>malloc(m.pool_cap * sizeof(item_t))
    m.id_off = <int64_t*>malloc(m.cap_ids * sizeof(int64_t))
    m.id_len = <int32_t*>malloc(m.cap_ids * sizeof(int32_t))
    m.id_top = <uint8_t*>malloc(m.cap_ids * sizeof(uint8_t))
    m.id_hash = <uint64_t*>malloc(m.cap_ids * sizeof(uint64_t))
    m.id_text = <int32_t*>malloc(m.cap_ids * sizeof(int32_t))
    m.ih_slot = <int32_t*>malloc((m.ih_mask + 1) * sizeof(int32_t))
    m.th_key = <uint64_t*>malloc((m.th_mask + 1) * sizeof(uint64_t))
    m.th_val = <int32_t*>malloc((m.th_mask + 1) * sizeof(int32_t))
    m.dense_cap = 16
    m.dense = <int32_t*>malloc(m.dense_cap * 256 * sizeof(int32_t))
    if (m.pool == NULL or m.id_off == NULL or m.id_len == NULL or m.id_top == NULL or m.id_hash == NULL
            or m.ih_slot == NULL or m.th_key == NULL or m.th_val == NULL or m.dense == NULL
            or m.id_text == NULL):
        return -1
    m_clear(m)
    return 0


cdef void m_free(Memo* m) noexcept nogil:
    free(m.pool)
    free(m.id_off)
    free(m.id_len)
    free(m.id_top)
    free(m.id_hash)
    free(m.id_text)
    free(m.ih_slot)
    free(m.th_key)
    free(m.th_val)
    free(m.dense)


cdef void m_clear(Memo* m) noexcept nogil:
    m.pool_len = 0
    m.n_ids = 0
    m.th_count = 0
    memset(m.ih_slot, 0xFF, (m.ih_mask + 1) * sizeof(int32_t))
    memset(m.th_val, 0xFF, (m.th_mask + 1) * sizeof(int32_t))
    memset(m.dense, 0xFF, <int64_t>m.dense_cap * 256 * sizeof(int32_t))
    memset(m.small_val, 0xFF, SMALL_SLOTS * sizeof(int32_t))


cdef inline uint64_t _mix(uint64_t h, uint64_t x) noexcept nogil:
    h ^= x
    h *= <uint64_t>0x9E3779B97F4A7C15
    h ^= h >> 29
    return h


cdef inline item_t _encode(Parser* p, int32_t k, item_t it) noexcept nogil:
    cdef uint64_t o = it >> 32
    cdef uint64_t enc
    if o == <uint64_t>k:
        enc = ORIGIN_SELF
    elif o < <uint64_t>p.n_static:
        enc = ORIGIN_STATIC | o
    else:
        enc = <uint64_t>p.set_id[o]
    return (it & <item_t>0xFFFFFFFF) | (enc << 32)


cdef int32_t m_intern(Memo* m, Parser* p, int32_t k) noexcept nogil:
    """The interned id of set k's content (created if new); -1 when out of memory."""
    cdef int64_t s = p.set_start[k], e = p_set_end(p, k), n = e - s, j
    cdef uint8_t top = p.set_top[k]
    cdef uint64_t h = _mix(<uint64_t>0xCBF29CE484222325, <uint64_t>n | (<uint64_t>top << 40))
    cdef uint32_t slot, i
    cdef int32_t x
    cdef bint same
    for j in range(s, e):
        h = _mix(h, _encode(p, k, p.items[j]))
    slot = <uint32_t>h & m.ih_mask
    while m.ih_slot[slot] >= 0:
        x = m.ih_slot[slot]
        if m.id_hash[x] == h and m.id_len[x] == n and m.id_top[x] == top:
            same = True
            for j in range(n):
                if m.pool[m.id_off[x] + j] != _encode(p, k, p.items[s + j]):
                    same = False
                    break
            if same:
                return x
        slot = (slot + 1) & m.ih_mask
    if m.pool_len + n > m.pool_cap:
        while m.pool_len + n > m.pool_cap:
            m.pool_cap *= 2
        m.pool = <item_t*>realloc(m.pool, m.pool_cap * sizeof(item_t))
        if m.pool == NULL:
            return -1
    if m.n_ids == m.cap_ids:
        m.cap_ids *= 2
        m.id_off = <int64_t*>realloc(m.id_off, m.cap_ids * sizeof(int64_t))
        m.id_len = <int32_t*>realloc(m.id_len, m.cap_ids * sizeof(int32_t))
        m.id_top = <uint8_t*>realloc(m.id_top, m.cap_ids * sizeof(uint8_t))
        m.id_hash = <uint64_t*>realloc(m.id_hash, m.cap_ids * sizeof(uint64_t))
        m.id_text = <int32_t*>realloc(m.id_text, m.cap_ids * sizeof(int32_t))
        if m.id_off == NULL or m.id_len == NULL or m.id_top == NULL or m.id_hash == NULL or m.id_text == NULL:
            return -1
    x = m.n_ids
    m.n_ids += 1
    m.id_off[x] = m.pool_len
    m.id_len[x] = <int32_t>n
    m.id_top[x] = top
    m.id_hash[x] = h
    m.id_text[x] = -2
    for j in range(n):
        m.pool[m.pool_len + j] = _encode(p, k, p.items[s + j])
    m.pool_len += n
    m.ih_slot[slot] = x
    if <uint32_t>m.n_ids * 2 > m.ih_mask:
        return x if _m_rehash_ids(m) == 0 else -1
    return x


cdef int _m_rehash_ids(Memo* m) noexcept nogil:
    cdef uint32_t size = (m.ih_mask + 1) * 2, slot
    cdef int32_t x
    free(m.ih_slot)
    m.ih_slot = <int32_t*>malloc(size * sizeof(int32_t))
    if m.ih_slot == NULL:
        return -1
    memset(m.ih_slot, 0xFF, size * sizeof(int32_t))
    m.ih_mask = size - 1
    for x in range(m.n_ids):
        slot = <uint32_t>m.id_hash[x] & m.ih_mask
        while m.ih_slot[slot] >= 0:
            slot = (slot + 1) & m.ih_mask
        m.ih_slot[slot] = x
    return 0


cdef inline uint32_t _tslot(Memo* m, uint64_t key) noexcept nogil:
    return <uint32_t>(_mix(0, key) >> 7) & m.th_mask


cdef inline int32_t m_trans_get(Memo* m, int32_t x, uint32_t sym) noexcept nogil:
    """sym: a byte (0-255), or 256 + rule for "complete rule from its callers' static set"."""
    cdef int32_t r
    cdef uint64_t key
    cdef uint32_t slot
    if sym < 256:
        if x < m.dense_cap:
            return m.dense[<int64_t>x * 256 + sym]
        return _m_trans_get_hashed(m, x, sym)
    key = (<uint64_t>x << 32) | sym
    slot = <uint32_t>(key * <uint64_t>0x9E3779B97F4A7C15 >> 52) & (SMALL_SLOTS - 1)
    if m.small_val[slot] >= 0 and m.small_key[slot] == key:
        return m.small_val[slot]
    r = _m_trans_get_hashed(m, x, sym)
    if r >= 0:
        m.small_key[slot] = key
        m.small_val[slot] = r
    return r


cdef int32_t _m_trans_get_hashed(Memo* m, int32_t x, uint32_t sym) noexcept nogil:
    cdef uint64_t key = (<uint64_t>x << 32) | sym
    cdef uint32_t slot = _tslot(m, key)
    while m.th_val[slot] >= 0:
        if m.th_key[slot] == key:
            return m.th_val[slot]
        slot = (slot + 1) & m.th_mask
    return -1


cdef int m_trans_put(Memo* m, int32_t x, uint32_t sym, int32_t r) noexcept nogil:
    cdef uint64_t key = (<uint64_t>x << 32) | sym
    cdef uint32_t slot, size, i
    cdef uint64_t* old_key
    cdef int32_t* old_val
    cdef int32_t old_cap
    if sym < 256 and x < DENSE_IDS:
        if x >= m.dense_cap:
            old_cap = m.dense_cap
            while x >= m.dense_cap:
                m.dense_cap *= 2
            m.dense = <int32_t*>realloc(m.dense, <int64_t>m.dense_cap * 256 * sizeof(int32_t))
            if m.dense == NULL:
                return -1
            memset(m.dense + <int64_t>old_cap * 256, 0xFF, <int64_t>(m.dense_cap - old_cap) * 256 * sizeof(int32_t))
        m.dense[<int64_t>x * 256 + sym] = r
        m.th_count += 1
        return 0
    if (m.th_count + 1) * 2 > <int64_t>m.th_mask:
        size = (m.th_mask + 1) * 2
        old_key = m.th_key
        old_val = m.th_val
        m.th_key = <uint64_t*>malloc(size * sizeof(uint64_t))
        m.th_val = <int32_t*>malloc(size * sizeof(int32_t))
        if m.th_key == NULL or m.th_val == NULL:
            return -1
        memset(m.th_val, 0xFF, size * sizeof(int32_t))
        i = m.th_mask + 1
        m.th_mask = size - 1
        while i > 0:
            i -= 1
            if old_val[i] >= 0:
                slot = _tslot(m, old_key[i])
                while m.th_val[slot] >= 0:
                    slot = (slot + 1) & m.th_mask
                m.th_key[slot] = old_key[i]
                m.th_val[slot] = old_val[i]
        free(old_key)
        free(old_val)
    slot = _tslot(m, key)
    while m.th_val[slot] >= 0:
        if m.th_key[slot] == key:
            return 0
        slot = (slot + 1) & m.th_mask
    m.th_key[slot] = key
    m.th_val[slot] = r
    m.th_count += 1
    return 0


cdef struct Parser:
    item_t* items
    int64_t n_items
    int64_t cap_items
    int64_t* set_start
    uint8_t* set_top
    int32_t n_sets
    int32_t cap_sets
    item_t* hkeys
    uint32_t* hgen
    uint32_t hmask
    uint32_t gen
    int64_t hcount
    int32_t hset          # which set the dedup table describes (-1: none)
    Memo* memo            # optional transition memo (the mask builder's walks); NULL: none
    int32_t* set_id       # interned id of each set (-1: none) when memo is set
    int32_t* set_prevpos  # previous stack position of the same id (restored on pop)
    int32_t* id_pos       # latest stack position holding each interned id
    int32_t cap_id_pos
    int32_t n_static      # leading sets that are never popped (the context parser's caller sets)


cdef int64_t _parser_bytes(const Parser* p) noexcept nogil:
    if p.items == NULL:
        return 0
    return (p.cap_items * sizeof(item_t) + p.cap_sets * (sizeof(int64_t) + 1 + 2 * sizeof(int32_t))
            + (<int64_t>p.hmask + 1) * (sizeof(item_t) + sizeof(uint32_t)) + p.cap_id_pos * sizeof(int32_t))


cdef int64_t _memo_bytes(const Memo* m) noexcept nogil:
    if m.pool == NULL:
        return 0
    return (m.pool_cap * sizeof(item_t)
            + <int64_t>m.cap_ids * (sizeof(int64_t) + sizeof(int32_t) + 1 + sizeof(uint64_t) + sizeof(int32_t))
            + (<int64_t>m.ih_mask + 1) * sizeof(int32_t)
            + (<int64_t>m.th_mask + 1) * (sizeof(uint64_t) + sizeof(int32_t))
            + <int64_t>m.dense_cap * 256 * sizeof(int32_t))


cdef int p_init(Parser* p) noexcept nogil:
    p.cap_items = 1024
    p.items = <item_t*>malloc(p.cap_items * sizeof(item_t))
    p.cap_sets = 256
    p.set_start = <int64_t*>malloc(p.cap_sets * sizeof(int64_t))
    p.set_top = <uint8_t*>malloc(p.cap_sets * sizeof(uint8_t))
    p.hmask = 255
    p.hkeys = <item_t*>malloc((p.hmask + 1) * sizeof(item_t))
    p.hgen = <uint32_t*>calloc(p.hmask + 1, sizeof(uint32_t))
    p.gen = 1
    p.n_items = 0
    p.n_sets = 0
    p.hcount = 0
    p.hset = -1
    p.memo = NULL
    p.n_static = 0
    p.set_id = <int32_t*>malloc(p.cap_sets * sizeof(int32_t))
    p.set_prevpos = <int32_t*>malloc(p.cap_sets * sizeof(int32_t))
    p.cap_id_pos = 1024
    p.id_pos = <int32_t*>malloc(p.cap_id_pos * sizeof(int32_t))
    if p.id_pos != NULL:
        memset(p.id_pos, 0xFF, p.cap_id_pos * sizeof(int32_t))
    if (p.items == NULL or p.set_start == NULL or p.set_top == NULL or p.hkeys == NULL or p.hgen == NULL
            or p.set_id == NULL or p.set_prevpos == NULL or p.id_pos == NULL):
        return -1
    return 0


cdef void p_free(Parser* p) noexcept nogil:
    free(p.items)
    free(p.set_start)
    free(p.set_top)
    free(p.hkeys)
    free(p.hgen)
    free(p.set_id)
    free(p.set_prevpos)
    free(p.id_pos)
    p.items = NULL
    p.set_start = NULL
    p.set_top = NULL
    p.hkeys = NULL
    p.hgen = NULL


cdef inline uint32_t _hash(item_t x) noexcept nogil:
    x ^= x >> 33
    x *= <uint64_t>0xff51afd7ed558ccd
    x ^= x >> 33
    return <uint32_t>x


cdef int _h_insert(Parser* p, item_t it) noexcept nogil:
    """1 if inserted, 0 if present."""
    cdef uint32_t h = _hash(it) & p.hmask
    while p.hgen[h] == p.gen:
        if p.hkeys[h] == it:
            return 0
        h = (h + 1) & p.hmask
    p.hgen[h] = p.gen
    p.hkeys[h] = it
    p.hcount += 1
    return 1


cdef int _h_reset(Parser* p) noexcept nogil:
    """Start a fresh dedup generation holding exactly the items of the open set."""
    cdef int64_t i, s, n
    cdef uint32_t newsize
    p.gen += 1
    if p.gen == 0:
        memset(p.hgen, 0, (p.hmask + 1) * sizeof(uint32_t))
        p.gen = 1
    p.hcount = 0
    p.hset = p.n_sets - 1
    if p.n_sets == 0:
        return 0
    s = p.set_start[p.n_sets - 1]
    n = p.n_items - s
    if n * 2 > <int64_t>p.hmask:
        return _h_grow(p, n)
    for i in range(s, p.n_items):
        _h_insert(p, p.items[i])
    return 0


cdef int _h_grow(Parser* p, int64_t need) noexcept nogil:
    cdef uint32_t size = p.hmask + 1
    cdef int64_t i
    while <int64_t>size < need * 4:
        size *= 2
    free(p.hkeys)
    free(p.hgen)
    p.hkeys = <item_t*>malloc(size * sizeof(item_t))
    p.hgen = <uint32_t*>calloc(size, sizeof(uint32_t))
    if p.hkeys == NULL or p.hgen == NULL:
        return -1
    p.hmask = size - 1
    p.gen = 1
    p.hcount = 0
    for i in range(p.set_start[p.n_sets - 1], p.n_items):
        _h_insert(p, p.items[i])
    return 0


cdef int p_add(Parser* p, item_t it) noexcept nogil:
    """Add an item to the open set unless present. 0 ok, -1 out of memory."""
    if p.hset != p.n_sets - 1:
        if _h_reset(p) < 0:
            return -1
    if (p.hcount + 1) * 2 > <int64_t>p.hmask:
        if _h_grow(p, p.hcount + 1) < 0:
            return -1
    if not _h_insert(p, it):
        return 0
    if p.n_items == p.cap_items:
        p.cap_items *= 2
        p.items = <item_t*>realloc(p.items, p.cap_items * sizeof(item_t))
        if p.items == NULL:
            return -1
    p.items[p.n_items] = it
    p.n_items += 1
    return 0


cdef int _open_set(Parser* p) noexcept nogil:
    """Append an empty set (no dedup reset)."""
    if p.n_sets == p.cap_sets:
        p.cap_sets *= 2
        p.set_start = <int64_t*>realloc(p.set_start, p.cap_sets * sizeof(int64_t))
        p.set_top = <uint8_t*>realloc(p.set_top, p.cap_sets * sizeof(uint8_t))
        p.set_id = <int32_t*>realloc(p.set_id, p.cap_sets * sizeof(int32_t))
        p.set_prevpos = <int32_t*>realloc(p.set_prevpos, p.cap_sets * sizeof(int32_t))
        if p.set_start == NULL or p.set_top == NULL or p.set_id == NULL or p.set_prevpos == NULL:
            return -1
    p.set_start[p.n_sets] = p.n_items
    p.set_top[p.n_sets] = 0
    p.set_id[p.n_sets] = -1
    p.n_sets += 1
    p.hset = -1
    return 0


cdef int p_begin_set(Parser* p) noexcept nogil:
    if _open_set(p) < 0:
        return -1
    return _h_reset(p)


cdef int _assign_id(Parser* p, int32_t k, int32_t x) noexcept nogil:
    cdef int32_t old = p.cap_id_pos
    if x >= p.cap_id_pos:
        while x >= p.cap_id_pos:
            p.cap_id_pos *= 2
        p.id_pos = <int32_t*>realloc(p.id_pos, p.cap_id_pos * sizeof(int32_t))
        if p.id_pos == NULL:
            return -1
        memset(p.id_pos + old, 0xFF, (p.cap_id_pos - old) * sizeof(int32_t))
    p.set_id[k] = x
    p.set_prevpos[k] = p.id_pos[x]
    p.id_pos[x] = k
    return 0


cdef inline void _unassign_id(Parser* p, int32_t k) noexcept nogil:
    cdef int32_t x = p.set_id[k]
    if x >= 0:
        p.id_pos[x] = p.set_prevpos[k]
        p.set_id[k] = -1


cdef int p_intern_top(Parser* p) noexcept nogil:
    """(Re)compute the interned id of the open set; a no-op without a memo."""
    cdef int32_t k = p.n_sets - 1, x
    if p.memo == NULL:
        return 0
    _unassign_id(p, k)
    x = m_intern(p.memo, p, k)
    if x < 0:
        return -1
    return _assign_id(p, k, x)


cdef int p_push_empty(Parser* p) noexcept nogil:
    """Open a new, empty state set without touching the dedup table (a dead parser stays dead)."""
    if _open_set(p) < 0:
        return -1
    return p_intern_top(p)


cdef inline void p_pop_to(Parser* p, int32_t n_sets) noexcept nogil:
    cdef int32_t k
    if n_sets < p.n_sets:
        if p.memo != NULL:
            k = p.n_sets
            while k > n_sets:
                k -= 1
                _unassign_id(p, k)
        p.n_items = p.set_start[n_sets]
        p.n_sets = n_sets
        p.hset = -1


cdef int p_materialize(Parser* p, int32_t x) noexcept nogil:
    """Push a set from the memo. 1/0 as p_push_byte; 2 when an origin cannot be resolved (caller
    then computes the step normally)."""
    cdef Memo* m = p.memo
    cdef int32_t k, n = m.id_len[x], i
    cdef int64_t off = m.id_off[x]
    cdef item_t enc
    cdef uint64_t eo, o
    if p.n_items + n > p.cap_items:
        while p.n_items + n > p.cap_items:
            p.cap_items *= 2
        p.items = <item_t*>realloc(p.items, p.cap_items * sizeof(item_t))
        if p.items == NULL:
            return -1
    if _open_set(p) < 0:
        return -1
    k = p.n_sets - 1
    for i in range(n):
        enc = m.pool[off + i]
        eo = enc >> 32
        if eo == ORIGIN_SELF:
            o = <uint64_t>k
        elif eo & ORIGIN_STATIC:
            o = eo & 0x7FFFFFFF
        else:
            if <int64_t>eo >= p.cap_id_pos or p.id_pos[eo] < 0:
                p.n_sets -= 1
                return 2
            o = <uint64_t>p.id_pos[eo]
        p.items[p.n_items + i] = (enc & <item_t>0xFFFFFFFF) | (o << 32)
    p.n_items += n
    p.set_top[k] = m.id_top[x]
    if _assign_id(p, k, x) < 0:
        return -1
    return 1 if n > 0 else 0


cdef inline int64_t p_set_end(Parser* p, int32_t k) noexcept nogil:
    return p.set_start[k + 1] if k + 1 < p.n_sets else p.n_items


cdef int p_closure(Parser* p, const GrammarC* g, int64_t i) noexcept nogil:
    """Predict and complete from item index i to the end of the open set (Aycock-Horspool nullables)."""
    cdef int32_t cur = p.n_sets - 1
    cdef item_t it, it2
    cdef uint32_t node, n2
    cdef int64_t origin, j, e
    cdef int32_t k, r, r2
    while i < p.n_items:
        it = p.items[i]
        i += 1
        node = it & NODE_MASK
        if g.node_final[node]:
            if it & TOP_BIT:
                p.set_top[cur] = 1
            else:
                r = g.node_rule[node]
                origin = <int64_t>(it >> 32)
                j = p.set_start[origin]
                e = p_set_end(p, <int32_t>origin)
                while j < e:
                    it2 = p.items[j]
                    j += 1
                    n2 = it2 & NODE_MASK
                    for k in range(g.re_start[n2], g.re_start[n2 + 1]):
                        if g.re_rule[k] == r:
                            if p_add(p, (it2 & ~(<item_t>NODE_MASK)) | <item_t>g.re_target[k]) < 0:
                                return -1
        for k in range(g.re_start[node], g.re_start[node + 1]):
            r2 = g.re_rule[k]
            if p_add(p, (<item_t>cur << 32) | <item_t>g.rule_start[r2]) < 0:
                return -1
            if g.rule_nullable[r2]:
                if p_add(p, (it & ~(<item_t>NODE_MASK)) | <item_t>g.re_target[k]) < 0:
                    return -1
    return 0


cdef int p_start(Parser* p, const GrammarC* g, item_t first) noexcept nogil:
    """Reset to one state set holding the closure of `first`."""
    p_pop_to(p, 0)
    if p_begin_set(p) < 0 or p_add(p, first) < 0:
        return -1
    if p_closure(p, g, 0) < 0:
        return -1
    return p_intern_top(p)


cdef int p_push_byte(Parser* p, const GrammarC* g, uint8_t b) noexcept nogil:
    """Scan byte b into a new state set. 1 if the new set is non-empty, 0 if empty, -1 on OOM.

    The new set stays pushed even when empty, so callers can pop uniformly by depth.
    """
    cdef int32_t prev = p.n_sets - 1
    cdef int64_t j, s, e
    cdef item_t it
    cdef uint32_t node
    cdef int32_t k, x = -1, r
    cdef int rc
    if prev < 0:
        return -1
    if p.memo != NULL:
        x = p.set_id[prev]
        if x >= 0:
            r = m_trans_get(p.memo, x, b)
            if r >= 0:
                rc = p_materialize(p, r)
                if rc != 2:
                    return rc
    s = p.set_start[prev]
    e = p.n_items
    if p_begin_set(p) < 0:
        return -1
    for j in range(s, e):
        it = p.items[j]
        node = it & NODE_MASK
        for k in range(g.be_start[node], g.be_start[node + 1]):
            if g.be_lo[k] > b:
                break
            if b <= g.be_hi[k]:
                if p_add(p, (it & ~(<item_t>NODE_MASK)) | <item_t>g.be_target[k]) < 0:
                    return -1
    s = p.set_start[p.n_sets - 1]
    if p_closure(p, g, s) < 0:
        return -1
    if p.memo != NULL:
        if p_intern_top(p) < 0:
            return -1
        if x >= 0 and m_trans_put(p.memo, x, b, p.set_id[p.n_sets - 1]) < 0:
            return -1
    return 1 if p.n_items > s else 0


cdef int p_complete_rule(Parser* p, const GrammarC* g, int32_t rule, int64_t origin) noexcept nogil:
    """Complete `rule` from state set `origin` into the open set, then close the new items."""
    cdef int64_t s = p.n_items, j = p.set_start[origin], e = p_set_end(p, <int32_t>origin)
    cdef item_t it2
    cdef uint32_t n2
    cdef int32_t k
    while j < e:
        it2 = p.items[j]
        j += 1
        n2 = it2 & NODE_MASK
        for k in range(g.re_start[n2], g.re_start[n2 + 1]):
            if g.re_rule[k] == rule:
                if p_add(p, (it2 & ~(<item_t>NODE_MASK)) | <item_t>g.re_target[k]) < 0:
                    return -1
    if p_closure(p, g, s) < 0:
        return -1
    return p_intern_top(p)


cdef inline void _set_bytes(uint64_t* bits, int32_t lo, int32_t hi) noexcept nogil:
    """Add bytes lo..hi to the 256-bit set `bits`."""
    cdef int32_t b
    for b in range(lo, hi + 1):
        bits[b >> 6] |= (<uint64_t>1) << (b & 63)


cdef void _first_bytes(Parser* P, const GrammarC* g, uint64_t* first) noexcept nogil:
    """Add the bytes the open set of P can scan to the 256-bit set `first`."""
    cdef int64_t j
    cdef uint32_t nd
    cdef int32_t k
    for j in range(P.set_start[P.n_sets - 1], P.n_items):
        nd = P.items[j] & NODE_MASK
        for k in range(g.be_start[nd], g.be_start[nd + 1]):
            _set_bytes(first, g.be_lo[k], g.be_hi[k])


cdef int p_inject_top(Parser* P, const GrammarC* g, int32_t node) noexcept nogil:
    """Add a top item at `node` (origin: the open set) and close it."""
    cdef int64_t s = P.n_items
    if p_add(P, (<item_t>(P.n_sets - 1) << 32) | TOP_BIT | <item_t>node) < 0:
        return -1
    if p_closure(P, g, s) < 0:
        return -1
    return p_intern_top(P)


cdef int p_catch_up(Parser* P, const GrammarC* g, const int32_t* ids, int32_t base, int32_t upto,
                    const uint8_t* path) noexcept nogil:
    """Materialize P's sets for depths [P's depth, upto) from their ids (-1: an empty set).

    Depth j is set index base + j; path[j] is the byte that led to depth j (used when a template
    cannot be resolved and the step is recomputed).
    """
    cdef int32_t j, x
    cdef int rc
    if P.n_sets > base + upto:
        p_pop_to(P, base + upto)
    while P.n_sets < base + upto:
        j = P.n_sets - base
        x = ids[j]
        if x < 0:
            rc = p_push_empty(P)
        else:
            rc = p_materialize(P, x)
            if rc == 2:
                rc = p_push_byte(P, g, path[j])
        if rc < 0:
            return -1
    return 0


cdef int32_t p_advance(Parser* P, const GrammarC* g, int32_t* ids, int32_t base, int32_t d, uint8_t byte,
                       const uint8_t* path) noexcept nogil:
    """The id of the set at depth d after `byte`; the step is computed (and memoized) only on a miss."""
    cdef int32_t r = m_trans_get(P.memo, ids[d - 1], byte)
    if r < 0:
        if p_catch_up(P, g, ids, base, d, path) < 0:
            return -1
        if p_push_byte(P, g, byte) < 0:
            return -1
        r = P.set_id[base + d]
    ids[d] = r
    return r


cdef int p_reintern_all(Parser* P) noexcept nogil:
    """Give every live set a fresh id (after the memo was cleared)."""
    cdef int32_t k, x
    memset(P.id_pos, 0xFF, P.cap_id_pos * sizeof(int32_t))
    for k in range(P.n_sets):
        P.set_id[k] = -1
    for k in range(P.n_static, P.n_sets):
        x = m_intern(P.memo, P, k)
        if x < 0 or _assign_id(P, k, x) < 0:
            return -1
    return 0


# ---------------------------------------------------------------------------------------------
# UTF-8 structure: a decoder automaton, and per trie node the decoder states from which every token
# below the node is well-formed UTF-8 (a truncated last character allowed)
# ---------------------------------------------------------------------------------------------

cdef enum:
    U8_STATES = 8

cdef int8_t U8[U8_STATES][256]


cdef void _u8_init() noexcept nogil:
    """States: 0 at a boundary; 1, 2, 5 need 1, 2, 3 continuation bytes; 3 (after E0), 4 (after ED),
    6 (after F0) and 7 (after F4) restrict the next byte. -1: invalid."""
    cdef int q, b
    for q in range(U8_STATES):
        for b in range(256):
            U8[q][b] = -1
    for b in range(0x80):
        U8[0][b] = 0
    for b in range(0xC2, 0xE0):
        U8[0][b] = 1
    U8[0][0xE0] = 3
    for b in range(0xE1, 0xF0):
        U8[0][b] = 2
    U8[0][0xED] = 4
    U8[0][0xF0] = 6
    for b in range(0xF1, 0xF4):
        U8[0][b] = 5
    U8[0][0xF4] = 7
    for b in range(0x80, 0xC0):
        U8[1][b] = 0
        U8[2][b] = 1
        U8[5][b] = 2
    for b in range(0xA0, 0xC0):
        U8[3][b] = 1
    for b in range(0x80, 0xA0):
        U8[4][b] = 1
    for b in range(0x90, 0xC0):
        U8[6][b] = 2
    for b in range(0x80, 0x90):
        U8[7][b] = 2

_u8_init()


cdef void _u8_subtrees(int32_t n, const uint8_t* sym, const int32_t* parent, uint8_t* ok,
                       int8_t (*table)[256]) noexcept nogil:
    """ok[i] bit q: from decoder state q, every byte sequence below node i is valid UTF-8 so far.
    `table[q][sym]` is the decoder step on a node's symbol (a byte, or a byte class whose bytes all
    step alike; -1 otherwise). Children follow their parent in pre-order, so one backward pass
    folds children into parents."""
    cdef int32_t i = n, p, q, nq
    memset(ok, 0xFF, n)
    while i > 0:
        i -= 1
        p = parent[i]
        if p < 0:
            continue
        for q in range(U8_STATES):
            nq = table[q][sym[i]]
            if nq < 0 or not ((ok[i] >> nq) & 1):
                ok[p] &= ~(1 << q)


# ---------------------------------------------------------------------------------------------
# Vocabulary: token bytes and a pre-order byte trie over the ordinary tokens
# ---------------------------------------------------------------------------------------------

# A token trie in pre-order arrays: node i has an incoming byte, a depth, the index just past its
# subtree, the tokens ending at it (toks[lo:hi]) and below it (toks[dlo:dhi]), and the set of bytes
# below it (4 words).
#: Longest chain of character steps node_chain records (more than any token's bytes).
cdef enum:
    CHAIN_CAP = 4096


cdef void _bytes_below(const TrieC* T, int32_t* out) noexcept nogil:
    """out[i]: the most bytes a token in node i's subtree has beyond node i (subtrees are
    preorder ranges [i, next[i]), so one backward pass suffices)."""
    cdef int32_t i, k, m
    i = T.n - 1
    while i >= 0:
        m = T.depth[i]
        k = i + 1
        while k < T.next[i]:
            if out[k] > m:
                m = out[k]
            k = T.next[k]
        out[i] = m
        i -= 1
    for i in range(T.n):
        out[i] -= T.depth[i]


cdef void _root_children(TrieC* T) noexcept nogil:
    cdef int32_t i = 0
    memset(T.root_child, 0xFF, sizeof(T.root_child))
    while i < T.n:
        T.root_child[T.byte[i]] = i
        i = T.next[i]


cdef inline int32_t _next_root_child(const TrieC* T, const GrammarC* g, int32_t st, int32_t byte) noexcept nogil:
    """The first node at depth 1 after byte `byte` whose byte automaton node `st` reads (T.n: none)."""
    cdef int32_t k, b
    for k in range(g.be_start[st], g.be_start[st + 1]):
        if g.be_hi[k] > byte:
            for b in range(max(<int32_t>g.be_lo[k], byte + 1), g.be_hi[k] + 1):
                if T.root_child[b] >= 0:
                    return T.root_child[b]
    return T.n


cdef inline int32_t _next_root_in(const TrieC* T, const uint64_t* bytes, int32_t byte) noexcept nogil:
    """The first node at depth 1 after byte `byte` whose byte is in the 256-bit set (T.n: none)."""
    cdef int32_t b
    for b in range(byte + 1, 256):
        if (bytes[b >> 6] >> (b & 63)) & 1 and T.root_child[b] >= 0:
            return T.root_child[b]
    return T.n


cdef inline int32_t _next_child(const TrieC* T, int32_t p, int32_t byte) noexcept nogil:
    """The first child of node p whose byte is at least `byte`; T.next[p] (past p's subtree) if none."""
    cdef int32_t a = T.cstart[p], b = T.cstart[p + 1], m
    while a < b:
        m = (a + b) >> 1
        if T.cbyte[m] < byte:
            a = m + 1
        else:
            b = m
    return T.cnode[a] if a < T.cstart[p + 1] else T.next[p]


cdef struct TrieC:
    int32_t n
    const uint8_t* byte
    const int32_t* depth
    const int32_t* next
    const int32_t* lo
    const int32_t* hi
    const int32_t* dlo
    const int32_t* dhi
    const uint64_t* below
    const int32_t* toks
    const uint8_t* u8ok      # per node: decoder states from which everything below is valid UTF-8
    const int32_t* span      # per node: the most bytes any token below it adds (see _bytes_below)
    int32_t root_child[256]  # per byte: its node at depth 1, -1 if no token starts with it
    const int32_t* cstart    # per node: where its children start in cnode/cbyte (NULL: no index)
    const int32_t* cnode     # children, node by node, in byte order
    const uint8_t* cbyte     # their bytes


cdef struct VocabC:
    int32_t vocab_size
    int32_t n_ordinary
    int32_t n_trie
    int32_t max_depth
    int32_t n_words
    const uint8_t* tok_data
    const int64_t* tok_off
    int32_t* rank_token
    int32_t* token_rank
    uint8_t* trie_byte
    int32_t* trie_depth
    int32_t* trie_next
    int32_t* trie_lo
    int32_t* trie_hi
    uint64_t* trie_below     # 4 words per node: the bytes that occur strictly below it
    const int32_t* trie_parent
    const int32_t* rank_node
    int32_t* trie_dlo        # rank range [dlo, dhi) of the tokens strictly below it
    int32_t* trie_dhi
    uint64_t* ordinary_bits
    int32_t* stop_ids
    int32_t n_stop
    uint8_t* tok_chars       # per token: the characters it starts (UTF-8 lead bytes), at most 255
    TrieC trie


cdef enum:
    # `_ranks` sorts n ranks when n times this is below the words of a vocabulary bitset
    RANKS_SORT_FACTOR = 8


cdef int _cmp_int32(const void* a, const void* b) noexcept nogil:
    cdef int32_t x = (<const int32_t*>a)[0], y = (<const int32_t*>b)[0]
    return (x > y) - (x < y)


cdef class Vocab:
    """Token bytes, their byte-sorted order and a byte trie in pre-order arrays.

    Walking the trie in order shares every common prefix between tokens, and a failing prefix skips
    its whole subtree in one jump (trie_next).
    """
    cdef readonly int32_t vocab_size
    cdef readonly int32_t n_tokens
    cdef readonly int32_t n_ordinary
    cdef readonly int32_t n_trie
    cdef readonly int32_t max_depth
    cdef readonly int32_t n_words          # uint64 words covering vocab_size
    cdef object _keep
    cdef const uint8_t* tok_data
    cdef const int64_t* tok_off
    cdef int32_t* rank_token
    cdef int32_t* token_rank
    cdef uint8_t* trie_byte
    cdef int32_t* trie_depth
    cdef int32_t* trie_next
    cdef int32_t* trie_lo
    cdef int32_t* trie_hi
    cdef uint64_t* trie_below
    cdef int32_t* trie_dlo
    cdef int32_t* trie_dhi
    cdef uint8_t* trie_u8ok
    cdef int32_t* trie_parent          # per node: its parent, -1 at depth 1
    cdef int32_t* rank_node            # per rank: the node its token ends at
    cdef int32_t* trie_cstart
    cdef int32_t* trie_cnode
    cdef uint8_t* trie_cbyte
    cdef int32_t* trie_span
    cdef uint8_t* tok_chars
    cdef uint64_t* ordinary_bits
    cdef int32_t* stop_ids
    cdef int32_t n_stop
    cdef VocabC c
    cdef object _sample
    cdef int32_t* free_scratch[MAX_FREE_SCRATCH]   # walk buffers, shared by all grammars of this vocabulary
    cdef int32_t n_free_scratch
    cdef PyThread_type_lock scratch_lock

    def __cinit__(self):
        self.n_free_scratch = 0
        self.scratch_lock = PyThread_allocate_lock()
        if self.scratch_lock == NULL:
            raise MemoryError()
        self.rank_token = NULL
        self.token_rank = NULL
        self.trie_byte = NULL
        self.trie_depth = NULL
        self.trie_next = NULL
        self.trie_lo = NULL
        self.trie_hi = NULL
        self.trie_below = NULL
        self.trie_dlo = NULL
        self.trie_dhi = NULL
        self.trie_u8ok = NULL
        self.trie_span = NULL
        self.trie_parent = NULL
        self.rank_node = NULL
        self.trie_cstart = NULL
        self.trie_cnode = NULL
        self.trie_cbyte = NULL
        self.tok_chars = NULL
        self.ordinary_bits = NULL
        self.stop_ids = NULL

    def __init__(self, list decoded, int vocab_size, ordinary_sorted_ids, stop_ids):
        """`decoded`: bytes per token id; `ordinary_sorted_ids`: ordinary ids sorted by their bytes."""
        cdef cnp.ndarray[cnp.int64_t, ndim=1] off = np.zeros(len(decoded) + 1, dtype=np.int64)
        cdef bytes blob = b"".join(decoded)
        cdef int64_t acc = 0
        cdef Py_ssize_t i
        for i in range(len(decoded)):
            acc += len(<bytes>decoded[i])
            off[i + 1] = acc
        self._keep = (blob, off)
        self.tok_data = <const uint8_t*><const char*>blob
        self.tok_off = <const int64_t*>cnp.PyArray_DATA(off)
        self.vocab_size = vocab_size
        self.n_tokens = len(decoded)
        self.n_words = (vocab_size + 63) // 64
        ids = np.ascontiguousarray(ordinary_sorted_ids, dtype=np.int32)
        self.n_ordinary = len(ids)
        self.rank_token = <int32_t*>malloc(max(1, self.n_ordinary) * sizeof(int32_t))
        self.token_rank = <int32_t*>malloc(max(1, vocab_size) * sizeof(int32_t))
        self.ordinary_bits = <uint64_t*>calloc(max(1, self.n_words), sizeof(uint64_t))
        stops = np.ascontiguousarray(stop_ids, dtype=np.int32)
        self.n_stop = len(stops)
        self.stop_ids = <int32_t*>malloc(max(1, self.n_stop) * sizeof(int32_t))
        if self.rank_token == NULL or self.token_rank == NULL or self.ordinary_bits == NULL or self.stop_ids == NULL:
            raise MemoryError()
        cdef int32_t[::1] idv = ids
        cdef int32_t t
        for i in range(vocab_size):
            self.token_rank[i] = -1
        for i in range(self.n_ordinary):
            t = idv[i]
            self.rank_token[i] = t
            self.token_rank[t] = i
            self.ordinary_bits[t >> 6] |= (<uint64_t>1) << (t & 63)
        cdef int32_t[::1] sv = stops
        for i in range(self.n_stop):
            self.stop_ids[i] = sv[i]
        self._build_trie()
        self.tok_chars = <uint8_t*>calloc(max(1, self.c.vocab_size), 1)
        if self.tok_chars == NULL:
            raise MemoryError()
        cdef int32_t n_chars
        cdef int64_t j
        for t in range(min(self.n_tokens, self.c.vocab_size)):     # padding ids have no bytes
            n_chars = 0
            for j in range(self.c.tok_off[t], self.c.tok_off[t + 1]):
                if (self.c.tok_data[j] & 0xC0) != 0x80:
                    n_chars += 1
            self.tok_chars[t] = <uint8_t>min(n_chars, 255)
        self.c.tok_chars = self.tok_chars

    cdef void _build_trie(self):
        cdef int64_t total = 0
        cdef int32_t r, t, d, lcp, plen, length, n = 0, sp = 0
        cdef const uint8_t* cur
        cdef const uint8_t* prev = NULL
        for r in range(self.n_ordinary):
            t = self.rank_token[r]
            total += self.tok_off[t + 1] - self.tok_off[t]
        total += 1
        self.trie_byte = <uint8_t*>malloc(total * sizeof(uint8_t))
        self.trie_depth = <int32_t*>malloc(total * sizeof(int32_t))
        self.trie_next = <int32_t*>malloc(total * sizeof(int32_t))
        self.trie_lo = <int32_t*>malloc(total * sizeof(int32_t))
        self.trie_hi = <int32_t*>malloc(total * sizeof(int32_t))
        cdef int32_t* stack = <int32_t*>malloc((MAX_TOKEN_BYTES + 1) * sizeof(int32_t))
        if (self.trie_byte == NULL or self.trie_depth == NULL or self.trie_next == NULL or
                self.trie_lo == NULL or self.trie_hi == NULL or stack == NULL):
            free(stack)
            raise MemoryError()
        plen = 0
        self.max_depth = 0
        for r in range(self.n_ordinary):
            t = self.rank_token[r]
            cur = self.tok_data + self.tok_off[t]
            length = <int32_t>(self.tok_off[t + 1] - self.tok_off[t])
            if length > MAX_TOKEN_BYTES:
                free(stack)
                raise ValueError(f"token {t} is longer than {MAX_TOKEN_BYTES} bytes")
            lcp = 0
            while lcp < length and lcp < plen and cur[lcp] == prev[lcp]:
                lcp += 1
            # Close the nodes deeper than the shared prefix.
            while sp > lcp:
                sp -= 1
                self.trie_next[stack[sp]] = n
            for d in range(lcp, length):
                self.trie_byte[n] = cur[d]
                self.trie_depth[n] = d + 1
                self.trie_lo[n] = 0
                self.trie_hi[n] = 0
                stack[sp] = n
                sp += 1
                n += 1
            if length > self.max_depth:
                self.max_depth = length
            d = stack[length - 1]
            if self.trie_hi[d] == 0 and self.trie_lo[d] == 0:
                self.trie_lo[d] = r
            self.trie_hi[d] = r + 1
            prev = cur
            plen = length
        while sp > 0:
            sp -= 1
            self.trie_next[stack[sp]] = n
        self.n_trie = n
        free(stack)
        self.c.vocab_size = self.vocab_size
        self.c.n_ordinary = self.n_ordinary
        self.c.n_trie = self.n_trie
        self.c.max_depth = self.max_depth
        self.c.n_words = self.n_words
        self.c.tok_data = self.tok_data
        self.c.tok_off = self.tok_off
        self.c.rank_token = self.rank_token
        self.c.token_rank = self.token_rank
        self.c.trie_byte = self.trie_byte
        self.c.trie_depth = self.trie_depth
        self.c.trie_next = self.trie_next
        self.c.trie_lo = self.trie_lo
        self.c.trie_hi = self.trie_hi
        self._build_subtrees()
        self.c.trie_below = self.trie_below
        self.c.trie_dlo = self.trie_dlo
        self.c.trie_dhi = self.trie_dhi
        self.c.trie_parent = self.trie_parent
        self.c.rank_node = self.rank_node
        self.c.trie.n = self.n_trie
        self.c.trie.byte = self.trie_byte
        self.c.trie.depth = self.trie_depth
        self.c.trie.next = self.trie_next
        self.c.trie.lo = self.trie_lo
        self.c.trie.hi = self.trie_hi
        self.c.trie.dlo = self.trie_dlo
        self.c.trie.dhi = self.trie_dhi
        self.c.trie.below = self.trie_below
        self.c.trie.toks = self.rank_token
        self.c.trie.u8ok = self.trie_u8ok
        self.c.trie.cstart = self.trie_cstart
        self.c.trie.cnode = self.trie_cnode
        self.c.trie.cbyte = self.trie_cbyte
        self.trie_span = <int32_t*>calloc(max(1, self.n_trie), sizeof(int32_t))
        if self.trie_span == NULL:
            raise MemoryError()
        _bytes_below(&self.c.trie, self.trie_span)
        self.c.trie.span = self.trie_span
        _root_children(&self.c.trie)
        self.c.ordinary_bits = self.ordinary_bits
        self.c.stop_ids = self.stop_ids
        self.c.n_stop = self.n_stop

    cdef void _build_subtrees(self):
        """Per trie node: the bytes below it and the rank range of the tokens below it.

        A walk whose state loops on every byte below a node accepts that whole subtree at once.
        """
        cdef int32_t n = self.n_trie, i, par, d, w
        cdef int32_t* parent_at = <int32_t*>malloc((self.max_depth + 2) * sizeof(int32_t))
        cdef int32_t* parent = <int32_t*>malloc(max(1, n) * sizeof(int32_t))
        self.trie_below = <uint64_t*>calloc(max(1, n) * 4, sizeof(uint64_t))
        self.trie_dlo = <int32_t*>malloc(max(1, n) * sizeof(int32_t))
        self.trie_dhi = <int32_t*>malloc(max(1, n) * sizeof(int32_t))
        if (parent_at == NULL or parent == NULL or self.trie_below == NULL or self.trie_dlo == NULL
                or self.trie_dhi == NULL):
            free(parent_at)
            free(parent)
            raise MemoryError()
        for i in range(n):
            d = self.trie_depth[i]
            parent[i] = parent_at[d - 1] if d > 1 else -1
            parent_at[d] = i
            self.trie_dlo[i] = 0x7FFFFFFF
            self.trie_dhi[i] = -1
        i = n
        while i > 0:
            i -= 1
            par = parent[i]
            if par < 0:
                continue
            for w in range(4):
                self.trie_below[par * 4 + w] |= self.trie_below[i * 4 + w]
            self.trie_below[par * 4 + (self.trie_byte[i] >> 6)] |= (<uint64_t>1) << (self.trie_byte[i] & 63)
            if self.trie_hi[i] > self.trie_lo[i]:
                self.trie_dlo[par] = min(self.trie_dlo[par], self.trie_lo[i])
                self.trie_dhi[par] = max(self.trie_dhi[par], self.trie_hi[i])
            if self.trie_dhi[i] >= 0:
                self.trie_dlo[par] = min(self.trie_dlo[par], self.trie_dlo[i])
                self.trie_dhi[par] = max(self.trie_dhi[par], self.trie_dhi[i])
        for i in range(n):
            if self.trie_dhi[i] < 0:
                self.trie_dlo[i] = 0
                self.trie_dhi[i] = 0
        self.trie_u8ok = <uint8_t*>malloc(max(1, n))
        if self.trie_u8ok == NULL:
            free(parent_at)
            free(parent)
            raise MemoryError()
        _u8_subtrees(n, self.trie_byte, parent, self.trie_u8ok, U8)
        free(parent_at)
        self.trie_parent = parent
        # Children by node (CSR): a walk below a node with few ways on finds them by search.
        self.trie_cstart = <int32_t*>calloc(n + 2, sizeof(int32_t))
        self.trie_cnode = <int32_t*>malloc(max(1, n) * sizeof(int32_t))
        self.trie_cbyte = <uint8_t*>malloc(max(1, n))
        if self.trie_cstart == NULL or self.trie_cnode == NULL or self.trie_cbyte == NULL:
            raise MemoryError()
        for i in range(n):
            if parent[i] >= 0:
                self.trie_cstart[parent[i] + 2] += 1
        for i in range(n):
            self.trie_cstart[i + 2] += self.trie_cstart[i + 1]
        for i in range(n):          # children come in index order, which is byte order
            if parent[i] >= 0:
                w = self.trie_cstart[parent[i] + 1]
                self.trie_cnode[w] = i
                self.trie_cbyte[w] = self.trie_byte[i]
                self.trie_cstart[parent[i] + 1] = w + 1
        self.rank_node = <int32_t*>malloc(max(1, self.n_ordinary) * sizeof(int32_t))
        if self.rank_node == NULL:
            raise MemoryError()
        for i in range(n):
            for w in range(self.trie_lo[i], self.trie_hi[i]):
                self.rank_node[w] = i

    @property
    def token_sample(self):
        """Every 64th ordinary token in byte order (distinct bytes), for cheap estimates."""
        if self._sample is None:
            self._sample = [self.token_bytes(self.rank_token[r]) for r in range(0, self.n_ordinary, 64)]
        return self._sample

    cdef int32_t* take_scratch(self) noexcept nogil:
        """Four vocabulary-sized buffers and a vocabulary bitset for one entry build (NULL: out of
        memory). Grammars share them, so a compiled grammar costs no per-vocabulary memory beyond
        its entries."""
        cdef int32_t* buf = NULL
        PyThread_acquire_lock(self.scratch_lock, WAIT_LOCK)
        if self.n_free_scratch > 0:
            self.n_free_scratch -= 1
            buf = self.free_scratch[self.n_free_scratch]
        PyThread_release_lock(self.scratch_lock)
        if buf == NULL:
            buf = <int32_t*>malloc((4 * max(1, self.n_ordinary) + 2 * self.n_words + 2) * sizeof(int32_t))
        return buf

    cdef void give_scratch(self, int32_t* buf) noexcept nogil:
        PyThread_acquire_lock(self.scratch_lock, WAIT_LOCK)
        if self.n_free_scratch < MAX_FREE_SCRATCH:
            self.free_scratch[self.n_free_scratch] = buf
            self.n_free_scratch += 1
            buf = NULL
        PyThread_release_lock(self.scratch_lock)
        free(buf)

    def token_bytes(self, int32_t t):
        return self.tok_data[self.tok_off[t]:self.tok_off[t + 1]]

    def __dealloc__(self):
        cdef int32_t i
        for i in range(self.n_free_scratch):
            free(self.free_scratch[i])
        if self.scratch_lock != NULL:
            PyThread_free_lock(self.scratch_lock)
        free(self.rank_token)
        free(self.token_rank)
        free(self.trie_byte)
        free(self.trie_depth)
        free(self.trie_next)
        free(self.trie_lo)
        free(self.trie_hi)
        free(self.trie_below)
        free(self.trie_dlo)
        free(self.trie_dhi)
        free(self.trie_u8ok)
        free(self.trie_span)
        free(self.trie_parent)
        free(self.rank_node)
        free(self.trie_cstart)
        free(self.trie_cnode)
        free(self.trie_cbyte)
        free(self.tok_chars)
        free(self.ordinary_bits)
        free(self.stop_ids)


cdef void _class_u8_table(const uint8_t* cmap, int8_t (*out)[256]) noexcept nogil:
    """out[q][c]: the decoder step shared by every byte of class c from state q, else -1."""
    cdef bint seen[256]
    cdef int b, q, c
    for c in range(256):
        seen[c] = False
    for b in range(256):
        c = cmap[b]
        for q in range(U8_STATES):
            if not seen[c]:
                out[q][c] = U8[q][b]
            elif out[q][c] != U8[q][b]:
                out[q][c] = -1
        seen[c] = True


cdef class ClassTrie:
    """The vocabulary trie with bytes replaced by a grammar's byte classes.

    Bytes that no edge of a grammar tells apart behave the same in every parser state, so tokens
    whose class sequences are equal share one path. For most grammars this trie is 2 to 100 times
    smaller than the byte trie, and mask-entry walks visit it instead.
    """
    cdef readonly int32_t n_nodes
    cdef TrieC t
    cdef uint8_t* byte
    cdef int32_t* depth
    cdef int32_t* next
    cdef int32_t* lo
    cdef int32_t* hi
    cdef int32_t* dlo
    cdef int32_t* dhi
    cdef uint64_t* below
    cdef int32_t* toks
    cdef uint8_t* u8ok
    cdef int32_t* span

    def __cinit__(self):
        self.u8ok = NULL
        self.span = NULL
        self.byte = NULL
        self.depth = NULL
        self.next = NULL
        self.lo = NULL
        self.hi = NULL
        self.dlo = NULL
        self.dhi = NULL
        self.below = NULL
        self.toks = NULL

    def __init__(self, Vocab vocab, const uint8_t[::1] classmap):
        if classmap.shape[0] != 256:
            raise ValueError("classmap must have 256 entries")
        if self._build(&vocab.c, &classmap[0]) < 0:
            raise MemoryError()

    def __dealloc__(self):
        free(self.byte)
        free(self.depth)
        free(self.next)
        free(self.lo)
        free(self.hi)
        free(self.dlo)
        free(self.dhi)
        free(self.below)
        free(self.toks)
        free(self.u8ok)
        free(self.span)

    cdef int _build(self, VocabC* v, const uint8_t* cmap) noexcept nogil:
        """Map every byte-trie node to a class-trie node (children kept in sorted sibling lists,
        short for coarse classes), then lay the class trie out in pre-order."""
        cdef const TrieC* bt = &v.trie
        cdef int32_t nb = bt.n, cap = nb + 1, i, d, c, nc = 1, par, j, k, r, x, prev, top
        cdef int8_t u8c[U8_STATES][256]
        cdef int rc = -1
        cdef int32_t* cmap_node = <int32_t*>malloc(cap * sizeof(int32_t))
        cdef int32_t* cpar = <int32_t*>malloc(cap * sizeof(int32_t))
        cdef int32_t* first = <int32_t*>malloc(cap * sizeof(int32_t))
        cdef int32_t* sibling = <int32_t*>malloc(cap * sizeof(int32_t))
        cdef uint8_t* ccls = <uint8_t*>malloc(cap * sizeof(uint8_t))
        cdef uint8_t* crep = <uint8_t*>malloc(cap * sizeof(uint8_t))
        cdef int32_t* ccount = <int32_t*>malloc(cap * sizeof(int32_t))
        cdef int32_t* stack = <int32_t*>malloc((v.max_depth + 2) * sizeof(int32_t))
        cdef int32_t* pre = NULL
        cdef int32_t* order = NULL
        cdef int32_t* dfs = NULL
        cdef int32_t* tok_start = NULL
        if (cmap_node == NULL or cpar == NULL or first == NULL or sibling == NULL or ccls == NULL
                or crep == NULL or ccount == NULL or stack == NULL):
            return self._free_scratch(cmap_node, cpar, first, sibling, ccls, crep, ccount, stack, pre, order,
                                      dfs, tok_start, -1)
        cpar[0] = -1
        first[0] = -1
        ccount[0] = 0
        stack[0] = 0
        for i in range(nb):
            d = bt.depth[i]
            par = stack[d - 1]
            c = cmap[bt.byte[i]]
            prev = -1
            x = first[par]
            while x >= 0 and ccls[x] < c:
                prev = x
                x = sibling[x]
            if x < 0 or ccls[x] != c:
                cpar[nc] = par
                ccls[nc] = <uint8_t>c
                crep[nc] = bt.byte[i]
                first[nc] = -1
                ccount[nc] = 0
                sibling[nc] = x
                if prev < 0:
                    first[par] = nc
                else:
                    sibling[prev] = nc
                x = nc
                nc += 1
            stack[d] = x
            cmap_node[i] = x
            ccount[x] += bt.hi[i] - bt.lo[i]
        pre = <int32_t*>malloc(nc * sizeof(int32_t))
        order = <int32_t*>malloc(nc * sizeof(int32_t))
        dfs = <int32_t*>malloc((nc + 1) * sizeof(int32_t))
        tok_start = <int32_t*>malloc((nc + 1) * sizeof(int32_t))
        self.byte = <uint8_t*>malloc(nc * sizeof(uint8_t))
        self.depth = <int32_t*>malloc(nc * sizeof(int32_t))
        self.next = <int32_t*>malloc(nc * sizeof(int32_t))
        self.lo = <int32_t*>malloc(nc * sizeof(int32_t))
        self.hi = <int32_t*>malloc(nc * sizeof(int32_t))
        self.dlo = <int32_t*>malloc(nc * sizeof(int32_t))
        self.dhi = <int32_t*>malloc(nc * sizeof(int32_t))
        self.below = <uint64_t*>calloc(nc * 4, sizeof(uint64_t))
        self.toks = <int32_t*>malloc(max(1, v.n_ordinary) * sizeof(int32_t))
        if not (pre == NULL or order == NULL or dfs == NULL or tok_start == NULL or self.byte == NULL
                or self.depth == NULL or self.next == NULL or self.lo == NULL or self.hi == NULL
                or self.dlo == NULL or self.dhi == NULL or self.below == NULL or self.toks == NULL):
            # Pre-order over the non-root nodes (children in class order).
            top = 0
            self.n_nodes = 0
            x = first[0]
            while x >= 0:
                dfs[top] = x
                top += 1
                x = sibling[x]
            # reverse the root's children on the stack so the smallest class is popped first
            j = 0
            k = top - 1
            while j < k:
                dfs[j], dfs[k] = dfs[k], dfs[j]
                j += 1
                k -= 1
            while top > 0:
                top -= 1
                x = dfs[top]
                pre[x] = self.n_nodes
                order[self.n_nodes] = x
                self.n_nodes += 1
                r = top
                c = first[x]
                while c >= 0:
                    dfs[top] = c
                    top += 1
                    c = sibling[c]
                j = r
                k = top - 1
                while j < k:
                    dfs[j], dfs[k] = dfs[k], dfs[j]
                    j += 1
                    k -= 1
            nc = self.n_nodes
            tok_start[0] = 0
            for j in range(nc):
                x = order[j]
                self.byte[j] = crep[x]
                self.depth[j] = 1 if cpar[x] == 0 else self.depth[pre[cpar[x]]] + 1
                tok_start[j + 1] = tok_start[j] + ccount[x]
                self.lo[j] = tok_start[j]
                self.hi[j] = tok_start[j + 1]
                self.next[j] = j + 1
            j = nc
            while j > 0:
                j -= 1
                x = order[j]
                if cpar[x] != 0:
                    k = pre[cpar[x]]
                    if self.next[j] > self.next[k]:
                        self.next[k] = self.next[j]
                    for r in range(4):
                        self.below[k * 4 + r] |= self.below[j * 4 + r]
                    self.below[k * 4 + (self.byte[j] >> 6)] |= (<uint64_t>1) << (self.byte[j] & 63)
            for j in range(nc):
                self.dlo[j] = self.hi[j]
                self.dhi[j] = tok_start[self.next[j]]
            # Tokens grouped by class node in pre-order (tok_start is reused as a fill cursor).
            for i in range(nb):
                j = pre[cmap_node[i]]
                for r in range(bt.lo[i], bt.hi[i]):
                    self.toks[tok_start[j]] = bt.toks[r]
                    tok_start[j] += 1
            self.t.n = nc
            self.t.byte = self.byte
            self.t.depth = self.depth
            self.t.next = self.next
            self.t.lo = self.lo
            self.t.hi = self.hi
            self.t.dlo = self.dlo
            self.t.dhi = self.dhi
            self.t.below = self.below
            self.t.toks = self.toks
            # UTF-8 structure on class paths: a class steps the decoder only where all its bytes agree.
            self.u8ok = <uint8_t*>calloc(max(1, nc), 1)
            if self.u8ok != NULL:
                _class_u8_table(cmap, u8c)
                for j in range(nc):
                    x = order[j]
                    dfs[j] = pre[cpar[x]] if cpar[x] != 0 else -1
                    crep[j] = ccls[x]
                _u8_subtrees(nc, crep, dfs, self.u8ok, u8c)
                self.t.u8ok = self.u8ok
                self.span = <int32_t*>calloc(max(1, nc), sizeof(int32_t))
                if self.span != NULL:
                    _bytes_below(&self.t, self.span)
                    self.t.span = self.span
                    _root_children(&self.t)
                    rc = 0
        return self._free_scratch(cmap_node, cpar, first, sibling, ccls, crep, ccount, stack, pre, order, dfs,
                                  tok_start, rc)

    cdef int _free_scratch(self, void* a, void* b, void* c, void* d, void* e, void* f, void* g, void* h,
                           void* i, void* j, void* k, void* l, int rc) noexcept nogil:
        free(a)
        free(b)
        free(c)
        free(d)
        free(e)
        free(f)
        free(g)
        free(h)
        free(i)
        free(j)
        free(k)
        free(l)
        return rc


# ---------------------------------------------------------------------------------------------
# Mask entries: accepted / rejected / uncertain tokens of one scannable node, stored adaptively
# ---------------------------------------------------------------------------------------------

cdef enum:
    ENTRY_ACCEPTED_LIST = 0     # list = accepted token ids
    ENTRY_REJECTED_LIST = 1     # list = ordinary ids that are not accepted (rejected or uncertain)
    ENTRY_BITSET = 2            # bits = accepted ids

cdef struct MaskEntry:
    int32_t kind
    int32_t n_list
    int32_t* list
    uint64_t* bits
    int32_t n_unc
    int32_t* unc_ranks          # uncertain tokens as ranks in byte order (sorted)
    # What the rule's automaton alone decides (paper §3.3), for reuse under another lookahead:
    # "open" tokens pass a point where the rule may end and are not read whole inside it; every
    # other token is accepted (read inside the rule) or rejected whatever follows the rule.
    int32_t open_all            # the rule may end at the node itself: every token not read inside is open
    int32_t n_open
    int32_t* open_ranks         # otherwise the open tokens, as sorted ranks
    int32_t n_ctx_acc
    int32_t* ctx_acc_ranks      # accepted only through the certain contexts (open ones), sorted ranks
    int64_t nbytes
    int refs                    # holders: the pool, compiled grammars (see entry_release)


cdef void entry_free(MaskEntry* e) noexcept nogil:
    if e != NULL:
        free(e.list)
        free(e.bits)
        free(e.unc_ranks)
        free(e.open_ranks)
        free(e.ctx_acc_ranks)
        free(e)


cdef const void* _ptr(dict keep, str name, dtype) except NULL:
    cdef cnp.ndarray a = keep[name]
    if a.dtype != dtype or not a.flags.c_contiguous:
        a = np.ascontiguousarray(a, dtype=dtype)
        keep[name] = a
    if a.size == 0:
        a = np.zeros(1, dtype=dtype)
        keep[name] = a
    return cnp.PyArray_DATA(a)


cdef int64_t entry_nbytes(const MaskEntry* e, int32_t n_words) noexcept nogil:
    cdef int64_t n = sizeof(MaskEntry) + (<int64_t>e.n_unc + e.n_open + e.n_ctx_acc) * 4
    if e.kind == ENTRY_BITSET:
        return n + <int64_t>n_words * 8
    return n + <int64_t>e.n_list * 4


cdef inline int64_t _push(int32_t* buf, int64_t n, int32_t lo, int32_t hi) noexcept nogil:
    """Append the trie positions [lo, hi) to buf (n entries so far); the new count."""
    cdef int32_t r
    for r in range(lo, hi):
        buf[n] = r
        n += 1
    return n


cdef inline int64_t _push_short(int32_t* buf, int64_t n, int32_t lo, int32_t hi, const int32_t* toks,
                                const uint8_t* chars, int32_t most) noexcept nogil:
    """Append the trie positions in [lo, hi) whose tokens start at most `most` characters."""
    cdef int32_t p
    for p in range(lo, hi):
        if chars[toks[p]] <= most:
            buf[n] = p
            n += 1
    return n


cdef inline void _all_but(uint64_t* out, const VocabC* v, const MaskEntry* e) noexcept nogil:
    """Into `out`: the ordinary tokens but those a rejected-list entry lists."""
    cdef int32_t j, t
    memcpy(out, v.ordinary_bits, v.n_words * sizeof(uint64_t))
    for j in range(e.n_list):
        t = e.list[j]
        out[t >> 6] &= ~((<uint64_t>1) << (t & 63))


cdef inline bint _as_list(int64_t n, int32_t n_words) noexcept nogil:
    """Whether an entry keeps n ids as a list rather than a bitset: while the list is at most half
    the bitset's size. A fill sets or clears a listed id at a time but copies a bitset by words, so
    a longer list would save memory and cost time on every fill."""
    return n <= n_words


cdef int _donor_own_tokens(const MaskEntry* d, VocabC* v, int32_t* out, uint64_t* scratch,
                           int64_t* n_out) noexcept nogil:
    """Append (as ranks) the tokens the donor accepts inside the rule itself: its accepted tokens
    but those it accepted through its certain contexts."""
    cdef int32_t WR = (v.n_ordinary + 63) // 64, j, t, r
    cdef int64_t n = 0
    memset(scratch, 0, WR * sizeof(uint64_t))
    for j in range(d.n_ctx_acc):
        r = d.ctx_acc_ranks[j]
        scratch[r >> 6] |= (<uint64_t>1) << (r & 63)
    if d.kind == ENTRY_ACCEPTED_LIST:
        for j in range(d.n_list):
            r = v.token_rank[d.list[j]]
            if not (scratch[r >> 6] >> (r & 63)) & 1:
                out[n] = r
                n += 1
    else:
        if d.kind == ENTRY_REJECTED_LIST:    # mark the rejected ones too, then take the rest
            for j in range(d.n_list):
                r = v.token_rank[d.list[j]]
                scratch[r >> 6] |= (<uint64_t>1) << (r & 63)
        for r in range(v.n_ordinary):
            if (scratch[r >> 6] >> (r & 63)) & 1:
                continue
            t = v.rank_token[r]
            if d.kind == ENTRY_BITSET and not (d.bits[t >> 6] >> (t & 63)) & 1:
                continue
            out[n] = r
            n += 1
    n_out[0] += n
    return 0


cdef bytes _entry_to_bytes(const MaskEntry* e, int32_t n_words):
    """Compact little-endian form: a header of 8 int32, then the list or bitset, the uncertain,
    open and context-accepted ranks."""
    head = np.array([_ENTRY_MAGIC, e.kind, e.n_list, e.n_unc, e.open_all, e.n_open, e.n_ctx_acc,
                     n_words if e.kind == ENTRY_BITSET else 0], dtype="<i4")
    parts = [head.tobytes()]
    if e.kind == ENTRY_BITSET:
        parts.append(np.asarray(<uint64_t[:n_words]>e.bits).astype("<u8").tobytes())
    elif e.n_list:
        parts.append(np.asarray(<int32_t[:e.n_list]>e.list).astype("<i4").tobytes())
    for n, ptr in ((e.n_unc, 0), (e.n_open, 1), (e.n_ctx_acc, 2)):
        if n:
            parts.append(np.asarray(<int32_t[:n]>(e.unc_ranks if ptr == 0 else
                                                   e.open_ranks if ptr == 1 else e.ctx_acc_ranks))
                         .astype("<i4").tobytes())
    return b"".join(parts)


cdef int32_t* _ranks_in(const char* p, int32_t n, int32_t limit) except NULL:
    """A copy of n sorted, distinct ranks below `limit` (ValueError otherwise)."""
    cdef int32_t* out = <int32_t*>malloc(max(1, n) * sizeof(int32_t))
    cdef int32_t i
    if out == NULL:
        raise MemoryError()
    if n:
        memcpy(out, p, n * sizeof(int32_t))
    for i in range(n):
        if out[i] < 0 or out[i] >= limit or (i and out[i] <= out[i - 1]):
            free(out)
            raise ValueError("mask entry: ranks out of range or unsorted")
    return out


cdef MaskEntry* _entry_from_bytes(bytes data, Vocab vocab) except NULL:
    """Read `_entry_to_bytes` output for `vocab` (one reference for the caller); ValueError when it
    is malformed or out of range (the bytes may come from another process). Plain C: a grammar read
    from the cache shards brings dozens of entries, and this runs before its first mask."""
    cdef const char* p = data
    cdef Py_ssize_t size = len(data)
    cdef int32_t h[8]
    cdef int32_t magic, kind, n_list, n_unc, open_all, n_open, n_ctx, n_words, i, t
    cdef Py_ssize_t body, off
    cdef uint64_t* ordinary = vocab.c.ordinary_bits
    cdef MaskEntry* e
    if not _LITTLE_ENDIAN:
        raise ValueError("mask entries are read on little-endian machines only")
    if size < 32:
        raise ValueError("mask entry: truncated header")
    memcpy(h, p, 32)
    magic, kind, n_list, n_unc, open_all, n_open, n_ctx, n_words = h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]
    if magic != _ENTRY_MAGIC or kind < 0 or kind > 2 or n_list < 0 or n_unc < 0 or n_open < 0 or n_ctx < 0:
        raise ValueError("mask entry: bad header")
    if kind == ENTRY_BITSET and n_words != vocab.n_words:
        raise ValueError("mask entry: bitset of another vocabulary size")
    body = <Py_ssize_t>n_words * 8 if kind == ENTRY_BITSET else <Py_ssize_t>n_list * 4
    if size != 32 + body + 4 * (<Py_ssize_t>n_unc + n_open + n_ctx):
        raise ValueError("mask entry: length does not match its header")
    e = <MaskEntry*>calloc(1, sizeof(MaskEntry))
    if e == NULL:
        raise MemoryError()
    e.refs = 1
    try:
        e.kind, e.n_list, e.n_unc, e.open_all, e.n_open, e.n_ctx_acc = kind, n_list, n_unc, open_all != 0, n_open, n_ctx
        off = 32
        # Entries name ordinary tokens only: a special or stop token in one would be let through.
        if kind == ENTRY_BITSET:
            e.bits = <uint64_t*>malloc(max(1, body))
            if e.bits == NULL:
                raise MemoryError()
            memcpy(e.bits, p + off, body)
            for i in range(n_words):
                if e.bits[i] & ~ordinary[i]:
                    raise ValueError("mask entry: a token that is not ordinary")
        else:
            e.list = <int32_t*>malloc(max(1, body))
            if e.list == NULL:
                raise MemoryError()
            memcpy(e.list, p + off, body)
            for i in range(n_list):
                t = e.list[i]
                if t < 0 or t >= vocab.vocab_size:
                    raise ValueError("mask entry: token id out of range")
                if not (ordinary[t >> 6] >> (t & 63)) & 1:
                    raise ValueError("mask entry: a token that is not ordinary")
        off += body
        e.unc_ranks = _ranks_in(p + off, n_unc, vocab.n_ordinary)
        off += 4 * n_unc
        e.open_ranks = _ranks_in(p + off, n_open, vocab.n_ordinary)
        off += 4 * n_open
        e.ctx_acc_ranks = _ranks_in(p + off, n_ctx, vocab.n_ordinary)
    except (MemoryError, ValueError):
        entry_free(e)
        raise
    e.nbytes = entry_nbytes(e, vocab.n_words)
    return e


_LITTLE_ENDIAN = sys.byteorder == "little"


cdef int32_t _ENTRY_MAGIC = 0x45324758   # "XG2E"


include "pool.pxi"


cdef class CompiledCore:
    """Flat grammar tables plus the lazily built mask entries, one per scannable node."""
    cdef GrammarC g
    cdef object _arrays
    cdef readonly Vocab vocab
    cdef VocabC* vc
    cdef const TrieC* trie            # the trie mask-entry walks visit (byte trie or class trie)
    cdef object _class_trie
    cdef uint64_t* rank_bits
    cdef readonly int32_t root_rule
    cdef MaskEntry** entries
    cdef PyThread_type_lock lock
    cdef int lock_waiters             # threads waiting in get_entry for the lock (see precompute)
    cdef Parser pa
    cdef Parser pb
    cdef Parser pc[MAX_RESUMES]
    cdef Memo memo
    cdef int32_t* acc_buf
    cdef int32_t* unc_buf
    cdef int32_t* dstate
    cdef uint64_t* node_loop          # 4 words per node: bytes on which a pure node loops to itself
    cdef uint64_t* node_text          # 2 words per node: ASCII bytes that leave a "text" node; see _text_node
    cdef uint8_t* node_textual
    cdef int32_t* node_chain          # per node: text characters a chain of nodes reads (see _chain_nodes)
    cdef uint8_t* node_closed         # per node: its chain ends where no character can follow (see _chain_nodes)
    cdef int32_t* pchars              # walk scratch, per depth: characters the path has started
    cdef int32_t* aid
    cdef int32_t* bid
    cdef int32_t* cids
    cdef uint8_t* topa                # per depth: the rule completed there (A's top item)
    cdef int32_t c_done[MAX_RESUMES]  # per certain parser: depth its ids are valid to
    cdef uint8_t* pbyte
    cdef int64_t n_acc
    cdef int64_t n_unc
    cdef int32_t* open_buf            # walk scratch: open tokens (positions in the walked trie)
    cdef int32_t* cacc_buf            # walk scratch: tokens accepted through the certain contexts only
    cdef uint64_t* set_buf            # walk scratch: a vocabulary bitset
    cdef uint8_t* anytop              # per depth: the rule could end at some shallower depth
    cdef uint8_t* narrow              # per depth: only A's automaton edges lead on below (see _build_entry)
    cdef int32_t* tpar                # per depth: the walked trie position there
    cdef const TrieC* wtrie           # the trie of the walk in progress (its positions fill the buffers)
    cdef const MaskEntry* donor_acc   # a partial hit's donor whose accepted set the new entry starts from
    cdef int64_t n_open
    cdef int64_t n_cacc
    cdef bint open_all
    cdef readonly EntryPool _pool     # shared across grammars, or None
    cdef const uint8_t* rule_keys     # per rule: content key of its automaton (see hashing.py)
    cdef const uint8_t* ctx_keys      # per rule: key of what may follow it
    cdef const int32_t* node_canon    # per node: its number in its rule's canonical numbering
    cdef const uint8_t* rule_shared   # per rule: its entries go through the pool
    cdef readonly int64_t cache_bytes
    cdef readonly int64_t n_entries

    def __cinit__(self):
        self.entries = NULL
        self.acc_buf = NULL
        self.unc_buf = NULL
        self.rank_bits = NULL
        self.dstate = NULL
        self.node_loop = NULL
        self.node_text = NULL
        self.node_textual = NULL
        self.node_chain = NULL
        self.node_closed = NULL
        self.pchars = NULL
        self.aid = NULL
        self.bid = NULL
        self.cids = NULL
        self.topa = NULL
        self.pbyte = NULL
        self.open_buf = NULL
        self.cacc_buf = NULL
        self.anytop = NULL
        self.lock = NULL
        self.pa.items = NULL
        self.pb.items = NULL
        for j in range(MAX_RESUMES):
            self.pc[j].items = NULL
        self.memo.pool = NULL

    def __init__(self, Vocab vocab, dict arrays, int root_rule, ClassTrie class_trie=None, pool=None,
                 keys=None):
        """`pool` (an EntryPool) shares entries with other grammars; `keys` is then
        (rule keys, context keys, per-node canonical numbers), see hashing.grammar_keys."""
        self.vocab = vocab
        self._pool = pool
        self.vc = &vocab.c
        self._class_trie = class_trie
        self.trie = &class_trie.t if class_trie is not None else &vocab.c.trie
        self.root_rule = root_rule
        keep = {}
        for k, v in arrays.items():
            keep[k] = np.ascontiguousarray(v)
        if pool is not None:
            rule_keys, ctx_keys, node_canon = keys
            keep["_rule_keys"] = np.frombuffer(b"".join(rule_keys), np.uint8)
            keep["_ctx_keys"] = np.frombuffer(b"".join(ctx_keys), np.uint8)
            if not len(keep["_rule_keys"]) == len(keep["_ctx_keys"]) == RULE_KEY_BYTES * len(keep["rule_start"]):
                raise ValueError(f"rule and context keys are {RULE_KEY_BYTES} bytes, one per rule")
            # An all-zero context key marks a rule whose entries stay in this grammar (hashing.py).
            keep["_rule_shared"] = keep["_ctx_keys"].reshape(-1, RULE_KEY_BYTES).any(axis=1).astype(np.uint8)
            self.rule_shared = <const uint8_t*>_ptr(keep, "_rule_shared", np.uint8)
            keep["_node_canon"] = np.asarray(node_canon, dtype=np.int32)
            self.rule_keys = <const uint8_t*>_ptr(keep, "_rule_keys", np.uint8)
            self.ctx_keys = <const uint8_t*>_ptr(keep, "_ctx_keys", np.uint8)
            self.node_canon = <const int32_t*>_ptr(keep, "_node_canon", np.int32)
        self._arrays = keep
        self.g.n_nodes = len(keep["node_rule"])
        self.g.n_rules = len(keep["rule_start"])
        self.g.node_rule = <const int32_t*>_ptr(keep, "node_rule", np.int32)
        self.g.node_final = <const uint8_t*>_ptr(keep, "node_final", np.uint8)
        self.g.be_start = <const int32_t*>_ptr(keep, "be_start", np.int32)
        self.g.be_lo = <const uint8_t*>_ptr(keep, "be_lo", np.uint8)
        self.g.be_hi = <const uint8_t*>_ptr(keep, "be_hi", np.uint8)
        self.g.be_target = <const int32_t*>_ptr(keep, "be_target", np.int32)
        self.g.re_start = <const int32_t*>_ptr(keep, "re_start", np.int32)
        self.g.re_rule = <const int32_t*>_ptr(keep, "re_rule", np.int32)
        self.g.re_target = <const int32_t*>_ptr(keep, "re_target", np.int32)
        self.g.rule_start = <const int32_t*>_ptr(keep, "rule_start", np.int32)
        self.g.rule_nullable = <const uint8_t*>_ptr(keep, "rule_nullable", np.uint8)
        self.g.ctx_start = <const int32_t*>_ptr(keep, "ctx_start", np.int32)
        self.g.ctx_item = <const uint64_t*>_ptr(keep, "ctx_item", np.uint64)
        self.g.node_pure = <const uint8_t*>_ptr(keep, "node_pure", np.uint8)
        self.g.ctx_resume = <const int32_t*>_ptr(keep, "ctx_resume", np.int32)
        self.g.rule_follow = <const uint8_t*>_ptr(keep, "rule_follow", np.uint8)
        self.entries = <MaskEntry**>calloc(max(1, self.g.n_nodes), sizeof(MaskEntry*))
        self.lock = PyThread_allocate_lock()
        self.rank_bits = <uint64_t*>malloc(max(1, (vocab.n_ordinary + 63) // 64) * sizeof(uint64_t))
        self.dstate = <int32_t*>malloc((vocab.max_depth + 2) * sizeof(int32_t))
        self.aid = <int32_t*>malloc((vocab.max_depth + 2) * sizeof(int32_t))
        self.bid = <int32_t*>malloc((vocab.max_depth + 2) * sizeof(int32_t))
        self.cids = <int32_t*>malloc(MAX_RESUMES * (vocab.max_depth + 2) * sizeof(int32_t))
        self.topa = <uint8_t*>malloc((vocab.max_depth + 2) * sizeof(uint8_t))
        self.pbyte = <uint8_t*>malloc((vocab.max_depth + 2) * sizeof(uint8_t))
        self.anytop = <uint8_t*>malloc((vocab.max_depth + 2) * sizeof(uint8_t))
        self.narrow = <uint8_t*>malloc((vocab.max_depth + 2) * sizeof(uint8_t))
        self.tpar = <int32_t*>malloc((vocab.max_depth + 2) * sizeof(int32_t))
        if self.anytop == NULL or self.narrow == NULL or self.tpar == NULL:
            raise MemoryError()
        if (self.entries == NULL or self.lock == NULL
                or self.dstate == NULL or self.aid == NULL or self.bid == NULL or self.cids == NULL
                or self.topa == NULL
                or self.pbyte == NULL
                or self.rank_bits == NULL):
            raise MemoryError()
        if p_init(&self.pa) < 0 or p_init(&self.pb) < 0 or m_init(&self.memo) < 0:
            raise MemoryError()
        cdef int32_t j
        for j in range(MAX_RESUMES):
            if p_init(&self.pc[j]) < 0:
                raise MemoryError()
            self.pc[j].memo = &self.memo
        self.node_loop = <uint64_t*>calloc(max(1, self.g.n_nodes) * 4, sizeof(uint64_t))
        if self.node_loop == NULL:
            raise MemoryError()
        cdef int32_t nd, ke, b
        for nd in range(self.g.n_nodes):
            for ke in range(self.g.be_start[nd], self.g.be_start[nd + 1]):
                if self.g.be_target[ke] == nd:
                    for b in range(self.g.be_lo[ke], self.g.be_hi[ke] + 1):
                        self.node_loop[nd * 4 + (b >> 6)] |= (<uint64_t>1) << (b & 63)
        self.node_text = <uint64_t*>calloc(max(1, self.g.n_nodes) * 2, sizeof(uint64_t))
        self.node_textual = <uint8_t*>calloc(max(1, self.g.n_nodes), 1)
        if self.node_text == NULL or self.node_textual == NULL:
            raise MemoryError()
        for nd in range(self.g.n_nodes):
            if self.g.be_start[nd + 1] > self.g.be_start[nd]:
                self._text_node(nd)
        self.node_chain = <int32_t*>calloc(max(1, self.g.n_nodes), sizeof(int32_t))
        self.node_closed = <uint8_t*>calloc(max(1, self.g.n_nodes), 1)
        self.pchars = <int32_t*>calloc(vocab.max_depth + 2, sizeof(int32_t))
        if self.node_chain == NULL or self.node_closed == NULL or self.pchars == NULL:
            raise MemoryError()
        with nogil:
            self._chain_nodes()
        self.pa.memo = &self.memo
        self.pb.memo = &self.memo
        self.cache_bytes = 0
        self.n_entries = 0

    @property
    def heap_bytes(self) -> int:
        """What this core holds in C besides its tables and entries, at the capacity its parsers and
        transition memo have grown to (they grow while entries are built): the figure a cache
        budget must count, not a per-node guess."""
        cdef int64_t depth = self.vocab.max_depth + 2, total, j
        total = <int64_t>self.g.n_nodes * (sizeof(MaskEntry*) + 6 * sizeof(uint64_t) + 1 + sizeof(int32_t) + 1)
        total += ((self.vocab.n_ordinary + 63) // 64) * sizeof(uint64_t)
        total += depth * (4 * sizeof(int32_t) + MAX_RESUMES * sizeof(int32_t) + 4)
        total += _parser_bytes(&self.pa) + _parser_bytes(&self.pb)
        for j in range(MAX_RESUMES):
            total += _parser_bytes(&self.pc[j])
        total += _memo_bytes(&self.memo)
        return total

    def __dealloc__(self):
        cdef int32_t i
        if self.entries != NULL:
            for i in range(self.g.n_nodes):
                entry_release(self.entries[i])
        free(self.entries)
        free(self.anytop)
        free(self.narrow)
        free(self.tpar)
        if self.lock != NULL:
            PyThread_free_lock(self.lock)
        free(self.rank_bits)
        free(self.dstate)
        free(self.node_loop)
        free(self.node_text)
        free(self.node_textual)
        free(self.node_chain)
        free(self.node_closed)
        free(self.pchars)
        free(self.aid)
        free(self.bid)
        free(self.cids)
        free(self.topa)
        free(self.pbyte)
        if self.pa.items != NULL:
            p_free(&self.pa)
        if self.pb.items != NULL:
            p_free(&self.pb)
        for i in range(MAX_RESUMES):
            if self.pc[i].items != NULL:
                p_free(&self.pc[i])
        if self.memo.pool != NULL:
            m_free(&self.memo)

    cdef MaskEntry* get_entry(self, int32_t node) noexcept nogil:
        """A node's entry, built on first need. Fills on other threads read the table without the
        lock, so an entry is published with a release store and read with an acquire load: a
        reader that sees the pointer sees the entry's contents too."""
        cdef MaskEntry* e = <MaskEntry*>xg2_load_acquire(<void**>&self.entries[node])
        if e != NULL:
            return e
        xg2_ref_add(&self.lock_waiters)
        PyThread_acquire_lock(self.lock, WAIT_LOCK)
        xg2_ref_sub(&self.lock_waiters)
        e = self.entries[node]
        if e == NULL:
            e = self._obtain(node)
            if e != NULL:
                self.cache_bytes += e.nbytes
                self.n_entries += 1
                xg2_store_release(<void**>&self.entries[node], e)
        PyThread_release_lock(self.lock)
        return e

    cdef MaskEntry* _obtain(self, int32_t node) noexcept nogil:
        """The entry of a node from the pool (perfect hit), rebuilt from a pooled entry of the
        same automaton node under another lookahead (partial hit: only its open tokens are walked
        again), or built; with one reference for the core. Called with the core's lock held; NULL
        when out of memory."""
        cdef MaskEntry* e = NULL
        cdef MaskEntry* donor = NULL
        cdef int32_t r = self.g.node_rule[node]
        cdef int64_t n = max(1, self.vc.n_ordinary)
        cdef uint8_t key[KEY_BYTES]
        cdef bint with_donor
        cdef int32_t* scratch = self.vocab.take_scratch()
        if scratch == NULL:
            return NULL
        self.acc_buf, self.unc_buf = scratch, scratch + n
        self.open_buf, self.cacc_buf = scratch + 2 * n, scratch + 3 * n
        self.set_buf = <uint64_t*>(scratch + 4 * n)
        if self._pool is None or not self.rule_shared[r]:
            e = self._build_entry(node, NULL)
        else:
            self._pool_key(node, key)
            # What the rule reads inside and what it reads into its follow are not told apart
            # (see _chain_nodes): no partial hits either way.
            with_donor = not self.g.rule_follow[r]
            self._pool.lookup(key, with_donor, &e, &donor)
            if e == NULL:
                e = self._build_entry(node, donor)
                entry_release(donor)
                if e != NULL and self._pool.store(key, with_donor, e) < 0:
                    entry_release(e)
                    e = NULL
        self.acc_buf = self.unc_buf = self.open_buf = self.cacc_buf = NULL
        self.set_buf = NULL
        self.vocab.give_scratch(scratch)
        return e

    cdef void _pool_key(self, int32_t node, uint8_t* key) noexcept nogil:
        """A node's key in the entry pool: rule key, canonical node (little-endian), context key."""
        cdef int32_t r = self.g.node_rule[node], canon = self.node_canon[node]
        memcpy(key, self.rule_keys + <int64_t>r * RULE_KEY_BYTES, RULE_KEY_BYTES)
        key[16] = canon & 0xFF
        key[17] = (canon >> 8) & 0xFF
        key[18] = (canon >> 16) & 0xFF
        key[19] = (canon >> 24) & 0xFF
        memcpy(key + FSM_KEY_BYTES, self.ctx_keys + <int64_t>r * RULE_KEY_BYTES, KEY_BYTES - FSM_KEY_BYTES)

    def pool_keys(self, nodes=None, bint built_only=False):
        """{node: pool key} of the scannable nodes (all, or those given) whose entries go through
        the pool: what another process's cache tier can be asked for before any entry is built.
        `built_only`: those whose entry is built (what a cache tier publishes)."""
        cdef uint8_t key[KEY_BYTES]
        cdef int32_t nd
        out = {}
        if self._pool is None:
            return out
        for nd in (range(self.g.n_nodes) if nodes is None else nodes):
            if not 0 <= nd < self.g.n_nodes:
                raise IndexError(f"node {nd} out of range")
            if built_only and xg2_load_acquire(<void**>&self.entries[nd]) == NULL:
                continue
            if self.g.be_start[nd + 1] > self.g.be_start[nd] and self.rule_shared[self.g.node_rule[nd]]:
                self._pool_key(nd, key)
                out[nd] = bytes(key[:KEY_BYTES])
        return out

    def built_entries(self, bint own_only=True):
        """{node: compact bytes} of the entries built so far; `own_only`: those that stay in this
        grammar (not pooled), which only the grammar's own serialized form can carry."""
        cdef MaskEntry* e
        cdef int32_t nd
        out = {}
        for nd in range(self.g.n_nodes):
            e = <MaskEntry*>xg2_load_acquire(<void**>&self.entries[nd])
            if e == NULL:
                continue
            if own_only and self._pool is not None and self.rule_shared[self.g.node_rule[nd]]:
                continue
            out[nd] = _entry_to_bytes(e, self.vc.n_words)
        return out

    def load_entry(self, int32_t node, bytes data):
        """Install an entry built elsewhere for this node (another process, the same grammar and
        vocabulary); kept only if the node has none yet. ValueError when the bytes are malformed
        or the node has no entry to hold."""
        if not 0 <= node < self.g.n_nodes or self.g.be_start[node + 1] == self.g.be_start[node]:
            raise ValueError(f"node {node} holds no mask entry")
        cdef MaskEntry* e = _entry_from_bytes(data, self.vocab)
        cdef bint kept = False
        with nogil:
            PyThread_acquire_lock(self.lock, WAIT_LOCK)
            if self.entries[node] == NULL:
                self.cache_bytes += e.nbytes
                self.n_entries += 1
                xg2_store_release(<void**>&self.entries[node], e)
                kept = True
            PyThread_release_lock(self.lock)
        if not kept:
            entry_release(e)

    def precompute(self, nodes):
        """Build the entries of the given nodes now (compile-time part of JIT). Before each, it
        lets a fill that waits for the core's lock have it: the lock is not fair, and a
        background precompute that took it again at once kept the first fills waiting for its
        whole budget (measured: a mask mean of 1.1 ms per token on new 8-tool schemas)."""
        cdef int32_t n, spins
        for n in nodes:
            with nogil:
                spins = 0
                while xg2_int_load(&self.lock_waiters) > 0 and spins < 100000:
                    sched_yield()
                    spins += 1
                if self.get_entry(n) == NULL:
                    with gil:
                        raise MemoryError()

    def scannable_nodes(self):
        """(node, width) for nodes with byte edges (the states that own mask entries); width, the
        number of bytes the node can scan, is the cost estimate for partial JIT."""
        out = []
        cdef int32_t n, k, w
        for n in range(self.g.n_nodes):
            if self.g.be_start[n + 1] > self.g.be_start[n]:
                w = 0
                for k in range(self.g.be_start[n], self.g.be_start[n + 1]):
                    w += self.g.be_hi[k] - self.g.be_lo[k] + 1
                out.append((n, w))
        return out

    cdef int _step(self, int32_t node, int b) noexcept nogil:
        cdef int32_t k
        for k in range(self.g.be_start[node], self.g.be_start[node + 1]):
            if self.g.be_lo[k] > b:
                break
            if b <= self.g.be_hi[k]:
                return self.g.be_target[k]
        return -1

    cdef int32_t _char_target(self, int32_t s) noexcept nogil:
        """The node every well-formed non-ASCII character leads s to, with every byte prefix alive;
        -1 when there is none (some character dies, or two lead to different nodes)."""
        cdef int32_t pair_d[64]
        cdef int8_t pair_q[64]
        cdef int n_pairs = 1, i = 0, j, b, q, nq, nd, d
        cdef int32_t target = -1
        cdef bint known
        pair_d[0] = s
        pair_q[0] = 0
        while i < n_pairs:
            d = pair_d[i]
            q = pair_q[i]
            i += 1
            for b in range(0x80, 0x100):
                nq = U8[q][b]
                if nq < 0:
                    continue
                nd = self._step(d, b)
                if nd < 0:
                    return -1
                if nq == 0:
                    if target >= 0 and nd != target:
                        return -1
                    target = nd
                    continue
                known = False
                for j in range(n_pairs):
                    if pair_d[j] == nd and pair_q[j] == nq:
                        known = True
                        break
                if not known:
                    if n_pairs == 64:
                        return -1
                    pair_d[n_pairs] = nd
                    pair_q[n_pairs] = <int8_t>nq
                    n_pairs += 1
        return target

    cdef bint _text_node(self, int32_t s) noexcept nogil:
        """Whether node s reads any well-formed non-ASCII character and comes back to s; then
        node_text[s] gets the ASCII bytes that do not loop on s. From such a node, every token of a
        subtree that is well-formed UTF-8 and avoids those bytes is accepted without walking it."""
        cdef int b
        if self._char_target(s) != s:
            return False
        self.node_text[s * 2] = self.node_text[s * 2 + 1] = 0
        for b in range(0x80):
            if self._step(s, b) != s:
                self.node_text[s * 2 + (b >> 6)] |= (<uint64_t>1) << (b & 63)
        self.node_textual[s] = 1
        return True

    cdef int32_t _chain_step(self, int32_t s, uint64_t* exits) noexcept nogil:
        """The node every well-formed character not in `exits` leads s to, if there is one (the
        character steps of a bounded string: `c{0,n}` unrolled); exits gets the ASCII bytes that do
        not lead there. -1 when s is no such node."""
        cdef int b, n_ascii = 0
        cdef int32_t nxt = self._step(s, ord("a"))
        if nxt < 0 or nxt == s or self._char_target(s) != nxt:
            return -1
        exits[0] = exits[1] = 0
        for b in range(0x80):
            if self._step(s, b) != nxt:
                exits[b >> 6] |= (<uint64_t>1) << (b & 63)
            else:
                n_ascii += 1
        return nxt if n_ascii >= 64 else -1

    cdef void _chain_nodes(self) noexcept nogil:
        """node_chain[s] = k > 0 when from s any k well-formed characters avoiding the ASCII bytes
        node_text[s] stay inside the rule: each leads to the next node of a chain whose exits are no
        wider (a bounded string `c{0,n}` unrolled), possibly into a text loop (then k is the cap).
        From such a node a trie subtree whose tokens add at most k bytes and avoid those bytes is
        accepted without walking it, as for text loops."""
        cdef int32_t n = self.g.n_nodes, s, t, u, k
        cdef int32_t* step = <int32_t*>malloc(max(1, n) * sizeof(int32_t))
        cdef uint64_t ex[2]
        if step == NULL:
            return
        for s in range(n):
            step[s] = -1
            if self.node_textual[s] or self.g.be_start[s + 1] == self.g.be_start[s]:
                continue
            t = self._chain_step(s, ex)
            if t >= 0:
                step[s] = t
                self.node_text[s * 2] = ex[0]
                self.node_text[s * 2 + 1] = ex[1]
        cdef bint closed
        for s in range(n):
            if step[s] < 0:
                continue
            k = 0
            t = s
            closed = not (self.g.node_final[s] or self.g.re_start[s + 1] > self.g.re_start[s])
            while k < CHAIN_CAP:
                u = step[t]
                k += 1
                if (self.node_text[u * 2] & ~self.node_text[s * 2]) or \
                        (self.node_text[u * 2 + 1] & ~self.node_text[s * 2 + 1]):
                    closed = False
                    break  # past u, a byte s lets through may leave
                if self.node_textual[u]:
                    k = CHAIN_CAP
                    break
                if step[u] < 0:
                    if self._ends_into_text(u, s):
                        k = CHAIN_CAP
                    closed = closed and self._dead_end(u, s)
                    break
                if self.g.node_final[u] or self.g.re_start[u + 1] > self.g.re_start[u]:
                    closed = False      # the text may go on past the rule's end or into a call
                t = u
            self.node_chain[s] = k
            self.node_closed[s] = closed and k < CHAIN_CAP
        free(step)

    cdef bint _dead_end(self, int32_t u, int32_t s) noexcept nogil:
        """Whether the chain that ends at u is closed: no text can be read after u, where text is
        what node s does not treat as leaving it. Either u reads only such bytes (and the rule can
        neither end nor call there), or the rule ends at u with no way on and every caller node
        its calls resume at is of the first kind. A token that still has characters to read at u
        then dies, and the chain's length decides the token (see _build_entry)."""
        cdef int32_t r = self.g.node_rule[u], k, v
        if self.g.node_final[u] and self.g.be_start[u + 1] == self.g.be_start[u] \
                and self.g.re_start[u + 1] == self.g.re_start[u]:
            if self.g.rule_follow[r] or self.g.ctx_resume[r * MAX_RESUMES] < 0:
                return False        # callers unknown (too many, or the root's end among them)
            for k in range(MAX_RESUMES):
                v = self.g.ctx_resume[r * MAX_RESUMES + k]
                if v >= 0 and not self._reads_no_text(v, s):
                    return False
            return True
        return self._reads_no_text(u, s)

    cdef bint _reads_no_text(self, int32_t u, int32_t s) noexcept nogil:
        cdef int32_t k, b
        if self.g.node_final[u] or self.g.re_start[u + 1] > self.g.re_start[u]:
            return False
        for k in range(self.g.be_start[u], self.g.be_start[u + 1]):
            if self.g.be_hi[k] >= 0x80:
                return False
            for b in range(self.g.be_lo[k], self.g.be_hi[k] + 1):
                if not (self.node_text[s * 2 + (b >> 6)] >> (b & 63)) & 1:
                    return False
        return True

    cdef bint _ends_into_text(self, int32_t u, int32_t s) noexcept nogil:
        """Whether the rule ends at node u (final, no way on) into a declared follow that loops on
        every character node s lets through: then the chain from s never runs out."""
        cdef int32_t r = self.g.node_rule[u], f
        if not (self.g.node_final[u] and self.g.rule_follow[r]
                and self.g.be_start[u + 1] == self.g.be_start[u] and self.g.re_start[u + 1] == self.g.re_start[u]):
            return False
        f = self.g.ctx_resume[r * MAX_RESUMES]
        return (self.node_textual[f] and (self.node_text[f * 2] & ~self.node_text[s * 2]) == 0
                and (self.node_text[f * 2 + 1] & ~self.node_text[s * 2 + 1]) == 0)

    cdef int32_t _text_item(self, int32_t x) noexcept nogil:
        """A node of some item of interned set x that is a text node (or loops), or -1."""
        cdef Memo* m = &self.memo
        cdef int32_t j, nd, best = -1
        if m.id_text[x] != -2:
            return m.id_text[x]
        for j in range(m.id_len[x]):
            nd = m.pool[m.id_off[x] + j] & NODE_MASK
            if self.node_textual[nd]:
                best = nd
                break
            if self.node_chain[nd] > 0 and (best < 0 or self.node_chain[nd] > self.node_chain[best]):
                best = nd
        m.id_text[x] = best
        return best

    def initial_nodes(self):
        """Scannable nodes of the parse's first state set: the entries the first mask needs."""
        cdef Parser* A = &self.pa
        cdef int64_t j
        cdef uint32_t nd
        out = set()
        with nogil:     # never wait for the lock holding the GIL: a builder may need the GIL
            PyThread_acquire_lock(self.lock, WAIT_LOCK)
        try:
            if p_start(A, &self.g, TOP_BIT | <item_t>self.g.rule_start[self.root_rule]) < 0:
                raise MemoryError()
            for j in range(A.set_start[0], A.n_items):
                nd = A.items[j] & NODE_MASK
                if self.g.be_start[nd + 1] > self.g.be_start[nd]:
                    out.add(nd)
            p_pop_to(A, 0)
        finally:
            PyThread_release_lock(self.lock)
        return sorted(out)

    def estimate_cost(self, int32_t node):
        """Trie nodes under the first bytes the node's closure can scan: a cheap proxy for the cost
        of its mask entry (the walk visits roughly those subtrees)."""
        cdef int64_t total
        with nogil:
            total = self._estimate_cost(node)
        return total

    def costliest_nodes(self):
        """(nodes, costs): the scannable nodes without a built entry, costliest first (by
        estimate_cost; ties by node), as int32 and int64 arrays. The partial JIT's order, computed
        in one call rather than one per node (a grammar of thousands of states took milliseconds
        of the GIL the other way)."""
        cdef int32_t n, count = 0
        cdef int64_t[::1] cost
        cdef int32_t[::1] nodes
        arr_nodes = np.empty(self.g.n_nodes, np.int32)
        arr_cost = np.empty(self.g.n_nodes, np.int64)
        nodes, cost = arr_nodes, arr_cost
        with nogil:
            for n in range(self.g.n_nodes):
                if self.g.be_start[n + 1] > self.g.be_start[n] and \
                        xg2_load_acquire(<void**>&self.entries[n]) == NULL:
                    nodes[count] = n
                    cost[count] = self._estimate_cost(n)
                    count += 1
        order = np.argsort(-arr_cost[:count], kind="stable")
        return arr_nodes[:count][order], arr_cost[:count][order]

    cdef int64_t _estimate_cost(self, int32_t node) noexcept nogil:
        cdef Parser* A = &self.pa
        cdef const TrieC* T = self.trie
        cdef uint64_t first[4]
        cdef int64_t total = 0
        cdef int32_t i
        first[0] = first[1] = first[2] = first[3] = 0
        PyThread_acquire_lock(self.lock, WAIT_LOCK)
        if p_start(A, &self.g, TOP_BIT | <item_t>node) == 0:
            _first_bytes(A, &self.g, first)
            if A.set_top[0] and self._start_context() == 0:
                # The rule can end right here: what follows it counts too.
                if p_complete_rule(&self.pb, &self.g, self.g.node_rule[node], self.g.node_rule[node]) == 0:
                    _first_bytes(&self.pb, &self.g, first)
                p_pop_to(&self.pb, 0)
        p_pop_to(A, 0)
        PyThread_release_lock(self.lock)
        i = 0
        while i < T.n:
            if (first[T.byte[i] >> 6] >> (T.byte[i] & 63)) & 1:
                total += T.next[i] - i
            i = T.next[i]
        return total

    cdef int _start_context(self) noexcept nogil:
        """Parser B starts with one static state set per rule: the caller items waiting on that rule.

        Completing a rule from its static set resumes every caller, whose own completion resumes
        their callers in turn, so B parses exactly the text that may follow the rule in any context.
        The static sets are built once per grammar (they hold no interned ids); each walk opens
        its depth-0 set after them.
        """
        cdef Parser* B = &self.pb
        cdef GrammarC* g = &self.g
        cdef int32_t r, k
        if B.n_static == g.n_rules and B.n_sets >= g.n_rules:
            p_pop_to(B, g.n_rules)
        else:
            p_pop_to(B, 0)
            for r in range(g.n_rules):
                if p_begin_set(B) < 0:
                    return -1
                for k in range(g.ctx_start[r], g.ctx_start[r + 1]):
                    if p_add(B, g.ctx_item[k]) < 0:
                        return -1
            B.n_static = g.n_rules
        if p_begin_set(B) < 0:
            return -1
        return p_intern_top(B)

    cdef int32_t _advance_certain(self, int32_t k, int32_t d, int32_t rule, int32_t c_empty) noexcept nogil:
        """The id of certain-context parser k at depth d, replaying the path from where it was last
        brought up to date (bytes, and the rule's completions as top items). -1 dead, -2 OOM."""
        cdef Parser* C = &self.pc[k]
        cdef GrammarC* g = &self.g
        cdef int32_t stride = self.vc.max_depth + 2, e = self.c_done[k], x, r
        cdef int32_t res = g.ctx_resume[rule * MAX_RESUMES + k]
        cdef int32_t* cids = self.cids + k * stride
        cdef Memo* memo = &self.memo
        if C.n_sets > e + 1:
            p_pop_to(C, e + 1)
        while e < d:
            e += 1
            cids[e] = -1
            x = cids[e - 1]
            if x >= 0 and memo.id_len[x] > 0:
                x = p_advance(C, g, cids, 0, e, self.pbyte[e], self.pbyte)
                if x < 0:
                    return -2
            if self.topa[e]:
                x = cids[e] if cids[e] >= 0 else c_empty
                r = m_trans_get(memo, x, 256 + <uint32_t>(g.n_rules + res))
                if r < 0:
                    if p_catch_up(C, g, cids, 0, e + 1, self.pbyte) < 0:
                        return -2
                    if p_inject_top(C, g, res) < 0:
                        return -2
                    r = C.set_id[e]
                    if m_trans_put(memo, x, 256 + <uint32_t>(g.n_rules + res), r) < 0:
                        return -2
                elif C.n_sets > e:
                    p_pop_to(C, e)
                cids[e] = r
        self.c_done[k] = d
        return cids[d]

    cdef MaskEntry* _build_entry(self, int32_t node, MaskEntry* donor) noexcept nogil:
        """Walk the vocabulary trie from `node` with parser A (inside the rule) and B (what may follow it).

        A token is accepted when A consumes all of it, uncertain when only B survives (it leaves the
        rule and fits some caller context), rejected otherwise; a dead prefix skips its whole subtree.
        Parsers C follow each caller node the rule's calls can resume at (at most MAX_RESUMES of
        them, without going further up): a token every one of them consumes is valid whichever
        callers are live, so it is accepted.
        Where the rule is a plain deterministic automaton from `node` on, A is just a node per depth.

        With a `donor` (an entry of the same automaton node under another lookahead: a partial
        hit), only the subtrees holding the donor's open tokens are walked, on the byte trie; the
        tokens A reads whole are the donor's, and every other token is rejected whatever follows.
        """
        cdef VocabC* v = self.vc
        cdef const TrieC* T = self.trie if donor == NULL else &self.vc.trie
        cdef Parser* A = &self.pa
        cdef Parser* B = &self.pb
        cdef Parser* C
        cdef GrammarC* g = &self.g
        cdef int32_t rule = g.node_rule[node]
        cdef int32_t n_res = 0, res, stride = v.max_depth + 2
        cdef int32_t* cids
        cdef int32_t base = g.n_rules
        cdef int32_t i = 0, d, r, okA, okB, okC, st, nxt = -1, k, x, empty_id, c_empty = -1
        cdef int64_t c_work = 0
        cdef int32_t op = 0             # cursor in the donor's open ranks
        cdef uint64_t first[4]
        while n_res < MAX_RESUMES and g.ctx_resume[rule * MAX_RESUMES + n_res] >= 0:
            n_res += 1
        cdef uint64_t* lp
        cdef uint64_t* tx
        cdef const uint64_t* bl
        cdef bint topA
        cdef bint partial = donor != NULL, track
        cdef Memo* memo = &self.memo
        cdef uint8_t byte
        cdef int32_t* accb = self.acc_buf
        cdef int32_t* uncb = self.unc_buf
        cdef int32_t* openb = self.open_buf
        cdef int32_t* caccb = self.cacc_buf
        cdef uint8_t* anytop = self.anytop
        cdef uint8_t* narrow = self.narrow
        cdef int32_t* tpar = self.tpar
        cdef int32_t* aid = self.aid
        cdef int32_t* bid = self.bid
        cdef int32_t* dstate = self.dstate
        cdef uint8_t* pbyte = self.pbyte
        cdef int32_t* pchars = self.pchars
        cdef int64_t nacc = 0, nunc = 0, nopen = 0, ncacc = 0
        self.wtrie = T
        if self.memo.pool_len > MEMO_MAX_ITEMS or self.memo.th_count > MEMO_MAX_TRANSITIONS:
            p_pop_to(A, 0)
            p_pop_to(B, 0)
            for k in range(MAX_RESUMES):
                p_pop_to(&self.pc[k], 0)
            m_clear(&self.memo)
        if self._start_context() < 0:
            return NULL
        # A runs as a plain automaton (dstate[d]: a node, -1 dead) while the path stays on nodes that
        # call no rule, and as the Earley parser (dstate[d] = -2, aid[d] its set) from the first
        # node that does: the head of a compressed repetition is read at automaton speed.
        if g.node_pure[node]:
            self.dstate[0] = node
            topA = g.node_final[node]
        else:
            if p_start(A, g, TOP_BIT | <item_t>node) < 0:
                return NULL
            topA = A.set_top[0]
            self.aid[0] = A.set_id[0]
            self.dstate[0] = -2
        empty_id = B.set_id[base]
        self.topa[0] = topA
        anytop[0] = 0
        narrow[0] = g.node_pure[node] and not topA
        self.open_all = topA
        track = not topA and not partial    # record open tokens one by one
        if topA and p_complete_rule(B, g, rule, rule) < 0:
            return NULL
        self.bid[0] = B.set_id[base]
        if not narrow[0]:
            # The first bytes A or B can read: a first byte outside them starts only rejected
            # tokens (C follows B), so the walk jumps over them at depth 1.
            memset(first, 0, sizeof(first))
            if dstate[0] == -2:
                _first_bytes(A, g, first)
            else:
                for k in range(g.be_start[node], g.be_start[node + 1]):
                    _set_bytes(first, g.be_lo[k], g.be_hi[k])
            if topA:
                _first_bytes(B, g, first)
        for k in range(n_res):
            C = &self.pc[k]
            p_pop_to(C, 0)
            if p_begin_set(C) < 0 or p_intern_top(C) < 0:
                return NULL
            c_empty = C.set_id[0]
            if topA and p_inject_top(C, g, g.ctx_resume[rule * MAX_RESUMES + k]) < 0:
                return NULL
            self.cids[k * stride] = C.set_id[0]
            self.c_done[k] = 0
        # A and B advance by interned set ids through the memo; their sets are materialized only
        # up to the depth where a transition is missing (lazy), which most of the walk never needs.
        while i < T.n:
            d = T.depth[i]
            if narrow[d - 1]:
                # Below a node where A is a plain automaton node and nothing else lives (B dead, the
                # rule not ended on the way), a child lives only on one of the node's edges: the
                # siblings between edges are skipped, and past the last edge the parent is done.
                st = dstate[d - 1]
                byte = T.byte[i]
                k = g.be_start[st]
                x = g.be_start[st + 1]
                if k == x or byte > g.be_hi[x - 1]:
                    i = T.next[tpar[d - 1]] if d > 1 else T.n
                    continue
                while g.be_hi[k] < byte:
                    k += 1
                if byte < g.be_lo[k]:
                    if d == 1:
                        i = _next_root_child(T, g, st, byte)
                    elif T.cstart != NULL:
                        i = _next_child(T, tpar[d - 1], g.be_lo[k])
                    else:
                        i = T.next[i]
                    continue
            elif d == 1:
                byte = T.byte[i]
                if not (first[byte >> 6] >> (byte & 63)) & 1:
                    i = _next_root_in(T, first, byte)
                    continue
            if partial and not donor.open_all:
                # The walk meets ranks in increasing order, so a cursor in the donor's sorted open
                # ranks tells whether any lies at or below this node.
                r = T.lo[i] if T.hi[i] > T.lo[i] else T.dlo[i]
                while op < donor.n_open and donor.open_ranks[op] < r:
                    op += 1
                if op == donor.n_open:
                    break           # no open token left: the donor's verdicts stand
                if donor.open_ranks[op] >= (T.dhi[i] if T.dhi[i] > T.dlo[i] else T.hi[i]):
                    # No open token below: on to the next one's highest ancestor not yet seen (the
                    # walk is on its parent's path), past the nodes between.
                    x = v.rank_node[donor.open_ranks[op]]
                    while v.trie_parent[x] > i:
                        x = v.trie_parent[x]
                    i = x
                    continue
            byte = T.byte[i]
            pbyte[d] = byte
            pchars[d] = pchars[d - 1] + ((byte & 0xC0) != 0x80)
            anytop[d] = anytop[d - 1] | self.topa[d - 1]
            # Materialized sets at depth >= d belong to an earlier branch.
            if A.n_sets > d:
                p_pop_to(A, d)
            if B.n_sets > base + d:
                p_pop_to(B, base + d)
            for k in range(n_res):
                if self.c_done[k] > d - 1:
                    self.c_done[k] = d - 1    # deeper ids belong to an earlier branch
            st = dstate[d - 1]
            if st != -2:
                nxt = -1
                if st >= 0:
                    for k in range(g.be_start[st], g.be_start[st + 1]):
                        if g.be_lo[k] > byte:
                            break
                        if byte <= g.be_hi[k]:
                            nxt = g.be_target[k]
                            break
                if nxt >= 0 and not g.node_pure[nxt]:
                    x = self._earley_from(nxt, d)     # a call ahead: the parser takes over here
                    if x < 0:
                        return NULL
                    dstate[d] = -2
                    okA = memo.id_len[x] > 0
                    topA = okA and memo.id_top[x]
                else:
                    dstate[d] = nxt
                    okA = nxt >= 0
                    topA = okA and g.node_final[nxt]
            else:
                x = p_advance(A, g, aid, 0, d, byte, pbyte)
                if x < 0:
                    return NULL
                dstate[d] = -2
                okA = memo.id_len[x] > 0
                topA = okA and memo.id_top[x]
            okB = 0
            bid[d] = -1
            x = bid[d - 1]
            if x >= 0 and memo.id_len[x] > 0:
                x = p_advance(B, g, bid, base, d, byte, pbyte)
                if x < 0:
                    return NULL
                okB = memo.id_len[x] > 0
            if topA:
                # The rule ends here: resume its callers in B at this depth (memoized too).
                x = bid[d] if bid[d] >= 0 else empty_id
                r = m_trans_get(memo, x, 256 + <uint32_t>rule)
                if r < 0:
                    if p_catch_up(B, g, bid, base, d + 1, pbyte) < 0:
                        return NULL
                    if p_complete_rule(B, g, rule, rule) < 0:
                        return NULL
                    r = B.set_id[base + d]
                    if m_trans_put(memo, x, 256 + <uint32_t>rule, r) < 0:
                        return NULL
                elif B.n_sets > base + d:
                    p_pop_to(B, base + d)   # the materialized set at d predates the completion
                bid[d] = r
                okB = memo.id_len[r] > 0
            self.topa[d] = topA
            narrow[d] = dstate[d] >= 0 and not okB and not topA and not anytop[d]
            tpar[d] = i
            okC = 0
            if not okA and okB and n_res > 0:
                # Only tokens A rejects need the certain contexts: bring each C up to this depth.
                # Past a work limit they are dropped: the remaining tokens stay uncertain (checked
                # at run time), which bounds the cost of an entry without changing any mask.
                c_work += n_res
                if c_work > CERTAIN_WORK_LIMIT:
                    n_res = 0
                okC = n_res > 0
                for k in range(n_res):
                    x = self._advance_certain(k, d, rule, c_empty)
                    if x == -2:
                        return NULL
                    if x < 0 or memo.id_len[x] == 0:
                        okC = 0
                        break
            if okA or okC:
                if not (partial and okA):      # a partial build takes A's tokens from the donor
                    nacc = _push(accb, nacc, T.lo[i], T.hi[i])
                if not okA:
                    ncacc = _push(caccb, ncacc, T.lo[i], T.hi[i])
                    if track:
                        nopen = _push(openb, nopen, T.lo[i], T.hi[i])
                st = -1
                if T.next[i] > i + 1:
                    if not okA:
                        # Through the one certain context (a declared follow, say `c*`): the same
                        # test on its items accepts whole subtrees past the rule's end.
                        if n_res == 1:
                            st = self._text_item(self.cids[d])
                    elif dstate[d] >= 0:
                        st = nxt
                    elif T.next[i] - i >= 16:
                        st = self._text_item(aid[d])
                if st >= 0:
                    lp = self.node_loop + st * 4
                    bl = T.below + <int64_t>i * 4
                    tx = self.node_text + st * 2
                    if (((self.node_textual[st] or self.node_chain[st] >= max(1, T.span[i]))
                            and ((bl[0] & tx[0]) | (bl[1] & tx[1])) == 0 and (T.u8ok[i] & 1))
                            or ((bl[0] & ~lp[0]) | (bl[1] & ~lp[1]) | (bl[2] & ~lp[2]) | (bl[3] & ~lp[3])) == 0):
                        # Every token below keeps an item looping on node st: the subtree is accepted.
                        if not (partial and okA):
                            nacc = _push(accb, nacc, T.dlo[i], T.dhi[i])
                        if not okA:
                            ncacc = _push(caccb, ncacc, T.dlo[i], T.dhi[i])
                            if track:
                                nopen = _push(openb, nopen, T.dlo[i], T.dhi[i])
                        i = T.next[i]
                        continue
                    if (dstate[d] >= 0 and self.node_closed[st] and not anytop[d]
                            and not self.topa[d] and ((bl[0] & tx[0]) | (bl[1] & tx[1])) == 0 and (T.u8ok[i] & 1)):
                        # A bounded chain too short for some tokens below, and nothing after it
                        # reads text (the rule has not ended on the way): the tokens that fit are
                        # accepted, the others die at its end. Decided by character counts.
                        if not partial:
                            nacc = _push_short(accb, nacc, T.dlo[i], T.dhi[i], T.toks, v.tok_chars,
                                               self.node_chain[st] + pchars[d])
                        i = T.next[i]
                        continue
                i += 1
            elif okB:
                nunc = _push(uncb, nunc, T.lo[i], T.hi[i])
                if track:
                    nopen = _push(openb, nopen, T.lo[i], T.hi[i])
                i += 1
            else:
                if track and anytop[d]:
                    # Rejected here, but only because of what follows the rule: open.
                    nopen = _push(openb, nopen, T.lo[i], T.hi[i])
                    nopen = _push(openb, nopen, T.dlo[i], T.dhi[i])
                i = T.next[i]
        self.n_acc = nacc
        self.n_unc = nunc
        self.n_open = nopen
        self.n_cacc = ncacc
        if partial:
            if donor.kind != ENTRY_ACCEPTED_LIST:
                self.donor_acc = donor      # it keeps a set: _store starts from it
            elif _donor_own_tokens(donor, v, accb + nacc, self.rank_bits, &self.n_acc) < 0:
                return NULL
        return self._store(v, donor)

    cdef int32_t _earley_from(self, int32_t nxt, int32_t d) noexcept nogil:
        """Parser A's set id at depth d when it starts there from node nxt, its rule's end being
        the end of the parse (as at the root of the walk); the depths above are empty sets."""
        cdef Parser* A = &self.pa
        cdef int32_t j
        for j in range(d):
            self.aid[j] = -1
        p_pop_to(A, 0)
        if p_catch_up(A, &self.g, self.aid, 0, d, self.pbyte) < 0:
            return -1
        if p_begin_set(A) < 0 or p_add(A, (<item_t>d << 32) | TOP_BIT | <item_t>nxt) < 0:
            return -1
        if p_closure(A, &self.g, A.set_start[d]) < 0 or p_intern_top(A) < 0:
            return -1
        self.aid[d] = A.set_id[d]
        return self.aid[d]

    cdef int _ranks(self, const int32_t* pos, int64_t n, int32_t** out) noexcept nogil:
        """Positions in the walked trie -> sorted ranks in byte order (malloc'ed into *out)."""
        cdef VocabC* v = self.vc
        cdef const int32_t* toks = self.wtrie.toks
        cdef int32_t WR = (v.n_ordinary + 63) // 64, w, r
        cdef int64_t j, u = 0
        cdef uint64_t word
        out[0] = <int32_t*>malloc(max(1, n) * sizeof(int32_t))
        if out[0] == NULL:
            return -1
        if n * RANKS_SORT_FACTOR < WR:
            # few: sort them (a position holds one token, so ranks are distinct); the bitset below
            # costs a pass over the whole vocabulary whatever n is
            for j in range(n):
                out[0][j] = v.token_rank[toks[pos[j]]]
            qsort(out[0], n, sizeof(int32_t), _cmp_int32)
            return 0
        memset(self.rank_bits, 0, WR * sizeof(uint64_t))
        for j in range(n):
            r = v.token_rank[toks[pos[j]]]
            self.rank_bits[r >> 6] |= (<uint64_t>1) << (r & 63)
        for w in range(WR):
            word = self.rank_bits[w]
            while word:
                out[0][u] = (w << 6) + __builtin_ctzll(word)
                u += 1
                word &= word - 1
        return 0

    cdef int64_t _merge_rejected(self, VocabC* v, const MaskEntry* base, int32_t* out) noexcept nogil:
        """Into `out`, sorted: the ids `base` (a rejected list) rejects or accepts only through its
        certain contexts, but those the walk accepted (acc_buf, byte-trie positions). The count;
        -1 when out of memory."""
        cdef const int32_t* toks = self.wtrie.toks
        cdef int64_t n_add = base.n_ctx_acc, n_del = self.n_acc, a = 0, b = 0, c = 0, n = 0, j
        cdef int32_t* add = <int32_t*>malloc(max(1, n_add + n_del) * sizeof(int32_t))
        cdef int32_t* dele = add + n_add
        cdef int32_t x
        if add == NULL:
            return -1
        for j in range(n_add):
            add[j] = v.rank_token[base.ctx_acc_ranks[j]]
        for j in range(n_del):
            dele[j] = toks[self.acc_buf[j]]
        qsort(add, n_add, sizeof(int32_t), _cmp_int32)
        qsort(dele, n_del, sizeof(int32_t), _cmp_int32)
        while a < base.n_list or b < n_add:
            if b == n_add or (a < base.n_list and base.list[a] <= add[b]):
                x = base.list[a]
                a += 1
                if b < n_add and add[b] == x:
                    b += 1
            else:
                x = add[b]
                b += 1
            while c < n_del and dele[c] < x:
                c += 1
            if c < n_del and dele[c] == x:
                continue
            out[n] = x
            n += 1
        free(add)
        return n

    cdef MaskEntry* _store(self, VocabC* v, MaskEntry* donor) noexcept nogil:
        """Keep accepted ids, non-accepted ids, or a bitset (paper App. B; see _as_list).

        acc_buf, unc_buf, open_buf and cacc_buf hold positions in the walked trie's token array.
        A set is assembled in set_buf, scratch that stays warm from one build to the next, where
        a fresh vocabulary-sized block per entry would cost page faults.
        """
        cdef const int32_t* toks = self.wtrie.toks
        cdef const MaskEntry* base = self.donor_acc
        cdef int64_t n_acc = self.n_acc, n_unc = self.n_unc, n_other
        cdef int64_t j, k = 0, w
        cdef int32_t t
        cdef uint64_t word
        cdef uint64_t* bits = self.set_buf
        cdef int32_t* merged = NULL
        self.donor_acc = NULL
        if base != NULL and base.kind == ENTRY_REJECTED_LIST:
            # What the donor rejects, plus what it accepted through its certain contexts, less what
            # the walk accepts: sorted id lists merged, without a pass over a vocabulary bitset.
            merged = self.open_buf      # a partial build records no open tokens
            n_other = self._merge_rejected(v, base, merged)
            if n_other < 0:
                return NULL
            n_acc = v.n_ordinary - n_other
            base = NULL if _as_list(n_other, v.n_words) and n_acc > n_other else base
            if base != NULL:
                merged = NULL           # the entry keeps a set after all: build it below
        if base != NULL:
            # the tokens the donor reads inside the rule (all it accepts but through its certain
            # contexts), as a set; the walk's accepted tokens are added to it below
            if base.kind == ENTRY_BITSET:
                memcpy(bits, base.bits, v.n_words * sizeof(uint64_t))
            else:
                _all_but(bits, v, base)
            for j in range(base.n_ctx_acc):
                t = v.rank_token[base.ctx_acc_ranks[j]]
                bits[t >> 6] &= ~((<uint64_t>1) << (t & 63))
            for j in range(self.n_acc):
                t = toks[self.acc_buf[j]]
                bits[t >> 6] |= (<uint64_t>1) << (t & 63)
            n_acc = 0
            for w in range(v.n_words):
                n_acc += __builtin_popcountll(bits[w])
        n_other = v.n_ordinary - n_acc
        cdef MaskEntry* e = <MaskEntry*>calloc(1, sizeof(MaskEntry))
        if e == NULL:
            return NULL
        e.refs = 1
        e.n_unc = <int32_t>n_unc
        e.n_ctx_acc = <int32_t>self.n_cacc
        # Uncertain tokens as ranks in byte order (the runtime check shares prefixes in that order).
        if self._ranks(self.unc_buf, n_unc, &e.unc_ranks) < 0 or \
                self._ranks(self.cacc_buf, self.n_cacc, &e.ctx_acc_ranks) < 0:
            entry_free(e)
            return NULL
        if donor != NULL:           # what the automaton alone decides is the donor's
            e.open_all = donor.open_all
            e.n_open = donor.n_open
            e.open_ranks = <int32_t*>malloc(max(1, donor.n_open) * sizeof(int32_t))
            if e.open_ranks == NULL:
                entry_free(e)
                return NULL
            memcpy(e.open_ranks, donor.open_ranks, donor.n_open * sizeof(int32_t))
        else:
            e.open_all = self.open_all
            e.n_open = 0 if self.open_all else <int32_t>self.n_open
            if self._ranks(self.open_buf, e.n_open, &e.open_ranks) < 0:
                entry_free(e)
                return NULL
        if _as_list(n_acc, v.n_words) and n_acc <= n_other:
            e.kind = ENTRY_ACCEPTED_LIST
            e.n_list = <int32_t>n_acc
        elif _as_list(n_other, v.n_words):
            e.kind = ENTRY_REJECTED_LIST
            e.n_list = <int32_t>n_other
        else:
            e.kind = ENTRY_BITSET
        if merged != NULL:              # a rejected list, merged above
            e.list = <int32_t*>malloc(max(1, e.n_list) * sizeof(int32_t))
            if e.list == NULL:
                entry_free(e)
                return NULL
            memcpy(e.list, merged, e.n_list * sizeof(int32_t))
        elif e.kind == ENTRY_ACCEPTED_LIST and base == NULL:
            e.list = <int32_t*>malloc(max(1, e.n_list) * sizeof(int32_t))
            if e.list == NULL:
                entry_free(e)
                return NULL
            for j in range(n_acc):
                e.list[j] = toks[self.acc_buf[j]]
        else:
            if base == NULL:
                memset(bits, 0, v.n_words * sizeof(uint64_t))
                for j in range(n_acc):
                    t = toks[self.acc_buf[j]]
                    bits[t >> 6] |= (<uint64_t>1) << (t & 63)
            if e.kind == ENTRY_BITSET:
                e.bits = <uint64_t*>malloc(v.n_words * sizeof(uint64_t))
                if e.bits == NULL:
                    entry_free(e)
                    return NULL
                memcpy(e.bits, bits, v.n_words * sizeof(uint64_t))
            else:
                # the list from the set, a word at a time: the accepted ids (from a donor's set),
                # or the ordinary ids not accepted
                e.list = <int32_t*>malloc(max(1, e.n_list) * sizeof(int32_t))
                if e.list == NULL:
                    entry_free(e)
                    return NULL
                for w in range(v.n_words):
                    word = bits[w] if e.kind == ENTRY_ACCEPTED_LIST else v.ordinary_bits[w] & ~bits[w]
                    while word:
                        e.list[k] = <int32_t>((w << 6) + __builtin_ctzll(word))
                        k += 1
                        word &= word - 1
        e.nbytes = entry_nbytes(e, v.n_words)
        return e

    @property
    def class_trie(self):
        return self._class_trie

    def entry_tokens(self, int32_t node):
        """(accepted token ids, uncertain token ids) of a node's entry, both sorted; builds it."""
        cdef MaskEntry* e
        cdef VocabC* v = self.vc
        cdef int32_t j, t
        with nogil:
            e = self.get_entry(node)
        if e == NULL:
            raise MemoryError()
        acc = np.zeros(v.vocab_size, dtype=bool)
        if e.kind == ENTRY_BITSET:
            for t in range(v.vocab_size):
                if (e.bits[t >> 6] >> (t & 63)) & 1:
                    acc[t] = True
        elif e.kind == ENTRY_ACCEPTED_LIST:
            for j in range(e.n_list):
                acc[e.list[j]] = True
        else:
            for j in range(v.n_ordinary):
                acc[v.rank_token[j]] = True
            for j in range(e.n_list):
                acc[e.list[j]] = False
        unc = sorted(v.rank_token[e.unc_ranks[j]] for j in range(e.n_unc))
        return np.nonzero(acc)[0], np.array(unc, dtype=np.int64)

    def chain_info(self, int32_t node):
        """(characters the node's chain reads, whether the chain is closed); see _chain_nodes."""
        return int(self.node_chain[node]), bool(self.node_closed[node])

    def entry_stats(self, int32_t node):
        """(kind, list length, uncertain count, open count (-1: all open), count accepted through
        the certain contexts) of a node's entry; builds it."""
        cdef MaskEntry* e
        with nogil:
            e = self.get_entry(node)
        if e == NULL:
            raise MemoryError()
        return (e.kind, e.n_list, e.n_unc, -1 if e.open_all else e.n_open, e.n_ctx_acc)




# ---------------------------------------------------------------------------------------------
# Matcher: one request's parse with history, mask fill, accept and rollback
# ---------------------------------------------------------------------------------------------

cdef class MatcherCore:
    """Runtime parser over a CompiledCore. Not thread-safe by itself: one request, one thread."""
    cdef CompiledCore core
    cdef GrammarC* g
    cdef VocabC* vc
    cdef Parser p
    cdef int32_t* boundaries          # n_sets before each accepted token
    cdef int32_t n_bound
    cdef int32_t cap_bound
    cdef uint64_t* acc                # scratch: uint64 words over vocab_size
    cdef uint64_t* tmp
    cdef uint64_t* unc                # scratch: uint64 words over ranks
    cdef int32_t* stamp
    cdef int32_t stamp_gen
    cdef int32_t* nodes
    cdef int32_t* stops
    cdef int32_t n_stop
    cdef Memo memo
    cdef int32_t* cid
    cdef uint8_t* pbyte
    cdef uint64_t* mcache             # final masks of recent costly states, direct-mapped by set id
    cdef int32_t mcache_id[MCACHE_SLOTS]
    cdef readonly bint terminated

    def __cinit__(self):
        self.p.items = NULL
        self.boundaries = NULL
        self.acc = NULL
        self.tmp = NULL
        self.unc = NULL
        self.stamp = NULL
        self.nodes = NULL
        self.stops = NULL
        self.memo.pool = NULL
        self.cid = NULL
        self.pbyte = NULL
        self.mcache = NULL

    def __init__(self, CompiledCore core, stop_ids):
        self.core = core
        self.g = &core.g
        self.vc = &core.vocab.c
        cdef Vocab v = core.vocab
        if p_init(&self.p) < 0 or m_init(&self.memo) < 0:
            raise MemoryError()
        self.p.memo = &self.memo
        self.cid = <int32_t*>malloc((v.max_depth + 2) * sizeof(int32_t))
        self.pbyte = <uint8_t*>malloc((v.max_depth + 2) * sizeof(uint8_t))
        self.mcache = <uint64_t*>malloc(MCACHE_SLOTS * max(1, v.n_words) * sizeof(uint64_t))
        if self.cid == NULL or self.pbyte == NULL or self.mcache == NULL:
            raise MemoryError()
        for i in range(MCACHE_SLOTS):
            self.mcache_id[i] = -1
        self.cap_bound = 64
        self.boundaries = <int32_t*>malloc(self.cap_bound * sizeof(int32_t))
        self.acc = <uint64_t*>calloc(max(1, v.n_words), sizeof(uint64_t))
        self.tmp = <uint64_t*>calloc(max(1, v.n_words), sizeof(uint64_t))
        self.unc = <uint64_t*>calloc(max(1, (v.n_ordinary + 63) // 64), sizeof(uint64_t))
        self.stamp = <int32_t*>calloc(max(1, core.g.n_nodes), sizeof(int32_t))
        self.nodes = <int32_t*>malloc(max(1, core.g.n_nodes) * sizeof(int32_t))
        if (self.boundaries == NULL or self.acc == NULL or self.tmp == NULL or self.unc == NULL or
                self.stamp == NULL or self.nodes == NULL):
            raise MemoryError()
        self.n_stop = len(stop_ids)
        self.stops = <int32_t*>malloc(max(1, self.n_stop) * sizeof(int32_t))
        if self.stops == NULL:
            raise MemoryError()
        for i, t in enumerate(stop_ids):
            if not 0 <= t < v.vocab_size:
                raise ValueError(f"stop token {t} out of range")
            self.stops[i] = t
        self.stamp_gen = 0
        self.reset()

    def __dealloc__(self):
        if self.p.items != NULL:
            p_free(&self.p)
        free(self.boundaries)
        free(self.acc)
        free(self.tmp)
        free(self.unc)
        free(self.stamp)
        free(self.nodes)
        free(self.stops)
        free(self.cid)
        free(self.pbyte)
        free(self.mcache)
        if self.memo.pool != NULL:
            m_free(&self.memo)

    def reset(self):
        self.n_bound = 0
        self.terminated = False
        if p_start(&self.p, self.g, TOP_BIT | <item_t>self.core.g.rule_start[self.core.root_rule]) < 0:
            raise MemoryError()

    @property
    def num_tokens(self):
        return self.n_bound

    def can_end(self):
        return bool(self.p.set_top[self.p.n_sets - 1])

    cdef int _feed(self, const uint8_t* data, int64_t n) noexcept nogil:
        """Push bytes; on failure restore the state. 1 accepted, 0 rejected, -1 OOM."""
        cdef int32_t base = self.p.n_sets
        cdef int64_t i
        cdef int ok
        for i in range(n):
            ok = p_push_byte(&self.p, self.g, data[i])
            if ok <= 0:
                p_pop_to(&self.p, base)
                return ok
        return 1

    cdef int _push_boundary(self) except -1:
        if self.n_bound == self.cap_bound:
            self.cap_bound *= 2
            self.boundaries = <int32_t*>realloc(self.boundaries, self.cap_bound * sizeof(int32_t))
            if self.boundaries == NULL:
                raise MemoryError()
        self.boundaries[self.n_bound] = self.p.n_sets
        self.n_bound += 1
        return 0

    def is_stop_token(self, int32_t t):
        cdef int32_t i
        for i in range(self.n_stop):
            if self.stops[i] == t:
                return True
        return False

    def accept_token(self, int32_t t):
        """Accept a token id; False (state unchanged) if the grammar does not allow it here."""
        cdef VocabC* v = self.vc
        cdef int ok
        if self.terminated or t < 0 or t >= v.vocab_size:
            return False
        if self.is_stop_token(t):
            if not self.p.set_top[self.p.n_sets - 1]:
                return False
            self._push_boundary()
            self.terminated = True
            return True
        if v.token_rank[t] < 0:
            return False
        self._push_boundary()
        with nogil:
            ok = self._feed(v.tok_data + v.tok_off[t], v.tok_off[t + 1] - v.tok_off[t])
        if ok <= 0:
            self.n_bound -= 1
            if ok < 0:
                raise MemoryError()
            return False
        return True

    def accept_bytes(self, const uint8_t[:] data):
        cdef int ok
        if self.terminated:
            return False
        self._push_boundary()
        with nogil:
            ok = self._feed(&data[0], data.shape[0]) if data.shape[0] > 0 else 1
        if ok <= 0:
            self.n_bound -= 1
            if ok < 0:
                raise MemoryError()
            return False
        return True

    def rollback(self, int32_t k):
        if k < 0 or k > self.n_bound:
            raise ValueError(f"cannot roll back {k} tokens; {self.n_bound} can be rolled back")
        if k == 0:
            return
        self.n_bound -= k
        p_pop_to(&self.p, self.boundaries[self.n_bound])
        self.terminated = False

    def forget_history(self, int32_t keep):
        """Keep only the last `keep` token boundaries for rollback (bounds max_rollback_tokens)."""
        if 0 <= keep < self.n_bound:
            # Source and destination overlap when fewer than 2 * keep boundaries are held.
            memmove(self.boundaries, self.boundaries + (self.n_bound - keep), keep * sizeof(int32_t))
            self.n_bound = keep

    def fill_bitmask(self, uintptr_t address, int32_t n_int32_words):
        """Write the next-token mask into n_int32_words int32 words at `address`, without the GIL."""
        cdef int rc
        with nogil:
            rc = self._fill(<int32_t*>address, n_int32_words)
        if rc < 0:
            raise MemoryError()

    cdef int _fill(self, int32_t* out, int32_t n_out) noexcept nogil:
        """The mask is built in the output row itself when it is wide and aligned enough (most
        rows), saving a copy of a vocabulary bitset per fill."""
        cdef uint64_t* own = self.acc
        cdef int32_t W = self.vc.n_words
        cdef int rc
        if n_out < W * 2 or (<uintptr_t>out) & 7:
            rc = self._fill_acc()
            if rc == 0:
                memcpy(out, self.acc, min(n_out, W * 2) * sizeof(int32_t))
        else:
            self.acc = <uint64_t*>out
            rc = self._fill_acc()
            self.acc = own
        if rc == 0 and n_out > W * 2:
            memset(out + W * 2, 0, (n_out - W * 2) * sizeof(int32_t))
        return rc

    cdef int _fill_acc(self) noexcept nogil:
        """The next-token mask into self.acc."""
        cdef VocabC* v = self.vc
        cdef Parser* p = &self.p
        cdef int32_t cur = p.n_sets - 1
        cdef int32_t W = v.n_words, WR = (v.n_ordinary + 63) // 64
        cdef int64_t j
        cdef int32_t node, n_nodes = 0, k, w, r, t, base
        cdef MaskEntry* e
        cdef uint64_t bitsw
        cdef int any_unc = 0, n_checked = 0
        cdef int32_t sid = p.set_id[cur], slot = sid & (MCACHE_SLOTS - 1), full = -1
        if self.terminated:
            memset(self.acc, 0, W * sizeof(uint64_t))
        elif sid >= 0 and self.mcache_id[slot] == sid:
            # The same parse state as an earlier step (interned ids capture all of it): same mask.
            memcpy(self.acc, self.mcache + <int64_t>slot * W, W * sizeof(uint64_t))
        else:
            self.stamp_gen += 1
            if self.stamp_gen == 0x7FFFFFFF:
                memset(self.stamp, 0, self.g.n_nodes * sizeof(int32_t))
                self.stamp_gen = 1
            for j in range(p.set_start[cur], p.n_items):
                node = p.items[j] & NODE_MASK
                if self.g.be_start[node + 1] > self.g.be_start[node] and self.stamp[node] != self.stamp_gen:
                    self.stamp[node] = self.stamp_gen
                    self.nodes[n_nodes] = node
                    n_nodes += 1
            # An entry that keeps a set (a bitset, or all ordinary tokens but a list) starts the
            # mask by itself; without one the mask starts empty.
            for k in range(n_nodes):
                e = self.core.get_entry(self.nodes[k])
                if e == NULL:
                    return -1
                if full < 0 and e.kind != ENTRY_ACCEPTED_LIST:
                    full = k
            if full < 0:
                memset(self.acc, 0, W * sizeof(uint64_t))
            else:
                e = self.core.entries[self.nodes[full]]
                if e.kind == ENTRY_BITSET:
                    memcpy(self.acc, e.bits, W * sizeof(uint64_t))
                else:
                    _all_but(self.acc, v, e)
            for k in range(n_nodes):
                e = self.core.entries[self.nodes[k]]
                if k == full:
                    pass                    # it started the mask
                elif e.kind == ENTRY_ACCEPTED_LIST:
                    for j in range(e.n_list):
                        t = e.list[j]
                        self.acc[t >> 6] |= (<uint64_t>1) << (t & 63)
                elif e.kind == ENTRY_BITSET:
                    for w in range(W):
                        self.acc[w] |= e.bits[w]
                else:
                    _all_but(self.tmp, v, e)
                    for w in range(W):
                        self.acc[w] |= self.tmp[w]
                if e.n_unc:
                    if not any_unc:
                        memset(self.unc, 0, WR * sizeof(uint64_t))
                        any_unc = 1
                    for j in range(e.n_unc):
                        r = e.unc_ranks[j]
                        self.unc[r >> 6] |= (<uint64_t>1) << (r & 63)
            if any_unc:
                n_checked = self._check_uncertain(WR)
                if n_checked < 0:
                    return -1
            for k in range(self.n_stop):
                t = self.stops[k]
                if p.set_top[cur]:
                    self.acc[t >> 6] |= (<uint64_t>1) << (t & 63)
                else:
                    self.acc[t >> 6] &= ~((<uint64_t>1) << (t & 63))
            sid = p.set_id[cur]
            if n_checked >= MCACHE_MIN_CHECKS and sid >= 0:
                slot = sid & (MCACHE_SLOTS - 1)
                self.mcache_id[slot] = sid
                memcpy(self.mcache + <int64_t>slot * W, self.acc, W * sizeof(uint64_t))
        return 0

    cdef int _check_uncertain(self, int32_t WR) noexcept nogil:
        """Run the parser over each uncertain token not already accepted, in byte order.

        Consecutive tokens share their common prefix, a failed prefix rejects every token that
        extends it, and steps go through the memo (sets are materialized only on a miss).
        """
        cdef VocabC* v = self.vc
        cdef Parser* p = &self.p
        cdef GrammarC* g = self.g
        cdef int32_t base = p.n_sets - 1, w, r, t, plen = 0, fail_at = -1, lcp, length, d, known = 0, x
        cdef uint64_t word
        cdef const uint8_t* prev = NULL
        cdef const uint8_t* cur
        cdef bint ok
        cdef int32_t n_checked = 0
        if self.memo.pool_len > MEMO_MAX_ITEMS or self.memo.th_count > MEMO_MAX_TRANSITIONS:
            m_clear(&self.memo)
            for x in range(MCACHE_SLOTS):
                self.mcache_id[x] = -1
            if p_reintern_all(p) < 0:
                return -1
        self.cid[0] = p.set_id[base]
        for w in range(WR):
            word = self.unc[w]
            while word:
                r = (w << 6) + __builtin_ctzll(word)
                word &= word - 1
                t = v.rank_token[r]
                if (self.acc[t >> 6] >> (t & 63)) & 1:
                    continue
                cur = v.tok_data + v.tok_off[t]
                length = <int32_t>(v.tok_off[t + 1] - v.tok_off[t])
                lcp = 0
                while lcp < length and lcp < plen and cur[lcp] == prev[lcp]:
                    lcp += 1
                prev = cur
                plen = length
                if fail_at >= 0 and lcp > fail_at:
                    continue          # shares the prefix that already failed
                fail_at = -1
                n_checked += 1
                d = min(lcp, known)
                if p.n_sets > base + 1 + d:
                    p_pop_to(p, base + 1 + d)
                ok = True
                while d < length:
                    self.pbyte[d + 1] = cur[d]
                    x = p_advance(p, g, self.cid, base, d + 1, cur[d], self.pbyte)
                    if x < 0:
                        return -1
                    if self.memo.id_len[x] == 0:
                        fail_at = d
                        ok = False
                        break
                    d += 1
                known = d
                if ok:
                    self.acc[t >> 6] |= (<uint64_t>1) << (t & 63)
        p_pop_to(p, base + 1)
        return n_checked

    def state_items(self):
        """(node, origin) of every item of the current state set (for inspection and profiling)."""
        cdef Parser* p = &self.p
        cdef int64_t j
        return [(int(p.items[j] & NODE_MASK), int(p.items[j] >> 32))
                for j in range(p.set_start[p.n_sets - 1], p.n_items)]

    def allowed_bytes(self):
        """The set of bytes some item of the current state set can scan (for jump-forward)."""
        cdef Parser* p = &self.p
        cdef GrammarC* g = self.g
        cdef int32_t cur = p.n_sets - 1, k
        cdef int64_t j
        cdef uint32_t node
        out = set()
        for j in range(p.set_start[cur], p.n_items):
            node = p.items[j] & NODE_MASK
            for k in range(g.be_start[node], g.be_start[node + 1]):
                out.update(range(g.be_lo[k], g.be_hi[k] + 1))
        return out

    def push_byte(self, uint8_t b):
        """Scan one byte (no token boundary); used by jump-forward with pop_bytes."""
        cdef int ok = p_push_byte(&self.p, self.g, b)
        if ok < 0:
            raise MemoryError()
        if ok == 0:
            p_pop_to(&self.p, self.p.n_sets - 1)
        return ok == 1

    @property
    def n_sets(self):
        return self.p.n_sets

    def pop_to(self, int32_t n):
        p_pop_to(&self.p, n)



# ---------------------------------------------------------------------------------------------
# Linking: module tables copied one after the other with their offsets (see linking.py)
# ---------------------------------------------------------------------------------------------

cdef int _shift_from(dict tables, str name, int32_t* out, int64_t shift, bint keep_negative) except -1:
    """Copy the int32 table `name` to `out`, adding `shift` (to every value, or to those >= 0)."""
    cdef const int32_t[::1] src = tables[name]
    cdef Py_ssize_t j
    for j in range(src.shape[0]):
        out[j] = src[j] if keep_negative and src[j] < 0 else <int32_t>(src[j] + shift)
    return 0


def link_tables(list tabs, list roots):
    """The tables of `root ::= m1 | m2 | ...` from the modules' tables (`Module.tables`): rule 0
    is the root, its node 0 calls every module root (`roots`, each module's own root index) and
    goes to node 1, which is final; module tables follow, their node, rule, edge and context
    indices moved. Each module root gets the linked root's node 0 as its first caller."""
    cdef Py_ssize_t M = len(tabs), i, j, k
    cdef int64_t nn = 2, nr = 1, nbe = 0, nre = M, nctx = 0
    cdef int64_t node_base, rule_base, be_base, re_base, ctx_base, first, n_rule_i
    cdef dict t
    for t in tabs:
        nn += len(t["node_rule"])
        nr += len(t["rule_start"])
        nbe += len(t["be_lo"])
        nre += len(t["re_rule"])
        nctx += len(t["ctx_item"]) + 1
    cdef cnp.ndarray[int32_t] node_rule = np.empty(nn, np.int32), be_start = np.empty(nn + 1, np.int32)
    cdef cnp.ndarray[int32_t] re_start = np.empty(nn + 1, np.int32), be_target = np.empty(nbe, np.int32)
    cdef cnp.ndarray[int32_t] re_rule = np.empty(nre, np.int32), re_target = np.empty(nre, np.int32)
    cdef cnp.ndarray[int32_t] rule_start = np.empty(nr, np.int32), ctx_start = np.empty(nr + 1, np.int32)
    cdef cnp.ndarray[int32_t] ctx_resume = np.empty(nr * 4, np.int32)
    cdef cnp.ndarray[uint64_t] ctx_item = np.empty(nctx, np.uint64)
    cdef cnp.ndarray[uint8_t] rule_nullable = np.empty(nr, np.uint8)
    cdef const uint64_t[::1] items
    node_rule[0] = node_rule[1] = 0
    be_start[0] = be_start[1] = 0
    re_start[0] = 0
    re_start[1] = <int32_t>M
    rule_start[0] = 0
    ctx_start[0] = ctx_start[1] = 0
    ctx_resume[0] = ctx_resume[1] = ctx_resume[2] = ctx_resume[3] = -1
    rule_nullable[0] = 0
    node_base, rule_base, be_base, re_base, ctx_base = 2, 1, 0, M, 0
    for i in range(M):
        t = tabs[i]
        n_rule_i = len(t["rule_start"])
        re_rule[i] = <int32_t>(rule_base + <int64_t>roots[i])
        re_target[i] = 1
        _shift_from(t, "node_rule", &node_rule[node_base], rule_base, False)
        _shift_from(t, "be_start", &be_start[node_base], be_base, False)
        _shift_from(t, "re_start", &re_start[node_base], re_base, False)
        _shift_from(t, "be_target", &be_target[be_base], node_base, False)
        _shift_from(t, "re_rule", &re_rule[re_base], rule_base, False)
        _shift_from(t, "re_target", &re_target[re_base], node_base, False)
        _shift_from(t, "rule_start", &rule_start[rule_base], node_base, False)
        _shift_from(t, "ctx_resume", &ctx_resume[rule_base * 4], node_base, True)
        _shift_from(t, "ctx_end", &ctx_start[rule_base + 1], ctx_base, False)
        if t["rule_nullable"][roots[i]]:
            rule_nullable[0] = 1
        # context items: the module's, with the linked root's item 0 first among its root's callers
        items = t["ctx_item"]
        first = t["ctx_root_start"][0]
        k = ctx_base
        for j in range(items.shape[0]):
            if j == first:
                ctx_item[k] = 0
                k += 1
            ctx_item[k] = items[j] + ((<uint64_t>rule_base) << 32) + <uint64_t>node_base
            k += 1
        if first == items.shape[0]:
            ctx_item[k] = 0
            k += 1
        node_base += len(t["node_rule"])
        rule_base += n_rule_i
        be_base += len(t["be_lo"])
        re_base += len(t["re_rule"])
        ctx_base = k
    be_start[nn] = <int32_t>nbe
    re_start[nn] = <int32_t>nre
    return {
        "node_rule": node_rule,
        "node_final": np.concatenate([np.array([0, 1], np.uint8)] + [t["node_final"] for t in tabs]),
        "be_start": be_start,
        "be_lo": np.concatenate([t["be_lo"] for t in tabs]),
        "be_hi": np.concatenate([t["be_hi"] for t in tabs]),
        "be_target": be_target,
        "re_start": re_start,
        "re_rule": re_rule,
        "re_target": re_target,
        "rule_start": rule_start,
        "rule_nullable": np.concatenate([rule_nullable[:1]] + [t["rule_nullable"] for t in tabs]),
        "node_pure": np.concatenate([np.array([0, 1], np.uint8)] + [t["node_pure"] for t in tabs]),
        "rule_follow": np.concatenate([np.zeros(1, np.uint8)] + [t["rule_follow"] for t in tabs]),
        "ctx_resume": ctx_resume,
        "ctx_start": ctx_start,
        "ctx_item": ctx_item,
    }



cdef inline int _fill_of(PyObject* core, int32_t* out, int32_t n_out) noexcept nogil:
    # A borrowed reference: the caller's list keeps every core alive for the whole call.
    return (<MatcherCore>core)._fill(out, n_out)


def fill_rows(list cores, uintptr_t base, int64_t row_words, const int64_t[:] rows, int32_t n_words):
    """Matcher k's mask into row rows[k] of the bitmask at `base` (rows of `row_words` int32 words,
    `n_words` of them written; rows None: row k): one call and one release of the GIL for a whole
    batch, no Python per row. The caller has checked the bitmask, the rows and that every item is a
    live MatcherCore."""
    cdef Py_ssize_t n = len(cores), k
    cdef int rc = 0
    cdef bint by_index = rows is None
    if not by_index and rows.shape[0] != n:
        raise ValueError("one row per matcher")
    cdef PyObject* few[8]
    cdef PyObject** ptrs = &few[0]
    if n > 8:
        ptrs = <PyObject**>malloc(n * sizeof(PyObject*))
    if ptrs == NULL:
        raise MemoryError()
    try:
        for k in range(n):
            ptrs[k] = <PyObject*>(<MatcherCore?>cores[k])
        with nogil:
            for k in range(n):
                if _fill_of(ptrs[k], <int32_t*>(base + <uintptr_t>((k if by_index else rows[k]) * row_words * 4)),
                            n_words) < 0:
                    rc = -1
                    break
    finally:
        if ptrs != &few[0]:
            free(ptrs)
    if rc < 0:
        raise MemoryError()
