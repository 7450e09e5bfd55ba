"""The one list of architectures: the family that builds each, its options, and what it isolates.

Light on purpose (no torch, no timm): :mod:`pipeline.config` validates architecture names against it, and
:mod:`pipeline.families` builds every row (refusing, at import, a family without an adapter or an option its
family does not read). A control is a *minimal pair* with its ``partner``: it differs from it in the one
thing ``isolates`` names (widths are solved so both match the parameter target). A new variant of an
existing family is one row here (and its ``train.archs`` entry in params.yaml).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
