"""The Python API on a tiny checkpoint: generate, chat, streaming, sampling semantics, bad input, concurrency."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from conftest import load_reference
from deepinfer import DeepInferenceEngine, EngineConfig, SamplingParams

PROMPTS = ["The quick brown fox", "Пример текста", "def f(x):", "DeepSeek models use"]


@pytest.fixture(scope="module")
def engine(checkpoints):
    e = DeepInferenceEngine(EngineConfig(model_name_or_path=str(checkpoints["v3"]), page_size=8, num_cache_pages=64,
                                         max_model_len=128, seed=1))
    yield e
    e.shutdown()


def test_generate_returns_results_in_input_order(engine):
    outs = engine.generate(PROMPTS, temperature=0.0, max_tokens=6)
    singles = [engine.generate(p, temperature=0.0, max_tokens=6)[0] for p in PROMPTS]
    assert [o.prompt for o in outs] == PROMPTS
    for o, s in zip(outs, singles):
        assert o.token_ids == s.token_ids and len(o.token_ids) == 6
        assert o.text == engine.tokenizer.decode(o.token_ids)
        assert o.finish_reason == "length"
        assert o.ttft_s is not None and o.ttft_s >= 0
        assert o.prompt_token_ids == engine.tokenizer.encode(o.prompt)


def test_developers_example_runs_as_written(checkpoints):
    from deepinfer import DeepInferenceEngine, EngineConfig
    prompts = ["Hello, my name is", "The future of AI is"]
    config = EngineConfig(model_name_or_path=str(checkpoints["v2"]), tensor_parallel_size=1, max_model_len=128,
                          gpu_memory_utilization=0.90, enforce_eager=False, quantization=None)
    engine = DeepInferenceEngine.from_config(config)
    outputs = engine.generate(prompts, temperature=0.6, top_p=0.9, max_tokens=8)
    assert [o.prompt for o in outputs] == prompts and all(len(o.token_ids) >= 1 for o in outputs)
    for o in outputs:
        print(o.prompt, o.text)
    engine.shutdown()


def test_stream_yields_increments_that_add_up(engine):
    params = SamplingParams(temperature=0.9, seed=11, max_tokens=12)
    deltas = list(engine.stream(PROMPTS[0], params))
    full = engine.generate(PROMPTS[0], params)[0]
    assert len(deltas) >= 2
    assert "".join(d.outputs[0].text for d in deltas) == full.text
    assert sum((d.outputs[0].token_ids for d in deltas), []) == full.token_ids
    assert deltas[-1].finished and deltas[-1].finish_reason == "length"


def test_forwarded_streams_deliver_everything_in_order(engine):
    """RequestStream.forward_to (how the server reads its streams): the deltas already queued when it is called and
    every later one reach the one queue in order as (tag, delta), then (tag, None); the text is generate()'s."""
    import asyncio

    params = SamplingParams(temperature=0.8, seed=5, max_tokens=16, ignore_eos=True)
    want = [engine.generate(p, params)[0] for p in PROMPTS]

    async def run():
        loop = asyncio.get_running_loop()
        streams = [engine.submit(p, params, loop=loop) for p in PROMPTS]
        while streams[0]._async_queue.empty():  # some deltas arrive before the stream is forwarded
            await asyncio.sleep(0.001)
        q: asyncio.Queue = asyncio.Queue()
        for i, s in enumerate(streams):
            s.forward_to(q, i)
        texts, ids, ended = [""] * len(streams), [[] for _ in streams], set()
        while len(ended) < len(streams):
            i, delta = await q.get()
            assert i not in ended
            if delta is None:
                ended.add(i)
                continue
            texts[i] += delta.outputs[0].text
            ids[i] += delta.outputs[0].token_ids
        return texts, ids

    texts, ids = asyncio.run(run())
    assert texts == [w.text for w in want] and ids == [w.token_ids for w in want]


def test_seed_gives_the_same_text_whatever_else_is_in_the_batch(engine):
    seeded = SamplingParams(temperature=1.0, top_p=0.95, seed=1234, max_tokens=10)
    alone = engine.generate(PROMPTS[1], seeded)[0].token_ids
    others = [SamplingParams(temperature=1.0, max_tokens=10 + i) for i in range(3)]
    batch = engine.generate([PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[3]], [others[0], seeded, others[1], others[2]])
    assert batch[1].token_ids == alone
    different = engine.generate(PROMPTS[1], SamplingParams(temperature=1.0, top_p=0.95, seed=4321, max_tokens=10))[0]
    assert different.token_ids != alone


def test_n_completions_use_consecutive_seeds(engine):
    out = engine.generate(PROMPTS[2], SamplingParams(n=3, temperature=1.0, seed=50, max_tokens=8))[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    for i, c in enumerate(out.outputs):
        single = engine.generate(PROMPTS[2], SamplingParams(temperature=1.0, seed=50 + i, max_tokens=8))[0]
        assert c.token_ids == single.token_ids
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1


def test_greedy_equals_top_k_one(engine):
    greedy = engine.generate(PROMPTS[3], temperature=0.0, max_tokens=10)[0]
    top1 = engine.generate(PROMPTS[3], temperature=1.3, top_k=1, seed=3, max_tokens=10)[0]
    assert greedy.token_ids == top1.token_ids


def test_stop_strings_truncate_and_abort(engine):
    full = engine.generate(PROMPTS[0], temperature=0.0, max_tokens=20, ignore_eos=True)[0]
    text = full.text
    assert len(text) > 6
    stop = text[3:6]
    first = text.find(stop)
    out = engine.generate(PROMPTS[0], temperature=0.0, max_tokens=20, ignore_eos=True, stop=[stop])[0]
    assert out.text == text[:first] and out.finish_reason == "stop" and out.outputs[0].stop_reason == stop
    kept = engine.generate(PROMPTS[0], temperature=0.0, max_tokens=20, ignore_eos=True, stop=[stop],
                           include_stop_str_in_output=True)[0]
    assert kept.text == text[:first + len(stop)]
    streamed = "".join(d.outputs[0].text for d in engine.stream(PROMPTS[0], temperature=0.0, max_tokens=20,
                                                               ignore_eos=True, stop=[stop]))
    assert streamed == out.text


def test_stop_token_ids_and_max_tokens(engine):
    full = engine.generate(PROMPTS[1], temperature=0.0, max_tokens=12, ignore_eos=True)[0].token_ids
    stop_id = full[4]
    out = engine.generate(PROMPTS[1], temperature=0.0, max_tokens=12, ignore_eos=True, stop_token_ids=[stop_id])[0]
    assert out.token_ids == full[: full.index(stop_id) + 1] and out.finish_reason == "stop"
    assert out.outputs[0].stop_reason == stop_id
    held = engine.generate(PROMPTS[1], temperature=0.0, max_tokens=12, ignore_eos=True, stop_token_ids=[stop_id],
                           min_tokens=12)[0]
    assert len(held.token_ids) == 12 and stop_id not in held.token_ids[: 12]


def test_logprobs_match_transformers(engine, checkpoints):
    out = engine.generate(PROMPTS[3], temperature=0.0, max_tokens=3, logprobs=5)[0]
    lp = out.outputs[0].logprobs
    assert len(lp) == 3
    model = load_reference(checkpoints["v3"])
    ids = torch.tensor([out.prompt_token_ids])
    with torch.no_grad():
        ref = torch.log_softmax(model(ids).logits[0, -1].double(), -1).numpy()
    top = [t.token_id for t in lp[0].top]
    assert top == list(np.argsort(-ref)[:5])
    assert lp[0].token_id == out.token_ids[0] == top[0]
    assert np.allclose([t.logprob for t in lp[0].top], ref[top], atol=1e-4)
    assert abs(out.outputs[0].cumulative_logprob - sum(t.logprob for t in lp)) < 1e-6


def test_repetition_penalty_matches_transformers(engine, checkpoints):
    model = load_reference(checkpoints["v3"])
    prompt_ids = engine.tokenizer.encode(PROMPTS[0])
    with torch.no_grad():
        ref = model.generate(torch.tensor([prompt_ids]), max_new_tokens=12, min_new_tokens=12, do_sample=False,
                             repetition_penalty=1.8, attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                             pad_token_id=2)[0, len(prompt_ids):].tolist()
    out = engine.generate({"prompt_token_ids": prompt_ids}, temperature=0.0, max_tokens=12, min_tokens=12,
                          repetition_penalty=1.8)[0]
    assert out.token_ids == ref


def test_chat_uses_the_checkpoint_template(engine):
    messages = [{"role": "user", "content": "Hello there"}]
    rendered = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert rendered.endswith("<|Assistant|>")
    out = engine.chat(messages, temperature=0.0, max_tokens=5)
    ref = engine.generate({"prompt_token_ids": engine.tokenizer.encode(rendered, add_special_tokens=False)},
                          temperature=0.0, max_tokens=5)[0]
    assert out.token_ids == ref.token_ids
    many = engine.chat([messages, messages + [{"role": "assistant", "content": "Hi"}, {"role": "user", "content": "?"}]],
                       temperature=0.0, max_tokens=3)
    assert len(many) == 2 and many[0].token_ids == out.token_ids[:3]


@pytest.mark.parametrize("kwargs, match", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": -3}, "max_tokens"),
    ({"temperature": -0.5}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"min_p": 2.0}, "min_p"),
    ({"presence_penalty": 3.0}, "presence_penalty"),
    ({"logprobs": 50}, "logprobs"),
])
def test_bad_sampling_parameters_raise_and_leave_the_engine_usable(engine, kwargs, match):
    with pytest.raises(ValueError, match=match):
        engine.generate(PROMPTS[0], **kwargs)
    assert len(engine.generate(PROMPTS[0], temperature=0.0, max_tokens=2)[0].token_ids) == 2


def test_bad_prompts_raise_and_leave_the_engine_usable(engine):
    with pytest.raises(ValueError, match="empty"):
        engine.generate("")
    with pytest.raises(ValueError, match="empty"):
        engine.generate({"prompt_token_ids": []})
    with pytest.raises(ValueError, match="max_model_len"):
        engine.generate("word " * 400)
    with pytest.raises(ValueError, match="vocabulary"):
        engine.generate({"prompt_token_ids": [1, 2, 10**6]})
    with pytest.raises(TypeError, match="unknown sampling parameters"):
        engine.generate("x", temprature=0.1)
    # A bad prompt in a batch fails the whole call before anything is queued.
    with pytest.raises(ValueError):
        engine.generate(["fine", ""], max_tokens=2)
    assert engine.stats().num_running == 0 and engine.stats().num_waiting == 0
    assert len(engine.generate(PROMPTS[0], temperature=0.0, max_tokens=2)[0].token_ids) == 2


def test_bad_engine_configs():
    for kwargs, match in [({"tensor_parallel_size": 0}, "tensor_parallel_size"),
                          ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
                          ({"max_model_len": 1}, "max_model_len"), ({"device": "tpu"}, "device"),
                          ({"quantization": "int8"}, "quantization"), ({"page_size": 0}, "page_size")]:
        with pytest.raises(ValueError, match=match):
            EngineConfig(**kwargs)
    # The seed's INT4 form is accepted (it loads on the CPU backend: test_int4.py); 8-bit INT4 is not.
    int4 = EngineConfig(quantization={"method": "int4", "weight_bits": 4, "activation_bits": 16, "group_size": 128,
                                      "fuse_quant_dequant": False}).quantization
    assert (int4.method, int4.weight_bits, int4.activation_bits, int4.group_size) == ("int4", 4, 16, 128)
    with pytest.raises(ValueError, match="weight_bits=4 and activation_bits=16"):
        EngineConfig(quantization={"method": "int4", "weight_bits": 8})
    with pytest.raises(ValueError, match="unknown keys"):
        EngineConfig(quantization={"method": "fp8", "bits": 8})


def test_breaking_out_of_a_stream_aborts_and_frees_pages(engine):
    for i, _ in enumerate(engine.stream(PROMPTS[0], temperature=0.0, max_tokens=100, ignore_eos=True)):
        if i == 2:
            break
    for _ in range(100):
        s = engine.stats()
        if s.num_running == 0 and s.num_free_cache_pages == s.num_cache_pages:
            break
        threading.Event().wait(0.02)
    s = engine.stats()
    assert s.num_running == 0 and s.num_free_cache_pages == s.num_cache_pages


def test_requests_from_many_threads(engine):
    # The reference: each prompt alone, one request at a time from this thread (greedy, so one answer per prompt).
    single = [engine.generate(p, temperature=0.0, max_tokens=4)[0].token_ids for p in PROMPTS]
    assert all(len(t) == 4 for t in single)
    results = {}

    def worker(i):
        results[i] = engine.generate(PROMPTS[i % 4], temperature=0.0, max_tokens=4)[0].token_ids

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 8
    for i in range(8):
        assert results[i] == single[i % 4], f"thread {i}: {results[i]} concurrently, {single[i % 4]} alone"


def test_shutdown_ends_running_and_queued_requests_as_aborted(checkpoints):
    e = DeepInferenceEngine(EngineConfig(model_name_or_path=str(checkpoints["v2"]), page_size=8, num_cache_pages=64,
                                         max_model_len=128, max_num_seqs=2))
    streams = [e.submit(PROMPTS[i % 4], SamplingParams(max_tokens=120, ignore_eos=True)) for i in range(5)]
    next(iter(streams[0]))  # the first request is running
    assert e.stats().num_running + e.stats().num_waiting == 5
    e.shutdown()
    aborted = 0
    for s in streams:
        out = s.result(timeout=10)
        assert out.finished
        if out.finish_reason == "length":  # honest only for a request that made all its tokens before the shutdown
            assert len(out.token_ids) == 120, (len(out.token_ids), "tokens, yet finish_reason length")
        else:
            assert out.finish_reason == "abort" and len(out.token_ids) < 120, (out.finish_reason, len(out.token_ids))
            aborted += 1
    assert aborted >= 3, "the three requests still queued (max_num_seqs 2) must end aborted"
    with pytest.raises(RuntimeError, match="shut down"):
        e.submit("x")


def test_device_choice_without_a_gpu(checkpoints):
    from deepinfer import _deepinfer

    if _deepinfer.cuda_device_count() > 0:
        pytest.skip("a GPU is visible")
    path = str(checkpoints["v2"])
    with pytest.raises(ValueError, match="no CUDA device"):
        DeepInferenceEngine(EngineConfig(model_name_or_path=path, device="cuda"))
    with pytest.raises(ValueError, match="computes in float32"):
        DeepInferenceEngine(EngineConfig(model_name_or_path=path, dtype="bfloat16"))
    with DeepInferenceEngine(EngineConfig(model_name_or_path=path, max_model_len=64)) as e:
        assert e.device == "cpu"  # "auto" falls back to the CPU


def test_stats_time_the_steps_and_count_decode_steps(engine):
    before = engine.stats()
    engine.generate([PROMPTS[0], PROMPTS[1]], temperature=0.0, max_tokens=12, ignore_eos=True)
    after = engine.stats()
    steps = after.num_steps - before.num_steps
    decode_steps = after.num_decode_steps - before.num_decode_steps
    # Two prompts prefill (one step or a few), then both decode together: at least 10 pure decode steps.
    assert 10 <= decode_steps < steps
    decode_s = after.decode_step_seconds - before.decode_step_seconds
    step_s = after.step_seconds - before.step_seconds
    assert 0.0 < decode_s < step_s
    assert after.num_graph_replays == 0  # the CPU has no graphs


def test_prompt_logprobs_match_transformers(checkpoints):
    """prompt_logprobs: each prompt token's logprob under transformers' model given the tokens before it, and the top
    N there; the prompt is prefilled in chunks (max_num_batched_tokens) and scoring only (max_tokens=0) generates
    nothing."""
    engine = DeepInferenceEngine(EngineConfig(model_name_or_path=str(checkpoints["v3"]), page_size=8,
                                              num_cache_pages=64, max_model_len=128, max_num_batched_tokens=5,
                                              seed=1))
    try:
        prompt_ids = engine.tokenizer.encode(PROMPTS[2] + " " + PROMPTS[0] + " " + PROMPTS[1])
        assert len(prompt_ids) > 10  # several chunks
        out = engine.generate({"prompt_token_ids": prompt_ids}, temperature=0.0, max_tokens=0, prompt_logprobs=3)[0]
        scored = engine.generate({"prompt_token_ids": prompt_ids}, temperature=0.0, max_tokens=2, prompt_logprobs=0)[0]
    finally:
        engine.shutdown()
    model = load_reference(checkpoints["v3"])
    with torch.no_grad():
        ref = torch.log_softmax(model(torch.tensor([prompt_ids])).logits[0].double(), -1).numpy()
    assert out.token_ids == [] and out.finish_reason == "length"
    assert len(scored.token_ids) == 2
    lp = out.prompt_logprobs
    assert len(lp) == len(prompt_ids) and lp[0] is None
    for i in range(1, len(prompt_ids)):
        token = prompt_ids[i]
        assert abs(lp[i][token].logprob - ref[i - 1, token]) < 1e-4, i
        top = list(np.argsort(-ref[i - 1])[:3])
        assert set(top) <= set(lp[i]), i
        assert np.allclose([lp[i][t].logprob for t in top], ref[i - 1, top], atol=1e-4)
        assert abs(scored.prompt_logprobs[i][token].logprob - lp[i][token].logprob) < 1e-5
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=21)


def test_vllm_style_llm_runs_as_written(caplog):
    """Code written against vllm.LLM: LLM(model=..., engine arguments under vLLM's names), generate with a
    SamplingParams, get_tokenizer; vLLM-only arguments warn with the reason, unknown ones fail naming them."""
    from deepinfer import LLM, DeepInferenceEngine, EngineConfig, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    with caplog.at_level("WARNING", logger="deepinfer"):
        llm = LLM(model=None, device="cpu", block_size=16, seed=2, swap_space=4, max_model_len=256)
    try:
        assert "LLM(swap_space=...) is ignored: DeepInfer never swaps cache pages" in caplog.text
        assert llm.config.page_size == 16
        outputs = llm.generate(["To be, or not to be"], params)
        assert llm.get_tokenizer() is llm.tokenizer
    finally:
        llm.shutdown()
    with DeepInferenceEngine(EngineConfig(device="cpu", page_size=16, seed=2, max_model_len=256)) as engine:
        expected = engine.generate(["To be, or not to be"], params)
    assert outputs[0].outputs[0].token_ids == expected[0].outputs[0].token_ids
    with pytest.raises(TypeError, match="unexpected keyword argument 'pipeline_parallel_sizes'"):
        LLM(pipeline_parallel_sizes=2)
    with pytest.raises(ValueError, match="block_size=16 and page_size=32 differ"):
        LLM(block_size=16, page_size=32)
