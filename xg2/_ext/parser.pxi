# Included by core.pyx: the byte-level Earley parser (a stack of state sets over the rule automata).

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
    double deadline       # closures stop once the clock passes it (0: never); see p_past_deadline
    double cpu_budget     # or once they have taken this much of the thread's CPU time (0: no limit)
    double cpu_start      # the thread's CPU time at the first check (0: not read yet)
    int64_t work          # closure steps since the clock was last read
    bint aborted          # a closure stopped at the deadline (its caller returned as for OOM)


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
    p.deadline = 0
    p.cpu_budget = 0
    p.cpu_start = 0
    p.work = 0
    p.aborted = False
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


cdef inline bint p_past_deadline(Parser* p, int64_t steps) noexcept nogil:
    """Count `steps` of closure work; past CLOSURE_CHECK_EVERY of them, check the limit (see
    _limit_hit). One closure
    of a hostile grammar can take minutes (sets of many items whose completions rescan their
    origin sets); an entry build gives its parsers its deadline so that it can stop inside one."""
    if p.deadline <= 0 and p.cpu_budget <= 0:
        return False
    p.work += steps
    if p.work < CLOSURE_CHECK_EVERY:
        return False
    p.work = 0
    if _limit_hit(p.deadline, p.cpu_budget, &p.cpu_start):
        p.aborted = True
        return True
    return False


cdef int p_closure(Parser* p, const GrammarC* g, int64_t i) noexcept nogil:
    """Predict and complete from item index i to the end of the open set (Aycock-Horspool nullables).
    -1 on OOM or at the parser's deadline (then `aborted` is set)."""
    cdef int32_t cur = p.n_sets - 1
    cdef item_t it, it2
    cdef uint32_t node, n2
    cdef int64_t origin, j, e
    cdef int32_t k, r, r2
    while i < p.n_items:
        if p_past_deadline(p, 1):
            return -1
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
                if p_past_deadline(p, e - j):
                    return -1
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


cdef int p_push_with(Parser* p, const GrammarC* g, int32_t b, const item_t* extra, int64_t n_extra) noexcept nogil:
    """Like p_push_byte (b < 0: scan nothing), with `extra` items added to the new set before its
    closure: the items a token edge advances to (see MatcherCore._feed_edges). The result depends
    on the token, not the byte alone, so no memo transition is recorded."""
    cdef int32_t prev = p.n_sets - 1
    cdef int64_t j, s, e
    cdef item_t it
    cdef uint32_t node
    cdef int32_t k
    if prev < 0:
        return -1
    s = p.set_start[prev]
    e = p.n_items
    if p_begin_set(p) < 0:
        return -1
    if b >= 0:
        for j in range(s, e):
            it = p.items[j]
            node = it & NODE_MASK
            for k in range(g.be_start[node], g.be_start[node + 1]):
                if g.be_lo[k] > b:
                    break
                if b <= g.be_hi[k]:
                    if p_add(p, (it & ~(<item_t>NODE_MASK)) | <item_t>g.be_target[k]) < 0:
                        return -1
    for j in range(n_extra):
        if p_add(p, extra[j]) < 0:
            return -1
    s = p.set_start[p.n_sets - 1]
    if p_closure(p, g, s) < 0:
        return -1
    if p_intern_top(p) < 0:
        return -1
    return 1 if p.n_items > s else 0


cdef int p_copy_from(Parser* dst, const Parser* src) noexcept nogil:
    """Make `dst` (with its own memo) hold the sets of `src`, set by set, each interned anew."""
    cdef int32_t k
    cdef int64_t a, n
    p_pop_to(dst, 0)
    for k in range(src.n_sets):
        if _open_set(dst) < 0:
            return -1
        a = src.set_start[k]
        n = (src.set_start[k + 1] if k + 1 < src.n_sets else src.n_items) - a
        if dst.n_items + n > dst.cap_items:
            while dst.n_items + n > dst.cap_items:
                dst.cap_items *= 2
            dst.items = <item_t*>realloc(dst.items, dst.cap_items * sizeof(item_t))
            if dst.items == NULL:
                return -1
        memcpy(dst.items + dst.n_items, src.items + a, n * sizeof(item_t))
        dst.n_items += n
        dst.set_top[k] = src.set_top[k]
        if p_intern_top(dst) < 0:
            return -1
    dst.hset = -1
    return 0


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
