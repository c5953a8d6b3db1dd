#!/usr/bin/env python3
"""Train the small Qwen3-architecture target that ships with dflash.cpp.

Steps (all in one process):
  1. collect Python source files found on this machine (stdlib + site-packages),
     deduplicate them and split off a held-out set (by content hash);
  2. train a byte-level BPE tokenizer (Qwen2-style pre-tokenizer split + byte level),
     with the special tokens appended at the end of the id space;
  3. encode the corpus into flat uint16 token streams (documents separated by <|endoftext|>);
  4. train a Qwen3ForCausalLM from scratch for a fixed wall-clock budget (bf16 autocast,
     AdamW, warmup + cosine schedule driven by elapsed time);
  5. save it in Hugging Face layout, bf16, sharded (every file < 15 MiB).

The work directory receives the token streams and the held-out documents, which
train_dflash.py and eval_acceptance.py reuse.
"""
import argparse
import glob
import hashlib
import json
import math
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402

EOS = "<|endoftext|>"
SPECIALS = [EOS, "<|im_start|>", "<|im_end|>"]
# Same pre-tokenization split as the Qwen2/Qwen3 tokenizers (single digits, letters with
# one optional leading non-letter, punctuation runs, newline runs, whitespace runs), so a
# C++ tokenizer written for Qwen3 handles this one unchanged (there is no normalizer here).
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def log(*a):
    print(f"[target {time.strftime('%H:%M:%S')}]", *a, flush=True)


# ----------------------------------------------------------------------------- data
def source_roots():
    import site
    import sysconfig

    roots = set()
    for key in ("stdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            roots.add(p)
    try:
        roots.update(site.getsitepackages())
    except Exception:
        pass
    roots.update(glob.glob("/usr/lib/python3*"))
    roots.update(glob.glob("/usr/local/lib/python3*"))
    return sorted(r for r in roots if os.path.isdir(r))


def collect_sources(roots, max_bytes, min_size=200, max_size=200_000):
    """Returns a list of (path, text), deduplicated by content, capped at max_bytes."""
    seen = set()
    docs = []
    total = 0
    paths = []
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            dirnames.sort()
            for fn in sorted(filenames):
                if fn.endswith(".py"):
                    paths.append(os.path.join(dirpath, fn))
    # deterministic order independent of root nesting; shuffled so a cap samples broadly
    paths = sorted(set(paths))
    random.Random(1234).shuffle(paths)
    for p in paths:
        try:
            sz = os.path.getsize(p)
            if sz < min_size or sz > max_size:
                continue
            with open(p, "rb") as f:
                raw = f.read()
            text = raw.decode("utf-8")
        except Exception:
            continue
        if "\x00" in text:
            continue
        h = hashlib.sha1(raw).digest()
        if h in seen:
            continue
        seen.add(h)
        docs.append((p, text))
        total += len(raw)
        if total >= max_bytes:
            break
    return docs


def is_heldout(text, percent):
    return int(hashlib.md5(text.encode("utf-8")).hexdigest()[:8], 16) % 1000 < percent * 10


# ----------------------------------------------------------------------------- tokenizer
def build_tokenizer(texts, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIALS),
        min_frequency=2,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    # specials at the end of the id space, like Qwen
    tok.add_special_tokens(SPECIALS)
    assert tok.get_vocab_size() == vocab_size, tok.get_vocab_size()
    return tok


def save_tokenizer(tok, out_dir, model_max_length):
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    added = {}
    for s in SPECIALS:
        added[str(tok.token_to_id(s))] = {
            "content": s,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "bos_token": None,
        "eos_token": EOS,
        "pad_token": EOS,
        "unk_token": None,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "split_special_tokens": False,
        "added_tokens_decoder": added,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")


def encode_docs(tok, texts, eos_id, time_budget=None, chunk=2000):
    t0 = time.time()
    parts = []
    n = 0
    for i in range(0, len(texts), chunk):
        encs = tok.encode_batch(texts[i : i + chunk], add_special_tokens=False)
        for e in encs:
            ids = e.ids
            parts.append(np.asarray(ids + [eos_id], dtype=np.uint16))
        n = i + chunk
        if time_budget is not None and time.time() - t0 > time_budget:
            break
    arr = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)
    return arr, min(n, len(texts))


# ----------------------------------------------------------------------------- model
def make_config(args, tok_size, eos_id):
    from transformers import Qwen3Config

    vocab = ((tok_size + 1 + 63) // 64) * 64
    return Qwen3Config(
        vocab_size=vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        max_position_embeddings=2048,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        attention_bias=False,
        use_sliding_window=False,
    )


def batch_windows(tokens_gpu, batch, seqlen, gen):
    n = tokens_gpu.numel() - seqlen - 1
    off = torch.randint(0, n, (batch,), device=tokens_gpu.device, generator=gen)
    idx = off[:, None] + torch.arange(seqlen + 1, device=tokens_gpu.device)[None, :]
    w = tokens_gpu[idx].long()
    return w[:, :-1], w[:, 1:]


@torch.no_grad()
def heldout_loss(model, tokens_gpu, seqlen, max_chunks, batch, dtype):
    model.eval()
    n = (tokens_gpu.numel() - 1) // seqlen
    n = min(n, max_chunks)
    tot, cnt = 0.0, 0
    for i in range(0, n, batch):
        m = min(batch, n - i)
        idx = (torch.arange(m, device=tokens_gpu.device)[:, None] + i) * seqlen + torch.arange(
            seqlen + 1, device=tokens_gpu.device
        )[None, :]
        w = tokens_gpu[idx].long()
        with torch.autocast(tokens_gpu.device.type, dtype=dtype, enabled=dtype != torch.float32):
            logits = model(input_ids=w[:, :-1]).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1), reduction="sum")
        tot += loss.item()
        cnt += w[:, 1:].numel()
    model.train()
    return tot / max(cnt, 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True, help="scratch directory (token streams, held-out docs)")
    ap.add_argument("--out", required=True, help="output model directory (HF layout)")
    ap.add_argument("--max-bytes", type=int, default=300_000_000)
    ap.add_argument("--tok-train-bytes", type=int, default=40_000_000)
    ap.add_argument("--encode-seconds", type=float, default=90.0)
    ap.add_argument("--heldout-percent", type=float, default=2.0)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--intermediate", type=int, default=1152)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--seqlen", type=int, default=512)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--train-seconds", type=float, default=240.0)
    ap.add_argument("--max-steps", type=int, default=10**9)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--roots", nargs="*", default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    os.makedirs(args.work, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(args.seed)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    amp_dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    stats = {"args": vars(args)}

    # 1. data
    t0 = time.time()
    roots = args.roots or source_roots()
    log("source roots:", roots)
    docs = collect_sources(roots, args.max_bytes)
    train_docs = [d for d in docs if not is_heldout(d[1], args.heldout_percent)]
    held_docs = [d for d in docs if is_heldout(d[1], args.heldout_percent)]
    tb = sum(len(t) for _, t in train_docs)
    hb = sum(len(t) for _, t in held_docs)
    log(f"collected {len(docs)} unique files: train {len(train_docs)} ({tb/1e6:.1f} MB chars), "
        f"held-out {len(held_docs)} ({hb/1e6:.1f} MB chars) in {time.time()-t0:.1f}s")
    with open(os.path.join(args.work, "heldout_docs.jsonl"), "w") as f:
        for p, t in held_docs:
            f.write(json.dumps({"path": p, "text": t}) + "\n")
    stats.update(train_files=len(train_docs), heldout_files=len(held_docs), train_chars=tb, heldout_chars=hb)

    # 2. tokenizer
    t1 = time.time()
    sample, acc = [], 0
    for _, t in train_docs:
        sample.append(t)
        acc += len(t)
        if acc >= args.tok_train_bytes:
            break
    tok = build_tokenizer(sample, args.vocab)
    del sample
    save_tokenizer(tok, args.out, model_max_length=2048)
    eos_id = tok.token_to_id(EOS)
    log(f"tokenizer: vocab {tok.get_vocab_size()}, eos id {eos_id}, trained in {time.time()-t1:.1f}s")
    rt = "def f(x):\n    return x + 1  # héllo\n\n\tclass A:\n"
    assert tok.decode(tok.encode(rt).ids, skip_special_tokens=False) == rt

    # 3. encode
    t2 = time.time()
    train_tokens, n_enc = encode_docs(tok, [t for _, t in train_docs], eos_id, time_budget=args.encode_seconds)
    held_tokens, _ = encode_docs(tok, [t for _, t in held_docs], eos_id)
    np.save(os.path.join(args.work, "train_tokens.npy"), train_tokens)
    np.save(os.path.join(args.work, "heldout_tokens.npy"), held_tokens)
    enc_chars = sum(len(t) for _, t in train_docs[:n_enc])
    log(f"encoded {n_enc}/{len(train_docs)} train files -> {train_tokens.size/1e6:.2f} M tokens "
        f"({enc_chars/max(train_tokens.size,1):.2f} chars/token); held-out {held_tokens.size/1e6:.2f} M tokens; "
        f"{time.time()-t2:.1f}s")
    stats.update(train_tokens=int(train_tokens.size), heldout_tokens=int(held_tokens.size),
                 chars_per_token=enc_chars / max(train_tokens.size, 1), data_prep_seconds=time.time() - t0)

    # 4. model
    from transformers import GenerationConfig, Qwen3ForCausalLM

    config = make_config(args, tok.get_vocab_size(), eos_id)
    model = Qwen3ForCausalLM(config).to(dev)
    nparams = sum(p.numel() for p in model.parameters())
    log(f"model: {nparams/1e6:.2f} M params, vocab_size {config.vocab_size} (mask id {tok.get_vocab_size()})")
    stats.update(params=nparams)

    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if p.ndim >= 2 and "embed" not in n else no_decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.wd}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=dev.type == "cuda",
    )
    fwd = torch.compile(model) if args.compile else model

    tr = torch.from_numpy(train_tokens.astype(np.int32)).to(dev)
    he = torch.from_numpy(held_tokens.astype(np.int32)).to(dev)
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed + 1)

    model.train()
    step, ema, tokens_seen = 0, None, 0
    t_start = time.time()
    last_log = t_start
    hist = []
    while True:
        elapsed = time.time() - t_start
        if elapsed >= args.train_seconds or step >= args.max_steps:
            break
        frac = min(elapsed / args.train_seconds, 1.0)
        lr = args.lr * min(1.0, (step + 1) / args.warmup) * (
            args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * frac))
        )
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = batch_windows(tr, args.batch, args.seqlen, gen)
        with torch.autocast(dev.type, dtype=amp_dtype, enabled=amp_dtype != torch.float32):
            logits = fwd(input_ids=x).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens_seen += x.numel()
        if step % 25 == 0 or step == 1:
            lv = loss.item()
            ema = lv if ema is None else 0.9 * ema + 0.1 * lv
            now = time.time()
            if now - last_log > 15 or step == 1:
                last_log = now
                tps = tokens_seen / (now - t_start)
                log(f"step {step} loss {lv:.4f} ema {ema:.4f} lr {lr:.2e} {tps/1e6:.2f} M tok/s elapsed {now-t_start:.0f}s")
                hist.append({"step": step, "loss": lv, "elapsed": now - t_start})
    train_time = time.time() - t_start
    final_train = ema
    hl = heldout_loss(model, he, args.seqlen, max_chunks=512, batch=64, dtype=amp_dtype)
    log(f"done: {step} steps, {tokens_seen/1e6:.1f} M tokens in {train_time:.0f}s; "
        f"train loss (ema) {final_train:.4f}; held-out loss {hl:.4f} (ppl {math.exp(hl):.2f})")
    stats.update(steps=step, tokens_seen=tokens_seen, train_seconds=train_time, final_train_loss_ema=final_train,
                 heldout_loss=hl, loss_history=hist)

    # 5. save
    model = model.to(torch.bfloat16)
    model.config.use_cache = True
    model.save_pretrained(args.out, max_shard_size="14MB")
    # engines that read only the pre-v5 key find rope_theta at the top level too
    cpath = os.path.join(args.out, "config.json")
    with open(cpath) as f:
        cj = json.load(f)
    cj["rope_theta"] = float(cj.get("rope_parameters", {}).get("rope_theta", 10000.0))
    with open(cpath, "w") as f:
        json.dump(cj, f, indent=2, sort_keys=True)
        f.write("\n")
    GenerationConfig(eos_token_id=eos_id, pad_token_id=eos_id, bos_token_id=None, do_sample=False,
                     max_new_tokens=256).save_pretrained(args.out)
    for fn in sorted(os.listdir(args.out)):
        sz = os.path.getsize(os.path.join(args.out, fn))
        log(f"  {fn}: {sz/2**20:.2f} MiB")
        assert sz < 15 * 2**20, fn
    with open(os.path.join(args.work, "target_stats.json"), "w") as f:
        json.dump(stats, f, indent=2)
    log("saved to", args.out)


if __name__ == "__main__":
    main()
