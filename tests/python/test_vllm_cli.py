"""A vLLM command line for a DeepSeek model runs with `vllm` replaced by `deepinfer`: vLLM's flags are implemented,
accepted with a warning naming them where they cannot matter, or refused with the reason.

The end-to-end tests run `deepinfer serve` on the embedded demo model (CPU) with such a command line; the rest parse
flags without starting anything.
"""

from __future__ import annotations

import argparse
import datetime
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import require_module

httpx = require_module("httpx")
openai = require_module("openai")
require_module("fastapi")
require_module("uvicorn")
require_module("yaml")

from deepinfer.default_model import TRAINED_MODEL_DIR  # noqa: E402
from deepinfer.server.cli import add_serve_arguments, resolve_serve_options  # noqa: E402
from deepinfer.server.vllm_flags import INAPPLICABLE  # noqa: E402
from test_server import HOST, ServerProcess, serve_env  # noqa: E402

MARKER = "[vllm-cli-template]"
TEMPLATE = (MARKER + "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}<answer>{% endif %}")


def parse(*argv: str) -> tuple[dict, dict]:
    parser = add_serve_arguments(argparse.ArgumentParser(prog="deepinfer serve", exit_on_error=False))
    return resolve_serve_options(parser.parse_args(list(argv)))


def serve_cli(*args: str, timeout: int = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deepinfer.cli", "serve", *args], capture_output=True, text=True,
                          timeout=timeout, env=serve_env())


# ----------------------------------------------------------------------------------------------- end to end


def test_a_vllm_command_line_serves_the_demo_model(tmp_path):
    from deepinfer.tokenizer import Tokenizer

    template = tmp_path / "T.jinja"
    template.write_text(TEMPLATE)
    srv = ServerProcess(str(TRAINED_MODEL_DIR), "--block-size", "16", "--max-model-len", "512",
                        "--enable-chunked-prefill", "--max-logprobs", "5", "--response-role", "assistant",
                        "--disable-log-requests",
                        "--swap-space", "4", "--disable-custom-all-reduce", "--trust-remote-code",
                        "--chat-template", str(template), "--root-path", "/api", "--uvicorn-log-level", "warning")
    try:
        srv.wait_ready()
        # Behind a proxy that keeps the prefix, and one that strips it: both reach the API.
        client = openai.OpenAI(base_url=f"{srv.base_url}/api/v1", api_key="none", max_retries=0)
        assert httpx.get(f"{srv.base_url}/v1/models", timeout=10).status_code == 200
        messages = [{"role": "user", "content": "Hello there"}]
        chat = client.chat.completions.create(model=str(TRAINED_MODEL_DIR), messages=messages, max_tokens=6,
                                              temperature=0.0, logprobs=True, top_logprobs=5)
        assert chat.choices[0].message.role == "assistant"
        assert len(chat.choices[0].logprobs.content[0].top_logprobs) == 5

        # The custom template rendered the prompt: its tokens are the template's text, and a completion of those
        # very tokens continues them the same way.
        rendered = f"{MARKER}<user>Hello there<answer>"
        ids = Tokenizer.from_dir(TRAINED_MODEL_DIR).encode(rendered, add_special_tokens=False)
        assert chat.usage.prompt_tokens == len(ids)
        completion = client.completions.create(model=str(TRAINED_MODEL_DIR), prompt=ids, max_tokens=6,
                                               temperature=0.0)
        assert completion.choices[0].text == chat.choices[0].message.content

        # Over --max-logprobs: 400 naming the limit, on both endpoints.
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model=str(TRAINED_MODEL_DIR), messages=messages, max_tokens=2,
                                           logprobs=True, top_logprobs=6)
        assert "between 0 and 5" in str(err.value) and "--max-logprobs" in str(err.value)
        with pytest.raises(openai.BadRequestError, match="between 0 and 5"):
            client.completions.create(model=str(TRAINED_MODEL_DIR), prompt="Hi", max_tokens=2, logprobs=6)
    finally:
        srv.stop()
    out = srv.final_output
    for flag in ("--swap-space", "--disable-custom-all-reduce"):
        assert "WARNING" in out and f"{flag} is ignored: {INAPPLICABLE[flag][1]}" in out, out
    assert "Traceback" not in out, out


def _self_signed_cert(tmp_path: Path) -> tuple[Path, Path]:
    pytest.importorskip("cryptography")
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOST)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(HOST))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    keyfile, certfile = tmp_path / "key.pem", tmp_path / "cert.pem"
    keyfile.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return keyfile, certfile


def test_https_with_ssl_keyfile_and_certfile(tmp_path):
    keyfile, certfile = _self_signed_cert(tmp_path)
    trust = ssl.create_default_context(cafile=str(certfile))
    srv = ServerProcess("--max-model-len", "256", "--ssl-keyfile", str(keyfile), "--ssl-certfile", str(certfile),
                        scheme="https", verify=trust)
    try:
        srv.wait_ready()
        client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="none", max_retries=0,
                               http_client=httpx.Client(verify=trust))
        out = client.completions.create(model=client.models.list().data[0].id, prompt="Hi", max_tokens=2)
        assert out.usage.completion_tokens >= 1
        with pytest.raises(httpx.HTTPError):  # plain HTTP is not answered
            httpx.get(f"http://{HOST}:{srv.port}/health", timeout=5)
    finally:
        srv.stop()


# ----------------------------------------------------------------------------------------------- flags


def test_block_size_is_page_size():
    assert parse("--block-size", "16")[0] == {"page_size": 16}
    assert parse("--block-size", "16", "--page-size", "16")[0] == {"page_size": 16}
    with pytest.raises(ValueError, match="--block-size 16 and --page-size 32 differ"):
        parse("--block-size", "16", "--page-size", "32")


def test_block_size_in_a_config_file(tmp_path):
    (tmp_path / "serve.yaml").write_text("block-size: 16\n")
    assert parse("--config", str(tmp_path / "serve.yaml"))[0] == {"page_size": 16}
    assert parse("--config", str(tmp_path / "serve.yaml"), "--page-size", "32")[0] == {"page_size": 32}


def test_chunked_prefill_accepted_and_its_opposite_refused():
    assert parse("--enable-chunked-prefill") == parse()
    r = serve_cli("--no-enable-chunked-prefill")
    assert r.returncode == 2 and "--no-enable-chunked-prefill is not supported" in r.stderr
    assert "--max-num-batched-tokens" in r.stderr and "Traceback" not in r.stderr


def test_inapplicable_flags_change_nothing():
    assert parse("--swap-space", "4", "--disable-custom-all-reduce", "--tokenizer-mode", "auto",
                 "--disable-log-stats") == parse()


def test_vllm_keys_in_a_config_file_are_taken_as_their_flags(tmp_path):
    """A vLLM serve YAML: the inapplicable keys are accepted and warned about as their flags are, chunked prefill
    accepted, its opposite refused with the reason."""
    config = tmp_path / "serve.yaml"
    config.write_text("swap-space: 4\ndisable-custom-all-reduce: true\ntokenizer-mode: auto\ndisable_log_stats: true\n"
                      "enable-chunked-prefill: true\nblock-size: 16\n")
    assert parse("--config", str(config)) == parse("--page-size", "16")
    r = serve_cli("--config", str(config), "--max-num-seqs", "0")  # refused after the warnings, before loading
    assert r.returncode == 2 and "Traceback" not in r.stderr
    for flag in INAPPLICABLE:
        assert f"{flag} is ignored: {INAPPLICABLE[flag][1]}" in r.stderr, flag
    config.write_text("enable-chunked-prefill: false\n")
    with pytest.raises(ValueError, match="enable-chunked-prefill: false is not supported: DeepInfer always prefills"):
        parse("--config", str(config))
    config.write_text("no-enable-chunked-prefill: true\n")
    with pytest.raises(ValueError, match="no-enable-chunked-prefill is not supported"):
        parse("--config", str(config))


def test_chat_template_file_inline_missing_and_broken(tmp_path):
    (tmp_path / "t.jinja").write_text(TEMPLATE)
    assert parse("--chat-template", str(tmp_path / "t.jinja"))[1]["chat_template"] == TEMPLATE
    assert parse("--chat-template", TEMPLATE)[1]["chat_template"] == TEMPLATE
    with pytest.raises(ValueError, match="not a readable file"):
        parse("--chat-template", str(tmp_path / "missing.jinja"))
    (tmp_path / "broken.jinja").write_text("{% for m in messages %}")
    with pytest.raises(ValueError, match="broken.jinja.*does not compile"):
        parse("--chat-template", str(tmp_path / "broken.jinja"))


def test_a_bad_chat_template_fails_before_the_model_loads(tmp_path):
    (tmp_path / "broken.jinja").write_text("{% if %}")
    r = serve_cli("/no/such/model", "--chat-template", str(tmp_path / "broken.jinja"))
    assert r.returncode == 2 and "broken.jinja" in r.stderr and "does not compile" in r.stderr


def test_server_flags_become_options():
    _, server = parse("--max-logprobs", "5", "--response-role", "bot", "--root-path", "/api",
                      "--uvicorn-log-level", "warning", "--disable-log-requests", "--disable-uvicorn-access-log")
    assert (server["max_logprobs"], server["response_role"], server["root_path"]) == (5, "bot", "/api")
    assert server["uvicorn_log_level"] == "warning" and server["log_level"] == "info"
    assert server["enable_log_requests"] is False and server["access_log"] is False
    assert parse("--enable-log-requests")[1]["enable_log_requests"] is True
    assert parse()[1]["max_logprobs"] == 20


@pytest.mark.parametrize("argv, message", [
    (("--max-logprobs", "21"), "max_logprobs must be an integer in [0, 20]"),
    (("--max-logprobs", "-1"), "max_logprobs must be an integer in [0, 20]"),
    (("--response-role", ""), "response_role must be a non-empty string"),
    (("--root-path", "api"), "root_path must be empty or a path like /api"),
    (("--root-path", "/api/"), "root_path must be empty or a path like /api"),
    (("--ssl-keyfile", "k.pem"), "HTTPS needs --ssl-certfile"),
    (("--ssl-certfile", "/no/such/cert.pem"), "cannot use --ssl-certfile '/no/such/cert.pem'"),
])
def test_bad_server_values_are_refused(argv, message):
    with pytest.raises(ValueError) as err:
        parse(*argv)
    assert message in str(err.value)


def test_revision_and_download_dir_reach_the_hub(monkeypatch, tmp_path):
    import huggingface_hub

    from deepinfer.engine import resolve_model_path

    calls = []

    def snapshot_download(repo_id, **kwargs):
        calls.append((repo_id, kwargs))
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    engine, _ = parse("deepseek-ai/DeepSeek-V2-Lite", "--revision", "abc123", "--download-dir", str(tmp_path))
    assert engine == {"model_name_or_path": "deepseek-ai/DeepSeek-V2-Lite", "revision": "abc123",
                      "download_dir": str(tmp_path)}
    assert resolve_model_path(**{"name": engine["model_name_or_path"], "revision": "abc123",
                                 "download_dir": str(tmp_path)}) == (tmp_path, None)
    (repo, kwargs), = calls
    assert repo == "deepseek-ai/DeepSeek-V2-Lite" and kwargs["revision"] == "abc123"
    assert kwargs["cache_dir"] == str(tmp_path)


def test_revision_of_a_local_directory_is_ignored_with_a_warning(caplog):
    from deepinfer.engine import resolve_model_path

    with caplog.at_level("WARNING", logger="deepinfer"):
        assert resolve_model_path(str(TRAINED_MODEL_DIR), revision="main") == (TRAINED_MODEL_DIR, None)
    assert "revision='main' is ignored: the model is the local directory" in caplog.text


def test_help_lists_the_vllm_flags():
    r = serve_cli("--help")
    assert r.returncode == 0
    for flag in ("--block-size", "--chat-template", "--enable-chunked-prefill", "--revision", "--download-dir",
                 "--ssl-keyfile", "--ssl-certfile", "--root-path", "--disable-log-requests", "--max-logprobs",
                 "--response-role", "--uvicorn-log-level", *INAPPLICABLE):
        assert flag in r.stdout, flag
