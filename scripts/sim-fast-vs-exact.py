#!/usr/bin/env python3
"""Run `ferry sim` on random configurations in its fast mode and with --exact, and report every
configuration whose output differs (docs/simulator-speed.md: the two must agree to the digit).

    FERRY=build-release/ferry scripts/sim-fast-vs-exact.py --seed 7 --count 250

Exits 1 when a configuration differs or runs in one mode only, 0 otherwise. Configurations a
model or profile cannot run (refused in both modes with the same message) are counted apart.
"""
import argparse
import collections
import os
import random
import subprocess
import sys

MODELS = ["llama-3-8b", "mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v2-lite", "gemma-2-9b", "olmoe-1b-7b",
          "gpt-oss-20b", "opt-6.7b", "gpt-neox-20b", "phi-3.5-moe"]
GPUS = ["l4", "h100-pcie", "rtx-4090", "a100-80gb-sxm", "t4", "rtx-a6000"]
CHOICES = [
    ["", "--runtime eager", "--runtime graph", "--runtime native"],
    ["", "--quant int4-g64", "--quant int8"],
    ["--prefetch-depth 0", "--prefetch-depth 1", "--prefetch-depth 2"],
    ["--device-budget 8GiB", "--device-budget 12GiB"],
    ["", "--kv-home host", "--kv-home disk"],
    ["", "--host-memory pageable"],
    ["", "--home disk"],
    ["--max-batch 1", "--max-batch 4", "--max-batch 16"],
    ["--synthetic rate=4,n=12,prompt=256,output=24", "--synthetic n=6,prompt=64,output=8 --as-fast-as-possible"],
]


def sim(ferry, args):
    p = subprocess.run([ferry, "sim"] + args, capture_output=True, text=True)
    last = (p.stderr.strip().splitlines() or [""])[-1]
    return p.returncode, p.stdout, last


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ferry", default=os.environ.get("FERRY", "build-release/ferry"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=100, help="configurations to draw (default 100)")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    ran = differ = 0
    refused = collections.Counter()
    for i in range(a.count):
        cfg = ["--model", rng.choice(MODELS), "--hw", rng.choice(GPUS), "--quiet"]
        for c in CHOICES:
            cfg += rng.choice(c).split()
        rc_f, out_f, err_f = sim(a.ferry, cfg)
        rc_e, out_e, err_e = sim(a.ferry, cfg + ["--exact"])
        if rc_f != 0 and rc_e != 0 and err_f == err_e:
            refused[err_f[:100]] += 1
            continue
        if rc_f != rc_e or out_f != out_e:
            differ += 1
            print(f"DIFFERS ferry sim {' '.join(cfg)}")
            first = next((x for x in zip(out_f.splitlines(), out_e.splitlines()) if x[0] != x[1]), None)
            print(f"  fast:  {first[0] if first else err_f}\n  exact: {first[1] if first else err_e}")
        else:
            ran += 1
        if (i + 1) % 25 == 0:
            print(f"{i + 1} of {a.count} drawn", file=sys.stderr)
    print(f"{ran} configurations agree, {differ} differ, {sum(refused.values())} refused by both modes")
    for msg, n in refused.most_common():
        print(f"  {n} x {msg}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
