#!/usr/bin/env python3
"""PyTorch reference of a DFlash drafter and of greedy DFlash speculative decoding.

Why: dflash.cpp needs an independent, readable reference of docs/dflash.md (sections 2-5) to
produce goldens (tools/make_tiny_drafters.py) and to train / check real drafters. It is written
from the contract, uses transformers only for the target model and for the RoPE frequency tables
(default / linear / yarn / llama3 scaling, read from the TARGET's config), and runs on CPU.

How: import it (the module has no side effects), e.g.

    from transformers import AutoModelForCausalLM
    from dflash_torch import DFlashDrafter, dflash_generate
    target = AutoModelForCausalLM.from_pretrained(tdir, dtype=torch.float32).eval()
    drafter = DFlashDrafter.from_pretrained(ddir, target.config).float().eval()
    tokens, acc = dflash_generate(target, drafter, prompt_ids, max_new_tokens=64, block_size=16)

Running the file itself (`python tools/dflash_torch.py TARGET_DIR DRAFTER_DIR [ids...]`) does one
greedy run, checks it against plain greedy decoding and prints the acceptance lengths.

Context features follow transformers' `hidden_states[l + 1]` for target layer l. Note: transformers
returns the FINAL-NORMED state as its last entry (hidden_states[num_layers]); so a target_layer_ids
entry equal to num_layers - 1 yields norm(residual), not the raw residual. Published drafters never
use the last layer; the tiny test drafters do, and their goldens follow transformers.

Versions used: tools/requirements-torch.txt (works with transformers 4.5x and 5.x).
"""
from __future__ import annotations

import copy
import inspect
import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


# =========================================================================== helpers

def default_target_layer_ids(num_target_layers: int, k: int) -> list[int]:
    """Publisher default (contract section 3): K = 1 -> [L // 2]; else round(1 + i*(L-4)/(K-1)).

    `round` is Python's (half to even), as in the publisher's Python code; for the published shapes
    (e.g. L = 36, K = 5 -> [1, 9, 17, 25, 33]) no value falls on .5."""
    L = int(num_target_layers)
    if k < 1:
        raise ValueError("k must be >= 1")
    if k == 1:
        return [L // 2]
    return [int(round(1 + i * (L - 4) / (k - 1))) for i in range(k)]


def target_context_features(hidden_states, layer_ids) -> torch.Tensor:
    """concat(hidden_states[l + 1] for l in layer_ids) along the last dim ([b, T, K*Ht])."""
    return torch.cat([hidden_states[int(l) + 1] for l in layer_ids], dim=-1)


def cache_kwarg(model) -> str:
    """KV-cache keyword of model.forward: 'cache' (transformers 5.x) or 'past_key_values' (4.x)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def new_dynamic_cache(model):
    from transformers import DynamicCache
    try:
        return DynamicCache(config=model.config)
    except TypeError:
        return DynamicCache()


def crop_cache(cache, keep: int) -> None:
    """Keep the first `keep` positions of a DynamicCache (negative crop works on 4.x and 5.x)."""
    remove = cache.get_seq_length() - keep
    if remove < 0:
        raise ValueError(f"cannot crop a cache of {cache.get_seq_length()} to {keep}")
    if remove:
        cache.crop(-remove)


def _config_get(cfg, key, default=None):
    if isinstance(cfg, dict):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


def target_rope_description(target_config) -> dict:
    """The target's RoPE as one flat dict {rope_type, rope_theta, ...} (4.x or 5.x config objects)."""
    rp = _config_get(target_config, "rope_parameters")
    if rp:
        rp = dict(rp)
        if "rope_type" not in rp and "type" in rp:
            rp["rope_type"] = rp.pop("type")
        rp.setdefault("rope_type", "default")
        return rp
    out = {"rope_theta": float(_config_get(target_config, "rope_theta", 10000.0))}
    rs = _config_get(target_config, "rope_scaling")
    if rs:
        rs = dict(rs)
        out["rope_type"] = rs.pop("rope_type", rs.pop("type", "default"))
        out.update(rs)
    else:
        out["rope_type"] = "default"
    return out


# =========================================================================== modules

class RMSNorm(nn.Module):
    """Same arithmetic as transformers' Qwen3RMSNorm: normalise in f32, cast back, times weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dt = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dt)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [b, heads, T, d]; cos/sin [b, T, d] (NeoX / HF 'rotate_half' convention)."""
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


class DrafterAttention(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        H, hd = c["hidden_size"], c["head_dim"]
        self.nh, self.nkv, self.hd = c["num_attention_heads"], c["num_key_value_heads"], hd
        bias = bool(c.get("attention_bias", False))
        self.q_proj = nn.Linear(H, self.nh * hd, bias=bias)
        self.k_proj = nn.Linear(H, self.nkv * hd, bias=bias)
        self.v_proj = nn.Linear(H, self.nkv * hd, bias=bias)
        self.o_proj = nn.Linear(self.nh * hd, H, bias=bias)
        self.q_norm = RMSNorm(hd, c["rms_norm_eps"])
        self.k_norm = RMSNorm(hd, c["rms_norm_eps"])

    def context_kv(self, context, cos_c, sin_c):
        """Per-layer K/V of the context rows (what the engine appends to the drafter cache)."""
        b, C, _ = context.shape
        kc = self.k_norm(self.k_proj(context).view(b, C, self.nkv, self.hd)).transpose(1, 2)
        vc = self.v_proj(context).view(b, C, self.nkv, self.hd).transpose(1, 2)
        return apply_rope(kc, cos_c, sin_c), vc

    def forward(self, h, context, cos_b, sin_b, cos_c, sin_c, attn_mask=None):
        b, Q, _ = h.shape
        q = self.q_norm(self.q_proj(h).view(b, Q, self.nh, self.hd)).transpose(1, 2)
        q = apply_rope(q, cos_b, sin_b)
        kb = self.k_norm(self.k_proj(h).view(b, Q, self.nkv, self.hd)).transpose(1, 2)
        kb = apply_rope(kb, cos_b, sin_b)
        vb = self.v_proj(h).view(b, Q, self.nkv, self.hd).transpose(1, 2)
        kc, vc = self.context_kv(context, cos_c, sin_c)
        k = torch.cat([kc, kb], dim=2)                       # [b, nkv, C+Q, hd]
        v = torch.cat([vc, vb], dim=2)
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, dim=1)                  # head j uses kv head j // rep
        v = v.repeat_interleave(rep, dim=1)
        scores = torch.matmul(q, k.transpose(-1, -2)) * (self.hd ** -0.5)
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask[:, None].to(torch.bool), float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(b, Q, self.nh * self.hd)
        return self.o_proj(out)


class DrafterMLP(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        H, I = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DrafterLayer(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.self_attn = DrafterAttention(c)
        self.mlp = DrafterMLP(c)
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, x, context, cos_b, sin_b, cos_c, sin_c, attn_mask=None):
        h = self.input_layernorm(x)
        x = x + self.self_attn(h, context, cos_b, sin_b, cos_c, sin_c, attn_mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    """DFlash drafter (contract sections 2-4). No embedding, no LM head: the target's are used."""

    def __init__(self, config: dict, target_config):
        super().__init__()
        c = dict(config)
        c.setdefault("head_dim", c["hidden_size"] // c["num_attention_heads"])
        c.setdefault("num_key_value_heads", c["num_attention_heads"])
        c.setdefault("rms_norm_eps", 1e-6)
        self.config = c
        dc = c.get("dflash_config") or {}
        self.mask_token_id = dc.get("mask_token_id", c.get("mask_token_id"))
        self.block_size = int(c.get("block_size", 16))
        self.num_target_layers = int(c.get("num_target_layers",
                                           _config_get(target_config, "num_hidden_layers")))
        target_hidden = int(_config_get(target_config, "hidden_size"))
        ids = dc.get("target_layer_ids", c.get("target_layer_ids"))
        if ids is None:
            k = int(c.get("num_context_features", 0)) or c["num_hidden_layers"]
            ids = default_target_layer_ids(self.num_target_layers, k)
        self.target_layer_ids = [int(i) for i in ids]
        H = c["hidden_size"]
        self.fc = nn.Linear(len(self.target_layer_ids) * target_hidden, H, bias=False)
        self.hidden_norm = RMSNorm(H, c["rms_norm_eps"])
        self.layers = nn.ModuleList([DrafterLayer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(H, c["rms_norm_eps"])

        # RoPE tables from the TARGET's rope parameters, at the drafter's head_dim.
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding
        rcfg = copy.deepcopy(target_config)
        rcfg.head_dim = c["head_dim"]
        rot = Qwen3RotaryEmbedding(rcfg)
        # Plain attributes, not buffers: .to(bfloat16) must not round the frequency table.
        self.inv_freq = rot.inv_freq.detach().float().clone()
        self.attention_scaling = float(rot.attention_scaling)
        self.rope_description = target_rope_description(target_config)
        if self.rope_description["rope_type"] in ("dynamic", "longrope"):
            raise NotImplementedError(f"rope_type {self.rope_description['rope_type']} not supported")
        own_theta = c.get("rope_theta", (c.get("rope_parameters") or {}).get("rope_theta"))
        if own_theta is not None and not math.isclose(float(own_theta), float(self.rope_description["rope_theta"])):
            print(f"dflash_torch: drafter rope_theta {own_theta} != target's "
                  f"{self.rope_description['rope_theta']}; using the target's (contract section 4)")

    # ------------------------------------------------------------------ pieces
    def rope(self, positions: torch.Tensor, dtype: torch.dtype):
        """cos, sin [b, T, head_dim] for integer positions [b, T] (or [T])."""
        if positions.dim() == 1:
            positions = positions[None]
        dev = self.fc.weight.device
        # Same arithmetic as transformers' rotary embedding: f32 angles, cos/sin times the
        # attention scaling (yarn: 0.1*ln(factor)+1), then cast to the compute dtype.
        freqs = positions.to(dev).float()[..., None] * self.inv_freq.to(dev)[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(dtype), sin.to(dtype)

    def project_context(self, features: torch.Tensor) -> torch.Tensor:
        """c = RMSNorm_hidden_norm(fc(features)); features [b, C, K*Ht] -> [b, C, H]."""
        return self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))

    def forward(self, block_embeds, block_positions, context, context_positions, attn_mask=None):
        """block_embeds [b, Q, H]; context [b, C, H] (already projected); positions [b, Q] / [b, C]
        (or 1-D); attn_mask [b, Q, C+Q] bool, True = visible; None = everything visible.
        Returns norm(x) [b, Q, H]."""
        x = block_embeds.to(self.fc.weight.dtype)
        context = context.to(x.dtype)
        cos_b, sin_b = self.rope(torch.as_tensor(block_positions), x.dtype)
        cos_c, sin_c = self.rope(torch.as_tensor(context_positions), x.dtype)
        b = x.shape[0]
        cos_b, sin_b = cos_b.expand(b, -1, -1), sin_b.expand(b, -1, -1)
        cos_c, sin_c = cos_c.expand(b, -1, -1), sin_c.expand(b, -1, -1)
        for layer in self.layers:
            x = layer(x, context, cos_b, sin_b, cos_c, sin_c, attn_mask)
        return self.norm(x)

    # ------------------------------------------------------------------ i/o
    @classmethod
    def from_pretrained(cls, directory, target_config, dtype: torch.dtype | None = None):
        from safetensors.torch import load_file
        d = Path(directory)
        config = json.loads((d / "config.json").read_text())
        model = cls(config, target_config)
        index = d / "model.safetensors.index.json"
        if index.exists():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        else:
            files = [p.name for p in sorted(d.glob("*.safetensors"))]
        state = {}
        for f in files:
            state.update(load_file(str(d / f)))
        saved_dtype = next(iter(state.values())).dtype
        state = {k[len("model."):] if k.startswith("model.") else k: v for k, v in state.items()}
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"drafter checkpoint mismatch: missing {missing}, unexpected {unexpected}")
        return model.to(dtype or saved_dtype)

    def drafter_state_dict(self) -> dict:
        return dict(self.state_dict())

    def save_pretrained(self, directory, dtype: torch.dtype = torch.float32) -> None:
        from safetensors.torch import save_file
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.detach().to(dtype).contiguous() for k, v in self.drafter_state_dict().items()}
        save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
        cfg = dict(self.config)
        cfg["torch_dtype"] = str(dtype).replace("torch.", "")
        (d / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


# =========================================================================== one step

@torch.no_grad()
def draft_block(target, drafter: DFlashDrafter, context_features: torch.Tensor, anchor: int,
                start: int, block_size: int | None = None, mask_token_id: int | None = None):
    """One drafting step (contract section 4) with the drafter context recomputed from scratch.

    context_features [1, s, K*Ht]: features of positions 0 … s-1 (s = start); anchor at position s.
    Returns (logits [B-1, vocab] float32 for block rows 1 … B-1, draft ids list[B-1])."""
    B = block_size or drafter.block_size
    mask = drafter.mask_token_id if mask_token_id is None else mask_token_id
    if mask is None:
        raise ValueError("mask_token_id unknown")
    s = int(start)
    if context_features.shape[1] != s:
        raise ValueError(f"expected {s} context rows, got {context_features.shape[1]}")
    dev = drafter.fc.weight.device
    ids = torch.tensor([[anchor] + [mask] * (B - 1)], device=dev)
    emb = target.get_input_embeddings()(ids.to(target.get_input_embeddings().weight.device))
    ctx = drafter.project_context(context_features.to(dev))
    hid = drafter(emb.to(dev), torch.arange(s, s + B, device=dev)[None], ctx,
                  torch.arange(0, s, device=dev)[None])
    head = target.get_output_embeddings()
    logits = head(hid[:, 1:].to(head.weight.dtype))[0].float()
    return logits, logits.argmax(-1).tolist()


@torch.no_grad()
def target_forward(target, ids: list[int], start: int, cache):
    """Run the target causally on ids at positions start … start+len-1, appending to cache.
    Returns (logits [T, vocab] float32, hidden_states tuple)."""
    dev = target.get_input_embeddings().weight.device
    x = torch.tensor([ids], device=dev)
    pos = torch.arange(start, start + len(ids), device=dev)[None]
    out = target(input_ids=x, position_ids=pos, use_cache=True, output_hidden_states=True,
                 **{cache_kwarg(target): cache})
    return out.logits[0].float(), out.hidden_states


# =========================================================================== greedy loop

@torch.no_grad()
def dflash_generate(target, drafter: DFlashDrafter, prompt_ids: list[int], max_new_tokens: int,
                    block_size: int, eos_ids=(), trace: list | None = None) -> tuple[list[int], list[int]]:
    """Greedy DFlash speculative decoding (contract sections 4-5).

    Returns (generated tokens, acceptance length a+1 of every verification step). The tokens equal
    plain greedy decoding of the target. Stops right after an id in eos_ids, or when
    max_new_tokens tokens are out (the last step's committed batch is truncated; its acceptance
    length is still reported in full). If `trace` is a list, one dict per step is appended to it:
    start (position of the anchor), anchor, drafts, target (argmax of every verified row),
    accepted (a + 1), draft_margin (smallest top-1 minus top-2 drafter logit gap in the block),
    target_margin (the same for the target rows that decided the commit)."""
    eos = set(int(e) for e in (eos_ids or ()))
    layer_ids = drafter.target_layer_ids
    cache = new_dynamic_cache(target)
    logits, hs = target_forward(target, list(prompt_ids), 0, cache)
    feats = target_context_features(hs, layer_ids)           # [1, n, K*Ht]
    anchor = int(logits[-1].argmax())
    s = len(prompt_ids)
    out: list[int] = []
    acc: list[int] = []
    while len(out) < max_new_tokens:
        dlogits, drafts = draft_block(target, drafter, feats, anchor, s, block_size)
        block = [anchor] + drafts
        vlogits, vhs = target_forward(target, block, s, cache)
        choice = vlogits.argmax(-1).tolist()                   # choice[i] predicts position s+i+1
        a = 0
        while a < block_size - 1 and drafts[a] == choice[a]:
            a += 1
        committed = block[: a + 1]
        acc.append(a + 1)
        if trace is not None:
            d2 = torch.topk(dlogits, 2, dim=-1).values
            t2 = torch.topk(vlogits[: a + 1], 2, dim=-1).values
            trace.append(dict(start=s, anchor=anchor, drafts=list(drafts), target=list(choice),
                              accepted=a + 1, draft_margin=float((d2[:, 0] - d2[:, 1]).min()),
                              target_margin=float((t2[:, 0] - t2[:, 1]).min())))
        crop_cache(cache, s + a + 1)
        feats = torch.cat([feats, target_context_features(vhs, layer_ids)[:, : a + 1]], dim=1)
        s += a + 1
        anchor = int(choice[a])
        for t in committed:
            out.append(int(t))
            if t in eos or len(out) >= max_new_tokens:
                return out, acc
    return out, acc


@torch.no_grad()
def greedy_generate(target, prompt_ids: list[int], max_new_tokens: int, eos_ids=()) -> list[int]:
    """Plain greedy decoding with the KV cache (the tokens dflash_generate must reproduce)."""
    eos = set(int(e) for e in (eos_ids or ()))
    cache = new_dynamic_cache(target)
    logits, _ = target_forward(target, list(prompt_ids), 0, cache)
    s, out = len(prompt_ids), []
    while True:
        t = int(logits[-1].argmax())
        out.append(t)
        if t in eos or len(out) >= max_new_tokens:
            return out
        logits, _ = target_forward(target, [t], s, cache)
        s += 1


def _main() -> None:
    import argparse
    from transformers import AutoModelForCausalLM
    ap = argparse.ArgumentParser(description="one greedy DFlash run vs plain greedy")
    ap.add_argument("target")
    ap.add_argument("drafter")
    ap.add_argument("ids", nargs="*", type=int, default=[5, 17, 42, 99, 7, 3, 64, 128])
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--block-size", type=int, default=0)
    a = ap.parse_args()
    target = AutoModelForCausalLM.from_pretrained(a.target, dtype=torch.float32,
                                                  attn_implementation="eager").eval()
    drafter = DFlashDrafter.from_pretrained(a.drafter, target.config, dtype=torch.float32).eval()
    B = a.block_size or drafter.block_size
    toks, acc = dflash_generate(target, drafter, a.ids, a.max_new_tokens, B)
    ref = greedy_generate(target, a.ids, a.max_new_tokens)
    print("tokens     ", toks)
    print("acceptance ", acc, "mean", sum(acc) / len(acc))
    print("matches plain greedy:", toks == ref)


if __name__ == "__main__":
    _main()
