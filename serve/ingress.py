"""The model application's HTTP ingress when grammar-affinity routing is on (deployment
"xg2-ingress"): it reads each request's body, computes its affinity (serve.routing) and calls the
model replicas ("xg2-model") through a DeploymentHandle whose router places it by that affinity.

Why a deployment in front: Serve's proxy routes an HTTP request before its body is read (the
router sees the ASGI scope only; the replica pulls the body from the proxy afterwards), and the
grammar is in the body. This hop costs one handle call per request (measured in
benchmarks/README.md, "Grammar-affinity routing"); streamed events pass through it one by one.

It only moves bytes: authentication, validation, errors, answers and response headers (the
answering replica's id among them) stay the replica's (ModelServer.respond and .generate run the same
code as its HTTP routes), so a request answers the same whichever way it came. Its affinity is a
best effort: a body it cannot decode is forwarded without one, and the replica gives the error.
It imports neither torch nor the model: a light process, so that it may run beside the proxy.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from ray import serve
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from xg2.actors.spec import ToolsSpec, content_key

from . import protocol as p
from .grammars import chat_session_spec, completion_session_spec
from .responses import decode_responses_request
from .routing import AFFINITY_KWARG, Affinity, tool_key

_log = logging.getLogger("xg2.serve")

#: (method, path) -> what the model replica is asked ("openapi": its OpenAPI document, which the
#: ingress keeps once read).
ROUTES = {("POST", "/v1/chat/completions"): "chat", ("POST", "/v1/completions"): "completions",
          ("POST", "/v1/responses"): "responses",
          ("GET", "/v1/models"): "models", ("GET", "/health"): "health", ("GET", "/v1/xg2/stats"): "stats",
          ("GET", "/openapi.json"): "openapi"}
_JSON = "application/json"
_SSE = "text/event-stream"


def request_affinity(kind: str, body: bytes, *, tool_format: str = "qwen_3",
                     max_tokens_limit: int = p.DEFAULT_MAX_TOKENS_LIMIT) -> Affinity | None:
    """A request's affinity: its grammar's content key (as the replica's runtime computes it, for
    the same tool format) and a key per tool with parameters; None when it has no grammar or
    cannot be decoded (the replica refuses it with the error it deserves). Builds the spec, which
    compiles nothing: tens of microseconds for a small body. A Responses request's is that of the
    chat request it becomes (serve.responses), which is what the replica compiles."""
    return inspect_request(kind, body, tool_format=tool_format, max_tokens_limit=max_tokens_limit)[0]


def inspect_request(kind: str, body: bytes, *, tool_format: str = "qwen_3",
                    max_tokens_limit: int = p.DEFAULT_MAX_TOKENS_LIMIT) -> tuple[Affinity | None, bool]:
    """The request's affinity (request_affinity) and whether it asks for a stream (False when it
    cannot be decoded: the replica's answer is then an error, never a stream)."""
    if kind not in ("chat", "completions", "responses"):
        raise ValueError(f"no affinity for a {kind!r} request: only chat, completions and responses carry a "
                         "grammar")
    try:
        if kind == "chat":
            req: Any = p.decode_chat_request(body, max_tokens_limit=max_tokens_limit)
            spec = chat_session_spec(req, tool_format=tool_format)
        elif kind == "responses":
            req = decode_responses_request(body, max_tokens_limit=max_tokens_limit).chat
            spec = chat_session_spec(req, tool_format=tool_format)
        else:
            req = p.decode_completion_request(body, max_tokens_limit=max_tokens_limit)
            spec = completion_session_spec(req)
    except p.RequestError:
        return None, False
    except Exception:       # noqa: BLE001 - a best effort: the replica answers what it deserves
        _log.debug("no affinity for a %s request", kind, exc_info=True)
        return None, False
    streamed = bool(req.stream)
    if spec is None:
        return None, streamed
    tools: tuple[bytes, ...] = ()
    try:
        if isinstance(spec, ToolsSpec):
            tools = tuple(tool_key(t["function"]["parameters"]) for t in spec.tools if "parameters" in t["function"])
        return (content_key(spec), tools), streamed
    except Exception:       # noqa: BLE001 - as above: no affinity (the replica refuses what cannot be keyed)
        _log.debug("no affinity for a %s request", kind, exc_info=True)
        return None, streamed


def _error(message: str, status: int, code: str, headers: dict[str, str] | None = None) -> Response:
    err = p.RequestError(message, status=status, code=code)
    return Response(p.encode(err.to_response()), status_code=status, media_type=_JSON, headers=headers)


@serve.deployment(name="xg2-ingress", ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1024,
                  health_check_period_s=10, graceful_shutdown_wait_loop_s=0.5)
class Ingress:
    """See the module note. `model` is the handle of "xg2-model"; `tool_format` and
    `max_tokens_limit` are the replicas' (ReplicaOptions), so that the content keys computed here
    are the ones the replicas' caches hold; `max_body_bytes` the replicas' bound (a larger body
    is forwarded without affinity, for the replica to refuse)."""

    def __init__(self, model: Any, tool_format: str = "qwen_3", max_tokens_limit: int = p.DEFAULT_MAX_TOKENS_LIMIT,
                 max_body_bytes: int = 4 << 20):
        self.model = model
        self.tool_format, self.max_tokens_limit, self.max_body_bytes = tool_format, max_tokens_limit, max_body_bytes
        self._openapi: bytes | None = None

    async def __call__(self, request: Request) -> Response:
        path = request.url.path
        root = request.scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):] or "/"
        # HEAD is GET without the body (the server sends none)
        route = ROUTES.get(("GET" if request.method == "HEAD" else request.method, path))
        if route is None:
            allowed = [m for m, known in ROUTES if known == path]
            allowed += ["HEAD"] if "GET" in allowed else []
            if allowed:
                return _error(f"{request.method} is not allowed on {path}", 405, "method_not_allowed",
                              {"Allow": ", ".join(allowed)})
            return _error(f"no such route: {path}", 404, "not_found")
        try:
            if route in ("chat", "completions", "responses"):
                return await self._generate(route, request)
            if route == "openapi":
                if self._openapi is None:
                    self._openapi = p.encode(await self.model.openapi_document.remote())
                return Response(self._openapi, media_type=_JSON)
            # ModelServer's own routes, called by handle: they answer starlette Responses
            if route == "stats":
                answer = await self.model.stats_for.remote(request.headers.get("authorization", ""))
            else:
                answer = await getattr(self.model, route).remote()
            return Response(answer.body, status_code=answer.status_code, media_type=_JSON)
        except Exception:       # noqa: BLE001 - the client gets OpenAI's error object, not a dropped connection
            _log.exception("the model replicas could not answer %s", path)
            return _error("the model replicas could not answer; retry later", 503, "unavailable")

    async def _generate(self, kind: str, request: Request) -> Response:
        body = await request.body()
        affinity, streamed = None, False
        if len(body) <= self.max_body_bytes:
            affinity, streamed = inspect_request(kind, body, tool_format=self.tool_format,
                                                 max_tokens_limit=self.max_tokens_limit)
        authorization = request.headers.get("authorization", "")
        if not streamed:        # one call, one answer: about a millisecond less than a stream of two
            status, media_type, headers, content = await self.model.respond.remote(
                kind, authorization, body, **{AFFINITY_KWARG: affinity})
            return Response(content, status_code=status, media_type=media_type, headers=headers)
        stream = self.model.options(stream=True).generate.remote(kind, authorization, body,
                                                                 **{AFFINITY_KWARG: affinity})
        try:
            status, media_type, headers = await stream.__anext__()
            if media_type == _SSE:
                return StreamingResponse(_relay(stream), media_type=_SSE, headers=headers)
            return Response(await stream.__anext__(), status_code=status, media_type=media_type, headers=headers)
        except BaseException:
            stream.cancel()     # the client left (or the call failed): the replica's request ends too
            raise


async def _relay(stream: Any) -> AsyncIterator[bytes]:
    """The replica's server-sent events; a failure of the call itself (the replica died) becomes an
    error event, then the end, as the replica does for its own failures."""
    try:
        async for event in stream:
            yield event
    except Exception:       # noqa: BLE001 - the client gets an error event, not a cut stream
        _log.exception("the model replica's stream failed")
        yield p.sse_event(p.ErrorResponse(p.ErrorDetail(message="internal error: the model replica's stream failed",
                                                        type="server_error")))
        yield p.SSE_DONE
    finally:
        stream.cancel()     # a client gone mid-stream ends the replica's request (nothing after the end)
