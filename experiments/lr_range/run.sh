#!/usr/bin/env bash
# Regenerate this study: 8 learning rates x 5 seeds for each of three settings (unclipped,
# clipping=global_norm at 40, the clip layer at ±0.1): 120 runs of the digits MLP in two sweeps
# of +experiment=lr_range under one folder, then the summary (max_stable_lr, final loss against
# the learning rate) into this folder.
#   bash experiments/lr_range/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
study=experiments/lr_range
sweep="outputs/multirun/lr_range/$(date +%Y-%m-%d_%H-%M-%S)"
# hydra/launcher=gradexp: the runs of one setting, whatever their learning rate and seed, train
# as batches of up to 32 (the learning rate is a variable of the optimizer, not program)
run() { python -m gradexp.train -m +experiment=lr_range hydra/launcher=gradexp "$@"; }
start=$SECONDS
run hydra.sweep.dir="$sweep/params" clipping=none,global_norm
run hydra.sweep.dir="$sweep/layer" clip=0.1
echo "sweeps: $((SECONDS - start)) s"
python -m gradexp.summarize "$sweep" --plots --out "$study"
