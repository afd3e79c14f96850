#!/usr/bin/env bash
# The declared regime search (DECLARED.md): recurrent gain {1.0, 1.1, 1.2} x learning rate
# {0.05, 0.1}, plain SGD and SGD-C, seeds 0-4, 50,000 updates each (60 runs), then the summary
# and the declared rule's choice (choose.py -> search/choice.md). Written after the runs, from the
# command they recorded (.hydra/hydra.yaml): the sweep as it ran.
#   bash experiments/pascanu_adding/search/run.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
sweep=outputs/multirun/pascanu_search
python -m gradexp.train -m +experiment=pascanu_adding hydra/launcher=gradexp \
    hydra.launcher.workers="${WORKERS:-2}" hydra.sweep.dir="$sweep" \
    seed=0,1,2,3,4 clipping.max_norm=null,1.0 model.recurrent_gain=1.0,1.1,1.2 \
    optimizer.learning_rate=0.05,0.1 trainer.steps=50000
python -m gradexp.summarize "$sweep" --baseline clipping.max_norm=null \
    --out experiments/pascanu_adding/search
python experiments/pascanu_adding/choose.py experiments/pascanu_adding/search/runs.csv
