"""A run's settings: one frozen object, validated before anything is loaded, saved with the run
as config.json.  No TensorFlow: the CLI builds and checks it before starting TensorFlow."""
import datetime
import os
from dataclasses import dataclass
from typing import Optional

from elastictrainer.common import UserError
from elastictrainer.energy import MODES as ENERGY_MODES
from elastictrainer.schemes import SCHEMES

# --optimizer choices (engine.make_optimizer builds them).
OPTIMIZERS = {
    "sgd": "SGD, momentum 0.9, decoupled weight decay lr_t x --weight_decay, cosine schedule "
           "(the reference's SGDW)",
    "adam": "plain Adam (advised for vit)",
}
# --lr_schedule choices; None (the default) is each optimizer's own, the reference's: cosine
# for sgd, constant for adam.
LR_SCHEDULES = {
    "cosine": "one cosine decay from --learning_rate to 0 over all training steps",
    "constant": "--learning_rate throughout",
}
DEFAULT_LR_SCHEDULE = {"sgd": "cosine", "adam": "constant"}


def lr_schedule_for(optimizer, schedule=None):
    """The LR_SCHEDULES name `optimizer` trains with: `schedule`, or the optimizer's own for None.
    An unknown optimizer or schedule is a UserError naming the valid ones."""
    if optimizer not in OPTIMIZERS:
        raise UserError(f"unknown optimizer {optimizer!r}; valid: {', '.join(OPTIMIZERS)}")
    schedule = schedule or DEFAULT_LR_SCHEDULE[optimizer]
    if schedule not in LR_SCHEDULES:
        raise UserError(f"unknown --lr_schedule {schedule!r}; valid: {', '.join(LR_SCHEDULES)}")
    return schedule


@dataclass(frozen=True)
class Config:
    """Every setting of a run; saved as config.json in the run directory."""
    model_name: str = "resnet50"
    dataset_name: str = "caltech_birds2011"
    train_type: str = "elastic_training"
    input_size: int = 224
    batch_size: int = 4
    num_classes: Optional[int] = None
    optimizer: str = "sgd"
    learning_rate: float = 1e-4
    lr_schedule: Optional[str] = None  # None: the optimizer's own (DEFAULT_LR_SCHEDULE)
    weight_decay: float = 5e-4
    num_epochs: int = 12
    run_name: Optional[str] = None
    save_model: bool = False
    save_txt: bool = False
    interval: float = 4.0
    rho: float = 0.5
    rho_feedback: bool = True
    seed: int = 0
    weights: str = "imagenet"
    data_dir: Optional[str] = None
    logdir: str = "logs"
    probe_batches: int = 1
    timing_table: Optional[str] = None
    steps_per_epoch: Optional[int] = None
    num_train: Optional[int] = None  # synthetic dataset only: images generated (default 512)
    num_test: Optional[int] = None   # synthetic dataset only: test images (default 512)
    dp_resolution: int = 10000
    energy: str = "auto"
    resume: bool = True
    checkpoint_minutes: float = 10.0
    progress: bool = True

    def validate(self):
        positive = ("input_size", "batch_size", "num_epochs", "probe_batches", "dp_resolution")
        for name in positive:
            if getattr(self, name) < 1:
                raise UserError(f"--{name} must be a positive integer, got {getattr(self, name)}")
        if self.num_classes is not None and self.num_classes < 1:
            raise UserError(f"--num_classes must be positive, got {self.num_classes}")
        if self.steps_per_epoch is not None and self.steps_per_epoch < 1:
            raise UserError(f"--steps_per_epoch must be positive, got {self.steps_per_epoch}")
        for name in ("num_train", "num_test"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise UserError(f"--{name} must be a positive integer, got {value}")
            if value is not None and self.dataset_name != "synthetic":
                raise UserError(f"--{name} sizes the built-in synthetic dataset only; "
                                f"{self.dataset_name} has its own splits")
        if not self.learning_rate > 0:
            raise UserError(f"--learning_rate must be positive, got {self.learning_rate}")
        if self.weight_decay < 0:
            raise UserError(f"--weight_decay must be >= 0, got {self.weight_decay}")
        if not self.interval > 0:
            raise UserError(f"--interval must be positive (epochs between re-selections), "
                            f"got {self.interval}")
        if not self.checkpoint_minutes >= 0:
            raise UserError(f"--checkpoint_minutes must be >= 0 (0: at epoch ends only), got "
                            f"{self.checkpoint_minutes}")
        if not 0 < self.rho <= 1:
            raise UserError(f"--rho is the elastic step time / full step time and must be in "
                            f"(0, 1], got {self.rho}")
        lr_schedule_for(self.optimizer, self.lr_schedule)
        SCHEMES.get_or_fail(self.train_type)
        if self.energy not in ENERGY_MODES:
            raise UserError(f"unknown --energy {self.energy!r}; valid: {', '.join(ENERGY_MODES)}")

    def resolved_run_name(self):
        if self.run_name:
            return self.run_name
        model = os.path.splitext(os.path.basename(self.model_name))[0]
        data = os.path.basename(os.path.normpath(self.dataset_name))
        rho = f"_rho{self.rho:g}" if SCHEMES[self.train_type].elastic else ""
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        return f"{model}_{data}_{self.train_type}{rho}_seed{self.seed}_{stamp}"
