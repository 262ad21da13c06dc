"""The `deepinfer` command: generate, chat, plan, serve, bench."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from deepinfer.engine_args import add_engine_arguments, engine_values, finite_float


def _add_sampling_arguments(p: argparse.ArgumentParser, default_max_tokens: int) -> None:
    # finite_float: float() takes 'nan' and 'inf', which no sampling value means.
    sampling = p.add_argument_group("sampling")
    sampling.add_argument("--max-tokens", type=int, default=default_max_tokens,
                          help="tokens to generate at most (default: %(default)s)")
    sampling.add_argument("--temperature", type=finite_float, default=0.7, help="0 = greedy (default: %(default)s)")
    sampling.add_argument("--top-p", type=finite_float, default=0.95,
                          help="nucleus sampling mass, in (0, 1] (default: %(default)s)")
    sampling.add_argument("--top-k", type=int, default=0,
                          help="keep the k most likely tokens (default: %(default)s = off)")
    sampling.add_argument("--min-p", type=finite_float, default=0.0,
                          help="drop tokens below min_p x the top probability (default: %(default)s)")
    sampling.add_argument("--repetition-penalty", type=finite_float, default=1.0,
                          help="> 1 discourages repeats (default: %(default)s)")
    sampling.add_argument("--sampling-seed", type=int, default=None,
                          help="seed of the request, for reproducible output (default: none)")
    sampling.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")


def _engine(args: argparse.Namespace):
    from deepinfer import DeepInferenceEngine, EngineConfig

    config = EngineConfig.from_dict(engine_values(args))  # only the flags given; EngineConfig's defaults otherwise
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


def _line_editing() -> None:
    """Arrow keys, history and Ctrl-R at the prompt (readline), when the prompt is a terminal and readline exists."""
    if sys.stdin.isatty():
        try:
            import readline  # noqa: F401  (importing it is what turns line editing on for input())
        except ImportError:  # e.g. a Python built without it: plain input() still works
            pass


def _reply(engine, ids: list[int], params) -> str:
    """Streams one reply to stdout; Ctrl-C stops it (the request is aborted) and keeps what came so far."""
    stream = engine.submit({"prompt_token_ids": ids}, params)
    parts: list[str] = []
    try:
        for delta in stream:
            parts.append(delta.outputs[0].text)
            sys.stdout.write(delta.outputs[0].text)
            sys.stdout.flush()
    except KeyboardInterrupt:
        stream.abort()
        sys.stdout.write(" [stopped]")
    sys.stdout.write("\n")
    return "".join(parts)


def cmd_chat(args: argparse.Namespace) -> int:
    engine = _engine(args)
    params = _sampling(args)
    messages: list[dict[str, str]] = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    _line_editing()
    print("Chatting with the model. Empty line, /exit or Ctrl-D quits; Ctrl-C stops a reply; /reset clears the "
          "history.", file=sys.stderr)
    try:
        while True:
            try:
                line = input("you> ")
            except EOFError:
                break
            except KeyboardInterrupt:  # at the prompt, as in Python's own REPL: a fresh line, the session goes on
                sys.stdout.write("\n")
                continue
            if line.strip() in ("", "/exit", "/quit"):
                break
            if line.strip() == "/reset":
                messages = messages[:1] if args.system else []
                print("(history cleared" + (", the system prompt kept)" if args.system else ")"), file=sys.stderr)
                continue
            messages.append({"role": "user", "content": line})
            sys.stdout.write("model> ")
            messages.append({"role": "assistant", "content": _reply(engine, engine.render_chat(messages), params)})
    finally:
        engine.shutdown()
    return 0


# Commands that need none of the server modules: when one of them runs, serve and bench are listed without
# importing theirs (the HTTP stack), which would double the start-up of `deepinfer plan`.
_LIGHT_COMMANDS = ("generate", "chat", "plan")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with `command` one of _LIGHT_COMMANDS, serve and bench only as names (what runs is
    `command`, so their flags are never parsed)."""
    load_servers = command not in _LIGHT_COMMANDS
    parser = argparse.ArgumentParser(prog="deepinfer", description="DeepInfer: serve and run DeepSeek V2/V3 models.")
    parser.add_argument("--version", action=_VersionAction,
                        help="print the version, the backends of this build and the GPUs it sees, and exit")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="complete one prompt and print the text")
    gen.add_argument("prompt", help="the prompt text")
    add_engine_arguments(gen)
    _add_sampling_arguments(gen, default_max_tokens=64)
    gen.add_argument("--stream", action="store_true", help="print text as it is generated")
    gen.add_argument("--verbose", "-v", action="store_true", help="print token count and timing to stderr")
    gen.set_defaults(func=cmd_generate)

    chat = sub.add_parser("chat", help="interactive chat with the model's chat template")
    add_engine_arguments(chat)
    _add_sampling_arguments(chat, default_max_tokens=256)
    chat.add_argument("--system", default=None, help="system prompt")
    chat.set_defaults(func=cmd_chat)

    from deepinfer.plan_cli import DESCRIPTION as PLAN_DESCRIPTION, add_plan_arguments, run_plan

    plan = sub.add_parser("plan", help="whether a deployment fits its GPUs, from config.json, in a second",
                          description=PLAN_DESCRIPTION)
    add_plan_arguments(plan)
    plan.set_defaults(func=run_plan)

    if not load_servers:
        sub.add_parser("serve", help="OpenAI-compatible HTTP server")
        sub.add_parser("bench", help="benchmarks")
        return parser
    _add_server_command(sub, "serve", "OpenAI-compatible HTTP server", "deepinfer.server.cli", "add_serve_arguments",
                        "run_serve")
    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    _add_server_command(bench_sub, "serve", "Poisson-arrival load test of an OpenAI-compatible endpoint",
                        "deepinfer.bench.serve", "add_bench_serve_arguments", "run_bench_serve")
    return parser


class _VersionAction(argparse.Action):
    """``--version``: like argparse's "version" action, but the text (which loads the extension to count GPUs) is
    only built when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        from deepinfer.build_info import format_build_info

        print(format_build_info())
        parser.exit()


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
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)  # the global options take no values
    args = build_parser(command).parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, NotADirectoryError) as e:
        print(f"deepinfer: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
