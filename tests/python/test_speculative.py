"""MTP speculative decoding: the checkpoint's MTP layer drafts, one step verifies.

Greedy and seeded outputs are those without drafts (token for token: each position is sampled from the target
distribution with its own random numbers, and a draft is kept when the sample equals it); the distribution of
sampled tokens matches by a chi-square test; the drafts the engine accepts are the ones the MTP layer computed by
transformers' layers (tools/mtp.py) predicts; penalties, stop strings, max_tokens and logprobs behave as without
drafts; bad configurations fail with clear errors."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pytest

from conftest import skip_or_fail, write_checkpoint
from deepinfer import DeepInferenceEngine, EngineConfig, SamplingParams
from deepinfer.config import SpeculativeConfig
from deepinfer.default_model import TRAINED_MODEL_DIR, has_trained_model

REPO = Path(__file__).resolve().parents[2]
PROMPTS = ["ROMEO:\nWhat light through yonder window", "First Citizen:\nBefore we proceed any further, hear me",
           "KING RICHARD III:\nNow is the winter", "To be, or not to be"]


@pytest.fixture(scope="module")
def demo():
    if not has_trained_model():
        skip_or_fail("the embedded demo model (with its MTP layer) is missing")
    return TRAINED_MODEL_DIR


def make_engine(k: int, **overrides) -> DeepInferenceEngine:
    config = dict(device="cpu", seed=5)
    if k > 0:
        config["speculative_config"] = {"method": "mtp", "num_speculative_tokens": k}
    config.update(overrides)
    return DeepInferenceEngine(EngineConfig(**config))


def generate(k: int, prompts, params: SamplingParams, **overrides):
    engine = make_engine(k, **overrides)
    try:
        return engine.generate(prompts, params, use_tqdm=False), engine.speculative_stats()
    finally:
        engine.shutdown()


@pytest.mark.parametrize("k", [1, 2, 3])
def test_greedy_output_is_the_output_without_drafts(demo, k):
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    ref, _ = generate(0, PROMPTS, params)
    got, stats = generate(k, PROMPTS, params)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in ref]
    assert [o.outputs[0].text for o in got] == [o.outputs[0].text for o in ref]
    # The drafts are worth something: the demo model's MTP layer guesses its next token most of the time.
    assert stats["num_drafts"] > 0 and stats["acceptance_rate_per_position"][0] > 0.4
    assert len(stats["acceptance_rate_per_position"]) == k
    assert stats["mean_accepted_length"] == pytest.approx(1 + stats["num_accepted_tokens"] / stats["num_drafts"])
    assert stats["drafter_failure"] is None


def test_greedy_output_holds_with_chunked_prefill_preemption_and_shared_prefixes(demo):
    """Prompt chunks of up to 6 tokens cross page boundaries (pages of 4), a cache of 24 pages preempts, and the prompts
    share a prefix (prefix caching on): every one of these paths keeps the MTP layer's cache in step."""
    system = "ROMEO:\nBut soft, what light through yonder window breaks? "
    prompts = [system + p for p in PROMPTS] * 2
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    small = dict(page_size=4, num_cache_pages=24, max_num_batched_tokens=6, max_model_len=96)
    ref, _ = generate(0, prompts, params, **small)
    engine = make_engine(2, **small)
    try:
        got = engine.generate(prompts, params, use_tqdm=False)
        s = engine.stats()
        assert s.num_preemptions > 0 and s.prefix_cache_hits > 0
        assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in ref]
        assert engine.speculative_stats()["acceptance_rate"] > 0.3
    finally:
        engine.shutdown()


def test_seeded_sampling_is_the_output_without_drafts(demo):
    params = [SamplingParams(temperature=0.8, top_p=0.9, top_k=50, max_tokens=32, seed=s, ignore_eos=True)
              for s in range(len(PROMPTS))]
    ref, _ = generate(0, PROMPTS, params)
    got, stats = generate(3, PROMPTS, params)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in ref]
    assert stats["num_accepted_tokens"] > 0


def _chi2_quantile(df: int, z: float) -> float:
    """Wilson-Hilferty: the chi-square quantile of `df` degrees of freedom at the normal quantile z."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def _homogeneity(a: list[int], b: list[int]) -> tuple[float, int]:
    """Chi-square statistic of two equally large samples of categories (rare ones pooled) and its df."""
    from collections import Counter

    ca, cb = Counter(a), Counter(b)
    stat, df, pooled_a, pooled_b = 0.0, -1, 0, 0
    for key in set(ca) | set(cb):
        x, y = ca[key], cb[key]
        if x + y < 10:
            pooled_a, pooled_b = pooled_a + x, pooled_b + y
            continue
        stat, df = stat + (x - y) ** 2 / (x + y), df + 1
    if pooled_a + pooled_b > 0:
        stat, df = stat + (pooled_a - pooled_b) ** 2 / (pooled_a + pooled_b), df + 1
    return stat, df


def test_sampled_tokens_follow_the_distribution_without_drafts(demo):
    """Token frequencies at output positions 1..3 of many samples (different seeds on each side, so the samples are
    independent) pass a chi-square homogeneity test at the 0.1% level; a slightly colder distribution fails it, so
    the test can tell."""
    n = 1200
    prompt = "ROMEO:\nWhat light through yonder window"

    def samples(k: int, temperature: float, first_seed: int) -> list[list[int]]:
        params = [SamplingParams(temperature=temperature, max_tokens=4, seed=first_seed + i, ignore_eos=True)
                  for i in range(n)]
        outs, stats = generate(k, [prompt] * n, params, max_num_seqs=256)
        if k:
            assert stats["num_accepted_tokens"] > 100  # the accepted path is exercised, not only rejections
        return [o.outputs[0].token_ids for o in outs]

    plain = samples(0, 1.0, 0)
    drafted = samples(2, 1.0, 10_000)
    colder = samples(0, 0.8, 20_000)
    for pos in (1, 2, 3):
        stat, df = _homogeneity([t[pos] for t in plain], [t[pos] for t in drafted])
        assert stat < _chi2_quantile(df, 3.09), f"position {pos}: chi2 {stat:.1f} with {df} df"
    stats = [_homogeneity([t[pos] for t in plain], [t[pos] for t in colder]) for pos in (1, 2, 3)]
    assert any(stat > _chi2_quantile(df, 3.09) for stat, df in stats), stats


def _reference_accepted(demo: Path, prompt_ids: list[int], output: list[int]) -> tuple[int, int]:
    """(verifications, accepted drafts) of k = 1 greedy decoding of `output`, with drafts computed by the MTP layer
    on transformers' DeepseekV3 layers (tools/mtp.py) over the whole sequence at once."""
    import torch
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(REPO / "tools"))
    from mtp import load_mtp_layer

    model = AutoModelForCausalLM.from_pretrained(demo, dtype=torch.float32).eval()
    mtp = load_mtp_layer(model.config, str(demo)).eval()
    ids = torch.tensor([prompt_ids + output])
    t = ids.shape[1]
    with torch.no_grad():
        hidden = model.model(input_ids=ids).last_hidden_state  # after model.norm
        positions = torch.arange(t - 1).unsqueeze(0)
        mtp_hidden = mtp(hidden[:, : t - 1], model.model.embed_tokens(ids[:, 1:]), positions, model.model.rotary_emb)
        draft = model.lm_head(mtp_hidden).argmax(-1)[0].tolist()  # draft[p]: the guess at token p + 2
    tokens = prompt_ids + output
    last, verifications, accepted = len(prompt_ids), 0, 0  # `last`: the position of the newest token
    while last - len(prompt_ids) + 1 < len(output):
        if last - len(prompt_ids) + 1 >= len(output) - 1:  # no room for a draft's extra token: no draft
            last += 1
            continue
        verifications += 1
        if draft[last - 1] == tokens[last + 1]:
            accepted += 1
            last += 2
        else:
            last += 1
    return verifications, accepted


def test_accepted_drafts_are_those_the_reference_mtp_layer_predicts(demo):
    pytest.importorskip("transformers")
    prompt = PROMPTS[0]
    engine = make_engine(1)
    try:
        out = engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True),
                              use_tqdm=False)[0]
        stats = engine.speculative_stats()
    finally:
        engine.shutdown()
    verifications, accepted = _reference_accepted(demo, out.prompt_token_ids, out.outputs[0].token_ids)
    assert (stats["num_drafts"], stats["num_accepted_tokens"]) == (verifications, accepted)
    assert accepted > 10


def test_penalties_stops_lengths_and_logprobs_behave_as_without_drafts(demo):
    params = [
        SamplingParams(temperature=0.0, max_tokens=30, repetition_penalty=1.3, presence_penalty=0.4,
                       frequency_penalty=0.3, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=60, stop=["\n\n", "thee"], ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=7, logprobs=3, ignore_eos=True),
        SamplingParams(temperature=0.7, max_tokens=25, min_tokens=12, seed=9, stop_token_ids=[13, 11]),
    ]
    ref, _ = generate(0, PROMPTS, params)
    got, stats = generate(3, PROMPTS, params)
    assert stats["num_accepted_tokens"] > 0
    for r, g in zip(ref, got):
        a, b = r.outputs[0], g.outputs[0]
        assert (b.token_ids, b.text, b.finish_reason, b.stop_reason) == (a.token_ids, a.text, a.finish_reason,
                                                                           a.stop_reason)
    assert len(got[2].outputs[0].token_ids) == 7
    for a, b in zip(ref[2].outputs[0].logprobs, got[2].outputs[0].logprobs):
        assert (b.token_id, [t.token_id for t in b.top]) == (a.token_id, [t.token_id for t in a.top])
        assert b.logprob == pytest.approx(a.logprob, abs=1e-4)
        assert [t.logprob for t in b.top] == pytest.approx([t.logprob for t in a.top], abs=1e-4)


def test_streaming_deltas_add_up_to_the_output(demo):
    engine = make_engine(3)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
        whole = engine.generate([PROMPTS[1]], params, use_tqdm=False)[0].outputs[0]
        deltas = list(engine.submit(PROMPTS[1], params))
        assert "".join(d.outputs[0].text for d in deltas) == whole.text
        assert [t for d in deltas for t in d.outputs[0].token_ids] == whole.token_ids
        assert any(len(d.outputs[0].token_ids) > 1 for d in deltas)  # accepted drafts arrive together
    finally:
        engine.shutdown()


def test_forced_acceptance_sets_the_acceptance_rate(demo):
    prompts = PROMPTS * 4
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    for rate in (0.0, 0.5, 1.0):
        engine = make_engine(2, speculative_config={"method": "mtp", "num_speculative_tokens": 2,
                                                    "forced_acceptance": rate})
        try:
            outs = engine.generate(prompts, params, use_tqdm=False)
            stats = engine.speculative_stats()
        finally:
            engine.shutdown()
        assert all(len(o.outputs[0].token_ids) == 40 for o in outs)
        assert stats["acceptance_rate_per_position"][0] == pytest.approx(rate, abs=0.12)


def test_requests_past_disable_by_batch_size_run_without_drafts(demo):
    """vLLM's disable_by_batch_size: the four prompts arrive together with a limit of 2, so the first two admitted draft
    and the other two never do (their positions skip the MTP layer); every output is the output without drafts."""
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    ref, _ = generate(0, PROMPTS, params)
    got, stats = generate(0, PROMPTS, params,
                          speculative_config={"method": "mtp", "num_speculative_tokens": 2, "disable_by_batch_size": 2})
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in ref]
    assert stats["num_requests_not_speculating"] == 2
    _, everyone = generate(2, PROMPTS, params)
    assert everyone["num_requests_not_speculating"] == 0
    # Two requests' verifications instead of four's: about half the drafts (the requests run alike, 40 tokens each).
    assert 0 < stats["num_drafts"] < 0.75 * everyone["num_drafts"]
    # Alone in the engine, a request drafts again.
    _, alone = generate(0, PROMPTS[:1], params,
                        speculative_config={"method": "mtp", "num_speculative_tokens": 2, "disable_by_batch_size": 1})
    assert alone["num_requests_not_speculating"] == 0 and alone["num_drafts"] > 0


def test_a_checkpoint_without_an_mtp_layer_is_refused(tmp_path):
    path = write_checkpoint(tmp_path / "no_mtp", "v3", seed=3)
    with pytest.raises(ValueError, match="no MTP layer"):
        make_engine(1, model_name_or_path=str(path))


@pytest.mark.parametrize("spec, message", [
    ({"method": "eagle", "num_speculative_tokens": 1}, "method must be one of"),
    ({"method": "mtp", "num_speculative_tokens": 0}, r"num_speculative_tokens must be an integer in \[1, 8\]"),
    ({"method": "mtp", "num_speculative_tokens": 9}, r"num_speculative_tokens must be an integer in \[1, 8\]"),
    ({"method": "mtp", "num_speculative_tokens": 1, "draft_len": 2}, "unknown keys"),
    ({"method": "mtp", "model": "some/draft-model"}, "separate draft model"),
    ({"method": "mtp", "forced_acceptance": 1.5}, "forced_acceptance"),
    ({"method": "mtp", "disable_by_batch_size": 0}, "disable_by_batch_size must be None or an integer >= 1"),
    ({"method": "mtp", "disable_by_batch_size": 2.5}, "disable_by_batch_size must be None or an integer >= 1"),
])
def test_bad_speculative_configs_are_refused(spec, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(speculative_config=spec)


@pytest.mark.parametrize("layout", [dict(tensor_parallel_size=2), dict(tensor_parallel_size=2, enable_expert_parallel=True),
                                    dict(tensor_parallel_size=4),
                                    dict(tensor_parallel_size=2, enable_expert_parallel=True, enable_dp_attention=True),
                                    dict(tensor_parallel_size=4, enable_expert_parallel=True, enable_dp_attention=True)],
                         ids=["tp2", "tp2-ep", "tp4", "dp2", "dp4"])
def test_greedy_output_holds_under_tensor_and_expert_parallelism(demo, layout):
    """The drafter runs on rank 0 and every rank runs each pass of the MTP layer over its shard (heads, experts,
    vocabulary); under data-parallel attention each rank runs its own lane's passes (padding ones where it has
    none: 4 prompts on 4 ranks finish at different times) and sends rank 0 its drafts. The tokens are one rank's
    without drafts, and the drafts accepted are one rank's."""
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    ref, _ = generate(0, PROMPTS, params)
    one_rank, one_rank_stats = generate(2, PROMPTS, params)
    got, stats = generate(2, PROMPTS, params, **layout)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in ref]
    assert stats["drafter_failure"] is None and stats["num_drafts"] > 0
    assert stats["num_accepted_tokens"] == one_rank_stats["num_accepted_tokens"]
    assert stats["acceptance_rate_per_position"] == pytest.approx(one_rank_stats["acceptance_rate_per_position"])


@pytest.mark.parametrize("layout", [{}, dict(enable_expert_parallel=True, enable_dp_attention=True)], ids=["tp", "dp"])
def test_ranks_as_processes_run_the_drafts_too(demo, layout):
    """Two commands through the multi-node flags (ranks as processes, gloo between them): the passes of the MTP layer
    travel to the other process as the steps do (and its lane's drafts back, under data-parallel attention)."""
    from test_parallel import free_port, run_nodes, tokens_of

    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    prompts = [[5 + (7 * i + 3 * j) % 500 for j in range(n)] for i, n in enumerate([1, 3, 9, 17, 37, 6, 24, 12])]
    ref = make_engine(0, page_size=4, num_cache_pages=24, max_model_len=64, max_num_batched_tokens=16)
    try:
        expected = [o.outputs[0].token_ids for o in ref.generate([{"prompt_token_ids": p} for p in prompts], params,
                                                                 use_tqdm=False)]
    finally:
        ref.shutdown()
    address = f"127.0.0.1:{free_port()}"
    spec = {"method": "mtp", "num_speculative_tokens": 2}
    nodes = [(dict(tensor_parallel_size=2, nnodes=2, node_rank=r, dist_init_addr=address, speculative_config=spec,
                   device="cpu", **layout), {}) for r in (0, 1)]
    (rc0, out0, err0), (rc1, _, err1) = run_nodes(demo, nodes)
    assert rc0 == 0 and rc1 == 0, (err0[-3000:], err1[-3000:])
    assert tokens_of(out0) == expected




def test_command_line_flags():
    from deepinfer.engine_args import add_engine_arguments, engine_values

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    parse = lambda *argv: EngineConfig.from_dict(engine_values(parser.parse_args(list(argv))))  # noqa: E731
    assert parse("--num-speculative-tokens", "2").speculative_config == SpeculativeConfig("mtp", 2)
    config = parse("--speculative-config", '{"method": "deepseek_mtp", "num_speculative_tokens": 3}')
    assert config.speculative_config == SpeculativeConfig("deepseek_mtp", 3) and config.num_speculative_tokens == 3
    config = parse("--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1, "disable_by_batch_size": 8}')
    assert config.speculative_config.disable_by_batch_size == 8
    assert parse().num_speculative_tokens == 0
    with pytest.raises(ValueError, match="disagrees"):
        parse("--num-speculative-tokens", "2", "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 3}')


def test_metrics_report_the_drafts(demo):
    pytest.importorskip("prometheus_client")
    from deepinfer.server.metrics import ServerMetrics

    engine = make_engine(0, speculative_config={"method": "mtp", "num_speculative_tokens": 2,
                                                "disable_by_batch_size": 1})
    try:
        engine.generate(PROMPTS[:2], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True), use_tqdm=False)
        text = ServerMetrics(engine, "demo").render().decode()
        s = engine.stats()
        assert 'deepinfer_spec_decode_num_requests_not_speculating_total{model_name="demo"} 1.0' in text
        assert f'deepinfer_spec_decode_num_drafts_total{{model_name="demo"}} {float(s.spec_num_drafts)}' in text
        assert (f'deepinfer_spec_decode_num_accepted_tokens_total{{model_name="demo"}} '
                f'{float(s.spec_num_accepted_tokens)}') in text
        assert 'deepinfer_spec_decode_num_accepted_tokens_per_pos_total{model_name="demo",position="1"}' in text
    finally:
        engine.shutdown()


def test_constrained_requests_are_speculated_on_and_keep_their_output(demo):
    """A constrained request keeps the drafts its grammar allows, and each verification row samples under the mask
    after the drafts before it: the output is the one without drafts, and drafts are accepted."""
    from deepinfer.structured_outputs import grammar_library

    if not grammar_library():
        skip_or_fail("llguidance is not installed")
    constraints = [{"regex": r"(ROMEO|JULIET): [a-z ,]{20,60}\."},
                   {"json": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30}},
                             "required": ["name"]}},
                   {"choice": ["To be, or not to be", "that is the question"]}]
    params = [SamplingParams(temperature=0.0, max_tokens=48, structured_outputs=c) for c in constraints]
    prompts = PROMPTS[:len(constraints)]
    ref, _ = generate(0, prompts, params)
    for k in (1, 3):
        got, stats = generate(k, prompts, params)
        assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in ref], k
        assert [o.outputs[0].finish_reason for o in got] == [o.outputs[0].finish_reason for o in ref]
        assert stats["num_drafts"] > 0 and stats["num_accepted_tokens"] > 0, stats
