"""The command line's training loop (paper Sec. 3): one loop for every --train_type.

A scheme (method/schemes.py) only decides *which tensors train*.  A fixed scheme trains its
tensors throughout; an elastic one hands every step to ElasticTrainer's runtime (elastic/),
which re-selects every --interval epochs (importance, eq. 4-6; the exact selection under rho,
eq. 3) and holds rho with its closed loop.  Setting the run up is setup.py's job and what the
run leaves behind is the recorder's (recorder.py); this module is the loop, with what only the
command line does around it: checkpoints, evaluation, the energy meter, Ctrl-C.
"""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

import contextlib
import dataclasses
import math
import os
import time

import tensorflow as tf

from elastictrainer import flavors, runlog
from elastictrainer.flavors import batchnorm
from elastictrainer.data.folder import first_undecodable
from elastictrainer.elastic import ElasticRuntime
from elastictrainer.errors import RunError, one_line
from elastictrainer.machine import release_memory
from elastictrainer.runs import disk, energy
from elastictrainer.runs.checkpoint import RunCheckpoint
from elastictrainer.runs.interrupt import StopFlag, fault_at_step, inject_fault
from elastictrainer.runs.recorder import Recorder, new_summary
from elastictrainer.runs.setup import get_random_state, set_random_state, setup_run
from elastictrainer.runs.state import LoopState


def run(cfg, log=print, model=None, data=None, clock=time.perf_counter):
    """Train as `cfg` says; returns the summary dict (also written to summary.json).

    For one's own model and data in Python (the README's example):
      model: a Keras Model to train instead of building cfg.model_name; it keeps its head,
        its input size and its name, which names its timing table and run.
      data: (train, test) tf.data datasets of (images, integer labels) batches, instead of
        loading cfg.dataset_name; the train set should reshuffle each iteration.  An epoch is
        the train set once (or cfg.steps_per_epoch steps).
    clock: seconds, for step timing and the training time (a simulated device in tests).
    """
    with disk.stops_cleanly(cfg.logdir, started=False):
        setup = setup_run(cfg, log, model, data, clock=clock)
    try:
        with disk.stops_cleanly(setup.out, chief=setup.dist.is_chief):  # one line, resumable
            return _train(setup, log, clock)
    finally:  # a model given leaves with its BatchNorm layers as it came (--bn_mode)
        batchnorm.restore(setup.bn_forced)
        if setup.bn_hold is not None:
            setup.bn_hold.release()


def _train(setup, log, clock):
    from tqdm import tqdm

    cfg, steps, dist, per_epoch = setup.cfg, setup.compiled, setup.dist, setup.steps_per_epoch
    train_iter = iter(dist.global_batches(setup.bundle.train, cfg.batch_size).repeat())
    probe_iter = iter(setup.bundle.train.repeat())
    decisions = None
    if setup.scheme.elastic and dist.multi_worker and dist.is_chief:
        from elastictrainer.elastic.follower import Decisions
        decisions = Decisions(dist, len(steps.variables))  # each step's, to the other workers
    elastic = (_elastic_driver(setup, probe_iter, clock, log, decisions)
               if setup.scheme.elastic else None)
    session = _Session(setup, {"train_data": train_iter, "probe_data": probe_iter}, elastic,
                       clock, log)
    st = session.start()
    fault_step = fault_at_step()
    with StopFlag() as stop, session.rec.writer.as_default(), session.meter, \
            session.outcome_recorded():
        while st.epoch < cfg.num_epochs:
            epoch = st.epoch + 1
            session.meter.resume()
            bar = tqdm(total=per_epoch, initial=st.step_in_epoch, unit="step", leave=False,
                       desc=f"epoch {epoch}/{cfg.num_epochs}", disable=not cfg.progress)
            t_epoch = clock()
            while st.step_in_epoch < per_epoch:
                inject_fault(st.global_step, fault_step)  # a testing hook; no-op unless set
                x, y = dist.split(next(train_iter), cfg.batch_size)  # replicas' slices
                if elastic:
                    outputs = elastic.train_step(st.global_step, x, y)
                    st.trained(*elastic.ran)
                    st.selection = elastic.selection
                else:
                    outputs = steps.step_for(st.selection)(x, y)
                    st.trained("selection", st.selection)
                loss, correct, seen = steps.batch_stats(outputs, y)
                if not math.isfinite(loss):
                    session.nan_loss(st, loss, epoch, clock() - t_epoch)
                st.add(loss, correct, seen)
                if st.global_step % runlog.SCALAR_EVERY_STEPS == 0:
                    session.train_scalars(st)
                # refresh=False: the bar redraws at tqdm's own pace, not once per step (every
                # millisecond of the loop's own work is paid at any rho)
                bar.set_postfix(loss=f"{st.ep_loss / st.ep_seen:.3f}",
                                acc=f"{100 * st.ep_correct / st.ep_seen:.1f}", refresh=False)
                bar.update(1)
                if stop.requested or (session.checkpoint_due(st) and st.step_in_epoch < per_epoch):
                    st.train_time += clock() - t_epoch
                    session.checkpoint(st)  # mid-epoch: a kill or Ctrl-C loses a few minutes
                    t_epoch = clock()  # saving is not training
                    if stop.requested:
                        break
            st.train_time += clock() - t_epoch
            session.meter.pause()
            bar.close()
            # An epoch whose every step ran is evaluated even if Ctrl-C came during its last
            # (possibly partial) batch.
            if stop.requested and st.step_in_epoch < per_epoch:
                session.rec.set(train_time_s=st.train_time)
                break
            session.end_epoch(st, epoch)
            if elastic:
                elastic.on_epoch_end(epoch, st.global_step)
            if stop.requested:
                break
        result = elastic.on_train_end(st.train_time, st.global_step) if elastic else None
    if decisions is not None:  # one exchange a step, read from its traced graph
        from elastictrainer.train.collectives import allreduce_bytes
        session.rec.set(decision_allreduce_bytes_per_step=allreduce_bytes(decisions))
    summary = session.finish(st, stop.requested, result)
    if setup.prefix_cache is not None:  # a stopped run keeps the files its resume reads
        setup.prefix_cache.close(finished=not stop.requested)
    dist.barrier()  # workers leave together: one gone early reads as a lost worker to the rest
    return summary


def _elastic_driver(setup, probe_iter, clock, log, decisions=None):
    from elastictrainer.elastic.driver import ElasticDriver
    from elastictrainer.elastic.pace import for_trainer

    cfg, dist = setup.cfg, setup.dist
    if dist.multi_worker and not dist.is_chief:  # the chief decides; this worker follows
        from elastictrainer.elastic.follower import ElasticFollower
        return ElasticFollower(setup.compiled, dist)
    steps = setup.compiled
    pace = for_trainer(steps, cfg.pace_check, log)
    runtime = ElasticRuntime(
        setup.time_model, cfg.rho, share=cfg.rho_share, objective=cfg.rho_objective,
        tolerance=cfg.rho_tolerance, feedback=cfg.rho_feedback,
        steps_per_epoch=setup.steps_per_epoch, total_steps=setup.total_steps,
        interval=cfg.interval, probe_batches=cfg.probe_batches,
        dp_resolution=cfg.dp_resolution, compile_ms=(setup.table or {}).get("compile_ms"),
        economy=cfg.economy, is_compiled=lambda selection: selection in steps.steps,
        profiling_s=setup.profiling_s, clock=clock, log=log, head_warmup=cfg.head_warmup,
        trial=None if steps.trial is None else steps.trial.drops,
        pace=None if pace is None else pace.compare,
        head=[k for k, role in enumerate(setup.roles) if role == "head"])
    return ElasticDriver(steps, setup.scheme, runtime, probe_iter, cfg.probe_batches,
                         announce=decisions.send if decisions is not None else None, pace=pace)


class _Session:
    """What the command line's loop does around its steps: checkpoints (weights, optimizer,
    input iterators, the loop's and the runtime's state), the evaluation after each epoch,
    the energy meter, and a run that dies saying why.  What is recorded goes to the Recorder."""

    def __init__(self, setup, iterators, elastic, clock, log):
        cfg, dist = setup.cfg, setup.dist
        self.setup, self.cfg, self.elastic, self.clock, self.log = setup, cfg, elastic, clock, log
        # A multi-worker run's chief writes the summary, the events and the energy; every worker
        # saves a checkpoint (tf.distribute asks each to), the others into a directory they
        # drop, and every worker restores the chief's.
        self.chief = dist.is_chief
        self.ckpt = RunCheckpoint(setup.out, setup.model, setup.compiled.optimizer, iterators,
                                  max_to_keep=cfg.keep_checkpoints, log=log,
                                  write_dir=None if self.chief else os.path.join(
                                      setup.out, f".{dist.worker.replace(' ', '')}"))
        self.meter = energy.detect(mode=cfg.energy if self.chief else "none")
        bundle = setup.bundle
        summary = new_summary(
            cfg, elastic=setup.scheme.elastic,
            tensor_names=[flavors.tensor_name(v) for v in setup.compiled.variables],
            timing_table=setup.table_path, steps_per_epoch=setup.steps_per_epoch,
            energy_source=self.meter.source, skipped=bundle.skipped)
        if bundle.skipped:
            shown = ", ".join(bundle.skipped[:3]) + (", ..." if len(bundle.skipped) > 3 else "")
            log(f"warning: skipped {len(bundle.skipped)} file(s) of {cfg.dataset_name} that "
                f"are not JPEG/PNG/GIF/BMP images: {shown}")
        self.rec = Recorder(setup.out, cfg, summary, chief=self.chief, log=log)
        self.last_checkpoint = 0.0

    @property
    def runtime(self):
        """The elastic runtime this process runs (None: a fixed scheme, or a follower)."""
        return getattr(self.elastic, "rt", None)

    def start(self):
        """The loop state to begin from: a fresh one, or the latest checkpoint's."""
        setup, rt = self.setup, self.runtime
        st = LoopState(selection=None if setup.scheme.elastic
                       else setup.scheme.fixed_selection(setup.roles))
        if setup.resume:
            saved = self.ckpt.restore()
            st = LoopState.from_dict(saved["loop"])
            self.rec.resume(saved["summary"], saved["wall_time"])
            set_random_state(setup.model, saved["random"])
            self.meter.restore(*saved["energy"])
            # the all-reduced bytes count the whole run's steps, those before the resume too
            setup.compiled.allreduce_bytes, setup.compiled.steps_run = saved.get(
                "allreduce", (0, 0))
            if rt is not None:
                rt.load_state(saved["elastic"])
            if setup.prefix_cache is not None and saved.get("prefix_cache") is not None:
                setup.prefix_cache.load_state(saved["prefix_cache"])
            self.log(f"resuming {setup.out} from {os.path.basename(self.ckpt.restored)}: epoch "
                     f"{st.epoch + 1} of {self.cfg.num_epochs}, step {st.step_in_epoch} of "
                     f"{setup.steps_per_epoch}, {st.train_time:.1f} s trained")
        elif setup.prefix_cache is not None:
            setup.prefix_cache.clear()
        self.rec.begin(resumed=setup.resume)
        if self.elastic:
            self.rec.plan(self.elastic.on_train_begin())
        self._record_state(st)
        self.last_checkpoint = self.clock()
        return st

    def _record_state(self, st, save=True):
        """The runtime's records and the cache's statistics into the summary, then saved
        (save false: the recorder's end saves it)."""
        rt = self.runtime
        if rt is not None:
            self.rec.elastic(rt.records, rt.corrections)
        if self.setup.prefix_cache is not None:
            self.rec.set(prefix_cache=self.setup.prefix_cache.summary(st.global_step))
        if save:
            self.rec.save()

    def checkpoint(self, st):
        self._record_state(st)
        rt = self.runtime
        state = {"loop": dataclasses.asdict(st), "summary": self.rec.summary.to_dict(),
                 "random": get_random_state(self.setup.model),
                 "energy": [self.meter.joules, self.meter.active_s],
                 "allreduce": [self.setup.compiled.allreduce_bytes,
                               self.setup.compiled.steps_run],
                 "elastic": rt.state() if rt is not None else None,
                 "wall_time": time.time(),
                 disk.CONFIG_KEY: dataclasses.asdict(self.cfg)}  # config.json's, if it is lost
        cache = self.setup.prefix_cache
        if cache is not None:
            state["prefix_cache"] = cache.state(st.global_step)
        self.rec.flush()
        self.ckpt.save(state, st.global_step)
        if cache is not None:
            cache.kept(self.ckpt.steps)
        self.last_checkpoint = self.clock()

    def checkpoint_due(self, st):
        every_s = self.cfg.checkpoint_minutes * 60
        return bool(every_s) and self.clock() - self.last_checkpoint >= every_s

    def train_scalars(self, st):
        """The reference's train scalars, every runlog.SCALAR_EVERY_STEPS steps."""
        if not st.run_seen:
            return
        opt = self.setup.compiled.optimizer
        lr = opt.learning_rate
        lr = lr(opt.iterations) if callable(lr) else lr
        self.rec.scalars(st.global_step, {
            runlog.TRAIN_ACCURACY: 100.0 * st.run_correct / st.run_seen,
            runlog.TRAIN_LOSS: st.run_loss / st.run_seen,
            runlog.LEARNING_RATE: float(tf.convert_to_tensor(lr))})
        st.run_loss = st.run_correct = st.run_seen = 0.0

    def nan_loss(self, st, loss, epoch, partial_s):
        self.meter.pause()
        self.rec.set(status="nan", train_time_s=st.train_time + partial_s,
                     energy_j=self.meter.joules, avg_power_w=self.meter.avg_power_w)
        self._record_state(st)
        raise RunError(f"the loss became {loss} at epoch {epoch}, step {st.global_step}; try a "
                       f"lower --learning_rate")

    def end_epoch(self, st, epoch):
        """Evaluate, record and checkpoint a finished epoch."""
        cfg, steps = self.cfg, self.setup.compiled
        self.train_scalars(st)
        # the epoch's freed buffers back to the OS before the evaluation allocates its own (a
        # small device's memory is the run's peak, not the heap's free lists)
        release_memory()
        # every worker evaluates: reading BatchNorm's moving statistics (synced on read) is a
        # collective that all workers must join
        test_acc, test_loss = steps.evaluate(self.setup.bundle.test)
        if test_acc > st.best:
            st.best = test_acc
            if cfg.save_model and self.chief:
                _save_weights_atomically(self.setup.model,
                                         os.path.join(self.setup.out, runlog.BEST_WEIGHTS_FILE))
        selected = len(st.selection) if st.selection is not None else len(steps.variables)
        seen = max(st.ep_seen, 1)
        self.rec.set(energy_j=self.meter.joules, avg_power_w=self.meter.avg_power_w)
        self.rec.epoch(runlog.EpochRecord(
            epoch=epoch, train_time_s=st.train_time, test_accuracy=test_acc,
            test_loss=test_loss, train_accuracy=100 * st.ep_correct / seen,
            train_loss=st.ep_loss / seen, selected=selected, energy_j=self.meter.joules),
            st.global_step)
        self.log(f"epoch {epoch}: train loss {st.ep_loss / seen:.4f}, test accuracy "
                 f"{test_acc:.2f}%, test loss {test_loss:.4f}, training time "
                 f"{st.train_time:.1f} s, {selected}/{len(steps.variables)} tensors trained")
        st.next_epoch()
        self.checkpoint(st)

    def finish(self, st, stopped, elastic_result):
        """The run's last numbers: what this worker ran, under a strategy the replicas'
        agreement and the all-reduced bytes, then the recorder's end."""
        dist, steps, rec = self.setup.dist, self.setup.compiled, self.rec
        rec.set(ran=st.changes, energy_j=self.meter.joules, avg_power_w=self.meter.avg_power_w)
        checksums = agree = None
        if dist.on:
            checksums, agree = dist.checksums(steps.variables)
            if not agree:
                self.log(f"warning: the replicas' weights differ at the end ({checksums}): "
                         f"their updates diverged")
        if not self.chief:
            return rec.finish_worker(dist.worker, st.changes, checksums, agree)
        rec.set(step_cache_traces=steps.steps.traces)
        if dist.on:
            rec.set(strategy=self.cfg.strategy, replicas=dist.num_replicas,
                    replica_checksums=checksums, replicas_agree=agree,
                    full_allreduce_bytes_per_step=float(sum(
                        v.shape.num_elements() * v.dtype.size for v in steps.variables)),
                    allreduce_bytes_per_step=(steps.allreduce_bytes / steps.steps_run
                                              if steps.steps_run else None))
        self._record_state(st, save=False)
        return rec.finish(stopped=stopped, train_time_s=st.train_time, step=st.global_step,
                          result=elastic_result)

    @contextlib.contextmanager
    def outcome_recorded(self):
        """A run that dies says so in summary.json (status failed and the error, the finished
        epochs kept); TensorFlow's own errors become one line, naming the file that does not
        decode when one of the dataset's files is to blame."""
        try:
            yield
        except BaseException as e:
            status = "interrupted" if isinstance(e, KeyboardInterrupt) else "failed"
            message = one_line(e)
            dist, files = self.setup.dist, self.setup.bundle.files
            lost = dist.multi_worker and isinstance(
                e, (tf.errors.UnavailableError, tf.errors.CancelledError,
                    tf.errors.AbortedError, tf.errors.DeadlineExceededError))
            if lost:
                message = (f"a worker of the cluster was lost ({type(e).__name__}: "
                           f"{_first_line(e.message)}); start every worker again with the same "
                           f"command: the run resumes from its last checkpoint")
            elif isinstance(e, tf.errors.OpError):
                bad, why = first_undecodable(files) if files else (None, None)
                message = (f"cannot decode {bad} ({why}); remove or re-save it" if bad else
                           one_line(e.message.split("}}")[-1], 300))
            self.rec.fail(status, message)
            epochs = len(self.rec.summary.epochs)
            if lost:
                raise RunError(f"the run stopped in epoch {epochs + 1}: {message}") from e
            if isinstance(e, tf.errors.OpError):
                raise RunError(f"the run stopped in epoch {epochs + 1}: {message}; the finished "
                               f"epochs are in summary.json") from e
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
    runlog.replace_durably(path, model.save_weights, tmp=os.path.join(head, "tmp-" + base))
