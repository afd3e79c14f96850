#!/usr/bin/env bash
# Regenerate this study: MNIST-1D's MLP, CNN and GRU presets x seeds 0-4 (15 runs, one sweep),
# then the summary and table.md (gradexp's test accuracies beside the paper's) into this folder.
#   bash experiments/mnist1d/run.sh            (each preset's 5 seeds train as one batch)
set -euo pipefail
cd "$(dirname "$0")/../.."
study=experiments/mnist1d
sweep="outputs/multirun/mnist1d/$(date +%Y-%m-%d_%H-%M-%S)"
start=$SECONDS
python -m gradexp.train -m "+experiment=mnist1d,mnist1d_cnn,mnist1d_gru" seed=0,1,2,3,4 \
    hydra/launcher=gradexp hydra.sweep.dir="$sweep"
echo "sweep: $((SECONDS - start)) s"
# no clipping here: the MLP's runs are the reference the other two are paired with, by seed
python -m gradexp.summarize "$sweep" --baseline experiment=mnist1d --plots --out "$study"
python "$study/table.py"
