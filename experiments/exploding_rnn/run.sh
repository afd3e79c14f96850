#!/usr/bin/env bash
# Regenerate this study: two sweeps of the same unstable RNN (85 runs, about 12 minutes on 2
# CPU cores) into outputs/multirun/exploding_rnn/<time>/{activation,params}/, then one summary per
# sweep into this folder's activation/ and params/, each against its own unclipped group:
#   activation  clip layer bound x placement    baseline clip=null      (+experiment=exploding_rnn)
#   params      parameter-gradient methods      baseline clipping=none  (+experiment=exploding_rnn_params)
# (A summary of both sweeps at once keeps two unclipped groups, one per layer.positions value,
# although an unclipped layer at either place is the same model.) Last, table.py checks that
# the unclipped copies are identical and puts every setting of both sweeps into table.md
# against the one unclipped group.
#   bash experiments/exploding_rnn/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
study=experiments/exploding_rnn
sweep="outputs/multirun/exploding_rnn/$(date +%Y-%m-%d_%H-%M-%S)"
parallel=(hydra/launcher=joblib hydra.launcher.n_jobs=2)
python -m gradexp.train -m +experiment=exploding_rnn "${parallel[@]}" \
    hydra.sweep.dir="$sweep/activation"
python -m gradexp.train -m +experiment=exploding_rnn_params "${parallel[@]}" \
    hydra.sweep.dir="$sweep/params"
# target 0.2: a little above 2/12 = 0.167, the error of always predicting the mean sum (1); the
# default target, the worst unclipped final loss, is a pre-divergence loss of 1e3 or more here
summarize=(--target-loss 0.2 --plots)
python -m gradexp.summarize "$sweep/activation" --baseline clip=null "${summarize[@]}" \
    --out "$study/activation"
python -m gradexp.summarize "$sweep/params" --baseline clipping=none "${summarize[@]}" \
    --out "$study/params"
python experiments/exploding_rnn/table.py "$sweep"
