"""tools/timeline_report.py against a timeline whose answers are known.

The records are made here the way the timeline build writes them (src/backend/cuda/timeline.h):
one per block, claimed in no particular order, grid ids repeating as a CUDA graph is replayed,
the next kernel's blocks arriving before the one before has finished (programmatic dependent
launch). The report must still find every launch, every forward pass and its kind, and each
kernel's period, tail and drain exactly.

    .venv/bin/python -m unittest tests/tools/test_timeline_report.py -v
"""
import random
import sys
import unittest
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import timeline_report as tr  # noqa: E402

# (n, k) of the products of one layer at Qwen3-8B shapes, then the kernels between them:
# (name, n, k, blocks, threads, duration ns, tail ns). Durations are distinct so that a launch
# taken for another shows.
LAYER = [
    ("q/k/v", 6144, 4096, 192, 256, 14_900, 2_800),
    ("q/k/v +1 (128 thr)", 0, 0, 32, 128, 2_300, 0),
    ("q/k/v +2 (256 thr)", 0, 0, 320, 256, 5_200, 0),
    ("q/k/v +3 (128 thr)", 0, 0, 8, 128, 3_400, 0),
    ("o", 4096, 4096, 256, 256, 10_200, 1_300),
    ("gate/up", 24576, 4096, 264, 256, 51_100, 1_700),
    ("down", 4096, 12288, 256, 256, 25_400, 3_100),
]
LM_HEAD = ("LM head", 151936, 4096, 264, 256, 304_000, 2_000)
DRAIN = 480  # last exit (or the kernel's end) to the next kernel's first wait return, ns


class Timeline:
    def __init__(self):
        self.records, self.t, self.launches = [], 1_000_000, 0

    def launch(self, grid_id, n, k, m, blocks, threads, duration, tail):
        """One launch starting (first wait return) at self.t and taking `duration` to its last
        exit; blocks arrive up to 20 us early and exit spread over `tail`."""
        start = self.t
        for b in range(blocks):
            r = np.zeros(1, tr.RECORD)
            r["grid"], r["grid_blocks"], r["threads"], r["block"], r["sm"] = grid_id, blocks, threads, b, b % 132
            r["n"], r["k"], r["m"] = n, k, m if n else 0
            r["t_entry"] = start - 20_000 + (b * 37) % 19_000
            r["t_wait"] = start + (b * 13) % 64
            if n:  # products stamp their exit: block 0 first, the last block at start + duration
                spread = 0 if b == 0 else tail if b == blocks - 1 else (b * 7919) % (tail + 1)
                r["t_exit"] = start + duration - tail + spread
            self.records.append(r)
        self.t = start + duration + DRAIN
        self.launches += 1

    def forward(self, rows, layers):
        # Graph replays: the same grid ids every forward of a kind.
        base = 1000 * (1 if layers == 36 else 2) + (100 if rows > 1 else 0)
        g = base
        for _ in range(layers):
            for _name, n, k, blocks, threads, duration, tail in LAYER:
                self.launch(g, n, k, rows, blocks, threads, duration, tail)
                g += 1
        _name, n, k, blocks, threads, duration, tail = LM_HEAD
        self.launch(g, n, k, rows, blocks, threads, duration, tail)

    def array(self):
        rec = np.concatenate(self.records)
        order = list(range(len(rec)))
        random.Random(5).shuffle(order)  # claimed by atomics, in no order
        return rec[order]


class TimelineReportTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        tl = Timeline()
        for _ in range(3):
            tl.forward(1, 36)
        for _ in range(3):
            tl.forward(16, 5)   # draft
            tl.forward(16, 36)  # verify
        cls.n_launches = tl.launches
        cls.L = tr.launches(tl.array())

    def test_every_launch_is_found_once_with_all_its_blocks(self):
        self.assertEqual(len(self.L["grid"]), self.n_launches)
        np.testing.assert_array_equal(self.L["blocks_seen"], self.L["grid_blocks"])

    def test_forwards_are_split_and_classified(self):
        kinds = [cls for cls, _ in tr.forwards(self.L)]
        self.assertEqual(kinds.count("decode (target, 1 row)"), 3)
        self.assertEqual(kinds.count("verify (target, 16 rows)"), 3)
        self.assertEqual(kinds.count("draft (5 layers, 16 rows)"), 3)
        self.assertEqual(kinds[3:5], ["draft (5 layers, 16 rows)", "verify (target, 16 rows)"])

    def test_periods_tails_and_drains_are_the_ones_made(self):
        tables = {cls: (pieces, rows, wb) for cls, pieces, rows, wb in tr.kernel_tables(dict(self.L), skip=1)}
        pieces, rows, weight_bytes = tables["decode (target, 1 row)"]
        self.assertEqual(len(pieces), 2)
        for name, n, k, _blocks, _threads, duration, tail in LAYER + [LM_HEAD]:
            r = rows[name]
            self.assertEqual(len(r["period"]), 2 * (1 if name == "LM head" else 36), name)
            self.assertAlmostEqual(float(np.median(r["period"])), (duration + DRAIN) / 1e3, places=6, msg=name)
            if n:
                self.assertAlmostEqual(float(np.median(r["tail"])), tail / 1e3, places=6, msg=name)
                self.assertAlmostEqual(float(np.median(r["drain"])), DRAIN / 1e3, places=6, msg=name)
                self.assertEqual(r["bytes"][0], 2.0 * n * k)
        self.assertEqual(weight_bytes, 2.0 * (36 * sum(n * k for _, n, k, *_ in LAYER) + LM_HEAD[1] * LM_HEAD[2]))
        # The periods of a forward add up to its time.
        p = pieces[0]
        total = sum(float(np.sum(r["period"])) for r in rows.values()) / len(pieces)
        span = (self.L["t_wait_min"][p[-1] + 1] - self.L["t_wait_min"][p[0]]) / 1e3
        self.assertAlmostEqual(total, span, places=3)

    def test_a_launch_table_saved_and_read_back_gives_the_same_tables(self):
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            path = str(Path(d) / "t.npz")
            np.savez_compressed(path, **self.L)
            _, L2 = tr.load(path)
        a = tr.kernel_tables(dict(self.L), skip=1)
        b = tr.kernel_tables(L2, skip=1)
        self.assertEqual([x[0] for x in a], [x[0] for x in b])
        for (_, _, ra, _), (_, _, rb, _) in zip(a, b):
            self.assertEqual(list(ra), list(rb))
            for name in ra:
                self.assertEqual(ra[name]["period"], rb[name]["period"])


if __name__ == "__main__":
    unittest.main()
