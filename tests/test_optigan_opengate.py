"""Interoperability with GATE 10's optiGAN: export loads into opengate's layout; model_3341.pt imports."""
from pathlib import Path

import pytest
import torch
from torch import nn

from sagips_environments.optigan.nets import OptiGANCritic, OptiGANGenerator
from sagips_environments.optigan.opengate import (
    CRITIC_KEYS,
    GENERATOR_KEYS,
    OPENGATE_KEYS,
    load_opengate,
    load_weights_into,
    save_opengate,
)

MODEL_3341 = Path(__file__).resolve().parents[2] / "shared" / "opengate" / "model_3341.pt"
needs_3341 = pytest.mark.skipif(not MODEL_3341.exists(),
                                reason=f"opengate's published model is not at {MODEL_3341} (outside this checkout)")


def opengate_generator() -> nn.Module:
    """What opengate builds (contrib/optical/optigan.py: WGANGenerator(10, 6, 128, 3)), written out by hand."""

    class WGANGenerator(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = nn.Sequential(nn.Linear(13, 128), nn.ReLU(True), nn.Linear(128, 256), nn.ReLU(True),
                                       nn.Linear(256, 512), nn.ReLU(True), nn.Linear(512, 6))

        def forward(self, x):
            return self.model(x)

    return WGANGenerator()


def _inputs(n=2048, seed=0):
    g = torch.Generator().manual_seed(seed)
    cond = torch.rand(n, 3, generator=g) * torch.tensor([1.5, 1.5, 3.0])
    return torch.cat([torch.randn(n, 10, generator=g), cond], dim=1)


def _standardised_generator():
    torch.manual_seed(1)
    G = OptiGANGenerator()
    G.set_standardisation([0.8, 0.4, 1.5], [0.4, 0.3, 0.7], [0.0, 0.0, 0.0, 0.0, 0.87, 2.43],
                          [0.8, 0.8, 0.35, 0.35, 0.08, 0.35])
    return G


def test_export_loads_into_opengates_layout_with_the_same_outputs(tmp_path):
    G = _standardised_generator()
    D = OptiGANCritic(dropout=0.2)
    D.set_standardisation(torch.rand(9), torch.rand(9) + 0.5)
    path = tmp_path / "model.pt"
    save_opengate(path, G, D, epoch=42, generator_loss=0.5, discriminator_loss=-0.1)
    ck = torch.load(path, map_location="cpu", weights_only=True)
    assert tuple(ck) == OPENGATE_KEYS and "discrminator_optimizer_state_dict" in ck  # opengate's spelling
    assert ck["epoch"] == 42 and ck["generator_loss"] == 0.5
    assert tuple(ck["generator_state_dict"]) == GENERATOR_KEYS
    assert tuple(ck["discriminator_state_dict"]) == CRITIC_KEYS
    assert ck["generator_optimizer_state_dict"]["param_groups"][0]["betas"] == (0.5, 0.9)
    plain = opengate_generator()
    plain.load_state_dict(ck["generator_state_dict"])  # strict, as opengate's create_generator does
    x = _inputs()
    with torch.no_grad():
        torch.testing.assert_close(plain(x), G(x), rtol=1e-5, atol=1e-5)
    # the critic too (eval mode: dropout off)
    plain_d = nn.Sequential(nn.Linear(9, 512), nn.LeakyReLU(0.2), nn.Dropout(0.2), nn.Linear(512, 256),
                            nn.LeakyReLU(0.2), nn.Dropout(0.2), nn.Linear(256, 128), nn.LeakyReLU(0.2),
                            nn.Linear(128, 1)).eval()
    plain_d.load_state_dict({k[len("model."):]: v for k, v in ck["discriminator_state_dict"].items()})
    y = torch.randn(256, 9)
    with torch.no_grad():
        torch.testing.assert_close(plain_d(y), D.eval()(y), rtol=1e-5, atol=1e-5)


def test_fold_unfold_round_trip():
    G = _standardised_generator()
    H = OptiGANGenerator()
    H.set_standardisation(torch.ones(3), torch.full((3,), 2.0), torch.ones(6), torch.full((6,), 3.0))
    H.unfold(G.fold())  # different buffers, same function
    x = _inputs(512)
    with torch.no_grad():
        torch.testing.assert_close(H(x), G(x), rtol=1e-5, atol=1e-5)


@needs_3341
def test_model_3341_imports_for_inference():
    ck = torch.load(MODEL_3341, map_location="cpu", weights_only=True)
    assert set(OPENGATE_KEYS) <= set(ck) and tuple(ck["generator_state_dict"]) == GENERATOR_KEYS
    plain = opengate_generator()
    plain.load_state_dict(ck["generator_state_dict"])
    G = load_opengate(MODEL_3341)
    x = _inputs()
    with torch.no_grad():
        torch.testing.assert_close(G(x), plain(x), rtol=1e-5, atol=1e-5)


@needs_3341
def test_model_3341_as_a_fine_tuning_start(tmp_path):
    """Unfolded into a standardised generator it computes the same function; re-exported it matches the original."""
    G = _standardised_generator()
    load_weights_into(G, MODEL_3341)
    plain = opengate_generator()
    plain.load_state_dict(torch.load(MODEL_3341, map_location="cpu", weights_only=True)["generator_state_dict"])
    x = _inputs()
    with torch.no_grad():
        torch.testing.assert_close(G(x), plain(x), rtol=1e-4, atol=1e-4)
    save_opengate(tmp_path / "again.pt", G)
    again = torch.load(tmp_path / "again.pt", map_location="cpu", weights_only=True)["generator_state_dict"]
    for k, v in plain.state_dict().items():
        torch.testing.assert_close(again[k], v, rtol=1e-4, atol=1e-5)
