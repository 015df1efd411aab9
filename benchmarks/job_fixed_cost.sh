#!/usr/bin/env bash
# A job's fixed cost: `python -m k25exp experiment=nccl_burst debug=quick` with MLflow tracking
# on a fresh SQLite store (a new folder per run, so no run pays or skips the schema creation
# differently), N runs (default 5); prints each run's wall / user / sys seconds and the medians,
# with the load average beside them (a loaded 2-core box moves these figures a lot).
# Also the job's own figure outside the measurement (its log line "job finished in T s
# (measuring M s)": T - M), which leaves out the interpreter's start and imports.
#   benchmarks/job_fixed_cost.sh [N] [extra overrides ...]
#   K25_TREE=/tmp/other-checkout benchmarks/job_fixed_cost.sh   # time another checkout's code
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$here/.venv/bin/python}
cd "${K25_TREE:-$here}"
n=${1:-5}; shift || true
tmp=$(mktemp -d /tmp/k25_fixed_cost.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for i in $(seq 1 "$n"); do
  out="$tmp/run$i"; mkdir -p "$out"
  # paths.outputs puts the store, its artifacts and Hydra's run folder in the fresh folder.
  MLFLOW_TRACKING_URI="sqlite:///$out/mlflow.db" /usr/bin/time -f '%e %U %S' -o "$tmp/time$i" \
    "$py" -m k25exp experiment=nccl_burst debug=quick tracking=mlflow "paths.outputs=$out" "$@" \
    >"$tmp/log$i" 2>&1 || { echo "run $i failed:"; tail -20 "$tmp/log$i"; exit 1; }
  read -r wall user sys <"$tmp/time$i"
  job=$(sed -nE 's/.*job finished in ([0-9.]+) s \(measuring ([0-9.]+) s\).*/\1 \2/p' "$tmp/log$i")
  echo "$job" >"$tmp/job$i"
  echo "run $i: wall ${wall}s user ${user}s sys ${sys}s cpu $(echo "$user + $sys" | bc)s; job (measuring) ${job/ /s (}s)"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
"$py" - "$tmp" "$n" <<'PY'
import statistics, sys
tmp, n = sys.argv[1], int(sys.argv[2])
rows = [list(map(float, open(f"{tmp}/time{i}").read().split())) for i in range(1, n + 1)]
wall = statistics.median(r[0] for r in rows)
cpu = statistics.median(r[1] + r[2] for r in rows)
jobs = [list(map(float, open(f"{tmp}/job{i}").read().split())) for i in range(1, n + 1)]
outside = statistics.median(j[0] - j[1] for j in jobs)
print(f"median of {n}: wall {wall:.2f}s cpu (user+sys) {cpu:.2f}s; "
      f"in the job outside its measurement {outside:.2f}s")
PY
