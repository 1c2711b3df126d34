# Included by core.pyx: mask entries (accepted / rejected / uncertain tokens) and their bytes.

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
