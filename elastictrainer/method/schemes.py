"""The --train_type schemes: what each one trains, declared as data.

A scheme only decides *which tensors train*; the loop (runs/loop.py), metrics, logging and timing are
written once.  Fixed schemes select by tensor role (roles.py: head, norm, bias, kernel); elastic
schemes re-select every --interval epochs by an importance estimate (importance.py) under the
time budget of eq. 3 (time_model.py, selector.py).  Each scheme also carries its plot label and
colour, so adding a scheme touches this file only.  No TensorFlow here: `--help` lists these.
"""
from dataclasses import dataclass
from typing import Optional, Tuple, Union

from elastictrainer.errors import Registry

ROLES = ("head", "norm", "bias", "kernel")  # roles.tensor_roles gives every tensor one of these


@dataclass(frozen=True)
class Scheme:
    """Which tensors a --train_type trains.

    roles: the tensor roles trained (None: all); importance: the importance.IMPORTANCE name that
    makes the scheme elastic; kernel_l1: an L1 penalty on kernels added to the loss.
    color: one colour, or a (light, dark) pair whose shades tell elastic runs' rho apart.
    """
    name: str
    label: str
    color: Union[str, Tuple[str, str]]
    help: str
    roles: Optional[frozenset] = None
    kernel_l1: float = 0.0
    importance: Optional[str] = None

    @property
    def elastic(self):
        return self.importance is not None

    @property
    def trains_everything(self):
        """Whether every tensor trains in every step (no prefix is ever frozen)."""
        return not self.elastic and self.roles is None

    def fixed_selection(self, roles):
        """Indices of the tensors a fixed scheme trains, from each tensor's role."""
        return tuple(k for k, r in enumerate(roles) if self.roles is None or r in self.roles)


SCHEMES = Registry("train_type")

for _scheme in (
    Scheme("full_training", "Full training", "#1f77b4", "every tensor"),
    Scheme("traditional_tl_training", "Traditional TL", "#2ca02c", "the classifier head only",
           roles=frozenset({"head"})),
    Scheme("bn_plus_bias_training", "BN+Bias", "#9467bd",
           "normalisation scale/offset, every bias, and the head",
           roles=frozenset({"head", "norm", "bias"})),
    # The reference's PruneTrain: full training with an L1 penalty on kernels (no channel removal).
    Scheme("prunetrain", "PruneTrain", "#7f7f7f",
           "full training with an L1 penalty (1e-4) on kernels, as the reference", kernel_l1=1e-4),
    Scheme("elastic_training", "ElasticTrainer", ("#fc9272", "#99000d"),
           "ElasticTrainer: Taylor importance (first-order loss drop of a fresh optimizer "
           "step, importance.py) + exact selection under rho (eq. 3)",
           importance="taylor"),
    Scheme("elastic_training_taylor_paper", "ElasticTrainer eq. 6", ("#c7eae5", "#01665e"),
           "ElasticTrainer with the paper's exact importance, -g(w+dw).dw (eq. 4-6)",
           importance="taylor_paper"),
    Scheme("elastic_training_curvature", "ElasticTrainer +curv.", ("#d9f0d3", "#1b7837"),
           "ElasticTrainer with importance that subtracts the curvature each tensor's own "
           "step meets (one more gradient per probe batch, one device; importance.py)",
           importance="taylor_curvature"),
    Scheme("elastic_training_weight_magnitude", "ElasticTrainer |w|", ("#fdd0a2", "#a63603"),
           "ablation: importance by weight magnitude", importance="weight_magnitude"),
    Scheme("elastic_training_grad_magnitude", "ElasticTrainer |g|", ("#fcc5c0", "#7a0177"),
           "ablation: importance by gradient magnitude", importance="grad_magnitude"),
):
    SCHEMES.register(_scheme.name)(_scheme)

BASELINES = tuple(name for name, s in SCHEMES.items() if not s.elastic)


@dataclass(frozen=True)
class FixedFrom(Scheme):
    """A fixed scheme training tensor `first` to the output (indices in model.trainable_weights'
    order, input side first): what a user gets by freezing every layer below by hand, the
    baseline the benchmarks hold ElasticTrainer against ("the last stage and head")."""
    first: int = 0

    @property
    def trains_everything(self):
        return self.first <= 0

    def fixed_selection(self, roles):
        return tuple(range(min(self.first, len(roles)), len(roles)))


def register_fixed_from(first):
    """FixedFrom(first) in SCHEMES (once); returns its --train_type name, fixed_from_<first>."""
    name = f"fixed_from_{first}"
    if name not in SCHEMES:
        SCHEMES.register(name)(FixedFrom(name, f"tensors {first}-", "#777777",
                                         f"tensors {first} to the output, fixed", first=first))
    return name


def choices_help():
    """'name: what it trains' for every scheme, for --train_type's help."""
    return "; ".join(f"{s.name}: {s.help}" for s in SCHEMES.values())
