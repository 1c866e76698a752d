#!/usr/bin/env python3
"""Write Vidur's per-operator kernel times of one GPU in the long format of
../shared/validation/gpu-kernels-a100/mlp_a100.csv (one row per model, tp, token count and op),
so that `scripts/validate-published.sh --kernel-set` checks ferry's kernel costs on GPUs other
than the A100 the D6 rows come from.

  usage: scripts/vidur_kernels.py VIDUR_GIT_DIR COMMIT GPU OUT.csv
         scripts/vidur_kernels.py VIDUR_GIT_DIR COMMIT network/MACHINE OUT.csv
         scripts/vidur_kernels.py VIDUR_GIT_DIR COMMIT cpu/GPU OUT.csv

VIDUR_GIT_DIR is a clone (or bare mirror) of microsoft/vidur; COMMIT the revision read;
GPU the folder under data/profiling/compute/ (h100, a40); network/MACHINE a folder under
data/profiling/network/ (h100_dgx), whose all_reduce.csv and send_recv.csv are written in the long format of
../shared/validation/gpu-kernels-a100/network_a100.csv (its sizes: 2 KiB to 64 MiB, about doubling);
cpu/GPU the per-step host overheads of Vidur's serving engine on that GPU's machine
(data/profiling/GPU/cpu_overheads.csv, in the older commits 6d98aa8 and e2d00e9), written as
../shared/validation/gpu-kernels-a100/cpu_overheads_a100.csv (ms to 0.1 us). The token counts kept are the
A100 set's (1, 2, 4, ... 32768: powers of two and the steps between them that file has), so the
three GPUs are compared on the same shapes; times are medians, minima and maxima of Vidur's
repetitions in ms, rounded to 0.1 us as the A100 set; a shape Vidur profiled twice keeps the
first profile's times. Vidur's data is MIT-licensed (Copyright
(c) Microsoft Corporation): its LICENSE travels with the output (LICENSE-vidur.txt beside it).
"""
import csv
import io
import subprocess
import sys

TOKENS = {1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384,
          24576, 32768}
OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm", "mlp_up_proj",
       "mlp_act", "mlp_down_proj", "add")


def git(gitdir, *args):
    p = subprocess.run(["git", "--git-dir", gitdir] + list(args), capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("vidur_kernels.py: git %s: %s" % (" ".join(args), p.stderr.strip()))
    return p.stdout


NET_SIZES = {2048, 10240, 18432, 34816, 67584, 133120, 264192, 526336, 1048576, 2097152, 4194304, 8388608,
             16777216, 33554432, 67108864}


def network(gitdir, commit, machine, out):
    rows, paths = [], []
    for collective in ("all_reduce", "send_recv"):
        path = "data/profiling/network/%s/%s.csv" % (machine, collective)
        listed = git(gitdir, "ls-tree", "--name-only", commit, path).split()
        if not listed:
            continue  # a machine Vidur measured one of the two on
        paths.append(path)
        seen = set()
        for r in csv.DictReader(io.StringIO(git(gitdir, "show", "%s:%s" % (commit, path)))):
            size = int(r["size"])
            key = (r["num_workers"], r["devices_per_node"], size)
            if size not in NET_SIZES or key in seen:
                continue
            seen.add(key)
            rows.append([machine, commit[:7], collective, r["num_workers"], r["devices_per_node"],
                         r["max_devices_per_node"], size, "%.4f" % float(r["time_stats.%s.median" % collective]),
                         "%.4f" % float(r["time_stats.%s.min" % collective]),
                         "%.4f" % float(r["time_stats.%s.max" % collective])])
    if not paths:
        sys.exit("vidur_kernels.py: no all_reduce.csv or send_recv.csv under data/profiling/network/%s at %s"
                 % (machine, commit))
    path = " and ".join(paths)
    rows.sort(key=lambda x: (x[2], int(x[3]), int(x[4]), x[6]))
    with open(out, "w", newline="") as fo:
        w = csv.writer(fo, lineterminator="\n")
        w.writerow(["network_device", "src_commit", "collective", "num_workers", "devices_per_node",
                    "max_devices_per_node", "size_bytes", "time_ms_median", "time_ms_min", "time_ms_max"])
        w.writerows(rows)
    print("%s: %d collective times (%s at %s)" % (out, len(rows), path, commit[:12]))


CPU_PHASES = ("schedule", "sampler_launch", "sampler_e2e", "prepare_inputs_launch", "prepare_inputs_e2e",
              "model_execution_launch", "model_execution_e2e", "process_model_outputs")


def cpu_overheads(gitdir, commit, gpu, out):
    path = "data/profiling/%s/cpu_overheads.csv" % gpu
    rows = []
    for r in csv.DictReader(io.StringIO(git(gitdir, "show", "%s:%s" % (commit, path)))):
        rows.append([gpu, r["model_name"].split("/")[-1], r["tensor_parallel_degree"], r["batch_size"]] +
                    ["%.4f" % float(r[p + "_median"]) for p in CPU_PHASES] +
                    ["%.4f" % float(r[p + "_mean"]) for p in CPU_PHASES] + ["%.4f" % float(r["ray_comm_time_mean"])])
    rows.sort(key=lambda x: (x[1], int(x[2]), int(x[3])))
    with open(out, "w", newline="") as fo:
        w = csv.writer(fo, lineterminator="\n")
        w.writerow(["gpu", "model", "tp", "batch_size"] + [p + "_ms_median" for p in CPU_PHASES] +
                   [p + "_ms_mean" for p in CPU_PHASES] + ["ray_comm_ms_mean"])
        w.writerows(rows)
    print("%s: %d per-step host overheads (%s at %s)" % (out, len(rows), path, commit[:12]))


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__.strip().split("\n\n")[1])
    gitdir, commit, gpu, out = sys.argv[1:]
    if gpu.startswith("network/"):
        return network(gitdir, commit, gpu[len("network/"):], out)
    if gpu.startswith("cpu/"):
        return cpu_overheads(gitdir, commit, gpu[len("cpu/"):], out)
    prefix = "data/profiling/compute/%s/" % gpu
    files = [f for f in git(gitdir, "ls-tree", "-r", "--name-only", commit, prefix).split()
             if f.endswith("/mlp.csv")]
    if not files:
        sys.exit("vidur_kernels.py: no %s*/mlp.csv at %s" % (prefix, commit))
    rows, seen = [], set()
    for f in sorted(files):
        model = f[len(prefix):].split("/")[1]
        for r in csv.DictReader(io.StringIO(git(gitdir, "show", "%s:%s" % (commit, f)))):
            n = int(r["num_tokens"])
            if n not in TOKENS:
                continue
            for op in OPS:
                med = r.get("time_stats.%s.median" % op, "")
                if med == "":
                    continue  # an op the model's block does not have
                key = (model, r["num_tensor_parallel_workers"], n, op)
                if key in seen:
                    continue  # Vidur profiled some shapes twice: the first run's times, as the A100 set
                seen.add(key)
                rows.append([gpu, model, r["n_embd"], r["n_expanded_embd"], r["n_head"], r["n_kv_head"],
                             r["use_gated_mlp"], r["num_tensor_parallel_workers"], n, op,
                             "%.4f" % float(med), "%.4f" % float(r["time_stats.%s.min" % op]),
                             "%.4f" % float(r["time_stats.%s.max" % op])])
    rows.sort(key=lambda x: (x[1], int(x[7]), x[8], OPS.index(x[9])))
    with open(out, "w", newline="") as fo:
        w = csv.writer(fo, lineterminator="\n")
        w.writerow(["gpu", "model", "n_embd", "n_expanded_embd", "n_head", "n_kv_head", "use_gated_mlp", "tp",
                    "num_tokens", "op", "time_ms_median", "time_ms_min", "time_ms_max"])
        w.writerows(rows)
    print("%s: %d kernel times from %d models (%s at %s)" % (out, len(rows), len(files), prefix, commit[:12]))


if __name__ == "__main__":
    main()
