"""What ElasticCallback (callback.py) writes down at the end of each model.fit epoch beyond
Keras' own logs, and what a restart reads back: summary.json's record of the epoch, taken
from Keras' epoch logs, and the runtime's state (elastic_state.json).

Keras' BackupAndRestore restores the model and optimizer at the start of an epoch, but not
the elastic runtime (its selection, importance, closed loop and accounting), the run's
summary or the prefix cache's store.  So each epoch's end saves them beside the run's other
files, and a fit that begins at epoch e > 0 (a restart) resumes from the state saved at the
end of epoch e (a state saved at another epoch's end is not used).

A fit that begins at epoch 0 starts its run directory afresh: one that holds a finished run
is refused (its curves and events would mix with the new run's, as a second run of a script
with the same logdir would make them), and one an earlier fit left unfinished before its
first epoch ended (nothing to resume) loses that fit's events and state first.
"""
import glob
import json
import os

from elastictrainer import runlog
from elastictrainer.errors import UserError

STATE_FILE = "elastic_state.json"


def save_state(out, epoch, global_step, train_time, rt, summary, cache):
    """Write the state at the end of epoch `epoch` (counted from 1) in the run directory
    `out`: the runtime `rt`'s, the run's summary (runs.recorder's RunSummary) and the prefix
    cache's (None: no cache), whose files of earlier states then go."""
    runlog.write_json(os.path.join(out, STATE_FILE), {
        "epoch": epoch, "global_step": global_step, "train_time_s": train_time,
        "runtime": rt.state(), "summary": summary.to_dict(),
        "prefix_cache": None if cache is None else cache.state(global_step)})
    if cache is not None:  # one state is kept: the files of earlier ones go
        cache.kept([global_step])


def refuse_finished(out):
    """UserError when the run directory `out` holds a finished run (module doc)."""
    if runlog.run_status(out) == "finished":
        raise UserError(f"ElasticCallback: {out} already holds a finished run; pass another "
                        f"logdir, or remove it to run again")


def start_over(out, log):
    """Before a fit's epoch 0: the events and state an unfinished earlier fit left in `out`
    removed, said in one line (module doc)."""
    status = runlog.run_status(out)
    if status is None:
        return
    stale = glob.glob(os.path.join(out, "events.out.tfevents*"))
    stale += [p for p in [os.path.join(out, STATE_FILE)] if os.path.exists(p)]
    for path in stale:
        os.remove(path)
    log(f"ElasticCallback: starting {out} over: the fit that left it ({status}) ended before "
        f"its first epoch did, so there is nothing to resume")


def saved_state(out, epoch):
    """The state saved in `out` at the end of epoch `epoch` (a restart, as BackupAndRestore
    makes, begins there); None for a fresh start."""
    path = os.path.join(out, STATE_FILE)
    if epoch == 0 or not os.path.exists(path):
        return None
    with open(path) as f:
        state = json.load(f)
    return state if state.get("epoch") == epoch else None


def epoch_record(epoch, train_time, logs, rt):
    """summary.json's record of a model.fit epoch, from Keras' epoch logs: the validation
    accuracy (in %) and loss are its test ones, where fit has them."""
    def metric(prefix):
        for key, value in logs.items():
            name = key[len(prefix):] if key.startswith(prefix) else None
            if name and "acc" in name and (prefix or not key.startswith("val_")):
                return 100.0 * float(value)
        return None

    def value(key):
        return None if logs.get(key) is None else float(logs[key])

    selection = rt.selection
    return runlog.EpochRecord(
        epoch=epoch, train_time_s=train_time, test_accuracy=metric("val_"),
        test_loss=value("val_loss"), train_accuracy=metric(""), train_loss=value("loss"),
        selected=len(selection) if selection is not None else len(rt.mask or ()))
