"""Structured outputs: the constraint a request's output follows, as vLLM names it (``StructuredOutputsParams``), turned
into the grammar the C++ engine's matcher (llguidance) takes. Exactly one of the fields is set."""

from __future__ import annotations

import json as _json
from dataclasses import dataclass, fields
from typing import Any, Sequence

from deepinfer import _deepinfer

# OpenAI's json_object mode: any JSON object.
_ANY_OBJECT = {"type": "object"}


@dataclass
class StructuredOutputsParams:
    json: str | dict[str, Any] | None = None  # a JSON Schema (object or its text)
    regex: str | None = None                  # the whole output matches it (Rust regex syntax)
    choice: Sequence[str] | None = None       # the output is exactly one of these strings
    grammar: str | None = None                # a Lark grammar (llguidance's dialect) or GBNF (converted to Lark)
    json_object: bool | None = None           # any JSON object
    # JSON's whitespace (vLLM's names). By default a JSON output is laid out as ', ' and ': ' with no other whitespace:
    # a grammar that allows any whitespace lets a weak or greedy model emit newlines until max_tokens. A schema's own
    # "x-guidance" options (llguidance's) take precedence over both.
    disable_any_whitespace: bool = True
    whitespace_pattern: str | None = None     # a regex for the whitespace allowed between JSON tokens

    _CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object")

    def __post_init__(self) -> None:
        set_fields = [name for name in self._CONSTRAINTS if getattr(self, name) not in (None, False)]
        if len(set_fields) != 1:
            raise ValueError("structured_outputs: set exactly one of json, regex, choice, grammar, json_object; got "
                             + (", ".join(set_fields) if set_fields else "none"))
        if self.json is not None and not isinstance(self.json, (str, dict)):
            raise ValueError(f"structured_outputs.json must be a JSON Schema (an object or its text), "
                             f"got {type(self.json).__name__}")
        if isinstance(self.json, str):
            try:
                parsed = _json.loads(self.json)
            except ValueError as e:
                raise ValueError(f"structured_outputs.json is not valid JSON: {e}") from None
            if not isinstance(parsed, (dict, bool)):
                raise ValueError("structured_outputs.json must be a JSON Schema object")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f"structured_outputs.{name} must be a non-empty string")
        if self.choice is not None:
            if isinstance(self.choice, str) or not all(isinstance(c, str) for c in self.choice) or not self.choice:
                raise ValueError("structured_outputs.choice must be a non-empty list of strings")
            self.choice = list(self.choice)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StructuredOutputsParams":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"structured_outputs: unknown fields {sorted(unknown)}; known: {sorted(known)}")
        return cls(**d)

    def to_core(self) -> "_deepinfer.GrammarSpec":
        spec = _deepinfer.GrammarSpec()
        if self.json is not None or self.json_object:
            schema = _ANY_OBJECT if self.json is None else _json.loads(self.json) if isinstance(self.json, str) \
                else self.json
            spec.kind, spec.text = _deepinfer.GrammarKind.json_schema, _json.dumps(self._with_whitespace(schema))
        elif self.regex is not None:
            spec.kind, spec.text = _deepinfer.GrammarKind.regex, self.regex
        elif self.choice is not None:
            # Lark string literals take JSON's escapes, so any string is one literal.
            spec.kind = _deepinfer.GrammarKind.lark
            spec.text = "start: " + " | ".join(_json.dumps(c, ensure_ascii=False) for c in self.choice) + "\n"
        else:
            spec.kind, spec.text = _deepinfer.GrammarKind.lark, _lark(self.grammar or "")
        return spec


    def _with_whitespace(self, schema: Any) -> Any:
        if not isinstance(schema, dict) or "x-guidance" in schema:
            return schema
        if self.whitespace_pattern is not None:
            options = {"whitespace_pattern": self.whitespace_pattern}
        elif self.disable_any_whitespace:
            options = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
        else:
            options = {"whitespace_flexible": True}
        return {**schema, "x-guidance": options}


def _lark(grammar: str) -> str:
    """A Lark grammar as given; a GBNF one (``root ::= ...``, llama.cpp's and xgrammar's form) through llguidance's own
    converter."""
    if "::=" not in grammar:
        return grammar
    try:
        from llguidance.gbnf_to_lark import gbnf_to_lark
    except ImportError as e:
        raise ValueError("structured_outputs.grammar in GBNF needs the llguidance package (pip install llguidance)") \
            from e
    try:
        return gbnf_to_lark(grammar)
    except Exception as e:  # the converter raises its own error types
        raise ValueError(f"structured_outputs.grammar: not a valid GBNF grammar: {e}") from None


def grammar_library() -> str:
    """The llguidance wheel's shared library, whose C interface the engine opens; empty when it is not installed."""
    try:
        import llguidance._lib as lib
    except ImportError:
        return ""
    return str(lib.__file__)
