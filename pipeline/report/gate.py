"""The gate of a ledger row: why its arms cannot be compared yet (an arm that did not learn, both at the ceiling or
at chance, a seed that never reached the criterion), so the row is "uninformative" instead of decided (the ledger)
and a second look knows which rows more seeds could open (the plan)."""

from __future__ import annotations

# Compared slices on which learning the task is itself the question (no held-out factor values).
LEARNING_SUBSETS = ("test", "slice/id")


# The subset of a row that compares how soon its arms learned, not how well: per seed the share of the step cap
# a run left unused when it reached ``train.criterion`` (1 - criterion step / cap; higher = sooner), so a pair
# at the accuracy ceiling still has a question (:func:`pipeline.report.measure.measure_speed`).
SPEED = "criterion/speed"
UNREACHED = "did not reach train.criterion"  # a speed row's gate reason: a seed with no time to criterion


def gate(row: dict, m: dict, tol: float) -> str:
    """Why a paired row cannot be decided ("" when it can); stated in docs/methods.md (Learnability):

    - compared out of distribution (an unseen factor value, or a slice an arm cannot reach): both arms must have
      learned on the row's ``learned_on`` slice (default in distribution), so generalisation is compared at
      matched learning, never a chance-level arm against a below-chance one;
    - compared in distribution, where learning is the question: a "+" row needs at least one arm that learned
      (the one that learned winning or losing is the finding), an "= 0" row needs both (two arms that did not
      learn are not equivalent, only equally stuck);
    - on the compared slice, never both at the ceiling or both at (or below) chance (accuracy only: an agreement
      row's low agreement with a wrong teacher is a student being right).

    Exact rows are not gated, nor floor rows (a floor prediction is about not learning) except one that names a
    ``learned_on`` slice: "at the floor where the arm cannot reach" says something only if the arm learned where
    it can (a model at chance everywhere sits at the floor across windows too, for another reason). A budget row
    (one arch, two budgets) needs no learned arm (learning under the longer budget is its question).

    On the compared slice, the arm the data favour must clear that slice's strongest shortcut floor by the
    row's margin (an "= 0" row: both arms), or a shortcut could explain the result (:func:`below_floor`)."""
    if row["kind"] == "floor" and row.get("learned_on") and m.get("seeds") and not m["in_a"] >= m["learn_at"]:
        return f"{row['a']} did not learn: {row['learned_on']} {m['in_a']:.3f} (needs >= {m['learn_at']:.3f})"
    if row["kind"] != "paired" or not m.get("seeds"):
        return ""
    reasons = list(m.get("unreached", ()))
    if row["finding"] != "budget":
        where = row.get("learned_on") or "in-distribution"
        # a base floor at 1.0 (a shortcut solves the slice): only a perfect arm counts, and the reason says why
        solved = "; a shortcut solves it, so learning cannot be told from it" if m["learn_at"] >= 1 - 1e-9 else ""
        missed = [f"{arm} did not learn: {where} {acc:.3f} (needs >= {m['learn_at']:.3f}{solved})"
                  for arm, acc in ((row["a"], m["in_a"]), (row["b"], m["in_b"])) if not acc >= m["learn_at"]]
        learning_is_the_question = row["subset"] in LEARNING_SUBSETS and row["expect"] == "+"
        if not learning_is_the_question or len(missed) == 2:
            reasons += missed
    reasons += below_floor(row, m)
    a, b = m["acc_a"], m["acc_b"]
    if row["subset"] == SPEED:  # how soon, not how well: a pair at the accuracy ceiling still has a question
        pass
    elif a >= 1 - tol and b >= 1 - tol:
        reasons.append(f"both at ceiling on {row['subset']}: {a:.3f} and {b:.3f}")
    elif a <= m["chance"] + tol and b <= m["chance"] + tol and not row["subset"].startswith("agree/"):
        # a budget pair at chance under both budgets too. Not an agreement row: agreeing with a teacher where it is
        # wrong less often than a random guess means being right there, which is learning, not its absence
        reasons.append(f"both at chance on {row['subset']}: {a:.3f} and {b:.3f} (chance {m['chance']:.3f})")
    return "; ".join(reasons)


def below_floor(row: dict, m: dict) -> list[str]:
    """The gate reason of a paired accuracy row whose winner does not clear the compared slice's shortcut floor by
    the row's margin: "a shortcut reaches <slice>: <baseline> <acc>". The winner of a "+" row is the arm its
    estimate favours: ``a`` as predicted, or ``b`` where ``b`` came out ahead (a failure is a win too: held to the
    floor, and not hidden behind the predicted winner's level); both arms of an "= 0" row. A speed row too, on
    its arms' test accuracy (how soon an arm learned says nothing about the factor if a shortcut reaches its
    level); not agreement rows (agreement, not accuracy); budget rows too (one arch under two budgets: a longer
    budget that only reaches a shortcut's level says nothing about the factor). The losing arm of a "+" row may
    sit below the floor (that is the finding)."""
    floor = m.get("floor", float("nan"))
    if floor != floor or row["subset"].startswith("agree/"):
        return []
    acc_a, acc_b = m.get("floor_acc_a", m["acc_a"]), m.get("floor_acc_b", m["acc_b"])  # on the floor's slice
    if row["expect"] != "+":
        arms = ((row["a"], acc_a), (row["b"], acc_b))
    else:
        arms = ((row["b"], acc_b),) if m.get("estimate", 0.0) < 0 else ((row["a"], acc_a),)
    need = floor + row["margin"]
    short = [f"{arm} {acc:.3f}" for arm, acc in arms if not acc >= need]
    if not short:
        return []
    return [f"a shortcut reaches {m.get('floor_slice', row['subset'])}: {m['floor_baseline']} {floor:.3f} "
            f"({', '.join(short)}; needs "
            f">= {need:.3f})"]


def why_short(reason: str) -> str:
    """An uninformative row's gate reason in a few words (the ledger has it whole): what stopped it first."""
    for says, short in (("a shortcut reaches", "below a shortcut floor"), ("did not learn", "an arm did not learn"),
                        ("at ceiling", "both at ceiling"), ("at chance", "both at chance")):
        if says in reason:
            return short
    return "uninformative"
