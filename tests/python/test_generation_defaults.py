"""The checkpoint's generation_config.json fills the sampling values a caller leaves unset (vLLM's
--generation-config auto), and generation_config="none" ignores it."""

from __future__ import annotations

import json
import shutil

import pytest

from deepinfer import DeepInferenceEngine, EngineConfig, SamplingParams
from deepinfer.default_model import TRAINED_MODEL_DIR
from deepinfer.generation_defaults import load_generation_defaults


def test_reads_the_sampling_keys(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 0, "do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.1,
         "repetition_penalty": 1.1, "max_new_tokens": 64, "num_beams": 1}))
    assert load_generation_defaults(tmp_path, "auto") == {"temperature": 0.6, "top_p": 0.95, "top_k": 20,
                                                          "min_p": 0.1, "repetition_penalty": 1.1, "max_tokens": 64}
    assert load_generation_defaults(tmp_path, "none") == {}
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": False, "temperature": 0.7}))
    assert load_generation_defaults(tmp_path, "auto") == {"temperature": 0.0}  # greedy, as transformers does
    (tmp_path / "generation_config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        load_generation_defaults(tmp_path, "auto")
    (tmp_path / "generation_config.json").unlink()
    assert load_generation_defaults(tmp_path, "auto") == {}
    with pytest.raises(ValueError, match="generation_config"):
        EngineConfig(generation_config="vllm")


@pytest.fixture(scope="module")
def greedy_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("greedy_by_default")
    for f in TRAINED_MODEL_DIR.iterdir():
        if f.is_file():
            shutil.copy(f, d / f.name)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": 1, "temperature": 0.0,
                                                           "max_new_tokens": 5}))
    return d


def test_generate_without_parameters_uses_the_checkpoints_values(greedy_model):
    prompt = "ROMEO:\nWhat light"
    with DeepInferenceEngine(EngineConfig(model_name_or_path=str(greedy_model), device="cpu")) as engine:
        assert engine.default_sampling_params().temperature == 0.0
        a = engine.generate(prompt)[0]
        b = engine.generate(prompt, temperature=0.0, max_tokens=5, ignore_eos=False)[0]
        assert len(a.token_ids) <= 5 and a.token_ids == b.token_ids  # greedy, at most 5 tokens, by default
        # Keyword arguments change only what they name; an explicit SamplingParams replaces the defaults.
        assert len(engine.generate(prompt, max_tokens=9, ignore_eos=True)[0].token_ids) == 9
        explicit = engine.generate(prompt, SamplingParams(temperature=1.0, seed=3, max_tokens=12, ignore_eos=True))
        assert len(explicit[0].token_ids) == 12
    config = EngineConfig(model_name_or_path=str(greedy_model), device="cpu", generation_config="none")
    with DeepInferenceEngine(config) as engine:
        assert engine.default_sampling_params() == SamplingParams()
