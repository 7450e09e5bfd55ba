"""The one list of architectures: the family that builds each, its options, and what it isolates; and the
``models.<section>`` schemas they read (:data:`SECTIONS`, registered into :mod:`pipeline.config`).

Light on purpose (no torch, no timm): :mod:`pipeline.config` validates architecture names and the model
sections against it without loading a model library (a family module costs seconds of torch and timm), and
:mod:`pipeline.families` builds every row (refusing, at import, a family without an adapter or an option its
family does not read). A control is a *minimal pair* with its ``partner``: it differs from it in the one
thing ``isolates`` names (widths are solved so both match the parameter target). A new variant of an
existing family is one row here (and its ``train.archs`` entry in params.yaml).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import Field, model_validator

from pipeline.sections import Count, ModelSection, PosFloat, PosInt, Section


@dataclass(frozen=True)
class ArchInfo:
    section: str  # the models.<section> of params.yaml it reads (dvc.yaml declares exactly that)
    family: str  # its adapter in pipeline.families: builder, FLOPs, tokens, token graph, resolution
    isolates: str  # one line: what it differs in from its partner
    partner: str | None  # the architecture it is a control of (None: a reference)
    description: str  # what it is, in the budget table
    options: dict[str, Any] = field(default_factory=dict)  # its family builder's keyword arguments
    width_of: str | None = None  # reuse this architecture's solved width (an ablation changes one thing only)


ARCHS: dict[str, ArchInfo] = {
    "vit": ArchInfo("vit", "vit", "reference: patchify, learned 1D position, global attention, mean readout",
                    None, "ViT, learned 1D position, mean readout"),
    "vit_nopos": ArchInfo("vit", "vit", "no position signal (permutation-invariant by construction)", "vit",
                          "ViT, no position, mean readout", {"position": "none"}, "vit"),
    "vit_sincos": ArchInfo("vit", "vit", "fixed 2D sin-cos position instead of a learned one", "vit",
                           "ViT, fixed 2D sin-cos position, mean readout", {"position": "sincos"}, "vit"),
    "vit_sincos_init": ArchInfo("vit", "vit", "the sin-cos table made learnable (fixed vs learned, same "
                                "initial geometry)", "vit_sincos",
                                "ViT, learned position initialised to the 2D sin-cos table",
                                {"position": "sincos_init"}, "vit"),
    "vit_convstem": ArchInfo("vit", "vit", "overlapping stride-2 3x3 conv stem instead of the patchify "
                             "projection (same token grid and width)", "vit", "ViT, stride-2 3x3 conv stem",
                             {"embed": "convstem"}, "vit"),
    "vit_overlap": ArchInfo("vit", "vit", "overlapping patches (kernel P+2, stride P) instead of disjoint "
                            "ones (same token grid and width)", "vit",
                            "ViT, overlapping (P+2)x(P+2) stride-P patches", {"embed": "overlap"}, "vit"),
    "vit_hybrid": ArchInfo("vit", "vit", "residual ResNet blocks (timm HybridEmbed, 1x1 patches on their map) "
                           "instead of a plain conv stem (same downsampling and token grid)", "vit_convstem",
                           "ViT hybrid: ResNet stage + 1x1 patches", {"embed": "hybrid"}),
    "deit": ArchInfo("vit", "vit", "a teacher's hard labels through the distillation token", "deit_labels",
                     "DeiT, class + distillation tokens, learned 1D position", {"distilled": True}),
    "deit_labels": ArchInfo("vit", "vit", "class + distillation tokens and two-head readout, labels only "
                            "(no teacher)", "vit", "DeiT trained on labels only", {"distilled": True}, "deit"),
    "swin": ArchInfo("swin", "swin", "reference: shifted windows, patch merging, relative position bias",
                     None, "Swin, shifted windows", {"shift": True}),
    "swin_noshift": ArchInfo("swin", "swin", "windows never shifted", "swin", "Swin, windows never shifted",
                             {"shift": False}, "swin"),
    "swin_local": ArchInfo("swin", "swin", "one stage, no patch merging: tokens in different windows never "
                           "interact", "swin_noshift", "Swin, one stage, fixed windows",
                           {"shift": False, "local": True}),
    "swin_local_shift": ArchInfo("swin", "swin", "windows shifted every other block, in one stage (no patch "
                                 "merging): the shift alone joins windows", "swin_local",
                                 "Swin, one stage, shifted windows", {"shift": True, "local": True}, "swin_local"),
    "resnet": ArchInfo("resnet", "resnet", "reference: CNN, stride-1 stem, stride-2 stages", None,
                       "ResNet (BasicBlock), 3x3 stride-1 stem, no max-pool"),
    "resnet_s1": ArchInfo("resnet", "resnet", "every stride 1: no subsampling, shift-equivariant up to the "
                          "border", "resnet", "ResNet, every stride 1", {"downsample": "none"}, "resnet"),
    "resnet_aa": ArchInfo("resnet", "resnet", "anti-aliased downsampling (BlurPool before every stride 2)",
                          "resnet", "ResNet, BlurPool downsampling", {"downsample": "blur"}, "resnet"),
    "nomix": ArchInfo("vit", "vit", "no token mixing: per-token MLP blocks in place of attention", "vit_nopos",
                      "patch embedding, per-token MLP blocks, mean readout", {"position": "none", "mix": False}),
    "mixer": ArchInfo("vit", "mixer", "global token mixing by an MLP over tokens (fixed weights per position) "
                      "instead of attention computed from content", "vit", "MLP-Mixer, same depth as the ViT"),
    "convmixer": ArchInfo("vit", "convmixer", "a local depthwise-conv body (3x3 on the token grid) instead of "
                          "global attention, same patch projection", "vit",
                          "ConvMixer: patchify, depthwise 3x3 + pointwise blocks", {"kernel": 3}),
}


# --------------------------------------------------------------------------- the models.<section> schemas
class ViTParams(ModelSection):
    depth: Count
    num_heads: Count
    mlp_ratio: PosFloat


class SwinLocal(Section):
    """The one-stage pair's own grid (``swin_local``, ``swin_local_shift``); its window spans the same pixels."""

    patch_size: PosInt
    window_size: PosInt


class SwinParams(ModelSection):
    patch_size: PosInt
    window_size: PosInt
    depths: list[Count]  # blocks per stage; a patch merging between stages
    num_heads: list[Count]  # one entry per stage
    mlp_ratio: PosFloat
    local: SwinLocal | None = None  # None: the one-stage pair keeps patch_size and window_size

    def grid(self, local: bool) -> tuple[int, int]:
        """(patch px, window in tokens) of the two-stage model, or of the one-stage pair."""
        return (self.local.patch_size, self.local.window_size) if local and self.local else (
            self.patch_size, self.window_size)

    def zoomed(self, k: int) -> SwinParams:
        """Patches of ``k`` x the px (the one-stage pair's too): the same token grid and windows."""
        local = self.local and self.local.model_copy(update={"patch_size": k * self.local.patch_size})
        return self.model_copy(update={"patch_size": k * self.patch_size, "local": local})

    @model_validator(mode="after")
    def _one_head_count_per_stage(self) -> SwinParams:
        if len(self.depths) != len(self.num_heads):
            raise ValueError(f"num_heads: has {len(self.num_heads)} entries, depths has {len(self.depths)}")
        return self

    def check_size(self, params, key: str, size: int) -> None:
        """Whole patch mergings at every evaluated size (and whole patches of the one-stage pair)."""
        s = self
        if size % (s.patch_size * 2 ** (len(s.depths) - 1)):
            raise ValueError(f"{key}: {size} is not a multiple of {s.patch_size * 2 ** (len(s.depths) - 1)} (Swin "
                             f"patch {s.patch_size} and {len(s.depths) - 1} patch mergings)")
        if s.local and size % s.local.patch_size:
            raise ValueError(f"{key}: {size} is not a multiple of models.swin.local.patch_size "
                             f"{s.local.patch_size}")

    def check_against(self, params) -> None:
        """The window geometry timm would silently pad, shrink or leave unshifted."""
        g, s = params.geometry, self
        if g.image_size % s.patch_size:
            raise ValueError(
                f"models.swin.patch_size: {s.patch_size} does not divide geometry.image_size {g.image_size}"
            )
        grid = g.image_size // s.patch_size
        if s.window_size > grid:
            raise ValueError(
                f"models.swin.window_size: {s.window_size} is larger than the token grid {grid}x{grid}"
            )
        if grid % s.window_size:
            raise ValueError(
                f"models.swin.window_size: {s.window_size} does not divide the token grid {grid}"
            )
        if grid % (2 ** (len(s.depths) - 1)):
            raise ValueError(
                f"models.swin.depths: {len(s.depths)} stages halve the {grid}x{grid} grid too often"
            )
        # timm pads a window that does not divide a later stage's grid, and shrinks it (turning the shift off)
        # where it covers the whole grid; refuse the first, and a layout where no block shifts at all
        # (then swin and swin_noshift would be the same model).
        stage_grids = [grid // 2**i for i in range(len(s.depths))]
        for i, res in enumerate(stage_grids):
            if res > s.window_size and res % s.window_size:
                raise ValueError(
                    f"models.swin.window_size: {s.window_size} does not divide stage {i}'s grid {res} "
                    "(timm would pad it)"
                )
        if not any(res > s.window_size and d >= 2 for res, d in zip(stage_grids, s.depths, strict=True)):
            raise ValueError(
                f"models.swin.window_size: {s.window_size} leaves no block with a shifted window "
                f"(stage grids {stage_grids}, depths {s.depths}): swin would equal swin_noshift"
            )
        if (loc := s.local) is not None:
            # One stage: the window must tile the grid and leave room to shift, and span the pixels of the
            # two-stage window, which relation's window slices (near/cross pairs) are cut by.
            key, lgrid = "models.swin.local", g.image_size // loc.patch_size
            if g.image_size % loc.patch_size:
                raise ValueError(f"{key}.patch_size: {loc.patch_size} does not divide geometry.image_size "
                                 f"{g.image_size}")
            if lgrid % loc.window_size or lgrid <= loc.window_size:
                raise ValueError(f"{key}.window_size: {loc.window_size} must divide the {lgrid}x{lgrid} token grid "
                                 "and be smaller than it (else swin_local_shift never shifts)")
            if loc.patch_size * loc.window_size != s.patch_size * s.window_size:
                raise ValueError(f"{key}: a window of {loc.window_size} x {loc.patch_size} px, not the "
                                 f"{s.window_size} x {s.patch_size} px of models.swin (relation's window slices)")


class ResNetParams(ModelSection):
    # BasicBlocks per stage; channels width * 2**stage; 3 stages (16 -> 8 -> 4 px) like the CIFAR ResNets.
    # At most 4 stages: timm's ResNet turns further stages into dilation instead of downsampling.
    layers: Annotated[list[PosInt], Field(min_length=1, max_length=4)]


# The models.<section> each architecture's ``section`` names, in params.yaml order.
SECTIONS: dict[str, type[ModelSection]] = {"vit": ViTParams, "swin": SwinParams, "resnet": ResNetParams}
