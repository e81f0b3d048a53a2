"""ElasticTrainer (MobiSys'23) on TensorFlow: on-device fine-tuning that trains, at any moment,
only the tensors that matter most within a requested step-time ratio rho.

Grouped by what each part does, in layers that import only downwards (docs/design.md):
    cli.py, keras.py   the commands; `from elastictrainer.keras import ElasticCallback`
    experiments/       the paper's figures as sweeps, compare, Ray sweeps, benchmark tables
    fit/               ElasticTrainer inside model.fit (ElasticCallback)
    config/            every command's settings (Config, the train command's), each with its
                       flag and help, and the docs' flag tables generated from them
    runs/              one run's lifecycle: setup, the loop, the recorder (summary.json,
                       TensorBoard, the closing line, for every driver), checkpoints, energy
    elastic/           the runtime: when to re-select, the closed loop on rho, overheads
    plotting/          the paper's figures from run directories
    profiler/          the Tensor Timing Profiler (Sec. 5): per-tensor t_dw / t_dy from a trace
    prefix/            the frozen prefix's activations cached (not in the paper)
    models/, data/     the model zoo and the datasets
    train/             compiled steps (one device, tf.distribute), one per selection, cached
    method/            the paper's method: time model and exact selector (eq. 3), importance
                       (eq. 4-6), the schemes
    runlog.py          run directories, TensorBoard tags, summary.json's format
    flavors/           the two Kerases, their optimizers, every private API (compat/)
    errors.py, machine.py

Importing the package imports no TensorFlow; `elastictrainer.run` and `elastictrainer.Config`
(the Python API: runs.loop.run, config.Config) load on first use.
"""
__version__ = "0.2.0"


def __getattr__(name):
    # PEP 562: the command line's `--help` must not wait for TensorFlow
    if name == "run":
        def run(cfg, *args, **kwargs):
            """runs.loop.run, after what the process needs before TensorFlow starts (--logical_cpus:
            distribution.prepare_process)."""
            from elastictrainer.train.distribution import prepare_process
            prepare_process(cfg)
            from elastictrainer.runs.loop import run as loop_run
            return loop_run(cfg, *args, **kwargs)
        return run
    if name == "Config":
        from elastictrainer.config import Config
        return Config
    raise AttributeError(f"module 'elastictrainer' has no attribute {name!r}")
