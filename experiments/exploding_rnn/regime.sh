#!/usr/bin/env bash
# The regime search behind this study's preset: the short probes, one run at a time, that chose
# T = 10, learning rate 0.001, 4000 steps (README, "How the regime was chosen"). 69 runs, about
# half an hour on 2 shared cores. Each probe is a sweep into
# outputs/multirun/exploding_rnn_regime/<time>/p<k>/; regime.py tabulates them into regime.md.
# Every probe states its sequence length and steps, so it composes the same run under the
# preset as it was when the probes ran (T = 50, 1000 steps, no streaming); the preset's own
# sweep keys (clip, layer.positions, seed) apply wherever a probe does not set them.
#   bash experiments/exploding_rnn/regime.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
root="outputs/multirun/exploding_rnn_regime/$(date +%Y-%m-%d_%H-%M-%S)"
probe() {  # probe <name> <overrides...>: streamed data and the success criterion in every probe
    local name=$1; shift
    python -m gradexp.train -m +experiment=exploding_rnn dataset.stream=true \
        dataset.error_threshold=0.04 trainer.log_every=100 trainer.histogram_every=0 \
        'hydra.sweeper.params={}' "$@" hydra.sweep.dir="$root/$name"
}
# p1: T = 20, unclipped, seed 0 (a single run, default logging)
python -m gradexp.train +experiment=exploding_rnn dataset.stream=true dataset.length=20 \
    dataset.error_threshold=0.04 trainer.steps=1000 trainer.eval_every=250 seed=0 \
    hydra.run.dir="$root/p1"
# p2: T = 20, the clip layer at 0.01 in the recurrence together with each parameter method
probe p2 dataset.length=20 trainer.steps=2000 trainer.eval_every=500 seed=0 clip=0.01 \
    'layer.positions=[rnn_1_state]' clipping=none,value,norm,global_norm
# p3, p4: T = 10, unclipped and the clip layer at 0.01 in the recurrence, three learning rates
probe p3 dataset.length=10 trainer.steps=4000 trainer.eval_every=500 seed=0 'clip=null,0.01' \
    'layer.positions=[rnn_1_state]'
probe p4 dataset.length=10 trainer.steps=5000 trainer.eval_every=500 seed=0 'clip=null,0.01' \
    'layer.positions=[rnn_1_state]' optimizer.learning_rate=0.0003,0.003
# p5: unclipped, seeds 1-4, T = 10 and 20 (both placements of the unclipped layer: the same model)
probe p5 dataset.length=10,20 trainer.steps=3000 trainer.eval_every=500 seed=1,2,3,4 clip=null
# p6: T = 10, the parameter methods, seed 0
probe p6 dataset.length=10 trainer.steps=4000 trainer.eval_every=500 seed=0 clip=null \
    'layer.positions=[rnn_1]' clipping=value,norm,global_norm,agc,autoclip
# p7: T = 20, unclipped at learning rate 0.0003, seeds 0-4
probe p7 dataset.length=20 trainer.steps=600 trainer.eval_every=300 seed=0,1,2,3,4 clip=null \
    'layer.positions=[rnn_1]' optimizer.learning_rate=0.0003
# p8: T = 20, the two norm methods for 5000 steps
probe p8 dataset.length=20 trainer.steps=5000 trainer.eval_every=500 seed=0 clip=null \
    'layer.positions=[rnn_1]' clipping=norm,global_norm
# p9: unclipped at learning rate 0.0005, T = 10 and 20, seeds 0-4
probe p9 dataset.length=10,20 trainer.steps=1000 trainer.eval_every=500 seed=0,1,2,3,4 \
    clip=null 'layer.positions=[rnn_1]' optimizer.learning_rate=0.0005
# p10: unclipped with recurrent gain 1.0, T = 10 and 20, seeds 0-4
probe p10 dataset.length=10,20 trainer.steps=300 trainer.eval_every=300 seed=0,1,2,3,4 \
    clip=null 'layer.positions=[rnn_1]' model.recurrent_gain=1.0
# p11: T = 10, the clip layer at 0.001, 0.1 and 1 at both placements, seed 0
probe p11 dataset.length=10 trainer.steps=4000 trainer.eval_every=500 seed=0 'clip=0.001,0.1,1' \
    'layer.positions=[rnn_1],[rnn_1_state]'
# p12: T = 10, the clip layer at 0.1 in the recurrence, unrolled or not (speed; twice each)
probe p12 dataset.length=10 trainer.steps=1500 seed=0 clip=0.1 'layer.positions=[rnn_1_state]' \
    model.unroll=false,true,false,true
python experiments/exploding_rnn/regime.py "$root"
