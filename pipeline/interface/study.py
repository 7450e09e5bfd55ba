"""All level-1 checks from one ``Params``: tables and the list of explicit comparisons.

Each ``*_study`` function builds its real timm modules (seeded, float64 where exactness matters), calls
the pure functions of its module, and turns each claim into :class:`~pipeline.interface.checks.Check`
rows. No file or MLflow I/O here: the stage writes and logs what :func:`run_all` returns.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import pandas as pd
import torch
from timm.layers import Attention
from timm.models.vision_transformer import Block, VisionTransformer

from pipeline import resolution
from pipeline.config import Params
from pipeline.families import family_of_model
from pipeline.interface import nullspace, pairs, permutation, reachability
from pipeline.interface.checks import Check, above, at_most, equal

HEAD_CLASSES = 10  # classifier width of the models built here: no check depends on it
MAX_JACOBIAN_TOKENS = 1024  # pair-count configs up to this many tokens are also checked by autograd
VISIBLE = 1e-2  # a collision pair must differ by at least this much in some pixel (1% of the range)
CLEAN_GAP = 1e10  # smallest kept / largest dropped Jacobian entry: the zero/non-zero cut is unambiguous


@dataclass
class Results:
    """Everything the stage writes. Tables are pandas frames; ``checks`` is the full comparison list."""

    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)

    def add(self, other: Results) -> Results:
        self.tables.update(other.tables)
        self.checks.extend(other.checks)
        return self


def _vit(params: Params, width: int, seed: int, **kwargs) -> VisionTransformer:
    i, g = params.interface, params.geometry
    torch.manual_seed(seed)
    return VisionTransformer(img_size=i.image_size, patch_size=i.patch_size, in_chans=g.channels,
                             num_classes=HEAD_CLASSES, embed_dim=width, depth=i.depth,
                             num_heads=i.num_heads, **kwargs).double().eval()


def _image(params: Params, seed: int) -> torch.Tensor:
    """``(1, C, H, W)`` float64 in [0.25, 0.75], so a perturbation has room on both sides."""
    gen = torch.Generator().manual_seed(seed)
    shape = (1, params.geometry.channels, params.interface.image_size, params.interface.image_size)
    return 0.25 + 0.5 * torch.rand(shape, generator=gen, dtype=torch.float64)


# --------------------------------------------------------------------------- null space, patchify
def nullspace_study(params: Params) -> Results:
    i, c, seed = params.interface, params.geometry.channels, params.seed
    res = Results()
    table = nullspace.nullity_table(i.widths, i.patch_size, c, seed)
    res.tables["nullity"] = table
    for r in table.itertuples():
        res.checks.append(Check("nullspace", f"nullity d={r.d} >= max(0, D-d)", f">= {r.bound}",
                                r.nullity, bool(r.nullity >= r.bound)))
        res.checks.append(equal("nullspace", f"rank d={r.d} (random weights: full rank)", min(r.d, r.D), r.rank))

    big_d = i.patch_size**2 * c
    x = _image(params, seed)
    rows = []
    for label, width in (("collision", i.collision_width), ("full width", big_d)):
        embed = nullspace.make_patch_embed(i.patch_size, c, width, seed, i.image_size)
        rows.append({"module": "PatchEmbed", "case": label, **vars(nullspace.collision(embed, embed, x,
                                                                                       i.patch_size))})
    vit = _vit(params, i.collision_width, seed, class_token=True, global_pool="token")
    rows.append({"module": "VisionTransformer", "case": "collision",
                 **vars(nullspace.collision(vit, vit.patch_embed, x, i.patch_size))})
    coll = pd.DataFrame(rows)
    res.tables["collisions"] = coll
    for r in coll.itertuples():
        name = f"{r.module} d={r.d}"
        res.checks += [above("nullspace", f"{name}: inputs differ (max |dx|)", r.input_max_diff, VISIBLE),
                       Check("nullspace", f"{name}: perturbed image inside [0, 1]", "in [0, 1]",
                             r.pixel_max - r.pixel_min, bool(r.pixel_min >= 0 and r.pixel_max <= 1))]
        if r.case == "collision":
            res.checks += [at_most("nullspace", f"{name}: outputs agree, float64", r.output_max_diff_f64,
                                   i.exact_tol),
                           at_most("nullspace", f"{name}: outputs agree, float32", r.output_max_diff_f32, i.atol)]
        else:
            res.checks += [equal("nullspace", f"{name}: nullity", 0, r.nullity),
                           above("nullspace", f"{name}: weakest direction still moves the token, float32",
                                 r.output_max_diff_f32, i.atol)]

    embed = nullspace.make_patch_embed(i.patch_size, c, i.collision_width, seed, i.image_size)
    diff = nullspace.patchify_vs_conv(embed, x)
    res.tables["patchify"] = pd.DataFrame([{"image_size": i.image_size, "patch_size": i.patch_size,
                                            "d": i.collision_width, "max_abs_diff_f64": diff}])
    res.checks.append(at_most("patchify", "cut-and-project == stride-P conv (float64)", diff, i.exact_tol))
    return res


# --------------------------------------------------------------------------- permutation
def permutation_study(params: Params) -> Results:
    i, seed = params.interface, params.seed
    res = Results()
    gen = torch.Generator().manual_seed(seed)
    sets = {"small": (i.small_tokens, permutation.all_permutations(i.small_tokens)),
            "large": (i.large_tokens, permutation.random_permutations(i.large_tokens, i.random_permutations,
                                                                      seed))}
    torch.manual_seed(seed)
    modules = {"Attention": Attention(i.embed_dim, num_heads=i.num_heads, qkv_bias=True),
               "Block": Block(i.embed_dim, num_heads=i.num_heads)}
    frames = []
    for mod_name, module in modules.items():
        module = module.double().eval()
        for set_name, (n, perms) in sets.items():
            x = torch.randn(1, n, i.embed_dim, generator=gen, dtype=torch.float64)  # content tokens
            pos = torch.randn(1, n, i.embed_dim, generator=gen, dtype=torch.float64)  # absolute position E
            frames.append(permutation.defect_table(module, x, pos, perms).assign(module=mod_name,
                                                                                  tokens=set_name, n=n))
    table = pd.concat(frames, ignore_index=True)
    res.tables["permutation"] = table
    for r in table.itertuples():
        tag = f"{r.module} n={r.n} perm [{r.perm}]"
        res.checks += [at_most("permutation", f"{tag}: f(PX) = P f(X)", r.equivariance, i.exact_tol),
                       at_most("permutation", f"{tag}: mean pool invariant", r.mean_pool, i.exact_tol),
                       at_most("permutation", f"{tag}: f(P(X+E)) = P f(X+E)", r.joint, i.exact_tol)]
        if not r.identity:
            # judged in float64 against exact_tol, like the identities: rounding is ~1e-16, so any defect
            # above exact_tol is a real break; its size scales with ||E|| (reported, not asserted)
            res.checks.append(above("permutation", f"{tag}: f(PX+E) != P f(X+E)", r.position_break,
                                    i.exact_tol))

    # whole timm ViTs: permute the image's patches; all orders of the first few, random orders of all
    x = _image(params, seed)
    grid = i.image_size // i.patch_size
    n_patches = grid * grid
    k = min(i.small_tokens, n_patches)
    perms = [p + tuple(range(k, n_patches)) for p in permutation.all_permutations(k)]
    perms += permutation.random_permutations(n_patches, i.random_permutations, seed + 1)
    variants = {"no position, mean pool": dict(pos_embed="none", class_token=False, global_pool="avg"),
                "no position, class token": dict(pos_embed="none", class_token=True, global_pool="token"),
                "learned position, mean pool": dict(pos_embed="learn", class_token=False, global_pool="avg")}
    rows = []
    for name, kwargs in variants.items():
        vit = _vit(params, i.embed_dim, seed, **kwargs)
        for perm in perms:
            identity = perm == tuple(range(n_patches))
            rows.append({"variant": name, "perm": " ".join(map(str, perm)), "identity": identity,
                         **permutation.vit_defects(vit, x, i.patch_size, perm)})
    vt = pd.DataFrame(rows)
    res.tables["vit_permutation"] = vt
    for r in vt.itertuples():
        tag = f"ViT ({r.variant}) perm [{r.perm}]"
        if r.variant.startswith("no position"):
            res.checks.append(at_most("permutation", f"{tag}: logits invariant", r.logits, i.exact_tol))
        else:
            if not r.identity:
                res.checks.append(above("permutation", f"{tag}: logits change", r.logits, i.exact_tol))
            res.checks.append(at_most("permutation", f"{tag}: positions permuted along: invariant", r.joint,
                                      i.exact_tol))
    return res


# --------------------------------------------------------------------------- pair counts
def pairs_study(params: Params) -> Results:
    pc, seed = params.interface.pair_counts, params.seed
    res = Results()
    table = pairs.timm_pair_table(pairs.pair_count_table(pc.image_size, pc.patch_sizes, pc.window,
                                                         pc.extra_image_sizes, pc.extra_patch_size))
    jac = []
    for r in table.itertuples():
        tag = f"H={r.image_size} P={r.patch_size} w={r.window}"
        if r.tiles:
            res.checks += [
                equal("pairs", f"{tag}: timm computed == N min(N, w^2)", r.window_pairs, r.timm_computed),
                equal("pairs", f"{tag}: timm unmasked (no shift) == N min(N, w^2)", r.window_pairs,
                      r.timm_unmasked),
                equal("pairs", f"{tag}: timm unmasked (shift) == shifted formula", r.shifted_unmasked_formula,
                      r.timm_shifted_unmasked)]
        else:  # padded windows: timm evaluates more entries than the formula, real pairs are fewer
            res.checks.append(above("pairs", f"{tag}: padded, timm computes more than N w^2",
                                    r.timm_computed, r.window_pairs))
        if r.tokens <= MAX_JACOBIAN_TOKENS:
            for shifted in (False, True):
                torch.manual_seed(seed)
                block = pairs.make_swin_block(r.grid, r.window, shifted).double().eval()
                x = torch.randn(1, r.grid, r.grid, block.dim, dtype=torch.float64)
                dep = reachability.token_dependency(block, x, "nhwc", "nhwc", params.interface.jacobian_cut,
                                                    seed)
                mismatch = int((dep.matrix != pairs.window_connectivity(block)).sum())
                jac.append({"image_size": r.image_size, "patch_size": r.patch_size, "shifted": shifted,
                            "jacobian_pairs": int(dep.matrix.sum()), "mismatches": mismatch})
                res.checks.append(equal("pairs", f"{tag} shift={shifted}: Jacobian pattern == mask read-off",
                                        0, mismatch))
    jt = pd.DataFrame(jac)
    table = table.merge(jt[~jt.shifted][["image_size", "patch_size", "jacobian_pairs"]], how="left",
                        on=["image_size", "patch_size"])
    table = table.merge(jt[jt.shifted][["image_size", "patch_size", "jacobian_pairs"]]
                        .rename(columns={"jacobian_pairs": "jacobian_shifted_pairs"}), how="left",
                        on=["image_size", "patch_size"])
    res.tables["pairs"] = table.astype({"shifted_unmasked_formula": "Int64", "jacobian_pairs": "Int64",
                                        "jacobian_shifted_pairs": "Int64"})
    return res


# --------------------------------------------------------------------------- reachability
def reachability_study(params: Params, models: dict[str, torch.nn.Module]) -> Results:
    """Measured token graphs of the configured architectures (``models``: arch -> built timm module)."""
    i, g = params.interface, params.geometry
    res = Results()
    offsets, distances, layers, summary = [], [], [], []
    for arch, model in models.items():
        chain, deps, meet = reachability.reachability(model, g.image_size, g.channels, i.probes, params.seed,
                                                      i.jacobian_cut)
        for k, (layer, dep) in enumerate(zip(chain, deps, strict=True)):
            gap = dep.smallest_kept / dep.largest_dropped if dep.largest_dropped else math.inf
            mismatch = None if layer.predicted is None else int((layer.predicted != dep.matrix).sum())
            layers.append({"arch": arch, "layer": k, "name": layer.name, "tokens_out": dep.matrix.shape[0],
                           "tokens_in": dep.matrix.shape[1], "dependencies": int(dep.matrix.sum()),
                           "smallest_kept": dep.smallest_kept, "largest_dropped": dep.largest_dropped,
                           "mismatches_vs_definition": mismatch})
            res.checks.append(above("reachability", f"{arch} {layer.name}: clean zero/non-zero cut", gap,
                                    CLEAN_GAP))
            if mismatch is not None:
                res.checks.append(equal("reachability", f"{arch} {layer.name}: Jacobian == definition", 0,
                                        mismatch))
        off = reachability.offset_table(meet, g.image_size)
        dist = reachability.distance_table(off)
        offsets.append(off.assign(arch=arch))
        distances.append(dist.assign(arch=arch, distance_tokens=dist.chebyshev / g.patch_size,
                                     depth=len(chain) - 1))
        reach = meet != reachability.UNREACHABLE
        summary.append({"arch": arch, "depth": len(chain) - 1, "layers": " > ".join(c.name for c in chain),
                        "all_pairs_meet": bool(reach.all()),
                        "layers_for_all_pairs": int(meet.max()) if reach.all() else reachability.UNREACHABLE,
                        "unreachable_pairs": int((~reach).sum())})
        first = chain[1].predicted if len(chain) > 1 else None
        if first is not None and first.all():  # block 1 mixes all tokens by definition: any two pixels meet
            # there at the latest (a wide convolutional embedding, the hybrid's, may join them already)
            worst = int(meet.max()) if reach.all() else len(chain)
            res.checks.append(at_most("reachability", f"{arch}: global token mixing, all pairs meet by layer 1",
                                      worst, 1))
    cols = ["arch", "chebyshev", "distance_tokens", "pairs", "best", "worst", "reachable", "depth"]
    res.tables["reachability"] = pd.concat(distances, ignore_index=True)[cols]
    res.tables["reachability_offsets"] = pd.concat(offsets, ignore_index=True)[
        ["arch", "dy", "dx", "chebyshev", "pairs", "best", "worst", "reachable"]]
    res.tables["reachability_layers"] = pd.DataFrame(layers).astype({"mismatches_vs_definition": "Int64"})
    res.tables["reachability_summary"] = pd.DataFrame(summary)
    return res


# --------------------------------------------------------------------------- position contract
def position_study(params: Params, models: dict[str, torch.nn.Module]) -> Results:
    """The resolution contract (pipeline/resolution.py) on every configured architecture.

    At the training size the mapped copy must give the original's logits exactly; at every evaluated size
    the logits must have shape (B, K), a learned/sin-cos table one row per token of the new grid, and a
    Swin block every relative offset's trained bias (window fixed, never interpolated).
    """
    res = Results()
    g, rows = params.geometry, []
    gen = torch.Generator().manual_seed(params.seed)
    for arch, model in models.items():
        model = model.eval()
        kind, family = resolution.position_kind(model), family_of_model(model)
        rows.append({"arch": arch, "kind": kind, "contract": resolution.POSITION_CONTRACT[kind]})
        fixed = family.resize is None  # a fixed token grid: its own size only
        sizes = [] if fixed else params.evaluation.resolution.sizes
        for size in dict.fromkeys([g.image_size, *sizes]):
            mapped = resolution.at_resolution(model, arch, params, size).eval()
            x = torch.rand(2, g.channels, size, size, generator=gen)
            with torch.no_grad():
                out = mapped(x)
                if size == g.image_size:
                    diff = (out - model(x)).abs().max().item()
                    res.checks.append(equal("position", f"{arch} at the training size {size} px: mapped logits "
                                            "== original (max |diff|)", 0, diff))
            res.checks.append(equal("position", f"{arch} at {size} px: logits per image", HEAD_CLASSES,
                                    out.shape[-1] if out.shape[0] == 2 else -1))
            for label, want, got in family.position_checks(model, mapped, size):  # the family reads its table
                res.checks.append(equal("position", f"{arch} at {size} px: {label}", want, got))
    res.tables["position_contract"] = pd.DataFrame(rows)
    return res


def run_all(params: Params, models: dict[str, torch.nn.Module], progress=print) -> Results:
    """Every group of checks, one progress line each; ``models`` are the configured architectures."""
    groups = {"null space and collisions": lambda: nullspace_study(params),
                "permutation equivariance": lambda: permutation_study(params),
                "attention pair counts": lambda: pairs_study(params),
                "reachability": lambda: reachability_study(params, models),
                "position contract": lambda: position_study(params, models)}
    res = Results()
    for i, (name, group) in enumerate(groups.items(), 1):
        t0 = time.perf_counter()
        part = group()
        res.add(part)
        progress(f"  interface {i}/{len(groups)} {name}: {sum(c.held for c in part.checks)} of "
                 f"{len(part.checks)} checks held ({time.perf_counter() - t0:.1f} s)", flush=True)
    return res


def key_numbers(res: Results) -> dict[str, float]:
    """Headline values for MLflow metrics and the report's first table."""
    t = res.tables
    coll = t["collisions"].set_index(["module", "case"])
    perm, vt = t["permutation"], t["vit_permutation"]
    moved = vt[(vt.variant == "learned position, mean pool") & ~vt.identity]
    p = t["pairs"]
    ref = p[(p.image_size == 224) & (p.patch_size == 16)]
    out = {
        "patchify_max_diff": float(t["patchify"].max_abs_diff_f64.iloc[0]),
        "collision_token_diff_f64": float(coll.loc[("PatchEmbed", "collision"), "output_max_diff_f64"]),
        "collision_token_diff_f32": float(coll.loc[("PatchEmbed", "collision"), "output_max_diff_f32"]),
        "collision_logit_diff_f64": float(coll.loc[("VisionTransformer", "collision"), "output_max_diff_f64"]),
        "collision_logit_diff_f32": float(coll.loc[("VisionTransformer", "collision"), "output_max_diff_f32"]),
        "full_width_min_token_diff_f32": float(coll.loc[("PatchEmbed", "full width"), "output_max_diff_f32"]),
        "equivariance_max_defect": float(perm.equivariance.max()),
        "position_break_min_defect": float(perm[~perm.identity].position_break.min()),
        "vit_learned_position_min_defect": float(moved.logits.min()) if len(moved) else float("nan"),
    }
    if len(ref):
        out["pairs_224_p16_global"] = float(ref.global_pairs.iloc[0])
        out["pairs_224_p16_window"] = float(ref.window_pairs.iloc[0])
    for r in t["reachability_summary"].itertuples():
        out[f"reach_layers_all_pairs.{r.arch}"] = float(r.layers_for_all_pairs)
    return out


def reachability_json(res: Results, params: Params) -> dict:
    """Machine-readable prediction for the training stages: per arch, per Chebyshev distance."""
    dist = res.tables["reachability"]
    return {
        "convention": {
            "meet_layer": "first layer whose output has one token depending on both input pixels "
                          "(0 = embedding/stem, k = after block k); -1 = never within the depth",
            "distance": "Chebyshev distance max(|dy|, |dx|) in input pixels; distance_tokens = pixels / "
                        "geometry.patch_size",
            "best_worst": "min / max meet layer over all pixel pairs at that distance",
            "method": "autograd Jacobian sparsity of each real timm layer, float64, generic random weights",
        },
        "image_size": params.geometry.image_size,
        "patch_size": params.geometry.patch_size,
        "archs": {
            r.arch: {"depth": r.depth, "layers": r.layers.split(" > "), "all_pairs_meet": r.all_pairs_meet,
                     "layers_for_all_pairs": r.layers_for_all_pairs,
                     "by_distance": dist[dist.arch == r.arch].drop(columns=["arch", "depth"]).to_dict("records")}
            for r in res.tables["reachability_summary"].itertuples()
        },
    }

