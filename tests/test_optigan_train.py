"""A short in-process optiGAN training through the generic trainer, then export of its checkpoint to opengate."""
import math

import numpy as np
import pytest
import torch

from sagips.config import load
from sagips.environment import get_environment
from sagips.io.checkpoint import list_checkpoints, load_checkpoint
from sagips.io.metrics import read_metrics
from sagips.trainer import Trainer

TINY = ["environment.name=optigan", "environment.photons_per_point=60", "environment.grid_side=2",
        "environment.grid_depths=2", "environment.heldout_points=2", "environment.heldout_photons=200",
        "environment.quality_photons=100", "environment.batch_size=64", "train.lr_g=1e-3", "train.lr_d=1e-3",
        "train.beta2=0.9", "train.log_every=2", "train.checkpoint_every=2", "train.progress=false",
        "train.threads=1"]


def _train(tmp_path, epochs, extra=()):
    cfg = load(None, TINY + list(extra), {"train.epochs": epochs, "output_dir": str(tmp_path)})
    env_cls = get_environment(cfg.environment.name)
    arrays, attrs = env_cls.generate_reference(cfg.environment, cfg.seed)
    env = env_cls(cfg.environment, "cpu", seed=0)
    env.attach_data(arrays, attrs, np.random.default_rng(0))
    torch.manual_seed(0)
    trainer = Trainer(cfg, env, 0, 1, str(tmp_path))
    before = [p.detach().clone() for p in trainer.G.parameters()]
    trainer.fit(progress=False)
    moved = max(float((p.detach() - b).abs().max()) for p, b in zip(trainer.G.parameters(), before))
    return trainer, read_metrics(tmp_path / "metrics.jsonl"), moved


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("optigan")
    return (out, *_train(out, 6))


def test_losses_finite_and_generator_moves(run):
    out, _, metrics, moved = run
    assert [m["epoch"] for m in metrics] == [1, 2, 4, 6]
    for m in metrics:
        for k in ("loss_d", "loss_g", "w_dist", "gp", "js", "js_ceiling"):
            assert isinstance(m[k], float) and math.isfinite(m[k]), (k, m)
        assert m["quality_set"] == "heldout" and m["gp"] >= 0
    assert moved > 1e-4
    # the checkpoint holds the standardisation buffers: it is self-contained
    ck = load_checkpoint(list_checkpoints(out)[0][6])
    assert ck["environment"] == "optigan" and "out_std" in ck["generator"]


def test_export_cli_of_a_trained_checkpoint(run, tmp_path, capsys):
    from sagips_environments.optigan.export import main as export_main
    from sagips_environments.optigan.opengate import PlainGenerator

    out, trainer, _, _ = run
    path = list_checkpoints(out)[0][6]
    dst = tmp_path / "model.pt"
    assert export_main([str(path), "--format", "opengate", "--out", str(dst)]) == 0
    printed = capsys.readouterr()
    assert "critic: trained" in printed.out  # from the run's full state at the same epoch
    assert "note:" not in printed.err  # no run.json saying the outputs were folded: nothing to warn about
    exported = torch.load(dst, map_location="cpu", weights_only=True)
    for k, v in trainer.D.fold().items():
        torch.testing.assert_close(exported["discriminator_state_dict"][k], v)
    assert exported["epoch"] == 6 and math.isfinite(exported["generator_loss"])  # from metrics.jsonl at epoch 6
    plain = PlainGenerator()
    plain.load_state_dict(exported["generator_state_dict"])
    x = torch.cat([torch.randn(512, 10), torch.rand(512, 3)], 1)
    with torch.no_grad():
        torch.testing.assert_close(plain(x), trainer.G(x), rtol=1e-4, atol=1e-4)
    assert export_main([str(dst), "--out", str(tmp_path / "x.pt")]) == 2  # not a SAGIPS checkpoint: a clear error


def test_export_with_an_origin_takes_and_gives_gates_coordinates(run, tmp_path):
    """--origin: opengate passes global conditions; the file then gives the photons' X, Y in the same (GATE) frame,
    the crystal's network shifted exactly: plain(z, c + o) = G(z, c) + (o_x, o_y, 0, 0, 0, 0)."""
    from sagips_environments.optigan.export import main as export_main
    from sagips_environments.optigan.opengate import PlainGenerator

    out, trainer, _, _ = run
    o = torch.tensor([5.0, -7.0, 120.0])
    assert export_main([str(list_checkpoints(out)[0][6]), "--out", str(tmp_path / "g.pt"), "--origin",
                        *map(str, o.tolist())]) == 0
    plain = PlainGenerator()
    plain.load_state_dict(torch.load(tmp_path / "g.pt", map_location="cpu", weights_only=True)["generator_state_dict"])
    z, c = torch.randn(512, 10), torch.rand(512, 3)
    with torch.no_grad():
        got, want = plain(torch.cat([z, c + o], 1)), trainer.G(torch.cat([z, c], 1))
    torch.testing.assert_close(got[:, 2:], want[:, 2:], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got[:, :2], want[:, :2] + o[:2], rtol=1e-4, atol=1e-4)


def test_a_training_state_exports_its_weight_average(run, tmp_path, capsys):
    """A state file (state/rankR/epochE.pt) given as CHECKPOINT: its weight average (train.ema > 0), which the
    run's checkpoints hold and its quality measured, not the raw generator beside it."""
    from sagips_environments.optigan.export import main as export_main
    from sagips_environments.optigan.opengate import PlainGenerator

    out, trainer, _, _ = run
    st = torch.load(out / "state" / "rank0000" / "epoch0000006.pt", map_location="cpu", weights_only=True)
    st["generator_ema"] = st["generator"]  # (this run trained without ema: make the raw generator another one)
    st["generator"] = {k: v + 0.5 if v.is_floating_point() and k.startswith("model.") else v
                       for k, v in st["generator"].items()}
    path = tmp_path / "state" / "rank0000" / "epoch0000006.pt"
    path.parent.mkdir(parents=True)
    torch.save(st, path)
    assert export_main([str(path), "--out", str(tmp_path / "s.pt")]) == 0
    assert "no run.json above the checkpoint" in capsys.readouterr().err
    plain = PlainGenerator()
    plain.load_state_dict(torch.load(tmp_path / "s.pt", map_location="cpu", weights_only=True)["generator_state_dict"])
    x = torch.cat([torch.randn(512, 10), torch.rand(512, 3)], 1)
    with torch.no_grad():
        torch.testing.assert_close(plain(x), trainer.G(x), rtol=1e-4, atol=1e-4)


def test_a_ddp_state_from_older_versions_exports(run, tmp_path):
    """A state of the DDP baseline as older versions wrote it with train.ema=0 (the wrapper's `module.`-prefixed
    keys): the export reads it as the generator it wraps."""
    from sagips_environments.optigan.export import main as export_main
    from sagips_environments.optigan.opengate import PlainGenerator

    out, trainer, _, _ = run
    st = torch.load(out / "state" / "rank0000" / "epoch0000006.pt", map_location="cpu", weights_only=True)
    st["generator"] = {f"module.{k}": v for k, v in st["generator"].items()}
    path = tmp_path / "state" / "rank0000" / "epoch0000006.pt"
    path.parent.mkdir(parents=True)
    torch.save(st, path)
    assert export_main([str(path), "--out", str(tmp_path / "d.pt")]) == 0
    plain = PlainGenerator()
    plain.load_state_dict(torch.load(tmp_path / "d.pt", map_location="cpu", weights_only=True)["generator_state_dict"])
    x = torch.cat([torch.randn(512, 10), torch.rand(512, 3)], 1)
    with torch.no_grad():
        torch.testing.assert_close(plain(x), trainer.G(x), rtol=1e-4, atol=1e-4)


def test_export_warns_when_the_run_folded_its_outputs(run, tmp_path, capsys):
    """A run trained with output folds (the quick preset), exported without distillation (--distill-steps 0, the
    plain network as it is): warn that opengate applies no fold, and name the keys. (The default, distillation, is
    tested in test_optigan_export_folds.py.)"""
    import json
    import shutil

    from sagips.config import config_to_dict
    from sagips_environments.optigan.export import main as export_main

    out, trainer, _, _ = run
    ckpt = tmp_path / "checkpoints" / "rank0000" / "epoch0000006.pt"
    ckpt.parent.mkdir(parents=True)
    shutil.copy(list_checkpoints(out)[0][6], ckpt)
    cfg = config_to_dict(trainer.cfg)
    cfg["environment"].update(output_bounds="reflect", energy_bounds=True, unit_direction=False)
    cfg["train"].update(lr_g=2e-4, lr_d=6e-4)
    (tmp_path / "run.json").write_text(json.dumps({"config": cfg}))
    assert export_main([str(ckpt), "--out", str(tmp_path / "model.pt"), "--distill-steps", "0", "--no-check"]) == 0
    written = torch.load(tmp_path / "model.pt", map_location="cpu", weights_only=True)
    assert [written[k]["param_groups"][0]["lr"] for k in ("generator_optimizer_state_dict",
                                                          "discrminator_optimizer_state_dict")] == [2e-4, 6e-4]
    err = capsys.readouterr().err
    assert ("warning: this run trained with environment.output_bounds=reflect, energy_bounds=true and the file holds "
            "the network without them (--distill-steps 0): opengate applies no fold") in err
    assert "unit_direction" not in err and err.count("\n") == 1


def test_gpu_recipe_switches_run(tmp_path):
    """The trainer's bf16 autocast (the gradient penalty stays fp32) and host-resident data (on CPU here)."""
    _, metrics, moved = _train(tmp_path, 2, ["train.amp=bf16", "environment.data_on_device=false"])
    assert all(math.isfinite(m["loss_d"]) and math.isfinite(m["loss_g"]) for m in metrics) and moved > 0


@pytest.mark.parametrize("what, says", [
    ("opengate", "an opengate optiGAN file already (generator_state_dict): GATE loads it as it is"),
    ("module", "holds more than tensors (a pickled object"),
    ("other", "its generator has no key 'model.0.weight' (keys: gen.model.0.weight"),
    ("shapes", "its generator does not fit SAGIPS's optiGAN layout (model.0.weight (2,), ...; "),
])
def test_export_of_what_is_not_a_sagips_checkpoint_is_one_line(tmp_path, capsys, what, says):
    from sagips_environments.optigan.export import main as export_main

    path = tmp_path / "in.pt"
    torch.save({"opengate": {"generator_state_dict": {}}, "module": torch.nn.Linear(2, 2),
                "other": {"generator": {"gen.model.0.weight": torch.zeros(2)}, "environment": "optigan"},
                "shapes": {"generator": {"module.model.0.weight": torch.zeros(2)}, "environment": "optigan"}}[what],
               path)
    assert export_main([str(path), "--out", str(tmp_path / "out.pt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert not (tmp_path / "out.pt").exists()
