#!/usr/bin/env bash
# Regenerate this study: two sweeps of the same unstable RNN (85 runs of up to 4000 steps) into
# outputs/multirun/exploding_rnn/<time>/{activation,params}/, then one summary per sweep into
# this folder's activation/ and params/, each against its own unclipped group:
#   activation  clip layer bound x placement    baseline clip=null      (+experiment=exploding_rnn)
#   params      parameter-gradient methods      baseline clipping=none  (+experiment=exploding_rnn_params)
# (A summary of both sweeps at once keeps two unclipped groups, one per layer.positions value,
# although an unclipped layer at either place is the same model.) Last, table.py checks that
# the unclipped copies are identical and puts every setting of both sweeps into table.md
# against the one unclipped group.
# The runs of each setting train as one batch (hydra/launcher=gradexp), two batches at a time:
#   bash experiments/exploding_rnn/run.sh               # two worker processes (WORKERS=2)
#   WORKERS=1 bash experiments/exploding_rnn/run.sh     # one, on a machine shared with other work
set -euo pipefail
cd "$(dirname "$0")/../.."
study=experiments/exploding_rnn
sweep="outputs/multirun/exploding_rnn/$(date +%Y-%m-%d_%H-%M-%S)"
parallel=(hydra/launcher=gradexp hydra.launcher.workers="${WORKERS:-2}")
start=$SECONDS
python -m gradexp.train -m +experiment=exploding_rnn "${parallel[@]}" \
    hydra.sweep.dir="$sweep/activation"
python -m gradexp.train -m +experiment=exploding_rnn_params "${parallel[@]}" \
    hydra.sweep.dir="$sweep/params"
echo "$((SECONDS - start)) ${WORKERS:-2}" > "$sweep/wall_time.txt"   # seconds, workers: table.md quotes them
# target 1/60: a tenth of 2/12, the error of always predicting the mean sum (1); the default
# target, the worst final loss of the unclipped runs that did not diverge, is undefined when
# every unclipped run diverges
summarize=(--target-loss 0.0167 --plots)
python -m gradexp.summarize "$sweep/activation" --baseline clip=null "${summarize[@]}" \
    --out "$study/activation"
python -m gradexp.summarize "$sweep/params" --baseline clipping=none "${summarize[@]}" \
    --out "$study/params"
python experiments/exploding_rnn/table.py "$sweep"
# skipping spiky steps instead of clipping (trainer.on_spike=skip), unclipped, at the default
# warm-up of the spike statistics (50 steps) and at 5: spikes/ (10 runs, under a minute each)
python -m gradexp.train -m +experiment=exploding_rnn "${parallel[@]}" \
    hydra.sweep.dir="$sweep/spikes" clip=null "layer.positions=[rnn_1]" \
    trainer.on_spike=skip trainer.spike_warmup=5,50
python -m gradexp.summarize "$sweep/spikes" --baseline trainer.spike_warmup=50 \
    --out "$study/spikes"
