"""The Ray Serve application: model replicas that answer the OpenAI API over HTTP, and the mask
service for engines that keep their own model.

- `ModelServer` (deployment "xg2-model"): a Replica (model + runtime + decoding loop) behind a
  FastAPI ingress, so the model, its matchers and the HTTP handling share a process. By default
  requests reach it through a thin ingress deployment (serve/ingress.py) whose handle routes each
  one to the replica that holds its grammar or most of its tools (serve/routing.py); with
  `router="default"` Serve's proxy sends HTTP straight to the replicas, with Serve's own routing.
  Every replica's runtime uses the same cache shards (named Ray actors), so a grammar one replica
  compiled is read by the others.
- `MaskService` (deployment "xg2-masks", two replicas by default): each replica starts a MaskHost
  actor (serve/masks.py: a MatcherHost, xg2.actors.host) that holds its sessions, and gives its
  handle to a client once (`host`); StepClient then calls it directly, one Ray call per decode
  step for a whole batch. The same calls go through the handle too: `open(tenant, spec,
  first_mask)`, `step_packed(tenant, request)`, `step_rows`, `close`, `fork`, `rollback`, routed by
  the replica id every session id starts with (serve.masks.SessionRouter). A replica that stops
  loses only its own sessions: calls naming them raise SessionLostError.

Tenants are told apart by their API key (`Authorization: Bearer ...`, see serve/keys.py): with
`api_keys` (a KeyRing, or key -> tenant) only those keys are let in; without ("open tenants"), any
key is its own tenant (named by a digest of it, never by the key itself).
"""


import json
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import ray
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response, StreamingResponse
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from xg2.errors import SessionLostError, UsageError, XG2Error

from . import protocol as p
from . import responses
from .keys import Caller, KeyRing
from .keys import caller_of as keys_caller_of
from .model import model_tool_format
from .replica import Replica, ReplicaOptions, grammar_info
from .routing import REPLICA_HEADER

_log = logging.getLogger("xg2.serve")
#: The gauges (cache bytes, step medians over the last steps) are read at most this often: their
#: cost grows with the caches and the step record, and every request ends with an update.
GAUGE_PERIOD_S = 1.0

api = FastAPI(title="xg2", docs_url=None, redoc_url=None)

# ------------------------------------------------------------------------------------------------
# The OpenAPI document (GET /openapi.json, here and through the ingress): the handlers read their
# bodies themselves (serve.protocol's msgspec decoders, whose refusals point at the field at
# fault), so the bodies are described here, as JSON Schemas generated from the same msgspec types,
# with the bounds the validators add (serve.protocol.validate_*) written into them.
# ------------------------------------------------------------------------------------------------

_REF = "#/components/schemas/{name}"
_JSON = "application/json"
_SSE = "text/event-stream"


def _ref(name: str) -> dict:
    return {"$ref": _REF.format(name=name)}


def _bound(schema: dict, kind: str, **bounds: Any) -> None:
    """Adds `bounds` to the `kind` branch of a property's schema (msgspec writes `T | None` as
    anyOf [T, null])."""
    for branch in schema.get("anyOf", [schema]):
        if branch.get("type") == kind:
            branch.update(bounds)


def _schema_components() -> dict[str, Any]:
    """The request, response and error types as JSON Schemas (OpenAPI 3.1's dialect), keyed by name."""
    _, components = msgspec.json.schema_components(
        [p.ChatCompletionRequest, p.CompletionRequest, p.ChatCompletion, p.ChatCompletionChunk, p.Completion,
         p.CompletionChunk, p.ModelList, p.ErrorResponse, responses.ResponseCreateRequest, responses.Response],
        ref_template=_REF)
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        props = components[name]["properties"]
        _bound(props["temperature"], "number", minimum=0, maximum=2)
        _bound(props["top_p"], "number", exclusiveMinimum=0, maximum=1)
        _bound(props["n"], "integer", minimum=1, maximum=1)
        _bound(props["seed"], "integer", minimum=-(1 << 63), maximum=(1 << 63) - 1)
        props["guided_whitespace_pattern"] = {"type": "null", "default": None,
                                              "description": "not supported: refused when given"}
        for field in ("max_tokens", "max_completion_tokens"):
            if field in props:
                _bound(props[field], "integer", minimum=1)
                props[field]["description"] = "at most the server's limit (max_tokens_limit)"
    components["StructuredOutputs"]["properties"]["whitespace_pattern"] = {
        "type": "null", "default": None, "description": "not supported: refused when given"}
    chat = components["ChatCompletionRequest"]["properties"]
    chat["messages"]["minItems"] = 1
    components["FunctionDefinition"]["properties"]["name"]["pattern"] = p.TOOL_NAME_RE.pattern.replace(r"\Z", "$")
    completion = components["CompletionRequest"]["properties"]
    text = {"type": "string", "minLength": 1}
    completion["prompt"] = {"anyOf": [text, {"type": "array", "items": text, "minItems": 1, "maxItems": 1}],
                            "description": "one prompt, not empty: a string, or a list of exactly one string "
                            "(token ids are refused)"}
    completion["echo"]["anyOf"][0]["enum"] = [False]        # echo and suffix are refused
    _bound(completion["suffix"], "string", maxLength=0)
    _bound(completion["best_of"], "integer", minimum=1, maximum=1)
    _responses_bounds(components)
    components["ErrorDetail"]["required"] = ["message", "type", "param", "code"]     # always written
    components["Health"] = {"type": "object", "properties": {"status": {"const": "ok"}}, "required": ["status"]}
    components["Stats"] = {
        "type": "object", "description": "The replica's figures; a tenant's key reads only its own "
        "(tenant, requests in flight, open sessions, compile usage, recent requests), an admin key all.",
        "additionalProperties": True}
    return components


def _responses_bounds(components: dict[str, Any]) -> None:
    """The bounds serve.responses's validation adds, and the fields it refuses, in the document."""
    props = components["ResponseCreateRequest"]["properties"]
    _bound(props["temperature"], "number", minimum=0, maximum=2)
    _bound(props["top_p"], "number", exclusiveMinimum=0, maximum=1)
    _bound(props["seed"], "integer", minimum=-(1 << 63), maximum=(1 << 63) - 1)
    props["seed"]["description"] = "xg2's extension (OpenAI's Responses API has no seed): reproducible sampling"
    _bound(props["max_output_tokens"], "integer", minimum=1)
    props["max_output_tokens"]["description"] = "at most the server's limit (max_tokens_limit)"
    _bound(props["max_tool_calls"], "integer", minimum=0)
    _bound(props["top_logprobs"], "integer", minimum=0, maximum=0)
    _bound(props["metadata"], "object", maxProperties=16, propertyNames={"maxLength": 64},
           additionalProperties={"type": "string", "maxLength": 512})
    props["background"]["anyOf"][0]["enum"] = [False]
    props["truncation"]["anyOf"][0]["enum"] = ["disabled"]
    _bound(props["include"], "array", items={"enum": sorted(responses.MOOT_INCLUDES)})
    for field in ("previous_response_id", "conversation", "prompt", "context_management", "moderation"):
        props[field] = {"type": "null", "default": None, "description": "not supported (nothing is stored, or "
                        "the server does not do it): refused when given"}
    reasoning = components["ReasoningConfig"]["properties"]
    reasoning["effort"] = {"enum": ["none", None], "default": None, "description": "the model does not reason"}
    reasoning["summary"] = {"type": "null", "default": None}
    name = {"pattern": p.TOOL_NAME_RE.pattern.replace(r"\Z", "$")}
    components["ResponsesFunctionTool"]["properties"]["name"].update(name)
    components["TextFormatJSONSchema"]["properties"]["name"].update(name)


def _error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    what = {400: "a malformed or refused request (`param`: the JSON pointer of the field at fault)",
            401: "no API key, or an unknown one", 404: "no such route", 405: "a method the route does not take",
            413: "a body larger than the server's bound", 429: "too many requests or sessions for this key",
            500: "an internal error", 503: "the model replicas are unavailable; retry later"}
    return {status: {"description": what[status], "content": {_JSON: {"schema": _ref("ErrorResponse")}}}
            for status in statuses}


def _answer(name: str, chunk: str) -> dict[int | str, dict[str, Any]]:
    """A generation route's answers: the whole answer, or server-sent events of chunks (`stream`)."""
    return {200: {"description": f"the answer ({name}), or with `stream` server-sent events, each a {chunk} "
                  "(an error after the first event is an ErrorResponse event), then `data: [DONE]`",
                  "content": {_JSON: {"schema": _ref(name)}, _SSE: {"schema": {"type": "string"}}}},
            **_error_responses(400, 401, 413, 429, 500, 503)}


def _responses_answer() -> dict[int | str, dict[str, Any]]:
    """The Responses route's answers: its events are named (`event:` lines) and end with
    `response.completed`, `.incomplete` or `.failed`, without `data: [DONE]`."""
    return {200: {"description": "the answer (Response), or with `stream` server-sent events as OpenAI sends "
                  "them (response.created, response.output_text.delta, ..., then response.completed, "
                  "response.incomplete, or an error event and response.failed)",
                  "content": {_JSON: {"schema": _ref("Response")}, _SSE: {"schema": {"type": "string"}}}},
            **_error_responses(400, 401, 413, 429, 500, 503)}


def _body(name: str) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {_JSON: {"schema": _ref(name)}}},
            "security": [{"bearer": []}]}


def openapi_document() -> dict[str, Any]:
    """The application's OpenAPI document (every route's body and answers); built once."""
    if api.openapi_schema is None:
        doc = get_openapi(title=api.title, version=api.version, routes=api.routes,
                          description="xg2: the OpenAI API with structured generation. Every refusal is an "
                          "OpenAI error object (ErrorResponse).")
        components = doc.setdefault("components", {})
        components.setdefault("schemas", {}).update(_schema_components())
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer",
                                                    "description": "the API key (`Authorization: Bearer KEY`)"}}
        api.openapi_schema = doc
    return api.openapi_schema


api.openapi = openapi_document      # type: ignore[method-assign]


# Every refusal is an OpenAI error object, the framework's own (no such route, a method the route
# does not take) included, with the wording the ingress uses.
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}


@api.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    status = exc.status_code
    if status == 404:
        message = f"no such route: {request.url.path}"
    elif status == 405:
        message = f"{request.method} is not allowed on {request.url.path}"
    else:
        message = str(exc.detail)
    response = _error(p.RequestError(message, status=status, code=_HTTP_CODES.get(status)))
    response.headers.update(exc.headers or {})      # a 405's Allow among them
    return response


@api.exception_handler(RequestValidationError)
async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
    first = (exc.errors() or [{}])[0]
    where = "".join(f"/{part}" for part in first.get("loc", ())[1:])
    return _error(p.RequestError(str(first.get("msg", "invalid request")), where or None, code="invalid_value"))


def caller_of(authorization: str, keys: KeyRing | None) -> Caller:
    """Who a request's `Authorization` header speaks for; RequestError 401 without a (known) key."""
    try:
        return keys_caller_of(authorization, keys)
    except LookupError as e:
        raise p.RequestError(str(e), status=401, code="invalid_api_key") from None


def _key_ring(api_keys: KeyRing | dict[str, str] | None, open_tenants: bool = False) -> KeyRing | None:
    """The ring `api_keys` stand for (None: open tenants alone)."""
    if api_keys is None:
        return None
    ring = api_keys if isinstance(api_keys, KeyRing) else KeyRing.from_mapping(api_keys)
    return ring.with_open_tenants() if open_tenants and not ring.open_tenants else ring


def stats_view(stats: dict, caller: Caller, open_tenants: bool, in_flight: int, sessions: int) -> dict:
    """What `caller` may read of a replica's figures: an admin, all of them; a tenant, its own (its
    recent requests, requests in flight, sessions, compile usage), and with open tenants (no key
    list: nothing to protect between callers but their names) the replica's own figures too, with
    no other tenant's name or figures in them."""
    if caller.admin:
        return stats
    own = {"tenant": caller.tenant, "requests_in_flight": in_flight, "open_sessions": sessions,
           "compile_usage": {k: v for k, v in stats.get("compile_usage", {}).items() if k == caller.tenant},
           "recent": [r for r in stats.get("recent", []) if r.get("tenant") == caller.tenant]}
    if not open_tenants:
        return {"replica": stats.get("replica"), **own}
    return {**stats, **own}


def _error(e: p.RequestError) -> Response:
    return Response(p.encode(e.to_response()), status_code=e.status, media_type="application/json")


def _internal_error(e: BaseException) -> p.RequestError:
    """A failure no request should cause, as OpenAI's error object (500, `server_error`)."""
    return p.RequestError(f"internal error: {type(e).__name__}", status=500, code="server_error")


async def _events(stream: Any) -> Any:
    """Server-sent events; an error after the first event becomes an error event, then the end."""
    try:
        async for event in stream:
            yield event
    except p.RequestError as e:
        yield p.sse_event(e.to_response())
        yield p.SSE_DONE
    except Exception as e:      # noqa: BLE001 - the client gets an error event, not a cut stream
        _log.exception("stream failed")
        yield p.sse_event(p.ErrorResponse(p.ErrorDetail(message=f"internal error: {type(e).__name__}",
                                                        type="server_error")))
        yield p.SSE_DONE


class _Metrics:
    """The replica's figures as Ray metrics (Prometheus through Ray's metrics agent): compile and
    fill time, cache hits per tier (grammars, modules, first-mask entries: local or from the
    shards), compile CPU, open sessions, cache bytes."""

    def __init__(self, replica: Replica):
        from ray.util import metrics

        self.replica = replica
        self.counters = {name: metrics.Counter(f"xg2_{name}", description=desc) for name, desc in (
            ("requests", "requests answered"), ("constrained_requests", "requests with a grammar"),
            ("compiles", "grammars compiled on this replica"),
            ("grammar_hits_local", "grammars found in the replica's own cache"),
            ("grammar_hits_shards", "grammars read from the cache shards"),
            ("steps", "decode steps"),
            ("modules_local", "tool/branch modules found in a compiler's own cache"),
            ("modules_shards", "tool/branch modules read from the cache shards"),
            ("modules_lowered", "tool/branch modules lowered"),
            ("entries_needed", "mask entries the first masks of new grammars needed"),
            ("entries_local", "first-mask entries found in the process's entry pool"),
            ("entries_shards", "first-mask entries read from the cache shards"),
            ("compile_cpu_ms", "compile CPU time, in this process and its compile workers (ms)"))}
        self.gauges = {name: metrics.Gauge(f"xg2_{name}", description=desc) for name, desc in (
            ("open_sessions", "grammar sessions open"), ("cache_bytes", "bytes in the replica's caches"),
            ("step_forward_ms", "median forward time per step"), ("step_fill_ms", "median mask fill per step"),
            ("step_mask_exposed_ms", "median mask time not hidden by the forward, per step"))}
        self.compile_ms = metrics.Histogram(
            "xg2_grammar_ready_ms", description="time from a request's arrival to its grammar session, by "
            "where the grammar came from (local, joined: a compile in flight, shards, compiled)",
            boundaries=[0.1, 1, 5, 10, 25, 50, 100, 250, 1000, 5000], tag_keys=("tier",))
        self._last: dict[str, float] = {}
        self._seen_recent = 0
        self._gauges_at = -GAUGE_PERIOD_S

    def update(self) -> None:
        try:
            r = self.replica
            rt = r.runtime.stats
            values = {"requests": r.counts["requests"], "constrained_requests": r.counts["constrained"],
                      "compiles": rt["compiles"] - rt["tier_grammar_hits"], "grammar_hits_local": rt["grammar_hits"],
                      "grammar_hits_shards": rt["tier_grammar_hits"], "steps": r.engine.counts["steps"]}
            reuse = r.runtime.reuse()
            values.update({k: reuse[k] for k in ("modules_local", "modules_shards", "modules_lowered",
                                                 "entries_needed", "entries_local", "entries_shards",
                                                 "compile_cpu_ms")})
            for name, value in values.items():
                delta = value - self._last.get(name, 0)
                if delta > 0:
                    self.counters[name].inc(delta)
                self._last[name] = value
            new = min(len(r.recent), r.finished - self._seen_recent)
            for rec in r.recent[len(r.recent) - new:] if new > 0 else []:
                if rec["grammar_from"] != "none":
                    self.compile_ms.observe(rec["compile_ms"], tags={"tier": rec["grammar_from"]})
            self._seen_recent = r.finished
            now = time.monotonic()
            if now - self._gauges_at < GAUGE_PERIOD_S:
                return
            self._gauges_at = now
            self.gauges["open_sessions"].set(r.runtime.open_sessions())
            cb = r.runtime.cache_bytes()
            self.gauges["cache_bytes"].set(cb["grammars"] + cb["compiler"])
            steps = r.engine.exposed_mask_ms()
            if steps:
                self.gauges["step_forward_ms"].set(steps["forward_ms"])
                self.gauges["step_fill_ms"].set(steps["fill_ms"])
                self.gauges["step_mask_exposed_ms"].set(steps["mask_exposed_ms"])
        except Exception:       # noqa: BLE001 - metrics never fail a request
            _log.debug("metrics update failed", exc_info=True)


# Health checked every 2 s, failing after 10: a replica lost with its node is replaced within
# seconds of its checks failing (Serve gives up after three in a row), not after half a minute with
# Serve's defaults (10 s, 30 s), while its node's requests are retried on the others. A replica
# told to stop looks every 0.5 s (Serve: 2 s) whether its requests are done, up to Serve's 20 s:
# an idle one goes at once.
@serve.deployment(name="xg2-model", ray_actor_options={"num_cpus": 0}, max_ongoing_requests=64,
                  health_check_period_s=2, health_check_timeout_s=10, graceful_shutdown_wait_loop_s=0.5)
@serve.ingress(api)
class ModelServer:
    """A model replica. HTTP reaches it straight from Serve's proxy (router "default"), or the
    ingress calls `respond` or `generate` by handle (router "affinity"); all run `_call`, so an
    answer is the same either way. Every answer names the replica in its REPLICA_HEADER."""

    def __init__(self, options: dict | None = None, api_keys: KeyRing | dict[str, str] | None = None,
                 open_tenants: bool = False):
        self.replica = Replica(ReplicaOptions(**(options or {})))
        self.keys = _key_ring(api_keys, open_tenants)
        self.open_tenants = self.keys is None or self.keys.open_tenants
        self._metrics = _Metrics(self.replica)
        self._replica_id = serve.get_replica_context().replica_id.unique_id

    async def _call(self, fn: Any, request: Request) -> Response:
        grammar_info(reset=True)
        try:
            caller = caller_of(request.headers.get("authorization", ""), self.keys)
            out = await fn(caller.tenant, await request.body())
        except p.RequestError as e:
            return _error(e)
        except Exception as e:      # noqa: BLE001 - the client gets OpenAI's error object, not a bare 500
            _log.exception("request failed")
            return _error(_internal_error(e))
        finally:
            self._metrics.update()
        info = grammar_info()
        headers = None
        if info is not None:        # where the grammar came from and what it cost (see serve.replica)
            headers = {"x-xg2-grammar": json.dumps({**info, "replica": self._replica_id}, separators=(",", ":"))}
        if isinstance(out, bytes):
            return Response(out, media_type="application/json", headers=headers)
        return StreamingResponse(_events(out), media_type="text/event-stream", headers=headers)

    # The handlers read their own bodies (see the OpenAPI section above): the bodies and answers
    # are declared here for the document alone.
    @api.post("/v1/chat/completions", response_class=Response, summary="A chat completion",
              operation_id="chat_completions", openapi_extra=_body("ChatCompletionRequest"),
              responses=_answer("ChatCompletion", "ChatCompletionChunk"))
    async def chat_completions(self, request: Request) -> Response:
        return self._tagged(await self._call(self.replica.chat, request))

    @api.post("/v1/responses", response_class=Response, summary="A response (OpenAI's Responses API)",
              operation_id="responses", openapi_extra=_body("ResponseCreateRequest"),
              responses=_responses_answer())
    async def responses(self, request: Request) -> Response:
        return self._tagged(await self._call(self.replica.responses, request))

    @api.post("/v1/completions", response_class=Response, summary="A (legacy) text completion",
              operation_id="completions", openapi_extra=_body("CompletionRequest"),
              responses=_answer("Completion", "CompletionChunk"))
    async def completions(self, request: Request) -> Response:
        return self._tagged(await self._call(self.replica.completions, request))

    @api.get("/v1/models", response_class=Response, summary="The model served", operation_id="models",
             responses={200: {"description": "the model list", "content": {_JSON: {"schema": _ref("ModelList")}}}})
    async def models(self) -> Response:
        return Response(self.replica.models(), media_type="application/json")

    @api.get("/health", response_class=Response, summary="Liveness", operation_id="health",
             responses={200: {"description": "the replica answers", "content": {_JSON: {"schema": _ref("Health")}}}})
    async def health(self) -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    @api.get("/v1/xg2/stats", response_class=Response, summary="The replica's figures", operation_id="stats",
             openapi_extra={"security": [{"bearer": []}]},
             responses={200: {"description": "what of the figures the key may read",
                              "content": {_JSON: {"schema": _ref("Stats")}}}, **_error_responses(401)})
    async def stats(self, request: Request) -> Response:
        """This replica's figures: requests, steps (forward, fill, mask time exposed), runtime and
        cache tiers (hits, bytes); what of them the caller's key may read (see stats_view)."""
        return await self.stats_for(request.headers.get("authorization", ""))

    async def stats_for(self, authorization: str) -> Response:
        """`stats` for a caller's `Authorization` header (the ingress's call, by handle)."""
        try:
            caller = caller_of(authorization, self.keys)
        except p.RequestError as e:
            return _error(e)
        stats = self.replica.stats()
        stats["replica"] = {"pid": os.getpid(), "id": self._replica_id,
                            "node": ray.get_runtime_context().get_node_id()}
        view = stats_view(stats, caller, self.open_tenants, self.replica._in_flight.get(caller.tenant, 0),
                          self.replica.runtime.open_sessions(caller.tenant))
        return Response(p.encode(view), media_type="application/json")

    async def openapi_document(self) -> dict[str, Any]:
        """The application's OpenAPI document (the ingress serves it by this call)."""
        return openapi_document()

    async def check_health(self) -> None:
        if self.replica.engine._closed:
            raise RuntimeError("the decoding loop is closed")

    async def respond(self, kind: str, authorization: str, body: bytes,
                      affinity: Any = None) -> tuple[int, str, dict[str, str], bytes]:
        """The ingress's call for an answer that is not streamed (serve/ingress.py, by handle):
        (status, media type, headers, body), as the HTTP route answers. `affinity` is for the
        router (serve/routing.py), which read it from this call to place it here; the replica has
        no use for it. A body that asks for a stream after all is answered whole."""
        response = await self._answer(kind, authorization, body)
        if isinstance(response, StreamingResponse):
            content = b"".join([event async for event in response.body_iterator])
        else:
            content = response.body
        return response.status_code, response.media_type, self._headers(response), content

    async def generate(self, kind: str, authorization: str, body: bytes, affinity: Any = None) -> AsyncIterator[Any]:
        """The ingress's call for a streamed answer (by handle, streamed): (status, media type,
        headers), then the body: the server-sent events one by one (or the whole JSON of an
        error). `affinity`: as for `respond`."""
        response = await self._answer(kind, authorization, body)
        yield response.status_code, response.media_type, self._headers(response)
        if isinstance(response, StreamingResponse):
            async for event in response.body_iterator:
                yield event
        else:
            yield response.body

    async def _answer(self, kind: str, authorization: str, body: bytes) -> Response:
        fn = {"chat": self.replica.chat, "completions": self.replica.completions,
              "responses": self.replica.responses}.get(kind)
        if fn is None:
            raise UsageError(f"no {kind!r} requests here: 'chat', 'completions' or 'responses'")
        return self._tagged(await self._call(fn, self._forwarded(authorization, body)))

    @staticmethod
    def _headers(response: Response) -> dict[str, str]:
        """The answer's own headers (its length and type are the ingress's response's to set)."""
        return {k: v for k, v in response.headers.items() if k not in ("content-length", "content-type")}

    @staticmethod
    def _forwarded(authorization: str, body: bytes) -> Request:
        """The forwarded request as `_call` reads it: its API key and its body."""
        async def receive() -> dict:
            return {"type": "http.request", "body": body, "more_body": False}

        scope = {"type": "http", "method": "POST", "headers": [(b"authorization", authorization.encode("latin-1"))]}
        return Request(scope, receive)

    @staticmethod
    def _tagged(response: Response) -> Response:
        response.headers[REPLICA_HEADER] = serve.get_replica_context().replica_id.unique_id
        return response

    async def __del__(self) -> None:
        await self.replica.close()


@serve.deployment(name="xg2-masks", num_replicas=2, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=256,
                  health_check_period_s=5, graceful_shutdown_wait_loop_s=0.5,
                  request_router_config={"request_router_class": "serve.masks.SessionRouter",
                                         "request_routing_stats_period_s": 2.0})
class MaskService:
    """One replica of the mask service: its sessions live in its MaskHost actor (serve.masks),
    which clients reach directly after one `host` call; the other methods are the same calls
    through Serve, routed by session id to this replica (serve.masks.SessionRouter). Every method
    names the tenant (a tenant reaches only its sessions); with API keys, the caller's key in its
    place (the host answers as the key's tenant, see MatcherHost)."""

    async def __init__(self, model: str = "default", shards: list[str] | None = None,
                       shard_namespace: str | None = None, api_keys: KeyRing | dict[str, str] | None = None,
                       open_tenants: bool = False):
        from .masks import start_host

        self.tag = serve.get_replica_context().replica_id.unique_id
        self._host = start_host(model, self.tag, shards, shard_namespace, _key_ring(api_keys, open_tenants))
        self.vocab_size = (await self._host.info.remote())["vocab_size"]
        self._clients = 0

    async def info(self) -> dict:
        return {"vocab_size": self.vocab_size, "tag": self.tag}

    async def host(self) -> dict:
        """This replica's MaskHost actor, for a client to call directly (StepClient binds with it)."""
        self._clients += 1
        return {"host": self._host, "tag": self.tag, "vocab_size": self.vocab_size}

    async def open(self, tenant: str, spec: Any, first_mask: bool = False) -> dict:
        return await self._forward(self._host.open.remote(tenant, spec, first_mask))

    async def step_packed(self, tenant: str, request: bytes) -> bytes:
        from xg2.actors.host import step_request_sessions

        return await self._forward(self._host.step_packed.remote(tenant, request), lambda: step_request_sessions(request))

    async def step_rows(self, tenant: str, session_ids: list[str], tokens: list[int | None]) -> dict:
        return await self._forward(self._host.step.remote(tenant, session_ids, tokens), lambda: session_ids)

    async def close(self, tenant: str, session_ids: list[str]) -> int:
        return await self._forward(self._host.close.remote(tenant, session_ids), lambda: session_ids)

    async def fork(self, tenant: str, session_id: str, n: int = 1) -> list[str]:
        return await self._forward(self._host.fork.remote(tenant, session_id, n), lambda: [session_id])

    async def rollback(self, tenant: str, session_ids: list[str], counts: int | list[int] = 1) -> None:
        return await self._forward(self._host.rollback.remote(tenant, session_ids, counts), lambda: session_ids)

    async def stats(self) -> dict:
        """This replica's figures (`handle.broadcast("stats")` gathers every replica's)."""
        out = await self._forward(self._host.stats.remote())
        out["replica"] = {"tag": self.tag, "clients": self._clients}
        return out

    def record_routing_stats(self) -> dict:
        return {"clients": self._clients}

    async def check_health(self) -> None:
        """The host answers, or this replica is replaced (with its host: their sessions are lost
        together, never one without the other)."""
        await self._host.ping.remote()

    async def _forward(self, ref: Any, sessions: Any = None) -> Any:
        """The host's answer. Its typed errors reach the caller as the host raised them; a host
        that has stopped is SessionLostError for the sessions the call named."""
        import ray

        try:
            return await ref
        except ray.exceptions.RayTaskError as e:
            raise e.cause from None
        except ray.exceptions.ActorDiedError:
            if sessions is None:
                raise XG2Error(f"mask service replica {self.tag} has lost its host and is being replaced: "
                               "call again") from None
            lost = list(sessions())
            raise SessionLostError(f"mask service replica {self.tag} has lost its host: {len(lost)} session(s) "
                                   "lost (open them again)", lost) from None

    def __del__(self) -> None:
        import ray

        host = getattr(self, "_host", None)
        if host is not None and ray.is_initialized():
            ray.kill(host, no_restart=True)


def _shard_names(args: dict[str, Any]) -> list[str]:
    """The shards' names: `shards` of them (0: no cache tier), this build's by default (the names
    the shards' keeper, serve/shards.py, gives them)."""
    from xg2.actors.keeper import shard_names

    return shard_names(int(args.pop("shards", 2)), args.pop("shard_prefix", None))


def _placement(args: dict[str, Any]) -> dict[str, Any]:
    """The model deployment's placement from `replica_resources` (custom Ray resources a replica
    needs, e.g. a label put on the nodes that should hold replicas) and `replica_max_replicas_per_node`."""
    out: dict[str, Any] = {}
    resources = args.pop("replica_resources", None)
    if resources:
        out["ray_actor_options"] = {"num_cpus": 0, "resources": dict(resources)}
    per_node = args.pop("replica_max_replicas_per_node", None)
    if per_node is not None:
        out["max_replicas_per_node"] = int(per_node)
    return out


def build(args: dict[str, Any]) -> Any:
    """The model application (`serve run serve.app:build`, or `serve/config.yaml`): args `model`,
    `replicas`, `shards` (how many; 0: no cache tier), `shard_prefix`, `api_keys` (a KeyRing, or key
    -> tenant), `open_tenants` (with `api_keys`: any other token is a tenant of its own),
    `replica_resources` and `replica_max_replicas_per_node` (placement), `router`
    ("affinity", the default: the ingress and the grammar-affinity router; "default": Serve's
    proxy and router, for comparison), `routing_imbalance`, `routing_remembered_keys` (0: the
    rendezvous homes alone) and `ingress_replicas` (with "affinity"), and any ReplicaOptions
    field."""
    args = dict(args or {})
    replicas = int(args.pop("replicas", 1))
    api_keys = args.pop("api_keys", None)
    open_tenants = bool(args.pop("open_tenants", False))
    router = args.pop("router", "affinity")
    imbalance = args.pop("routing_imbalance", None)
    remembered = args.pop("routing_remembered_keys", None)
    ingress_replicas = int(args.pop("ingress_replicas", 1))
    placement = _placement(args)
    if router not in ("affinity", "default"):
        raise UsageError(f"router must be 'affinity' or 'default', got {router!r}")
    shards = _shard_names(args)
    options = {**args, "shards": shards}
    if router == "default":
        return ModelServer.options(num_replicas=replicas, **placement).bind(options, api_keys, open_tenants)
    from .ingress import Ingress
    from .routing import DEFAULT_IMBALANCE, DEFAULT_REMEMBERED_KEYS, router_config

    config = router_config(imbalance=DEFAULT_IMBALANCE if imbalance is None else int(imbalance),
                           remembered_keys=DEFAULT_REMEMBERED_KEYS if remembered is None else int(remembered))
    model = ModelServer.options(num_replicas=replicas, request_router_config=config, **placement).bind(
        options, api_keys, open_tenants)
    defaults = ReplicaOptions()
    return Ingress.options(num_replicas=ingress_replicas).bind(
        model, tool_format=options.get("tool_format") or model_tool_format(options.get("model", defaults.model)),
        max_tokens_limit=options.get("max_tokens_limit", defaults.max_tokens_limit),
        max_body_bytes=options.get("max_body_bytes", defaults.max_body_bytes))


def build_masks(args: dict[str, Any]) -> Any:
    """The mask service application (reached by handle: `serve.get_app_handle("xg2-masks")`):
    args `model` (its tokenizer), `replicas` (default 2), `shards`, `shard_prefix`,
    `shard_namespace` (the same shards as the model's), `api_keys` (as the model's)."""
    args = dict(args or {})
    replicas = int(args.pop("replicas", 2))
    if replicas < 1:
        raise UsageError(f"the mask service needs at least one replica, not {replicas}")
    shards = _shard_names(args)
    return MaskService.options(num_replicas=replicas).bind(args.get("model", "default"), shards,
                                                           args.get("shard_namespace"), args.get("api_keys"),
                                                           bool(args.get("open_tenants", False)))
