#!/usr/bin/env python3
"""Train the DFlash drafter for the target made by train_target.py.

Uses tools/dflash_torch.py (DFlashDrafter, target_context_features) for the drafter itself; this
file only prepares data and runs the optimisation.

  1. data: prompts are random token windows cut from the target's training stream
     (work/train_tokens.npy); the target continues each one (mostly greedy, some low-temperature
     sampling) to a fixed total length. The generated part is what the drafter learns to predict.
  2. training step: the frozen target runs over a batch of sequences and yields the context
     features (hidden_states[l + 1] for l in target_layer_ids). Random anchor positions s are
     drawn inside the generated part; each anchor makes one block [tok[s], MASK x (B-1)] at
     positions s .. s+B-1 whose queries see the context rows of positions < s plus their own
     block (bidirectional), through a boolean mask. Many blocks are packed per sequence.
     Loss: cross-entropy of block rows 1..B-1 against tok[s+1..s+B-1], row k weighted by
     exp(-(k-1)/gamma). The drafter reads embeddings and logits through the target's (frozen)
     embedding and LM head.
  3. save in the drafter layout (config.json with dflash_config, safetensors, bf16).
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from dflash_torch import (  # noqa: E402
    DFlashDrafter,
    cache_kwarg,
    draft_block,
    new_dynamic_cache,
    target_context_features,
)


def log(*a):
    print(f"[dflash {time.strftime('%H:%M:%S')}]", *a, flush=True)


# ----------------------------------------------------------------------------- data generation
@torch.no_grad()
def continue_batch(target, prompts, n_new, temperature, gen):
    """prompts [b, P] (long, on the target's device) -> [b, P + n_new]; temperature 0 = greedy.
    No stop at end-of-text: every row gets exactly n_new tokens."""
    b, P = prompts.shape
    dev = prompts.device
    kw = cache_kwarg(target)
    cache = new_dynamic_cache(target)
    out = target(input_ids=prompts, position_ids=torch.arange(P, device=dev)[None].expand(b, -1),
                 use_cache=True, logits_to_keep=1, **{kw: cache})
    toks = []
    for i in range(n_new):
        logits = out.logits[:, -1].float()
        if temperature > 0:
            probs = torch.softmax(logits / temperature, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=gen)[:, 0]
        else:
            nxt = logits.argmax(-1)
        toks.append(nxt)
        if i + 1 == n_new:
            break
        pos = torch.full((b, 1), P + i, device=dev, dtype=torch.long)
        out = target(input_ids=nxt[:, None], position_ids=pos, use_cache=True, logits_to_keep=1, **{kw: cache})
    return torch.cat([prompts, torch.stack(toks, 1)], 1)


def random_windows(tokens, n, length, rng):
    off = rng.integers(0, tokens.size - length - 1, size=n)
    return np.stack([tokens[o : o + length] for o in off]).astype(np.int64)


def generate_pool(target, tokens, seq_len, prompt_lens, batch, seconds, sample_frac, temperature, dev, seed,
                  max_batches=10**9, min_batches=1):
    """Generated sequences [N, seq_len] (long, on dev) and their prompt lengths [N]."""
    rng = np.random.default_rng(seed)
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    seqs, plens = [], []
    t0 = time.time()
    i = 0
    n_greedy = n_sampled = 0
    while i < max_batches and (i < min_batches or time.time() - t0 < seconds):
        P = int(prompt_lens[i % len(prompt_lens)])
        temp = temperature if rng.random() < sample_frac else 0.0
        prompts = torch.from_numpy(random_windows(tokens, batch, P, rng)).to(dev)
        s = continue_batch(target, prompts, seq_len - P, temp, gen)
        seqs.append(s)
        plens.append(torch.full((batch,), P, dtype=torch.long, device=dev))
        if temp > 0:
            n_sampled += batch
        else:
            n_greedy += batch
        i += 1
    seqs = torch.cat(seqs)
    plens = torch.cat(plens)
    return seqs, plens, {"batches": i, "greedy_seqs": n_greedy, "sampled_seqs": n_sampled,
                         "seconds": time.time() - t0}


# ----------------------------------------------------------------------------- blocks
def make_blocks(seqs, plens, n_blocks, B, mask_id, gen):
    """Random anchors in the generated part of each sequence.

    Returns block_ids [b, N*B], block_pos [b, N*B], labels [b, N, B-1], attn_mask [b, N*B, L+N*B]."""
    b, L = seqs.shape
    dev = seqs.device
    lo = plens.float()
    span = (L - B + 1) - lo                                           # anchors s in [P, L-B]
    s = (lo[:, None] + torch.rand(b, n_blocks, device=dev, generator=gen) * span[:, None]).long()
    s = torch.minimum(s, torch.full_like(s, L - B))
    offs = torch.arange(B, device=dev)
    pos = s[:, :, None] + offs[None, None, :]                         # [b, N, B]
    block_ids = torch.full((b, n_blocks, B), mask_id, dtype=torch.long, device=dev)
    block_ids[:, :, 0] = torch.gather(seqs, 1, s)
    labels = torch.gather(seqs, 1, pos[:, :, 1:].reshape(b, -1)).view(b, n_blocks, B - 1)
    ctx_vis = torch.arange(L, device=dev)[None, None, :] < s[:, :, None]   # [b, N, L]
    ctx_vis = ctx_vis[:, :, None, :].expand(b, n_blocks, B, L).reshape(b, n_blocks * B, L)
    blk = torch.arange(n_blocks, device=dev)
    same = (blk[:, None] == blk[None, :])                              # [N, N]
    blk_vis = same[:, None, :, None].expand(n_blocks, B, n_blocks, B).reshape(n_blocks * B, n_blocks * B)
    mask = torch.cat([ctx_vis, blk_vis[None].expand(b, -1, -1)], dim=2)
    return block_ids.view(b, -1), pos.view(b, -1), labels, mask


def drafter_step(target, drafter, layer_ids, seqs, plens, n_blocks, B, mask_id, gen, amp_dtype, row_w):
    """Returns (weighted loss, per-row correctness [b*N, B-1] bool)."""
    b, L = seqs.shape
    dev = seqs.device
    with torch.no_grad():
        with torch.autocast(dev.type, dtype=amp_dtype, enabled=amp_dtype != torch.float32):
            out = target.model(input_ids=seqs, output_hidden_states=True, use_cache=False)
        hs = out.hidden_states
        feats = target_context_features(hs, layer_ids)
        block_ids, pos, labels, mask = make_blocks(seqs, plens, n_blocks, B, mask_id, gen)
        emb = target.get_input_embeddings()(block_ids)
    with torch.autocast(dev.type, dtype=amp_dtype, enabled=amp_dtype != torch.float32):
        ctx = drafter.project_context(feats)
        ctx_pos = torch.arange(L, device=dev)[None].expand(b, -1)
        hid = drafter(emb, pos, ctx, ctx_pos, mask)                   # [b, N*B, H]
        hid = hid.view(b, n_blocks, B, -1)[:, :, 1:]
        logits = target.get_output_embeddings()(hid)                  # [b, N, B-1, V]
    logits = logits.float().reshape(-1, B - 1, logits.shape[-1])
    lab = labels.reshape(-1, B - 1)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), lab.reshape(-1), reduction="none").view(-1, B - 1)
    loss = (ce * row_w[None]).sum(-1).mean() / row_w.sum()
    correct = logits.argmax(-1) == lab
    return loss, correct


@torch.no_grad()
def check_packing(target, drafter, layer_ids, seqs, plens, n_blocks, B, mask_id):
    """The packed, masked training forward must give the same block logits as the reference
    one-block step of dflash_torch.draft_block (context = features of positions < s only)."""
    g = torch.Generator(device=seqs.device)
    g.manual_seed(5)
    seqs, plens = seqs[:2], plens[:2]
    b, L = seqs.shape
    out = target.model(input_ids=seqs, output_hidden_states=True, use_cache=False)
    feats = target_context_features(out.hidden_states, layer_ids)
    block_ids, pos, labels, mask = make_blocks(seqs, plens, n_blocks, B, mask_id, g)
    emb = target.get_input_embeddings()(block_ids)
    ctx = drafter.project_context(feats)
    hid = drafter(emb, pos, ctx, torch.arange(L, device=seqs.device)[None].expand(b, -1), mask)
    head = target.get_output_embeddings()
    logits = head(hid.view(b, n_blocks, B, -1)[:, :, 1:].to(head.weight.dtype)).float()
    worst = 0.0
    for i in range(b):
        for j in (0, n_blocks - 1):
            s = int(pos[i, j * B])
            ref, _ = draft_block(target, drafter, feats[i:i + 1, :s], int(block_ids[i, j * B]), s, B, mask_id)
            err = ((logits[i, j] - ref).norm() / ref.norm()).item()
            worst = max(worst, err)
            assert torch.equal(labels[i, j], seqs[i, s + 1:s + B]), "labels misaligned"
    return worst


def acceptance_from_correct(correct):
    """Mean acceptance length (1 + accepted drafts) if each block were verified greedily."""
    return (1 + torch.cumprod(correct.long(), dim=1).sum(1).float()).mean().item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--target-layer-ids", type=int, nargs="+", default=[1, 4, 6])
    ap.add_argument("--seq-len", type=int, default=480)
    ap.add_argument("--prompt-lens", type=int, nargs="+", default=[64, 128, 192])
    ap.add_argument("--gen-batch", type=int, default=2048)
    ap.add_argument("--gen-seconds", type=float, default=60.0)
    ap.add_argument("--gen-max-batches", type=int, default=10**9)
    ap.add_argument("--sample-frac", type=float, default=0.25)
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--blocks-per-seq", type=int, default=16)
    ap.add_argument("--gamma", type=float, default=7.0)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--wd", type=float, default=0.01)
    ap.add_argument("--train-seconds", type=float, default=170.0)
    ap.add_argument("--max-steps", type=int, default=10**9)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(args.seed)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    amp_dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True

    tok = AutoTokenizer.from_pretrained(args.target)
    tok_size = len(tok)
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.bfloat16 if dev.type == "cuda" else torch.float32)
    target = target.to(dev).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    tc = target.config
    mask_id = tok_size                      # first embedding row past the tokenizer's last id
    assert mask_id < tc.vocab_size, (mask_id, tc.vocab_size)
    L_t = tc.num_hidden_layers
    for l in args.target_layer_ids:
        assert 0 <= l < L_t - 1, f"target layer {l}: use layers below the last (hidden_states[L] is normed)"
    B = args.block_size
    rope_theta = float((getattr(tc, "rope_parameters", None) or {}).get("rope_theta", getattr(tc, "rope_theta", 10000.0)))
    dcfg = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": tc.hidden_size,
        "intermediate_size": tc.intermediate_size,
        "num_hidden_layers": args.layers,
        "num_attention_heads": tc.num_attention_heads,
        "num_key_value_heads": tc.num_key_value_heads,
        "head_dim": tc.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": tc.rms_norm_eps,
        "attention_bias": False,
        "rope_theta": rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": tc.max_position_embeddings,
        "vocab_size": tc.vocab_size,
        "tie_word_embeddings": False,
        "block_size": B,
        "num_target_layers": L_t,
        "dflash_config": {"mask_token_id": mask_id, "target_layer_ids": list(args.target_layer_ids)},
    }
    drafter = DFlashDrafter(dcfg, tc).to(dev)
    nparams = sum(p.numel() for p in drafter.parameters())
    log(f"target {sum(p.numel() for p in target.parameters())/1e6:.2f} M params, {L_t} layers; "
        f"drafter {nparams/1e6:.2f} M params; mask id {mask_id}; target_layer_ids {args.target_layer_ids}")

    # 1. data
    train_tokens = np.load(os.path.join(args.work, "train_tokens.npy"))
    held_tokens = np.load(os.path.join(args.work, "heldout_tokens.npy"))
    pool, plens, ginfo = generate_pool(target, train_tokens, args.seq_len, args.prompt_lens, args.gen_batch,
                                       args.gen_seconds, args.sample_frac, args.temperature, dev, args.seed + 7,
                                       max_batches=args.gen_max_batches)
    gen_tokens = int((args.seq_len - plens).sum())
    log(f"generated {pool.shape[0]} sequences of {args.seq_len} ({gen_tokens/1e6:.2f} M generated tokens) "
        f"in {ginfo['seconds']:.0f}s: {ginfo}")
    vb = min(256, max(args.batch, 8))
    vpool, vplens, _ = generate_pool(target, held_tokens, args.seq_len, args.prompt_lens, vb, 0.0, 0.0, 0.0, dev,
                                     args.seed + 99, max_batches=1)

    err = check_packing(target, drafter, args.target_layer_ids, vpool, vplens, args.blocks_per_seq, B, mask_id)
    log(f"packed-block forward vs dflash_torch.draft_block: max relative error {err:.2e}")
    assert err < (5e-2 if target.dtype == torch.bfloat16 else 1e-4), err

    # 2. train
    decay = [p for n, p in drafter.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in drafter.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=dev.type == "cuda")
    row_w = torch.exp(-torch.arange(B - 1, device=dev, dtype=torch.float32) / args.gamma)
    g = torch.Generator(device=dev)
    g.manual_seed(args.seed + 3)
    gv = torch.Generator(device=dev)

    def validate():
        gv.manual_seed(12345)
        drafter.eval()
        with torch.no_grad():
            accs, losses = [], []
            for i in range(0, vpool.shape[0], args.batch):
                l, c = drafter_step(target, drafter, args.target_layer_ids, vpool[i:i + args.batch],
                                    vplens[i:i + args.batch], args.blocks_per_seq, B, mask_id, gv, amp_dtype, row_w)
                losses.append(l.item())
                accs.append(c)
            c = torch.cat(accs)
        drafter.train()
        return float(np.mean(losses)), acceptance_from_correct(c), c.float().mean(0).tolist()

    drafter.train()
    step, ema, ema_tau = 0, None, None
    t_start = time.time()
    last_log = t_start - 100
    hist = []
    N = pool.shape[0]
    while True:
        elapsed = time.time() - t_start
        if elapsed >= args.train_seconds or step >= args.max_steps:
            break
        frac = min(elapsed / args.train_seconds, 1.0)
        lr = args.lr * min(1.0, (step + 1) / args.warmup) * (
            args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * frac)))
        for grp in opt.param_groups:
            grp["lr"] = lr
        idx = torch.randint(0, N, (args.batch,), device=dev, generator=g)
        loss, correct = drafter_step(target, drafter, args.target_layer_ids, pool[idx], plens[idx],
                                     args.blocks_per_seq, B, mask_id, g, amp_dtype, row_w)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 20 == 0 or step == 1:
            lv = loss.item()
            tau = acceptance_from_correct(correct)
            ema = lv if ema is None else 0.8 * ema + 0.2 * lv
            ema_tau = tau if ema_tau is None else 0.8 * ema_tau + 0.2 * tau
            now = time.time()
            if now - last_log > 20:
                last_log = now
                vl, vt, _ = validate()
                log(f"step {step} loss {lv:.4f} (ema {ema:.4f}) train tau~{ema_tau:.2f} | held-out loss {vl:.4f} "
                    f"tau~{vt:.2f} | lr {lr:.2e} elapsed {now - t_start:.0f}s")
                hist.append({"step": step, "loss": lv, "heldout_loss": vl, "heldout_tau_est": vt,
                             "elapsed": now - t_start})
    train_time = time.time() - t_start
    vl, vt, row_acc = validate()
    log(f"done: {step} steps in {train_time:.0f}s; train loss (ema) {ema:.4f}; held-out loss {vl:.4f}, "
        f"block-level tau estimate {vt:.3f}")
    log("held-out per-row top-1 accuracy: " + " ".join(f"{a:.2f}" for a in row_acc))

    # 3. save
    drafter.save_pretrained(args.out, dtype=torch.bfloat16)
    for fn in sorted(os.listdir(args.out)):
        log(f"  {fn}: {os.path.getsize(os.path.join(args.out, fn))/2**20:.2f} MiB")
    # round trip through the loader
    d2 = DFlashDrafter.from_pretrained(args.out, tc)
    assert d2.mask_token_id == mask_id and d2.target_layer_ids == list(args.target_layer_ids)
    stats = {"args": vars(args), "drafter_config": dcfg, "drafter_params": nparams, "generation": ginfo,
             "pool_sequences": int(N), "generated_tokens": gen_tokens, "steps": step, "train_seconds": train_time,
             "final_train_loss_ema": ema, "heldout_loss": vl, "heldout_tau_estimate": vt,
             "heldout_row_accuracy": row_acc, "history": hist}
    with open(os.path.join(args.work, "dflash_stats.json"), "w") as f:
        json.dump(stats, f, indent=2)
    log("saved to", args.out)


if __name__ == "__main__":
    main()
