"""Profiling in a child process, the parent's side: a fresh Python process builds the model
again by its name, profiles it and writes the table (run.child_main), so that its graphs, trace
and allocator high-water mark die with it; its phases come back, its failure as one UserError
line."""
import json
import os
import subprocess
import sys
import tempfile
import time

from elastictrainer.errors import UserError
from elastictrainer.profiler import table as tables


def profile_in_child(path, model_name, input_size, batch_size, num_classes, seed=0,
                     progress=True, optimizer="sgd", names=None, shapes=None, trace_dir=None,
                     run_steps=None):
    """Profile in a fresh Python process that builds `model_name` (weights "none": timings do
    not depend on their values), write the table at `path` and return it.

    The child's progress bar goes to this process's stderr; its failure comes back as one
    UserError line.  `names`/`shapes`: the caller's model's trainable tensors; the child checks
    its rebuilt model has the same shapes and writes the caller's names into the table (Keras
    numbers unnamed layers per process, so the names may differ).  run_steps: as
    run.profile_model's."""
    request = {"path": os.path.abspath(path), "model_name": model_name,
               "input_size": int(input_size), "batch_size": int(batch_size),
               "num_classes": int(num_classes), "seed": int(seed), "progress": bool(progress),
               "optimizer": optimizer, "names": names, "shapes": shapes,
               "trace_dir": trace_dir and os.path.abspath(trace_dir), "run_steps": run_steps}
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    # the child imports this very package, not another installed copy
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory(prefix="et_profile_") as tmp:
        request_file = os.path.join(tmp, "request.json")
        status_file = os.path.join(tmp, "status.json")
        with open(request_file, "w") as f:
            json.dump(dict(request, status=status_file), f)
        # wall-clock time (time.time) is the one clock both processes read alike
        spawned = time.time()
        proc = subprocess.Popen([sys.executable, "-c", _CHILD_CODE, request_file], env=env)
        try:
            code = proc.wait()
        except BaseException:  # Ctrl-C reached the child too; do not leave it behind
            proc.terminate()
            proc.wait()
            raise
        ended = time.time()
        status = {}
        if os.path.exists(status_file):
            with open(status_file) as f:
                status = json.load(f)
    if code == 0 and status.get("ok"):
        table = tables.load_table(path, input_size=input_size, batch_size=batch_size,
                                  optimizer=optimizer)
        # the child's own phases around profile_model's, for the caller's log (not the file)
        table["profiling_phases_s"] = dict(
            {"child_start": status["started"] - spawned}, **status["phases"],
            child_exit=ended - status["finished"])
        return table
    if status.get("error"):
        raise UserError(f"profiling {model_name} failed: {status['error']}")
    if code < 0:
        raise UserError(f"the profiling process of {model_name} was killed by signal {-code}"
                        f"{' (out of memory?)' if -code == 9 else ''}; profile with profiler.py "
                        f"and pass --timing_table")
    raise UserError(f"the profiling process of {model_name} exited with code {code}")


# the child's side is run.py's, beside the profile_model it runs
_CHILD_CODE = "from elastictrainer.profiler.run import child_main; child_main()"
