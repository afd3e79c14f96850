"""K runs of one structure trained by one compiled program: a run alone is K = 1, a sweep's runs
that differ only in seed, clip bounds and learning rate K > 1 (`hydra/launcher=gradexp`).

A run's state is a value (gradexp/training/step.py `State`): alone, it lives in the run's own
variables; in a batch each variable i is stacked along a new first axis, S_i = stack_k(v_i of run
k), and the program steps each run in turn (tf.map_fn: a loop in the program, not K dispatches),
S[k] ← step(S[k], x_k, y_k) on run k's own batch; a run that diverged is no longer computed.
On a CPU the runs are split into one part per core, the parts of a call run at once.

One call (`train_steps`) trains up to `trainer.log_every` steps in a while loop (XLA under
trainer.jit_compile), its last step measuring the telemetry. Each run computes with its own
shapes and operations: a batch's numbers are its runs' alone, bit for bit.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial

from gradexp._tf import keras, tf
from gradexp.parts import data
from gradexp.runs.measures import diverged
from gradexp.training.step import State


def parts_for(runs: int, where: str) -> int:
    """Parts a batch is computed in: one per CPU core (at most one per run); one on a GPU."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(runs, cores or 1) if where == "cpu" else 1


def own_variables(run) -> list:
    """A run's state as variables, in State order: model, optimizer, carry."""
    return [*run.step.variables, *run.state.carry]


class Engine:
    """The compiled functions on K runs' state, traced on the first run, `run`:
    `train_steps(first_step, n, active)` -> (rows [n_max, K, names], steps done per run, the
    gradients of each run's last step); `evaluate(x_val, y_val)` -> {name: [K]}."""

    def __init__(self, run, K: int):
        step, t = run.step, run.cfg.trainer
        self.step, self.K, self.arrays = step, K, run.arrays
        self.names = list(step.names)
        self.batch_size, self.n_max = t.batch_size, t.log_every
        self.stop_at_divergence = t.on_divergence == "stop"
        self.strategy = run.strategy
        self.counts = (len(step.model.variables), len(step.variables))
        self.stacked = K > 1
        self.size = -(-K // parts_for(K, run.where)) if self.stacked else 1  # runs per part
        parts = -(-K // self.size)  # no part of padding only (33 runs, 32 cores: 17 of 2)
        self.slots = parts * self.size
        self.runs: list = [run]
        template = own_variables(run)
        self.parts = ([[tf.Variable(tf.stack([value] * self.size), trainable=False,
                                    name=f"stacked_{p}_{i}")
                        for i, value in enumerate(read(template))] for p in range(parts)]
                      if self.stacked else [template])
        self.seeds = tf.Variable([run.cfg.seed] * self.slots, dtype=tf.int64,
                                 trainable=False, name="seeds")
        self.params = step.model.trainable_variables
        distributed = self.strategy.num_replicas_in_sync > 1
        self.backward = tf.function(step.backward, jit_compile=t.jit_compile, autograph=False)
        # the whole call one XLA program, or TensorFlow's loop around an XLA-compiled step
        whole = t.jit_compile and not distributed and not (
            run.where == "cpu" and has_convolutions(step.model))
        self.part_steps = tf.function(self._part_steps, autograph=False, jit_compile=whole)
        self.compiled_step = {measure: tf.function(
            partial(self._one_step, measure=measure), autograph=False, jit_compile=True)
            for measure in (True, False)} if t.jit_compile and not (whole or distributed) else {}
        self.train_steps = tf.function(self._train_steps, autograph=False)
        self.evaluate = tf.function(self._evaluate, autograph=False)

    def compile_ahead(self) -> Future:
        """Call a part's program for no step in a thread, so that XLA compiles it (C++, without
        the GIL) while this thread sets up the other runs; pure, it writes nothing. Called from
        a function, as `train_steps` calls it (called eagerly it is another program)."""
        x, y, indices = data.examples(self.arrays, tf.zeros([self.slots], tf.int64),
                                      self.batch_size, tf.constant(0, tf.int64), self.n_max)
        args = (read(self.parts[0]), x, y, indices[:self.size],
                tf.constant(0), tf.ones([self.size], tf.bool))
        in_a_function = tf.function(lambda *args: self.part_steps(*args), autograph=False)
        pool = ThreadPoolExecutor(1, thread_name_prefix="gradexp-compile")
        done = pool.submit(in_a_function.get_concrete_function(*args), *args)
        pool.shutdown(wait=False)  # the thread ends with the call
        return done

    # ------------------------------------------------------------------------------ state
    def load(self, runs: list) -> None:
        """The runs' state from their own variables (run k in slot k, padding: the last's)."""
        self.runs = list(runs)
        self.seeds.assign([runs[min(k, self.K - 1)].cfg.seed for k in range(self.slots)])
        if not self.stacked:
            return
        own = [own_variables(runs[min(k, self.K - 1)]) for k in range(self.slots)]
        for p, part in enumerate(self.parts):
            for i, stacked in enumerate(part):
                stacked.assign(tf.stack([tf.convert_to_tensor(vs[i]) for vs in own[p * self.size:
                                                                    (p + 1) * self.size]]))

    def sync(self, *ks: int) -> None:
        """Runs ks' state into their own variables (to checkpoint), one host copy a part."""
        if not self.stacked:
            return
        for p in sorted({k // self.size for k in ks}):
            values = [v.numpy() for v in self.parts[p]]
            for k in (k for k in ks if k // self.size == p):
                for own, value in zip(own_variables(self.runs[k]), values, strict=True):
                    own.assign(value[k % self.size])

    # ------------------------------------------------------------------------- training
    def _train_steps(self, first_step, n, active):
        """Up to n steps of the active runs from `first_step`, a call of `part_steps` a part."""
        active = tf.concat([active, tf.zeros([self.slots - self.K], tf.bool)], 0)  # padding: idle
        x, y, indices = data.examples(self.arrays, self.seeds, self.batch_size, first_step,
                                      self.n_max)
        results = []
        for p, part in enumerate(self.parts):
            at = slice(p * self.size, (p + 1) * self.size)
            new, *result = self.part_steps(read(part), x, y, indices[at], n, active[at])
            for v, value in zip(part, new, strict=True):
                v.assign(value)
            results.append(result)
        rows, done, grads = zip(*results, strict=True)
        grads = ([tf.concat(g, 0)[:self.K] for g in zip(*grads, strict=True)] if self.stacked
                 else grads[0])
        return tf.concat(rows, 1)[:, :self.K], tf.concat(done, 0)[:self.K], grads

    def _one_step(self, values, grads, x, y, active, measure: bool):
        """S[k] ← step(S[k], x[k], y[k]) for a part's active runs: the new state, its rows and
        (measuring) its gradients, else `grads` as they were."""
        def step(values, grads, x, y):
            new, row, new_grads = self._run_step(values, x, y, measure)
            return new, row, new_grads if measure else grads

        if not self.stacked:
            new, row, grads = step(values, grads, x[0], y[0])
            return new, row[None], grads
        if self.compiled_step:  # the runs written out, not a loop: see has_convolutions
            slots = [step([v[k] for v in values], [g[k] for g in grads], x[k], y[k])
                     for k in range(self.size)]

            def stacked(j, old):  # part j of every slot's result, a stopped run's as it was
                new = [tf.stack(t) for t in zip(*(r[j] for r in slots), strict=True)]
                return [tf.where(tf.reshape(active, [-1] + [1] * (n.shape.rank - 1)), n, o)
                        for n, o in zip(new, old, strict=True)]

            rows = tf.stack([r[1] for r in slots])
            return (stacked(0, values), tf.where(active[:, None], rows, float("nan")),
                    stacked(2, grads))

        def one(args):  # a stopped run is not computed: its state and a row of NaN
            values, grads, x, y, active = args
            return tf.cond(active, lambda: step(values, grads, x, y),
                           lambda: (values, tf.fill([len(self.names)], float("nan")), grads))

        shapes = ([tf.TensorSpec(v.shape[1:], v.dtype) for v in values],
                  tf.TensorSpec([len(self.names)], tf.float32),
                  [tf.TensorSpec(g.shape[1:], g.dtype) for g in grads])
        return tf.map_fn(one, (values, grads, x, y, active), fn_output_signature=shapes,
                         parallel_iterations=1)

    def _run_step(self, values, x, y, measure: bool):
        """One run's step on its values: (new values, row, gradients). Under a distribution
        strategy the replicas' forward and backward passes on their shares of the batch
        (XLA-compiled; the cross-replica sum cannot be) are summed, the update made once."""
        a, b = self.counts
        state = State(list(values[:a]), list(values[a:b]), list(values[b:]))
        if self.strategy.num_replicas_in_sync == 1:
            new, row, grads = self.step.train(state, x, y, measure)
        else:
            new, row, grads = self.step.update(state, self._replicated_backward(state, x, y),
                                               measure)
        return [*new.model, *new.optimizer, *new.carry], row, list(grads)

    def _replicated_backward(self, state, x, y):
        strategy = self.strategy
        share = self.batch_size // strategy.num_replicas_in_sync

        def split(t):
            return strategy.experimental_distribute_values_from_function(
                lambda ctx: t[ctx.replica_id_in_sync_group * share:
                              (ctx.replica_id_in_sync_group + 1) * share])

        def replica_backward(state, x, y):
            b = self.backward(state, x, y)
            sums = tf.distribute.get_replica_context().all_reduce(
                "SUM", (b.grads, b.stats, b.loss_sum))
            return b._replace(grads=sums[0], stats=sums[1], loss_sum=sums[2])

        return strategy.experimental_local_results(
            strategy.run(replica_backward, (state, split(x), split(y))))[0]

    def _still_active(self, active, rows):
        """`active` less the runs whose step diverged (measures.diverged, on the rows)."""
        if not self.stop_at_divergence:
            return active
        skipped = rows[:, self.names.index("skipped")] if "skipped" in self.names else 0.0
        return active & ~diverged(rows[:, self.names.index("loss/train")],
                                  rows[:, self.names.index("grad_norm/global")], skipped,
                                  isfinite=tf.math.is_finite)

    def _part_steps(self, values, x, y, indices, n, active):
        """The program: up to n steps of a part's runs (the last measuring the telemetry and
        keeping its gradients); (new values, rows, steps done, gradients)."""
        def body(i, values, grads, active, done, rows):
            batch = [tf.gather(t, indices[:, i]) for t in (x, y)]  # [runs, B, ...]

            def one_step(measure):  # (a compiled step's arguments are not its program: no i)
                step = self.compiled_step.get(measure, partial(self._one_step, measure=measure))
                return lambda: step(values, grads, *batch, active)

            values, r, grads = tf.cond(i == n - 1, one_step(True), one_step(False))
            done = tf.where(active, i + 1, done)
            return i + 1, values, grads, self._still_active(active, r), done, rows.write(i, r)

        lead = [self.size] if self.stacked else []
        _, values, grads, _, done, rows = tf.while_loop(
            lambda i, values, grads, active, done, rows: (i < n) & tf.reduce_any(active), body,
            (tf.constant(0), list(values), [tf.zeros([*lead, *v.shape], v.dtype)
                                            for v in self.params],
             active, tf.zeros_like(active, tf.int32),
             tf.TensorArray(tf.float32, size=self.n_max,
                            element_shape=[self.size, len(self.names)])))
        return values, rows.stack(), done, grads

    # ------------------------------------------------------------------------- evaluation
    def _evaluate(self, x_val, y_val):
        """Every run's evaluation: a loop over each part's slots in one program; a run alone
        without the loop, which for one slot only adds cost (most of it in the first call)."""
        names, models = self.step.val_names, self.counts[0]

        def one(values):
            measured = self.step.evaluate(values, x_val, y_val)
            return [measured[name] for name in names]

        parts = [tf.map_fn(one, read(part[:models]), parallel_iterations=1,
                           fn_output_signature=[tf.TensorSpec([], tf.float32)] * len(names))
                 if self.stacked else [m[None] for m in one(read(part[:models]))]
                 for part in self.parts]
        return {name: tf.concat([p[i] for p in parts], 0)[:self.K]
                for i, name in enumerate(names)}


def has_convolutions(model) -> bool:
    """Whether the model (or one inside it) has a convolution layer. XLA on a CPU rewrites a
    convolution into the form Eigen computes fast only outside a while loop, so such a model's
    step is compiled alone in TensorFlow's loop, and a batch's runs are written out in it."""
    convolutions = tuple(getattr(keras.layers, name) for name in dir(keras.layers)
                         if "Conv" in name)
    return any(isinstance(layer, convolutions) or (layer is not model and has_convolutions(
        layer)) for layer in getattr(model, "layers", []))


def read(variables: list) -> list:
    """The values of Keras's and TensorFlow's variables alike."""
    return [tf.convert_to_tensor(v) for v in variables]

