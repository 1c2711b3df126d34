"""The row book both ends of a remote step keep (xg2._ext.rowbook): the receiver's rows always equal
the sender's, whether a row is named, sent whole or sent as changed words, as the ring wraps."""

from __future__ import annotations

import numpy as np
import pytest
from xg2._ext.rowbook import RowBook, RowBookError


def _pair(capacity: int, width: int) -> tuple[RowBook, RowBook]:
    return RowBook(capacity, width, 7), RowBook(capacity, width, 7, indexed=False)


def _step(sender: RowBook, receiver: RowBook, rows: np.ndarray, last: np.ndarray) -> tuple[np.ndarray, int]:
    n, w = rows.shape
    ids = np.empty(n, np.int64)
    pos, val = np.empty(n * w, np.int32), np.empty(n * w, np.int32)
    m = sender.encode(rows, last, ids, pos, val)
    out = np.full((n, w), -1, np.int32)
    receiver.decode(last, ids, pos[:m], val[:m], out)
    return out, m, ids


@pytest.mark.parametrize("capacity", [1, 3, 16, 256])
def test_receiver_rows_equal_sender_rows(capacity):
    rng = np.random.default_rng(capacity)
    width, sessions = 37, 6
    pool = rng.integers(-2**31, 2**31, (20, width), dtype=np.int64).astype(np.int32)
    sender, receiver = _pair(capacity, width)
    last = np.full(sessions, -1, np.int64)
    words = 0
    for _ in range(300):
        rows = pool[rng.integers(0, len(pool), sessions)].copy()
        if rng.random() < 0.3:               # a row close to its session's previous one
            rows[0] = rows[0] ^ (rng.random(width) < 0.05).astype(np.int32)
        out, m, ids = _step(sender, receiver, rows, last)
        assert np.array_equal(out, rows)
        assert sender.next_id == receiver.next_id
        last = ids
        words += m
    if capacity >= len(pool):                # the pool fits: after the first visits, rows are named
        assert words < 300 * sessions * width // 4


def test_a_new_row_is_sent_as_the_words_that_differ():
    sender, receiver = _pair(8, 64)
    a = np.zeros((1, 64), np.int32)
    a[0, 5] = 3
    out, m, ids = _step(sender, receiver, a, np.array([-1]))
    assert m == 1 and np.array_equal(out, a)
    b = a.copy()
    b[0, 9] = -1
    out, m, ids2 = _step(sender, receiver, b, ids)
    assert m == 1 and np.array_equal(out, b) and ids2[0] == 1
    out, m, ids3 = _step(sender, receiver, a, ids2)      # back to a: named, nothing sent
    assert m == 0 and ids3[0] == 0 and np.array_equal(out, a)


def test_a_row_the_receiver_does_not_hold_is_refused():
    sender, receiver = _pair(4, 8)
    rows = np.arange(8, dtype=np.int32).reshape(1, 8)
    _step(sender, receiver, rows, np.array([-1]))
    out = np.zeros((1, 8), np.int32)
    with pytest.raises(RowBookError):
        receiver.decode(np.array([-1]), np.array([5]), np.empty(0, np.int32), np.empty(0, np.int32), out)
    with pytest.raises(RowBookError):       # words of no new row
        receiver.decode(np.array([-1]), np.array([0]), np.array([3], np.int32), np.array([1], np.int32), out)
    with pytest.raises(ValueError):
        receiver.encode(rows, np.array([-1]), np.empty(1, np.int64), np.empty(8, np.int32), np.empty(8, np.int32))
    with pytest.raises(ValueError):
        RowBook(0, 8)
