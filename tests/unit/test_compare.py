"""compare.py: the table's accuracy of a run's last epochs, and which finished runs it reads."""
import dataclasses
import json

import pytest

from elastictrainer import Config, runlog
from elastictrainer.experiments import compare, recorded


@pytest.mark.parametrize("epochs,expected", [([], None), ([70.0], 70.0),
                                             ([10.0, 50.0, 60.0, 70.0], 60.0)])
def test_last_epochs_accuracy(epochs, expected):
    summary = {"epochs": [{"test_accuracy": a} for a in epochs]}
    assert compare.last_epochs_accuracy(summary) == expected


def test_a_finished_run_is_read_only_when_it_ran_with_the_same_settings(tmp_path):
    """Runs finished before with the same settings are read, not trained again; asked for
    another --rho under the same --run_name, compare reads full training (which --rho does
    not change) and refuses the elastic run in one line rather than show the old run's row as
    the new one's."""
    cfg = Config(model_name="smallcnn", dataset_name="synthetic", rho=0.5, run_name="cmp",
                 logdir=str(tmp_path))
    for kind in ("full_training", "elastic_training"):
        run = dataclasses.replace(cfg, train_type=kind, run_name=f"cmp_{kind}")
        out = tmp_path / run.run_name
        out.mkdir()
        (out / runlog.CONFIG_FILE).write_text(json.dumps(dataclasses.asdict(run)))
        (out / runlog.SUMMARY_FILE).write_text(json.dumps({"status": "finished",
                                                           "train_type": kind}))
    rows = compare.compare(cfg, ["full_training", "elastic_training"], log=lambda m: None)
    assert [r["train_type"] for r in rows] == ["full_training", "elastic_training"]
    with pytest.raises(recorded.OtherSettings, match=r"cmp_elastic_training holds a finished "
                                                     r"run with --rho 0.5, not 0.4: pass "
                                                     r"another --run_name, or --resume false"):
        compare.compare(dataclasses.replace(cfg, rho=0.4), ["full_training", "elastic_training"],
                        log=lambda m: None)


def test_the_table_says_what_a_runs_first_profiling_took_beside_its_training_time():
    def row(kind, rho, seconds, **kw):
        return {"train_type": kind, "rho": rho, "best_test_accuracy": 80.0, "epochs": [],
                "train_time_s": seconds, "measured_ratio": None, "num_tensors": 10, **kw}

    rows = [row("full_training", None, 100.0),
            row("elastic_training", 0.5, 60.0, profiling_s=12.34, profiling_in_train_time=False)]
    text = compare.table(rows)
    assert text.splitlines()[3].split("|")[6].strip() == "0.60"  # training time alone
    assert text.endswith("Training time leaves out the timing table's first profiling "
                         "(ElasticTrainer: 12.3 s); each run's closing line gives its wall "
                         "clock against full training's with it.")
    rows[1]["profiling_s"] = 0.0  # the table read: nothing to say
    assert compare.table(rows).splitlines()[-1].startswith("| ElasticTrainer |")

