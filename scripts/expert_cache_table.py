#!/usr/bin/python3
"""Expert placement policies against each other in `ferry sim` (issue 14's goal): on slices of
the Azure 2023 conversation and code traces (tests/data/traces/azure_{conv,code}_200.csv, the
first N requests, all arriving at once), Mixtral-8x7B and Qwen1.5-MoE-A2.7B on h100-pcie, l4 and
rtx-4090 with each GPU's default budget (Qwen1.5-MoE fits an H100's: there it gets 16 GiB, so it
offloads), the mean TPOT of --expert-cache lru, lfu, static and auto. The goal: auto within 5 %
of the best of lru, lfu and static in every cell. Prints the table (Markdown with --markdown
FILE); exits 1 when a cell misses the goal.
usage: scripts/expert_cache_table.py [--requests N] [--markdown FILE] [-j N]   (FERRY=path/to/ferry)
Standard library only."""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
TRACES = ("conv", "code")
MODELS = ("mixtral-8x7b", "qwen1.5-moe-a2.7b")
GPUS = ("h100-pcie", "l4", "rtx-4090")
POLICIES = ("lru", "lfu", "static", "auto")
GOAL = 0.05


def budget(model, gpu):
    # the model fits the H100's default budget: no cache at all without a smaller one
    return ["--device-budget", "16GiB"] if model == "qwen1.5-moe-a2.7b" and gpu == "h100-pcie" else []


def tpot(ferry, trace, model, gpu, policy, n):
    args = [ferry, "sim", "--model", model, "--hw", gpu, "--trace",
            os.path.join(ROOT, "tests", "data", "traces", "azure_%s_200.csv" % trace), "--max-requests", str(n),
            "--as-fast-as-possible", "--expert-cache", policy, "--quiet", "--format", "json"] + budget(model, gpu)
    p = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        sys.exit("%s: %s" % (" ".join(args), (p.stderr or p.stdout).strip()))
    return json.loads(p.stdout)["runs"][0]["tpot_ms"]["mean"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ferry", default=os.environ.get("FERRY", os.path.join(ROOT, "build", "ferry")))
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--markdown")
    ap.add_argument("-j", type=int, default=2)
    a = ap.parse_args()
    cells = [(t, m, g) for t in TRACES for m in MODELS for g in GPUS]
    jobs = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.j) as pool:
        for c in cells:
            for p in POLICIES:
                jobs[c + (p,)] = pool.submit(tpot, a.ferry, c[0], c[1], c[2], p, a.requests)
    head = "| trace | model | GPU | " + " | ".join("%s TPOT (ms)" % p for p in POLICIES) + " | auto vs best |"
    lines = [head, "|" + "---|" * (4 + len(POLICIES))]
    worst, failed = -1.0, []
    print("%-5s %-18s %-10s" % ("trace", "model", "gpu") + "".join("%10s" % p for p in POLICIES) + "  auto/best")
    for c in cells:
        v = {p: jobs[c + (p,)].result() for p in POLICIES}
        best = min(v["lru"], v["lfu"], v["static"])
        rel = v["auto"] / best - 1.0
        worst = max(worst, rel)
        if rel > GOAL:
            failed.append(c)
        gpu = c[2] + (" (16 GiB)" if budget(c[1], c[2]) else "")
        print("%-5s %-18s %-10s" % c + "".join("%10.1f" % v[p] for p in POLICIES) + "  %+6.1f %%%s" %
              (rel * 100, "  MISS" if rel > GOAL else ""))
        lines.append("| %s | %s | %s | " % (c[0], c[1], gpu) + " | ".join("%.1f" % v[p] for p in POLICIES) +
                     " | %+.1f %% |" % (rel * 100))
    print("auto is at worst %+.1f %% of the best of lru, lfu and static (goal: %+.0f %%)" % (worst * 100, GOAL * 100))
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write("\n".join(lines) + "\n")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
