#!/usr/bin/env python3
"""Whether two builds of a .cu file have the same machine code, kernel by kernel.

Why: a refactor of kernel source that changes no instruction needs no new GPU measurement, and
one that does change some (a different ptxas schedule has cost the skinny products 2 % before,
docs/benchmarks.md, eighteenth pass) does. This compares the .text.<kernel> sections of two
cubins (ELF files, read with readelf) and names the kernels that differ.

    nvcc ... -arch=sm_90 -cubin -x cu src/backend/cuda/skinny_matmul.cu -o /tmp/before.cubin
    (change the source, build again to /tmp/after.cubin)
    python3 tools/cubin_text_diff.py /tmp/before.cubin /tmp/after.cubin

The "before" source may be a copy elsewhere (`git show REV:src/backend/cuda/x.cu > /tmp/old/x.cu`):
kernels in an anonymous namespace carry a hash of the file's path in their names, which is left
out of the comparison.

Exits 0 when every kernel in both is byte-identical, 1 otherwise.
"""
import hashlib
import re
import subprocess
import sys


# Itanium mangling of an anonymous namespace in nvcc's output: "<len>_GLOBAL__N__<hash>_<len>_<file>_cu_<hash>".
ANONYMOUS_NAMESPACE = re.compile(r"\d+_GLOBAL__N__[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]+")


def kernel_sections(path: str) -> dict:
    listing = subprocess.run(["readelf", "-S", "-W", path], capture_output=True, text=True, check=True).stdout
    data = open(path, "rb").read()
    out = {}
    for line in listing.splitlines():
        m = re.match(r"\s*\[\s*\d+\]\s+(\S+)\s+\S+\s+[0-9a-f]+\s+([0-9a-f]+)\s+([0-9a-f]+)", line)
        if m and m.group(1).startswith(".text."):
            off, size = int(m.group(2), 16), int(m.group(3), 16)
            name = ANONYMOUS_NAMESPACE.sub("(anonymous)", m.group(1)[len(".text."):])
            out[name] = hashlib.sha1(data[off:off + size]).hexdigest()
    return out


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    a, b = kernel_sections(sys.argv[1]), kernel_sections(sys.argv[2])
    differ = sorted(k for k in a.keys() & b.keys() if a[k] != b[k])
    unmatched = sorted(a.keys() ^ b.keys())
    print(f"kernels: {len(a)} and {len(b)}; identical {len(a.keys() & b.keys()) - len(differ)}, "
          f"different {len(differ)}, in one only {len(unmatched)}")
    for k in differ:
        print("  differs:", k)
    for k in unmatched:
        print("  in one only:", k)
    return 0 if not differ and not unmatched else 1


if __name__ == "__main__":
    sys.exit(main())
