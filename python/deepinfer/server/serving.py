"""Request handling for /v1/completions and /v1/chat/completions: validation, submission, responses, streaming.

Everything here runs on the server's event loop and never computes: the engine steps in its own C++ thread and
hands outputs over through RequestStream, so concurrent requests are batched by the engine while this loop only
shuffles text. A request's lifetime is owned by a ``_Run``: it counts the request against the queue bound, records
latencies and token counts, and aborts whatever is still generating when the response ends early (client gone,
error, shutdown), which frees the request's cache pages.

Both endpoints validate and tokenize their own request, then answer through one ``OpenAIServing._respond``: the
whole response, or server-sent events (the usage chunk, n > 1 choices, finish reasons, the engine's failures,
disconnects that abort). What differs between their choices (text and echo, or a message with its role and
reasoning_content; the two logprobs shapes) is a ``ChoiceFormat`` from choices.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from pydantic import ValidationError

from deepinfer.outputs import CompletionOutput
from deepinfer.sampling_params import MAX_LOGPROBS, SamplingParams
from deepinfer.server.choices import ChatFormat, Choice, ChoiceFormat, CompletionFormat, prompt_logprobs_body
from deepinfer.server.metrics import ServerMetrics
from deepinfer.server.protocol import (APIError, ChatCompletionRequest, CompletionRequest, check_text,
                                       check_unsupported, check_values, forced_tool_name, validation_error)
from deepinfer.server.reasoning import ReasoningParser
from deepinfer.server.engine_link import EngineQueueFull
from deepinfer.server.sse import ChunkEncoder, Inbox, sse as _sse
from deepinfer.server.structured import Constraint, request_constraint, tool_call_grammar, tool_call_token_ids
from deepinfer.server.tool_calls import DeepSeekToolCallParser
from deepinfer.structured_outputs import StructuredOutputsParams
from deepinfer.tokenizer import TokenText

logger = logging.getLogger("deepinfer.server")

MAX_PROMPTS_PER_REQUEST = 256     # prompts in one /v1/completions batch
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions (chat defaults to the rest of the context)


# ----------------------------------------------------------------------------------------------- server state


@dataclass
class ServerOptions:
    served_model_names: list[str]
    api_key: str | None = None
    max_queue_size: int = 1024
    reasoning_parser: type[ReasoningParser] | None = None
    tool_call_parser: type[DeepSeekToolCallParser] | None = None  # None: requests with tools are refused
    tool_call_format: str = "deepseek_v3"  # the form a forced tool call is written in: deepseek_v3 or deepseek_v31
    chat_template: str | None = None   # Jinja source used instead of the checkpoint's (a request's own still wins)
    response_role: str = "assistant"   # the role of chat answers' messages
    max_logprobs: int = MAX_LOGPROBS   # the largest logprobs / top_logprobs a request may ask for
    log_requests: bool = False         # one log line per generation request (never its text)


@dataclass
class ServerState:
    """What the handlers of one app share."""

    engine: Any
    options: ServerOptions
    metrics: ServerMetrics
    created: int = field(default_factory=lambda: int(time.time()))
    draining: bool = False
    inflight: int = 0          # generation requests submitted to the engine and not yet answered in full
    pending_seqs: int = 0      # sequences submitted that have produced nothing yet (queued or in prefill)
    runs: set = field(default_factory=set)  # the _Run of every request in flight

    def __post_init__(self) -> None:
        self.token_text = TokenText(self.engine.tokenizer)

    @property
    def model_name(self) -> str:
        return self.options.served_model_names[0]

    @property
    def max_model_len(self) -> int:
        value = getattr(self.engine, "max_model_len", None)
        if isinstance(value, int):
            return value
        return int(self.engine.max_model_len)

    def begin_drain(self) -> None:
        """Stop admitting requests (503); those in flight go on."""
        self.draining = True

    async def abort_all(self, grace_s: float = 2.0) -> None:
        """Aborts every request in flight. Responses end with finish_reason "abort" (streams) or a 503; any the
        engine has not ended within ``grace_s`` are ended here."""
        for run in list(self.runs):
            run.abort()
        deadline = time.monotonic() + grace_s
        while self.runs and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for run in list(self.runs):
            run.kill()


# ----------------------------------------------------------------------------------------------- a request's run


class _Run:
    """The engine streams of one HTTP request (one per prompt, each with n completions) and their bookkeeping."""

    _KILL = -1

    def __init__(self, state: ServerState, streams: list[Any], n: int, arrival: float, prompt_lens: list[int]) -> None:
        self.state = state
        self.streams = streams
        self.n = n
        self.arrival = arrival
        self.prompt_lens = prompt_lens
        self.num_choices = len(streams) * n
        self.prompt_logprobs: list[Any] = [None] * len(streams)  # per prompt, when it was scored
        self.num_cached_tokens = [0] * len(streams)  # per prompt: its tokens the prefix cache held
        self.client_gone = False
        self._first_token = False
        self._last_token_time: list[float | None] = [None] * self.num_choices
        self._pending = [True] * self.num_choices
        self.finished = [False] * self.num_choices
        self._closed = False
        self._queue = Inbox()  # (prompt, delta), (prompt, None) at a stream's end
        self._pumps: list[asyncio.Task] = []
        state.pending_seqs += self.num_choices
        state.inflight += 1
        state.runs.add(self)
        state.metrics.prompt_tokens.inc(sum(prompt_lens))

    def _release_pending(self, ci: int) -> None:
        if self._pending[ci]:
            self._pending[ci] = False
            self.state.pending_seqs -= 1

    def abort(self) -> None:
        """Asks the engine to stop every completion; each ends with finish_reason "abort" and frees its pages."""
        for s in self.streams:
            s.abort()

    def queued(self) -> int:
        """Deltas waiting in the run's queue (already arrived, not yet taken by outputs())."""
        return self._queue.qsize()

    def kill(self) -> None:
        """Ends the response now, whatever the engine still sends (unfinished completions end as "abort")."""
        self._queue.put_nowait((self._KILL, None))

    def client_disconnected(self) -> None:
        self.client_gone = True
        self.abort()

    def _start_pumps(self) -> None:
        """Every stream's deltas into the run's one queue as (prompt, delta): the engine's streams put them there
        themselves (RequestStream.forward_to: no task and no second queue a delta); any other async iterable of
        deltas gets a task that moves them."""
        async def pump(i: int, stream: Any) -> None:
            try:
                async for delta in stream:
                    self._queue.put_nowait((i, delta))
            finally:
                self._queue.put_nowait((i, None))

        for i, s in enumerate(self.streams):
            if hasattr(s, "forward_to"):
                s.forward_to(self._queue, i)
            else:
                self._pumps.append(asyncio.create_task(pump(i, s)))

    async def outputs(self) -> AsyncIterator[tuple[int, CompletionOutput]]:
        """(choice index, new output of that choice) as they arrive; choice index = prompt * n + completion."""
        metrics = self.state.metrics
        self._start_pumps()
        remaining = len(self.streams)
        try:
            while remaining:
                p, delta = await self._queue.get()
                if p == self._KILL:
                    for ci, done in enumerate(self.finished):
                        if not done:
                            self.finished[ci] = True
                            metrics.finished("abort")
                            yield ci, CompletionOutput(index=ci % self.n, finish_reason="abort")
                    return
                if delta is None:
                    remaining -= 1
                    continue
                now = time.monotonic()
                if delta.prompt_logprobs is not None:
                    self.prompt_logprobs[p] = delta.prompt_logprobs
                self.num_cached_tokens[p] = delta.num_cached_tokens
                for out in delta.outputs:
                    ci = p * self.n + out.index
                    k = len(out.token_ids)
                    if k:
                        if not self._first_token:
                            self._first_token = True
                            metrics.time_to_first_token.observe(now - self.arrival)
                        last = self._last_token_time[ci]
                        if last is not None:  # k tokens at once: k gaps of (now - last) / k
                            metrics.inter_token_latency.observe((now - last) / k, k)
                        self._last_token_time[ci] = now
                        metrics.generation_tokens.inc(k)
                    if k or out.finish_reason:
                        self._release_pending(ci)
                    if out.finish_reason and not self.finished[ci]:
                        self.finished[ci] = True
                        metrics.finished(out.finish_reason)
                    yield ci, out
        finally:
            self.close()

    def close(self) -> None:
        """Ends the run: aborts what still generates (its cache pages are freed), settles the counters."""
        if self._closed:
            return
        self._closed = True
        self.state.inflight -= 1
        self.state.runs.discard(self)
        for t in self._pumps:
            t.cancel()
        if not all(self.finished):
            self.abort()
            for ci, done in enumerate(self.finished):  # no longer watched: they end aborted
                if not done:
                    self.finished[ci] = True
                    self.state.metrics.finished("abort")
        for ci in range(self.num_choices):
            self._release_pending(ci)
        if self._first_token:
            self.state.metrics.e2e_latency.observe(time.monotonic() - self.arrival)


async def _watch_disconnect(request: Request, run: _Run) -> None:
    """Aborts the run when the client goes away (the ASGI server reports http.disconnect)."""
    try:
        while True:
            message = await request.receive()
            if message.get("type") == "http.disconnect":
                run.client_disconnected()
                return
    except asyncio.CancelledError:
        raise
    except Exception:  # a server without disconnect reporting: rely on send() failing instead
        return


# ----------------------------------------------------------------------------------------------- helpers


def _json_response(payload: Mapping[str, Any], status: int = 200) -> Response:
    return Response(json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8"),
                    status_code=status, media_type="application/json")


_GRAMMAR_ERROR = re.compile(r"invalid \w+ grammar\b")  # the engine's message for a constraint that does not compile

_PARAM_NAMES = {"n", "temperature", "top_p", "top_k", "min_p", "seed", "max_tokens", "min_tokens", "stop",
                "stop_token_ids", "repetition_penalty", "presence_penalty", "frequency_penalty", "logprobs"}


def _sampling_error(e: Exception, renames: Mapping[str, str]) -> APIError:
    message = str(e)
    first = message.split(" ", 1)[0].strip(":")
    param = renames.get(first, first) if first in _PARAM_NAMES else None
    return APIError(400, message, param=param, code="invalid_value")


def _generation_failed(error: str | None) -> APIError:
    return APIError(500, f"Generation failed: {error or 'engine error'}", type="server_error", code="engine_error")


def _usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's usage object; prompt_tokens_details.cached_tokens counts prompt tokens the prefix cache held."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


class _RunStreamingResponse(StreamingResponse):
    """Server-sent events that close their run however the response ends, even if the body never started
    (a client gone before the first byte)."""

    def __init__(self, gen: AsyncIterator[bytes], run: _Run) -> None:
        super().__init__(gen, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._run = run

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._run.close()


def _stream_response(gen: AsyncIterator[bytes], run: _Run) -> StreamingResponse:
    return _RunStreamingResponse(gen, run)


# ----------------------------------------------------------------------------------------------- serving


class OpenAIServing:
    def __init__(self, state: ServerState) -> None:
        self.state = state

    @property
    def engine(self) -> Any:
        return self.state.engine

    # ---- shared steps

    async def _parse(self, request: Request, model: Any, endpoint: str) -> tuple[Any, int]:
        """The request's JSON body as ``model`` (a pydantic request class), checked by protocol.py's passes and
        against the served model names. Returns the request and its n."""
        body = await self._read_json(request)
        check_text(body)
        check_unsupported(body, endpoint)
        try:
            req = model.model_validate(body)
        except ValidationError as e:
            raise validation_error(e) from None
        self._check_model(req.model)
        return req, check_values(req, self.state.options.max_logprobs)

    async def _read_json(self, request: Request) -> dict[str, Any]:
        raw = await request.body()
        if not raw.strip():
            raise APIError(400, "The request body is empty; send a JSON object", code="invalid_json")
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise APIError(400, f"The request body is not valid JSON: {e}", code="invalid_json") from None
        if not isinstance(body, dict):
            raise APIError(400, f"The request body must be a JSON object, got {type(body).__name__}",
                           code="invalid_json")
        return body

    def _check_model(self, model: str | None) -> None:
        if model is not None and model not in self.state.options.served_model_names:
            raise APIError(404, f"The model `{model}` does not exist. This server serves "
                                f"{', '.join(repr(m) for m in self.state.options.served_model_names)}.",
                           param="model", code="model_not_found")

    def _max_tokens(self, requested: int | None, prompt_len: int, default: int | None, param: str,
                    scores_prompt: bool = False) -> int:
        """The completion's token limit; 0 is allowed when the request scores its prompt (echo with logprobs)."""
        max_len = self.state.max_model_len
        if prompt_len >= max_len:
            raise APIError(400, f"This model's maximum context length is {max_len} tokens. However, your prompt "
                                f"has {prompt_len} tokens (the prompt plus at least one generated token must fit). "
                                "Please reduce the length of the prompt.",
                           param="messages" if param == "max_completion_tokens" else "prompt",
                           code="context_length_exceeded")
        room = max_len - prompt_len
        if requested is None:
            return room if default is None else min(default, room)
        if requested < (0 if scores_prompt else 1):
            least = "0 (with echo and logprobs) or more" if scores_prompt else "1"
            raise APIError(400, f"Invalid value for '{param}': must be at least {least}, got {requested}",
                           param=param, code="invalid_value")
        if requested > room:
            raise APIError(400, f"This model's maximum context length is {max_len} tokens. However, you requested "
                                f"{prompt_len + requested} tokens ({prompt_len} in the prompt, {requested} for the "
                                f"completion). Please reduce the prompt or the completion length.",
                           param=param, code="context_length_exceeded")
        return requested

    def _truncated(self, ids: list[int], keep: int | None, completion_tokens: int) -> list[int]:
        """The prompt's last ``keep`` tokens (truncate_prompt_tokens); -1 keeps as many as fit beside
        ``completion_tokens``. Shorter prompts are unchanged."""
        if keep is None:
            return ids
        if keep == -1:
            keep = max(1, self.state.max_model_len - max(1, completion_tokens))
        return ids[-keep:] if len(ids) > keep else ids

    def _sampling_params(self, req: Any, n: int, max_tokens: int, logprobs: int | None,
                         renames: Mapping[str, str], prompt_logprobs: int | None = None,
                         constraint: Constraint | None = None) -> SamplingParams:
        # The checkpoint's recommended values (generation_config.json) for what the request leaves unset.
        defaults = getattr(self.state.engine, "generation_defaults", {})
        values: dict[str, Any] = {k: v for k, v in defaults.items() if k != "max_tokens"}
        values.update({"n": n, "max_tokens": max_tokens, "logprobs": logprobs, "prompt_logprobs": prompt_logprobs})
        if constraint is not None:
            values["structured_outputs"] = constraint.params
        for name in ("temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
                     "include_stop_str_in_output", "ignore_eos", "repetition_penalty", "presence_penalty",
                     "frequency_penalty", "min_tokens", "skip_special_tokens"):
            value = getattr(req, name)
            if value is not None:
                values[name] = value
        try:
            return SamplingParams(**values)
        except (ValueError, TypeError) as e:
            raise _sampling_error(e, renames) from None

    def _admit(self, num_seqs: int) -> None:
        state = self.state
        if state.draining:
            state.metrics.rejected("shutting_down")
            raise APIError(503, "The server is shutting down and accepts no new requests.", type="server_error",
                           code="server_shutting_down")
        engine_waiting = 0
        if not getattr(self.engine, "admits_in_engine", False):  # else its submission checks the engine's queue
            try:
                engine_waiting = int(self.engine.stats().num_waiting)
            except Exception:
                pass
        self._check_queue(max(engine_waiting, state.pending_seqs), num_seqs)

    def _check_queue(self, waiting: int, num_seqs: int) -> None:
        limit = self.state.options.max_queue_size
        if waiting + num_seqs > limit:
            self.state.metrics.rejected("queue_full")
            raise APIError(503, f"The server is overloaded: {waiting} sequences are waiting and the queue holds "
                                f"{limit}. Retry later.", type="server_error", code="server_overloaded")

    async def _submit(self, prompts: list[list[int]], params: list[SamplingParams], request_id: str, n: int,
                      arrival: float, constraint: Constraint | None = None) -> _Run:
        self._admit(len(prompts) * n)
        loop = asyncio.get_running_loop()
        # An engine in another process (server/engine_proxy.py) answers a submission asynchronously: its refusal
        # (a ValueError, as the engine's own) still comes before any response is started.
        submit_async = getattr(self.engine, "submit_async", None)
        streams = []
        try:
            for i, (ids, p) in enumerate(zip(prompts, params)):
                rid = request_id if len(prompts) == 1 else f"{request_id}-{i}"
                if submit_async is not None:
                    stream = await submit_async(ids, p, request_id=rid,
                                                max_waiting=self.state.options.max_queue_size)
                    if isinstance(stream, EngineQueueFull):
                        self._check_queue(stream.waiting, p.n)  # raises the 503
                    streams.append(stream)
                else:
                    streams.append(self.engine.submit({"prompt_token_ids": ids}, p, loop=loop, request_id=rid))
        except ValueError as e:
            for s in streams:
                s.abort()
            if constraint is not None and _GRAMMAR_ERROR.match(str(e)):
                # The engine compiles the constraint when the request is added: llguidance's message names the
                # problem (a bad type, a $ref that points nowhere, a regex that does not parse...).
                raise APIError(400, f"Invalid value for '{constraint.param}': {e}", param=constraint.param,
                               code="invalid_value") from None
            raise APIError(400, str(e), code="invalid_value") from None
        except APIError:
            for s in streams:
                s.abort()
            raise
        except RuntimeError as e:  # the engine is shut down
            for s in streams:
                s.abort()
            raise APIError(503, f"The engine is not running: {e}", type="server_error",
                           code="server_shutting_down") from None
        return _Run(self.state, streams, n, arrival, [len(ids) for ids in prompts])

    @staticmethod
    def _failure(choices: list[Choice], run: _Run) -> APIError | None:
        """The error to answer instead of a body, when a choice failed or was aborted by a shutdown."""
        for c in choices:
            if c.finish_reason == "error":
                return _generation_failed(c.error)
        if any(c.finish_reason == "abort" for c in choices) and not run.client_gone:
            return APIError(503, "The request was aborted because the server is shutting down.",
                            type="server_error", code="server_shutting_down")
        return None

    async def _collect_or_fail(self, request: Request, run: _Run, choices: list[Choice]) -> None:
        """Waits for every choice of a non-streaming request; raises the request's failure, if it had one."""
        try:
            await self._collect(request, run, choices)
        except BaseException:
            run.close()
            raise
        failure = self._failure(choices, run)
        if failure is not None:
            raise failure

    async def _collect(self, request: Request, run: _Run, choices: list[Choice]) -> None:
        watcher = asyncio.create_task(_watch_disconnect(request, run))
        try:
            async for ci, out in run.outputs():
                choices[ci].add(out)
        finally:
            watcher.cancel()
            run.close()

    async def _respond(self, request: Request, req: Any, fmt: ChoiceFormat, id_prefix: str,
                       prompts: list[list[int]], params: list[SamplingParams], n: int, arrival: float,
                       constraint: Constraint | None = None) -> Response:
        """Submits a request's prompts and answers it: the whole response, or its server-sent events with
        ``stream``. The same for both endpoints; ``fmt`` gives what their choices look like."""
        request_id = f"{id_prefix}-{uuid.uuid4().hex}"
        created = int(time.time())
        model = req.model or self.state.model_name
        run = await self._submit(prompts, params, request_id, n, arrival, constraint)
        if self.state.options.log_requests:
            logger.info("request %s: %d prompt(s) of %s tokens, %s", request_id, len(prompts),
                        "/".join(str(len(ids)) for ids in prompts), params[0])
        choices = [Choice(i) for i in range(run.num_choices)]
        prompt_tokens = sum(run.prompt_lens)

        def usage() -> dict[str, int]:
            return _usage(prompt_tokens, sum(c.num_tokens for c in choices), sum(run.num_cached_tokens))

        if not req.stream:
            await self._collect_or_fail(request, run, choices)
            for p, entries in enumerate(run.prompt_logprobs):
                fmt.prompt_scored(p, entries)
            # vLLM's prompt_logprobs: in each choice of /v1/completions, once in the response of a chat.
            wanted = req.prompt_logprobs
            scored = [prompt_logprobs_body(self.state.token_text, ids, entries, wanted) if wanted is not None
                      else None for ids, entries in zip(prompts, run.prompt_logprobs)]
            data = []
            for c in choices:
                content, logprobs = fmt.body(c)
                choice = {"index": c.index, fmt.body_key: content, "logprobs": logprobs,
                          "finish_reason": fmt.finish_reason(c, c.finish_reason), "stop_reason": c.stop_reason}
                if wanted is not None and fmt.object == "text_completion":
                    choice["prompt_logprobs"] = scored[c.index // n]
                data.append(choice)
            body = {"id": request_id, "object": fmt.object, "created": created, "model": model, "choices": data,
                    "usage": usage()}
            if wanted is not None and fmt.object != "text_completion":
                body["prompt_logprobs"] = scored[0]
            return _json_response(body)

        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        # `usage` is null on every chunk but the last when asked for.
        chunk = ChunkEncoder(request_id, fmt.chunk_object, created, model, fmt.delta_key, include_usage).chunk

        async def stream() -> AsyncIterator[bytes]:
            watcher = asyncio.create_task(_watch_disconnect(request, run))
            try:
                for c in choices:
                    first = fmt.first_delta(c)
                    if first is not None:
                        yield chunk(c.index, first)
                # Chunks that are ready together leave in one write: when the event loop runs behind (many streams),
                # a response's deltas of several steps go out in one send instead of one send each.
                ready: list[bytes] = []
                async for ci, out in run.outputs():
                    c = choices[ci]
                    c.add(out)
                    if out.finish_reason == "error":
                        ready.append(_sse(_generation_failed(out.error).body()))
                        break
                    part = fmt.delta(c, out)
                    if part is not None:
                        ready.append(chunk(ci, part[0], part[1], fmt.finish_reason(c, out.finish_reason),
                                           out.stop_reason))
                    if ready and run.queued() == 0:
                        yield b"".join(ready)
                        ready.clear()
                if ready:
                    yield b"".join(ready)
                if include_usage:
                    yield _sse({"id": request_id, "object": fmt.chunk_object, "created": created, "model": model,
                                "choices": [], "usage": usage()})
                yield _sse("[DONE]")
            finally:
                watcher.cancel()
                run.close()

        return _stream_response(stream(), run)

    # ---- /v1/completions

    def _completion_prompts(self, prompt: Any) -> list[tuple[str | None, list[int]]]:
        tok = self.engine.tokenizer
        vocab = int(self.engine.model_config.vocab_size)
        if isinstance(prompt, str):
            items: list[Any] = [prompt]
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            items = [prompt]
        else:
            items = list(prompt)
        if not items:
            raise APIError(400, "Invalid value for 'prompt': the list is empty", param="prompt", code="invalid_value")
        if len(items) > MAX_PROMPTS_PER_REQUEST:
            raise APIError(400, f"Invalid value for 'prompt': at most {MAX_PROMPTS_PER_REQUEST} prompts per request",
                           param="prompt", code="invalid_value")
        out: list[tuple[str | None, list[int]]] = []
        for i, item in enumerate(items):
            where = "prompt" if len(items) == 1 else f"prompt[{i}]"
            if isinstance(item, str):
                if item == "":
                    raise APIError(400, f"Invalid value for '{where}': the prompt is empty", param="prompt",
                                   code="invalid_value")
                out.append((item, tok.encode(item)))
            else:
                ids = list(item)
                if not ids:
                    raise APIError(400, f"Invalid value for '{where}': no token ids", param="prompt",
                                   code="invalid_value")
                bad = [t for t in ids if not 0 <= t < vocab]
                if bad:
                    raise APIError(400, f"Invalid value for '{where}': token ids {bad[:5]} are outside the "
                                        f"vocabulary [0, {vocab})", param="prompt", code="invalid_value")
                out.append((None, ids))
        return out

    async def completions(self, request: Request) -> Response:
        arrival = time.monotonic()
        req, n = await self._parse(request, CompletionRequest, "completions")
        constraint = request_constraint(req)
        prompts = self._completion_prompts(req.prompt)
        if req.truncate_prompt_tokens is not None:  # a truncated prompt echoes its kept tokens' text
            room = req.max_tokens if req.max_tokens is not None else DEFAULT_COMPLETION_MAX_TOKENS
            kept = [self._truncated(ids, req.truncate_prompt_tokens, room) for _, ids in prompts]
            prompts = [(text if len(k) == len(ids) else None, k) for (text, ids), k in zip(prompts, kept)]
        params = []
        echo = bool(req.echo)
        # echo with logprobs scores the prompt too: its tokens' logprobs lead the choice's (what loglikelihood
        # evaluations read, with max_tokens 0 or 1).
        scores_prompt = echo and req.logprobs is not None
        scoring = [v for v in (req.logprobs if scores_prompt else None, req.prompt_logprobs) if v is not None]
        for _, ids in prompts:
            max_tokens = self._max_tokens(req.max_tokens, len(ids), DEFAULT_COMPLETION_MAX_TOKENS, "max_tokens",
                                          bool(scoring))
            params.append(self._sampling_params(req, n, max_tokens, req.logprobs, {},
                                                max(scoring) if scoring else None, constraint))
        tok = self.engine.tokenizer
        echo_texts = [(text if text is not None else tok.decode(ids, skip_special_tokens=False)) if echo else ""
                      for text, ids in prompts]
        fmt = CompletionFormat(self.state.token_text, echo_texts, echo, n, req.logprobs is not None,
                               [ids for _, ids in prompts] if scores_prompt else None)
        return await self._respond(request, req, fmt, "cmpl", [ids for _, ids in prompts], params, n, arrival,
                                   constraint)

    # ---- /v1/chat/completions

    @staticmethod
    def _chat_messages(req: ChatCompletionRequest) -> list[dict[str, Any]]:
        """The messages as the chat template takes them (check_values has checked roles and content parts)."""
        messages = []
        for m in req.messages:
            content: Any = m.content
            if isinstance(content, list):
                content = "\n".join(part.text for part in content)
            message: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": content}
            for key in ("name", "reasoning_content", "tool_calls", "tool_call_id"):
                value = getattr(m, key)
                if value is not None:
                    message[key] = value
            messages.append(message)
        return messages

    def _check_tools(self, req: ChatCompletionRequest) -> None:
        if not req.tools:
            return
        if self.state.options.tool_call_parser is None:
            raise APIError(400, "'tools' is not supported: this server runs with --tool-call-parser none",
                           param="tools", code="unsupported_parameter")
        for i, tool in enumerate(req.tools):
            function = tool.get("function") if isinstance(tool, dict) else None
            if not (isinstance(tool, dict) and tool.get("type") == "function" and isinstance(function, dict)
                    and isinstance(function.get("name"), str) and function["name"]):
                raise APIError(400, f"Invalid value for 'tools[{i}]': expected {{\"type\": \"function\", "
                                    "\"function\": {\"name\": ..., \"parameters\": {...}}}", param="tools",
                               code="invalid_value")
            parameters = function.get("parameters")
            if parameters is not None and not isinstance(parameters, dict):
                raise APIError(400, f"Invalid value for 'tools[{i}].function.parameters': expected a JSON Schema "
                                    "object", param="tools", code="invalid_value")
        name = forced_tool_name(req.tool_choice)
        if name is not None and name not in {tool["function"]["name"] for tool in req.tools}:
            raise APIError(400, f"Invalid value for 'tool_choice': no tool named {name!r} in 'tools'",
                           param="tool_choice", code="invalid_value")

    def _forced_tool_calls(self, req: ChatCompletionRequest, constraint: Constraint | None,
                           reasoning: str | None) -> Constraint | None:
        """For tool_choice "required" or a named function: the grammar that makes the output a tool-call block
        (after R1's reasoning, with a reasoning parser). None for "auto" and "none"."""
        if req.tool_choice in (None, "auto", "none"):
            return None
        what = "a named function" if isinstance(req.tool_choice, dict) else "'required'"
        if constraint is not None:
            raise APIError(400, f"'tool_choice' {what} and '{constraint.param}' both constrain the output; give "
                                "one structured-output constraint per request", param="tool_choice",
                           code="invalid_value")
        token_ids = tool_call_token_ids(self.engine.tokenizer)
        if token_ids is None:
            raise APIError(400, f"'tool_choice' {what} is not supported with this model: its tokenizer lacks "
                                "DeepSeek's tool-call tokens (<｜tool▁calls▁begin｜> ...), which the forced call is "
                                "written with", param="tool_choice", code="unsupported_parameter")
        name = forced_tool_name(req.tool_choice)
        grammar = tool_call_grammar(req.tools, token_ids, form=self.state.options.tool_call_format, name=name,
                                    parallel=name is None and req.parallel_tool_calls is not False,
                                    reasoning=reasoning)
        # A compile error comes from a tool's parameters schema: the grammar around it is this server's.
        return Constraint(StructuredOutputsParams(grammar=grammar), "tools")

    def _render_chat(self, req: ChatCompletionRequest) -> list[int]:
        import jinja2

        messages = self._chat_messages(req)
        kwargs = dict(req.chat_template_kwargs or {})
        if req.tools and req.tool_choice != "none":
            kwargs["tools"] = req.tools  # the template renders them (DeepSeek's lists them in the system turn)
        # The server's --chat-template, unless the request names its own in chat_template_kwargs.
        template = self.state.options.chat_template
        template = {"chat_template": template} if template and "chat_template" not in kwargs else {}
        try:
            return list(self.engine.render_chat(messages, add_generation_prompt=bool(req.add_generation_prompt),
                                                continue_final_message=bool(req.continue_final_message),
                                                chat_template_kwargs=kwargs, **template))
        except (ValueError, jinja2.TemplateError) as e:  # the template's own words (raise_exception) or ours
            raise APIError(400, f"The chat template could not render these messages: {e}", param="messages",
                           code="invalid_value") from None
        except (TypeError, KeyError) as e:  # Python's words about the template's code: logged, not answered
            logger.info("the chat template failed: %s: %s", type(e).__name__, e)
            raise APIError(400, "The chat template could not render these messages: a message lacks a field the "
                                "template reads, or holds a value of another type than it expects",
                           param="messages", code="invalid_value") from None

    async def chat_completions(self, request: Request) -> Response:
        arrival = time.monotonic()
        req, n = await self._parse(request, ChatCompletionRequest, "chat")
        self._check_tools(req)
        constraint = request_constraint(req)
        ids = self._render_chat(req)
        requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        ids = self._truncated(ids, req.truncate_prompt_tokens, requested or 1)
        max_tokens = self._max_tokens(requested, len(ids), None, param, req.prompt_logprobs is not None)
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        parser_cls = self.state.options.reasoning_parser
        opens_reasoning = False
        if parser_cls is not None:
            tail = self.engine.tokenizer.decode(ids[-16:], skip_special_tokens=False)
            opens_reasoning = parser_cls.prompt_opens_reasoning(tail)
        reasoning = None if parser_cls is None else "open" if opens_reasoning else "optional"
        constraint = self._forced_tool_calls(req, constraint, reasoning) or constraint
        params = self._sampling_params(req, n, max_tokens, logprobs, {"logprobs": "top_logprobs"},
                                       req.prompt_logprobs, constraint)
        uses_tools = bool(req.tools) and req.tool_choice != "none"
        role = self.state.options.response_role
        last = self._chat_messages(req)[-1]
        echo_text = (last["content"] or "") if req.echo and last["role"] == role else ""
        fmt = ChatFormat(self.state.token_text, n, bool(req.logprobs), parser_cls, opens_reasoning,
                         self.state.options.tool_call_parser if uses_tools else None,
                         req.parallel_tool_calls is not False, role, echo_text)
        return await self._respond(request, req, fmt, "chatcmpl", [ids], [params], n, arrival, constraint)
