"""ShardedCache: the runtime's second cache tier, over the CacheShard actors.

The first tier is the process's own (the compiler's entry pool and module cache, the runtime's
compiled grammars). This one is the deployment's: what any process built, any other can fetch.

- Compile time: the compiled grammar is fetched by its spec's content key (one call; its blob
  carries the entries of its first mask). On a miss the grammar is compiled here: the modules of its
  schemas (tools, `anyOf` branches) are fetched in one batched read before any is lowered, and once
  the grammar's tables and keys exist the entries of its first mask are fetched in one more, so the
  first mask is built from them. The entries of every other key it names are fetched in the
  background, while the model prefills.
- Background: a publisher thread sends what was built (modules; the grammar's blob; the pooled entries its
  keys name, once the compile-time precompute is over, and again when a session closes, for the
  entries decoding built) in batches. Nothing waits on it, and a key once sent is not sent again.

Shard keys are the item's own content key (at least 128 bits), its kind and a digest of the
namespace (the build: engine version, format version, compiled core; and the vocabulary
fingerprint); values are transport blobs,
checked on the way in (checksum, versions, vocabulary, then the entry itself). Anything that fails a check is
dropped and rebuilt: a damaged, stale or lost item costs time, never a wrong mask.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import queue
import threading
import time
from collections import OrderedDict, deque
from typing import Any

import msgspec

from .. import transport
from .router import ShardRouter

_log = logging.getLogger("xg2.tier")

#: Keys remembered as sent (older ones may be sent again; the shard keeps its copy).
MAX_SENT_KEYS = 1 << 18
_MODULE_KEY = msgspec.msgpack.Encoder()
#: Background loops give up the GIL after holding it this long (and then wait while an open is on
#: its way to a first mask): a thread that keeps it runs for the interpreter's whole switch interval
#: (5 ms) while a compile or a fill waits. Yielding every 8 items instead, as before, spent more in
#: GIL hand-offs than in the work: with the tier on, the replica's process used twice the CPU of a
#: run without it, a third of it in the publisher's yields.
YIELD_AFTER_S = 0.001
#: How long a background loop waits at a yield point while opens are on their way to a first mask.
FOREGROUND_WAIT_S = 0.005
#: Pairs per put call.
PUBLISH_BATCH = 512
#: Publish jobs waiting at most (a grammar, a session's entries, a module): past it the oldest is
#: dropped and counted (`publish_dropped`). Publishing is best effort, and a queue that grows
#: while the shards are slow or gone would hold every grammar it names in memory.
MAX_PUBLISH_JOBS = 1024
#: Module blobs this process holds (those its compile workers lowered, those read from the shards):
#: a compile here or in a worker finds them without a round trip to the shards.
MODULE_BLOB_BYTES = 32 << 20
#: A module the shards did not hold is not asked for again for this long: a compile that could not
#: link on the replica's thread goes to a worker, which asks for the same modules at once.
MODULE_MISS_TTL_S = 2.0


class GrammarFound(Exception):
    """A compile asked for its grammar in the read of its modules (ShardedCache.asking_grammar), and
    the shards hold it: the compile stops, the blob is loaded instead."""

    def __init__(self, blob: bytes):
        super().__init__("the compiled grammar is in the shards")
        self.blob = blob


class _GrammarAsk:
    __slots__ = ("asked", "sk")

    def __init__(self, sk: bytes):
        self.sk, self.asked = sk, False


def namespace_digest(build: str, fingerprint: str) -> bytes:
    """What every shard key of one build and vocabulary ends with (its first 8 bytes): items of
    two builds or two vocabularies never meet, even in one shard."""
    return hashlib.blake2b(f"xg2/{build}/{fingerprint}".encode(), digest_size=16).digest()


class ShardedCache:
    """The second tier over a ShardRouter; bound to one compiler (vocabulary) by `bind`."""

    def __init__(self, router: ShardRouter, *, precompute_wait_s: float = 2.0):
        self.router = router
        router.on_restart.append(self._shard_restarted)
        self.precompute_wait_s = precompute_wait_s
        self.compiler = None
        self._ns = b""
        self._fingerprint = ""
        self._sent: OrderedDict[bytes, None] = OrderedDict()
        self._jobs: deque[tuple] = deque()
        self._jobs_ready = threading.Condition(threading.Lock())
        self.max_publish_jobs = MAX_PUBLISH_JOBS
        self._worker: threading.Thread | None = None
        self._fetches: queue.Queue = queue.Queue()
        self._fetcher: threading.Thread | None = None
        self._lock = threading.Lock()
        self.counts = {"grammar_gets": 0, "grammar_hits": 0, "entry_gets": 0, "entry_hits": 0,
                       "entries_refused": 0, "published_grammars": 0, "published_entries": 0,
                       "grammar_get_ms": 0.0, "entry_get_ms": 0.0, "module_gets": 0, "module_hits": 0,
                       "module_get_ms": 0.0, "published_modules": 0, "prefetch_skipped": 0,
                       "publish_dropped": 0, "module_memory_hits": 0}
        self._module_blobs: OrderedDict[bytes, bytes] = OrderedDict()     # shard key -> blob
        self._module_blob_bytes = 0
        self._module_misses: OrderedDict[bytes, float] = OrderedDict()    # shard key -> when it missed
        self.module_blob_budget = MODULE_BLOB_BYTES
        self._fetched: OrderedDict[tuple, Any] = OrderedDict()
        self._local = threading.local()     # `ask`: a grammar to ask for with the next module read
        self._generation = 0        # of the shards' contents, as this process knows them (restarts)
        self.also_found: bytes | None = None
        self._foreground = 0

    @contextlib.contextmanager
    def foreground(self):
        """Marks an open on its way to its first mask: the background loops (prefetch, loading,
        publishing) hold back at their next yield point for up to FOREGROUND_WAIT_S, so the open's
        read, deserialize and first fill do not queue behind them for the GIL."""
        with self._lock:
            self._foreground += 1
        try:
            yield
        finally:
            with self._lock:
                self._foreground -= 1

    def _pace(self) -> None:
        """A background loop's check between items: yield (below, waiting while opens are on their
        way) when it has held the GIL for YIELD_AFTER_S."""
        if not getattr(self._local, "background", False):
            return      # a compile's own read (its first mask's entries) never waits for itself
        now = time.perf_counter()
        last = getattr(self._local, "paced", 0.0)
        if now - last >= YIELD_AFTER_S:
            if last:
                self._yield()
            self._local.paced = time.perf_counter()

    def _yield(self) -> None:
        """A background loop's yield point: give up the GIL, and wait while opens are in progress."""
        if self._foreground:
            until = time.monotonic() + FOREGROUND_WAIT_S
            while self._foreground and time.monotonic() < until:
                time.sleep(0.0002)
        else:
            time.sleep(0)

    def _shard_restarted(self, shard: int) -> None:
        """A shard came back empty: what this process sent it must be sent again when next built
        or closed, so forget having sent it."""
        with self._lock:
            self._generation += 1       # every grammar's entries are looked at again
            groups = self.router.group(list(self._sent))
            for k in groups.get(shard, []):
                del self._sent[k]

    def bind(self, compiler: Any) -> None:
        """Serve `compiler` as its second tier: entries of first masks, and modules."""
        self.compiler = compiler
        compiler.entry_source = self.load_entries
        compiler.module_source = self
        self._fingerprint = compiler.tokenizer_info.fingerprint
        self._ns = namespace_digest(transport.build_id(), self._fingerprint)

    def shard_key(self, kind: bytes, key: bytes) -> bytes:
        """The item's own content key (a digest already: the router spreads by its first bytes),
        its kind, and the namespace's first 8 bytes."""
        return key + kind + self._ns[:8]

    # -- reads (on the compiling thread) ------------------------------------------------------------
    def get_grammar(self, key: bytes) -> bytes | None:
        self.counts["grammar_gets"] += 1
        t0 = time.perf_counter()
        blob = self.router.get_many([self.shard_key(b"g", key)])
        self.counts["grammar_get_ms"] += (time.perf_counter() - t0) * 1e3
        return self._grammar_found(blob)

    def _grammar_found(self, found: dict[bytes, bytes]) -> bytes | None:
        """The blob of a grammar read, remembered as held by the shards (not to be sent back)."""
        if not found:
            return None
        self.counts["grammar_hits"] += 1
        ((sk, blob),) = found.items()
        with self._lock:
            self._remember(sk)
        return blob

    async def get_grammar_async(self, key: bytes) -> bytes | None:
        """`get_grammar` on the caller's event loop, while no compile thread is held."""
        self.counts["grammar_gets"] += 1
        t0 = time.perf_counter()
        blob = await self.router.get_many_async([self.shard_key(b"g", key)])
        self.counts["grammar_get_ms"] += (time.perf_counter() - t0) * 1e3
        return self._grammar_found(blob)

    def load_entries(self, keys: list[bytes], also: bytes | None = None) -> int:
        """Fetch the entries of pool `keys` in one batched read and load them into the pool;
        returns how many were loaded. `also`: one more shard key read in the same batch, whose
        value is kept in `self.also_found` (a grammar's own entries)."""
        t0 = time.perf_counter()
        pool = self.compiler.entry_pool
        by_shard_key = {self.shard_key(b"e", k): k for k in keys}
        found = self.router.get_many(list(by_shard_key) + ([also] if also is not None else []))
        self.also_found = found.pop(also, None) if also is not None else None
        self.counts["entry_gets"] += len(keys)
        loaded = 0
        for sk, blob in found.items():
            self._pace()        # let a compile or a fill on another thread take the GIL
            try:
                pool.load(by_shard_key[sk], transport.load_entry(blob, self._fingerprint))
                loaded += 1
            except (ValueError, MemoryError) as e:
                self.counts["entries_refused"] += 1
                _log.warning("cache tier entry refused (%s); it will be rebuilt", e)
        with self._lock:
            for sk in found:        # the shards hold these already
                self._remember(sk)
        self.counts["entry_hits"] += loaded
        self.counts["entry_get_ms"] += (time.perf_counter() - t0) * 1e3
        return loaded

    @staticmethod
    def module_key(key: tuple) -> bytes:
        """A module's compiler key (options and schema text) as a content digest."""
        return hashlib.blake2b(_MODULE_KEY.encode(key), digest_size=16).digest()

    def _keep_blob(self, sk: bytes, blob: bytes) -> None:
        """Hold a module's blob (with self._lock), the least recently used dropped past the budget."""
        old = self._module_blobs.pop(sk, None)
        if old is not None:
            self._module_blob_bytes -= len(old)
        self._module_blobs[sk] = blob
        self._module_blob_bytes += len(blob)
        while self._module_blob_bytes > self.module_blob_budget and self._module_blobs:
            self._module_blob_bytes -= len(self._module_blobs.popitem(last=False)[1])

    def _module_blobs_for(self, sks: list[bytes]) -> tuple[dict[bytes, bytes], list[bytes]]:
        """The module blobs held here for shard keys `sks`, and the keys to ask the shards for."""
        held: dict[bytes, bytes] = {}
        with self._lock:
            for sk in sks:
                blob = self._module_blobs.get(sk)
                if blob is not None:
                    self._module_blobs.move_to_end(sk)
                    held[sk] = blob
        self.counts["module_memory_hits"] += len(held)
        return held, [sk for sk in sks if sk not in held]

    @contextlib.contextmanager
    def asking_grammar(self, key: bytes):
        """Within it, this thread's next module read (`fetch`) asks the shards for the compiled
        grammar of `key` in the same batch, and raises GrammarFound if they hold it: a tool set's
        compile costs one round trip to the shards, not two. Yields whether it was asked
        (`.asked`: no module read, no question)."""
        ask = _GrammarAsk(self.shard_key(b"g", key))
        self._local.ask = ask
        try:
            yield ask
        finally:
            self._local.ask = None

    def _read_modules(self, sks: list[bytes], also: bytes | None = None) -> dict[bytes, bytes]:
        """Module blobs for `sks`: those held here, the others in one batched read of the shards
        (kept here from then on); `also`, one more shard key asked in the same read."""
        found, ask = self._module_blobs_for(sks)
        now = time.monotonic()
        with self._lock:
            ask = [sk for sk in ask if self._module_misses.get(sk, -MODULE_MISS_TTL_S) + MODULE_MISS_TTL_S <= now]
        if not ask and also is None:
            return found
        t0 = time.perf_counter()
        got = self.router.get_many(ask + ([also] if also is not None else []))
        ms = (time.perf_counter() - t0) * 1e3
        if also is not None:
            self.counts["grammar_gets"] += 1
            self.counts["grammar_get_ms"] += ms
            blob = got.pop(also, None)
            if blob is not None:
                raise GrammarFound(self._grammar_found({also: blob}))
        self.counts["module_gets"] += len(ask)
        self.counts["module_hits"] += len(got)
        self.counts["module_get_ms"] += ms
        with self._lock:
            for sk in ask:
                if sk in got:
                    self._remember(sk)      # the shards hold it: not to be sent back
                    self._keep_blob(sk, got[sk])
                else:
                    self._module_misses[sk] = now
                    self._module_misses.move_to_end(sk)
            while len(self._module_misses) > 4096:
                self._module_misses.popitem(last=False)
        found.update(got)
        return found

    def fetch(self, keys: list[tuple], all_or_nothing: bool = False) -> int:
        """Get the modules of `keys` (held here, else in one batched read); `take` hands them to the
        compiler. `all_or_nothing`: unless every one was found, none is loaded (a link-only compile
        that must go to a worker anyway: the worker loads them; their blobs stay held here)."""
        by_shard_key = {self.shard_key(b"m", self.module_key(k)): k for k in keys}
        ask = getattr(self._local, "ask", None)
        also = None
        if ask is not None and not ask.asked:
            ask.asked, also = True, ask.sk
        found = self._read_modules(list(by_shard_key), also)
        if all_or_nothing and len(found) < len(by_shard_key):
            return len(found)
        for sk, blob in found.items():
            try:
                module = transport.load_module(blob, self._fingerprint)
            except transport.DeserializeError as e:
                _log.warning("cache tier module refused (%s); it will be lowered here", e)
                continue
            with self._lock:
                self._fetched[by_shard_key[sk]] = module
                while len(self._fetched) > 256:
                    self._fetched.popitem(last=False)
        return len(found)

    def get_blobs(self, kind: bytes, keys: list[bytes]) -> list[bytes | None]:
        """One batched read for a compile running in another process (a compile worker asks
        through its parent): the blobs of modules (`kind` b"m", keys their `module_key`; those held
        here need no read) or of pool entries (b"e", pool keys), None where the shards hold none.
        The worker checks and loads them; they are counted here as the in-process fetches are."""
        sks = [self.shard_key(kind, k) for k in keys]
        if kind == b"m":
            found = self._read_modules(sks)
            return [found.get(sk) for sk in sks]
        t0 = time.perf_counter()
        found = self.router.get_many(sks)
        with self._lock:
            for sk in found:        # the shards hold these: not to be sent back
                self._remember(sk)
        self.counts["entry_gets"] += len(keys)
        self.counts["entry_hits"] += len(found)
        self.counts["entry_get_ms"] += (time.perf_counter() - t0) * 1e3
        return [found.get(sk) for sk in sks]

    def publish_module_blobs(self, modules: list[tuple[bytes, bytes]]) -> None:
        """Modules another process lowered and dumped (a compile worker: (digest, blob) each): held
        here, for this process's compiles and workers, and sent in the background in one batch."""
        with self._lock:
            for digest, blob in modules:
                sk = self.shard_key(b"m", digest)
                self._keep_blob(sk, blob)
                self._module_misses.pop(sk, None)
        self._submit(("module_blobs", None, modules))

    def publish_module_blob(self, digest: bytes, blob: bytes) -> None:
        self.publish_module_blobs([(digest, blob)])

    def take(self, key: tuple) -> Any:
        with self._lock:
            return self._fetched.pop(key, None)

    def publish(self, key: tuple, module: Any) -> None:
        self._submit(("module", key, module))

    def _load_own(self, compiled: Any, blob: bytes) -> None:
        """Install a loaded grammar's own entries beyond its first mask (published apart from it)."""
        try:
            entries = transport.load_own_entries(blob, self._fingerprint)
        except transport.DeserializeError as e:
            _log.warning("cache tier gave unusable grammar entries (%s); they will be built", e)
            return
        core = compiled._core
        for node, data in entries.items():
            self._pace()        # let a compile or a fill on another thread take the GIL
            try:
                core.load_entry(node, data)
            except (ValueError, MemoryError):
                self.counts["entries_refused"] += 1

    def prefetch(self, compiled: Any, key: bytes) -> None:
        """Fetch, in the background, the entries of every other key the grammar names (one batched
        read), while the model prefills; the precompute and the fills then find them in the pool.
        A grammar compiled here whose first mask's entries the shards did not hold, and none of
        whose modules came from them, is new to the deployment: its other keys are not asked for
        (nearly all of them would miss). A new set of known tools is not: its tools' entries are
        there."""
        if compiled._built_keys is None and compiled._tier_found == 0 and not compiled._tier_modules:
            self.counts["prefetch_skipped"] += 1
            return
        with self._lock:
            if self._fetcher is None or not self._fetcher.is_alive():
                self._fetcher = threading.Thread(target=self._fetch_loop, name="xg2-tier-prefetch", daemon=True)
                self._fetcher.start()
        self._fetches.put((compiled, key))

    def _fetch_loop(self) -> None:
        pool = self.compiler.entry_pool
        self._local.background = True
        while True:
            compiled = self._fetches.get()
            try:
                if isinstance(compiled, threading.Event):
                    compiled.set()
                    continue
                compiled, key = compiled
                known = compiled._built_keys     # a loaded grammar names what exists
                keys = compiled._core.pool_keys().values() if known is None else known
                wanted = [k for k in keys if k not in pool]
                own = self.shard_key(b"o", key) if known is not None else None
                if wanted or own is not None:
                    self.load_entries(wanted, own)
                if self.also_found is not None:
                    self._load_own(compiled, self.also_found)
            except Exception:       # noqa: BLE001 - a failed prefetch only means building the entries
                _log.exception("cache tier prefetch failed")

    # -- writes (in the background) ------------------------------------------------------------------
    def publish_grammar(self, key: bytes, compiled: Any) -> None:
        self._submit(("grammar", key, compiled))

    def publish_entries(self, compiled: Any, key: bytes | None = None) -> None:
        """Send the pooled entries built for `compiled` that the shards may lack (a session closed:
        decoding built some); with its `key`, the grammar too, unless the shards are known to hold
        it (after a shard restart they are not)."""
        self._submit(("entries", None, compiled) if key is None else ("grammar", key, compiled))

    def _submit(self, job: tuple) -> None:
        with self._lock:
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._run, name="xg2-tier-publish", daemon=True)
                self._worker.start()
        with self._jobs_ready:
            jobs = self._jobs
            if job[0] != "flush" and len(jobs) >= self.max_publish_jobs:
                # the oldest job that is not a flush goes (a flush is a caller waiting)
                for i, old in enumerate(jobs):
                    if old[0] != "flush":
                        del jobs[i]
                        self.counts["publish_dropped"] += 1
                        break
            jobs.append(job)
            self._jobs_ready.notify()

    def _next_job(self) -> tuple:
        with self._jobs_ready:
            while not self._jobs:
                self._jobs_ready.wait()
            return self._jobs.popleft()

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until everything submitted so far is published (or `timeout_s` passes)."""
        deadline = time.monotonic() + timeout_s
        done = threading.Event()
        self._submit(("flush", None, done))
        fetched = True
        if self._fetcher is not None:
            event = threading.Event()
            self._fetches.put(event)
            fetched = event.wait(timeout_s)
        return done.wait(max(0.0, deadline - time.monotonic())) and fetched

    def _remember(self, sk: bytes) -> bool:
        """Mark a shard key as sent; False if it was (with self._lock)."""
        if sk in self._sent:
            self._sent.move_to_end(sk)
            return False
        self._sent[sk] = None
        if len(self._sent) > MAX_SENT_KEYS:
            self._sent.popitem(last=False)
        return True

    def _run(self) -> None:
        self._local.background = True
        while True:
            kind, key, obj = self._next_job()
            try:
                if kind == "flush":
                    obj.set()
                    continue
                items = []
                if kind in ("module", "module_blobs"):
                    pairs = [(self.shard_key(b"m", self.module_key(key)), obj)] if kind == "module" else \
                        [(self.shard_key(b"m", digest), blob) for digest, blob in obj]
                    with self._lock:
                        pairs = [(sk, blob) for sk, blob in pairs if self._remember(sk)]
                    if pairs:
                        self.router.put_many([(sk, transport.dump_module(blob, self._fingerprint)
                                               if kind == "module" else blob) for sk, blob in pairs])
                        self.counts["published_modules"] += len(pairs)
                    continue
                if kind == "grammar":
                    obj._precomputed.wait(self.precompute_wait_s)
                    sk = self.shard_key(b"g", key)
                    with self._lock:
                        fresh = self._remember(sk)
                    if fresh:
                        blob, rest = transport.dump_grammar(obj, rest_apart=True)
                        items += [(sk, blob), (self.shard_key(b"o", key), rest)]
                        self.counts["published_grammars"] += 1
                items += self._entry_items(obj)
                for i in range(0, len(items), PUBLISH_BATCH):
                    self.router.put_many(items[i:i + PUBLISH_BATCH])
            except Exception:       # noqa: BLE001 - publishing is best effort; the next build sends again
                _log.exception("cache tier publish failed")

    def _entry_items(self, compiled: Any) -> list[tuple[bytes, bytes]]:
        """The built pooled entries of `compiled` not sent yet. Each grammar remembers the keys it
        has had examined (until a shard restarts): a session's close then looks only at what decoding
        built since, not again at every entry of the grammar."""
        pool = self.compiler.entry_pool
        examined = compiled._tier_examined
        if examined is None or examined[0] != self._generation:
            examined = compiled._tier_examined = (self._generation, set())
        seen = examined[1]
        todo = set(compiled._core.pool_keys(built_only=True).values())
        todo.difference_update(seen)
        seen.update(todo)
        out = []
        self._local.paced = 0.0
        for k in todo:
            self._pace()
            sk = self.shard_key(b"e", k)
            with self._lock:
                if sk in self._sent:
                    continue
            data = pool.dump(k)
            if data is None:
                continue        # evicted
            with self._lock:
                self._remember(sk)
            out.append((sk, transport.dump_entry(data, self._fingerprint)))
        self.counts["published_entries"] += len(out)
        return out

    def stats(self) -> dict[str, int]:
        return dict(self.counts, router_failures=self.router.failures, shard_restarts=self.router.restarts)
