"""DeepSeek tool calls: the parser on the real DeepSeek-V3 token strings (streamed token by token and whole), and
the OpenAI schema through the server's app."""

from __future__ import annotations

import asyncio
import json

import pytest

from deepinfer.server.tool_calls import DeepSeekToolCallParser
from deepinfer.tokenizer import Tokenizer

V3_TWO_CALLS = ("Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
                '{"city": "Paris", "unit": "celsius"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function'
                '<｜tool▁sep｜>get_time\n```json\n{"tz": "CET"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>')
V31_ONE_CALL = ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>{"q": "DeepSeek MLA"}'
                "<｜tool▁call▁end｜><｜tool▁calls▁end｜>")


def streamed(pieces: list[str]) -> tuple[str, list[dict]]:
    """Content and calls rebuilt from the parser's deltas, OpenAI-style (name first, then argument fragments)."""
    parser = DeepSeekToolCallParser()
    content, calls = [], {}
    for piece in pieces:
        c, deltas = parser.feed(piece)
        content.append(c)
        for d in deltas:
            o = d.openai()
            call = calls.setdefault(o["index"], {"id": None, "name": None, "arguments": ""})
            if "id" in o:
                assert call["id"] is None and o["function"]["name"], "the first delta names the call"
                call["id"], call["name"] = o["id"], o["function"]["name"]
            call["arguments"] += o["function"]["arguments"]
    c, deltas = parser.finish()
    content.append(c)
    assert not deltas or all(d.id is None for d in deltas)
    return "".join(content), [calls[i] for i in sorted(calls)]


@pytest.mark.parametrize("text, content, names, arguments", [
    (V3_TWO_CALLS, "Let me check.", ["get_weather", "get_time"],
     [{"city": "Paris", "unit": "celsius"}, {"tz": "CET"}]),
    (V31_ONE_CALL, "", ["search"], [{"q": "DeepSeek MLA"}]),
])
def test_parser_reads_v3_and_v31_streamed_as_whole(text, content, names, arguments):
    tok = Tokenizer.default_deepseek_v3()
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.convert_ids_to_tokens(ids[:1]) in (["<｜tool▁calls▁begin｜>"], ["Let"])  # the real special tokens
    pieces = [tok.decode([i], skip_special_tokens=False) for i in ids]
    assert "".join(pieces) == text
    whole_content, whole_calls = DeepSeekToolCallParser().parse(text)
    assert whole_content == content
    assert [c["function"]["name"] for c in whole_calls] == names
    assert [json.loads(c["function"]["arguments"]) for c in whole_calls] == arguments
    got_content, got_calls = streamed(pieces)
    assert got_content == content
    assert [c["name"] for c in got_calls] == names
    assert [json.loads(c["arguments"]) for c in got_calls] == arguments
    char_content, char_calls = streamed(list(text))
    assert (char_content, [c["arguments"] for c in char_calls]) == (content, [c["arguments"] for c in got_calls])


@pytest.mark.parametrize("text", [
    "no calls at all, just text with ``` fences ```",
    "before <｜tool▁calls▁begin｜>not a call",
    "cut short <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": 1",
])
def test_text_that_is_not_a_complete_call_is_content(text):
    content, calls = DeepSeekToolCallParser().parse(text)
    assert calls == [] and content == text


# ------------------------------------------------------------------------------------------- through the app


def chat(app, body):
    from httpx import ASGITransport, AsyncClient

    async def go():
        async with AsyncClient(transport=ASGITransport(app=app), base_url="http://t") as client:
            return await client.post("/v1/chat/completions", json=body)

    return asyncio.run(go())


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


@pytest.fixture
def tool_app():
    from test_server_units import FakeEngine

    from deepinfer.server.app import create_app

    pieces = ["Let me check.", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_",
              'weather\n```json\n{"city": ', '"Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>']
    engine = FakeEngine(pieces, finish_reason="stop")
    return create_app(engine), engine


def test_tool_calls_in_the_openai_schema(tool_app):
    app, engine = tool_app
    r = chat(app, {"model": "fake-r1", "messages": [{"role": "user", "content": "Weather in Paris?"}],
                   "tools": TOOLS})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    msg = choice["message"]
    assert msg["content"] == "Let me check."
    (call,) = msg["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"]) == {"city": "Paris"}


def test_tool_calls_streamed(tool_app):
    app, _ = tool_app
    r = chat(app, {"model": "fake-r1", "messages": [{"role": "user", "content": "Weather in Paris?"}],
                   "tools": TOOLS, "stream": True})
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert calls[0]["function"]["name"] == "get_weather" and calls[0]["id"].startswith("call_")
    assert json.loads("".join(c["function"]["arguments"] for c in calls)) == {"city": "Paris"}
    assert "".join(d.get("content") or "" for d in deltas) == "Let me check."
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_without_tools_the_text_is_content_and_bad_tools_are_refused(tool_app):
    app, _ = tool_app
    r = chat(app, {"model": "fake-r1", "messages": [{"role": "user", "content": "hi"}]})
    assert "<｜tool▁calls▁begin｜>" in r.json()["choices"][0]["message"]["content"]
    assert r.json()["choices"][0]["finish_reason"] == "stop"
    bad = chat(app, {"model": "fake-r1", "messages": [{"role": "user", "content": "hi"}], "tools": [{"name": "f"}]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tools"
    forced = chat(app, {"model": "fake-r1", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
                        "tool_choice": "required"})
    # A forced call is written with DeepSeek's tool-call tokens, which this stand-in tokenizer lacks.
    assert forced.status_code == 400 and forced.json()["error"]["param"] == "tool_choice"
    assert "tool-call tokens" in forced.json()["error"]["message"]
