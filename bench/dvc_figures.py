"""What DVC costs around the pipeline: a no-op ``dvc repro``'s time, and whether a report-only param edit leaves
every non-report stage up to date (so editing a report setting retrains nothing)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml

from bench import tiny


def timed(fn) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def report_only_param(repo: Path) -> str | None:
    """A params key that only report stages declare (None when there is none)."""
    stages = yaml.safe_load((repo / "dvc.yaml").read_text())["stages"]

    def declared(stage: dict) -> list[str]:
        body = stage.get("do", stage)
        return [p for p in body.get("params", []) if isinstance(p, str)]

    report = [p for name, s in stages.items() if name.startswith("report") for p in declared(s)]
    others = [p for name, s in stages.items() if not name.startswith("report") for p in declared(s)]
    for key in report:
        if not any(key == o or key.startswith(f"{o}.") or o.startswith(f"{key}.") for o in others):
            return key
    return None


def _edited(value):
    """A different value of the same type (what an edit of the key looks like)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "_edited"
    if isinstance(value, list):
        return list(reversed(value)) if len(set(map(str, value))) > 1 else value + value[:1]
    if isinstance(value, dict):
        k = next(iter(value))
        return {**value, k: _edited(value[k])}
    return value


def dvc_figures(repo: Path) -> dict:
    """No-op ``dvc repro`` time, and the stages ``dvc status`` reports after a report-only param edit."""
    status = json.loads(tiny.dvc(repo, "status", "--json").stdout or "{}")
    if status:
        return {"error": f"{repo} is not up to date ({', '.join(status)}): run dvc repro there first"}
    noop_s, proc = timed(lambda: tiny.dvc(repo, "repro"))
    out = {"noop_s": noop_s, "noop_ran": "Running stage" in proc.stdout, "report_key": None, "changed": None}
    key = report_only_param(repo)
    if key is not None:
        path = repo / "params.yaml"
        original = path.read_text()
        params = yaml.safe_load(original)
        *parents, last = key.split(".")
        node = params
        for k in parents:
            node = node[k]
        node[last] = _edited(node[last])
        try:
            path.write_text(yaml.safe_dump(params, sort_keys=False))
            out["changed"] = sorted(json.loads(tiny.dvc(repo, "status", "--json").stdout or "{}"))
        finally:
            path.write_text(original)
        out["report_key"] = key
    return out
