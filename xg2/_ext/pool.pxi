# Included by core.pyx: the cross-grammar pool of mask entries (XGrammar 2 §3.3), in C.
#
# Entries are keyed by content, never by grammar: (rule key, canonical node, context key), see
# `grammar/hashing.py`. Two grammars that share a sub-structure in the same surroundings share its
# entries outright (a perfect hit); under other surroundings the entry of the same automaton node
# still fixes every token the automaton decides alone, so a new entry only walks the others (a
# partial hit). A mask fill that meets a node without its entry looks the pool up, so the lookup
# lives here in C, without the GIL: in Python its bookkeeping cost as much as building a small entry.

cdef enum:
    RULE_KEY_BYTES = 16
    FSM_KEY_BYTES = 20          # rule key and canonical node: the automaton part of a key
    KEY_BYTES = 36              # then the context key

cdef extern from *:
    """
    static inline void xg2_ref_add(int *p) { __atomic_add_fetch(p, 1, __ATOMIC_RELAXED); }
    static inline int xg2_ref_sub(int *p) { return __atomic_sub_fetch(p, 1, __ATOMIC_ACQ_REL); }
    static inline void *xg2_load_acquire(void **p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static inline void xg2_store_release(void **p, void *v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
    static inline int xg2_int_load(int *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static inline void xg2_int_store(int *p, int v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
    static inline int xg2_cas_ptr(void **p, void *v) {
        void *expected = NULL;
        return __atomic_compare_exchange_n(p, &expected, v, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    }
    static inline void xg2_add64(int64_t *p, int64_t v) { __atomic_add_fetch(p, v, __ATOMIC_RELAXED); }
    """
    void xg2_ref_add(int* p) nogil
    int xg2_ref_sub(int* p) nogil
    void* xg2_load_acquire(void** p) nogil
    void xg2_store_release(void** p, void* v) nogil
    int xg2_int_load(int* p) nogil
    void xg2_int_store(int* p, int v) nogil
    bint xg2_cas_ptr(void** p, void* v) nogil       # NULL -> v, once
    void xg2_add64(int64_t* p, int64_t v) nogil


cdef inline void entry_retain(MaskEntry* e) noexcept nogil:
    xg2_ref_add(&e.refs)


cdef inline void entry_release(MaskEntry* e) noexcept nogil:
    """Entries are shared by the pool and by every compiled grammar that uses them; the last
    holder frees it (holders may live on different threads)."""
    if e != NULL and xg2_ref_sub(&e.refs) == 0:
        entry_free(e)


cdef inline uint64_t _key_hash(const uint8_t* key, int n) noexcept nogil:
    """Rule and context keys are digests already: a few of their bytes, mixed, spread well."""
    cdef uint64_t a, b = 0, c = 0
    memcpy(&a, key, 8)
    memcpy(&b, key + RULE_KEY_BYTES, 4)
    if n == KEY_BYTES:
        memcpy(&c, key + FSM_KEY_BYTES, 8)
    a ^= (b * <uint64_t>0x9E3779B97F4A7C15) ^ (c * <uint64_t>0xC2B2AE3D27D4EB4F)
    return a ^ (a >> 31)


cdef struct PoolSlot:
    uint8_t key[KEY_BYTES]
    uint64_t hash               # of the whole key
    uint64_t fhash              # of its automaton part
    MaskEntry* e                # NULL: a free slot
    int32_t next                # chain in the key table (or the free list)
    int32_t fnext               # chain in the donor table, when the slot is its node's donor
    int32_t older, newer        # recency list
    uint8_t donor               # in the donor table


cdef class EntryPool:
    """One tokenizer's entries (a compiler's), safe to share between threads, within a byte budget
    by evicting the least recently used. Entries hold token ids only, nothing a tenant sent."""
    cdef PoolSlot* slots
    cdef int32_t cap
    cdef int32_t n_used
    cdef int32_t free_head
    cdef int32_t* buckets       # key table: chains of slots by hash
    cdef int32_t* fbuckets      # donor table: per automaton node, the slot of its latest donor entry
    cdef uint64_t bmask
    cdef int32_t oldest, newest
    cdef int64_t _nbytes
    cdef int64_t _limit
    cdef int64_t hits, partial_hits, misses, evictions
    cdef PyThread_type_lock lock
    cdef readonly Vocab vocab
    cdef readonly str fingerprint

    def __cinit__(self):
        self.slots = NULL
        self.buckets = NULL
        self.fbuckets = NULL
        self.lock = NULL

    def __init__(self, Vocab vocab, str fingerprint, int64_t limit_bytes=-1):
        self.vocab = vocab
        self.fingerprint = fingerprint
        self._limit = limit_bytes
        self.lock = PyThread_allocate_lock()
        if self.lock == NULL or self._grow(1024) < 0:
            raise MemoryError()

    def __dealloc__(self):
        cdef int32_t i
        if self.slots != NULL:
            for i in range(self.cap):
                entry_release(self.slots[i].e)
        free(self.slots)
        free(self.buckets)
        free(self.fbuckets)
        if self.lock != NULL:
            PyThread_free_lock(self.lock)

    # -- the C side, used by CompiledCore without the GIL ----------------------------------------
    cdef int _grow(self, int32_t cap) noexcept nogil:
        """Room for `cap` slots; both tables rehashed at one bucket per slot."""
        cdef PoolSlot* s = <PoolSlot*>realloc(self.slots, cap * sizeof(PoolSlot))
        cdef int32_t* b
        cdef int32_t* fb
        cdef int32_t i
        cdef uint64_t h
        if s == NULL:
            return -1
        self.slots = s
        b = <int32_t*>malloc(cap * sizeof(int32_t))
        fb = <int32_t*>malloc(cap * sizeof(int32_t))
        if b == NULL or fb == NULL:
            free(b)
            free(fb)
            return -1
        free(self.buckets)
        free(self.fbuckets)
        self.buckets, self.fbuckets, self.bmask = b, fb, <uint64_t>(cap - 1)
        memset(b, 0xFF, cap * sizeof(int32_t))
        memset(fb, 0xFF, cap * sizeof(int32_t))
        if self.cap == 0:
            self.free_head = -1
            self.oldest = self.newest = -1
        for i in range(self.cap):
            if s[i].e != NULL:
                h = s[i].hash & self.bmask
                s[i].next = b[h]
                b[h] = i
                if s[i].donor:
                    h = s[i].fhash & self.bmask
                    s[i].fnext = fb[h]
                    fb[h] = i
        for i in range(cap - 1, self.cap - 1, -1):
            s[i].e = NULL
            s[i].donor = 0
            s[i].next = self.free_head
            self.free_head = i
        self.cap = cap
        return 0

    cdef int32_t _find(self, const uint8_t* key, uint64_t h) noexcept nogil:
        cdef int32_t i = self.buckets[h & self.bmask]
        while i >= 0:
            if self.slots[i].hash == h and memcmp(self.slots[i].key, key, KEY_BYTES) == 0:
                return i
            i = self.slots[i].next
        return -1

    cdef int32_t _find_donor(self, const uint8_t* key, uint64_t fh) noexcept nogil:
        cdef int32_t i = self.fbuckets[fh & self.bmask]
        while i >= 0:
            if self.slots[i].fhash == fh and memcmp(self.slots[i].key, key, FSM_KEY_BYTES) == 0:
                return i
            i = self.slots[i].fnext
        return -1

    cdef void _unlink_recent(self, int32_t i) noexcept nogil:
        cdef PoolSlot* s = self.slots
        if s[i].older >= 0:
            s[s[i].older].newer = s[i].newer
        else:
            self.oldest = s[i].newer
        if s[i].newer >= 0:
            s[s[i].newer].older = s[i].older
        else:
            self.newest = s[i].older

    cdef void _link_newest(self, int32_t i) noexcept nogil:
        cdef PoolSlot* s = self.slots
        s[i].older = self.newest
        s[i].newer = -1
        if self.newest >= 0:
            s[self.newest].newer = i
        else:
            self.oldest = i
        self.newest = i

    cdef void _unchain(self, int32_t* head, int32_t i, bint donor_chain) noexcept nogil:
        cdef PoolSlot* s = self.slots
        cdef int32_t* p = head
        while p[0] != i:
            p = &s[p[0]].fnext if donor_chain else &s[p[0]].next
        p[0] = s[i].fnext if donor_chain else s[i].next

    cdef void _drop_donor(self, int32_t i) noexcept nogil:
        if self.slots[i].donor:
            self._unchain(&self.fbuckets[self.slots[i].fhash & self.bmask], i, True)
            self.slots[i].donor = 0

    cdef void _remove(self, int32_t i) noexcept nogil:
        cdef PoolSlot* s = self.slots
        self._drop_donor(i)
        self._unchain(&self.buckets[s[i].hash & self.bmask], i, False)
        self._unlink_recent(i)
        self._nbytes -= s[i].e.nbytes
        entry_release(s[i].e)
        s[i].e = NULL
        s[i].next = self.free_head
        self.free_head = i
        self.n_used -= 1

    cdef void _evict(self) noexcept nogil:
        while self._limit >= 0 and self._nbytes > self._limit and self.oldest >= 0:
            self._remove(self.oldest)
            self.evictions += 1

    cdef void lookup(self, const uint8_t* key, bint with_donor, MaskEntry** found,
                     MaskEntry** donor) noexcept nogil:
        """found: the entry of `key` (a perfect hit); else donor: an entry of the same automaton node
        under another context, when `with_donor` allows one. Each comes with a reference for the
        caller to release."""
        cdef uint64_t h = _key_hash(key, KEY_BYTES)
        cdef int32_t i
        found[0] = donor[0] = NULL
        PyThread_acquire_lock(self.lock, WAIT_LOCK)
        i = self._find(key, h)
        if i >= 0:
            self._unlink_recent(i)
            self._link_newest(i)
            found[0] = self.slots[i].e
            entry_retain(found[0])
            self.hits += 1
        else:
            i = self._find_donor(key, _key_hash(key, FSM_KEY_BYTES)) if with_donor else -1
            if i >= 0:
                donor[0] = self.slots[i].e
                entry_retain(donor[0])
                self.partial_hits += 1
            else:
                self.misses += 1
        PyThread_release_lock(self.lock)

    cdef int store(self, const uint8_t* key, bint as_donor, MaskEntry* e) noexcept nogil:
        """Keep `e` (the pool takes its own reference) under `key`; `as_donor` lets it serve partial
        hits (entries whose inside-the-rule verdicts depend on their context must not). -1: OOM."""
        cdef uint64_t h = _key_hash(key, KEY_BYTES)
        cdef int32_t i, old
        cdef PoolSlot* s
        cdef int rc = 0
        PyThread_acquire_lock(self.lock, WAIT_LOCK)
        i = self._find(key, h)
        if i >= 0:                      # two grammars built it at once: keep the newer
            self._remove(i)
        if self.free_head < 0 and self._grow(self.cap * 2) < 0:
            rc = -1
        else:
            i = self.free_head
            s = &self.slots[i]
            self.free_head = s.next
            memcpy(s.key, key, KEY_BYTES)
            s.hash = h
            s.fhash = _key_hash(key, FSM_KEY_BYTES)
            s.e = e
            entry_retain(e)
            s.next = self.buckets[h & self.bmask]
            self.buckets[h & self.bmask] = i
            s.donor = 0
            if as_donor:
                old = self._find_donor(key, s.fhash)
                if old >= 0:
                    self._drop_donor(old)
                s = &self.slots[i]
                s.fnext = self.fbuckets[s.fhash & self.bmask]
                self.fbuckets[s.fhash & self.bmask] = i
                s.donor = 1
            self._link_newest(i)
            self._nbytes += e.nbytes
            self.n_used += 1
            self._evict()
        PyThread_release_lock(self.lock)
        return rc

    # -- the Python side ----------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        return self._nbytes

    def set_limit(self, int64_t limit_bytes) -> None:
        with nogil:
            PyThread_acquire_lock(self.lock, WAIT_LOCK)
            self._limit = limit_bytes
            self._evict()
            PyThread_release_lock(self.lock)

    def clear(self) -> None:
        with nogil:
            PyThread_acquire_lock(self.lock, WAIT_LOCK)
            while self.oldest >= 0:
                self._remove(self.oldest)
            PyThread_release_lock(self.lock)

    def __len__(self) -> int:
        return self.n_used

    def stats(self) -> dict:
        return {"entries": self.n_used, "bytes": self._nbytes, "hits": self.hits,
                "partial_hits": self.partial_hits, "misses": self.misses, "evictions": self.evictions}

    # -- transport: entries travel between processes as bytes ---------------------------------------
    def keys(self) -> list:
        """Every key, least recently used first."""
        out = []
        cdef int32_t i
        PyThread_acquire_lock(self.lock, WAIT_LOCK)
        try:
            i = self.oldest
            while i >= 0:
                out.append(bytes(self.slots[i].key[:KEY_BYTES]))
                i = self.slots[i].newer
        finally:
            PyThread_release_lock(self.lock)
        return out

    def dump(self, bytes key) -> bytes | None:
        """The compact bytes of one entry (None if absent), for another process's pool."""
        cdef MaskEntry* e = NULL
        cdef int32_t i
        if len(key) != KEY_BYTES:
            return None
        PyThread_acquire_lock(self.lock, WAIT_LOCK)
        i = self._find(<const uint8_t*>key, _key_hash(<const uint8_t*>key, KEY_BYTES))
        if i >= 0:
            e = self.slots[i].e
            entry_retain(e)
        PyThread_release_lock(self.lock)
        if e == NULL:
            return None
        try:
            return _entry_to_bytes(e, self.vocab.n_words)
        finally:
            entry_release(e)

    def __contains__(self, bytes key) -> bool:
        cdef int32_t i = -1
        if len(key) != KEY_BYTES:
            return False
        PyThread_acquire_lock(self.lock, WAIT_LOCK)
        i = self._find(<const uint8_t*>key, _key_hash(<const uint8_t*>key, KEY_BYTES))
        PyThread_release_lock(self.lock)
        return i >= 0

    def load(self, bytes key, bytes data) -> None:
        """Add an entry another process built for the same tokenizer; ValueError if malformed."""
        if len(key) != KEY_BYTES:
            raise ValueError(f"pool keys are {KEY_BYTES} bytes, got {len(key)}")
        cdef MaskEntry* e = _entry_from_bytes(data, self.vocab)
        cdef int rc = self.store(<const uint8_t*>key, True, e)
        entry_release(e)
        if rc < 0:
            raise MemoryError()
