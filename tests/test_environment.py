"""The environment a run's numbers also depend on: what it records, and how two of them are compared."""

from __future__ import annotations

import importlib.metadata

import torch

from pipeline.environment import KERNEL_VARIABLES, differences, environment


def test_environment_names_versions_cpu_and_kernel_dispatch(monkeypatch):
    for var in KERNEL_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    env = environment()
    assert env["torch"] == torch.__version__ and env["timm"] == importlib.metadata.version("timm")
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and env["cpu"]
    assert not set(KERNEL_VARIABLES) & set(env)  # only the variables that are set
    monkeypatch.setenv("MKL_CBWR", "AVX2")
    assert environment()["MKL_CBWR"] == "AVX2"


def test_differences_name_each_changed_or_missing_key():
    here = {"torch": "2.14.1", "cpu": "A", "MKL_CBWR": "AVX2"}
    assert differences(here, dict(here)) == []
    assert differences(here, {"torch": "2.14.1", "cpu": "B"}) == ["MKL_CBWR: AVX2 here, unset there",
                                                                 "cpu: A here, B there"]
