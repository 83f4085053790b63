"""Checks of an environment's code at the first epoch of a process: one line each, naming the method to fix.

Without them, a generator of the wrong width, events of the wrong shape, a pipeline that drops the gradient or
produces NaN surface as tracebacks from deep inside torch on every rank (or, for a generator of width 1, as no
error at all: the output broadcasts over the parameters). The trainer runs them on rank 0 only and broadcasts the
verdict, so that every rank stops at the same point, before any exchange, with one message printed once.

Each function returns None (fine) or the message; the trainer raises `EnvironmentCheckError` with it.
"""
from __future__ import annotations

from typing import Any

import torch

from sagips.environment import Environment, EnvironmentCheckError
from sagips.models import unwrap


def _pipeline(env: Environment) -> str:
    """The method that makes the events: a ParametricEnvironment's density or simulate (unless the subclass replaced
    synthesize itself), else synthesize."""
    from sagips.parametric import ParametricEnvironment

    if isinstance(env, ParametricEnvironment) and type(env).synthesize is ParametricEnvironment.synthesize:
        return env.pipeline_method
    return "synthesize"


def events_of(batch: Any) -> torch.Tensor | None:
    """The event tensor of a real or synthetic batch: the batch itself, or the first item of a tuple/list/dict."""
    if torch.is_tensor(batch):
        return batch
    if isinstance(batch, (tuple, list)) and batch and torch.is_tensor(batch[0]):
        return batch[0]
    if isinstance(batch, dict) and batch and torch.is_tensor(next(iter(batch.values()))):
        return next(iter(batch.values()))
    return None


def generator_width(env: Environment, G: torch.nn.Module) -> str | None:
    """The generator must predict one value per parameter (for environments that name their parameters)."""
    names = env.parameter_names()
    if not names or type(env).noise is Environment.noise:
        return None
    state, cpu_state = env.gen.get_state(), torch.get_rng_state()
    try:  # two noise vectors, without moving the training's random streams
        with torch.no_grad():
            out = G(env.noise(2))
    except EnvironmentCheckError as e:
        return str(e)
    finally:
        env.gen.set_state(state)
        torch.set_rng_state(cpu_state)
    width = out.shape[-1] if out.ndim else 0
    if out.ndim != 2 or width != len(names):
        return (f"build_generator: the generator outputs shape {tuple(out.shape)} for 2 noise vectors, but the "
                f"environment has {len(names)} parameters ({', '.join(names)}): make its last layer "
                f"{len(names)} wide")
    return None


def synthetic_events(env: Environment, real: Any, fake: Any) -> str | None:
    """A synthetic batch has the real batch's event shape and only finite values."""
    r, f = events_of(real), events_of(fake)
    if r is None or f is None:
        return None
    where = _pipeline(env)
    if f.ndim != r.ndim or f.shape[1:] != r.shape[1:]:
        return (f"{where}: the synthetic events have shape {tuple(f.shape)} but the real events have "
                f"{tuple(r.shape)}: return one row per event with the real data's {tuple(r.shape[1:])} columns")
    bad = (~torch.isfinite(f.detach())).sum().item()
    if bad:
        return (f"{where}: {bad} of {f.numel()} synthetic event values are NaN or infinite at the generator's first "
                f"parameters: keep the pipeline finite over the whole parameter box (e.g. a density >= 0 with a "
                f"positive integral)")
    return None


def differentiable(env: Environment, fake: Any) -> str | None:
    """The synthetic events must carry the generator's gradient."""
    f = events_of(fake)
    if f is None or f.requires_grad:
        return None
    return (f"{_pipeline(env)}: the synthetic events do not require grad, so no gradient reaches the generator: "
            f"compute them from the parameters with differentiable torch operations (no .detach(), .item(), numpy "
            f"or torch.no_grad())")


class FirstEpochCheckError(EnvironmentCheckError):
    """A first-epoch check failed; every rank of the run raises it at the same point (the verdict is rank 0's,
    broadcast), before any gradient exchange, so the run can free its communicators and exit with status 2."""


class _FrozenRandomness:
    """Restores the environment's stream and torch's default streams on exit: the checks' trial pass leaves the
    training's random numbers exactly as they were (a checked run is identical to an unchecked one)."""

    def __init__(self, env: Environment):
        self.env = env

    def __enter__(self):
        self.states = (self.env.gen.get_state(), torch.get_rng_state(),
                       torch.cuda.get_rng_state(self.env.device) if self.env.device.type == "cuda" else None)

    def __exit__(self, *exc):
        gen, cpu, cuda = self.states
        self.env.gen.set_state(gen)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda, self.env.device)
        return False


def first_epoch_problem(env: Environment, G: torch.nn.Module, real: Any) -> str | None:
    """Every check on a trial pass (generator width, then one synthetic batch with gradients): the first problem's
    message, or None. The training's random streams are left untouched."""
    G = unwrap(G)  # a DDP-wrapped generator: check the module (no collective on one rank)
    with _FrozenRandomness(env):
        problem = generator_width(env, G)
        if problem:
            return problem
        try:
            fake = env.synthesize(G, real)
        except EnvironmentCheckError as e:  # a contract that the environment checks itself (ParametricEnvironment)
            return str(e)
        return synthetic_events(env, real, fake) or differentiable(env, fake)
