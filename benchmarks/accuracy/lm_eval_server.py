"""The second perplexity measurement: lm-evaluation-harness's loglikelihood_rolling through `deepinfer serve`.

For one configuration (its `deepinfer serve` flags: the weights' quantization, the latent cache's dtype): start
`deepinfer serve` with them (the demo model, on the CPU, at a free loopback port), wait until it
answers /health, run `lm_eval run --model local-completions` with tasks/deepinfer_demo_heldout.yaml over the held-out
text, stop the server, and read back the total loglikelihood lm-eval summed over the document. lm-eval reports word
and byte perplexity only; the token perplexity is exp(-loglikelihood / tokens) with the engine measurement's token
count (the same tokenizer.json, so the same tokens).

lm-eval is called as a program (``python -m lm_eval``), possibly from another environment: --lm-eval-python.
"""

from __future__ import annotations

import contextlib
import glob
import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
TASK_NAME = "deepinfer_demo_heldout"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get_json(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


@contextlib.contextmanager
def served(server_args: list[str], max_model_len: int, log_path: Path, start_timeout_s: float = 300.0):
    """A running `deepinfer serve` of the demo model with ``server_args`` added; yields (base URL, served model name,
    the command); always stopped after."""
    port = free_port()
    cmd = [sys.executable, "-m", "deepinfer.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--device", "cpu", "--max-model-len", str(max_model_len), "--log-level", "warning", "--no-access-log",
           *server_args]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + start_timeout_s
            while True:
                if server.poll() is not None:
                    raise RuntimeError(f"deepinfer serve exited with {server.returncode}; see {log_path}")
                try:
                    _get_json(f"{base}/health")
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"deepinfer serve not up after {start_timeout_s:.0f} s; see {log_path}")
                    time.sleep(0.5)
            model = _get_json(f"{base}/v1/models")["data"][0]["id"]
            yield base, model, cmd
        finally:
            server.terminate()  # SIGTERM: the server drains and exits
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def write_dataset(text: str, folder: Path) -> Path:
    """heldout.jsonl (the task's data_files), one document: the whole held-out text."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "heldout.jsonl"
    path.write_text(json.dumps({"text": text}, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def lm_eval_command(lm_eval_python: str, base_url: str, model: str, tokenizer_dir: Path, max_length: int,
                    output_path: Path) -> list[str]:
    model_args = ",".join([
        f"base_url={base_url}/v1/completions", f"model={model}", f"tokenizer={tokenizer_dir}",
        "tokenizer_backend=huggingface", "tokenized_requests=True", f"max_length={max_length}",
        "num_concurrent=1", "max_retries=1", "timeout=600",
    ])
    return [lm_eval_python, "-m", "lm_eval", "run", "--model", "local-completions", "--model_args", model_args,
            "--tasks", TASK_NAME, "--include_path", str(TASKS_DIR), "--batch_size", "1",
            "--output_path", str(output_path), "--log_samples", "--verbosity", "WARNING"]


def read_results(output_path: Path) -> dict:
    """lm-eval's reported metrics and the document's total loglikelihood (from the logged sample)."""
    results_files = sorted(glob.glob(str(output_path / "**" / "results_*.json"), recursive=True))
    samples_files = sorted(glob.glob(str(output_path / "**" / f"samples_{TASK_NAME}_*.jsonl"), recursive=True))
    if not results_files or not samples_files:
        raise FileNotFoundError(f"lm-eval wrote no results/samples under {output_path}")
    metrics = json.loads(Path(results_files[-1]).read_text())["results"][TASK_NAME]
    samples = [json.loads(line) for line in Path(samples_files[-1]).read_text().splitlines() if line.strip()]
    if len(samples) != 1:
        raise ValueError(f"expected one document, lm-eval logged {len(samples)}")
    # word_perplexity's per-document value is the pair (loglikelihood, words).
    loglikelihood, words = samples[0]["word_perplexity"]
    return {
        "loglikelihood": float(loglikelihood),
        "words": int(words),
        "word_perplexity": metrics["word_perplexity,none"],
        "byte_perplexity": metrics["byte_perplexity,none"],
        "bits_per_byte": metrics["bits_per_byte,none"],
    }


def measure(label: str, server_args: list[str], text: str, tokens: int, window: int, tokenizer_dir: Path,
            work: Path, lm_eval_python: str, timeout_s: float) -> dict:
    """One lm-eval run through a fresh server started with ``server_args``, its files under work/label; the token
    perplexity over ``tokens`` tokens."""
    run_dir = work / label
    write_dataset(text, run_dir)
    max_length = window + 1  # local-completions keeps one position for the generated token
    with served(server_args, max_length, run_dir / "server.log") as (base_url, model, server_cmd):
        cmd = lm_eval_command(lm_eval_python, base_url, model, tokenizer_dir, max_length, run_dir / "lm_eval_out")
        env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
                   HF_DATASETS_CACHE=str(run_dir / "hf_datasets_cache"))
        start = time.perf_counter()
        with open(run_dir / "lm_eval.log", "w") as log:
            done = subprocess.run(cmd, cwd=run_dir, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s)
        seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"lm_eval exited with {done.returncode}; see {run_dir / 'lm_eval.log'}")
    res = read_results(run_dir / "lm_eval_out")
    nats = -res["loglikelihood"] / tokens
    # The commands as recorded: this machine's paths and the port replaced by names.
    names = {base_url: "http://127.0.0.1:PORT", str(tokenizer_dir): "DEMO_MODEL_DIR", str(run_dir): "OUT",
             str(TASKS_DIR): "benchmarks/accuracy/tasks", lm_eval_python: "python",
             f"--port {base_url.rsplit(':', 1)[1]}": "--port PORT"}
    res.update(tokens=tokens, max_length=max_length, nats_per_token=nats,
               perplexity=math.exp(nats), seconds=round(seconds, 1),
               server_command=_named(["deepinfer", "serve"] + server_cmd[4:], names),
               lm_eval_command=_named(cmd, names))
    return res


def _named(argv: list[str], names: dict[str, str]) -> str:
    text = " ".join(argv)
    for value, name in sorted(names.items(), key=lambda kv: -len(kv[0])):  # longest first: a path inside another
        text = text.replace(value, name)
    return text
