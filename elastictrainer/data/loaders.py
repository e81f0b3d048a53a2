"""Loading a dataset by name or path: load_dataset, the one entry point.  The loaders
themselves live by kind: tfds_data.py (TensorFlow Datasets), folder.py (image folders),
synthetic.py (with the domain shift of domain_shift.py), objects.py and textures.py (the
built-in generated sets); pipeline.py holds what they share."""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

import os

from elastictrainer.errors import UserError
from elastictrainer.data import (  # noqa: F401  (DATASET_NAMES: what loads, by name)
    DATASET_NAMES, GENERATED_NAMES, looks_like_path, objects, textures,
    unknown_dataset)
from elastictrainer.data import tfds_data  # noqa: F401  (registers the TFDS names)
from elastictrainer.data.folder import image_folder_dataset
from elastictrainer.data.pipeline import LOADERS, DatasetBundle, positive_int  # noqa: F401
from elastictrainer.data.synthetic import SHIFTED_NAME, shifted_dataset, synthetic_dataset


# ----------------------------------------------------------------------------- entry point

def load_dataset(name_or_path, input_size=224, batch_size=4, seed=0, data_dir=None,
                 shuffle_buffer=1000, download=True, **kwargs):
    """Load a dataset by name (DATASET_NAMES) or image-folder path into a DatasetBundle.

    A name in DATASET_NAMES wins over a same-named folder in the working directory (pass
    ./NAME for the folder).

    shuffle_buffer: TFDS train splits are shuffled through a buffer of this many (still encoded)
      images; folders and synthetic data shuffle whole file/index lists. 0 disables shuffling.
    download: for TFDS datasets not yet prepared in data_dir, try TFDS's download_and_prepare.
    kwargs: only for the generated datasets (num_classes, num_train, num_test).
    """
    input_size = positive_int(input_size, "input_size")
    batch_size = positive_int(batch_size, "batch_size")
    if int(shuffle_buffer) < 0:
        raise UserError(f"shuffle_buffer must be >= 0, got {shuffle_buffer}")
    seed = int(seed)
    opts = dict(input_size=input_size, batch_size=batch_size, seed=seed,
                shuffle_buffer=int(shuffle_buffer))
    key = os.fspath(name_or_path)

    if key == "synthetic":
        return synthetic_dataset(**opts, **kwargs)
    if key == SHIFTED_NAME:
        return shifted_dataset(**opts, **kwargs)
    if key == objects.NAME:
        return objects.objects_dataset(**opts, **kwargs)
    if key == textures.NAME:
        return textures.textures_dataset(**opts, **kwargs)
    if kwargs:
        raise TypeError(f"unexpected arguments for dataset {key!r}: {', '.join(sorted(kwargs))}"
                        f" (only {', '.join(GENERATED_NAMES)} take extra arguments)")
    if key in LOADERS:
        return LOADERS[key](key, data_dir=data_dir, download=download, **opts)
    if looks_like_path(key):
        return image_folder_dataset(key, **opts)
    raise UserError(unknown_dataset(key))
