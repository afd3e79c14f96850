#!/usr/bin/env bash
# Regenerate this study: its 40-run sweep (outputs/multirun/digits_clip_scale/<time>/, about
# 3 minutes on 2 CPU cores), then the summary table and plots into this folder.
#   bash experiments/digits_clip_scale/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
sweep="outputs/multirun/digits_clip_scale/$(date +%Y-%m-%d_%H-%M-%S)"
python -m gradexp.train -m +experiment=digits_clip_scale hydra.sweep.dir="$sweep"
python -m gradexp.summarize "$sweep" --plots --out experiments/digits_clip_scale
