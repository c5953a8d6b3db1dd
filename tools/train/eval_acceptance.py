#!/usr/bin/env python3
"""Acceptance of the trained drafter on held-out code prompts, with the reference greedy loop of
tools/dflash_torch.py (dflash_generate), checked token for token against plain greedy decoding.

Prompts: cut from files the target never saw (work/heldout_docs.jsonl, written by
train_target.py): each starts at a def/class/decorator line and ends at a line end, 100-256
tokens long. They are saved (text and token ids) to --prompts-out, or read from --prompts-in.

Reports per dtype: mean acceptance length tau (pooled over all verification steps), the histogram
of acceptance lengths 1..B, per-position acceptance rates, and whether every speculative output
equals the plain greedy output.
"""
import argparse
import hashlib
import json
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from dflash_torch import DFlashDrafter, dflash_generate, greedy_generate  # noqa: E402

STARTS = ("def ", "class ", "async def ", "@", "    def ", "    async def ", "    @")


def log(*a):
    print(f"[eval {time.strftime('%H:%M:%S')}]", *a, flush=True)


def short_source(path):
    for key in ("site-packages/", "dist-packages/", "/lib/"):
        if key in path:
            return path.split(key, 1)[1] if key != "/lib/" else "lib/" + path.split(key, 1)[1]
    return os.path.basename(path)


def build_prompts(docs, tok, n, min_tokens, max_tokens, seed=2024):
    docs = sorted(docs, key=lambda d: hashlib.md5(d["path"].encode()).hexdigest())
    rng = random.Random(seed)
    out = []
    for d in docs:
        lines = d["text"].splitlines(keepends=True)
        if len(lines) < 40 or any(len(l) > 300 for l in lines):
            continue
        cands = [i for i, l in enumerate(lines[:-20]) if i > 0 and l.startswith(STARTS)]
        if not cands:
            continue
        start = rng.choice(cands)
        want = rng.randint(min_tokens, max_tokens)
        text, ids = "", []
        for l in lines[start:]:
            nt = text + l
            nids = tok(nt, add_special_tokens=False)["input_ids"]
            if len(nids) > want:
                break
            text, ids = nt, nids
        if len(ids) < min_tokens or not text.endswith("\n"):
            continue
        out.append({"prompt": text, "prompt_ids": ids, "source": short_source(d["path"])})
        if len(out) >= n:
            break
    return out


def summarize(acc_all, B):
    hist = [0] * (B + 1)
    for a in acc_all:
        hist[a] += 1
    steps = len(acc_all)
    pos_rate = []
    for i in range(1, B):
        reached = sum(1 for a in acc_all if a >= i)
        passed = sum(1 for a in acc_all if a >= i + 1)
        pos_rate.append(passed / reached if reached else 0.0)
    return {"tau": sum(acc_all) / max(steps, 1), "steps": steps, "histogram": {str(k): hist[k] for k in range(1, B + 1)},
            "per_position_acceptance": pos_rate}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default=None, help="work dir of train_target.py (heldout_docs.jsonl)")
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--prompts-in", default=None, help="reuse an existing prompt file (jsonl with prompt_ids)")
    ap.add_argument("--prompts-out", default=None)
    ap.add_argument("--results", default=None)
    ap.add_argument("--n-prompts", type=int, default=32)
    ap.add_argument("--min-prompt-tokens", type=int, default=100)
    ap.add_argument("--max-prompt-tokens", type=int, default=256)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--device", default=None)
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    tok = AutoTokenizer.from_pretrained(args.target)
    eos_ids = [tok.eos_token_id]
    if args.prompts_in:
        prompts = [json.loads(l) for l in open(args.prompts_in)][: args.n_prompts]
        for p in prompts:
            if "prompt_ids" not in p:
                p["prompt_ids"] = tok(p["prompt"], add_special_tokens=False)["input_ids"]
    else:
        docs = [json.loads(l) for l in open(os.path.join(args.work, "heldout_docs.jsonl"))]
        prompts = build_prompts(docs, tok, args.n_prompts, args.min_prompt_tokens, args.max_prompt_tokens)
        if args.prompts_out:
            os.makedirs(os.path.dirname(os.path.abspath(args.prompts_out)), exist_ok=True)
            with open(args.prompts_out, "w") as f:
                for p in prompts:
                    f.write(json.dumps(p) + "\n")
    lens = [len(p["prompt_ids"]) for p in prompts]
    log(f"{len(prompts)} prompts, {min(lens)}..{max(lens)} tokens (mean {sum(lens)/len(lens):.0f}); device {dev}; "
        f"eos {eos_ids}")

    results = {"prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "block_size": args.block_size,
               "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu", "runs": {}}
    for dname in args.dtypes:
        dtype = getattr(torch, dname)
        target = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype).to(dev).eval()
        drafter = DFlashDrafter.from_pretrained(args.drafter, target.config, dtype=dtype).to(dev).eval()
        B = args.block_size
        acc_all, per_prompt, mismatches = [], [], 0
        t_spec = t_plain = 0.0
        n_spec_tokens = 0
        for i, p in enumerate(prompts):
            ids = p["prompt_ids"]
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.time()
            toks, acc = dflash_generate(target, drafter, ids, args.max_new_tokens, B, eos_ids)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t1 = time.time()
            ref = greedy_generate(target, ids, args.max_new_tokens, eos_ids)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t2 = time.time()
            t_spec += t1 - t0
            t_plain += t2 - t1
            n_spec_tokens += len(toks)
            same = toks == ref
            if not same:
                mismatches += 1
                first = next((k for k, (a, b) in enumerate(zip(toks, ref)) if a != b), min(len(toks), len(ref)))
                log(f"  [{dname}] prompt {i}: speculative != greedy from token {first} "
                    f"(lens {len(toks)} / {len(ref)})")
            acc_all.extend(acc)
            per_prompt.append({"tau": sum(acc) / len(acc), "steps": len(acc), "new_tokens": len(toks), "match": same})
        s = summarize(acc_all, B)
        s.update(mismatches=mismatches, prompts_matching=len(prompts) - mismatches,
                 mean_of_prompt_tau=sum(p["tau"] for p in per_prompt) / len(per_prompt),
                 generated_tokens=n_spec_tokens, seconds_speculative=t_spec, seconds_plain=t_plain,
                 per_prompt=per_prompt)
        results["runs"][dname] = s
        log(f"[{dname}] tau {s['tau']:.3f} over {s['steps']} steps (mean of per-prompt tau "
            f"{s['mean_of_prompt_tau']:.3f}); speculative == greedy on {len(prompts) - mismatches}/{len(prompts)} prompts")
        log(f"[{dname}] histogram 1..{B}: " + " ".join(f"{k}:{v}" for k, v in s["histogram"].items()))
        log(f"[{dname}] per-position acceptance: " + " ".join(f"{r:.2f}" for r in s["per_position_acceptance"]))
        log(f"[{dname}] reference-loop wall time: speculative {t_spec:.1f}s, plain {t_plain:.1f}s "
            f"({n_spec_tokens} tokens)")
    if args.results:
        os.makedirs(os.path.dirname(os.path.abspath(args.results)), exist_ok=True)
        with open(args.results, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
