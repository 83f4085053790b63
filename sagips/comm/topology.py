"""Inner groups (the ranks of one node, or a fixed size) and the leaders' (outer) communicator.

    topo = build_topology(MPI.COMM_WORLD, inner_size=2)   # 4 ranks posing as 2 nodes x 2 GPUs
    topo.inner, topo.outer, topo.group_index, topo.is_leader
    ...
    topo.free()                                            # after every exchange built on it is freed

Paper IV-B4: ranks are divided into inner groups (one per node: on Polaris, 4 GPUs -> 4 ranks), the rank 0 of each
inner group is its leader, and the leaders form the outer group. Groups are numbered by their lowest rank in
`world`, on every rank, so the numbering does not depend on how MPI colours Split_type.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from mpi4py import MPI


@dataclass
class Topology:
    """The communicators of one run. Owns `inner` and `outer` (not `world`): call free() once, on every rank."""

    world: MPI.Comm            # the communicator of this run (may be a sub-communicator of COMM_WORLD)
    inner: MPI.Comm            # the ranks of my inner group, ordered by their rank in `world`
    outer: MPI.Comm | None     # the leaders' communicator (outer rank == group_index); None on non-leaders
    group_index: int           # which inner group I am in (groups ordered by their lowest `world` rank)
    n_groups: int
    group_sizes: list[int]     # size of every inner group, in group order
    groups: list[list[int]] = field(default_factory=list)  # `world` ranks of every group, in group order
    inner_size: int | None = None                          # as requested (None/0: one group per node)
    _freed: bool = field(default=False, repr=False)

    @property
    def is_leader(self) -> bool:
        """Rank 0 of its inner group (paper: the leader is fixed to the group's rank 0)."""
        return self.inner.Get_rank() == 0

    def describe(self) -> dict:
        """JSON-able layout for run.json."""
        return {
            "inner_size": self.inner_size or 0,
            "split": "fixed" if self.inner_size else "node (COMM_TYPE_SHARED)",
            "world_size": self.world.Get_size(),
            "n_groups": self.n_groups,
            "group_sizes": list(self.group_sizes),
            "groups": [list(g) for g in self.groups],
        }

    def free(self) -> None:
        """Free `outer` then `inner` (collective; the same order on every rank). Idempotent.

        Free every Ring/RmaExchange/exchange built on these communicators first (a window on `inner` must be freed
        before `inner` itself).
        """
        if self._freed:
            return
        self._freed = True
        if self.outer is not None:
            self.outer.Free()
        self.inner.Free()


def build_topology(world: MPI.Comm, inner_size: int | None) -> Topology:
    """Split `world` into inner groups of `inner_size` consecutive ranks (None or 0: one group per node).

    The last group may be smaller when inner_size does not divide the world size. Collective over `world`.
    """
    size, rank = world.Get_size(), world.Get_rank()
    if inner_size is not None and inner_size < 0:
        raise ValueError(f"comm.inner_size={inner_size} is negative; use 0 (one group per node) or a positive size")
    if inner_size and inner_size > size:
        raise ValueError(f"comm.inner_size={inner_size} is larger than the world size {size}; "
                         f"set comm.inner_size to at most {size} (or 0 for one group per node)")
    if inner_size:
        inner = world.Split(color=rank // inner_size, key=rank)
    else:
        # key=rank keeps the `world` order inside the node, so the leader is the node's lowest rank.
        inner = world.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    # Everyone learns every group's members; the groups are numbered by their lowest rank, identically everywhere.
    members = inner.allgather(rank)
    groups = sorted({tuple(sorted(g)) for g in world.allgather(tuple(members))}, key=lambda g: g[0])
    group_index = next(i for i, g in enumerate(groups) if rank in g)
    is_leader = inner.Get_rank() == 0
    # key=rank: leaders are ordered by their lowest rank, so the outer rank of a leader equals its group index.
    outer = world.Split(color=0 if is_leader else MPI.UNDEFINED, key=rank)
    if outer == MPI.COMM_NULL:
        outer = None
    return Topology(world=world, inner=inner, outer=outer, group_index=group_index, n_groups=len(groups),
                    group_sizes=[len(g) for g in groups], groups=[list(g) for g in groups],
                    inner_size=inner_size or None)


def node_of_ranks(world: MPI.Comm) -> list[int]:
    """The node of every rank of `world` (a node = the ranks of one MPI_COMM_TYPE_SHARED split, numbered by its lowest
    rank), identical on every rank. Collective over `world`."""
    node = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
    try:
        lowest = node.allreduce(world.Get_rank(), op=MPI.MIN)
    finally:
        node.Free()
    return world.allgather(lowest)


def groups_across_nodes(nodes: list[int], inner_size: int) -> list[list[int]]:
    """The fixed inner groups (inner_size consecutive ranks, as build_topology forms them) that hold ranks of more than
    one node; nodes[r] is the node of rank r (node_of_ranks)."""
    groups = [list(range(s, min(s + inner_size, len(nodes)))) for s in range(0, len(nodes), inner_size)]
    return [g for g in groups if len({nodes[r] for r in g}) > 1]
