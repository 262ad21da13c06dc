"""The multi-turn replay of benchmarks/gpu/prefix_cache_bench.py on the CPU (its smoke shape): conversations taken
from a ShareGPT file (real multi-turn ones, or consecutive first turns when the file holds first turns only), every
turn resending the conversation so far, with and without caching."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"))

import bench_common  # noqa: E402
import prefix_cache_bench  # noqa: E402

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex a jovial king".split()


def user_text(i: int) -> str:
    return " ".join(WORDS[(i + j) % len(WORDS)] for j in range(60 + 7 * i))


def test_conversations_keep_their_user_turns_or_chain_first_turns(tmp_path):
    multi = [{"id": "a", "conversations": [{"from": "human", "value": user_text(0)}, {"from": "gpt", "value": "ok"},
                                           {"from": "human", "value": user_text(1)}]},
             {"id": "b", "conversations": [{"from": "human", "value": user_text(2)}]}]  # one turn: left out
    (tmp_path / "multi.json").write_text(json.dumps(multi))
    chats, info = bench_common.sharegpt_conversations(tmp_path / "multi.json", 8, 4096, 1000, max_turns=4)
    assert info["turns_from"] == "conversations" and [len(c) for c in chats] == [2]
    firsts = [{"id": str(i), "conversations": [{"from": "human", "value": user_text(i)}]} for i in range(7)]
    (tmp_path / "firsts.json").write_text(json.dumps(firsts))
    chats, info = bench_common.sharegpt_conversations(tmp_path / "firsts.json", 8, 4096, 16, max_turns=3)
    assert info["turns_from"] == "consecutive first-turn prompts" and [len(c) for c in chats] == [3, 3]
    assert all(len(t) == 16 and max(t) < 4096 for c in chats for t in c)


def test_the_replay_resends_each_conversation_and_caching_computes_only_the_new_turns(tmp_path):
    firsts = [{"id": str(i), "conversations": [{"from": "human", "value": user_text(i)}]} for i in range(9)]
    (tmp_path / "sharegpt.json").write_text(json.dumps(firsts))
    assert prefix_cache_bench.main(["--workload", "multi-turn", "--shape", "smoke", "--device", "cpu",
                                    "--sharegpt", str(tmp_path / "sharegpt.json"), "--conversations", "3",
                                    "--turns", "3", "--turn-tokens", "64", "--output-tokens", "8",
                                    "--max-num-seqs", "4", "--out", str(tmp_path)]) == 0
    runs = json.loads((tmp_path / "prefix_cache_multi_turn_bench.json").read_text())["runs"]
    off, on = runs["multi-turn, caching off"], runs["multi-turn, caching on"]
    for run in (off, on):
        assert run["status"] == "ok" and run["turns"] == 9
    # Each turn resends the earlier turns and their outputs: the same prompts either way.
    assert off["prompt_tokens_sent"] == on["prompt_tokens_sent"] == off["prompt_tokens_computed"]
    assert off["cache_hit_rate"] == 0.0 and off["cached_tokens_later_turns_mean"] == 0
    # With caching the history comes from the cache: at most the new turns (64 tokens each) and, for each of the 6
    # later turns, the tail of the history past its last full page (64 tokens, the default) are computed.
    page, new_tokens = 64, 9 * 64
    assert on["prompt_tokens_computed"] < off["prompt_tokens_computed"]
    assert on["prompt_tokens_computed"] <= new_tokens + 6 * page and on["cached_tokens_later_turns_mean"] >= page
