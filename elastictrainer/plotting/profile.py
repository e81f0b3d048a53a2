"""The profiler's table as a bar chart of each tensor's t_dw and t_dy."""
import os

import numpy as np

from elastictrainer.plotting.common import (out_base, pyplot, save_figure)


# --------------------------------------------------------------------------- profiler table
def plot_profile(table_path, out):
    """The profiler's t_dw/t_dy bars from a table file.  Returns the written paths."""
    from elastictrainer.profiler.table import load_table

    base = out_base(out)
    draw_profile(load_table(table_path), base + ".png")  # it writes <base>.png and <base>.pdf
    return [base + ".png", base + ".pdf"]


def draw_profile(table, path):
    """Bars of t_dw and t_dy per tensor from the input (left) to the output (right); PNG + PDF.
    Returns the PNG's path."""
    plt = pyplot()

    tensors = sorted(table["tensors"], key=lambda t: -t["rank"])
    n = len(tensors)
    x = np.arange(n)
    dw = np.array([t["t_dw_ms"] for t in tensors])
    dy = np.array([t["t_dy_ms"] for t in tensors])
    est = np.array([t["estimated"] for t in tensors])
    fig, ax = plt.subplots(figsize=(max(6.0, min(18.0, 0.08 * n + 4)), 3.6))
    ax.bar(x, dw, color="#1f77b4", label="t_dw (weight gradient + update)")
    ax.bar(x, dy, bottom=dw, color="#ff7f0e", label="t_dy (error gradient)")
    if est.any():
        ax.bar(x[est], dw[est], color="none", edgecolor="k", hatch="//", label="estimated (FLOPs)")
    ax.set_xlabel("tensor (input → output)")
    from matplotlib.ticker import MaxNLocator
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("op time per step (ms)")
    ax.margins(x=0.01, y=0.35)  # the tallest bar clear of the frame and of the legend
    ax.set_title(f"{table['model']}: input {table['input_size']}, batch {table['batch_size']}; "
                 f"forward {table['t_fp_ms']:.0f} ms, full step {table['t_full_ms']:.0f} ms")
    ax.set_xlim(-1, n)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    return save_figure(fig, os.path.splitext(path)[0])[0]
