"""runs/board.py's numbers and text, from scripted summaries: what HParams and Text show."""
import numpy as np

from elastictrainer import config, runlog
from elastictrainer.elastic import SHORT_RUN
from elastictrainer.plotting import selection_image
from elastictrainer.runs import board


def summary(**over):
    base = {"train_type": "elastic_training", "model": "smallcnn", "dataset": "synthetic",
            "rho": 0.5, "num_tensors": 10, "status": "finished", "best_test_accuracy": 71.25,
            "train_time_s": 30.0, "wall_ratio": 0.55, "measured_ratio": 0.48,
            "corrections": [{}], "plan": {"forward_floor": 0.31},
            "epochs": [{}, {}, {}, {}],
            # 2 probe steps, 18 steps of 4 tensors, 1 timed full step, 19 steps of 6 tensors
            "ran": [[0, "probe", None], [2, "selection", [6, 7, 8, 9]], [20, "full", None],
                    [21, "selection", [4, 5, 6, 7, 8, 9]]],
            "selections": [
                {"step": 2, "epoch": 0.2, "reason": "interval", "mask": [0] * 6 + [1] * 4,
                 "predicted_ratio": 0.49, "measured_ratio": 0.47},
                {"step": 21, "epoch": 2.1, "reason": "interval", "mask": [0] * 4 + [1] * 6,
                 "predicted_ratio": 0.5, "measured_ratio": None}]}
    base.update(over)
    return base


def test_tensors_trained_is_the_mean_over_the_steps_that_updated_weights():
    s = summary()
    assert board.tensors_trained(s["ran"], 40, 10) == (18 * 4 + 19 * 6) / 37
    assert board.tensors_trained([[0, "selection", None]], 12, 10) == 10
    assert board.tensors_trained([[0, "probe", None]], 1, 10) is None


def test_run_metrics_of_an_elastic_run_and_of_full_training():
    elastic = board.run_metrics(summary(), 40)
    assert elastic == {runlog.BEST_ACCURACY: 71.25, runlog.TRAIN_TIME: 30.0,
                       runlog.TIME_OVER_FULL: 0.55, runlog.RUN_MEASURED_RATIO: 0.48,
                       runlog.TENSORS_TRAINED: (18 * 4 + 19 * 6) / 37}
    full = board.run_metrics(summary(train_type="full_training", rho=None, wall_ratio=None,
                                     measured_ratio=None, ran=[[0, "selection", list(range(10))]]),
                             40)
    assert full[runlog.TIME_OVER_FULL] == 1.0 and full[runlog.TENSORS_TRAINED] == 10
    assert runlog.RUN_MEASURED_RATIO not in full
    # the head only: its time against full training's is not known in the run
    head = board.run_metrics(summary(train_type="traditional_tl_training", rho=None,
                                     wall_ratio=None, measured_ratio=None,
                                     ran=[[0, "selection", [8, 9]]]), 40)
    assert runlog.TIME_OVER_FULL not in head and head[runlog.TENSORS_TRAINED] == 2


def test_the_closing_text_says_rho_asked_and_measured_wall_clock_and_tensors():
    s = summary()
    text = board.closing_text(s, board.run_metrics(s, 40))
    assert "ElasticTrainer (ρ=0.5) finished" in text and "71.25%" in text
    assert "asked 0.5, measured 0.480 (1 correction(s))" in text
    assert "0.55 of full training's, estimated in the run" in text
    assert f"{(18 * 4 + 19 * 6) / 37:.1f} of 10 per step" in text
    short = summary(selections=[dict(summary()["selections"][0], reason=SHORT_RUN)])
    assert "too short" in board.closing_text(short, board.run_metrics(short, 40))
    full = summary(train_type="full_training", rho=None, wall_ratio=None,
                   ran=[[0, "selection", None]])
    text = board.closing_text(full, board.run_metrics(full, 40))
    assert "no rho asked" in text and "1.00 of full training's." in text


def test_hparams_hold_rho_only_for_elastic_schemes():
    cfg = config.Config(rho=0.4, cache_frozen_prefix=True)
    assert board.hparams_of(cfg, elastic=True)["rho"] == 0.4
    fixed = board.hparams_of(cfg, elastic=False)
    assert "rho" not in fixed and fixed["cache_frozen_prefix"] is True
    assert set(fixed) == set(board.HPARAM_FIELDS) - {"rho"}


def test_the_heat_map_image_draws_each_selection_held_until_the_next():
    """selection_image: an RGB array whose dark share grows with the tensors trained."""
    few = selection_image(summary(selections=summary()["selections"][:1]), 4, 1.0)
    more = selection_image(summary(), 4, 1.0)
    assert few.dtype == np.uint8 and few.ndim == 3 and few.shape[2] == 3
    assert few.shape == more.shape
    dark = [(np.asarray(im).mean(axis=2) < 60).mean() for im in (few, more)]
    assert dark[1] > dark[0] > 0.02
