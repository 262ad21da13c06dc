"""Prefix caching on a GPU, random weights of a DeepSeek shape, with and without caching; each run gets a fresh
engine. Two workloads:

`--workload system-prompt` (default): ShareGPT requests behind one common system prompt — TTFT (median) and
throughput of the whole offline run. Every request is the same `--system-tokens` system prompt followed by a
ShareGPT first-turn prompt, all submitted at once. The first requests to reach the model compute the system prompt;
the rest find its pages cached. A third run, caching on with no shared prefix, measures the cost of caching at a 0%
hit rate.

`--workload multi-turn`: a replay of ShareGPT conversations, as a chat client sends them. Every conversation runs
at once, its turns one after another: turn i resends the whole conversation so far (every earlier prompt, the tokens
the engine generated for it, then the next user turn), so with caching only the new user turn (and the tail of the
last page) is computed. TTFT of the turns after the first, and throughput.

  python3 benchmarks/gpu/prefix_cache_bench.py --sharegpt sharegpt_v3_filtered_1000.json --out OUT
  python3 benchmarks/gpu/prefix_cache_bench.py --workload multi-turn --sharegpt ... --conversations 256 --out OUT
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import (SHAPE_NAMES, run_metadata, shape_config, sharegpt_conversations,  # noqa: E402
                          sharegpt_prompts, write_json)
from engine_bench import write_model_dir  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=SHAPE_NAMES, default="v2-lite")
    ap.add_argument("--workload", choices=["system-prompt", "multi-turn"], default="system-prompt")
    ap.add_argument("--conversations", type=int, default=256, help="multi-turn: conversations replayed at once")
    ap.add_argument("--turns", type=int, default=6, help="multi-turn: user turns kept per conversation (at least 2)")
    ap.add_argument("--turn-tokens", type=int, default=512, help="multi-turn: tokens kept per user turn")
    ap.add_argument("--sharegpt", type=Path, required=True, help="sharegpt_v3_filtered_1000.json")
    ap.add_argument("--num-prompts", type=int, default=1000)
    ap.add_argument("--system-tokens", type=int, default=2000, help="tokens of the common system prompt")
    ap.add_argument("--prompt-tokens", type=int, default=1024, help="ShareGPT prompt tokens kept per request")
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=16384)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--run-s", type=float, default=120.0, help="abort a run after this long")
    ap.add_argument("--out", type=Path, default=Path("."))
    return ap.parse_args(argv)


def offline_run(model_dir: Path, prompts: list[list[int]], caching: bool, args) -> dict:
    from deepinfer import SamplingParams

    max_len = max(len(p) for p in prompts) + args.output_tokens + 8
    engine = make_engine(model_dir, max_len, caching, args)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=args.output_tokens, ignore_eos=True)
        engine.generate({"prompt_token_ids": [1, 2, 3]}, params)  # warm-up: graphs and workspaces, nothing shared
        before = engine.stats()
        t0 = time.perf_counter()
        streams = [engine.submit({"prompt_token_ids": p}, params) for p in prompts]
        while not all(s.finished for s in streams) and time.perf_counter() < t0 + args.run_s:
            time.sleep(0.01)
        partial = not all(s.finished for s in streams)
        for s in streams:
            if not s.finished:
                s.abort()
        outs = [s.result(timeout=120) for s in streams]
        after = engine.stats()
    finally:
        engine.shutdown()
    done = [o for o in outs if o.outputs[0].finish_reason == "length"]
    wall = max(o.metrics.finish_time for o in done) - min(o.metrics.arrival_time for o in outs)
    queries = after.prefix_cache_queries - before.prefix_cache_queries
    hits = after.prefix_cache_hits - before.prefix_cache_hits
    return {"caching": caching, "status": "partial: time limit" if partial else "ok", "requests": len(prompts),
            "completed": len(done), "wall_s": wall, "requests_per_s": len(done) / wall,
            "output_tokens_per_s": sum(len(o.token_ids) for o in done) / wall,
            "ttft_s_median": statistics.median(o.ttft_s for o in done),
            "ttft_s_p90": statistics.quantiles([o.ttft_s for o in done], n=10)[-1] if len(done) >= 10 else None,
            "prompt_tokens_computed": after.num_prompt_tokens_computed - before.num_prompt_tokens_computed,
            "cache_hit_rate": hits / queries if queries else 0.0,
            "cached_tokens_per_request_mean": statistics.mean(o.num_cached_tokens for o in done)}


def make_engine(model_dir: Path, max_len: int, caching: bool, args):
    from deepinfer import DeepInferenceEngine, EngineConfig

    return DeepInferenceEngine(EngineConfig(model_name_or_path=str(model_dir), load_format="dummy", device=args.device,
                                            seed=0, max_model_len=max_len, max_num_seqs=args.max_num_seqs,
                                            max_num_batched_tokens=args.max_num_batched_tokens,
                                            enable_prefix_caching=caching))


def multi_turn_run(model_dir: Path, conversations: list[list[list[int]]], caching: bool, args) -> dict:
    """Every conversation in a thread of its own, its turns in order, each resending the conversation so far."""
    from deepinfer import SamplingParams

    max_len = max(sum(len(t) + args.output_tokens for t in chat) for chat in conversations) + 8
    engine = make_engine(model_dir, max_len, caching, args)
    params = SamplingParams(temperature=0.0, max_tokens=args.output_tokens, ignore_eos=True)
    turns: list[dict] = []  # one record a turn
    lock = threading.Lock()
    deadline = [0.0]

    def replay(chat: list[list[int]]) -> None:
        history: list[int] = []
        for i, user in enumerate(chat):
            if time.perf_counter() > deadline[0]:
                return
            prompt = history + user
            out = engine.submit({"prompt_token_ids": prompt}, params).result(timeout=args.run_s + 120)
            with lock:
                turns.append({"turn": i, "prompt_tokens": len(prompt), "cached": out.num_cached_tokens,
                              "ttft_s": out.ttft_s, "output_tokens": len(out.token_ids),
                              "finished": out.metrics.finish_time, "arrival": out.metrics.arrival_time})
            history = prompt + list(out.token_ids)

    try:
        engine.generate({"prompt_token_ids": [1, 2, 3]}, params)  # warm-up: graphs and workspaces, nothing shared
        before = engine.stats()
        t0 = time.perf_counter()
        deadline[0] = t0 + args.run_s
        threads = [threading.Thread(target=replay, args=(chat,), daemon=True) for chat in conversations]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        after = engine.stats()
    finally:
        engine.shutdown()
    later = [t for t in turns if t["turn"] > 0]
    queries = after.prefix_cache_queries - before.prefix_cache_queries
    hits = after.prefix_cache_hits - before.prefix_cache_hits
    expected = sum(len(chat) for chat in conversations)
    return {"caching": caching, "status": "ok" if len(turns) == expected else "partial: time limit",
            "conversations": len(conversations), "turns": len(turns), "turns_expected": expected, "wall_s": wall,
            "output_tokens_per_s": sum(t["output_tokens"] for t in turns) / wall,
            "ttft_s_median_later_turns": statistics.median(t["ttft_s"] for t in later) if later else None,
            "ttft_s_median_first_turns": statistics.median(t["ttft_s"] for t in turns if t["turn"] == 0),
            "prompt_tokens_sent": sum(t["prompt_tokens"] for t in turns),
            "prompt_tokens_computed": after.num_prompt_tokens_computed - before.num_prompt_tokens_computed,
            "cached_tokens_later_turns_mean": statistics.mean(t["cached"] for t in later) if later else 0.0,
            "cache_hit_rate": hits / queries if queries else 0.0}


def result_header(what: str, args, sharegpt: dict) -> dict:
    """The result file's description of a run: what it measures, the machine and commit, the settings, the prompts."""
    return {"what": what, **run_metadata(), "shape": args.shape,
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "sharegpt": sharegpt, "runs": {}}


def main_multi_turn(args, c: dict) -> int:
    conversations, info = sharegpt_conversations(args.sharegpt, args.conversations, c["vocab_size"],
                                                 args.turn_tokens, args.turns)
    result = result_header("prefix caching: a replay of ShareGPT conversations, every turn resending the "
                           "conversation so far, with and without caching (fresh engine each run)", args, info)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, _ = write_model_dir(Path(tmp), args.shape, c)
        for name, caching in (("multi-turn, caching off", False), ("multi-turn, caching on", True)):
            row = multi_turn_run(model_dir, conversations, caching, args)
            result["runs"][name] = row
            print(f"{name}: {row['output_tokens_per_s']:,.0f} output tok/s, median TTFT of later turns "
                  f"{1e3 * row['ttft_s_median_later_turns']:.1f} ms, hit rate {100 * row['cache_hit_rate']:.1f}%, "
                  f"{row['prompt_tokens_computed']:,} of {row['prompt_tokens_sent']:,} prompt tokens computed, "
                  f"{row['turns']}/{row['turns_expected']} turns ({row['status']})", flush=True)
            write_json(args.out / "prefix_cache_multi_turn_bench.json", result)
    on, off = result["runs"]["multi-turn, caching on"], result["runs"]["multi-turn, caching off"]
    ttft_ratio = off["ttft_s_median_later_turns"] / on["ttft_s_median_later_turns"]
    print(f"multi-turn: median TTFT of later turns {ttft_ratio:.2f}x lower, throughput "
          f"{on['output_tokens_per_s'] / off['output_tokens_per_s']:.2f}x")
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    c = shape_config(args.shape)
    if args.workload == "multi-turn":
        return main_multi_turn(args, c)
    prompts, info = sharegpt_prompts(args.sharegpt, args.num_prompts, c["vocab_size"], args.prompt_tokens)
    rng = random.Random(0)
    system = [rng.randrange(3, c["vocab_size"]) for _ in range(args.system_tokens)]
    shared = [system + p for p in prompts]
    result = result_header("prefix caching: ShareGPT requests behind a common system prompt, offline, with and "
                           "without caching (fresh engine each run)", args, info)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, _ = write_model_dir(Path(tmp), args.shape, c)
        for name, batch, caching in (("shared prompt, caching off", shared, False),
                                     ("shared prompt, caching on", shared, True),
                                     ("no shared prompt, caching on", prompts, True),
                                     ("no shared prompt, caching off", prompts, False)):
            row = offline_run(model_dir, batch, caching, args)
            result["runs"][name] = row
            print(f"{name}: {row['output_tokens_per_s']:,.0f} output tok/s, median TTFT "
                  f"{1e3 * row['ttft_s_median']:.1f} ms, hit rate {100 * row['cache_hit_rate']:.1f}%, "
                  f"{row['completed']}/{row['requests']} ({row['status']})", flush=True)
            write_json(args.out / "prefix_cache_bench.json", result)
    runs = result["runs"]
    on, off = runs["shared prompt, caching on"], runs["shared prompt, caching off"]
    print(f"shared prompt: median TTFT {off['ttft_s_median'] / on['ttft_s_median']:.2f}x lower, throughput "
          f"{on['output_tokens_per_s'] / off['output_tokens_per_s']:.2f}x; no shared prompt: caching costs "
          f"{100 * (1 - runs['no shared prompt, caching on']['output_tokens_per_s'] / runs['no shared prompt, caching off']['output_tokens_per_s']):.1f}%"
          " of throughput")
    return 0


if __name__ == "__main__":
    sys.exit(main())
