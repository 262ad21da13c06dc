"""The `deepinfer` command as a user runs it: a real process, real arguments, real stdin."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ENV = {**os.environ, "DEEPINFER_NO_PROGRESS": "1", "PYTHONUNBUFFERED": "1"}


def deepinfer(*args: str, stdin: str | None = None, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deepinfer.cli", *args], input=stdin, capture_output=True,
                          text=True, env=ENV, timeout=timeout)


def test_generate_greedy_matches_the_api(checkpoints):
    from deepinfer import DeepInferenceEngine, EngineConfig

    path = str(checkpoints["v3"])
    with DeepInferenceEngine(EngineConfig(model_name_or_path=path, max_model_len=128)) as engine:
        expected = engine.generate("The quick brown fox", temperature=0.0, max_tokens=6)[0].text
    r = deepinfer("generate", "--model", path, "--max-model-len", "128", "--temperature", "0", "--max-tokens", "6",
                  "The quick brown fox")
    assert r.returncode == 0, r.stderr
    assert r.stdout == expected + "\n"
    streamed = deepinfer("generate", "--model", path, "--max-model-len", "128", "--temperature", "0",
                         "--max-tokens", "6", "--stream", "The quick brown fox")
    assert streamed.returncode == 0 and streamed.stdout == expected + "\n"


def test_generate_with_the_embedded_default_model():
    r = deepinfer("generate", "--max-tokens", "4", "--max-model-len", "256", "-v", "Hello")
    assert r.returncode == 0, r.stderr
    assert "4 tokens" in r.stderr


def test_chat_reads_turns_from_stdin(checkpoints):
    r = deepinfer("chat", "--model", str(checkpoints["v2"]), "--max-model-len", "128", "--max-tokens", "3",
                  "--temperature", "0", stdin="Hello\nHow are you?\n/exit\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("model> ") == 2


@pytest.mark.parametrize("args, message", [
    (("generate", "--model", "/nonexistent/model", "x"), "does not exist"),
    (("generate", "--temperature", "-1", "x"), "temperature"),
])
def test_errors_are_one_clear_line(args, message):
    r = deepinfer(*args)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_help_explains_every_flag():
    for sub in ("generate", "chat"):
        r = deepinfer(sub, "--help")
        assert r.returncode == 0
        for flag in ("--model", "--max-tokens", "--temperature", "--top-p", "--top-k", "--min-p", "--stop"):
            assert flag in r.stdout
