"""The architecture factory: every arch builds, matches the parameter target, trains, and is what its name claims."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import timm.layers
import tiny_repo
import torch
import torch.nn.functional as F
import yaml
from timm.layers import BlurPool2d
from timm.models.deit import VisionTransformerDistilled

from pipeline.archs import ARCHS
from pipeline.budget import analytic_forward_flops, measured_forward_flops, tokens_per_image
from pipeline.config import parse_params
from pipeline.errors import ConfigError
from pipeline.families.swin import block_layout as swin_block_layout
from pipeline.interface.reachability import generic_weights, token_dependency
from pipeline.models import (
    budget_table,
    build_model,
    param_count,
    solve_width,
    width_step,
)

torch.set_num_threads(1)

REPO_PARAMS = yaml.safe_load((Path(__file__).parents[1] / "params.yaml").read_text())
TINY = parse_params(tiny_repo.small_params())
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


class _Built(dict):
    """Tiny models built on first use (seeded by name), shared by the tests of one module."""

    def __missing__(self, arch: str) -> torch.nn.Module:
        torch.manual_seed(0)
        self[arch] = build_model(arch, TINY, CLASSES)
        return self[arch]


@pytest.fixture(scope="module")
def tiny_models() -> dict[str, torch.nn.Module]:
    return _Built()


# --------------------------------------------------------------------------- defining properties of controls
SAMPLING_OPS = (torch.nn.modules.conv._ConvNd, torch.nn.modules.pooling._MaxPoolNd,
                torch.nn.modules.pooling._AvgPoolNd, BlurPool2d)


def _strides(model: torch.nn.Module) -> dict[str, int]:
    """Largest stride of every sampling operator (convolutions, pools, BlurPool) by module name."""
    out = {}
    for name, m in model.named_modules():
        if isinstance(m, SAMPLING_OPS):
            stride = m.stride
            out[name] = max(stride) if isinstance(stride, tuple) else int(stride)
    return out


def _pixel_dependency(model: torch.nn.Module, layout_out: str) -> np.ndarray:
    """(tokens, pixels) bool: which input pixels each output token of ``forward_features`` depends on.

    Measured by autograd on a float64 copy with generic (jittered) weights, as the reachability study does.
    """
    g = TINY.geometry
    model = generic_weights(model)
    x = torch.rand(2, g.channels, g.image_size, g.image_size, dtype=torch.float64,
                   generator=torch.Generator().manual_seed(0))
    return token_dependency(model.forward_features, x, "nchw", layout_out).matrix


def _block_membership(side: int, block: int) -> np.ndarray:
    """(tokens, pixels) bool for tokens that each own one ``block x block`` pixel cell (row-major)."""
    yy, xx = np.divmod(np.arange(side * side), side)
    cells = side // block
    owner = (yy // block) * cells + xx // block
    return np.arange(cells * cells)[:, None] == owner[None, :]


def _check_resnet_s1(model):
    assert max(_strides(model).values()) == 1, _strides(model)
    assert max(_strides(build_model("resnet", TINY, CLASSES)).values()) == 2  # the partner does subsample
    with torch.no_grad():
        assert model.forward_features(_images()).shape[-2:] == (TINY.geometry.image_size,) * 2


def _check_resnet_aa(model):
    strided = {name for name, s in _strides(model).items() if s > 1}
    assert strided and all(isinstance(model.get_submodule(n), BlurPool2d) for n in strided), strided


def _check_same_grid_as_vit(model):
    vit = build_model("vit", TINY, CLASSES)
    assert model.patch_embed.grid_size == vit.patch_embed.grid_size
    assert model.patch_embed.num_patches == vit.patch_embed.num_patches
    assert model.embed_dim == vit.embed_dim
    with torch.no_grad():
        assert model.forward_features(_images()).shape == vit.forward_features(_images()).shape
    convs = [m for m in model.patch_embed.proj.modules() if isinstance(m, torch.nn.Conv2d)]
    assert all(c.kernel_size[0] > c.stride[0] for c in convs), "every convolution must overlap its neighbours"


def _check_nomix(model):
    g = TINY.geometry
    dep = _pixel_dependency(model, "nlc")  # token i depends on the pixels of patch i, and nothing else
    np.testing.assert_array_equal(dep, _block_membership(g.image_size, g.patch_size))
    assert _pixel_dependency(build_model("vit_nopos", TINY, CLASSES), "nlc").all()  # the partner mixes


def _check_swin_local(model, params=TINY):
    g, (patch, window) = params.geometry, params.models.swin.grid(local=True)
    dep = _pixel_dependency(model, "nhwc")  # token -> pixels of its own window, never another window's
    tokens, pixel_window = dep.shape[0], _block_membership(g.image_size, patch * window)
    side = g.image_size // patch
    token_window = _block_membership(side, window).argmax(0)  # window index of every token
    np.testing.assert_array_equal(dep, pixel_window[token_window[:tokens]])
    assert pixel_window.shape[0] > 1, "one window would make the check vacuous"
    assert _pixel_dependency(build_model("swin_noshift", params, CLASSES), "nhwc").all()  # merging mixes


def test_the_one_stage_swin_pair_reads_its_own_grid():
    # models.swin.local: the pair's own patch and window (the same pixels per window); the two-stage model keeps
    # models.swin's. TINY's Swin has 4 px patches and 2-token windows; the pair here gets 2 px and 4 tokens.
    params = parse_params(tiny_repo.small_params({"models": {"swin": {"local": {"patch_size": 2, "window_size": 4}}}}))
    local, shifted = (build_model(a, params, CLASSES) for a in ("swin_local", "swin_local_shift"))
    assert tuple(build_model("swin", params, CLASSES).patch_embed.patch_size) == (4, 4)
    for model in (local, shifted):
        assert tuple(model.patch_embed.patch_size) == (2, 2)
        assert {tuple(b.window_size) for b in model.layers[0].blocks} == {(4, 4)}
    assert any(tuple(b.shift_size) == (2, 2) for b in shifted.layers[0].blocks)
    assert tokens_per_image("swin_local", params) == (params.geometry.image_size // 2) ** 2
    for arch, model in (("swin_local", local), ("swin_local_shift", shifted)):  # the FLOP formula follows the grid
        width = model.embed_dim
        assert analytic_forward_flops(arch, params, width, CLASSES) == measured_forward_flops(model, params)
    _check_swin_local(local, params)


def _check_swin_local_shift(model):
    # one stage like swin_local, but shifted blocks: tokens reach pixels beyond their fixed window
    assert len(model.layers) == 1 and any(tuple(b.shift_size) != (0, 0) for b in model.layers[0].blocks)
    dep = _pixel_dependency(model, "nhwc")
    fixed = _pixel_dependency(build_model("swin_local", TINY, CLASSES), "nhwc")
    assert (dep | ~fixed).all() and dep.sum() > fixed.sum()  # every fixed-window pixel and more


def _check_sincos_init(model):
    assert isinstance(model.pos_embed, torch.nn.Parameter) and model.pos_embed.requires_grad
    table = timm.layers.build_sincos2d_pos_embed([TINY.geometry.grid] * 2, dim=model.embed_dim)
    torch.testing.assert_close(model.pos_embed.detach(), table.unsqueeze(0))


def _check_deit_labels(model):
    deit = build_model("deit", TINY, CLASSES)
    assert isinstance(model, VisionTransformerDistilled) and model.num_prefix_tokens == 2
    assert {k: v.shape for k, v in model.state_dict().items()} == {k: v.shape for k, v in deit.state_dict().items()}


def _check_hybrid(model):
    # the ViT's token grid and width, fed by residual BasicBlocks through timm's HybridEmbed (1x1 patches)
    from timm.layers import HybridEmbed
    from timm.models.resnet import BasicBlock

    vit = build_model("vit", TINY, CLASSES)
    assert isinstance(model.patch_embed, HybridEmbed) and model.patch_embed.patch_size == (1, 1)
    assert model.patch_embed.num_patches == vit.patch_embed.num_patches and model.embed_dim == vit.embed_dim
    assert any(isinstance(m, BasicBlock) for m in model.patch_embed.backbone.modules())
    assert not any(isinstance(m, BasicBlock) for m in build_model("vit_convstem", TINY, CLASSES).modules())


def _check_mixer(model):
    # no attention and no position table, yet token mixing is tied to positions: permuting the patches
    # changes the pooled features (nomix and vit_nopos are invariant to it)
    from timm.layers import Attention

    assert not any(isinstance(m, Attention) for m in model.modules()) and not hasattr(model, "pos_embed")
    assert _pixel_dependency(model, "nlc").all()  # every token reaches every pixel (global mixing)
    x = _images(batch=3)
    order = torch.randperm(TINY.geometry.grid**2, generator=torch.Generator().manual_seed(1))
    moved = _pooled(model, _permute_patches(x, TINY.geometry.patch_size, order))
    assert (moved - _pooled(model, x)).abs().max() > 1e-4


def _check_convmixer(model):
    # the ViT's disjoint P x P patch projection, then depthwise (one group per channel) 3x3 convolutions
    from timm.layers import Attention

    g = TINY.geometry
    stem = model.stem[0]
    assert stem.kernel_size == stem.stride == (g.patch_size, g.patch_size)
    depthwise = [m for m in model.blocks.modules() if isinstance(m, torch.nn.Conv2d) and m.groups > 1]
    assert depthwise and all(m.groups == m.in_channels and m.kernel_size == (3, 3) for m in depthwise)
    assert not any(isinstance(m, Attention) for m in model.modules())


DEFINING = {
    "resnet_s1": _check_resnet_s1, "resnet_aa": _check_resnet_aa, "vit_convstem": _check_same_grid_as_vit,
    "vit_overlap": _check_same_grid_as_vit, "nomix": _check_nomix, "swin_local": _check_swin_local,
    "swin_local_shift": _check_swin_local_shift,
    "vit_sincos_init": _check_sincos_init, "deit_labels": _check_deit_labels, "vit_hybrid": _check_hybrid,
    "mixer": _check_mixer, "convmixer": _check_convmixer,
}


@pytest.mark.parametrize("arch", list(ARCHS))
def test_every_arch_matches_params_trains_and_is_what_it_claims(arch):
    torch.manual_seed(0)
    model = build_model(arch, TINY, CLASSES)  # width solved at the target (ConfigError if out of tolerance)
    m = TINY.models
    n = param_count(model)
    assert abs(n / m.param_target - 1) <= m.param_tolerance, f"{arch}: {n} params vs target {m.param_target}"
    assert n == sum(p.numel() for p in model.parameters())  # nothing frozen
    if arch in DEFINING:  # at initialisation, before any step
        DEFINING[arch](model)

    # One optimizer step on a tiny batch: finite loss, gradients everywhere trainable, weights move.
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in model.parameters()]
    loss = F.cross_entropy(model(_images(batch=4)), torch.tensor([0, 1, 2, 0]))
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    opt.step()
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))

    model.eval()
    with torch.no_grad():
        logits = model(_images())
    assert logits.shape == (2, CLASSES), f"{arch}: expected (2, {CLASSES}), got {tuple(logits.shape)}"


def test_every_control_names_a_partner_and_has_a_defining_check():
    # A control without a check of the one thing it isolates would be a name, not a minimal pair.
    controls = {a for a, info in ARCHS.items() if info.partner is not None}
    checked = set(DEFINING) | {"vit_nopos", "vit_sincos", "swin_noshift", "deit"}  # tests below
    assert controls <= checked, controls - checked
    assert all(info.partner in ARCHS for info in ARCHS.values() if info.partner)


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


@pytest.mark.slow  # a stage, a store, a browser or a long fit: make test, not test-fast
def test_default_widths_land_within_tolerance():
    params = parse_params(REPO_PARAMS)
    table = budget_table(params, params.models.reference_classes)
    tol = params.models.param_tolerance
    for row in table.itertuples():
        assert abs(row.deviation) <= tol, f"{row.arch}: {row.params} params is {row.deviation:+.1%} off"
        assert row.width % width_step(row.arch, params) == 0
    widths = dict(zip(table.arch, table.width, strict=True))
    # Ablations change one thing, not the width as well.
    for arch, reference in {"vit_nopos": "vit", "vit_sincos": "vit", "vit_sincos_init": "vit", "vit_convstem": "vit",
                            "vit_overlap": "vit", "deit_labels": "deit", "swin_noshift": "swin",
                            "resnet_s1": "resnet", "resnet_aa": "resnet"}.items():
        assert widths[arch] == widths[reference], arch


def test_impossible_target_names_the_key():
    params = parse_params(tiny_repo.small_params({"models": {"param_target": 50}}))
    with pytest.raises(ConfigError, match=r"^models\.param_target: vit cannot get within"):
        solve_width("vit", params, 10)


def test_bad_widths_and_names_are_config_errors():
    with pytest.raises(ConfigError, match="^width: 7 for vit"):
        build_model("vit", TINY, CLASSES, width=7)
    with pytest.raises(ConfigError, match="^arch: unknown architecture 'vitt'"):
        build_model("vitt", TINY, CLASSES)


SWIN = REPO_PARAMS["models"]["swin"]


@pytest.mark.parametrize(("models", "key"), [
    ({"resnet": {"layers": [1, 1, 1, 1, 1]}}, "models.resnet.layers"),
    ({"swin": {**SWIN, "window_size": 8, "depths": [2, 2], "num_heads": [2, 4]}}, "models.swin.window_size"),
    ({"swin": {**SWIN, "window_size": 4, "depths": [1, 2], "num_heads": [2, 4]}}, "models.swin.window_size"),
    ({"swin": {**SWIN, "local": {"patch_size": 4, "window_size": 4}}}, "models.swin.local.window_size"),
    ({"swin": {**SWIN, "local": {"patch_size": 2, "window_size": 2}}}, "models.swin.local"),
    ({"reference_classes": 0}, "models.reference_classes"),
])
def test_bad_model_params_name_the_key(models, key):
    with pytest.raises(ConfigError) as err:
        parse_params({**REPO_PARAMS, "models": {**REPO_PARAMS["models"], **models}})
    message = str(err.value)
    assert message.startswith(f"params.yaml: {key}:") and "\n" not in message, message
