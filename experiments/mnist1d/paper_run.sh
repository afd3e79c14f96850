#!/usr/bin/env bash
# MNIST-1D with the paper's own models, run the way a user runs a model of their own
# (model=keras, here through paper_conf/: paper_models.py, paper_data.py): the four models x
# {regular, spatially shuffled} data x seeds 0-4 = 40 runs of 8,000 steps (each setting's five
# seeds train as one batch), validated on 400 sequences split from the training set, and the
# final weights evaluated once, after the last step, on the package's 1,000 test sequences
# (trainer.test; nothing reads them during training); then the summary (each model's shuffled
# data against its regular data, unpaired) and paper_table.py into paper/.
#   bash experiments/mnist1d/paper_run.sh              # two worker processes (WORKERS=2)
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"   # a checkout without gradexp installed
cd "$repo/experiments/mnist1d"
sweep="$repo/outputs/multirun/mnist1d_paper/$(date +%Y-%m-%d_%H-%M-%S)"
start=$SECONDS
python -m gradexp.train -m --config-dir paper_conf +experiment=mnist1d_paper \
    model=paper_logistic,paper_mlp,paper_cnn,paper_gru dataset.kwargs.shuffle=false,true \
    seed=0,1,2,3,4 hydra/launcher=gradexp hydra.launcher.workers="${WORKERS:-2}" \
    hydra.sweep.dir="$sweep"
echo "sweep: $((SECONDS - start)) s"
python -m gradexp.summarize "$sweep" --baseline dataset.kwargs.shuffle=false --plots --out paper
python paper_table.py
