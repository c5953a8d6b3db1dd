#!/usr/bin/env python3
"""Golden for the sampling warpers (src/engine/sampling.cc): which tokens survive temperature,
top-k, top-p and min-p, and their probabilities, as transformers' own warpers compute them.

Why: token_distribution() keeps a candidate set instead of masking the whole vocabulary row (a
top-p sort of 151 936 logits cost 24 ms a row); tests/sampling_test.cc holds it to this file.

How:  python3 tools/make_sampling_golden.py --out testdata/sampling/warpers_golden.json
      (torch and transformers: versions in tools/requirements-torch.txt; CPU is enough. The
      device machine has both: scripts/gpu_run.sh's `golden` step runs this there.)

Logits: row r, token i: u = ((i + 1) · 2654435761 + r · 40503) mod 2^32 / 2^32 (exact in
double), l = float32(30 · u^64 − 5) with u^64 by six squarings in double. The C++ test computes
the same numbers bit for bit, so no logits are stored. A vocabulary of 32 000 gives top-p
without top-k tens of thousands of candidates, after top-k tens.

Warpers, in the order generate applies them: TemperatureLogitsWarper, TopKLogitsWarper,
TopPLogitsWarper, MinPLogitsWarper (each only when set), then softmax in float32. Stored per
case: the surviving token ids (ascending) and their probabilities.

Penalty cases: RepetitionPenaltyLogitsProcessor first, as generate applies it before the
warpers, over a history stored with the case (the row's 24 largest logits, whose values are
positive, and 24 of its negative ones, some twice). Logit-bias cases: SequenceBiasLogitsProcessor
with one-token sequences before that (generate's order): the row's largest logit banned (-100),
its 200th and 5000th raised (stored with the case).
"""
import argparse
import json
import os

import torch
import transformers
from transformers.generation.logits_process import (MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,
                                                     SequenceBiasLogitsProcessor, TemperatureLogitsWarper,
                                                     TopKLogitsWarper, TopPLogitsWarper)

VOCAB = 32000
ROWS = 3
# (temperature, top_k, top_p, min_p)
CASES = [
    (0.7, 0, 0.9, 0.0),
    (1.0, 0, 0.5, 0.0),
    (1.5, 0, 0.95, 0.0),
    (0.6, 20, 0.95, 0.0),
    (1.0, 50, 1.0, 0.1),
    (0.8, 0, 1.0, 0.05),
    (1.2, 200, 0.8, 0.0),
]

# (temperature, top_k, top_p, min_p, repetition_penalty)
PENALTY_CASES = [
    (0.7, 0, 0.9, 0.0, 1.3),
    (1.0, 50, 1.0, 0.0, 1.2),
    (0.8, 0, 1.0, 0.05, 1.5),
    (1.0, 20, 0.95, 0.0, 0.8),
]


# (temperature, top_k, top_p, min_p, repetition_penalty), each with the logit bias of bias_of()
BIAS_CASES = [
    (0.7, 0, 0.9, 0.0, 1.0),
    (1.0, 50, 1.0, 0.0, 1.2),
]


def bias_of(row):
    order = torch.argsort(row, descending=True, stable=True).tolist()
    return [[order[0], -100.0], [order[199], 6.5], [order[4999], 30.0]]


def history_of(row):
    order = torch.argsort(row, descending=True, stable=True).tolist()
    negative = [i for i in range(0, 4000, 97) if row[i].item() < 0][:24]
    return order[:24] + negative + negative[:8]


def logits_row(r):
    out = []
    for i in range(VOCAB):
        u = (((i + 1) * 2654435761 + r * 40503) % (1 << 32)) / float(1 << 32)
        for _ in range(6):
            u = u * u
        out.append(30.0 * u - 5.0)
    return torch.tensor(out, dtype=torch.float64).to(torch.float32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    cases = []
    for r in range(ROWS):
        row = logits_row(r)
        for t, k, p, mp, rp, biased in ([c + (1.0, False) for c in CASES] + [c + (False,) for c in PENALTY_CASES] +
                                        [c + (True,) for c in BIAS_CASES]):
            x = row.clone().unsqueeze(0)
            history = history_of(row) if rp != 1.0 else []
            ids = torch.tensor([history or [0]], dtype=torch.long)
            bias = bias_of(row) if biased else []
            if bias:
                x = SequenceBiasLogitsProcessor(sequence_bias=[[[i], b] for i, b in bias])(ids, x)
            if rp != 1.0:
                x = RepetitionPenaltyLogitsProcessor(penalty=rp)(ids, x)
            x = TemperatureLogitsWarper(t)(ids, x)
            if k > 0:
                x = TopKLogitsWarper(top_k=k)(ids, x)
            if p < 1.0:
                x = TopPLogitsWarper(top_p=p)(ids, x)
            if mp > 0.0:
                x = MinPLogitsWarper(min_p=mp)(ids, x)
            probs = torch.softmax(x[0], dim=-1)
            kept = torch.nonzero(probs > 0).flatten().tolist()
            case = {"row": r, "temperature": t, "top_k": k, "top_p": p, "min_p": mp}
            if rp != 1.0:
                case.update({"repetition_penalty": rp, "history": history})
            if bias:
                case["logit_bias"] = bias
            case.update({"kept": kept, "probs": [float(f"{probs[i].item():.8g}") for i in kept]})
            cases.append(case)
            print(f"row {r} T {t} k {k} p {p} min_p {mp} repetition {rp} bias {bias}: {len(kept)} tokens kept")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"generator": "tools/make_sampling_golden.py", "torch": torch.__version__,
                   "transformers": transformers.__version__, "vocab": VOCAB, "cases": cases}, f)
        f.write("\n")


if __name__ == "__main__":
    main()
