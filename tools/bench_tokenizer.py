#!/usr/bin/env python3
"""Encode throughput, one thread: dflash's tokenizer vs the HF `tokenizers` library, on the
same corpus in one run (default: the tokenizer fixture corpus, 20,000 varied strings).

    /tmp/tokvenv/bin/python tools/bench_tokenizer.py [--build build] [--corpus FILE] [--repeats 5]

Two shapes of input: each corpus string on its own (short strings: per-call overhead counts),
and the corpus joined with newlines into documents of 200 strings (~9 KB each). Both sides
encode each input separately with special-token parsing and the post-processor
on (the tokenizer's defaults), and report the best of --repeats passes in MB/s of UTF-8 input.
"""
import argparse
import json
import os
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def hf_throughput(model_dir, texts, repeats):
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    tokens = sum(len(tok.encode(t).ids) for t in texts)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for t in texts:
            tok.encode(t)
        best = min(best, time.perf_counter() - t0)
    return {"impl": "hf-tokenizers", "strings": len(texts), "bytes": nbytes, "tokens": tokens,
            "seconds": best, "mb_per_s": nbytes / best / 1e6}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--corpus", default=os.path.join(ROOT, "testdata/tokenizers/fixtures/corpus.jsonl"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--families", default="qwen3,llama3.1")
    args = ap.parse_args()
    with open(args.corpus, encoding="utf-8") as f:
        texts = [json.loads(line) for line in f]
    docs = ["\n".join(texts[i:i + 200]) for i in range(0, len(texts), 200)]
    bench = os.path.join(args.build, "bench", "tokenizer_bench")
    with tempfile.TemporaryDirectory() as tmp:
        docs_path = os.path.join(tmp, "docs.jsonl")
        with open(docs_path, "w", encoding="utf-8") as f:
            for d in docs:
                f.write(json.dumps(d, ensure_ascii=False) + "\n")
        for shape, path, inputs in [("strings", args.corpus, texts), ("documents", docs_path, docs)]:
            for family in args.families.split(","):
                model_dir = os.path.join(args.build, "testdata/tokenizers", family)  # unpacked by CMake
                out = subprocess.run([bench, model_dir, path, str(args.repeats)], check=True,
                                     capture_output=True, text=True).stdout
                ours = json.loads(out)
                ref = hf_throughput(model_dir, inputs, args.repeats)
                same = "same" if ours["tokens"] == ref["tokens"] else "DIFFERENT"
                print(f"{family} {shape} ({len(inputs)} inputs, {ours['bytes']} bytes): "
                      f"dflash {ours['mb_per_s']:.2f} MB/s, hf-tokenizers {ref['mb_per_s']:.2f} MB/s "
                      f"(x{ours['mb_per_s'] / ref['mb_per_s']:.2f}); {same} token count {ours['tokens']}")


if __name__ == "__main__":
    main()
