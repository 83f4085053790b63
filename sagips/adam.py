"""The trainer's optimizer: torch.optim.Adam, without the import of torch._dynamo.

torch.optim marks five of Adam's methods as not to be compiled (`__init__`'s add_param_group, step, zero_grad,
state_dict, load_state_dict), and each mark imports torch._dynamo the first time it runs: ~1.2 s of CPU on an idle
core and 2-3 s on a loaded one, a third to a half of a rank's start-up, paid by every rank (on a laptop, 4 ranks on 2
cores pay it twice over). SAGIPS compiles none of these calls, so the marks do nothing but that import. `Adam` calls
the very functions torch's marks wrap (found with `inspect.unwrap`), with the grad mode that torch's step sets, so its
arithmetic, state dicts and hooks are torch.optim.Adam's own; tests/test_adam.py checks it bit for bit against
torch.optim.Adam, and that a run imports no torch._dynamo. A torch whose methods are not wrapped this way is used as
it is (the import comes back, nothing else changes).
"""
from __future__ import annotations

import inspect
from typing import Any

import torch

_Optimizer, _Adam = torch.optim.Optimizer, torch.optim.Adam
_ADD_GROUP = inspect.unwrap(_Optimizer.add_param_group)
_ZERO_GRAD = inspect.unwrap(_Optimizer.zero_grad)
_STATE_DICT = inspect.unwrap(_Optimizer.state_dict)
_LOAD_STATE_DICT = inspect.unwrap(_Optimizer.load_state_dict)
_STEP = inspect.unwrap(_Adam.step)  # through the profiling hook (patched in at the first Adam) and the grad mode


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
