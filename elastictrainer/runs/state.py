"""Where the command line's loop is (LoopState): what a checkpoint keeps besides weights,
optimizer and input iterators.  Only the loop changes it."""
import dataclasses


@dataclasses.dataclass
class LoopState:
    """Where the loop is: what a checkpoint needs besides weights, optimizer and iterators."""
    selection: tuple = None
    epoch: int = 0  # epochs finished
    step_in_epoch: int = 0
    global_step: int = 0
    train_time: float = 0.0
    best: float = -1.0
    ep_loss: float = 0.0
    ep_correct: float = 0.0
    ep_seen: float = 0.0
    run_loss: float = 0.0
    run_correct: float = 0.0
    run_seen: float = 0.0
    # [global step, step kind, tensors] each time what a step runs changed: the record the
    # workers of a distributed run compare
    changes: list = dataclasses.field(default_factory=list)

    def __post_init__(self):
        if self.selection is not None:
            self.selection = tuple(int(k) for k in self.selection)

    @classmethod
    def from_dict(cls, data):
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def trained(self, kind, selection):
        """What the step about to be counted ran: its kind (elastic/runtime.py's) and the
        tensors it trained; kept where it changed (`changes`)."""
        entry = [kind, None if selection is None else [int(k) for k in selection]]
        if not self.changes or self.changes[-1][1:] != entry:
            self.changes.append([self.global_step] + entry)

    def add(self, loss, correct, b):
        """A trained batch of `b` examples: its mean loss and how many it classified right."""
        self.ep_loss += loss * b
        self.ep_correct += correct
        self.ep_seen += b
        self.run_loss += loss * b
        self.run_correct += correct
        self.run_seen += b
        self.global_step += 1
        self.step_in_epoch += 1

    def next_epoch(self):
        self.epoch += 1
        self.step_in_epoch = 0
        self.ep_loss = self.ep_correct = self.ep_seen = 0.0
