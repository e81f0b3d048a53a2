"""prefix/store.py: an example's augmented views, filled one per pass and then drawn at random;
float16 storage; the file store alike."""
from types import SimpleNamespace

import numpy as np
import pytest

from elastictrainer.prefix.store import Store, StoreFull, free_disk_bytes

CUT = SimpleNamespace(shape=(2, 3))


def values(n, start=0.0):
    return (start + np.arange(n * 6, dtype=np.float32)).reshape(n, 2, 3) / 7


def test_a_disk_store_leaves_the_larger_of_1_gb_and_5_percent_of_the_disk_free():
    def disk(total_gb, free_gb):
        return lambda path: SimpleNamespace(total=total_gb * 2**30, free=free_gb * 2**30)

    assert free_disk_bytes("/x", disk(10, 4)) == 3 * 2**30  # 1 GB kept on a small disk
    assert free_disk_bytes("/x", disk(200, 30)) == 20 * 2**30  # 5% of a large one
    assert free_disk_bytes("/x", disk(252, 12)) < 0  # fuller than the reserve: no room


@pytest.mark.parametrize("on_disk", [False, True])
def test_views_fill_one_per_pass_then_are_drawn_among_those_stored(tmp_path, on_disk):
    store = Store(CUT, capacity=3, views=2,
                  path=str(tmp_path / "c" / "cut.bin") if on_disk else None)
    rng = np.random.default_rng(0)
    keys = ["a", "b", "c"]
    first = store.add(keys, values(3), rng)
    assert list(first) == [0, 2, 4]  # example e's view 0 in row 2e
    examples = store.lookup(keys)
    assert list(examples) == [0, 1, 2] and store.needs(examples).all()  # one view of two
    second = store.add(keys, values(3, 100.0), rng)
    assert list(second) == [1, 3, 5] and store.complete
    assert not store.needs(examples).any()
    np.testing.assert_array_equal(store.read(second), values(3, 100.0))
    drawn = np.array([store.pick(examples, rng) for _ in range(50)])
    assert set(drawn[:, 1]) == {2, 3}  # both of b's views, and nothing else
    assert store.lookup(["new"])[0] == -1 and store.needs(store.lookup(["new"]))[0]
    with pytest.raises(StoreFull):
        store.add(["new"], values(1), rng)
    store.close()


def test_a_key_twice_in_a_batch_takes_one_view_each_until_it_has_all():
    store = Store(CUT, capacity=2, views=2)
    rows = store.add(["a", "a", "a"], values(3), np.random.default_rng(0))
    assert list(rows[:2]) == [0, 1] and rows[2] in (0, 1)
    assert store.stored == 2 and store.counts[0] == 2


def test_float16_halves_the_bytes_and_reads_back_the_rounded_float32():
    x = values(2) * 1e3 + 1 / 3
    wide, half = Store(CUT, 2), Store(CUT, 2, dtype="float16")
    assert half.nbytes * 2 == wide.nbytes
    rng = np.random.default_rng(0)
    rows = half.add(["a", "b"], x, rng)
    out = half.read(rows)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, x.astype(np.float16).astype(np.float32))
    assert not np.array_equal(out, x)  # rounded, to 11 significant bits
    np.testing.assert_allclose(out, x, rtol=2 ** -11)
