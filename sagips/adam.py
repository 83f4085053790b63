"""The trainer's optimizer: torch.optim.Adam, without the import of torch._dynamo.

torch.optim marks five of Adam's methods as not to be compiled (`__init__`'s add_param_group, step, zero_grad,
state_dict, load_state_dict), and each mark imports torch._dynamo the first time it runs: ~1.2 s of CPU on an idle
core and 2-3 s on a loaded one, a third to a half of a rank's start-up, paid by every rank (on a laptop, 4 ranks on 2
cores pay it twice over). SAGIPS compiles none of these calls, so the marks do nothing but that import. `Adam` calls
the very functions torch's marks wrap (found with `inspect.unwrap`), with the grad mode that torch's step sets, so its
arithmetic, state dicts and hooks are torch.optim.Adam's own; tests/test_adam.py checks it bit for bit against
torch.optim.Adam, and that a run imports no torch._dynamo. A torch whose methods are not wrapped this way is used as
it is (the import comes back, nothing else changes). Without the marks, torch.compile would trace these methods if a
user's own compiled code called them (SAGIPS calls them outside any compiled code).
"""
from __future__ import annotations

import inspect
from typing import Any

import torch

_Adam = torch.optim.Adam
# Adam's own (Optimizer's, where Adam does not override them); step: through the profiling hook that the first Adam
# patches in (an Adam made before this import) and the grad mode
_ADD_GROUP, _ZERO_GRAD, _STATE_DICT, _LOAD_STATE_DICT, _STEP = (
    inspect.unwrap(getattr(_Adam, name)) for name in ("add_param_group", "zero_grad", "state_dict", "load_state_dict",
                                                      "step"))


class Adam(torch.optim.Adam):
    """torch.optim.Adam (see the module's docstring); an instance of it, so every check of the type still holds."""

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        _ADD_GROUP(self, param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        _ZERO_GRAD(self, set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return _STATE_DICT(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        _LOAD_STATE_DICT(self, state_dict)

    def step(self, closure=None):
        # torch's mark: grad off for the update unless the optimizer is differentiable
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return _STEP(self, closure)


def make_adam(params, lr: float, betas: tuple[float, float], fused: bool) -> Adam:
    """Adam with the fused kernel where this torch has one for the parameters' device (CUDA; CPU since torch 2.4:
    one kernel per step instead of ~10 small ops per tensor, 3x faster for the paper's networks), else the default."""
    params = list(params)
    if fused:
        try:
            return Adam(params, lr=lr, betas=betas, fused=True)
        except (RuntimeError, TypeError, ValueError):  # no fused kernel for this device or dtype in this torch
            pass
    return Adam(params, lr=lr, betas=betas)
