"""What re-selecting costs and what selections save, in seconds: the prices the economy
(economy.py) weighs against each other.

A selection's step saves (1 - ratio) of a full step, its ratio eq. 3's prediction
(method/time_model.py) or the closed loop's measurement; a probe or timed full step computes
every gradient and trains nothing, a full step over the table's full_over_grads.  A full step is
the one timed in this run (feedback on), else the table's.

The compile a switch pays, before the run has compiled a selection of its own, is known before
the first step, so the run decides the same way at its start whatever its timing table holds:
- the table's compile_ms, when the profiler calibrated: the longest compile of its reference
  selections' steps (profiler/calibration.py), the longest because a compile grows with the
  selection's backward graph and a run compiles while its input pipeline shares the cores;
- else an estimate from the model's size, COMPILE_MS_PER_TENSOR per trainable tensor (a step's
  graph grows with its layers).  Measuring the run's first compile instead would mean
  compiling before deciding: the probe step (the overhead a short run is meant to avoid), or
  a few full training steps (which an elastic run does not take: full Adam steps can shake a
  pretrained backbone).  And the estimate depends on nothing this run times, so with
  --rho_feedback false, where no decision may, it decides as well.
With the feedback on, once the run has compiled a selection's step, that compile prices the
later switches.

With the frozen prefix cached (--cache_frozen_prefix), a switch that moves the cut fills the
cache again: an epoch of steps for each augmented view it keeps, each running the new prefix
once more (refill_s).
"""
# A selection's step compile per trainable tensor, for a table without compile_ms.  The
# profiler's compile_ms over the model's tensors on this project's 2-core machine: smallcnn
# 17 ms, MobileNetV2 13-16 ms (Keras 3: 23 ms), ResNet50 9 ms; taken near the top, since too
# high an estimate costs a borderline run its selection while too low a one makes a short run
# slower than full training.
COMPILE_MS_PER_TENSOR = 20.0


class Prices:
    """The prices of one run, each in seconds.  on: --economy (off, nothing is priced: no
    compile estimate, no refill); controller: the run's RhoController (its time model, the
    table's base model, rho, feedback); total_steps, steps_per_epoch, probe_batches; compile_ms:
    the timing table's, or None.  Methods taking `progress` read the run so far
    (economy.Progress)."""

    def __init__(self, on, controller, *, total_steps, steps_per_epoch, probe_batches,
                 compile_ms=None):
        self.on = bool(on)
        self.ctl = controller
        self.total_steps = int(total_steps)
        self.steps_per_epoch = int(steps_per_epoch)
        self.probe_batches = int(probe_batches)
        self.n = len(controller.base.t_dw)
        self.table_compile_ms = compile_ms

    @property
    def rho(self):
        return self.ctl.rho

    # ------------------------------------------------------------------ compiling
    def start_compile_s(self):
        """The compile the start decides with: the table's, else the model-size estimate."""
        if self.table_compile_ms is not None:
            return self.table_compile_ms / 1e3
        return self.n * COMPILE_MS_PER_TENSOR / 1e3

    def compile_source(self):
        if self.table_compile_ms is not None:
            return ("the timing table's compile_ms, the longest of the profiler's reference "
                    "selections")
        return (f"estimated from the model's size, {self.n} tensors x "
                f"{COMPILE_MS_PER_TENSOR:g} ms: the timing table has no compile_ms")

    def compile_estimate(self, progress):
        """Seconds a new selection's step takes to compile: with the feedback on, the last one
        measured in this run; before any, and always with the feedback off (no decision may
        depend on this run's timing then), start_compile_s.  None with the economy off."""
        if not self.on:
            return None
        if self.ctl.feedback and progress.selection_compile_s is not None:
            return progress.selection_compile_s
        return self.start_compile_s()

    def refill_s(self, mask, progress):
        """What moving the prefix cache to `mask`'s cut costs: an epoch's steps per view kept
        there, each running the new prefix once more (the forward pass the cut saves), 0 when
        the cut stays or the selection has none."""
        model = self.ctl.model
        if not self.on or progress.current_ratio is None or model.cut_of(mask) is None:
            return 0.0
        if model.cut_name(mask) == progress.current_cut:
            return 0.0
        device = self.t_full_s(progress) / (self.ctl.base.t_full / 1e3)  # this run's speed
        return (self.steps_per_epoch * model.fill_passes(mask) * model.forward_saved(mask)
                / 1e3 * device)

    # ------------------------------------------------------------------ the run's numbers
    def saving_at_s(self, ratio):
        """What the whole run's steps save at a step ratio, at the table's full step."""
        return self.total_steps * (1 - ratio) * self.ctl.base.t_full / 1e3

    def best_saving_s(self, global_step, progress):
        """What the steps left save at best: all but one re-selection's probes train a
        selection at rho."""
        steps = max(self.steps_left(global_step) - self.probe_batches, 0)
        return steps * (1 - self.rho) * self.t_full_s(progress)

    def saving_left_s(self, ratio, global_step, progress):
        """What the steps left from `global_step` save at a step ratio, at this run's full
        step."""
        return self.steps_left(global_step) * (1 - ratio) * self.t_full_s(progress)

    def lowest_step_s(self, progress, step_ratio=None):
        """A selection's step in seconds at the lowest step ratio in sight (rho, the current
        selection's, `step_ratio`): what the economy's budget shares are taken of."""
        ratios = [self.rho] + ([step_ratio] if step_ratio is not None else [])
        if progress.current_ratio is not None:
            ratios.append(progress.current_ratio)
        return min(ratios) * self.t_full_s(progress)

    def grad_s(self, progress):
        """A probe or timed full step (every gradient, no update), in seconds."""
        return self.t_full_s(progress) / self.ctl.base.full_over_grads

    def t_full_s(self, progress):
        """A full step in seconds: measured in this run (feedback on), else the table's."""
        if self.ctl.feedback and progress.full_step_s is not None:
            return progress.full_step_s
        return self.ctl.base.t_full / 1e3

    def spent_s(self, progress):
        """Re-selection overhead so far: as booked (feedback on); with feedback off, from the
        table alone (selections compiled, probe and full steps run), so that no decision
        depends on this run's timing."""
        if self.ctl.feedback:
            return progress.overhead_s
        grad_s = self.ctl.base.t_full / 1e3 / self.ctl.base.full_over_grads
        return (progress.selections_compiled * (self.compile_estimate(progress) or 0.0)
                + (progress.full_steps + progress.probes) * grad_s)

    def steps_left(self, global_step):
        return max(self.total_steps - global_step, 0)
