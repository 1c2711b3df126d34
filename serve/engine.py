"""The decoding loop of a model replica: every active request advanced by one forward per step,
each constrained by its own grammar session, the mask work hidden behind the forward pass.

A step, for the batch of active sequences:
  1. the forward pass is launched on the forward thread (torch releases the GIL while it runs);
  2. meanwhile, on the loop's thread, the runtime fills the bitmask rows of the constrained
     sequences in one C call (their sessions accepted the previous tokens already);
  3. when the logits arrive, the rows are applied (`apply_token_bitmask_inplace`, constrained rows
     only), the next tokens sampled (greedy, or seeded temperature / top-p per request), and the
     sessions accept them.
Only step 3's mask part (apply and accept, plus any wait for a fill that outlasted the forward)
is added to the step's time; `stats` keeps it per step as `mask_exposed_ms`.

New requests are prefilled into a free cache row (serve.slots) in chunks of at most
`prefill_chunk` prompt tokens, one chunk per step, run in the step's own forward beside the
decoded tokens: a long prompt never stops the running streams for its whole length (a 2,000-token
prompt is seconds of CPU), each of its chunks only makes one of their steps longer (with nothing
decoding, chunks are bigger: `prefill_chunk_alone`). Prompts are
prefilled one at a time, first come first served; the request being prefilled stays at the head of
the queue, holding the row just past the active ones, until its last chunk gives its first token
and it joins the batch. A finished or cancelled request's row is given back at the end of the step.
A token the grammar did not allow can never be emitted: a session that refuses a sampled token (it
cannot happen with the mask applied) fails its request with an error instead.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import os
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import torch

import xg2

from .slots import SlotModel

_log = logging.getLogger("xg2.serve")

#: Prompt tokens run per step beside decoding rows (Engine's `prefill_chunk`). A step's forward
#: costs about one read of the weights plus each token's compute: with SmolLM2-135M on 2 CPU
#: cores, 32 prompt tokens make a step of 3 streams about 1.3 times longer (their inter-token p99
#: stays well within twice its plain value while a 2,000-token prompt goes in), 64 about 1.6
#: times, 256 four times (benchmarks/README.md, "Chunked prefill").
PREFILL_CHUNK = 32

#: Prompt tokens run per step when no row decodes (Engine's `prefill_chunk_alone`): no stream
#: waits on the prompt then, and bigger chunks read the weights fewer times (a lone 2,000-token
#: prompt: about 6 s by 512s, 12 s by 32s, as one forward); still bounded, so that a prompt
#: cancelled meanwhile is let go within a second or so.
PREFILL_CHUNK_ALONE = 512


@dataclass
class SamplingParams:
    """What a request asks of the sampler; temperature 0 is greedy."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if not 0 <= self.temperature <= 2:
            raise ValueError("temperature must be within [0, 2]")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be within (0, 1]")


class GenerationError(RuntimeError):
    """A request's generation failed on the replica (the message says why); retryable when the
    replica is shutting down."""


class GrammarTooCostly(GenerationError):
    """A request's grammar needed a mask entry that could not be built within the fill budget
    (xg2.FillTimeoutError): that request fails with its tokens so far; the batch goes on."""


class Generation:
    """A request's tokens as they are sampled (`async for token in generation`), then its
    `finish_reason` ("stop": a stop token; "length": max_tokens or the model's length;
    "cancelled")."""

    __slots__ = ("_queue", "cancelled", "completion_tokens", "done", "finish_reason", "first_token_s",
                 "generator", "last", "params", "prefilled", "prompt", "row", "session", "submitted")

    def __init__(self, prompt: list[int], session: Any, params: SamplingParams):
        self.prompt = prompt
        self.session = session
        self.params = params
        self.generator: torch.Generator | None = None
        if params.temperature > 0:
            self.generator = torch.Generator()
            self.generator.manual_seed(params.seed if params.seed is not None
                                       else int.from_bytes(os.urandom(7), "little"))
        self._queue: asyncio.Queue = asyncio.Queue()
        self.row = -1
        self.prefilled = 0          # prompt tokens in its row so far
        self.last = -1
        self.completion_tokens = 0
        self.done = False
        self.cancelled = False
        self.finish_reason: str | None = None
        self.submitted = time.perf_counter()
        self.first_token_s: float | None = None

    def cancel(self) -> None:
        """Stop generating (e.g. a stop string was seen, or the client went away)."""
        if not self.done:
            self.cancelled = True

    def _emit(self, token: int) -> None:
        if self.first_token_s is None:
            self.first_token_s = time.perf_counter() - self.submitted
        self.completion_tokens += 1
        self._queue.put_nowait(token)

    def _finish(self, reason: str, error: BaseException | None = None) -> None:
        if not self.done:
            self.done = True
            self.finish_reason = reason
            self._queue.put_nowait(error)

    def __aiter__(self) -> AsyncIterator[int]:
        return self._tokens()

    async def _tokens(self) -> AsyncIterator[int]:
        try:
            while True:
                item = await self._queue.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.cancel()


class Engine:
    """The batch decoding loop of one replica (see the module note). Use it from one event loop.

    `prefill_chunk` is the most prompt tokens run in one step beside decoding rows (None: a whole
    prompt at once, as a single forward that holds up the running streams for its length);
    `prefill_chunk_alone` the most when no row decodes (None: the rest of the prompt)."""

    def __init__(self, model: Any, stop_token_ids: list[int], *, runtime: Any = None, max_batch: int = 8,
                 max_len: int = 4096, vocab_size: int | None = None, prefill_chunk: int | None = PREFILL_CHUNK,
                 prefill_chunk_alone: int | None = PREFILL_CHUNK_ALONE):
        for name, value in (("prefill_chunk", prefill_chunk), ("prefill_chunk_alone", prefill_chunk_alone)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1 (or None: no chunking)")
        self.prefill_chunk = prefill_chunk
        self.prefill_chunk_alone = prefill_chunk_alone
        self.lm = SlotModel(model, max_rows=max_batch, max_len=max_len)
        self.runtime = runtime
        self.max_batch = max_batch
        self.vocab_size = vocab_size or model.config.vocab_size
        self.stop_ids = frozenset(stop_token_ids)
        self._stop_list = sorted(self.stop_ids)
        self.bitmask = xg2.allocate_token_bitmask(max_batch, self.vocab_size)
        self._pending: collections.deque[Generation] = collections.deque()
        self._active: list[Generation] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._forward = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="xg2-forward")
        self._closed = False
        #: per step (the last 4096): forward, mask fill (overlapped), mask work exposed, batch size
        self.steps: collections.deque[tuple[float, float, float, int]] = collections.deque(maxlen=4096)
        self.counts = {"steps": 0, "prefills": 0, "prefill_chunks": 0, "tokens": 0, "requests": 0,
                       "refused_tokens": 0, "fill_timeouts": 0}

    def idle(self) -> bool:
        """Whether no request is queued or decoding (read from any thread: a hint, not a lock)."""
        return not self._active and not self._pending

    # -- requests ----------------------------------------------------------------------------------
    def submit(self, prompt: list[int], params: SamplingParams, session: Any = None) -> Generation:
        """Queue a request: its prompt token ids, sampling, and the runtime session that constrains
        it (None: unconstrained). The session must be fresh (nothing accepted yet)."""
        if self._closed:
            raise GenerationError("the replica is shutting down (retry on another)")
        if not prompt:
            raise ValueError("the prompt is empty")
        if len(prompt) >= self.lm.max_len:
            raise ValueError(f"the prompt has {len(prompt)} tokens; this model takes at most {self.lm.max_len - 1}")
        gen = Generation(list(prompt), session, params)
        self._pending.append(gen)
        self.counts["requests"] += 1
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run())
        self._wake.set()
        return gen

    async def close(self) -> None:
        """Fail what is queued or running (retryable) and stop the loop."""
        self._closed = True
        for gen in list(self._pending) + self._active:
            gen._finish("error", GenerationError("the replica is shutting down (retry on another)"))
        self._pending.clear()
        if self._task is not None:
            self._task.cancel()
        self._forward.shutdown(wait=False)

    # -- the loop --------------------------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closed:
            if not self._active and not self._pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                chunk = self._next_chunk()
                if self._active or chunk is not None:
                    await self._step(loop, chunk)
                self._retire()
            except asyncio.CancelledError:
                raise
            except Exception as e:      # noqa: BLE001 - a bug here fails the batch, never the replica
                _log.exception("decoding step failed")
                error = GenerationError(f"decoding failed: {type(e).__name__}: {e}")
                for g in self._active:
                    g._finish("error", error)
                self._active = []
                if self._pending and self._pending[0].row >= 0:     # the prompt being prefilled
                    self._drop_prefill(self._pending[0], error)

    def _next_chunk(self) -> tuple[Generation, list[int]] | None:
        """The prompt tokens to run with this step: the next chunk of the request at the head of
        the queue, which takes the first free row when it starts. One request at a time, in
        arrival order, so a burst of arrivals is admitted in order and none is overtaken."""
        while self._pending:
            gen = self._pending[0]
            if not self._going_on([gen])[0]:        # cancelled, or its session closed: queued or mid-prompt
                self._drop_prefill(gen)
                continue
            if gen.row < 0:
                if len(self._active) >= self.max_batch:
                    return None
                gen.row = len(self._active)
                self.lm.reset(gen.row)
            size = self.prefill_chunk if self._active else self.prefill_chunk_alone
            end = len(gen.prompt) if size is None else gen.prefilled + size
            return gen, gen.prompt[gen.prefilled:end]
        return None

    def _drop_prefill(self, gen: Generation, error: BaseException | None = None) -> None:
        """The head of the queue leaves it before joining the batch (cancelled, failed, or its
        session closed), giving back the row its prompt was going into."""
        self._pending.popleft()
        if gen.row >= 0:
            self.lm.reset(gen.row)
            gen.row = -1
        if error is not None:
            gen._finish("error", error)
        elif gen.cancelled:
            gen._finish("cancelled")

    def _too_costly(self, gens: list[Generation]) -> None:
        for g in gens:
            self.counts["fill_timeouts"] += 1
            g._finish("error", GrammarTooCostly("the request's grammar is too costly to constrain at this point "
                                                "(a mask took longer than the fill budget)"))

    @staticmethod
    def _going_on(gens: list[Generation]) -> list[bool]:
        """Which of `gens` go on with this step. A cancelled request goes (its caller may close
        its session at any await); one whose session was closed under it (by anyone else) fails
        alone, with a typed error, rather than decode unconstrained or fail the batch's fill."""
        out = []
        for g in gens:
            if g.done or g.cancelled:
                out.append(False)
            elif g.session is not None and g.session.closed:
                g._finish("error", GenerationError("the request's grammar session was closed while it decoded"))
                out.append(False)
            else:
                out.append(True)
        return out

    async def _step(self, loop: asyncio.AbstractEventLoop, chunk: tuple[Generation, list[int]] | None) -> None:
        """One forward: a token for each active request and, beside them, `chunk` (a prompt's
        next tokens); a prompt's last chunk also gives its request's first token, sampled with
        the others'. A forward that fails with a chunk in it fails that chunk's request only:
        the active rows are left as they were (serve.slots) and step again without it."""
        active = self._active
        b = len(active)
        tokens = [g.last for g in active]
        gen, ids = chunk if chunk is not None else (None, [])
        src = -1
        batch = active
        if gen is not None:
            src, gen.row = gen.row, b           # its row follows the active ones (some may have left)
            if gen.prefilled + len(ids) == len(gen.prompt):
                batch = [*active, gen]          # its first token comes with this step
        t0 = time.perf_counter()
        filled = threading.Event()
        timing = [0.0, 0.0]         # the forward's end, the mask application's seconds

        def forward() -> list[int] | Exception:
            # Masking and sampling run here, on the thread that ran the forward: torch's worker
            # threads still spin for a while after it, and on a small machine they would slow
            # any other thread that touches the logits.
            try:
                if src not in (-1, b):
                    self.lm.move(src, b)
                logits = self.lm.forward(tokens, b, ids).float()
            except Exception as e:      # noqa: BLE001 - whose failure it is is decided on the loop's thread
                return e
            timing[0] = time.perf_counter()
            if not batch:
                return []
            filled.wait()
            picked, timing[1] = self._mask_and_sample(batch, logits[:len(batch)])
            return picked

        pending = loop.run_in_executor(self._forward, forward)
        # a cancelled request's session may be closed by its caller at any await from here on
        sessions = [g.session if go else None for g, go in zip(batch, self._going_on(batch))]
        fill_end = t0
        try:
            if any(s is not None for s in sessions):
                try:
                    self.runtime.fill(sessions, self.bitmask)   # one C call, GIL released, beside the forward
                except xg2.FillTimeoutError as e:               # those requests fail; their rows are zeros
                    self._too_costly([batch[k] for k in e.rows])
                fill_end = time.perf_counter()
        finally:
            filled.set()
        try:
            picked = await pending
        except Exception as e:      # noqa: BLE001 - masking or sampling failed: the step's requests fail
            for g in active:
                g._finish("error", GenerationError(f"forward failed: {e}"))
            if gen is not None:
                self._drop_prefill(gen, GenerationError(f"forward failed: {e}"))
            return
        if isinstance(picked, Exception):       # the forward itself failed
            if gen is None:
                for g in active:
                    g._finish("error", GenerationError(f"forward failed: {picked}"))
                return
            if src != b:
                self.lm.reset(src)
            self._drop_prefill(gen, GenerationError(f"prefill failed: {picked}"))
            return
        if gen is not None:
            gen.prefilled += len(ids)
            self.counts["prefill_chunks"] += 1
            if batch is not active:     # its prompt is in: it joins the batch
                self._pending.popleft()
                self._active = batch
                self.counts["prefills"] += 1
        if not batch:
            return
        exposed = timing[1] + self._accept_and_emit(batch, picked) + max(0.0, fill_end - timing[0])
        if active:
            self.counts["steps"] += 1
            self.steps.append(((timing[0] - t0) * 1e3, (fill_end - t0) * 1e3, exposed * 1e3, len(batch)))

    def _mask_and_sample(self, gens: list[Generation], logits: torch.Tensor) -> tuple[list[int], float]:
        """The rows of constrained requests masked, then every row sampled (row k is gens[k]'s);
        also the seconds the masking took."""
        t0 = time.perf_counter()
        constrained = [k for k, g in enumerate(gens) if g.session is not None and not g.done]
        if constrained:
            xg2.apply_token_bitmask_inplace(logits, self.bitmask[:len(gens)], vocab_size=self.vocab_size,
                                            indices=constrained)
        mask_s = time.perf_counter() - t0
        return _sample(logits, gens), mask_s

    def _accept_and_emit(self, gens: list[Generation], picked: list[int]) -> float:
        """The sessions accept their tokens, the tokens go to their requests; returns the seconds
        the sessions took."""
        t1 = time.perf_counter()
        self._going_on(gens)       # a session closed meanwhile: that request fails, none emits
        todo = [(g, t) for g, t in zip(gens, picked)
                if g.session is not None and not (g.cancelled or g.done) and t not in self.stop_ids]
        if todo:
            try:
                ok = self.runtime.accept([g.session for g, _ in todo], [t for _, t in todo])
            except xg2.FillTimeoutError as e:      # those requests fail; the others' tokens are taken
                ok = e.accepted
                self._too_costly([todo[k][0] for k in e.rows])
                ok = [a or k in e.rows for k, a in enumerate(ok)]      # (not counted as refused)
            for (g, t), accepted in zip(todo, ok):
                if not accepted:        # cannot happen with the mask applied; never emit such a token
                    self.counts["refused_tokens"] += 1
                    g._finish("error", GenerationError(f"the grammar refused sampled token {t}"))
        mask_s = time.perf_counter() - t1
        for g, t in zip(gens, picked):
            if g.done:
                continue
            if g.cancelled:
                g._finish("cancelled")
            elif t in self.stop_ids or (g.session is not None and g.session.matcher._core.terminated):
                g._finish("stop")       # a stop token (the engine's, or one the grammar took as its end)
            else:
                g.last = t
                g._emit(t)
                self.counts["tokens"] += 1
                if g.completion_tokens >= g.params.max_tokens \
                        or len(g.prompt) + g.completion_tokens >= self.lm.max_len:
                    g._finish("length")
        return mask_s

    def _retire(self) -> None:
        """Give back the rows of finished or cancelled requests, keeping the active rows packed."""
        if not any(g.done or g.cancelled for g in self._active):
            return
        keep = []
        for g in self._active:
            if g.cancelled and not g.done:
                g._finish("cancelled")
            if not g.done:
                keep.append(g)
        for row, g in enumerate(keep):
            if g.row != row:
                self.lm.move(g.row, row)
                g.row = row
        self._active = keep

    def exposed_mask_ms(self) -> dict[str, float]:
        """Per-step figures over the recorded steps (medians)."""
        import statistics

        if not self.steps:
            return {}
        cols = list(zip(*self.steps))
        return {"steps": len(self.steps), "forward_ms": statistics.median(cols[0]),
                "fill_ms": statistics.median(cols[1]), "mask_exposed_ms": statistics.median(cols[2]),
                "batch": statistics.median(cols[3])}


def _sample(logits: torch.Tensor, gens: list[Generation]) -> list[int]:
    """The next token of each row: argmax for greedy rows, else temperature and nucleus sampling
    with the request's own generator (so a seed gives the same tokens however the batch looks)."""
    greedy = logits.argmax(dim=-1).tolist()
    out = []
    for k, g in enumerate(gens):
        p = g.params
        if p.temperature == 0 or g.generator is None:
            out.append(greedy[k])
            continue
        row = logits[k] / p.temperature
        probs = torch.softmax(row, dim=-1)
        if p.top_p < 1.0:
            sorted_p, order = probs.sort(descending=True)
            cum = sorted_p.cumsum(0)
            cut = int((cum < p.top_p).sum()) + 1          # the smallest prefix whose mass reaches top_p
            keep = order[:cut]
            probs = torch.zeros_like(probs).index_fill_(0, keep, 1.0) * probs
        if not torch.isfinite(probs).all() or float(probs.sum()) <= 0:
            out.append(greedy[k])       # every token masked but one, or numerically empty: the best one
            continue
        out.append(int(torch.multinomial(probs, 1, generator=g.generator)))
    return out
