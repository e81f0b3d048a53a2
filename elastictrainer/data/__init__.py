"""Every dataset the trainer and profiler use, as batched tf.data pipelines.

    from elastictrainer.data.loaders import load_dataset
    bundle = load_dataset(name_or_path, input_size=224, batch_size=4, seed=0, data_dir=None)

Sources:
  * TFDS: caltech_birds2011, oxford_iiit_pet, stanford_dogs (the paper's --dataset_name values),
    read from `data_dir` (None = TFDS default, ~/tensorflow_datasets or $TFDS_DATA_DIR).
  * synthetic: class-specific oriented gratings made on the fly (no files), see synthetic_dataset.
  * synthetic_shifted: the synthetic dataset seen through a fixed domain shift (rotated, colours
    permuted and inverted, noisy: domain_shift.py), a target on which the layers that see
    pixels must move.
  * synthetic_objects: 40 fine-grained classes of procedural objects over cluttered backgrounds
    (objects.py), the offline target an ImageNet backbone fine-tunes on.
  * synthetic_textures: 40 classes of procedural textures, ten families at four scales
    (textures.py), as a texture dataset has.
  * a directory: one sub-folder per class holding images, optionally split into train/ and test/.

Every element is (images float32 [B, S, S, 3] in [0, 255], labels int32 [B]). The train split is
reshuffled on every pass under `seed` (the reference code never shuffled); the test split is fixed.

This module only names what exists (no TensorFlow, so `--help` can list it); loaders.py loads
(through tfds_data.py, folder.py and synthetic.py).
"""
import os

DATASET_NAMES = ("caltech_birds2011", "oxford_iiit_pet", "stanford_dogs", "synthetic",
                 "synthetic_shifted", "synthetic_objects", "synthetic_textures")
TFDS_NAMES = DATASET_NAMES[:3]
# The datasets generated here, offline: --num_train and --num_test size them
GENERATED_NAMES = DATASET_NAMES[3:]
# Class counts of the built-in datasets, known without loading them (the figure scripts size
# heads and timing tables up front); a test checks them against TFDS's own metadata.
NUM_CLASSES = {"caltech_birds2011": 200, "oxford_iiit_pet": 37, "stanford_dogs": 120,
               "synthetic": 10, "synthetic_shifted": 10, "synthetic_objects": 40,
               "synthetic_textures": 40}
# Training and test images of the synthetic dataset when --num_train / --num_test are not given.
SYNTHETIC_EXAMPLES = 512
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")


def looks_like_path(key):
    """Whether a --dataset_name that is no built-in name is an image folder's path."""
    return os.sep in key or key.startswith((".", "~")) or os.path.exists(key)


def unknown_dataset(key):
    """The one line that refuses --dataset_name `key`, neither a built-in name nor a path."""
    return (f"unknown dataset {key!r}; valid: {', '.join(DATASET_NAMES)} (or the path of an "
            f"image folder with one sub-folder per class)")


def choices_help():
    return (", ".join(f"{n} (TFDS)" for n in TFDS_NAMES) + ", synthetic (built in, offline: "
            "gratings), synthetic_shifted (built in, offline: the gratings seen through a fixed "
            "domain shift), synthetic_objects (built in, offline: 40 fine-grained classes of "
            "procedural objects, the target of an ImageNet backbone), synthetic_textures (built "
            "in, offline: 40 classes of procedural textures, ten families at four scales), or a "
            "folder with one sub-folder of images per class")
