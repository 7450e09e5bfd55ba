"""The prediction ledger: what the architecture's structure predicts, fixed before any accuracy is read.

:func:`predictions` is a function of params and interface-stage outputs only (the reachability record and
the budget stage's solved widths), never of a measured accuracy, so the ledger cannot be tuned to the
results. :func:`judge` then sets each prediction beside the measured outcome and its interval:

- ``equals``: the measured accuracy should equal ``value`` (e.g. chance). held if the interval contains it
  and is at most ``decisive_width`` wide; inconclusive if it contains it but is wider; failed otherwise.
- ``greater``: ``arch`` should beat ``other`` on the metric. The difference's interval (half-widths added in
  quadrature) above 0: held; below 0: failed; straddling 0: inconclusive.
- ``untestable``: the reason is stated (e.g. every pair is reachable at this depth, so reachability forbids
  nothing), and no result is invented.

Intervals: :func:`pipeline.report.aggregate.ledger_interval` (seeds and test-set sampling error).
Levels: ``exact`` (level-1 algebra: a violation would be a bug) vs ``qualitative`` (a structural expectation
or a literature finding that training may or may not reproduce at our scale).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import pandas as pd

from pipeline.config import Params
from pipeline.report.aggregate import ledger_interval

VIT_PATCH_ARCHS = ("vit", "vit_nopos", "vit_sincos", "deit", "deit_vit")  # a linear P x P patch projection


@dataclass(frozen=True)
class Prediction:
    """One ledger entry. ``metric`` is a slice key of metrics.json (``test``, ``slice/...``) or
    ``shift_consistency``; ``other`` is the arch a ``greater`` prediction compares against."""

    id: str
    claim: str
    level: str  # "exact" | "qualitative"
    basis: str  # what the prediction follows from
    kind: str  # "equals" | "greater" | "untestable"
    task: str = ""
    arch: str = ""
    metric: str = "test"
    value: float = math.nan
    other: str = ""
    reason: str = ""  # why untestable


def _cell_range(d: int, p: int) -> tuple[int, int]:
    """Pixel Chebyshev distances between any pixels of two marks in cells ``d`` cells apart (cell = P px)."""
    return max(1, (d - 1) * p + 1), (d + 1) * p - 1


def reachability_predictions(params: Params, reach: dict | None, archs: list[str]) -> list[Prediction]:
    """Relation task: a mark pair the mask graph cannot connect within the depth is at chance (exact).

    reach: data/interface/reachability.json (per arch: ``by_distance`` rows with ``chebyshev`` in px and
    ``reachable`` = fraction of pixel pairs that meet). A cell distance d is *unreachable* when no pixel pair
    in its range meets, *connected* when every one does. Connected distances forbid nothing: no prediction.
    """
    if "relation" not in params.train.tasks:
        return []
    if not reach:
        return [Prediction("reach", "reachability limits relation accuracy", "exact", "interface reachability",
                           "untestable", task="relation", reason="data/interface/reachability.json missing")]
    p, g = params.geometry.patch_size, params.geometry.grid
    out = []
    for arch in archs:
        rec = reach.get("archs", {}).get(arch)
        if rec is None:
            continue
        frac = {int(r["chebyshev"]): float(r["reachable"]) for r in rec["by_distance"]}
        connected = []
        for d in range(1, g):
            lo, hi = _cell_range(d, p)
            vals = [frac.get(c, 0.0) for c in range(lo, hi + 1) if c in frac]
            if vals and max(vals) == 0.0:
                out.append(Prediction(
                    f"reach.{arch}.d{d}", f"{arch} is at chance (0.5) on relation marks {d} cells apart",
                    "exact", f"interface reachability: no pixel pair {lo}-{hi} px apart meets within depth "
                    f"{rec['depth']}", "equals", "relation", arch, f"slice/distance_tokens={d}", 0.5))
            elif vals and min(vals) == 1.0:
                connected.append(d)
        if connected:
            out.append(Prediction(
                f"reach.{arch}", f"{arch}: reachability bounds relation accuracy at distances {connected} cells",
                "exact", f"interface reachability: every pixel pair meets by layer {rec['layers_for_all_pairs']} "
                f"of {rec['depth']}", "untestable", "relation", arch,
                reason="not testable at these params: every mark pair is connectable within the depth, so "
                       "reachability forbids nothing"))
    return out


def collision_predictions(params: Params, widths: dict[str, int] | None, archs: list[str]) -> list[Prediction]:
    """A patch projection narrower than P*P*C maps some distinct patches to one token (exact, level 1)."""
    big_d = params.geometry.patch_size ** 2 * params.geometry.channels
    out = []
    for arch in archs:
        if arch not in VIT_PATCH_ARCHS:
            continue
        d = (widths or {}).get("deit" if arch.startswith("deit") else arch)
        if d is None:
            reason = "width unknown (reports/budget/architectures.csv missing)"
        elif d >= big_d:
            reason = (f"not testable: embedding width d={d} >= P*P*C={big_d}, so the trained projection is "
                      "generically injective and no collision pair exists")
        else:
            reason = (f"holds by algebra (null space of dimension >= {big_d - d}, confirmed by the interface "
                      "stage on random weights); not testable on trained models here: main-grid runs keep no "
                      "weights")
        out.append(Prediction(f"collision.{arch}", f"{arch}: two different images give identical predictions",
                              "exact", "null space of the linear patch embedding", "untestable", arch=arch,
                              reason=reason))
    return out


def predictions(params: Params, reach: dict | None = None, widths: dict[str, int] | None = None) -> list[Prediction]:
    """Every ledger entry for this configuration (a function of params + interface outputs only)."""
    tasks = set(params.train.tasks)
    archs = list(params.train.archs)
    students = dict(params.distill.students)
    has = set(archs)
    out: list[Prediction] = []
    if "arrangement" in tasks and "vit_nopos" in has:
        out.append(Prediction(
            "chance.vit_nopos.arrangement", "vit_nopos is exactly at chance (0.5) on arrangement", "exact",
            "interface: no-position ViT with mean readout has permutation-invariant logits; arrangement "
            "twins are exact patch permutations with opposite labels", "equals", "arrangement", "vit_nopos",
            "test", 0.5))
    out += reachability_predictions(params, reach, archs)
    out += collision_predictions(params, widths, archs + [s for s in students if s not in has])

    def greater(pid: str, claim: str, basis: str, task: str, a: str, b: str, metric: str = "test") -> None:
        if task in tasks and a in has | set(students) and b in has | set(students):
            out.append(Prediction(pid, claim, "qualitative", basis, "greater", task, a, metric, other=b))

    greater("ood.resnet_vs_vit", "resnet beats vit on alignment offsets outside the training range",
            "convolution is translation-equivariant; a patch projection is not", "alignment", "resnet", "vit",
            "slice/ood")
    greater("shift.resnet_vs_vit", "resnet's prediction survives a 1-px shift more often than vit's",
            "convolution is translation-equivariant; a patch projection is not", "alignment", "resnet", "vit",
            "shift_consistency")
    greater("ood.resnet_vs_vit.scale", "resnet beats vit on object sizes unseen in training",
            "multi-scale receptive fields vs a fixed patch grid", "scale", "resnet", "vit", "slice/ood")
    greater("window.swin_vs_noshift", "swin beats swin_noshift when the marks sit in different windows",
            "shifted windows connect neighbouring windows in fewer layers (interface reachability)",
            "relation", "swin", "swin_noshift", "slice/window=cross")
    greater("position.vit_vs_nopos", "vit (learned position) beats vit_nopos on arrangement",
            "only a position signal breaks permutation invariance", "arrangement", "vit", "vit_nopos")
    dtasks = [t for t in params.distill.tasks if t in tasks]
    for t in dtasks:
        for student, teacher in students.items():
            if teacher == "resnet":
                greater(f"distill.{student}_vs_vit.{t}", f"{student} (distilled from resnet) beats label-only "
                        f"vit on {t}", "DeiT: a convnet teacher transfers its bias", t, student, "vit")
        cnn = [s for s, te in students.items() if te == "resnet"]
        vitt = [s for s, te in students.items() if te != "resnet"]
        if cnn and vitt:
            greater(f"distill.teacher_type.{t}", f"{cnn[0]} (CNN teacher) beats {vitt[0]} (ViT teacher) on {t}",
                    "DeiT: a convnet teacher beats a transformer teacher", t, cnn[0], vitt[0])
    return out


# --------------------------------------------------------------------------- judging
def measure(runs: pd.DataFrame, slices: pd.DataFrame, task: str, arch: str, metric: str,
            level: float) -> dict | None:
    """The measured interval of one arch on one task's metric (main grid, students included), or None."""
    if metric == "shift_consistency":
        sub = runs[(runs.source == "runs") & (runs.task == task) & (runs.arch == arch)]
        values, n = sub["shift_consistency"].to_numpy(), int(sub["n_test"].max()) if len(sub) else 0
    else:
        sub = slices[(slices.source == "runs") & (slices.task == task) & (slices.arch == arch)
                     & (slices.slice == metric)]
        values, n = sub["acc"].to_numpy(), int(sub["n"].max()) if len(sub) else 0
    if not len(sub):
        return None
    return ledger_interval(values, n, level)


def verdict(pred: Prediction, a: dict | None, b: dict | None, decisive_width: float) -> tuple[str, float, float,
                                                                                              float]:
    """(verdict, estimate, lo, hi): the estimate is the measured mean (equals) or the difference (greater)."""
    if pred.kind == "untestable":
        return "untestable", math.nan, math.nan, math.nan
    if a is None or (pred.kind == "greater" and b is None):
        return "not run", math.nan, math.nan, math.nan
    if pred.kind == "equals":
        lo, hi = a["ci_lo"], a["ci_hi"]
        if not lo <= pred.value <= hi:
            return "failed", a["mean"], lo, hi
        return ("held" if hi - lo <= decisive_width else "inconclusive"), a["mean"], lo, hi
    diff = a["mean"] - b["mean"]
    half = math.hypot(a["half"], b["half"])
    lo, hi = diff - half, diff + half
    return ("held" if lo > 0 else "failed" if hi < 0 else "inconclusive"), diff, lo, hi


def judge(preds: list[Prediction], runs: pd.DataFrame, slices: pd.DataFrame, level: float,
          decisive_width: float) -> pd.DataFrame:
    """One ledger row per prediction: the prediction, the measured estimate with its interval, the verdict."""
    rows = []
    for pred in preds:
        a = measure(runs, slices, pred.task, pred.arch, pred.metric, level) if pred.kind != "untestable" else None
        b = measure(runs, slices, pred.task, pred.other, pred.metric, level) if pred.kind == "greater" else None
        v, est, lo, hi = verdict(pred, a, b, decisive_width)
        rows.append({**asdict(pred), "verdict": v, "estimate": est, "ci_lo": lo, "ci_hi": hi,
                     "seeds": a["n"] if a else 0})
    return pd.DataFrame(rows)


def agreement_rate(ledger: pd.DataFrame) -> dict[str, int | float]:
    """Counts per verdict and the share of decided predictions (held or failed) that held."""
    counts = {v: int((ledger.verdict == v).sum()) if len(ledger) else 0
              for v in ("held", "failed", "inconclusive", "untestable", "not run")}
    decided = counts["held"] + counts["failed"]
    return {**counts, "held_of_decided": counts["held"] / decided if decided else math.nan}


# --------------------------------------------------------------------------- literature anchors (docs/design.md §9)
# (anchor, what the paper reports, task our comparison uses ("distill" = mean over distill.tasks), archs)
ANCHORS = (
    ("ViT paper, position ablation (ViT-B/16, ImageNet 5-shot linear)", "none 0.614, 1D 0.642, 2D 0.640",
     "natural", ("vit_nopos", "vit", "vit_sincos")),
    ("DeiT (ImageNet-1k, 300 epochs), Ti", "no distillation 72.2, distillation token 74.5; a convnet teacher "
     "beats a transformer teacher (DeiT-B)", "distill", ("vit", "deit", "deit_vit")),
    ("Swin-T ablation (ImageNet)", "no shift 80.2, shifted 81.3", "natural", ("swin_noshift", "swin")),
    ("Small data, CIFAR-10, ~800k-param ViT", "no position ~80%, learned 86.5%", "natural", ("vit_nopos", "vit")),
)


def _fmt(mean: float, lo: float, hi: float) -> str:
    return f"{mean:.3f}" + (f" [{lo:.3f}, {hi:.3f}]" if hi == hi else " (1 seed)")


def anchors_table(acc: pd.DataFrame, distill_tasks: list[str], interface_key: dict) -> pd.DataFrame:
    """Literature anchors beside what our (far smaller) runs show; ``acc`` is the accuracy table."""
    rows = []
    for anchor, paper, task, archs in ANCHORS:
        parts = []
        for arch in archs:
            if task == "distill":
                sub = acc[(acc.arch == arch) & acc.task.isin(distill_tasks)]
                if len(sub):  # a plain mean over tasks: no interval claimed across different tasks
                    parts.append(f"{arch} {sub['mean'].mean():.3f} (mean of {len(sub)} tasks)")
            else:
                sub = acc[(acc.arch == arch) & (acc.task == task)]
                if len(sub):
                    r = sub.iloc[0]
                    parts.append(f"{arch} {_fmt(r['mean'], r['ci_lo'], r['ci_hi'])}")
        where = "controlled tasks " + ", ".join(distill_tasks) if task == "distill" else task
        rows.append({"anchor": anchor, "paper": paper, "ours": "; ".join(parts) or "not run", "our_task": where})
    pairs = interface_key.get("pairs_224_p16_global")
    rows.append({"anchor": "Pair counts at 224 px, P=16", "paper": "196 tokens, 38,416 global pairs",
                 "ours": f"{pairs:,.0f} global pairs (analytic count, interface stage)" if pairs else "not run",
                 "our_task": "interface"})
    return pd.DataFrame(rows)
