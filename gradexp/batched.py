"""K runs of one structure trained in one compiled program: a sweep's runs that differ only in
their seed, clip bounds and learning rate, one dispatch per step for all of them.

Each run is set up as it would be alone (gradexp/train.py `start`: its directory, provenance,
seed, model and optimizer built with that seed's initial weights, logs). Their variables are
then stacked along a new first axis,

    S_i = stack_k(v_i of run k)         for every variable i of model and optimizer,

and one step — the first run's `step_body` (gradexp/step.py), traced once — runs for each k
in turn inside an XLA-compiled function (tf.map_fn: a loop in the compiled program, not K
dispatches), reading and writing run k's state through a keras.StatelessScope:
S[k] ← step(S[k], x_k, y_k), with x_k, y_k run k's own batch (on a CPU the K runs are split
into one part per core, each part such a function, the parts of a step run at once: `Batch`).
The stacked state is made from the first run as soon as it is set up, the step traced on
it, and XLA compiles it in a thread (`Batch.compile_ahead`: 1.1 s of C++) while the other
runs are set up; their values then replace the first's (`Batch.load`). A run that has
stopped (it diverged) is no longer computed and keeps its state. Evaluation and histograms
run the first run's functions on each run's state (the evaluations of all runs in one call: they
reach them at the same step); a checkpoint copies S[k] back into run k's own variables and
saves them as its own run would.

Each run computes with the shapes and operations of its separate run, so its numbers are the
separate run's bit for bit (tests/test_batched.py compares metrics.csv byte for byte). Mapping
with tf.vectorized_map instead (one batched matrix multiply for the K runs) was measured and
rejected: it changes the order of floating-point operations, and the default config amplifies
one float32 rounding at step 5 into final losses 25-250% apart by step 1000.

Runs that cannot share a step this way train one after another in this process instead
(gradexp/grouping.py's `why_separate`): parameter clipping with state (autoclip, zclip,
adagc), trainer.on_spike=skip, mixed precision, a distribution strategy, deterministic=true
(its promise is the separate run's program, so it gets that program), and model=cnn (not bit
for bit: NOT_BIT_EXACT).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial

from gradexp import train as training
from gradexp._tf import keras, tf
from gradexp.grouping import Job, why_separate
from gradexp.measures import diverged

log = logging.getLogger("gradexp")


def run_logger(job: Job) -> logging.Logger:
    """A logger writing to the run's own log file only (the console gets the batch's lines)."""
    logger = logging.getLogger(f"gradexp.batch.{job.run_dir}")
    logger.handlers.clear()
    handler = logging.FileHandler(job.run_dir / job.log_name)
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


class Batch:
    """The stacked state of K runs of one structure and the compiled functions on it:
    `train_steps(iterator, n, active)` -> (rows [steps, K, names], steps done per run),
    `evaluate(x_val, y_val)` -> {name: [K]} (every run's at once), `gradients(k, x, y)` and
    `sync(*ks)` (S[k] into run k's variables).

    On a CPU of C cores the K runs are stacked in parts of n = ceil(K / min(K, C)) runs,
    ceil(K / n) of them (the last padded with runs never computed), one compiled program each
    (traced once: the parts have one shape); the parts of a step are independent, and
    TensorFlow's executor runs them on its inter-op threads at once. One compiled program is
    one core's loop over its runs: on 2 cores two parts took a step of 10 runs in ~3/4 of the
    time. A GPU gets one part.
    """

    def __init__(self, template: training.Run, K: int):
        compiled = template.compiled
        self.template, self.names, self.K = compiled, list(compiled.names), K
        self.template_variables = run_variables(compiled)
        self.size = -(-K // parts_for(K, template.where))  # runs per part
        parts = -(-K // self.size)  # no part of padding only (33 runs, 32 cores: 17 of 2)
        self.parts = [[tf.Variable(tf.stack([v.value] * self.size), trainable=False,
                                   name=f"stacked_{p}_{i}")
                       for i, v in enumerate(self.template_variables)] for p in range(parts)]
        self.variables: list[list] = []  # each run's own, in run order: `load`
        t = template.cfg.trainer
        self.stop_at_divergence = t.on_divergence == "stop"
        self.step_part = tf.function(self._step_part, jit_compile=t.jit_compile,
                                     autograph=False)
        self.train_steps = tf.function(self._train_steps, autograph=False)
        self.evaluate = tf.function(self._evaluate_all, autograph=False)
        self.gradients = tf.function(self._gradients, autograph=False)

    def compile_ahead(self, template: training.Run) -> Future:
        """Trace a part's step here and call it once in a thread on the first part's state: XLA
        compiles it there (C++, without the GIL) while this thread sets up the other runs. The
        call returns a new state and writes none. `train_steps`, which calls that traced step,
        is traced here too, but made ready only once the runs are set up (`make_ready`)."""
        x, y = (tf.zeros([self.size, *spec.shape], spec.dtype)
                for spec in template.train_batches.element_spec)
        args = ([v.read_value() for v in self.parts[0]], x, y, tf.ones([self.size], tf.bool))
        # called from a function, as train_steps calls it (an eager call is another program)
        in_a_function = tf.function(lambda *args: self.step_part(*args), autograph=False)
        compiled = _in_a_thread(in_a_function.get_concrete_function(*args), *args)
        iterator = batch_iterator([template] * self.K)  # the element spec of the runs' streams
        active = tf.ones([self.K], tf.bool)
        self._warm = partial(self.train_steps.get_concrete_function(iterator, tf.constant(1),
                                                                    active), iterator)
        return compiled

    def make_ready(self, compiled: Future) -> Future:
        """Call the traced `train_steps` for no step in a thread, once the runs are set up: its
        program is made then (~0.25 s) while this thread loads the runs' values, and kept (each
        run's session and seeds clear TensorFlow's programs made before: clear_session and
        tf.random.set_seed do; XLA's compiled step survives). It reads and writes no state.
        The future is done when that call and the step's compile (`compiled`) are."""
        def ready():
            self._warm(tf.constant(0), tf.ones([self.K], tf.bool))
            compiled.result()

        return _in_a_thread(ready)

    def load(self, runs: list[training.Run]) -> None:
        """Stack the runs' own variables into the parts (run k in slot k, padding slots a copy
        of the last run's)."""
        self.variables = [run_variables(run.compiled) for run in runs]
        slots = [self.variables[min(k, self.K - 1)] for k in range(len(self.parts) * self.size)]
        for p, part in enumerate(self.parts):
            for i, stacked in enumerate(part):
                stacked.assign(tf.stack([vs[i].value
                                         for vs in slots[p * self.size:(p + 1) * self.size]]))

    def _scope(self, values):
        return keras.StatelessScope(list(zip(self.template_variables, values, strict=True)))

    def _step_part(self, values, x, y, active):
        """One step of a part's active runs: S[k] ← step(S[k], x_k, y_k); its new state and
        rows."""
        def step(values, x, y):
            with self._scope(values) as scope:
                m = self.template.step_body(x, y, scope)
                new = [scope.get_current_value(v) for v in self.template_variables]
            return new, tf.stack([m[k] for k in self.names])

        def one(args):  # a stopped run is not computed: its state and a row of NaN
            values, x, y, active = args
            return tf.cond(active, lambda: step(values, x, y),
                           lambda: (values, tf.fill([len(self.names)], float("nan"))))

        shapes = ([tf.TensorSpec(v.shape[1:], v.dtype) for v in values],
                  tf.TensorSpec([len(self.names)], tf.float32))
        return tf.map_fn(one, (values, x, y, active), fn_output_signature=shapes,
                         parallel_iterations=1)

    def _step_all(self, x, y, active):
        """One step of every active run, part by part (the parts independent of each other)."""
        pad = len(self.parts) * self.size - self.K  # padded slots: inactive, fed run 0's batch
        x, y = (tf.concat([t, tf.repeat(t[:1], pad, axis=0)], 0) if pad else t for t in (x, y))
        active = tf.concat([active, tf.zeros([pad], tf.bool)], 0)
        rows = []
        for p, stacked in enumerate(self.parts):
            at = slice(p * self.size, (p + 1) * self.size)
            new, r = self.step_part([v.read_value() for v in stacked], x[at], y[at], active[at])
            for v, n in zip(stacked, new, strict=True):
                v.assign(n)
            rows.append(r)
        return tf.concat(rows, 0)[:self.K]

    def _train_steps(self, iterator, n, active):
        """Up to n steps of the active runs; a run stops after a step that diverged, the call
        when none is left. (A tf.while_loop written out: AutoGraph's conversion of this loop
        and of what it calls took ~0.5 s of the first call.)"""
        loss, norm = self.names.index("loss/train"), self.names.index("grad_norm/global")

        def step(i, active, done, rows):
            x, y = iterator.get_next()
            r = self._step_all(x, y, active)
            done = tf.where(active, i + 1, done)
            if self.stop_at_divergence:
                active = active & ~diverged(r[:, loss], r[:, norm], 0.0,
                                            isfinite=tf.math.is_finite)
            return i + 1, active, done, rows.write(i, r)

        _, _, done, rows = tf.while_loop(
            lambda i, active, done, rows: (i < n) & tf.reduce_any(active), step,
            (tf.constant(0), active, tf.zeros_like(active, tf.int32),
             tf.TensorArray(tf.float32, size=0, dynamic_size=True)))
        return rows.stack(), done

    def _evaluate_all(self, x_val, y_val):
        """Every run's evaluation, the first run's evaluate on each run's state: a loop over
        each part's slots in one program, the parts independent (padding slots evaluated too)."""
        names = self.template.val_names

        def one(values):
            with self._scope(values):
                measured = self.template.evaluate.python_function(x_val, y_val)
            return [tf.cast(measured[name], tf.float32) for name in names]

        parts = [tf.map_fn(one, [v.read_value() for v in part], parallel_iterations=1,
                           fn_output_signature=[tf.TensorSpec([], tf.float32)] * len(names))
                 for part in self.parts]
        return {name: tf.concat([p[i] for p in parts], 0)[:self.K] for i, name in enumerate(names)}

    def _slice(self, k):
        """Run k's values in the stacked state (k a tensor; the parts' slots are in run order)."""
        return [tf.concat([part[i] for part in self.parts], 0)[k]
                for i in range(len(self.template_variables))]

    def _gradients(self, k, x, y):
        """Run k's gradients on (x, y), for its histograms: one run a call (mapped over the
        runs as the evaluation is, a transformer's gradients were 1 ulp off its own run's)."""
        with self._scope(self._slice(k)) as scope:
            return self.template.gradients.python_function(x, y, scope)

    def sync(self, *ks: int) -> None:
        """Copy runs ks' slices of the stacked state into their own variables (to checkpoint),
        through one host copy of each stacked variable of their parts (an eager slice per
        variable and run took ~7 ms a run)."""
        for p in sorted({k // self.size for k in ks}):
            values = [v.numpy() for v in self.parts[p]]
            for k in (k for k in ks if k // self.size == p):
                for own, value in zip(self.variables[k], values, strict=True):
                    own.assign(value[k % self.size])


def _in_a_thread(call, *args) -> Future:
    pool = ThreadPoolExecutor(1, thread_name_prefix="gradexp-compile")
    done = pool.submit(call, *args)
    pool.shutdown(wait=False)  # the thread ends with the call
    return done


def parts_for(runs: int, where: str) -> int:
    """Parts a batch is computed in: one per CPU core (at most one per run); one on a GPU."""
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(runs, cores or 1) if where == "cpu" else 1


def run_variables(compiled) -> list:
    """A run's state in a fixed order: the model's variables, then the optimizer's."""
    return [*compiled.model.variables, *compiled.optimizer.variables]


def train(jobs: list[Job]) -> list[dict]:
    """Train `jobs` (runs of one structure, see `group_key`) and return their summaries: as
    one batch when they can share a step, else one after another."""
    from gradexp import data

    reason = why_separate(jobs[0].cfg) if len(jobs) > 1 else "one run"
    if reason is not None:
        if len(jobs) > 1:
            log.info("%d runs train one after another: %s", len(jobs), reason)
        return [alone(job) for job in jobs]
    arrays = data.load(jobs[0].cfg.dataset)

    def start(k: int) -> training.Run:
        return training.start(jobs[k].cfg, jobs[k].run_dir, jobs[k].overrides, arrays=arrays,
                              free_memory=k == 0, recorded=jobs[k].provenance)

    runs = [start(0)]
    if runs[0].compiled.state_variables:  # a clipping method with state: autoclip, zclip, adagc
        log.info("%d runs train one after another: clipping=%s keeps state", len(jobs),
                 jobs[0].cfg.clipping.name)
        runs += [start(k) for k in range(1, len(jobs))]
        return [training.finish(run, training.loop(run)) for run in runs]
    batch = Batch(runs[0], len(jobs))
    compiled = batch.compile_ahead(runs[0])
    runs += [start(k) for k in range(1, len(jobs))]
    ready = batch.make_ready(compiled)
    batch.load(runs)
    loggers = [run_logger(job) for job in jobs]
    results = loop(batch, runs, loggers, ready)
    member = {"runs": len(runs), "first": str(runs[0].run_dir)}
    summaries = [training.finish(run, result, logger, batch={**member, "index": k})
                 for k, (run, result, logger) in enumerate(zip(runs, results, loggers,
                                                               strict=True))]
    for run, summary, logger in zip(runs, summaries, loggers, strict=True):
        log.info(training.final_line(summary, run.run_dir))
        for handler in logger.handlers:  # a sweep of many batches keeps no file open
            handler.close()
        logger.handlers.clear()
    return summaries


def alone(job: Job) -> dict:
    """One run trained on its own; a crash is recorded in its summary.json, as a sweep's."""
    from gradexp import rundir

    try:
        return training.train(job.cfg, job.run_dir, job.overrides)
    except Exception as exc:
        message = training.record_failure(exc, job.cfg, job.run_dir, job.overrides)
        log.error("run failed: %s (%s)", message or repr(exc), job.run_dir)
        return {"status": rundir.FAILED}


def batch_iterator(runs: list[training.Run]):
    """The runs' training streams as one: each element (x, y) stacks run k's batch at k."""
    return iter(stacked_stream([run.train_batches for run in runs]))


def stacked_stream(streams):
    """Datasets of (x, y) as one: each element stacks the k-th stream's (x, y) at k."""
    return (tf.data.Dataset.zip(tuple(streams))
            .map(lambda *pairs: tuple(tf.stack(part) for part in zip(*pairs, strict=True))))


def loop(batch: Batch, runs: list[training.Run], loggers: list[logging.Logger],
         ready: Future | None = None) -> list[training.LoopResult]:
    """train.loop for K runs at once: one compiled call advances every run still going, then
    each run's Tracker does its bookkeeping on its own rows."""
    from gradexp.checkpoints import stop_requests

    t, K = runs[0].cfg.trainer, len(runs)
    iterator = batch_iterator(runs)
    # the runs going reach an evaluation, histogram or checkpoint together: the first of them
    # to ask has it done for all (`for_all`), once per call; each takes its own part
    histogram_batches = training.HistogramBatches(stacked_stream(
        [run.histogram_batches for run in runs]))  # a stopped run's draws are never used
    done: dict = {}

    def for_all(what: str, do):
        if what not in done:
            done[what] = do()
        return done[what]

    def evaluate(k):  # on the first run's validation set: the runs' one dataset's
        measured = for_all("evaluate", lambda: {name: value.numpy() for name, value in
                                               batch.evaluate(*runs[0].validation).items()})
        return {name: values[k] for name, values in measured.items()}

    def gradients(k):
        x, y = for_all("histogram batches", lambda: next(histogram_batches))
        return batch.gradients(tf.constant(k), x[k], y[k])

    def save(k):
        def checkpoint(step):
            for_all("sync", lambda: batch.sync(*(j for j, tr in enumerate(trackers)
                                                 if tr.going() or j == k)))
            runs[k].state.save(step)
        return checkpoint

    trackers = [training.Tracker(t, batch.names, run.compiled.val_names, run.runlog, run.step,
                                 evaluate=partial(evaluate, k), gradients=partial(gradients, k),
                                 save=save(k), logger=loggers[k]) for k, run in enumerate(runs)]
    for run, logger in zip(runs, loggers, strict=True):
        logger.info("training %s on %s (%d steps, %s, one of a batch of %d) -> %s",
                    run.cfg.model.name, run.cfg.dataset.name, t.steps, run.where, K, run.run_dir)
    log.info("training %d runs as one batch: %s on %s (%d steps, %s, %d parts at once) -> %s ...",
             K, runs[0].cfg.model.name, runs[0].cfg.dataset.name, t.steps, runs[0].where,
             len(batch.parts), runs[0].run_dir)
    if ready is not None:
        ready.result()
    for tracker, logger in zip(trackers, loggers, strict=True):  # steps run from here
        logger.info("step %*d/%d  the batch's step is compiled and ready",
                    len(str(t.steps)), tracker.step, t.steps)
    with stop_requests() as stop:
        while stop.signal is None and any(tr.going() for tr in trackers):
            going = [tr.going() for tr in trackers]
            step = max(tr.step for tr, g in zip(trackers, going, strict=True) if g)
            n = training.steps_to_next_event(step, t)
            tick = time.perf_counter()
            rows, steps = batch.train_steps(iterator, tf.constant(n), tf.constant(going))
            rows, steps, seconds = rows.numpy(), steps.numpy(), time.perf_counter() - tick
            done.clear()
            for k, tracker in enumerate(trackers):
                if going[k]:
                    tracker.record(rows[:steps[k], k], seconds)
            log.info("%s  %d of %d runs going  %.0f steps/s per run", training.progress(
                step + len(rows), t.steps, rows[:, going].reshape(-1, len(batch.names)),
                batch.names, None, len(rows) / seconds).rsplit("  ", 1)[0],
                sum(tr.going() for tr in trackers), K, len(rows) / seconds)
    batch.sync(*range(K))
    return [tracker.result(stop.signal) for tracker in trackers]
