#!/usr/bin/env python3
"""Tiny random Qwen3 checkpoints + golden outputs for the dflash.cpp tests.

Why: the C++ engine must load Hugging Face Qwen3 checkpoints in every layout published models use
(tied / untied embeddings, GQA ratios, head_dim != hidden/heads, f32 / bf16 / f16, RoPE default /
linear / yarn / llama3, transformers 4.x vs 5.x config keys, sharded safetensors) and reproduce
transformers' logits and greedy tokens. Real checkpoints are gigabytes; these are a few hundred KB.

How:  /tmp/tvenv/bin/python tools/make_tiny_models.py [--out testdata/tiny] [--only NAME ...]
      (needs torch, transformers, safetensors, numpy: versions in tools/requirements-torch.txt)

Writes, per model, testdata/tiny/<name>/:
  config.json, model.safetensors (or shards + model.safetensors.index.json), generation_config.json,
  golden.json (schema in tools/README.md, "Tiny checkpoints and goldens").

Everything is seeded: rerunning overwrites the outputs with identical content (same library
versions). Weights are re-drawn with a larger std than HF's 0.02 so that next-token distributions
are peaked; for each model the first weight seed (from a fixed list) whose greedy run is far from
ties, in both the saved dtype and in float32, is kept.
"""

from __future__ import annotations

import argparse
import inspect
import shutil
import json
import math
from pathlib import Path

import torch


# --------------------------------------------------------------------------- JSON

def _fmt_float(x: float) -> str:
    x = float(x)
    if math.isnan(x) or math.isinf(x):
        raise ValueError(f"non-finite value {x} cannot go into a golden")
    s = f"{x:.8g}"
    # '%.8g' can print '1e-05'; JSON accepts that. Make integers-looking floats explicit floats.
    if "." not in s and "e" not in s and "n" not in s:
        s += ".0"
    return s


def _emit(obj, indent: int, level: int) -> str:
    pad = " " * (indent * level)
    pad_in = " " * (indent * (level + 1))
    if isinstance(obj, bool) or obj is None:
        return json.dumps(obj)
    if isinstance(obj, int):
        return str(obj)
    if isinstance(obj, float):
        return _fmt_float(obj)
    if isinstance(obj, str):
        return json.dumps(obj)
    if isinstance(obj, torch.Tensor):
        obj = obj.tolist()
    if isinstance(obj, (list, tuple)):
        if not obj:
            return "[]"
        # flat lists of scalars go on one line
        if all(not isinstance(v, (list, tuple, dict, torch.Tensor)) for v in obj):
            return "[" + ", ".join(_emit(v, indent, level + 1) for v in obj) + "]"
        return "[\n" + ",\n".join(pad_in + _emit(v, indent, level + 1) for v in obj) + "\n" + pad + "]"
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [pad_in + json.dumps(str(k)) + ": " + _emit(v, indent, level + 1) for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    raise TypeError(f"cannot serialise {type(obj)}")


def write_json(path: Path, obj) -> None:
    """Write obj as JSON: floats with 8 significant digits, each matrix row on its own line."""
    Path(path).write_text(_emit(obj, 1, 0) + "\n")


# --------------------------------------------------------------------------- transformers shims

def cache_kwarg(model) -> str:
    """Name of the KV-cache argument of model.forward: 'cache' (transformers >= 5.x) or 'past_key_values'."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def new_dynamic_cache(model):
    from transformers import DynamicCache
    try:
        return DynamicCache(config=model.config)
    except TypeError:  # older transformers: no config argument
        return DynamicCache()


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def dtype_name(dt: torch.dtype) -> str:
    for k, v in DTYPES.items():
        if v == dt:
            return k
    raise ValueError(dt)


# --------------------------------------------------------------------------- weights

@torch.no_grad()
def reinit_weights(module: torch.nn.Module, seed: int, *, linear_std: float, embed_std: float,
                   norm_jitter: float, lm_head_std: float | None = None) -> None:
    """Overwrite every parameter with seeded normal values.

    Linear / embedding matrices get N(0, std^2) (std ~0.2-0.5 instead of HF's 0.02, so that the tiny
    random models have peaked next-token distributions); RMSNorm weights get 1 + N(0, norm_jitter^2)
    so a norm-weight mix-up changes the results. Parameters are visited in name order; tied
    parameters are visited once (named_parameters de-duplicates them).
    """
    gen = torch.Generator().manual_seed(seed)
    for name, p in sorted(module.named_parameters(), key=lambda kv: kv[0]):
        shape = p.shape
        if name.endswith("norm.weight"):
            val = 1.0 + norm_jitter * torch.randn(shape, generator=gen, dtype=torch.float32)
        elif "embed_tokens" in name:
            val = embed_std * torch.randn(shape, generator=gen, dtype=torch.float32)
        elif name.startswith("lm_head") and lm_head_std is not None:
            val = lm_head_std * torch.randn(shape, generator=gen, dtype=torch.float32)
        elif p.dim() == 2:
            val = linear_std * torch.randn(shape, generator=gen, dtype=torch.float32)
        else:
            raise ValueError(f"unexpected parameter {name} {tuple(shape)}")
        p.copy_(val.to(p.dtype))


# =========================================================================== model specs

BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, head_dim=16, max_position_embeddings=512,
            rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False, bos_token_id=1, eos_token_id=255)

# config_layout: "4.x"  -> top-level rope_theta (+ rope_scaling dict or null), "torch_dtype", as the
#                          published Qwen3 checkpoints carry;
#                "5.x"  -> left exactly as the installed transformers writes it (rope_parameters, "dtype").
SPECS = {
    "qwen3-gqa1-tied-f32": dict(
        cfg=dict(num_key_value_heads=4, tie_word_embeddings=True),
        rope={"rope_type": "default", "rope_theta": 10000.0},
        dtype="float32", layout="4.x", seed=100),
    "qwen3-gqa4-untied-f32": dict(
        cfg=dict(num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                 intermediate_size=160, tie_word_embeddings=False),
        rope={"rope_type": "default", "rope_theta": 1000000.0},
        dtype="float32", layout="4.x", seed=200),
    "qwen3-yarn-bf16": dict(
        cfg=dict(num_key_value_heads=2, tie_word_embeddings=False),
        rope={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128},
        dtype="bfloat16", layout="4.x", seed=300),
    "qwen3-linear-f16-tied": dict(
        cfg=dict(num_key_value_heads=2, tie_word_embeddings=True),
        rope={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
        dtype="float16", layout="4.x-oldtype", seed=400),
    "qwen3-llama3rope-f32-sharded": dict(
        cfg=dict(num_key_value_heads=2, tie_word_embeddings=False),
        rope={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 128},
        dtype="float32", layout="5.x", seed=500, max_shard_size="200KB"),
    "qwen3-gqa2-bf16": dict(
        cfg=dict(num_key_value_heads=2, tie_word_embeddings=True, eos_token_id=[254, 255]),
        rope={"rope_type": "default", "rope_theta": 10000.0},
        dtype="bfloat16", layout="5.x", seed=600),
    "qwen3-vocab16-f32": dict(
        cfg=dict(vocab_size=16, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=16, tie_word_embeddings=True, eos_token_id=15),
        rope={"rope_type": "default", "rope_theta": 10000.0},
        dtype="float32", layout="5.x", seed=700, prompt_hi=13, train_noise=0.35),
}

TRAIN_STEPS = 150
TRAIN_NOISE = 0.2          # fraction of random transitions in the synthetic training text
PROMPT_LEN = 12
GREEDY_LEN = 32
LINEAR_STD = 0.25
EMBED_STD = 0.5
NORM_JITTER = 0.15
SEED_TRIES = 40


def spec_config(name: str):
    from transformers import Qwen3Config
    spec = SPECS[name]
    kw = dict(BASE)
    kw.update(spec["cfg"])
    return Qwen3Config(**kw, rope_parameters=dict(spec["rope"]))


# =========================================================================== sharpening

def train_on_permutation_text(model, seed: int, steps: int, noise: float) -> None:
    """A few Adam steps on synthetic text whose next token is perm[current] (else uniform, with
    probability `noise`). Random weights alone give top-1/top-2 logit gaps that are tiny relative to
    bf16 resolution; after this the greedy choice is clear (gap of several nats) while every weight
    stays dense and random-looking. Runs in float32, on CPU, single-threaded: deterministic."""
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(seed + 12345)
    perm = torch.randperm(vocab, generator=gen)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    batch, length = 16, 48
    model.train()
    for _ in range(steps):
        cur = torch.randint(0, vocab, (batch,), generator=gen)
        cols = [cur]
        for _ in range(length - 1):
            rnd = torch.randint(0, vocab, (batch,), generator=gen)
            use_rnd = torch.rand(batch, generator=gen) < noise
            cur = torch.where(use_rnd, rnd, perm[cur])
            cols.append(cur)
        ids = torch.stack(cols, 1)
        logits = model(input_ids=ids, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, vocab), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


# =========================================================================== goldens

@torch.no_grad()
def greedy_loop(model, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """Plain greedy decoding with the KV cache, ignoring EOS. Returns tokens and top1-top2 margins."""
    cache = new_dynamic_cache(model)
    kw = cache_kwarg(model)
    ids = torch.tensor([prompt])
    out_tokens, margins = [], []
    for _ in range(n):
        logits = model(input_ids=ids, use_cache=True, **{kw: cache}).logits[0, -1].float()
        top = torch.topk(logits, 2)
        out_tokens.append(int(top.indices[0]))
        margins.append(float(top.values[0] - top.values[1]))
        ids = top.indices[:1].view(1, 1)
    return out_tokens, margins


@torch.no_grad()
def teacher_forced_logits(model, ids: list[int]) -> torch.Tensor:
    return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()


def mean_entropy(logits: torch.Tensor) -> float:
    lp = torch.log_softmax(logits.double(), -1)
    return float(-(lp.exp() * lp).sum(-1).mean())


def make_prompt(name: str, hi: int) -> list[int]:
    gen = torch.Generator().manual_seed(SPECS[name]["seed"] + 7)
    return torch.randint(2, hi + 1, (PROMPT_LEN,), generator=gen).tolist()


def evaluate(model_saved_dtype, prompt):
    """Greedy + teacher-forced logits in the saved dtype and in an f32 upcast copy."""
    import copy
    f32 = copy.deepcopy(model_saved_dtype).float()
    g, m = greedy_loop(model_saved_dtype, prompt, GREEDY_LEN)
    g32, m32 = greedy_loop(f32, prompt, GREEDY_LEN)
    seq = prompt + g[:-1]
    lg = teacher_forced_logits(model_saved_dtype, seq)
    lg32 = teacher_forced_logits(f32, seq)
    return dict(greedy=g, margins=m, greedy32=g32, margins32=m32, logits=lg, logits32=lg32)


def acceptable(ev, prompt, dtype: str) -> tuple[bool, str]:
    thr = 0.05 if dtype == "float32" else 0.3
    n = len(prompt)
    tf = ev["logits"][n - 1:].argmax(-1).tolist()
    tf32 = ev["logits32"][n - 1:].argmax(-1).tolist()
    reasons = []
    if ev["greedy"] != ev["greedy32"]:
        reasons.append("greedy differs between saved dtype and f32")
    if tf != ev["greedy"] or tf32 != ev["greedy"]:
        reasons.append("teacher-forced argmax differs from greedy")
    if min(ev["margins"]) < thr or min(ev["margins32"]) < thr:
        reasons.append(f"min margin {min(ev['margins']):.3f}/{min(ev['margins32']):.3f} < {thr}")
    if len(set(ev["greedy"])) < 6:
        reasons.append("greedy too repetitive")
    return (not reasons), "; ".join(reasons)


# =========================================================================== config layouts

def rewrite_config_layout(path: Path, layout: str) -> None:
    """Turn the config.json that transformers 5.x wrote into the 4.x layout when asked."""
    if layout == "5.x":
        return
    cfg = json.loads(path.read_text())
    rp = dict(cfg.pop("rope_parameters"))
    theta = rp.pop("rope_theta")
    rtype = rp.pop("rope_type")
    out = {}
    for k, v in cfg.items():
        if k == "dtype":
            out["torch_dtype"] = v
            continue
        out[k] = v
    out["rope_theta"] = theta
    if rtype == "default":
        out["rope_scaling"] = None
    elif layout == "4.x-oldtype":
        out["rope_scaling"] = {"type": rtype, **rp}
    else:
        out["rope_scaling"] = {"rope_type": rtype, **rp}
    path.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")


# =========================================================================== main

def build_one(name: str, out_root: Path) -> dict:
    from transformers import GenerationConfig, Qwen3ForCausalLM
    import transformers
    spec = SPECS[name]
    dtype = DTYPES[spec["dtype"]]
    cfg = spec_config(name)
    prompt = make_prompt(name, spec.get("prompt_hi", 250))

    chosen = None
    for k in range(SEED_TRIES):
        seed = spec["seed"] + k
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(cfg).eval()
        reinit_weights(model, seed, linear_std=LINEAR_STD, embed_std=spec.get("embed_std", EMBED_STD),
                       norm_jitter=NORM_JITTER)
        train_on_permutation_text(model, seed, spec.get("train_steps", TRAIN_STEPS),
                                  spec.get("train_noise", TRAIN_NOISE))
        model = model.to(dtype)
        ev = evaluate(model, prompt)
        ok, why = acceptable(ev, prompt, spec["dtype"])
        if ok:
            chosen = (seed, model)
            break
        print(f"  {name}: weight seed {seed} rejected: {why}")
    if chosen is None:
        raise SystemExit(f"{name}: no acceptable seed among {SEED_TRIES}")
    seed, model = chosen

    d = out_root / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    save_kw = {}
    if "max_shard_size" in spec:
        save_kw["max_shard_size"] = spec["max_shard_size"]
    model.save_pretrained(d, **save_kw)
    eos = spec["cfg"].get("eos_token_id", BASE["eos_token_id"])
    gen_cfg = {"bos_token_id": 1, "eos_token_id": eos, "do_sample": False,
               "transformers_version": transformers.__version__}
    (d / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2) + "\n")
    rewrite_config_layout(d / "config.json", spec["layout"])

    # Reload from disk (this also checks that transformers reads the rewritten layout) and compute
    # the goldens from the reloaded model.
    loaded = Qwen3ForCausalLM.from_pretrained(d, dtype=dtype, attn_implementation="eager").eval()
    want_rp = dict(spec["rope"])
    got_rp = {k: v for k, v in dict(loaded.config.rope_parameters).items() if k in want_rp}
    if got_rp != want_rp:
        raise SystemExit(f"{name}: reloaded rope_parameters {dict(loaded.config.rope_parameters)} != {want_rp}")
    for (n1, p1), (n2, p2) in zip(model.state_dict().items(), loaded.state_dict().items()):
        if n1 != n2 or not torch.equal(p1, p2):
            raise SystemExit(f"{name}: reloaded tensor {n1} differs")
    ev = evaluate(loaded, prompt)
    ok, why = acceptable(ev, prompt, spec["dtype"])
    if not ok:
        raise SystemExit(f"{name}: reloaded model fails the checks: {why}")

    rot = loaded.model.rotary_emb
    golden = {
        "model": name,
        "dtype": spec["dtype"],
        "config_layout": spec["layout"],
        "weight_seed": seed,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__.split("+")[0],
        "attn_implementation": "eager",
        "ignore_eos": True,
        "rope": {"parameters": dict(loaded.config.rope_parameters),
                 "inv_freq": rot.inv_freq.float().tolist(),
                 "attention_scaling": float(rot.attention_scaling)},
        "prompt": prompt,
        "greedy": ev["greedy"],
        "greedy_min_margin": min(ev["margins"]),
        "greedy_min_margin_f32ref": min(ev["margins32"]),
        "logits_input": prompt + ev["greedy"][:-1],
        "logits_rows": len(prompt) + len(ev["greedy"]) - 1,
        "logits_cols": int(ev["logits"].shape[1]),
        "mean_entropy": mean_entropy(ev["logits"]),
        "logits": ev["logits"],
        "logits_f32ref": ev["logits32"],
    }
    write_json(d / "golden.json", golden)
    files = sorted(p.name for p in d.iterdir())
    print(f"{name}: seed {seed}, files {files}, greedy margin {golden['greedy_min_margin']:.3f}, "
          f"entropy {golden['mean_entropy']:.3f}, distinct greedy {len(set(ev['greedy']))}")
    return golden


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "testdata" / "tiny"))
    ap.add_argument("--only", nargs="*", default=None, help="model names (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    out_root = Path(args.out)
    out_root.mkdir(parents=True, exist_ok=True)
    for name in args.only or list(SPECS):
        build_one(name, out_root)


if __name__ == "__main__":
    main()
