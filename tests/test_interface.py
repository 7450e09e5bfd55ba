"""Level-1 interface checks on tiny configurations: real timm modules, no mocks."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import tiny_repo
import torch
import yaml
from conftest import empty_store
from timm.layers import Attention
from timm.models.swin_transformer import SwinTransformer
from timm.models.vision_transformer import Block, VisionTransformer

from pipeline.archs import ARCHS
from pipeline.config import parse_params
from pipeline.errors import ConfigError
from pipeline.families import family
from pipeline.interface import nullspace, pairs, permutation, reachability
from pipeline.interface.reachability import UNREACHABLE

torch.set_num_threads(1)


def _image(c: int, h: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return 0.25 + 0.5 * torch.rand(1, c, h, h, generator=gen, dtype=torch.float64)


# --------------------------------------------------------------------------- null space
def test_nullity_matches_formula_across_widths():
    table = nullspace.nullity_table([2, 6, 11, 12, 13, 20], patch_size=2, channels=3, seed=0)  # D = 12
    assert (table.D == 12).all()
    assert table.nullity.tolist() == [max(0, 12 - d) for d in table.d]
    assert table["rank"].tolist() == [min(d, 12) for d in table.d]


def test_collision_pair_exists_below_full_width():
    x = _image(3, 4)
    embed = nullspace.make_patch_embed(2, 3, width=6, seed=0, image_size=4)
    c = nullspace.collision(embed, embed, x, patch_size=2, patch_index=3)
    assert c.nullity == 6 and c.sigma_min == 0.0
    assert c.input_max_diff > 0.05  # the images differ visibly...
    assert 0.0 <= c.pixel_min and c.pixel_max <= 1.0  # ...and both are valid images
    assert c.output_max_diff_f64 < 1e-12  # ...but give the same tokens
    assert c.output_max_diff_f32 < 1e-5


def test_collision_pair_fools_a_whole_vit_but_not_a_full_width_embedding():
    x = _image(3, 8)
    torch.manual_seed(0)
    vit = VisionTransformer(img_size=8, patch_size=2, embed_dim=6, depth=1, num_heads=2, num_classes=3)
    c = nullspace.collision(vit, vit.patch_embed, x, patch_size=2, patch_index=5)
    assert c.input_max_diff > 0.05 and c.output_max_diff_f64 < 1e-12 and c.output_scale > 0

    full = nullspace.make_patch_embed(2, 3, width=12, seed=0, image_size=8)  # d = D
    c = nullspace.collision(full, full, x, patch_size=2)
    assert c.nullity == 0 and c.sigma_min > 0
    assert c.output_max_diff_f32 > 1e-5  # the least-responsive direction still moves the token


def test_patchify_equals_strided_convolution():
    embed = nullspace.make_patch_embed(4, 3, width=10, seed=1, image_size=12)
    x = torch.rand(2, 3, 12, 12, dtype=torch.float64)
    assert nullspace.patchify_vs_conv(embed, x) < 1e-12
    # and the cut is in the token order of timm: token t = patch t, row-major
    patches = nullspace.cut_patches(x, 4)
    assert patches.shape == (2, 9, 48)
    assert torch.equal(patches[0, 4], x[0, :, 4:8, 4:8].reshape(-1))


# --------------------------------------------------------------------------- permutation
@pytest.mark.parametrize("module_cls", [Attention, Block])
def test_content_attention_is_equivariant_and_position_breaks_it(module_cls):
    torch.manual_seed(0)
    f = module_cls(8, num_heads=2).double().eval()
    x, pos = torch.randn(2, 1, 4, 8, dtype=torch.float64)
    table = permutation.defect_table(f, x, pos, permutation.all_permutations(4))
    assert len(table) == 24 and table.identity.sum() == 1
    assert table.equivariance.max() < 1e-12
    assert table.mean_pool.max() < 1e-12
    assert table.joint.max() < 1e-12
    assert table[~table.identity].position_break.min() > 1e-3
    assert table[table.identity].position_break.max() < 1e-12


def test_whole_vit_permutation_identities():
    x = _image(3, 8)
    perms = permutation.random_permutations(16, 4, seed=0)
    torch.manual_seed(0)
    nopos = VisionTransformer(img_size=8, patch_size=2, embed_dim=8, depth=1, num_heads=2, num_classes=3,
                              pos_embed="none", class_token=False, global_pool="avg").double()
    torch.manual_seed(0)
    learned = VisionTransformer(img_size=8, patch_size=2, embed_dim=8, depth=1, num_heads=2, num_classes=3,
                                class_token=True, global_pool="token").double()
    for perm in perms:
        assert permutation.vit_defects(nopos, x, 2, perm)["logits"] < 1e-12
        d = permutation.vit_defects(learned, x, 2, perm)
        assert d["logits"] > 1e-6 and d["joint"] < 1e-12


def test_permute_image_patches_moves_whole_patches():
    x = torch.arange(2 * 4 * 4, dtype=torch.float64).reshape(1, 2, 4, 4)
    y = permutation.permute_image_patches(x, 2, (3, 2, 1, 0))
    assert torch.equal(y[..., :2, :2], x[..., 2:, 2:])
    assert torch.equal(permutation.permute_image_patches(y, 2, (3, 2, 1, 0)), x)


# --------------------------------------------------------------------------- pair counts
@pytest.mark.parametrize("grid,window", [(8, 4), (12, 4), (6, 2), (4, 4), (3, 7)])
def test_pair_counts_formula_matches_timm_masks(grid, window):
    n = grid * grid
    plain = pairs.timm_pair_counts(pairs.make_swin_block(grid, window, shifted=False))
    shifted = pairs.timm_pair_counts(pairs.make_swin_block(grid, window, shifted=True))
    assert plain["computed"] == plain["unmasked"] == pairs.window_pairs(n, window)
    assert shifted["computed"] == pairs.window_pairs(n, window)
    assert shifted["unmasked"] == pairs.shifted_unmasked_pairs(grid, shifted["window_used"],
                                                               shifted["shift_used"])
    if window < grid:
        assert shifted["unmasked"] < shifted["computed"]  # the roll's wrapped pairs are masked
    else:
        assert shifted["shift_used"] == 0 and plain["computed"] == pairs.global_pairs(n)


def test_pair_count_table_reference_numbers():
    t = pairs.pair_count_table(224, [16], 7, [384], 16).set_index("image_size")
    assert t.loc[224, "tokens"] == 196 and t.loc[224, "global_pairs"] == 38_416
    assert t.loc[224, "window_pairs"] == 196 * 49
    assert t.loc[384, "tokens"] == 576 and t.loc[384, "global_pairs"] == 331_776
    assert not t.loc[384, "tiles"]  # 24 tokens per side: 7x7 windows do not tile


@pytest.mark.parametrize("grid,window,shifted", [(8, 4, True), (6, 4, True), (6, 4, False)])
def test_mask_read_off_equals_jacobian_of_the_block(grid, window, shifted):
    torch.manual_seed(0)
    block = pairs.make_swin_block(grid, window, shifted).double().eval()
    x = torch.randn(1, grid, grid, block.dim, dtype=torch.float64)
    dep = reachability.token_dependency(block, x, "nhwc", "nhwc")
    assert np.array_equal(dep.matrix, pairs.window_connectivity(block))
    if shifted:
        assert dep.largest_dropped < 1e-40 < 1e-6 < dep.smallest_kept  # e^-100 masks sit far below the cut


# --------------------------------------------------------------------------- reachability
def _tiny_swin(depth: int) -> SwinTransformer:
    torch.manual_seed(0)
    return SwinTransformer(img_size=8, patch_size=1, in_chans=1, window_size=2, embed_dim=4, depths=(depth,),
                           num_heads=(1,), mlp_ratio=1.0, num_classes=2, drop_path_rate=0.0)


def test_swin_reachability_needs_the_shifted_layer_and_reports_unreachable():
    chain, deps, meet = reachability.reachability(_tiny_swin(2), image_size=8, channels=1)
    assert [c.name for c in chain] == ["embed", "stage1.block1", "stage1.block2"]
    assert all(np.array_equal(c.predicted, d.matrix) for c, d in zip(chain, deps, strict=True))

    def pix(y: int, x: int) -> int:
        return y * 8 + x

    assert meet[pix(0, 0), pix(0, 0)] == 0  # patch_size 1: only a pixel with itself at the embedding
    assert meet[pix(0, 0), pix(1, 1)] == 1  # same 2x2 window: one layer
    assert meet[pix(0, 1), pix(0, 2)] == 2  # neighbours across a window border: the shifted layer
    assert meet[pix(0, 0), pix(0, 7)] == UNREACHABLE  # too far for two window layers
    dist = reachability.distance_table(reachability.offset_table(meet, 8)).set_index("chebyshev")
    assert dist.loc[1, "best"] == 1 and dist.loc[1, "worst"] == 2
    assert dist.loc[7, "worst"] == UNREACHABLE and dist.loc[7, "reachable"] == 0.0

    _, _, meet1 = reachability.reachability(_tiny_swin(1), image_size=8, channels=1)
    assert meet1[pix(0, 1), pix(0, 2)] == UNREACHABLE  # without the shifted layer: never


def test_vit_reachability_is_global_after_one_block():
    torch.manual_seed(0)
    vit = VisionTransformer(img_size=8, patch_size=4, in_chans=1, embed_dim=8, depth=2, num_heads=2,
                            num_classes=2)
    chain, deps, meet = reachability.reachability(vit, image_size=8, channels=1)
    assert all(np.array_equal(c.predicted, d.matrix) for c, d in zip(chain, deps, strict=True))
    assert meet[0, 3] == 0  # same 4x4 patch
    assert meet[0, 63] == 1 and meet.max() == 1


# --------------------------------------------------------------------------- config
@pytest.mark.parametrize("section,key,value", [
    ("interface", "collision_width", 48),  # D = 4*4*3: no collision pair at d >= D
    ("interface", "image_size", 18),
    ("interface", "jacobian_cut", 1.5),
    ("interface", "unknown", 1),
])
def test_bad_interface_params_name_the_key(section, key, value):
    with pytest.raises(ConfigError, match=f"interface.{key}"):
        parse_params(tiny_repo.params_with({section: {key: value}}))


# --------------------------------------------------------------------------- stage end to end
TINY = {  # geometry stays at its default (16 px, 4-px patches): other sections validate against it
    "interface": {"patch_size": 2, "widths": [4, 12, 16], "collision_width": 4, "embed_dim": 8,
                  "num_heads": 2, "small_tokens": 3, "large_tokens": 8, "random_permutations": 2,
                  "image_size": 8, "depth": 1,
                  "pair_counts": {"image_size": 32, "patch_sizes": [4, 8], "window": 2,
                                  "extra_image_sizes": [48], "extra_patch_size": 8}},
    "models": {"param_target": 3000, "param_tolerance": 0.5,
               "vit": {"depth": 1, "num_heads": 1, "mlp_ratio": 1.0},
               "swin": {"patch_size": 2, "window_size": 4, "depths": [2], "num_heads": [1],
                        "mlp_ratio": 1.0},
               "resnet": {"layers": [1, 1]}},  # timm divides by (blocks - 1): one block crashes
}


TINY["evaluation"] = {"subgroups": {"border": "edge", "shuffle_seed": 0, "zoom": [1.0]},
                      "resolution": {"tasks": [], "sizes": [8, 12, 20], "interpolation": "bicubic",
                                     "image_resize": "area"}}
# its own data seed, not the study's: at 3,000 parameters a conv stem can leave a ReLU path dead for both of the
# reachability probes at some seeds (seed 2: vit_convstem's layer-1 mixing measured at 2), which says nothing about
# the stage; the study's own models pass at its seed (the interface stage of every committed study)
TINY["seed"] = 1
TINY = tiny_repo.params_with(TINY)  # the repository's params.yaml with the tiny study merged in


# --------------------------------------------------------------------------- position contract
def _built(params) -> dict[str, torch.nn.Module]:
    from pipeline.models import build_model

    out = {}
    for arch in ARCHS:
        torch.manual_seed(0)
        out[arch] = build_model(arch, params, 10).eval()
    return out


@pytest.mark.slow  # over a second idle: make test, not test-fast
def test_position_contract_exact_at_training_size_and_shapes_elsewhere():
    from pipeline.interface.study import position_study
    from pipeline.resolution import POSITION_CONTRACT

    params = parse_params(TINY)
    res = position_study(params, _built(params))
    table = res.tables["position_contract"].set_index("arch")
    for arch, kind in table.kind.items():  # a family of one position kind states just that row
        rows = family(arch).contract
        assert kind in rows and (len(rows) > 1 or [kind] == list(rows)), (arch, kind)
    # the ViT's kind follows its `position` option (DeiT: always its learned 1D table)
    vits = [a for a in ARCHS if ARCHS[a].family == "vit"]
    assert {a: table.kind[a] for a in vits} == {
        a: {"none": "none", "sincos": "sincos"}.get(ARCHS[a].options.get("position"), "learned") for a in vits}
    assert set(table.contract) <= set(POSITION_CONTRACT.values())
    failed = [c for c in res.checks if not c.held]
    assert not failed, failed
    names = [c.name for c in res.checks]
    assert sum("training size" in n for n in names) == len(table)  # one exact-equality check per architecture
    fixed = sum(family(a).resize is None for a in table.index)  # a fixed token grid: its training size only
    assert sum("at 20 px: logits per image" in n for n in names) == len(table) - fixed
    assert any("swin at 12 px: every offset keeps its trained bias" in n for n in names)


@pytest.mark.slow  # over a second idle: make test, not test-fast
def test_a_fixed_grid_family_is_refused_at_another_size_naming_the_key():
    from pipeline.resolution import at_resolution

    params = parse_params(TINY)
    mixer = _built(params)["mixer"]
    assert at_resolution(mixer, "mixer", params, params.geometry.image_size) is not mixer  # its own size: a copy
    with pytest.raises(ConfigError, match=r"^evaluation\.resolution\.tasks: mixer has a fixed token grid"):
        at_resolution(mixer, "mixer", params, 20)


@pytest.mark.slow  # over a second idle: make test, not test-fast
def test_swin_window_fixed_crops_and_timm_interpolation_would_not_hold():
    from pipeline.families.swin import bias_defect
    from pipeline.resolution import at_resolution

    params = parse_params(TINY)
    torch.manual_seed(0)
    swin = _built(params)["swin"]
    with torch.no_grad():  # random biases, so a changed offset shows
        for m in swin.modules():
            if hasattr(m, "relative_position_bias_table"):
                m.relative_position_bias_table.normal_()
    small = at_resolution(swin, "swin", params, 6)  # grid 3 < window 4: one 3 x 3 window, table cropped
    block = small.layers[0].blocks[1]
    assert tuple(block.window_size) == (3, 3) and tuple(block.shift_size) == (0, 0)
    assert bias_defect(swin, small) == 0
    plain = copy.deepcopy(swin)
    plain.set_input_size(img_size=(6, 6), window_size=4)  # timm alone resamples the table (BEiT-style)
    assert bias_defect(swin, plain) > 0
    big = at_resolution(swin, "swin", params, 20)  # grid 10: window 4, shift 2, padded by timm
    assert [tuple(b.window_size) for b in big.layers[0].blocks] == [(4, 4), (4, 4)]
    assert tuple(big.layers[0].blocks[1].shift_size) == (2, 2) and bias_defect(swin, big) == 0


@pytest.mark.slow  # over a second idle: make test, not test-fast
def test_learned_table_resampled_with_the_named_interpolation_sincos_recomputed():
    from timm.layers import build_sincos2d_pos_embed, resample_abs_pos_embed

    from pipeline.resolution import at_resolution

    params = parse_params(TINY)
    models = _built(params)
    vit, sincos = models["vit"], models["vit_sincos"]
    mapped = at_resolution(vit, "vit", params, 24)
    want = resample_abs_pos_embed(vit.pos_embed.data, [6, 6], [4, 4], num_prefix_tokens=0,
                                  interpolation="bicubic", antialias=True)
    assert torch.equal(mapped.pos_embed.data, want) and isinstance(mapped.pos_embed, torch.nn.Parameter)
    assert vit.pos_embed.shape[1] == 16  # the original is untouched
    bilinear = parse_params({**TINY, "evaluation": {**TINY["evaluation"], "resolution": {
        **TINY["evaluation"]["resolution"], "interpolation": "bilinear"}}})
    assert not torch.equal(at_resolution(vit, "vit", bilinear, 24).pos_embed.data, want)
    s = at_resolution(sincos, "vit_sincos", params, 24)
    assert torch.equal(s.pos_embed[0], build_sincos2d_pos_embed([6, 6], dim=sincos.embed_dim))
    assert "pos_embed" in dict(s.named_buffers())  # still fixed: not a parameter
    with pytest.raises(ConfigError, match="evaluation.resolution.sizes: 10 px"):
        at_resolution(vit, "vit", params, 10)


@pytest.mark.slow  # the whole interface stage, with its MLflow run
def test_stage_writes_outputs_and_logs_to_mlflow(reproduced_repo, tmp_path, monkeypatch):
    """The stage on the shared tiny repository's params, here in process: its outputs and MLflow run, and the same
    tables and text, byte for byte, as the repository's own run of it (another process, another folder: what makes
    a clone's rerun agree)."""
    from mlflow.tracking import MlflowClient

    from pipeline.stages.interface import main

    empty_store(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    params = reproduced_repo / "params.yaml"
    out, rep = tmp_path / "data", tmp_path / "report"
    assert main(["--params", str(params), "--out", str(out), "--report", str(rep)]) == 0
    for name in ("checks.csv", "nullity.csv", "pairs.csv", "reachability.csv", "reachability.json",
                 "summary.json"):
        assert (out / name).stat().st_size > 0
    for name in ("interface.md", "nullity.png", "permutation.png", "pairs.png", "reachability.png",
                 "reachability.csv", "reachability.json"):
        assert (rep / name).stat().st_size > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["checks"]["checked"] == summary["checks"]["held"] > 0
    pred = json.loads((rep / "reachability.json").read_text())
    assert set(pred["archs"]) >= {"vit", "swin", "swin_noshift", "resnet"}
    assert f"{summary['checks']['held']} of {summary['checks']['checked']} checks held" in (
        rep / "interface.md").read_text()

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment_by_name("bias-interface")
    (run,) = client.search_runs([exp.experiment_id])
    m = run.data.metrics
    assert m["checks.checked"] == m["checks.held"] == summary["checks"]["checked"]
    assert math.isclose(m["patchify_max_diff"], summary["key_numbers"]["patchify_max_diff"])
    width = yaml.safe_load(params.read_text())["interface"]["collision_width"]
    assert run.data.params["interface.collision_width"] == str(width)
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "report")}
    assert "report/interface.md" in artifacts

    # the figures aside: matplotlib's state in a test worker is what earlier tests left (sizes differ), a stage
    # process starts clean
    for ours, theirs in ((out, reproduced_repo / "data/interface"), (rep, reproduced_repo / "reports/interface")):
        assert {p.name for p in ours.iterdir()} == {p.name for p in theirs.iterdir()}
        assert {p.name: p.read_bytes() for p in ours.iterdir() if p.suffix != ".png"} == {
            p.name: p.read_bytes() for p in theirs.iterdir() if p.suffix != ".png"}


def test_stage_rejects_bad_params_in_one_line(tmp_path, capsys):
    from pipeline.stages.interface import main

    bad = tmp_path / "params.yaml"
    bad.write_text(yaml.safe_dump(tiny_repo.params_with({"interface": {"collision_width": 64}})))
    assert main(["--params", str(bad), "--out", str(tmp_path / "o"), "--report", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "interface.collision_width" in err
    assert not (tmp_path / "o").exists()
