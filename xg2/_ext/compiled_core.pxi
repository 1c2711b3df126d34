# Included by core.pyx: a grammar's flat tables and its lazily built mask entries.

cdef int _cmp_cost_desc(const void* a, const void* b) noexcept nogil:
    """(cost, node) pairs: costliest first, then by node."""
    cdef const int64_t* x = <const int64_t*>a
    cdef const int64_t* y = <const int64_t*>b
    if x[0] != y[0]:
        return -1 if x[0] > y[0] else 1
    return (x[1] > y[1]) - (x[1] < y[1])


cdef inline void _let_waiters_in(PyObject* bp) noexcept nogil:
    """Before a precompute takes builder `bp` for its next entry, a fill waiting for that builder
    has it first: the lock is not fair, and a precompute that took it again at once kept the first
    fills waiting for its whole budget."""
    cdef int spins = 0
    while xg2_int_load(&(<EntryBuilder>bp).lock_waiters) > 0 and spins < 100000:
        sched_yield()
        spins += 1


cdef class CompiledCore:
    """Flat grammar tables plus the lazily built mask entries, one per scannable node.

    Entries are built by an EntryBuilder: `fill` for the fills (and the compile-time part of the
    partial JIT), and `background`, lent to a background precompute while it runs. Either
    publishes an entry with one compare-and-swap, so the two never wait for each other; a node
    both built at once keeps the first and drops the other."""
    cdef GrammarC g
    cdef object _arrays
    cdef readonly Vocab vocab
    cdef VocabC* vc
    cdef const TrieC* trie            # the trie mask-entry walks visit (byte trie or class trie)
    cdef object _class_trie
    cdef readonly int32_t root_rule
    cdef MaskEntry** entries
    cdef uint64_t* node_loop          # 4 words per node: bytes on which a pure node loops to itself
    cdef uint64_t* node_text          # 2 words per node: ASCII bytes that leave a "text" node; see _text_node
    cdef uint8_t* node_textual
    cdef int32_t* node_chain          # per node: text characters a chain of nodes reads (see _chain_nodes)
    cdef uint8_t* node_closed         # per node: its chain ends where no character can follow (see _chain_nodes)
    cdef readonly EntryPool _pool     # shared across grammars, or None
    cdef const uint8_t* rule_keys     # per rule: content key of its automaton (see hashing.py)
    cdef const uint8_t* ctx_keys      # per rule: key of what may follow it
    cdef const int32_t* node_canon    # per node: its number in its rule's canonical numbering
    cdef const uint8_t* rule_shared   # per rule: its entries go through the pool
    cdef EntryBuilder fill            # the fills' builder
    cdef PyObject* fill_ptr           # the same, borrowed, for nogil code
    cdef EntryBuilder background      # a background precompute's builder while it runs, else None
    cdef int bg_node                  # the node the background builder is building now (-1: none)
    cdef int bg_cancel                # set: the background precompute stops before its next entry
    cdef readonly int64_t cache_bytes
    cdef readonly int64_t n_entries
    cdef const uint64_t* tsets        # per token set (TokenSlot), a bitset over the vocabulary
    cdef const int32_t* rule_budget   # per rule, its max_tokens (-1: none); NULL when no rule has one
    cdef readonly int32_t n_tsets
    #: Seconds of its thread's CPU time a fill may spend building an entry it lacks, or an accept
    #: or a fill's checks may spend in the parser (0: no limit); past it FillTimeoutError, and the
    #: entry is left unbuilt, the parse as it was (GrammarCompiler sets it).
    cdef public double fill_timeout_s

    def __cinit__(self):
        self.entries = NULL
        self.node_loop = NULL
        self.node_text = NULL
        self.node_textual = NULL
        self.node_chain = NULL
        self.node_closed = NULL
        self.fill_ptr = NULL
        self.fill_timeout_s = 0
        self.bg_node = -1
        self.bg_cancel = 0

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
        if self.entries == NULL:
            raise MemoryError()
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
        self.node_chain = <int32_t*>calloc(max(1, self.g.n_nodes), sizeof(int32_t))
        self.node_closed = <uint8_t*>calloc(max(1, self.g.n_nodes), 1)
        if self.node_chain == NULL or self.node_closed == NULL:
            raise MemoryError()
        self.rule_budget = NULL
        if "rule_max_tokens" in keep:
            if len(keep["rule_max_tokens"]) != self.g.n_rules:
                raise ValueError("one max_tokens per rule")
            self.rule_budget = <const int32_t*>_ptr(keep, "rule_max_tokens", np.int32)
        self.n_tsets = 0
        if "token_set_start" in keep:
            self._token_sets(keep)
        self.fill = self._new_builder()
        self.fill_ptr = <PyObject*>self.fill
        for nd in range(self.g.n_nodes):
            if self.g.be_start[nd + 1] > self.g.be_start[nd]:
                self.fill._text_node(nd)
        with nogil:
            self.fill._chain_nodes()
        self.cache_bytes = 0
        self.n_entries = 0

    def _token_sets(self, dict keep):
        """The grammar's token sets as vocabulary bitsets: a set's ids, or for an excluding set
        every other id, keeping only tokens with text (what xgrammar counts: tokens without
        text, such as its special tokens, are never a token edge; stop tokens are the matcher's
        to allow or not, as everywhere)."""
        cdef int32_t V = self.vc.vocab_size, W = self.vc.n_words, k, t
        start = np.asarray(keep["token_set_start"], np.int64)
        ids = np.asarray(keep["token_set_ids"], np.int64)
        exclude = np.asarray(keep["token_set_exclude"], np.uint8)
        n = len(start) - 1
        if n < 0 or len(exclude) != n or (n and (start[0] != 0 or start[n] != len(ids) or (np.diff(start) < 0).any())):
            raise ValueError("malformed token set tables")
        if len(ids) and (ids.min() < 0 or ids.max() >= V):
            from xg2.errors import GrammarError
            bad = int(ids.max() if ids.max() >= V else ids.min())
            raise GrammarError(f"token id {bad} in Token(...) / ExcludeToken(...) is outside the vocabulary "
                               f"(size {V})")
        with_text = np.array([self.vc.token_rank[t] >= 0 for t in range(V)], dtype=bool)
        rows = np.zeros((max(1, n), W * 64), dtype=bool)
        for k in range(n):
            member = np.zeros(W * 64, dtype=bool)
            member[ids[start[k]:start[k + 1]]] = True
            if exclude[k]:
                member[:V] = ~member[:V]
                member[V:] = False
            member[:V] &= with_text
            rows[k] = member
        # Bit t of word t >> 6 is token t, as in the masks (little-endian words).
        table = np.ascontiguousarray(np.packbits(rows, axis=1, bitorder="little")).view("<u8").astype(np.uint64)
        keep["_token_sets"] = table
        self.tsets = <const uint64_t*>_ptr(keep, "_token_sets", np.uint64)
        self.n_tsets = n

    cdef EntryBuilder _new_builder(self):
        """A builder wired to this core's tables."""
        cdef EntryBuilder b = EntryBuilder.__new__(EntryBuilder)
        b._owner = self
        b.g = self.g
        b.vocab = self.vocab
        b.vc = self.vc
        b.trie = self.trie
        b._pool = self._pool
        b.rule_keys = self.rule_keys
        b.ctx_keys = self.ctx_keys
        b.node_canon = self.node_canon
        b.rule_shared = self.rule_shared
        b.node_loop = self.node_loop
        b.node_text = self.node_text
        b.node_textual = self.node_textual
        b.node_chain = self.node_chain
        b.node_closed = self.node_closed
        b._alloc()
        return b

    @property
    def heap_bytes(self) -> int:
        """What this core keeps in C besides its tables and entries, at the capacity the fills'
        builder's parsers and transition memo have grown to (they grow while entries are built):
        the figure a cache budget must count, not a per-node guess. A background precompute's
        builder is left out: it is working memory of one job at a time, given back when the job
        ends, and counting it evicted the grammars and modules a cache is for while a job ran."""
        cdef int64_t total
        total = <int64_t>self.g.n_nodes * (sizeof(MaskEntry*) + 6 * sizeof(uint64_t) + 1 + sizeof(int32_t) + 1)
        return total + self.fill.heap_bytes()

    @property
    def background_heap_bytes(self) -> int:
        """The background precompute's builder's working memory now (0 when none runs)."""
        return 0 if self.background is None else int(self.background.heap_bytes())

    def __dealloc__(self):
        cdef int32_t i
        if self.entries != NULL:
            for i in range(self.g.n_nodes):
                entry_release(self.entries[i])
        free(self.entries)
        free(self.node_loop)
        free(self.node_text)
        free(self.node_textual)
        free(self.node_chain)
        free(self.node_closed)

    cdef MaskEntry* get_entry(self, int32_t node) noexcept nogil:
        """A node's entry, built on first need by the fills' builder, without a limit (for
        inspection). Fills on other threads read the table without a lock, so an entry is
        published with a release store (see _install) and read with an acquire load: a reader
        that sees the pointer sees the entry's contents."""
        cdef int why
        cdef MaskEntry* e = <MaskEntry*>xg2_load_acquire(<void**>&self.entries[node])
        if e != NULL:
            return e
        return self._build_in(self.fill_ptr, node, 0, 0, &why)

    cdef MaskEntry* entry_for_fill(self, int32_t node, double* cpu_start, int* why) noexcept nogil:
        """A node's entry for a fill: built if missing, within fill_timeout_s of this thread's CPU
        time for the whole fill (*cpu_start: the fill's CPU time when its first build was checked;
        0 until then). NULL with *why BUILD_NO_MEMORY or BUILD_PAST_DEADLINE."""
        cdef double until
        cdef MaskEntry* e = <MaskEntry*>xg2_load_acquire(<void**>&self.entries[node])
        if e != NULL:
            return e
        if xg2_int_load(&self.bg_node) == node:
            # The background precompute is building this very entry: it started first, so its
            # build ends sooner than one started now would (and two builds of one entry share the
            # machine's cores for nothing). Wait for it, at most the fill's budget, then build.
            until = _monotonic() + (self.fill_timeout_s if self.fill_timeout_s > 0 else 1.0)
            while xg2_int_load(&self.bg_node) == node and _monotonic() < until:
                usleep(20)
            e = <MaskEntry*>xg2_load_acquire(<void**>&self.entries[node])
            if e != NULL:
                return e
        return self._build_in(self.fill_ptr, node, 0, self.fill_timeout_s, why, cpu_start)

    cdef MaskEntry* _build_in(self, PyObject* bp, int32_t node, double deadline, double cpu_budget,
                              int* why, double* cpu_start=NULL) noexcept nogil:
        """A node's entry, built (or found in the pool) by builder `bp` (borrowed: its owner keeps
        it alive) under that builder's lock, unless `deadline` or `cpu_budget` (0: none; see
        _limit_hit) is reached first; NULL with *why BUILD_NO_MEMORY or BUILD_PAST_DEADLINE
        (nothing of the attempt is kept). `cpu_start`: where the CPU budget started counting, shared
        by the builds of one fill (read and written back)."""
        cdef MaskEntry* e
        why[0] = BUILD_OK
        xg2_ref_add(&(<EntryBuilder>bp).lock_waiters)
        PyThread_acquire_lock((<EntryBuilder>bp).lock, WAIT_LOCK)
        xg2_ref_sub(&(<EntryBuilder>bp).lock_waiters)
        e = <MaskEntry*>xg2_load_acquire(<void**>&self.entries[node])
        if e == NULL:
            (<EntryBuilder>bp).set_deadline(deadline, cpu_budget, 0 if cpu_start == NULL else cpu_start[0])
            e = (<EntryBuilder>bp)._obtain(node)
            if cpu_start != NULL:
                cpu_start[0] = (<EntryBuilder>bp).first_cpu_start()
            if e != NULL:
                e = self._install(node, e)
            else:
                why[0] = BUILD_PAST_DEADLINE if (<EntryBuilder>bp).past_deadline() else BUILD_NO_MEMORY
            (<EntryBuilder>bp).set_deadline(0, 0, 0)
        PyThread_release_lock((<EntryBuilder>bp).lock)
        return e

    cdef MaskEntry* _install(self, int32_t node, MaskEntry* e) noexcept nogil:
        """Publish `e` as the node's entry unless another builder did first (then `e` is dropped);
        the node's entry either way."""
        if xg2_cas_ptr(<void**>&self.entries[node], e):
            xg2_add64(&self.cache_bytes, e.nbytes)
            xg2_add64(&self.n_entries, 1)
            return e
        entry_release(e)
        return <MaskEntry*>xg2_load_acquire(<void**>&self.entries[node])

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
                self.fill._pool_key(nd, key)
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
        with nogil:
            self._install(node, e)

    def use_class_trie(self, ClassTrie class_trie):
        """Walk `class_trie` from the next build on (a grammar compiled before its class trie
        was built starts on the byte trie; the entries are the same either way). Each builder
        changes over under its own lock, so no walk switches tries midway."""
        if class_trie is None or self._class_trie is not None:
            return
        self._class_trie = class_trie
        self.trie = &class_trie.t
        for b in (self.fill, self.background):
            if b is None:
                continue
            with nogil:
                PyThread_acquire_lock((<EntryBuilder>b).lock, WAIT_LOCK)
            (<EntryBuilder>b).trie = self.trie
            PyThread_release_lock((<EntryBuilder>b).lock)

    def start_background(self):
        """Lend a second builder to a background precompute: its builds then never hold the lock
        a fill waits for. end_background gives its working memory back."""
        if self.background is None:
            self.background = self._new_builder()

    def cancel_background(self):
        """Have the background precompute stop before its next entry (another grammar's goes first)."""
        xg2_int_store(&self.bg_cancel, 1)

    def resume_background(self):
        """Whether the last background precompute was cancelled; clears it for the next run."""
        cdef int was = xg2_int_load(&self.bg_cancel)
        xg2_int_store(&self.bg_cancel, 0)
        return bool(was)

    def end_background(self):
        """The background builder goes; its transition memo stays, with the fills' builder, when it
        is the warmer one. Why: a precompute on the compile path warms the fills' own memo, so the
        lazy builds of the first fills after it reuse the state sets it interned (measured on the
        EBNF corpus: fills 1.3-2x slower after a background precompute than after the same one on
        the compile path, until the fills' memo caught up). The memo depends on the grammar alone."""
        cdef EntryBuilder b = self.background
        cdef EntryBuilder f = self.fill
        cdef Memo tmp
        if b is None:
            return
        self.background = None
        with nogil:
            PyThread_acquire_lock(f.lock, WAIT_LOCK)
            PyThread_acquire_lock(b.lock, WAIT_LOCK)
            if b.memo.n_ids > f.memo.n_ids and b.memo.pool != NULL and f.memo.pool != NULL:
                f.drop_parse()
                b.drop_parse()
                tmp = f.memo
                f.memo = b.memo
                b.memo = tmp
            PyThread_release_lock(b.lock)
            PyThread_release_lock(f.lock)

    def precompute(self, nodes, double deadline=0):
        """Build the entries of the given nodes now with the fills' builder (the first mask's, or
        every entry with jit=False); CompileTimeout, with the entry left unbuilt, once
        `deadline` (time.perf_counter seconds; 0: none) passes, even inside one node's build."""
        cdef int32_t n
        cdef int why = BUILD_OK
        for n in nodes:
            if not 0 <= n < self.g.n_nodes:
                raise IndexError(f"node {n} out of range")
            if self.g.be_start[n + 1] == self.g.be_start[n]:
                continue
            with nogil:
                _let_waiters_in(self.fill_ptr)
                if xg2_load_acquire(<void**>&self.entries[n]) == NULL:
                    self._build_in(self.fill_ptr, n, deadline, 0, &why)
            if why == BUILD_NO_MEMORY:
                raise MemoryError()
            if why == BUILD_PAST_DEADLINE:
                from xg2.grammar import budget
                budget.check(f"the mask entry of grammar node {n}")     # the compile's own message
                raise budget.CompileTimeout(f"building the mask entry of grammar node {n} ran past the "
                                            f"compile deadline")

    def precompute_costliest(self, double deadline, int64_t top_k=-1, bint background=False,
                             double hard_deadline=0):
        """The partial JIT ahead of the fills, in one call without the GIL: the scannable nodes
        without an entry, costliest first by estimate_cost (the builds a fill mid-generation
        would stall on), each built unless `deadline` (time.perf_counter seconds) has passed or
        the time per estimated trie node seen so far predicts it would overrun it (then it is
        left for its first visit); at most `top_k` (-1: no limit). `background`: with the
        builder start_background lent. A build still running at `hard_deadline` (0: none) stops
        there and is left for its first visit too. How many were built.

        Why in C: the loop used to be Python around one call per node, and a background thread
        that takes the GIL back after every small build slowed the compiles beside it."""
        cdef EntryBuilder b = self.background if background else self.fill
        if b is None:
            raise RuntimeError("precompute_costliest(background=True) without start_background()")
        cdef PyObject* bp = <PyObject*>b
        cdef int32_t n, count = 0, k
        cdef int why = BUILD_OK
        cdef MaskEntry* e
        cdef int64_t built = 0
        cdef double now, spu = 25e-9, t
        cdef int64_t* pairs
        if top_k == 0 or _monotonic() >= deadline:
            return 0
        pairs = <int64_t*>malloc(max(1, self.g.n_nodes) * 2 * sizeof(int64_t))
        if pairs == NULL:
            raise MemoryError()
        with nogil:
            for n in range(self.g.n_nodes):
                if self.g.be_start[n + 1] > self.g.be_start[n] and \
                        xg2_load_acquire(<void**>&self.entries[n]) == NULL:
                    pairs[2 * count] = b._estimate_cost(n)
                    pairs[2 * count + 1] = n
                    count += 1
            qsort(pairs, count, 2 * sizeof(int64_t), _cmp_cost_desc)
            for k in range(count):
                now = _monotonic()
                if now >= deadline or (background and xg2_int_load(&self.bg_cancel)):
                    break
                if now + pairs[2 * k] * spu > deadline:
                    continue
                n = <int32_t>pairs[2 * k + 1]
                if not background:
                    _let_waiters_in(bp)
                if xg2_load_acquire(<void**>&self.entries[n]) == NULL:
                    if background:
                        xg2_int_store(&self.bg_node, n)     # a fill that needs it waits for it
                    e = self._build_in(bp, n, hard_deadline, 0, &why)
                    if background:
                        xg2_int_store(&self.bg_node, -1)
                    if e == NULL:
                        if why == BUILD_PAST_DEADLINE:
                            break       # left for its first visit
                        built = -1
                        break
                    built += 1
                if pairs[2 * k] > 1000:
                    t = (_monotonic() - now) / pairs[2 * k]
                    if t > spu:
                        spu = t
                if top_k > 0 and built >= top_k:
                    break
        free(pairs)
        if built < 0:
            raise MemoryError()
        return built

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
    def initial_nodes(self):
        """Scannable nodes of the parse's first state set: the entries the first mask needs."""
        cdef Parser* A = &self.fill.pa
        cdef int64_t j
        cdef uint32_t nd
        out = set()
        with nogil:     # never wait for the lock holding the GIL: a builder may need the GIL
            PyThread_acquire_lock(self.fill.lock, WAIT_LOCK)
        try:
            if p_start(A, &self.g, TOP_BIT | <item_t>self.g.rule_start[self.root_rule]) < 0:
                raise MemoryError()
            for j in range(A.set_start[0], A.n_items):
                nd = A.items[j] & NODE_MASK
                if self.g.be_start[nd + 1] > self.g.be_start[nd]:
                    out.add(nd)
            p_pop_to(A, 0)
        finally:
            PyThread_release_lock(self.fill.lock)
        return sorted(out)

    def estimate_cost(self, int32_t node):
        """Trie nodes under the first bytes the node's closure can scan: a cheap proxy for the cost
        of its mask entry (the walk visits roughly those subtrees)."""
        cdef int64_t total
        with nogil:
            total = self.fill._estimate_cost(node)
        return total

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
