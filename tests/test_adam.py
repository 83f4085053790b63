"""sagips/adam.py: torch.optim.Adam's arithmetic, state dicts and hooks, bit for bit, without importing
torch._dynamo (the truth: torch.optim.Adam itself, run side by side on the same gradients)."""
import copy
import subprocess
import sys

import pytest
import torch

from sagips.adam import Adam, make_adam
from tests._mpirun import ROOT, child_env


def _pair(fused: bool, seed: int = 0):
    torch.manual_seed(seed)
    nets = [torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3)) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    kw = dict(lr=3e-2, betas=(0.5, 0.9), **({"fused": True} if fused else {}))
    return nets, Adam(nets[0].parameters(), **kw), torch.optim.Adam(nets[1].parameters(), **kw)


def _steps(nets, opts, n, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        x = torch.randn(11, 5, generator=g)
        for net, opt in zip(nets, opts):
            opt.zero_grad()
            with torch.enable_grad():  # torch's step turns grad off for the update: so must ours
                net(x).square().mean().backward()
            opt.step()


def _equal_states(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    assert sa["state"].keys() == sb["state"].keys()
    for k in sa["state"]:
        for name in sa["state"][k]:
            assert torch.equal(sa["state"][k][name], sb["state"][k][name]), (k, name)


@pytest.mark.parametrize("fused", [False, True])
def test_steps_and_state_dicts_are_torch_adams_bit_for_bit(fused):
    nets, ours, theirs = _pair(fused)
    assert isinstance(ours, torch.optim.Adam) and bool(ours.defaults.get("fused")) == fused
    _steps(nets, (ours, theirs), 6, seed=1)
    for a, b in zip(nets[0].parameters(), nets[1].parameters()):
        assert torch.equal(a, b) and a.is_leaf and a.grad_fn is None
    _equal_states(ours, theirs)
    # a state saved by one loads into the other, and both go on as one
    fresh_nets, ours2, theirs2 = _pair(fused, seed=5)
    fresh_nets[0].load_state_dict(nets[1].state_dict())
    fresh_nets[1].load_state_dict(nets[0].state_dict())
    ours2.load_state_dict(copy.deepcopy(theirs.state_dict()))  # as from a file: torch's load shares the tensors
    theirs2.load_state_dict(copy.deepcopy(ours.state_dict()))
    _equal_states(ours2, ours)
    _steps(fresh_nets, (ours2, theirs2), 3, seed=2)
    _steps(nets, (ours, theirs), 3, seed=2)
    for a, b, c in zip(fresh_nets[0].parameters(), fresh_nets[1].parameters(), nets[0].parameters()):
        assert torch.equal(a, b) and torch.equal(a, c)
    # zero_grad: None by default, zeros when asked, as torch's
    ours.zero_grad()
    assert all(p.grad is None for p in nets[0].parameters())
    _steps(nets[:1], (ours,), 1, seed=3)
    ours.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in nets[0].parameters())


def test_param_groups_and_step_hooks_are_torchs():
    nets, ours, _ = _pair(False)
    extra = torch.nn.Linear(2, 2)
    ours.add_param_group({"params": extra.parameters(), "lr": 1e-3})
    assert [g["lr"] for g in ours.param_groups] == [3e-2, 1e-3] and ours.param_groups[1]["betas"] == (0.5, 0.9)
    with pytest.raises(ValueError, match="more than one parameter group"):
        ours.add_param_group({"params": nets[0][0].weight})
    seen = []
    ours.register_step_pre_hook(lambda opt, a, k: seen.append("pre"))
    ours.register_step_post_hook(lambda opt, a, k: seen.append("post"))
    _steps(nets[:1], (ours,), 2, seed=4)
    assert seen == ["pre", "post"] * 2


def test_make_adam_takes_the_fused_kernel_where_there_is_one():
    p = [torch.nn.Parameter(torch.zeros(3))]
    assert type(make_adam(p, 1e-3, (0.5, 0.9), fused=False)) is Adam
    major, minor = (int(v) for v in torch.__version__.split(".")[:2])  # a CPU kernel since torch 2.4
    assert bool(make_adam(p, 1e-3, (0.5, 0.9), fused=True).defaults.get("fused")) == ((major, minor) >= (2, 4))


def test_a_run_imports_no_dynamo(tmp_path):
    """The point of the module: a whole run (start-up, training, checkpoints, the end-of-run analysis) never loads
    torch._dynamo (~1.2-3 s of CPU per rank)."""
    code = ("import sys; from sagips.run import main; "
            f"rc = main(['--config', 'configs/proxy1d-quick.yaml', '--epochs', '4', '--output-dir', {str(tmp_path)!r},"
            " '--no-progress', '--set', 'train.log_every=2', '--set', 'train.checkpoint_every=2']); "
            "print('rc', rc, 'dynamo', 'torch._dynamo' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=child_env(), capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.splitlines()[-1] == "rc 0 dynamo False", p.stdout[-2000:]


def test_an_adam_of_torch_made_before_the_import_changes_nothing():
    """torch patches its profiling hook into Adam.step at the first Adam: made before sagips.adam is imported, the
    unwrapped step is still the bare update (each hook runs once, the result is torch's)."""
    code = ("import torch; p = torch.nn.Parameter(torch.ones(3)); q = torch.nn.Parameter(torch.ones(3)); "
            "theirs = torch.optim.Adam([q], lr=0.1); theirs.step(); "
            "from sagips.adam import Adam; ours = Adam([p], lr=0.1); seen = []; "
            "ours.register_step_pre_hook(lambda *a: seen.append('pre')); "
            "ours.register_step_post_hook(lambda *a: seen.append('post')); "
            "p.grad = torch.tensor([1., -2., 3.]); q.grad = p.grad.clone(); ours.step(); theirs.step(); "
            "print(seen, torch.equal(p, q))")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=child_env(), capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["['pre',", "'post']", "True"], p.stdout
