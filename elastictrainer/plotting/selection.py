"""Fig. 21: which tensors each re-selection trained, as a heat map: the figure `plot selection`
writes, and the same picture as an image array for the run's TensorBoard events (runs/board.py)."""
from collections import namedtuple

import numpy as np

from elastictrainer import runlog
from elastictrainer.errors import UserError
from elastictrainer.plotting.common import (STATUS_FLAGS, _display_name, load_runs,
                                            save_figure, scheme_label)


# --------------------------------------------------------------------------- Fig. 21
Selections = namedtuple("Selections", "epochs matrix predicted_ratio measured_ratio source")


def selection_matrix(run):
    """Selections(epochs, matrix [tensor, re-selection] of 0/1, predicted and measured
    step-time ratios (NaN where unknown), source) from summary.json's selections, or from the
    SELECTION_MASK and PREDICTED_RATIO events when the summary has none (no measured ratios:
    the events do not hold them)."""
    sels = run.summary.get("selections") or []
    if sels:
        return selections_from_records(sels)
    steps, masks = runlog.read_tensors(run.path, runlog.SELECTION_MASK, run.events)
    if not masks:
        if run.rho is None:
            raise UserError(f"{run.path}: {run.train_type} is not an elastic scheme, so it has "
                            f"no tensor selections to plot")
        raise UserError(f"{run.path}: no tensor selection recorded yet")
    spe = run.summary["steps_per_epoch"]
    matrix = np.stack([np.asarray(m, np.int32).reshape(-1) for m in masks], axis=1)
    rsteps, rvals = run.scalars(runlog.PREDICTED_RATIO)
    by_step = dict(zip(rsteps.tolist(), rvals.tolist()))
    ratio = np.array([by_step.get(s, np.nan) for s in steps], float)
    return Selections(np.array(steps, float) / spe, matrix, ratio, np.full(len(steps), np.nan),
                      "events")


def selections_from_records(records):
    """Selections from summary.json's "selections" (elastic.SelectionRecord dicts)."""
    epochs = np.array([s["epoch"] for s in records], float)
    matrix = np.array([s["mask"] for s in records], np.int32).T
    ratio = np.array([s.get("predicted_ratio", np.nan) for s in records], float)
    measured = np.array([np.nan if s.get("measured_ratio") is None else s["measured_ratio"]
                         for s in records], float)
    return Selections(epochs, matrix, ratio, measured, runlog.SUMMARY_FILE)


def selection_caption(rho, forward_floor):
    """'ρ asked 0.5, forward floor 0.31 of a full step': what bounds the selections drawn."""
    parts = [] if rho is None else [f"ρ asked {runlog.rho_text(rho)}"]
    if forward_floor is not None:
        parts.append(f"forward floor {forward_floor:.2f} of a full step")
    return ", ".join(parts)


def plot_selection(run_dir, out):
    """Heat map of the tensors trained after each re-selection (draw_selection) of the run in
    `run_dir`, written as <out>.png and <out>.pdf.  Returns the written paths."""
    run = load_runs([run_dir])[0]
    status = f" ({run.flag})" if run.flag else ""
    fig = draw_selection(
        selection_matrix(run), len(run.epochs), run.config.get("interval"),
        f"{run.model} on {run.dataset}: {scheme_label(run.train_type, run.rho)}{status}",
        run.rho, (run.summary.get("plan") or {}).get("forward_floor"))
    return save_figure(fig, out)


def selection_image(summary, finished_epochs, interval=None, dpi=100):
    """The heat map of draw_selection for a run's summary (summary.json as a dict, its
    selections so far) as an RGB uint8 array [height, width, 3]: what TensorBoard shows of
    the selections, the same picture `plot selection` draws from the run directory."""
    import io

    from matplotlib.image import imread

    status = STATUS_FLAGS.get(summary.get("status", "finished"))
    title = (f"{_display_name(summary['model'])} on {_display_name(summary['dataset'])}: "
             f"{scheme_label(summary['train_type'], summary.get('rho'))}"
             f"{f' ({status})' if status else ''}")
    fig = draw_selection(selections_from_records(summary["selections"]), finished_epochs,
                         interval, title, summary.get("rho"),
                         (summary.get("plan") or {}).get("forward_floor"))
    buf = io.BytesIO()
    # "tight", as save_figure does: the legends right of the panels stay in the picture
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight", pad_inches=0.1)
    buf.seek(0)
    rgba = imread(buf, format="png")
    return (np.clip(rgba[..., :3], 0.0, 1.0) * 255).round().astype(np.uint8)


def draw_selection(sel, finished_epochs, interval, title, rho=None, forward_floor=None):
    """The figure of Selections `sel`: a heat map of the tensors trained after each
    re-selection (x: epoch, y: tensor from input at the bottom to output at the top), with the
    fraction selected and the predicted and measured step-time ratios above it; the rho asked
    and the forward floor in its title.  finished_epochs: where the last selection's column
    ends (an unfinished run's last selection is drawn for one interval); interval: the
    --interval, the width of a lone selection's column."""
    # a Figure of its own, not pyplot's: drawing for TensorBoard inside a training process (a
    # notebook's, say) leaves its pyplot backend and figures alone
    from matplotlib.figure import Figure

    n, m = sel.matrix.shape
    # each selection holds until the next one, the last until the end of the finished epochs
    gaps = np.diff(sel.epochs)
    step = float(np.median(gaps)) if len(gaps) else float(interval or 1.0)
    end = float(finished_epochs)
    if end <= sel.epochs[-1]:  # an unfinished run: show the last selection for one interval
        end = sel.epochs[-1] + step
    x_edges = np.append(sel.epochs, end)
    y_edges = np.arange(n + 1) - 0.5

    fig = Figure(figsize=(7.5, 6.0 if n > 40 else 5.0), layout="constrained")
    top, ax = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [1, 3.5]})
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch
    trained = "#1a1a1a"
    ax.pcolormesh(x_edges, y_edges, sel.matrix, cmap=ListedColormap(["white", trained]), vmin=0,
                  vmax=1, antialiased=False, rasterized=n * m > 20000)
    for e in x_edges[1:-1]:  # two equal selections in a row still read as two columns
        ax.axvline(e, color="0.6", lw=0.6)
    ax.set_ylim(-0.5, n - 0.5)
    from matplotlib.ticker import MaxNLocator
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # tensors are whole
    ax.set_xlabel("epoch (each column: one re-selection, held until the next)")
    ax.set_ylabel(f"tensor index (input → output, {n} tensors)")
    ax.legend([Patch(color=trained), Patch(facecolor="white", edgecolor="0.6")],
              ["trained", "frozen"], loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False,
              fontsize=8)

    frac = sel.matrix.sum(axis=0) / n
    xs = np.append(sel.epochs, end)
    top.step(xs, np.append(frac, frac[-1]), where="post", color="#444444",
             label="fraction of tensors trained")
    if np.isfinite(sel.predicted_ratio).any():
        pr = sel.predicted_ratio
        top.step(xs, np.append(pr, pr[-1]), where="post", color="#d62728",
                 label="predicted step-time ratio")
    # a selection is kept after a correction when it was measured within rho before, even if
    # the corrected time model predicts it over: the measured line shows what the steps took
    if np.isfinite(sel.measured_ratio).any():
        mr = sel.measured_ratio
        top.step(xs, np.append(mr, mr[-1]), where="post", color="#1f77b4", ls="--",
                 label="measured step-time ratio")
    if isinstance(rho, (int, float)):  # rho auto has no one ratio: each selection its own
        top.axhline(rho, color="#d62728", ls=":", lw=1, label=f"ρ = {rho:g}")
    if forward_floor is not None:  # no selection can be predicted below it
        top.axhline(forward_floor, color="0.5", ls="-.", lw=1, label="forward floor")
    top.set_ylim(0, max(1.05, np.nanmax(np.concatenate([sel.predicted_ratio,
                                                         sel.measured_ratio, [0]])) + 0.05))
    top.set_ylabel("fraction")
    top.grid(alpha=0.3)
    top.legend(loc="upper left", bbox_to_anchor=(1.0, 1.05), frameon=False, fontsize=8)
    ax.set_xlim(x_edges[0], x_edges[-1])
    if m <= 24:
        ax.set_xticks(x_edges)
        ax.set_xticklabels(sparse_tick_labels(x_edges), fontsize=8)
    caption = selection_caption(rho, forward_floor)
    top.set_title(f"{title}\ntensors selected at each re-selection"
                  f"{f' ({caption})' if caption else ''}")
    return fig


def sparse_tick_labels(edges, min_gap=0.04):
    """Labels for ticks at `edges`, blank where a tick sits closer than min_gap of the axis
    range to the last labelled one: a correction a few steps after a re-selection would print
    its epoch on top of the re-selection's ("00.13")."""
    edges = [float(e) for e in edges]
    span = (max(edges) - min(edges)) or 1.0
    labels, last = [], None
    for e in edges:
        if last is None or e - last >= min_gap * span:
            labels.append(f"{e:.3g}")
            last = e
        else:
            labels.append("")
    return labels
