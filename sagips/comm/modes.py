"""The exchange modes (paper Tab. II, and hvd, the Horovod baseline), each a few lines composing topology, Ring and
RmaExchange.

    exchange = build_exchange(cfg.mode, topo, n=grad_buffer.size, ring=cfg.comm.ring,
                              outer_every=cfg.comm.outer_every, max_staleness=cfg.comm.max_staleness,
                              timeout_s=cfg.comm.timeout_s)
    for epoch in range(1, epochs + 1):          # epochs are 1-based
        stats = exchange(grad_buffer, epoch)    # in place
    exchange.free(); topo.free()                # this order, on every rank

    ensemble        no exchange (independent GANs)
    allreduce       MPI Allreduce over all ranks, every epoch (the synchronous, Horovod-like baseline)
    arar            one ring over all ranks, every epoch
    arar-arar       ring inside each inner group every epoch; on an outer epoch also the leaders' ring + broadcast
    rma-arar-arar   RMA inside each inner group every epoch; on an outer epoch the same leaders' ring + broadcast
    hvd             the paper's Horovod baseline: MPI Allreduce over all ranks, of the generator's AND the critic's
                    gradients (the trainer builds a second Allreduce for the critic; every rank has all the data)

comm.outer_sync=weights (grouped modes): an outer epoch runs the inner step only, and after the optimizer step
`WeightAverage` replaces the generator's weights and Adam moments with their mean over all ranks.

Outer epoch (epoch % outer_every == 0), after the inner step: the leaders (inner rank 0) run a ring weighted by
their group sizes (each contributes g * group_mean; the result is divided by sum g = world size), then each leader
broadcasts the result to its group. So after an outer epoch EVERY rank holds the same buffer, and in arar-arar it is
the exact global mean: arar-arar equals arar on an outer epoch (up to float rounding). The outer step follows the
inner step rather than replacing it, because the inner step is what forms the group means the leaders combine.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from sagips.config import MODES  # the one definition of the mode names

from . import watchdog
from .ring import RING_TAG, Ring
from .rma import RmaExchange
from .topology import Topology


class Exchange(Protocol):
    # in place; returns stats (may be empty). weight=0 drops this rank's contribution (e.g. a NaN/Inf gradient:
    # the trainer then passes zeros) while the rank still takes part, so that nobody waits for it.
    def __call__(self, buf: np.ndarray, epoch: int, weight: float = 1.0) -> dict: ...

    # whether epoch `epoch`'s exchange may wait for other ranks (sagips/comm/stop.py learns of a stop before it)
    def waits(self, epoch: int) -> bool: ...

    def free(self) -> None: ...


class Ensemble:
    """No exchange: every rank trains its own GAN."""

    def __call__(self, buf, epoch, weight=1.0):
        return {}

    def waits(self, epoch):
        return False

    def free(self):
        pass


class Allreduce:
    """buf <- mean over topo.world, with MPI's own Allreduce (Iallreduce under the watchdog)."""

    def __init__(self, topo: Topology, timeout_s):
        self.comm, self.timeout_s = topo.world, timeout_s
        self.count = np.zeros(1, np.float32)

    def __call__(self, buf, epoch, weight=1.0):
        watchdog.allreduce_sum(self.comm, buf, timeout_s=self.timeout_s, what="allreduce", epoch=epoch)
        # the number of contributors (one more, 4-byte allreduce on every rank, so that the collectives match):
        # the price of dropping a rank with a NaN/Inf gradient exactly
        self.count[0] = weight
        watchdog.allreduce_sum(self.comm, self.count, timeout_s=self.timeout_s, what="allreduce", epoch=epoch)
        buf /= np.float32(max(self.count[0], 1.0))
        return {}

    def waits(self, epoch):
        return True

    def free(self):
        pass


class RingMean:
    """buf <- mean over one ring (arar: the ring over topo.world)."""

    def __init__(self, ring: Ring):
        self.ring = ring

    def __call__(self, buf, epoch, weight=1.0):
        self.ring.allreduce(buf, weight=weight, epoch=epoch)
        self.last_weight = self.ring.last_weight  # contributors in the result (the leaders' ring weighs by it)
        return {}

    def waits(self, epoch):
        return True

    def free(self):
        pass


class Grouped:
    """inner step every epoch, then on outer epochs the leaders' weighted ring and a broadcast into the group."""

    def __init__(self, topo: Topology, inner, outer_ring: Ring | None, outer_every: int, timeout_s,
                 outer_sync: str = "gradients"):
        if outer_every < 1:
            raise ValueError(f"comm.outer_every={outer_every} must be >= 1")
        if outer_sync not in ("gradients", "weights"):
            raise ValueError(f"comm.outer_sync={outer_sync!r} is not 'gradients' or 'weights'")
        self.topo, self.inner, self.outer_ring = topo, inner, outer_ring
        self.outer_every, self.timeout_s, self.outer_sync = outer_every, timeout_s, outer_sync

    def __call__(self, buf, epoch, weight=1.0):
        stats = self.inner(buf, epoch, weight)
        if epoch % self.outer_every == 0 and self.outer_sync == "weights":
            # the weights are averaged after the step (WeightAverage): every older gradient belongs to old weights
            if hasattr(self.inner, "consumed"):
                self.inner.consumed(epoch)
            return {**stats, "outer": 1}
        if epoch % self.outer_every == 0:
            if self.outer_ring is not None:  # leaders only
                # a leader stands for the contributions its group mean holds (the group size when all are good)
                self.outer_ring.allreduce(buf, weight=self.inner.last_weight, epoch=epoch)
            watchdog.bcast(self.topo.inner, buf, root=0, timeout_s=self.timeout_s, what="outer broadcast",
                           epoch=epoch)
            if hasattr(self.inner, "consumed"):  # RMA: the global mean has spent every slot up to this epoch
                self.inner.consumed(epoch)
            stats = {**stats, "outer": 1}
        return stats

    def waits(self, epoch):
        return self.inner.waits(epoch) or epoch % self.outer_every == 0  # the leaders' ring and broadcast

    def free(self):
        self.inner.free()


class WeightAverage:
    """comm.outer_sync=weights: on outer epochs (epoch % outer_every == 0), buf <- its mean over all ranks, with MPI's
    Allreduce (every rank receives the same bytes). The trainer flattens into buf what it averages (the generator's
    weights and Adam moments) and loads the result back."""

    def __init__(self, world, outer_every: int, timeout_s):
        self.world, self.outer_every, self.timeout_s = world, outer_every, timeout_s

    def due(self, epoch: int) -> bool:
        return epoch % self.outer_every == 0

    def __call__(self, buf: np.ndarray, epoch: int) -> None:
        watchdog.allreduce_sum(self.world, buf, timeout_s=self.timeout_s, what="outer weight average", epoch=epoch)
        buf /= np.float32(self.world.Get_size())


class _RmaStep:
    """RmaExchange as an inner step (the callable shape of the other steps)."""

    def __init__(self, rma: RmaExchange):
        self.rma = rma

    def __call__(self, buf, epoch, weight=1.0):
        if weight:
            stats = self.rma.exchange(buf, epoch)
            self.last_weight = 1.0 + stats["rma_used"]
            return stats
        # dropped: publish nothing, use only what the others sent (buf holds zeros)
        stats = self.rma.combine(buf, epoch, average=False)
        if stats["rma_used"] > 1:
            buf /= np.float32(stats["rma_used"])
        self.last_weight = float(stats["rma_used"])
        return stats

    def consumed(self, epoch):
        self.rma.consumed(epoch)

    def waits(self, epoch):
        return False  # one-sided: a slow rank never blocks its neighbours

    def free(self):
        self.rma.free()


def build_exchange(mode: str, topo: Topology, n: int, *, ring: str = "whole", outer_every: int = 1000,
                   max_staleness: int = 10, timeout_s: float | None = 300.0,
                   outer_sync: str = "gradients") -> Exchange:
    """The exchange callable of `mode` for buffers of `n` float32. Collective over topo.world."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not one of {MODES}")

    def make_ring(comm, name, tag=RING_TAG):
        return Ring(comm, n, ring, timeout_s=timeout_s, tag=tag, name=name)

    def leaders_ring():
        return make_ring(topo.outer, "outer ring") if topo.outer is not None else None

    if mode == "ensemble":
        return Ensemble()
    if mode in ("allreduce", "hvd"):
        return Allreduce(topo, timeout_s)
    if mode == "arar":
        return RingMean(make_ring(topo.world, "world ring"))
    if mode == "arar-arar":
        return Grouped(topo, RingMean(make_ring(topo.inner, "inner ring")), leaders_ring(), outer_every, timeout_s,
                       outer_sync)
    rma = RmaExchange(topo.inner, n, max_staleness=max_staleness, timeout_s=timeout_s)
    return Grouped(topo, _RmaStep(rma), leaders_ring(), outer_every, timeout_s, outer_sync)
