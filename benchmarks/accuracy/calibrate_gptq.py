"""A GPTQ-calibrated INT4 checkpoint of the demo model, made by llm-compressor's oneshot (GPTQModifier, W4A16,
groups of 128, symmetric: its "W4A16" preset), for perplexity.py's calibrated row. The calibration text is the demo
model's training split (the corpus before its validation and test splits, as tools/train_demo_model.py cuts it), in
windows of 512 tokens after BOS, never the held-out text the perplexity is measured on. llm-compressor writes the
checkpoint in compressed-tensors' pack-quantized format, which the engine loads as stored.

transformers does not keep DeepSeek's MTP layer (model.layers.{num_hidden_layers}.*: it is no part of its model), so
llm-compressor's output has none; graft_mtp_layer copies it over from the source checkpoint as stored (unquantized,
listed in the quantization config's `ignore`), so the calibrated checkpoint still speculates with MTP.

llm-compressor pins its own transformers and compressed-tensors, so it runs in an environment of its own:

    python -m venv --system-site-packages .venv-gptq
    .venv-gptq/bin/pip install -r benchmarks/accuracy/requirements-gptq.txt
    .venv-gptq/bin/python benchmarks/accuracy/calibrate_gptq.py OUT_DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import heldout  # noqa: E402

VAL_FRACTION = 0.025  # tools/train_demo_model.py --val-fraction (the shipped run's value)


def calibration_windows(corpus_text: str, model_dir: Path, window: int, count: int) -> list[list[int]]:
    """`count` windows of BOS + `window` - 1 tokens, evenly spread over the training split."""
    cut = int(len(corpus_text) * (1.0 - heldout.TEST_FRACTION - VAL_FRACTION))
    train = corpus_text[:corpus_text.find("\n", cut) + 1]
    ids = heldout.tokenize(train, model_dir)
    step = (len(ids) - window) // max(1, count - 1)
    return [[heldout.BOS_TOKEN_ID] + ids[i * step:i * step + window - 1] for i in range(count)]


def graft_mtp_layer(source: Path, out: Path) -> int:
    """Copies the source checkpoint's MTP layers (model.layers.{n}.*, n >= num_hidden_layers) into `out` as a shard
    of their own (`mtp.safetensors`, the tensors as stored), indexes every shard in model.safetensors.index.json, sets
    `num_nextn_predict_layers`, and lists the layers in quantization_config's `ignore` (a reader that goes by it, as
    vLLM's does, then expects them unquantized). Returns how many tensors were copied (0: the source has none)."""
    import json

    from safetensors import safe_open
    from safetensors.torch import save_file

    src_config = json.loads((source / "config.json").read_text())
    layers, mtp_layers = int(src_config["num_hidden_layers"]), int(src_config.get("num_nextn_predict_layers") or 0)
    if mtp_layers == 0:
        return 0
    prefixes = tuple(f"model.layers.{layers + i}." for i in range(mtp_layers))
    index_path = source / "model.safetensors.index.json"
    files = (sorted(set(json.loads(index_path.read_text())["weight_map"].values())) if index_path.exists()
             else ["model.safetensors"])
    tensors = {}
    for name in files:
        with safe_open(str(source / name), framework="pt") as f:
            tensors.update({k: f.get_tensor(k) for k in f.keys() if k.startswith(prefixes)})
    if not tensors:
        raise ValueError(f"{source}: num_nextn_predict_layers is {mtp_layers} but no model.layers.{layers}.* tensor "
                         "is stored")
    out_index = out / "model.safetensors.index.json"
    if out_index.exists():
        weight_map = json.loads(out_index.read_text())["weight_map"]
    else:
        with safe_open(str(out / "model.safetensors"), framework="pt") as f:
            weight_map = {k: "model.safetensors" for k in f.keys()}
    clash = sorted(k for k in tensors if k in weight_map)
    if clash:
        raise ValueError(f"{out} already stores MTP tensors ({clash[0]}, ...): nothing to graft")
    save_file(tensors, str(out / "mtp.safetensors"), metadata={"format": "pt"})
    weight_map.update({k: "mtp.safetensors" for k in tensors})
    out_index.write_text(json.dumps({"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}, indent=2))
    config = json.loads((out / "config.json").read_text())
    config["num_nextn_predict_layers"] = mtp_layers
    quant = config.get("quantization_config") or {}
    ignore = list(quant.get("ignore") or [])
    ignore += [f"re:^model\\.layers\\.{layers + i}\\." for i in range(mtp_layers)]
    quant["ignore"] = ignore
    config["quantization_config"] = quant
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return len(tensors)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", type=Path, default=None, help="the source checkpoint (default: the demo model)")
    ap.add_argument("--corpus", type=Path, default=None, help="tinyshakespeare.txt (as perplexity.py finds it)")
    ap.add_argument("--samples", type=int, default=128, help="calibration windows")
    ap.add_argument("--window", type=int, default=512)
    args = ap.parse_args(argv)

    import torch
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import GPTQModifier
    from transformers import AutoModelForCausalLM

    if args.model is None:
        from deepinfer.default_model import TRAINED_MODEL_DIR
        args.model = Path(TRAINED_MODEL_DIR)
    corpus = args.corpus or heldout.default_corpus()
    windows = calibration_windows(corpus.read_text(encoding="utf-8"), args.model, args.window, args.samples)
    data = Dataset.from_dict({"input_ids": windows, "attention_mask": [[1] * len(w) for w in windows]})
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    # Every attention and MLP projection (experts included), as the engine's INT4 rounding at load; the router
    # (mlp.gate), embeddings and lm_head stay.
    recipe = GPTQModifier(targets="Linear", scheme="W4A16", ignore=["lm_head", "re:.*mlp\\.gate$"])
    oneshot(model=model, dataset=data, recipe=recipe, max_seq_length=args.window, num_calibration_samples=len(windows),
            output_dir=str(args.out), save_compressed=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (args.model / f).exists() and not (args.out / f).exists():
            (args.out / f).write_bytes((args.model / f).read_bytes())
    grafted = graft_mtp_layer(args.model, args.out)
    print(f"{args.out}" + (f" (the MTP layer's {grafted} tensors copied over unquantized)" if grafted else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
