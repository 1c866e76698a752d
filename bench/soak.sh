#!/bin/sh
# Soak test of what keeps a run up (not part of `make test`): `ferry run` serves a synthetic
# trace for DURATION seconds on an MoE model streamed through a small device budget, with
# transient disk faults injected all along (EIO, EAGAIN, short reads, 20 ms stalls), the host
# budget swinging every PERIOD/2 seconds between room for everything, a squeeze the engine meets
# by re-planning, and a deeper one it meets by halving its prefetch depth, and two weight reloads
# (new weights at a third of the run, newer ones at two thirds: versions of the same size, so the
# memory of the start and of the end compare; tests/test_reload.c covers a reload to another
# quantization). It then checks
#   - no request lost: every request of the trace finished (none refused, none failed);
#   - no budget exceeded: every host memory sample after the engine shed for a budget (its
#     transition event) is within that budget;
#   - memory flat: resident set size (RSS, sampled every RSS_EVERY seconds) grows by less than
#     1 % between the first phase of each budget (past 10 % of the run) and its last phase (the
#     median RSS of each phase, from 10 s after its change; a phase with room for every weight in
#     host memory holds more than a squeezed one, so like is compared with like);
# and prints the figures (docs/resilience.md quotes them).
#
# Usage: bench/soak.sh [DURATION_S [OUT_DIR]]   (defaults: 1800 s, build/soak)
# Environment: FERRY (the binary, default build/ferry), RATE (requests/s, default 4), PERIOD
# (budget swing period in s, default 120), RSS_EVERY (s, default 5). Runs under nice.
set -eu

DURATION=${1:-1800}
OUT=${2:-build/soak}
FERRY=${FERRY:-build/ferry}
RATE=${RATE:-4}
PERIOD=${PERIOD:-120}
RSS_EVERY=${RSS_EVERY:-5}
PY=/usr/bin/python3

[ -x "$FERRY" ] || { echo "soak: no ferry binary at $FERRY (make, or FERRY=...)" >&2; exit 2; }
rm -rf "$OUT"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

echo "soak: models in $OUT"
"$FERRY" model gen --preset tiny-moe --seed 1 --out "$OUT/a" >/dev/null
"$FERRY" model gen --preset tiny-moe --seed 2 --out "$OUT/b" >/dev/null
"$FERRY" model gen --preset tiny-moe --seed 3 --out "$OUT/c" >/dev/null
for d in a b c; do "$FERRY" model manifest "$OUT/$d" >/dev/null; done

# the budget swings: room for everything, then 18 MiB (a re-plan homes most experts on disk),
# back, then 15 MiB (the prefetch depth must halve: three staging slots no longer fit)
SCHEDULE=$($PY - "$DURATION" "$PERIOD" <<'EOF'
import sys
d, p = float(sys.argv[1]), float(sys.argv[2])
out, t, k = [], p / 2, 0
sizes = ["18MiB", "1GiB", "15MiB", "1GiB"]
while t < d and len(out) < 32:
    out.append("%g:%s" % (t, sizes[k % 4]))
    t += p / 2
    k += 1
print(",".join(out))
EOF
)
N=$($PY -c "print(int($RATE * $DURATION))")
T1=$($PY -c "print($DURATION / 3)")
T2=$($PY -c "print(2 * $DURATION / 3)")
FAULTS="read:eio@0.002,read:eagain@0.001,read:short@0.003,read:delay:20@0.001,seed=7"
echo "soak: $DURATION s, $N requests at $RATE/s, reloads at $T1 s and $T2 s"
echo "soak: host budget schedule $SCHEDULE"
echo "soak: faults $FAULTS"

start=$(date +%s)
nice -n 10 "$FERRY" run --model "$OUT/a" --synthetic "rate=$RATE,n=$N,prompt=24,output=12" --seed 3 \
  --device-budget 8MiB --host-budget 1GiB --prefetch-depth 2 --max-batch 8 --max-seq-tokens 64 --threads 1 \
  --pressure --host-budget-schedule "$SCHEDULE" --reload-at "$T1:$OUT/b,$T2:$OUT/c" --faults "$FAULTS" \
  --db "$OUT/soak.db" --quiet >"$OUT/run.out" 2>"$OUT/run.err" &
pid=$!
: >"$OUT/rss.txt"
while kill -0 "$pid" 2>/dev/null; do
  rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
  [ -n "$rss" ] && echo "$(($(date +%s) - start)) $rss" >>"$OUT/rss.txt"
  sleep "$RSS_EVERY"
done
rc=0
wait "$pid" || rc=$?
elapsed=$(($(date +%s) - start))
echo "soak: ferry run exited $rc after $elapsed s"
cat "$OUT/run.out"

$PY - "$OUT" "$N" "$rc" "$elapsed" "$SCHEDULE" "$DURATION" <<'EOF'
import sqlite3, sys, statistics
out, n, rc, elapsed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
schedule = [(float(c.split(":")[0]), c.split(":")[1]) for c in sys.argv[5].split(",") if c]
duration = float(sys.argv[6])
db = sqlite3.connect(out + "/soak.db")
q = lambda sql, *a: db.execute(sql, a).fetchall()
ok = True
def check(cond, what):
    global ok
    print("soak: %s %s" % ("PASS" if cond else "FAIL", what))
    ok &= bool(cond)
run = q("SELECT id, complete, error FROM runs ORDER BY id DESC LIMIT 1")[0]
done = q("SELECT count(*) FROM requests WHERE runId = ? AND finish_ns IS NOT NULL", run[0])[0][0]
refused = q("SELECT count(*) FROM engine_events WHERE runId = ? AND kind = 'refused'", run[0])[0][0]
check(rc == 0 and run[1] == 1 and run[2] is None, "run complete (exit %d, error %s)" % (rc, run[2]))
check(done == n and refused == 0, "no request lost: %d of %d finished, %d refused" % (done, n, refused))
meta = dict(q("SELECT name, value FROM META_DATA_EXPORT WHERE runId = ?", run[0]))
print("soak: I/O: %s reads, %s attempts, %s retries, %s recovered, %s short, %s failed; %s faults injected" % (
    meta.get("IO_READS"), meta.get("IO_ATTEMPTS"), meta.get("IO_RETRIES"), meta.get("IO_RECOVERED"),
    meta.get("IO_SHORT_READS"), meta.get("IO_FAILED"), meta.get("FAULTS_INJECTED")))
check(int(meta.get("IO_RECOVERED", 0)) > 0 and int(meta.get("IO_FAILED", 1)) == 0,
      "transient faults survived (%s reads recovered, none failed)" % meta.get("IO_RECOVERED"))
ev = q("SELECT t_ns, kind, action, level, budget_bytes FROM engine_events WHERE runId = ? AND kind IN ('pressure','reload') ORDER BY t_ns, rowid", run[0])
applied = [e for e in ev if e[2] == "reload applied"]
check(len(applied) == 2, "two reloads applied (%d)" % len(applied))
acts = {}
for e in ev:
    acts[e[2]] = acts.get(e[2], 0) + 1
print("soak: pressure and reload events: %s; highest level %d" % (
    ", ".join("%s %d" % kv for kv in sorted(acts.items())), max([e[3] or 0 for e in ev] or [0])))
# the budget in force after each shed: from the first transition after a change to the next change
mem = q("SELECT t_ns, used_bytes FROM memory WHERE runId = ? AND tier = 'host' ORDER BY t_ns", run[0])
windows, budget, pending = [], None, False
for t, kind, action, level, b in ev:
    if action == "budget changed":
        if windows and windows[-1][1] is None: windows[-1][1] = t
        budget, pending = b, True
    elif pending and kind == "pressure":
        windows.append([t, None, budget]); pending = False
worst, checked = 0.0, 0
for lo, hi, b in windows:
    for t, used in mem:
        if t >= lo and (hi is None or t < hi):
            checked += 1
            worst = max(worst, used / b)
check(checked > 0 and worst <= 1.0, "no budget exceeded: %d host samples under %d budgets, highest used/budget %.3f" % (
    checked, len(windows), worst))
rss = [tuple(map(int, l.split())) for l in open(out + "/rss.txt") if l.strip()]
# phases: [change + 10 s, next change), labelled by the budget in force
bounds = [(0.0, "1GiB")] + schedule
phases = []
for i, (t, size) in enumerate(bounds):
    end = bounds[i + 1][0] if i + 1 < len(bounds) else duration
    vals = [r for (s_, r) in rss if t + 10 <= s_ < end]
    if vals:
        phases.append((t, size, statistics.median(vals)))
late = [p for p in phases if p[0] >= duration / 10]
worst = None
for size in sorted(set(p[1] for p in late)):
    ps = [p for p in late if p[1] == size]
    if len(ps) < 2:
        continue
    g = 100.0 * (ps[-1][2] - ps[0][2]) / ps[0][2]
    print("soak: RSS in %s phases: %d KiB at %.0f s, %d KiB at %.0f s (%+.2f %%), %d phases" % (
        size, ps[0][2], ps[0][0], ps[-1][2], ps[-1][0], g, len(ps)))
    worst = g if worst is None else max(worst, g)
if rss:
    print("soak: RSS overall: %d KiB at %d s, %d KiB at the end, peak %d KiB" % (
        rss[len(rss) // 10][1], rss[len(rss) // 10][0], rss[-1][1], max(r for _, r in rss)))
check(worst is not None and worst < 1.0, "memory flat: RSS growth %s between the first and last phase of each budget" % (
    "%+.2f %% at most" % worst if worst is not None else "not measured (too short a run)"))
lat = q("SELECT avg(first_token_ns - arrival_ns), max(finish_ns - arrival_ns) FROM requests WHERE runId = ?", run[0])[0]
print("soak: %d s, mean TTFT %.1f ms, longest request %.1f ms" % (elapsed, lat[0] / 1e6, lat[1] / 1e6))
sys.exit(0 if ok else 1)
EOF
