#!/usr/bin/env bash
# One run of the paper-model study at its full length, timed: the GRU (the paper's slowest model:
# its README gives it at least 10x the CNN's wall time), regular data, seed 0, 8,000 steps, at
# nice 5 on a shared machine. Writes paper/timing.json (the run's own figures from its
# summary.json, the process's wall time, the machine's CPUs and load) for the README's estimate.
#   bash experiments/mnist1d/paper_timing.sh
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"   # a checkout without gradexp installed
cd "$repo/experiments/mnist1d"
run="$repo/outputs/mnist1d_paper_timing/$(date +%Y-%m-%d_%H-%M-%S)"
start=$(date +%s.%N)
nice -n 5 python -m gradexp.train --config-dir paper_conf +experiment=mnist1d_paper \
    model=paper_gru seed=0 hydra.run.dir="$run"
end=$(date +%s.%N)
python - "$run" "$start" "$end" <<'PY'
import json, os, sys

run, start, end = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
summary = json.load(open(os.path.join(run, "summary.json")))
record = {key: summary[key] for key in ("overrides", "status", "steps", "wall_time_s",
                                         "steps_per_s", "val_accuracy")}
record.update(process_wall_s=round(end - start, 2), nice=5, cpus=os.cpu_count(),
              load_average_1min=round(os.getloadavg()[0], 2))
with open("paper/timing.json", "w") as f:
    json.dump(record, f, indent=2)
    f.write("\n")
print(json.dumps(record, indent=2))
PY
