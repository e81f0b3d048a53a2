"""data/: what is refused before any data is read (TFDS not prepared, downloads that fail or
cannot start, bad folders, one class only among them, bad arguments, unknown names), the
held-out split, and the network check's bound."""
from elastictrainer.errors import UserError

import logging
import threading

import pytest
import tensorflow_datasets as tfds
from PIL import Image

from elastictrainer import data
from elastictrainer.data import folder, loaders, tfds_data
from helpers import TFDS_CLASSES, write_image_folder


def _assert_one_line_prepare_error(excinfo, name, data_dir):
    msg = str(excinfo.value)
    assert "\n" not in msg
    assert name in msg and "--data_dir" in msg and str(data_dir) in msg
    assert f"tfds build {name}" in msg
    return msg


@pytest.mark.parametrize("name", sorted(TFDS_CLASSES))
def test_tfds_not_prepared_without_download(name, tmp_path, monkeypatch, caplog):
    network = []  # download disabled: neither the network check nor a download is attempted
    monkeypatch.setattr(tfds_data, "_download_blocker", lambda *a, **kw: network.append("check"))
    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare",
                        lambda *a, **kw: network.append("download"))
    with pytest.raises(UserError) as excinfo:
        loaders.load_dataset(name, data_dir=tmp_path, download=False)
    assert network == []
    _assert_one_line_prepare_error(excinfo, name, tmp_path)
    assert not any(tmp_path.iterdir())  # nothing written
    # the one line is all a user sees: TFDS's own look-up warnings are held back
    assert not [r for r in caplog.records if r.name == "absl" and r.levelno >= logging.WARNING]


def test_tfds_download_failure_is_one_line(tmp_path, monkeypatch, no_network_check):
    def fail(self, *a, **kw):
        raise ConnectionError("Max retries exceeded\nwith url: https://example.invalid/x.tgz")
    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", fail)
    with pytest.raises(UserError) as excinfo:
        loaders.load_dataset("stanford_dogs", data_dir=tmp_path)
    msg = _assert_one_line_prepare_error(excinfo, "stanford_dogs", tmp_path)
    assert "Max retries exceeded with url" in msg


def test_tfds_download_missing_module(tmp_path, monkeypatch, no_network_check):
    def fail(self, *a, **kw):
        raise ModuleNotFoundError("No module named 'importlib_resources'",
                                  name="importlib_resources")
    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", fail)
    with pytest.raises(UserError, match="pip install importlib_resources"):
        loaders.load_dataset("oxford_iiit_pet", data_dir=tmp_path)


class _FakeBuilder:
    url_infos = {"https://files.example.invalid/a.tgz": None, "http://o.example.invalid/b": None}


def test_download_blocker_unreachable_host(monkeypatch):
    for var in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)

    def refuse(address, timeout=None):
        raise OSError("Network is unreachable")
    monkeypatch.setattr(tfds_data.socket, "create_connection", refuse)
    problem = tfds_data._download_blocker(_FakeBuilder())
    assert "Network is unreachable" in problem and "example.invalid" in problem

    # a host that never answers: the connection attempt blocks until the test releases it, so
    # the check must give up on its own and say so, with the attempt still pending
    release, answered = threading.Event(), threading.Event()

    def hang(address, timeout=None):
        release.wait()
        answered.set()
        raise OSError("too late")
    monkeypatch.setattr(tfds_data.socket, "create_connection", hang)
    try:
        problem = tfds_data._download_blocker(_FakeBuilder(), timeout=0.3)
        assert "within 0.3s" in problem and not answered.is_set()
    finally:
        release.set()

    class Conn:
        def close(self):
            pass
    monkeypatch.setattr(tfds_data.socket, "create_connection", lambda address, timeout=None: Conn())
    assert tfds_data._download_blocker(_FakeBuilder()) is None


def test_tfds_offline_fails_fast_unpatched(tmp_path, monkeypatch):
    """The real path, with the real network check: it runs before any download, with its bound
    (NETWORK_CHECK_SECONDS; test_download_blocker_unreachable_host shows the bound holds), and
    the one-line error gives its answer.

    With internet this would start a real download, so never let it reach download_and_prepare.
    """
    calls = []
    real_check = tfds_data._download_blocker

    def check(builder, **kw):
        calls.append(("check", kw.get("timeout", tfds_data.NETWORK_CHECK_SECONDS)))
        problem = real_check(builder, **kw)
        calls.append(("problem", problem))
        return problem

    def no_download(self, *a, **kw):
        calls.append(("download", None))
        raise ConnectionError("test stub: downloads disabled")
    monkeypatch.setattr(tfds_data, "_download_blocker", check)
    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", no_download)
    with pytest.raises(UserError) as excinfo:
        loaders.load_dataset("oxford_iiit_pet", data_dir=tmp_path)
    msg = _assert_one_line_prepare_error(excinfo, "oxford_iiit_pet", tmp_path)
    assert calls[0] == ("check", tfds_data.NETWORK_CHECK_SECONDS)
    problem = calls[1][1]
    if problem is None:  # the hosts answered (online): the stubbed download fails instead
        assert calls[2:] == [("download", None)] and "downloads disabled" in msg
    else:  # offline: no download is attempted, and the error says why
        assert calls[2:] == [] and problem in msg


def test_held_out_split_sizes():
    classes = {"a": [f"a{i}" for i in range(10)], "b": ["b0", "b1"], "c": ["c0"]}
    train, test = folder._held_out_split(classes, seed=3)
    assert [len(test[k]) for k in "abc"] == [2, 1, 0]
    assert [len(train[k]) for k in "abc"] == [8, 1, 1]
    assert folder._held_out_split(classes, seed=3) == (train, test)


def test_bad_folders(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        loaders.load_dataset(str(tmp_path / "missing"))
    with pytest.raises(UserError, match="no class sub-folders"):
        loaders.load_dataset(str(tmp_path))  # empty
    Image.new("RGB", (8, 8)).save(tmp_path / "loose.png")
    (tmp_path / "empty_class").mkdir()
    with pytest.raises(UserError, match="no class sub-folders") as excinfo:
        loaders.load_dataset(str(tmp_path))
    assert "\n" not in str(excinfo.value)
    with pytest.raises(UserError, match="not a directory"):
        loaders.load_dataset(str(tmp_path / "loose.png"))
    one = write_image_folder(tmp_path / "one", classes=("cat",), per_class=8)
    with pytest.raises(UserError, match="a classifier needs at least two"):
        loaders.load_dataset(str(one))


def test_synthetic_bad_arguments():
    with pytest.raises(UserError):
        loaders.load_dataset("synthetic", num_classes=1)
    with pytest.raises(UserError):
        loaders.load_dataset("synthetic", input_size=0)
    with pytest.raises(TypeError):
        loaders.load_dataset("oxford_iiit_pet", num_classes=3)


def test_unknown_name():
    with pytest.raises(UserError) as excinfo:
        loaders.load_dataset("imagenet")
    msg = str(excinfo.value)
    assert "unknown dataset 'imagenet'" in msg and "\n" not in msg
    for name in data.DATASET_NAMES:
        assert name in msg


def test_dataset_names():
    assert data.DATASET_NAMES == ("caltech_birds2011", "oxford_iiit_pet", "stanford_dogs",
                                  "synthetic", "synthetic_shifted", "synthetic_objects",
                                  "synthetic_textures")
