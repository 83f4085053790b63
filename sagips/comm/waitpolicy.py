"""The watchdog's wait loop in numbers: sagips.comm.watchdog waits with them, and the scaling model
(benchmarks/sim.py) models them. No MPI here, so that the model can import them without initialising MPI.

MPICH's own Waitall busy-polls, which on an oversubscribed node (more ranks than cores) steals the core from the very
peer we are waiting for; but a sleep costs ~60-100 us on Linux (timer slack + wake-up), several times a whole
200 KiB ring hop (~30 us on this machine). So a wait has three phases: spin on Testall for SPIN_S (a hop whose peer
is ready finishes here), then Testall + sched_yield until YIELD_S (costs ~1 us when the core is ours, hands it to
the peer when the node is oversubscribed), then sleeps with exponential back-off from MIN_SLEEP_S to MAX_SLEEP_S, so
that waiting for a straggler for seconds or minutes costs ~no CPU and wakes at most MAX_SLEEP_S late.
"""
SPIN_S = 20e-6
YIELD_S = 2e-3
MIN_SLEEP_S = 50e-6
MAX_SLEEP_S = 1e-3
