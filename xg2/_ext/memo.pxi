# Included by core.pyx: interned Earley state sets and the transition memo over them.

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
