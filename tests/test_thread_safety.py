"""Serving compiles on a pool and fills on many threads: what that needs of one compiler."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import numpy as np

import xg2

STRESS = Path(__file__).with_name("stress_threads.py")


def test_threads_compiling_and_filling_match_a_single_thread():
    """tests/stress_threads.py in a child process: a crash in the core prints every thread's stack
    (PYTHONFAULTHANDLER) and fails this test instead of the runner."""
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    proc = subprocess.run([sys.executable, str(STRESS), "--threads", "8", "--rounds", "2"], check=False,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "errors=0" in proc.stdout


def test_compiling_leaves_the_garbage_collector_on(json_info):
    """Other threads' requests keep their collections while a compile runs."""
    compiler = xg2.GrammarCompiler(json_info, cache_enabled=False)
    schema = {"type": "object", "properties": {f"k{i}": {"type": "array", "items": {"type": "integer"}}
                                               for i in range(60)}}
    seen: list[bool] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.append(gc.isenabled())
            time.sleep(0.0005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for _ in range(3):
            compiler.compile_json_schema(schema)
    finally:
        done.set()
        watcher.join()
    assert seen and all(seen)


def test_background_precompute_does_not_keep_the_compiler_alive(json_info):
    compiler = xg2.GrammarCompiler(json_info, background_precompute=True)
    compiled = compiler.compile_json_schema({"type": "object", "properties": {"a": {"type": "string"}}})
    compiled._precomputed.wait(5)
    worker = compiler._worker       # this compiler's thread (other tests' compilers may still live)
    assert worker is not None and worker.is_alive()
    ref = weakref.ref(compiler)
    del compiler, compiled
    gc.collect()
    assert ref() is None
    worker.join(5)
    assert not worker.is_alive()


def test_bounded_rollback_keeps_the_latest_boundaries(json_info):
    """max_rollback_tokens drops old boundaries by moving the kept ones down: the move overlaps
    whenever fewer than twice as many are held, and rolling back must land on the right states."""
    compiler = xg2.GrammarCompiler(json_info)
    compiled = compiler.compile_grammar('root ::= [a-c]+ "." [0-9]+')
    text = "abcabcab.0123"
    ids = [json_info.decoded_vocab.index(ch.encode()) for ch in text]
    free = xg2.GrammarMatcher(compiled)
    masks = []
    bitmask = xg2.allocate_token_bitmask(1, json_info.vocab_size, backend="numpy")
    for t in ids:
        free.fill_next_token_bitmask(bitmask, 0)
        masks.append(bitmask.copy())
        assert free.accept_token(t)
    for keep in (1, 3, 5):
        bounded = xg2.GrammarMatcher(compiled, max_rollback_tokens=keep)
        for t in ids:
            assert bounded.accept_token(t)
        bounded.rollback(keep)
        bounded.fill_next_token_bitmask(bitmask, 0)
        assert np.array_equal(bitmask, masks[len(ids) - keep])
