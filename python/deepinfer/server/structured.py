"""Structured outputs on the wire: what a request asks its output to follow, as one ``StructuredOutputsParams``.

A request constrains its output through one of

- OpenAI's ``response_format``: ``{"type": "json_object"}`` (any JSON object) or ``{"type": "json_schema",
  "json_schema": {"name", "schema", "strict", "description"}}`` (the schema is always enforced, ``strict`` or not);
- vLLM's ``structured_outputs`` object (``json``, ``regex``, ``choice``, ``grammar``, ``json_object``, with
  ``disable_any_whitespace`` and ``whitespace_pattern``), or its older ``guided_json``, ``guided_regex``,
  ``guided_choice``, ``guided_grammar`` fields (``guided_whitespace_pattern``; ``guided_decoding_backend`` may name
  "auto", "guidance" or "llguidance", what runs here, and nothing else);
- chat's ``tool_choice`` "required" or a named function: a grammar that makes the output a DeepSeek tool-call block
  (see ``tool_call_grammar``).

Two of these at once are refused (400): one output cannot follow two grammars. A constraint's shape is checked here;
its schema or grammar is compiled by the engine when the request is added, and a compile error is a 400 too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from deepinfer.server.protocol import APIError
from deepinfer.structured_outputs import StructuredOutputsParams

__all__ = ["Constraint", "request_constraint", "tool_call_grammar", "tool_call_token_ids", "TOOL_CALL_TOKENS"]

_CONSTRAINT_FIELDS = ("json", "regex", "choice", "grammar", "json_object")
_WHITESPACE_FIELDS = ("disable_any_whitespace", "whitespace_pattern")
_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
# guided_decoding_backend values that name what runs here (llguidance); vLLM's other backends are refused.
GUIDED_BACKENDS = ("auto", "guidance", "llguidance")
_JSON_SCHEMA_KEYS = {"name", "description", "schema", "strict"}

# The markers of DeepSeek-V3's tool-call block (special tokens of its tokenizer).
TOOL_CALL_TOKENS = {"calls_begin": "<｜tool▁calls▁begin｜>", "calls_end": "<｜tool▁calls▁end｜>",
                    "call_begin": "<｜tool▁call▁begin｜>", "call_end": "<｜tool▁call▁end｜>", "sep": "<｜tool▁sep｜>"}


@dataclass
class Constraint:
    """The request's one constraint and the parameter it came from (errors name it)."""

    params: StructuredOutputsParams
    param: str


def _bad(message: str, param: str) -> APIError:
    return APIError(400, message, param=param, code="invalid_value")


def _from_response_format(rf: Any) -> tuple[dict[str, Any], str] | None:
    """response_format -> (StructuredOutputsParams fields, param), or None for text."""
    if not isinstance(rf, dict):
        raise _bad("Invalid value for 'response_format': expected an object such as {\"type\": \"json_object\"}",
                   "response_format")
    kind = rf.get("type")
    extra = set(rf) - {"type", "json_schema"}
    if extra:
        raise APIError(400, f"Unrecognized request argument supplied: response_format.{sorted(extra)[0]}",
                       param=f"response_format.{sorted(extra)[0]}", code="unknown_parameter")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}, "response_format"
    if kind == "json_schema":
        js = rf.get("json_schema")
        if js is None:
            raise APIError(400, "Missing required parameter: 'response_format.json_schema'",
                           param="response_format.json_schema", code="missing_required_parameter")
        if not isinstance(js, dict):
            raise _bad("Invalid value for 'response_format.json_schema': expected an object with 'name' and "
                       "'schema'", "response_format.json_schema")
        extra = set(js) - _JSON_SCHEMA_KEYS
        if extra:
            name = f"response_format.json_schema.{sorted(extra)[0]}"
            raise APIError(400, f"Unrecognized request argument supplied: {name}", param=name,
                           code="unknown_parameter")
        if "name" not in js:
            raise APIError(400, "Missing required parameter: 'response_format.json_schema.name'",
                           param="response_format.json_schema.name", code="missing_required_parameter")
        if not isinstance(js["name"], str) or not js["name"]:
            raise _bad("Invalid value for 'response_format.json_schema.name': expected a non-empty string",
                       "response_format.json_schema.name")
        if "schema" not in js:
            raise APIError(400, "Missing required parameter: 'response_format.json_schema.schema' (the JSON Schema "
                                "the output follows)",
                           param="response_format.json_schema.schema", code="missing_required_parameter")
        if not isinstance(js["schema"], dict):
            raise _bad("Invalid value for 'response_format.json_schema.schema': expected a JSON Schema object",
                       "response_format.json_schema.schema")
        for key, types in (("strict", (bool,)), ("description", (str,))):
            if js.get(key) is not None and not isinstance(js[key], types):
                raise _bad(f"Invalid type for 'response_format.json_schema.{key}': expected a "
                           f"{'boolean' if key == 'strict' else 'string'}", f"response_format.json_schema.{key}")
        return {"json": js["schema"]}, "response_format.json_schema.schema"
    if kind is None:
        raise APIError(400, "Missing required parameter: 'response_format.type'", param="response_format.type",
                       code="missing_required_parameter")
    if kind == "structural_tag":
        raise APIError(400, "'response_format' of type 'structural_tag' (vLLM's) is not supported: use "
                            "'json_schema', or structured_outputs' 'grammar'", param="response_format.type",
                       code="unsupported_parameter")
    raise _bad(f"Invalid value for 'response_format.type': {kind!r}; supported: 'text', 'json_object', "
               "'json_schema'", "response_format.type")


def request_constraint(req: Any) -> Constraint | None:
    """The constraint a request's fields ask for (None: free text). Raises a 400 for a malformed one and for two
    at once. ``tool_choice`` is not looked at here (see serving.py)."""
    found: list[tuple[dict[str, Any], str]] = []
    rf = getattr(req, "response_format", None)
    if rf is not None:
        got = _from_response_format(rf)
        if got is not None:
            found.append(got)
    whitespace: dict[str, Any] = {}
    so = getattr(req, "structured_outputs", None)
    if so is not None:
        unknown = sorted(set(so) - set(_CONSTRAINT_FIELDS) - set(_WHITESPACE_FIELDS))
        if unknown:
            raise _bad(f"Invalid value for 'structured_outputs': unknown fields {unknown}; known: "
                       f"{sorted(_CONSTRAINT_FIELDS + _WHITESPACE_FIELDS)}", "structured_outputs")
        whitespace = {k: so[k] for k in _WHITESPACE_FIELDS if so.get(k) is not None}
        set_fields = [k for k in _CONSTRAINT_FIELDS if so.get(k) not in (None, False)]
        for k in set_fields:
            found.append(({k: so[k]}, f"structured_outputs.{k}"))
    for name, key in _GUIDED.items():
        value = getattr(req, name, None)
        if value is not None:
            found.append(({key: value}, name))
    pattern = getattr(req, "guided_whitespace_pattern", None)
    if pattern is not None:
        whitespace.setdefault("whitespace_pattern", pattern)
    backend = getattr(req, "guided_decoding_backend", None)
    if backend is not None and backend not in GUIDED_BACKENDS:
        raise APIError(400, f"'guided_decoding_backend' {backend!r} is not available: this server's structured "
                            f"outputs run on llguidance (give one of {list(GUIDED_BACKENDS)}, or leave it out)",
                       param="guided_decoding_backend", code="unsupported_parameter")
    if not found:
        if so is not None:
            raise _bad("Invalid value for 'structured_outputs': set one of json, regex, choice, grammar, json_object",
                       "structured_outputs")
        return None
    if len(found) > 1:
        names = [p for _, p in found]
        raise APIError(400, f"{' and '.join(repr(n) for n in names)} both constrain the output; give one "
                            "structured-output constraint per request", param=names[1], code="invalid_value")
    fields, param = found[0]
    try:
        params = StructuredOutputsParams(**fields, **whitespace)
    except (ValueError, TypeError) as e:
        raise _bad(f"Invalid value for '{param}': {e}", param) from None
    return Constraint(params, param)


# ----------------------------------------------------------------------------------------------- tool calls


def tool_call_token_ids(tokenizer: Any) -> dict[str, int] | None:
    """The ids of DeepSeek's tool-call markers in ``tokenizer``; None when it lacks any of them."""
    convert = getattr(tokenizer, "convert_tokens_to_ids", None)
    if convert is None:
        return None
    ids: dict[str, int] = {}
    for key, token in TOOL_CALL_TOKENS.items():
        try:
            token_id = convert(token)
        except Exception:
            return None
        if not isinstance(token_id, int) or token_id < 0:
            return None
        ids[key] = token_id
    return ids


def _lark_str(text: str) -> str:
    # Lark string literals take JSON's escapes, so any string is one literal.
    return json.dumps(text, ensure_ascii=False)


def _arguments_schema(tool: dict[str, Any]) -> dict[str, Any]:
    params = tool["function"].get("parameters")
    schema = params if isinstance(params, dict) and params else {"type": "object"}
    if "x-guidance" in schema:
        return schema
    # The compact layout of JSON outputs (", " and ": "), as StructuredOutputsParams lays them out by default.
    return {**schema, "x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}}


def tool_call_grammar(tools: list[dict[str, Any]], token_ids: dict[str, int], *, form: str = "deepseek_v3",
                      name: str | None = None, parallel: bool = True, reasoning: str | None = None) -> str:
    """A Lark grammar (llguidance's dialect) whose outputs are one DeepSeek tool-call block:

        <｜tool▁calls▁begin｜> CALL ("\\n"? CALL)* <｜tool▁calls▁end｜>      (one CALL unless ``parallel``)
        CALL (deepseek_v3):  <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\nARGS\\n```<｜tool▁call▁end｜>
        CALL (deepseek_v31): <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>

    NAME is one of the tools' names (only ``name`` when given) and ARGS is JSON valid against that tool's
    ``parameters`` schema (embedded with ``%json``; a tool without parameters takes any object). The markers are
    the tokenizer's special tokens, referred to by id (``token_ids``). ``reasoning`` puts R1's reasoning first:
    "open" (the prompt opened a ``<think>`` block: free text up to ``</think>``), "optional" (the output may start
    with a ``<think>...</think>`` block) or None.
    """
    t = {key: f"<[{value}]>" for key, value in token_ids.items()}
    chosen = [tool for tool in tools if name is None or tool["function"]["name"] == name]
    lines = []
    calls = f"{t['calls_begin']} call " + (f'("\\n"? call)* ' if parallel and name is None else "") + t["calls_end"]
    if reasoning == "open":
        lines.append(f"start: think WS {calls}")
    elif reasoning == "optional":
        lines.append(f'start: ("<think>" think WS)? {calls}')
    else:
        lines.append(f"start: {calls}")
    if reasoning is not None:
        # A lazy rule ends at the first "</think>"; up to 4 whitespace characters may follow (R1 writes "\n\n").
        lines.append('think[lazy]: /(.|\\n)*/ "</think>"')
        lines.append("WS: /[ \\t\\r\\n]{0,4}/")
    lines.append("call: " + " | ".join(f"call_{i}" for i in range(len(chosen))))
    for i, tool in enumerate(chosen):
        fn = tool["function"]["name"]
        if form == "deepseek_v31":
            head = f"{t['call_begin']} {_lark_str(fn)} {t['sep']}"
            tail = t["call_end"]
        else:
            head = f"{t['call_begin']} \"function\" {t['sep']} {_lark_str(fn + chr(10) + '```json' + chr(10))}"
            tail = f"{_lark_str(chr(10) + '```')} {t['call_end']}"
        lines.append(f"call_{i}: {head} args_{i} {tail}")
        lines.append(f"args_{i}: %json {json.dumps(_arguments_schema(tool), ensure_ascii=False)}")
    return "\n".join(lines) + "\n"
