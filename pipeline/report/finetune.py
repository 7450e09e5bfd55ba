"""The fine-tuning stage's page: per (task, arch), accuracy at the training size, evaluated only at another size
and fine-tuned there (:mod:`pipeline.finetune`), with seed-level intervals."""

from __future__ import annotations

import pandas as pd

from pipeline.config import Params
from pipeline.report.stats import seed_interval


def table(results: list[dict], trained_acc: dict[str, float], level: float) -> pd.DataFrame:
    """Per (task, arch): seeds, position code, test accuracy at the training size (``trained_acc``: run name ->
    its recorded test accuracy), evaluation only at ``size`` and after fine-tuning there, with Student-t
    intervals over seeds, and the fine-tuning gain over evaluation only."""
    cols = ["task", "arch", "position", "seeds", "size", "trained", "trained_lo", "trained_hi", "eval_only",
            "eval_only_lo", "eval_only_hi", "finetuned", "finetuned_lo", "finetuned_hi", "gain", "gain_lo",
            "gain_hi", "skipped"]
    rows = []
    frame = pd.DataFrame(results)
    if frame.empty:
        return pd.DataFrame(columns=cols)
    for (task, arch), g in frame.groupby(["task", "arch"], sort=True):
        row = {"task": task, "arch": arch, "position": g.position.iloc[0], "seeds": len(g), "size": g["size"].iloc[0]}
        if "skipped" in g and g.skipped.notna().all():
            rows.append({**row, "skipped": g.skipped.iloc[0]})
            continue
        per_seed = {"trained": g.run.map(trained_acc).to_numpy(float), "eval_only": g.eval_only_acc.to_numpy(float),
                    "finetuned": g.finetuned_acc.to_numpy(float)}
        per_seed["gain"] = per_seed["finetuned"] - per_seed["eval_only"]
        for name, values in per_seed.items():  # accuracies stay in [0, 1], the gain (a difference) in [-1, 1]
            b = seed_interval(values, level, bounds=(-1.0, 1.0) if name == "gain" else (0.0, 1.0))
            row |= {name: b["estimate"], f"{name}_lo": b["ci_lo"], f"{name}_hi": b["ci_hi"]}
        rows.append(row)
    return pd.DataFrame(rows, columns=cols)


def markdown(tab: pd.DataFrame, params: Params) -> str:
    """The stage's page: what was done, then one row per (task, arch)."""
    ft, level = params.finetune, params.report.confidence
    head = "# Fine-tuning at another resolution\n\n"
    if not ft.tasks:
        return head + ("Off in this profile (`finetune.tasks` is empty). `params-natural.yaml` trains CIFAR-10 at "
                       "32 px and fine-tunes at 48 px; any task can be listed.\n")

    def cell(r, name: str) -> str:
        if pd.isna(r[name]):
            return "-"
        ci = "" if pd.isna(r[f"{name}_lo"]) else f" [{r[f'{name}_lo']:.3f}, {r[f'{name}_hi']:.3f}]"
        return f"{r[name]:+.3f}{ci}" if name == "gain" else f"{r[name]:.3f}{ci}"

    px = {t: (params.for_task(t).geometry.image_size, params.for_task(t).finetune.size) for t in ft.tasks}
    (trained, size), zoomed = px[ft.tasks[0]], len(set(px.values())) > 1  # tasks at other zooms: sizes per row
    view = pd.DataFrame([{"task": r.task, "arch": r.arch, "position": r.position, "seeds": r.seeds,
                          **({"trained at / mapped to (px)": "{} / {}".format(*px[r.task])} if zoomed else {}),
                          "test acc, trained size" if zoomed else f"test acc at {trained} px": cell(r, "trained"),
                          "mapped, evaluated only" if zoomed else f"at {size} px, evaluated only": cell(r, "eval_only"),
                          "mapped, fine-tuned" if zoomed else f"at {size} px, fine-tuned": cell(r, "finetuned"),
                          "gain from fine-tuning": cell(r, "gain") if pd.isna(r.skipped) else f"skipped: {r.skipped}"}
                         for _, r in tab.iterrows()])
    at, to = ("its task's canvas", "finetune.size times its task's zoom") if zoomed else (f"{trained} px", f"{size} px")
    text = (f"Every main-grid run of {', '.join(ft.tasks)} (trained at {at}) mapped to {to} by the position "
            f"contract (`pipeline/resolution.py`), scored on the test split resized to that size "
            f"({params.evaluation.resolution.image_resize}), then fine-tuned {ft.steps} steps there "
            f"on its own training images (batch {ft.batch_size}, AdamW lr {ft.lr:g} after {ft.warmup_steps} "
            f"warm-up steps, cosine to 0; the recipe's weight decay, label smoothing and gradient clip; the task's "
            f"views, if any, scaled to the size) and scored again. Seed means with {level:.0%} Student-t "
            "intervals over seeds; the gain is fine-tuned minus evaluated only, per seed.\n\n")
    return head + text + (view.to_markdown(index=False, disable_numparse=True) if not view.empty else "_no run_") + "\n"
