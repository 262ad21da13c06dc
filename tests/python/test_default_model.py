"""The embedded demo model: loads in DeepInfer and in transformers with identical greedy output, and has learned."""

from __future__ import annotations

import pytest
import torch

from conftest import skip_or_fail

from deepinfer import DeepInferenceEngine, EngineConfig, SamplingParams
from deepinfer.default_model import TRAINED_MODEL_DIR, has_trained_model

if not has_trained_model():  # the repository ships it: in CI its absence is a broken install
    skip_or_fail(f"this build ships no trained demo model ({TRAINED_MODEL_DIR})")

PROMPTS = ["ROMEO:", "First Citizen:\nBefore we proceed any further, hear me speak.", "KING RICHARD III:\nNow is the",
           "To be, or not to be"]


@pytest.fixture(scope="module")
def engine():
    with DeepInferenceEngine(EngineConfig(max_model_len=512)) as e:
        yield e


def test_the_default_is_the_trained_model(engine):
    assert engine.model_dir == TRAINED_MODEL_DIR and not engine.is_random_model
    assert engine.model_config.architecture == "DeepseekV3ForCausalLM"
    assert engine.model_config.num_nextn_predict_layers == 1  # the MTP layer is in the checkpoint, skipped here


def test_greedy_output_matches_transformers(engine):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(TRAINED_MODEL_DIR, dtype=torch.float32).eval()
    outs = engine.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True))
    for out in outs:
        ids = torch.tensor([out.prompt_token_ids])
        with torch.no_grad():
            ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False,
                                 eos_token_id=None, pad_token_id=engine.tokenizer.eos_token_id)
        assert out.token_ids == ref[0, ids.shape[1]:].tolist(), out.prompt


def test_it_writes_shakespeare_shaped_text(engine):
    out = engine.generate("ROMEO:", temperature=0.0, max_tokens=48)[0]
    assert ":" in out.text and "\n" in out.text  # speaker turns, as in the corpus
    assert len(set(out.text.split())) > 8        # not a single repeated token
