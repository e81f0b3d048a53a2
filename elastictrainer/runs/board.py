"""What a run writes for TensorBoard's dashboards besides its scalars: its hyperparameters and
run-level metrics (HParams), its configuration and closing line (Text), and the heat map of
the tensors each re-selection trained (Images), the same picture `plot selection` draws.

Plain functions of the run's config and summary.json dict, each writing through the summary
writer it is given; runs/recorder.py calls them at the run's start, as its selections grow,
and at its end.  The tags are runlog's."""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

import numpy as np
import tensorflow as tf

from elastictrainer import runlog

# What a figure's runs differ in or compare by: the HParams dashboard's columns.
HPARAM_FIELDS = ("train_type", "rho", "model_name", "dataset_name", "input_size", "batch_size",
                 "optimizer", "learning_rate", "seed", "cache_frozen_prefix")


def hparams_of(cfg, elastic):
    """{name: value} of a run's hyperparameters (config.Config `cfg`); rho only for an elastic
    scheme, whose only setting it is."""
    values = {name: getattr(cfg, name) for name in HPARAM_FIELDS}
    if not elastic:
        del values["rho"]
    return {k: v for k, v in values.items() if v is not None}


def write_hparams(writer, hparams, trial_id):
    """The run's session for TensorBoard's HParams dashboard.  No experiment config is
    written: TensorBoard builds the experiment from every run's session and values (a run
    cannot know its sweep's other values), its metrics from the runs' scalar tags, the
    run-level ones (run_metrics, written by write_run_end) among them."""
    from tensorboard.plugins.hparams import api as hp

    with writer.as_default():
        hp.hparams(hparams, trial_id=trial_id)
    writer.flush()


def write_config_text(writer, config):
    """The run's configuration (dataclasses.asdict of its Config) as a table in the Text
    dashboard, at step 0."""
    rows = "\n".join(f"| {key} | {_cell(value)} |" for key, value in sorted(config.items()))
    with writer.as_default():
        tf.summary.text(runlog.CONFIG_TEXT, f"| setting | value |\n|---|---|\n{rows}", step=0)
    writer.flush()


def write_selection_images(writer, summary, written, interval):
    """The heat map of the selections at each selection of `summary` (summary.json's dict)
    from index `written` on, at that selection's step and drawn as it stood then (its last
    column held for one interval).  Returns how many selections have their image now."""
    records = summary.get("selections") or []
    for k in range(written, len(records)):
        upto = dict(summary, selections=records[:k + 1])
        write_selection_image(writer, upto, records[k]["step"], int(records[k]["epoch"]),
                              interval)
    return max(written, len(records))


def write_selection_image(writer, summary, step, finished_epochs, interval):
    """One heat map of `summary`'s selections (plotting.selection_image) at `step`, the rho
    asked and the forward floor in its description too."""
    from elastictrainer.plotting.selection import selection_caption, selection_image

    image = selection_image(summary, finished_epochs, interval)
    caption = selection_caption(summary.get("rho"), (summary.get("plan") or {}).get(
        "forward_floor"))
    description = (f"Tensors trained (dark) after each re-selection, input at the bottom, "
                   f"output at the top; {caption}." if caption else None)
    with writer.as_default():
        tf.summary.image(runlog.SELECTION_IMAGE, image[np.newaxis], step=step, max_outputs=1,
                         description=description)


def run_metrics(summary, final_step):
    """{tag: value} of the run-level numbers the HParams dashboard compares runs by (runlog's
    compare/ tags), those the run knows."""
    n = summary["num_tensors"]
    trained = tensors_trained(summary.get("ran") or [], final_step, n)
    only_full = bool(summary.get("ran")) and all(
        kind == "selection" and (tensors is None or len(tensors) == n)
        for _, kind, tensors in summary["ran"])
    over_full = summary.get("wall_ratio")
    if over_full is None and only_full:  # every step trained every tensor: full training
        over_full = 1.0
    values = {runlog.BEST_ACCURACY: summary.get("best_test_accuracy"),
              runlog.TRAIN_TIME: summary.get("train_time_s"),
              runlog.TIME_OVER_FULL: over_full,
              runlog.RUN_MEASURED_RATIO: summary.get("measured_ratio"),
              runlog.TENSORS_TRAINED: trained}
    return {tag: float(v) for tag, v in values.items() if v is not None}


def tensors_trained(ran, final_step, num_tensors):
    """The mean number of tensors a weight-updating step trained, from summary.json's "ran"
    ([global step, step kind, tensors or None for all] where it changed; probe and timed full
    steps update nothing and are left out); None when no step updated weights."""
    total = count = 0
    for k, (start, kind, tensors) in enumerate(ran):
        end = ran[k + 1][0] if k + 1 < len(ran) else final_step
        if kind == "selection" and end > start:
            total += (end - start) * (num_tensors if tensors is None else len(tensors))
            count += end - start
    return total / count if count else None


def closing_text(summary, metrics):
    """The run's closing line as markdown: what rho was asked and what was measured, the wall
    clock against full training's, and the tensors trained."""
    from elastictrainer.elastic import SHORT_RUN
    from elastictrainer.plotting.common import scheme_label

    rho, n = summary.get("rho"), summary["num_tensors"]
    best = summary.get("best_test_accuracy")
    lines = [f"**{scheme_label(summary['train_type'], rho)} {summary.get('status', 'finished')}"
             f"**: best test "
             f"accuracy {'n/a' if best is None else f'{best:.2f}%'}, training time "
             f"{summary.get('train_time_s', 0.0):.1f} s."]
    sels = summary.get("selections") or []
    if rho is None:
        lines.append("Step-time ratio: no rho asked; the scheme trains a fixed set of tensors.")
    elif sels and all(s["reason"] == SHORT_RUN for s in sels):
        lines.append(f"Step-time ratio: asked {runlog.rho_text(rho)}; every tensor trained, as "
                     f"in full training: the run was too short to pay for compiling a "
                     f"selection's step.")
    else:
        measured = summary.get("measured_ratio")
        lines.append(f"Step-time ratio: asked {runlog.rho_text(rho)}, measured "
                     f"{'n/a' if measured is None else f'{measured:.3f}'} "
                     f"({len(summary.get('corrections') or [])} correction(s)).")
    over = metrics.get(runlog.TIME_OVER_FULL)
    lines.append("Wall clock: " + ("not known against full training's." if over is None else
                                   f"{over:.2f} of full training's"
                                   f"{', estimated in the run' if rho is not None else ''}."))
    trained = metrics.get(runlog.TENSORS_TRAINED)
    lines.append("Tensors trained: " + ("none (no step updated weights)." if trained is None
                                        else f"{trained:.1f} of {n} per step on average."))
    return "\n\n".join(lines)


def write_run_end(writer, summary, final_step, interval):
    """At the run's end: the last heat map (elastic runs), the run-level metrics and the
    closing text, at `final_step`; flushed."""
    metrics = run_metrics(summary, final_step)
    with writer.as_default():
        if summary.get("selections"):
            write_selection_image(writer, summary, final_step, len(summary["epochs"]), interval)
        for tag, value in metrics.items():
            tf.summary.scalar(tag, value, step=final_step)
        tf.summary.text(runlog.RESULT_TEXT, closing_text(summary, metrics), step=final_step)
    writer.flush()


def _cell(value):
    # a markdown table cell: no pipe or line break of a path or list may end the row
    return str(value).replace("|", "\\|").replace("\n", " ")
