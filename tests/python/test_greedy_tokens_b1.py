"""benchmarks/gpu/greedy_tokens_b1.py on the CPU: one sequence at a time, its greedy tokens must be transformers'
(fp32, the same tiny checkpoints), and a prompt list it cannot find is a clear error."""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import VOCAB, load_reference

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"))

import greedy_tokens_b1  # noqa: E402


def hf_greedy(model, prompt, max_new):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new, min_new_tokens=max_new, do_sample=False,
                             attention_mask=torch.ones(1, len(prompt), dtype=torch.long), pad_token_id=2)
    return out[0, len(prompt):].tolist()


def test_tokens_match_transformers_one_sequence_at_a_time(checkpoints, tmp_path):
    """A parity work folder as hf_parity.py's prepare phase leaves it (a checkpoint and hf_reference.json per arch)."""
    rng = np.random.default_rng(11)
    prompts = [rng.integers(3, VOCAB, n).tolist() for n in (5, 19, 2)]
    expected = {}
    for arch, name in (("v3", "v3"), ("v2", "v2_two_shared")):
        shutil.copytree(checkpoints[name], tmp_path / arch)
        model = load_reference(checkpoints[name])
        expected[arch] = [hf_greedy(model, p, 6) for p in prompts]
        (tmp_path / arch / "hf_reference.json").write_text(
            json.dumps({"prompt_ids": prompts, "hf_fp32": expected[arch]}))
    out = tmp_path / "tokens.json"
    assert greedy_tokens_b1.main(["--work", str(tmp_path), "--out", str(out), "--max-tokens", "6",
                                  "--device", "cpu"]) == 0
    assert json.loads(out.read_text()) == expected


def test_missing_reference_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="hf_reference.json is missing"):
        greedy_tokens_b1.main(["--work", str(tmp_path), "--out", str(tmp_path / "t.json"), "--device", "cpu"])
