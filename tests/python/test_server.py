"""The OpenAI-compatible server, end to end: a real `deepinfer serve` process on a free localhost port, talked to
with the official `openai` client (sync and async, streaming and not) and with raw HTTP for malformed input.

The embedded default model serves; its outputs are never assumed, only compared with themselves (greedy decoding
is deterministic, also across batch compositions).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import require_module

httpx = require_module("httpx")
openai = require_module("openai")
require_module("fastapi")
require_module("uvicorn")
require_module("prometheus_client")
require_module("yaml")

import deepinfer  # noqa: E402
from deepinfer.build_info import build_info  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

API_KEY = "sk-deepinfer-test"
MAX_MODEL_LEN = 1024
HOST = "127.0.0.1"


# ----------------------------------------------------------------------------------------------- harness


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def serve_env() -> dict[str, str]:
    """The environment of a `deepinfer serve` child: this deepinfer package first on PYTHONPATH, the rest kept (the
    compiled extension may come from there)."""
    env = dict(os.environ)
    package_root = str(Path(deepinfer.__file__).resolve().parents[1])
    env["PYTHONPATH"] = package_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["DEEPINFER_NO_PROGRESS"] = "1"
    env.pop("DEEPINFER_API_KEY", None)
    return env


class ServerProcess:
    """`python -m deepinfer.cli serve ...` on a free port of 127.0.0.1, its output in a temporary file; ``scheme`` and
    ``verify`` (what httpx trusts) for a server started with --ssl-* flags. After stop(), ``final_output`` holds its
    whole output."""

    def __init__(self, *args: str, scheme: str = "http", verify: object = True) -> None:
        self.port = free_port()
        self.base_url = f"{scheme}://{HOST}:{self.port}"
        self.verify = verify
        self.final_output = ""
        env = serve_env()
        self._log = tempfile.NamedTemporaryFile(prefix="deepinfer-serve-", suffix=".log", delete=False)
        cmd = [sys.executable, "-m", "deepinfer.cli", "serve", "--host", HOST, "--port", str(self.port),
               "--no-access-log", *args]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env)

    def output(self) -> str:
        self._log.flush()
        return Path(self._log.name).read_text(errors="replace")

    def wait_ready(self, timeout: float = 120.0) -> "ServerProcess":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2.0, verify=self.verify).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the server did not become healthy in {timeout}s:\n{self.output()}")

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.final_output = self.output()
        self._log.close()
        try:
            os.unlink(self._log.name)
        except OSError:
            pass
        return self.proc.returncode


def metrics(base_url: str) -> dict[str, float]:
    """name -> value, with non-model labels in the key: 'deepinfer_request_finished_total{finish_reason=stop}'."""
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = {k: v for k, v in sample.labels.items() if k != "model_name"}
            key = sample.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())) + "}" if labels else "")
            out[key] = sample.value
    return out


def wait_idle(base_url: str, timeout: float = 20.0) -> dict[str, float]:
    """Waits until nothing runs or waits and every cache page is free again; returns the metrics then."""
    deadline = time.monotonic() + timeout
    m: dict[str, float] = {}
    while time.monotonic() < deadline:
        m = metrics(base_url)
        if (m["deepinfer_num_requests_running"] == 0 and m["deepinfer_num_requests_waiting"] == 0
                and m["deepinfer_cache_pages_free"] == m["deepinfer_cache_pages_total"]):
            return m
        time.sleep(0.05)
    raise AssertionError(f"the engine did not become idle with every page free: {m}")


def m_running(base_url: str) -> float:
    return metrics(base_url)["deepinfer_num_requests_running"]


def finished(m: dict[str, float], reason: str) -> float:
    return m.get(f"deepinfer_request_finished_total{{finish_reason={reason}}}", 0.0)


# Every test of a running server runs against one process serving both HTTP and the engine, and against the engine in
# its own process behind two HTTP server processes (--api-server-count 2: engine_host.py / engine_proxy.py).
API_SERVER_COUNTS = pytest.mark.parametrize("api_servers", [1, 2], ids=["one-process", "api-servers-2"])


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "api-servers-2"])
def server(request):
    srv = ServerProcess("--max-model-len", str(MAX_MODEL_LEN), "--api-key", API_KEY,
                        "--reasoning-parser", "deepseek-r1", "--max-num-seqs", "64", "--shutdown-timeout", "5",
                        "--api-server-count", str(request.param))
    try:
        srv.wait_ready()
        yield srv
    finally:
        code = srv.stop()
        assert code == 0, f"the server exited with {code}:\n{srv.final_output[-3000:]}"


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def post(server, path: str, body, *, key: str | None = API_KEY, raw: bytes | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if raw is not None:
        headers["Content-Type"] = "application/json"
        return httpx.post(f"{server.base_url}{path}", content=raw, headers=headers, timeout=60)
    return httpx.post(f"{server.base_url}{path}", json=body, headers=headers, timeout=60)


def assert_error(response: httpx.Response, status: int, param: str | None = "any", code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    if param != "any":
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err


# ----------------------------------------------------------------------------------------------- basics


def test_health_version_models(server, client, model):
    assert httpx.get(f"{server.base_url}/health").json() == {"status": "ok"}
    assert httpx.get(f"{server.base_url}/version").json() == build_info()  # what `deepinfer --version` prints
    assert build_info()["version"] == deepinfer.__version__
    models = client.models.list().data
    assert [m.id for m in models] == [model]
    card = httpx.get(f"{server.base_url}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}).json()
    assert card["object"] == "list" and card["data"][0]["max_model_len"] == MAX_MODEL_LEN
    assert client.models.retrieve(model).id == model


def test_api_key(server, model):
    body = {"model": model, "prompt": "Hello", "max_tokens": 2}
    assert_error(post(server, "/v1/completions", body, key=None), 401, code="invalid_api_key")
    assert_error(post(server, "/v1/completions", body, key="sk-wrong"), 401, code="invalid_api_key")
    r = httpx.get(f"{server.base_url}/v1/models")
    assert_error(r, 401)
    bad = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    # Health, version and metrics stay open (probes and scrapers carry no key).
    assert httpx.get(f"{server.base_url}/metrics").status_code == 200


def test_completion(client, model):
    r = client.completions.create(model=model, prompt="To be or not to be", max_tokens=12, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.object == "text_completion" and r.model == model and r.id.startswith("cmpl-")
    assert len(r.choices) == 1 and r.choices[0].finish_reason == "length"
    assert r.choices[0].text
    assert r.usage.completion_tokens == 12 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_completion_stream_matches_non_stream(client, model):
    kwargs = dict(model=model, prompt="My lord, I", max_tokens=20, temperature=0, extra_body={"ignore_eos": True})
    full = client.completions.create(**kwargs)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    usage_chunks = [c for c in chunks if c.usage is not None]
    assert len(usage_chunks) == 1 and usage_chunks[0] is chunks[-1] and chunks[-1].choices == []
    assert usage_chunks[0].usage.completion_tokens == 20
    assert usage_chunks[0].usage.prompt_tokens == full.usage.prompt_tokens
    # Without include_usage no chunk carries usage.
    plain = list(client.completions.create(stream=True, **kwargs))
    assert all(c.usage is None for c in plain)


def test_chat(client, model):
    messages = [{"role": "system", "content": "You are a poet."}, {"role": "user", "content": "Speak of the king."}]
    r = client.chat.completions.create(model=model, messages=messages, max_completion_tokens=16, temperature=0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    msg = r.choices[0].message
    assert msg.role == "assistant" and isinstance(msg.content, str)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert 0 < r.usage.completion_tokens <= 16
    chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=16, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == msg.content
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == r.usage.prompt_tokens


def test_async_client(server, model):
    async def main():
        aclient = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0)
        try:
            comp = aclient.completions.create(model=model, prompt="ROMEO:\n", max_tokens=10, temperature=0)
            chat = aclient.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                                   max_tokens=10, temperature=0)
            full_comp, full_chat = await asyncio.gather(comp, chat)
            stream = await aclient.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                                           max_tokens=10, temperature=0, stream=True)
            text = ""
            async for chunk in stream:
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
            return full_comp, full_chat, text
        finally:
            await aclient.close()

    comp, chat, streamed = asyncio.run(main())
    assert comp.choices[0].text and comp.usage.completion_tokens <= 10
    assert streamed == chat.choices[0].message.content


def test_n_and_batched_prompts(client, model):
    r = client.completions.create(model=model, prompt="Once upon a time", n=3, max_tokens=8, temperature=1.0, seed=3,
                                  extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert r.usage.completion_tokens == 24
    # Three samples, not one copied three times: each of the n completions draws its own tokens (seeded, so fixed).
    texts = [c.text for c in r.choices]
    assert len(set(texts)) == 3, texts
    r = client.completions.create(model=model, prompt=["To be", "My lord"], n=2, max_tokens=4, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == [0, 1, 2, 3]
    by_index = {c.index: c.text for c in r.choices}
    assert by_index[0] == by_index[1] and by_index[2] == by_index[3]  # greedy: the n copies agree
    chunks = list(client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], n=2,
                                                 max_tokens=6, temperature=1.0, stream=True))
    seen = {c.choices[0].index for c in chunks if c.choices}
    assert seen == {0, 1}
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishes) == 2


def test_logprobs(client, model):
    r = client.completions.create(model=model, prompt="To be or not", max_tokens=6, temperature=0, logprobs=3,
                                  extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    if not any("\ufffd" in t for t in lp.tokens):  # (a token may hold part of a UTF-8 character)
        assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert chosen <= 0 and 1 <= len(top) <= 3
        assert abs(max(top.values()) - chosen) < 1e-4  # greedy picks the most likely token

    c = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=5,
                                       temperature=0, logprobs=True, top_logprobs=2)
    content = c.choices[0].logprobs.content
    assert len(content) == c.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 2
        assert bytes(entry.bytes).decode("utf-8", errors="replace") == entry.token
    chunks = list(client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                                 max_tokens=5, temperature=0, logprobs=True, stream=True))
    streamed = [e for ch in chunks if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in content]
    no_lp = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert no_lp.choices[0].logprobs is None


def test_stop_strings(client, model):
    kwargs = dict(model=model, prompt="KING RICHARD II:\n", max_tokens=40, temperature=0,
                  extra_body={"ignore_eos": True})
    text = client.completions.create(**kwargs).choices[0].text
    assert len(text) > 12, text
    stop = text[6:10]
    expected = text[:text.find(stop)]
    r = client.completions.create(stop=[stop], **kwargs)
    assert r.choices[0].text == expected and r.choices[0].finish_reason == "stop"
    streamed = list(client.completions.create(stop=stop, stream=True, **kwargs))
    assert "".join(c.choices[0].text for c in streamed) == expected
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_seed_reproducible(client, model):
    def sample(seed):
        return client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Tell a tale"}],
                                              max_tokens=24, temperature=1.0, seed=seed).choices[0].message.content

    a, b, c = sample(1234), sample(1234), sample(999)
    assert a == b
    assert a != c


def test_echo_and_token_prompts(client, model):
    r = client.completions.create(model=model, prompt="To be", max_tokens=4, temperature=0, echo=True)
    assert r.choices[0].text.startswith("To be") and len(r.choices[0].text) > len("To be")
    ids_prompt = client.completions.create(model=model, prompt=[5, 6, 7, 8], max_tokens=3, temperature=0,
                                           extra_body={"ignore_eos": True})
    assert ids_prompt.usage.prompt_tokens == 4 and ids_prompt.usage.completion_tokens == 3


def test_tools_and_a_tool_result_turn_are_accepted(client, model):
    """The demo model never calls a tool, so this checks the request side with the official client: tools are rendered
    (no 400), a conversation with an assistant tool call and its tool result renders, the answer is plain content."""
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}}}}}]
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Weather in Paris?"}],
                                       tools=tools, tool_choice="auto", max_tokens=8, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length") and r.choices[0].message.tool_calls is None
    turn = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"celsius": 21}'}]
    r2 = client.chat.completions.create(model=model, messages=turn, tools=tools, max_tokens=8, temperature=0)
    assert r2.choices[0].message.content is not None


def test_usage_reports_cached_prompt_tokens(client, model):
    """The second request of the same long prompt finds its full pages in the prefix cache (OpenAI's
    prompt_tokens_details.cached_tokens), and generates the same greedy tokens."""
    ids = [(i * 37) % 500 + 5 for i in range(300)]
    first = client.completions.create(model=model, prompt=ids, max_tokens=4, temperature=0,
                                      extra_body={"ignore_eos": True})
    second = client.completions.create(model=model, prompt=ids, max_tokens=4, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert 0 < second.usage.prompt_tokens_details.cached_tokens < len(ids)
    assert second.choices[0].text == first.choices[0].text


def test_echo_with_logprobs_scores_the_prompt(client, model):
    """echo + logprobs + max_tokens 0 (what lm-evaluation-harness's loglikelihood requests send): each prompt token's
    logprob, null for the first, from the same distribution the model generates from after that prefix."""
    ids = [5, 77, 300, 12, 9, 401]
    scored = client.completions.create(model=model, prompt=ids, max_tokens=0, echo=True, logprobs=5, temperature=0)
    lp = scored.choices[0].logprobs
    assert scored.usage.completion_tokens == 0 and scored.choices[0].finish_reason == "length"
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == len(ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.text_offset == sorted(lp.text_offset)
    for i in range(1, len(ids)):
        assert lp.token_logprobs[i] <= 0 and lp.tokens[i] in lp.top_logprobs[i]
        assert abs(lp.top_logprobs[i][lp.tokens[i]] - lp.token_logprobs[i]) < 1e-6
        # The model's distribution after ids[:i], as a generation from that prefix reports it.
        gen = client.completions.create(model=model, prompt=ids[:i], max_tokens=1, temperature=0, logprobs=5,
                                        extra_body={"ignore_eos": True}).choices[0].logprobs
        common = set(gen.top_logprobs[0]) & set(lp.top_logprobs[i])
        assert len(common) >= 5
        for text in common:
            assert abs(gen.top_logprobs[0][text] - lp.top_logprobs[i][text]) < 1e-4, (i, text)
    # max_tokens 1: the prompt's entries, then the generated token's.
    both = client.completions.create(model=model, prompt=ids, max_tokens=1, echo=True, logprobs=1, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert len(both.choices[0].logprobs.token_logprobs) == len(ids) + 1
    assert both.choices[0].logprobs.token_logprobs[1:len(ids)] == pytest.approx(lp.token_logprobs[1:], abs=1e-5)


def test_chat_template_opens_reasoning(client, model):
    """With --reasoning-parser deepseek-r1 and a template that ends the prompt with <think>, the output is reasoning
    until </think> (this model never writes one, so all of it), streamed and not."""
    template = ("{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}<think>\n{% endif %}")
    kwargs = dict(model=model, messages=[{"role": "user", "content": "Tell a tale"}], max_tokens=12, temperature=0,
                  extra_body={"chat_template_kwargs": {"chat_template": template}, "ignore_eos": True})
    r = client.chat.completions.create(**kwargs)
    msg = r.choices[0].message
    assert msg.content is None
    assert msg.reasoning_content
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert reasoning == msg.reasoning_content and content == ""
    # The default template opens nothing: plain content, reasoning_content null.
    plain = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert plain.choices[0].message.content is not None
    assert getattr(plain.choices[0].message, "reasoning_content", "absent") is None


# ----------------------------------------------------------------------------------------------- vLLM's extensions


def test_prompt_logprobs_are_the_echoed_scores(server, client, model):
    """prompt_logprobs (vLLM's): per prompt token, null first, then {id: {logprob, rank, decoded_token}} for the token
    and the top N; the token's logprob is the one echo + logprobs reports, the top N are ranked 1..N in order."""
    ids = [5, 77, 300, 12, 9, 401]
    r = post(server, "/v1/completions", {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0,
                                         "prompt_logprobs": 3, "n": 2})
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    pl = choices[0]["prompt_logprobs"]
    assert choices[1]["prompt_logprobs"] == pl  # every choice of the prompt carries them
    scored = client.completions.create(model=model, prompt=ids, max_tokens=0, echo=True, logprobs=3, temperature=0)
    echoed = scored.choices[0].logprobs.token_logprobs
    assert len(pl) == len(ids) and pl[0] is None
    for i in range(1, len(ids)):
        entry = pl[i]
        assert entry[str(ids[i])]["logprob"] == pytest.approx(echoed[i], abs=1e-5)
        top = sorted((v for k, v in entry.items() if v["rank"] is not None), key=lambda v: v["rank"])
        assert [v["rank"] for v in top] == [1, 2, 3]
        assert [v["logprob"] for v in top] == sorted((v["logprob"] for v in top), reverse=True)
        assert len(entry) == 3 or entry[str(ids[i])]["rank"] is None  # the prompt token beside the top 3
        assert all(isinstance(v["decoded_token"], str) for v in entry.values())
    chat = post(server, "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": "Hi"}],
                                                 "max_tokens": 1, "prompt_logprobs": 0})
    body = chat.json()
    assert len(body["prompt_logprobs"]) == body["usage"]["prompt_tokens"] and body["prompt_logprobs"][0] is None
    assert all(len(e) == 1 for e in body["prompt_logprobs"][1:])  # N = 0: the prompt token alone
    assert_error(post(server, "/v1/completions", {"model": model, "prompt": "hi", "prompt_logprobs": 1,
                                                  "stream": True}), 400, param="prompt_logprobs")
    assert_error(post(server, "/v1/completions", {"model": model, "prompt": "hi", "prompt_logprobs": 99}), 400,
                 param="prompt_logprobs")


def test_truncate_prompt_tokens_keeps_the_prompt_end(server, client, model):
    ids = list(range(10, 50))
    kept = client.completions.create(model=model, prompt=ids, max_tokens=6, temperature=0, echo=True,
                                     extra_body={"truncate_prompt_tokens": 8, "ignore_eos": True})
    plain = client.completions.create(model=model, prompt=ids[-8:], max_tokens=6, temperature=0, echo=True,
                                      extra_body={"ignore_eos": True})
    assert kept.usage.prompt_tokens == 8
    assert kept.choices[0].text == plain.choices[0].text  # the echo is the kept tokens' text, then the same reply
    # -1: as many as fit beside max_tokens.
    long = client.completions.create(model=model, prompt=list(range(5, 5 + MAX_MODEL_LEN + 100)), max_tokens=4,
                                     extra_body={"truncate_prompt_tokens": -1})
    assert long.usage.prompt_tokens == MAX_MODEL_LEN - 4
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Tell me a long tale"}],
                                          max_tokens=2, extra_body={"truncate_prompt_tokens": 3})
    assert chat.usage.prompt_tokens == 3
    assert_error(post(server, "/v1/completions", {"model": model, "prompt": "hi", "truncate_prompt_tokens": 0}),
                 400, param="truncate_prompt_tokens")


def test_continue_final_message_and_chat_echo(client, model):
    """continue_final_message renders the conversation up to the end of the assistant's final message (no end of
    turn; the rendering itself is checked against transformers in test_chat_template.py), so the reply is what a
    completion of that text gives; echo leads the reply with that final message."""
    from deepinfer.default_model import default_model
    from deepinfer.tokenizer import Tokenizer

    messages = [{"role": "user", "content": "Tell a tale"}, {"role": "assistant", "content": "Once upon a"}]
    tok = Tokenizer.from_dir(default_model()[0])
    rendered = tok.apply_chat_template(messages, add_generation_prompt=False, continue_final_message=True)
    assert rendered.endswith("Once upon a")
    extra = {"continue_final_message": True, "add_generation_prompt": False, "ignore_eos": True}
    cont = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0,
                                          extra_body=extra)
    ref = client.completions.create(model=model, prompt=tok.encode(rendered, add_special_tokens=False),
                                    max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    assert cont.usage.prompt_tokens == ref.usage.prompt_tokens
    assert cont.choices[0].message.content == ref.choices[0].text
    echoed = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0,
                                            extra_body={**extra, "echo": True})
    assert echoed.choices[0].message.content == "Once upon a" + ref.choices[0].text
    streamed = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0,
                                              stream=True, extra_body={**extra, "echo": True})
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == \
        echoed.choices[0].message.content
    # echo after a user turn: nothing of the user's message leads the reply.
    plain = client.chat.completions.create(model=model, messages=messages[:1], max_tokens=4, temperature=0,
                                           extra_body={"echo": True, "ignore_eos": True})
    assert not plain.choices[0].message.content.startswith("Tell a tale")


def test_extension_errors(server, model):
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    assert_error(post(server, "/v1/chat/completions", {**chat, "continue_final_message": True}), 400,
                 param="continue_final_message")  # add_generation_prompt is true by default
    assert_error(post(server, "/v1/chat/completions", {**chat, "continue_final_message": True,
                                                       "add_generation_prompt": False}), 400,
                 param="continue_final_message")  # the final message is the user's
    err = assert_error(post(server, "/v1/completions", {"model": model, "prompt": "hi", "priority": 3}), 400,
                       param="priority", code="unsupported_parameter")
    assert "first come, first served" in err["message"]
    assert post(server, "/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 1,
                                            "priority": 0}).status_code == 200


# ----------------------------------------------------------------------------------------------- bad input


def test_malformed_requests(server, model):
    err = assert_error(post(server, "/v1/completions", None, raw=b'{"prompt": "x", '), 400, code="invalid_json")
    assert "JSON" in err["message"]
    assert_error(post(server, "/v1/chat/completions", None, raw=b"[1, 2]"), 400)
    assert_error(post(server, "/v1/chat/completions", None, raw=b""), 400)
    assert_error(post(server, "/v1/completions", None, raw=b"\xff\xfe"), 400)
    # Wrong types: no coercion.
    assert_error(post(server, "/v1/completions", {"model": model, "prompt": "x", "max_tokens": "5"}), 400,
                 param="max_tokens")
    assert_error(post(server, "/v1/completions", {"model": model, "prompt": "x", "temperature": "hot"}), 400,
                 param="temperature")
    assert_error(post(server, "/v1/completions", {"model": model, "prompt": "x", "stream": "yes"}), 400,
                 param="stream")
    assert_error(post(server, "/v1/completions", {"model": model, "prompt": 5}), 400, param="prompt")
    assert_error(post(server, "/v1/completions", {"model": model}), 400, param="prompt")
    assert_error(post(server, "/v1/chat/completions", {"model": model, "messages": "hi"}), 400, param="messages")
    assert_error(post(server, "/v1/chat/completions", {"model": model, "messages": []}), 400, param="messages")
    assert_error(post(server, "/v1/chat/completions",
                      {"model": model, "messages": [{"role": "user", "content": 3}]}), 400,
                 param="messages[0].content")
    assert_error(post(server, "/v1/chat/completions",
                      {"model": model, "messages": [{"role": "wizard", "content": "hi"}]}), 400,
                 param="messages[0].role")
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]
    assert_error(post(server, "/v1/chat/completions", {"model": model, "messages": image}), 400,
                 param="messages[0].content[0].type")
    # Empty prompts and token ids outside the vocabulary.
    assert_error(post(server, "/v1/completions", {"model": model, "prompt": ""}), 400, param="prompt")
    assert_error(post(server, "/v1/completions", {"model": model, "prompt": []}), 400, param="prompt")
    assert_error(post(server, "/v1/completions", {"model": model, "prompt": [1, 10**9]}), 400, param="prompt")
    # Unknown endpoints and methods answer in the same schema.
    assert_error(httpx.get(f"{server.base_url}/v1/nothing"), 404)
    assert_error(httpx.get(f"{server.base_url}/v1/completions"), 405)


def test_errors_name_the_request_not_the_code(server, model):
    """Input the tokenizer or the chat template would choke on is refused up front in the API's words, with the
    field's path: no Python exception text reaches the client."""
    cases = [
        ("/v1/completions", b'{"prompt": "a\\ud800b"}', "prompt", "lone UTF-16 surrogate"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\udfff"}]}', "messages[0].content",
         "lone UTF-16 surrogate"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": null}]}', "messages[0].content",
         "null is allowed only"),
        ("/v1/chat/completions", b'{"messages": [{"role": "assistant", "content": null}]}', "messages[0].content",
         "null is allowed only"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": [{"type": "text"}]}]}',
         "messages[0].content[0].text", "needs its 'text'"),
    ]
    for path, raw, param, words in cases:
        err = assert_error(post(server, path, None, raw=raw), 400, param=param, code="invalid_value")
        assert words in err["message"], err
        for internal in ("TextEncodeInput", "NoneType", "Traceback", "concatenate"):
            assert internal not in err["message"], err
    # An assistant message with tool calls may have null content (OpenAI's clients send it so): the check lets it
    # through. (The demo model's template renders no tool calls and cannot take a null content: its failure is then
    # answered without Python's words. DeepSeek-V3's template, in test_server_structured_outputs.py, renders it.)
    body = {"model": model, "max_tokens": 2, "messages": [
        {"role": "user", "content": "What is the weather?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]}
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
    assert "NoneType" not in r.json()["error"]["message"]


def test_unknown_model(server):
    err = assert_error(post(server, "/v1/chat/completions",
                            {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}), 404,
                       param="model", code="model_not_found")
    assert "gpt-4o" in err["message"]


def test_too_long(server, model):
    long_prompt = "To be or not to be, that is the question. " * 200
    err = assert_error(post(server, "/v1/completions", {"model": model, "prompt": long_prompt}), 400,
                       code="context_length_exceeded")
    assert str(MAX_MODEL_LEN) in err["message"]
    assert_error(post(server, "/v1/chat/completions",
                      {"model": model, "messages": [{"role": "user", "content": long_prompt}]}), 400,
                 code="context_length_exceeded")
    assert_error(post(server, "/v1/completions", {"model": model, "prompt": "hi", "max_tokens": MAX_MODEL_LEN}),
                 400, param="max_tokens", code="context_length_exceeded")


@pytest.mark.parametrize("field,value", [
    ("temperature", -0.5), ("top_p", 0.0), ("top_p", 1.5), ("n", 0), ("n", 1000), ("max_tokens", 0),
    ("presence_penalty", 3.0), ("frequency_penalty", -2.5), ("top_k", -5), ("min_p", 2.0), ("seed", -1),
    ("logprobs", 50), ("repetition_penalty", 0.0),
])
def test_out_of_range(server, model, field, value):
    assert_error(post(server, "/v1/completions", {"model": model, "prompt": "hi", field: value}), 400, param=field)


@pytest.mark.parametrize("endpoint,field,value", [
    ("chat", "functions", [{"name": "f"}]),
    ("chat", "function_call", "auto"),
    ("chat", "logit_bias", {"5": 10}),
    ("chat", "audio", {"voice": "alloy", "format": "wav"}),
    ("chat", "store", True),
    ("completions", "suffix", "the end"),
    ("completions", "logit_bias", {"5": 10}),
    ("completions", "best_of", 3),
])
def test_unsupported_parameters(server, model, endpoint, field, value):
    body = {"model": model, field: value}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    err = assert_error(post(server, f"/v1/{'chat/completions' if endpoint == 'chat' else 'completions'}", body), 400,
                       param=field, code="unsupported_parameter")
    assert field in err["message"]


def test_unknown_and_inert_parameters(server, model, client):
    err = assert_error(post(server, "/v1/completions", {"model": model, "prompt": "hi", "frobnicate": 1}), 400,
                       param="frobnicate")
    assert "frobnicate" in err["message"]
    assert_error(post(server, "/v1/completions", {"model": model, "prompt": "hi", "echo": True, "logprobs": 1,
                                                  "stream": True}), 400, param="stream")
    assert_error(post(server, "/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 0}), 400,
                 param="max_tokens")
    assert_error(post(server, "/v1/chat/completions",
                      {"model": model, "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}), 400,
                 param="top_logprobs")
    assert_error(post(server, "/v1/completions", {"model": model, "prompt": "hi", "stream_options":
                                                  {"include_usage": True}}), 400, param="stream_options")
    # Values that ask for nothing are accepted: no tools, text responses, tags.
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                       tools=[], tool_choice="none", response_format={"type": "text"}, user="u1",
                                       metadata={"k": "v"}, store=False)
    assert r.choices[0].message.role == "assistant"


def test_server_keeps_serving_after_bad_input(client, model, server):
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    r = client.completions.create(model=model, prompt="Still there?", max_tokens=3)
    assert r.usage.completion_tokens >= 1
    m = metrics(server.base_url)
    assert m.get("deepinfer_http_requests_total{endpoint=/v1/completions,status=400}", 0) > 0


# ----------------------------------------------------------------------------------------------- concurrency


def test_streams_interleave(server, model):
    """Two streams running at once receive chunks alternately: the engine batches them."""
    events: list[tuple[str, str]] = []

    async def run(name: str, started: asyncio.Event | None, wait_for: asyncio.Event | None):
        aclient = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0)
        try:
            if wait_for is not None:
                await wait_for.wait()
            stream = await aclient.completions.create(model=model, prompt=f"{name}:\n", max_tokens=300,
                                                      temperature=0, stream=True, extra_body={"ignore_eos": True})
            async for chunk in stream:
                c = chunk.choices[0]
                if c.text:
                    events.append((name, "text"))
                    if started is not None and not started.is_set():
                        started.set()
                if c.finish_reason:
                    events.append((name, "finish"))
        finally:
            await aclient.close()

    async def main():
        a_started = asyncio.Event()
        await asyncio.gather(run("A", a_started, None), run("B", None, a_started))

    asyncio.run(main())
    first_b = events.index(("B", "text"))
    finish_a = events.index(("A", "finish"))
    assert first_b < finish_a, "B produced nothing before A finished: requests were not batched"
    a_after_b = [i for i, e in enumerate(events) if e == ("A", "text") and i > first_b]
    assert a_after_b, "A produced nothing after B started"
    # While both run, neither stream starves: A's text keeps coming between B's chunks.
    b_texts = [i for i, e in enumerate(events) if e == ("B", "text")]
    assert any(b_texts[0] < i < b_texts[-1] for i in a_after_b)
    wait_idle(server.base_url)


def test_disconnect_aborts_request(server, model):
    before = metrics(server.base_url)
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": 900, "stream": True, "ignore_eos": True,
            "temperature": 0}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{server.base_url}/v1/completions", json=body, headers=headers) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            chunks = 0
            for line in lines:
                if line.startswith("data:"):
                    chunks += 1
                if chunks >= 3:
                    break
            assert m_running(server.base_url) == 1
        # Leaving the block closes the connection mid-stream.
    after = wait_idle(server.base_url)
    assert finished(after, "abort") == finished(before, "abort") + 1
    generated = after["deepinfer_generation_tokens_total"] - before["deepinfer_generation_tokens_total"]
    assert generated < 900, "the request ran to the end although its client was gone"


def test_disconnect_aborts_non_streaming_request(server, model):
    before = metrics(server.base_url)
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": 900, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        post_client = httpx.Client(timeout=httpx.Timeout(0.3, connect=5))
        try:
            post_client.post(f"{server.base_url}/v1/completions", json=body,
                             headers={"Authorization": f"Bearer {API_KEY}"})
        finally:
            post_client.close()
    after = wait_idle(server.base_url)
    assert finished(after, "abort") == finished(before, "abort") + 1


def test_load(server, model):
    """64 concurrent streaming clients x 3 rounds, completions and chat: every answer complete and identical to the
    same request made alone (greedy), and afterwards nothing runs and every cache page is free."""
    prompts = ["To be or not to be", "My lord, I", "ROMEO:\n", "Once upon a time"]
    sync = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0)
    extra = {"ignore_eos": True}
    ref_comp = [sync.completions.create(model=model, prompt=p, max_tokens=16, temperature=0, extra_body=extra)
                .choices[0].text for p in prompts]
    ref_chat = [sync.chat.completions.create(model=model, messages=[{"role": "user", "content": p}], max_tokens=16,
                                             temperature=0, extra_body=extra).choices[0].message.content
                for p in prompts]
    before = metrics(server.base_url)
    clients, rounds = 64, 3

    async def one(aclient, i: int):
        p = i % len(prompts)
        if i % 2:
            stream = await aclient.completions.create(model=model, prompt=prompts[p], max_tokens=16, temperature=0,
                                                      stream=True, stream_options={"include_usage": True},
                                                      extra_body=extra)
            text, usage, finish = "", None, None
            async for c in stream:
                if c.choices:
                    text += c.choices[0].text
                    finish = c.choices[0].finish_reason or finish
                if c.usage:
                    usage = c.usage
            return text == ref_comp[p] and finish == "length" and usage.completion_tokens == 16
        stream = await aclient.chat.completions.create(model=model, messages=[{"role": "user", "content": prompts[p]}],
                                                       max_tokens=16, temperature=0, stream=True,
                                                       stream_options={"include_usage": True}, extra_body=extra)
        text, usage, finish = "", None, None
        async for c in stream:
            if c.choices:
                text += c.choices[0].delta.content or ""
                finish = c.choices[0].finish_reason or finish
            if c.usage:
                usage = c.usage
        return text == ref_chat[p] and finish == "length" and usage.completion_tokens == 16

    async def main():
        aclient = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
        try:
            results = []
            for _ in range(rounds):
                results += await asyncio.gather(*(one(aclient, i) for i in range(clients)))
            return results
        finally:
            await aclient.close()

    results = asyncio.run(main())
    assert len(results) == clients * rounds and all(results), f"{results.count(False)} wrong answers"
    after = wait_idle(server.base_url)
    assert finished(after, "length") - finished(before, "length") == clients * rounds
    assert after["deepinfer_generation_tokens_total"] - before["deepinfer_generation_tokens_total"] == \
        16 * clients * rounds
    assert after["deepinfer_cache_usage_perc"] == 0.0
    assert after["deepinfer_time_to_first_token_seconds_count"] >= clients * rounds
    assert after["deepinfer_inter_token_latency_seconds_count"] > 0


def test_metrics_exposition(server):
    text = httpx.get(f"{server.base_url}/metrics").text
    for name in ("deepinfer_num_requests_running", "deepinfer_num_requests_waiting", "deepinfer_cache_usage_perc",
                 "deepinfer_cache_pages_free", "deepinfer_cache_pages_total", "deepinfer_num_preemptions_total",
                 "deepinfer_time_to_first_token_seconds_bucket", "deepinfer_inter_token_latency_seconds_bucket",
                 "deepinfer_e2e_request_latency_seconds_bucket", "deepinfer_prompt_tokens_total",
                 "deepinfer_generation_tokens_total", "deepinfer_request_finished_total"):
        assert name in text, name


# ----------------------------------------------------------------------------------------------- limits, shutdown


def _read_first_chunk(response: httpx.Response):
    """Reads up to the first text chunk. Returns the line iterator: dropping it would close the connection."""
    lines = response.iter_lines()
    for line in lines:
        if line.startswith("data:") and '"text":""' not in line:
            return lines
    raise AssertionError("the stream ended without text")


@API_SERVER_COUNTS
def test_overload_answers_503(api_servers):
    srv = ServerProcess("--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "1", "--max-queue-size", "1",
                        "--api-server-count", str(api_servers))
    try:
        srv.wait_ready()
        model = httpx.get(f"{srv.base_url}/v1/models").json()["data"][0]["id"]
        body = {"model": model, "prompt": "Once upon a time", "max_tokens": 900, "stream": True, "ignore_eos": True}
        with httpx.Client(timeout=60) as h1, httpx.Client(timeout=60) as h2:
            with h1.stream("POST", f"{srv.base_url}/v1/completions", json=body) as running:
                lines = _read_first_chunk(running)  # the first request runs (max_num_seqs 1) ...
                with h2.stream("POST", f"{srv.base_url}/v1/completions", json=body) as queued:
                    assert queued.status_code == 200  # ... the second waits in the queue (size 1) ...
                    time.sleep(0.2)
                    r = httpx.post(f"{srv.base_url}/v1/completions", json={**body, "stream": False}, timeout=30)
                    err = assert_error(r, 503, code="server_overloaded")  # ... the third is refused
                    assert err["type"] == "server_error"
                    assert r.headers.get("retry-after")
                    r = httpx.post(f"{srv.base_url}/v1/chat/completions",
                                   json={"model": model, "messages": [{"role": "user", "content": "hi"}]}, timeout=30)
                    assert_error(r, 503, code="server_overloaded")
                    assert m_running(srv.base_url) == 1, "the first request should still be running"
                del lines
        m = wait_idle(srv.base_url)
        assert m["deepinfer_requests_rejected_total{reason=queue_full}"] == 2
        # Once the queue drains, requests are served again.
        r = httpx.post(f"{srv.base_url}/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 2},
                       timeout=30)
        assert r.status_code == 200
    finally:
        assert srv.stop() == 0


@API_SERVER_COUNTS
def test_sigterm_shuts_down_cleanly(api_servers):
    srv = ServerProcess("--max-model-len", str(MAX_MODEL_LEN), "--shutdown-timeout", "0.5",
                        "--api-server-count", str(api_servers))
    try:
        srv.wait_ready()
        model = httpx.get(f"{srv.base_url}/v1/models").json()["data"][0]["id"]
        client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0, timeout=60)
        stream = client.completions.create(model=model, prompt="Once upon a time", max_tokens=900, stream=True,
                                           extra_body={"ignore_eos": True})
        finish = None
        text = ""
        for i, chunk in enumerate(stream):
            if i == 2:
                srv.proc.send_signal(signal.SIGTERM)
            if chunk.choices:
                text += chunk.choices[0].text
                finish = chunk.choices[0].finish_reason or finish
        # The stream ended properly ([DONE]) with the request aborted after the grace period: 900 tokens take far
        # longer than 0.5 s (the CPU demo model makes tens to hundreds of tokens a second), so "length" would mean
        # the shutdown waited for the request instead of aborting it.
        assert finish == "abort", (finish, len(text))
        assert srv.proc.wait(30) == 0, srv.output()
        assert "Traceback" not in srv.output(), srv.output()
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{srv.base_url}/health", timeout=2)
    finally:
        srv.stop()


def test_sigterm_when_idle_and_bad_config(tmp_path):
    srv = ServerProcess("--max-model-len", "256")
    srv.wait_ready()
    assert srv.stop() == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_model_len: 256\nno_such_option: 1\n")
    p = subprocess.run([sys.executable, "-m", "deepinfer.cli", "serve", "--config", str(bad)], capture_output=True,
                       text=True, timeout=60, env=serve_env())
    assert p.returncode == 2 and "no_such_option" in p.stderr


def test_port_in_use_fails_before_the_model_loads():
    """`deepinfer serve` binds its port before loading: a taken port is one clear line and exit 1 at once, not
    uvicorn's `[Errno 98]` after the whole load."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        p = subprocess.run([sys.executable, "-m", "deepinfer.cli", "serve", "--host", HOST, "--port", str(port)],
                           capture_output=True, text=True, timeout=60, env=serve_env())
    assert p.returncode == 1, p.stderr
    assert f"{HOST}:{port}: the address is already in use" in p.stderr and "--port" in p.stderr, p.stderr
    assert "Errno 98" not in p.stderr and "Traceback" not in p.stderr
    assert "resident weights" not in p.stderr  # the engine logs this once the weights are loaded
