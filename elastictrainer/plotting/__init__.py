"""The paper's figures from run directories written by the training loop (CLI: `plot`).

Everything is read from summary.json and the TensorBoard events (runlog.read_scalars /
read_tensors), never from stdout.  Each figure is written as <out>.png and <out>.pdf.

By figure: common.py (styles, runs, time axis, output), curves.py (Fig. 15/16), bars.py
(Fig. 17/19, 23), selection.py (Fig. 21), profile.py (the profiler's table), time_to_accuracy.py (accuracy
against wall clock, with the levels peers report time to).
"""
from elastictrainer.plotting.common import (  # noqa: F401
    NOT_A_VARIANT, Run, STATUS_FLAGS, SchemeKey, Style, find_run_dirs, load_runs, out_base,
    pyplot, save_figure, scheme_label, scheme_styles, seeds_label, step_to_time, time_unit)
from elastictrainer.plotting.curves import (  # noqa: F401
    plot_curves, run_curves)
from elastictrainer.plotting.bars import (  # noqa: F401
    BarGroup, Panel, bar_groups, bars_table, energy_of, plot_bars, plot_energy, speedups)
from elastictrainer.plotting.selection import (  # noqa: F401
    Selections, draw_selection, plot_selection, selection_caption, selection_image,
    selection_matrix, selections_from_records, sparse_tick_labels)
from elastictrainer.plotting.profile import (  # noqa: F401
    draw_profile, plot_profile)
from elastictrainer.plotting.time_to_accuracy import (  # noqa: F401
    plot_time_to_accuracy)
