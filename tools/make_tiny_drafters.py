#!/usr/bin/env python3
"""Tiny random DFlash drafters for the tiny Qwen3 targets + drafter goldens.

Why: the C++ drafter (context features, projection, one drafting step, verification, rollback)
needs a reference that is independent of the engine. The reference is tools/dflash_torch.py,
written from docs/dflash.md; this script runs it on tiny random drafters and records the results.

How:  /tmp/tvenv/bin/python tools/make_tiny_drafters.py [--only TARGET_NAME ...]
      (run tools/make_tiny_models.py first: the targets are read from testdata/tiny/<target>/)

Writes testdata/tiny/dflash-<target>/: config.json, model.safetensors (contract section 2 layout),
drafter_golden.json (schema in tools/README.md, "Tiny checkpoints and goldens").

All computation is float32 (bf16 targets / drafters are upcast; the bf16 drafter's weights are
rounded to bf16 before anything is computed, so the file holds exactly the weights used).
Drafter weights: seeded random (std 0.25, norm weights 1 + N(0, 0.15^2)), then a short
distillation on the target's own greedy continuations (300 Adam steps) so that acceptance lengths
vary between 1 and B (a purely random drafter drafts one token for every mask row and is never
accepted, which would leave the accept / partial-accept / rollback paths untested).
Seeded and deterministic; the first weight seed (from a fixed list) whose drafts and reference
run are far from ties is kept.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dflash_torch import (DFlashDrafter, cache_kwarg, dflash_generate, draft_block, greedy_generate,  # noqa: E402
                          new_dynamic_cache, target_context_features, target_forward)
from make_tiny_models import reinit_weights, write_json  # noqa: E402

DRAFTERS = {
    # target name: drafter shape (hidden = target hidden; head_dim as the target's)
    "qwen3-gqa1-tied-f32": dict(layers=2, heads=4, kv=2, head_dim=16, inter=128, ids=[0, 1],
                                block=16, mask=255, dtype="float32", seed=1000),
    "qwen3-gqa4-untied-f32": dict(layers=1, heads=8, kv=2, head_dim=32, inter=160, ids=[0, 1],
                                  block=16, mask=255, dtype="float32", seed=2000),
    "qwen3-yarn-bf16": dict(layers=2, heads=4, kv=2, head_dim=16, inter=128, ids=[0, 1],
                            block=16, mask=255, dtype="bfloat16", seed=3000),
    "qwen3-vocab16-f32": dict(layers=1, heads=2, kv=1, head_dim=16, inter=64, ids=[0, 1],
                              block=8, mask=15, dtype="float32", seed=7000),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
PROMPT_LEN = 10
EXTRA_TOKENS = 3
REF_MAX_NEW = 40
SEED_TRIES = 40
LINEAR_STD = 0.25
NORM_JITTER = 0.15
TRAIN_STEPS = 300


def drafter_config(target_cfg, spec: dict) -> dict:
    rp = dict(target_cfg.rope_parameters)
    theta = rp.pop("rope_theta")
    rtype = rp.pop("rope_type")
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": target_cfg.hidden_size,
        "intermediate_size": spec["inter"],
        "num_hidden_layers": spec["layers"],
        "num_attention_heads": spec["heads"],
        "num_key_value_heads": spec["kv"],
        "head_dim": spec["head_dim"],
        "hidden_act": "silu",
        "attention_bias": False,
        "rms_norm_eps": 1e-6,
        "rope_theta": theta,
        "rope_scaling": None if rtype == "default" else {"rope_type": rtype, **rp},
        "max_position_embeddings": target_cfg.max_position_embeddings,
        "vocab_size": target_cfg.vocab_size,
        "tie_word_embeddings": False,
        "block_size": spec["block"],
        "num_target_layers": target_cfg.num_hidden_layers,
        "dflash_config": {"mask_token_id": spec["mask"], "target_layer_ids": list(spec["ids"])},
    }


@torch.no_grad()
def target_greedy_pool(target, seed: int, n_seq: int, prompt_len: int, gen_len: int):
    """n_seq random prompts continued greedily by the target; returns ids [n, P+G] and the
    context features of every row [n, P+G, K*Ht] (layer ids applied later)."""
    vocab = target.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, max(3, min(251, vocab - 2)), (n_seq, prompt_len), generator=g)
    out = ids
    cache = new_dynamic_cache(target)
    kw = {cache_kwarg(target): cache}
    step_in = ids
    for _ in range(gen_len):
        lg = target(input_ids=step_in, use_cache=True, **kw).logits[:, -1]
        step_in = lg.argmax(-1, keepdim=True)
        out = torch.cat([out, step_in], 1)
    hs = target(input_ids=out, use_cache=False, output_hidden_states=True).hidden_states
    return out, hs


def train_drafter(drafter: DFlashDrafter, target, seed: int, steps: int, prompt_len: int = 8,
                  gen_len: int = 40, batch: int = 16) -> None:
    """Short distillation so that acceptance lengths vary (a purely random drafter drafts the same
    token at every mask row and is never accepted). Block rows 1..B-1 are trained to predict the
    target's greedy continuation after an anchor; the context is the features of the rows before
    the anchor (masked by position). Float32, CPU, single thread: deterministic."""
    B = drafter.block_size
    mask_id = drafter.mask_token_id
    ids, hs = target_greedy_pool(target, seed + 99, 64, prompt_len, gen_len)
    feats = target_context_features(hs, drafter.target_layer_ids).detach()
    T = ids.shape[1]
    embed = target.get_input_embeddings()
    head = target.get_output_embeddings()
    g = torch.Generator().manual_seed(seed + 4242)
    opt = torch.optim.Adam(drafter.parameters(), lr=3e-3)
    drafter.train()
    for _ in range(steps):
        rows = torch.randint(0, ids.shape[0], (batch,), generator=g)
        starts = torch.randint(prompt_len, T - B + 1, (batch,), generator=g)  # anchor positions
        block = torch.full((batch, B), mask_id, dtype=torch.long)
        block[:, 0] = ids[rows, starts]
        labels = torch.stack([ids[r, s + 1: s + B] for r, s in zip(rows.tolist(), starts.tolist())])
        ctx = drafter.project_context(feats[rows])                    # [b, T, H]
        ctx_pos = torch.arange(T)[None].expand(batch, -1)
        blk_pos = starts[:, None] + torch.arange(B)[None]
        visible_ctx = ctx_pos[:, None, :] < starts[:, None, None]     # [b, 1, T]
        attn = torch.cat([visible_ctx.expand(-1, B, -1), torch.ones(batch, B, B, dtype=torch.bool)], -1)
        with torch.no_grad():
            emb = embed(block)
        hid = drafter(emb, blk_pos, ctx, ctx_pos, attn_mask=attn)
        logits = head(hid[:, 1:])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    drafter.eval()


def mean_entropy(logits: torch.Tensor) -> float:
    lp = torch.log_softmax(logits.double(), -1)
    return float(-(lp.exp() * lp).sum(-1).mean())


def min_margin(logits: torch.Tensor) -> float:
    t = torch.topk(logits, 2, dim=-1).values
    return float((t[..., 0] - t[..., 1]).min())


@torch.no_grad()
def compute_golden(target, drafter: DFlashDrafter, prompt: list[int], B: int) -> dict:
    ids = drafter.target_layer_ids
    L = target.config.num_hidden_layers
    n = len(prompt)
    # ---- step 1: prefill features of the prompt rows; anchor = target's greedy next token
    cache = new_dynamic_cache(target)
    logits, hs = target_forward(target, prompt, 0, cache)
    feats1 = target_context_features(hs, ids)                       # [1, n, K*Ht]
    anchor1 = int(logits[-1].argmax())
    s1_logits, s1_draft = draft_block(target, drafter, feats1, anchor1, n, B)
    # ---- the target's greedy continuation after anchor1 (EXTRA_TOKENS tokens)
    extra, c2 = [], new_dynamic_cache(target)
    lg, _ = target_forward(target, prompt + [anchor1], 0, c2)
    for i in range(EXTRA_TOKENS):
        t = int(lg[-1].argmax())
        extra.append(t)
        lg, _ = target_forward(target, [t], n + 1 + i, c2)
    # ---- step 2: the target verifies/commits [anchor1] + extra in one forward (positions n … n+3)
    rows = [anchor1] + extra
    lg2, hs2 = target_forward(target, rows, n, cache)
    if lg2[:-1].argmax(-1).tolist() != extra:
        raise RuntimeError("greedy continuation differs between incremental and block forward")
    feats2 = torch.cat([feats1, target_context_features(hs2, ids)], dim=1)
    s2 = n + len(rows)
    anchor2 = int(lg2[-1].argmax())
    s2_logits, s2_draft = draft_block(target, drafter, feats2, anchor2, s2, B)
    # ---- reference greedy DFlash run
    trace: list = []
    toks, acc = dflash_generate(target, drafter, prompt, REF_MAX_NEW, B, eos_ids=(), trace=trace)
    plain = greedy_generate(target, prompt, REF_MAX_NEW)
    if toks != plain:
        raise RuntimeError("dflash_generate differs from plain greedy decoding")
    return dict(
        anchor1=anchor1, s1_logits=s1_logits, s1_draft=s1_draft, extra=extra, anchor2=anchor2,
        s2_logits=s2_logits, s2_draft=s2_draft, feats1=feats1, ctx_row0=drafter.project_context(feats1)[0, 0],
        s2_ctx_len=s2, toks=toks, acc=acc, trace=trace,
        last_layer_used=(L - 1) in ids)


def acceptable(g: dict, vocab: int) -> tuple[bool, str]:
    import math
    why = []
    m = min(min_margin(g["s1_logits"]), min_margin(g["s2_logits"]))
    if m < 0.05:
        why.append(f"step draft margin {m:.4f}")
    dm = min(t["draft_margin"] for t in g["trace"])
    tm = min(t["target_margin"] for t in g["trace"])
    if dm < 1e-3 or tm < 0.05:
        why.append(f"reference run margins draft {dm:.4f} target {tm:.4f}")
    ent = mean_entropy(g["s1_logits"])
    if ent > 0.8 * math.log(vocab):
        why.append(f"drafter entropy {ent:.2f} too close to uniform")
    return not why, "; ".join(why)


def build_one(tname: str, root: Path) -> None:
    from transformers import AutoModelForCausalLM
    import transformers
    spec = DRAFTERS[tname]
    tdir = root / tname
    target = AutoModelForCausalLM.from_pretrained(tdir, dtype=torch.float32, attn_implementation="eager").eval()
    tcfg = target.config
    cfg = drafter_config(tcfg, spec)
    gen = torch.Generator().manual_seed(spec["seed"] + 7)
    hi = min(250, tcfg.vocab_size - 3)
    prompt = torch.randint(2, hi + 1, (PROMPT_LEN,), generator=gen).tolist()
    B = spec["block"]
    save_dtype = DTYPES[spec["dtype"]]

    chosen = None
    for k in range(SEED_TRIES):
        seed = spec["seed"] + k
        torch.manual_seed(seed)
        drafter = DFlashDrafter(cfg, tcfg)
        reinit_weights(drafter, seed, linear_std=LINEAR_STD, embed_std=0.0, norm_jitter=NORM_JITTER)
        for p in target.parameters():
            p.requires_grad_(False)
        train_drafter(drafter, target, seed, spec.get("train_steps", TRAIN_STEPS))
        # the saved weights are exactly the ones used for the goldens
        drafter = drafter.to(save_dtype).float().eval()
        g = compute_golden(target, drafter, prompt, B)
        ok, why = acceptable(g, tcfg.vocab_size)
        if ok:
            chosen = (seed, drafter, g)
            break
        print(f"  dflash-{tname}: weight seed {seed} rejected: {why}")
    if chosen is None:
        raise SystemExit(f"dflash-{tname}: no acceptable seed")
    seed, drafter, g = chosen

    ddir = root / f"dflash-{tname}"
    if ddir.exists():
        shutil.rmtree(ddir)
    drafter.save_pretrained(ddir, dtype=save_dtype)
    # reload from disk and recompute: the goldens must come from the files
    re = DFlashDrafter.from_pretrained(ddir, tcfg, dtype=torch.float32).eval()
    g2 = compute_golden(target, re, prompt, B)
    if not torch.equal(g2["s1_logits"], g["s1_logits"]) or g2["toks"] != g["toks"] or g2["acc"] != g["acc"]:
        raise SystemExit(f"dflash-{tname}: reloaded drafter gives different results")

    n = PROMPT_LEN
    golden = {
        "drafter": f"dflash-{tname}",
        "target": tname,
        "dtype_saved": spec["dtype"],
        "compute_dtype": "float32",
        "weight_seed": seed,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__.split("+")[0],
        "block_size": B,
        "mask_token_id": spec["mask"],
        "target_layer_ids": list(spec["ids"]),
        "feature_rule": "feature(t) = concat(hidden_states[l+1][t] for l in target_layer_ids), transformers "
                        "hidden_states; hidden_states[num_layers] is the FINAL-NORMED output",
        "last_target_layer_used": g["last_layer_used"],
        "rope": {"parameters": drafter.rope_description, "inv_freq": drafter.inv_freq.tolist(),
                 "attention_scaling": drafter.attention_scaling},
        "prompt": prompt,
        "features_row0": g["feats1"][0, 0],
        "projected_context_row0": g["ctx_row0"],
        "step1_context_len": n,
        "step1_context_positions": [0, n - 1],
        "step1_anchor": g["anchor1"],
        "step1_block_ids": [g["anchor1"]] + [spec["mask"]] * (B - 1),
        "step1_block_positions": [n, n + B - 1],
        "step1_logits_rows": "block rows 1..B-1 (positions n+1..n+B-1)",
        "step1_logits": g["s1_logits"],
        "step1_draft": g["s1_draft"],
        "extra_tokens": g["extra"],
        "step2_new_context_tokens": [g["anchor1"]] + g["extra"],
        "step2_new_context_positions": [n, n + EXTRA_TOKENS],
        "step2_context_len": g["s2_ctx_len"],
        "step2_context_positions": [0, g["s2_ctx_len"] - 1],
        "step2_anchor": g["anchor2"],
        "step2_block_ids": [g["anchor2"]] + [spec["mask"]] * (B - 1),
        "step2_block_positions": [g["s2_ctx_len"], g["s2_ctx_len"] + B - 1],
        "step2_logits": g["s2_logits"],
        "step2_draft": g["s2_draft"],
        "step_logits_min_margin": min(min_margin(g["s1_logits"]), min_margin(g["s2_logits"])),
        "step1_mean_entropy": mean_entropy(g["s1_logits"]),
        "reference_generate": {
            "max_new_tokens": REF_MAX_NEW,
            "block_size": B,
            "eos_ids": [],
            "tokens": g["toks"],
            "acceptance_lengths": g["acc"],
            "min_draft_margin": min(t["draft_margin"] for t in g["trace"]),
            "min_target_margin": min(t["target_margin"] for t in g["trace"]),
            "steps": [{"start": t["start"], "anchor": t["anchor"], "drafts": t["drafts"],
                       "accepted": t["accepted"]} for t in g["trace"]],
        },
    }
    write_json(ddir / "drafter_golden.json", golden)
    print(f"dflash-{tname}: seed {seed}, drafts {g['s1_draft'][:6]}..., acceptance {g['acc']}, "
          f"entropy {golden['step1_mean_entropy']:.2f}, margins {golden['step_logits_min_margin']:.3f} "
          f"{golden['reference_generate']['min_draft_margin']:.4f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=str(Path(__file__).resolve().parent.parent / "testdata" / "tiny"))
    ap.add_argument("--only", nargs="*", default=None, help="target names (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    for t in args.only or list(DRAFTERS):
        build_one(t, Path(args.root))


if __name__ == "__main__":
    main()
