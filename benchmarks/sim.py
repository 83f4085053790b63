"""A discrete-event model of the SAGIPS exchange schedules: training time and analysis rate versus ranks.

    from sim import Link, Profile, simulate, project     # (run from benchmarks/; tests: tests._bench.load_benchmark)
    prof = Profile(name="toy", epoch_s=0.035, intra=Link(0.5e-6, 10e9), inter=Link(2.5e-6, 25e9), hop_overhead_s=20e-6)
    res = simulate("arar-arar", n_ranks=400, epochs=2000, profile=prof, outer_every=1000)
    res.train_s, res.finish            # the run's training seconds (slowest rank), every rank's finishing time
    project("arar", 400, prof, epochs=100_000)   # -> {"train_s": ..., "rate": ...} (eq. 9)

Pure numpy, no MPI: benchmarks/scaling_model.py calibrates the inputs and draws the figures (docs/benchmarks/).

What one epoch is, per rank r (times in seconds, one clock shared by all ranks; every rank starts at 0):

    arrive[r] = end[r] of the previous epoch + compute[r] (+ offload_s in every mode but ensemble)
    end[r]    = arrive[r] followed by the exchange of the mode, with the waits that the exchange implies

compute[r] = epoch_s * max(0, 1 + jitter_cv * N(0, 1)) * oversubscription, plus the extra seconds of stragglers
(fixed per rank, like sagips.run's pipeline.delay_s; or random per rank and epoch).

The exchanges (the same algorithms as sagips/comm/):
- ring "whole" (the paper's, Algorithm 1): N-1 hops of the full buffer (n+1 floats: the weight travels with it).
  In hop k rank r posts Irecv from its left neighbour L and Isend to its right neighbour R, then waits for both:
      F[r][k] = max( max(F[r][k-1], F[L][k-1]) + c(L->r),          the receive: L must have entered hop k
                     max(F[r][k-1], F[R][k-1]) + c(r->R) )          the send: R must have entered hop k
  The second term is the rendezvous protocol of large messages (MPICH above its eager limit: 200 kB is), where a
  send completes only once the receiver has posted its receive. With rendezvous=False (eager) it is dropped.
  c(a->b) = hop_overhead_s + link.latency_s + bytes / link.bandwidth_Bps, with the intra-node link when a and b
  share a node, else the inter-node link. After the last hop a rank adds the N rows: (N-1) n reduce_s_per_float.
  Hence a slow rank delays its whole ring (the delay travels one neighbour per hop, and N-1 hops reach everybody).
- ring "chunked": reduce-scatter then all-gather, 2(N-1) hops of ceil((n+1)/N) floats, same hop rule; the
  reduce-scatter hops also add one received chunk (ceil((n+1)/N) reduce_s_per_float).
- allreduce (MPI_Allreduce): modelled as MPICH's algorithm for long messages, Rabenseifner's reduce-scatter by
  recursive halving + all-gather by recursive doubling: 2 ceil(log2 N) rounds; round i of each half moves
  bytes/2^i to a partner at distance 2^(L-i) (the farthest partner gets the largest message), over the inter-node
  link when the partner is on another node. It is a collective in which everybody depends on everybody after
  log2 N rounds, so it is modelled as a barrier: end[r] = max(arrive) + call_overhead_s + the round costs +
  (N-1)/N n reduce_s_per_float + bytes * allreduce_s_per_byte (MPICH's own work per byte beyond the rounds). Unlike the Python ring, the per-round cost has no Python overhead (one call).
  Mode `allreduce` makes two such calls per epoch (sagips.comm.modes.Allreduce): the buffer, then a 1-float count
  of the contributors; the second starts when every rank has left the first, so only the first waits in the
  back-off (polling below).
- rma (the inner step of rma-arar-arar): no waiting on anybody: end[r] = arrive[r] + rma_fixed_s +
  (K-1) rma_per_peer_s (publish into K-1 windows, read and check K-1 slots, add them; all local work).
- grouped modes: inner groups are blocks of inner_size consecutive ranks (as sagips.comm.topology with
  comm.inner_size, and as COMM_TYPE_SHARED with block placement of ranks on nodes). arar-arar runs the ring inside
  every group every epoch. On an outer epoch (epoch % outer_every == 0; epochs are 1-based) the leaders (the first
  rank of each group) then run the ring among themselves (same algorithm), and each leader broadcasts to its group
  (Ibcast, a binomial tree: call_overhead_s + ceil(log2 K) * c_intra(bytes)). With rendezvous a tree's send
  completes only once its receiver has entered, so the broadcast ends for the whole group at the latest arrival in
  the group + that cost; eager: end[m] = max(end[m], end[leader]) + cost. So in rma-arar-arar a straggler holds up
  its own group at an outer epoch, and, through its late leader, everybody at the next one.

The wait loop (polling=True), with the constants of sagips.comm.waitpolicy (the watchdog's own): a rank tests its
requests continuously while it spins (poll_spin_s) and then yields (until poll_yield_s has passed since the wait
began), then sleeps with exponential back-off (poll_min_sleep_s doubling up to poll_max_sleep_s, each sleep taking
wake_s longer than asked). A rank that waits W therefore notices the completion at once if W <= poll_yield_s, else
at its first test after W (poll_finish): a ring hop that had to wait longer than the yield phase finishes late by up
to one back-off gap. (A yield on an oversubscribed node hands the core to another runnable rank; the model counts
that through the compute slow-down of shared cores, not here.) A nonblocking collective
(Iallreduce, Ibcast) progresses only inside those tests: once the last rank has arrived, every later round waits
for the early ranks' next test, on average half their (by then long) gap: collective_rounds * rounds * gap / 2.

Output: res.train_s = max over ranks of the finishing time (sagips.run reports per-rank training seconds; the run
lasts as long as its slowest rank). Analysis rate (paper eq. 9) = N * events_per_epoch * epochs / train_s.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from sagips.comm import waitpolicy  # the watchdog's wait loop, in numbers
from sagips.config import MODES as _ALL_MODES  # the one definition of the mode names

#: the modes this model simulates: every mode but hvd, whose critic exchange (an Allreduce per critic step) it
#: does not model
MODES = tuple(m for m in _ALL_MODES if m != "hvd")
RINGS = ("whole", "chunked")


@dataclass(frozen=True)
class Link:
    """One kind of link: the MPI latency of a message (s) and the bandwidth of one transfer (bytes/s)."""

    latency_s: float
    bandwidth_Bps: float

    def time(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bandwidth_Bps


@dataclass
class Profile:
    """A machine + workload. Every number is per rank; `sources` says where each one comes from."""

    name: str
    epoch_s: float                    #: mean compute seconds per epoch (critic + generator steps), exchange excluded
    intra: Link                       #: between ranks of one node
    inter: Link                       #: between ranks of different nodes
    ranks_per_node: int = 4           #: ranks r and s share a node iff r // ranks_per_node == s // ranks_per_node
    jitter_cv: float = 0.0            #: coefficient of variation of the compute time (Gaussian, clipped at 0)
    hop_overhead_s: float = 0.0       #: Python/mpi4py cost of one ring hop (Isend + Irecv + the wait loop)
    call_overhead_s: float = 0.0      #: Python/mpi4py cost of one collective call (Iallreduce, Ibcast + wait)
    allreduce_s_per_byte: float = 0.0  #: an Iallreduce's per-byte cost beyond its modelled rounds (MPICH's own
                                       #: copies and reductions in host memory), per byte of the buffer
    reduce_s_per_float: float = 0.0   #: one float32 addition in numpy, per element
    offload_s: float = 0.0            #: per epoch, every mode but ensemble: D2H + H2D of the buffer, copies, divide
    rma_fixed_s: float = 0.0          #: RMA exchange: fixed local cost per call
    rma_per_peer_s: float = 0.0       #: RMA exchange: local cost per peer of the group (store + read + crc + add)
    rendezvous: bool = True           #: a ring send also waits for the receiver (large messages)
    cpu_cores: int | None = None      #: cores of one node for compute; more ranks than that share them (None: no limit)
    corun_factor: float = 1.0         #: slow-down of a rank's compute while other ranks compute on the same node's
                                      #: cores (shared caches, memory bandwidth, clocks); 1 = none (one GPU per rank)
    polling: bool = False             #: model the watchdog's wait loop (spin, yield, sleeps with back-off)
    poll_spin_s: float = waitpolicy.SPIN_S            #: spin this long on Testall
    poll_yield_s: float = waitpolicy.YIELD_S          #: then Testall + sched_yield until this long since the start
    poll_min_sleep_s: float = waitpolicy.MIN_SLEEP_S  #: first sleep of the back-off (doubling)
    poll_max_sleep_s: float = waitpolicy.MAX_SLEEP_S  #: longest sleep of the back-off
    wake_s: float = 0.0               #: extra time every sleep really takes (timer slack + scheduler wake-up)
    collective_rounds: float = 1.0    #: polled rounds of a nonblocking collective, per 2*ceil(log2 N) modelled ones
    n_floats: int = 50_688            #: exchanged float32 (the generator's weight gradients)
    events_per_epoch: int = 102_400   #: discriminator batch, N_disc of eq. 9
    sources: dict = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Bytes of one whole-buffer message: the n floats + 1 weight float."""
        return 4 * (self.n_floats + 1)

    def link(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, Link, Link]:
        """(same-node mask, intra, inter) for rank arrays a and b."""
        return (a // self.ranks_per_node) == (b // self.ranks_per_node), self.intra, self.inter

    def hop_cost(self, a: np.ndarray, b: np.ndarray, nbytes: float) -> np.ndarray:
        """Cost of one ring hop from ranks a to ranks b (elementwise) carrying nbytes."""
        same, intra, inter = self.link(np.asarray(a), np.asarray(b))
        return self.hop_overhead_s + np.where(same, intra.time(nbytes), inter.time(nbytes))

    def compute_factor(self, n_ranks: int) -> float:
        """Slow-down of compute when ranks share a node's cores (the local 2-core profile): corun_factor once two or
        more ranks compute on the node, times the time-slicing of more ranks than cores."""
        if not self.cpu_cores:
            return 1.0
        on_node = min(n_ranks, self.ranks_per_node)
        return (self.corun_factor if on_node > 1 else 1.0) * max(1.0, on_node / self.cpu_cores)


@dataclass
class SimResult:
    mode: str
    n_ranks: int
    epochs: int
    finish: np.ndarray                #: (n_ranks,) finishing time of every rank
    epoch_ends: np.ndarray | None     #: (epochs, n_ranks) end of every epoch, if trace=True

    @property
    def train_s(self) -> float:
        return float(self.finish.max())


# ------------------------------------------------------------------------------------------------- polling
_CHECKS: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}


def _checks(prof: Profile) -> tuple[np.ndarray, np.ndarray]:
    """Times (from the start of a wait) at which the watchdog's loop tests the requests once it has stopped testing
    continuously (after the spin and the yield phase), and the gap that follows each test: sleeps of min, 2 min, ...
    max, each + wake_s."""
    key = (_continuous(prof), prof.poll_min_sleep_s, prof.poll_max_sleep_s, prof.wake_s)
    if key not in _CHECKS:
        lo, hi = max(prof.poll_min_sleep_s, 1e-7), max(prof.poll_max_sleep_s, 1e-7)
        times, gaps, t, sleep = [], [], _continuous(prof), min(lo, hi)
        while t < 120.0:  # longer waits are the watchdog's business, not the model's
            times.append(t)
            gaps.append(sleep + prof.wake_s)
            t += sleep + prof.wake_s
            sleep = min(2 * sleep, hi)
        _CHECKS[key] = (np.array(times), np.array(gaps))
    return _CHECKS[key]


def _continuous(prof: Profile) -> float:
    """How long a wait tests continuously (spin, then yield) before it sleeps."""
    return max(prof.poll_spin_s, prof.poll_yield_s)


def poll_finish(prof: Profile, wait: np.ndarray) -> np.ndarray:
    """When a rank that waits `wait` seconds for its requests notices that they completed (>= wait)."""
    wait = np.asarray(wait, float)
    if not prof.polling:
        return wait
    times, _ = _checks(prof)
    idx = np.minimum(np.searchsorted(times, wait), len(times) - 1)
    return np.where(wait <= _continuous(prof), wait, np.maximum(times[idx], wait))


def poll_interval(prof: Profile, waited: np.ndarray) -> np.ndarray:
    """The gap between two tests of a rank that has been waiting `waited` seconds (0 while it spins or yields)."""
    waited = np.asarray(waited, float)
    if not prof.polling:
        return np.zeros_like(waited)
    times, gaps = _checks(prof)
    idx = np.clip(np.searchsorted(times, waited, side="right") - 1, 0, len(times) - 1)
    return np.where(waited <= _continuous(prof), 0.0, gaps[idx])


def collective_delay(prof: Profile, arrive: np.ndarray, rounds: int) -> float:
    """Extra time of a nonblocking collective under the watchdog's loop: the early ranks have backed off to long
    sleeps by the time the last one arrives; every later round of the collective waits, on average, half the
    longest gap between two tests of its participants."""
    if not prof.polling or rounds == 0:
        return 0.0
    gap = float(poll_interval(prof, arrive.max() - arrive).max())
    return prof.collective_rounds * rounds * gap / 2


# ------------------------------------------------------------------------------------------------- the rings
def ring_hops(start: np.ndarray, cost_recv: np.ndarray, cost_send: np.ndarray, hops: int, rendezvous: bool,
              extra: np.ndarray | float = 0.0, extra_hops: int = 0, prof: Profile | None = None) -> np.ndarray:
    """Hop-by-hop finishing times of rings, vectorised over independent rings of equal size.

    start: (G, K) arrival times (ring g, position j; left neighbour j-1, right neighbour j+1, cyclic).
    cost_recv[g, j]: cost of the hop into position j from its left; cost_send[g, j]: from j to its right.
    extra: local work added to the first `extra_hops` hops (the chunk additions of a reduce-scatter).
    Returns (hops + 1, G, K): row 0 is `start`, row k the end of hop k.
    """
    f = np.empty((hops + 1,) + start.shape)
    f[0] = start
    for k in range(1, hops + 1):
        prev = f[k - 1]
        left = np.roll(prev, 1, axis=-1)
        done = np.maximum(prev, left) + cost_recv
        if rendezvous:
            right = np.roll(prev, -1, axis=-1)
            done = np.maximum(done, np.maximum(prev, right) + cost_send)
        if prof is not None and prof.polling:  # the rank notices completion at its next test
            done = prev + poll_finish(prof, done - prev)
        if k <= extra_hops:
            done = done + extra
        f[k] = done
    return f


def ring_allreduce(arrive: np.ndarray, members: np.ndarray, prof: Profile, algorithm: str) -> np.ndarray:
    """End times of rings over `members` (G, K): ranks (indices into `arrive`) in ring order. Returns (G, K)."""
    g, k = members.shape
    start = arrive[members]
    if k == 1:
        return start
    right = np.roll(members, -1, axis=-1)
    left = np.roll(members, 1, axis=-1)
    n = prof.n_floats
    if algorithm == "whole":
        nbytes = prof.nbytes
        f = ring_hops(start, prof.hop_cost(left, members, nbytes), prof.hop_cost(members, right, nbytes), k - 1,
                      prof.rendezvous, prof=prof)
        return f[-1] + (k - 1) * n * prof.reduce_s_per_float
    if algorithm == "chunked":
        chunk = math.ceil((n + 1) / k)
        f = ring_hops(start, prof.hop_cost(left, members, 4 * chunk), prof.hop_cost(members, right, 4 * chunk),
                      2 * (k - 1), prof.rendezvous, extra=chunk * prof.reduce_s_per_float, extra_hops=k - 1,
                      prof=prof)
        return f[-1]
    raise ValueError(f"ring algorithm {algorithm!r} is not one of {RINGS}")


def allreduce_cost(n_ranks: int, prof: Profile, n_floats: int | None = None) -> float:
    """One MPI_Allreduce of n_floats (default: the exchanged buffer, prof.n_floats + 1 floats on the wire) modelled
    as Rabenseifner (recursive halving + doubling), block placement of ranks on nodes, plus call_overhead_s."""
    if n_ranks == 1:
        return 0.0
    n = prof.n_floats if n_floats is None else n_floats
    nbytes = prof.nbytes if n_floats is None else 4 * n_floats
    rounds = math.ceil(math.log2(n_ranks))
    total = prof.call_overhead_s
    for i in range(1, rounds + 1):
        distance = 2 ** (rounds - i)
        link = prof.intra if distance < prof.ranks_per_node else prof.inter
        total += 2 * link.time(nbytes / 2 ** i)  # reduce-scatter round + the mirrored all-gather round
    return total + (n_ranks - 1) / n_ranks * n * prof.reduce_s_per_float + nbytes * prof.allreduce_s_per_byte


def allreduce_mode_cost(n_ranks: int, prof: Profile) -> float:
    """The exchange of mode `allreduce` (sagips.comm.modes.Allreduce) once every rank has arrived: the buffer's
    Iallreduce, then a 1-float Iallreduce of the contributors' count (ranks that dropped a non-finite gradient)."""
    return allreduce_cost(n_ranks, prof) + allreduce_cost(n_ranks, prof, n_floats=1)


def bcast_cost(k: int, prof: Profile) -> float:
    """Ibcast of the buffer inside one node: binomial tree, ceil(log2 K) rounds."""
    if k == 1:
        return 0.0
    return prof.call_overhead_s + math.ceil(math.log2(k)) * prof.intra.time(prof.nbytes)


def rma_cost(k: int, prof: Profile) -> float:
    return prof.rma_fixed_s + (k - 1) * prof.rma_per_peer_s if k > 1 else 0.0


def groups_of(n_ranks: int, inner_size: int) -> list[np.ndarray]:
    """Blocks of equal-size groups as 2-D arrays of ranks (the last, smaller group in its own block)."""
    full, rest = divmod(n_ranks, inner_size)
    blocks = []
    if full:
        blocks.append(np.arange(full * inner_size).reshape(full, inner_size))
    if rest:
        blocks.append(np.arange(full * inner_size, n_ranks).reshape(1, rest))
    return blocks


# ------------------------------------------------------------------------------------------------- one run
def simulate(mode: str, n_ranks: int, epochs: int, profile: Profile, *, inner_size: int | None = None,
             outer_every: int = 1000, ring: str = "whole", delays: dict[int, float] | None = None,
             straggler_prob: float = 0.0, straggler_s: float = 0.0, seed: int = 0,
             trace: bool = False, compute: np.ndarray | None = None) -> SimResult:
    """Run the schedule of `mode` for `epochs` epochs on `n_ranks` ranks (see the module docstring).

    compute: optional (epochs, n_ranks) array of compute seconds that replaces the drawn ones (epoch_s, jitter,
    random stragglers); `delays` and offload_s are still added. Used to replay a measured schedule.
    """
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {MODES}")
    if ring not in RINGS:
        raise ValueError(f"ring {ring!r} is not one of {RINGS}")
    prof = profile
    k = min(inner_size or prof.ranks_per_node, n_ranks)
    rng = np.random.default_rng(seed)
    delay = np.zeros(n_ranks)
    for r, d in (delays or {}).items():
        delay[r] += d
    mean = prof.epoch_s * prof.compute_factor(n_ranks)
    exchanging = mode != "ensemble"
    world = np.arange(n_ranks).reshape(1, n_ranks)
    blocks = groups_of(n_ranks, k)
    leaders = np.arange(0, n_ranks, k)
    ar_cost = allreduce_mode_cost(n_ranks, prof)
    bc_cost = bcast_cost(k, prof)
    group_of = np.arange(n_ranks) // k
    sizes = np.bincount(group_of)
    rma_local = np.array([rma_cost(int(s), prof) for s in sizes])[group_of]

    end = np.zeros(n_ranks)
    ends = np.empty((epochs, n_ranks)) if trace else None
    given = None if compute is None else np.asarray(compute, float).reshape(epochs, n_ranks)
    for epoch in range(1, epochs + 1):
        if given is not None:
            work = given[epoch - 1]
        else:
            work = np.full(n_ranks, mean)
            if prof.jitter_cv:
                work *= np.maximum(0.0, 1.0 + prof.jitter_cv * rng.standard_normal(n_ranks))
            if straggler_prob:
                work += straggler_s * (rng.random(n_ranks) < straggler_prob)
        arrive = end + work + delay + (prof.offload_s if exchanging else 0.0)
        if mode == "ensemble" or n_ranks == 1:
            end = arrive
        elif mode == "allreduce":
            rounds = 2 * math.ceil(math.log2(n_ranks))
            end = np.full(n_ranks, arrive.max() + ar_cost + collective_delay(prof, arrive, rounds))
        elif mode == "arar":
            end = ring_allreduce(arrive, world, prof, ring)[0]
        else:
            if mode == "arar-arar":
                end = np.empty(n_ranks)
                for members in blocks:
                    end[members] = ring_allreduce(arrive, members, prof, ring)
            else:  # rma-arar-arar
                end = arrive + rma_local
            if epoch % outer_every == 0:
                end = end.copy()
                if len(leaders) > 1:
                    end[leaders] = ring_allreduce(end, leaders.reshape(1, -1), prof, ring)[0]
                if prof.rendezvous:  # the tree's sends complete only once every member has posted its receive
                    latest = np.maximum.reduceat(end, leaders)
                    if prof.polling:
                        waited = (latest[group_of] - end)
                        gap = np.maximum.reduceat(poll_interval(prof, waited), leaders)
                        latest = latest + prof.collective_rounds * math.ceil(math.log2(max(k, 2))) * gap / 2
                    end = latest[group_of] + bc_cost
                else:                # eager: a member waits for the root's data only
                    end = np.maximum(end, end[leaders][group_of]) + bc_cost
        if trace:
            ends[epoch - 1] = end
    return SimResult(mode, n_ranks, epochs, end, ends)


def rate(n_ranks: int, events_per_epoch: int, epochs: int, train_s: float) -> float:
    """Paper eq. 9: events analysed per second by the whole run."""
    return n_ranks * events_per_epoch * epochs / train_s


def project(mode: str, n_ranks: int, profile: Profile, epochs: int, *, sim_epochs: int | None = None,
            outer_every: int = 1000, **kw) -> dict:
    """Training time and eq.-9 rate of a full run of `epochs`, from `sim_epochs` simulated epochs.

    The schedule is periodic (allreduce and arar meet every epoch, the grouped modes every outer_every epochs), so
    the simulated time per epoch is extrapolated linearly. sim_epochs defaults to 2 outer periods for the grouped
    modes, 100 epochs for allreduce and arar, and 20,000 for ensemble (independent ranks drift apart like random
    walks: the slowest one's excess grows like sqrt(epochs), so the ensemble is simulated long); never more than
    `epochs`.
    """
    if sim_epochs is None:
        sim_epochs = {"arar-arar": 2 * outer_every, "rma-arar-arar": 2 * outer_every, "ensemble": 20_000}.get(mode, 100)
    sim_epochs = min(sim_epochs, epochs)
    res = simulate(mode, n_ranks, sim_epochs, profile, outer_every=outer_every, **kw)
    train_s = res.train_s * epochs / sim_epochs
    return {"mode": mode, "n_ranks": n_ranks, "epochs": epochs, "sim_epochs": sim_epochs, "train_s": train_s,
            "epoch_s": train_s / epochs, "rate": rate(n_ranks, profile.events_per_epoch, epochs, train_s)}


def with_changes(profile: Profile, **changes) -> Profile:
    """A copy of `profile` with some fields changed (sensitivity studies)."""
    return replace(profile, **changes)
