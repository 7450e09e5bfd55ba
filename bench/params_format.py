"""Rewrite ``params.yaml`` in the form ``dvc exp run -S`` writes it back, so an ``-S`` edit is a one-line diff.

DVC applies ``-S key=value`` with ``dvc.utils.hydra.apply_overrides``: it loads the file with ruamel's round-trip
loader (comments kept), rebuilds every value through OmegaConf, merges the result back (every list becomes a new
plain list, so flow lists ``[a, b]`` turn into block lists and their end-of-line comment moves to the key; ``null``
is written as an empty value) and dumps with ruamel (``default_flow_style=False``, 2-space indent). A file already
in that form is a fixed point, so the only line an ``-S`` edit changes is the edited one.

This script runs DVC's own writer with no overrides, i.e. exactly that rewrite and nothing else:

    python -m bench.params_format params.yaml           # rewrite in place
    python -m bench.params_format params.yaml --check   # exit 1 (and say so) if the file is not in DVC's form
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import yaml


def dvc_form(text: str) -> str:
    """``text`` (a params YAML document) as DVC's ``-S`` writer leaves it; the data it holds is unchanged."""
    from dvc.utils.hydra import apply_overrides

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "params.yaml"
        path.write_text(text)
        apply_overrides(path, [])
        out = path.read_text()
    if yaml.safe_load(out) != yaml.safe_load(text):  # DVC's writer must never change a value
        raise RuntimeError("DVC's YAML writer changed a value; params.yaml was left as it was")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("path", type=Path, nargs="?", default=Path("params.yaml"))
    parser.add_argument("--check", action="store_true", help="only check; exit 1 if a rewrite is needed")
    args = parser.parse_args(argv)
    if not args.path.is_file():
        print(f"error: {args.path}: no such file", file=sys.stderr)
        return 2
    text = args.path.read_text()
    formatted = dvc_form(text)
    if formatted == text:
        print(f"{args.path}: already in DVC's form")
        return 0
    if args.check:
        print(f"{args.path}: not in DVC's form; run `python -m bench.params_format {args.path}`")
        return 1
    tmp = args.path.with_suffix(".yaml.tmp")
    tmp.write_text(formatted)
    shutil.move(tmp, args.path)  # atomic on one filesystem: never a half-written params.yaml
    print(f"{args.path}: rewritten in DVC's form")
    return 0


if __name__ == "__main__":
    sys.exit(main())
