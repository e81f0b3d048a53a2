"""data/domain_shift.py: the target's images seen through a fixed, seeded change of domain."""
import numpy as np
import pytest

from elastictrainer.data.domain_shift import DomainShift, shift_image, shifted


def _images(n=4, size=16, seed=0):
    import tensorflow as tf

    from elastictrainer.data import synthetic

    return synthetic.synthetic_examples(size, n, seed=seed, split=0), tf


def _arrays(ds):
    return [(x.numpy(), int(y)) for x, y in ds]


def test_a_shift_is_a_function_of_its_seed_and_the_examples_index():
    ds, _ = _images()
    shift = DomainShift(seed=3)
    once, again = _arrays(shifted(ds, shift)), _arrays(shifted(ds, shift))
    assert all(np.array_equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(once, again))
    # another seed draws other noise; another split other noise for the same image
    other = _arrays(shifted(ds, DomainShift(seed=4)))
    test_split = _arrays(shifted(ds, shift, split=1))
    assert not np.array_equal(once[0][0], other[0][0])
    assert not np.array_equal(once[0][0], test_split[0][0])
    # labels untouched, images 8-bit levels in range
    assert [y for _, y in once] == [y for _, y in _arrays(ds)]
    x = once[0][0]
    assert x.min() >= 0 and x.max() <= 255 and np.array_equal(x, np.round(x))


def test_colour_permutes_the_channels_and_inverts_them():
    ds, _ = _images()
    shift = DomainShift(rotation_deg=0.0, colour=True, noise=0.0, seed=0)
    perm = shift.permutation()
    assert sorted(perm) == [0, 1, 2] and all(perm[c] != c for c in range(3))
    for (x, _), (y, _) in zip(_arrays(ds), _arrays(shifted(ds, shift))):
        np.testing.assert_array_equal(y, 255.0 - x[..., perm])
    # the statistics move as designed: channel c's mean is 255 minus channel perm[c]'s
    plain = np.stack([x for x, _ in _arrays(ds)])
    moved = np.stack([x for x, _ in _arrays(shifted(ds, shift))])
    np.testing.assert_allclose(moved.mean(axis=(0, 1, 2)),
                               255.0 - plain.mean(axis=(0, 1, 2))[perm], rtol=1e-5)
    assert abs(moved.mean() - plain.mean()) > 50  # the synthetic images are dark: inverted


def test_the_rotation_turns_the_image_about_its_centre():
    import tensorflow as tf

    image = tf.constant(np.random.default_rng(0).uniform(0, 255, (9, 9, 3)).round(),
                        tf.float32)
    quarter = shift_image(image, 0, DomainShift(rotation_deg=90.0, colour=False, noise=0.0))
    turned = [np.rot90(image.numpy(), k, axes=(0, 1)) for k in (1, 3)]
    assert any(np.allclose(quarter.numpy(), t, atol=1.0) for t in turned)
    # a turn by an angle off the grid leaves the corners black
    tilted = shift_image(image, 0, DomainShift(rotation_deg=30.0, colour=False, noise=0.0))
    assert np.all(tilted.numpy()[0, 0] == 0) and not np.all(image.numpy()[0, 0] == 0)


def test_the_noise_has_the_standard_deviation_asked_for():
    import tensorflow as tf

    grey = tf.fill([32, 32, 3], 128.0)
    noisy = np.stack([shift_image(grey, i, DomainShift(rotation_deg=0.0, colour=False,
                                                       noise=0.1)).numpy() for i in range(8)])
    assert np.std(noisy - 128.0) == pytest.approx(25.5, rel=0.05)
    assert not np.array_equal(noisy[0], noisy[1])  # each example its own noise
