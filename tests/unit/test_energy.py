"""Tests for elastictrainer.runs.energy on fake sysfs trees (no real sensor needed)."""
import sys
import threading
import types

import pytest

from elastictrainer.runs import energy


class Clock:
    """Manually advanced stand-in for time.monotonic."""

    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def write(path, value):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{value}\n")


@pytest.fixture(autouse=True)
def no_real_nvml(monkeypatch):
    # A test machine with a GPU and nvidia-ml-py must not leak into fake-tree tests.
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.delenv(energy.ENV_ROOT, raising=False)


def tx2_tree(root, input_mw=5000):
    dev = root / "sys/bus/i2c/drivers/ina3221x/0-0040/iio:device0"
    for n, (name, mw) in enumerate([("VDD_IN", input_mw), ("VDD_SYS_CPU", 1500),
                                    ("VDD_SYS_DDR", 700)]):
        write(dev / f"rail_name_{n}", name)
        write(dev / f"in_power{n}_input", mw)
    return dev


def orin_tree(root, labels, hwmon="hwmon7"):
    dev = root / f"sys/bus/i2c/drivers/ina3221/1-0040/hwmon/{hwmon}"
    for n, (label, mv, ma) in enumerate(labels, start=1):
        write(dev / f"in{n}_label", label)
        write(dev / f"in{n}_input", mv)
        write(dev / f"curr{n}_input", ma)
    write(dev / "in7_label", "sum of shunt voltages")
    write(dev / "in7_input", 12345)
    return dev


def rapl_tree(root, domains):
    base = root / "sys/class/powercap"
    for dom, name, uj, max_uj in domains:
        write(base / dom / "name", name)
        write(base / dom / "energy_uj", uj)
        write(base / dom / "max_energy_range_uj", max_uj)
    return base


def test_tx2_constant_power_and_pause(tmp_path):
    dev = tx2_tree(tmp_path)
    clock = Clock()
    m = energy.detect(root=str(tmp_path), clock=clock)
    assert m.source == "jetson-tx2-ina3221x:VDD_IN"
    m.start(background=False)
    clock.t += 10
    assert m.read_joules() == pytest.approx(50.0)  # 5 W x 10 s, meter keeps running
    m.pause()
    write(dev / "in_power0_input", 100000)  # validation at 100 W must not count
    clock.t += 30
    m.sample()
    write(dev / "in_power0_input", 5000)
    m.resume()
    clock.t += 5
    assert m.stop() == pytest.approx(75.0)
    assert m.active_s == pytest.approx(15.0)
    assert m.avg_power_w == pytest.approx(5.0)


def test_trapezoid_between_samples(tmp_path):
    dev = tx2_tree(tmp_path)
    clock = Clock()
    m = energy.detect(root=str(tmp_path), clock=clock).start(background=False)
    write(dev / "in_power0_input", 7000)
    clock.t += 2
    m.sample()
    assert m.joules == pytest.approx((5 + 7) / 2 * 2)


def test_orin_hwmon_vdd_in_by_label(tmp_path):
    orin_tree(tmp_path, [("VDD_CPU_GPU_CV", 5000, 400), ("VDD_IN", 5000, 1200),
                         ("VDD_SOC", 5000, 300)], hwmon="hwmon3")
    clock = Clock()
    m = energy.detect(root=str(tmp_path), clock=clock)
    assert m.source == "jetson-orin-ina3221:VDD_IN"
    m.start(background=False)
    clock.t += 4
    assert m.stop() == pytest.approx(5000 * 1200 / 1000 / 1000 * 4)  # 6 W x 4 s


def test_orin_without_input_rail_sums_and_says_so(tmp_path):
    orin_tree(tmp_path, [("VDD_GPU_SOC", 5000, 1000), ("VDD_CPU_CV", 5000, 200),
                         ("NC", 0, 0)])
    clock = Clock()
    m = energy.detect(root=str(tmp_path), clock=clock)
    assert "no input rail" in m.source and "VDD_GPU_SOC+VDD_CPU_CV" in m.source
    assert "NC" not in m.source.split(":", 1)[1]
    m.start(background=False)
    clock.t += 1
    assert m.stop() == pytest.approx(6.0)


def test_rapl_wrap_and_subdomain_skipped(tmp_path):
    max_uj = 262143328850
    base = rapl_tree(tmp_path, [
        ("intel-rapl:0", "package-0", max_uj - 1_000_000, max_uj),
        ("intel-rapl:0:0", "core", 5_000_000, max_uj),
        ("intel-rapl:1", "package-1", 10_000_000, max_uj),
        ("intel-rapl:2", "psys", 0, max_uj),  # whole platform: contains the packages
    ])
    clock = Clock()
    m = energy.detect(root=str(tmp_path), clock=clock)
    assert m.source == "rapl:package-0+package-1"
    m.start(background=False)
    write(base / "intel-rapl:0/energy_uj", 2_000_000)  # wrapped: +3 J
    write(base / "intel-rapl:0:0/energy_uj", 900_000_000)  # would add 895 J if read
    write(base / "intel-rapl:1/energy_uj", 14_000_000)  # +4 J
    write(base / "intel-rapl:2/energy_uj", 20_000_000)  # would add 20 J if read
    clock.t += 2
    assert m.stop() == pytest.approx(7.0)
    assert m.avg_power_w == pytest.approx(3.5)


def test_rapl_permission_denied_gives_null_with_reason(tmp_path, monkeypatch):
    rapl_tree(tmp_path, [("intel-rapl:0", "package-0", 1, 100)])
    real = energy._read_num

    def deny(path):
        if path.endswith("energy_uj"):
            raise PermissionError(13, "Permission denied", path)
        return real(path)

    monkeypatch.setattr(energy, "_read_num", deny)
    m = energy.detect(root=str(tmp_path))
    assert m.joules is None and m.avg_power_w is None and not m.available
    assert "RAPL not readable (permission denied" in m.source


def test_no_sensor_gives_none_with_reasons(tmp_path):
    m = energy.detect(root=str(tmp_path))
    assert m.joules is None and m.avg_power_w is None
    assert m.source.startswith("no sensor:")
    for part in ("no INA3221 rails", "no RAPL package domains", "NVML not installed"):
        assert part in m.source
    with m:  # the null meter is safe to drive like a real one
        m.pause(), m.resume(), m.sample()
    assert m.read_joules() is None


def test_mode_none_and_bad_mode(tmp_path):
    tx2_tree(tmp_path)
    m = energy.detect(root=str(tmp_path), mode="none")
    assert m.joules is None and m.source == "disabled (--energy none)"
    with pytest.raises(ValueError):
        energy.detect(root=str(tmp_path), mode="watts")


def test_forced_mode_ignores_other_sensors(tmp_path):
    tx2_tree(tmp_path)
    rapl_tree(tmp_path, [("intel-rapl:0", "package-0", 1, 100)])
    assert energy.detect(root=str(tmp_path), mode="rapl").source == "rapl:package-0"


def test_env_variable_overrides_root(tmp_path, monkeypatch):
    tx2_tree(tmp_path)
    monkeypatch.setenv(energy.ENV_ROOT, str(tmp_path))
    assert energy.detect().source == "jetson-tx2-ina3221x:VDD_IN"


def test_nvml_combined_with_rapl(tmp_path, monkeypatch):
    counters = {0: 1_000_000, 1: 0}  # mJ; GPU1 has no energy counter

    class NVMLError(Exception):
        pass

    def total_energy(h):
        if h == 1:
            raise NVMLError("Not Supported")
        return counters[h]

    fake = types.SimpleNamespace(
        NVMLError=NVMLError, nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetTotalEnergyConsumption=total_energy)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    base = rapl_tree(tmp_path, [("intel-rapl:0", "package-0", 0, 10**12)])
    clock = Clock()
    m = energy.detect(root=str(tmp_path), clock=clock)
    assert m.source == "nvml:GPU0 + rapl:package-0"
    m.start(background=False)
    counters[0] += 250_000  # +250 J on the GPU
    write(base / "intel-rapl:0/energy_uj", 50_000_000)  # +50 J on the CPU
    clock.t += 1
    assert m.stop() == pytest.approx(300.0)


class Ticks:
    """Stands in for the meter's stop event: the sampling thread's wait between samples returns
    when the test ticks (one sample each) or stops the meter, never on its own."""

    def __init__(self):
        self._cond = threading.Condition()
        self._ticks = self.waits = 0
        self._set = False

    def wait(self, timeout=None):
        with self._cond:
            self.waits += 1
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._ticks or self._set)
            if self._set:
                return True
            self._ticks -= 1
            return False

    def tick(self):
        with self._cond:
            self._ticks += 1
            self._cond.notify_all()

    def until_waits(self, n):
        """Block until the thread has waited n times (a hang guard, not a measurement)."""
        with self._cond:
            assert self._cond.wait_for(lambda: self.waits >= n, timeout=HANG_GUARD_S)

    def set(self):
        with self._cond:
            self._set = True
            self._cond.notify_all()

    def clear(self):
        with self._cond:
            self._set = False

    def is_set(self):
        return self._set


HANG_GUARD_S = 600  # only a broken meter ever waits this long


def test_background_thread_samples_and_stops(tmp_path):
    tx2_tree(tmp_path)
    clock = Clock()
    m = energy.detect(root=str(tmp_path), clock=clock)
    m._stop = ticks = Ticks()
    m.start()
    thread = m._thread
    assert thread is not None and thread.daemon and thread.is_alive()
    for k in range(1, 4):  # one second, then one sample, three times
        clock.t += 1
        ticks.tick()
        ticks.until_waits(k + 1)
    assert m.n_samples >= 3
    m.stop()
    assert not thread.is_alive() and m._thread is None
    assert m.joules > 0 and m.last_error is None
    taken = m.n_samples
    ticks.tick()
    assert m.n_samples == taken  # nothing samples after stop()


def test_vanished_sensor_does_not_crash_training(tmp_path):
    dev = tx2_tree(tmp_path)
    clock = Clock()
    m = energy.detect(root=str(tmp_path), clock=clock).start(background=False)
    (dev / "in_power0_input").unlink()
    clock.t += 1
    m.sample()
    assert m.last_error and "VDD_IN" in m.last_error
    write(dev / "in_power0_input", 5000)
    clock.t += 1
    assert m.stop() == pytest.approx(10.0)  # the gap is covered by the next read


def test_nvml_init_failure_gives_reason(tmp_path, monkeypatch):
    class NVMLError(Exception):
        pass

    def fail():
        raise NVMLError("Driver Not Loaded")

    monkeypatch.setitem(sys.modules, "pynvml",
                        types.SimpleNamespace(NVMLError=NVMLError, nvmlInit=fail))
    m = energy.detect(root=str(tmp_path), mode="nvml")
    assert m.joules is None and m.source == "no sensor: NVML failed (Driver Not Loaded)"
