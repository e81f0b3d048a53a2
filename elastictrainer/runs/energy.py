"""Energy measurement during training, from the device's own sensors.

Readers (every path is below ``root``; see "Fake trees" at the end):

Jetson, INA3221 power monitors. The board's input rail (label ``VDD_IN``, or
``POM_5V_IN`` on Nano / TX2 NX) is used as the total; without one the rails
are summed and the source says ``sum(...), no input rail`` (e.g. AGX Orin,
whose INA3221s carry VDD_GPU_SOC, VDD_CPU_CV, VIN_SYS_5V0 only).

* iio layout (downstream ``ina3221x`` driver, JetPack <= 4: TX2, Nano, Xavier)::

      /sys/bus/i2c/drivers/ina3221x/<bus-addr>/iio:device<K>/
          rail_name_<N>        rail label, e.g. VDD_IN, VDD_SYS_GPU
          in_power<N>_input    power, mW
          in_voltage<N>_input  (mV)  in_current<N>_input (mA)   -- not used

* hwmon layout (mainline ``ina3221`` driver, JetPack >= 5: Orin; the hwmon
  number changes between boots, so it is globbed)::

      /sys/bus/i2c/drivers/ina3221/<bus-addr>/hwmon/hwmon<K>/
          in<N>_label          rail label (N = 1..3); "NC" = not connected
          in<N>_input          bus voltage, mV
          curr<N>_input        current, mA        -> power = mV * mA / 1000 mW
          in7_label            "sum of shunt voltages" (no curr7: skipped)

  (Linux Documentation/hwmon/ina3221.rst; NVIDIA Jetson Linux Developer Guide,
  "Platform Power and Performance".)  Power is sampled every ``interval_s``
  and integrated over time with the trapezoid rule.

x86, RAPL through powercap: ``/sys/class/powercap/intel-rapl:<N>/`` with
``name`` (``package-<N>``), ``energy_uj`` (cumulative energy, uJ) and
``max_energy_range_uj`` (the counter wraps to 0 past it). Only top-level
domains ``intel-rapl:<N>`` are read: subdomains ``intel-rapl:<N>:<M>`` (core,
uncore, dram) are parts of a package, and ``psys`` (laptops) contains the
packages, so reading either would count energy twice. Since Linux 5.10
``energy_uj`` is root-only by default; then RAPL is unavailable with that reason.

NVIDIA GPUs, NVML: ``nvmlDeviceGetTotalEnergyConsumption`` (mJ since the driver
loaded; Volta and newer) through ``pynvml`` from the optional ``nvidia-ml-py``.

Choice: on a workstation with both, NVML GPUs and RAPL packages are summed
(``source`` names both): training energy is GPU + CPU, and neither counter
contains the other. Neither includes DRAM (off-package), fans or PSU losses.
A Jetson's VDD_IN is the whole module, so it is used alone.

Fake trees: ``detect(root=...)`` reads ``<root>/sys/...``; when ``root`` is
left at "/" the environment variable ``ELASTICTRAINER_SYSFS_ROOT`` replaces it.

Why no library: zeus 0.16.0 requires numpy, pandas, scikit-learn, pydantic,
rich, tyro, httpx, amdsmi, python-dateutil, nvidia-ml-py (30 wheels, 78 MB
download, ~400 MB installed), hard-codes /sys, and polls Jetson rails in a
spawned process; jetson-stats 7.2.2 (smbus2, distro, nvidia-ml-py) reads only
through its root ``jtop.service`` socket. Each reader here is ~20 lines.
"""
from __future__ import annotations

import glob
import os
import re
import threading
import time
from typing import Callable

ENV_ROOT = "ELASTICTRAINER_SYSFS_ROOT"
INPUT_RAILS = ("VDD_IN", "POM_5V_IN")
MODES = ("auto", "none", "jetson", "nvml", "rapl")
__all__ = ["EnergyMeter", "NullMeter", "detect", "ENV_ROOT", "MODES"]


def _read_num(path: str) -> float:
    """Read one number from a sysfs file (module-level so tests can patch it)."""
    with open(path) as f:
        return float(f.read().strip())


def _read_str(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


class _PowerSource:
    """Instantaneous power in W; the meter integrates it (trapezoid rule)."""

    def __init__(self, name: str, read_w: Callable[[], float]):
        self.name, self.read_w = name, read_w
        self._prev: tuple[float, float] | None = None  # (time s, power W)

    def begin(self, now: float) -> None:
        self._prev = None  # stays None if the read fails; advance() retries
        self._prev = (now, self.read_w())

    def advance(self, now: float) -> float:
        if self._prev is None:
            self.begin(now)
            return 0.0
        p = self.read_w()  # read first: if it fails, the next call covers the gap
        t0, p0 = self._prev
        self._prev = (now, p)
        return (p + p0) / 2.0 * (now - t0)


class _CounterSource:
    """Cumulative energy counters in J (one per domain), each wrapping at its range.

    ``read_j`` returns the raw counters; ``ranges_j`` the wrap value of each
    (None: no wrap expected, a decrease means a reset and counts as 0).
    """

    def __init__(self, name: str, read_j: Callable[[], list[float]],
                 ranges_j: list[float | None]):
        self.name, self.read_j, self.ranges_j = name, read_j, ranges_j
        self._last: list[float] | None = None

    def begin(self, now: float) -> None:
        self._last = None
        self._last = self.read_j()

    def advance(self, now: float) -> float:
        if self._last is None:
            self.begin(now)
            return 0.0
        cur = self.read_j()
        total = 0.0
        for c, last, rng in zip(cur, self._last, self.ranges_j):
            d = c - last
            if d < 0:  # one wrap between reads; sampling often keeps it to one
                d = d + rng if rng else 0.0
            total += d
        self._last = cur
        return total


def _jetson(root: str) -> tuple[_PowerSource | None, str]:
    """Find INA3221 rails in either layout; return (source, reason-if-none)."""
    rails: list[tuple[str, Callable[[], float]]] = []
    layout = ""
    for name_file in sorted(glob.glob(os.path.join(
            root, "sys/bus/i2c/drivers/ina3221x/*/iio:device*/rail_name_*"))):
        n = name_file.rsplit("_", 1)[1]
        pwr = os.path.join(os.path.dirname(name_file), f"in_power{n}_input")
        if os.path.exists(pwr):
            rails.append((_read_str(name_file), lambda p=pwr: _read_num(p) / 1e3))
            layout = "jetson-tx2-ina3221x"
    if not rails:
        for label_file in sorted(glob.glob(os.path.join(
                root, "sys/bus/i2c/drivers/ina3221/*/hwmon/hwmon*/in*_label"))):
            d = os.path.dirname(label_file)
            n = re.fullmatch(r"in(\d+)_label", os.path.basename(label_file)).group(1)
            mv, ma = os.path.join(d, f"in{n}_input"), os.path.join(d, f"curr{n}_input")
            label = _read_str(label_file)
            if label.upper() != "NC" and os.path.exists(mv) and os.path.exists(ma):
                rails.append((label, lambda v=mv, a=ma: _read_num(v) * _read_num(a) / 1e6))
                layout = "jetson-orin-ina3221"
    if not rails:
        return None, "no INA3221 rails"
    total = [(f"{layout}:{label}", read) for label, read in rails
             if label.upper() in INPUT_RAILS]
    if total:
        src = _PowerSource(*total[0])
    else:
        reads = [r for _, r in rails]
        src = _PowerSource(f"{layout}:sum({'+'.join(n for n, _ in rails)}), "
                           "no input rail", lambda: sum(r() for r in reads))
    try:
        src.read_w()
    except (OSError, ValueError) as e:
        return None, f"INA3221 rails not readable ({e})"
    return src, ""


def _rapl(root: str) -> tuple[_CounterSource | None, str]:
    """RAPL package domains under powercap; energy_uj in uJ, returned in J."""
    base = os.path.join(root, "sys/class/powercap")
    doms = [d for d in sorted(glob.glob(os.path.join(base, "intel-rapl:*")))
            if re.fullmatch(r"intel-rapl:\d+", os.path.basename(d))]
    names, files, ranges = [], [], []
    try:
        for d in doms:
            name = _read_str(os.path.join(d, "name"))
            if name == "psys":
                continue
            energy = os.path.join(d, "energy_uj")
            _read_num(energy)  # probe now: root-only on Linux >= 5.10
            names.append(name)
            files.append(energy)
            ranges.append(_read_num(os.path.join(d, "max_energy_range_uj")) / 1e6)
    except PermissionError:
        return None, ("RAPL not readable (permission denied: run as root or "
                      f"chmod a+r {base}/intel-rapl:*/energy_uj)")
    except (OSError, ValueError) as e:
        return None, f"RAPL not readable ({e})"
    if not files:
        return None, "no RAPL package domains"
    return _CounterSource("rapl:" + "+".join(names),
                          lambda: [_read_num(f) / 1e6 for f in files], ranges), ""


def _nvml() -> tuple[_CounterSource | None, str]:
    """Total energy of every NVIDIA GPU that has the counter (NVML, mJ -> J)."""
    try:
        import pynvml  # optional: pip install nvidia-ml-py
    except ImportError:
        return None, "NVML not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
        handles, names = [], []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            try:
                pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
            except pynvml.NVMLError:  # pre-Volta GPUs have no energy counter
                continue
            handles.append(h)
            names.append(f"GPU{i}")
    except pynvml.NVMLError as e:
        return None, f"NVML failed ({e})"
    if not handles:
        return None, "NVML: no GPU with an energy counter"
    read = lambda: [pynvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1e3 for h in handles]
    return _CounterSource("nvml:" + "+".join(names), read, [None] * len(handles)), ""


class EnergyMeter:
    """Measures joules over the active (started, not paused) time of training.

    A daemon thread calls ``sample()`` every ``interval_s`` s; tests may leave
    it off (``start(background=False)``), inject ``clock`` and call ``sample()``.
    A failed read is kept in ``last_error``; the next good read of that source
    covers the gap (trapezoid over the longer interval, or counter difference).
    """

    available = True

    def __init__(self, sources: list, interval_s: float = 0.5,
                 clock: Callable[[], float] = time.monotonic):
        self.sources, self.interval_s, self.clock = sources, interval_s, clock
        self.source = " + ".join(s.name for s in sources)
        self.n_samples = 0
        self.last_error: str | None = None
        self._joules = self._active_s = self._last_t = 0.0
        self._active = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def joules(self) -> float:
        """Joules over active time, as of the last sample (no sensor read)."""
        return self._joules

    @property
    def active_s(self) -> float:
        return self._active_s

    @property
    def avg_power_w(self) -> float | None:
        """joules / active seconds; None before any active time has passed."""
        return self._joules / self._active_s if self._active_s > 0 else None

    def start(self, background: bool = True) -> "EnergyMeter":
        self.resume()
        if background and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="energy-meter",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self) -> float:
        """Count up to now, stop the thread, return the total joules."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.pause()
        return self._joules

    def restore(self, joules, active_s) -> None:
        """Continue the totals of a resumed run (what it had measured before it stopped)."""
        with self._lock:
            self._joules, self._active_s = float(joules or 0.0), float(active_s or 0.0)

    def pause(self) -> None:
        """Count up to now, then ignore time until resume() (e.g. validation)."""
        self.sample()
        with self._lock:
            self._active = False

    def resume(self) -> None:
        with self._lock:
            if self._active:
                return
            now = self.clock()
            for s in self.sources:
                try:
                    s.begin(now)
                except Exception as e:  # a meter must never stop training
                    self.last_error = f"{s.name}: {e}"
            self._last_t, self._active = now, True

    def sample(self) -> None:
        """Read every source once and add the energy since the previous read."""
        with self._lock:
            if not self._active:
                return
            now = self.clock()
            for s in self.sources:
                try:
                    self._joules += s.advance(now)
                except Exception as e:  # e.g. OSError, NVMLError; retried next sample
                    self.last_error = f"{s.name}: {e}"
            self._active_s += now - self._last_t
            self._last_t = now
            self.n_samples += 1

    def read_joules(self) -> float:
        """Joules so far, sampled now, without stopping (for an epoch-end scalar)."""
        self.sample()
        return self._joules

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> "EnergyMeter":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class NullMeter:
    """Stands in when nothing is measured: joules and avg_power_w are None and
    ``source`` says why. Every method is a no-op, so callers need no branches."""

    available, joules, avg_power_w, active_s, n_samples = False, None, None, 0.0, 0

    def __init__(self, reason: str):
        self.source = reason

    def start(self, background: bool = True) -> "NullMeter":
        return self

    def stop(self) -> None: ...
    def restore(self, joules, active_s) -> None: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def sample(self) -> None: ...
    def read_joules(self) -> None: ...
    def __enter__(self) -> "NullMeter":
        return self

    def __exit__(self, *exc) -> None: ...


def detect(root: str = "/", mode: str = "auto", interval_s: float = 0.5,
           clock: Callable[[], float] = time.monotonic) -> EnergyMeter | NullMeter:
    """Return a meter for the device's sensor, or a NullMeter giving the reason.

    mode: "auto" (Jetson alone if found, else NVML + RAPL, whichever exist),
    "none" (disabled), or "jetson" / "nvml" / "rapl" to use only that one.
    root "/" is replaced by $ELASTICTRAINER_SYSFS_ROOT when that is set.
    """
    if mode not in MODES:
        raise ValueError(f"energy mode {mode!r}: expected one of {MODES}")
    if mode == "none":
        return NullMeter("disabled (--energy none)")
    if root == "/":
        root = os.environ.get(ENV_ROOT) or "/"
    reasons = []
    if mode in ("auto", "jetson"):
        src, why = _jetson(root)
        if src:
            return EnergyMeter([src], interval_s, clock)
        reasons.append(why)
    found = []
    for name, probe in (("nvml", _nvml), ("rapl", lambda: _rapl(root))):
        if mode in ("auto", name):
            src, why = probe()
            if src:
                found.append(src)
            else:
                reasons.append(why)
    if found:
        return EnergyMeter(found, interval_s, clock)
    return NullMeter("no sensor: " + ", ".join(reasons))
