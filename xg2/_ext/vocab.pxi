# Included by core.pyx: UTF-8 structure, the vocabulary's byte trie, and Vocab.

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
