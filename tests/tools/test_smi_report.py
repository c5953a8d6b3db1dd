"""tools/smi_report.py against a clock log whose answers are known.

The log is written here the way `scripts/gpu_run.sh` leaves it with SMI_LOG=1: nvidia-smi's CSV
lines, with the script's run marks between them; samples outside a run, a line cut short and a
power reading of [N/A] must not count.

    python3 -m unittest tests/tools/test_smi_report.py -v
"""
import io
import sys
import tempfile
import unittest
from contextlib import redirect_stdout
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import smi_report as sr  # noqa: E402

HEADER = ("timestamp, clocks.current.sm [MHz], clocks.current.memory [MHz], power.draw [W], "
          "temperature.gpu, clocks_event_reasons.active")


def sample(sm, watts, reasons):
    return f"2026/12/03 18:25:40.100, {sm} MHz, 3201 MHz, {watts} W, 34, 0x{reasons:016x}"


LOG = "\n".join([
    HEADER,
    sample(345, 80.2, 0x1),  # before any run: not counted
    "# 2026/12/03 18:25:41.000 start default",
    sample(1980, 125.0, 0x0),  # loading: not busy
    sample(1980, 450.0, 0x0),
    sample(1800, 690.0, 0x4),
    sample(1600, 699.0, 0x4),
    "2026/12/03 18:25:41.300, 1980 MHz, 3201",  # cut short
    "# 2026/12/03 18:25:42.000 end default",
    sample(1980, 300.0, 0x0),  # between runs: not counted
    "# 2026/12/03 18:25:43.000 start --warmup=4 --warmup-tokens=64",
    HEADER,  # nvidia-smi may print its header again
    sample(1965, 500.0, 0x4),
    "2026/12/03 18:25:43.100, 1980 MHz, 3201 MHz, [N/A], 34, 0x0000000000000000",
    sample(1500, 680.0, 0x4 | 0x40),
    "# 2026/12/03 18:25:44.000 end --warmup=4 --warmup-tokens=64",
    "# 2026/12/03 18:25:45.000 start idle",
    sample(1980, 120.0, 0x0),
    "# 2026/12/03 18:25:46.000 end idle",
])


class SmiReport(unittest.TestCase):
    def test_runs_and_their_samples(self):
        runs = sr.parse(LOG.splitlines())
        self.assertEqual([r["name"] for r in runs], ["default", "--warmup=4 --warmup-tokens=64", "idle"])
        self.assertEqual([len(r["samples"]) for r in runs], [4, 2, 1])

    def test_busy_samples_clocks_and_the_cap(self):
        default, sustained, idle = (sr.summarise(r, 200.0) for r in sr.parse(LOG.splitlines()))
        self.assertEqual((default["busy"], default["capped"], default["thermal_or_hw"]), (3, 2, 0))
        self.assertAlmostEqual(default["sm_mean"], (1980 + 1800 + 1600) / 3)
        self.assertEqual((default["sm_min"], default["watts_max"]), (1600, 699.0))
        self.assertEqual((sustained["busy"], sustained["capped"], sustained["thermal_or_hw"]), (2, 2, 1))
        self.assertEqual(sustained["sm_min"], 1500)
        self.assertEqual(idle["busy"], 0)
        self.assertNotIn("sm_mean", idle)

    def test_table_and_errors(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "smi.csv"
            path.write_text(LOG)
            out = io.StringIO()
            with redirect_stdout(out):
                self.assertEqual(sr.main([str(path)]), 0)
            lines = out.getvalue().splitlines()
            self.assertEqual(len(lines), 4)
            self.assertTrue(lines[1].startswith("default "), lines[1])
            self.assertIn(" 1793 ", lines[1])  # mean SM clock of the busy samples, rounded
            path.write_text(HEADER + "\n" + sample(1980, 500.0, 0))
            self.assertEqual(sr.main([str(path)]), 2)  # no run marks
        self.assertEqual(sr.main(["/nonexistent/smi.csv"]), 2)


if __name__ == "__main__":
    unittest.main()
