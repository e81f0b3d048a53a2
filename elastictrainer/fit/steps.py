"""model.fit's steps for ElasticCallback (callback.py): what the elastic driver runs,
over fit's batches, for Keras 3 and tf-keras models, on one device or under the model's
tf.distribute strategy, and on one device with the frozen prefix's activations cached
(prefix/cache.py: a selection with a cut trains its suffix on stored rows, with Keras' compiled
loss and metrics as the whole model's step has them).  A step is called with a batch's parts,
step(x, y[, sample_weight])."""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

import tensorflow as tf

from elastictrainer import flavors
from elastictrainer.flavors import optimizers
from elastictrainer.errors import UserError
from elastictrainer.method.importance import in_step_terms, one_device_only
from elastictrainer.train.compiled import StepCache


def covered_terms(importance, optimizer, variables):
    """The in-step importance terms of `importance` under `optimizer` for `variables`; a
    UserError when the optimizer's update is not one they cover (ElasticCallback checks this
    before profiling the model, and again when it builds the steps)."""
    terms = in_step_terms(importance, optimizer, variables)
    if terms is None:
        raise UserError(f"ElasticCallback computes importance inside the step, which covers "
                        f"SGD, Adam and AdamW without gradient clipping or variable "
                        f"constraints; {type(optimizer).__name__} with these settings is not "
                        f"covered")
    return terms


class FitSteps:
    """What elastic.driver.ElasticDriver drives (compiled.CompiledSteps's interface), over model.fit's
    batches: one compiled step per selection (cached), each the model's own train step with
    gradients for the selected tensors only, returning (loss, logs); and the probe step (every
    gradient, no update, the loss and metrics updated) with the in-step importance terms.
    Under the model's tf.distribute strategy a step all-reduces the selected tensors' gradients
    only and updates every replica's copy, as the command line's distributed steps do
    (distributed_steps.DistributedStep).  prefix_cache: a prefix.cache.PrefixCache (one
    device only), whose steps then train the selections that leave a frozen prefix; bn_hold: a
    batchnorm.FrozenHold (bn_mode "frozen"), held as compiled.CompiledSteps holds it; trial:
    keep the probes' batches for the trial step by depth (method/trial.py), `self.trial`."""

    def __init__(self, model, optimizer, importance, strategy=None, prefix_cache=None,
                 bn_hold=None, trial=False):
        self.model, self.optimizer = model, optimizer
        self.prefix_cache = prefix_cache
        self.bn_hold = bn_hold
        self.variables = list(model.trainable_weights)
        self.flavor = flavors.for_model(model)
        self.strategy = strategy
        self._terms = covered_terms(importance, optimizer, self.variables)
        self.in_step = True
        one_device = one_device_only(self._terms, f"importance {importance}",
                                     trial and "trial_check")
        if one_device and strategy is not None:
            raise UserError(f"{one_device}; under a tf.distribute strategy use train_type "
                            f"elastic_training and trial_check False")
        self._needs_batch = bool(getattr(self._terms, "needs_batch", False))
        if self._needs_batch:
            self._terms.stats = list(model.non_trainable_weights)
        self.trial = None
        if trial:
            from elastictrainer.method.trial import TrialStep

            # its forward passes update fit's loss and metrics too: put back with the rest
            self.trial = TrialStep(optimizer, self.variables, self.loss_of, stats=lambda: (
                list(model.non_trainable_weights)
                + [v for metric in model.metrics for v in metric.variables]),
                random_layers=self.flavor.random_layers(model))
        self._reduce_op = self.flavor.losses_scaled_for_replicas()  # outside any trace
        self.steps = StepCache(self._selection_step,
                               size_fn=None if strategy is None else (lambda step: None))
        self._probe = self._terms_fn = None

    def step_for(self, selection):
        if self.bn_hold is not None:  # before the step (and its prefix plan) is traced
            self.bn_hold.hold(selection)
        return self.steps(tuple(selection))

    def _selection_step(self, selection):
        var_list = [self.variables[k] for k in selection]
        if self.prefix_cache is None:
            return self._step(var_list, True)
        return self.prefix_cache.step(
            selection, lambda: self._step(var_list, True),
            lambda suffix, cut: self._step(var_list, True, call=suffix))

    def _step(self, var_list, train, call=None):
        """(x, y[, sample_weight]) -> (loss, logs) training `var_list`; train false: (loss,
        logs, gradients).  call: what maps x to the predictions (the model; a suffix model
        when x is a cut's stored activations)."""
        model, flavor, optimizer = self.model, self.flavor, self.optimizer
        update = flavors.for_optimizer(optimizer)

        def forward_backward(data):
            with tf.GradientTape() as tape:
                x, y, sample_weight, y_pred, loss = flavor.fit_forward(model, data, call)
            grads = tape.gradient(loss, var_list)
            return loss, flavor.fit_metrics(model, x, y, y_pred, sample_weight), grads

        strategy = self.strategy
        # autograph off: the steps have no Python control flow on tensors to convert
        if strategy is None:
            @tf.function(autograph=False)
            def step(*data):
                loss, logs, grads = forward_backward(_packed(data))
                if not train:
                    return loss, logs, grads
                optimizers.apply_updates(optimizer, grads, var_list)
                return loss, logs

            return step
        # Keras scales each replica's loss by 1 / replicas (where it does), so that summed
        # gradients are the global batch's mean
        op = tf.distribute.ReduceOp.SUM if self._reduce_op else tf.distribute.ReduceOp.MEAN

        def replica(data):
            loss, logs, grads = forward_backward(data)
            present = [k for k, g in enumerate(grads) if g is not None]
            reduced = tf.distribute.get_replica_context().all_reduce(
                op, [grads[k] for k in present])
            for k, g in zip(present, reduced):
                grads[k] = g
            if train:
                grads, _ = update.prepare_gradients(optimizer, grads, var_list)
            return loss, logs, grads

        @tf.function(autograph=False)
        def distributed(*data):
            data = _packed(data)
            if train:
                update.begin_update(optimizer)
            loss, logs, grads = strategy.run(replica, args=(data,))
            loss = strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None)
            logs = strategy.experimental_local_results(logs)[0]
            if not train:
                return loss, logs, strategy.experimental_local_results(grads)[0]
            for g, v in zip(grads, var_list):
                strategy.extended.update(
                    optimizers.tf_variable(v),
                    lambda var, grad: update.update_variable(optimizer, grad, var),
                    args=(g,), group=False)
            update.finish_update(optimizer, var_list)
            return loss, logs

        return distributed

    def loss_of(self, data):
        """The training loss on `data` (the step's parts), as the model's train step computes
        it."""
        return self.flavor.fit_forward(self.model, _packed(tuple(data)), None)[-1]

    def probe_traced(self, want_terms=False):
        from elastictrainer.flavors import compat

        def has(fn):
            return fn is not None and bool(compat.concrete_functions(fn))

        return has(self._probe) and (not want_terms or has(self._terms_fn))

    def probe_step(self, *data, want_terms):
        """Every tensor's gradient, no update; (loss, logs, terms)."""
        if self.bn_hold is not None:
            self.bn_hold.hold(None)
        if self._probe is None:
            self._probe = self._step(self.variables, False)
            if self._needs_batch:  # a second gradient on this batch (importance.CurvatureTerms)
                from elastictrainer.method.importance import hessian_vector_product

                hvp_at = hessian_vector_product(self.loss_of, self.variables)
                # autograph off, as train/steps.ProbeStep's
                self._terms_fn = tf.function(
                    lambda grads, *data: self._terms(grads, hvp_at, data), autograph=False)
            else:
                self._terms_fn = tf.function(self._terms)
        loss, logs, grads = self._probe(*data)
        if want_terms and self.trial is not None:
            self.trial.keep(data, grads)
        if not want_terms:
            terms = tf.zeros([len(self.variables)], tf.float64)
        else:
            terms = self._terms_fn(grads, *data) if self._needs_batch else self._terms_fn(grads)
        return loss, logs, terms


def parts(data):
    """A fit batch as the steps take it: (x, y[, sample_weight]), or (x,) for x alone."""
    return tuple(data) if isinstance(data, tuple) else (data,)


def _packed(parts):
    """The batch Keras' unpack_x_y_sample_weight takes, from a step's arguments."""
    return parts[0] if len(parts) == 1 else tuple(parts)
