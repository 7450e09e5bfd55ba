"""`teacher` stage: train one teacher architecture on every distilled task, on a transfer set disjoint from
the students' images (``train_<distill.teacher_size>`` minus ``train_<train.size>``), and record its provenance.

Outputs per task: ``<out>/<task>/weights.pt`` (the weights students load, also logged to MLflow),
``provenance.json`` (what students cite and verify: run id, artifact URI, checkpoint sha256, transfer set, data
hashes, accuracy and disagreement with the true labels on the students' images, compute), ``metrics.json`` and
``predictions.npz``.
"""

from __future__ import annotations

import argparse

from pipeline.stages.common import add_run_paths, parse_stage, quiet_lightning, stage_main


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--arch", required=True, help="teacher architecture (one of distill.teachers)")
    add_run_paths(p)
    return p


@stage_main
def main(argv: list[str] | None = None) -> None:
    args, params = parse_stage(parser(), argv, {"arch": "distill.teachers"})
    quiet_lightning()
    from pipeline.experiment import execute, prune
    from pipeline.grid import RunKey, specs_for

    d, r = params.distill, params.train.recipe
    keys = [RunKey(task, args.arch, d.teacher_seed, d.teacher_size - params.train.size, r.steps, r.budget_mode)
            for task in d.tasks]
    specs = specs_for("teacher", keys, args.data, args.slices, args.out, args.ckpt)
    for m in execute(specs, params, "teacher", f"teacher/{args.arch}", args.ckpt):
        print(f"teacher/{args.arch}/{m['task']}: test acc {m['test_acc']:.3f}, disagrees with the true label on "
              f"{m['student_train']['disagreement']:.1%} of the students' images")
    prune(args.out, [s.out_dir for s in specs])  # after success: a failed stage changes nothing


if __name__ == "__main__":
    raise SystemExit(main())
