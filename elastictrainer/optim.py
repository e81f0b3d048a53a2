"""The optimizers and learning-rate schedules a run can name, and which schedule each trains with.

Plain Python, imported by config (the flags' choices) and by the Keras flavors (building them),
so neither depends on the other.
"""
from elastictrainer.common import UserError

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
