# Included by core.pyx: the vocabulary trie over a grammar's byte classes.

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
        cdef int rc
        with nogil:     # 5-10 ms over a large vocabulary, often on a background thread beside the fills
            rc = self._build(&vocab.c, &classmap[0])
        if rc < 0:
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
