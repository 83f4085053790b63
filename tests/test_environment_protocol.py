"""The Environment protocol is what the trainer, --resume and sagips.analyze call, with their real signatures: a
minimal subclass that implements exactly the protocol trains, logs its quality, resumes bit-identically (its data
subset and extra state restored) and is analysed with its parameter names."""
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sagips.analysis.ensemble import load_run, predict_group
from sagips.config import Config, from_dict, opt
from sagips.environment import Environment
from sagips.trainer import Trainer
from tests._plugins import write_dist


@dataclass
class MinimalConfig:
    name: str = opt("minimal", "registered environment name")
    data_file: str | None = opt(None, "reference HDF5 file (dataset 'events'); null = generate")
    mu: float = opt(0.7, "the true location of the events")


class Minimal(Environment):
    """Events x = mu + 0.1 eps; the generator predicts mu from one noise value."""

    name = "minimal"
    Config = MinimalConfig
    datasets = {"events": 1}
    BATCH = 32

    def __init__(self, cfg, device, seed):
        super().__init__(cfg, device, seed)
        self.g_steps = 0  # state beside `gen` that --resume must restore (extra_state)

    @classmethod
    def generate_reference(cls, cfg, seed):
        rng = np.random.default_rng(seed)
        return {"events": (cfg.mu + 0.1 * rng.standard_normal((400, 1))).astype(np.float32)}, {"mu": cfg.mu}

    def attach_data(self, arrays, attrs, rng):
        self._all = arrays["events"]
        self.select_subset(np.sort(rng.choice(len(self._all), 200, replace=False)))

    def select_subset(self, idx):
        self.subset_idx = np.asarray(idx, dtype=np.int64)
        self.data = torch.as_tensor(self._all[self.subset_idx])

    def build_generator(self):
        return torch.nn.Linear(1, 1)

    def build_discriminator(self):
        return torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.LeakyReLU(0.2), torch.nn.Linear(8, 1))

    def noise(self, n):
        return torch.randn((n, 1), generator=self.gen)

    def params(self, G, n):
        return G(self.noise(n))

    def real_batch(self):
        return self.data[torch.randint(len(self.data), (self.BATCH,), generator=self.gen)]

    def synthesize(self, G, real):
        return self.params(G, self.BATCH) + 0.1 * torch.randn((self.BATCH, 1), generator=self.gen)

    def d_loss(self, D, real, fake):
        logits = D(torch.cat((real, fake)))
        target = torch.cat((torch.ones(len(real), 1), torch.zeros(len(fake), 1)))
        return F.binary_cross_entropy_with_logits(logits, target)

    def g_loss(self, D, real, fake):
        self.g_steps += 1
        loss = F.binary_cross_entropy_with_logits(D(fake), torch.ones(len(fake), 1))
        return loss, {"g_steps": torch.tensor(float(self.g_steps))}

    @property
    def events_per_epoch(self):
        return self.BATCH

    @torch.no_grad()
    def quality(self, G, n):
        p = float(G(torch.randn((n, 1), generator=torch.Generator().manual_seed(5))).mean())
        return {"params": [p], "residuals": [(self.cfg.mu - p) / self.cfg.mu]}

    def combine_quality(self, per_rank):
        return {"params": [float(np.mean([q["params"][0] for q in per_rank]))], "ranks": len(per_rank)}

    def extra_state(self):
        return {"g_steps": self.g_steps}

    def load_extra_state(self, state):
        self.g_steps = state["g_steps"]

    def truth(self):
        return [self.cfg.mu]

    def parameter_names(self):
        return ["mu"]


def trainer(tmp_path, epochs, data_seed=0, gather=None):
    cfg = from_dict(Config, {"train": {"epochs": epochs, "log_every": 1, "progress": False, "quality_samples": 8,
                                       "state_every": 1, "chunk_rows": 0, "lr_g": 1e-2, "lr_d": 1e-2}})
    cfg.environment = from_dict(MinimalConfig, {})
    env = Minimal(cfg.environment, "cpu", seed=11)
    env.attach_data(*Minimal.generate_reference(cfg.environment, 0), np.random.default_rng(data_seed))
    torch.manual_seed(0)
    return Trainer(cfg, env, 0, 1, str(tmp_path), gather_quality=gather)


def test_trains_logs_and_combines_through_the_protocol(tmp_path):
    tr = trainer(tmp_path, 3, gather=lambda q, epoch: [q, q])  # as if two ranks reported
    tr.fit(progress=False)
    assert tr.state.epoch == 3 and tr.env.g_steps == 3
    assert tr.last_quality == {"params": tr.env.quality(tr.G, 8)["params"], "ranks": 2}


def test_resume_restores_subset_and_extra_state_bit_identically(tmp_path):
    whole = trainer(tmp_path / "whole", 4)
    whole.fit(progress=False)
    first = trainer(tmp_path / "cut", 2)
    first.fit(progress=False)
    state = first.state_dict()
    again = trainer(tmp_path / "cut", 4, data_seed=99)  # another subset: load_state_dict must select the saved one
    assert not np.array_equal(again.env.subset_idx, first.env.subset_idx)
    again.load_state_dict(state)
    assert np.array_equal(again.env.subset_idx, first.env.subset_idx) and again.env.g_steps == 2
    again.fit(progress=False)
    assert again.env.g_steps == 4
    for k, w in whole.G.state_dict().items():
        assert torch.equal(w, again.G.state_dict()[k]), k


def test_analyze_predicts_through_noise_and_params(tmp_path, monkeypatch):
    import json

    site = tmp_path / "site"
    write_dist(site, "sagips-minimal", {"minimal": "tests.test_environment_protocol:Minimal"})
    monkeypatch.syspath_prepend(str(site))
    run = tmp_path / "run"
    tr = trainer(run, 2)
    tr.fit(progress=False)
    (run / "run.json").write_text(json.dumps({"environment": "minimal", "world_size": 1, "truth": [0.7],
                                              "config": {"environment": {"name": "minimal"}}}))
    g = predict_group("one", [load_run(run)], 16, noise_seed=4)
    assert g.names == ["mu"] and g.preds.shape == (2, 1, 16, 1)  # epochs 1 and 2, 1 run, K = 16, P = 1
    env = Minimal(MinimalConfig(), "cpu", 4)  # the same noise: drawn first from a stream seeded with noise_seed
    expect = tr.G(env.noise(16)).detach().double().numpy()
    np.testing.assert_allclose(g.preds[-1, 0], expect, rtol=1e-6)


def test_abstract_methods_are_the_protocol():
    """What a package must implement (the rest has defaults); adding to this set breaks third-party packages."""
    assert Environment.__abstractmethods__ == {
        "generate_reference", "attach_data", "build_generator", "build_discriminator", "real_batch", "synthesize",
        "d_loss", "g_loss", "events_per_epoch", "quality"}


@pytest.mark.parametrize("method", ["noise", "params"])
def test_analyze_refuses_an_environment_without_noise_or_params(method):
    env = Minimal(MinimalConfig(), "cpu", 0)
    Minimal._saved = getattr(Minimal, method)
    try:
        delattr(Minimal, method)
        with pytest.raises(NotImplementedError, match=method):
            getattr(env, method)(*((1,) if method == "noise" else (None, 1)))
    finally:
        setattr(Minimal, method, Minimal._saved)
        del Minimal._saved
