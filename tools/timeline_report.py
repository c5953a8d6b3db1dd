#!/usr/bin/env python3
"""Where a forward pass's time goes between the CUDA backend's kernels.

Reads the records a timeline build writes (src/backend/cuda/timeline.h: configure with
-DDFLASH_CUDA_TIMELINE=ON, run with DFLASH_CUDA_TIMELINE_OUT=FILE) and prints, per kind of
forward pass (a decode token, a verification, a draft), what each kernel costs on the critical
path and, for the matrix products, how their blocks start and end around the kernels beside them.

Under programmatic dependent launch only one kernel is past its grid dependency wait at a time,
so the launches are ordered by the first block's return from that wait ("start"); a kernel's
"period" is the time from its start to the next kernel's start, and the periods of a forward
add up to its time. For the products, whose blocks also stamp their exit:
  tail   first block's exit to last block's exit (blocks that finish early leave SMs idle
         unless the next kernel's blocks take them);
  drain  last block's exit to the next kernel's start (the grid's completion reaching the next
         kernel's wait);
  lead   how long before its start the product's first block arrived (its first weights were
         then already in flight).

    python3 tools/timeline_report.py FILE [--skip 4] [--bytes-per-s 4.29e12]
"""
import argparse
import collections
import sys

import numpy as np

RECORD = np.dtype([
    ("grid", "<u8"), ("t_entry", "<u8"), ("t_wait", "<u8"), ("t_exit", "<u8"),
    ("c_entry", "<u8"), ("c_wait", "<u8"), ("c_exit", "<u8"),
    ("sm", "<u4"), ("block", "<u4"), ("grid_blocks", "<u4"), ("threads", "<u4"),
    ("n", "<u4"), ("k", "<u4"), ("m", "<u4"), ("pad", "<u4"),
])
assert RECORD.itemsize == 88


def runs(rec):
    """The records in the order of their wait stamps, and each one's launch index (launches()
    says why a launch is one run in that order)."""
    rec = rec[np.argsort(rec["t_wait"], kind="stable")]
    sig = np.stack([rec["grid"], rec["grid_blocks"].astype(np.uint64), rec["threads"].astype(np.uint64),
                    rec["n"].astype(np.uint64), rec["k"].astype(np.uint64), rec["m"].astype(np.uint64)], axis=1)
    return rec, np.concatenate([[0], np.cumsum(np.any(sig[1:] != sig[:-1], axis=1))])


def launches(rec):
    """One row per launch: its blocks' first and last stamps, shape, and how many blocks wrote.

    %gridid repeats when a CUDA graph is replayed, so it does not name a launch by itself. But
    a block passes its wait only once the launch before has completed, so in the order of the
    wait stamps each launch's blocks come as one run: a launch ends where the grid id or the
    shape changes."""
    rec, inv = runs(rec)
    n = int(inv[-1]) + 1
    out = {}
    for key in ("t_entry", "t_wait"):
        v = rec[key].astype(np.int64)
        lo = np.full(n, np.iinfo(np.int64).max)
        hi = np.full(n, np.iinfo(np.int64).min)
        np.minimum.at(lo, inv, v)
        np.maximum.at(hi, inv, v)
        out[key + "_min"], out[key + "_max"] = lo, hi
    ex = rec["t_exit"].astype(np.int64)
    has = ex > 0
    lo = np.full(n, np.iinfo(np.int64).max)
    hi = np.full(n, 0, dtype=np.int64)
    np.minimum.at(lo, inv[has], ex[has])
    np.maximum.at(hi, inv[has], ex[has])
    out["t_exit_min"], out["t_exit_max"] = np.where(hi > 0, lo, 0), hi
    for key in ("n", "k", "m", "grid_blocks", "threads"):
        v = np.zeros(n, dtype=np.int64)
        np.maximum.at(v, inv, rec[key].astype(np.int64))
        out[key] = v
    out["blocks_seen"] = np.bincount(inv, minlength=n)
    out["grid"] = rec["grid"][np.searchsorted(inv, np.arange(n))].astype(np.int64)
    return out


def save_blocks(rec, L, path, per_class=2, skip=8):
    """The block records of a few forwards of each kind, times in ns from the forward's start
    (int32), with each block's launch index inside its forward: what a per-block look needs,
    small enough to bring back from the GPU machine."""
    rec, inv = runs(rec)
    out = {}
    by_class = collections.defaultdict(list)
    for cls, idx in forwards(L):
        by_class[cls].append(idx)
    for cls, pieces in by_class.items():
        if cls == "other":
            continue
        first = min(skip, max(0, len(pieces) - per_class))
        for j, p in enumerate(pieces[first:first + per_class]):
            sel = (inv >= p[0]) & (inv <= p[-1])
            r = rec[sel]
            t0 = int(L["t_wait_min"][p[0]])
            key = f"{cls.split()[0]}{j}"
            out[key + "_launch"] = (inv[sel] - p[0]).astype(np.int32)
            out[key + "_sm"] = r["sm"].astype(np.int16)
            out[key + "_block"] = r["block"].astype(np.int32)
            for f in ("t_entry", "t_wait", "t_exit"):
                v = r[f].astype(np.int64) - t0
                out[key + "_" + f] = np.where(r[f] > 0, v, -1).astype(np.int32)
            out[key + "_names"] = np.array([L["names"][i] for i in p])
    np.savez_compressed(path, **out)
    print(f"block records of {len(out) // 7} forwards written to {path}")


def load(path):
    """A records file, or a launch table saved by --save."""
    if path.endswith(".npz"):
        z = np.load(path)
        return None, {k: z[k] for k in z.files}
    rec = np.fromfile(path, dtype=RECORD)
    return rec, launches(rec) if len(rec) else None


PRODUCT_NAMES = {  # Qwen3-8B shapes (N as the kernel sees it: gate and up stacked)
    (6144, 4096): "q/k/v", (4096, 4096): "o", (24576, 4096): "gate/up", (4096, 12288): "down",
    (151936, 4096): "LM head",
}


def name_launches(L):
    """Products by their shape; every other kernel by its place after the last product (its
    grid changes with the context length, its place does not): "q/k/v +2" is the second kernel
    after a q/k/v product."""
    names, last, j = [], "start", 0
    for i in range(len(L["grid"])):
        n, k = int(L["n"][i]), int(L["k"][i])
        if n:
            last, j = PRODUCT_NAMES.get((n, k), f"product {n}x{k}"), 0
            names.append(last)
        else:
            j += 1
            names.append(f"{last} +{j} ({int(L['threads'][i])} thr)")
    return names


def kernel_name(L, i):
    return L["names"][i]


def forwards(L):
    """Split the launch sequence at the LM head (the product with the largest N): each piece
    is one forward pass. Its class: rows of the LM head and how many q/k/v products it holds."""
    if "names" not in L:
        L["names"] = name_launches(L)
    vocab = int(L["n"].max())
    heads = np.nonzero(L["n"] == vocab)[0]
    pieces, begin = [], 0
    for h in heads:
        idx = np.arange(begin, h + 1)
        names = [kernel_name(L, i) for i in idx]
        layers = names.count("q/k/v")
        rows = int(L["m"][h])
        if layers >= 30:
            cls = "decode (target, 1 row)" if rows == 1 else f"verify (target, {rows} rows)"
        elif layers > 0:
            cls = f"draft ({layers} layers, {rows} rows)"
        else:
            cls = "other"
        pieces.append((cls, idx))
        begin = h + 1
    return pieces


def report(path, skip, bandwidth, save, blocks):
    rec, L = load(path)
    if rec is not None:
        print(f"{path}: {len(rec)} block records")
    if L is None:
        return
    if save:
        np.savez_compressed(save, **L)
        print(f"launch table written to {save}")
        if blocks and rec is not None and save.endswith(".npz"):
            save_blocks(rec, dict(L), save[:-4] + "_blocks.npz")
    short = L["blocks_seen"] != L["grid_blocks"]
    print(f"{len(L['grid'])} launches; {int(short.sum())} whose block records are not one a block "
          "(a kernel whose thread 0 returns before its wait, a full ring, or two launches taken for one)")
    if rec is not None:
        t = np.unique(rec["t_wait"])
        d = np.diff(t)
        print(f"globaltimer: smallest step between stamps {int(d[d > 0].min()) if (d > 0).any() else 0} ns; "
              f"stamps that are multiples of 32 ns: {np.mean(rec['t_wait'] % 32 == 0):.0%}, of 1 us: "
              f"{np.mean(rec['t_wait'] % 1000 == 0):.0%}")
    for cls, pieces, rows, weight_bytes in kernel_tables(L, skip):
        times = [(L["t_exit_max"][p[-1]] - L["t_wait_min"][p[0]]) / 1e3 for p in pieces]
        print(f"\n== {cls}: {len(pieces)} forwards (after skipping {skip}); "
              f"first start to LM head's last exit: median {np.median(times):.1f} us")
        print(f"{'kernel':<22} {'a fwd':>6} {'period us':>10} {'ms a fwd':>9} {'GB/s':>7} {'of bw':>6} "
              f"{'tail':>6} {'drain':>6} {'lead':>6} {'spread':>6}")
        total = 0.0
        for name, r in rows.items():
            per_fwd = len(r["period"]) / len(pieces)
            med = float(np.median(r["period"]))
            ms = float(np.sum(r["period"])) / len(pieces) / 1e3
            total += ms
            line = f"{name:<22} {per_fwd:6.0f} {med:10.2f} {ms:9.3f}"
            if r["bytes"]:
                gbs = float(np.median(np.array(r["bytes"]) / (np.array(r["period"]) * 1e3)))
                line += f" {gbs:7.0f} {gbs * 1e9 / bandwidth:6.0%}"
                for key in ("tail", "drain", "lead", "spread"):
                    line += f" {np.median(r[key]):6.2f}" if r[key] else f" {'':>6}"
            print(line)
        bound = weight_bytes / bandwidth * 1e3
        print(f"{'sum of periods':<22} {'':>6} {'':>10} {total:9.3f}   weight bytes {weight_bytes / 1e9:.2f} GB "
              f"= {bound:.3f} ms at {bandwidth / 1e9:.0f} GB/s")


def kernel_tables(L, skip):
    """Per kind of forward (after the first `skip` of each kind): its forwards (launch indices),
    and per kernel name the list of each of its launches' period, weight bytes, tail, drain,
    lead and spread (us), and the weight bytes of one forward."""
    if "names" not in L:
        L["names"] = name_launches(L)
    nxt = np.append(L["t_wait_min"][1:], L["t_exit_max"][-1])
    period = (nxt - L["t_wait_min"]) / 1e3  # us
    by_class = collections.defaultdict(list)
    for cls, idx in forwards(L):
        by_class[cls].append(idx)
    out = []
    for cls, pieces in by_class.items():
        if cls == "other" or len(pieces) <= skip:
            continue
        pieces = pieces[skip:]
        rows = collections.OrderedDict()
        for p in pieces:
            for i in p:
                r = rows.setdefault(kernel_name(L, i), collections.defaultdict(list))
                r["period"].append(period[i])
                if L["n"][i]:
                    r["bytes"].append(2.0 * L["n"][i] * L["k"][i])
                    if L["t_exit_max"][i]:
                        r["tail"].append((L["t_exit_max"][i] - L["t_exit_min"][i]) / 1e3)
                        r["drain"].append((nxt[i] - L["t_exit_max"][i]) / 1e3)
                    r["lead"].append((L["t_wait_min"][i] - L["t_entry_min"][i]) / 1e3)
                    r["spread"].append((L["t_wait_max"][i] - L["t_wait_min"][i]) / 1e3)
        weight_bytes = sum(2.0 * L["n"][i] * L["k"][i] for i in pieces[0])
        out.append((cls, pieces, rows, weight_bytes))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--skip", type=int, default=4, help="forwards of each kind left out at the start (warm-up)")
    ap.add_argument("--bytes-per-s", type=float, default=4.29e12, help="the copy bandwidth to compare against")
    ap.add_argument("--save", nargs="*", default=[], help="write each file's launch table (.npz) to these paths")
    ap.add_argument("--blocks", action="store_true",
                    help="with --save, also the block records of a few forwards of each kind (NAME_blocks.npz)")
    a = ap.parse_args()
    for i, f in enumerate(a.files):
        report(f, a.skip, a.bytes_per_s, a.save[i] if i < len(a.save) else None, a.blocks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
