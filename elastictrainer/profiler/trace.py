"""Op times from the .xplane.pb that tf.profiler writes, read with TensorFlow's bundled
protobuf (the profile plugin's op tables stop at 500 rows, which silently drops ops)."""
import glob
import os
import re
from collections import defaultdict

# Call ops wrap other traced ops; counting them too would count their contents twice.
_CALL_OP_TYPES = {"PartitionedCall", "StatefulPartitionedCall", "While", "If", "StatelessIf",
                  "StatelessWhile", "Case"}
_OP_EVENT = re.compile(r"^([^\s:]+):([A-Za-z0-9_]+)$")

def find_xplane(logdir):
    """The newest .xplane.pb under a tf.profiler log directory."""
    files = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True),
                   key=os.path.getmtime)
    if not files:
        raise RuntimeError(f"tf.profiler wrote no .xplane.pb under {logdir}")
    return files[-1]


def read_op_times(xplane_path):
    """Total time (ms) and kernel type of every TensorFlow op in a trace, by op (node) name.

    Host ops are executor events named 'node:KernelType'.  Ops that ran on an accelerator are
    timed by the kernels that carry their name in the 'tf_op' stat of the device planes, which
    replace the host-side launch time.
    """
    from elastictrainer.flavors import compat

    space = compat.xplane_pb2().XSpace()
    with open(xplane_path, "rb") as f:
        space.ParseFromString(f.read())
    host = defaultdict(float)
    device = defaultdict(float)
    kernel_type = {}
    for plane in space.planes:
        is_device = plane.name.startswith("/device:") and not plane.name.startswith("/device:CPU")
        if not (is_device or plane.name.startswith("/host:")):
            continue
        stat_names = {k: m.name for k, m in plane.stat_metadata.items()}
        for line in plane.lines:
            for ev in line.events:
                md = plane.event_metadata[ev.metadata_id]
                if is_device:
                    tf_op = None
                    for s in list(ev.stats) + list(md.stats):
                        if stat_names.get(s.metadata_id) == "tf_op":
                            tf_op = s.str_value or (plane.stat_metadata[s.ref_value].name
                                                    if s.ref_value else None)
                            break
                    m = _OP_EVENT.match(tf_op or "")
                    if m:
                        device[m.group(1)] += ev.duration_ps / 1e9
                        kernel_type.setdefault(m.group(1), m.group(2))
                    continue
                m = _OP_EVENT.match(md.name)
                if not m or m.group(2) in _CALL_OP_TYPES:
                    continue
                host[m.group(1)] += ev.duration_ps / 1e9
                kernel_type.setdefault(m.group(1), m.group(2))
    times = dict(host)
    times.update(device)
    return times, kernel_type
