#!/usr/bin/env bash
# The declared test (DECLARED.md): the regime the search chose (recurrent gain 1.2, learning
# rate 0.1), plain SGD and SGD-C, the fresh seeds 20-39, 200,000 updates each (40 runs); then the
# summary, the exact one-sided McNemar test (mcnemar.py -> test/result.md), each run's error
# rates (per_seed.py -> test/per_seed.csv) and the README's generated blocks (report.py).
# Written after the runs, from the command they recorded (.hydra/hydra.yaml): the sweep as it ran.
#   bash experiments/pascanu_adding/test/run.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
study=experiments/pascanu_adding
sweep=outputs/multirun/pascanu_test
python -m gradexp.train -m +experiment=pascanu_adding hydra/launcher=gradexp \
    hydra.launcher.workers="${WORKERS:-2}" hydra.sweep.dir="$sweep" \
    seed="$(seq -s, 20 39)" clipping.max_norm=null,1.0 model.recurrent_gain=1.2 \
    optimizer.learning_rate=0.1 trainer.steps=200000
python -m gradexp.summarize "$sweep" --baseline clipping.max_norm=null --out "$study/test"
python "$study/mcnemar.py" "$study/test/runs.csv"
python "$study/per_seed.py" "$sweep" "$study/test/per_seed.csv"
python "$study/report.py"
