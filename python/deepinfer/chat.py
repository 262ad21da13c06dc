"""Chat-template rendering, compatible with Hugging Face ``apply_chat_template``.

Chat templates ship with checkpoints (``tokenizer_config.json``'s ``chat_template`` or a
``chat_template.jinja`` file) and are Jinja2 programs. A prompt rendered here must be the exact
string that ``transformers``' ``tokenizer.apply_chat_template(..., tokenize=False)`` produces, so
the environment reproduces what templates written for transformers rely on:

* a sandboxed, immutable Jinja2 environment with ``trim_blocks`` and ``lstrip_blocks`` on and the
  ``loopcontrols`` extension (``{% break %}`` / ``{% continue %}``);
* globals ``raise_exception(msg)``, ``strftime_now(fmt)``, ``namespace(...)`` (refusing
  underscore-prefixed attribute names) and ``dict(...)``;
* a ``tojson`` filter that does *not* HTML-escape and accepts ``indent``, ``separators``,
  ``sort_keys`` and ``ensure_ascii`` (default ``False``);
* a ``{% generation %}...{% endgeneration %}`` block tag (rendered as its body), so templates made
  for assistant-mask training still compile;
* variables ``messages``, ``tools``, ``documents``, ``add_generation_prompt``, the special tokens
  (``bos_token``, ``eos_token``, ...) and any extra keyword arguments (which override the tokens).

Inputs are rebuilt from plain JSON types before the template sees them (pydantic models and
dataclasses become dicts, anything else exotic becomes an inert ``"<TypeName>"`` string), and a
message's reasoning given as ``reasoning_content``, ``thinking`` or ``reasoning`` is visible under
both ``reasoning_content`` and ``thinking``, as in transformers.

One deliberate difference: transformers 5.x drops message keys whose value is ``None`` before
rendering. DeepSeek's templates test ``message['content'] is none`` to recognise an assistant
turn that only carries tool calls (the OpenAI wire format sends ``"content": null`` there), and
dropping the key makes those templates fail with an undefined-variable error. ``None`` values are
therefore kept, which is what transformers 4.x (the release DeepSeek wrote the templates against)
and transformers' own lower-level ``render_jinja_template`` do.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

__all__ = [
    "ChatTemplateError",
    "compile_chat_template",
    "render_chat_template",
    "select_chat_template",
]

_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class ChatTemplateError(ValueError):
    """A chat template is missing, ambiguous, or raised an error while rendering."""


# --------------------------------------------------------------------------------------------
# Template selection


def select_chat_template(
    templates: str | Mapping[str, str] | None,
    chat_template: str | None = None,
    tools: Sequence[Any] | None = None,
    *,
    source: str = "the tokenizer",
) -> str:
    """Pick the template source to render.

    ``templates`` is what a checkpoint provides: one template string, a mapping of named
    templates (``{"default": ..., "tool_use": ...}``) or ``None``. ``chat_template`` is an
    explicit choice from the caller: the name of one of the named templates, or a template
    string. With named templates and no explicit choice, ``tool_use`` is taken when tools are
    given and it exists, else ``default``.
    """
    if isinstance(templates, Mapping):
        if chat_template is not None:
            return templates.get(chat_template, chat_template)
        if tools is not None and "tool_use" in templates:
            return templates["tool_use"]
        if "default" in templates:
            return templates["default"]
        raise ChatTemplateError(
            f"{source} has several chat templates and none is named 'default'; pass "
            f"chat_template=<name> with one of {sorted(templates)}"
        )
    if chat_template is not None:
        return chat_template
    if templates is None:
        raise ChatTemplateError(
            f"{source} has no chat template (no 'chat_template' in tokenizer_config.json and no "
            "chat_template.jinja); pass chat_template=<jinja source> or send a plain prompt"
        )
    return templates


# --------------------------------------------------------------------------------------------
# The Jinja environment


def _raise_exception(message: str) -> None:
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | str | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _DictFactory:
    """``dict(...)`` and ``dict.fromkeys(...)`` inside templates, without exposing the type."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:3]:
        leading = re.match(r"\d+", piece)
        if leading is None:
            break
        parts.append(int(leading.group()))
    return tuple(parts)


@lru_cache(maxsize=1)
def _environment():
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    import jinja2.utils
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    if _version_tuple(jinja2.__version__) < (3, 1, 6):
        raise ImportError(
            f"jinja2>=3.1.6 is required to render chat templates (found {jinja2.__version__}); "
            "older releases have known sandbox escapes"
        )

    class GenerationBlock(jinja2.ext.Extension):
        """``{% generation %}body{% endgeneration %}`` renders as ``body``."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

        def _render_body(self, caller):
            return caller()

    class Namespace(jinja2.utils.Namespace):
        """``namespace(...)`` that refuses dunder / private attribute names."""

        def __init__(*args, **kwargs):  # noqa: N805 - same calling convention as jinja's Namespace
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for key in attrs:
                Namespace._check(key)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, key, value):
            Namespace._check(key)
            jinja2.utils.Namespace.__setitem__(self, key, value)

        @staticmethod
        def _check(key):
            if isinstance(key, str) and key.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"chat templates may not set underscore-prefixed namespace attributes ({key!r})"
                )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _DictFactory()
    env.globals["namespace"] = Namespace
    return env


@lru_cache(maxsize=64)
def compile_chat_template(source: str):
    """Compile a template source (cached: checkpoints reuse one template for every request)."""
    import jinja2

    try:
        return _environment().from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat template does not compile: {e} (line {e.lineno})") from e


# --------------------------------------------------------------------------------------------
# Inputs


def _plain(value: Any) -> Any:
    """Rebuild ``value`` out of plain JSON-like types (the sandbox only ever sees those)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    item = getattr(value, "item", None)
    if callable(item) and type(value).__module__.startswith("numpy"):
        return _plain(item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return _plain(dump())
    return f"<{type(value).__name__}>"


def _tool_schemas(tools: Sequence[Any] | None) -> list | None:
    if tools is None:
        return None
    schemas = []
    for tool in tools:
        if isinstance(tool, Mapping):
            schemas.append(tool)
        elif inspect.isfunction(tool) or inspect.ismethod(tool):
            try:
                from transformers.utils import get_json_schema
            except ImportError as e:  # pragma: no cover - depends on the environment
                raise ValueError(
                    "tools given as Python functions need transformers installed to derive their JSON "
                    "schema; pass JSON schemas (dicts) instead"
                ) from e
            schemas.append(get_json_schema(tool))
        else:
            raise ValueError(
                f"a tool must be a JSON schema (dict) or a documented Python function, got {type(tool).__name__}"
            )
    return schemas


def _messages(conversation: Any) -> list[dict]:
    messages = getattr(conversation, "messages", conversation)
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TypeError(f"messages must be a list of dicts, got {type(messages).__name__}")
    if len(messages) == 0:
        raise ValueError("cannot apply a chat template to an empty conversation")
    out = []
    for m in _plain(list(messages)):
        if not isinstance(m, dict):
            raise TypeError(f"each chat message must be a dict (or dataclass / pydantic model), got {m!r}")
        reasoning = next((m[k] for k in _REASONING_KEYS if m.get(k) is not None), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        out.append(m)
    return out


# --------------------------------------------------------------------------------------------
# Rendering


def render_chat_template(
    template: str,
    messages: Any,
    *,
    add_generation_prompt: bool = False,
    tools: Sequence[Any] | None = None,
    documents: Sequence[Mapping[str, Any]] | None = None,
    continue_final_message: bool | str = False,
    special_tokens: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> str:
    """Render ``messages`` with the Jinja ``template`` source; returns the prompt string.

    ``special_tokens`` supplies ``bos_token``, ``eos_token``, ... (extra ``kwargs`` override them).
    ``continue_final_message`` (``True`` or the field name to continue, e.g. ``"reasoning_content"``)
    renders the last message open-ended, cut right after its text, for assistant prefill; it cannot
    be combined with ``add_generation_prompt``.
    """
    import jinja2

    if continue_final_message and add_generation_prompt:
        raise ValueError("continue_final_message and add_generation_prompt cannot be used together")
    compiled = compile_chat_template(template)
    chat = _messages(messages)
    tool_schemas = _plain(_tool_schemas(tools))
    if documents is not None:
        for doc in documents:
            if not isinstance(doc, Mapping):
                raise TypeError("documents must be a list of dicts (with 'title' and 'text' keys)")
    documents = _plain(documents)
    variables = _plain({**(special_tokens or {}), **kwargs})

    continued = None
    if continue_final_message:
        field = continue_final_message if isinstance(continue_final_message, str) else "content"
        last = chat[-1]
        continued = last.get(field)
        if continued is None:
            raise ValueError(f"continue_final_message: the final message has no {field!r} to continue")
        fields = [field]
        if field in _REASONING_KEYS:
            fields = [k for k in _REASONING_KEYS if last.get(k) == continued]
        if not any(f in template for f in fields):
            raise ValueError(f"continue_final_message: the chat template never reads {field!r}")
        if isinstance(continued, (list, tuple)):
            for block in reversed(continued):
                if isinstance(block, dict) and "text" in block:
                    continued = block["text"]
                    block["text"] = block["text"] + _CONTINUE_TAG
                    break
            else:
                raise ValueError("continue_final_message: no text block to continue in the final message")
        else:
            for f in fields:
                last[f] = last[f] + _CONTINUE_TAG

    try:
        rendered = compiled.render(
            messages=chat,
            tools=tool_schemas,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            **variables,
        )
    except jinja2.exceptions.TemplateError as e:
        raise ChatTemplateError(f"chat template failed to render: {e}") from e

    if continued is not None:
        tag = _CONTINUE_TAG.strip()
        if continued.strip() not in rendered or tag not in rendered:
            raise ValueError(
                "continue_final_message: the template dropped (part of) the final message, so it cannot "
                "be continued"
            )
        at = rendered.rindex(tag)
        if rendered[at:at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
            rendered = rendered[:at]
        else:  # the template trimmed trailing whitespace after the message
            rendered = rendered[:at].rstrip()
    return rendered
