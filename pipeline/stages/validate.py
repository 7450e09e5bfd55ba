"""DVC stage ``validate``: the whole params file checked before any other stage runs.

DVC removes a stage's outputs just before it runs the stage, so a bad value given with ``dvc exp run -S`` (or an
edit) that only a later stage refuses would cost that stage's previous outputs. Every other stage depends on this
one's output, so DVC runs it first; it reads every key (also those no stage declares) and writes the same line
whatever the values, so a valid edit reruns nothing downstream by itself.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.io import write_text
from pipeline.stages.common import parse_stage, stage_main

VALID = "params.yaml: every key validated before the other stages ran\n"


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, required=True, help="the marker the other stages depend on")
    return ap


@stage_main
def main(argv: list[str] | None = None) -> None:
    args, _ = parse_stage(parser(), argv)  # refuses a bad params file in one line, naming the key
    write_text(args.out, VALID)


if __name__ == "__main__":
    raise SystemExit(main())
