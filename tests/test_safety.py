"""Safety: weights-only checkpoint loading, no pickle-capable loaders (yaml.load is ruff S506),
no network at run time, a localhost-only MLflow UI."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tiny_repo
import yaml

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "pipeline").rglob("*.py")) + sorted((ROOT / "bench").rglob("*.py"))


def calls(name: str):
    """(file, call node) of every call to ``<something>.<name>`` in the project's code."""
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == name:
                yield path, node


def test_torch_load_is_weights_only():
    found = [(p, n) for p, n in calls("load") if isinstance(n.func.value, ast.Name) and n.func.value.id == "torch"]
    assert found, "expected the checkpoint loaders in pipeline/"
    for path, node in found:
        kw = {k.arg: k.value for k in node.keywords}
        assert isinstance(kw.get("weights_only"), ast.Constant) and kw["weights_only"].value is True, \
            f"{path.name}:{node.lineno}: torch.load without weights_only=True"


class Payload:
    """Stands for a pickle that runs code on load (here it only would: torch refuses to build it)."""


def test_a_blocked_pickle_is_called_unsafe_never_loaded_with_the_protection_off(tmp_path):
    import torch

    from pipeline.errors import StageError
    from pipeline.provenance import load_state

    bad = tmp_path / "weights.pt"
    torch.save({"w": torch.zeros(2), "x": Payload()}, bad)
    with pytest.raises(StageError) as err:
        load_state(bad, "vit", "rerun the teacher stage")
    msg = str(err.value)
    assert msg.startswith(f"{bad}: ") and "unsafe" in msg and "delete it" in msg and "rerun the teacher stage" in msg
    assert "never load it with weights_only=False" in msg and "\n" not in msg
    assert "to do so" not in msg  # torch's own advice (turn the protection off) is not passed on


def test_no_unsafe_loaders():
    """``yaml.load`` is ruff's S506 (pyproject); these two spellings ruff does not see."""
    for path in SOURCES:
        assert "unsafe_load" not in path.read_text() and "allow_pickle=True" not in path.read_text(), path


def test_mlflow_ui_binds_localhost():
    recipe = re.search(r"^mlflow-ui:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert recipe, "Makefile has no mlflow-ui target"
    cmd = recipe.group(1)
    assert "bias ui" in cmd and "0.0.0.0" not in cmd  # bias ui (pipeline/cli.py) starts the server:
    ui = re.search(r"^def ui\(.*?(?=^def )", (ROOT / "pipeline/cli.py").read_text(), re.M | re.S).group(0)
    assert '"mlflow"), "ui", "--host", "127.0.0.1"' in ui and "0.0.0.0" not in ui


# Fallback when user namespaces are unavailable: refuse every connection that is not to this machine.
BLOCK = """
import socket
_connect = socket.socket.connect
def _local_only(self, address):
    host = address[0] if isinstance(address, tuple) else address
    if isinstance(host, str) and not (host.startswith("127.") or host in ("localhost", "::1") or "/" in host):
        raise OSError(f"network disabled for this test: {address}")
    return _connect(self, address)
socket.socket.connect = _local_only
"""


def offline_prefix(tmp: Path) -> tuple[list[str], dict[str, str]]:
    """Run without a network: a fresh network namespace (only loopback) or a socket guard."""
    env = dict(os.environ)
    if shutil.which("unshare") and subprocess.run(["unshare", "-rn", "true"]).returncode == 0:
        return ["unshare", "-rn"], env
    (tmp / "sitecustomize.py").write_text(BLOCK)
    env["PYTHONPATH"] = f"{tmp}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return [], env


@pytest.mark.slow  # trains a DeiT student in a subprocess
def test_training_stage_runs_offline(copy_workspace, tmp_path):
    ws = copy_workspace
    prefix, env = offline_prefix(tmp_path)
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{ws / 'mlflow.db'}"
    probe = subprocess.run([*prefix, sys.executable, "-c",
                            "import socket; socket.create_connection(('1.1.1.1', 443), timeout=2)"],
                           env=env, capture_output=True, text=True)
    assert probe.returncode != 0, "the network is still reachable: the test would prove nothing"
    params = yaml.safe_load((ws / "params.yaml").read_text())
    params["train"]["archs"] = {}  # the DeiT student alone: it loads its teacher, the one input from elsewhere
    tiny_repo.write_params(ws / "student.yaml", params)
    cmd = [*prefix, sys.executable, "-m", "pipeline.stages.train", "--params", str(ws / "student.yaml"),
           "--teachers", str(ws / "data/teachers"), "--data", str(ws / "data/tasks"),
           "--slices", str(ws / "data/slices"), "--out", str(ws / "out"), "--ckpt", str(ws / "ckpt")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [p.relative_to(ws / "out") for p in (ws / "out").rglob("metrics.json")] == [
        Path("deit/alignment/n128-t20-s0-d0-criterion/metrics.json")]
