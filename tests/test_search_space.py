"""The search space of `hydra/sweeper=optuna` (gradexp/sweeps/search/space.py), read from
`hydra.sweeper` and the command line: what each kind of dimension becomes, the jobs of a trial
and of the space's corners, and the one line of each bad setting, here in this process."""

from __future__ import annotations

import math

import pytest
from omegaconf import OmegaConf

from gradexp.config import ConfigError
from gradexp.sweeps.search.space import Dimension, SearchSpace, from_config, is_search


def space(arguments=(), **sweeper):
    return from_config(OmegaConf.create({"_target_": "x.SearchSweeper", **sweeper}),
                       list(arguments))


def test_each_kind_of_dimension_with_its_bounds_scale_and_description():
    found = space(["clip=tag(log, interval(0.001, 10))", "model.width=range(8, 65, 8)",
                   "optimizer=choice(sgd, adam)", "+layer.x=range(1, 4)", "seed=0,1,2",
                   "trainer.steps=500"])
    clip, width, optimizer, x = found.dimensions
    assert clip == Dimension("clip", "float", 0.001, 10.0, 1, True)
    assert width == Dimension("model.width", "int", 8, 64, 8, False)  # 65 is not reached
    assert optimizer == Dimension("optimizer", "choice", choices=("sgd", "adam"))
    assert x.key == "+layer.x" and x.name == "layer.x" and (x.low, x.high) == (1, 3)
    assert found.seeds == ["0", "1", "2"] and found.fixed == ["trainer.steps=500"]
    assert [d.describe() for d in found.dimensions] == [
        "clip in [0.001, 10] (log scale)", "model.width in [8, 64] (linear scale, step 8)",
        "optimizer in {sgd, adam}", "layer.x in [1, 3] (linear scale)"]
    assert found.describe() == (
        "20 trials of clip in [0.001, 10] (log scale); model.width in [8, 64] (linear scale, "
        "step 8); optimizer in {sgd, adam}; layer.x in [1, 3] (linear scale), each over seeds "
        "0, 1, 2; objective final_loss (lower is better; a diverged run ranks last)")
    assert (found.n_trials, found.n_jobs, found.objective, found.sampler, found.sampler_seed,
            found.enqueue) == (20, 1, "final_loss", "tpe", 0, [])


def test_the_command_line_replaces_the_configs_params_key_by_key_and_settings_are_read():
    found = space(["clip=interval(0.5, 1)"], params={"clip": "interval(0.1, 1)",
                                                      "model.width": "range(8, 17, 8)"},
                  n_trials=3, n_jobs=2, objective="val_loss", sampler="random", sampler_seed=7,
                  enqueue=[{"clip": 0.7, "model.width": 16}])
    assert [(d.name, d.low, d.high) for d in found.dimensions] == [
        ("clip", 0.5, 1.0), ("model.width", 8, 16)]
    assert (found.n_trials, found.n_jobs, found.objective, found.sampler, found.sampler_seed,
            found.enqueue) == (3, 2, "val_loss", "random", 7, [{"clip": 0.7, "model.width": 16}])
    assert found.seeds == [] and found.describe().endswith(
        ", each over one seed; objective val_loss (lower is better; a diverged run ranks last)")


def test_a_trials_jobs_and_the_corners_of_the_space():
    found = space(["clip=interval(0.1, 1)", "optimizer=sgd,adam", "seed=0,1", "trainer.steps=5"],
                  enqueue=[{"clip": 100, "optimizer": "adam"}])
    assert found.jobs({"clip": 0.30000000000000004, "optimizer": "sgd"}) == [
        ["trainer.steps=5", "clip=0.30000000000000004", "optimizer=sgd", "seed=0"],
        ["trainer.steps=5", "clip=0.30000000000000004", "optimizer=sgd", "seed=1"]]
    corners = found.corner_jobs()
    points = [job[1:3] for job in corners[::2]]  # each point's seed-0 job
    assert points == [["clip=0.1", "optimizer=sgd"], ["clip=0.1", "optimizer=adam"],
                      ["clip=1.0", "optimizer=sgd"], ["clip=1.0", "optimizer=adam"],
                      ["clip=100", "optimizer=adam"]]  # the enqueued point last
    assert [job[-1] for job in corners] == ["seed=0", "seed=1"] * 5
    one_seed = space(["clip=interval(0.1, 1)"])
    assert one_seed.jobs({"clip": 0.5}) == [["clip=0.5"]]  # no seed override: the config's


def test_an_enqueued_point_may_lie_outside_a_range_but_not_outside_a_choice():
    dims = {"clip": Dimension("clip", "float", 0.1, 1.0), "width": Dimension(
        "width", "int", 8, 16, 8), "opt": Dimension("opt", "choice", choices=("sgd", "adam"))}
    assert dims["clip"].contains(0.1) and dims["clip"].contains(1) and dims["clip"].contains(1.0)
    assert not dims["clip"].contains(1.01) and not dims["clip"].contains(0.09)
    assert not dims["clip"].contains("0.5")
    assert dims["opt"].contains("adam") and not dims["opt"].contains("lion")
    assert dims["width"].extremes() == [8, 16] and dims["opt"].extremes() == ["sgd", "adam"]
    assert space(["clip=interval(0.1, 1)"], enqueue=[{"clip": 100}]).enqueue == [{"clip": 100}]


@pytest.mark.parametrize("arguments, sweeper, message", [
    ([], {}, "hydra.sweeper.params: nothing to search; give a key a range, e.g. clip: "
             "tag(log, interval(0.001, 10))"),
    (["seed=0,1", "trainer.steps=5"], {}, "hydra.sweeper.params: nothing to search; give a key "
                                          "a range, e.g. clip: tag(log, interval(0.001, 10))"),
    (["clip=interval(0.1, 1)"], {"n_trial": 3},
     "hydra.sweeper.n_trial: no such setting of the search; allowed: n_trials, n_jobs, "
     "objective, sampler, sampler_seed, enqueue, params"),
    (["clip=interval(0.1, 1"], {},  # the parser's own first line
     "hydra.sweeper.params: no viable alternative at input 'interval(0.1, 1'"),
    (["opt=glob(*)"], {}, "opt=glob(*): not a search dimension; use interval(low, high), "
                          "range(low, high[, step]) or a choice a,b,c"),
    (["clip=tag(linear, interval(0.1, 1))"], {},
     "clip=tag(linear, interval(0.1, 1)): unknown tag 'linear'; allowed: log"),
    (["opt=tag(log, choice(a, b))"], {},
     "opt=tag(log, choice(a, b)): a choice has no scale; tag(log, ...) takes an interval or a "
     "range"),
    (["opt=choice(a, a)"], {}, "opt=choice(a, a): a choice needs at least two different values"),
    (["w=range(0.5, 4)"], {},
     "w=range(0.5, 4): a range searches integers; search a float with interval(low, high)"),
    (["clip=interval(1, 1)"], {}, "clip=interval(1, 1): needs finite bounds with low < high"),
    (["clip=interval(2, 1)"], {}, "clip=interval(2, 1): needs finite bounds with low < high"),
    (["clip=interval(0, inf)"], {}, "clip=interval(0, inf): needs finite bounds with low < high"),
    (["clip=tag(log, interval(0, 1))"], {},
     "clip=tag(log, interval(0, 1)): a log scale needs a positive low bound (got 0)"),
    (["w=tag(log, range(1, 9, 2))"], {},
     "w=tag(log, range(1, 9, 2)): a log-scale range takes step 1 only"),
    (["clip=interval(0.1, 1)"], {"n_trials": 0},
     "hydra.sweeper.n_trials=0: must be a positive integer"),
    (["clip=interval(0.1, 1)"], {"n_jobs": True},
     "hydra.sweeper.n_jobs=True: must be a positive integer"),
    (["clip=interval(0.1, 1)"], {"n_jobs": 1.5},
     "hydra.sweeper.n_jobs=1.5: must be a positive integer"),
    (["clip=interval(0.1, 1)"], {"objective": "loss"},
     "hydra.sweeper.objective=loss: choose one of final_loss, val_loss"),
    (["clip=interval(0.1, 1)"], {"sampler": "grid"},
     "hydra.sweeper.sampler=grid: choose one of tpe, random"),
    (["clip=interval(0.1, 1)", "opt=a,b"], {"enqueue": [{"clip": 0.5}]},
     "hydra.sweeper.enqueue[0]={'clip': 0.5}: give a value of each searched key (clip, opt)"),
    (["clip=interval(0.1, 1)"], {"enqueue": [{"clip": 0.5}, 0.5]},
     "hydra.sweeper.enqueue[1]=0.5: give a value of each searched key (clip)"),
    (["clip=interval(0.1, 1)", "opt=a,b"], {"enqueue": [{"clip": 0.5, "opt": "c"}]},
     "hydra.sweeper.enqueue[0].opt=c: not a value of opt in {a, b}"),
    (["clip=interval(0.1, 1)"], {"enqueue": [{"clip": "big"}]},
     "hydra.sweeper.enqueue[0].clip=big: not a value of clip in [0.1, 1] (linear scale)"),
    (["clip=interval(0.1, 1)"], {"enqueue": [{"clip": True}]},
     "hydra.sweeper.enqueue[0].clip=True: not a value of clip in [0.1, 1] (linear scale)"),
    (["clip=interval(0.1, 1)"], {"enqueue": [{"clip": math.inf}]},
     "hydra.sweeper.enqueue[0].clip=inf: not a value of clip in [0.1, 1] (linear scale)"),
])
def test_each_bad_setting_is_one_line_naming_it(arguments, sweeper, message):
    with pytest.raises(ConfigError) as error:
        space(arguments, **sweeper)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_a_search_is_known_by_its_sweepers_target():
    assert is_search(OmegaConf.create({"hydra": {"sweeper": {"_target_": "a.b.SearchSweeper"}}}))
    assert not is_search(OmegaConf.create({"hydra": {"sweeper": {"_target_": "a.BasicSweeper"}}}))
    assert not is_search(OmegaConf.create({"hydra": {}}))


def test_a_float_is_written_in_full_and_anything_else_as_it_prints():
    found = SearchSpace([Dimension("a", "float", 0.0, 1.0), Dimension("b", "choice",
                                                                      choices=("x", "y"))], [])
    assert found.jobs({"a": 1 / 3, "b": "x"}) == [["a=0.3333333333333333", "b=x"]]
    assert found.jobs({"a": 1e-20, "b": 5}) == [["a=1e-20", "b=5"]]


def test_optuna_is_given_the_sampler_and_the_distributions_the_space_says():
    """Each dimension as Optuna's distribution (log scale and int step kept); sampler=random is
    Optuna's RandomSampler, tpe its TPESampler, each seeded with sampler_seed: the seeded
    sampler's first point is the one Optuna's own sampler of that seed draws."""
    import optuna

    from gradexp.sweeps.search.sweeper import _distribution, _sampler

    found = space(["clip=tag(log, interval(0.001, 10))", "model.width=range(8, 65, 8)",
                   "+layer.x=tag(log, range(1, 9))", "optimizer=choice(sgd, adam)"])
    assert [_distribution(optuna, d) for d in found.dimensions] == [
        optuna.distributions.FloatDistribution(0.001, 10.0, log=True),
        optuna.distributions.IntDistribution(8, 64, step=8),
        optuna.distributions.IntDistribution(1, 8, log=True),
        optuna.distributions.CategoricalDistribution(("sgd", "adam"))]

    def first_point(sampler) -> dict:
        study = optuna.create_study(sampler=sampler)
        return study.ask({d.name: _distribution(optuna, d) for d in found.dimensions}).params

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for name, kind in (("random", optuna.samplers.RandomSampler),
                       ("tpe", optuna.samplers.TPESampler)):
        seeded = space(["clip=interval(0.1, 1)"], sampler=name, sampler_seed=3)
        assert type(_sampler(optuna, seeded)) is kind
    found = space(["clip=tag(log, interval(0.001, 10))", "optimizer=choice(sgd, adam)"],
                  sampler="random", sampler_seed=3)
    ours = first_point(_sampler(optuna, found))
    assert ours == first_point(optuna.samplers.RandomSampler(seed=3))
    assert ours != first_point(optuna.samplers.RandomSampler(seed=4))


def test_a_trial_is_logged_by_its_point_floats_to_four_digits():
    from gradexp.sweeps.search.sweeper import _point

    assert _point({"clip": 0.012345678, "model.width": 16, "optimizer": "adam"}) == (
        "clip=0.01235, model.width=16, optimizer=adam")


def test_the_configs_params_are_read_with_their_interpolations_resolved(monkeypatch):
    monkeypatch.setenv("GRADEXP_TEST_LOW", "0.25")
    found = space(params={"clip": "interval(${oc.env:GRADEXP_TEST_LOW}, 1)"})
    assert [(d.name, d.low, d.high) for d in found.dimensions] == [("clip", 0.25, 1.0)]
