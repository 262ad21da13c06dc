"""How the engine takes prompts: each is tokenized and checked once, and a bad one queues nothing."""

from __future__ import annotations

import pytest

from deepinfer import DeepInferenceEngine, EngineConfig


@pytest.fixture(scope="module")
def engine(checkpoints):
    e = DeepInferenceEngine(EngineConfig(model_name_or_path=str(checkpoints["v3"]), page_size=8, num_cache_pages=64,
                                         max_model_len=128, seed=1))
    yield e
    e.shutdown()


@pytest.fixture
def encode_calls(engine, monkeypatch):
    """The texts tokenized, one by one (encode) or as a batch (encode_batch: each of its texts)."""
    calls = []
    encode, encode_batch = engine.tokenizer.encode, engine.tokenizer.encode_batch

    def counting(text, *args, **kwargs):
        calls.append(text)
        return encode(text, *args, **kwargs)

    def counting_batch(texts, *args, **kwargs):
        calls.extend(texts)
        return encode_batch(texts, *args, **kwargs)

    monkeypatch.setattr(engine.tokenizer, "encode", counting)
    monkeypatch.setattr(engine.tokenizer, "encode_batch", counting_batch)
    return calls


def test_generate_tokenizes_each_prompt_once(engine, encode_calls):
    prompts = ["The quick brown fox", "def f(x):", {"prompt": "DeepSeek models use"}]
    outs = engine.generate(prompts, temperature=0.0, max_tokens=2)
    assert encode_calls == ["The quick brown fox", "def f(x):", "DeepSeek models use"]
    assert [o.prompt for o in outs] == ["The quick brown fox", "def f(x):", "DeepSeek models use"]


def test_generate_tokenizes_a_batch_as_the_tokenizer_does_each_text(engine):
    # Texts, token ids and both mappings mixed: the batch's ids are each text's own encoding, in prompt order.
    prompts = ["The quick brown fox", [5, 6, 7], {"prompt_token_ids": [9, 10]}, {"prompt": "ünïcödé 日本語"},
               "x"]
    outs = engine.generate(prompts, temperature=0.0, max_tokens=1)
    encode = engine.tokenizer.encode
    assert [o.prompt_token_ids for o in outs] == [encode("The quick brown fox"), [5, 6, 7], [9, 10],
                                                  encode("ünïcödé 日本語"), encode("x")]


def test_submit_tokenizes_once(engine, encode_calls):
    engine.submit("The quick brown fox", engine.default_sampling_params()).result(timeout=60)
    assert encode_calls == ["The quick brown fox"]


def test_a_bad_prompt_in_a_batch_queues_none_of_it(engine, encode_calls):
    before = engine.stats().num_waiting + engine.stats().num_running
    with pytest.raises(ValueError, match="max_model_len"):
        engine.generate(["short", "word " * 200], max_tokens=2)
    with pytest.raises(ValueError, match="prompt is empty"):
        engine.generate(["short", ""], max_tokens=2)
    assert engine.stats().num_waiting + engine.stats().num_running == before
    assert engine.generate("short", temperature=0.0, max_tokens=2)[0].finish_reason == "length"


def test_a_batch_is_admitted_by_one_step(engine):
    """generate() queues its prompts together, so the step thread cannot start on the first before the last
    arrives: sixteen two-token prompts that each need one token are served by a single step, on every run (with
    one queue call a prompt, how many steps depended on how the two threads interleaved)."""
    for _ in range(5):
        before = engine.stats().num_steps
        outs = engine.generate([[7 + i, 11 + i] for i in range(16)], temperature=0.0, max_tokens=1, ignore_eos=True,
                              use_tqdm=False)
        assert [len(o.outputs[0].token_ids) for o in outs] == [1] * 16
        assert engine.stats().num_steps - before == 1
