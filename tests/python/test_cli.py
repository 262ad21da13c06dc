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


# ----------------------------------------------------------------------------------------------- vLLM's habits


def test_version_names_the_backends_and_the_gpus():
    from deepinfer import __version__, _deepinfer

    r = deepinfer("--version")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    gpus = _deepinfer.cuda_device_count()
    assert lines[0] == f"deepinfer {__version__}"
    assert lines[1] == ("backends: CPU, CUDA" if gpus > 0 else "backends: CPU")
    assert lines[2].startswith(f"CUDA GPUs visible: {gpus}")
    assert lines[3].startswith("ranks as processes: ")
    if os.environ.get("DEEPINFER_CI"):  # CI installs OpenMPI and gloo: the build has both
        assert lines[3] == "ranks as processes: mpirun (MPI), --nnodes / torchrun / LeaderWorkerSet (gloo)"


def _engine_options(parser) -> dict[str, str]:
    """option string -> help, for the flags of the "engine" argument group."""
    group = next(g for g in parser._action_groups if g.title == "engine")
    return {opt: a.help for a in group._group_actions for opt in a.option_strings}


def _subparser(name: str):
    from deepinfer.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices[name]


def test_generate_and_chat_have_every_engine_flag_of_serve():
    serve = _engine_options(_subparser("serve"))
    for flag in ("--device", "--dtype", "--tensor-parallel-size", "--gpu-memory-utilization", "--max-num-seqs",
                 "--max-model-len", "--enable-prefix-caching", "--no-enable-prefix-caching", "--quantization",
                 "--kv-cache-dtype", "--quantization-config"):
        assert flag in serve, flag
    for name in ("generate", "chat"):
        assert _engine_options(_subparser(name)) == serve, name


def test_every_engine_flag_help_is_a_meaning_and_a_default():
    import dataclasses

    from deepinfer.config import ENGINE_FIELD_HELP, EngineConfig

    names = [f.name for f in dataclasses.fields(EngineConfig)]
    assert sorted(ENGINE_FIELD_HELP) == sorted(names), "ENGINE_FIELD_HELP must have one line per EngineConfig field"
    nullable = [f.name for f in dataclasses.fields(EngineConfig) if f.default is None]
    for name in nullable:  # the flag takes 'none': its help says what that means
        assert "none" in ENGINE_FIELD_HELP[name], name
    helps = _engine_options(_subparser("serve"))
    for flag, text in helps.items():
        assert "\n" not in text and not text.startswith("EngineConfig."), (flag, text)
        if flag != "--quantization-config":
            assert "(default: " in text, (flag, text)
    assert helps["--page-size"] == "tokens per latent-cache page (default: 64)"
    assert "(default: on)" in helps["--enable-prefix-caching"]


def test_generate_flags_become_engine_config():
    from deepinfer import EngineConfig
    from deepinfer.engine_args import engine_values

    args = _subparser("generate").parse_args(
        ["--device", "cpu", "--dtype", "float32", "--max-num-seqs", "3", "--no-enable-prefix-caching",
         "--gpu-memory-utilization", "0.5", "--kv-cache-dtype", "auto", "--max-model-len", "128", "--seed", "7",
         "--temperature", "0", "hello"])
    config = EngineConfig.from_dict(engine_values(args))
    assert (config.device, config.dtype, config.max_num_seqs, config.enable_prefix_caching,
            config.gpu_memory_utilization, config.max_model_len, config.seed) == ("cpu", "float32", 3, False, 0.5,
                                                                                 128, 7)
    assert args.temperature == 0.0 and args.prompt == "hello"
    # Nothing given: EngineConfig's own defaults.
    assert EngineConfig.from_dict(engine_values(_subparser("chat").parse_args([]))) == EngineConfig()


@pytest.mark.parametrize("argv, option", [
    (["generate", "--temperature", "nan", "x"], "--temperature"),
    (["generate", "--top-p", "inf", "x"], "--top-p"),
    (["chat", "--min-p", "-inf"], "--min-p"),
    (["generate", "--gpu-memory-utilization", "nan", "x"], "--gpu-memory-utilization"),
    (["chat", "--cache-memory-gb", "inf"], "--cache-memory-gb"),
    (["serve", "--shutdown-timeout", "nan"], "--shutdown-timeout"),
    (["bench", "serve", "--temperature", "nan"], "--temperature"),
    (["bench", "serve", "--request-rate", "nan"], "--request-rate"),
])
def test_non_finite_numbers_are_refused_naming_the_option(argv, option, capsys):
    from deepinfer.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}" in err and "Traceback" not in err, err


def test_max_model_len_past_max_position_embeddings_is_refused_before_loading(tmp_path):
    import json
    import shutil

    from deepinfer import DeepInferenceEngine, EngineConfig
    from deepinfer.default_model import TRAINED_MODEL_DIR

    # A checkpoint of config.json and tokenizer alone: no weight file, so getting past the check would fail on
    # the missing weights instead.
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        if (TRAINED_MODEL_DIR / name).exists():
            shutil.copy(TRAINED_MODEL_DIR / name, tmp_path / name)
    limit = json.loads((tmp_path / "config.json").read_text())["max_position_embeddings"]
    with pytest.raises(ValueError, match=rf"max_model_len={limit + 1} is larger than the model's "
                                         rf"max_position_embeddings={limit}"):
        DeepInferenceEngine(EngineConfig(model_name_or_path=str(tmp_path), max_model_len=limit + 1))
    with pytest.raises(Exception) as at_the_limit:  # the check passes; the weights are missing
        DeepInferenceEngine(EngineConfig(model_name_or_path=str(tmp_path), max_model_len=limit))
    assert "max_position_embeddings" not in str(at_the_limit.value)

    r = deepinfer("generate", "--max-model-len", "1000000", "x")
    assert r.returncode == 2 and "max_model_len=1000000" in r.stderr and "max_position_embeddings=" in r.stderr
    assert "Traceback" not in r.stderr


def test_chat_ctrl_c_stops_the_reply_and_keeps_the_session(monkeypatch, capsys):
    """Ctrl-C while a reply streams aborts that request and keeps the session (the partial reply in the history);
    Ctrl-C at the prompt gives a fresh line; /reset says so."""
    import io
    import types

    from deepinfer import cli
    from deepinfer.outputs import CompletionOutput, RequestOutput

    class Stream:
        def __init__(self, interrupt: bool) -> None:
            self.interrupt, self.aborted = interrupt, False

        def abort(self) -> None:
            self.aborted = True

        def __iter__(self):
            yield RequestOutput(request_id="r", prompt=None, prompt_token_ids=[1],
                                outputs=[CompletionOutput(index=0, text="partial")])
            if self.interrupt:
                raise KeyboardInterrupt
            yield RequestOutput(request_id="r", prompt=None, prompt_token_ids=[1],
                                outputs=[CompletionOutput(index=0, text=" reply", finish_reason="stop")])

    class Engine:
        def __init__(self) -> None:
            self.streams, self.rendered = [], []

        def render_chat(self, messages):
            self.rendered.append([dict(m) for m in messages])
            return [1, 2]

        def submit(self, prompt, params):
            self.streams.append(Stream(interrupt=len(self.streams) == 0))
            return self.streams[-1]

        def shutdown(self) -> None:
            pass

    engine = Engine()
    monkeypatch.setattr(cli, "_engine", lambda args: engine)
    lines = iter(["first", KeyboardInterrupt, "second", "/reset", "/exit"])

    def fake_input(prompt=""):
        item = next(lines)
        if item is KeyboardInterrupt:
            raise KeyboardInterrupt
        return item

    monkeypatch.setattr("builtins.input", fake_input)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    args = types.SimpleNamespace(system=None, max_tokens=8, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0,
                                 repetition_penalty=1.0, sampling_seed=None, stop=None)
    assert cli.cmd_chat(args) == 0
    out, err = capsys.readouterr()
    assert engine.streams[0].aborted and not engine.streams[1].aborted
    assert "partial [stopped]" in out and "partial reply" in out
    # The second turn saw the first, stopped reply in its history.
    assert engine.rendered[1][:2] == [{"role": "user", "content": "first"},
                                      {"role": "assistant", "content": "partial"}]
    assert "history cleared" in err
