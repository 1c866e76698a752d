#!/usr/bin/python3
"""Published offloading results against `ferry sim` (driven by scripts/validate-published.sh).

Rows come from tests/data/published/rows.tsv (one `ferry sim` configuration per published
figure, or the feature ferry lacks to express it); the measured A100 kernel times of
../shared/validation/gpu-kernels-a100/ are priced with `ferry hw kernel` through the op mapping
in tests/data/published/kernels-a100.tsv. Prints published, predicted and error per row, the
median |error| per source, and the rows that cannot be expressed with the missing feature. A miss
that lies within the rounding of the printed figure ("0.01" stands for 0.005 to 0.015) is marked
as such; its error still counts as measured against the printed figure.
With --sensitivity PCT, each row also names the three figures of its profile and runtime its
prediction hinges on (`ferry sim --sensitivity`: the change of the row's own metric with that
figure PCT % lower; '*' marks a figure with no source: a ferry default, an estimate). Standard library only."""
import argparse
import csv
import datetime
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

METRICS = {
    # generated tokens over the makespan
    "tok_s": "SELECT SUM(output_tokens) * 1e9 / (MAX(finish_ns) - MIN(arrival_ns)) FROM requests WHERE finish_ns >= 0",
    # end-to-end latency per generated token
    "s_per_token": "SELECT AVG((finish_ns - arrival_ns) * 1.0 / output_tokens) / 1e9 FROM requests WHERE finish_ns >= 0",
    # prompt tokens over the time to the last first token
    "prompt_tok_s": "SELECT SUM(prompt_tokens) * 1e9 / (MAX(first_token_ns) - MIN(arrival_ns)) FROM requests "
    "WHERE first_token_ns >= 0",
    # tokens after the first over the time after the first (decode speed of a request)
    "decode_tok_s": "SELECT SUM(output_tokens - 1) * 1e9 / SUM(finish_ns - first_token_ns) FROM requests "
    "WHERE finish_ns >= 0 AND output_tokens > 1",
}


def read_rows(path):
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            cols = line.split("\t")
            if len(cols) != 5 or cols[3] not in METRICS:
                sys.exit("%s:%d: expected 5 tab-separated columns (id, source, published, metric, definition)" % (path, n))
            rows.append({"id": cols[0], "source": cols[1], "published": float(cols[2]), "text": cols[2], "metric": cols[3],
                         "def": cols[4]})
    return rows


def run_row(ferry, row, tmp):
    db = os.path.join(tmp, row["id"] + ".db")
    args = [ferry, "sim"] + row["def"].split() + ["--quiet", "--db", db]
    p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        return None, (p.stderr or p.stdout).strip().splitlines()[-1:]
    con = sqlite3.connect(db)
    try:
        (v,) = con.execute(METRICS[row["metric"]]).fetchone()
    finally:
        con.close()
    return v, None


# The summary figure of `ferry sim --sensitivity` that moves as each row metric does, and whether
# the metric is its inverse (a rate over that time: the rows' runs give every request the same
# times, so the mean or p99 is each request's).
SENS_KEY = {"tok_s": ("tokens_per_s_change_pct", False), "s_per_token": ("e2e_p99_change_pct", False),
            "prompt_tok_s": ("ttft_mean_change_pct", True), "decode_tok_s": ("tpot_mean_change_pct", True)}
UNSOURCED = ("default", "estimate", "none")


def hinges(ferry, row, pct, jobs):
    """The three figures the row's metric moves most with (name, change %, basis), or why not."""
    args = [ferry, "sim"] + row["def"].split() + ["--quiet", "--sensitivity", str(pct), "--format", "json",
                                                  "--jobs", str(jobs)]
    p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        return None
    key, inverse = SENS_KEY[row["metric"]]
    figs = []
    for f in json.loads(p.stdout)["figures"]:
        c = f.get(key)
        if c is None or c <= -100:
            continue
        figs.append((f["figure"], 100.0 * (100.0 / (100.0 + c) - 1.0) if inverse else c, f["basis"]))
    figs.sort(key=lambda f: -abs(f[1]))
    # a derived figure moves with the one it is derived from (the pageable rate with
    # link.h2d_gbps): where the two move the row alike, the derived one says nothing more
    figs = [f for f in figs if not (f[2] == "derived" and any(g[2] != "derived" and abs(g[1] - f[1]) < 0.05 for g in figs))]
    return [f for f in figs[:3] if abs(f[1]) >= 0.05]


def hinge_text(h):
    if h is None:
        return "-"
    return ", ".join("%s%s %+.1f%%" % (n, "*" if b in UNSOURCED else "", c) for n, c, b in h) or "(none)"


# ---- D6: kernel times -----------------------------------------------------------------------

def kernel_map(path):
    """op name -> spec template (Python format string over the CSV's columns)."""
    ops = {}
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line.strip() or line.startswith("#"):
                continue
            csv_name, op, template = line.split("\t")
            ops[(csv_name, op)] = template
    return ops


def spec_of(template, r):
    v = {}
    for k, x in r.items():
        try:
            v[k] = int(x)
        except ValueError:
            try:
                v[k] = float(x)
            except ValueError:
                v[k] = x
    if "n_embd" in v and "n_head" in v:
        v["head_dim"] = v["n_embd"] // v["n_head"]
    v["gated"] = 2 if v.get("use_gated_mlp") == "True" else 1
    return eval("f" + repr(template), {}, v)  # templates are ferry's own data file


# --kernel-set NAME: the GPU's kernel times, the profile that prices them, its source label and
# its CSVs, each with the kernels-a100.tsv mapping it takes its op templates from. a100 is D6
# (../shared/validation/gpu-kernels-a100/); h100 and a40 are Vidur's measurements of the same ops
# on those GPUs (scripts/vidur_kernels.py), which the cost model was not developed against.
# The compute sets run under the `graph` runtime: Vidur's profiler times vLLM's (sarathi-serve's)
# kernels, which compute in fp16 (runtime.act_bytes 2; `ferry hw kernel` alone takes `native`).
# Its attention is sarathi-serve's FlashAttentionWrapper, which hands the new K and V to
# flash_attn_with_kvcache for the kernel to append (runtime.attn_fa2_kvcache 1; hw/README.md).
KERNEL_SETS = {
    "a100": ("a100-80gb-sxm+runtime=graph+runtime.attn_fa2_kvcache=1", "D6", [("{shared}/validation/gpu-kernels-a100/mlp_a100.csv", "mlp_a100.csv"),
                                    ("{shared}/validation/gpu-kernels-a100/attention_a100.csv", "attention_a100.csv")]),
    "h100": ("h100-sxm+runtime=graph+runtime.attn_fa2_kvcache=1", "K-H100", [("{root}/tests/data/published/kernels-vidur/mlp_h100.csv", "mlp_a100.csv")]),
    "a40": ("a40+runtime=graph+runtime.attn_fa2_kvcache=1", "K-A40", [("{root}/tests/data/published/kernels-vidur/mlp_a40.csv", "mlp_a100.csv")]),
    # this project's own measurement on an H200 (scripts/gpu_kernel_times.py, the four linear layers
    # in CUDA graphs, weights rotated past L2; tests/data/published/kernels-h200/README.md)
    "h200": ("h200+runtime=graph+runtime.attn_fa2_kvcache=1", "K-H200", [("{root}/tests/data/published/kernels-h200/mlp_h200.csv", "mlp_a100.csv")]),
    # NCCL all-reduce times within one NVSwitch machine: the A100 DGX of D6's folder, and Vidur's H100 DGX
    "a100-net": ("8xa100-80gb-sxm", "D6-net", [("{shared}/validation/gpu-kernels-a100/network_a100.csv",
                                                "network_a100.csv")]),
    "h100-net": ("8xh100-sxm", "K-H100-net", [("{root}/tests/data/published/kernels-vidur/network_h100.csv",
                                               "network_a100.csv")]),
    # The per-step host time of Vidur's serving engine (schedule, sampler, input preparation,
    # output processing and the step's unrecorded time, as Vidur's simulator sums them) against a
    # step of `graph-ray` (the `graph` preset's step_ns and row_ns, fit to the A100 set's tp=1 rows,
    # and worker_step_ns on several GPUs, fit to its tp 2 and 4 rows); the A40 machine's (tp 1 to
    # 8) was not used to fit either
    "a100-host": ("8xa100-80gb-sxm+runtime=graph-ray", "D6-host",
                  [("{shared}/validation/gpu-kernels-a100/cpu_overheads_a100.csv", "cpu_overheads_a100.csv")]),
    "a40-host": ("a40+runtime=graph-ray", "K-A40-host",
                 [("{root}/tests/data/published/kernels-vidur/cpu_overheads_a40.csv", "cpu_overheads_a100.csv")]),
}

# The phases of a step Vidur's simulator charges the host (vidur/entities/execution_time.py
# _get_cpu_overhead): four medians and the mean unrecorded time (ray_comm_time_mean: the run's
# wall time less its recorded phases, per step).
HOST_PHASES = ("schedule_ms_median", "sampler_e2e_ms_median", "prepare_inputs_e2e_ms_median",
               "process_model_outputs_ms_median", "ray_comm_ms_mean")


def op_of(r):
    """A measured row's op: its op column, a network file's collective, or a host overhead file's
    engine step."""
    return r.get("op") or r.get("collective") or "step"


def label_of(r):
    """The group a row is reported in: its op, a step by its tensor-parallel degree."""
    return "step_tp%s" % r["tp"] if op_of(r) == "step" else op_of(r)


def measured_ms(r):
    """A row's measured time: a kernel's median, or a step's host phases summed as Vidur does."""
    if "time_ms_median" in r:
        return float(r["time_ms_median"])
    return sum(float(r[c]) for c in HOST_PHASES)


def priced_row(csv_name, r, mapping):
    """Whether a measured row has a ferry kernel: its op (a network file's collective) is mapped,
    it took time, and a network row ran on one NVSwitch machine (ferry prices no multi-node
    collective, nor the pairwise-NVLink boxes)."""
    if (csv_name, op_of(r)) not in mapping or not measured_ms(r) > 0:
        return False
    if "network_device" in r:
        return r["network_device"].endswith("_dgx") and r["devices_per_node"] == r["num_workers"]
    return True


def run_kernels(ferry, hw, files, mapping):
    """files: (path, mapping key) pairs. None when a file is absent (no shared folder)."""
    results = []  # (csv, op, measured_ms, predicted_ms, spec)
    for path, csv_name in files:
        if not os.path.exists(path):
            return None
        with open(path) as f:
            data = [r for r in csv.DictReader(f) if priced_row(csv_name, r, mapping)]
        specs = [spec_of(mapping[(csv_name, op_of(r))], r) for r in data]
        p = subprocess.run([ferry, "hw", "kernel", hw, "-"], input="\n".join(specs) + "\n", capture_output=True,
                           text=True, cwd=ROOT)
        if p.returncode != 0:
            sys.exit("ferry hw kernel: " + p.stderr.strip())
        times = [float(x) / 1e3 for x in p.stdout.split()]
        if len(times) != len(data):
            sys.exit("ferry hw kernel: %d times for %d kernels" % (len(times), len(data)))
        for r, t, spec in zip(data, times, specs):
            results.append((csv_name, label_of(r), measured_ms(r), t, spec))
    return results


def half_unit(text):
    """Half a unit of the last digit the published figure was printed with: the figure stands for
    every value within it ("0.01" for 0.005 to 0.015, "18" for 17.5 to 18.5)."""
    t = text.strip().lower()
    if "e" in t:
        mant, exp = t.split("e", 1)
        return half_unit(mant) * 10.0 ** int(exp)
    return 0.5 * 10.0 ** -(len(t.split(".", 1)[1]) if "." in t else 0)


def err_pct(pred, pub):
    return (pred - pub) / pub * 100.0


def doc_region(lines, rows_file):
    """The lines of the document's section for rows_file: from its marker line,
    `<!-- validate-published ROWS -->` (ROWS the file's name), to the next heading."""
    mark = "<!-- validate-published %s -->" % os.path.basename(rows_file)
    for i, line in enumerate(lines):
        if line.strip() == mark:
            end = i + 1
            while end < len(lines) and not lines[end].startswith("#"):
                end += 1
            return lines[i + 1:end]
    return None


def cells_of(line):
    """The cells of a Markdown table line."""
    return [c.strip() for c in line.strip().strip("|").split("|")]


def table_line(lines, key):
    """The cells of the first Markdown table line whose first cell is key, else of the first whose
    first cell is key's first part up to a '-' (a table may name O3.4-flexgen-6.7b-comp-p256 as
    O3.4), or None."""
    for exact in (True, False):
        for line in lines:
            if not line.startswith("| "):
                continue
            first = line.split("|")[1].strip()
            if first == key if exact else (first and key.startswith(first + "-")):
                return cells_of(line)
    return None


def check_doc(path, rows_file, row_lines, source_lines, failed):
    """The document's section for rows_file against this run's own Markdown (row_lines, the rows'
    table lines; source_lines, the per-source summary's): each row's line ends with its predicted
    value and error as measured, each source's line gives its median and rows within 25 %, so a
    change of the physics cannot leave the published tables behind (a ctest runs this for every
    rows file)."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        sys.exit("%s: %s" % (path, e.strerror))
    region = doc_region(lines, rows_file)
    if region is None:
        sys.exit("%s: no section marked <!-- validate-published %s -->" % (path, os.path.basename(rows_file)))
    bad = ["%s: row %s failed to run: %s" % (path, r["id"], " ".join(why)) for r, why in failed]
    failed_ids = {r["id"] for r, _ in failed}
    for line in row_lines:
        want = cells_of(line)
        if want[0] in failed_ids:
            continue
        pred, err = want[-2], want[-1].split()[0]
        cells = table_line(region, want[0])
        if cells is None:
            bad.append("%s: row %s is in no table of its section (measured %s, %s %%)" % (path, want[0], pred, err))
        elif len(cells) < 3 or cells[-2] != pred or cells[-1].split()[0] != err:
            bad.append("%s: row %s documents %s | %s, measured %s | %s %%" % (path, want[0], cells[-2], cells[-1], pred, err))
    for line in source_lines:
        want = cells_of(line)
        if want[0] == "D6":
            continue
        cells = table_line(region, want[0])
        if cells is None or len(cells) < 4 or cells[-2:] != want[-2:]:
            bad.append("%s: source %s documents %s, measured median %s %%, %s within 25 %%" %
                       (path, want[0], " | ".join(cells) if cells else "nothing", want[-2], want[-1]))
    if bad:
        print("\n" + "\n".join(bad), file=sys.stderr)
        sys.exit(1)
    print("\n%s: every row and source of %s as measured" % (path, os.path.basename(rows_file)))


def check_doc_kernels(path, set_name, kernel_lines):
    """The document's section marked <!-- validate-published kernels-SET --> against this run's
    per-op kernel table (kernel_lines): every op's line as measured."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        sys.exit("%s: %s" % (path, e.strerror))
    region = doc_region(lines, "kernels-" + set_name)
    if region is None:
        sys.exit("%s: no section marked <!-- validate-published kernels-%s -->" % (path, set_name))
    bad = []
    for line in kernel_lines:
        want = cells_of(line)
        cells = table_line(region, want[0])
        if cells != want:
            bad.append("%s: kernels %s %s documents %s, measured %s" % (path, set_name, want[0],
                                                                    " | ".join(cells) if cells else "nothing",
                                                                    " | ".join(want)))
    if bad:
        print("\n" + "\n".join(bad), file=sys.stderr)
        sys.exit(1)
    print("\n%s: every op of the %s kernel set as measured" % (path, set_name))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ferry", default=os.environ.get("FERRY", os.path.join(ROOT, "build", "ferry")))
    ap.add_argument("--rows", default=os.environ.get("ROWS", os.path.join(ROOT, "tests", "data", "published", "rows.tsv")),
                    help="rows file (default $ROWS, else rows.tsv; oos-rows.tsv holds the out-of-sample rows)")
    ap.add_argument("--kernels", default=os.path.join(ROOT, "tests", "data", "published", "kernels-a100.tsv"))
    ap.add_argument("--shared", default=os.path.join(ROOT, "..", "shared"))
    ap.add_argument("--markdown", help="also write the tables as Markdown to this file")
    ap.add_argument("--no-kernels", action="store_true", help="skip the D6 kernel timings (rows only)")
    ap.add_argument("--kernel-csv", metavar="FILE",
                    help="also write every priced kernel to this CSV: its file, op, the `ferry hw kernel` spec, "
                    "measured and predicted ms, error %%")
    ap.add_argument("--kernel-set", choices=sorted(KERNEL_SETS), default="a100",
                    help="the GPU whose kernel times to price (default a100, source D6; h100 and a40: Vidur's "
                    "out-of-sample sets, h200: this project's products measured on an H200, each run alone, "
                    "without the rows; -net: NCCL all-reduces; -host: a serving engine's host time per step)")
    ap.add_argument("--sensitivity", type=float, metavar="PCT",
                    help="also name the three figures each row hinges on (ferry sim --sensitivity PCT)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="with --sensitivity: its --jobs")
    ap.add_argument("--check-doc", metavar="FILE",
                    help="exit 1 unless FILE (docs/validation.md), in its section marked "
                    "<!-- validate-published ROWS -->, gives each row and source as this run measured them "
                    "(with --kernel-set GPU: <!-- validate-published kernels-GPU -->, each op)")
    a = ap.parse_args()
    if a.sensitivity is not None and not 0.1 <= a.sensitivity <= 50:
        sys.exit("--sensitivity: a percentage in [0.1, 50]")
    sens = a.sensitivity is not None
    if sens and a.check_doc:
        sys.exit("--check-doc compares the plain tables: leave out --sensitivity")
    if a.kernel_set != "a100" and (a.no_kernels or sens):
        sys.exit("--kernel-set %s prices kernels alone: leave out --no-kernels and --sensitivity"
                 % a.kernel_set)
    rows = [] if a.kernel_set != "a100" else read_rows(a.rows)
    out = []  # markdown lines
    by_source, missing, failed, rounded = {}, [], [], []
    if rows:
        print("%-20s %-4s %12s %12s %9s%s" % ("row", "src", "published", "predicted", "error%",
                                              "  hinges on (%g %% lower; * no source)" % a.sensitivity if sens else ""))
        out += ["| row | source | metric | published | predicted | error %% |%s" % (" hinges on |" if sens else ""),
                "|---|---|---|---|---|---|%s" % ("---|" if sens else "")]
    with tempfile.TemporaryDirectory(prefix="ferry-published-") as tmp:
        for r in rows:
            if r["def"].startswith("missing:"):
                missing.append(r)
                continue
            v, why = run_row(a.ferry, r, tmp)
            if v is None:
                failed.append((r, why))
                print("%-20s %-4s %12.4g %12s %9s  (failed: %s)" % (r["id"], r["source"], r["published"], "-", "-",
                                                                    " ".join(why)))
                out.append("| %s | %s | %s | %.4g | failed | - |" % (r["id"], r["source"], r["metric"], r["published"]))
                continue
            e = err_pct(v, r["published"])
            by_source.setdefault(r["source"], []).append(abs(e))
            miss = abs(e) > 25
            # a miss the published figure's own rounding covers is said so (the error stays as
            # measured against the printed figure, and counts as such)
            hu = half_unit(r["text"])
            rounding = miss and abs(v - r["published"]) <= hu
            if rounding:
                rounded.append((r, hu))
            mark = (" (miss, within the printed figure's rounding)" if rounding else " (miss)") if miss else ""
            h = hinge_text(hinges(a.ferry, r, a.sensitivity, a.jobs)) if sens else None
            print("%-20s %-4s %12.4g %12.4g %+9.1f%s%s" % (r["id"], r["source"], r["published"], v, e,
                                                          ("  MISS (rounding)" if rounding else "  MISS") if miss else "",
                                                          "  " + h if sens else ""))
            out.append("| %s | %s | %s | %.4g | %.4g | %+.1f%s |%s" % (r["id"], r["source"], r["metric"], r["published"], v, e,
                                                                      mark, " %s |" % h if sens else ""))
    # D6
    mapping = kernel_map(a.kernels)
    k_hw, k_source, k_files = KERNEL_SETS[a.kernel_set]
    k_files = [(p.format(shared=a.shared, root=ROOT), key) for p, key in k_files]
    kres = None if a.no_kernels else run_kernels(a.ferry, k_hw, k_files, mapping)
    if kres is None and a.kernel_set != "a100":
        sys.exit("--kernel-set %s: %s is missing" % (a.kernel_set, k_files[0][0]))
    if a.kernel_csv and kres is None:
        sys.exit("--kernel-csv: no kernels were priced (--no-kernels, or the kernel set's files are missing)")
    if a.kernel_csv:
        with open(a.kernel_csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["file", "op", "spec", "measured_ms", "predicted_ms", "error_pct"])
            for c, op, m, p, spec in kres:
                w.writerow([c, op, spec, "%.6g" % m, "%.6g" % p, "%+.1f" % err_pct(p, m)])
    kout = []
    what = "steps" if a.kernel_set.endswith("-host") else "kernels"  # what a set's rows time
    if kres is not None:
        print("\n%s: %s %s times (measured medians) against `ferry hw kernel %s`" % (k_source, a.kernel_set.upper(),
                                                                               "step" if what == "steps" else "kernel", k_hw))
        print("%-36s %6s %14s %14s" % ("op", "rows", "median err%", "median |err|%"))
        kout += ["| op | %s | median error %% | median \\|error\\| %% |" % what, "|---|---|---|---|"]
        ops = {}
        for c, op, m, p, _ in kres:
            ops.setdefault((c, op), []).append(err_pct(p, m))
        all_abs = []
        for (c, op), es in sorted(ops.items()):
            all_abs += [abs(x) for x in es]
            print("%-36s %6d %+14.1f %14.1f" % (c.split("_")[0] + "/" + op, len(es), statistics.median(es),
                                              statistics.median([abs(x) for x in es])))
            kout.append("| %s/%s | %d | %+.1f | %.1f |" % (c.split("_")[0], op, len(es), statistics.median(es),
                                                          statistics.median([abs(x) for x in es])))
        by_source[k_source] = [statistics.median(all_abs)]
        print("%-36s %6d %14s %14.1f" % ("all " + what, len(all_abs), "", statistics.median(all_abs)))
        kout.append("| all %s | %d | | %.1f |" % (what, len(all_abs), statistics.median(all_abs)))
    print("\nmedian |error| per source (goal: rows within 25 %, median at most 10 %; D6 kernels 15 %):")
    sout = ["| source | rows | median \\|error\\| % | rows within 25 % |", "|---|---|---|---|"]
    for s in sorted(by_source):
        es = by_source[s]
        if s == k_source:
            print("  %-4s %3s %s  %6.1f %%" % (s, len(kres), what, es[0]))
            sout.append("| %s | %d %s | %.1f | - |" % (s, len(kres), what, es[0]))
        else:
            within = sum(1 for x in es if x <= 25)
            print("  %-4s %3d rows  %6.1f %%  (%d within 25 %%)" % (s, len(es), statistics.median(es), within))
            sout.append("| %s | %d | %.1f | %d of %d |" % (s, len(es), statistics.median(es), within, len(es)))
    if rounded:
        print("\nmisses within the rounding of the printed figure (the published value could be the prediction):")
        for r, hu in rounded:
            print("  %-16s %-4s %s = %.6g to %.6g" % (r["id"], r["source"], r["text"], r["published"] - hu, r["published"] + hu))
    mout = []
    if missing or failed:
        print("\nrows ferry cannot express yet:")
        mout += ["| row | source | published | missing feature |", "|---|---|---|---|"]
        for r in missing:
            print("  %-16s %-4s %10.4g  %s" % (r["id"], r["source"], r["published"], r["def"]))
            mout.append("| %s | %s | %.4g | %s |" % (r["id"], r["source"], r["published"], r["def"][len("missing: "):]))
        for r, why in failed:
            print("  %-16s %-4s %10.4g  failed: %s" % (r["id"], r["source"], r["published"], " ".join(why)))
    if a.check_doc and a.kernel_set != "a100":
        check_doc_kernels(a.check_doc, a.kernel_set, kout[2:])
    elif a.check_doc:
        check_doc(a.check_doc, a.rows, out[2:], sout[2:], failed)
    if a.markdown:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        with open(a.markdown, "w") as f:
            f.write("Measured %s at commit %s with `scripts/validate-published.sh`.\n\n" %
                    (datetime.date.today().isoformat(), rev or "?"))
            if out:
                f.write("\n".join(out) + "\n\n")
            if kout:
                f.write("%s, per op (%s, `ferry hw kernel %s`):\n\n" % (k_source, a.kernel_set.upper(), k_hw) +
                        "\n".join(kout) + "\n\n")
            f.write("\n".join(sout) + "\n\n")
            if mout:
                f.write("Rows ferry cannot express yet:\n\n" + "\n".join(mout) + "\n")


main()
