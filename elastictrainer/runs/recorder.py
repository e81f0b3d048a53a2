"""What happens around the training loop (loop.py): summary.json, TensorBoard, checkpoints,
energy, Ctrl-C, and a run that dies saying why.  The loop calls these at the same few points
for every --train_type."""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

import contextlib
import dataclasses
import os
import signal
import time

import numpy as np
import tensorflow as tf

from elastictrainer import flavors, runlog
from elastictrainer.runs import board, energy
from elastictrainer.runs.checkpoint import RunCheckpoint
from elastictrainer.errors import RunError, one_line
from elastictrainer.machine import peak_rss_mb, release_memory
from elastictrainer.data.folder import first_undecodable
from elastictrainer.elastic import SHORT_RUN
from elastictrainer.runs.setup import get_random_state, set_random_state

# A testing hook, not a setting: see fault_at_step.
FAULT_AT_STEP_ENV = "ELASTICTRAINER_FAULT_AT_STEP"


def fault_at_step():
    """Testing hook: the global step before which the training process kills itself, or None.

    $ELASTICTRAINER_FAULT_AT_STEP=N makes the loop send itself SIGKILL as it is about to run
    global step N (counted from 0, so after N steps have run), as a power cut or the kernel's
    OOM killer would: nothing is flushed or saved.  The resume tests use it to interrupt a run
    at a known step instead of at a moment.  Unset or empty: no fault.  Read once per run, here.
    """
    value = os.environ.get(FAULT_AT_STEP_ENV, "").strip()
    return int(value) if value else None


def inject_fault(global_step, fault_step):
    """SIGKILL this process when `global_step` is the fault_at_step() step (testing hook)."""
    if fault_step is not None and global_step == fault_step:
        os.kill(os.getpid(), signal.SIGKILL)


@dataclasses.dataclass
class LoopState:
    """Where the loop is: what a checkpoint needs besides weights, optimizer and iterators."""
    selection: tuple = None
    epoch: int = 0  # epochs finished
    step_in_epoch: int = 0
    global_step: int = 0
    train_time: float = 0.0
    best: float = -1.0
    ep_loss: float = 0.0
    ep_correct: float = 0.0
    ep_seen: float = 0.0
    run_loss: float = 0.0
    run_correct: float = 0.0
    run_seen: float = 0.0
    last_checkpoint: float = 0.0
    # [global step, step kind, tensors] each time what a step runs changed: the record the
    # workers of a distributed run compare
    changes: list = dataclasses.field(default_factory=list)

    def __post_init__(self):
        if self.selection is not None:
            self.selection = tuple(int(k) for k in self.selection)

    @classmethod
    def from_dict(cls, data):
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def trained(self, kind, selection):
        """What the step about to be counted ran: its kind (elastic/runtime.py's) and the
        tensors it trained; kept where it changed (`changes`)."""
        entry = [kind, None if selection is None else [int(k) for k in selection]]
        if not self.changes or self.changes[-1][1:] != entry:
            self.changes.append([self.global_step] + entry)

    def add(self, loss, correct, b):
        """A trained batch of `b` examples: its mean loss and how many it classified right."""
        self.ep_loss += loss * b
        self.ep_correct += correct
        self.ep_seen += b
        self.run_loss += loss * b
        self.run_correct += correct
        self.run_seen += b
        self.global_step += 1
        self.step_in_epoch += 1

    def next_epoch(self):
        self.epoch += 1
        self.step_in_epoch = 0
        self.ep_loss = self.ep_correct = self.ep_seen = 0.0


class StopFlag:
    """Ctrl-C asks the loop to stop after the current step instead of killing it mid-write."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def __enter__(self):
        def handler(signum, frame):
            if self.requested:  # a second Ctrl-C stops at once
                raise KeyboardInterrupt
            self.requested = True
        try:
            self._previous = signal.signal(signal.SIGINT, handler)
        except ValueError:  # not the main thread
            self._previous = None
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        return False


class RunRecorder:
    """summary.json, TensorBoard events, checkpoints and the energy meter of one run."""

    def __init__(self, setup, iterators, elastic, clock, log):
        cfg, tr = setup.cfg, setup.trainer
        self.setup, self.cfg, self.elastic, self.clock, self.log = setup, cfg, elastic, clock, log
        self.out = setup.out
        dist = setup.dist
        # A multi-worker run's chief writes the summary, the events and the energy; every worker
        # saves a checkpoint (tf.distribute asks each to), the others into a directory they
        # drop, and every worker restores the chief's.
        self.chief = dist is None or dist.is_chief
        self.ckpt = RunCheckpoint(self.out, setup.model, tr.optimizer, iterators,
                                  write_dir=None if self.chief else os.path.join(
                                      self.out, f".{dist.worker.replace(' ', '')}"))
        self.meter = energy.detect(mode=cfg.energy if self.chief else "none")
        bundle = setup.bundle
        self.summary = runlog.RunSummary(
            train_type=cfg.train_type, model=cfg.model_name, dataset=cfg.dataset_name,
            rho=cfg.rho if setup.scheme.elastic else None, seed=cfg.seed,
            num_tensors=len(tr.variables), tensor_names=[flavors.tensor_name(v) for v in tr.variables],
            timing_table=setup.table_path, steps_per_epoch=setup.steps_per_epoch,
            skipped_images=len(bundle.skipped), skipped_files=list(bundle.skipped[:100]),
            energy_source=self.meter.source)
        if elastic:
            self.summary.rho_feedback = cfg.rho_feedback
        if bundle.skipped:
            shown = ", ".join(bundle.skipped[:3]) + (", ..." if len(bundle.skipped) > 3 else "")
            log(f"warning: skipped {len(bundle.skipped)} file(s) of {cfg.dataset_name} that "
                f"are not JPEG/PNG/GIF/BMP images: {shown}")
        self.writer = None
        self._steps = 0  # the run's steps so far, for the prefix cache's share
        self._drawn = 0  # selections whose heat map TensorBoard has (board.py)

    def start(self):
        """The loop state to begin from: a fresh one, or the latest checkpoint's."""
        cfg, setup = self.cfg, self.setup
        st = LoopState(selection=None if setup.scheme.elastic
                       else setup.scheme.fixed_selection(setup.roles))
        if not setup.resume:
            if self.chief:
                runlog.write_json(os.path.join(self.out, runlog.CONFIG_FILE),
                                  dataclasses.asdict(cfg))
        else:
            saved = self.ckpt.restore()
            st = LoopState.from_dict(saved["loop"])
            self.summary = runlog.RunSummary.from_dict(dict(saved["summary"], status="running",
                                                            error=None))
            set_random_state(setup.model, saved["random"])
            self.meter.restore(*saved["energy"])
            if self.elastic and self.elastic.rt is not None:
                self.elastic.rt.load_state(saved["elastic"])
            # events written after this checkpoint would repeat their steps: dropped
            if self.chief:
                runlog.truncate_events(self.out, saved["wall_time"])
            self.log(f"resuming {self.out} from {os.path.basename(self.ckpt.latest)}: epoch "
                     f"{st.epoch + 1} of {cfg.num_epochs}, step {st.step_in_epoch} of "
                     f"{setup.steps_per_epoch}, {st.train_time:.1f} s trained")
        self.writer = (tf.summary.create_file_writer(self.out) if self.chief
                       else tf.summary.create_noop_writer())
        if self.chief and not setup.resume:  # TensorBoard's HParams and Text (board.py)
            board.write_hparams(self.writer, board.hparams_of(cfg, setup.scheme.elastic),
                                cfg.run_name)
            board.write_config_text(self.writer, dataclasses.asdict(cfg))
        self._drawn = len(self.summary.selections)
        self.save_summary()
        st.last_checkpoint = self.clock()
        return st

    def save_summary(self):
        if not self.chief:
            return
        if self.elastic:
            rt = self.elastic.rt.s
            self.summary.selections, self.summary.corrections = rt.records, rt.corrections
            self._drawn = board.write_selection_images(self.writer, self.summary.to_dict(),
                                                       self._drawn, self.cfg.interval)
        if self.setup.prefix_cache is not None:
            self.summary.prefix_cache = self.setup.prefix_cache.summary(self._steps)
        runlog.write_json(os.path.join(self.out, runlog.SUMMARY_FILE), self.summary.to_dict())

    def checkpoint(self, st):
        self._steps = st.global_step
        self.save_summary()
        state = {"loop": dataclasses.asdict(st), "summary": self.summary.to_dict(),
                 "random": get_random_state(self.setup.model),
                 "energy": [self.meter.joules, self.meter.active_s],
                 "elastic": (self.elastic.rt.state()
                             if self.elastic and self.elastic.rt is not None else None),
                 "wall_time": time.time()}
        self.writer.flush()
        self.ckpt.save(state, st.global_step)
        st.last_checkpoint = self.clock()

    def checkpoint_due(self, st):
        every_s = self.cfg.checkpoint_minutes * 60
        return bool(every_s) and self.clock() - st.last_checkpoint >= every_s

    def train_scalars(self, st):
        """The reference's train scalars, every runlog.SCALAR_EVERY_STEPS steps."""
        if not st.run_seen:
            return
        tf.summary.scalar(runlog.TRAIN_ACCURACY, 100.0 * st.run_correct / st.run_seen,
                          step=st.global_step)
        tf.summary.scalar(runlog.TRAIN_LOSS, st.run_loss / st.run_seen, step=st.global_step)
        opt = self.setup.trainer.optimizer
        lr = opt.learning_rate
        lr = lr(opt.iterations) if callable(lr) else lr
        tf.summary.scalar(runlog.LEARNING_RATE, float(tf.convert_to_tensor(lr)), step=st.global_step)
        st.run_loss = st.run_correct = st.run_seen = 0.0

    def nan_loss(self, st, loss, epoch, partial_s):
        self.summary.status = "nan"
        self.meter.pause()
        self.summary.train_time_s = st.train_time + partial_s
        self.summary.energy_j, self.summary.avg_power_w = self.meter.joules, self.meter.avg_power_w
        self.save_summary()
        raise RunError(f"the loss became {loss} at epoch {epoch}, step {st.global_step}; try a "
                       f"lower --learning_rate")

    def end_epoch(self, st, epoch):
        """Evaluate, log and checkpoint a finished epoch."""
        cfg, tr = self.cfg, self.setup.trainer
        self.train_scalars(st)
        # the epoch's freed buffers back to the OS before the evaluation allocates its own (a
        # small device's memory is the run's peak, not the heap's free lists)
        release_memory()
        # every worker evaluates: reading BatchNorm's moving statistics (synced on read) is a
        # collective that all workers must join
        test_acc, test_loss = tr.evaluate(self.setup.bundle.test)
        tf.summary.scalar(runlog.TEST_ACCURACY, test_acc, step=st.global_step)
        tf.summary.scalar(runlog.TEST_LOSS, test_loss, step=st.global_step)
        if self.meter.joules is not None:
            tf.summary.scalar(runlog.ENERGY_JOULES, self.meter.joules, step=st.global_step)
        if test_acc > st.best:
            st.best = test_acc
            if cfg.save_model and self.chief:
                _save_weights_atomically(self.setup.model,
                                         os.path.join(self.out, runlog.BEST_WEIGHTS_FILE))
        selected = len(st.selection) if st.selection is not None else len(tr.variables)
        seen = max(st.ep_seen, 1)
        self.summary.epochs.append(dataclasses.asdict(runlog.EpochRecord(
            epoch=epoch, train_time_s=st.train_time, test_accuracy=test_acc,
            test_loss=test_loss, train_accuracy=100 * st.ep_correct / seen,
            train_loss=st.ep_loss / seen, selected=selected, energy_j=self.meter.joules)))
        self.summary.best_test_accuracy = st.best
        self.summary.train_time_s = st.train_time
        self.log(f"epoch {epoch}: train loss {st.ep_loss / seen:.4f}, test accuracy "
                 f"{test_acc:.2f}%, test loss {test_loss:.4f}, training time "
                 f"{st.train_time:.1f} s, {selected}/{len(tr.variables)} tensors trained")
        st.next_epoch()
        self.checkpoint(st)

    def finish(self, st, stopped, elastic_result):
        """The summary's last numbers, the reference's text file and the closing line."""
        cfg, summary = self.cfg, self.summary
        self.writer.flush()
        dist = self.setup.dist
        summary.ran = st.changes
        if dist is not None and dist.on:
            summary.replica_checksums, summary.replicas_agree = dist.checksums(
                self.setup.trainer.variables)
            if not summary.replicas_agree:
                self.log(f"warning: the replicas' weights differ at the end "
                         f"({summary.replica_checksums}): their updates diverged")
        if not self.chief:  # what this worker ran, for comparing with the chief's summary
            runlog.write_json(os.path.join(self.out, f"{dist.worker.replace(' ', '')}.json"), {
                "worker": dist.worker, "ran": st.changes,
                "replica_checksums": summary.replica_checksums,
                "replicas_agree": summary.replicas_agree})
            self.log(f"{cfg.train_type} finished on {dist.worker}; the chief writes the results "
                     f"to {self.out}")
            return summary.to_dict()
        if elastic_result:
            for key, value in elastic_result.items():
                setattr(summary, key, value)
        summary.status = "interrupted" if stopped else "finished"
        tr, dist = self.setup.trainer, self.setup.dist
        summary.step_cache_traces = tr.steps.traces
        if dist is not None and dist.on:
            summary.strategy, summary.replicas = cfg.strategy, dist.num_replicas
            summary.full_allreduce_bytes_per_step = float(sum(
                v.shape.num_elements() * v.dtype.size for v in tr.variables))
            if tr.steps_run:
                summary.allreduce_bytes_per_step = tr.allreduce_bytes / tr.steps_run
        summary.peak_rss_mb = peak_rss_mb()
        self._steps = st.global_step
        self.save_summary()
        board.write_run_end(self.writer, summary.to_dict(), st.global_step, cfg.interval)
        train_time, best = st.train_time, max(st.best, 0.0)
        hours = train_time / 3600
        if cfg.save_txt:
            np.savetxt(os.path.join(self.out, f"{cfg.run_name}.txt"), [hours, best])
        spent = (f", energy {self.meter.joules:.0f} J ({self.meter.source})"
                 if self.meter.joules is not None else "")
        if elastic_result and all(r["reason"] == SHORT_RUN for r in summary.selections):
            spent += ("; every tensor trained, as in full training: the run was too short to "
                      "pay for compiling a selection's step (--economy false to select anyway)")
        elif elastic_result:
            measured, wall = summary.measured_ratio, summary.wall_ratio
            spent += (f"; step-time ratio asked {cfg.rho:g}, measured "
                      f"{'n/a' if measured is None else f'{measured:.3f}'}"
                      f" ({len(summary.corrections)} correction(s)); wall clock "
                      f"{'n/a' if wall is None else f'{wall:.2f}'} of full training's, "
                      f"estimated in the run (re-selecting {summary.reselection_overhead_s:.1f} "
                      f"s, {100 * summary.reselection_overhead_s / max(train_time, 1e-9):.0f}% "
                      f"of training)")
        ended = (f"interrupted after {len(summary.epochs)} of {cfg.num_epochs} epochs (run "
                 f"the same command again to continue)" if stopped else "finished")
        self.log(f"{cfg.train_type} {ended}: best test accuracy {best:.2f}%, training time "
                 f"{hours:.4f} h ({train_time:.1f} s){spent}; results in {self.out}")
        return summary.to_dict()

    @contextlib.contextmanager
    def outcome_recorded(self):
        """A run that dies says so in summary.json (status failed and the error, the finished
        epochs kept); TensorFlow's own errors become one line, naming the file that does not
        decode when one of the dataset's files is to blame."""
        summary, files = self.summary, self.setup.bundle.files
        try:
            yield
        except BaseException as e:
            summary = self.summary
            if summary.status == "running":
                summary.status = "interrupted" if isinstance(e, KeyboardInterrupt) else "failed"
            message = one_line(e)
            dist = self.setup.dist
            lost = (dist is not None and dist.multi_worker and isinstance(
                e, (tf.errors.UnavailableError, tf.errors.CancelledError,
                    tf.errors.AbortedError, tf.errors.DeadlineExceededError)))
            if lost:
                message = (f"a worker of the cluster was lost ({type(e).__name__}: "
                           f"{_first_line(e.message)}); start every worker again with the same "
                           f"command: the run resumes from its last checkpoint")
            elif isinstance(e, tf.errors.OpError):
                bad, why = first_undecodable(files) if files else (None, None)
                message = (f"cannot decode {bad} ({why}); remove or re-save it" if bad else
                           one_line(e.message.split("}}")[-1], 300))
            summary.error = message
            summary.peak_rss_mb = peak_rss_mb()
            self.save_summary()
            if lost:
                raise RunError(f"the run stopped in epoch {len(summary.epochs) + 1}: "
                               f"{message}") from e
            if isinstance(e, tf.errors.OpError):
                raise RunError(f"the run stopped in epoch {len(summary.epochs) + 1}: {message}; "
                               f"the finished epochs are in summary.json") from e
            raise


def _first_line(text, limit=160):
    """What a TensorFlow error message says went wrong: its grpc_message if it has one (a
    peer's connection reset or refused), else its first line that is not a frame header."""
    import re

    found = re.search(r'grpc_message:"([^"]+)"', str(text))
    if found:
        return one_line(found.group(1), limit)
    lines = [part.strip() for part in str(text).splitlines() if part.strip()]
    useful = [line for line in lines if not line.startswith(("Graph execution error",
                                                             "Detected at node"))]
    return one_line((useful or lines or [""])[0], limit)


def _save_weights_atomically(model, path):
    # the format follows the name's ending (".weights.h5"), so the temporary name keeps it
    head, base = os.path.split(path)
    tmp = os.path.join(head, "tmp-" + base)
    model.save_weights(tmp)
    os.replace(tmp, path)
