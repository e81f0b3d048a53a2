"""plot.py / plotting.py on one real tiny elastic run (the fake runs are unit/test_plot.py's)."""
import numpy as np
import pytest

from elastictrainer import plotting, runlog
from helpers import assert_figures, plot_cli as cli


# ----------------------------------------------------------------- a real run
def test_plots_a_real_tiny_elastic_run(tmp_path, capsys):
    import main as main_cli
    from helpers import tiny_model
    from elastictrainer.profiler import run as prun, table as ptable

    model = tiny_model()  # 8 trainable tensors
    model.save(str(tmp_path / "tiny.keras"))
    table = prun.profile_model(model, str(tmp_path / "tiny.keras"), 16, 4, 10, num_iterations=2,
                             progress=False)
    ptable.save_table(table, str(tmp_path / "table.json"))
    from elastictrainer.method.time_model import TimeModel
    # a rho above the forward floor that this profile measured: the tiny model's forward pass
    # is 0.7-0.8 of its step, up to about 0.81 on a busy machine
    rho = min(0.99, max(0.8, TimeModel(table).rho_floor + 0.1))
    assert main_cli.main([
        "--model_name", str(tmp_path / "tiny.keras"), "--dataset_name", "synthetic",
        "--input_size", "16", "--weights", "none", "--num_epochs", "2", "--steps_per_epoch", "4",
        "--interval", "0.5", "--rho", f"{rho:.3f}", "--learning_rate", "0.01",
        "--train_type", "elastic_training", "--timing_table", str(tmp_path / "table.json"),
        "--logdir", str(tmp_path / "logs"), "--run_name", "et", "--quiet",
        "--economy", "false"]) == 0  # 8 steps: too short to select, with the economy
    run = str(tmp_path / "logs" / "et")
    for argv, base in ((["curves", run], "c"), (["selection", run], "s")):
        code, _, err = cli(argv + ["--out", str(tmp_path / "figs" / base)], capsys)
        assert code == 0, err
        assert_figures(str(tmp_path / "figs" / base))
    sel = plotting.selection_matrix(plotting.Run(run))
    # every half epoch (2 steps) a probe step, then the selection trains from the next step
    np.testing.assert_allclose(sel.epochs, np.array([1, 3, 5, 7]) / 4)
    assert sel.matrix.shape == (8, 4)
    c = plotting.run_curves(plotting.Run(run))
    summary = runlog.read_summary(run)
    assert sorted(c["accuracy"]) == [4, 8]
    assert c["accuracy"][8][0] == pytest.approx(summary["train_time_s"])
