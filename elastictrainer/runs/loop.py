"""The training loop (paper Sec. 3): one loop for every --train_type.

A scheme (schemes.py) only decides *which tensors train*.  A fixed scheme trains its tensors
throughout; an elastic one hands every step to ElasticTrainer's runtime (elastic/), which
re-selects every --interval epochs (importance, eq. 4-6; the exact selection under rho, eq. 3)
and holds rho with its closed loop.  Setting the run up is run_setup.py's job, and summary,
TensorBoard, checkpoints and energy are run_hooks.py's; this module is the loop itself.
"""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

import math
import time

from elastictrainer import runlog
from elastictrainer.elastic import ElasticRuntime
from elastictrainer.runs.recorder import RunRecorder, StopFlag, fault_at_step, inject_fault
from elastictrainer.runs.setup import setup_run


def run(cfg, log=print, model=None, data=None, clock=time.perf_counter):
    """Train as `cfg` says; returns the summary dict (also written to summary.json).

    For one's own model and data in Python (the README's example):
      model: a tf_keras Model to train instead of building cfg.model_name; it keeps its head,
        its input size and its name, which names its timing table and run.
      data: (train, test) tf.data datasets of (images, integer labels) batches, instead of
        loading cfg.dataset_name; the train set should reshuffle each iteration.  An epoch is
        the train set once (or cfg.steps_per_epoch steps).
    clock: seconds, for step timing and the training time (a simulated device in tests).
    """
    from tqdm import tqdm

    setup = setup_run(cfg, log, model, data)
    cfg, trainer, steps_per_epoch = setup.cfg, setup.trainer, setup.steps_per_epoch
    dist = setup.dist
    train_iter = iter(dist.global_batches(setup.bundle.train, cfg.batch_size).repeat())
    probe_iter = iter(setup.bundle.train.repeat())
    elastic = _elastic_hooks(setup, probe_iter, clock, log) if setup.scheme.elastic else None
    rec = RunRecorder(setup, {"train_data": train_iter, "probe_data": probe_iter}, elastic,
                      clock, log)
    st = rec.start()
    if elastic:
        plan = elastic.on_train_begin()
        rec.summary.plan = vars(plan) if plan is not None else None
    meter = rec.meter
    fault_step = fault_at_step()
    with StopFlag() as stop, rec.writer.as_default(), meter, rec.outcome_recorded():
        while st.epoch < cfg.num_epochs:
            epoch = st.epoch + 1
            meter.resume()
            bar = tqdm(total=steps_per_epoch, initial=st.step_in_epoch,
                       desc=f"epoch {epoch}/{cfg.num_epochs}", disable=not cfg.progress,
                       unit="step", leave=False)
            t_epoch = clock()
            while st.step_in_epoch < steps_per_epoch:
                inject_fault(st.global_step, fault_step)  # a testing hook; no-op unless set
                x, y = dist.split(next(train_iter), cfg.batch_size)  # replicas' slices
                if elastic:
                    outputs = elastic.train_step(st.global_step, x, y)
                    st.trained(*elastic.ran)
                    st.selection = elastic.selection
                else:
                    outputs = trainer.step_for(st.selection)(x, y)
                    st.trained("selection", st.selection)
                loss, correct, seen = trainer.batch_stats(outputs, y)
                if not math.isfinite(loss):
                    rec.nan_loss(st, loss, epoch, clock() - t_epoch)
                st.add(loss, correct, seen)
                if st.global_step % runlog.SCALAR_EVERY_STEPS == 0:
                    rec.train_scalars(st)
                # refresh=False: the bar redraws at tqdm's own pace, not once per step (every
                # millisecond of the loop's own work is paid at any rho)
                bar.set_postfix(loss=f"{st.ep_loss / st.ep_seen:.3f}",
                                acc=f"{100 * st.ep_correct / st.ep_seen:.1f}", refresh=False)
                bar.update(1)
                if stop.requested or (rec.checkpoint_due(st)
                                      and st.step_in_epoch < steps_per_epoch):
                    st.train_time += clock() - t_epoch
                    rec.checkpoint(st)  # mid-epoch: a kill or Ctrl-C loses a few minutes
                    t_epoch = clock()  # saving is not training
                    if stop.requested:
                        break
            st.train_time += clock() - t_epoch
            meter.pause()
            rec.summary.energy_j, rec.summary.avg_power_w = meter.joules, meter.avg_power_w
            bar.close()
            # An epoch whose every step ran is evaluated even if Ctrl-C came during its last
            # (possibly partial) batch.
            if stop.requested and st.step_in_epoch < steps_per_epoch:
                rec.summary.train_time_s = st.train_time
                break
            rec.end_epoch(st, epoch)
            if elastic:
                elastic.on_epoch_end(epoch, st.global_step)
            if stop.requested:
                break
        result = elastic.on_train_end(st.train_time, st.global_step) if elastic else None
    summary = rec.finish(st, stop.requested, result)
    if setup.prefix_cache is not None:
        setup.prefix_cache.close()
    dist.barrier()  # workers leave together: one gone early reads as a lost worker to the rest
    return summary


def _elastic_hooks(setup, probe_iter, clock, log):
    from elastictrainer.elastic.driver import ElasticDriver

    cfg, dist = setup.cfg, setup.dist
    if dist.multi_worker and not dist.is_chief:  # the chief decides; this worker follows
        from elastictrainer.elastic.follower import ElasticFollower
        return ElasticFollower(setup.trainer, dist)
    trainer = setup.trainer
    runtime = ElasticRuntime(
        setup.time_model, cfg.rho, feedback=cfg.rho_feedback,
        steps_per_epoch=setup.steps_per_epoch, total_steps=setup.total_steps,
        interval=cfg.interval, probe_batches=cfg.probe_batches,
        dp_resolution=cfg.dp_resolution, compile_ms=(setup.table or {}).get("compile_ms"),
        economy=cfg.economy, is_compiled=lambda selection: selection in trainer.steps,
        clock=clock, log=log)
    announce = None
    if dist.multi_worker:  # every step's kind and selection, to the other workers
        from elastictrainer.elastic.follower import Decisions
        announce = Decisions(dist, len(trainer.variables)).send
    return ElasticDriver(trainer, setup.scheme, runtime, probe_iter, cfg.probe_batches,
                         announce=announce)
