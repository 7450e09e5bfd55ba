"""The one list of architectures: what each reads from ``params.yaml`` and what it isolates.

Light on purpose (no torch, no timm): :mod:`pipeline.config` validates architecture names against it, and
:mod:`pipeline.models` builds every name in it. A control is a *minimal pair* with its ``partner``: it
differs from it in the one thing ``isolates`` names (widths are solved so both match the parameter target).
"""

from __future__ import annotations

from typing import NamedTuple


class ArchInfo(NamedTuple):
    section: str  # the models.<section> of params.yaml it reads (dvc.yaml declares exactly that)
    family: str  # 'vit' | 'deit' | 'swin' | 'resnet' | 'nomix': the builder and the analytic FLOP layout
    isolates: str  # one line: what it differs in from its partner
    partner: str | None  # the architecture it is a control of (None: a reference)


ARCHS: dict[str, ArchInfo] = {
    "vit": ArchInfo("vit", "vit", "reference: patchify, learned 1D position, global attention, mean readout",
                    None),
    "vit_nopos": ArchInfo("vit", "vit", "no position signal (permutation-invariant by construction)", "vit"),
    "vit_sincos": ArchInfo("vit", "vit", "fixed 2D sin-cos position instead of a learned one", "vit"),
    "vit_sincos_init": ArchInfo("vit", "vit", "the sin-cos table made learnable (fixed vs learned, same "
                                "initial geometry)", "vit_sincos"),
    "vit_convstem": ArchInfo("vit", "vit", "overlapping stride-2 3x3 conv stem instead of the patchify "
                             "projection (same token grid and width)", "vit"),
    "vit_overlap": ArchInfo("vit", "vit", "overlapping patches (kernel P+2, stride P) instead of disjoint "
                            "ones (same token grid and width)", "vit"),
    "deit": ArchInfo("vit", "deit", "a teacher's hard labels through the distillation token", "deit_labels"),
    "deit_labels": ArchInfo("vit", "deit", "class + distillation tokens and two-head readout, labels only "
                            "(no teacher)", "vit"),
    "swin": ArchInfo("swin", "swin", "reference: shifted windows, patch merging, relative position bias",
                     None),
    "swin_noshift": ArchInfo("swin", "swin", "windows never shifted", "swin"),
    "swin_local": ArchInfo("swin", "swin", "one stage, no patch merging: tokens in different windows never "
                           "interact", "swin_noshift"),
    "resnet": ArchInfo("resnet", "resnet", "reference: CNN, stride-1 stem, stride-2 stages", None),
    "resnet_s1": ArchInfo("resnet", "resnet", "every stride 1: no subsampling, shift-equivariant up to the "
                          "border", "resnet"),
    "resnet_aa": ArchInfo("resnet", "resnet", "anti-aliased downsampling (BlurPool before every stride 2)",
                          "resnet"),
    "nomix": ArchInfo("vit", "nomix", "no token mixing: per-token MLP blocks in place of attention",
                      "vit_nopos"),
}
