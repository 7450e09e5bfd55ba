"""What DVC costs around the pipeline: a no-op ``dvc repro``'s time, and whether editing a report setting leaves every
training stage up to date (it retrains nothing)."""

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


def report_param(repo: Path) -> str | None:
    """The params key of the ``report`` stage that the fewest other stages read, the ``report`` section's first on a
    tie (None without a report stage). Read from ``dvc.lock``, where a matrix stage's templated keys
    (``tasks.${item.task}``) are expanded per stage; inside a section that others read part of (``finetune`` reads
    ``report.confidence``), its other keys are candidates too."""
    stages = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    params = yaml.safe_load((repo / "params.yaml").read_text())
    declared = {name: list(s.get("params", {}).get("params.yaml", {})) for name, s in stages.items()}

    def readers(key: str) -> int:
        return sum(any(key == o or key.startswith(f"{o}.") or o.startswith(f"{key}.") for o in keys)
                   for name, keys in declared.items() if not name.startswith("report"))

    queue, candidates = [k for name, keys in declared.items() if name.startswith("report") for k in keys], []
    while queue:
        key = queue.pop(0)
        candidates.append(key)
        node = params
        for part in key.split("."):
            node = node[part]
        if isinstance(node, dict) and readers(key):  # a section others read: maybe not all of it
            queue += [f"{key}.{k}" for k in node]
    return min(candidates, key=lambda k: (readers(k), k.split(".")[0] != "report"), default=None)  # report.* first


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
    """No-op ``dvc repro`` time, and the stages ``dvc status`` reports after an edit of the report param the fewest
    other stages read (:func:`report_param`)."""
    status = json.loads(tiny.dvc(repo, "status", "--json").stdout or "{}")
    if status:
        return {"error": f"{repo} is not up to date ({', '.join(status)}): run dvc repro there first"}
    noop_s, proc = timed(lambda: tiny.dvc(repo, "repro"))
    out = {"noop_s": noop_s, "noop_ran": "Running stage" in proc.stdout, "report_key": None, "changed": None}
    key = report_param(repo)
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
