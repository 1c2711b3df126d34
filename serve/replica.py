"""A model replica: the model, its tokenizer, the grammar runtime and the decoding loop in one
process, answering OpenAI requests (the HTTP layer in serve.app only moves bytes in and out).

A request is decoded and validated (serve.protocol), mapped onto a grammar spec (serve.grammars),
its prompt rendered with the model's chat format, its grammar session opened on the replica's
runtime (compiled once per content key, from the cache shards when another replica or process
built it), and its tokens generated with the other requests of the replica (serve.engine). The
session is closed when the request ends, whatever way it ends.

Tenants are told apart by the caller (the API key); each has a bound on the requests it has in
flight on a replica and, through the runtime, on its open sessions and running compiles.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from xg2 import ModelOutput, model_output_hold, read_model_output
from xg2.actors import GrammarRuntime
from xg2.actors.spec import SessionSpec, ToolsSpec
from xg2.errors import QuotaError, XG2Error
from xg2.grammar.model_output import model_output_think

from . import protocol as p
from .chat import openai_tool_calls
from .engine import (
    PREFILL_CHUNK,
    PREFILL_CHUNK_ALONE,
    Engine,
    GenerationError,
    GrammarTooCostly,
    SamplingParams,
)
from .grammars import chat_session_spec, compile_error_to_request_error, completion_session_spec
from .model import LoadedModel, load_model, tokenizer_info
from .responses import respond as respond_responses

_log = logging.getLogger("xg2.serve")


@dataclass
class ReplicaOptions:
    """A replica's settings (the `xg2 serve` flags and the Serve config's init args)."""

    model: str = "default"
    model_name: str | None = None           # the id /v1/models lists and responses carry
    tool_format: str | None = None          # the model's tool-call format (None: the model's; serve.model)
    max_batch: int = 8
    max_len: int = 4096
    # Prompts go in by chunks of this many tokens, each in a decode step of the running streams
    # (serve.engine; None: a whole prompt in one forward, which stops every stream for its length),
    # and by chunks of prefill_chunk_alone when nothing decodes.
    prefill_chunk: int | None = PREFILL_CHUNK
    prefill_chunk_alone: int | None = PREFILL_CHUNK_ALONE
    max_tokens_limit: int = 4096
    default_max_tokens: int = 512
    max_requests_per_tenant: int = 16       # in flight on this replica
    max_body_bytes: int = 4 << 20           # a request body past this is refused (413) before it is decoded
    max_tools: int = 128                    # tools in one request (OpenAI's own limit)
    max_sessions_per_tenant: int = 64
    max_compiles_per_tenant: int = 1        # of the runtime's 2 compile workers
    compile_timeout_s: float = 10.0
    # This process's grammar caches (the cache shards are the tier behind them): compiled grammars
    # by content key, and the compiler's own (modules, the entry pool, grammars by source).
    grammar_cache_mb: int = 64
    compiler_cache_mb: int = 128
    # Compile in child processes (xg2.actors.compile_workers): a tenant's compiles then never hold
    # the GIL the decode loop needs (on threads, a tenant compiling 64-tool sets took the others'
    # decode step from 3 ms to 89 ms at the median).
    compile_processes: bool = True
    # A tenant past this much recent compile CPU time (decayed seconds, half-life 10 s: about 0.07 s
    # of compiling per second sustained) gets 429 for new grammars until it decays; see
    # GrammarRuntime. The load tests' heaviest honest tenant reaches 0.45 s.
    max_compile_seconds_per_tenant: float | None = 1.0
    shards: list[str] = field(default_factory=list)
    shard_namespace: str | None = None


#: What the grammar of the request being answered in this task cost: where it came from
#: (Session.source), the time until its session was open, and for a grammar compiled for it what
#: its compile found where (modules and first-mask entries: local, from the shards, built). The
#: HTTP layer sends it back as the X-XG2-Grammar header: a client (a benchmark) sees per request
#: what the cache tiers saved it.
_GRAMMAR_INFO: contextvars.ContextVar[dict | None] = contextvars.ContextVar("xg2_grammar_info", default=None)


def grammar_info(reset: bool = False) -> dict | None:
    """The grammar info of the request this task answers (see _GRAMMAR_INFO); `reset` clears it
    before a request. (A function: Serve pickles the ingress app, and a ContextVar does not pickle.)"""
    if reset:
        _GRAMMAR_INFO.set(None)
        return None
    return _GRAMMAR_INFO.get()

#: Request bodies and prompts past this many bytes are rendered and tokenized on a thread.
_LARGE_PROMPT_BYTES = 32 << 10


class TextStream:
    """Generated tokens as text, piece by piece: a piece is released once it cannot change (no
    half-written UTF-8 character at its end) and cannot be the start of a stop string."""

    def __init__(self, tokenizer: Any, stops: list[str], markers: tuple[str, ...] = ()):
        self.tokenizer = tokenizer
        self.stops = [s for s in stops if s]
        # held back: what may be the start of a stop string, or of a marker the caller looks for
        self.hold = max((len(s) for s in (*self.stops, *markers)), default=1) - 1
        self.tokens: list[int] = []
        self.text = ""
        self.sent = 0
        self.stopped = False

    def add(self, token: int) -> str:
        """The text that can be released after `token` ('' if none); sets `stopped` when a stop
        string appeared (the text is cut before it)."""
        self.tokens.append(token)
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=False)
        if text.endswith("\ufffd"):
            return ""
        self.text = text
        for s in self.stops:
            at = text.find(s, max(0, self.sent - len(s)))
            if at >= 0:
                self.text = text[:at]
                self.stopped = True
                return self.flush()
        end = len(text) - self.hold
        if end <= self.sent:
            return ""
        piece, self.sent = text[self.sent:end], end
        return piece

    def flush(self) -> str:
        piece, self.sent = self.text[self.sent:], len(self.text)
        return piece


class Replica:
    """See the module note. One per process; its methods run on one event loop."""

    def __init__(self, options: ReplicaOptions | None = None, *, loaded: LoadedModel | None = None):
        self.options = o = options or ReplicaOptions()
        self.loaded = loaded or load_model(o.model, tool_format=o.tool_format)
        self.model_name = o.model_name or self.loaded.name
        tier = None
        if o.shards:
            from xg2.actors.router import ShardRouter
            from xg2.actors.tier import ShardedCache

            # the shards' application (serve/shards.py) creates and owns them; a replica only finds them
            router = ShardRouter(o.shards, namespace=o.shard_namespace, create=False)
            for i in range(len(o.shards)):
                try:
                    router._handle(i)       # looked up now, not on the first request
                except ValueError:
                    _log.warning("cache shard %s not found yet: its keys miss until it is", o.shards[i])
            tier = ShardedCache(router)
        self.runtime = GrammarRuntime(tokenizer_info(self.loaded), cache_tier=tier,
                                      max_sessions_per_tenant=o.max_sessions_per_tenant,
                                      max_compiles_per_tenant=o.max_compiles_per_tenant,
                                      compile_timeout_s=o.compile_timeout_s,
                                      grammar_cache_bytes=o.grammar_cache_mb << 20,
                                      cache_limit_bytes=o.compiler_cache_mb << 20,
                                      compile_processes=o.compile_processes,
                                      max_compile_seconds_per_tenant=o.max_compile_seconds_per_tenant)
        if self.runtime.compile_workers is not None:
            self.runtime.compile_workers.wait_ready()       # before the first request, not on it
        # no token is longer than this: a prompt of more bytes than max_len of them is too long untokenized
        added = getattr(self.loaded.tokenizer, "get_added_vocab", dict)()      # special tokens' text
        self._max_token_bytes = max(1, max(map(len, tokenizer_info(self.loaded).decoded_vocab)),
                                    max((len(t.encode()) for t in added), default=0))
        self.engine = Engine(self.loaded.model, self.loaded.eos_token_ids, runtime=self.runtime,
                             max_batch=o.max_batch, max_len=o.max_len, vocab_size=self.loaded.vocab_size,
                             prefill_chunk=o.prefill_chunk, prefill_chunk_alone=o.prefill_chunk_alone)
        # known tool sets are linked on the runtime's thread only while nothing decodes (see
        # GrammarRuntime.links_here_when); else in the compile workers, like the rest
        self.runtime.links_here_when = self.engine.idle
        self._in_flight: dict[str, int] = {}
        self.counts = {"requests": 0, "constrained": 0, "failed": 0, "rejected": 0}
        self.recent: list[dict] = []            # the last requests' timings (ttft, compile), bounded
        self.finished = 0

    # -- requests --------------------------------------------------------------------------------
    def models(self) -> bytes:
        return p.encode(p.ModelList(data=[p.ModelCard(id=self.model_name)]))

    async def chat(self, tenant: str, body: bytes) -> bytes | AsyncIterator[bytes]:
        """A `/v1/chat/completions` body: the response's JSON, or its server-sent events. Raises
        RequestError (400, 429, ...) before any event is sent."""
        self._check_size(body)
        req = p.decode_chat_request(body, max_tokens_limit=self.options.max_tokens_limit)
        if req.tools and len(req.tools) > self.options.max_tools:
            raise p.RequestError(f"{len(req.tools)} tools; at most {self.options.max_tools} in one request", "/tools",
                                 code="invalid_value")
        fmt = self.loaded.tool_format
        try:
            spec = chat_session_spec(req, tool_format=fmt)
            render = functools.partial(self.loaded.chat_format.render, req.message_dicts(), req.tool_dicts() or None)
            # a large template (many tools) renders off the event loop: the other requests' tokens keep flowing
            prompt_text = await asyncio.to_thread(render) if len(body) > _LARGE_PROMPT_BYTES else render()
        except ValueError as e:
            raise p.RequestError(str(e), "/messages") from None
        tools = spec if isinstance(spec, ToolsSpec) else None       # the output is read in the tool format
        run = await self._start(tenant, req, spec, prompt_text, req.effective_max_tokens,
                                lambda exc: compile_error_to_request_error(exc, req, tool_format=fmt),
                                markers=_held_markers(tools))
        if req.stream:
            return _Events(run, self._chat_events(run, req, tools))
        async with run:
            text = await run.text()
        out = read_model_output(fmt, text, tools.tools, tools.reasoning) if tools else ModelOutput(content=text)
        calls = openai_tool_calls(out.calls)
        message = p.ChatMessage(content=out.content if out.content else (None if calls else ""))
        if out.reasoning:
            message.reasoning_content = out.reasoning
        if calls:
            message.tool_calls = [p.ResponseToolCall(id=c["id"], function=p.ResponseFunctionCall(
                name=c["function"]["name"], arguments=c["function"]["arguments"])) for c in calls]
        return p.encode(p.ChatCompletion(model=self.model_name, choices=[
            p.ChatChoice(message=message, finish_reason=_finish(out, calls, run.finish_reason))], usage=run.usage()))

    async def responses(self, tenant: str, body: bytes) -> bytes | AsyncIterator[bytes]:
        """A `/v1/responses` body (OpenAI's Responses API): translated onto `chat` (serve/responses.py),
        so that it is served with everything a chat request is served with. JSON or server-sent events."""
        return await respond_responses(self.chat, tenant, body, model_name=self.model_name,
                                       max_tokens_limit=self.options.max_tokens_limit,
                                       max_body_bytes=self.options.max_body_bytes)

    async def completions(self, tenant: str, body: bytes) -> bytes | AsyncIterator[bytes]:
        """A `/v1/completions` body (with the grammar extensions): JSON or server-sent events."""
        self._check_size(body)
        req = p.decode_completion_request(body, max_tokens_limit=self.options.max_tokens_limit)
        spec = completion_session_spec(req)
        run = await self._start(tenant, req, spec, req.prompt_text, req.effective_max_tokens,
                                lambda exc: compile_error_to_request_error(exc, req))
        if req.stream:
            return _Events(run, self._completion_events(run, req))
        async with run:
            text = await run.text()
        return p.encode(p.Completion(model=self.model_name, choices=[
            p.CompletionChoice(text=text, finish_reason=run.finish_reason)], usage=run.usage()))

    def _check_size(self, body: bytes) -> None:
        if len(body) > self.options.max_body_bytes:
            raise p.RequestError(f"the request body is {len(body)} bytes; at most {self.options.max_body_bytes}",
                                 status=413, code="request_too_large")

    def _admit(self, tenant: str) -> None:
        """429 when the tenant has its bound of requests in flight on this replica."""
        held = self._in_flight.get(tenant, 0)
        if held >= self.options.max_requests_per_tenant:
            self.counts["rejected"] += 1
            raise p.RequestError(f"too many requests in flight for this API key ({held}); retry later",
                                 status=429, code="rate_limit_exceeded", type="rate_limit_error")

    async def _start(self, tenant: str, req: Any, spec: Any, prompt_text: str, max_tokens: int | None,
                     compile_error: Any, markers: tuple[str, ...] = ()) -> _Run:
        """Admission (the tenant's bound), the prompt's tokens, the grammar session, the submit."""
        self._admit(tenant)
        n_bytes = len(prompt_text.encode("utf-8", "surrogatepass"))
        if -(-n_bytes // self._max_token_bytes) >= self.engine.lm.max_len:    # past the limit whatever the split
            raise p.RequestError(f"the prompt has at least {-(-n_bytes // self._max_token_bytes)} tokens; this model "
                                 f"takes at most {self.engine.lm.max_len - 1}", "/messages",
                                 code="context_length_exceeded")
        encode = functools.partial(self.loaded.tokenizer.encode, prompt_text, add_special_tokens=False)
        if n_bytes > _LARGE_PROMPT_BYTES:
            prompt = await asyncio.to_thread(encode)
            self._admit(tenant)         # others of the tenant's may have started meanwhile
        else:
            prompt = encode()
        if len(prompt) >= self.engine.lm.max_len:
            raise p.RequestError(f"the prompt has {len(prompt)} tokens; this model takes at most "
                                 f"{self.engine.lm.max_len - 1}", "/messages", code="context_length_exceeded")
        limit = self.engine.lm.max_len - len(prompt)
        params = SamplingParams(
            max_tokens=min(max_tokens or self.options.default_max_tokens, limit),
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p, seed=req.seed)
        self._in_flight[tenant] = self._in_flight.get(tenant, 0) + 1
        self.counts["requests"] += 1
        t0 = time.perf_counter()
        session = None
        try:
            tier = "none"
            if spec is not None:
                self.counts["constrained"] += 1
                session = await self.runtime.open(SessionSpec(grammar=spec, tenant=tenant))
                tier = session.source
            compile_s = time.perf_counter() - t0
            if session is not None:
                reuse = session.matcher.compiled_grammar._reuse if tier == "compiled" else None
                _GRAMMAR_INFO.set({"from": tier, "ready_ms": round(compile_s * 1e3, 3), **(reuse or {})})
            gen = self.engine.submit(prompt, params, session)
        except BaseException as e:
            self._done(tenant, session)
            if isinstance(e, QuotaError):
                raise p.RequestError(str(e), status=429, code="rate_limit_exceeded",
                                     type="rate_limit_error") from None
            if isinstance(e, XG2Error):
                raise compile_error(e) from None
            if isinstance(e, GenerationError):
                raise p.RequestError(str(e), status=503, code="unavailable", type="server_error") from None
            raise
        run = _Run(self, tenant, session, gen, prompt, req.stop_sequences, t0, compile_s, markers)
        run.tier = tier
        return run

    def _done(self, tenant: str, session: Any) -> None:
        n = self._in_flight.get(tenant, 1) - 1
        if n > 0:
            self._in_flight[tenant] = n
        else:
            self._in_flight.pop(tenant, None)
        if session is not None:
            self.runtime.close(session)

    async def _chat_events(self, run: _Run, req: Any, tools: ToolsSpec | None) -> AsyncIterator[bytes]:
        cid, created = p.new_chat_id(), p.now()
        usage_field = None if req.include_usage else p.UNSET

        def chunk(delta: p.Delta, finish: str | None = None) -> bytes:
            return p.sse_event(p.ChatCompletionChunk(id=cid, created=created, model=self.model_name,
                                                     choices=[p.ChunkChoice(delta=delta, finish_reason=finish)],
                                                     usage=usage_field))

        async with run:
            yield chunk(p.Delta(role="assistant", content=""))
            if tools is None:
                async for piece in run.pieces():
                    if piece:
                        yield chunk(p.Delta(content=piece))
                finish = run.finish_reason
            else:
                split = _StreamSplit(self.loaded.tool_format, tools)
                async for _piece in run.pieces():
                    for delta in split.step(run.stream.text, run.stream.sent):
                        yield chunk(delta)
                out = read_model_output(self.loaded.tool_format, run.stream.text, tools.tools, tools.reasoning)
                for delta in split.end(out):
                    yield chunk(delta)
                calls = openai_tool_calls(out.calls)
                for i, c in enumerate(calls):
                    yield chunk(p.Delta(tool_calls=[p.DeltaToolCall(
                        index=i, id=c["id"], type="function", function=p.DeltaFunctionCall(
                            name=c["function"]["name"], arguments=c["function"]["arguments"]))]))
                finish = _finish(out, calls, run.finish_reason)
            yield chunk(p.Delta(), finish)
            if req.include_usage:
                yield p.sse_event(p.ChatCompletionChunk(id=cid, created=created, model=self.model_name,
                                                        choices=[], usage=run.usage()))
            yield p.SSE_DONE

    async def _completion_events(self, run: _Run, req: Any) -> AsyncIterator[bytes]:
        cid, created = p.new_completion_id(), p.now()
        usage_field = None if req.include_usage else p.UNSET

        def chunk(text: str, finish: str | None = None) -> bytes:
            return p.sse_event(p.CompletionChunk(id=cid, created=created, model=self.model_name, choices=[
                p.CompletionChoice(text=text, finish_reason=finish)], usage=usage_field))

        async with run:
            async for piece in run.pieces():
                if piece:
                    yield chunk(piece)
            yield chunk("", run.finish_reason)
            if req.include_usage:
                yield p.sse_event(p.CompletionChunk(id=cid, created=created, model=self.model_name, choices=[],
                                                    usage=run.usage()))
            yield p.SSE_DONE

    # -- state -------------------------------------------------------------------------------------
    def stats(self) -> dict:
        rt = self.runtime
        out = {"requests": dict(self.counts), "engine": dict(self.engine.counts),
               "steps": self.engine.exposed_mask_ms(), "runtime": dict(rt.stats),
               "cache_bytes": rt.cache_bytes(), "open_sessions": rt.open_sessions(),
               # what requests hold now: all three return to 0 when the replica is idle
               "requests_in_flight": sum(self._in_flight.values()),
               "engine_rows": len(self.engine._active) + len(self.engine._pending),
               "compiler": rt.compiler.cache_stats(), "compile_usage": rt.compile_usage(), "reuse": rt.reuse(),
               "recent": list(self.recent[-64:])}
        if rt.cache_tier is not None:
            out["tier"] = rt.cache_tier.stats()
        return out

    async def close(self) -> None:
        await self.engine.close()
        await asyncio.to_thread(self.runtime.shutdown)


def _finish(out: ModelOutput, calls: list, reason: str) -> str:
    """OpenAI's finish reason: for an output cut inside a call (or its reasoning), whose markup is
    then in neither the content nor the calls, what cut it (`length`, or a stop string's `stop`),
    never `tool_calls`; `tool_calls` when it called."""
    if out.cut:
        return reason
    return "tool_calls" if calls else reason


def _held_markers(tools: ToolsSpec | None) -> tuple[str, ...]:
    """What the text stream must not release half of: the strings from which the tool format's
    text is held back, and the end of its reasoning."""
    if tools is None:
        return ()
    think = model_output_think(tools.model) if tools.reasoning != "disabled" else None
    return tuple(m for m in (*model_output_hold(tools.model), *(think[1:] if think else ())) if m)


class _StreamSplit:
    """A tool-format output streamed as it is read whole at its end: the reasoning (sent once its
    closing tag is out), then text up to where a call may begin, held from there; `end` sends
    what the whole output's reading adds to what was sent."""

    def __init__(self, model: str, tools: ToolsSpec):
        self.hold = model_output_hold(model)
        think = model_output_think(model) if tools.reasoning != "disabled" else None
        self.think_end = think[1] if think else None
        self.model, self.tools = model, tools
        self.start: int | None = 0 if self.think_end is None else None      # where the text begins
        self.sent = ""              # the text sent
        self.reasoning_sent = False

    def step(self, text: str, released: int) -> list[p.Delta]:
        out: list[p.Delta] = []
        if self.start is None:
            at = text.find(self.think_end)
            if at < 0 or at + len(self.think_end) > released:
                return out
            self.start = at + len(self.think_end)
            thought = read_model_output(self.model, text[:self.start], self.tools.tools, self.tools.reasoning).reasoning
            if thought:
                out.append(p.Delta(reasoning_content=thought))
                self.reasoning_sent = True
        if "" in self.hold:
            return out          # the format's text lies inside its own markup: read whole at the end
        end = released
        for marker in self.hold:
            at = text.find(marker, self.start)
            if at >= 0:
                end = min(end, at)
        if not self.sent:       # the text's leading white space is not its own (the reader drops it)
            self.start = end - len(text[self.start:end].lstrip())
        # white space waits for what follows it: before a call it is dropped too
        end = self.start + len(text[self.start:end].rstrip())
        piece = text[self.start + len(self.sent):end]
        if piece:
            self.sent += piece
            out.append(p.Delta(content=piece))
        return out

    def end(self, out: ModelOutput) -> list[p.Delta]:
        deltas = []
        if out.reasoning and not self.reasoning_sent:
            deltas.append(p.Delta(reasoning_content=out.reasoning))
        content = out.content or ""
        if content.startswith(self.sent) and len(content) > len(self.sent):
            deltas.append(p.Delta(content=content[len(self.sent):]))
        return deltas


class _Events:
    """A streamed answer's server-sent events. The body (an async generator) ends its request when
    it ends; but a client that goes before the first event is asked for (Serve's handle call
    cancelled, the response dropped unstarted) would never run it, and the request would decode on
    and hold its tenant's slot: closed or dropped unstarted, these end it themselves."""

    __slots__ = ("_body", "_run", "_started")

    def __init__(self, run: _Run, body: AsyncIterator[bytes]):
        self._run, self._body, self._started = run, body, False

    def __aiter__(self) -> _Events:
        return self

    async def __anext__(self) -> bytes:
        self._started = True
        return await self._body.__anext__()

    async def aclose(self) -> None:
        if not self._started:
            self._started = True
            self._run.release(failed=True)
        await self._body.aclose()

    def __del__(self) -> None:
        if not self._started:
            self._run.release(failed=True)


class _Run:
    """One request on the replica: its generation, its text, and its end (session closed,
    the tenant's slot given back, its timings kept)."""

    def __init__(self, replica: Replica, tenant: str, session: Any, gen: Any, prompt: list[int],
                 stops: list[str], t0: float, compile_s: float, markers: tuple[str, ...] = ()):
        self.replica, self.tenant, self.session, self.gen = replica, tenant, session, gen
        self.prompt = prompt
        self.stream = TextStream(replica.loaded.tokenizer, stops, markers)
        self.t0 = t0
        self.compile_s = compile_s
        self.finish_reason = "stop"
        self.tier = "none"
        self.completed = False      # the whole answer was produced (a client gone after it is no failure)
        self._released = False

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release(exc[0] is not None)

    def release(self, failed: bool) -> None:
        """End the request, once (whichever comes first: its body's end, or its events dropped
        before their first was asked for): generation stopped, session closed, slot given back."""
        if self._released:
            return
        self._released = True
        self.gen.cancel()
        r = self.replica
        r._done(self.tenant, self.session)
        if failed and not self.completed:
            r.counts["failed"] += 1
        r.finished += 1
        r.recent.append({"tenant": self.tenant, "grammar_from": self.tier, "prompt_tokens": len(self.prompt),
                         "completion_tokens": self.gen.completion_tokens, "compile_ms": self.compile_s * 1e3,
                         "ttft_ms": None if self.gen.first_token_s is None else self.gen.first_token_s * 1e3,
                         "total_ms": (time.perf_counter() - self.t0) * 1e3, "finish": self.finish_reason})
        del r.recent[:-256]

    async def pieces(self) -> AsyncIterator[str]:
        try:
            async for token in self.gen:
                piece = self.stream.add(token)
                if self.stream.stopped:
                    self.gen.cancel()
                    self.finish_reason = "stop"
                    self.completed = True
                    if piece:
                        yield piece
                    return
                if piece:
                    yield piece
        except GrammarTooCostly as e:
            raise p.RequestError(str(e), status=400, code="grammar_too_costly",
                                 type="invalid_request_error") from None
        except GenerationError as e:
            raise p.RequestError(str(e), status=503, code="unavailable", type="server_error") from None
        piece = self.stream.flush()
        self.finish_reason = "length" if self.gen.finish_reason == "length" else "stop"
        self.completed = True
        if piece:
            yield piece

    async def text(self) -> str:
        async for _ in self.pieces():
            pass
        return self.stream.text

    def usage(self) -> p.Usage:
        return p.Usage.of(len(self.prompt), self.gen.completion_tokens)
