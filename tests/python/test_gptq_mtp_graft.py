"""benchmarks/accuracy/calibrate_gptq.py's MTP graft: llm-compressor's output has no MTP layer (transformers keeps
none), and graft_mtp_layer copies it over from the source checkpoint as stored.

The stand-in for llm-compressor's output is the demo model quantized by compressed-tensors' own packer (the format
llm-compressor writes), without its MTP layer. Before the graft the checkpoint cannot speculate (the engine refuses
it); after it, MTP drafts are accepted and greedy output is the output without drafts."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import require_module, skip_or_fail
from deepinfer import DeepInferenceEngine, EngineConfig, SamplingParams
from deepinfer.default_model import TRAINED_MODEL_DIR, has_trained_model

require_module("compressed_tensors")

from test_int4 import compress_ct  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "accuracy"))
from calibrate_gptq import graft_mtp_layer  # noqa: E402

PROMPTS = ["ROMEO:\nWhat light through yonder window", "KING RICHARD III:\nNow is the winter"]


@pytest.fixture(scope="module")
def without_mtp(tmp_path_factory):
    """The demo model in compressed-tensors' W4A16 (g128, symmetric) as llm-compressor leaves it: no MTP layer."""
    if not has_trained_model():
        skip_or_fail("the embedded demo model (with its MTP layer) is missing")
    out = tmp_path_factory.mktemp("gptq_like")
    config = json.loads((TRAINED_MODEL_DIR / "config.json").read_text())
    mtp_prefix = f"model.layers.{config['num_hidden_layers']}."
    sd = {k: v for k, v in load_file(str(TRAINED_MODEL_DIR / "model.safetensors")).items()
          if not k.startswith(mtp_prefix)}
    packed, quantization, _ = compress_ct(sd, 128, True, torch.bfloat16)
    for f in TRAINED_MODEL_DIR.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name != "config.json":
            shutil.copy(f, out / f.name)
    config.pop("num_nextn_predict_layers")  # as transformers saves it: the field goes with the layer
    config["quantization_config"] = quantization
    (out / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in packed.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    return out


def greedy(path: Path, k: int):
    spec = {"speculative_config": {"method": "mtp", "num_speculative_tokens": k}} if k else {}
    engine = DeepInferenceEngine(EngineConfig(model_name_or_path=str(path), device="cpu", seed=1, **spec))
    try:
        outs = engine.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
                               use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs], engine.speculative_stats()
    finally:
        engine.shutdown()


def test_the_grafted_checkpoint_speculates_with_its_mtp_layer(without_mtp, tmp_path):
    with pytest.raises(ValueError, match="no MTP layer"):
        greedy(without_mtp, 1)
    grafted = tmp_path / "grafted"
    shutil.copytree(without_mtp, grafted)
    config = json.loads((TRAINED_MODEL_DIR / "config.json").read_text())
    source_mtp = {k: v for k, v in load_file(str(TRAINED_MODEL_DIR / "model.safetensors")).items()
                  if k.startswith(f"model.layers.{config['num_hidden_layers']}.")}
    assert graft_mtp_layer(TRAINED_MODEL_DIR, grafted) == len(source_mtp) > 0
    stored = load_file(str(grafted / "mtp.safetensors"))
    assert all((stored[k] == v).all() and stored[k].dtype == v.dtype for k, v in source_mtp.items())  # as stored
    out_config = json.loads((grafted / "config.json").read_text())
    assert out_config["num_nextn_predict_layers"] == config["num_nextn_predict_layers"]
    assert any(e.startswith("re:") and str(config["num_hidden_layers"]) in e
               for e in out_config["quantization_config"]["ignore"])
    index = json.loads((grafted / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(index.values()) == {"model.safetensors", "mtp.safetensors"}

    plain, _ = greedy(grafted, 0)
    drafted, stats = greedy(grafted, 2)
    assert drafted == plain
    assert stats["num_draft_tokens"] > 0 and stats["num_accepted_tokens"] > 0
    with pytest.raises(ValueError, match="already stores MTP tensors"):
        graft_mtp_layer(TRAINED_MODEL_DIR, grafted)
