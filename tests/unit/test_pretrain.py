"""`--weights synthetic` without pretraining anything: the source task's classes are disjoint
from the target's, the weights name parses, each recipe says whether it resamples, and the
models without synthetic pretraining are refused in one line."""
import numpy as np
import pytest

from elastictrainer.errors import UserError
from elastictrainer.data import synthetic
from elastictrainer.models import pretrain
from elastictrainer.models.base import weights_kind
from elastictrainer.models.build import build_model


def _bands(freqs):
    j = synthetic.SYN_FREQUENCY_JITTER
    return [(f * (1 - j), f * (1 + j)) for f in np.unique(freqs)]


# ------------------------------------------------------------------------- the source task

@pytest.mark.parametrize("target_classes", [2, 3, 5, 10, 12, 13, 20, 37])
def test_source_classes_are_disjoint_from_the_targets(target_classes):
    """No source image can have a frequency a target class draws (frequency bands with the
    generator's jitter do not overlap), whatever the target's class count."""
    _, source_f, _ = synthetic.synthetic_source_class_params()
    _, target_f, _ = synthetic._synthetic_class_params(target_classes)
    for lo, hi in _bands(source_f):
        for tlo, thi in _bands(target_f):
            assert hi < tlo or thi < lo, (lo, hi, tlo, thi)


def test_synthetic_is_a_weights_name():
    assert weights_kind("synthetic") == weights_kind(" Synthetic ") == "synthetic"
    assert weights_kind("./synthetic") == "path"


# ------------------------------------------------------------------------- --weights synthetic

def test_mobilenetv2_recipe_resamples():
    assert pretrain.recipe("mobilenetv2").resample and not pretrain.recipe("smallcnn").resample


@pytest.mark.parametrize("name", ["resnet50", "vgg16", "vit"])
def test_other_models_need_imagenet_or_a_path(name):
    with pytest.raises(UserError) as err:
        build_model(name, input_size=32, num_classes=3, weights="synthetic")
    msg = str(err.value)
    assert "imagenet" in msg and "PATH" in msg and "smallcnn" in msg and "\n" not in msg


def test_a_cached_backbone_is_named_by_its_recipe(monkeypatch):
    """A recipe that changes (more steps, say) names another file, so a backbone pretrained by
    the old one is not loaded for it; the same recipe names the same file."""
    before = pretrain.cache_path("mobilenetv2", 96)
    assert before == pretrain.cache_path("mobilenetv2", 96)
    assert before != pretrain.cache_path("smallcnn", 96)
    original = pretrain.recipe

    def longer(name):
        rec = original(name)
        return type(rec)(**{**rec.__dict__, "steps": rec.steps + 1})

    monkeypatch.setattr(pretrain, "recipe", longer)
    after = pretrain.cache_path("mobilenetv2", 96)
    assert after != before and f"_v{pretrain.VERSION}_" in after

