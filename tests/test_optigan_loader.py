"""optiGAN's data paths (environment.loader): rows on the device, in host memory, or through a DataLoader."""
import io

import numpy as np
import pytest
import torch

from sagips.config import ConfigError, load
from sagips.environment import get_environment
from sagips.trainer import Trainer
from sagips_environments.optigan.env import BootstrapBatches, resolve_loader

TINY = ["environment.name=optigan", "environment.photons_per_point=60", "environment.grid_side=2",
        "environment.grid_depths=2", "environment.heldout_points=2", "environment.heldout_photons=200",
        "environment.quality_photons=100", "environment.quality_points=1", "environment.batch_size=64",
        "train.lr_g=1e-3", "train.lr_d=1e-3", "train.beta2=0.9", "train.progress=false", "train.threads=1",
        # forked workers start in ms; the default (forkserver, whose workers import torch: seconds) and the batches'
        # independence of the start method are checked by test_dataloader_workers_are_not_forks_of_the_rank
        "environment.loader_start=fork"]


@pytest.fixture(scope="module")
def reference():
    cfg = load(None, TINY)
    return get_environment("optigan").generate_reference(cfg.environment, 0)


def make_env(reference, sets=(), seed=5):
    cfg = load(None, TINY + list(sets))
    env = get_environment("optigan")(cfg.environment, "cpu", seed=seed)
    env.attach_data(*reference, np.random.default_rng(0))
    return cfg, env


def rows_of(a: torch.Tensor) -> set:
    return set(map(tuple, a.numpy().tolist()))


@pytest.mark.parametrize("workers", [0, 1])
def test_dataloader_batches_come_from_the_ranks_subset(reference, workers):
    _, env = make_env(reference, ["environment.loader=dataloader", f"environment.loader_workers={workers}",
                                  "environment.subset_fraction=0.5"])
    assert env.loader == "dataloader" and env.subset_idx.size > 0
    arrays = reference[0]
    table = np.concatenate([arrays["photons"], arrays["conditions"]], axis=1).astype(np.float32)
    mine = rows_of(torch.from_numpy(table[env.subset_idx]))
    others = rows_of(torch.from_numpy(np.delete(table, env.subset_idx, axis=0))) - mine
    seen = set()
    for _ in range(5):
        b = env.real_batch()
        assert b.shape == (64, 9) and b.dtype == torch.float32 and b.device == env.device
        assert rows_of(b) <= mine
        seen |= rows_of(b)
    assert not seen & others and len(seen) > 64  # with replacement, from fresh indices every batch
    assert env.extra_state() == {"loader_seed": 5, "loader_batches": 5}


def test_dataloader_batches_do_not_depend_on_the_workers(reference):
    batches = {}
    for workers in (0, 1):
        _, env = make_env(reference, ["environment.loader=dataloader", f"environment.loader_workers={workers}",
                                      "environment.prefetch_factor=3"])
        batches[workers] = [env.real_batch() for _ in range(4)]
    for a, b in zip(batches[0], batches[1]):
        assert torch.equal(a, b)
    assert not torch.equal(batches[0][0], batches[0][1])
    # item i depends on (seed, i) only
    ds = BootstrapBatches(torch.arange(1000.0).reshape(-1, 1), 16, seed=3)
    assert torch.equal(ds[7], ds[7]) and not torch.equal(ds[7], ds[8])
    assert not torch.equal(ds[7], BootstrapBatches(ds.rows, 16, seed=4)[7])


class _Parent(torch.utils.data.Dataset):
    """Item i: (the pid of the worker's parent, whether this process has MPI loaded)."""

    def __len__(self):
        return 1

    def __getitem__(self, i):
        import os
        import sys

        return torch.tensor([os.getppid(), int("mpi4py.MPI" in sys.modules)])


def test_dataloader_workers_are_not_forks_of_the_rank(reference):
    """issue 21, item 8: the rank has called MPI_Init, so its DataLoader workers start from a clean forkserver (the
    default) or spawn, not as forks of it; the batches are the same whatever the start method."""
    import os

    from mpi4py import MPI  # noqa: F401  (as in a rank: MPI initialised before the loader starts)

    assert load(None, ["environment.name=optigan"]).environment.loader_start == "forkserver"  # the default
    _, env = make_env(reference, ["environment.loader=dataloader", "environment.loader_workers=1",
                                  "environment.loader_start=forkserver"])
    assert env._dataloader().multiprocessing_context.get_start_method() == "forkserver"
    for start in ("forkserver", "fork"):
        loader = torch.utils.data.DataLoader(_Parent(), batch_size=None, num_workers=1,
                                             multiprocessing_context=start)
        ppid, has_mpi = next(iter(loader)).tolist()
        assert (ppid == os.getpid()) == (start == "fork"), start  # the check can fail: a fork's parent is the rank
        assert bool(has_mpi) == (start == "fork"), start
    got = {}
    for start in ("forkserver", "fork"):
        _, env = make_env(reference, ["environment.loader=dataloader", "environment.loader_workers=1",
                                      f"environment.loader_start={start}"])
        got[start] = [env.real_batch() for _ in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(got["forkserver"], got["fork"]))


def _train(trainer, epochs):
    for e in epochs:
        out = trainer.step(e)
        assert np.isfinite(out["loss_d"].item()) and np.isfinite(out["loss_g"].item())


def _roundtrip(sd):
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def test_dataloader_trains_and_resumes_bit_identically(reference, tmp_path):
    """4 epochs in one go == 2 epochs, save, a fresh trainer (another worker count) loads the state, 2 more."""
    sets = ["environment.loader=dataloader", "environment.loader_workers=1"]
    cfg, env = make_env(reference, sets)
    torch.manual_seed(0)
    ref = Trainer(cfg, env, 0, 1, str(tmp_path / "a"), is_root=False)
    before = [p.detach().clone() for p in ref.G.parameters()]
    _train(ref, range(1, 5))
    assert max(float((p.detach() - b).abs().max()) for p, b in zip(ref.G.parameters(), before)) > 0
    assert env.extra_state()["loader_batches"] == 4 * (env.n_critic + 1)

    cfg, env = make_env(reference, sets)
    torch.manual_seed(0)
    first = Trainer(cfg, env, 0, 1, str(tmp_path / "b"), is_root=False)
    _train(first, range(1, 3))
    first.state.epoch = 2
    sd = _roundtrip(first.state_dict())
    cfg, env = make_env(reference, ["environment.loader=dataloader", "environment.loader_workers=0"], seed=99)
    second = Trainer(cfg, env, 0, 1, str(tmp_path / "b"), is_root=False)
    second.load_state_dict(sd)
    _train(second, range(3, 5))
    for a, b in zip(ref.G.state_dict().values(), second.G.state_dict().values()):
        assert torch.equal(a, b)


def test_host_and_device_paths_still_train(reference, tmp_path):
    for loader in ("device", "host"):
        cfg, env = make_env(reference, [f"environment.loader={loader}"])
        assert env.loader == loader and env.extra_state()["loader_batches"] == 0
        _train(Trainer(cfg, env, 0, 1, str(tmp_path / loader), is_root=False), range(1, 3))


def test_loader_config_and_auto(monkeypatch):
    assert load(None, TINY).environment.loader == "auto"
    assert load(None, TINY + ["environment.data_on_device=false"]).environment.loader == "host"  # deprecated alias
    assert load(None, TINY + ["environment.data_on_device=true"]).environment.loader == "device"
    with pytest.raises(ConfigError, match="contradicts environment.loader"):
        load(None, TINY + ["environment.data_on_device=true", "environment.loader=dataloader"])
    with pytest.raises(ConfigError, match="environment.loader"):
        load(None, TINY + ["environment.loader=gpu"])
    with pytest.raises(ConfigError, match="environment.prefetch_factor"):
        load(None, TINY + ["environment.prefetch_factor=0"])
    assert resolve_loader("auto", torch.device("cpu"), 10 ** 12, 0.25) == "device"  # CPU: memory is the device
    assert resolve_loader("host", torch.device("cpu"), 1, 0.25) == "host"
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1000, 4000))
    cuda = torch.device("cuda", 0)
    assert resolve_loader("auto", cuda, 250, 0.25) == "device"
    assert resolve_loader("auto", cuda, 251, 0.25) == "dataloader"
    assert resolve_loader("device", cuda, 10 ** 12, 0.25) == "device"  # explicit: obeyed
