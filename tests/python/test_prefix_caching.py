"""Prefix caching: requests that share a prefix share its latent-cache pages and compute only their suffix, with
the same greedy tokens as without caching (checkpoints of both architectures, whole and partial page matches,
chunked prefill across page boundaries, preemption, a cache of a few pages)."""

from __future__ import annotations

import pytest

from deepinfer import DeepInferenceEngine, EngineConfig, SamplingParams

PAGE = 4
SYSTEM = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]  # 2 full pages and 3 tokens of a third
TAILS = [[30, 31, 32], [40, 41], [50, 51, 52, 53, 54, 55, 56], [30, 31, 33]]


def run(path, prompts, caching: bool, **overrides) -> tuple[list, DeepInferenceEngine]:
    config = dict(model_name_or_path=str(path), page_size=PAGE, num_cache_pages=64, max_model_len=96,
                  enable_prefix_caching=caching, max_num_batched_tokens=7, seed=3)
    config.update(overrides)
    engine = DeepInferenceEngine(EngineConfig(**config))
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    # One at a time, so that each request finds the pages of the ones before it.
    outs = [engine.generate({"prompt_token_ids": p}, params)[0] for p in prompts]
    return outs, engine


@pytest.mark.parametrize("arch", ["v3", "v2"])
def test_greedy_tokens_are_the_same_with_and_without_caching(checkpoints, arch):
    prompts = [SYSTEM + t for t in TAILS] + [SYSTEM + TAILS[2]]  # the last one repeats a whole prompt
    ref, e0 = run(checkpoints[arch], prompts, caching=False)
    e0.shutdown()
    got, engine = run(checkpoints[arch], prompts, caching=True)
    try:
        assert [o.token_ids for o in got] == [o.token_ids for o in ref]
        assert got[0].num_cached_tokens == 0
        # The two full pages of the shared prefix; the fourth prompt also shares the first's third page (its tail
        # starts like the first's); the repeat finds all of its full pages but the one holding its last token, which
        # it computes for its logits.
        assert [o.num_cached_tokens for o in got[1:4]] == [8, 8, 12]
        assert got[4].num_cached_tokens == 4 * ((len(prompts[4]) - 1) // 4)
        s = engine.stats()
        assert s.prefix_cache_hits == sum(o.num_cached_tokens for o in got)
        assert s.prefix_cache_queries >= sum(len(p) for p in prompts)
        assert all(o.num_cached_tokens == 0 for o in ref)
    finally:
        engine.shutdown()


def test_outputs_are_cached_too_and_a_small_cache_evicts(checkpoints):
    """A multi-turn follow-up (the conversation so far, sent again) finds the pages of the first turn's output; with
    a cache of a few pages the old prefixes are evicted and everything still matches the uncached run."""
    first = SYSTEM + TAILS[0]
    ref_first, e0 = run(checkpoints["v3"], [first], caching=False)
    e0.shutdown()
    follow_up = first + ref_first[0].token_ids + [60, 61]
    prompts = [first, follow_up] + [[70 + i, 71, 72, 73, 74, 75, 76, 77, 78] for i in range(6)] + [follow_up]
    ref, e1 = run(checkpoints["v3"], prompts, caching=False, num_cache_pages=12, max_model_len=48)
    e1.shutdown()
    got, engine = run(checkpoints["v3"], prompts, caching=True, num_cache_pages=12, max_model_len=48)
    try:
        assert [o.token_ids for o in got] == [o.token_ids for o in ref]
        assert got[1].num_cached_tokens == 4 * ((len(first) + 6 - 1) // 4)  # the first turn's prompt and output
        assert got[-1].num_cached_tokens < got[1].num_cached_tokens  # its pages were evicted by the six others
        assert engine.stats().num_free_cache_pages == engine.stats().num_cache_pages  # nothing leaked
    finally:
        engine.shutdown()


def test_concurrent_requests_with_preemption_match_the_uncached_run(checkpoints):
    """Many requests at once over a cache too small for all of them: preemptions recompute from cached pages."""
    prompts = [SYSTEM + t + [90 + i] for i, t in enumerate(TAILS * 3)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    results = []
    for caching in (False, True):
        engine = DeepInferenceEngine(EngineConfig(model_name_or_path=str(checkpoints["v2"]), page_size=PAGE,
                                                  num_cache_pages=24, max_model_len=64, max_num_batched_tokens=16,
                                                  enable_prefix_caching=caching, seed=3))
        try:
            outs = engine.generate([{"prompt_token_ids": p} for p in prompts], params)
            results.append([o.token_ids for o in outs])
            s = engine.stats()
            assert s.num_preemptions > 0, "the cache should be too small for every request at once"
            if caching:
                assert s.prefix_cache_hits > 0
            assert s.num_free_cache_pages == s.num_cache_pages
        finally:
            engine.shutdown()
    assert results[0] == results[1]


def test_prompt_logprobs_requests_compute_their_whole_prompt(checkpoints):
    engine = DeepInferenceEngine(EngineConfig(model_name_or_path=str(checkpoints["v3"]), page_size=PAGE,
                                              num_cache_pages=64, max_model_len=96, seed=3))
    try:
        prompt = {"prompt_token_ids": SYSTEM + TAILS[0]}
        engine.generate(prompt, SamplingParams(max_tokens=2))
        scored = engine.generate(prompt, SamplingParams(max_tokens=0, prompt_logprobs=0))[0]
        assert scored.num_cached_tokens == 0
        assert len(scored.prompt_logprobs) == len(prompt["prompt_token_ids"])
        assert all(entry is not None for entry in scored.prompt_logprobs[1:])
    finally:
        engine.shutdown()
