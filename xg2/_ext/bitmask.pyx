# cython: language_level=3, boundscheck=False, wraparound=False
"""Masking logits on the CPU: one pass over the bitmask words, without the GIL.

A decode step masks every structured request's row of a (batch, vocab) logits buffer. Words whose
32 tokens are all allowed are skipped with one compare, words whose 32 tokens are all banned are
written with 32 plain stores (which the compiler vectorises), and only the banned tokens of the
others are written one by one: a mask that allows most of the vocabulary costs a read of the
bitmask, and one that allows a few tokens (a JSON state) about a store per word. Torch's and numpy's vectorised forms unpack
every bit of every row into a temporary first.
"""

from libc.stdint cimport int32_t, int64_t, uint16_t, uint32_t, uintptr_t

cdef extern from *:
    """
    static inline int xg2_ctz32(unsigned int x) { return __builtin_ctz(x); }
    """
    int xg2_ctz32(unsigned int x) nogil

cdef extern from "math.h":
    float INFINITY

#: Element kinds of the logits buffer.
FLOAT32 = 0
FLOAT16 = 1
BFLOAT16 = 2


cdef void _mask_row(char* row, int kind, const int32_t* words, int64_t vocab_size) noexcept nogil:
    cdef int64_t n_words = (vocab_size + 31) // 32, w, base, t
    cdef uint32_t banned
    cdef float* f32 = <float*>row
    cdef uint16_t* f16 = <uint16_t*>row
    # -inf in IEEE half precision and in bfloat16
    cdef uint16_t ninf16 = 0xFC00 if kind == 1 else 0xFF80
    for w in range(n_words):
        banned = ~(<uint32_t>words[w])
        if banned == 0:
            continue
        base = w * 32
        if vocab_size - base < 32:
            banned &= (<uint32_t>1 << (vocab_size - base)) - 1
        elif banned == <uint32_t>0xFFFFFFFFu:      # a whole word banned (most of a JSON state's row): 32 plain stores
            if kind == 0:
                for t in range(base, base + 32):
                    f32[t] = -INFINITY
            else:
                for t in range(base, base + 32):
                    f16[t] = ninf16
            continue
        while banned:
            t = base + xg2_ctz32(banned)
            banned &= banned - 1
            if kind == 0:
                f32[t] = -INFINITY
            else:
                f16[t] = ninf16


def mask_rows(uintptr_t logits, int64_t logits_row_bytes, int kind, uintptr_t bitmask,
              int64_t bitmask_row_words, const int64_t[:] rows, int64_t vocab_size):
    """For each i in `rows`: logits row i, its first `vocab_size` elements, masked by bitmask row i.

    The caller has checked everything (xg2.kernels): addresses of C-contiguous rows, row indices in
    range for both buffers, vocab_size within both widths, `kind` one of FLOAT32/FLOAT16/BFLOAT16.
    """
    cdef int64_t k, i, n = rows.shape[0]
    with nogil:
        for k in range(n):
            i = rows[k]
            _mask_row(<char*>(logits + <uintptr_t>(i * logits_row_bytes)), kind,
                      <const int32_t*>(bitmask + <uintptr_t>(i * bitmask_row_words * 4)), vocab_size)
