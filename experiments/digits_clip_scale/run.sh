#!/usr/bin/env bash
# Regenerate this study: its 40-run sweep (outputs/multirun/digits_clip_scale/<time>/; the runs of
# each layer.scale train as one batch, hydra/launcher=gradexp), then the summary table and plots
# into this folder.
#   bash experiments/digits_clip_scale/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
sweep="outputs/multirun/digits_clip_scale/$(date +%Y-%m-%d_%H-%M-%S)"
start=$SECONDS
python -m gradexp.train -m +experiment=digits_clip_scale hydra/launcher=gradexp \
    hydra.sweep.dir="$sweep"
echo "sweep: $((SECONDS - start)) s"
# target 0.5 (chance is ln 10 = 2.30): the default, the worst final loss of the unclipped runs
# that did not diverge, is a stalled run's 2.3, which every run reaches within a few steps
python -m gradexp.summarize "$sweep" --target-loss 0.5 --plots --out experiments/digits_clip_scale
