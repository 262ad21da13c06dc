"""``deepinfer plan``: whether a deployment fits, from config.json alone, before anything is loaded.

The engine flags are the engine's own (engine_args), so a plan's command line becomes a serve command line by
changing its first word and dropping --gpus, --gpu-memory-gb and --json.
"""

from __future__ import annotations

import argparse
import sys

from deepinfer.engine_args import add_engine_arguments, engine_values, finite_float

__all__ = ["add_plan_arguments", "run_plan"]

DESCRIPTION = """\
Plans a deployment from a checkpoint directory or a bare config.json, without a GPU and without reading a weight:
the weight bytes a GPU by dtype, the working memory and reserves, the latent cache's tokens a GPU and in all, how
many sequences of --max-model-len fit at once, whether it fits, and what would (the smallest tensor_parallel_size,
FP8 weights, the FP8 cache, INT4 weights). Exit status: 0 it fits, 1 it does not, 2 bad input."""


def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    S = argparse.SUPPRESS
    p.add_argument("model_positional", nargs="?", metavar="MODEL", default=S,
                   help="checkpoint directory or config.json (same as --model; none: the embedded demo model)")
    plan = p.add_argument_group("plan")
    plan.add_argument("--gpus", type=int, default=None,
                      help="GPUs of the deployment; tensor_parallel_size defaults to it (default: "
                           "tensor_parallel_size)")
    plan.add_argument("--gpu-memory-gb", type=finite_float, default=None, metavar="GIB",
                      help="one GPU's memory in GiB, as nvidia-smi's MiB / 1024: 80 for an H100, 141 for an H200 "
                           "(default: the first visible GPU's, when this build has CUDA and sees one)")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON (bytes, not GiB)")
    add_engine_arguments(p)


def _model_value(args: argparse.Namespace, values: dict) -> str | None:
    positional = vars(args).get("model_positional")
    flag = values.get("model_name_or_path")
    if positional is not None and flag is not None and positional != flag:
        raise ValueError(f"the model is given twice, differently: {positional!r} (MODEL) and {flag!r} (--model)")
    return positional if positional is not None else flag


def _visible_gpu_memory() -> int | None:
    """The first visible GPU's total memory, when the extension can say (a CUDA build that sees a GPU)."""
    from deepinfer import _deepinfer

    ask = getattr(_deepinfer, "cuda_device_memory", None)
    if ask is None or _deepinfer.cuda_device_count() == 0:
        return None
    return int(ask(0)[1])


def run_plan(args: argparse.Namespace) -> int:
    from deepinfer.config import EngineConfig
    from deepinfer.model_dims import load_model_dims
    from deepinfer.plan import GIB, plan_device, plan_memory, plan_options
    from deepinfer.plan_report import format_plan, plan_json

    values = engine_values(args)
    model = _model_value(args, values)
    if model is None:
        from deepinfer.default_model import default_model

        model = str(default_model()[0])
    values["model_name_or_path"] = model
    if args.gpus is not None and args.gpus < 1:
        raise ValueError(f"--gpus must be >= 1, got {args.gpus}")
    values.setdefault("tensor_parallel_size", args.gpus or 1)
    config = EngineConfig.from_dict(values)
    gpus = args.gpus if args.gpus is not None else config.tensor_parallel_size
    if config.tensor_parallel_size > gpus:
        raise ValueError(f"tensor_parallel_size {config.tensor_parallel_size} needs as many GPUs; --gpus is {gpus}")
    if args.gpu_memory_gb is not None and args.gpu_memory_gb <= 0:
        raise ValueError(f"--gpu-memory-gb must be > 0, got {args.gpu_memory_gb:g}")
    dims = load_model_dims(model)
    memory = None
    if plan_device(config) == "cuda":
        memory = int(args.gpu_memory_gb * GIB) if args.gpu_memory_gb is not None else _visible_gpu_memory()
    plan = plan_memory(dims, config, gpus=gpus, gpu_memory_bytes=memory, model=model)
    options = plan_options(dims, config, plan)
    print(plan_json(plan, options) if args.json else format_plan(plan, options))
    sys.stdout.flush()
    return 0 if plan.fits else 1
