"""What a run's numbers depend on besides code, params and data: the library versions and the CPU kernels.

Training here is chaotic in float rounding: the same run, on a CPU where torch or MKL picks kernels that sum in
another order (another SIMD width, another MKL code path), ends at other weights and another test accuracy
(``python -m bench.kernels`` measures how far: a third to a half of what another seed does). Results are
bit-identical only where all of this is equal, so every MLflow run carries the stage process's as ``env.*``
tags, and the executor warns when a worker's differs from it.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform

PACKAGES = ("torch", "torchvision", "timm", "lightning", "numpy")
# Variables that choose kernels, where a user or a cluster sets them (torch's, MKL's and oneDNN's dispatch).
KERNEL_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")


def cpu_model() -> str:
    """The CPU's model name (Linux ``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def environment() -> dict[str, str]:
    """This process's versions, CPU, the SIMD level torch dispatches to, and any kernel-choosing variable set."""
    import torch

    env = {"python": platform.python_version(), "cpu": cpu_model(),
           "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    env |= {package: _version(package) for package in PACKAGES}
    env["torch"] = torch.__version__  # with its build (+cpu, +cu130: each ships its own MKL and oneDNN)
    env |= {var: os.environ[var] for var in KERNEL_VARIABLES if var in os.environ}
    return env


def differences(here: dict[str, str], there: dict[str, str]) -> list[str]:
    """``"key: a here, b there"`` for every key whose value differs (``unset`` where one side lacks it)."""
    return [f"{key}: {here.get(key, 'unset')} here, {there.get(key, 'unset')} there"
            for key in sorted(here.keys() | there.keys()) if here.get(key) != there.get(key)]
