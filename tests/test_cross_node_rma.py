"""rma-arar-arar keeps its inner groups on one node unless comm.allow_cross_node_rma names the risk (issue 35):
one-sided MPI across nodes has known hangs on Slingshot (pmodels/mpich#7118, #7830; docs/polaris.md). Nodes are posed
on this one host with MPICH's MPIR_CVAR_NUM_CLIQUES (ranks dealt round-robin to the cliques, which
MPI_COMM_TYPE_SHARED then splits by)."""
from __future__ import annotations

from sagips.comm.topology import groups_across_nodes
from sagips.config import load
from tests._mpirun import run_mpi


def test_groups_across_nodes():
    nodes = [0, 0, 0, 0, 4, 4, 4, 4]                       # 2 nodes x 4 ranks
    assert groups_across_nodes(nodes, 4) == [] and groups_across_nodes(nodes, 2) == []
    assert groups_across_nodes(nodes, 8) == [list(range(8))]
    assert groups_across_nodes(nodes, 3) == [[3, 4, 5]]     # a size that does not divide a node's ranks
    assert groups_across_nodes([0, 1, 0, 1], 2) == [[0, 1], [2, 3]]


def test_the_flag_is_off_by_default():
    assert load(None).comm.allow_cross_node_rma is False
    assert load(None, ["comm.allow_cross_node_rma=true"]).comm.allow_cross_node_rma is True


def test_rma_groups_across_nodes_are_refused_in_one_line(tmp_path):
    args = ["-m", "sagips.run", "--config", "configs/proxy1d-quick.yaml", "--mode", "rma-arar-arar", "--epochs", "2",
            "--output-dir", str(tmp_path / "run"), "--no-progress", "--set", "comm.inner_size=2"]
    r = run_mpi(4, args, timeout=120, env={"MPIR_CVAR_NUM_CLIQUES": "2"})
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("sagips: error: comm.inner_size=2"), r.stderr
    assert "comm.allow_cross_node_rma=true" in lines[0] and "2 RMA group(s)" in lines[0]
    assert not (tmp_path / "run" / "run.json").exists()

