"""The NaN guard's counters, kept on the device so that the step never reads a device value on the host.

    guard = BadSteps(device)
    guard.generator(ok)      # ok: 0-dim bool, this step's generator gradients were finite
    guard.critic(bad)        # bad: 0-dim bool, a critic step was skipped (non-finite loss)
    counts = guard.take()    # one host read, at a check epoch: {"streak", "worst", "bad_grad", "bad_loss_d"}

`worst` is the longest run of bad generator steps in a row since the last `take` (so a run of `max_bad_steps` that
ends between two reads is still seen); `bad_grad` and `bad_loss_d` count since the last `take`, which zeroes them.
"""
from __future__ import annotations

import torch

NAMES = ("streak", "worst", "bad_grad", "bad_loss_d")


class BadSteps:
    def __init__(self, device: torch.device):
        # float64 counts are exact to 2**53 and every device reduces them
        self.counts = torch.zeros(len(NAMES), dtype=torch.float64, device=device)
        self.streak, self.worst, self.bad_grad, self.bad_loss_d = self.counts.unbind()  # views, updated in place

    def generator(self, ok: torch.Tensor) -> None:
        bad = (~ok).to(self.counts.dtype)
        self.streak.add_(1.0).mul_(bad)  # +1 on a bad step, back to 0 on a good one
        torch.maximum(self.worst, self.streak, out=self.worst)
        self.bad_grad.add_(bad)

    def critic(self, bad: torch.Tensor) -> None:
        self.bad_loss_d.add_(bad.to(self.counts.dtype))

    def take(self) -> dict[str, int]:
        """The counts (one device-to-host read); then `worst` restarts from the current streak and the totals from 0."""
        values = dict(zip(NAMES, (int(v) for v in self.counts.tolist())))
        self.worst.copy_(self.streak)
        self.bad_grad.zero_()
        self.bad_loss_d.zero_()
        return values

    def set_streak(self, n: int) -> None:
        """Restore a streak (a resumed run continues its count)."""
        self.streak.fill_(float(n))
        self.worst.fill_(float(n))
