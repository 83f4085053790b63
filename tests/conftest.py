"""Shared pytest hooks for the single-process tests."""
import pytest
import torch


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """A test that runs the trainer in-process sets torch's intra-op threads (sagips.trainer.set_threads) for the
    whole process; restore them, so that a later test does not run its small ops on more threads than it was given
    (on a loaded machine, 2 threads made 120 small ML fits 10x slower: 600 s instead of 60)."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)
