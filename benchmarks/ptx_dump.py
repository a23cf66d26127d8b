"""Writes the program binaries of the on-disk program cache (PTX on NVIDIA's OpenCL) to a folder,
one file per program named by its first kernels, to read what the driver compiled:

    python benchmarks/ptx_dump.py OUT_DIR [--cache DIR]

Run it on the GPU machine after a benchmark filled ``DLPRIM_CACHE_DIR``; then, where CUDA's
``ptxas`` and ``nvdisasm`` are installed: ``ptxas -arch=sm_90 -v FILE.ptx -o FILE.cubin``
(registers, spills, local memory per kernel) and ``nvdisasm -c FILE.cubin`` (the machine code:
instruction mix of a loop, HMMA chains, where loads and stores sit). The files hold PTX text as
the driver returned it, without the trailing NUL bytes.
"""
import argparse
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dlprim_py import config, program  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--cache", help="cache folder (default: DLPRIM_CACHE_DIR or the user's)")
    args = ap.parse_args()
    cache = Path(args.cache or config.cache_dir()) / "programs"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    header = program._HEADER
    written = 0
    for path in sorted(cache.glob("*.bin")):
        data = path.read_bytes()
        if data[:len(program._MAGIC)] != program._MAGIC or len(data) < header.size:
            continue
        binary = data[header.size:].rstrip(b"\0")
        kernels = re.findall(rb"\.entry\s+(\w+)", binary)
        if not kernels:     # not PTX (another vendor's binary)
            continue
        name = "-".join(k.decode() for k in kernels[:3])[:100]
        (out / f"{written:03d}-{name}.ptx").write_bytes(binary)
        written += 1
    print(f"{written} programs with PTX from {cache} written to {out}")


if __name__ == "__main__":
    main()
