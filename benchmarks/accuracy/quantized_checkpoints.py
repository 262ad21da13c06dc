"""4-bit checkpoints of the demo model written by compressed-tensors, for perplexity.py's FP4 rows: NVFP4 (e2m1, e4m3
scales per 16 inputs and a per-tensor global scale) and MXFP4 (e2m1, E8M0 scales per 32), weight-only, round to
nearest with the library's own scales (calculate_qparams, generate_gparam) and packing (its compressors). The layers
quantized are the ones DeepSeek's quantized releases quantize, every attention and MLP projection; the router,
embeddings, lm_head and norms stay as stored (`ignore`).

    python benchmarks/accuracy/quantized_checkpoints.py nvfp4 OUT_DIR   # from the embedded demo model
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

# preset: (compressed-tensors' scheme, its checkpoint format)
PRESETS = {"nvfp4": ("NVFP4A16", "nvfp4-pack-quantized"), "mxfp4": ("MXFP4A16", "mxfp4-pack-quantized")}


def is_quantized_linear(name: str, ndim: int) -> bool:
    return ndim == 2 and (name.endswith("_proj.weight") or name.endswith("_proj_with_mqa.weight"))


def write_fp4_checkpoint(src: Path, dst: Path, preset: str) -> Path:
    """`src` (a bf16/fp32 checkpoint directory) with its linear layers in `preset`, written to `dst`."""
    import torch
    from compressed_tensors.compressors.base import BaseCompressor
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme
    from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam
    from safetensors.torch import load_file, save_file

    scheme_name, fmt = PRESETS[preset]
    scheme = preset_name_to_scheme(scheme_name, ["Linear"])
    compressor = BaseCompressor.load_from_registry(fmt)
    args = scheme.weights
    tensors = {}
    for name, t in load_file(str(src / "model.safetensors")).items():
        if not is_quantized_linear(name, t.dim()):
            tensors[name] = t
            continue
        w = t.float()
        groups = w.reshape(w.shape[0], -1, args.group_size)
        global_scale = generate_gparam(w.amin(), w.amax()) if preset == "nvfp4" else None
        scale, _ = calculate_qparams(groups.amin(-1), groups.amax(-1), args, global_scale=global_scale)
        state = {"weight": w, "weight_scale": scale}
        if global_scale is not None:
            state["weight_global_scale"] = global_scale
        module = name.removesuffix(".weight")
        packed = compressor.compress(state, scheme)
        packed["weight_shape"] = torch.tensor(w.shape, dtype=torch.int64)
        tensors.update({f"{module}.{key}": value.contiguous() for key, value in packed.items()})
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy(f, dst / f.name)
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = QuantizationConfig(
        config_groups={"group_0": scheme}, format=fmt, ignore=["lm_head", "re:.*mlp\\.gate$"],
        quantization_status="compressed").model_dump(mode="json")
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("preset", choices=sorted(PRESETS))
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", type=Path, default=None, help="the source checkpoint (default: the demo model)")
    args = ap.parse_args(argv)
    if args.model is None:
        from deepinfer.default_model import TRAINED_MODEL_DIR
        args.model = Path(TRAINED_MODEL_DIR)
    print(write_fp4_checkpoint(args.model, args.out, args.preset))
    return 0


if __name__ == "__main__":
    sys.exit(main())
