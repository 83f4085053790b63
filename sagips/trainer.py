"""The per-rank epoch loop: critic step(s), generator step, gradient exchange, checkpoints and metrics.

Each rank owns a generator replica and its *own* discriminator. Only the generator's gradients cross ranks: after
the generator backward, the trainer hands its flat gradient buffer to one exchange hook (`sagips.comm.modes`),
then steps the generator's optimizer with whatever came back.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from sagips.comm.buffer import GradBuffer
from sagips.config import Config
from sagips.environment import Environment
from sagips.io.checkpoint import save_checkpoint
from sagips.io.metrics import MetricsWriter

Exchange = Callable[[np.ndarray, int], dict]


def select_device(kind: str, local_rank: int) -> torch.device:
    """cuda:(local_rank % device_count) when CUDA is present (and allowed), else cpu."""
    if kind == "cpu" or (kind == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("train.device=cuda but CUDA is not available on this host; use train.device=auto")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def set_threads(requested: int, local_size: int) -> int:
    """Split the host's cores between the ranks on it, so that they do not oversubscribe."""
    if requested <= 0:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        requested = max(1, cores // max(1, local_size))
    torch.set_num_threads(requested)
    return requested


def rank_seeds(seed: int, member: int, rank: int) -> tuple[int, int]:
    """Independent (torch, numpy) seeds for one rank of one ensemble member."""
    s = np.random.SeedSequence([seed, member, rank]).generate_state(2, dtype=np.uint32)
    return int(s[0]), int(s[1])


@dataclass
class TrainState:
    epoch: int = 0
    time_s: float = 0.0  #: accumulated training wall seconds on this rank
    stats: dict[str, float] = field(default_factory=dict)  #: counters summed over the run (e.g. RMA drops)


class Trainer:
    def __init__(self, cfg: Config, env: Environment, rank: int, world_size: int, out_dir: str,
                 exchange: Exchange | None = None, gather_quality: Callable[[dict], list[dict] | None] | None = None,
                 is_root: bool = True):
        self.cfg, self.env, self.rank, self.world_size = cfg, env, rank, world_size
        self.out_dir = out_dir
        self.exchange = exchange
        self.gather_quality = gather_quality
        self.is_root = is_root
        t = cfg.train
        self.G = env.build_generator()
        self.D = env.build_discriminator()
        self.opt_g = torch.optim.Adam(self.G.parameters(), lr=t.lr_g, betas=(t.beta1, t.beta2))
        self.opt_d = torch.optim.Adam(self.D.parameters(), lr=t.lr_d, betas=(t.beta1, t.beta2))
        self.grads = GradBuffer(self.G, exchange_bias=cfg.comm.exchange_bias)
        self.state = TrainState()
        self.delay_s = cfg.pipeline.delay_s if rank in cfg.pipeline.delay_ranks else 0.0
        self.metrics = MetricsWriter(os.path.join(out_dir, "metrics.jsonl")) if is_root else None
        self.last_quality: dict[str, Any] | None = None

    # ------------------------------------------------------------------------------------------------ one epoch
    def step(self, epoch: int) -> dict[str, float]:
        env, G, D = self.env, self.G, self.D
        for _ in range(env.n_critic):
            real = env.real_batch()
            with torch.no_grad():
                fake = env.synthesize(G, real)
            loss_d = env.d_loss(D, real, fake)
            self.opt_d.zero_grad(set_to_none=True)
            loss_d.backward()
            self.opt_d.step()
        real = env.real_batch()
        fake = env.synthesize(G, real)
        if self.delay_s:  # the straggler knob: a slow pipeline on chosen ranks
            time.sleep(self.delay_s)
        loss_g, extras = env.g_loss(D, real, fake)
        self.grads.zero_()
        loss_g.backward()
        stats = {}
        if self.exchange is not None:
            buf = self.grads.offload()
            stats = self.exchange(buf, epoch) or {}
            self.grads.load_back()
        self.opt_g.step()
        return {"loss_d": loss_d, "loss_g": loss_g, **extras, **stats}

    # ------------------------------------------------------------------------------------------------ the run
    def fit(self, progress: bool = True) -> TrainState:
        t, st = self.cfg.train, self.state
        bar = self._progress_bar(progress)
        try:
            while st.epoch < t.epochs:
                epoch = st.epoch + 1
                t0 = time.perf_counter()
                out = self.step(epoch)
                st.time_s += time.perf_counter() - t0
                st.epoch = epoch
                for k, v in out.items():  # integer counters from the exchange are summed over the run
                    if isinstance(v, int):
                        st.stats[k] = st.stats.get(k, 0) + v
                if epoch == 1 or epoch % t.checkpoint_every == 0 or epoch == t.epochs:
                    save_checkpoint(self.out_dir, self.rank, epoch, st.time_s, self.G, self.env.name)
                if epoch == 1 or epoch % t.log_every == 0 or epoch == t.epochs:
                    self._log(epoch, out, bar)
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
            if self.metrics is not None:
                self.metrics.close()
        return st

    def _log(self, epoch: int, out: dict[str, Any], bar) -> None:
        q = self.env.quality(self.G, self.cfg.train.quality_samples)
        all_q = self.gather_quality(q) if self.gather_quality is not None else [q]
        if not self.is_root:
            return
        run_q = self.env.combine_quality(all_q) if len(all_q) > 1 else q
        self.last_quality = run_q
        rec = {"epoch": epoch, "time_s": round(self.state.time_s, 6),
               **{k: (float(v.detach()) if torch.is_tensor(v) else v) for k, v in out.items()},
               **{k: v for k, v in self.state.stats.items()},
               "quality_ranks": len(all_q), **run_q}
        self.metrics.write(rec)
        if bar is not None:
            bar.set_postfix(self.env.progress_fields(run_q), refresh=False)

    def _progress_bar(self, progress: bool):
        if not (progress and self.is_root and self.cfg.train.progress):
            return None
        from tqdm import tqdm

        return tqdm(total=self.cfg.train.epochs, initial=self.state.epoch, unit="epoch", dynamic_ncols=True,
                    file=sys.stderr, mininterval=1.0, desc=f"{self.cfg.mode}")
