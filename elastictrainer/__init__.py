"""ElasticTrainer (MobiSys'23) on TensorFlow: on-device fine-tuning that trains, at any moment,
only the tensors that matter most within a requested step-time ratio rho.

One module per component of the paper:
    profiler/       Tensor Timing Profiler (Sec. 5): per-tensor t_dw / t_dy from a real trace
    time_model.py   the time model of eq. 3, calibrated
    importance.py   tensor importance (eq. 4-6) and the ablations
    selector.py     the exact DP tensor selector (eq. 3)
    elastic/        the runtime: when to re-select, the closed loop on rho, overhead accounting
    schemes.py      what each --train_type trains
    loop.py         the one training loop (run_setup.py sets a run up, run_hooks.py logs and
                    checkpoints it); trainer.py, engine.py its compiled steps
    models/, data/  the model zoo and the datasets
    runlog.py       run directories, TensorBoard tags, file formats
    plotting/       the paper's figures, one module per figure; figures.py runs them
    cli.py          `elastictrainer train|profile|plot|figure` (and main.py, profiler.py, plot.py)

Importing the package imports no TensorFlow; `elastictrainer.run` and `elastictrainer.Config`
(the Python API: loop.run, config.Config) load on first use.
"""
__version__ = "0.2.0"


def __getattr__(name):
    # PEP 562: the command line's `--help` must not wait for TensorFlow
    if name == "run":
        def run(cfg, *args, **kwargs):
            """loop.run, after what the process needs before TensorFlow starts (--logical_cpus:
            distribute.prepare_process)."""
            from elastictrainer.train.distribution import prepare_process
            prepare_process(cfg)
            from elastictrainer.runs.loop import run as loop_run
            return loop_run(cfg, *args, **kwargs)
        return run
    if name == "Config":
        from elastictrainer.config import Config
        return Config
    raise AttributeError(f"module 'elastictrainer' has no attribute {name!r}")
