"""Structured outputs in the engine (StructuredOutputsParams through llguidance's matcher in the C++ step).

The references are not ours: outputs are checked with `jsonschema` and Python's `re`, and greedy constrained decoding
is compared token for token with transformers' model whose logits go through llguidance's matcher, driven step by step
from Python (llguidance_reference.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import torch

from conftest import skip_or_fail
from deepinfer import DeepInferenceEngine, EngineConfig, SamplingParams, StructuredOutputsParams
from deepinfer.default_model import TRAINED_MODEL_DIR, has_trained_model

PROMPTS = ["ROMEO:\nWhat light through yonder window", "First Citizen:\nBefore we proceed any further, hear me",
           "KING RICHARD III:\nNow is the winter", "To be, or not to be", "JULIET:\n", "Hark"]

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer"},
        "mood": {"enum": ["merry", "sad", "wroth"]},
        "lines": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2},
        "home": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}},
                 "required": ["city"], "additionalProperties": False},
    },
    "required": ["name", "age", "mood", "lines", "home"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine():
    if not has_trained_model():
        skip_or_fail("the embedded demo model is missing")
    e = DeepInferenceEngine(EngineConfig(device="cpu", seed=3))
    yield e
    e.shutdown()


def constrained(**kwargs) -> StructuredOutputsParams:
    return StructuredOutputsParams(**kwargs)


def test_the_grammar_engine_can_be_opened_ahead(engine):
    assert engine.prepare_structured_outputs() is True
    assert engine.prepare_structured_outputs() is True  # once made, kept


def test_json_schema_outputs_validate(engine):
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=160, structured_outputs=constrained(json=PERSON))
              for s in range(len(PROMPTS))]
    outs = engine.generate(PROMPTS, params, use_tqdm=False)
    for out in outs:
        o = out.outputs[0]
        assert o.finish_reason == "stop", f"{o.text!r} did not complete in 160 tokens"
        jsonschema.validate(json.loads(o.text), PERSON)
        assert "\n" not in o.text  # compact JSON by default: ', ' and ': ' only


def test_json_object_schema_text_and_flexible_whitespace(engine):
    outs = engine.generate(PROMPTS[:3], SamplingParams(temperature=0.9, seed=1, max_tokens=120,
                                                       structured_outputs={"json_object": True}), use_tqdm=False)
    for out in outs:
        if out.outputs[0].finish_reason == "stop":
            assert isinstance(json.loads(out.outputs[0].text), dict)
        else:  # an open object cut at max_tokens is still a prefix of one
            assert out.outputs[0].text.startswith("{")
    # A schema as text, with any whitespace allowed: still valid JSON of the schema.
    small = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}
    outs = engine.generate(PROMPTS[:2], SamplingParams(temperature=0.7, seed=2, max_tokens=60, structured_outputs=
                                                       constrained(json=json.dumps(small), disable_any_whitespace=False)),
                           use_tqdm=False)
    for out in outs:
        if out.outputs[0].finish_reason == "stop":
            jsonschema.validate(json.loads(out.outputs[0].text), small)


def test_regex_choice_lark_and_gbnf(engine):
    regex = r"(Act|Scene) [IVX]{1,4}: [a-z]{2,6}( [a-z]{2,6}){0,2}\."
    outs = engine.generate(PROMPTS, [SamplingParams(temperature=1.0, seed=s, max_tokens=40,
                                                    structured_outputs=constrained(regex=regex))
                                     for s in range(len(PROMPTS))], use_tqdm=False)
    for out in outs:
        assert out.outputs[0].finish_reason == "stop" and re.fullmatch(regex, out.outputs[0].text), out.outputs[0].text

    choices = ["Montague", "Capulet", "neither, \"a plague\" o' both"]
    outs = engine.generate(PROMPTS, [SamplingParams(temperature=1.5, seed=s, max_tokens=20,
                                                    structured_outputs=constrained(choice=choices))
                                     for s in range(len(PROMPTS))], use_tqdm=False)
    for out in outs:
        assert out.outputs[0].text in choices and out.outputs[0].finish_reason == "stop"

    lark = 'start: "(" num (op num)* ")"\nop: "+" | "*"\nnum: /[0-9]{1,3}/\n'
    outs = engine.generate(PROMPTS[:4], [SamplingParams(temperature=1.0, seed=s, max_tokens=40,
                                                        structured_outputs=constrained(grammar=lark))
                                         for s in range(4)], use_tqdm=False)
    for out in outs:
        text = out.outputs[0].text
        assert re.fullmatch(r"\([0-9]{1,3}([+*][0-9]{1,3})*\)", text) or (
            out.outputs[0].finish_reason == "length" and re.fullmatch(r"\([0-9+*]*", text)), text

    gbnf = 'root ::= "verily " answer\nanswer ::= "aye" | "nay"\n'
    outs = engine.generate(PROMPTS[:3], SamplingParams(temperature=1.0, seed=4, max_tokens=10,
                                                       structured_outputs=constrained(grammar=gbnf)), use_tqdm=False)
    assert {o.outputs[0].text for o in outs} <= {"verily aye", "verily nay"}


def test_constrained_and_free_requests_share_a_batch(engine):
    """Masks apply to their own rows only: the free requests' greedy tokens are those of a batch without grammars."""
    free = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    alone = engine.generate(PROMPTS, free, use_tqdm=False)
    mixed_params = [free if i % 2 == 0 else SamplingParams(temperature=0.0, max_tokens=24,
                                                           structured_outputs=constrained(regex=r"[a-z ]{3,30}"))
                    for i in range(len(PROMPTS))]
    mixed = engine.generate(PROMPTS, mixed_params, use_tqdm=False)
    for i, (a, m) in enumerate(zip(alone, mixed)):
        if i % 2 == 0:
            assert m.outputs[0].token_ids == a.outputs[0].token_ids
        else:
            assert re.fullmatch(r"[a-z ]{3,30}", m.outputs[0].text), m.outputs[0].text


def reference_greedy(engine, kind: str, grammar: str, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """transformers' demo model, greedy, each step's logits masked by llguidance's matcher (llguidance_reference.py)."""
    from transformers import AutoModelForCausalLM

    from llguidance_reference import Matcher

    model = AutoModelForCausalLM.from_pretrained(TRAINED_MODEL_DIR, dtype=torch.float32).eval()
    eos = model.config.eos_token_id
    matcher = Matcher(engine.tokenizer.to_json(), model.config.vocab_size, eos, kind, grammar)
    ids, out = list(prompt_ids), []
    with torch.no_grad():
        for _ in range(max_tokens):
            logits = model(torch.tensor([ids])).logits[0, -1].clone()
            logits[~torch.tensor(matcher.allowed())] = -torch.inf
            token = int(torch.argmax(logits))
            if token == eos:
                break
            matcher.consume(token)
            out.append(token)
            ids.append(token)
            if matcher.is_stopped():
                break
    return out


@pytest.mark.parametrize("which", ["json_schema", "regex", "lark"])
def test_greedy_constrained_tokens_match_transformers_with_llguidance(engine, which):
    so = {"json_schema": constrained(json=PERSON), "regex": constrained(regex=r"[A-Z][a-z]{1,8}(, [a-z]{1,8}){1,3}!"),
          "lark": constrained(grammar='start: greeting " " NAME\ngreeting: "Good " ("morrow" | "even")\n'
                                     'NAME: /[A-Z][a-z]{2,9}/\n')}[which]
    spec = so.to_core()
    prompt = PROMPTS[0]
    prompt_ids = engine.tokenizer.encode(prompt)
    expected = reference_greedy(engine, which, spec.text, prompt_ids, 100)
    out = engine.generate([{"prompt_token_ids": prompt_ids}],
                          SamplingParams(temperature=0.0, max_tokens=100, structured_outputs=so), use_tqdm=False)[0]
    assert list(out.outputs[0].token_ids) == expected
    assert out.outputs[0].finish_reason == "stop"


def test_preemption_and_prefix_sharing_keep_the_grammar(engine):
    """A cache too small for all requests: preempted constrained requests resume where their grammar is."""
    small = DeepInferenceEngine(EngineConfig(device="cpu", seed=3, page_size=4, num_cache_pages=48,
                                             max_num_batched_tokens=64))
    try:
        prompts = [PROMPTS[i % len(PROMPTS)] + " " * (i % 3) for i in range(8)]
        params = SamplingParams(temperature=0.0, max_tokens=150, structured_outputs=constrained(json=PERSON))
        got = small.generate(prompts, params, use_tqdm=False)
        assert small.stats().num_preemptions > 0, "the cache was meant to be too small for all 8 requests"
        ref = engine.generate(prompts, params, use_tqdm=False)
        for g, r in zip(got, ref):
            assert g.outputs[0].token_ids == r.outputs[0].token_ids
            jsonschema.validate(json.loads(g.outputs[0].text), PERSON)
    finally:
        small.shutdown()


def test_speculative_decoding_skips_constrained_requests(engine):
    spec = DeepInferenceEngine(EngineConfig(device="cpu", seed=3,
                                            speculative_config={"method": "mtp", "num_speculative_tokens": 2}))
    try:
        params = [SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True),
                  SamplingParams(temperature=0.0, max_tokens=100, structured_outputs=constrained(json=PERSON))]
        got = spec.generate(PROMPTS[:2], params, use_tqdm=False)
        ref = engine.generate(PROMPTS[:2], params, use_tqdm=False)
        assert [g.outputs[0].token_ids for g in got] == [r.outputs[0].token_ids for r in ref]
        assert spec.speculative_stats()["num_drafts"] > 0  # the free request was still speculated on
    finally:
        spec.shutdown()


def test_a_complete_grammar_ends_the_request_even_with_ignore_eos(engine):
    out = engine.generate(["Say:"], SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True,
                                                   structured_outputs=constrained(choice=["aye"])), use_tqdm=False)[0]
    assert out.outputs[0].text == "aye" and out.outputs[0].finish_reason == "stop"


def test_logprobs_are_the_models_own_distribution(engine):
    """The mask shapes what is drawn, not the reported logprobs (vLLM reports the raw distribution too)."""
    prompt_ids = engine.tokenizer.encode(PROMPTS[1])
    free = engine.generate([{"prompt_token_ids": prompt_ids}], SamplingParams(temperature=0.0, max_tokens=1,
                                                                               logprobs=3), use_tqdm=False)[0]
    forced = engine.generate([{"prompt_token_ids": prompt_ids}],
                             SamplingParams(temperature=0.0, max_tokens=1, logprobs=3,
                                            structured_outputs=constrained(choice=["Zounds"])), use_tqdm=False)[0]
    free_top = {lp.token_id: lp.logprob for lp in free.outputs[0].logprobs[0].top}
    forced_lp = forced.outputs[0].logprobs[0]
    assert {lp.token_id: lp.logprob for lp in forced_lp.top} == pytest.approx(free_top, abs=1e-5)
    assert forced_lp.token_id == forced.outputs[0].token_ids[0] != free.outputs[0].token_ids[0]


@pytest.mark.parametrize("so, message", [
    ({"json": {"type": "foo"}}, "invalid json_schema grammar"),
    ({"regex": "(unclosed"}, "invalid regex grammar"),
    ({"grammar": "start: undefined_rule\n"}, "invalid lark grammar"),
    ({"grammar": "root ::= (\n"}, "GBNF"),
    ({"json": {"type": "object"}, "regex": "a"}, "exactly one"),
    ({}, "exactly one"),
    ({"choice": []}, "non-empty list of strings"),
    ({"choice": "ab"}, "list of strings"),
    ({"regex": ""}, "non-empty string"),
    ({"json": "{not json"}, "not valid JSON"),
    ({"schema": {}}, "unknown fields"),
])
def test_bad_constraints_fail_the_request_with_the_reason(engine, so, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        engine.generate(["x"], SamplingParams(max_tokens=4, structured_outputs=so), use_tqdm=False)
    # The engine goes on serving.
    assert engine.generate(["x"], SamplingParams(max_tokens=2), use_tqdm=False)[0].outputs[0].token_ids


def test_without_llguidance_constrained_requests_are_refused(monkeypatch):
    if not has_trained_model():
        skip_or_fail("the embedded demo model is missing")
    import deepinfer.engine as engine_module

    monkeypatch.setattr(engine_module, "grammar_library", lambda: "")
    e = DeepInferenceEngine(EngineConfig(device="cpu"))
    try:
        assert e.prepare_structured_outputs() is False
        with pytest.raises(ValueError, match="need the llguidance package"):
            e.generate(["x"], SamplingParams(max_tokens=2, structured_outputs={"regex": "a+"}), use_tqdm=False)
        assert e.generate(["x"], SamplingParams(max_tokens=2), use_tqdm=False)[0].outputs[0].token_ids
    finally:
        e.shutdown()


def test_a_broken_grammar_library_fails_only_constrained_requests(monkeypatch, tmp_path):
    if not has_trained_model():
        skip_or_fail("the embedded demo model is missing")
    import deepinfer.engine as engine_module

    missing = tmp_path / "no_such_lib.so"
    monkeypatch.setattr(engine_module, "grammar_library", lambda: str(missing))
    e = DeepInferenceEngine(EngineConfig(device="cpu"))
    try:
        with pytest.raises(Exception, match="cannot open the llguidance library"):
            e.generate(["x"], SamplingParams(max_tokens=2, structured_outputs={"regex": "a+"}), use_tqdm=False)
        assert e.generate(["x"], SamplingParams(max_tokens=2), use_tqdm=False)[0].outputs[0].token_ids
    finally:
        e.shutdown()


def test_tensor_parallel_ranks_sample_the_same_constrained_tokens(engine):
    """Rank 0 samples under tensor parallelism: the masks are its own, the output that of one rank."""
    tp = DeepInferenceEngine(EngineConfig(device="cpu", seed=3, tensor_parallel_size=2))
    try:
        params = SamplingParams(temperature=0.0, max_tokens=100, structured_outputs=constrained(json=PERSON))
        got = tp.generate(PROMPTS[:3], params, use_tqdm=False)
        ref = engine.generate(PROMPTS[:3], params, use_tqdm=False)
        assert [g.outputs[0].token_ids for g in got] == [r.outputs[0].token_ids for r in ref]
    finally:
        tp.shutdown()


@pytest.mark.parametrize("ranks, k", [(2, 0), (4, 0), (2, 2)], ids=["dp2", "dp4", "dp2-mtp"])
def test_data_parallel_ranks_sample_their_constrained_rows_under_rank_0s_masks(engine, ranks, k):
    """Under data-parallel attention each rank samples its own requests, but the grammars live on rank 0 with the
    schedulers: rank 0 fills the other ranks' masks and sends them with the step (and, with MTP, the masks after
    their drafts). The output is one rank's, constrained and free requests mixed across the ranks."""
    params = [SamplingParams(temperature=0.0, max_tokens=100, structured_outputs=constrained(json=PERSON)),
              SamplingParams(temperature=0.0, max_tokens=24),
              SamplingParams(temperature=0.0, max_tokens=60, structured_outputs={"regex": r"[A-Z][a-z]+(, [a-z]+)+\."})]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(6)]
    per_prompt = [params[i % 3] for i in range(6)]
    extra = {"speculative_config": {"method": "mtp", "num_speculative_tokens": k}} if k else {}
    dp = DeepInferenceEngine(EngineConfig(device="cpu", seed=3, tensor_parallel_size=ranks, enable_expert_parallel=True,
                                          enable_dp_attention=True, **extra))
    try:
        got = dp.generate(prompts, per_prompt, use_tqdm=False)
    finally:
        dp.shutdown()
    ref = engine.generate(prompts, per_prompt, use_tqdm=False)
    assert [g.outputs[0].token_ids for g in got] == [r.outputs[0].token_ids for r in ref]
    assert [g.outputs[0].finish_reason for g in got] == [r.outputs[0].finish_reason for r in ref]


def test_masks_are_counted_in_stats_and_metrics(engine):
    from deepinfer.server.metrics import ServerMetrics

    before = engine.stats()
    out = engine.generate(["Hark"], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True,
                                                   structured_outputs={"regex": "[a-z]{6}"}), use_tqdm=False)[0]
    after = engine.stats()
    assert after.num_grammar_masks - before.num_grammar_masks == len(out.outputs[0].token_ids) > 0
    assert after.grammar_mask_seconds > before.grammar_mask_seconds
    text = ServerMetrics(engine, "demo").render().decode()
    assert f'deepinfer_grammar_masks_total{{model_name="demo"}} {float(after.num_grammar_masks)}' in text


def test_a_tokenizer_larger_than_the_vocabulary(tmp_path):
    """DeepSeek-V3's tokenizer (128,815 tokens) over a model of 100,000: the grammar's masks cover the tokenizer's
    tokens and are cut to the model's, whose tokens come first."""
    import shutil

    import deepinfer
    from deepinfer.tokenizer import Tokenizer

    from conftest import tiny_config

    config = tiny_config("v3").to_dict()
    config["vocab_size"] = 100_000
    (tmp_path / "config.json").write_text(json.dumps(config))
    Tokenizer.default_deepseek_v3().backend.save(str(tmp_path / "tokenizer.json"))
    shutil.copy(Path(deepinfer.__file__).parent / "tokenizer" / "deepseek-v3" / "tokenizer_config.json", tmp_path)
    e = DeepInferenceEngine(EngineConfig(model_name_or_path=str(tmp_path), load_format="dummy", device="cpu"))
    try:
        out = e.generate(["hello"], SamplingParams(temperature=1.0, seed=0, max_tokens=12,
                                                   structured_outputs={"regex": "[a-z]+"}), use_tqdm=False)[0]
        o = out.outputs[0]
        assert o.finish_reason in ("stop", "length") and o.token_ids, (o.finish_reason, o.error)
        assert all(t < 100_000 for t in o.token_ids) and re.fullmatch("[a-z]+", o.text), o.text
    finally:
        e.shutdown()


def test_a_grammar_the_core_refuses_queues_none_of_its_batch(engine):
    """The grammar compiles in the core, after Python's checks passed for the whole batch: the batch is queued in
    one call that checks every request before it queues any."""
    before = engine.stats()
    params = [SamplingParams(max_tokens=4), SamplingParams(max_tokens=4),
              SamplingParams(max_tokens=4, structured_outputs={"regex": "(unclosed"})]
    with pytest.raises(ValueError, match="invalid regex grammar"):
        engine.generate(["x", "y", "z"], params, use_tqdm=False)
    after = engine.stats()
    assert (after.num_waiting, after.num_running, after.num_steps) == (before.num_waiting, before.num_running,
                                                                       before.num_steps)
    assert not engine._by_core_id  # the batch's streams, registered before the core took it, are gone again
