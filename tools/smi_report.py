#!/usr/bin/env python3
"""Per run, what the GPU's clocks and power did while `scripts/gpu_run.sh` ran its A/B (SMI_LOG=1).

Why: an H200 running this engine reaches its 700 W limit within about a second and lowers its SM
clock (docs/benchmarks.md, thirty-eighth pass). The weight stream does not care, the latency-bound
kernels do, so two settings can differ in speed only because one ran nearer the cap. This says,
for each run between the script's "# <time> start <setting>" and "# <time> end <setting>" marks,
how many samples were busy (power above --busy-watts), how many of those had the software power
cap among the clock event reasons (bit 0x4), the SM clock over the busy samples, and the highest
power read. nvidia-smi's power figure is an average over about a second; the cap bit is not.

    python3 tools/smi_report.py OUT/smi.csv [--busy-watts 200]
"""
import argparse
import re
import statistics
import sys

POWER_CAP = 0x4  # clocks_event_reasons: software power cap
THERMAL_OR_HW = 0x8 | 0x20 | 0x40 | 0x80  # hardware slowdown, software/hardware thermal, power brake


def parse(lines):
    """Runs in file order: dicts with name, samples [(sm_mhz, watts, reasons)]."""
    runs, current = [], None
    for line in lines:
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            m = re.match(r"#\s+\S+\s+\S+\s+(start|end)\s?(.*)$", line)
            if not m:
                continue
            if m.group(1) == "start":
                current = {"name": m.group(2) or "default", "samples": []}
                runs.append(current)
            else:
                current = None
            continue
        if current is None or line.startswith("timestamp"):
            continue
        fields = [f.strip() for f in line.split(",")]
        try:
            sm = int(fields[1].split()[0])
            watts = float(fields[3].split()[0])
            reasons = int(fields[5], 16)
        except (IndexError, ValueError):
            continue  # a line nvidia-smi cut short, or "[N/A]"
        current["samples"].append((sm, watts, reasons))
    return runs


def summarise(run, busy_watts):
    busy = [s for s in run["samples"] if s[1] > busy_watts]
    out = {"name": run["name"], "samples": len(run["samples"]), "busy": len(busy),
           "capped": sum(1 for s in busy if s[2] & POWER_CAP),
           "thermal_or_hw": sum(1 for s in busy if s[2] & THERMAL_OR_HW)}
    if busy:
        out["sm_mean"] = statistics.mean(s[0] for s in busy)
        out["sm_min"] = min(s[0] for s in busy)
        out["watts_max"] = max(s[1] for s in busy)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--busy-watts", type=float, default=200.0)
    a = ap.parse_args(argv)
    try:
        with open(a.csv) as f:
            runs = parse(f)
    except OSError as e:
        print(f"smi_report: {a.csv}: {e.strerror}", file=sys.stderr)
        return 2
    if not runs:
        print(f"smi_report: {a.csv}: no run marks (\"# <date> <time> start <setting>\")", file=sys.stderr)
        return 2
    print(f"{'run':48s} {'samples':>7s} {'busy':>5s} {'capped':>6s} {'thermal/hw':>10s} {'SM MHz mean':>11s} "
          f"{'min':>5s} {'W max':>6s}")
    for run in runs:
        s = summarise(run, a.busy_watts)
        tail = (f"{s['sm_mean']:11.0f} {s['sm_min']:5d} {s['watts_max']:6.0f}" if s["busy"]
                else f"{'-':>11s} {'-':>5s} {'-':>6s}")
        print(f"{s['name'][:48]:48s} {s['samples']:7d} {s['busy']:5d} {s['capped']:6d} {s['thermal_or_hw']:10d} {tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
