"""Run directory layout, TensorBoard tags and file formats: defined once, used by the training
loop that writes them and by the plotting scripts that read them."""
import json
import os

# Scalar tags (the reference's names, so its TensorBoard habits carry over).
TRAIN_ACCURACY = "train/accuracy"
TRAIN_LOSS = "train/classification_loss"
LEARNING_RATE = "train/learning_rate"
TEST_ACCURACY = "test/accuracy"
TEST_LOSS = "test/classification_loss"
# Elastic schemes, one point per re-selection.
NUM_SELECTED = "elastic/num_selected"
PREDICTED_RATIO = "elastic/predicted_step_ratio"
SELECTION_MASK = "elastic/selection_mask"  # tensor summary: 1 = trained, model.trainable_weights order

CONFIG_FILE = "config.json"
SUMMARY_FILE = "summary.json"
BEST_WEIGHTS_FILE = "best.weights.h5"
SCALAR_EVERY_STEPS = 200  # the reference's logging period for train scalars


def run_dir(logdir, run_name):
    return os.path.join(logdir, run_name)


def write_json(path, obj):
    """Write whole-or-nothing, so an interrupted run never leaves half a file."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def read_summary(run_directory):
    with open(os.path.join(run_directory, SUMMARY_FILE)) as f:
        return json.load(f)


def read_config(run_directory):
    with open(os.path.join(run_directory, CONFIG_FILE)) as f:
        return json.load(f)
