#!/usr/bin/env python3
"""transformers baselines on the engine's own weights: plain `generate` and a DFlash loop.

Why: the engine's speed claims ("at least 8x faster at plain decode, at least 10x faster per
DFlash step") only mean something against a reference measured on the very same checkpoint, in
the same run, on the same machine. This script is that reference. It measures:

1. plain: `AutoModelForCausalLM.generate` (greedy, sdpa attention, DynamicCache, EOS disabled so
   exactly --new-tokens come out). Prefill is timed as a `generate` of one token, so
   decode tokens/s = (N - 1) / (t_generate(N) - t_generate(1)).
2. dflash: a greedy DFlash loop (docs/dflash.md sections 4-5) built from transformers' target
   (DynamicCache, output_hidden_states for the context features, crop for rollback) and the
   drafter of tools/dflash_torch.py. The drafter keeps a per-layer K/V cache of the context rows,
   as the contract (and the engine) does, so a step costs O(new rows) for the context projection
   instead of re-projecting the whole context: the fair baseline. Every step is timed in three
   synchronised parts: draft (context projection + drafter + LM head + argmax), verify (target
   over the B block rows), commit (acceptance, KV crop, feature selection).

Also printed: "greedy DFlash == generate: yes/no" (the DFlash tokens against generate's), and on
the first step the cached drafter's logits against tools/dflash_torch.draft_block (which
recomputes the context from scratch), so the timed drafter is the reference drafter.

    python3 tools/hf_side_by_side.py --target /tmp/q8b --draft /tmp/q8b-dflash \
        --prompt-len 512 --new-tokens 64 --block 16 --steps 64 --device cuda --dtype bfloat16 \
        --json /tmp/hf_side_by_side.json

Works offline (local_files_only) with transformers 4.5x and 5.x.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dflash_torch import (DFlashDrafter, apply_rope, crop_cache, draft_block,  # noqa: E402
                          new_dynamic_cache, target_context_features, target_forward)


# =========================================================================== setup

def fail(msg: str) -> None:
    print(f"hf_side_by_side: error: {msg}", file=sys.stderr)
    sys.exit(2)


def check_checkpoint_dir(d: str, what: str) -> Path:
    p = Path(d)
    if not p.is_dir():
        fail(f"{what} directory {d!r} does not exist")
    if not (p / "config.json").is_file():
        fail(f"{what} directory {d!r} has no config.json")
    if not any(p.glob("*.safetensors")):
        fail(f"{what} directory {d!r} has no *.safetensors")
    return p


def load_target(d: Path, dtype: torch.dtype, device: str):
    import transformers
    from transformers import AutoModelForCausalLM
    # `dtype=` only exists from 4.56 on; older versions would silently store an unknown kwarg in
    # the config and load f32, so pick the keyword by version and check the result below.
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    key = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
    model = AutoModelForCausalLM.from_pretrained(str(d), attn_implementation="sdpa",
                                                 local_files_only=True, **{key: dtype})
    model = model.to(device).eval()
    if model.dtype != dtype:
        fail(f"target loaded as {model.dtype}, wanted {dtype}")
    return model


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def now(device: str) -> float:
    sync(device)
    return time.perf_counter()


# =========================================================================== plain generate

def plain_generation_config(model, n: int):
    """Greedy, no EOS: with an EOS id set, min_new_tokens would mask it out of the argmax and
    the tokens would no longer be plain greedy ones (which the DFlash loop reproduces)."""
    import copy
    gc = copy.deepcopy(model.generation_config)
    gc.eos_token_id = None
    gc.do_sample = False
    gc.max_new_tokens = n
    gc.min_new_tokens = n
    gc.pad_token_id = 0
    for k in ("temperature", "top_p", "top_k"):
        if hasattr(gc, k):
            setattr(gc, k, None)
    return gc


def run_generate(model, ids: torch.Tensor, n: int, device: str) -> tuple[float, list[int]]:
    gc = plain_generation_config(model, n)
    t0 = now(device)
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gc)
    t1 = now(device)
    new = out[0, ids.shape[1]:].tolist()
    if len(new) != n:
        fail(f"generate returned {len(new)} tokens, wanted {n}")
    return t1 - t0, new


def measure_plain(model, ids, n, warmup, repeats, device):
    for _ in range(warmup):
        run_generate(model, ids, n, device)
        run_generate(model, ids, 1, device)
    pre, full, tokens = [], [], None
    for _ in range(repeats):
        t, _ = run_generate(model, ids, 1, device)
        pre.append(t)
        t, tokens = run_generate(model, ids, n, device)
        full.append(t)
    t_pre, t_full = statistics.median(pre), statistics.median(full)
    decode = t_full - t_pre
    return dict(prefill_ms=1e3 * t_pre, generate_ms=1e3 * t_full,
                prefill_runs_ms=[1e3 * t for t in pre], generate_runs_ms=[1e3 * t for t in full],
                decode_ms_per_token=1e3 * decode / max(n - 1, 1),
                decode_tokens_per_s=(n - 1) / decode if decode > 0 else float("nan"),
                generate_tokens_per_s=n / t_full), tokens


# =========================================================================== DFlash loop

class DrafterKV:
    """The drafter's per-layer K/V of committed context rows (contract section 4: appended,
    never recomputed). Preallocated so that a step does not copy the whole cache to grow it."""

    def __init__(self, drafter: DFlashDrafter, capacity: int, device, dtype):
        a = drafter.layers[0].self_attn
        shape = (len(drafter.layers), 1, a.nkv, capacity, a.hd)
        self.k = torch.empty(shape, device=device, dtype=dtype)
        self.v = torch.empty(shape, device=device, dtype=dtype)
        self.n = 0


def draft_cached(target, drafter: DFlashDrafter, kv: DrafterKV, new_features, anchor: int,
                 s: int, B: int):
    """One drafting step: new_features [1, s - kv.n, K*Ht] are the rows the drafter has not seen.
    Same arithmetic as DFlashDrafter.forward, except context K/V come from the cache and the
    attention goes through SDPA (what a transformers user would write on a GPU)."""
    dev, dt = drafter.fc.weight.device, drafter.fc.weight.dtype
    n0 = kv.n
    if n0 + new_features.shape[1] != s:
        raise ValueError(f"drafter cache has {n0} rows + {new_features.shape[1]} new != {s}")
    ctx = drafter.project_context(new_features)
    cos_c, sin_c = drafter.rope(torch.arange(n0, s, device=dev)[None], dt)
    cos_b, sin_b = drafter.rope(torch.arange(s, s + B, device=dev)[None], dt)
    ids = torch.tensor([[anchor] + [drafter.mask_token_id] * (B - 1)], device=dev)
    x = target.get_input_embeddings()(ids).to(dt)
    for i, layer in enumerate(drafter.layers):
        at = layer.self_attn
        kc, vc = at.context_kv(ctx, cos_c, sin_c)
        kv.k[i, :, :, n0:s] = kc
        kv.v[i, :, :, n0:s] = vc
        h = layer.input_layernorm(x)
        q = apply_rope(at.q_norm(at.q_proj(h).view(1, B, at.nh, at.hd)).transpose(1, 2), cos_b, sin_b)
        kb = apply_rope(at.k_norm(at.k_proj(h).view(1, B, at.nkv, at.hd)).transpose(1, 2), cos_b, sin_b)
        vb = at.v_proj(h).view(1, B, at.nkv, at.hd).transpose(1, 2)
        k = torch.cat([kv.k[i, :, :, :s], kb], dim=2)
        v = torch.cat([kv.v[i, :, :, :s], vb], dim=2)
        rep = at.nh // at.nkv
        if rep > 1:  # expanded rather than enable_gqa: keeps the flash / efficient SDPA kernels
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v)  # no mask: bidirectional inside the block
        x = x + at.o_proj(o.transpose(1, 2).reshape(1, B, at.nh * at.hd))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    kv.n = s
    head = target.get_output_embeddings()
    logits = head(drafter.norm(x)[:, 1:].to(head.weight.dtype))[0]
    return logits, logits.argmax(-1).tolist()


def dflash_run(target, drafter, prompt: list[int], B: int, device: str, max_new_tokens=None,
               max_steps=None, check_first_step=False):
    """Greedy DFlash from the prompt until max_new_tokens tokens are out or max_steps steps ran.
    Returns (tokens, per-step records, prefill seconds, first-step drafter check or None)."""
    layer_ids = drafter.target_layer_ids
    budget = (max_new_tokens or 0) + (max_steps or 0) * B
    kv = DrafterKV(drafter, len(prompt) + budget + B, device, drafter.fc.weight.dtype)
    cache = new_dynamic_cache(target)
    t0 = now(device)
    logits, hs = target_forward(target, prompt, 0, cache)
    new_feats = target_context_features(hs, layer_ids)
    anchor = int(logits[-1].argmax())
    t_prefill = now(device) - t0
    del logits, hs
    s, out, steps, check = len(prompt), [], [], None
    while True:
        if max_new_tokens is not None and len(out) >= max_new_tokens:
            break
        if max_steps is not None and len(steps) >= max_steps:
            break
        if check_first_step and not steps:
            # The timed drafter against the reference one (context recomputed from scratch).
            ref_logits, ref_drafts = draft_block(target, drafter, new_feats, anchor, s, B)
        t0 = now(device)
        dlogits, drafts = draft_cached(target, drafter, kv, new_feats, anchor, s, B)
        t1 = now(device)
        block = [anchor] + drafts
        vlogits, vhs = target_forward(target, block, s, cache)
        t2 = now(device)
        choice = vlogits.argmax(-1).tolist()  # choice[i] predicts position s + i + 1
        a = 0
        while a < B - 1 and drafts[a] == choice[a]:
            a += 1
        crop_cache(cache, s + a + 1)
        new_feats = target_context_features(vhs, layer_ids)[:, : a + 1]
        t3 = now(device)
        if check_first_step and not steps:
            check = dict(max_abs_logit_diff=float((dlogits.float() - ref_logits).abs().max()),
                         drafts_equal=ref_drafts == drafts,
                         drafts_matching=sum(x == y for x, y in zip(ref_drafts, drafts)),
                         drafts_total=len(drafts))
        steps.append(dict(draft_ms=1e3 * (t1 - t0), verify_ms=1e3 * (t2 - t1),
                          commit_ms=1e3 * (t3 - t2), step_ms=1e3 * (t3 - t0), accepted=a + 1,
                          start=s))
        out.extend(block[: a + 1])
        s += a + 1
        anchor = int(choice[a])
        del vlogits, vhs, dlogits
    if max_new_tokens is not None:
        out = out[:max_new_tokens]
    return out, steps, t_prefill, check


def summarise_steps(steps: list[dict]) -> dict:
    def col(k):
        return [st[k] for st in steps]

    total_ms = sum(col("step_ms"))
    tokens = sum(col("accepted"))
    r = dict(steps=len(steps), tokens=tokens, total_ms=total_ms,
             tau=tokens / len(steps), tokens_per_s=1e3 * tokens / total_ms)
    for k in ("step_ms", "draft_ms", "verify_ms", "commit_ms"):
        r[k.replace("_ms", "") + "_mean_ms"] = statistics.fmean(col(k))
        r[k.replace("_ms", "") + "_median_ms"] = statistics.median(col(k))
    hist = {}
    for a in col("accepted"):
        hist[a] = hist.get(a, 0) + 1
    r["acceptance_histogram"] = {str(k): hist[k] for k in sorted(hist)}
    return r


def first_difference_note(target, prompt, gen, dfl, device) -> str:
    """Where the two greedy runs part, and the target's top-1/top-2 logit gap there: random bf16
    weights give near-ties that batched (B rows) and single-row kernels may break differently."""
    i = next((j for j, (x, y) in enumerate(zip(gen, dfl)) if x != y), min(len(gen), len(dfl)))
    if i >= min(len(gen), len(dfl)):
        return f"lengths differ ({len(gen)} vs {len(dfl)})"
    cache = new_dynamic_cache(target)
    logits, _ = target_forward(target, list(prompt) + gen[:i], 0, cache)
    top = torch.topk(logits[-1], 2).values
    return (f"first difference at new token {i}: generate {gen[i]}, DFlash {dfl[i]}; "
            f"target top-1 - top-2 logit gap there {float(top[0] - top[1]):.3g}")


# =========================================================================== main

def describe(target, drafter, B) -> dict:
    c = target.config
    keys = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "intermediate_size", "tie_word_embeddings")
    dc = drafter.config
    return dict(
        target={k: getattr(c, k, None) for k in keys}
        | dict(parameters=sum(p.numel() for p in target.parameters())),
        drafter={k: dc.get(k) for k in keys if k in dc}
        | dict(block_size_config=drafter.block_size, block_size_used=B,
               target_layer_ids=drafter.target_layer_ids, mask_token_id=drafter.mask_token_id,
               parameters=sum(p.numel() for p in drafter.parameters())))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True, help="target checkpoint directory (HF layout)")
    ap.add_argument("--draft", required=True, help="DFlash drafter directory")
    ap.add_argument("--prompt-len", type=int, default=512, help="random prompt length (seeded)")
    ap.add_argument("--prompt-ids", default="", help="comma-separated ids (overrides --prompt-len)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random prompt")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--block", type=int, default=16, help="DFlash block size B")
    ap.add_argument("--steps", type=int, default=64, help="DFlash steps to time")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs before each measurement")
    ap.add_argument("--repeats", type=int, default=3, help="timed plain runs (median reported)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--json", default="", help="write all figures here")
    a = ap.parse_args()

    if a.device.startswith("cuda") and not torch.cuda.is_available():
        fail("--device cuda but torch sees no CUDA device")
    if a.new_tokens < 2 or a.block < 2 or a.steps < 1 or a.repeats < 1 or a.warmup < 0:
        fail("need --new-tokens >= 2, --block >= 2, --steps >= 1, --repeats >= 1, --warmup >= 0")
    tdir = check_checkpoint_dir(a.target, "target")
    ddir = check_checkpoint_dir(a.draft, "drafter")
    dtype = getattr(torch, a.dtype)

    import transformers
    torch.manual_seed(0)
    target = load_target(tdir, dtype, a.device)
    drafter = DFlashDrafter.from_pretrained(ddir, target.config, dtype=dtype).to(a.device).eval()
    # A plain attribute (kept f32 on purpose by dflash_torch); moved once here so that every
    # RoPE call does not copy it to the device again.
    drafter.inv_freq = drafter.inv_freq.to(a.device)
    if drafter.mask_token_id is None:
        fail("drafter config has no mask_token_id")
    vocab = target.config.vocab_size
    if a.prompt_ids:
        prompt = [int(x) for x in a.prompt_ids.split(",") if x.strip()]
    else:
        g = torch.Generator().manual_seed(a.seed)
        prompt = torch.randint(0, vocab, (a.prompt_len,), generator=g).tolist()
    if not prompt or max(prompt) >= vocab or min(prompt) < 0:
        fail(f"prompt ids must be in [0, {vocab})")
    ids = torch.tensor([prompt], device=a.device)
    dev_name = torch.cuda.get_device_name(a.device) if a.device.startswith("cuda") else \
        (platform.processor() or platform.machine()) + f" ({torch.get_num_threads()} threads)"

    with torch.inference_mode():
        plain, gen_tokens = measure_plain(target, ids, a.new_tokens, a.warmup, a.repeats, a.device)

        # Untimed: the greedy-equality check over --new-tokens, which also warms the loop up.
        dfl_tokens, _, _, drafter_check = dflash_run(target, drafter, prompt, a.block, a.device,
                                                     max_new_tokens=a.new_tokens,
                                                     check_first_step=True)
        same = dfl_tokens == gen_tokens
        note = "" if same else first_difference_note(target, prompt, gen_tokens, dfl_tokens, a.device)
        for _ in range(max(a.warmup - 1, 0)):
            dflash_run(target, drafter, prompt, a.block, a.device, max_steps=min(a.steps, 4))
        _, steps, dfl_prefill, _ = dflash_run(target, drafter, prompt, a.block, a.device,
                                              max_steps=a.steps)
    dflash = summarise_steps(steps) | dict(prefill_with_hidden_states_ms=1e3 * dfl_prefill)

    result = dict(
        tool="tools/hf_side_by_side.py", torch_version=torch.__version__,
        transformers_version=transformers.__version__, python_version=platform.python_version(),
        device=a.device, device_name=dev_name, dtype=a.dtype, attn_implementation="sdpa",
        target_dir=str(tdir), draft_dir=str(ddir), prompt_len=len(prompt), prompt_seed=
        None if a.prompt_ids else a.seed, new_tokens=a.new_tokens, block=a.block,
        warmup=a.warmup, repeats=a.repeats, shapes=describe(target, drafter, a.block),
        plain=plain, dflash=dflash, dflash_steps=steps,
        greedy_check=dict(equal=same, generate_tokens=gen_tokens, dflash_tokens=dfl_tokens,
                          note=note, first_step_drafter_vs_reference=drafter_check))

    t = result["shapes"]["target"]
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {dev_name}, "
          f"{a.dtype}, sdpa")
    print(f"target {t['num_hidden_layers']}L H{t['hidden_size']} heads {t['num_attention_heads']}/"
          f"{t['num_key_value_heads']} vocab {t['vocab_size']}; drafter "
          f"{len(drafter.layers)}L K={len(drafter.target_layer_ids)}; prompt {len(prompt)}, "
          f"new tokens {a.new_tokens}, block {a.block}")
    print(f"{'':26}{'ms':>10}  {'tok/s':>9}")
    print(f"{'plain prefill (gen 1)':26}{plain['prefill_ms']:10.2f}")
    print(f"{'plain generate':26}{plain['generate_ms']:10.2f}  {plain['generate_tokens_per_s']:9.2f}")
    print(f"{'plain decode / token':26}{plain['decode_ms_per_token']:10.3f}  "
          f"{plain['decode_tokens_per_s']:9.2f}")
    print(f"{'DFlash step mean':26}{dflash['step_mean_ms']:10.3f}  {dflash['tokens_per_s']:9.2f}"
          f"   (median {dflash['step_median_ms']:.3f}, {dflash['steps']} steps, "
          f"tau {dflash['tau']:.3f})")
    print(f"{'  draft mean':26}{dflash['draft_mean_ms']:10.3f}   (median {dflash['draft_median_ms']:.3f})")
    print(f"{'  verify mean':26}{dflash['verify_mean_ms']:10.3f}   (median {dflash['verify_median_ms']:.3f})")
    print(f"{'  commit mean':26}{dflash['commit_mean_ms']:10.3f}   (median {dflash['commit_median_ms']:.3f})")
    if drafter_check:
        # In bf16 the two attention paths round differently, so a near-tied draft may flip;
        # in f32 every draft must match.
        print(f"cached drafter vs dflash_torch.draft_block (step 1): drafts equal "
              f"{drafter_check['drafts_matching']}/{drafter_check['drafts_total']}, max |logit diff| "
              f"{drafter_check['max_abs_logit_diff']:.3g}")
    print(f"greedy DFlash == generate: {'yes' if same else 'no'}" + (f" ({note})" if note else ""))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
