"""The architecture factory: every arch runs, each variant is what its name claims, widths match."""

from __future__ import annotations

import pytest
import timm.layers
import torch

from pipeline.config import Params, parse_params
from pipeline.errors import ConfigError
from pipeline.models import (
    ARCHS,
    budget_table,
    build_model,
    param_count,
    solve_width,
    swin_block_layout,
    width_step,
)

torch.set_num_threads(1)

# Default geometry (16 px, 4-px patches: a 4x4 ViT grid; the tasks' checks tie it to their glyph sizes).
# Swin on a 4x4 then 2x2 grid with 2x2 windows: stage 0 shifts, stage 1 is one window and cannot.
TINY = parse_params({
    "models": {
        "param_target": 8000, "param_tolerance": 0.3, "reference_classes": 3,
        "vit": {"depth": 2, "num_heads": 2, "mlp_ratio": 2.0},
        "swin": {"patch_size": 4, "window_size": 2, "depths": [2, 2], "num_heads": [2, 4], "mlp_ratio": 2.0},
        "resnet": {"layers": [1, 1]},
    },
})
CLASSES = 3


def _images(batch: int = 2, seed: int = 0) -> torch.Tensor:
    g = TINY.geometry
    return torch.randn(batch, g.channels, g.image_size, g.image_size,
                       generator=torch.Generator().manual_seed(seed))


def _permute_patches(x: torch.Tensor, patch: int, order: torch.Tensor) -> torch.Tensor:
    """Rearrange the P x P patches of (B, C, H, W) images: output patch i is input patch ``order[i]``."""
    b, c, h, w = x.shape
    gh, gw = h // patch, w // patch
    cells = x.reshape(b, c, gh, patch, gw, patch).permute(0, 2, 4, 1, 3, 5)  # (B, gh, gw, C, P, P)
    cells = cells.reshape(b, gh * gw, c, patch, patch)
    cells = cells[:, order]
    return cells.reshape(b, gh, gw, c, patch, patch).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)


def _pooled(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(B, d) pooled features before the head: larger than timm's near-zero-initialised logits."""
    with torch.no_grad():
        return model.forward_head(model.forward_features(x), pre_logits=True)


@pytest.fixture(scope="module")
def tiny_models() -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    return {arch: build_model(arch, TINY, CLASSES) for arch in ARCHS}


@pytest.mark.parametrize("arch", ARCHS)
def test_every_arch_builds_and_classifies(arch, tiny_models):
    model = tiny_models[arch].eval()
    with torch.no_grad():
        logits = model(_images())
    assert logits.shape == (2, CLASSES), f"{arch}: expected (2, {CLASSES}), got {tuple(logits.shape)}"
    assert torch.isfinite(logits).all()
    assert param_count(model) == sum(p.numel() for p in model.parameters())  # nothing frozen


def test_deit_distilled_training_returns_both_heads(tiny_models):
    model = tiny_models["deit"]
    model.set_distilled_training(True)
    try:
        model.train()
        cls_logits, dist_logits = model(_images())
        assert cls_logits.shape == dist_logits.shape == (2, CLASSES)
        model.eval()  # eval mode averages the two heads whatever the flag says
        with torch.no_grad():
            assert model(_images()).shape == (2, CLASSES)
    finally:
        model.set_distilled_training(False)
        model.eval()


def test_vit_nopos_has_no_position_and_is_permutation_invariant(tiny_models):
    model = tiny_models["vit_nopos"].eval()
    assert model.pos_embed is None and model.cls_token is None
    assert not [n for n, _ in model.named_parameters() if "pos" in n]
    x = _images(batch=3)
    order = torch.randperm(TINY.geometry.grid**2, generator=torch.Generator().manual_seed(1))
    same, moved = _pooled(model, x), _pooled(model, _permute_patches(x, TINY.geometry.patch_size, order))
    torch.testing.assert_close(moved, same, atol=1e-5, rtol=1e-5)


def test_learned_position_breaks_permutation_invariance(tiny_models):
    # The control: the same check must fail once a position signal is present (else the test proves nothing).
    model = tiny_models["vit"].eval()
    with torch.no_grad():
        model.pos_embed.normal_()  # a visible position signal (timm's init is std 0.02)
    x = _images(batch=3)
    order = torch.randperm(TINY.geometry.grid**2, generator=torch.Generator().manual_seed(1))
    moved = _permute_patches(x, TINY.geometry.patch_size, order)
    diff = (_pooled(model, moved) - _pooled(model, x)).abs().max()
    assert diff > 1e-3, f"learned position should break invariance, max difference {diff:.2e}"


def test_vit_sincos_position_is_a_fixed_2d_table(tiny_models):
    model = tiny_models["vit_sincos"]
    names = dict(model.named_parameters())
    assert "pos_embed" not in names, "the sin-cos table must not be a trainable parameter"
    assert "pos_embed" in dict(model.named_buffers()) and "pos_embed" in model.state_dict()
    g, width = TINY.geometry, model.embed_dim
    expected = timm.layers.build_sincos2d_pos_embed([g.grid, g.grid], dim=width).unsqueeze(0)
    torch.testing.assert_close(model.pos_embed, expected)


def test_swin_shifts_odd_blocks_and_noshift_never(tiny_models):
    shifted = swin_block_layout(tiny_models["swin"])
    unshifted = swin_block_layout(tiny_models["swin_noshift"])
    window = TINY.models.swin.window_size
    for b in shifted:
        partitioned = b.resolution[0] > window  # timm turns the shift off where one window covers the grid
        expected = (window // 2,) * 2 if (b.block % 2 and partitioned) else (0, 0)
        assert b.shift == expected, f"stage {b.stage} block {b.block}: shift {b.shift}, expected {expected}"
    assert any(any(b.shift) for b in shifted)
    assert all(b.shift == (0, 0) for b in unshifted), unshifted
    assert [b.window for b in shifted] == [b.window for b in unshifted]
    assert all(blk.attn_mask is None for stage in tiny_models["swin_noshift"].layers for blk in stage.blocks)


def test_swin_shift_changes_the_function_not_the_parameters(tiny_models):
    swin, noshift = tiny_models["swin"].eval(), tiny_models["swin_noshift"].eval()
    noshift.load_state_dict(swin.state_dict())  # identical parameter sets: the shift is structure only
    diff = (_pooled(swin, _images()) - _pooled(noshift, _images())).abs().max()
    assert diff > 1e-3, "shifted and unshifted windows gave the same output"


def test_resnet_keeps_full_resolution_stem(tiny_models):
    model = tiny_models["resnet"]
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    assert isinstance(model.maxpool, torch.nn.Identity)
    with torch.no_grad():
        stem = model.act1(model.bn1(model.conv1(_images())))
    assert stem.shape[-2:] == (TINY.geometry.image_size,) * 2
    assert model.layer1[0].downsample is None  # stem width == first-stage width: no projection needed


def test_default_widths_land_within_tolerance():
    params = Params()
    table = budget_table(params, params.models.reference_classes)
    assert list(table.arch) == list(ARCHS)
    tol = params.models.param_tolerance
    for row in table.itertuples():
        assert abs(row.deviation) <= tol, f"{row.arch}: {row.params} params is {row.deviation:+.1%} off"
        assert row.width % width_step(row.arch, params) == 0
    widths = dict(zip(table.arch, table.width, strict=True))
    # Ablations change one thing: the position variants share the ViT's width, no-shift shares Swin's.
    assert widths["vit"] == widths["vit_nopos"] == widths["vit_sincos"]
    assert widths["swin"] == widths["swin_noshift"]


def test_impossible_target_names_the_key():
    params = parse_params({"models": {"param_target": 50}})
    with pytest.raises(ConfigError, match=r"^models\.param_target: vit cannot get within"):
        solve_width("vit", params, 10)


def test_bad_widths_and_names_are_config_errors():
    with pytest.raises(ConfigError, match="^width: 7 for vit"):
        build_model("vit", TINY, CLASSES, width=7)
    with pytest.raises(ConfigError, match="^arch: unknown architecture 'vitt'"):
        build_model("vitt", TINY, CLASSES)


@pytest.mark.parametrize(("models", "key"), [
    ({"resnet": {"layers": [1, 1, 1, 1, 1]}}, "models.resnet.layers"),
    ({"swin": {"window_size": 8, "depths": [2, 2], "num_heads": [2, 4]}}, "models.swin.window_size"),
    ({"swin": {"window_size": 4, "depths": [1, 2], "num_heads": [2, 4]}}, "models.swin.window_size"),
    ({"reference_classes": 0}, "models.reference_classes"),
])
def test_bad_model_params_name_the_key(models, key):
    with pytest.raises(ConfigError) as err:
        parse_params({"models": models})
    message = str(err.value)
    assert message.startswith(f"params.yaml: {key}:") and "\n" not in message, message
