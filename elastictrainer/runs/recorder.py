"""One run's record, for every driver: the command line's loop (runs/loop.py), `model.fit`
through ElasticCallback (fit/callback.py) and a tf.distribute run's chief.  It owns what a run
leaves behind for people and tools to read: config.json, summary.json (runlog.RunSummary),
TensorBoard events under the reference's tags, the reference's text file and the closing line.

Drivers hand it values: epoch records, the runtime's typed records (elastic.SelectionRecord,
elastic.Correction, the end result), the run's end.  It reads no driver's, runtime's or
trainer's state, so what a run reports is the same whichever loop trained it.
"""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

import dataclasses
import os

import numpy as np
import tensorflow as tf

from elastictrainer import runlog
from elastictrainer.method.schemes import SCHEMES
from elastictrainer.runs import board
from elastictrainer.machine import peak_rss_mb

# The run's end as the summary says it.
FINISHED, INTERRUPTED = "finished", "interrupted"


def new_summary(cfg, *, elastic, tensor_names, timing_table, steps_per_epoch,
                energy_source=None, skipped=()):
    """The summary a run starts with: what it trains and on what (`cfg`, a config.Config)."""
    summary = runlog.RunSummary(
        train_type=cfg.train_type, model=cfg.model_name, dataset=cfg.dataset_name,
        rho=cfg.rho if elastic else None, seed=cfg.seed, num_tensors=len(tensor_names),
        tensor_names=list(tensor_names), timing_table=timing_table,
        steps_per_epoch=steps_per_epoch, skipped_images=len(skipped),
        skipped_files=list(skipped[:100]), energy_source=energy_source)
    if elastic:
        summary.rho_feedback = cfg.rho_feedback
    return summary


class Recorder:
    """What one run writes (module docstring).

    out: the run directory; cfg: the run's config.Config (saved as config.json); summary: its
    runlog.RunSummary (new_summary, or a resumed run's); chief: whether this process writes
    (a multi-worker run's other workers write only their own record, finish_worker);
    where: how the closing line names the driver ("" for the command line, " in model.fit").
    """

    def __init__(self, out, cfg, summary, *, chief=True, where="", log=print):
        self.out, self.cfg, self.summary = out, cfg, summary
        self.chief, self.where, self.log = chief, where, log
        self.writer = None
        self._drawn = 0  # selections whose heat map TensorBoard has (board.py)

    # ------------------------------------------------------------------ the start
    def begin(self, resumed=False):
        """Open the TensorBoard writer and write the summary; a fresh run writes config.json."""
        if self.chief:
            os.makedirs(self.out, exist_ok=True)
            if not resumed:
                runlog.write_json(os.path.join(self.out, runlog.CONFIG_FILE),
                                  dataclasses.asdict(self.cfg))
        self.writer = (tf.summary.create_file_writer(self.out) if self.chief
                       else tf.summary.create_noop_writer())
        if self.chief and not resumed:  # TensorBoard's HParams and Text dashboards (board.py)
            cfg = self.cfg
            board.write_hparams(self.writer, board.hparams_of(cfg, SCHEMES[cfg.train_type].elastic),
                                cfg.run_name)
            board.write_config_text(self.writer, dataclasses.asdict(cfg))
        self._drawn = len(self.summary.selections)
        self.save()

    def resume(self, saved_summary, wall_time=None):
        """Continue from a checkpoint's summary (its status back to running); events written
        after `wall_time` (the checkpoint's) would repeat their steps, and are dropped."""
        self.summary = runlog.RunSummary.from_dict(dict(saved_summary, status="running",
                                                        error=None))
        if self.chief and wall_time is not None:
            runlog.truncate_events(self.out, wall_time)

    def plan(self, plan):
        """The elastic runtime's plan (elastic.Plan: forward floor, affordable tensors)."""
        self.summary.plan = dataclasses.asdict(plan) if plan is not None else None

    # ------------------------------------------------------------------ as it trains
    def scalars(self, step, values):
        """TensorBoard scalars {tag: value} at `step` (None values are left out)."""
        with self.writer.as_default():
            for tag, value in values.items():
                if value is not None:
                    tf.summary.scalar(tag, value, step=step)

    def elastic(self, records, corrections):
        """The runtime's selection records and corrections so far (elastic.SelectionRecord,
        elastic.Correction, or their dicts)."""
        self.summary.selections = [_as_dict(r) for r in records]
        self.summary.corrections = [_as_dict(c) for c in corrections]
        if len(self.summary.selections) > self._drawn:  # the heat map as it stands now
            self._drawn = board.write_selection_images(self.writer, self.summary.to_dict(),
                                                       self._drawn, self.cfg.interval)

    def set(self, **fields):
        """Summary fields a driver measures (energy, the prefix cache's statistics, ...)."""
        for key, value in fields.items():
            if not hasattr(self.summary, key):
                raise AttributeError(f"RunSummary has no field {key!r}")
            setattr(self.summary, key, value)

    def epoch(self, record, step, train_scalars=False):
        """A finished epoch (runlog.EpochRecord): kept in the summary, its test accuracy and
        loss (and, for drivers with no scalars of their own, its train ones) in TensorBoard."""
        values = {runlog.TEST_ACCURACY: record.test_accuracy, runlog.TEST_LOSS: record.test_loss,
                  runlog.ENERGY_JOULES: record.energy_j}
        if train_scalars:
            values.update({runlog.TRAIN_ACCURACY: record.train_accuracy,
                           runlog.TRAIN_LOSS: record.train_loss})
        self.scalars(step, values)
        self.summary.epochs.append(dataclasses.asdict(record))
        accuracies = [e["test_accuracy"] for e in self.summary.epochs
                      if e["test_accuracy"] is not None]
        self.summary.best_test_accuracy = max(accuracies) if accuracies else None
        self.summary.train_time_s = record.train_time_s
        self.save()

    def save(self):
        if self.chief:
            runlog.write_json(os.path.join(self.out, runlog.SUMMARY_FILE), self.summary.to_dict())

    def flush(self):
        if self.writer is not None:
            self.writer.flush()

    # ------------------------------------------------------------------ the end
    def finish(self, *, stopped, train_time_s, step, result=None, note=""):
        """The run's end: its status, the elastic runtime's end result (elastic.EndResult: its
        summary fields and closing words; None for a fixed scheme), summary.json, the
        reference's text file (--save_txt) and the closing line."""
        summary, cfg = self.summary, self.cfg
        self.flush()
        for key, value in (result.summary_fields() if result is not None else {}).items():
            setattr(summary, key, value)
        summary.status = INTERRUPTED if stopped else FINISHED
        summary.train_time_s = train_time_s
        summary.peak_rss_mb = peak_rss_mb()
        self.save()
        # the last heat map, the run-level metrics and the closing text (board.py)
        board.write_run_end(self.writer, summary.to_dict(), step, cfg.interval)
        self.flush()
        if self.chief and cfg.save_txt:
            best = max(summary.best_test_accuracy or 0.0, 0.0)
            np.savetxt(os.path.join(self.out, f"{cfg.run_name}.txt"),
                       [train_time_s / 3600, best])
        self.log(closing_line(cfg, summary, stopped, where=self.where, out=self.out,
                              note=note, elastic=result.closing if result is not None else ""))
        return summary.to_dict()

    def finish_worker(self, worker, ran, checksums, agree):
        """A multi-worker run's other worker: what it ran, for comparing with the chief's."""
        self.flush()
        name = worker.replace(" ", "")
        runlog.write_json(os.path.join(self.out, f"{name}.json"), {
            "worker": worker, "ran": ran, "replica_checksums": checksums,
            "replicas_agree": agree})
        self.log(f"{self.cfg.train_type} finished on {worker}; the chief writes the results "
                 f"to {self.out}")
        return dict(self.summary.to_dict(), ran=ran, replica_checksums=checksums,
                    replicas_agree=agree)

    def fail(self, status, error):
        """A run that dies says so: its status and the error, the finished epochs kept."""
        if self.summary.status == "running":
            self.summary.status = status
        self.summary.error = error
        self.summary.peak_rss_mb = peak_rss_mb()
        self.save()


def closing_line(cfg, summary, stopped, *, elastic="", where="", note="", out=""):
    """The one line a run ends with: the reference's (scheme, best accuracy, hours), energy
    where measured, then an elastic run's closing words (EndResult.closing: the step ratio
    asked and measured, the wall clock against full training's, what the economy chose)."""
    train_time = summary.train_time_s or 0.0
    best = max(summary.best_test_accuracy or 0.0, 0.0)
    spent = note
    if summary.energy_j is not None:
        spent += f", energy {summary.energy_j:.0f} J ({summary.energy_source})"
    if elastic:
        spent += f"; {elastic}"
    ended = (f"interrupted after {len(summary.epochs)} of {cfg.num_epochs} epochs (run the same "
             f"command again to continue)" if stopped else "finished")
    # None until an epoch is tested (Recorder.epoch): then not 0%, since nothing was measured
    accuracy = (f"best test accuracy {best:.2f}%" if summary.best_test_accuracy is not None
                else "no epoch tested yet")
    return (f"{cfg.train_type} {ended}{where}: {accuracy}, training time "
            f"{train_time / 3600:.4f} h ({train_time:.1f} s){spent}; results in {out}")


def _as_dict(record):
    if isinstance(record, dict):
        return record
    return record.to_dict() if hasattr(record, "to_dict") else dataclasses.asdict(record)
