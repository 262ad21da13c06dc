"""DeepSeek-V3 multi-token prediction (MTP) layer and DeepSeek checkpoint naming.

The main model is Hugging Face transformers' `DeepseekV3ForCausalLM`; transformers has no MTP module,
so this file supplies one, plus the code that writes and reads a checkpoint in the layout of
DeepSeek's own releases.

MTP, one depth (DeepSeek-V3 technical report, section 2.2). For position i of a sequence t_0..t_{T-1}:

    h_i    = the main model's final hidden state at position i, AFTER the main model's final norm
             (`model.norm`), i.e. the vector the main lm_head reads. This is what Megatron-LM's MTP
             (its decoder block ends with the final layernorm), vLLM and SGLang (the target model's
             returned hidden states) feed to DeepSeek's released MTP weights.
    e_i    = Emb(t_{i+1})                        (the main model's embedding table, shared)
    x_i    = eh_proj([enorm(e_i) ; hnorm(h_i)])  (2H -> H; embedding half FIRST, as those engines do)
    y      = one full decoder block over x_0..x_{T-2} (MLA + MoE, causal, rope position of x_i is i)
    logits = shared_head.head(shared_head.norm(y_i))  -> predicts t_{i+2}

Loss: main next-token cross-entropy + lambda * MTP cross-entropy (lambda 0.3 as in DeepSeek-V3's
first 10T tokens). The embedding and output head are shared with the main model (one tensor each
while training); the checkpoint still stores copies under the MTP layer, as DeepSeek does:

    model.layers.{N}.embed_tokens.weight          copy of model.embed_tokens.weight
    model.layers.{N}.enorm.weight
    model.layers.{N}.hnorm.weight
    model.layers.{N}.eh_proj.weight               [H, 2H]
    model.layers.{N}.input_layernorm.weight, .post_attention_layernorm.weight,
    model.layers.{N}.self_attn.*, model.layers.{N}.mlp.*   (same names as a main MoE layer)
    model.layers.{N}.shared_head.norm.weight
    model.layers.{N}.shared_head.head.weight      copy of lm_head.weight

with N = num_hidden_layers and `num_nextn_predict_layers: 1` in config.json. Routed experts are
stored one tensor per expert (`mlp.experts.{e}.{gate,up,down}_proj.weight`), as in DeepSeek's
checkpoints, not in transformers' fused in-memory layout.
"""

from __future__ import annotations

import json
import os

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from transformers.masking_utils import create_causal_mask
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
    DeepseekV3DecoderLayer,
    DeepseekV3RMSNorm,
)


class MTPLayer(nn.Module):
    """One MTP depth. Embedding and output head are passed in (shared with the main model)."""

    def __init__(self, config):
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.config = config
        self.enorm = DeepseekV3RMSNorm(hidden, eps=eps)
        self.hnorm = DeepseekV3RMSNorm(hidden, eps=eps)
        self.eh_proj = nn.Linear(2 * hidden, hidden, bias=False)
        # A full decoder block; layer_idx >= first_k_dense_replace gives it an MoE MLP.
        self.block = DeepseekV3DecoderLayer(config, layer_idx=config.num_hidden_layers)
        self.shared_head_norm = DeepseekV3RMSNorm(hidden, eps=eps)

    def forward(self, hidden, next_embeds, position_ids, rotary_emb):
        """hidden [B, S, H]: main-model final hidden (after model.norm) at positions 0..S-1;
        next_embeds [B, S, H]: Emb(t_{i+1}) for the same positions; position_ids [B, S].
        Returns the normed MTP hidden [B, S, H]; the caller applies the shared head."""
        x = self.eh_proj(torch.cat([self.enorm(next_embeds), self.hnorm(hidden)], dim=-1))  # [B, S, H]
        position_embeddings = rotary_emb(x, position_ids)  # cos, sin [B, S, rope_dim]
        mask = create_causal_mask(
            config=self.config, inputs_embeds=x, attention_mask=None, cache=None, position_ids=position_ids
        )
        x = self.block(x, attention_mask=mask, position_ids=position_ids, position_embeddings=position_embeddings)
        return self.shared_head_norm(x)  # [B, S, H]


def forward_with_mtp(model, mtp: MTPLayer | None, input_ids: torch.Tensor):
    """Main logits [B, T, V] and MTP logits [B, T-2, V] (MTP row i predicts t_{i+2})."""
    batch, seq = input_ids.shape
    hidden = model.model(input_ids=input_ids).last_hidden_state  # [B, T, H], after model.norm
    logits = model.lm_head(hidden)  # [B, T, V]
    if mtp is None or seq < 3:
        return logits, None
    next_embeds = model.model.embed_tokens(input_ids[:, 1 : seq - 1])  # Emb(t_{i+1}), i = 0..T-3
    position_ids = torch.arange(seq - 2, device=input_ids.device).unsqueeze(0).expand(batch, -1)
    mtp_hidden = mtp(hidden[:, : seq - 2], next_embeds, position_ids, model.model.rotary_emb)
    mtp_logits = model.lm_head(mtp_hidden)  # [B, T-2, V], shared output head
    return logits, mtp_logits


def mtp_losses(logits, mtp_logits, input_ids):
    """Mean next-token CE and mean next-next-token CE (MTP), both over all valid positions."""
    vocab = logits.shape[-1]
    main = F.cross_entropy(logits[:, :-1].reshape(-1, vocab).float(), input_ids[:, 1:].reshape(-1))
    if mtp_logits is None:
        return main, None
    mtp = F.cross_entropy(mtp_logits.reshape(-1, vocab).float(), input_ids[:, 2:].reshape(-1))
    return main, mtp


# ---------------------------------------------------------------------------------------------
# DeepSeek checkpoint layout


def _split_experts(prefix: str, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' fused experts (gate_up_proj [E, 2I, H], down_proj [E, H, I]) -> one tensor per
    expert under DeepSeek's names. Other entries pass through with `prefix` prepended."""
    out = {}
    for name, tensor in state.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            base = prefix + name[: -len("gate_up_proj")]
            inter = tensor.shape[1] // 2
            for e in range(tensor.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = tensor[e, :inter]  # [I, H]
                out[f"{base}{e}.up_proj.weight"] = tensor[e, inter:]  # [I, H]
        elif name.endswith("mlp.experts.down_proj"):
            base = prefix + name[: -len("down_proj")]
            for e in range(tensor.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = tensor[e]  # [H, I]
        else:
            out[prefix + name] = tensor
    return out


def deepseek_state_dict(model, mtp: MTPLayer | None) -> dict[str, torch.Tensor]:
    """Every tensor of the model (+ MTP layer) under DeepSeek-V3's checkpoint names."""
    state = {k: v for k, v in model.state_dict().items() if "rotary_emb" not in k}
    out = _split_experts("", state)
    if mtp is not None:
        n = model.config.num_hidden_layers
        p = f"model.layers.{n}."
        out[p + "embed_tokens.weight"] = model.model.embed_tokens.weight
        out[p + "enorm.weight"] = mtp.enorm.weight
        out[p + "hnorm.weight"] = mtp.hnorm.weight
        out[p + "eh_proj.weight"] = mtp.eh_proj.weight
        out.update(_split_experts(p, mtp.block.state_dict()))
        out[p + "shared_head.norm.weight"] = mtp.shared_head_norm.weight
        out[p + "shared_head.head.weight"] = model.lm_head.weight
    return out


# DeepSeek keeps the routing bias in float32; everything else is stored in the checkpoint dtype.
FP32_SUFFIXES = ("e_score_correction_bias",)


def save_deepseek_checkpoint(model, mtp, path: str, dtype=torch.bfloat16) -> dict[str, torch.Tensor]:
    state = deepseek_state_dict(model, mtp)
    tensors = {}
    for name, tensor in state.items():
        keep = name.endswith(FP32_SUFFIXES)
        tensors[name] = tensor.detach().to("cpu", torch.float32 if keep else dtype).contiguous().clone()
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    return tensors


def load_mtp_layer(config, path: str, dtype=torch.float32) -> MTPLayer:
    """Build an MTPLayer from a DeepSeek-layout checkpoint (single model.safetensors)."""
    n = config.num_hidden_layers
    p = f"model.layers.{n}."
    state = load_file(os.path.join(path, "model.safetensors"))
    mtp = MTPLayer(config)
    block = {}
    experts: dict[int, dict[str, torch.Tensor]] = {}
    for name, tensor in state.items():
        if not name.startswith(p):
            continue
        rest = name[len(p) :]
        if rest.startswith("mlp.experts."):
            e, proj = rest[len("mlp.experts.") :].split(".")[:2]
            experts.setdefault(int(e), {})[proj] = tensor
        elif rest.split(".")[0] in ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm"):
            block[rest] = tensor
    num = len(experts)
    block["mlp.experts.gate_up_proj"] = torch.stack(
        [torch.cat([experts[e]["gate_proj"], experts[e]["up_proj"]], dim=0) for e in range(num)]
    )
    block["mlp.experts.down_proj"] = torch.stack([experts[e]["down_proj"] for e in range(num)])
    mtp.block.load_state_dict(block, strict=True)
    mtp.enorm.weight.data.copy_(state[p + "enorm.weight"])
    mtp.hnorm.weight.data.copy_(state[p + "hnorm.weight"])
    mtp.eh_proj.weight.data.copy_(state[p + "eh_proj.weight"])
    mtp.shared_head_norm.weight.data.copy_(state[p + "shared_head.norm.weight"])
    mtp.to(dtype)
    # The router bias and gate weight stay float32, as transformers keeps them for the main model.
    mtp.block.mlp.gate.float()
    return mtp


def read_config(path: str) -> dict:
    with open(os.path.join(path, "config.json")) as f:
        return json.load(f)
