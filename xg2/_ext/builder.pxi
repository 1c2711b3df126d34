# Included by core.pyx: the mask-entry builder, the working memory of one thread's entry builds.


cdef inline void _limit_parser(Parser* p, double deadline, double cpu_budget, double cpu_start) noexcept nogil:
    p.deadline = deadline
    p.cpu_budget = cpu_budget
    p.cpu_start = cpu_start
    p.work = 0
    p.aborted = False


cdef class EntryBuilder:
    """Builds the mask entries of one compiled grammar: the trie walk with parsers A (inside the
    rule), B (what may follow it) and the certain-context parsers, the transition memo of interned
    state sets they share, and per-depth walk scratch.

    Why an object of its own: the tables a core reads are immutable once built, but a build
    mutates all of this. A core keeps one builder for the fills and lends a second one to a
    background precompute, so that a fill never waits for the precompute's build (each builder is
    used by one thread at a time, under its own lock). Made and wired by CompiledCore, which owns
    the tables it points into (`_owner` keeps them alive)."""
    cdef object _owner                # the CompiledCore whose tables these point into
    cdef GrammarC g
    cdef Vocab vocab
    cdef VocabC* vc
    cdef const TrieC* trie            # the trie mask-entry walks visit (byte trie or class trie)
    cdef EntryPool _pool              # shared across grammars, or None
    cdef const uint8_t* rule_keys     # per rule: content key of its automaton (see hashing.py)
    cdef const uint8_t* ctx_keys      # per rule: key of what may follow it
    cdef const int32_t* node_canon    # per node: its number in its rule's canonical numbering
    cdef const uint8_t* rule_shared   # per rule: its entries go through the pool
    cdef uint64_t* node_loop          # 4 words per node: bytes on which a pure node loops to itself
    cdef uint64_t* node_text          # 2 words per node: ASCII bytes that leave a "text" node; see _text_node
    cdef uint8_t* node_textual
    cdef int32_t* node_chain          # per node: text characters a chain of nodes reads (see _chain_nodes)
    cdef uint8_t* node_closed         # per node: its chain ends where no character can follow (see _chain_nodes)
    cdef PyThread_type_lock lock
    cdef int lock_waiters             # threads waiting for the lock (see CompiledCore.precompute)
    cdef Parser pa
    cdef Parser pb
    cdef Parser pc[MAX_RESUMES]
    cdef Memo memo
    cdef uint64_t* rank_bits
    cdef int32_t* acc_buf
    cdef int32_t* unc_buf
    cdef int32_t* dstate
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
    # A build stops, leaving nothing behind, once the clock passes `deadline` (0: never) and sets
    # `aborted`: one node's entry of a hostile grammar can take minutes (its Earley sets explode
    # under the walk), and no compile, precompute or fill may wait for that. Set under the lock.
    cdef double deadline
    cdef double cpu_budget            # or a budget of the thread's CPU time (see _limit_hit)
    cdef double cpu_start
    cdef bint aborted

    def __cinit__(self):
        self.lock = NULL
        self.rank_bits = NULL
        self.acc_buf = NULL
        self.unc_buf = NULL
        self.dstate = NULL
        self.pchars = NULL
        self.aid = NULL
        self.bid = NULL
        self.cids = NULL
        self.topa = NULL
        self.pbyte = NULL
        self.open_buf = NULL
        self.cacc_buf = NULL
        self.anytop = NULL
        self.narrow = NULL
        self.tpar = NULL
        self.pa.items = NULL
        self.pb.items = NULL
        for j in range(MAX_RESUMES):
            self.pc[j].items = NULL
        self.memo.pool = NULL
        self.deadline = 0
        self.cpu_budget = 0
        self.cpu_start = 0
        self.aborted = False

    cdef int _alloc(self) except -1:
        """The lock, parsers, memo and per-depth scratch (the vocabulary-sized buffers are taken
        from the vocabulary per build)."""
        cdef int64_t depth = self.vc.max_depth + 2
        cdef int32_t j
        self.lock = PyThread_allocate_lock()
        self.rank_bits = <uint64_t*>malloc(max(1, (self.vc.n_ordinary + 63) // 64) * sizeof(uint64_t))
        self.dstate = <int32_t*>malloc(depth * sizeof(int32_t))
        self.pchars = <int32_t*>calloc(depth, sizeof(int32_t))
        self.aid = <int32_t*>malloc(depth * sizeof(int32_t))
        self.bid = <int32_t*>malloc(depth * sizeof(int32_t))
        self.cids = <int32_t*>malloc(MAX_RESUMES * depth * sizeof(int32_t))
        self.topa = <uint8_t*>malloc(depth * sizeof(uint8_t))
        self.pbyte = <uint8_t*>malloc(depth * sizeof(uint8_t))
        self.anytop = <uint8_t*>malloc(depth * sizeof(uint8_t))
        self.narrow = <uint8_t*>malloc(depth * sizeof(uint8_t))
        self.tpar = <int32_t*>malloc(depth * sizeof(int32_t))
        if (self.lock == NULL or self.rank_bits == NULL or self.dstate == NULL or self.pchars == NULL
                or self.aid == NULL or self.bid == NULL or self.cids == NULL or self.topa == NULL
                or self.pbyte == NULL or self.anytop == NULL or self.narrow == NULL or self.tpar == NULL):
            raise MemoryError()
        if p_init(&self.pa) < 0 or p_init(&self.pb) < 0 or m_init(&self.memo) < 0:
            raise MemoryError()
        for j in range(MAX_RESUMES):
            if p_init(&self.pc[j]) < 0:
                raise MemoryError()
            self.pc[j].memo = &self.memo
        self.pa.memo = &self.memo
        self.pb.memo = &self.memo
        return 0

    cdef void set_deadline(self, double deadline, double cpu_budget, double cpu_start) noexcept nogil:
        """The limits of the next build (a wall-clock deadline, a CPU budget counted from
        `cpu_start`, 0: from the first check; 0: none), for its walk and its parsers' closures;
        clears `aborted`."""
        cdef int32_t j
        self.deadline = deadline
        self.cpu_budget = cpu_budget
        self.cpu_start = cpu_start
        self.aborted = False
        _limit_parser(&self.pa, deadline, cpu_budget, cpu_start)
        _limit_parser(&self.pb, deadline, cpu_budget, cpu_start)
        for j in range(MAX_RESUMES):
            _limit_parser(&self.pc[j], deadline, cpu_budget, cpu_start)

    cdef double first_cpu_start(self) noexcept nogil:
        """The earliest CPU time any check of the last build started counting from (0: none did)."""
        cdef double out = self.cpu_start
        cdef int32_t j
        if self.pa.cpu_start > 0 and (out == 0 or self.pa.cpu_start < out):
            out = self.pa.cpu_start
        if self.pb.cpu_start > 0 and (out == 0 or self.pb.cpu_start < out):
            out = self.pb.cpu_start
        for j in range(MAX_RESUMES):
            if self.pc[j].cpu_start > 0 and (out == 0 or self.pc[j].cpu_start < out):
                out = self.pc[j].cpu_start
        return out

    cdef void drop_parse(self) noexcept nogil:
        """Every parser emptied, as when the memo is cleared: their sets hold ids of the memo, which
        is about to be swapped for another (see CompiledCore.end_background)."""
        cdef int32_t j
        p_pop_to(&self.pa, 0)
        p_pop_to(&self.pb, 0)
        for j in range(MAX_RESUMES):
            p_pop_to(&self.pc[j], 0)
            self.c_done[j] = 0

    cdef bint past_deadline(self) noexcept nogil:
        """Whether the last build stopped at its deadline (in the walk or in a closure)."""
        cdef int32_t j
        if self.aborted or self.pa.aborted or self.pb.aborted:
            return True
        for j in range(MAX_RESUMES):
            if self.pc[j].aborted:
                return True
        return False

    cdef int64_t heap_bytes(self) noexcept nogil:
        """What the builder holds now: parsers and memo at the capacity they have grown to, and
        its per-depth scratch."""
        cdef int64_t depth = self.vc.max_depth + 2, total, j
        total = ((self.vc.n_ordinary + 63) // 64) * sizeof(uint64_t)
        total += depth * (4 * sizeof(int32_t) + MAX_RESUMES * sizeof(int32_t) + 4)
        total += _parser_bytes(&self.pa) + _parser_bytes(&self.pb)
        for j in range(MAX_RESUMES):
            total += _parser_bytes(&self.pc[j])
        total += _memo_bytes(&self.memo)
        return total

    def __dealloc__(self):
        cdef int32_t i
        if self.lock != NULL:
            PyThread_free_lock(self.lock)
        free(self.rank_bits)
        free(self.dstate)
        free(self.pchars)
        free(self.aid)
        free(self.bid)
        free(self.cids)
        free(self.topa)
        free(self.pbyte)
        free(self.anytop)
        free(self.narrow)
        free(self.tpar)
        if self.pa.items != NULL:
            p_free(&self.pa)
        if self.pb.items != NULL:
            p_free(&self.pb)
        for i in range(MAX_RESUMES):
            if self.pc[i].items != NULL:
                p_free(&self.pc[i])
        if self.memo.pool != NULL:
            m_free(&self.memo)

    cdef MaskEntry* _obtain(self, int32_t node) noexcept nogil:
        """The entry of a node from the pool (perfect hit), rebuilt from a pooled entry of the
        same automaton node under another lookahead (partial hit: only its open tokens are walked
        again), or built; with one reference for the caller. Called with this builder's lock held;
        NULL when out of memory."""
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
        cdef int32_t d = self._step(s, 0xC2)
        if d < 0 or self._step(d, 0x80) != s:
            return False    # U+0080 does not come back to s (a check of two steps, not the whole walk)
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
        cdef int64_t nacc = 0, nunc = 0, nopen = 0, ncacc = 0, walked = 0
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
            walked += 1
            if walked % DEADLINE_CHECK_EVERY == 0 and (self.deadline > 0 or self.cpu_budget > 0) \
                    and _limit_hit(self.deadline, self.cpu_budget, &self.cpu_start):
                self.aborted = True
                return NULL
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
