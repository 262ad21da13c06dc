"""The OpenAI wire format: request models (validated strictly), errors, and parameter policy.

Requests are validated here, in three passes. First the raw JSON object is checked against parameters that OpenAI
defines but this server does not implement (logit_bias, audio, the deprecated functions, ...): those are refused
with a 400 that names the parameter, never silently dropped. Then the object is validated by a strict pydantic model
(no type coercion, unknown keys refused), so a string where a number belongs is an error, not a guess. Last,
``check_values`` checks what the types do not say (n's range; chat's logprobs options, token limits, roles and
content parts). What needs the engine (the model's name, the prompt's tokens against the vocabulary and the context,
the chat template) is checked where the request is tokenized, in serving.py.
"""

from __future__ import annotations

from typing import Any, Callable, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from deepinfer.sampling_params import MAX_LOGPROBS

__all__ = [
    "APIError",
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "StreamOptions",
    "MAX_N",
    "check_text",
    "check_unsupported",
    "check_values",
    "error_body",
    "validation_error",
]


MAX_N = 128  # completions per prompt
_CHAT_ROLES = {"system", "developer", "user", "assistant", "tool"}


# ----------------------------------------------------------------------------------------------- errors


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | int | None = None) -> dict[str, Any]:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class APIError(Exception):
    """An error answered to the client in OpenAI's schema."""

    def __init__(self, status_code: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)

    @classmethod
    def bad_request(cls, message: str, param: str | None = None, code: str | None = None) -> "APIError":
        return cls(400, message, param=param, code=code)


# ----------------------------------------------------------------------------------------------- models


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: Optional[bool] = False
    # Random padding against length side channels on OpenAI's service; it never changes content, so accepting it
    # and sending no padding is faithful.
    include_obfuscation: Optional[bool] = None


class _SamplingRequest(_Strict):
    """Fields shared by /v1/completions and /v1/chat/completions (OpenAI's, then vLLM-compatible extensions)."""

    model: Optional[str] = None
    frequency_penalty: Optional[float] = None
    presence_penalty: Optional[float] = None
    max_tokens: Optional[int] = None
    n: Optional[int] = 1
    seed: Optional[int] = None
    stop: Union[str, list[str], None] = None
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    # Accepted and without effect on the output (end-user tags, routing hints of OpenAI's service).
    user: Optional[str] = None
    metadata: Optional[dict[str, str]] = None
    service_tier: Optional[str] = None
    safety_identifier: Optional[str] = None
    prompt_cache_key: Optional[str] = None
    store: Optional[bool] = None
    # Extensions (the names vLLM and SGLang use).
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    repetition_penalty: Optional[float] = None
    min_tokens: Optional[int] = None
    ignore_eos: Optional[bool] = None
    stop_token_ids: Optional[list[int]] = None
    include_stop_str_in_output: Optional[bool] = None
    skip_special_tokens: Optional[bool] = None
    # Structured outputs (structured.py turns these into the request's one constraint): OpenAI's response_format,
    # vLLM's structured_outputs and its older guided_* fields.
    response_format: Optional[dict[str, Any]] = None
    structured_outputs: Optional[dict[str, Any]] = None
    guided_json: Union[dict[str, Any], str, None] = None
    guided_regex: Optional[str] = None
    guided_choice: Optional[list[str]] = None
    guided_grammar: Optional[str] = None
    guided_whitespace_pattern: Optional[str] = None
    guided_decoding_backend: Optional[str] = None
    # vLLM's request extensions: the prompt tokens' logprobs (top N a position), keeping only the prompt's last
    # tokens (-1: as many as fit beside max_tokens), and the scheduling priority (only 0 here: first come, first
    # served).
    prompt_logprobs: Optional[int] = None
    truncate_prompt_tokens: Optional[int] = None
    priority: Optional[int] = None


class CompletionRequest(_SamplingRequest):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    echo: Optional[bool] = False
    logprobs: Optional[int] = None
    best_of: Optional[int] = None
    suffix: Optional[str] = None
    logit_bias: Optional[dict[str, float]] = None


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    type: str
    text: Optional[str] = None


class ChatMessage(_Strict):
    role: str
    content: Union[str, list[ContentPart], None] = None
    name: Optional[str] = None
    reasoning_content: Optional[str] = None
    tool_calls: Optional[list[dict[str, Any]]] = None
    tool_call_id: Optional[str] = None
    refusal: Optional[str] = None


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = None
    logprobs: Optional[bool] = False
    top_logprobs: Optional[int] = None
    logit_bias: Optional[dict[str, float]] = None
    parallel_tool_calls: Optional[bool] = None
    tools: Optional[list[Any]] = None
    tool_choice: Optional[Any] = None  # "auto", "none", "required" or {"type": "function", "function": {"name"}}
    # The deprecated function-calling fields: only the values that ask for nothing get past check_unsupported.
    functions: Optional[list[Any]] = None
    function_call: Optional[Any] = None
    modalities: Optional[list[str]] = None
    # Extensions.
    chat_template_kwargs: Optional[dict[str, Any]] = None
    add_generation_prompt: Optional[bool] = True
    # The reply continues the conversation's final (assistant) message instead of starting a new one; needs
    # add_generation_prompt false.
    continue_final_message: Optional[bool] = False
    # The reply's content starts with the final message's when that message has the reply's role.
    echo: Optional[bool] = False


# ----------------------------------------------------------------------------------------------- policy

_NO_TOOLS = ("is not supported: use 'tools' (the deprecated function-calling fields are not implemented)")

# parameter -> (is the given value one this server cannot honour?, why). A value of None counts as absent.
_Check = tuple[Callable[[Any], bool], str]

_UNSUPPORTED_CHAT: dict[str, _Check] = {
    "functions": (lambda v: v != [], _NO_TOOLS),
    "function_call": (lambda v: v != "none", _NO_TOOLS),
    "logit_bias": (lambda v: v != {}, "is not supported yet"),
    "audio": (lambda v: True, "is not supported: this model produces text only"),
    "modalities": (lambda v: v != ["text"], "is not supported: this model produces text only"),
    "prediction": (lambda v: True, "(predicted outputs) is not supported"),
    "web_search_options": (lambda v: True, "is not supported: this server has no web search"),
    "reasoning_effort": (lambda v: True, "is not supported: DeepSeek models do not take a reasoning effort"),
    "verbosity": (lambda v: True, "is not supported"),
    "store": (lambda v: v is not False, "is not supported: this server does not store completions"),
    "best_of": (lambda v: True, "is not supported for chat completions"),
}

_UNSUPPORTED_COMPLETIONS: dict[str, _Check] = {
    "suffix": (lambda v: v != "", "is not supported: DeepSeek V2/V3 checkpoints have no fill-in-the-middle "
                                  "suffix mode here"),
    "logit_bias": (lambda v: v != {}, "is not supported yet"),
    "store": (lambda v: v is not False, "is not supported: this server does not store completions"),
}


def _lone_surrogate(value: Any, path: str) -> tuple[str, int, str] | None:
    """(JSON path, character index, the surrogate) of the first string in ``value`` holding a lone UTF-16
    surrogate (JSON lets "\\ud800" through; it is no Unicode text), or None."""
    if isinstance(value, str):
        for i, ch in enumerate(value):
            if "\ud800" <= ch <= "\udfff":
                return path, i, f"\\u{ord(ch):04x}"
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _lone_surrogate(item, f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else key)
        if found is not None:
            return found
    return None


def check_text(body: dict[str, Any]) -> None:
    """Raises a 400 naming the first string of the request that is not Unicode text (a lone surrogate)."""
    found = _lone_surrogate(body, "")
    if found is not None:
        path, index, char = found
        raise APIError(400, f"Invalid value for '{path}': character {index} is a lone UTF-16 surrogate ({char}), "
                            "which is not Unicode text", param=path, code="invalid_value")


def check_unsupported(body: dict[str, Any], endpoint: Literal["chat", "completions"]) -> None:
    """Raises a 400 naming the first parameter the request sets to a value this server cannot honour."""
    table = _UNSUPPORTED_CHAT if endpoint == "chat" else _UNSUPPORTED_COMPLETIONS
    for name, (unsupported, why) in table.items():
        value = body.get(name)
        if value is None:
            continue
        if unsupported(value):
            raise APIError(400, f"'{name}' {why}", param=name, code="unsupported_parameter")
    if endpoint == "completions":
        best_of, n = body.get("best_of"), body.get("n")
        n = n if isinstance(n, int) and not isinstance(n, bool) else 1
        if isinstance(best_of, int) and not isinstance(best_of, bool) and best_of not in (1, n):
            raise APIError(400, f"'best_of'={best_of} is not supported: server-side ranking of candidates is not "
                                "implemented (use best_of=n, or n to get every candidate)",
                           param="best_of", code="unsupported_parameter")
        if body.get("echo") is True and body.get("logprobs") is not None and body.get("stream") is True:
            raise APIError(400, "'echo' with 'logprobs' is answered whole, not streamed: the prompt's logprobs come "
                                "once the prompt is computed (leave 'stream' out)", param="stream",
                           code="unsupported_parameter")
    stream_options = body.get("stream_options")
    if stream_options is not None and body.get("stream") is not True:
        raise APIError(400, "'stream_options' is only allowed when 'stream' is true", param="stream_options")


# ----------------------------------------------------------------------------------------------- values


def check_values(req: CompletionRequest | ChatCompletionRequest, max_logprobs: int = MAX_LOGPROBS) -> int:
    """Raises a 400 for the first value of a (model-validated) request that its types allow but the API does not;
    returns the request's n. ``max_logprobs`` is the server's --max-logprobs."""
    n = 1 if req.n is None else req.n
    if not 1 <= n <= MAX_N:
        raise APIError(400, f"Invalid value for 'n': must be between 1 and {MAX_N}, got {n}", param="n",
                       code="invalid_value")
    _check_logprobs("prompt_logprobs", req.prompt_logprobs, max_logprobs)
    if req.prompt_logprobs is not None and req.stream:
        raise APIError(400, "'prompt_logprobs' is answered whole, not streamed: the prompt's logprobs come with the "
                            "response; send the request without 'stream'", param="prompt_logprobs",
                       code="invalid_value")
    t = req.truncate_prompt_tokens
    if t is not None and not (t >= 1 or t == -1):
        raise APIError(400, "Invalid value for 'truncate_prompt_tokens': must be at least 1 (keep the prompt's last "
                            f"so many tokens) or -1 (as many as fit beside max_tokens), got {t}",
                       param="truncate_prompt_tokens", code="invalid_value")
    if req.priority not in (None, 0):
        raise APIError(400, f"'priority' {req.priority} is not supported: this server schedules first come, first "
                            "served (only priority 0)", param="priority", code="unsupported_parameter")
    if isinstance(req, ChatCompletionRequest):
        _check_chat_values(req, max_logprobs)
    else:
        _check_logprobs("logprobs", req.logprobs, max_logprobs)
    return n


def _check_logprobs(param: str, value: int | None, max_logprobs: int) -> None:
    if value is not None and not 0 <= value <= max_logprobs:
        limit = "" if max_logprobs == MAX_LOGPROBS else " (this server's --max-logprobs)"
        raise APIError(400, f"Invalid value for '{param}': must be between 0 and {max_logprobs}{limit}, got {value}",
                       param=param, code="invalid_value")


def _check_chat_values(req: ChatCompletionRequest, max_logprobs: int) -> None:
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "'top_logprobs' requires 'logprobs' to be true", param="top_logprobs",
                       code="invalid_value")
    _check_logprobs("top_logprobs", req.top_logprobs, max_logprobs)
    if req.max_tokens is not None and req.max_completion_tokens is not None \
            and req.max_tokens != req.max_completion_tokens:
        raise APIError(400, "Give 'max_completion_tokens' or 'max_tokens', not two different values",
                       param="max_tokens", code="invalid_value")
    _check_tool_choice(req)
    if req.continue_final_message and req.add_generation_prompt:
        raise APIError(400, "'continue_final_message' continues the final message, 'add_generation_prompt' starts a "
                            "new one: set 'add_generation_prompt' to false", param="continue_final_message",
                       code="invalid_value")
    if req.continue_final_message and req.messages[-1].role != "assistant":
        raise APIError(400, "'continue_final_message' needs the final message to be the assistant's, got role "
                            f"{req.messages[-1].role!r}", param="continue_final_message", code="invalid_value")
    for i, m in enumerate(req.messages):
        if m.role not in _CHAT_ROLES:
            raise APIError(400, f"Invalid value for 'messages[{i}].role': {m.role!r}; expected one of "
                                f"{sorted(_CHAT_ROLES)}", param=f"messages[{i}].role", code="invalid_value")
        if m.content is None and not (m.role == "assistant" and (m.tool_calls or m.refusal is not None)):
            raise APIError(400, f"Invalid value for 'messages[{i}].content': null is allowed only for an assistant "
                                "message with 'tool_calls'", param=f"messages[{i}].content", code="invalid_value")
        if isinstance(m.content, list):
            for j, part in enumerate(m.content):
                if part.type == "text" and part.text is None:
                    raise APIError(400, f"Invalid value for 'messages[{i}].content[{j}]': a text part needs its "
                                        "'text'", param=f"messages[{i}].content[{j}].text", code="invalid_value")
                if part.type != "text":
                    raise APIError(400, f"Content parts of type {part.type!r} are not supported: this model "
                                        "takes text only", param=f"messages[{i}].content[{j}].type",
                                   code="unsupported_parameter")


def forced_tool_name(tool_choice: Any) -> str | None:
    """The function a (checked) named tool_choice forces; None for the string values."""
    return tool_choice["function"]["name"] if isinstance(tool_choice, dict) else None


def _check_tool_choice(req: ChatCompletionRequest) -> None:
    tc = req.tool_choice
    if tc is None:
        return
    if isinstance(tc, str):
        if tc not in ("auto", "none", "required"):
            raise APIError(400, f"Invalid value for 'tool_choice': {tc!r}; expected 'auto', 'none', 'required' or "
                                "{\"type\": \"function\", \"function\": {\"name\": ...}}", param="tool_choice",
                           code="invalid_value")
    else:
        function = tc.get("function") if isinstance(tc, dict) else None
        if not (isinstance(tc, dict) and tc.get("type") == "function" and set(tc) <= {"type", "function"}
                and isinstance(function, dict) and set(function) == {"name"}
                and isinstance(function["name"], str) and function["name"]):
            raise APIError(400, "Invalid value for 'tool_choice': a named tool choice is {\"type\": \"function\", "
                                "\"function\": {\"name\": ...}}", param="tool_choice", code="invalid_value")
    if tc not in ("auto", "none") and not req.tools:
        raise APIError(400, "'tool_choice' 'required' or a named function needs 'tools'", param="tool_choice",
                       code="invalid_value")


# ----------------------------------------------------------------------------------------------- validation

_UNION_EXPECTED = {
    "prompt": "a string, a list of strings, a list of token ids or a list of lists of token ids",
    "stop": "a string or a list of strings",
    "content": "a string or a list of content parts",
}

_FIELD_NAMES = frozenset(
    name for model in (CompletionRequest, ChatCompletionRequest, ChatMessage, ContentPart, StreamOptions)
    for name in model.model_fields
)


def _param_path(loc: tuple[Any, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif isinstance(part, str) and (part in _FIELD_NAMES or not path):
            path += f".{part}" if path else part
        # else: a union member's tag such as 'list[int]'; not part of the parameter's path
    return path


def validation_error(exc: ValidationError) -> APIError:
    """The first problem of a pydantic ValidationError as an OpenAI 400."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = tuple(first.get("loc", ()))
    param = _param_path(loc) or None
    if first.get("type") == "extra_forbidden":
        return APIError(400, f"Unrecognized request argument supplied: {param}", param=param,
                        code="unknown_parameter")
    if first.get("type") == "missing":
        return APIError(400, f"Missing required parameter: '{param}'", param=param, code="missing_required_parameter")
    leaf = next((p for p in reversed(loc) if isinstance(p, str) and p in _UNION_EXPECTED), None)
    same_param = [e for e in errors if _param_path(tuple(e.get("loc", ()))) == param]
    if leaf is not None and len(same_param) > 1:
        message = f"Invalid type for '{param}': expected {_UNION_EXPECTED[leaf]}"
    else:
        got = first.get("input")
        shown = repr(got) if len(repr(got)) <= 60 else repr(got)[:57] + "..."
        message = f"Invalid value for '{param}': {first.get('msg', 'invalid')} (got {shown})"
    return APIError(400, message, param=param, code="invalid_value" if "type" not in first.get("type", "")
                    else "invalid_type")
