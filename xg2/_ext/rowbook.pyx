# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""A numbered ring of distinct bitmask rows, kept alike on both ends of a remote step.

A step of many sessions sends few new masks: sessions of a batch pass through the same states
(inside a string, between members, at a tool's name), so over a few hundred steps of 32 tool-calling
sessions only a few hundred distinct rows occur. Both ends number the rows in the order they were
first sent and keep the last `capacity` of them; a step then names a row the caller already holds by
its number, and sends only the rows it never saw, as the words that differ from the session's
previous row. The sender finds a row by a hash of its words and always compares the words
themselves before naming it, so a hash collision costs a resend, never a wrong mask.

Numbers are assigned in row order within a step on both ends, and a number leaves the ring when the
ring wraps past it; the receiver sees a new row as the one numbered `next_id`. Both ends apply the
same rule at the same point of the same sequence, which is what keeps them equal; the caller
checks that sequence (the book's epoch and `next_id` travel with every step).
"""

from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy, memset

import numpy as np


class RowBookError(ValueError):
    """A step names a row this end does not hold: the two ends' books are out of step."""


cdef inline uint64_t _mix(uint64_t h) noexcept nogil:
    h ^= h >> 33
    h *= 0xff51afd7ed558ccdULL
    h ^= h >> 33
    h *= 0xc4ceb9fe1a85ec53ULL
    h ^= h >> 33
    return h


cdef uint64_t row_hash(const int32_t *row, Py_ssize_t width) noexcept nogil:
    """Four independent multiply-add lanes over the row's words (fast; only finds candidates)."""
    cdef uint64_t a = 0x9E3779B97F4A7C15ULL, b = 0xC2B2AE3D27D4EB4FULL
    cdef uint64_t c = 0x165667B19E3779F9ULL, d = 0x27D4EB2F165667C5ULL
    cdef Py_ssize_t i = 0
    while i + 4 <= width:
        a = (a + <uint32_t>row[i]) * 0x100000001B3ULL
        b = (b + <uint32_t>row[i + 1]) * 0x9E3779B185EBCA87ULL
        c = (c + <uint32_t>row[i + 2]) * 0xC2B2AE3D27D4EB4FULL
        d = (d + <uint32_t>row[i + 3]) * 0x165667B19E3779F9ULL
        i += 4
    while i < width:
        a = (a + <uint32_t>row[i]) * 0x100000001B3ULL
        i += 1
    return _mix(a ^ _mix(b + 1) ^ _mix(c + 2) ^ _mix(d + 3) ^ <uint64_t>width)


cdef class RowBook:
    """The last `capacity` distinct rows, numbered from 0 in the order they were added. The sending
    end (`indexed`) also keeps a hash index to find a row by its words."""

    cdef int32_t[:, ::1] _ring
    cdef uint64_t[::1] _hashes
    cdef dict _index
    cdef readonly int64_t next_id
    cdef readonly int64_t capacity
    cdef readonly Py_ssize_t width
    cdef readonly object epoch

    def __init__(self, int64_t capacity, Py_ssize_t width, epoch=0, bint indexed=True):
        if capacity < 1 or width < 1:
            raise ValueError("a row book needs a capacity and a width of at least 1")
        self._ring = np.zeros((capacity, width), np.int32)
        self._hashes = np.zeros(capacity, np.uint64)
        self._index = {} if indexed else None
        self.next_id = 0
        self.capacity = capacity
        self.width = width
        self.epoch = epoch

    cdef inline bint _holds(self, int64_t row_id) noexcept nogil:
        return 0 <= row_id < self.next_id and row_id >= self.next_id - self.capacity

    def holds(self, int64_t row_id) -> bool:
        return self._holds(row_id)

    def row(self, int64_t row_id):
        if not self._holds(row_id):
            raise RowBookError(f"row {row_id} is not in the book (next {self.next_id}, capacity {self.capacity})")
        return np.asarray(self._ring[row_id % self.capacity])

    cdef void _add(self, const int32_t *row, uint64_t h) except *:
        cdef int64_t new_id = self.next_id
        cdef int64_t slot = new_id % self.capacity
        cdef int64_t gone = new_id - self.capacity
        if self._index is not None:
            if gone >= 0:
                old = self._hashes[slot]
                if self._index.get(old) == gone:
                    del self._index[old]
            self._index[h] = new_id
        memcpy(&self._ring[slot, 0], row, self.width * sizeof(int32_t))
        self._hashes[slot] = h
        self.next_id = new_id + 1

    def encode(self, int32_t[:, ::1] rows, const int64_t[::1] last, int64_t[::1] ids,
               int32_t[::1] positions, int32_t[::1] values) -> int:
        """For each row k: ids[k] = the number of an equal row in the book (the session's last row,
        `last[k]`, or any other), or the number the row gets as a new one; a new row's words that
        differ from row `last[k]` (zeros if the book no longer holds it) go to positions (k * width
        + word) and values. Returns how many words were written."""
        cdef Py_ssize_t n = rows.shape[0], w = self.width, k, i
        cdef Py_ssize_t m = 0
        cdef int64_t lid, slot
        cdef uint64_t h
        cdef const int32_t *row
        cdef const int32_t *base
        if self._index is None:
            raise ValueError("only an indexed book (the sending end) encodes")
        if rows.shape[1] != w or last.shape[0] < n or ids.shape[0] < n:
            raise ValueError("rows, last and ids do not match the book's width and the batch")
        if positions.shape[0] < n * w or values.shape[0] < n * w:
            raise ValueError("positions and values need room for every word of the batch")
        for k in range(n):
            row = &rows[k, 0]
            lid = last[k]
            if self._holds(lid) and memcmp(row, &self._ring[lid % self.capacity, 0], w * sizeof(int32_t)) == 0:
                ids[k] = lid
                continue
            h = row_hash(row, w)
            found = self._index.get(h)
            if found is not None:
                slot = found
                if self._holds(slot) and memcmp(row, &self._ring[slot % self.capacity, 0],
                                                w * sizeof(int32_t)) == 0:
                    ids[k] = slot
                    continue
            base = &self._ring[lid % self.capacity, 0] if self._holds(lid) else NULL
            with nogil:
                if base == NULL:
                    for i in range(w):
                        if row[i] != 0:
                            positions[m] = <int32_t>(k * w + i)
                            values[m] = row[i]
                            m += 1
                else:
                    for i in range(w):
                        if row[i] != base[i]:
                            positions[m] = <int32_t>(k * w + i)
                            values[m] = row[i]
                            m += 1
            ids[k] = self.next_id
            self._add(row, h)
        return m

    def decode(self, const int64_t[::1] last, const int64_t[::1] ids, const int32_t[::1] positions,
               const int32_t[::1] values, int32_t[:, ::1] out) -> None:
        """The receiving end of `encode`: writes row k of `out` from the book, or as the session's
        last row with the sent words applied, adding it as a new row. Raises RowBookError when a
        step names a row this book does not hold."""
        cdef Py_ssize_t n = ids.shape[0], w = self.width, k, j = 0, m = positions.shape[0], end
        cdef int64_t rid, lid
        if out.shape[0] < n or out.shape[1] != w or last.shape[0] < n or values.shape[0] < m:
            raise ValueError("out, last and the words do not match the book's width and the batch")
        for k in range(n):
            rid = ids[k]
            if rid == self.next_id:
                lid = last[k]
                if self._holds(lid):
                    memcpy(&out[k, 0], &self._ring[lid % self.capacity, 0], w * sizeof(int32_t))
                else:
                    memset(&out[k, 0], 0, w * sizeof(int32_t))
                end = (k + 1) * w
                while j < m and positions[j] < end:
                    if positions[j] < k * w:
                        raise RowBookError("the step's words are not in row order")
                    out[k, positions[j] - k * w] = values[j]
                    j += 1
                self._add(&out[k, 0], 0)
            elif self._holds(rid):
                memcpy(&out[k, 0], &self._ring[rid % self.capacity, 0], w * sizeof(int32_t))
            else:
                raise RowBookError(f"the step names row {rid}, which this book does not hold "
                                   f"(next {self.next_id}, capacity {self.capacity})")
        if j != m:
            raise RowBookError("the step carries words of no new row")
