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
checked to reproduce the network it was made from.

Folds (issue 24). A run trained with `output_bounds: reflect` (and `energy_bounds`) scores its generator *with* the
folds, but opengate runs the plain network and applies no fold. A run trained with `environment.fold_layer: true`
is written exactly, folds included (`OptiGANGenerator.fold`: ReLU hinges in opengate's third hidden layer). For any
other such run the export *distils*: it fits a
plain network of opengate's layout to the folded generator (`exported.distill`, `--distill-steps`, default
DISTILL_STEPS; 0 = write the plain network as it is). Then, unless `--no-check`, it samples the written file as
opengate does (noise N(0, 1), raw condition, raw output) on every held-out point of the run, beside the run's own
folded generator with the same noise, and prints both figures and the MC-vs-MC ceiling. When the file is worse
than the run's generator by more than `--max-loss` (0.5) point, nothing is written and the export fails with the
measured loss (`--force` writes it all the same, with a warning). The check needs the run directory (run.json) to
make the reference data again (the run's seed; about 30 s for the quick preset).

`--origin X Y Z`: the GATE world position (mm) of this project's origin (the crystal axis at its back face; see
mc.py). opengate passes the gamma's *global* position as the condition; the shift is written into the first and
last layers' biases (exact), so that the file takes conditions and gives the photons' X, Y in GATE's coordinates
(the crystal's axis along GATE's z, as `sagips.data --gate-origin` reads GATE's files).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import torch

from .nets import OptiGANCritic, OptiGANGenerator
from .opengate import PlainGenerator, generator_dims, opengate_checkpoint, shift_frame

#: distillation steps of batch DISTILL_BATCH when the run trained with folds (docs/benchmarks/optigan.md, "Export")
DISTILL_STEPS = 3000
DISTILL_BATCH = 2048
#: the largest JS loss (points) of the written file against the run's own generator before the export refuses
MAX_LOSS = 0.5


class ExportRefused(RuntimeError):
    """The exported file is worse than the run's generator by more than the allowed loss."""


def _run_dir(checkpoint: Path) -> Path | None:
    """checkpoints/rank{R}/epoch{E}.pt (or state/rank{R}/epoch{E}.pt) -> the run directory, when the file sits in
    that layout."""
    p = checkpoint.resolve()
    if p.parent.name.startswith("rank") and p.parent.parent.name in ("checkpoints", "state"):
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
        info = json.loads((run_dir / "run.json").read_text())
        cfg = info["config"]
    except (OSError, KeyError, ValueError, TypeError):
        return {}
    if not isinstance(cfg, dict):
        return {}
    env = cfg.get("environment")
    if not isinstance(env, dict):
        return cfg
    # the export may run from another directory: data_file as the run resolved it (absolute), and any other relative
    # *_file (heldout_file) from where the run started
    env, start = dict(env), info.get("cwd")
    if env.get("data_file") and info.get("data_file"):
        env["data_file"] = info["data_file"]
    for key, value in env.items():
        if key.endswith("_file") and isinstance(value, str) and value and isinstance(start, str) \
                and not os.path.isabs(value):
            env[key] = os.path.join(start, value)
    return {**cfg, "environment": env}


def output_folds(config: dict) -> list[str]:
    """The environment keys of `config` that fold the generator's outputs after its network (not in an export)."""
    env = config.get("environment") or {}
    if env.get("output_bounds", "none") == "none":
        return []
    return [f"output_bounds={env['output_bounds']}"] + [f"{k}=true" for k in ("energy_bounds", "unit_direction")
                                                         if env.get(k)]


def _run_settings(run_dir: Path | None, config: dict, epoch: int
                  ) -> tuple[tuple[float, float], tuple[float, float], float, float]:
    """((lr_g, lr_d), betas, loss_g, loss_d): the run's starting rates and betas (the paper's without run.json), and
    the losses logged at `epoch`."""
    lr, betas, loss_g, loss_d = (5e-5, 5e-5), (0.5, 0.9), math.nan, math.nan
    if run_dir is None:
        return lr, betas, loss_g, loss_d
    try:
        train = config["train"]
        lr, betas = (float(train["lr_g"]), float(train["lr_d"])), (float(train["beta1"]), float(train["beta2"]))
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
    import pickle

    from sagips.io.checkpoint import unwrapped_keys

    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise ValueError(f"{path}: holds more than tensors (a pickled object, e.g. a whole module saved with "
                         f"torch.save), which is not loaded; give a SAGIPS checkpoint "
                         f"(OUTPUT_DIR/checkpoints/rankR/epochE.pt)") from None
    if isinstance(ck, dict) and "generator_state_dict" in ck:
        raise ValueError(f"{path}: an opengate optiGAN file already (generator_state_dict): GATE loads it as it is; "
                         f"to train on from it, set environment.init_generator={path}")
    if not isinstance(ck, dict) or "generator" not in ck:
        raise ValueError(f"{path}: not a SAGIPS checkpoint (no 'generator')")
    env = ck.get("environment", "optigan")
    if env != "optigan":
        raise ValueError(f"{path}: a checkpoint of environment {env!r}, not optigan")
    # a training state (state/rankR/epochE.pt) holds the raw generator and, where train.ema > 0, its weight average,
    # which is what the run's checkpoints hold and its logged quality measured
    # (a state of the DDP baseline from before it saved its generator unwrapped: `module.`-prefixed keys)
    ck["generator"] = unwrapped_keys(ck["generator"])
    if ck.get("generator_ema"):
        ck["generator_ema"] = unwrapped_keys(ck["generator_ema"])
    state = ck.get("generator_ema") or ck["generator"]
    if "model.6.weight" in state:
        generator_dims(state)  # a ValueError that names the keys, for a state dict of another layout
    try:
        return OptiGANGenerator.from_state(state), ck
    except KeyError as e:
        raise ValueError(f"{path}: its generator has no key {e} (keys: {', '.join(list(state)[:4])}, ...): not an "
                         f"optiGAN generator of SAGIPS's layout") from None
    except (ValueError, RuntimeError) as e:  # (shapes of another network: torch's message is many lines)
        shapes = ", ".join(f"{k} {tuple(v.shape)}" for k, v in list(state.items())[:3])
        raise ValueError(f"{path}: its generator does not fit SAGIPS's optiGAN layout ({shapes}, ...; "
                         f"{str(e).splitlines()[0][:120]})") from None


def export_opengate(checkpoint: str | Path, out: str | Path, atol: float = 1e-4, distill_steps: int | None = None,
                    check: bool = True, max_loss: float = MAX_LOSS, force: bool = False,
                    origin: tuple[float, float, float] | None = None, distill_batch: int = DISTILL_BATCH,
                    log=None) -> dict:
    """Write the opengate file for `checkpoint` to `out`, verify it, and return what was written (without tensors).

    `distill_steps`: None = DISTILL_STEPS when the run trained with folds, else 0. `check`: score the file against
    the run's generator on the run's held-out points (needs run.json); raises ExportRefused (nothing written) when
    it is worse by more than `max_loss` points, unless `force`. `origin`: GATE world position of the SAGIPS origin.
    """
    from sagips.io.atomic import atomic_open

    say = log or (lambda m: None)
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
    folds = output_folds(config)
    lr, betas, loss_g, loss_d = _run_settings(run_dir, config, epoch)
    if distill_steps is None:  # a fold_layer generator writes its folds exactly: nothing to distil
        distill_steps = DISTILL_STEPS if folds and not G.fold_layer else 0
    if G.fold_layer and distill_steps > 0:
        raise ValueError(f"{checkpoint}: a fold_layer generator is written with its folds exactly; distillation "
                         f"would replace its layers (pass --distill-steps 0, the default for it)")
    if distill_steps > 0 and not config:
        raise ValueError(f"{checkpoint}: distillation needs the run's run.json (the folds and the conditions come "
                         f"from it); keep the checkpoint in its run directory, or pass --distill-steps 0")
    env = folded = None
    if config and (check or distill_steps > 0):
        from .exported import environment_for_config, folded_generator

        say("making the run's reference data again (its seed) for the check")
        env, _ = environment_for_config(config)
        folded = folded_generator(env, ck.get("generator_ema") or ck["generator"])  # (the generator exported)
    exported_G, distilled = G, None
    if distill_steps > 0:
        from .exported import distill

        box_lo, box_hi, points = env.condition_box()
        say(f"distilling the folds ({', '.join(folds) or 'none'}) into opengate's plain layout: {distill_steps} "
            f"steps of {distill_batch} rows")
        distilled = distill(folded, box_lo, box_hi, points, steps=distill_steps, batch=distill_batch, seed=0, log=say)
        exported_G = distilled["student"]
    payload = opengate_checkpoint(exported_G, D, epoch=epoch, generator_loss=loss_g, discriminator_loss=loss_d,
                                  lr=lr, betas=betas)
    quality = None
    if check and env is not None:
        quality = compare_with_run(env, folded, payload)
        quality["logged_js"] = _logged_js(run_dir, epoch)
        loss = quality["loss"]
        if loss > max_loss and not force:
            raise ExportRefused(
                f"the exported file scores JS {quality['export']['js']:.2f}% against the run's own generator's "
                f"{quality['run']['js']:.2f}% (loss {loss:.2f} points > {max_loss}; ceiling "
                f"{quality['run']['js_ceiling']:.2f}%, raw outputs outside the bounds "
                f"{100 * quality['export']['outside']:.1f}%): not written; raise --distill-steps, or --force")
    if origin is not None:  # after the check, which samples in the SAGIPS frame
        payload["generator_state_dict"] = shift_frame(payload["generator_state_dict"], noise_dim, origin)
    with atomic_open(out, "wb") as fh:
        torch.save(payload, fh)
    # verify: what opengate would do (weights_only load, strict load into its layout) reproduces the network
    back = torch.load(out, map_location="cpu", weights_only=True)
    plain = PlainGenerator(noise_dim, hidden)
    plain.load_state_dict(back["generator_state_dict"])
    x = torch.cat([torch.randn(4096, noise_dim, generator=torch.Generator().manual_seed(0)),
                   torch.rand(4096, 3, generator=torch.Generator().manual_seed(1)) * torch.tensor([1.5, 1.5, 3.0])],
                  dim=1)
    with torch.no_grad():
        ref = exported_G(x)
        x_in = x
        if origin is not None:  # GATE's frame: conditions in and X, Y out shifted by the origin
            x_in = x + torch.cat([torch.zeros(noise_dim), torch.as_tensor(origin)]).float()
            ref = ref + torch.cat([torch.as_tensor(origin[:2]), torch.zeros(ref.shape[1] - 2)]).float()
        err = float((plain(x_in) - ref).abs().max())
        tol = atol * max(1.0, float(ref.abs().max()))
    if not err <= tol:
        raise RuntimeError(f"export check failed: the exported generator differs by {err:g}")
    return {"epoch": epoch, "lr": lr, "betas": betas, "generator_loss": loss_g, "discriminator_loss": loss_d,
            "critic": "trained (from the run's state)" if D is not None else "untrained (no state file for this epoch)",
            "max_abs_diff": err, "folds": folds, "origin": origin,
            "distill": None if distilled is None else {k: v for k, v in distilled.items() if k != "student"},
            "quality": quality}


def compare_with_run(env, folded: OptiGANGenerator, payload: dict, seed: int = 7) -> dict:
    """The written file (sampled as opengate samples it) beside the run's own folded generator, with the same noise
    on every held-out point of the run: {"run": score, "export": score, "loss": run js - export js}."""
    from .env import unfolded
    from .exported import load_plain, sample_like_opengate, score_samples

    qs = env.heldout_set(0)
    lo, hi = env.bounds()
    counts = [len(b) for b in qs["b"]]
    bins = env.cfg.js_bins
    runs = score_samples(sample_like_opengate(folded, qs["points"], counts, seed), qs["a"], qs["b"], bins, lo, hi)
    with unfolded(folded):
        alone = score_samples(sample_like_opengate(folded, qs["points"], counts, seed), qs["a"], qs["b"], bins, lo,
                              hi)
    exp = score_samples(sample_like_opengate(load_plain(payload), qs["points"], counts, seed), qs["a"], qs["b"],
                        bins, lo, hi)
    return {"run": runs, "alone": alone, "export": exp, "loss": runs["js"] - exp["js"], "points": len(qs["points"]),
            "photons": counts[0]}


def _logged_js(run_dir: Path | None, epoch: int) -> float | None:
    """The run's logged js at `epoch` (metrics.jsonl), or None."""
    if run_dir is None or not (run_dir / "metrics.jsonl").exists():
        return None
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("epoch") == epoch and "js" in rec:
            return float(rec["js"])
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sagips.export", description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="checkpoints/rank{R:04d}/epoch{E:07d}.pt of an optigan run")
    p.add_argument("--format", choices=("opengate",), default="opengate", help="output format (opengate)")
    p.add_argument("--out", required=True, metavar="FILE.pt", help="output file (written atomically)")
    p.add_argument("--distill-steps", type=int, default=None, metavar="N",
                   help=f"distillation steps when the run trained with folds (default {DISTILL_STEPS}; 0 = write "
                        f"the plain network as it is)")
    p.add_argument("--no-check", action="store_true", help="do not score the file against the run's generator")
    p.add_argument("--max-loss", type=float, default=MAX_LOSS, metavar="POINTS",
                   help=f"refuse when the file's JS is below the run's generator's by more (default {MAX_LOSS})")
    p.add_argument("--force", action="store_true", help="write the file even when it is worse than --max-loss")
    p.add_argument("--origin", type=float, nargs=3, metavar=("X", "Y", "Z"), default=None,
                   help="GATE world position (mm) of the SAGIPS origin (crystal axis at its back face): the file "
                        "then takes GATE's global coordinates as conditions and gives the photons' X, Y in them "
                        "(docs/optigan.md)")
    args = p.parse_args(argv)
    if args.distill_steps is not None and args.distill_steps < 0:
        print("sagips.export: error: --distill-steps must be >= 0", file=sys.stderr)
        return 2
    try:
        info = export_opengate(args.checkpoint, args.out, distill_steps=args.distill_steps, check=not args.no_check,
                               max_loss=args.max_loss, force=args.force,
                               origin=tuple(args.origin) if args.origin else None,
                               log=lambda m: print(f"sagips.export: {m}", file=sys.stderr, flush=True))
    except ExportRefused as e:
        print(f"sagips.export: error: {e}", file=sys.stderr)
        return 3
    except (OSError, ValueError, RuntimeError) as e:
        print(f"sagips.export: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out} (opengate optiGAN format, epoch {info['epoch']}; critic: {info['critic']}; "
          f"max |difference| vs the network written {info['max_abs_diff']:.2e})")
    if info["distill"]:
        d = info["distill"]
        print(f"distilled the folds ({', '.join(info['folds'])}) into the plain network: {d['steps']} steps, "
              f"regression mse {d['mse']:.3g} (standardised units), {d['seconds']:.0f} s")
    elif info["folds"]:
        print(f"sagips.export: warning: this run trained with environment.{', '.join(info['folds'])} and the file "
              f"holds the network without them (--distill-steps 0): opengate applies no fold", file=sys.stderr)
    q = info["quality"]
    if q:
        r, x = q["run"], q["export"]
        print(f"JS similarity on {q['points']} held-out points x {q['photons']} photons, sampled as opengate samples:")
        a = q["alone"]
        print("  feature   run's generator   its network alone   exported file   MC vs MC (ceiling)")
        for f in r["js_features"]:
            print(f"  {f:8s}  {r['js_features'][f]:15.2f}   {a['js_features'][f]:17.2f}   "
                  f"{x['js_features'][f]:13.2f}   {r['js_ceiling_features'][f]:9.2f}")
        print(f"  mean      {r['js']:15.2f}   {a['js']:17.2f}   {x['js']:13.2f}   {r['js_ceiling']:9.2f}   "
              f"(file - run: {-q['loss']:+.2f} points; file's gap to the ceiling {x['js_ceiling'] - x['js']:.2f})")
        print(f"  raw outputs outside the crystal's bounds: the network alone {100 * a['outside']:.1f}%, "
              f"the exported file {100 * x['outside']:.1f}%")
        if q["logged_js"] is not None:
            print(f"  (the run logged js {q['logged_js']:.2f}% at this epoch, on its quality points)")
        if q["loss"] > args.max_loss:
            print(f"sagips.export: WARNING: the file written is worse than the run's generator by {q['loss']:.2f} "
                  f"points of JS (> {args.max_loss}), written anyway (--force)", file=sys.stderr)
    elif not args.no_check:
        print("sagips.export: no run.json above the checkpoint: the file was not scored against the run, and a run "
              "trained with output folds (environment.output_bounds=reflect, as configs/optigan-quick.yaml) would "
              "lose them unseen; export the checkpoint from its run directory (checkpoints/rankR/)", file=sys.stderr)
    if info["origin"]:
        print(f"conditions and the photons' X, Y are in GATE's frame: SAGIPS origin at {info['origin']} mm")
    return 0


if __name__ == "__main__":
    sys.exit(main())
