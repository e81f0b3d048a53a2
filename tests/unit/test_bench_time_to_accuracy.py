"""scripts/bench_time_to_accuracy.py: its flags and its table from scripted curves."""
from helpers import load_script

from elastictrainer.experiments import time_to_accuracy as tta


def test_flags_and_the_table_it_writes():
    bench = load_script("bench_time_to_accuracy")
    args = bench.build_parser().parse_args(["--configs", "smallcnn", "--seeds", "0,1",
                                            "--rhos", "0.5", "--shares", "0.8,0.9"])
    assert args.shares == (0.8, 0.9) and args.rhos == (0.5,)
    curves = {"full_training": [[(10.0, 70.0), (20.0, 80.0)]] * 2,
              "ElasticTrainer rho auto, share 0.9": [[(5.0, 79.5), (9.0, 79.8)]] * 2,
              "ElasticTrainer rho 0.3": [tta.Refused("--rho 0.3 is below the floor")] * 2}
    results = {"date": "2026-11-26", "configs": {"smallcnn": {
        "runs": 2, "schemes": tta.summarize(curves)}}}
    text = bench.markdown(results, args, {"cpu": "cpu", "cores": 2, "platform": "linux",
                                          "tensorflow": "2.21"})
    assert "--rhos 0.5 --shares 0.8,0.9" in text and "**smallcnn** (2 seed(s))" in text
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert rows[1].startswith("| Full training | 2 | 80.0% |")
    assert rows[2].startswith("| ElasticTrainer rho auto, share 0.9 | 2 | 79.8% | 0.2 | 5.0 s |")
    assert "refused: --rho 0.3 is below the floor" in rows[3]


def test_where_the_time_went_from_the_runs_summaries():
    """The costs table: each part read from a run's summary.json, the medians over seeds, and
    the time to within 1 point with the profiling paid and with the timing table read."""
    bench = load_script("bench_time_to_accuracy")
    full = [[(10.0, 70.0), (20.0, 80.0), (30.0, 81.0)]] * 3

    def summary(times, accs, fill, timing, compiling, probes):
        return {"train_time_s": times[-1], "measured_ratio": 0.25, "estimated_ratio": 0.2,
                "epochs": [{"train_time_s": t, "test_accuracy": a} for t, a in zip(times, accs)],
                # two stores: the cache filled again once, where a re-selection moved its cut
                "prefix_cache": {"fill_s": fill, "builds": [{}, {}]},
                "reselection_overhead_parts_s": {"timing full steps": timing,
                                                 "compiling": compiling, "importance": probes,
                                                 "solving": 0.5}}

    elastic = [tta.costs(summary((4.0, 8.0), (79.0, 80.5), fill, 1.0, 0.5, 0.25),
                         profiling_s=5.0) for fill in (2.0, 3.0, 7.0)]
    fixed = [tta.costs({"train_time_s": 9.0, "epochs": [
        {"train_time_s": 9.0, "test_accuracy": 80.2}]})] * 3
    assert elastic[0]["read"] == [(4.0, 79.0), (8.0, 80.5)] and fixed[0]["fill_s"] == 0.0
    out = tta.summarize_costs({"ElasticTrainer rho 0.3": elastic, "last stage": fixed}, full)
    row = out["ElasticTrainer rho 0.3"]
    assert row["fill_s"] == 3.0 and row["timing_s"] == 1.0 and row["probes_s"] == 0.75
    assert row["profiling_s"] == 5.0 and row["train_s"] == 8.0
    # within 1 point of 81.0: 80.5 at 8 s of training, 13 s with the profiling paid first
    assert row["pt1_s"] == 13.0 and row["pt1_read_s"] == 8.0
    assert out["last stage"]["pt1_s"] == out["last stage"]["pt1_read_s"] == 9.0
    args = bench.build_parser().parse_args(["--configs", "smallcnn"])
    results = {"date": "2026-11-27", "configs": {"smallcnn": {
        "runs": 3, "schemes": tta.summarize({"full_training": full}), "costs": out}}}
    text = bench.markdown(results, args, {"cpu": "cpu", "cores": 2, "platform": "linux",
                                          "tensorflow": "2.21"})
    assert "Where the time went, smallcnn" in text
    assert ("| ElasticTrainer rho 0.3 | 8.0 s | 3.0 s | 1.0 s | 0.5 s | 0.8 s | 5.0 s "
            "| 13.0 s | 8.0 s | 1 | 0.250 / 0.200 (4.0x) |") in text
    # a scheme that times no step has no ratio, and a cache that never moved no refill
    assert "| last stage | 9.0 s | 0.0 s | 0.0 s | 0.0 s | 0.0 s | 0.0 s | 9.0 s | 9.0 s | 0 | n/a |" in text


def test_main_puts_each_seeds_costs_together_and_names_where_it_wrote(tmp_path, monkeypatch):
    """main() over seeds: the costs table has the schemes every seed trained (one refused on a
    seed has none), the header names --out when the results went elsewhere, and the figure
    its seed."""
    import json

    bench = load_script("bench_time_to_accuracy")
    full = {"train_time_s": 20.0, "epochs": [{"train_time_s": 10.0, "test_accuracy": 70.0},
                                             {"train_time_s": 20.0, "test_accuracy": 80.0}]}
    fast = {"train_time_s": 8.0, "epochs": [{"train_time_s": 8.0, "test_accuracy": 79.5}]}

    def scripted_runs(name, seed, args, log):
        curves = {"full_training": tta.curve(full), "ElasticTrainer rho 0.3": tta.curve(fast)}
        costs = {"full_training": tta.costs(full),
                 "ElasticTrainer rho 0.3": tta.costs(fast, profiling_s=2.0)}
        if seed == 1:  # refused on this seed: a curve's reason, no costs
            curves["ElasticTrainer rho 0.3"] = tta.Refused("--rho 0.3 is below the floor")
            del costs["ElasticTrainer rho 0.3"]
        return curves, costs

    monkeypatch.setattr(bench, "cli_runs", scripted_runs)
    from elastictrainer.plotting import time_to_accuracy as ptta

    titles = []  # the figure shows one seed's curves, and says which
    monkeypatch.setattr(ptta, "draw", lambda curves, out, title="": titles.append(title))
    out = tmp_path / "tta"
    assert bench.main(["--configs", "smallcnn", "--seeds", "2,0", "--rhos", "0.3",
                       "--out", str(out)]) == 0
    assert titles == ["smallcnn, seed 2"]
    costs = json.loads((tmp_path / "tta.json").read_text())["configs"]["smallcnn"]["costs"]
    assert costs["ElasticTrainer rho 0.3"]["pt1_s"] == 10.0
    assert costs["ElasticTrainer rho 0.3"]["pt1_read_s"] == 8.0
    text = (tmp_path / "tta.md").read_text()
    # each configuration's own epochs: no --epochs unless given
    assert f"--shares 0.5,0.7,0.9 --out {out}`" in text and "--epochs" not in text
    assert "Where the time went, smallcnn" in text
    bench.main(["--configs", "smallcnn", "--seeds", "0,1", "--rhos", "0.3", "--out", str(out)])
    costs = json.loads((tmp_path / "tta.json").read_text())["configs"]["smallcnn"]["costs"]
    assert list(costs) == ["full_training"]


def test_an_unknown_configuration_is_refused_before_any_run(tmp_path):
    import pytest

    from elastictrainer.errors import UserError

    bench = load_script("bench_time_to_accuracy")
    with pytest.raises(UserError, match="unknown configuration 'nope'; valid: smallcnn"):
        bench.main(["--configs", "smallcnn,nope", "--logdir", str(tmp_path / "logs"),
                    "--out", str(tmp_path / "tta")])
    assert not (tmp_path / "logs").exists() and not list(tmp_path.iterdir())
    with pytest.raises(UserError, match="--views_too must be a positive integer, got 0"):
        bench.main(["--configs", "smallcnn", "--views_too", "0", "--logdir",
                    str(tmp_path / "logs"), "--out", str(tmp_path / "tta")])
    assert not list(tmp_path.iterdir())


def test_a_model_fit_seed_that_has_run_is_read_back_not_run_again(tmp_path, monkeypatch):
    from elastictrainer import runlog
    from elastictrainer.experiments import fit_task

    bench = load_script("bench_time_to_accuracy")
    args = bench.build_parser().parse_args(["--configs", "keras3_fit", "--other_seeds", "0,1",
                                            "--rhos", "0.3", "--shares", "0.7",
                                            "--logdir", str(tmp_path)])
    assert args.other_seeds == (0, 1)
    curves = {"plain_fit": [(10.0, 70.0), (20.0, 80.0)], "hand_frozen": [(5.0, 75.0)],
              "ElasticCallback rho 0.3": tta.Refused("--rho 0.3 is below the floor"),
              "ElasticCallback rho auto, share 0.7": [(4.0, 79.5)]}
    (tmp_path / "keras3_fit").mkdir()
    runlog.write_json(str(tmp_path / "keras3_fit" / "curves_seed1.json"), curves)

    def no_training(*a, **k):
        raise AssertionError("a finished seed was trained again")

    monkeypatch.setattr(fit_task, "PretrainedTask", no_training)
    back, costs = bench.fit_runs("keras3_fit", 1, args, log=print)
    assert back == curves and costs == {}
    assert isinstance(back["ElasticCallback rho 0.3"], tta.Refused)
    assert list(back) == list(curves)  # the reference (plain fit) first
    # a seed with a scheme missing from its file runs
    args = bench.build_parser().parse_args(["--rhos", "0.3,0.2", "--shares", "0.7",
                                            "--logdir", str(tmp_path)])
    import pytest

    with pytest.raises(AssertionError, match="trained again"):
        bench.fit_runs("keras3_fit", 1, args, log=print)
    text = bench.markdown({"date": "2026-11-26", "configs": {}}, args,
                          {"cpu": "cpu", "cores": 2, "platform": "linux", "tensorflow": "2.21"})
    assert "--seeds 0,1,2,3,4 --other_seeds 0 --rhos 0.3,0.2" in text


def test_the_first_profiling_is_timed_after_a_warm_up_and_read_back_after(tmp_path,
                                                                           monkeypatch):
    import json

    import elastictrainer
    from elastictrainer.experiments import first_profiling
    from elastictrainer.profiler import run as profiler_run

    monkeypatch.chdir(tmp_path)  # the table's default path is relative
    cfg = elastictrainer.Config(model_name="smallcnn", weights="none", input_size=16,
                                batch_size=2, logdir=str(tmp_path / "logs"))
    events = []

    def recorded_warm_up(c):
        first_profiling.warm_up(c, steps=1)  # the real one, on the configuration's model
        events.append("warm-up")

    monkeypatch.setattr(profiler_run, "load_or_profile",
                        lambda *a, **k: events.append("profiling"))
    # a record from before the warm-up rule is measured again
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "profile_seconds.json").write_text('{"seconds": 99.0}')
    seconds = first_profiling.seconds(cfg, print, warm=recorded_warm_up)
    assert events == ["warm-up", "profiling"] and seconds < 99.0
    kept = json.loads((tmp_path / "logs" / "profile_seconds.json").read_text())
    assert kept["warm"] is True and kept["seconds"] == seconds
    # read, not measured
    assert first_profiling.seconds(cfg, print, warm=recorded_warm_up) == seconds
    assert events == ["warm-up", "profiling"]


def test_the_levels_are_printed_with_full_trainings_epoch_to_epoch_spread():
    """Each level's median over seeds, and the noise beside it: the largest minus the smallest
    test accuracy of full training's last two epochs, median over seeds."""
    bench = load_script("bench_time_to_accuracy")
    full = [[(1.0, 60.0), (2.0, 79.0), (3.0, 80.0), (4.0, 78.5)],   # spread 1.5, best 80
            [(1.0, 61.0), (2.0, 70.0), (3.0, 71.0), (4.0, 70.5)],   # spread 0.5, best 71
            [(1.0, 62.0), (2.0, 90.0), (3.0, 86.0), (4.0, 89.0)]]   # spread 3.0, best 90
    levels = tta.noise(full)
    assert levels["spread"] == 1.5 and levels["epochs"] == 2
    assert tta.noise(full, last=3)["spread"] == 1.5  # 1.5, 1.0 and 4.0
    assert levels["pt1"] == 79.0 and levels["p95"] == 0.95 * 80.0
    assert tta.noise([tta.Refused("no")]) == {}
    args = bench.build_parser().parse_args(["--configs", "smallcnn"])
    results = {"date": "2026-11-27", "configs": {"smallcnn": {
        "runs": 3, "schemes": tta.summarize({"full_training": full}), "levels": levels}}}
    text = bench.markdown(results, args, {"cpu": "cpu", "cores": 2, "platform": "linux",
                                          "tensorflow": "2.21"})
    assert ("95% of full's best 76.0%, 99% of full's best 79.2%, within 1 point 79.0%; full "
            "training's test accuracy moves by 1.5 points over its last 2 epochs") in text


def test_the_paper_regime_configuration_is_the_papers_optimizer_and_its_baselines():
    """mobilenetv2_paper: MobileNetV2 pretrained offline, fine-tuned with SGD (the paper's:
    momentum, cosine decay, decoupled weight decay) at a small batch for its own epochs, with
    BN+Bias among its baselines; --epochs overrides every configuration's."""
    bench = load_script("bench_time_to_accuracy")
    setup = bench.CONFIGS["mobilenetv2_paper"]
    assert setup.fields["model_name"] == "mobilenetv2" and setup.fields["optimizer"] == "sgd"
    assert setup.fields["weights"] == "synthetic" and setup.fields["batch_size"] <= 8
    assert setup.baselines == ("bn_plus_bias_training",) and setup.epochs == 8
    assert "mobilenetv2_96" not in bench.CONFIG_NAMES
    assert bench.build_parser().parse_args([]).epochs is None
    assert bench.build_parser().parse_args(["--epochs", "3"]).epochs == 3


def test_the_command_lines_domain_shift_is_the_paper_regime_on_the_shifted_target():
    """domain_shift_cli: mobilenetv2_paper's settings, its target seen through the domain
    shift (--dataset_name synthetic_shifted), so the two differ by the shift alone."""
    bench = load_script("bench_time_to_accuracy")
    paper, shifted = bench.CONFIGS["mobilenetv2_paper"], bench.CONFIGS["domain_shift_cli"]
    assert shifted.fields == {**paper.fields, "dataset_name": "synthetic_shifted"}
    assert (shifted.last_stage, shifted.epochs) == (paper.last_stage, paper.epochs)


def _scripted_cli_runs(monkeypatch):
    """The benchmark script with every run scripted (one epoch at 50% in 4 s) and a first
    profiling of 3 s: (the script's module, the Configs it was asked to run)."""
    import elastictrainer

    bench = load_script("bench_time_to_accuracy")
    seen = []

    def scripted_run(cfg, log):
        seen.append(cfg)
        return {"train_time_s": 4.0, "epochs": [{"train_time_s": 4.0, "test_accuracy": 50.0}]}

    monkeypatch.setattr(bench.first_profiling, "seconds", lambda cfg, log: 3.0)
    monkeypatch.setattr(elastictrainer, "run", scripted_run)
    return bench, seen


def test_a_configuration_runs_its_baselines_for_its_own_epochs(tmp_path, monkeypatch):
    """cli_runs trains full training, traditional TL, the configuration's baselines, the last
    stage uncached and cached, each rho and each share, all for the configuration's epochs,
    and adds the first profiling to the elastic runs' curves only."""
    bench, seen = _scripted_cli_runs(monkeypatch)
    args = bench.build_parser().parse_args(["--configs", "mobilenetv2_paper", "--rhos", "0.3",
                                            "--shares", "0.7", "--logdir", str(tmp_path)])
    curves, costs = bench.cli_runs("mobilenetv2_paper", 0, args, log=lambda m: None)
    kinds = [(c.train_type, c.cache_frozen_prefix, c.rho) for c in seen]
    assert [k[0] for k in kinds[:3]] == ["full_training", "traditional_tl_training",
                                         "bn_plus_bias_training"]
    assert kinds[3][1] is False and kinds[4][1] == "auto" and kinds[3][0] == kinds[4][0]
    assert [k[2] for k in kinds[5:]] == [0.3, "auto"]
    assert {c.num_epochs for c in seen} == {8} and {c.optimizer for c in seen} == {"sgd"}
    assert curves["bn_plus_bias_training"] == [(4.0, 50.0)]
    assert curves["ElasticTrainer rho 0.3"] == [(7.0, 50.0)]
    assert costs["ElasticTrainer rho 0.3"]["profiling_s"] == 3.0
    assert {c.rho_objective for c in seen} == {"share"}
    # --rate: one more run, rho auto with the rate objective
    seen.clear()
    args = bench.build_parser().parse_args(["--configs", "mobilenetv2_paper", "--rhos", "0.3",
                                            "--shares", "0.7", "--rate", "--logdir",
                                            str(tmp_path / "rate")])
    curves, _ = bench.cli_runs("mobilenetv2_paper", 0, args, log=lambda m: None)
    assert [(c.rho, c.rho_objective) for c in seen[-2:]] == [("auto", "share"), ("auto", "rate")]
    assert "ElasticTrainer rho auto, rate" in curves
    assert "--shares 0.7 --rate" in bench.markdown({"date": "d", "configs": {}}, args, {
        "cpu": "cpu", "cores": 2, "platform": "linux", "tensorflow": "2.21"})
    # --elastic_only: full training, the yardstick, and the elastic runs alone
    seen.clear()
    args = bench.build_parser().parse_args(["--configs", "mobilenetv2_paper", "--rhos", "0.3",
                                            "--shares", "0.7", "--elastic_only", "--logdir",
                                            str(tmp_path / "elastic_only")])
    curves, _ = bench.cli_runs("mobilenetv2_paper", 0, args, log=lambda m: None)
    assert [(c.train_type, c.rho) for c in seen] == [
        ("full_training", 0.5), ("elastic_training", 0.3), ("elastic_training", "auto")]
    assert list(curves) == ["full_training", "ElasticTrainer rho 0.3",
                            "ElasticTrainer rho auto, share 0.7"]
    assert "--elastic_only" in bench.markdown({"date": "d", "configs": {}}, args, {
        "cpu": "cpu", "cores": 2, "platform": "linux", "tensorflow": "2.21"})
    # --bn_mode: every run of the configuration in that mode (each one's own, model, without)
    assert {c.bn_mode for c in seen} == {"model"}
    seen.clear()
    args = bench.build_parser().parse_args(["--configs", "mobilenetv2_paper", "--rhos", "0.3",
                                            "--shares", "0.7", "--bn_mode", "frozen",
                                            "--logdir", str(tmp_path / "frozen")])
    bench.cli_runs("mobilenetv2_paper", 0, args, log=lambda m: None)
    assert len(seen) == 7 and {c.bn_mode for c in seen} == {"frozen"}
    assert "--bn_mode frozen" in bench.markdown({"date": "d", "configs": {}}, args, {
        "cpu": "cpu", "cores": 2, "platform": "linux", "tensorflow": "2.21"})


def test_the_from_scratch_configuration_runs_each_elastic_run_uncached_too(tmp_path,
                                                                          monkeypatch):
    """smallcnn_scratch: random weights, and each elastic run again with the cache off (the
    same settings otherwise), labelled so; the other configurations run the default cache
    alone."""
    bench, seen = _scripted_cli_runs(monkeypatch)
    args = bench.build_parser().parse_args(["--configs", "smallcnn_scratch", "--rhos", "0.6",
                                            "--shares", "0.7", "--elastic_only", "--logdir",
                                            str(tmp_path)])
    curves, _ = bench.cli_runs("smallcnn_scratch", 0, args, log=lambda m: None)
    assert [(c.rho, c.cache_frozen_prefix) for c in seen[1:]] == [
        (0.6, "auto"), ("auto", "auto"), (0.6, False), ("auto", False)]
    assert {c.weights for c in seen} == {"none"} and {c.num_epochs for c in seen} == {4}
    assert list(curves)[3:] == ["ElasticTrainer rho 0.6, uncached",
                                "ElasticTrainer rho auto, share 0.7, uncached"]
    assert not any(s.uncached_too for n, s in bench.CONFIGS.items() if n != "smallcnn_scratch")


def test_uncached_too_runs_each_elastic_scheme_again_without_the_cache(tmp_path,
                                                                       monkeypatch):
    """--uncached_too: on a configuration that caches, each elastic run again with the cache
    off, labelled so, and the table's command line says it; full training is run once."""
    bench, seen = _scripted_cli_runs(monkeypatch)
    args = bench.build_parser().parse_args(["--configs", "smallcnn", "--rhos", "0.5",
                                            "--shares", "0.7", "--elastic_only", "--uncached_too",
                                            "--logdir", str(tmp_path)])
    curves, _ = bench.cli_runs("smallcnn", 0, args, log=lambda m: None)
    assert [(c.train_type, c.cache_frozen_prefix) for c in seen] == [
        ("full_training", "auto")] + [("elastic_training", "auto")] * 2 + [
        ("elastic_training", False)] * 2
    assert [c.rho for c in seen[1:]] == [0.5, "auto", 0.5, "auto"]
    assert list(curves)[3:] == ["ElasticTrainer rho 0.5, uncached",
                                "ElasticTrainer rho auto, share 0.7, uncached"]
    text = bench.markdown({"date": "2026-12-06", "configs": {}}, args,
                          {"cpu": "cpu", "cores": 2, "platform": "linux", "tensorflow": "2.21"})
    assert " --elastic_only --uncached_too" in text


def test_views_too_runs_each_elastic_scheme_again_cached_with_that_many_views(tmp_path,
                                                                             monkeypatch):
    """--views_too N: each elastic run again with the cache on and N views of each image,
    labelled so, beside the uncached ones; the table's command line says it."""
    bench, seen = _scripted_cli_runs(monkeypatch)
    args = bench.build_parser().parse_args(["--configs", "smallcnn", "--rhos", "0.5",
                                            "--shares", "0.7", "--elastic_only", "--uncached_too",
                                            "--views_too", "4", "--logdir", str(tmp_path)])
    curves, _ = bench.cli_runs("smallcnn", 0, args, log=lambda m: None)
    assert [(c.rho, c.cache_frozen_prefix, c.cache_views) for c in seen[1:]] == [
        (0.5, "auto", 0), ("auto", "auto", 0), (0.5, False, 0), ("auto", False, 0),
        (0.5, True, 4), ("auto", True, 4)]
    assert list(curves)[5:] == ["ElasticTrainer rho 0.5, 4 views cached",
                                "ElasticTrainer rho auto, share 0.7, 4 views cached"]
    text = bench.markdown({"date": "2026-12-06", "configs": {}}, args,
                          {"cpu": "cpu", "cores": 2, "platform": "linux", "tensorflow": "2.21"})
    assert " --uncached_too --views_too 4" in text


def test_the_learning_rate_sweep_reads_the_grids_run_and_trains_the_other_rates(tmp_path,
                                                                                  monkeypatch):
    """--lr_sweep trains full training at each other rate on the first seed, reads the
    configuration's own rate from the grid's run, and its table marks the chosen rate."""
    import dataclasses

    import elastictrainer
    from elastictrainer import runlog

    bench = load_script("bench_time_to_accuracy")
    trained = []

    def scripted_run(cfg, log):
        trained.append(cfg.learning_rate)
        acc = {0.01: 10.0, 0.0001: 70.0}[cfg.learning_rate]
        return {"train_time_s": 5.0, "epochs": [{"train_time_s": 5.0, "test_accuracy": acc}]}

    own = bench.CONFIGS["mobilenetv2_paper"].fields["learning_rate"]
    grid_run = tmp_path / "mobilenetv2_paper" / "full_training_seed0"
    grid_run.mkdir(parents=True)
    runlog.write_json(str(grid_run / "summary.json"), {"status": "finished", "train_time_s": 5.0,
                      "epochs": [{"train_time_s": 5.0, "test_accuracy": 80.0}]})
    monkeypatch.setattr(elastictrainer, "run", scripted_run)
    args = bench.build_parser().parse_args(["--configs", "mobilenetv2_paper", "--lr_sweep",
                                            f"0.01,{own:g},0.0001", "--logdir", str(tmp_path)])
    # the grid's full training run, with its settings as a run writes them
    grid = dataclasses.replace(bench._base_config("mobilenetv2_paper", 0, args),
                               train_type="full_training", run_name="full_training_seed0")
    runlog.write_json(str(grid_run / runlog.CONFIG_FILE), dataclasses.asdict(grid))
    sweep = bench.lr_sweep("mobilenetv2_paper", 0, args, log=lambda m: None)
    assert sorted(trained) == [0.0001, 0.01]  # the configuration's own rate was read back
    assert list(sweep["curves"]) == ["0.01", f"{own:g}", "0.0001"]
    table = bench.tta.lr_sweep_table(sweep)
    assert f"| {own:g} (chosen) | 80.0% | 80.0 |" in table and "| 0.01 | 10.0% | 10.0 |" in table
    text = bench.markdown({"date": "2026-11-27", "configs": {"mobilenetv2_paper": {
        "runs": 1, "schemes": {}, "lr_sweep": sweep}}}, args,
        {"cpu": "cpu", "cores": 2, "platform": "linux", "tensorflow": "2.21"})
    assert f"--lr_sweep 0.01,{own:g},0.0001" in text and "Full training's learning rate" in text
    # the seeds flag of the configurations that ran: --other_seeds alone here
    assert "--configs mobilenetv2_paper --other_seeds 0 --rhos" in text


def test_the_paper_regime_is_the_offline_figures_protocol():
    """mobilenetv2_paper reads its settings from the figures' OFFLINE protocol, and they are
    still the ones its table was measured with."""
    from elastictrainer.experiments.protocols import OFFLINE

    bench = load_script("bench_time_to_accuracy")
    setup = bench.CONFIGS["mobilenetv2_paper"]
    assert setup.fields == dict(model_name="mobilenetv2", weights="synthetic",
                                dataset_name="synthetic", num_train=2000, num_test=4096,
                                input_size=96, batch_size=8, optimizer="sgd",
                                learning_rate=0.001)
    assert setup.epochs == 8 == OFFLINE.num_epochs and setup.last_stage == 134
    flags = OFFLINE.flags("mobilenetv2")
    assert {k: flags[k] for k in setup.fields if k in flags} == {
        k: v for k, v in setup.fields.items() if k in flags}


def test_the_domain_shift_configuration_runs_the_users_schemes_on_its_own_task():
    """domain_shift_fit: Keras' MobileNetV2 on shifted target images, its schemes the user's
    (plain fit, the last stage by hand, ElasticCallback(rho="auto") at its defaults and with
    trial_check, rho=0.3 with bn_mode inference) whatever --rhos, --shares and --fit_bn_mode say, while
    keras3_fit's still follow them."""
    from elastictrainer.experiments import fit_configs, fit_task

    bench = load_script("bench_time_to_accuracy")
    assert {"keras3_fit", "domain_shift_fit"} <= set(bench.CONFIG_NAMES)
    args = bench.build_parser().parse_args(["--configs", "domain_shift_fit", "--rhos", "0.5",
                                            "--shares", "0.9", "--fit_bn_mode", "model"])
    variants = fit_configs.fit_variants("domain_shift_fit", args)
    assert variants == [("plain_fit", None, None), ("hand_frozen", "block_13_", None),
                        ("ElasticCallback rho auto", None, {"rho": "auto"}),
                        ("ElasticCallback rho auto, trial check", None,
                         {"rho": "auto", "trial_check": True}),
                        ("ElasticCallback rho 0.3, bn_mode inference", None,
                         {"rho": 0.3, "bn_mode": "inference"})]
    assert [v[0] for v in fit_configs.fit_variants("keras3_fit", args)] == [
        "plain_fit", "hand_frozen", "ElasticCallback rho 0.5",
        "ElasticCallback rho auto, share 0.9"]
    assert fit_configs.fit_variants("keras3_fit", args)[2][2] == {"rho": 0.5,
                                                                  "bn_mode": "model"}
    args.uncached_too = True  # each ElasticCallback again with the cache off, in both kinds
    assert [v[0] for v in fit_configs.fit_variants("keras3_fit", args)][4:] == [
        "ElasticCallback rho 0.5, uncached", "ElasticCallback rho auto, share 0.9, uncached"]
    assert fit_configs.fit_variants("keras3_fit", args)[4][2] == {
        "rho": 0.5, "bn_mode": "model", "cache_frozen_prefix": False}
    assert fit_configs.fit_variants("domain_shift_fit", args)[5][2] == {
        "rho": "auto", "cache_frozen_prefix": False}
    args.uncached_too = False
    settings = fit_configs.fit_settings("domain_shift_fit", args)
    assert settings["epochs"] == 8 and settings["batch_size"] == 16
    assert settings["domain_shift"]["colour"] and settings["domain_shift"]["noise"] > 0
    assert fit_configs.fit_settings("keras3_fit", args)["domain_shift"] is None
    task = fit_task.SHIFTED_MOBILENETV2
    assert task.shift is not None and fit_task.CNN.shift is None
    assert task.optimizer is not fit_task.CNN.optimizer  # SGD with momentum, not Adam
    machine = {"cpu": "cpu", "cores": 2, "platform": "linux", "tensorflow": "2.21.0"}
    header = bench.markdown({"date": "d", "configs": {}}, args, machine)
    assert "--rhos" not in header and "--shares" not in header and "--other_seeds 0`" in header
    both = bench.build_parser().parse_args(["--configs", "domain_shift_fit,keras3_fit",
                                            "--rhos", "0.5", "--shares", "0.9"])
    assert "--rhos 0.5 --shares 0.9" in bench.markdown({"date": "d", "configs": {}}, both,
                                                       machine)


def test_a_model_fit_seed_trains_each_scheme_on_its_configurations_task(tmp_path,
                                                                        monkeypatch):
    """fit_runs with the task stubbed: the configuration's task is the one pretrained, the hand
    baseline freezes below its last stage, each callback gets its settings, and the seed's
    curves are written, then read back."""
    import json

    import keras

    from elastictrainer.experiments import fit_configs, fit_task

    bench = load_script("bench_time_to_accuracy")
    built, frozen, callbacks = [], [], []

    class Model:
        def fit(self, train, epochs, validation_data, verbose, callbacks):
            clock = callbacks[0]
            clock.on_train_begin()
            for epoch in range(epochs):
                clock.on_epoch_begin(epoch)
                clock.on_train_batch_end(0)
                clock.on_epoch_end(epoch, {"val_accuracy": 0.1 * (epoch + 1)})

    class Task:
        def __init__(self, keras_, workdir, seed, log, task):
            built.append(task)
            self.train = self.test = None

        def warm_up(self):
            pass

        def fresh(self, frozen_below=None):
            frozen.append(frozen_below)
            return Model()

    monkeypatch.setattr(fit_task, "PretrainedTask", Task)
    monkeypatch.setattr(fit_task, "first_run_callback",
                        lambda logdir, log=None, **s: callbacks.append(s) or keras.callbacks.Callback())
    args = bench.build_parser().parse_args(["--configs", "domain_shift_fit", "--epochs", "2",
                                            "--logdir", str(tmp_path)])
    curves, costs = bench.fit_runs("domain_shift_fit", 0, args, log=lambda m: None)
    assert built == [fit_task.SHIFTED_MOBILENETV2] and costs == {}
    assert frozen == [None, "block_13_", None, None, None]
    assert callbacks == [{"rho": "auto"}, {"rho": "auto", "trial_check": True},
                         {"rho": 0.3, "bn_mode": "inference"}]
    assert [a for _, a in curves["ElasticCallback rho auto"]] == [10.0, 20.0]
    kept = json.loads((tmp_path / "domain_shift_fit" / "curves_seed0.json").read_text())
    assert list(kept) == list(curves)
    assert fit_configs.fit_runs("domain_shift_fit", 0, args, log=lambda m: None)[0] == curves
    assert len(built) == 1  # read back, not run again


def test_the_hand_frozen_baseline_freezes_the_layers_with_weights_before_the_last_stage():
    from types import SimpleNamespace

    from elastictrainer.experiments import fit_task

    def layer(name, weights=True):
        return SimpleNamespace(name=name, weights=[0] if weights else [])

    layers = [layer("input", False), layer("stage0_conv0"), layer("re_lu", False),
              layer("stage1_bn0"), layer("stage2_conv0"), layer("stage2_bn0"), layer("head")]
    assert [x.name for x in fit_task.frozen_before(layers, "stage2")] == ["stage0_conv0",
                                                                          "stage1_bn0"]
    import pytest

    with pytest.raises(ValueError, match="no layer is named block_13_"):
        fit_task.frozen_before(layers, "block_13_")
    # a nested model's layers count in its place
    nested = SimpleNamespace(name="app", weights=[0], layers=layers[1:4] + layers[4:6])
    assert [x.name for x in fit_task.frozen_before([layers[0], nested, layers[-1]],
                                                   "stage2")] == ["stage0_conv0", "stage1_bn0"]


def test_the_shifted_tasks_mobilenetv2_has_its_last_stage_where_the_baseline_cuts():
    """Keras' own MobileNetV2, flat, with the layers named block_13_ onwards and the head
    trained by hand (the last resolution stage), its BatchNorm averages not trailing a short
    fine-tune."""
    import keras

    from elastictrainer.experiments import fit_task

    task = fit_task.SHIFTED_MOBILENETV2
    model = task.build(keras, 10)
    names = [layer.name for layer in model.layers]
    assert names[-1] == "head" and "block_16_project" in names and "Conv1" in names
    frozen = {layer.name for layer in fit_task.frozen_before(model.layers, task.last_stage)}
    assert "block_12_project_BN" in frozen and "Conv1" in frozen
    assert not any(n.startswith(("block_13", "block_16", "Conv_1")) for n in frozen)
    # BatchNorm at the layer's default momentum, not the application's 0.999
    norms = [x for x in model.layers if isinstance(x, keras.layers.BatchNormalization)]
    assert len(norms) == 52 and {x.momentum for x in norms} == {fit_task.MNV2_BN_MOMENTUM}


def test_after_pretraining_batchnorms_moving_statistics_are_the_final_weights():
    """recalibrate_batchnorm: the moving mean and variance come to the batches' own, the
    weights stay, and each layer's momentum is put back."""
    import keras
    import numpy as np
    import tensorflow as tf

    from elastictrainer.experiments import fit_task

    inputs = keras.Input((4,))
    norm = keras.layers.BatchNormalization(momentum=0.999)
    # nested, as an application inside a user's model holds its BatchNorm layers
    inner = keras.Model(inputs, norm(inputs))
    outer = keras.Input((4,))
    model = keras.Model(outer, keras.layers.Dense(2)(inner(outer)))
    weights = [w.numpy().copy() for w in model.trainable_weights]
    rng = np.random.default_rng(0)
    x = tf.constant(5.0 + 2.0 * rng.standard_normal((256, 4)), tf.float32)
    batches = [(x[i:i + 32], None) for i in range(0, 256, 32)] * 6
    fit_task.recalibrate_batchnorm(keras, model, batches)
    np.testing.assert_allclose(norm.moving_mean.numpy(), x.numpy().mean(axis=0), atol=0.3)
    np.testing.assert_allclose(norm.moving_variance.numpy(), x.numpy().var(axis=0), rtol=0.25)
    assert norm.momentum == 0.999
    assert all(np.array_equal(w, v.numpy()) for w, v in zip(weights, model.trainable_weights))


def test_the_nested_tasks_application_is_one_layer_at_its_own_batchnorm_momentum():
    """domain_shift_nested: MobileNetV2 as the transfer-learning guide nests it, the hand-frozen
    baseline reaching into it, its BatchNorm at the application's 0.999."""
    import keras

    from elastictrainer.experiments import fit_task

    task = fit_task.SHIFTED_NESTED_MOBILENETV2
    model = task.build(keras, 10)
    assert [layer.name for layer in model.layers][-1] == "head" and len(model.layers) == 4
    frozen = {layer.name for layer in fit_task.frozen_before(model.layers, task.last_stage)}
    assert "block_15_project_BN" in frozen and "Conv1" in frozen
    assert not any(n.startswith(("block_16", "Conv_1", "head")) for n in frozen)
    norms = fit_task.batchnorm_layers(keras, model)
    assert len(norms) == 52 and {x.momentum for x in norms} == {0.999}


def test_a_seed_the_figures_file_holds_is_read_back_under_the_same_grid_only(tmp_path,
                                                                              monkeypatch):
    """A grid continues from its committed figures: a seed <out>.json holds from this machine,
    with the same grid flags and settings, is read back (curves, refusals and costs), not run
    again; another rho, another machine's file, or a file that holds only median costs make the
    difference they should."""
    import json

    bench = load_script("bench_time_to_accuracy")
    full = {"train_time_s": 20.0, "epochs": [{"train_time_s": 10.0, "test_accuracy": 70.0},
                                             {"train_time_s": 20.0, "test_accuracy": 80.0}]}
    fast = {"train_time_s": 8.0, "epochs": [{"train_time_s": 8.0, "test_accuracy": 79.5}]}
    ran = []

    def scripted_runs(name, seed, args, log):
        ran.append((seed, tuple(args.rhos)))
        labels = [label for label, _, _ in bench.cli_schemes(name, args)]
        curves = {label: tta.curve(full if label == "full_training" else fast)
                  for label in labels}
        costs = {label: tta.costs(fast, profiling_s=2.0) for label in labels}
        if seed == 1:  # refused on this seed: read back as a refusal, not a curve
            curves["ElasticTrainer rho 0.3"] = tta.Refused("--rho 0.3 is below the floor")
            del costs["ElasticTrainer rho 0.3"]
        return curves, costs

    monkeypatch.setattr(bench, "cli_runs", scripted_runs)
    monkeypatch.setattr(bench, "plot", lambda first_seed, out: [])
    out = str(tmp_path / "tta")
    grid = ["--configs", "smallcnn", "--rhos", "0.3", "--shares", "0.7", "--out", out]
    bench.main(grid + ["--seeds", "0,1"])
    first = json.loads((tmp_path / "tta.json").read_text())["configs"]["smallcnn"]
    assert ran == [(0, (0.3,)), (1, (0.3,))]
    bench.main(grid + ["--seeds", "0,1,2"])
    assert ran[2:] == [(2, (0.3,))]  # seeds 0 and 1 read back
    again = json.loads((tmp_path / "tta.json").read_text())["configs"]["smallcnn"]
    assert again["curves"]["full_training"][:2] == first["curves"]["full_training"]
    assert again["schemes"]["ElasticTrainer rho 0.3"]["refused"] == "--rho 0.3 is below the floor"
    assert again["costs_seeds"] == [0, 1, 2]
    bench.main(grid[:2] + ["--rhos", "0.4"] + grid[4:] + ["--seeds", "0"])
    assert ran[3:] == [(0, (0.4,))]  # another grid: run
    # a file from another machine is no record of this one's
    data = json.loads((tmp_path / "tta.json").read_text())
    (tmp_path / "tta.json").write_text(json.dumps({**data, "machine": {"cpu": "elsewhere"}}))
    bench.main(grid[:2] + ["--rhos", "0.4"] + grid[4:] + ["--seeds", "0"])
    assert ran[4:] == [(0, (0.4,))]
    # a file that holds only median costs gives its seeds' curves; the costs table says over
    # which seeds it runs
    bench.main(grid[:2] + ["--rhos", "0.4"] + grid[4:] + ["--seeds", "0"])
    data = json.loads((tmp_path / "tta.json").read_text())
    del data["configs"]["smallcnn"]["costs_per_seed"]
    (tmp_path / "tta.json").write_text(json.dumps(data))
    bench.main(grid[:2] + ["--rhos", "0.4"] + grid[4:] + ["--seeds", "0,3"])
    assert ran[5:] == [(3, (0.4,))]
    assert "(median seconds of seed(s) 3, the ones whose costs are on record;" in (
        tmp_path / "tta.md").read_text()


def test_a_finished_run_is_read_back_only_with_the_settings_the_grid_gives_it(tmp_path,
                                                                              monkeypatch):
    """A run directory that finished with the grid's settings is read, not trained again,
    whatever it says of where it was written or of settings its config.json predates; one that
    finished with other settings (another --epochs into the same --logdir) stops the grid with
    one line naming the setting, rather than being read as the grid's, or taken for a refused
    run."""
    import dataclasses
    import json

    import pytest

    from elastictrainer import runlog
    from elastictrainer.experiments import recorded

    bench, seen = _scripted_cli_runs(monkeypatch)
    args = bench.build_parser().parse_args(["--configs", "mobilenetv2_paper", "--rhos", "0.3",
                                            "--shares", "0.7", "--elastic_only", "--logdir",
                                            str(tmp_path)])
    full = bench._base_config("mobilenetv2_paper", 0, args)
    full = dataclasses.replace(full, train_type="full_training", run_name="full_training_seed0")
    run_dir = tmp_path / "mobilenetv2_paper" / "full_training_seed0"
    run_dir.mkdir(parents=True)
    saved = {**dataclasses.asdict(full), "logdir": "elsewhere", "progress": True}
    del saved["trial_check"]  # written before the flag: its default
    (run_dir / runlog.CONFIG_FILE).write_text(json.dumps(saved))
    (run_dir / runlog.SUMMARY_FILE).write_text(json.dumps({
        "status": "finished", "train_time_s": 9.0,
        "epochs": [{"train_time_s": 9.0, "test_accuracy": 61.0}]}))
    curves, _ = bench.cli_runs("mobilenetv2_paper", 0, args, log=lambda m: None)
    assert curves["full_training"] == [(9.0, 61.0)]
    assert [c.train_type for c in seen] == ["elastic_training"] * 2
    (run_dir / runlog.CONFIG_FILE).write_text(json.dumps({**saved, "num_epochs": 4}))
    with pytest.raises(recorded.OtherSettings, match=r"full_training_seed0 holds a finished "
                                                     r"run with --num_epochs 4, not 8: pass "
                                                     r"another --logdir"):
        bench.cli_runs("mobilenetv2_paper", 0, args, log=lambda m: None)


def test_each_auto_again_flag_runs_each_rho_auto_scheme_again_with_its_setting():
    """--economy_off_too (and each AUTO_AGAIN flag): each --rho auto scheme (ElasticCallback's
    too) again with its one setting changed, not a numeric rho; the table's command line says
    which flags ran."""
    from elastictrainer.experiments import cli_configs, fit_configs

    bench = load_script("bench_time_to_accuracy")
    args = bench.build_parser().parse_args(["--configs", "smallcnn", "--rhos", "0.5",
                                            "--shares", "0.7", "--elastic_only", "--pace_too",
                                            "--economy_off_too", "--trial_check_too"])
    auto = {"rho": "auto", "rho_share": 0.7}
    assert [(label, extra) for label, _, extra in cli_configs.cli_schemes("smallcnn", args)][1:] \
        == [("ElasticTrainer rho 0.5", {"rho": 0.5}),
            ("ElasticTrainer rho auto, share 0.7", auto),
            ("ElasticTrainer rho auto, share 0.7, pace check", {**auto, "pace_check": True}),
            ("ElasticTrainer rho auto, share 0.7, economy off", {**auto, "economy": False}),
            ("ElasticTrainer rho auto, share 0.7, trial check", {**auto, "trial_check": True})]
    off = [v for v in fit_configs.fit_variants("keras3_fit", args) if "economy off" in v[0]]
    assert [(s, c["economy"], c["rho"]) for s, _, c in off] == [
        ("ElasticCallback rho auto, share 0.7, economy off", False, "auto")]
    text = bench.markdown({"date": "2026-12-07", "configs": {}}, args,
                          {"cpu": "cpu", "cores": 2, "platform": "linux", "tensorflow": "2.21"})
    assert " --pace_too --economy_off_too --trial_check_too" in text
    # a configuration that already runs the trial check gets no second run of it
    checked = [s for s, _, c in fit_configs.fit_variants("domain_shift_fit", args)
               if c is not None and c.get("trial_check")]
    assert checked == ["ElasticCallback rho auto, trial check"]
