# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Rule automata in C: epsilon-NFA -> subset construction -> minimal DFA -> canonical numbering.

Compiling a grammar builds one automaton per rule, and a large JSON schema has hundreds of rules; in
Python each one cost milliseconds, which dominated the time to the first mask. Everything here runs
on growable C arrays; Python objects are touched only to read the rule body (or a flat edge list) at
the start and to emit the RuleFSM lists at the end. The subset construction follows the Python
reference state for state (same discovery order, same state limit and closure work budget), so the
same rules hit the same limits.

The result is the *minimal* partial DFA (rule calls are ordinary input symbols): states from which
no final state is reachable are dropped, then Valmari and Lehtinen's partition refinement for
partial transition functions ("Efficient minimization of DFAs with partial transition functions",
STACS 2008) merges equivalent states in O(m log n). A minimal DFA is unique up to renaming, so the
breadth-first numbering at the end (the same order as `fsm.canonical`) makes equal languages give
identical automata, which the rule-sharing and node-to-node mapping downstream rely on.

Byte transitions are ranges. For the subset construction each state's ranges are split into
disjoint elementary intervals (a sorted handful of boundaries, or a 257-entry table when there are
many edges); for minimisation the bytes are
grouped into classes that no range boundary of the DFA separates, and each class is one letter.
"""

from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, qsort, realloc
from libc.string cimport memcmp, memcpy, memset

from hashlib import blake2b as _blake2b

from xg2.grammar.ir import CharClass, Choice, Literal, Repeat, RuleRef, Seq, TokenSlot, text_bytes, token_slot_bytes


cdef struct Vec:
    int32_t* d
    Py_ssize_t n
    Py_ssize_t cap


cdef struct LVec:
    int64_t* d
    Py_ssize_t n
    Py_ssize_t cap


cdef int _grow(Vec* v, Py_ssize_t need) except -1:
    cdef Py_ssize_t cap = v.cap * 2 if v.cap else 16
    while cap < need:
        cap *= 2
    cdef int32_t* p = <int32_t*>realloc(v.d, cap * sizeof(int32_t))
    if p == NULL:
        raise MemoryError()
    v.d = p
    v.cap = cap
    return 0


cdef int _lgrow(LVec* v, Py_ssize_t need) except -1:
    cdef Py_ssize_t cap = v.cap * 2 if v.cap else 16
    while cap < need:
        cap *= 2
    cdef int64_t* p = <int64_t*>realloc(v.d, cap * sizeof(int64_t))
    if p == NULL:
        raise MemoryError()
    v.d = p
    v.cap = cap
    return 0


cdef inline int push(Vec* v, int32_t x) except -1:
    if v.n == v.cap:
        _grow(v, v.n + 1)
    v.d[v.n] = x
    v.n += 1
    return 0


cdef inline int lpush(LVec* v, int64_t x) except -1:
    if v.n == v.cap:
        _lgrow(v, v.n + 1)
    v.d[v.n] = x
    v.n += 1
    return 0


cdef inline int resize(Vec* v, Py_ssize_t n) except -1:
    if n > v.cap:
        _grow(v, n)
    v.n = n
    return 0


cdef inline int fill(Vec* v, Py_ssize_t n, int32_t x) except -1:
    cdef Py_ssize_t i
    resize(v, n)
    for i in range(n):
        v.d[i] = x
    return 0


cdef int _cmp_i32(const void* a, const void* b) noexcept nogil:
    cdef int32_t x = (<const int32_t*>a)[0]
    cdef int32_t y = (<const int32_t*>b)[0]
    return (x > y) - (x < y)


cdef int _cmp_i64(const void* a, const void* b) noexcept nogil:
    cdef int64_t x = (<const int64_t*>a)[0]
    cdef int64_t y = (<const int64_t*>b)[0]
    return (x > y) - (x < y)


cdef inline void sort_i32(int32_t* a, Py_ssize_t n) noexcept nogil:
    """Insertion sort for the usual handful of elements, libc qsort beyond."""
    cdef Py_ssize_t i, j
    cdef int32_t x
    if n > 24:
        qsort(a, n, sizeof(int32_t), _cmp_i32)
        return
    for i in range(1, n):
        x = a[i]
        j = i - 1
        while j >= 0 and a[j] > x:
            a[j + 1] = a[j]
            j -= 1
        a[j + 1] = x


cdef inline void sort_i64(int64_t* a, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i, j
    cdef int64_t x
    if n > 24:
        qsort(a, n, sizeof(int64_t), _cmp_i64)
        return
    for i in range(1, n):
        x = a[i]
        j = i - 1
        while j >= 0 and a[j] > x:
            a[j + 1] = a[j]
            j -= 1
        a[j + 1] = x


cdef class _Partition:
    """A refinable partition of 0..n-1 (Valmari & Lehtinen): elements of a set are contiguous in
    `elems`; `mark` moves an element to the front part of its set, `split` cuts every touched set
    into marked and unmarked parts, keeping the larger part under the old number (which is what
    makes the refinement O(m log n))."""

    cdef Vec elems, loc, sidx, first, past, marked, touched
    cdef int32_t z

    def __dealloc__(self):
        free(self.elems.d)
        free(self.loc.d)
        free(self.sidx.d)
        free(self.first.d)
        free(self.past.d)
        free(self.marked.d)
        free(self.touched.d)

    cdef int init(self, Py_ssize_t n) except -1:
        cdef Py_ssize_t i
        resize(&self.elems, n)
        resize(&self.loc, n)
        fill(&self.sidx, n, 0)
        fill(&self.first, n + 1, 0)
        fill(&self.past, n + 1, 0)
        fill(&self.marked, n + 1, 0)
        resize(&self.touched, 0)
        for i in range(n):
            self.elems.d[i] = <int32_t>i
            self.loc.d[i] = <int32_t>i
        self.past.d[0] = <int32_t>n
        self.z = 1 if n else 0
        return 0

    cdef inline int mark(self, int32_t e) except -1:
        """Callers never mark an element twice between splits (one transition per state and label)."""
        cdef int32_t s = self.sidx.d[e]
        cdef int32_t i = self.loc.d[e]
        cdef int32_t j = self.first.d[s] + self.marked.d[s]
        self.elems.d[i] = self.elems.d[j]
        self.loc.d[self.elems.d[i]] = i
        self.elems.d[j] = e
        self.loc.d[e] = j
        if self.marked.d[s] == 0:
            push(&self.touched, s)
        self.marked.d[s] += 1
        return 0

    cdef void split(self) noexcept:
        cdef int32_t s, j, z, i
        while self.touched.n:
            self.touched.n -= 1
            s = self.touched.d[self.touched.n]
            j = self.first.d[s] + self.marked.d[s]
            if j == self.past.d[s]:
                self.marked.d[s] = 0
                continue
            z = self.z
            if self.marked.d[s] <= self.past.d[s] - j:
                self.first.d[z] = self.first.d[s]
                self.past.d[z] = j
                self.first.d[s] = j
            else:
                self.past.d[z] = self.past.d[s]
                self.first.d[z] = j
                self.past.d[s] = j
            for i in range(self.first.d[z], self.past.d[z]):
                self.sidx.d[self.elems.d[i]] = z
            self.marked.d[s] = 0
            self.marked.d[z] = 0
            self.z = z + 1


cdef inline uint64_t _hash(const int32_t* a, Py_ssize_t n) noexcept nogil:
    cdef uint64_t h = 1469598103934665603ULL ^ <uint64_t>n
    cdef Py_ssize_t i
    for i in range(n):
        h = (h ^ <uint64_t><uint32_t>a[i]) * 1099511628211ULL
    h ^= h >> 29
    h *= 0xBF58476D1CE4E5B9ULL
    h ^= h >> 32
    return h


#: id(CharClass) -> (the class, its packed byte sequences). Front-ends reuse the same class objects
#: over and over (a key exclusion has hundreds of them in one body), and the lookup in
#: `class_sequences` hashes and compares every range of a class in Python (dataclass __hash__ and
#: __eq__). Keying by identity costs an int hash; holding the class keeps its id from being reused.
cdef dict _CLASS_BYTES = {}
cdef Py_ssize_t _CLASS_BYTES_MAX = 1 << 16


cdef bytes _class_bytes(object cc, object class_sequences):
    """A class's UTF-8 byte-range sequences as bytes: per sequence its length, then lo, hi per byte."""
    cdef tuple entry = _CLASS_BYTES.get(id(cc))
    if entry is not None and entry[0] is cc:
        return <bytes>entry[1]
    cdef bytearray out = bytearray()
    for seq in class_sequences(cc):
        out.append(len(seq))
        for a, b in seq:
            out.append(a)
            out.append(b)
    if len(_CLASS_BYTES) >= _CLASS_BYTES_MAX:
        _CLASS_BYTES.clear()
    packed = bytes(out)
    _CLASS_BYTES[id(cc)] = (cc, packed)
    return packed


cdef class _Builder:
    """All buffers of one build; freed together when the builder goes away (also on errors)."""

    # the NFA as CSR: epsilon edges, byte-range edges, rule edges
    cdef Vec eps_off, eps_dst, byt_off, byt_a, byt_b, byt_dst, rul_off, rul_r, rul_dst
    # subset states: sorted NFA node sets concatenated in `pool`, interned through `table`
    cdef Vec pool, table, st_final, mark, stack, clo, seeds
    cdef LVec st_off, st_hash, pairs
    cdef int32_t stamp, n_states
    cdef int32_t n_nfa, end
    # the DFA: per state its byte ranges (lo, hi, target) and rule edges (rule, target)
    cdef Vec be_off, be_lo, be_hi, be_tgt, re_off, re_r, re_tgt
    # per-state scratch for splitting byte ranges
    cdef Vec ea, eb, ev, cover
    # the NFA as built: five ints per edge (src, kind, a, b, dst)
    cdef Vec flat
    # minimisation: predecessors, live states, letters, transitions (tail, label, head), quotient
    cdef Vec m_pred_off, m_pred, m_alive, m_cid, m_orig, m_T, m_L, m_H, m_in_off, m_in_t, m_lab_off
    cdef Vec m_num, m_order, m_rep
    cdef Vec q_cnt, q_lo, q_hi, q_tgt     # the minimal DFA's byte edges, flat (see minimal)
    cdef _Partition blocks, cords

    def __cinit__(self):
        self.blocks = _Partition()
        self.cords = _Partition()

    def __dealloc__(self):
        cdef Vec* vs[32]
        cdef int k
        vs[0] = &self.eps_off
        vs[1] = &self.eps_dst
        vs[2] = &self.byt_off
        vs[3] = &self.byt_a
        vs[4] = &self.byt_b
        vs[5] = &self.byt_dst
        vs[6] = &self.rul_off
        vs[7] = &self.rul_r
        vs[8] = &self.rul_dst
        vs[9] = &self.pool
        vs[10] = &self.table
        vs[11] = &self.st_final
        vs[12] = &self.mark
        vs[13] = &self.stack
        vs[14] = &self.clo
        vs[15] = &self.seeds
        vs[16] = &self.be_off
        vs[17] = &self.be_lo
        vs[18] = &self.be_hi
        vs[19] = &self.be_tgt
        vs[20] = &self.re_off
        vs[21] = &self.re_r
        vs[22] = &self.re_tgt
        vs[23] = &self.ea
        vs[24] = &self.eb
        vs[25] = &self.ev
        vs[26] = &self.cover
        vs[27] = &self.flat
        for k in range(28):
            free(vs[k].d)
        free(self.m_pred_off.d)
        free(self.m_pred.d)
        free(self.m_alive.d)
        free(self.m_cid.d)
        free(self.m_orig.d)
        free(self.m_T.d)
        free(self.m_L.d)
        free(self.m_H.d)
        free(self.m_in_off.d)
        free(self.m_in_t.d)
        free(self.m_lab_off.d)
        free(self.m_num.d)
        free(self.m_order.d)
        free(self.m_rep.d)
        free(self.q_cnt.d)
        free(self.q_lo.d)
        free(self.q_hi.d)
        free(self.q_tgt.d)
        free(self.st_off.d)
        free(self.st_hash.d)
        free(self.pairs.d)

    cdef int load_list(self, list flat, int32_t n_nodes) except -1:
        """Copy a Python flat edge list (src, kind, a, b, dst per edge) in, checking every field."""
        cdef Py_ssize_t i, n = (len(flat) // 5) * 5
        cdef int32_t kind, a, b
        if n != len(flat):
            raise ValueError("the flat edge list must hold five ints per edge")
        resize(&self.flat, n)
        for i in range(n):
            self.flat.d[i] = flat[i]
        for i in range(0, n, 5):
            kind = self.flat.d[i + 1]
            a = self.flat.d[i + 2]
            b = self.flat.d[i + 3]
            if not (0 <= self.flat.d[i] < n_nodes and 0 <= self.flat.d[i + 4] < n_nodes):
                raise ValueError("edge endpoint out of range")
            if kind == 0 and not (0 <= a <= b <= 255):
                raise ValueError("byte range out of range")
            if kind == 1 and a < 0:
                raise ValueError("negative rule index")
            if not (0 <= kind <= 2):
                raise ValueError("unknown edge kind")
        self.n_nfa = n_nodes
        return 0

    cdef inline int32_t node(self, int32_t limit) except -2:
        """A new NFA node, or -1 past `limit` nodes (the caller reports the limit)."""
        if self.n_nfa >= limit:
            return -1
        self.n_nfa += 1
        return self.n_nfa - 1

    cdef inline int edge(self, int32_t u, int32_t kind, int32_t a, int32_t b, int32_t v) except -1:
        cdef Py_ssize_t n = self.flat.n
        if n + 5 > self.flat.cap:
            _grow(&self.flat, n + 5)
        self.flat.d[n] = u
        self.flat.d[n + 1] = kind
        self.flat.d[n + 2] = a
        self.flat.d[n + 3] = b
        self.flat.d[n + 4] = v
        self.flat.n = n + 5
        return 0

    cdef int thompson(self, object body, dict rule_index, object class_sequences, int32_t limit) except -2:
        """`fsm.build_nfa` straight into C arrays: the same construction (same nodes, same edges,
        same node limit), without a Python object per edge. Start is node 0, end node 1. Returns 0,
        or -1 past `limit` nodes."""
        cdef list stack = [body]
        cdef Vec ends
        cdef int32_t s, t, cur, nxt, a, b
        cdef Py_ssize_t i, n, k, lo, hi
        cdef bytes data
        cdef const unsigned char* p
        cdef tuple items
        cdef bytes packed
        memset(&ends, 0, sizeof(Vec))
        self.n_nfa = 0
        self.flat.n = 0
        try:
            if self.node(limit) < 0 or self.node(limit) < 0:
                return -1
            push(&ends, 0)
            push(&ends, 1)
            while stack:
                e = stack.pop()
                ends.n -= 2
                s = ends.d[ends.n]
                t = ends.d[ends.n + 1]
                if isinstance(e, Literal) or isinstance(e, TokenSlot):
                    data = text_bytes(<str>e.text) if isinstance(e, Literal) else token_slot_bytes(e.index)
                    n = len(data)
                    p = data
                    if n == 0:
                        self.edge(s, 2, 0, 0, t)
                        continue
                    cur = s
                    for i in range(n):
                        if i == n - 1:
                            nxt = t
                        else:
                            nxt = self.node(limit)
                            if nxt < 0:
                                return -1
                        self.edge(cur, 0, p[i], p[i], nxt)
                        cur = nxt
                elif isinstance(e, CharClass):
                    packed = _class_bytes(e, class_sequences)
                    p = packed
                    n = len(packed)
                    k = 0
                    while k < n:
                        lo = p[k]
                        cur = s
                        for i in range(lo):
                            if i == lo - 1:
                                nxt = t
                            else:
                                nxt = self.node(limit)
                                if nxt < 0:
                                    return -1
                            self.edge(cur, 0, p[k + 1 + 2 * i], p[k + 2 + 2 * i], nxt)
                            cur = nxt
                        k += 1 + 2 * lo
                elif isinstance(e, Seq):
                    items = e.items
                    n = len(items)
                    if n == 0:
                        self.edge(s, 2, 0, 0, t)
                        continue
                    cur = s
                    for i in range(n):
                        if i == n - 1:
                            nxt = t
                        else:
                            nxt = self.node(limit)
                            if nxt < 0:
                                return -1
                        stack.append(items[i])
                        push(&ends, cur)
                        push(&ends, nxt)
                        cur = nxt
                elif isinstance(e, Choice):
                    for x in e.alts:
                        stack.append(x)
                        push(&ends, s)
                        push(&ends, t)
                elif isinstance(e, Repeat):
                    x = e.expr
                    lo = e.min
                    cur = s
                    for k in range(lo):
                        nxt = self.node(limit)
                        if nxt < 0:
                            return -1
                        stack.append(x)
                        push(&ends, cur)
                        push(&ends, nxt)
                        cur = nxt
                    if e.max is None:
                        a = self.node(limit)  # loop
                        if a < 0:
                            return -1
                        self.edge(cur, 2, 0, 0, a)
                        b = self.node(limit)  # back
                        if b < 0:
                            return -1
                        stack.append(x)
                        push(&ends, a)
                        push(&ends, b)
                        self.edge(b, 2, 0, 0, a)
                        self.edge(a, 2, 0, 0, t)
                    else:
                        hi = e.max
                        for k in range(hi - lo):
                            self.edge(cur, 2, 0, 0, t)
                            nxt = self.node(limit)
                            if nxt < 0:
                                return -1
                            stack.append(x)
                            push(&ends, cur)
                            push(&ends, nxt)
                            cur = nxt
                        self.edge(cur, 2, 0, 0, t)
                elif isinstance(e, RuleRef):
                    self.edge(s, 1, rule_index[e.name], 0, t)
                else:
                    raise TypeError(f"unknown IR node {e!r}")
            return 0
        finally:
            free(ends.d)

    cdef int load(self) except -1:
        """CSR arrays (epsilon, byte-range and rule edges apart) from `flat` and `n_nfa`."""
        cdef int32_t n_nodes = self.n_nfa
        cdef Py_ssize_t n_edges = self.flat.n // 5, e, i
        cdef int32_t u, kind, a, b, v
        cdef int32_t* f = self.flat.d
        cdef Vec* off
        fill(&self.eps_off, n_nodes + 1, 0)
        fill(&self.byt_off, n_nodes + 1, 0)
        fill(&self.rul_off, n_nodes + 1, 0)
        for e in range(n_edges):
            u = f[5 * e]
            kind = f[5 * e + 1]
            off = &self.byt_off if kind == 0 else &self.rul_off if kind == 1 else &self.eps_off
            off.d[u] += 1
        # Inclusive prefix sums: off[u] ends node u's edges; filling back to front moves it to the start.
        for i in range(n_nodes):
            self.eps_off.d[i + 1] += self.eps_off.d[i]
            self.byt_off.d[i + 1] += self.byt_off.d[i]
            self.rul_off.d[i + 1] += self.rul_off.d[i]
        resize(&self.eps_dst, self.eps_off.d[n_nodes])
        resize(&self.byt_a, self.byt_off.d[n_nodes])
        resize(&self.byt_b, self.byt_off.d[n_nodes])
        resize(&self.byt_dst, self.byt_off.d[n_nodes])
        resize(&self.rul_r, self.rul_off.d[n_nodes])
        resize(&self.rul_dst, self.rul_off.d[n_nodes])
        # Fill back to front so each node's edges keep their insertion order.
        for e in range(n_edges - 1, -1, -1):
            u = f[5 * e]
            kind = f[5 * e + 1]
            a = f[5 * e + 2]
            b = f[5 * e + 3]
            v = f[5 * e + 4]
            if kind == 0:
                self.byt_off.d[u] -= 1
                i = self.byt_off.d[u]
                self.byt_a.d[i] = a
                self.byt_b.d[i] = b
                self.byt_dst.d[i] = v
            elif kind == 1:
                self.rul_off.d[u] -= 1
                i = self.rul_off.d[u]
                self.rul_r.d[i] = a
                self.rul_dst.d[i] = v
            else:
                self.eps_off.d[u] -= 1
                self.eps_dst.d[self.eps_off.d[u]] = v
        fill(&self.mark, n_nodes, 0)
        self.stamp = 0
        return 0

    cdef int closure(self, const int32_t* seeds, Py_ssize_t k) except -1:
        """Epsilon closure of `seeds` into `clo`, sorted (an explicit stack, no recursion)."""
        cdef Py_ssize_t i, e
        cdef int32_t u, v, st
        if self.stamp == 0x7FFFFFFF:
            memset(self.mark.d, 0, self.n_nfa * sizeof(int32_t))
            self.stamp = 0
        self.stamp += 1
        st = self.stamp
        self.clo.n = 0
        self.stack.n = 0
        for i in range(k):
            u = seeds[i]
            if self.mark.d[u] != st:
                self.mark.d[u] = st
                push(&self.clo, u)
                push(&self.stack, u)
        while self.stack.n:
            self.stack.n -= 1
            u = self.stack.d[self.stack.n]
            for e in range(self.eps_off.d[u], self.eps_off.d[u + 1]):
                v = self.eps_dst.d[e]
                if self.mark.d[v] != st:
                    self.mark.d[v] = st
                    push(&self.clo, v)
                    push(&self.stack, v)
        sort_i32(self.clo.d, self.clo.n)
        return 0

    cdef int32_t intern(self) except -1:
        """The subset state equal to `clo` (just computed), added if new."""
        cdef uint64_t h = _hash(self.clo.d, self.clo.n)
        cdef uint64_t mask = <uint64_t>(self.table.n - 1)
        cdef uint64_t slot = h & mask
        cdef int32_t s
        cdef Py_ssize_t base, n = self.clo.n
        while True:
            s = self.table.d[slot]
            if s < 0:
                break
            if <uint64_t>self.st_hash.d[s] == h and self.st_off.d[s + 1] - self.st_off.d[s] == n:
                base = self.st_off.d[s]
                if n == 0 or memcmp(self.pool.d + base, self.clo.d, n * sizeof(int32_t)) == 0:
                    return s
            slot = (slot + 1) & mask
        s = self.n_states
        base = self.pool.n
        resize(&self.pool, base + n)
        memcpy(self.pool.d + base, self.clo.d, n * sizeof(int32_t))
        lpush(&self.st_off, base + n)
        lpush(&self.st_hash, <int64_t>h)
        push(&self.st_final, 1 if self.mark.d[self.end] == self.stamp else 0)
        self.table.d[slot] = s
        self.n_states += 1
        if 2 * self.n_states > self.table.n:
            self.rehash()
        return s

    cdef int rehash(self) except -1:
        cdef Py_ssize_t size = 2 * self.table.n, s
        cdef uint64_t mask = <uint64_t>(size - 1), slot
        fill(&self.table, size, -1)
        for s in range(self.n_states):
            slot = <uint64_t>self.st_hash.d[s] & mask
            while self.table.d[slot] >= 0:
                slot = (slot + 1) & mask
            self.table.d[slot] = <int32_t>s
        return 0

    cdef int64_t subsets(self, int32_t start, int64_t max_states, int64_t budget) except -3:
        """Subset construction in breadth-first order, exactly as the Python reference discovers
        states (byte intervals in order, then rules in order), so that the state limit and the work
        budget trigger on the same rules. Returns -1 when the budget runs out, -2 on success, and
        the budget left when there are more than `max_states` states (the caller falls back)."""
        cdef int32_t i, j, u, r, prev_j, npts, nint, k, c
        cdef Py_ssize_t p, e, beg, fin, q, g
        cdef bint prev_ok
        cdef int32_t pts[258]
        cdef int32_t idx_of[258]
        cdef int32_t cstart[258]
        cdef char bmark[258]
        fill(&self.table, 64, -1)
        self.n_states = 0
        self.pool.n = 0
        self.st_off.n = 0
        self.st_hash.n = 0
        self.st_final.n = 0
        lpush(&self.st_off, 0)
        self.seeds.n = 0
        push(&self.seeds, start)
        self.closure(self.seeds.d, 1)
        self.intern()
        self.be_off.n = 0
        self.re_off.n = 0
        self.be_lo.n = self.be_hi.n = self.be_tgt.n = 0
        self.re_r.n = self.re_tgt.n = 0
        push(&self.be_off, 0)
        push(&self.re_off, 0)
        i = 0
        while i < self.n_states:
            if self.n_states > max_states:
                return budget
            beg = self.st_off.d[i]
            fin = self.st_off.d[i + 1]
            budget -= fin - beg
            if budget < 0:
                return -1
            # Gather this state's byte edges (with interval boundaries) and rule edges.
            self.ea.n = self.eb.n = self.ev.n = 0
            self.pairs.n = 0
            for p in range(beg, fin):
                u = self.pool.d[p]
                for e in range(self.byt_off.d[u], self.byt_off.d[u + 1]):
                    push(&self.ea, self.byt_a.d[e])
                    push(&self.eb, self.byt_b.d[e])
                    push(&self.ev, self.byt_dst.d[e])
                for e in range(self.rul_off.d[u], self.rul_off.d[u + 1]):
                    lpush(&self.pairs, (<int64_t>self.rul_r.d[e] << 32) | self.rul_dst.d[e])
            if self.ea.n:
                # Interval boundaries, sorted and distinct: sort them when there are few (the usual
                # case), else mark them in a 257-entry table and scan it.
                npts = 0
                if self.ea.n <= 16:
                    for q in range(self.ea.n):
                        pts[npts] = self.ea.d[q]
                        pts[npts + 1] = self.eb.d[q] + 1
                        npts += 2
                    sort_i32(pts, npts)
                    k = 1
                    for q in range(1, npts):
                        if pts[q] != pts[k - 1]:
                            pts[k] = pts[q]
                            k += 1
                    npts = k
                else:
                    memset(bmark, 0, sizeof(bmark))
                    for q in range(self.ea.n):
                        bmark[self.ea.d[q]] = 1
                        bmark[self.eb.d[q] + 1] = 1
                    for k in range(257):
                        if bmark[k]:
                            pts[npts] = k
                            npts += 1
                for k in range(npts):
                    idx_of[pts[k]] = k
                nint = npts - 1
                # Targets per elementary interval, as CSR (`cover`), in edge order.
                memset(cstart, 0, (nint + 1) * sizeof(int32_t))
                for q in range(self.ea.n):
                    for k in range(idx_of[self.ea.d[q]], idx_of[self.eb.d[q] + 1]):
                        cstart[k + 1] += 1
                for k in range(nint):
                    cstart[k + 1] += cstart[k]
                resize(&self.cover, cstart[nint])
                for q in range(self.ea.n - 1, -1, -1):
                    for k in range(idx_of[self.ea.d[q]], idx_of[self.eb.d[q] + 1]):
                        cstart[k + 1] -= 1
                        self.cover.d[cstart[k + 1]] = self.ev.d[q]
                # now cstart[k + 1] is the start of interval k; shift so cstart[k] is
                for k in range(nint):
                    cstart[k] = cstart[k + 1]
                cstart[nint] = <int32_t>self.cover.n
                prev_ok = False
                prev_j = -1
                for k in range(nint):
                    c = cstart[k + 1] - cstart[k]
                    if c == 0:
                        prev_ok = False
                        continue
                    if prev_ok and c == cstart[k] - cstart[k - 1] and memcmp(
                            self.cover.d + cstart[k - 1], self.cover.d + cstart[k], c * sizeof(int32_t)) == 0:
                        j = prev_j
                    else:
                        self.closure(self.cover.d + cstart[k], c)
                        j = self.intern()
                    g = self.be_lo.n
                    if g > self.be_off.d[i] and self.be_tgt.d[g - 1] == j and self.be_hi.d[g - 1] + 1 == pts[k]:
                        self.be_hi.d[g - 1] = pts[k + 1] - 1
                    else:
                        push(&self.be_lo, pts[k])
                        push(&self.be_hi, pts[k + 1] - 1)
                        push(&self.be_tgt, j)
                    prev_ok = True
                    prev_j = j
            push(&self.be_off, <int32_t>self.be_lo.n)
            if self.pairs.n:
                sort_i64(self.pairs.d, self.pairs.n)
                q = 0
                while q < self.pairs.n:
                    r = <int32_t>(self.pairs.d[q] >> 32)
                    self.seeds.n = 0
                    while q < self.pairs.n and <int32_t>(self.pairs.d[q] >> 32) == r:
                        push(&self.seeds, <int32_t>(self.pairs.d[q] & 0xFFFFFFFF))
                        q += 1
                    self.closure(self.seeds.d, self.seeds.n)
                    j = self.intern()
                    push(&self.re_r, r)
                    push(&self.re_tgt, j)
            push(&self.re_off, <int32_t>self.re_r.n)
            i += 1
        return -2

    cdef object minimal(self):
        """Trim, minimise and number the DFA built by `subsets`; returns the RuleFSM fields."""
        cdef int32_t n = self.n_states, s, t, q, c, lo, hi, b, nn = 0, n_bc, max_rule = -1, nlab
        cdef int32_t qb, cur_lo, cur_hi, cur_t, tb, x
        cdef Py_ssize_t e, i, mm, k
        cdef Vec* pred_off = &self.m_pred_off
        cdef Vec* pred = &self.m_pred
        cdef Vec* alive = &self.m_alive
        cdef Vec* cid = &self.m_cid
        cdef Vec* orig = &self.m_orig
        cdef Vec* T = &self.m_T
        cdef Vec* L = &self.m_L
        cdef Vec* H = &self.m_H
        cdef Vec* in_off = &self.m_in_off
        cdef Vec* in_t = &self.m_in_t
        cdef Vec* lab_off = &self.m_lab_off
        cdef Vec* num = &self.m_num
        cdef Vec* order = &self.m_order
        cdef Vec* rep = &self.m_rep
        cdef int32_t cls_of[256]
        cdef char bnd[257]
        cdef _Partition blocks = self.blocks, cords = self.cords
        cdef list byte_edges, rule_edges, lst
        cdef set finals
        orig.n = T.n = L.n = H.n = order.n = 0
        # 1. Trim: keep the states from which a final state is reachable (all are reachable
        #    from the start by construction).
        fill(pred_off, n + 1, 0)
        for e in range(self.be_tgt.n):
            pred_off.d[self.be_tgt.d[e] + 1] += 1
        for e in range(self.re_tgt.n):
            pred_off.d[self.re_tgt.d[e] + 1] += 1
        for s in range(n):
            pred_off.d[s + 1] += pred_off.d[s]
        resize(pred, pred_off.d[n])
        for s in range(n):
            for e in range(self.be_off.d[s], self.be_off.d[s + 1]):
                t = self.be_tgt.d[e]
                pred.d[pred_off.d[t]] = s
                pred_off.d[t] += 1
            for e in range(self.re_off.d[s], self.re_off.d[s + 1]):
                t = self.re_tgt.d[e]
                pred.d[pred_off.d[t]] = s
                pred_off.d[t] += 1
        for s in range(n, 0, -1):
            pred_off.d[s] = pred_off.d[s - 1]
        pred_off.d[0] = 0
        fill(alive, n, 0)
        self.stack.n = 0
        for s in range(n):
            if self.st_final.d[s]:
                alive.d[s] = 1
                push(&self.stack, s)
        while self.stack.n:
            self.stack.n -= 1
            t = self.stack.d[self.stack.n]
            for e in range(pred_off.d[t], pred_off.d[t + 1]):
                s = pred.d[e]
                if not alive.d[s]:
                    alive.d[s] = 1
                    push(&self.stack, s)
        if not alive.d[0]:
            return [[]], [[]], set(), (b"\x00\x00\x00\x00", b"", b"", b"")   # one node, no edges
        fill(cid, n, -1)
        for s in range(n):
            if alive.d[s]:
                cid.d[s] = nn
                push(orig, s)
                nn += 1

        # 2. Letters: byte classes no live range boundary separates, then one letter per rule.
        memset(bnd, 0, sizeof(bnd))
        for s in range(n):
            if not alive.d[s]:
                continue
            for e in range(self.be_off.d[s], self.be_off.d[s + 1]):
                if alive.d[self.be_tgt.d[e]]:
                    bnd[self.be_lo.d[e]] = 1
                    bnd[self.be_hi.d[e] + 1] = 1
            for e in range(self.re_off.d[s], self.re_off.d[s + 1]):
                if self.re_r.d[e] > max_rule:
                    max_rule = self.re_r.d[e]
        c = -1
        for x in range(256):
            if x == 0 or bnd[x]:
                c += 1
            cls_of[x] = c
        n_bc = c + 1
        nlab = n_bc + max_rule + 1
        for s in range(n):
            if not alive.d[s]:
                continue
            q = cid.d[s]
            for e in range(self.be_off.d[s], self.be_off.d[s + 1]):
                t = self.be_tgt.d[e]
                if alive.d[t]:
                    for c in range(cls_of[self.be_lo.d[e]], cls_of[self.be_hi.d[e]] + 1):
                        push(T, q)
                        push(L, c)
                        push(H, cid.d[t])
            for e in range(self.re_off.d[s], self.re_off.d[s + 1]):
                t = self.re_tgt.d[e]
                if alive.d[t]:
                    push(T, q)
                    push(L, n_bc + self.re_r.d[e])
                    push(H, cid.d[t])
        mm = T.n

        # 3. Partition refinement. Blocks start as {final, non-final}; cords (sets of
        #    transitions) start as one per letter.
        blocks.init(nn)
        for q in range(nn):
            if self.st_final.d[orig.d[q]]:
                blocks.mark(q)
        blocks.split()
        cords.init(mm)
        if mm:
            fill(lab_off, nlab + 1, 0)
            for e in range(mm):
                lab_off.d[L.d[e] + 1] += 1
            for c in range(nlab):
                lab_off.d[c + 1] += lab_off.d[c]
            cords.z = 0
            for c in range(nlab):
                if lab_off.d[c + 1] > lab_off.d[c]:
                    cords.first.d[cords.z] = lab_off.d[c]
                    cords.past.d[cords.z] = lab_off.d[c + 1]
                    cords.z += 1
            # place transitions by label (stable), recording set numbers
            c = 0
            for k in range(nlab):
                if lab_off.d[k + 1] > lab_off.d[k]:
                    lab_off.d[k] = c  # reuse as cord number of label k
                    c += 1
                else:
                    lab_off.d[k] = -1
            for k in range(cords.z):
                cords.marked.d[k] = cords.first.d[k]  # temporary fill cursor
            for e in range(mm):
                c = lab_off.d[L.d[e]]
                i = cords.marked.d[c]
                cords.marked.d[c] += 1
                cords.elems.d[i] = <int32_t>e
                cords.loc.d[e] = <int32_t>i
                cords.sidx.d[e] = c
            for k in range(cords.z):
                cords.marked.d[k] = 0
        # incoming transitions per state
        fill(in_off, nn + 1, 0)
        for e in range(mm):
            in_off.d[H.d[e] + 1] += 1
        for q in range(nn):
            in_off.d[q + 1] += in_off.d[q]
        resize(in_t, mm)
        fill(num, nn + 1, 0)  # a cursor per state
        for q in range(nn + 1):
            num.d[q] = in_off.d[q]
        for e in range(mm):
            in_t.d[num.d[H.d[e]]] = <int32_t>e
            num.d[H.d[e]] += 1
        b = 1
        c = 0
        while c < cords.z:
            for i in range(cords.first.d[c], cords.past.d[c]):
                blocks.mark(T.d[cords.elems.d[i]])
            blocks.split()
            c += 1
            while b < blocks.z:
                for i in range(blocks.first.d[b], blocks.past.d[b]):
                    q = blocks.elems.d[i]
                    for e in range(in_off.d[q], in_off.d[q + 1]):
                        cords.mark(in_t.d[e])
                cords.split()
                b += 1

        # 4. Quotient, numbered breadth-first from the start block following byte ranges in
        #    order, then rule edges in order (as `fsm.canonical` does).
        fill(num, blocks.z, -1)
        resize(rep, blocks.z)
        for b in range(blocks.z):
            rep.d[b] = orig.d[blocks.elems.d[blocks.first.d[b]]]
        byte_edges = []
        rule_edges = []
        finals = set()
        self.q_cnt.n = self.q_lo.n = self.q_hi.n = self.q_tgt.n = 0
        qb = blocks.sidx.d[cid.d[0]]
        num.d[qb] = 0
        push(order, qb)
        i = 0
        while i < order.n:
            b = order.d[i]
            s = rep.d[b]
            if self.st_final.d[s]:
                finals.add(i)
            lst = []
            cur_t = -1
            cur_lo = cur_hi = 0
            for e in range(self.be_off.d[s], self.be_off.d[s + 1]):
                t = self.be_tgt.d[e]
                if not alive.d[t]:
                    continue
                tb = blocks.sidx.d[cid.d[t]]
                if num.d[tb] < 0:
                    num.d[tb] = <int32_t>order.n
                    push(order, tb)
                lo = self.be_lo.d[e]
                hi = self.be_hi.d[e]
                if cur_t == tb and cur_hi + 1 == lo:
                    cur_hi = hi
                else:
                    if cur_t >= 0:
                        lst.append((cur_lo, cur_hi, num.d[cur_t]))
                        self._flat_edge(cur_lo, cur_hi, num.d[cur_t])
                    cur_t = tb
                    cur_lo = lo
                    cur_hi = hi
            if cur_t >= 0:
                lst.append((cur_lo, cur_hi, num.d[cur_t]))
                self._flat_edge(cur_lo, cur_hi, num.d[cur_t])
            push(&self.q_cnt, <int32_t>len(lst))
            byte_edges.append(tuple(lst))
            lst = []
            for e in range(self.re_off.d[s], self.re_off.d[s + 1]):
                t = self.re_tgt.d[e]
                if not alive.d[t]:
                    continue
                tb = blocks.sidx.d[cid.d[t]]
                if num.d[tb] < 0:
                    num.d[tb] = <int32_t>order.n
                    push(order, tb)
                lst.append((self.re_r.d[e], num.d[tb]))
            rule_edges.append(tuple(lst))
            i += 1
        # The same byte edges as flat little-endian tables (edges per node int32, lo and hi uint8,
        # target int32): the core's tables are these arrays, without a pass over the lists.
        flat = (_vec_bytes(&self.q_cnt, 4), _vec_bytes(&self.q_lo, 1), _vec_bytes(&self.q_hi, 1),
                _vec_bytes(&self.q_tgt, 4))
        return tuple(byte_edges), tuple(rule_edges), finals, flat

    cdef int _flat_edge(self, int32_t lo, int32_t hi, int32_t tgt) except -1:
        push(&self.q_lo, lo)
        push(&self.q_hi, hi)
        push(&self.q_tgt, tgt)
        return 0


cdef bytes _vec_bytes(Vec* v, int width):
    """A Vec's values as `width`-byte native integers (the values fit)."""
    cdef bytearray out
    cdef Py_ssize_t i
    if width == 4:
        return (<char*>v.d)[:v.n * 4] if v.n else b""
    out = bytearray(v.n)
    for i in range(v.n):
        out[i] = <unsigned char>v.d[i]
    return bytes(out)


#: One builder kept between calls, so that small automata (most rules) do not pay for allocating
#: and freeing some forty buffers each. A call takes it or, if another thread holds it (the build
#: runs Python code, which can switch threads), makes its own. Buffers grown past SPARE_MAX_INTS by
#: a huge automaton are not kept.
cdef _Builder _spare = None
cdef Py_ssize_t SPARE_MAX_INTS = 1 << 20


cdef _Builder _take():
    global _spare
    cdef _Builder bld = _spare
    if bld is None:
        return _Builder()
    _spare = None
    return bld


cdef void _give(_Builder bld):
    global _spare
    if (bld.flat.cap + bld.pool.cap + bld.mark.cap + bld.m_T.cap + bld.cords.elems.cap
            + bld.be_lo.cap + bld.cover.cap) <= SPARE_MAX_INTS:
        _spare = bld


def minimal_dfa(list flat, int n_nodes, int start, int end, long long max_states, long long budget):
    """The canonical minimal DFA of an epsilon-NFA given as a flat edge list.

    `flat` holds five ints per edge: source, kind (0 byte range [a, b], 1 call of rule a, 2
    epsilon), a, b, target. Returns `(byte_edges, rule_edges, finals)` for a deterministic
    RuleFSM; or an int: -1 when the closure work budget ran out, otherwise the budget left when the
    subset construction passed `max_states` states (the caller falls back to an epsilon-free NFA).
    """
    if not (0 <= start < n_nodes and 0 <= end < n_nodes):
        raise ValueError("start or end node out of range")
    cdef _Builder bld = _take()
    cdef int64_t res
    bld.load_list(flat, n_nodes)
    bld.load()
    bld.end = end
    res = bld.subsets(start, max_states, budget)
    out = res if res != -2 else bld.minimal()
    _give(bld)
    return out


def rule_dfa(body, dict rule_index, class_sequences, int max_nfa_nodes, long long max_states,
             long long budget):
    """`minimal_dfa` of `fsm.build_nfa(body, rule_index)`, with the NFA built here in C arrays.

    `class_sequences(cc)` gives a CharClass's UTF-8 byte-range sequences (fsm's cached helper).
    Returns what `minimal_dfa` returns, or -3 when the NFA would pass `max_nfa_nodes` nodes.
    """
    cdef _Builder bld = _take()
    cdef int64_t res
    if bld.thompson(body, rule_index, class_sequences, max_nfa_nodes) < 0:
        _give(bld)
        return -3
    bld.load()
    bld.end = 1
    res = bld.subsets(0, max_states, budget)
    out = res if res != -2 else bld.minimal()
    _give(bld)
    return out


def reach_back(const int32_t[::1] counts, const int32_t[::1] target, list call_edges, seeds):
    """Flags (a bytearray, one per node) of the nodes from which some node in `seeds` is
    reachable over the byte edges (`counts` per node, `target` in node order: an automaton's
    flat tables) and the `(node, target)` pairs of `call_edges`. What fsm.reaching computes over
    Python lists, for the automata the C builder makes: a backward walk over a predecessor
    table in C, linear in the edges."""
    cdef int32_t n = counts.shape[0], n_edges = target.shape[0], i, k, u, v, top = 0, m
    cdef int32_t n_calls = len(call_edges)
    out = bytearray(n)
    cdef unsigned char[::1] flag = out
    cdef int32_t* pstart = <int32_t*>calloc(n + 2, sizeof(int32_t))
    cdef int32_t* pred = <int32_t*>malloc((n_edges + n_calls + 1) * sizeof(int32_t))
    cdef int32_t* src = <int32_t*>malloc((n_edges + n_calls + 1) * sizeof(int32_t))
    cdef int32_t* dst = <int32_t*>malloc((n_edges + n_calls + 1) * sizeof(int32_t))
    cdef int32_t* stack = <int32_t*>malloc((n + 1) * sizeof(int32_t))
    if pstart == NULL or pred == NULL or src == NULL or dst == NULL or stack == NULL:
        free(pstart); free(pred); free(src); free(dst); free(stack)
        raise MemoryError()
    try:
        m = 0
        for u in range(n):
            for k in range(counts[u]):
                if m >= n_edges:
                    raise ValueError("counts and target disagree")
                src[m] = u
                dst[m] = target[m]
                m += 1
        if m != n_edges:
            raise ValueError("counts and target disagree")
        for u, v in call_edges:
            src[m] = u
            dst[m] = v
            m += 1
        for i in range(m):
            if not 0 <= dst[i] < n:
                raise ValueError("an edge leads out of the automaton")
            pstart[dst[i] + 2] += 1
        for i in range(n):
            pstart[i + 2] += pstart[i + 1]
        for i in range(m):
            pred[pstart[dst[i] + 1]] = src[i]
            pstart[dst[i] + 1] += 1
        for u in seeds:
            if 0 <= u < n and not flag[u]:
                flag[u] = 1
                stack[top] = u
                top += 1
        with nogil:
            while top > 0:
                top -= 1
                v = stack[top]
                for k in range(pstart[v], pstart[v + 1]):
                    u = pred[k]
                    if not flag[u]:
                        flag[u] = 1
                        stack[top] = u
                        top += 1
    finally:
        free(pstart); free(pred); free(src); free(dst); free(stack)
    return out


def repeat_chain(const int32_t[::1] counts, const unsigned char[::1] lo, const unsigned char[::1] hi,
                 const int32_t[::1] target, int32_t final, int32_t low, int32_t high, long long max_states):
    """The canonical minimal DFA of `e{low,high}` from the minimal DFA of `e` (its flat tables:
    edges per node, byte ranges and targets in node order, start 0), where `e`'s strings form a
    prefix code, so that its DFA has one final node `final` without edges and 0 is not final.

    Copy c of e's automaton then hands over at its final node to the start of copy c + 1, and the
    start of copy c is final when c >= low; the end of copy `high` is the last node. With a prefix
    code every string splits into copies one way only, so no two of these nodes accept the same
    language and the chain is minimal as it stands: no subset construction and no partition
    refinement (they cost milliseconds for the few thousand nodes of an unrolled string bound).
    Numbered breadth-first as `_Builder.minimal` numbers, so the result is identical to the general
    builder's. Returns its `(None, rule_edges, finals, flat)`: the byte edges only as flat tables
    (fsm.FlatEdges writes them out as tuples if something asks), since a tuple per edge was most
    of the cost; or None past `max_states`."""
    cdef int32_t k = counts.shape[0]
    cdef int64_t n_states = <int64_t>(k - 1) * high + 1, i, total
    if k < 2 or high < 1 or low < 0 or low > high or not 0 < final < k or counts[final] != 0:
        raise ValueError("not the automaton of a non-empty prefix code")
    if n_states > max_states:
        return None
    cdef int32_t end = <int32_t>(<int64_t>high * k)     # chain node (c, q) is c * k + q
    cdef int32_t* num = <int32_t*>malloc((<int64_t>high * k + 1) * sizeof(int32_t))
    cdef int32_t* order = <int32_t*>malloc(n_states * sizeof(int32_t))
    cdef int32_t* start = <int32_t*>malloc((k + 1) * sizeof(int32_t))
    cdef Vec q_cnt, q_lo, q_hi, q_tgt
    q_cnt.d = q_lo.d = q_hi.d = q_tgt.d = NULL
    q_cnt.n = q_lo.n = q_hi.n = q_tgt.n = q_cnt.cap = q_lo.cap = q_hi.cap = q_tgt.cap = 0
    cdef int32_t head = 0, tail = 0, s, c, q, t, nxt, e, n_out
    cdef set finals = set()
    if num == NULL or order == NULL or start == NULL:
        free(num); free(order); free(start)
        raise MemoryError()
    try:
        start[0] = 0
        for q in range(k):
            start[q + 1] = start[q] + counts[q]
        if start[k] != target.shape[0] or lo.shape[0] != target.shape[0] or hi.shape[0] != target.shape[0]:
            raise ValueError("counts and edges disagree")
        for i in range(<int64_t>high * k + 1):
            num[i] = -1
        num[0] = 0
        order[tail] = 0
        tail += 1
        while head < tail:
            s = order[head]
            if s == end:
                finals.add(head)
                push(&q_cnt, 0)
                head += 1
                continue
            c = s // k
            q = s % k
            if q == 0 and c >= low:
                finals.add(head)
            n_out = 0
            for e in range(start[q], start[q + 1]):
                t = target[e]
                if not 0 <= t < k:
                    raise ValueError("an edge leads out of the automaton")
                nxt = (end if c + 1 == high else (c + 1) * k) if t == final else c * k + t
                if num[nxt] < 0:
                    num[nxt] = tail
                    order[tail] = nxt
                    tail += 1
                push(&q_lo, lo[e])
                push(&q_hi, hi[e])
                push(&q_tgt, num[nxt])
                n_out += 1
            push(&q_cnt, n_out)
            head += 1
        total = head
        if total != n_states:
            raise ValueError("the automaton has unreachable nodes")
        flat = (_vec_bytes(&q_cnt, 4), _vec_bytes(&q_lo, 1), _vec_bytes(&q_hi, 1), _vec_bytes(&q_tgt, 4))
        return None, ((),) * total, finals, flat
    finally:
        free(num); free(order); free(start)
        free(q_cnt.d); free(q_lo.d); free(q_hi.d); free(q_tgt.d)


def node_digests(const int32_t[::1] counts, const unsigned char[::1] lo, const unsigned char[::1] hi,
                 const int32_t[::1] target, const unsigned char[::1] final, tuple rule_edges, list key,
                 cycle_digests):
    """Per node of an automaton (its flat tables and its calls `rule_edges`, callees named by
    `key`): a 16-byte digest of what the rule reads from that node on (hashing._node_digests).

    The strongly connected components come out of an iterative Tarjan walk successors first; a
    node outside cycles is digested at once as a fixed-width record (finality, edge count, each
    byte edge as lo, hi and the target's digest, call count, each call as callee key and resume
    digest, sorted), a cycle is handed to `cycle_digests(members, digests)`, which fills its
    members' digests in the list. In Python the walk and the records cost 5 to 7 us a node, and a
    caller's nodes are digested the first time a grammar calls from it."""
    cdef int32_t n = counts.shape[0], u, v, w, i, c, m, top = 0, wtop = 0, counter = 0
    cdef int64_t e, n_edges = target.shape[0], n_calls = 0
    if final.shape[0] != n or len(rule_edges) != n or lo.shape[0] != n_edges or hi.shape[0] != n_edges:
        raise ValueError("the automaton's tables disagree")
    for u in range(n):
        n_calls += len(rule_edges[u])
    cdef int32_t* start = <int32_t*>malloc((n + 1) * sizeof(int32_t))
    cdef int32_t* succ = <int32_t*>malloc((n_edges + n_calls + 1) * sizeof(int32_t))
    cdef int32_t* index = <int32_t*>malloc((n + 1) * sizeof(int32_t))
    cdef int32_t* low = <int32_t*>malloc((n + 1) * sizeof(int32_t))
    cdef int32_t* stack = <int32_t*>malloc((n + 1) * sizeof(int32_t))
    cdef int32_t* work = <int32_t*>malloc((n + 1) * sizeof(int32_t))      # node being expanded
    cdef int32_t* pos = <int32_t*>malloc((n + 1) * sizeof(int32_t))       # its next successor
    cdef unsigned char* on = <unsigned char*>calloc(n + 1, 1)
    cdef unsigned char* calls = <unsigned char*>calloc(n + 1, 1)
    cdef int32_t* bstart = <int32_t*>malloc((n + 1) * sizeof(int32_t))
    cdef bytearray rec
    cdef list dig = [b""] * n, comp, parts
    cdef bytes d
    if (start == NULL or succ == NULL or index == NULL or low == NULL or stack == NULL or work == NULL
            or pos == NULL or on == NULL or calls == NULL or bstart == NULL):
        free(start); free(succ); free(index); free(low); free(stack); free(work); free(pos); free(on)
        free(calls); free(bstart)
        raise MemoryError()
    try:
        bstart[0] = 0
        for u in range(n):
            bstart[u + 1] = bstart[u] + counts[u]
        if bstart[n] != n_edges:
            raise ValueError("counts and edges disagree")
        m = 0
        for u in range(n):
            start[u] = m
            for e in range(bstart[u], bstart[u + 1]):
                if not 0 <= target[e] < n:
                    raise ValueError("an edge leads out of the automaton")
                succ[m] = target[e]
                m += 1
            if rule_edges[u]:
                calls[u] = 1
                for _r, v in rule_edges[u]:
                    if not 0 <= v < n:
                        raise ValueError("a call resumes outside the automaton")
                    succ[m] = v
                    m += 1
        start[n] = m
        for u in range(n):
            index[u] = -1
        for u in range(n):
            if index[u] >= 0:
                continue
            work[0] = u
            pos[0] = start[u]
            wtop = 1
            index[u] = low[u] = counter
            counter += 1
            stack[top] = u
            top += 1
            on[u] = 1
            while wtop > 0:
                v = work[wtop - 1]
                if pos[wtop - 1] < start[v + 1]:
                    w = succ[pos[wtop - 1]]
                    pos[wtop - 1] += 1
                    if index[w] < 0:
                        index[w] = low[w] = counter
                        counter += 1
                        stack[top] = w
                        top += 1
                        on[w] = 1
                        work[wtop] = w
                        pos[wtop] = start[w]
                        wtop += 1
                    elif on[w] and index[w] < low[v]:
                        low[v] = index[w]
                    continue
                wtop -= 1
                if wtop > 0 and low[v] < low[work[wtop - 1]]:
                    low[work[wtop - 1]] = low[v]
                if low[v] != index[v]:
                    continue
                if stack[top - 1] == v:
                    c = 1
                    for i in range(start[v], start[v + 1]):
                        if succ[i] == v:
                            c = 2
                            break
                    if c == 1:      # a node outside cycles: its successors are digested
                        top -= 1
                        on[v] = 0
                        rec = bytearray()
                        rec.append(final[v] != 0)
                        rec += (<object>(bstart[v + 1] - bstart[v])).to_bytes(4, "little")
                        for e in range(bstart[v], bstart[v + 1]):
                            rec.append(lo[e])
                            rec.append(hi[e])
                            rec += <bytes>dig[target[e]]
                        if calls[v]:
                            parts = []
                            for r, w2 in rule_edges[v]:
                                k = key[r]
                                if len(k) != 16:
                                    raise ValueError("rule keys are 16 bytes")
                                parts.append(k + dig[w2])
                            parts.sort()
                            rec += len(parts).to_bytes(4, "little")
                            for d in parts:
                                rec += d
                        else:
                            rec += b"\0\0\0\0"
                        dig[v] = _blake2b(rec, digest_size=16).digest()
                        continue
                comp = []
                while True:
                    top -= 1
                    w = stack[top]
                    on[w] = 0
                    comp.append(w)
                    if w == v:
                        break
                cycle_digests(comp, dig)
        return dig
    finally:
        free(start); free(succ); free(index); free(low); free(stack); free(work); free(pos); free(on)
        free(calls); free(bstart)
