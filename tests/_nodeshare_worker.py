"""Under mpiexec (tests/test_nodeshare.py): hold the node's subset of a data file in a shared window, as sagips.run
does with data.share=node, first on the real node (COMM_TYPE_SHARED: one node of all ranks on this host), then posing
as nodes of 2 ranks (a Split of the world: a shared window works on any group of ranks of one host). Each rank hands
the window to a proxy1d environment and draws a batch, and writes OUT/{split}{R}.json. argv: FILE FRACTION OUT."""
import json
import sys

import numpy as np
import torch
from mpi4py import MPI

from sagips.io import shard
from sagips.io.nodeshare import NodeData, split_nodes
from sagips.trainer import rank_seeds
from sagips_environments.proxy1d.env import Proxy1D, Proxy1DConfig

path, fraction, out_dir = sys.argv[1], float(sys.argv[2]), sys.argv[3]
world, SEED = MPI.COMM_WORLD, 7

for split in ("node", "pairs"):
    if split == "node":
        node, index = split_nodes(world)
    else:
        node, index = world.Split(color=world.rank // 2, key=world.rank), world.rank // 2
    layout, ranges = shard.plan_subset(world, path, {"events": 2}, shard.node_seed(SEED, 0, index), fraction,
                                       "blocks")
    data = NodeData(node, ranges, {"events": 2}, world, shard.reader(path, layout, {"events": 2}))
    env = Proxy1D(Proxy1DConfig(param_samples=4, events_per_sample=4), "cpu", seed=rank_seeds(SEED, 0, world.rank)[0])
    env.attach_subset(data.arrays, layout["attrs"])
    ev = data.arrays["events"]
    record = {"rank": world.rank, "node": index, "node_size": node.size, "allocated": data.allocated_bytes(),
              "nbytes": data.nbytes, "ids": ev[:, 1].astype(int).tolist(), "first": ev[:3, 0].tolist(),
              "ranges": ranges.tolist(),
              "zero_copy": bool(np.shares_memory(env.data.numpy(), ev)),
              "batch": env.real_batch()[:, 1].to(torch.int64).tolist()}
    del env, ev  # nothing may point into the window when it is freed
    data.free()
    with open(f"{out_dir}/{split}{world.rank}.json", "w") as fh:
        json.dump(record, fh)
