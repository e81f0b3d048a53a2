"""ElasticTrainer training: `python main.py --model_name resnet50 --dataset_name caltech_birds2011
--train_type elastic_training --rho 0.5`.  Flags and defaults follow the paper's code; see
`python main.py --help`.  The training loop itself is train.run()."""
import common
from common import ArgumentParser, str2bool

TRAIN_TYPES = ("full_training", "traditional_tl_training", "bn_plus_bias_training", "prunetrain",
               "elastic_training", "elastic_training_weight_magnitude",
               "elastic_training_grad_magnitude")


def build_parser():
    p = ArgumentParser(
        prog="main.py",
        description="Fine-tune a vision model on the device with ElasticTrainer (train the tensors "
                    "that matter most within a step-time budget) or one of its baselines. Writes "
                    "TensorBoard events, config.json and summary.json under LOGDIR/RUN_NAME.")
    p.add_argument("--model_name", default="resnet50",
                   help="resnet50 | vgg16 | mobilenetv2 | vit, or a saved Keras model (.keras/.h5)")
    p.add_argument("--dataset_name", default="caltech_birds2011",
                   help="caltech_birds2011 | oxford_iiit_pet | stanford_dogs (TFDS), synthetic "
                        "(built in, offline), or a folder with one sub-folder of images per class")
    p.add_argument("--train_type", default="elastic_training", help=" | ".join(TRAIN_TYPES))
    p.add_argument("--input_size", type=int, default=224, help="image height and width")
    p.add_argument("--batch_size", type=int, default=4, help="training batch (test: 2x)")
    p.add_argument("--num_classes", type=int, default=None,
                   help="classifier outputs (default: the dataset's class count)")
    p.add_argument("--optimizer", default="sgd",
                   help="sgd (momentum 0.9, decoupled weight decay, cosine schedule) | adam "
                        "(advised for vit)")
    p.add_argument("--learning_rate", type=float, default=1e-4, help="initial learning rate")
    p.add_argument("--weight_decay", type=float, default=5e-4,
                   help="sgd's decoupled weight decay, applied as lr_t x weight_decay")
    p.add_argument("--num_epochs", type=int, default=12, help="training epochs")
    p.add_argument("--run_name", default=None,
                   help="run directory name under --logdir (default: model_dataset_scheme_..._time)")
    p.add_argument("--save_model", type=str2bool, default=False,
                   help="save the best weights as LOGDIR/RUN_NAME/best.weights.h5 (load them with "
                        "--weights PATH)")
    p.add_argument("--save_txt", type=str2bool, default=False,
                   help="write the reference's [hours, best accuracy %%] text file")
    p.add_argument("--interval", type=float, default=4,
                   help="epochs between importance evaluations and re-selections (0.5 = twice "
                        "an epoch)")
    p.add_argument("--rho", type=float, default=0.5,
                   help="requested elastic step time / full step time (0.5 = 2x faster); must be "
                        "above the forward pass's share of a step and at most 1")
    p.add_argument("--seed", type=int, default=0, help="seed of weights, data order and probes")
    p.add_argument("--weights", default="imagenet",
                   help="imagenet (keras cache, downloaded when online) | none | PATH")
    p.add_argument("--data_dir", default=None, help="TFDS data directory (default ~/tensorflow_datasets)")
    p.add_argument("--logdir", default="logs", help="where run directories are written")
    p.add_argument("--probe_batches", type=int, default=1,
                   help="fresh training batches per importance evaluation")
    p.add_argument("--timing_table", default=None,
                   help="profiler.py's table (default: profiles/<model>_i<input>_b<batch>_c<classes>"
                        ".json; profiled first if absent)")
    p.add_argument("--steps_per_epoch", type=int, default=None,
                   help="cap on training steps per epoch, for quick trials (default: the whole set)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def config_from_args(args):
    import train

    fields = {f: getattr(args, f) for f in train.Config.__dataclass_fields__ if hasattr(args, f)}
    fields["progress"] = not args.quiet
    return train.Config(**fields)


def main(argv=None):
    args = build_parser().parse_args(argv)
    import train

    cfg = config_from_args(args)
    cfg.validate()  # bad flags fail before any data or model is loaded
    summary = train.run(cfg)
    return 130 if summary["status"] == "interrupted" else 0


if __name__ == "__main__":
    common.run_cli(main)
