# Included by core.pyx: module tables linked into one grammar, and the batch fill.

# ---------------------------------------------------------------------------------------------
# Linking: module tables copied one after the other with their offsets (see linking.py)
# ---------------------------------------------------------------------------------------------

cdef int _shift_from(dict tables, str name, int32_t* out, int64_t shift, bint keep_negative) except -1:
    """Copy the int32 table `name` to `out`, adding `shift` (to every value, or to those >= 0)."""
    cdef const int32_t[::1] src = tables[name]
    cdef Py_ssize_t j
    for j in range(src.shape[0]):
        out[j] = src[j] if keep_negative and src[j] < 0 else <int32_t>(src[j] + shift)
    return 0


def link_tables(list tabs, list roots):
    """The tables of `root ::= m1 | m2 | ...` from the modules' tables (`Module.tables`): rule 0
    is the root, its node 0 calls every module root (`roots`, each module's own root index) and
    goes to node 1, which is final; module tables follow, their node, rule, edge and context
    indices moved. Each module root gets the linked root's node 0 as its first caller."""
    cdef Py_ssize_t M = len(tabs), i, j, k
    cdef int64_t nn = 2, nr = 1, nbe = 0, nre = M, nctx = 0
    cdef int64_t node_base, rule_base, be_base, re_base, ctx_base, first, n_rule_i
    cdef dict t
    for t in tabs:
        nn += len(t["node_rule"])
        nr += len(t["rule_start"])
        nbe += len(t["be_lo"])
        nre += len(t["re_rule"])
        nctx += len(t["ctx_item"]) + 1
    cdef cnp.ndarray[int32_t] node_rule = np.empty(nn, np.int32), be_start = np.empty(nn + 1, np.int32)
    cdef cnp.ndarray[int32_t] re_start = np.empty(nn + 1, np.int32), be_target = np.empty(nbe, np.int32)
    cdef cnp.ndarray[int32_t] re_rule = np.empty(nre, np.int32), re_target = np.empty(nre, np.int32)
    cdef cnp.ndarray[int32_t] rule_start = np.empty(nr, np.int32), ctx_start = np.empty(nr + 1, np.int32)
    cdef cnp.ndarray[int32_t] ctx_resume = np.empty(nr * 4, np.int32)
    cdef cnp.ndarray[uint64_t] ctx_item = np.empty(nctx, np.uint64)
    cdef cnp.ndarray[uint8_t] rule_nullable = np.empty(nr, np.uint8)
    cdef const uint64_t[::1] items
    node_rule[0] = node_rule[1] = 0
    be_start[0] = be_start[1] = 0
    re_start[0] = 0
    re_start[1] = <int32_t>M
    rule_start[0] = 0
    ctx_start[0] = ctx_start[1] = 0
    ctx_resume[0] = ctx_resume[1] = ctx_resume[2] = ctx_resume[3] = -1
    rule_nullable[0] = 0
    node_base, rule_base, be_base, re_base, ctx_base = 2, 1, 0, M, 0
    for i in range(M):
        t = tabs[i]
        n_rule_i = len(t["rule_start"])
        re_rule[i] = <int32_t>(rule_base + <int64_t>roots[i])
        re_target[i] = 1
        _shift_from(t, "node_rule", &node_rule[node_base], rule_base, False)
        _shift_from(t, "be_start", &be_start[node_base], be_base, False)
        _shift_from(t, "re_start", &re_start[node_base], re_base, False)
        _shift_from(t, "be_target", &be_target[be_base], node_base, False)
        _shift_from(t, "re_rule", &re_rule[re_base], rule_base, False)
        _shift_from(t, "re_target", &re_target[re_base], node_base, False)
        _shift_from(t, "rule_start", &rule_start[rule_base], node_base, False)
        _shift_from(t, "ctx_resume", &ctx_resume[rule_base * 4], node_base, True)
        _shift_from(t, "ctx_end", &ctx_start[rule_base + 1], ctx_base, False)
        if t["rule_nullable"][roots[i]]:
            rule_nullable[0] = 1
        # context items: the module's, with the linked root's item 0 first among its root's callers
        items = t["ctx_item"]
        first = t["ctx_root_start"][0]
        k = ctx_base
        for j in range(items.shape[0]):
            if j == first:
                ctx_item[k] = 0
                k += 1
            ctx_item[k] = items[j] + ((<uint64_t>rule_base) << 32) + <uint64_t>node_base
            k += 1
        if first == items.shape[0]:
            ctx_item[k] = 0
            k += 1
        node_base += len(t["node_rule"])
        rule_base += n_rule_i
        be_base += len(t["be_lo"])
        re_base += len(t["re_rule"])
        ctx_base = k
    be_start[nn] = <int32_t>nbe
    re_start[nn] = <int32_t>nre
    return {
        "node_rule": node_rule,
        "node_final": np.concatenate([np.array([0, 1], np.uint8)] + [t["node_final"] for t in tabs]),
        "be_start": be_start,
        "be_lo": np.concatenate([t["be_lo"] for t in tabs]),
        "be_hi": np.concatenate([t["be_hi"] for t in tabs]),
        "be_target": be_target,
        "re_start": re_start,
        "re_rule": re_rule,
        "re_target": re_target,
        "rule_start": rule_start,
        "rule_nullable": np.concatenate([rule_nullable[:1]] + [t["rule_nullable"] for t in tabs]),
        "node_pure": np.concatenate([np.array([0, 1], np.uint8)] + [t["node_pure"] for t in tabs]),
        "rule_follow": np.concatenate([np.zeros(1, np.uint8)] + [t["rule_follow"] for t in tabs]),
        "ctx_resume": ctx_resume,
        "ctx_start": ctx_start,
        "ctx_item": ctx_item,
    }



cdef inline int _fill_of(PyObject* core, int32_t* out, int32_t n_out) noexcept nogil:
    # A borrowed reference: the caller's list keeps every core alive for the whole call.
    return (<MatcherCore>core)._fill(out, n_out)


def fill_rows(list cores, uintptr_t base, int64_t row_words, const int64_t[:] rows, int32_t n_words):
    """Matcher k's mask into row rows[k] of the bitmask at `base` (rows of `row_words` int32 words,
    `n_words` of them written; rows None: row k): one call and one release of the GIL for a whole
    batch, no Python per row. The caller has checked the bitmask, the rows and that every item is a
    live MatcherCore.

    A row whose mask cannot be made (an entry build past the fill's deadline, or no memory) is
    written all zeros and the others are still filled: one session's costly grammar is its own
    failure, not the batch's. Then FillTimeoutError (or MemoryError) says which positions failed."""
    cdef Py_ssize_t n = len(cores), k
    cdef int rc, worst = 0
    cdef int64_t row
    cdef bint by_index = rows is None
    if not by_index and rows.shape[0] != n:
        raise ValueError("one row per matcher")
    cdef PyObject* few[8]
    cdef int few_rc[8]
    cdef PyObject** ptrs = &few[0]
    cdef int* rcs = &few_rc[0]
    if n > 8:
        ptrs = <PyObject**>malloc(n * sizeof(PyObject*))
        rcs = <int*>malloc(n * sizeof(int))
        if ptrs == NULL or rcs == NULL:
            free(ptrs)
            free(rcs)
            raise MemoryError()
    try:
        for k in range(n):
            ptrs[k] = <PyObject*>(<MatcherCore?>cores[k])
        with nogil:
            for k in range(n):
                row = k if by_index else rows[k]
                rc = _fill_of(ptrs[k], <int32_t*>(base + <uintptr_t>(row * row_words * 4)), n_words)
                rcs[k] = rc
                if rc < 0:
                    memset(<void*>(base + <uintptr_t>(row * row_words * 4)), 0, n_words * sizeof(int32_t))
                    if worst == 0 or rc == BUILD_NO_MEMORY:
                        worst = rc
        if worst < 0:
            raise _fill_error(worst, [k for k in range(n) if rcs[k] < 0])
    finally:
        if ptrs != &few[0]:
            free(ptrs)
        if rcs != &few_rc[0]:
            free(rcs)
