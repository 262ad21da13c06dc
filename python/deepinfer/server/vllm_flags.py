"""vLLM ``serve`` flags without a DeepInfer option of their own, so that a vLLM command line for a DeepSeek model
runs with ``vllm`` replaced by ``deepinfer``. Everything vLLM-only is mapped here, in three tables:

- ALIASES: vLLM's name for a DeepInfer option (``--block-size`` is ``--page-size``);
- INAPPLICABLE: flags about machinery DeepInfer does not have; accepted, and a warning names the flag and why;
- REFUSED: flags asking for behaviour DeepInfer does not offer; an error gives the reason and what to do instead.

vLLM flags that DeepInfer implements under the same name (``--chat-template``, ``--max-logprobs``, ``--ssl-*``, ...)
are ordinary server or engine flags, not listed here.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

__all__ = ["ALIASES", "INAPPLICABLE", "REFUSED", "add_vllm_arguments", "apply_aliases", "take_vllm_file_keys",
           "warn_inapplicable"]

# vLLM's flag -> the DeepInfer option (a dest) it names.
ALIASES: dict[str, str] = {"block_size": "page_size"}

# flag -> (whether it takes a value, why it cannot matter here).
INAPPLICABLE: dict[str, tuple[bool, str]] = {
    "--swap-space": (True, "DeepInfer never swaps cache pages to host memory: a preempted sequence frees its pages "
                           "and is recomputed"),
    "--disable-custom-all-reduce": (False, "DeepInfer's tensor-parallel all-reduce is NCCL's (CUDA) or in-process "
                                           "(CPU); there is no custom kernel to turn off"),
    "--tokenizer-mode": (True, "DeepInfer has one tokenizer implementation, which reads tokenizer.json"),
    "--disable-log-stats": (False, "DeepInfer logs no periodic engine statistics; /metrics serves them"),
}

# flag -> why it is refused.
REFUSED: dict[str, str] = {
    "--no-enable-chunked-prefill": "DeepInfer always prefills in chunks of at most --max-num-batched-tokens tokens a "
                                   "step; to prefill each prompt in one step, set --max-num-batched-tokens to at least "
                                   "--max-model-len",
}

_INAPPLICABLE_DEST = "vllm_inapplicable"


class _Inapplicable(argparse.Action):
    """Takes the flag (and its value, if it has one) and remembers it, for warn_inapplicable."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: str | None = None):
        seen = list(getattr(namespace, _INAPPLICABLE_DEST, []))
        seen.append(option_string)
        setattr(namespace, _INAPPLICABLE_DEST, seen)


class _Accepted(argparse.Action):
    """Takes a flag that asks for what DeepInfer always does."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: str | None = None):
        pass


class _Refused(argparse.Action):
    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: str | None = None):
        parser.error(f"{option_string} is not supported: {REFUSED[option_string]}")


def add_vllm_arguments(parser: argparse.ArgumentParser) -> None:
    S = argparse.SUPPRESS
    group = parser.add_argument_group("vLLM compatibility", "vLLM flags, so that a vLLM command line runs as it is")
    group.add_argument("--block-size", dest="block_size", type=int, default=S, metavar="INT",
                       help="vLLM's name for --page-size (default 64)")
    # What DeepInfer always does: accepted without a word.
    group.add_argument("--enable-chunked-prefill", nargs=0, action=_Accepted,
                       default=S, help="accepted: prefills are always chunked (see --max-num-batched-tokens)")
    for flag, why in REFUSED.items():
        group.add_argument(flag, nargs=0, action=_Refused, default=S, help=f"refused: {why}")
    for flag, (takes_value, why) in INAPPLICABLE.items():
        extra = {"nargs": 1, "metavar": "VALUE"} if takes_value else {"nargs": 0}
        group.add_argument(flag, action=_Inapplicable, dest=_INAPPLICABLE_DEST, default=S, help=f"ignored: {why}",
                           **extra)


def apply_aliases(values: dict[str, Any], where: str) -> dict[str, Any]:
    """``values`` with each vLLM alias renamed to its DeepInfer option; both given, differently, is an error."""
    out = dict(values)
    for alias, name in ALIASES.items():
        if alias not in out:
            continue
        value = out.pop(alias)
        if name in out and out[name] != value:
            flag, other = "--" + alias.replace("_", "-"), "--" + name.replace("_", "-")
            raise ValueError(f"{where}: {flag} {value} and {other} {out[name]} differ ({flag} is vLLM's name for "
                             f"{other}); give one of them")
        out[name] = value
    return out


def take_vllm_file_keys(values: dict[str, Any], where: str, args: argparse.Namespace) -> dict[str, Any]:
    """A config file's vLLM-only keys, as their flags on the command line: ``values`` without the inapplicable ones
    (recorded in ``args`` for warn_inapplicable) and without ``enable_chunked_prefill: true``; a refused one (or
    ``enable_chunked_prefill: false``) raises ValueError with the reason."""
    out = dict(values)
    if "enable_chunked_prefill" in out:
        if out.pop("enable_chunked_prefill") is False:
            raise ValueError(f"{where}: enable-chunked-prefill: false is not supported: "
                             f"{REFUSED['--no-enable-chunked-prefill']}")
    for flag in REFUSED:
        if flag[2:].replace("-", "_") in out:
            raise ValueError(f"{where}: {flag[2:]} is not supported: {REFUSED[flag]}")
    seen = list(getattr(args, _INAPPLICABLE_DEST, []))
    for flag in INAPPLICABLE:
        if out.pop(flag[2:].replace("-", "_"), None) is not None:
            seen.append(flag)
    setattr(args, _INAPPLICABLE_DEST, seen)
    return out


def warn_inapplicable(args: argparse.Namespace, logger: logging.Logger) -> None:
    for flag in dict.fromkeys(getattr(args, _INAPPLICABLE_DEST, [])):
        logger.warning("%s is ignored: %s", flag, INAPPLICABLE[flag][1])
