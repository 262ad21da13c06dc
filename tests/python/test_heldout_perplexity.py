"""benchmarks/accuracy: the engine's prompt-logprob perplexity of the demo model on a slice of its held-out text,
against transformers' own cross-entropy of the same windows (fp32), and the rolling-window definition itself."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from conftest import load_reference, require_asset, skip_or_fail

from deepinfer import DeepInferenceEngine, EngineConfig
from deepinfer.default_model import TRAINED_MODEL_DIR, has_trained_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "accuracy"))

import heldout  # noqa: E402
from perplexity import score_windows  # noqa: E402

if not has_trained_model():
    skip_or_fail(f"this build ships no trained demo model ({TRAINED_MODEL_DIR})")

SLICE_TOKENS = 600
WINDOW = 256  # a slice of 600 tokens: the BOS window, one full window after it, the right-aligned last one


@pytest.fixture(scope="module")
def slice_ids() -> list[int]:
    corpus = require_asset(heldout.default_corpus())  # ../shared/assets/corpora beside the repository, else .data/
    return heldout.tokenize(heldout.heldout_text(corpus.read_text(encoding="utf-8")), TRAINED_MODEL_DIR)[:SLICE_TOKENS]


def test_the_heldout_text_is_the_training_reports():
    corpus = require_asset(heldout.default_corpus())  # ../shared/assets/corpora beside the repository, else .data/
    ids = heldout.tokenize(heldout.heldout_text(corpus.read_text(encoding="utf-8")), TRAINED_MODEL_DIR)
    assert len(ids) == 19_056  # benchmarks/results/demo_model_training.md: test tokens


def test_rolling_windows_score_every_token_once():
    ids = list(range(10, 1010))
    windows = heldout.rolling_windows(ids, 300)
    assert windows[0].tokens[0] == heldout.BOS_TOKEN_ID and windows[0].scored == 299
    assert all(len(w.tokens) == 300 for w in windows)  # the last one right-aligned, so full length too
    scored = [t for w in windows for t in w.tokens[len(w.tokens) - w.scored:]]
    assert scored == ids
    assert windows[1].tokens[0] == ids[298]  # conditioned on the token before its first scored one
    assert [w.scored for w in heldout.rolling_windows(ids[:5], 300)] == [5]


def transformers_nll(model, windows: list[heldout.Window]) -> float:
    total = 0.0
    with torch.no_grad():
        for w in windows:
            tokens = torch.tensor([w.tokens])
            logprobs = torch.log_softmax(model(tokens).logits[0].double(), -1)
            first = len(w.tokens) - w.scored
            positions = torch.arange(first, len(w.tokens))
            total -= logprobs[positions - 1, tokens[0, positions]].sum().item()
    return total


def test_engine_perplexity_matches_transformers(slice_ids):
    windows = heldout.rolling_windows(slice_ids, WINDOW)
    assert len(windows) == 3
    with DeepInferenceEngine(EngineConfig(device="cpu", max_model_len=WINDOW + 1)) as engine:
        nll, count = score_windows(engine, windows)
    with DeepInferenceEngine(EngineConfig(device="cpu", max_model_len=WINDOW + 1, quantization="fp8")) as engine:
        fp8_nll, _ = score_windows(engine, windows)
    assert count == SLICE_TOKENS
    ref_nll = transformers_nll(load_reference(TRAINED_MODEL_DIR), windows)
    perplexity, ref_perplexity = math.exp(nll / count), math.exp(ref_nll / count)
    assert abs(perplexity / ref_perplexity - 1) < 1e-5, (perplexity, ref_perplexity)
    # FP8 weights stay within the target of +1% perplexity on this slice too.
    assert math.exp(fp8_nll / count) / perplexity - 1 < 0.01
