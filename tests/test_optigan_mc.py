"""The optical-photon MC conserves what it should, and its detected fraction matches the escape-cone expectation."""
import math

import numpy as np
import pytest

from sagips_environments.optigan.mc import (
    SPECTRA,
    Crystal,
    fresnel_transmission,
    paper_grid,
    random_points,
    simulate_point,
    simulate_points,
    transport,
)


def _check_photons(c: Crystal, ph: np.ndarray):
    assert ph.shape[1] == 6 and np.isfinite(ph).all()
    d = ph[:, 2:5]
    np.testing.assert_allclose(np.linalg.norm(d, axis=1), 1.0, atol=1e-9)
    assert (d[:, 2] >= c.cos_critical - 1e-12).all() and (d[:, 2] <= 1.0).all()
    assert (np.abs(ph[:, :2]) <= c.width / 2 + 1e-9).all()
    lo, hi = c.energy_range
    assert (ph[:, 5] >= lo).all() and (ph[:, 5] <= hi).all()


def test_detected_photons_obey_the_physics():
    c = Crystal()
    ph, st = simulate_point(c, (0.5, 0.25, 1.0), 3000, np.random.default_rng(1))
    assert len(ph) == 3000
    _check_photons(c, ph)
    assert abs(c.cos_critical - math.cos(math.radians(44.2))) < 2e-3  # θc = 44.2° for BGO into grease
    # every emitted photon is accounted for
    assert st.emitted == st.detected + st.absorbed_bulk + st.absorbed_reflector + st.trapped + st.bounce_cap


def test_diffuse_reflector_and_lyso_keep_the_invariants():
    for c in (Crystal(lambertian=0.5, max_bounces=200), Crystal(scintillator="LYSO", length=5.0)):
        ph, _ = simulate_point(c, (0.3, 0.1, 1.2), 1500, np.random.default_rng(2))
        _check_photons(c, ph)
    assert Crystal(scintillator="LYSO").n == SPECTRA["LYSO"][4]


def test_detected_fraction_is_the_escape_cone_without_losses():
    """R = 1, no absorption, specular faces: |dz| is conserved, so a photon is detected iff |dz0| >= cos θc, and then
    it leaves sooner or later whatever T(θ) is: the detected fraction is P(|dz| >= cos θc) = 1 - cos θc
    (isotropic emission)."""
    c = Crystal(reflectivity=1.0, absorption_length=math.inf, max_bounces=300)
    n = 20_000
    _, st = transport(c, np.array([0.3, 0.1, 1.0]), n, np.random.default_rng(3), skip_trapped=False)
    expected = 1.0 - c.cos_critical  # 0.284 for BGO
    sigma = math.sqrt(expected * (1 - expected) / n)
    assert abs(st.detected_fraction - expected) < 4 * sigma + 2e-3  # + photons near θc still bouncing at the cap
    assert st.absorbed_bulk == st.absorbed_reflector == 0
    # the shortcut (trapped photons not tracked) gives the same fraction
    _, st2 = transport(c, np.array([0.3, 0.1, 1.0]), n, np.random.default_rng(4))
    assert abs(st2.detected_fraction - expected) < 4 * sigma + 2e-3
    assert abs(st2.trapped / n - c.cos_critical) < 4 * sigma


def test_losses_only_lower_the_detected_fraction():
    c = Crystal()  # R = 0.98, absorption length 100 mm
    _, st = transport(c, np.array([0.0, 0.0, 1.5]), 20_000, np.random.default_rng(5))
    assert 0.8 * (1 - c.cos_critical) < st.detected_fraction < 1 - c.cos_critical


def test_fresnel_transmission():
    n1, n2 = 2.15, 1.5
    t0 = fresnel_transmission(np.array([1.0]), n1, n2)[0]
    assert t0 == pytest.approx(1 - ((n1 - n2) / (n1 + n2)) ** 2)
    cos_c = math.sqrt(1 - (n2 / n1) ** 2)
    t = fresnel_transmission(np.array([cos_c + 1e-4, cos_c - 1e-4, 0.2]), n1, n2)
    assert 0 <= t[0] < 0.1 and t[1] == 0 and t[2] == 0


def test_paper_grid_and_heldout_points():
    g = paper_grid(Crystal())
    assert g.shape == (140, 3)
    assert sorted(set(g[:, 2].round(6))) == [0.5, 1.0, 1.5, 2.0, 2.5]
    assert (g[:, 1] <= g[:, 0]).all() and [0.25, 0.0, 0.5] in g.tolist() and [1.45, 1.45, 2.5] in g.tolist()
    r = random_points(g, 200, np.random.default_rng(0))
    dist = np.sqrt(((r[:, None] - g[None]) ** 2).sum(-1)).min(1)
    assert (dist >= 0.05).all() and (r[:, 1] <= r[:, 0]).all() and (r[:, 2] >= 0.5).all() and (r[:, 2] <= 2.5).all()


def test_points_are_reproducible_streams():
    g = paper_grid(Crystal(), n_side=2, depths=1)
    ph, co, _ = simulate_points(Crystal(), g, 100, 7)
    assert co.shape == (300, 3) and (co[:100] == g[0].astype(np.float32)).all()
    ph3, _, _ = simulate_points(Crystal(), g, 100, 7)
    np.testing.assert_array_equal(ph, ph3)  # reproducible from the seed
    assert not np.array_equal(ph[:100], ph[100:200])  # one stream per point
