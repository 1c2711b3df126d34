# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The C core: a byte-level Earley parser over per-rule automata and the adaptive token-mask cache.

Everything inside the `nogil` functions touches only C data. Items pack into one 64-bit word:
bits 0-30 the global automaton node (the rule is implied), bit 31 the "top" flag, bits 32-63 the
origin (index of the state set where the item's rule was predicted). A top item stands for the start
of the parse, so its completion means "the parse can end here"; the mask builder reuses the flag for
the rule whose entry it builds and for the context it checks leftover bytes against.
"""

from libc.stdint cimport uint8_t, int8_t, int32_t, uint32_t, int64_t, uint64_t, uintptr_t
from libc.stdlib cimport malloc, realloc, free, calloc, qsort
from libc.string cimport memset, memcpy, memcmp, memmove
from libc.math cimport NAN

cdef extern from "<sched.h>" nogil:
    int sched_yield()

cdef extern from "<unistd.h>" nogil:
    int usleep(unsigned int usec)

from cpython.ref cimport PyObject
from cpython.pythread cimport (PyThread_type_lock, PyThread_allocate_lock, PyThread_free_lock,
                               PyThread_acquire_lock, PyThread_release_lock, WAIT_LOCK)
cimport numpy as cnp
import sys

import numpy as np

cnp.import_array()

ctypedef uint64_t item_t

cdef enum:
    NODE_MASK = 0x7FFFFFFF
    TOP_BIT = 0x80000000
    TOKEN_LEAD_BYTE = 0xF9            # ir.TOKEN_LEAD: a token edge's first byte

cdef enum:
    MAX_TOKEN_BYTES = 4096
    MEMO_MAX_ITEMS = 1 << 22
    MEMO_MAX_TRANSITIONS = 1 << 21
    MCACHE_SLOTS = 8
    MAX_RESUMES = 4
    CERTAIN_WORK_LIMIT = 65536
    MCACHE_MIN_CHECKS = 32
    MAX_FREE_SCRATCH = 4

cdef extern from *:
    int __builtin_ctzll(unsigned long long) nogil
    int __builtin_popcountll(unsigned long long) nogil

cdef extern from "<time.h>" nogil:
    ctypedef long time_t
    struct timespec:
        time_t tv_sec
        long tv_nsec
    int clock_gettime(int clk, timespec* ts)
    enum: CLOCK_MONOTONIC
    enum: CLOCK_THREAD_CPUTIME_ID


cdef inline double _monotonic() noexcept nogil:
    """time.perf_counter's clock (CLOCK_MONOTONIC on Linux), in seconds."""
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef inline double _thread_cpu() noexcept nogil:
    """This thread's CPU time, in seconds: what a work budget counts, whatever else the machine runs."""
    cdef timespec ts
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef inline bint _limit_hit(double deadline, double cpu_budget, double* cpu_start) noexcept nogil:
    """Whether work under a limit must stop: past `deadline` (time.perf_counter seconds; 0: none),
    or past `cpu_budget` seconds of this thread's CPU time since the first check (*cpu_start: 0
    until then). A deadline bounds a compile in wall time, as its caller waits; a CPU budget bounds
    the work of a fill or an accept, so that a busy machine does not fail a legitimate one."""
    cdef double now
    if deadline > 0 and _monotonic() > deadline:
        return True
    if cpu_budget > 0:
        now = _thread_cpu()
        if cpu_start[0] == 0:
            cpu_start[0] = now
            return False
        return now - cpu_start[0] > cpu_budget
    return False


cdef enum:
    BUILD_OK = 0
    BUILD_NO_MEMORY = -1
    BUILD_PAST_DEADLINE = -2          # an entry build ran past its deadline (see EntryBuilder.deadline)
    DEADLINE_CHECK_EVERY = 256        # trie nodes walked between two reads of the clock
    CLOSURE_CHECK_EVERY = 1 << 16     # closure steps (items, origin items rescanned) between two reads

# ---------------------------------------------------------------------------------------------
# Grammar tables
# ---------------------------------------------------------------------------------------------

cdef struct GrammarC:
    int32_t n_nodes
    int32_t n_rules
    const int32_t* node_rule
    const uint8_t* node_final
    const int32_t* be_start
    const uint8_t* be_lo
    const uint8_t* be_hi
    const int32_t* be_target
    const int32_t* re_start
    const int32_t* re_rule
    const int32_t* re_target
    const int32_t* rule_start
    const uint8_t* rule_nullable
    const int32_t* ctx_start
    const uint64_t* ctx_item
    const uint8_t* node_pure      # bit 0: deterministic, and no rule call reachable inside its rule;
                                  # bit 1: deterministic, and no rule call at this node
    const int32_t* ctx_resume     # per rule, MAX_RESUMES slots: the caller nodes calls resume at (-1: unused)
    const uint8_t* rule_follow    # 1: slot 0 of ctx_resume is the start of the rule's declared follow

include "memo.pxi"
include "parser.pxi"
include "vocab.pxi"
include "class_trie.pxi"
include "entries.pxi"
include "pool.pxi"
include "builder.pxi"
include "compiled_core.pxi"
include "matcher.pxi"
include "link.pxi"
