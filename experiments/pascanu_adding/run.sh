#!/usr/bin/env bash
# Regenerate this study: plain SGD and SGD-C (gradient-norm clipping at 1) on Pascanu et al.'s
# adding problem, 10 seeds x 100,000 updates (+experiment=pascanu_adding; the 10 seeds of each
# method train as one batch, hydra/launcher=gradexp, the two batches at once), then the summary
# (success rate with exact intervals, paired sign test, curves) into this folder.
#   bash experiments/pascanu_adding/run.sh            # seeds 0-9, as the preset
#   SEEDS=10,11,12,13,14,15,16,17,18,19 OUT=experiments/pascanu_adding/unseen \
#       bash experiments/pascanu_adding/run.sh      # other seeds, summarized into OUT
#   STEPS=200000 SEEDS=10,…,19 OUT=experiments/pascanu_adding/unseen_200k \
#       bash experiments/pascanu_adding/run.sh      # a longer budget (trainer.steps)
set -euo pipefail
cd "$(dirname "$0")/../.."
study="${OUT:-experiments/pascanu_adding}"
sweep="outputs/multirun/pascanu_adding/$(date +%Y-%m-%d_%H-%M-%S)"
python -m gradexp.train -m +experiment=pascanu_adding hydra/launcher=gradexp \
    hydra.launcher.workers="${WORKERS:-2}" hydra.sweep.dir="$sweep" \
    seed="${SEEDS:-0,1,2,3,4,5,6,7,8,9}" clipping.max_norm=null,1.0 \
    ${STEPS:+trainer.steps=$STEPS}
python -m gradexp.summarize "$sweep" --baseline clipping.max_norm=null --plots --out "$study"
# both seed ranges in one table (needs the summaries of 0-9 here and of 10-19 in unseen/)
if [ -f experiments/pascanu_adding/runs.csv ] && [ -f experiments/pascanu_adding/unseen/runs.csv ]; then
    python experiments/pascanu_adding/pooled.py
fi
