"""Markdown and figures for the level-1 report (no computation beyond formatting the study's tables)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only; no display on a build machine
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from pipeline.interface.checks import Check, summary  # noqa: E402
from pipeline.interface.reachability import UNREACHABLE  # noqa: E402
from pipeline.interface.study import MAX_JACOBIAN_TOKENS  # noqa: E402

CAPTION = "Analytic count / exact check on timm modules, not a measurement of training."


def _md(frame: pd.DataFrame, floatfmt: str = ".3g") -> str:
    """A GitHub Markdown table with fixed float formatting (so reruns give identical bytes)."""
    cols = list(frame.columns)
    lines = ["| " + " | ".join(map(str, cols)) + " |", "|" + "---|" * len(cols)]
    for row in frame.itertuples(index=False):
        cells = ["-" if v is pd.NA else format(v, floatfmt) if isinstance(v, float) else str(v) for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- figures
def nullity_figure(nullity: pd.DataFrame):
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(nullity.d, nullity.bound, "k--", label="bound max(0, D - d)")
    ax.plot(nullity.d, nullity.nullity, "o", label="nullity of timm PatchEmbed")
    ax.axvline(int(nullity.D.iloc[0]), color="grey", lw=0.8)
    ax.set(xlabel="embedding width d", ylabel="null-space dimension",
           title=f"Patch null space, D = {int(nullity.D.iloc[0])}")
    ax.legend(frameon=False)
    return fig


def permutation_figure(perm: pd.DataFrame, vit: pd.DataFrame):
    series = {
        "f(PX) vs P f(X)": perm.equivariance,
        "mean pool": perm.mean_pool,
        "P(X+E) jointly": perm.joint,
        "PX + E (break)": perm[~perm.identity].position_break,
        "ViT, no position": vit[vit.variant.str.startswith("no position")].logits,
        "ViT, learned pos.": vit[(vit.variant == "learned position, mean pool") & ~vit.identity].logits,
        "ViT, pos. permuted along": vit[vit.variant == "learned position, mean pool"].joint,
    }
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    floor = 1e-18  # exact zeros drawn at the floor of the log axis
    for k, values in enumerate(series.values()):
        v = values.clip(lower=floor)
        ax.plot([k] * len(v), v, "_", ms=14, alpha=0.5)
    ax.set_yscale("log")
    ax.set_xticks(range(len(series)), list(series), rotation=30, ha="right", fontsize=8)
    ax.set(ylabel="relative defect", title="Permutation identities (every permutation checked)")
    return fig


def pairs_figure(pairs: pd.DataFrame):
    fig, ax = plt.subplots(figsize=(5, 3.2))
    p = pairs.sort_values("tokens")
    ax.loglog(p.tokens, p.global_pairs, "o-", label="global N^2")
    ax.loglog(p.tokens, p.window_pairs, "s-", label="window N min(N, w^2)")
    ax.loglog(p.tokens, p.timm_shifted_unmasked, "x", label="timm shifted, unmasked")
    ax.set(xlabel="tokens N", ylabel="candidate query-key pairs", title="Attention pair counts")
    ax.legend(frameon=False, fontsize=8)
    return fig


def reachability_figure(dist: pd.DataFrame):
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for k, (arch, grp) in enumerate(dist.groupby("arch", sort=False)):
        worst = grp.worst.where(grp.worst != UNREACHABLE)
        jitter = 0.06 * (k - 3)  # archs with identical curves stay visible
        ax.plot(grp.chebyshev, worst + jitter, "-o", ms=3, label=arch)
        ax.plot(grp.chebyshev, grp.best.where(grp.best != UNREACHABLE) + jitter, ":", color=ax.lines[-1].get_color())
    top = int(max(dist.worst.max(), dist.best.max()))
    ax.set_yticks(range(top + 1))
    ax.set(xlabel="Chebyshev distance between two pixels (px)", ylabel="meet layer (solid worst, dotted best)",
           title="First layer at which one token sees both pixels")
    ax.legend(frameon=False, fontsize=7, ncol=2, title="curves offset slightly to stay visible",
              title_fontsize=7)
    return fig


# --------------------------------------------------------------------------- markdown
def markdown(tables: dict[str, pd.DataFrame], checks: list[Check], key: dict[str, float],
             figures: dict[str, str]) -> str:
    s = summary(checks)
    fam = pd.DataFrame([{"family": f, "checked": s[f"{f}.checked"], "held": s[f"{f}.held"]}
                        for f in sorted({c.family for c in checks})])
    failed = [c for c in checks if not c.held]
    perm, vit = tables["permutation"], tables["vit_permutation"]
    perm_sum = perm.groupby(["module", "n"], sort=False).apply(lambda g: pd.Series({
        "permutations": str(len(g)), "max f(PX) vs P f(X)": g.equivariance.max(),
        "max mean-pool": g.mean_pool.max(), "max joint": g.joint.max(),
        "min break (non-identity)": g[~g.identity].position_break.min()}), include_groups=False).reset_index()
    vit_sum = vit.groupby("variant", sort=False).apply(lambda g: pd.Series({
        "permutations": str(len(g)), "max logit change": g.logits.max(),
        "min logit change (non-identity)": g[~g.identity].logits.min(),
        "max with positions permuted along": g.joint.max()}), include_groups=False).reset_index()
    dist = tables["reachability"]
    cell = dist.assign(cell=lambda d: [f"{b}-{w}" if w != UNREACHABLE else f"{b}-never"
                                       for b, w in zip(d.best, d.worst, strict=True)])
    reach_pivot = cell.pivot(index="chebyshev", columns="arch", values="cell")[list(dict.fromkeys(dist.arch))]
    reach_pivot = reach_pivot.reset_index().rename(columns={"chebyshev": "distance px"})
    pairs = tables["pairs"]
    layers = tables["reachability_layers"]

    def fig(name: str, alt: str) -> str:
        return f"![{alt}]({figures[name]})\n\n*{CAPTION}*"

    out = [
        "# Interface checks (level 1: what the architectures can represent)",
        "",
        "Exact algebra on real timm modules with random weights; no training. Generated by "
        "`python -m pipeline.stages.interface` (DVC stage `interface`); every number below is recomputed "
        "from `params.yaml` on each run.",
        "",
        f"**{s['held']} of {s['checked']} checks held.** Each check is one explicit comparison (expected vs "
        "actual), listed in `data/interface/checks.csv`.",
        "",
        _md(fam),
        "",
    ]
    if failed:
        out += ["Failed checks:", "", _md(pd.DataFrame([c.row() for c in failed])), ""]
    out += [
        "## Key numbers", "", _md(pd.DataFrame({"quantity": list(key), "value": list(key.values())}), ".6g"), "",
        "## Null space of the patch embedding",
        "",
        "A patch of P x P x C = D values is mapped to d numbers by a linear map W (timm's `PatchEmbed.proj`, "
        "a stride-P convolution). rank(W) <= min(d, D), so nullity = D - rank >= max(0, D - d): for d < D "
        "different patches give the same token. Measured on randomly initialised timm modules (float64 SVD "
        "rank):",
        "",
        _md(tables["nullity"]),
        "",
        fig("nullity", "nullity against width"),
        "",
        "**Collision pairs.** A null-space vector of W, scaled to the largest step that keeps every pixel in "
        "[0, 1], is added to one patch of a random image in [0.25, 0.75]. The two images differ visibly; "
        "their tokens, and the logits of a whole timm ViT built on that embedding, agree to rounding. At "
        "d = D the embedding is injective (nullity 0): its least-responsive direction, at the same pixel "
        "budget, still moves the token far above the float32 tolerance.",
        "",
        _md(tables["collisions"].drop(columns=["D"]), ".2e"),
        "",
        "## Patchify = convolution",
        "",
        "Cutting the image into P x P patches (reshape) and multiplying by W plus bias equals timm's "
        "`Conv2d(kernel=P, stride=P)` in `PatchEmbed`:",
        "",
        _md(tables["patchify"], ".2e"),
        "",
        "## Permutation equivariance and the position signal",
        "",
        "Content-only token mixers (timm `Attention`, ViT `Block`; float64): permuting the input tokens "
        "permutes the outputs and leaves a mean-pooled readout unchanged. Adding an un-permuted absolute "
        "position signal E breaks the identity (relative defect ||f(PX+E) - P f(X+E)|| / ||f(X+E)||); "
        "permuting content and positions together restores it. Every permutation of the small token set, "
        "random permutations of the large one:",
        "",
        _md(perm_sum, ".2e"),
        "",
        "Whole timm ViTs (patches of the image permuted; all orders of the first few patches plus random "
        "orders of all). Without position embedding the logits are invariant, with a class token or a mean "
        "pool; with a learned one they change, and permuting the position embedding along restores them. "
        "Holds means a defect <= `exact_tol`, breaks means > `exact_tol` (float64 rounding is ~1e-16); "
        "the size of a break scales with the position signal: unit-variance E above, timm's initial "
        "learned embedding (std 0.02) here, so a swap of two patches moves the logits only slightly:",
        "",
        _md(vit_sum, ".2e"),
        "",
        fig("permutation", "permutation defects"),
        "",
        "## Candidate query-key pairs",
        "",
        "A candidate pair is an ordered (query, key) pair of real tokens whose attention weight can be "
        "non-zero. Global: N^2; windows of w x w tiling the grid: N min(N, w^2). For a *shifted* window "
        "timm still evaluates N w^2 entries but masks (-100 before the softmax) the pairs the cyclic roll "
        "brought together; the unmasked pairs are `((G/w - 1) w^2 + (w - s)^2 + s^2)^2` for a G x G grid "
        "and shift s. The timm columns are read off real `SwinTransformerBlock`s (window partition + "
        "`attn_mask`); where the window does not tile the grid timm pads, evaluating more entries than the "
        "formula while fewer real pairs remain (those rows are reported, not asserted equal). For grids up "
        f"to {MAX_JACOBIAN_TOKENS} tokens the read-off is also confirmed against the Jacobian sparsity of the block.",
        "",
        _md(pairs),
        "",
        fig("pairs", "pair counts"),
        "",
        "## Reachability (the prediction the training stages test)",
        "",
        "Each layer of each configured architecture is probed by autograd (float64, generic random "
        "weights): output token t depends on input token s where d y_t / d x_s is non-zero. Composing "
        "these boolean matrices gives, for every pair of input pixels, the first layer at which one token "
        "depends on both (0 = embedding or stem, a linear meeting; k = after block k). Cells: best-worst "
        "meet layer over all pixel pairs at that Chebyshev distance; `never` = some pair does not meet "
        "within the configured depth. Machine-readable: `reachability.csv`, `reachability.json` (also "
        "per offset in `data/interface/reachability_offsets.csv`).",
        "",
        _md(tables["reachability_summary"]),
        "",
        _md(reach_pivot),
        "",
        fig("reachability", "meet layer against distance"),
        "",
        "Per layer: measured dependencies vs the layer's definition (patch membership, all-to-all "
        "attention, the Swin window mask composed with patch merging; no closed form for ResNet blocks), "
        "and the gap between the smallest kept and the largest dropped relative Jacobian entry (masked Swin "
        "pairs keep an e^-100 weight; the cut sits far inside the gap):",
        "",
        _md(layers, ".2e"),
        "",
    ]
    if "position_contract" in tables:
        out += _position_section(tables["position_contract"], [c for c in checks if c.family == "position"])
    return "\n".join(out)


def _position_section(contract: pd.DataFrame, checks: list[Check]) -> list[str]:
    """The resolution contract (pipeline/resolution.py POSITION_CONTRACT) and its checks."""
    held = sum(c.held for c in checks)
    return [
        "## Position contract (resolution change at a fixed patch size)",
        "",
        "How each architecture's position signal is mapped when the image size, hence the token grid, changes "
        "(`pipeline/resolution.py`, `POSITION_CONTRACT`; the family is read off the module). Checked on the "
        f"configured architectures at the training size and at every `evaluation.resolution.sizes`: {held} of "
        f"{len(checks)} held (mapped logits equal the original's exactly at the training size; logit shapes, "
        "position-table rows and Swin's per-offset bias at the other sizes).",
        "",
        _md(contract),
        "",
    ]
