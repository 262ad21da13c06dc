"""Server pieces without a server process: the DeepSeek-R1 reasoning parser, the serve command's options, and the
HTTP app over a scripted stand-in engine (outputs the real model never writes: <think> blocks, engine errors)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random

import pytest

from conftest import require_module

require_module("fastapi")
require_module("prometheus_client")
require_module("yaml")
httpx = require_module("httpx")

from deepinfer.config import EngineConfig, QuantizationConfig  # noqa: E402
from deepinfer.outputs import CompletionOutput, RequestOutput  # noqa: E402
from deepinfer.server import create_app  # noqa: E402
from deepinfer.server.cli import add_serve_arguments, resolve_serve_options, run_serve  # noqa: E402
from deepinfer.server.reasoning import DeepSeekR1ReasoningParser, get_reasoning_parser  # noqa: E402

# ----------------------------------------------------------------------------------------------- reasoning parser


def feed_all(pieces, opens=False):
    parser = DeepSeekR1ReasoningParser(prompt_opens_reasoning=opens)
    reasoning, content = "", ""
    for piece in pieces:
        r, c = parser.feed(piece)
        reasoning, content = reasoning + r, content + c
    r, c = parser.finish()
    return reasoning + r, content + c, parser.saw_reasoning


def splits(text):
    """The text in one piece, char by char, at every single split point, and in random chunks."""
    yield [text]
    yield list(text)
    for i in range(1, len(text)):
        yield [text[:i], text[i:]]
    rng = random.Random(0)
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(text)), min(4, len(text) - 1)))
        yield [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]


@pytest.mark.parametrize("text,opens,reasoning,content", [
    ("<think>\nLet me think.\n</think>\n\nThe answer is 4.", False, "Let me think.\n", "The answer is 4."),
    ("  <think>abc</think>xyz", False, "abc", "xyz"),
    ("Let me think.</think>\n\nFour.", True, "Let me think.", "Four."),
    ("\nLet me think.</think>Four.", True, "Let me think.", "Four."),
    ("Just an answer, no thinking.", False, None, "Just an answer, no thinking."),
    ("Text with </think> but no opening tag", False, None, "Text with </think> but no opening tag"),
    ("<think>unfinished reasoning", False, "unfinished reasoning", None),
    ("<think>cut inside the tag </thi", False, "cut inside the tag </thi", None),
    ("still thinking", True, "still thinking", None),
    ("<thinking> is not the tag", False, None, "<thinking> is not the tag"),
    ("<thi", False, None, "<thi"),
    ("<think></think>only content", False, "", "only content"),
    ("a < b </think> c < d", True, "a < b ", "c < d"),
])
def test_reasoning_parser(text, opens, reasoning, content):
    one_shot = DeepSeekR1ReasoningParser(prompt_opens_reasoning=opens).parse(text)
    assert one_shot == (reasoning, content)
    for pieces in splits(text):
        r, c, saw = feed_all(pieces, opens)
        assert (r if saw else None, c or None) == (reasoning, content), pieces


def test_reasoning_parser_streams_without_waiting_for_the_end():
    parser = DeepSeekR1ReasoningParser()
    assert parser.feed("<thi") == ("", "")          # could still be the tag
    assert parser.feed("nk>\nStep one. ") == ("Step one. ", "")
    assert parser.feed("Step two.</") == ("Step two.", "")  # "</" held back: it may start </think>
    assert parser.feed("think>\n\nDone") == ("", "Done")
    assert parser.feed(" now.") == ("", " now.")
    assert parser.finish() == ("", "")


def test_prompt_opens_reasoning():
    opens = DeepSeekR1ReasoningParser.prompt_opens_reasoning
    assert opens("<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜><think>\n")
    assert opens("...<think>")
    assert not opens("<｜User｜>hi<｜Assistant｜>")
    assert not opens("<think>x</think>\n")
    assert get_reasoning_parser("deepseek-r1") is DeepSeekR1ReasoningParser
    assert get_reasoning_parser(None) is None
    with pytest.raises(ValueError, match="unknown reasoning parser"):
        get_reasoning_parser("qwen3")


# ----------------------------------------------------------------------------------------------- serve options


def parse(*argv):
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser.parse_args(list(argv))


def test_every_engine_config_field_has_a_flag():
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    dests = {a.dest for a in parser._actions}
    for f in dataclasses.fields(EngineConfig):
        assert f.name in dests, f"EngineConfig.{f.name} has no serve flag"
    options = {o for a in parser._actions for o in a.option_strings}
    for flag in ("--model", "--host", "--port", "--api-key", "--served-model-name", "--config", "--reasoning-parser",
                 "--max-queue-size", "--quantization", "--quantization-config", "--max-model-len"):
        assert flag in options


def test_flags_become_engine_config():
    args = parse("--model", "/models/v2-lite", "--max-model-len", "4096", "--enforce-eager", "--no-trust-remote-code",
                 "--cache-memory-gb", "2.5", "--quantization", "fp8", "--served-model-name", "ds", "--port", "9000",
                 "--max-queue-size", "7", "--seed", "3", "--load-format", "dummy", "--tokenizer", "none")
    engine, server = resolve_serve_options(args)
    assert engine == {"model_name_or_path": "/models/v2-lite", "max_model_len": 4096, "enforce_eager": True,
                      "trust_remote_code": False, "cache_memory_gb": 2.5, "quantization": "fp8",
                      "served_model_name": "ds", "seed": 3, "load_format": "dummy", "tokenizer": None}
    assert server["port"] == 9000 and server["max_queue_size"] == 7 and server["host"] == "127.0.0.1"
    config = EngineConfig.from_dict(engine)
    assert config.quantization == QuantizationConfig(method="fp8")
    # Nothing given: defaults only, and EngineConfig's own defaults apply.
    engine, server = resolve_serve_options(parse())
    assert engine == {} and server["port"] == 8000 and server["api_key"] is None
    assert EngineConfig.from_dict(engine) == EngineConfig()


def test_yaml_config_and_flag_override(tmp_path, monkeypatch):
    monkeypatch.delenv("DEEPINFER_API_KEY", raising=False)
    path = tmp_path / "serve.yaml"
    path.write_text(
        "model: /models/r1\n"
        "max-model-len: 8192\n"
        "max_num_seqs: 32\n"
        "page_size: 32\n"
        "port: 7000\n"
        "api_key: from-file\n"
        "reasoning_parser: deepseek-r1\n"
        "quantization_config:\n"
        "  method: fp8\n"
        "  weight_bits: 8\n"
        "  activation_bits: 8\n"
        "  group_size: 128\n"
        "  fuse_quant_dequant: false\n")
    engine, server = resolve_serve_options(parse("--config", str(path), "--max-model-len", "2048", "--port", "7001"))
    assert engine["model_name_or_path"] == "/models/r1"
    assert engine["max_model_len"] == 2048          # the flag wins
    assert engine["max_num_seqs"] == 32 and engine["page_size"] == 32
    assert server["port"] == 7001 and server["api_key"] == "from-file" and server["reasoning_parser"] == "deepseek-r1"
    config = EngineConfig.from_dict(engine)
    assert config.quantization == QuantizationConfig(method="fp8", weight_bits=8, activation_bits=8, group_size=128,
                                                     fuse_quant_dequant=False)
    # A quantization flag replaces the file's quantization_config block.
    engine, _ = resolve_serve_options(parse("--config", str(path), "--quantization", "none"))
    assert "quantization_config" not in engine and EngineConfig.from_dict(engine).quantization is None
    engine, _ = resolve_serve_options(parse("--config", str(path), "--quantization-config", '{"group_size": 64}'))
    assert engine["quantization_config"] == {"group_size": 64}


def test_bad_config_files(tmp_path, monkeypatch):
    monkeypatch.setenv("DEEPINFER_API_KEY", "from-env")
    _, server = resolve_serve_options(parse())
    assert server["api_key"] == "from-env"
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("max_model_len: 1024\nmax_modle_len: 5\n")
    with pytest.raises(ValueError, match="max_modle_len"):
        resolve_serve_options(parse("--config", str(unknown)))
    not_mapping = tmp_path / "list.yaml"
    not_mapping.write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="mapping"):
        resolve_serve_options(parse("--config", str(not_mapping)))
    bad_port = tmp_path / "port.yaml"
    bad_port.write_text("port: eighty\n")
    with pytest.raises(ValueError, match="port"):
        resolve_serve_options(parse("--config", str(bad_port)))
    # run_serve reports bad options and bad engine values with exit status 2, before loading anything.
    assert run_serve(parse("--config", str(unknown))) == 2
    assert run_serve(parse("--page-size", "0")) == 2
    assert run_serve(parse("--config", str(tmp_path / "missing.yaml"))) == 2


def test_serve_takes_the_model_as_a_positional_argument(tmp_path):
    engine, _ = resolve_serve_options(parse("/models/v2-lite", "--port", "9000"))
    assert engine == {"model_name_or_path": "/models/v2-lite"}
    engine, _ = resolve_serve_options(parse("--max-model-len", "64", "/models/v2-lite"))
    assert engine == {"model_name_or_path": "/models/v2-lite", "max_model_len": 64}
    # The same model both ways is fine; two different ones are an error naming both.
    engine, _ = resolve_serve_options(parse("/models/a", "--model", "/models/a"))
    assert engine == {"model_name_or_path": "/models/a"}
    with pytest.raises(ValueError, match=r"'/models/a' \(positional MODEL\) and '/models/b' \(--model\)"):
        resolve_serve_options(parse("/models/a", "--model", "/models/b"))
    assert run_serve(parse("/models/a", "--model", "/models/b")) == 2
    # Like every flag, the positional model overrides a --config file's.
    path = tmp_path / "serve.yaml"
    path.write_text("model: /models/from-file\n")
    engine, _ = resolve_serve_options(parse("--config", str(path), "/models/given"))
    assert engine == {"model_name_or_path": "/models/given"}


def test_non_finite_numbers_in_options_and_configs_are_refused(tmp_path):
    from deepinfer.sampling_params import SamplingParams

    path = tmp_path / "nan.yaml"
    path.write_text("shutdown_timeout: .nan\n")
    with pytest.raises(ValueError, match="shutdown_timeout must be a finite number"):
        resolve_serve_options(parse("--config", str(path)))
    for name, value in (("gpu_memory_utilization", float("nan")), ("cache_memory_gb", float("inf")),
                        ("cache_memory_gb", float("nan"))):
        with pytest.raises(ValueError, match=name):
            EngineConfig(**{name: value})
    for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"):
        for value in (float("nan"), float("inf")):
            with pytest.raises(ValueError, match=f"{name} must be a finite number"):
                SamplingParams(**{name: value})


def test_a_port_in_use_fails_before_loading_naming_the_port():
    import socket

    from deepinfer.server.cli import bind_listen_socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=rf"127\.0\.0\.1:{port}: the address is already in use.*--port"):
            bind_listen_socket("127.0.0.1", port)
    sock = bind_listen_socket("127.0.0.1", port)  # free again: bound, and not accepting until uvicorn serves
    try:
        assert sock.getsockname()[1] == port
    finally:
        sock.close()


# ----------------------------------------------------------------------------------------------- app over a stand-in


class FakeTokenizer:
    """One token per character."""

    def encode(self, text, add_special_tokens=True):
        return [ord(ch) for ch in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)

    def convert_ids_to_tokens(self, token_id):
        return None


class FakeStream:
    def __init__(self, request_id, n, script, finish_reason, error):
        self.request_id, self.n, self.script = request_id, n, script
        self.finish_reason, self.error = finish_reason, error
        self.aborted = False

    def abort(self):
        self.aborted = True

    async def __aiter__(self):
        for step, piece in enumerate(self.script):
            await asyncio.sleep(0)
            last = step == len(self.script) - 1
            for i in range(self.n):
                finish = ("abort" if self.aborted else self.finish_reason) if last else None
                out = CompletionOutput(index=i, text=piece, token_ids=[ord(piece[0]) if piece else 32],
                                       finish_reason=finish, error=self.error if finish == "error" else None)
                yield RequestOutput(request_id=self.request_id, prompt=None, prompt_token_ids=[1], outputs=[out],
                                    finished=last)


class FakeEngine:
    served_model_name = "fake-r1"
    max_model_len = 512

    class model_config:
        vocab_size = 1 << 21

    def __init__(self, script, template_suffix="", finish_reason="length", error=None):
        self.tokenizer = FakeTokenizer()
        self.script, self.template_suffix = script, template_suffix
        self.finish_reason, self.error = finish_reason, error
        self.streams = []

    def render_chat(self, messages, add_generation_prompt=True, chat_template_kwargs=None,
                    continue_final_message=False):
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>" + self.template_suffix
        return self.tokenizer.encode(text)

    def submit(self, prompt, params, loop=None, request_id=None):
        stream = FakeStream(request_id, params.n, self.script, self.finish_reason, self.error)
        self.streams.append(stream)
        return stream

    def stats(self):
        return type("Stats", (), dict(num_running=0, num_waiting=0, num_cache_pages=10, num_free_cache_pages=10,
                                      num_preemptions=0, num_steps=0, num_prompt_tokens_computed=0,
                                      num_generated_tokens=0, step_seconds=0.0, num_decode_steps=0,
                                      decode_step_seconds=0.0, prefix_cache_queries=0, prefix_cache_hits=0,
                                      num_grammar_masks=0, grammar_mask_seconds=0.0,
                                      alive=True))()


def call(app, path, body):
    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.post(path, json=body)

    return asyncio.run(go())


def sse(response):
    events = [line[len("data: "):] for line in response.text.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


THINKING = ["<th", "ink>\n", "Two and ", "two.</th", "ink>\n\n", "Four", "."]


def test_reasoning_content_in_output():
    app = create_app(FakeEngine(THINKING), reasoning_parser="deepseek-r1")
    chat = {"model": "fake-r1", "messages": [{"role": "user", "content": "2+2?"}], "n": 2}
    body = call(app, "/v1/chat/completions", chat).json()
    for choice in body["choices"]:
        assert choice["message"] == {"role": "assistant", "reasoning_content": "Two and two.", "content": "Four."}
    events = sse(call(app, "/v1/chat/completions", {**chat, "stream": True}))
    for index in (0, 1):
        deltas = [e["choices"][0]["delta"] for e in events if e["choices"][0]["index"] == index]
        assert deltas[0] == {"role": "assistant", "content": ""}
        assert "".join(d.get("reasoning_content", "") for d in deltas) == "Two and two."
        assert "".join(d.get("content", "") for d in deltas) == "Four."
        # Reasoning streams before the answer, never mixed into content.
        first_content = next(i for i, d in enumerate(deltas) if d.get("content"))
        assert all("reasoning_content" not in d for d in deltas[first_content:])
    # Without the parser the tags are plain text.
    plain = create_app(FakeEngine(THINKING))
    message = call(plain, "/v1/chat/completions", chat).json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "".join(THINKING)}


def test_reasoning_opened_by_the_template():
    engine = FakeEngine(["I ponder", " deeply", "</think>", "\n\nYes."], template_suffix="<think>\n")
    app = create_app(engine, reasoning_parser="deepseek-r1")
    chat = {"messages": [{"role": "user", "content": "?"}]}
    message = call(app, "/v1/chat/completions", chat).json()["choices"][0]["message"]
    assert message == {"role": "assistant", "reasoning_content": "I ponder deeply", "content": "Yes."}
    events = sse(call(app, "/v1/chat/completions", {**chat, "stream": True}))
    deltas = [e["choices"][0]["delta"] for e in events]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "I ponder deeply"
    assert "".join(d.get("content", "") for d in deltas) == "Yes."


def test_engine_errors_are_server_errors():
    engine = FakeEngine(["partial", " output"], finish_reason="error", error="out of cache pages")
    app = create_app(engine)
    r = call(app, "/v1/completions", {"prompt": "hi"})
    assert r.status_code == 500
    err = r.json()["error"]
    assert err["type"] == "server_error" and "out of cache pages" in err["message"]
    events = sse(call(app, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True}))
    assert "out of cache pages" in events[-1]["error"]["message"]


def test_shutdown_abort_is_503_for_non_streaming():
    app = create_app(FakeEngine(["a", "b"], finish_reason="abort"))
    r = call(app, "/v1/completions", {"prompt": "hi"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "server_shutting_down"


def test_draining_refuses_new_requests():
    app = create_app(FakeEngine(["a"]))
    app.state.server.begin_drain()
    r = call(app, "/v1/completions", {"prompt": "hi"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "server_shutting_down"

    async def health():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            return await client.get("/health")

    assert asyncio.run(health()).status_code == 503


def test_apps_have_their_own_metrics_and_names():
    a = create_app(FakeEngine(["x"]), served_model_name=["alias-1", "alias-2"])
    b = create_app(FakeEngine(["y"]))  # a second app in the same process: no registry clash
    assert call(a, "/v1/completions", {"model": "alias-2", "prompt": "hi"}).status_code == 200
    assert call(a, "/v1/completions", {"model": "fake-r1", "prompt": "hi"}).status_code == 404
    assert call(b, "/v1/completions", {"model": "fake-r1", "prompt": "hi"}).status_code == 200

    async def metrics(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            return (await client.get("/metrics")).text

    text_a, text_b = asyncio.run(metrics(a)), asyncio.run(metrics(b))
    assert 'deepinfer_request_finished_total{finish_reason="length",model_name="alias-1"} 1.0' in text_a
    assert 'model_name="fake-r1"' in text_b and "alias-1" not in text_b
    with pytest.raises(ValueError):
        create_app(FakeEngine(["x"]), max_queue=0)


def test_unset_sampling_values_come_from_the_generation_config():
    class RecordingEngine(FakeEngine):
        def submit(self, prompt, params, loop=None, request_id=None):
            self.params.append(params)
            return super().submit(prompt, params, loop=loop, request_id=request_id)

    engine = RecordingEngine(["ok"])
    engine.params = []
    engine.generation_defaults = {"temperature": 0.6, "top_p": 0.95, "max_tokens": 7}
    app = create_app(engine)
    assert call(app, "/v1/completions", {"model": "fake-r1", "prompt": "hi"}).status_code == 200
    assert call(app, "/v1/completions", {"model": "fake-r1", "prompt": "hi", "temperature": 0.1,
                                         "max_tokens": 3}).status_code == 200
    assert call(app, "/v1/chat/completions", {"model": "fake-r1", "messages": [{"role": "user", "content": "x"}],
                                              "top_p": 0.5}).status_code == 200
    first, second, chat = engine.params
    assert (first.temperature, first.top_p) == (0.6, 0.95)
    assert (second.temperature, second.top_p, second.max_tokens) == (0.1, 0.95, 3)  # what the request sets wins
    assert (chat.temperature, chat.top_p) == (0.6, 0.5)


def test_cors_is_off_by_default_and_follows_allowed_origins():
    async def preflight_and_get(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            pre = await client.options("/v1/completions", headers={
                "Origin": "https://app.example", "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type"})
            got = await client.get("/v1/models", headers={"Origin": "https://app.example"})
            other = await client.get("/v1/models", headers={"Origin": "https://evil.example"})
            return pre, got, other

    pre, got, other = asyncio.run(preflight_and_get(create_app(FakeEngine(["a"]))))
    assert "access-control-allow-origin" not in got.headers and pre.status_code == 405
    app = create_app(FakeEngine(["a"]), allowed_origins=["https://app.example"], allow_credentials=True)
    pre, got, other = asyncio.run(preflight_and_get(app))
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "https://app.example"
    assert "POST" in pre.headers["access-control-allow-methods"]
    assert got.status_code == 200 and got.headers["access-control-allow-origin"] == "https://app.example"
    assert got.headers["access-control-allow-credentials"] == "true"
    assert "access-control-allow-origin" not in other.headers

    _, server = resolve_serve_options(parse("--allowed-origins", "https://a.example", "*", "--allow-credentials"))
    assert server["allowed_origins"] == ["https://a.example", "*"] and server["allow_credentials"] is True
    _, server = resolve_serve_options(parse())
    assert server["allowed_origins"] == [] and server["allow_credentials"] is False


def test_an_engine_that_stops_ends_the_server_with_its_reason(caplog):
    """A parallel engine whose rank failed cannot step again: the server exits with status 1, logging the engine's
    reason (which names the rank), instead of answering every request with an error."""
    import logging
    import time

    from deepinfer.server.app import create_app
    from deepinfer.server.cli import bind_listen_socket, serve_app

    class DyingEngine(FakeEngine):
        def __init__(self):
            super().__init__(["x"])
            self.dies_at = time.monotonic() + 1.0
            self.shut = False

        def stats(self):
            s = super().stats()
            if time.monotonic() >= self.dies_at:
                s.alive, s.failure = False, "the engine stopped: rank 1 of 2 failed: CUDA error: an illegal memory access"
            return s

        def shutdown(self):
            self.shut = True

    engine = DyingEngine()
    app = create_app(engine)
    sock = bind_listen_socket("127.0.0.1", 0)
    server = {"host": "127.0.0.1", "port": sock.getsockname()[1], "log_level": "warning", "access_log": False,
              "shutdown_timeout": 2}
    started = time.monotonic()
    with caplog.at_level(logging.CRITICAL):
        assert serve_app(app, engine, server, sock) == 1
    assert time.monotonic() - started < 20
    assert engine.shut
    assert any("rank 1 of 2 failed" in r.getMessage() and "the server stops" in r.getMessage() for r in caplog.records)


def test_an_internal_error_answers_no_python_internals():
    """An exception the server did not foresee answers 500 with an id the log has, not the exception's text."""
    class Broken(FakeEngine):
        def submit(self, prompt, params, loop=None, request_id=None):
            raise TypeError("unsupported operand type(s) for +: 'NoneType' and 'int'")

    async def go():
        # The app's own handler answers; the transport must not re-raise the exception to the test.
        transport = httpx.ASGITransport(app=create_app(Broken(["x"])), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.post("/v1/completions", json={"model": "fake-r1", "prompt": "hi", "max_tokens": 2})

    r = asyncio.run(go())
    assert r.status_code == 500
    err = r.json()["error"]
    assert err["code"] == "internal_error" and "logged on the server as" in err["message"]
    assert "NoneType" not in err["message"] and "TypeError" not in err["message"]


def test_a_template_type_error_is_not_answered_in_pythons_words():
    class BadTemplate(FakeEngine):
        def render_chat(self, messages, **kwargs):
            raise TypeError('can only concatenate str (not "NoneType") to str')

    r = call(create_app(BadTemplate(["x"])), "/v1/chat/completions",
             {"model": "fake-r1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "messages" and "NoneType" not in err["message"]



def test_chunks_ready_together_leave_in_one_write():
    """Deltas that arrive while the response is still writing earlier ones go out in one body write (the stream
    forwards its whole script at once, as the engine's streams forward a step's deltas); the events are the same."""
    class Burst(FakeStream):
        def forward_to(self, q, tag):  # as the engine's streams: every delta of the script already there
            for step, piece in enumerate(self.script):
                last = step == len(self.script) - 1
                out = CompletionOutput(index=0, text=piece, token_ids=[ord(piece)], finish_reason="length" if last
                                       else None)
                q.put_nowait((tag, RequestOutput(request_id=self.request_id, prompt=None, prompt_token_ids=[1],
                                                 outputs=[out], finished=last)))
            q.put_nowait((tag, None))

    class BurstEngine(FakeEngine):
        def submit(self, prompt, params, loop=None, request_id=None):
            return Burst(request_id, params.n, self.script, self.finish_reason, self.error)

    app = create_app(BurstEngine(["a", "b", "c", "d", "e", "f"]))
    body = {"model": "fake-r1", "prompt": "hi", "max_tokens": 6, "stream": True}

    async def go():
        writes: list[bytes] = []
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"",
                 "root_path": "", "headers": [(b"content-type", b"application/json"), (b"host", b"test")],
                 "client": ("127.0.0.1", 1), "server": ("test", 80)}
        sent = False

        async def receive():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}
            await asyncio.sleep(3600)  # the client stays connected
            return {"type": "http.disconnect"}

        async def send(message):
            if message["type"] == "http.response.body" and message.get("body"):
                writes.append(message["body"])

        await app(scope, receive, send)
        return writes

    writes = asyncio.run(go())
    text = b"".join(writes).decode()
    events = [line[len("data: "):] for line in text.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == "abcdef"
    assert len(writes) < len(events)  # several events a write


# ----------------------------------------------------------------------------------------------- server-sent events

def test_a_chunk_is_the_bytes_json_dumps_makes_of_it():
    """The encoder splices a choice between fields encoded once: the bytes must be json.dumps' own for every kind of
    value a chunk carries (escapes, non-ASCII, nested deltas and logprobs, integer stop reasons)."""
    import json

    from deepinfer.server.sse import ChunkEncoder

    contents = ["", "plain", 'quote " and \\ backslash', "tab\tnew\nline\x00\x1f", "ünïcödé 日本語 🙂 \u2028",
                {"role": "assistant", "content": "hi"}, {"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]},
                None]
    logprobs = [None, {"tokens": ["a"], "token_logprobs": [-0.5], "top_logprobs": [{"a": -0.5}], "text_offset": [0]}]
    for usage in (False, True):
        for key in ("text", "delta"):
            encoder = ChunkEncoder('cmpl-"x"', "text_completion", 1700000000, "deepseek/ü", key, usage)
            for i, (content, lp, reason, stop) in enumerate(
                    [(c, lp, r, s) for c in contents for lp in logprobs for r in (None, "stop")
                     for s in (None, 128, "\n\nUser:")]):
                want = {"id": 'cmpl-"x"', "object": "text_completion", "created": 1700000000, "model": "deepseek/ü",
                        "choices": [{"index": i, key: content, "logprobs": lp, "finish_reason": reason,
                                     "stop_reason": stop}]}
                if usage:
                    want["usage"] = None
                expected = f"data: {json.dumps(want, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()
                assert encoder.chunk(i, content, lp, reason, stop) == expected


def test_the_inbox_hands_its_items_over_in_order_and_wakes_its_reader():
    import asyncio

    from deepinfer.server.sse import Inbox

    async def main():
        inbox = Inbox()
        inbox.put_nowait(1)
        assert inbox.qsize() == 1 and await inbox.get() == 1
        reader = asyncio.ensure_future(inbox.get())
        await asyncio.sleep(0)  # the reader waits on an empty inbox
        for item in (2, 3, 4):
            inbox.put_nowait(item)
        assert await reader == 2
        assert [await inbox.get(), await inbox.get()] == [3, 4] and inbox.qsize() == 0
        late = asyncio.ensure_future(inbox.get())
        await asyncio.sleep(0)
        asyncio.get_running_loop().call_soon(inbox.put_nowait, 5)  # from a callback, as the engine delivers
        assert await asyncio.wait_for(late, 1) == 5

    asyncio.run(main())


# ---------------------------------------------------------------------------------------------- per-token metrics

def _samples(text: str, name: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples if s.name.startswith(name)}


def test_the_loop_metrics_expose_what_prometheus_client_would():
    # The same observations through prometheus_client's Histogram and Counter and through the loop's lock-free ones:
    # the same samples on /metrics (bucket counts, count, sum, the counter's total), bounds included (le is <=).
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
    from deepinfer.server.loop_metrics import LoopCounter, LoopHistogram, LoopMetricsCollector
    buckets = (0.001, 0.005, 0.01, 0.5)
    values = [0.0005, 0.001, 0.003, 0.003, 0.02, 0.5, 7.0] + [random.Random(3).random() for _ in range(50)]
    ref_registry, loop_registry = CollectorRegistry(), CollectorRegistry()
    ref = Histogram("x_seconds", "doc", ["model_name"], buckets=buckets, registry=ref_registry).labels("m")
    ref_tokens = Counter("x_tokens", "doc", ["model_name"], registry=ref_registry).labels("m")
    loop, loop_tokens = LoopHistogram("x_seconds", "doc", buckets), LoopCounter("x_tokens", "doc")
    loop_registry.register(LoopMetricsCollector([loop, loop_tokens], "m"))
    for i, v in enumerate(values):
        k = 1 + i % 3  # k tokens in one delta: k gaps of the same value
        for _ in range(k):
            ref.observe(v)
        loop.observe(v, k)
        ref_tokens.inc(k)
        loop_tokens.inc(k)
    want = _samples(generate_latest(ref_registry).decode(), "x_")
    got = _samples(generate_latest(loop_registry).decode(), "x_")
    want = {k: v for k, v in want.items() if not k[0].endswith("_created")}
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-12), key
