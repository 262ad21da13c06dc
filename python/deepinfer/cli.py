"""The `deepinfer` command: generate, chat, serve, bench."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

DEFAULT_MODEL_HELP = "Hugging Face DeepSeek V2/V3 directory (default: the embedded demo model)"


def _add_engine_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help=DEFAULT_MODEL_HELP)
    p.add_argument("--tokenizer", default=None, help="directory with tokenizer.json (default: the model's)")
    p.add_argument("--max-model-len", type=int, default=None, help="longest prompt + output, in tokens")
    p.add_argument("--cache-memory-gb", type=float, default=1.0, help="latent cache budget on the CPU, in GiB")
    p.add_argument("--load-format", choices=["auto", "safetensors", "dummy"], default="auto",
                   help="'dummy' uses random weights built from config.json (benchmarks)")
    p.add_argument("--quantization", default=None, help="'fp8': FP8 weights (an FP8 checkpoint as stored, a bf16 one quantized at load); default: the checkpoint's own")
    p.add_argument("--seed", type=int, default=0, help="engine seed (dummy weights, unseeded requests)")


def _add_sampling_arguments(p: argparse.ArgumentParser, default_max_tokens: int) -> None:
    p.add_argument("--max-tokens", type=int, default=default_max_tokens, help="tokens to generate at most")
    p.add_argument("--temperature", type=float, default=0.7, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling mass, in (0, 1]")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    p.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min_p x the top probability")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="> 1 discourages repeats")
    p.add_argument("--sampling-seed", type=int, default=None, help="seed of the request (reproducible output)")
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")


def _engine(args: argparse.Namespace):
    from deepinfer import DeepInferenceEngine, EngineConfig

    config = EngineConfig(model_name_or_path=args.model, tokenizer=args.tokenizer, max_model_len=args.max_model_len,
                          cache_memory_gb=args.cache_memory_gb, load_format=args.load_format,
                          quantization=args.quantization, seed=args.seed)
    engine = DeepInferenceEngine.from_config(config)
    if engine.is_random_model:
        print("note: the embedded model has random weights (no trained demo model in this build): "
              "its output is noise", file=sys.stderr)
    return engine


def _sampling(args: argparse.Namespace):
    from deepinfer import SamplingParams

    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                          top_k=args.top_k, min_p=args.min_p, repetition_penalty=args.repetition_penalty,
                          seed=args.sampling_seed, stop=args.stop)


def cmd_generate(args: argparse.Namespace) -> int:
    engine = _engine(args)
    try:
        params = _sampling(args)
        if args.stream:
            for delta in engine.stream(args.prompt, params):
                sys.stdout.write(delta.outputs[0].text)
                sys.stdout.flush()
            sys.stdout.write("\n")
        else:
            out = engine.generate(args.prompt, params)[0]
            print(out.text)
            if args.verbose:
                print(f"[{len(out.token_ids)} tokens, finish_reason={out.finish_reason}, "
                      f"ttft={out.ttft_s:.3f}s]", file=sys.stderr)
    finally:
        engine.shutdown()
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    engine = _engine(args)
    params = _sampling(args)
    messages: list[dict[str, str]] = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    print("Chatting with the model. Empty line or /exit quits; /reset clears the history.", file=sys.stderr)
    try:
        while True:
            try:
                line = input("you> ")
            except EOFError:
                break
            if line.strip() in ("", "/exit", "/quit"):
                break
            if line.strip() == "/reset":
                messages = messages[:1] if args.system else []
                continue
            messages.append({"role": "user", "content": line})
            ids = engine.render_chat(messages)
            sys.stdout.write("model> ")
            reply = []
            for delta in engine.stream({"prompt_token_ids": ids}, params):
                reply.append(delta.outputs[0].text)
                sys.stdout.write(delta.outputs[0].text)
                sys.stdout.flush()
            sys.stdout.write("\n")
            messages.append({"role": "assistant", "content": "".join(reply)})
    finally:
        engine.shutdown()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="deepinfer", description="DeepInfer: serve and run DeepSeek V2/V3 models.")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="complete one prompt and print the text")
    gen.add_argument("prompt", help="the prompt text")
    _add_engine_arguments(gen)
    _add_sampling_arguments(gen, default_max_tokens=64)
    gen.add_argument("--stream", action="store_true", help="print text as it is generated")
    gen.add_argument("--verbose", "-v", action="store_true", help="print token count and timing to stderr")
    gen.set_defaults(func=cmd_generate)

    chat = sub.add_parser("chat", help="interactive chat with the model's chat template")
    _add_engine_arguments(chat)
    _add_sampling_arguments(chat, default_max_tokens=256)
    chat.add_argument("--system", default=None, help="system prompt")
    chat.set_defaults(func=cmd_chat)

    _add_server_command(sub, "serve", "OpenAI-compatible HTTP server", "deepinfer.server.cli", "add_serve_arguments",
                        "run_serve")
    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    _add_server_command(bench_sub, "serve", "Poisson-arrival load test of an OpenAI-compatible endpoint",
                        "deepinfer.bench.serve", "add_bench_serve_arguments", "run_bench_serve")
    return parser


def _add_server_command(sub, name: str, help_text: str, module: str, add_arguments: str, run: str) -> None:
    """A subcommand whose module needs the optional `server` dependencies: without them it still appears in
    --help and, when run, says what to install instead of failing at import."""
    import importlib

    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        p = sub.add_parser(name, help=f"{help_text} (needs deepinfer[server])")
        p.set_defaults(func=lambda _args, _e=e: _missing(name, _e))
        return
    p = sub.add_parser(name, help=help_text)
    getattr(mod, add_arguments)(p)
    p.set_defaults(func=getattr(mod, run))


def _missing(what: str, error: Exception) -> int:
    print(f"deepinfer {what}: a dependency is missing ({error}); install deepinfer[server]", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, NotADirectoryError) as e:
        print(f"deepinfer: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
