"""`budget` stage: each architecture's solved width, parameters and forward FLOPs, and Swin's real windows.

Writes ``<report>/architectures.csv`` and ``<report>/swin_layout.csv`` (per block: grid, window and shift as
timm built them) and ``<report>/README.md`` with both tables and the counting convention.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import torch

from pipeline import budget
from pipeline.archs import ARCHS
from pipeline.errors import StageError
from pipeline.families.swin import block_layout
from pipeline.io import write_text, write_with
from pipeline.models import build_model
from pipeline.stages.common import parse_stage, stage_main


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--report", type=Path, required=True)
    return p


def zoomed_tables(params) -> dict[int, tuple[pd.DataFrame, list[str]]]:
    """A task drawn at a zoom builds every model on its canvas (Params.for_task): per extra canvas size, its
    architecture table and the tasks drawn there."""
    canvases: dict[int, tuple] = {}
    for task in params.tasks.names:
        at = params.for_task(task)
        canvases.setdefault(at.geometry.image_size, (at, []))[1].append(task)
    return {size: (budget.architecture_table(at).drop(columns=["solve_seconds"]), tasks)
            for size, (at, tasks) in canvases.items() if size != params.geometry.image_size}


@stage_main
def main(argv: list[str] | None = None) -> None:
    args, params = parse_stage(parser(), argv)

    torch.set_num_threads(1)
    # the solve time is the machine's, not the architecture's: a committed output reproduces byte for byte without it
    table = budget.architecture_table(params).drop(columns=["solve_seconds"])
    layouts = pd.DataFrame([
        {"arch": arch, **block._asdict()}
        for arch in [name for name, info in ARCHS.items() if info.family == "swin"]
        for block in block_layout(build_model(arch, params, params.models.reference_classes))
    ])
    zoomed = zoomed_tables(params)
    for t in [table, *(z for z, _ in zoomed.values())]:
        mismatch = t[t.forward_flops != t.forward_flops_counted]
        if len(mismatch):  # the analytic formulas are the reported numbers: they must agree with the counter
            raise StageError(f"analytic FLOPs disagree with the counter for {', '.join(mismatch.arch)}")

    write_with(args.report / "architectures.csv", lambda p: table.to_csv(p, index=False, float_format="%.6g"))
    write_with(args.report / "swin_layout.csv", lambda p: layouts.to_csv(p, index=False))
    for size, (z, _) in zoomed.items():
        write_with(args.report / f"architectures_{size}px.csv", lambda p, z=z: z.to_csv(p, index=False,
                                                                                      float_format="%.6g"))
    shown = table.assign(deviation=table.deviation.map("{:+.1%}".format))
    m = params.models
    write_text(args.report / "README.md", "\n".join([
        "# Architectures: parameters and forward FLOPs per image (level 3: counting)",
        "",
        f"Widths solved for {m.param_target:,} trainable parameters (tolerance {m.param_tolerance:.0%}) with a "
        f"{m.reference_classes}-class head, on {params.geometry.image_size} px images "
        f"({params.geometry.patch_size} px ViT patches, {m.swin.patch_size} px Swin patches, "
        f"{m.swin.grid(local=True)[0]} px for the one-stage Swin pair). A control "
        "differs from its `partner` in one named thing (`pipeline/archs.py`); ablations that change no "
        "parameter shape reuse their reference's width (ViT position and stem variants: `vit`; "
        "`swin_noshift`: `swin`; `resnet_s1`, `resnet_aa`: `resnet`); `nomix` and `swin_local` solve their "
        "own. `flops_vs_partner` shows what a control's forward costs against its partner's.",
        "",
        "FLOPs: 2 per multiply-add of convolutions, linear layers and the attention products QK^T and AV; "
        "norms, softmax, activations, adds and pooling ignored. `forward_flops` is analytic and equals "
        "`forward_flops_counted` (torch FlopCounterMode, MATH attention) exactly; "
        "`forward_flops_counted_fused` is the same counter under the default CPU attention kernel, which "
        "it cannot see. Training = 3 x forward per image; a distillation teacher adds 1 x its forward.",
        "",
        shown.to_markdown(index=False),
        "",
        "## Swin windows as built (timm shrinks a window that covers its stage and drops the shift there)",
        "",
        layouts.to_markdown(index=False),
        "",
        *[line for size, (z, tasks) in zoomed.items() for line in (
            f"## At {size} px ({', '.join(tasks)}: `tasks.<task>.zoom`)", "",
            f"Every patch {size // params.geometry.image_size} x its size above, so the token grids and windows "
            f"are the same; widths solved again for {m.param_target:,} parameters "
            f"(`architectures_{size}px.csv`).", "",
            z.assign(deviation=z.deviation.map("{:+.1%}".format)).to_markdown(index=False), "")],
    ]))
    print(table[["arch", "width", "params", "forward_flops"]].to_string(index=False))


if __name__ == "__main__":
    raise SystemExit(main())
