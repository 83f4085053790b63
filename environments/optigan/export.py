"""Export a SAGIPS optiGAN checkpoint as a file that GATE 10's optiGAN loads unchanged.

    python -m sagips.export runs/optigan/checkpoints/rank0000/epoch0003000.pt --format opengate --out model.pt
    python -m sagips_environments.optigan.export CHECKPOINT --out model.pt          # the same, without the hook

Then, in a GATE 10 simulation: `OptiGAN(..., path_to_optigan_model="model.pt")`.

What is written (see opengate.py): the generator with its standardisation folded into the first/last Linear layers
(raw mm / eV in and out, as opengate feeds it), opengate's seven keys, the checkpoint's epoch, the losses logged at
that epoch in the run's metrics.jsonl (NaN when that epoch was not logged), and fresh Adam states with the run's
lr/betas from run.json (paper values otherwise). SAGIPS checkpoints hold the generator only: the critic comes from
the trainer's full state of the same rank and epoch (`state/rank{R}/epoch{E}.pt`, kept for --resume) when it
exists (a state file may also be given as CHECKPOINT), else it is an untrained one of the right layout. After
writing, the file is reloaded with torch.load(weights_only=True) into a plain opengate-layout generator and
checked to reproduce the SAGIPS generator's outputs.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

from .nets import OptiGANCritic, OptiGANGenerator
from .opengate import PlainGenerator, generator_dims, opengate_checkpoint


def _run_dir(checkpoint: Path) -> Path | None:
    """checkpoints/rank{R}/epoch{E}.pt -> the run directory, when the file sits in that layout."""
    p = checkpoint.resolve()
    if p.parent.name.startswith("rank") and p.parent.parent.name == "checkpoints":
        return p.parent.parent.parent
    return None


def _state_file(checkpoint: Path) -> Path | None:
    """run/state/rank{R}/epoch{E}.pt beside run/checkpoints/rank{R}/epoch{E}.pt, if it exists."""
    run_dir = _run_dir(checkpoint)
    if run_dir is None:
        return None
    p = run_dir / "state" / checkpoint.resolve().parent.name / checkpoint.name
    return p if p.exists() else None


def _run_config(run_dir: Path | None) -> dict:
    """The run's resolved config from run.json ({} when there is none or it cannot be read)."""
    if run_dir is None:
        return {}
    try:
        cfg = json.loads((run_dir / "run.json").read_text())["config"]
    except (OSError, KeyError, ValueError, TypeError):
        return {}
    return cfg if isinstance(cfg, dict) else {}


def output_folds(config: dict) -> list[str]:
    """The environment keys of `config` that fold the generator's outputs after its network (not in an export)."""
    env = config.get("environment") or {}
    if env.get("output_bounds", "none") == "none":
        return []
    return [f"output_bounds={env['output_bounds']}"] + [f"{k}=true" for k in ("energy_bounds", "unit_direction")
                                                         if env.get(k)]


def _run_settings(run_dir: Path | None, config: dict, epoch: int
                  ) -> tuple[float, tuple[float, float], float, float]:
    lr, betas, loss_g, loss_d = 5e-5, (0.5, 0.9), math.nan, math.nan
    if run_dir is None:
        return lr, betas, loss_g, loss_d
    try:
        train = config["train"]
        lr, betas = float(train["lr_g"]), (float(train["beta1"]), float(train["beta2"]))
    except (KeyError, ValueError, TypeError):
        pass
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("epoch") == epoch:
                loss_g, loss_d = float(rec.get("loss_g", math.nan)), float(rec.get("loss_d", math.nan))
    return lr, betas, loss_g, loss_d


def load_sagips_generator(path: str | Path) -> tuple[OptiGANGenerator, dict]:
    """(the generator, the checkpoint dict) of a SAGIPS optiGAN checkpoint."""
    ck = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(ck, dict) or "generator" not in ck:
        raise ValueError(f"{path}: not a SAGIPS checkpoint (no 'generator')")
    env = ck.get("environment", "optigan")
    if env != "optigan":
        raise ValueError(f"{path}: a checkpoint of environment {env!r}, not optigan")
    state = ck["generator"]
    noise_dim, hidden = generator_dims(state)
    G = OptiGANGenerator(noise_dim, hidden)
    G.load_state_dict(state)
    return G, ck


def export_opengate(checkpoint: str | Path, out: str | Path, atol: float = 1e-4) -> dict:
    """Write the opengate file for `checkpoint` to `out`, verify it, and return what was written (without tensors)."""
    from sagips.io.atomic import atomic_open

    checkpoint = Path(checkpoint)
    G, ck = load_sagips_generator(checkpoint)
    noise_dim, hidden = G.noise_dim, G.model[0].out_features
    if (noise_dim, hidden) != (10, 128):
        raise ValueError(f"{checkpoint}: noise_dim={noise_dim}, hidden={hidden}; opengate's optiGAN hard-codes "
                         f"noise_dimension=10 and hidden_dimension=128, so it could not load this generator")
    D, d_state = None, ck.get("discriminator")
    if d_state is None:  # the trainer's full state of the same rank and epoch (for --resume) holds the critic
        state = _state_file(checkpoint)
        if state is not None:
            d_state = torch.load(state, map_location="cpu", weights_only=True).get("discriminator")
    if d_state is not None:
        D = OptiGANCritic()
        D.load_state_dict(d_state)
    epoch = int(ck.get("epoch", 0))
    run_dir = _run_dir(checkpoint)
    config = _run_config(run_dir)
    lr, betas, loss_g, loss_d = _run_settings(run_dir, config, epoch)
    payload = opengate_checkpoint(G, D, epoch=epoch, generator_loss=loss_g, discriminator_loss=loss_d, lr=lr,
                                  betas=betas)
    with atomic_open(out, "wb") as fh:
        torch.save(payload, fh)
    # verify: what opengate would do (weights_only load, strict load into its layout) reproduces G
    back = torch.load(out, map_location="cpu", weights_only=True)
    plain = PlainGenerator(noise_dim, hidden)
    plain.load_state_dict(back["generator_state_dict"])
    x = torch.cat([torch.randn(4096, noise_dim, generator=torch.Generator().manual_seed(0)),
                   torch.rand(4096, 3, generator=torch.Generator().manual_seed(1)) * torch.tensor([1.5, 1.5, 3.0])],
                  dim=1)
    with torch.no_grad():
        ref = G(x)
        err = float((plain(x) - ref).abs().max())
        tol = atol * max(1.0, float(ref.abs().max()))
    if not err <= tol:
        raise RuntimeError(f"export check failed: the exported generator differs by {err:g}")
    return {"epoch": epoch, "lr": lr, "betas": betas, "generator_loss": loss_g, "discriminator_loss": loss_d,
            "critic": "trained (from the run's state)" if D is not None else "untrained (no state file for this epoch)",
            "max_abs_diff": err, "folds": output_folds(config)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sagips.export", description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="checkpoints/rank{R:04d}/epoch{E:07d}.pt of an optigan run")
    p.add_argument("--format", choices=("opengate",), default="opengate", help="output format (opengate)")
    p.add_argument("--out", required=True, metavar="FILE.pt", help="output file (written atomically)")
    args = p.parse_args(argv)
    try:
        info = export_opengate(args.checkpoint, args.out)
    except (OSError, ValueError, RuntimeError) as e:
        print(f"sagips.export: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out} (opengate optiGAN format, epoch {info['epoch']}; critic: {info['critic']}; "
          f"max |difference| vs the SAGIPS generator {info['max_abs_diff']:.2e})")
    if info["folds"]:
        print(f"sagips.export: note: this run trained with environment.{', '.join(info['folds'])}; those folds act "
              f"after the network and opengate's layout has no place for them, so opengate runs the unfolded "
              f"network: apply them to its output (docs/optigan.md, 'Output bounds')", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
