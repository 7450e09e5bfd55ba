"""The trained-weights null-space check (pipeline/report/collisions.py) and its two ledger rows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import tiny_repo
import torch

from pipeline.config import Params
from pipeline.models import build_model
from pipeline.report import collisions as col
from pipeline.report import measure

PATCH = 4


@pytest.fixture(scope="module")
def models():
    params = Params.model_validate(tiny_repo.params_with())
    torch.manual_seed(0)
    vit, resnet = build_model("vit", params, 4), build_model("resnet", params, 4)
    with torch.no_grad():  # "trained": weights far from their initialisation
        for p in [*vit.parameters(), *resnet.parameters()]:
            p.add_(torch.randn_like(p) * 0.3)
    return vit.eval(), resnet.eval()


def images(n: int = 16, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 16, 16, 3), dtype=np.uint8)


def test_patches_round_trip_in_the_projection_order():
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    p = col.to_patches(x, PATCH)
    assert p.shape == (2, 4, 48)
    assert torch.equal(col.from_patches(p, tuple(x.shape), PATCH), x)
    conv = torch.nn.Conv2d(3, 5, PATCH, PATCH, bias=False).double()
    # the conv's output at each cell = its flattened weight times that cell's flattened patch
    want = conv(x).flatten(2).transpose(1, 2)
    torch.testing.assert_close(p @ conv.weight.reshape(5, -1).T, want)


def test_null_basis_is_orthonormal_and_invisible_to_the_projection():
    w = torch.randn(36, 3, PATCH, PATCH)
    b = col.null_basis(w)
    assert b.shape == (48, 12)
    torch.testing.assert_close(b.T @ b, torch.eye(12, dtype=torch.float64))
    assert (w.double().reshape(36, -1) @ b).abs().max() < 1e-12
    assert col.null_basis(torch.randn(48, 3, PATCH, PATCH)).shape == (48, 0)  # full width: nothing is lost


def test_trained_vit_ignores_its_null_space_and_the_resnet_does_not(models):
    vit, resnet = models
    basis = col.null_basis(col.patchify_projection(vit, PATCH))
    out = col.collision_check(vit, resnet, images(), PATCH, 0, basis)
    assert out["null_dim"] == 48 - vit.patch_embed.proj.out_channels > 0
    assert out["pixel_rms_grey_levels"] == pytest.approx(64.0)  # a large pixel change
    assert out["vit_max_diff_f64"] < 1e-10 and out["vit_flips"] == 0.0
    assert out["other_max_diff_f64"] > 1e-3


def test_a_perturbation_outside_the_null_space_moves_the_vit(models):
    """The check can fail: directions the projection keeps do move the ViT."""
    vit, _ = models
    w = col.patchify_projection(vit, PATCH)
    seen = torch.linalg.svd(w.double().reshape(w.shape[0], -1)).Vh[:4].T  # 4 directions the projection sees
    out = col.collision_check(vit, vit, images(), PATCH, 0, seen)
    assert out["vit_max_diff_f64"] > 1e-3


def test_only_plain_patchify_has_a_projection(models):
    _, resnet = models
    assert col.patchify_projection(resnet, PATCH) is None
    assert col.patchify_projection(models[0], 2) is None


def test_discriminative_share_on_planted_signals():
    rng = np.random.default_rng(0)
    w = torch.randn(36, 3, PATCH, PATCH)
    basis = col.null_basis(w)
    labels = np.repeat([0, 1], 50)
    base = rng.integers(100, 156, (1, 16, 16, 3)).repeat(100, 0).astype(np.float64)

    def planted(direction: torch.Tensor) -> float:
        d = col.from_patches(direction.reshape(1, 1, 48).expand(1, 16, 48), (1, 3, 16, 16), PATCH)
        shift = d[0].permute(1, 2, 0).numpy() * 20
        imgs = base + np.where(labels[:, None, None, None] == 1, shift, 0)
        return col.discriminative_share(np.clip(np.rint(imgs), 0, 255).astype(np.uint8), labels, basis, PATCH)

    assert planted(basis[:, 0]) > 0.95  # the classes differ only inside the null space
    seen = torch.linalg.svd(w.double().reshape(36, -1)).Vh[0]
    assert planted(seen) < 0.05  # ... only along a direction the projection keeps


def test_ledger_rows_hold_and_fail_on_the_numbers():
    row = {"task": "alignment", "seed": 0, "other_arch": "resnet", "D": 48, "null_dim": 12,
           "pixel_rms_grey_levels": 64.0, "vit_max_diff_f64": 1e-14, "vit_max_diff_f32": 1e-6, "vit_flips": 0.0,
           "other_max_diff_f64": 2.0, "other_flips": 0.4, "share_discarded": 0.2, "share_random": 0.25}
    good = measure.collision_rows(pd.DataFrame([row]), 1e-10, 1e-5)
    assert [r["id"] for r in good] == ["exact.collision.vit", "exact.collision.resnet"]
    assert all(r["exact"] for r in good)
    bad = measure.collision_rows(pd.DataFrame([{**row, "vit_max_diff_f64": 1e-3, "other_max_diff_f64": 0.0}]),
                                1e-10, 1e-5)
    assert not any(r["exact"] for r in bad)
    assert measure.collision_rows(pd.DataFrame(), 1e-10, 1e-5) == []
