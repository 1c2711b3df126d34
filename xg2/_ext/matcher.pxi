# Included by core.pyx: one request's parse, mask fill, accept and rollback.

# ---------------------------------------------------------------------------------------------
# Matcher: one request's parse with history, mask fill, accept and rollback
# ---------------------------------------------------------------------------------------------

cdef object _fill_error(int rc, list rows):
    """The exception of a failed fill: FillTimeoutError (`rows`: the batch positions that failed)
    when an entry build ran past the fill's deadline, MemoryError otherwise."""
    if rc == BUILD_PAST_DEADLINE:
        from xg2.errors import FillTimeoutError
        return FillTimeoutError(rows)
    return MemoryError()


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
    cdef uint8_t* hist                # hist[s - 1]: the byte that made state set s (for fork)
    cdef int64_t cap_hist
    cdef readonly bint terminated
    cdef item_t* extra                # scratch: the items token edges advance to (see _edge_items)
    cdef int64_t cap_extra
    cdef int32_t* tok_end             # the last state set of each accepted token, in order (budgets)
    cdef int32_t n_tok
    cdef int32_t cap_tok

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
        self.hist = NULL
        self.cap_hist = 0
        self.extra = NULL
        self.cap_extra = 0
        self.tok_end = NULL
        self.n_tok = 0
        self.cap_tok = 0

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
        free(self.hist)
        free(self.extra)
        free(self.tok_end)
        if self.memo.pool != NULL:
            m_free(&self.memo)

    def reset(self):
        self.n_bound = 0
        self.n_tok = 0
        self.terminated = False
        if p_start(&self.p, self.g, TOP_BIT | <item_t>self.core.g.rule_start[self.core.root_rule]) < 0:
            raise MemoryError()

    @property
    def num_tokens(self):
        return self.n_bound

    def can_end(self):
        return bool(self.p.set_top[self.p.n_sets - 1])

    def completions(self, int32_t first, const int32_t[::1] wanted):
        """The completed occurrences, in the sets from `first` on, of the rules `wanted` marks
        (>= 0): (rule, the set it started in, the set it ended in, the item's index, whether it is
        the root's), a set's in order of its items."""
        cdef Parser* p = &self.p
        cdef const GrammarC* g = self.g
        cdef int32_t k, r
        cdef int64_t j, e
        cdef item_t it
        cdef uint32_t node
        if wanted.shape[0] != g.n_rules:
            raise ValueError("one entry per rule")
        out = []
        for k in range(max(first, 0), p.n_sets):
            e = p_set_end(p, k)
            for j in range(p.set_start[k], e):
                it = p.items[j]
                node = it & NODE_MASK
                r = g.node_rule[node]
                if g.node_final[node] and wanted[r] >= 0:
                    out.append((r, 0 if it & TOP_BIT else <int64_t>(it >> 32), k, j, bool(it & TOP_BIT)))
        return out

    def occurrences_above(self, int64_t j0):
        """The occurrences (rule, the set it started in; -1 for the root's) the item at index `j0`
        lies inside: its callers, theirs, up to the root, each item visited once."""
        cdef Parser* p = &self.p
        cdef const GrammarC* g = self.g
        cdef int64_t j, j2, k
        cdef int32_t r, o
        cdef item_t it
        cdef uint32_t n2
        out = set()
        seen = {j0}
        todo = [j0]
        while todo:
            j = todo.pop()
            it = p.items[j]
            r = g.node_rule[it & NODE_MASK]
            if it & TOP_BIT:
                out.add((r, -1))
                continue
            o = <int32_t>(it >> 32)
            if j != j0:
                out.add((r, o))
            for j2 in range(p.set_start[o], p_set_end(p, o)):
                n2 = p.items[j2] & NODE_MASK
                for k in range(g.re_start[n2], g.re_start[n2 + 1]):
                    if g.re_rule[k] == r:
                        if j2 not in seen:
                            seen.add(j2)
                            todo.append(j2)
                        break
        return out

    def history(self, int32_t a, int32_t b):
        """The bytes that made state sets a+1 .. b (the text read between sets a and b)."""
        if not 0 <= a <= b < self.p.n_sets:
            raise ValueError("no such state sets")
        return bytes(self.hist[a:b]) if b > a else b""

    def top_items(self):
        """The items of the current state set as (rule, node, origin set, from the root), for
        debugging: what the parse is waiting for."""
        cdef Parser* p = &self.p
        cdef int64_t j
        cdef item_t it
        out = []
        if p.n_sets == 0:
            return out
        for j in range(p.set_start[p.n_sets - 1], p.n_items):
            it = p.items[j]
            out.append((self.g.node_rule[it & NODE_MASK], <int64_t>(it & NODE_MASK), <int64_t>(it >> 32),
                        bool(it & TOP_BIT)))
        return out

    def temperature_range(self, const double[::1] temps):
        """(lowest, highest, reaches_root): over the paths the parse can go on along, the
        temperature of the innermost enclosing rule that sets one (`temps`, per rule, NaN: none);
        NaN, NaN when no path is inside such a rule, and reaches_root when some path is in none.

        A path starts at an item of the current set that can read a byte, and climbs through
        the items of its origin set that wait on its rule (the callers), each item visited once:
        linear in the items of the stack, with an explicit stack, whatever the grammar."""
        cdef Parser* p = &self.p
        cdef const GrammarC* g = self.g
        cdef int32_t top = p.n_sets - 1, r
        cdef int64_t n = p.n_items, j, j2, k, sp = 0, s0, s1
        cdef uint32_t node, n2
        cdef item_t it
        cdef double t, lo = NAN, hi = NAN     # libc's NAN: float("nan") here measured a fifth slower mask fill
        cdef bint root = False
        if temps.shape[0] != g.n_rules:
            raise ValueError("one temperature per rule")
        if top < 0 or n == 0:
            return lo, hi, True
        cdef uint8_t* seen = <uint8_t*>calloc(n, 1)
        cdef int64_t* stack = <int64_t*>malloc(n * sizeof(int64_t))
        if seen == NULL or stack == NULL:
            free(seen)
            free(stack)
            raise MemoryError()
        for j in range(p.set_start[top], n):
            node = p.items[j] & NODE_MASK
            if g.be_start[node + 1] > g.be_start[node]:
                seen[j] = 1
                stack[sp] = j
                sp += 1
        while sp > 0:
            sp -= 1
            it = p.items[stack[sp]]
            node = it & NODE_MASK
            r = g.node_rule[node]
            t = temps[r]
            if t == t:
                if not (lo <= t):
                    lo = t
                if not (hi >= t):
                    hi = t
                continue
            if it & TOP_BIT:
                root = True
                continue
            s0 = p.set_start[<int32_t>(it >> 32)]
            s1 = p_set_end(p, <int32_t>(it >> 32))
            for j2 in range(s0, s1):
                if seen[j2]:
                    continue
                n2 = p.items[j2] & NODE_MASK
                for k in range(g.re_start[n2], g.re_start[n2 + 1]):
                    if g.re_rule[k] == r:
                        seen[j2] = 1
                        stack[sp] = j2
                        sp += 1
                        break
        free(seen)
        free(stack)
        return lo, hi, root

    cdef int64_t _edge_items(self, int32_t t) noexcept nogil:
        """Into self.extra, the items of the current set that token `t` carries across a token
        edge (TokenSlot: TOKEN_LEAD and two bytes naming a set that holds `t`), advanced past it.
        Their count; -1 out of memory."""
        cdef Parser* p = &self.p
        cdef const GrammarC* g = self.g
        cdef int32_t W = self.vc.n_words, ke, k1, k2, b1, b2, slot
        cdef int64_t j, n = 0
        cdef item_t it
        cdef uint32_t node, n1, n2
        cdef item_t* grown
        for j in range(p.set_start[p.n_sets - 1], p.n_items):
            it = p.items[j]
            node = it & NODE_MASK
            for ke in range(g.be_start[node], g.be_start[node + 1]):
                if g.be_lo[ke] > TOKEN_LEAD_BYTE or g.be_hi[ke] < TOKEN_LEAD_BYTE:
                    continue
                n1 = g.be_target[ke]
                for k1 in range(g.be_start[n1], g.be_start[n1 + 1]):
                    for b1 in range(max(g.be_lo[k1], 0x80), min(g.be_hi[k1], 0xBF) + 1):
                        n2 = g.be_target[k1]
                        for k2 in range(g.be_start[n2], g.be_start[n2 + 1]):
                            for b2 in range(max(g.be_lo[k2], 0x80), min(g.be_hi[k2], 0xBF) + 1):
                                slot = ((b1 & 0x3F) << 6) | (b2 & 0x3F)
                                if slot >= self.core.n_tsets or not (
                                        (self.core.tsets[<int64_t>slot * W + (t >> 6)] >> (t & 63)) & 1):
                                    continue
                                if n == self.cap_extra:
                                    grown = <item_t*>realloc(self.extra, max(16, 2 * self.cap_extra) * sizeof(item_t))
                                    if grown == NULL:
                                        return -1
                                    self.extra, self.cap_extra = grown, max(16, 2 * self.cap_extra)
                                self.extra[n] = (it & ~(<item_t>NODE_MASK)) | <item_t>g.be_target[k2]
                                n += 1
        return n

    cdef void _or_token_edges(self, int32_t n_nodes) noexcept nogil:
        """Add to the mask in self.acc every token of the sets behind the token edges of the
        scannable nodes self.nodes[:n_nodes]."""
        cdef const GrammarC* g = self.g
        cdef int32_t W = self.vc.n_words, ke, k1, k2, b1, b2, slot, k, w
        cdef uint32_t node, n1, n2
        cdef const uint64_t* row
        for k in range(n_nodes):
            node = self.nodes[k]
            for ke in range(g.be_start[node], g.be_start[node + 1]):
                if g.be_lo[ke] > TOKEN_LEAD_BYTE or g.be_hi[ke] < TOKEN_LEAD_BYTE:
                    continue
                n1 = g.be_target[ke]
                for k1 in range(g.be_start[n1], g.be_start[n1 + 1]):
                    for b1 in range(max(g.be_lo[k1], 0x80), min(g.be_hi[k1], 0xBF) + 1):
                        n2 = g.be_target[k1]
                        for k2 in range(g.be_start[n2], g.be_start[n2 + 1]):
                            for b2 in range(max(g.be_lo[k2], 0x80), min(g.be_hi[k2], 0xBF) + 1):
                                slot = ((b1 & 0x3F) << 6) | (b2 & 0x3F)
                                if slot < self.core.n_tsets:
                                    row = self.core.tsets + <int64_t>slot * W
                                    for w in range(W):
                                        self.acc[w] |= row[w]

    cdef int _feed_edges(self, const uint8_t* data, int64_t n, int64_t n_extra) noexcept nogil:
        """A token read both ways at once: its bytes through the automata, and across the token
        edges that hold it (self.extra, from the set before it). The edge items join the set of
        its last byte, which every continuation starts from; the sets in between (where only
        the bytes are) keep the token's depth in bytes, so rollback stays by depth. 1 accepted,
        0 rejected (state restored), -1 out of memory."""
        cdef int32_t base = self.p.n_sets
        cdef int64_t i, need = base - 1 + n, cap
        cdef uint8_t* grown
        cdef int ok = 1
        if n <= 0:
            return 0
        if need > self.cap_hist:
            cap = max(need, 2 * self.cap_hist, 256)
            grown = <uint8_t*>realloc(self.hist, cap)
            if grown == NULL:
                return -1
            self.hist, self.cap_hist = grown, cap
        for i in range(n - 1):
            ok = p_push_byte(&self.p, self.g, data[i]) if ok > 0 else p_push_empty(&self.p)
            if ok < 0:
                return -1
            self.hist[base - 1 + i] = data[i]
        ok = p_push_with(&self.p, self.g, data[n - 1] if ok > 0 else -1, self.extra, n_extra)
        if ok <= 0:
            p_pop_to(&self.p, base)
            return ok
        self.hist[base - 1 + n - 1] = data[n - 1]
        return 1

    cdef int _feed(self, const uint8_t* data, int64_t n) noexcept nogil:
        """Push bytes; on failure restore the state. 1 accepted, 0 rejected, -1 OOM. Each byte
        is also kept in `hist` (one per state set: a rollback's pop trims it too), so that a
        fork can replay the parse."""
        cdef int32_t base = self.p.n_sets
        cdef int64_t i, need = base - 1 + n, cap
        cdef uint8_t* grown
        cdef int ok
        if need > self.cap_hist:
            cap = max(need, 2 * self.cap_hist, 256)
            grown = <uint8_t*>realloc(self.hist, cap)
            if grown == NULL:
                return -1
            self.hist, self.cap_hist = grown, cap
        for i in range(n):
            ok = p_push_byte(&self.p, self.g, data[i])
            if ok <= 0:
                p_pop_to(&self.p, base)
                return ok
            self.hist[base - 1 + i] = data[i]
        return 1

    def fork(self):
        """An independent matcher in this one's state, rollback history included: a new parse
        over the same compiled core, fed the bytes this one has accepted (a transition memo of
        its own, so the two never share mutable state)."""
        cdef MatcherCore m = MatcherCore(self.core, [self.stops[i] for i in range(self.n_stop)])
        cdef int ok
        with nogil:
            if self.core.n_tsets > 0 or self.core.rule_budget != NULL:
                # Token edges are crossed by tokens, not bytes: the bytes alone would not replay
                # the parse, so the sets are copied (and interned in the fork's own memo).
                ok = 1 if p_copy_from(&m.p, &self.p) == 0 else -1
            else:
                ok = m._feed(self.hist, self.p.n_sets - 1) if self.p.n_sets > 1 else 1
        if ok < 0:
            raise MemoryError()
        if ok == 0 or m.p.n_sets != self.p.n_sets:     # a replay of an accepted parse cannot fail
            raise RuntimeError("fork: the replayed parse diverged")
        if self.n_bound > m.cap_bound:
            free(m.boundaries)
            m.boundaries = <int32_t*>malloc(self.n_bound * sizeof(int32_t))
            if m.boundaries == NULL:
                raise MemoryError()
            m.cap_bound = self.n_bound
        memcpy(m.boundaries, self.boundaries, self.n_bound * sizeof(int32_t))
        m.n_bound = self.n_bound
        if self.n_tok:
            m.tok_end = <int32_t*>malloc(self.n_tok * sizeof(int32_t))
            if m.tok_end == NULL:
                raise MemoryError()
            memcpy(m.tok_end, self.tok_end, self.n_tok * sizeof(int32_t))
            m.n_tok = m.cap_tok = self.n_tok
        m.terminated = self.terminated
        return m

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

    cdef inline void _arm(self, Parser* p) noexcept nogil:
        """Give the parse the fill budget (CPU time) for what comes (an accept, the checks of a
        fill): one token's closures over a hostile grammar can take minutes, and the batch waits."""
        p.aborted = False
        p.work = 0
        p.cpu_start = 0
        p.cpu_budget = self.core.fill_timeout_s     # no clock is read unless the closures grow long

    cdef object _step_error(self):
        if self.p.aborted:
            self.p.aborted = False
            return _fill_error(BUILD_PAST_DEADLINE, [0])
        return MemoryError()

    def accept_token(self, int32_t t, bint enforce=True):
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
        cdef int64_t n_extra = 0
        if self.core.n_tsets > 0:
            with nogil:
                n_extra = self._edge_items(t)
            if n_extra < 0:
                raise MemoryError()
        self._push_boundary()
        with nogil:
            self._arm(&self.p)
            if n_extra > 0:
                ok = self._feed_edges(v.tok_data + v.tok_off[t], v.tok_off[t + 1] - v.tok_off[t], n_extra)
            else:
                ok = self._feed(v.tok_data + v.tok_off[t], v.tok_off[t + 1] - v.tok_off[t])
            self.p.cpu_budget = 0
        if ok <= 0:
            self.n_bound -= 1
            if ok < 0:
                raise self._step_error()
            return False
        if self.core.rule_budget != NULL:
            if self.n_tok == self.cap_tok:
                self.cap_tok = max(64, 2 * self.cap_tok)
                self.tok_end = <int32_t*>realloc(self.tok_end, self.cap_tok * sizeof(int32_t))
                if self.tok_end == NULL:
                    raise MemoryError()
            self.tok_end[self.n_tok] = self.p.n_sets - 1
            self.n_tok += 1
            if enforce:
                self._enforce_budgets()
        return True

    def accept_bytes(self, const uint8_t[:] data, bint enforce=True):
        cdef int ok
        if self.terminated:
            return False
        self._push_boundary()
        with nogil:
            self._arm(&self.p)
            ok = self._feed(&data[0], data.shape[0]) if data.shape[0] > 0 else 1
            self.p.cpu_budget = 0
        if ok <= 0:
            self.n_bound -= 1
            if ok < 0:
                raise self._step_error()
            return False
        if enforce and self.core.rule_budget != NULL:      # (text counts no token)
            self._enforce_budgets()
        return True

    def enforce_budgets(self):
        """What accept_token / accept_bytes do last unless told not to (see _enforce_budgets): the
        caller records what the step completed first (captures), then calls this."""
        if self.core.rule_budget != NULL:
            self._enforce_budgets()

    cdef tuple _occurrence(self, item_t x):
        """(rule, the set it started in; -1 for the root's) of an item: one occurrence of a rule."""
        return (self.g.node_rule[x & NODE_MASK], -1 if x & TOP_BIT else <int64_t>(x >> 32))

    cdef int32_t _tokens_after(self, int32_t o) noexcept nogil:
        """Accepted tokens that read a byte after state set `o` (their last set is past it)."""
        cdef int32_t lo = 0, hi = self.n_tok, mid
        while lo < hi:                      # tok_end ascends: the first one past o
            mid = (lo + hi) >> 1
            if self.tok_end[mid] > o:
                hi = mid
            else:
                lo = mid + 1
        return self.n_tok - lo

    cdef int _enforce_budgets(self) except -1:
        """xgrammar's `max_tokens`: an occurrence of a budgeted rule that has had its tokens and
        can end here must end here. Where such an occurrence is complete in the current set, the
        items that would go on inside it are dropped: its own, and every item whose only ways up
        to the root pass through it. (An occurrence that cannot end yet goes on: the budget is
        enforced at the first place it can end.) The items of the stack and their callers form a
        graph walked with explicit stacks; the current set is then interned anew."""
        cdef Parser* p = &self.p
        cdef const GrammarC* g = self.g
        cdef const int32_t* budget = self.core.rule_budget
        cdef int32_t cur = p.n_sets - 1, r, b, o32
        cdef int64_t s, e = p.n_items, j, j2, k, kept
        cdef int rc
        cdef item_t it, it2
        cdef uint32_t node, n2
        if cur < 0:
            return 0
        s = p.set_start[cur]
        # The occurrences that must end: (rule, origin) of final items whose budget is spent.
        ex = []
        for j in range(s, e):
            it = p.items[j]
            node = it & NODE_MASK
            r = g.node_rule[node]
            b = budget[r]
            if b >= 0 and g.node_final[node]:
                if self._tokens_after(<int32_t>(it >> 32) if not (it & TOP_BIT) else -1) >= b:
                    ex.append((r, <int64_t>(it >> 32) if not (it & TOP_BIT) else -1))
        if not ex:
            return 0
        spent = set(ex)

        # Upward closure of the current set's items (child -> callers), then liveness downward from
        # the root items that are not inside a spent occurrence.
        parents = {}
        order = []
        todo = list(range(s, e))
        seen = set(todo)
        while todo:
            j = todo.pop()
            order.append(j)
            it = p.items[j]
            if it & TOP_BIT:
                parents[j] = ()
                continue
            r = g.node_rule[it & NODE_MASK]
            o32 = <int32_t>(it >> 32)
            ps = []
            for j2 in range(p.set_start[o32], p_set_end(p, o32)):
                n2 = p.items[j2] & NODE_MASK
                for k in range(g.re_start[n2], g.re_start[n2 + 1]):
                    if g.re_rule[k] == r:
                        ps.append(j2)
                        if j2 not in seen:
                            seen.add(j2)
                            todo.append(j2)
                        break
            parents[j] = ps
        children = {}
        for j, ps in parents.items():
            for j2 in ps:
                children.setdefault(j2, []).append(j)
        live = set()
        todo = [j for j in order if not parents[j] and self._occurrence(p.items[j]) not in spent]
        live.update(todo)
        while todo:
            j = todo.pop()
            for j2 in children.get(j, ()):
                if j2 not in live and self._occurrence(p.items[j2]) not in spent:
                    live.add(j2)
                    todo.append(j2)
        kept = s
        saved = [p.items[j] for j in range(s, e)]
        for j in range(s, e):
            if j in live:
                p.items[kept] = p.items[j]
                kept += 1
        if kept == e:
            return 0
        p.n_items = kept
        p.hset = -1
        if p_intern_top(p) < 0:
            raise MemoryError()
        # Ending here must leave a token to write: if no token reads on from the ended set (and
        # the output cannot end here), the budget is relaxed for this step, as where the
        # occurrence cannot end at all (xgrammar does the same).
        if not p.set_top[cur]:
            rc = self._fill_acc()
            if rc < 0:
                raise _fill_error(rc, [0])
            for k in range(self.vc.n_words):
                if self.acc[k]:
                    return 0
            for j in range(s, e):
                p.items[j] = saved[j - s]
            p.n_items = e
            p.hset = -1
            if p_intern_top(p) < 0:
                raise MemoryError()
        return 0

    def rollback(self, int32_t k):
        if k < 0 or k > self.n_bound:
            raise ValueError(f"cannot roll back {k} tokens; {self.n_bound} can be rolled back")
        if k == 0:
            return
        self.n_bound -= k
        p_pop_to(&self.p, self.boundaries[self.n_bound])
        while self.n_tok > 0 and self.tok_end[self.n_tok - 1] >= self.p.n_sets:
            self.n_tok -= 1
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
            raise _fill_error(rc, [0])

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
        """The next-token mask into self.acc; 0, or BUILD_NO_MEMORY / BUILD_PAST_DEADLINE."""
        cdef VocabC* v = self.vc
        cdef Parser* p = &self.p
        cdef int32_t cur = p.n_sets - 1
        cdef int32_t W = v.n_words, WR = (v.n_ordinary + 63) // 64
        cdef int64_t j
        cdef int32_t node, n_nodes = 0, k, w, r, t, base
        cdef MaskEntry* e
        cdef uint64_t bitsw
        cdef int any_unc = 0, n_checked = 0, why = BUILD_OK
        cdef double cpu_start = 0         # one CPU budget for the fill's builds and checks
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
                e = self.core.entry_for_fill(self.nodes[k], &cpu_start, &why)
                if e == NULL:
                    return why
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
                self._arm(p)
                p.cpu_start = cpu_start
                n_checked = self._check_uncertain(WR)
                p.cpu_budget = 0
                if n_checked < 0:
                    p_pop_to(p, cur + 1)
                    if p.aborted:
                        p.aborted = False
                        return BUILD_PAST_DEADLINE
                    return -1
            if self.core.n_tsets > 0:
                self._or_token_edges(n_nodes)
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
