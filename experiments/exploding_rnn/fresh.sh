#!/usr/bin/env bash
# The fresh-seed test that DECLARED.md names, committed before its runs: both sweeps of this study
# on the seeds 5-14 (170 runs of 4000 steps), their summaries into fresh/activation and
# fresh/params, then the declared test (fresh.py -> fresh/result.md).
#   bash experiments/exploding_rnn/fresh.sh              # two worker processes (WORKERS=2)
set -euo pipefail
cd "$(dirname "$0")/../.."
study=experiments/exploding_rnn
sweep="outputs/multirun/exploding_rnn_fresh/$(date +%Y-%m-%d_%H-%M-%S)"
parallel=(hydra/launcher=gradexp hydra.launcher.workers="${WORKERS:-2}")
seeds=seed=5,6,7,8,9,10,11,12,13,14
python -m gradexp.train -m +experiment=exploding_rnn "${parallel[@]}" "$seeds" \
    hydra.sweep.dir="$sweep/activation"
python -m gradexp.train -m +experiment=exploding_rnn_params "${parallel[@]}" "$seeds" \
    hydra.sweep.dir="$sweep/params"
summarize=(--target-loss 0.0167 --plots)   # as run.sh summarizes the first sweeps
python -m gradexp.summarize "$sweep/activation" --baseline clip=null "${summarize[@]}" \
    --out "$study/fresh/activation"
python -m gradexp.summarize "$sweep/params" --baseline clipping=none "${summarize[@]}" \
    --out "$study/fresh/params"
python "$study/fresh.py"
