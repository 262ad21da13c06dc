"""The OpenAI-compatible HTTP application (FastAPI) over a DeepInferenceEngine.

Endpoints: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (API key checked when one
is set), and, without a key, ``GET /health``, ``GET /version``, ``GET /metrics`` (Prometheus). Every error is
answered in OpenAI's schema ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import hmac
import logging
import uuid
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

import deepinfer
from deepinfer.build_info import build_info
from deepinfer.sampling_params import MAX_LOGPROBS
from deepinfer.server.metrics import CONTENT_TYPE_LATEST, ServerMetrics
from deepinfer.server.protocol import APIError, error_body
from deepinfer.server.reasoning import ReasoningParser, get_reasoning_parser
from deepinfer.server.tool_calls import TOOL_CALL_PARSERS
from deepinfer.server.serving import OpenAIServing, ServerOptions, ServerState

__all__ = ["create_app", "DEFAULT_MAX_QUEUE_SIZE"]

logger = logging.getLogger("deepinfer.server")

DEFAULT_MAX_QUEUE_SIZE = 1024

_STATUS_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
                 405: "invalid_request_error", 413: "invalid_request_error", 422: "invalid_request_error"}


def _error_response(err: APIError) -> JSONResponse:
    headers = {"Retry-After": "1"} if err.status_code == 503 else None
    if err.status_code == 401:
        headers = {"WWW-Authenticate": "Bearer"}
    return JSONResponse(err.body(), status_code=err.status_code, headers=headers)


def create_app(engine: Any, *, api_key: str | None = None, max_queue: int = DEFAULT_MAX_QUEUE_SIZE,
               reasoning_parser: str | type[ReasoningParser] | None = None,
               tool_call_parser: str | None = "deepseek_v3",
               served_model_name: str | Sequence[str] | None = None,
               allowed_origins: Sequence[str] = (), allow_credentials: bool = False,
               chat_template: str | None = None, response_role: str = "assistant",
               max_logprobs: int = MAX_LOGPROBS, root_path: str = "", log_requests: bool = False) -> FastAPI:
    """An ASGI app serving ``engine``. The caller owns the engine (and shuts it down).

    ``max_queue`` bounds the sequences waiting for their first token; past it requests get 503.
    ``reasoning_parser`` ("deepseek-r1") splits chat outputs into ``reasoning_content`` and ``content``.
    ``tool_call_parser`` ("deepseek_v3" or "deepseek_v31": one parser reads both forms; None or "none": requests with
    tools are refused) turns DeepSeek's tool-call text into OpenAI ``tool_calls``; its name is also the form that
    ``tool_choice`` "required" or a named function forces the call to be written in.
    ``served_model_name`` names the model in the API (default: the engine's served_model_name); requests naming
    another model get 404.
    ``allowed_origins`` (e.g. ["https://app.example"] or ["*"]) lets browsers on those origins call the API: CORS
    headers on every answer, preflight requests answered; none by default (same-origin only).
    ``chat_template`` (a Jinja source) renders chat requests instead of the checkpoint's template;
    ``response_role`` is the role of the answers' messages; ``max_logprobs`` the largest logprobs / top_logprobs a
    request may ask for. ``root_path`` (e.g. "/api") is the prefix of a proxy in front: paths answer with or
    without it. ``log_requests`` logs one line per generation request (its id, prompt lengths and parameters).
    """
    if isinstance(reasoning_parser, str):
        reasoning_parser = get_reasoning_parser(reasoning_parser)
    if served_model_name is None:
        names = [engine.served_model_name]
    elif isinstance(served_model_name, str):
        names = [served_model_name]
    else:
        names = list(served_model_name)
        if not names:
            raise ValueError("served_model_name: give at least one name")
    if not isinstance(max_queue, int) or max_queue < 1:
        raise ValueError(f"max_queue must be an integer >= 1, got {max_queue!r}")

    if tool_call_parser not in (None, "none") and tool_call_parser not in TOOL_CALL_PARSERS:
        raise ValueError(f"tool_call_parser must be one of {sorted(TOOL_CALL_PARSERS)} or 'none', "
                         f"got {tool_call_parser!r}")
    options = ServerOptions(served_model_names=names, api_key=api_key or None, max_queue_size=max_queue,
                            reasoning_parser=reasoning_parser,
                            tool_call_parser=TOOL_CALL_PARSERS.get(tool_call_parser or "none"),
                            tool_call_format=tool_call_parser if tool_call_parser in TOOL_CALL_PARSERS
                            else "deepseek_v3",
                            chat_template=chat_template, response_role=response_role, max_logprobs=max_logprobs,
                            log_requests=log_requests)
    state = ServerState(engine=engine, options=options, metrics=ServerMetrics(engine, names[0]))
    serving = OpenAIServing(state)

    if not isinstance(max_logprobs, int) or not 0 <= max_logprobs <= MAX_LOGPROBS:
        raise ValueError(f"max_logprobs must be an integer in [0, {MAX_LOGPROBS}], got {max_logprobs!r}")

    # FastAPI's root_path: a request path with the prefix is routed without it, one without it as it is, so the
    # server answers behind a proxy that strips the prefix and one that keeps it.
    app = FastAPI(title="DeepInfer", version=deepinfer.__version__, docs_url=None, redoc_url=None,
                  openapi_url=None, root_path=root_path)
    app.state.server = state
    if allowed_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(allowed_origins), allow_credentials=allow_credentials,
                           allow_methods=["*"], allow_headers=["*"])

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404:
            message = f"{request.method} {request.url.path} is not an endpoint of this server"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        return JSONResponse(error_body(message, _STATUS_TYPES.get(exc.status_code, "server_error")),
                            status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
        # The client gets no Python internals (they name this server's code, not the request's problem); the log
        # has the traceback under an id the message gives.
        error_id = uuid.uuid4().hex[:12]
        logger.exception("internal error %s answering %s %s", error_id, request.method, request.url.path)
        return JSONResponse(error_body(f"Internal server error (logged on the server as {error_id})", "server_error",
                                       code="internal_error"), status_code=500)

    def check_api_key(request: Request) -> None:
        if options.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if not header:
            raise APIError(401, "You didn't provide an API key. Send it in an 'Authorization: Bearer KEY' header.",
                           code="invalid_api_key")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), options.api_key.encode()):
            raise APIError(401, "Incorrect API key provided.", code="invalid_api_key")

    async def answer(endpoint: str, request: Request, handler: Any) -> Response:
        try:
            check_api_key(request)
            response = await handler(request)
        except APIError as e:
            state.metrics.http(endpoint, e.status_code)
            return _error_response(e)
        state.metrics.http(endpoint, response.status_code)
        return response

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await answer("/v1/completions", request, serving.completions)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await answer("/v1/chat/completions", request, serving.chat_completions)

    def model_card(name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": state.created, "owned_by": "deepinfer",
                "root": getattr(engine, "config", None) and engine.config.model_name_or_path or name,
                "parent": None, "max_model_len": state.max_model_len}

    @app.get("/v1/models")
    async def list_models(request: Request) -> Response:
        check_api_key(request)
        return JSONResponse({"object": "list", "data": [model_card(name) for name in names]})

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str, request: Request) -> Response:
        check_api_key(request)
        if model_id not in names:
            raise APIError(404, f"The model `{model_id}` does not exist.", param="model", code="model_not_found")
        return JSONResponse(model_card(model_id))

    @app.get("/health")
    async def health() -> Response:
        if state.draining:
            return JSONResponse(error_body("The server is shutting down.", "server_error",
                                           code="server_shutting_down"), status_code=503)
        try:
            alive = bool(getattr(engine.stats(), "alive", True))
        except Exception:
            alive = False
        if not alive:
            return JSONResponse(error_body("The engine is not running.", "server_error", code="engine_dead"),
                                status_code=503)
        return JSONResponse({"status": "ok"})

    # The same facts as `deepinfer --version`: the package version, the backends, the GPUs the build sees.
    version_body = build_info()

    @app.get("/version")
    async def version() -> Response:
        return JSONResponse(version_body)

    @app.get("/metrics")
    async def metrics() -> Response:
        # Under --api-server-count the other server processes' request metrics are added to this one's.
        peers = getattr(engine, "peer_metrics", None)
        families = await peers() if peers is not None else []
        return Response(state.metrics.render(families), media_type=CONTENT_TYPE_LATEST)

    return app
