"""The reference's solver module name: `selection_DP(t_dy, t_dw, I, rho)` solves paper eq. 3
exactly.  The solver is elastictrainer/method/selector.py."""
from elastictrainer.method.selector import SelectionResult, select_tensors, selection_DP  # noqa: F401
