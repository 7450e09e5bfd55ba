"""bench.tune_compare: trials matched on (arch, task, lr); a cell learned when its best trial clears the line."""

from __future__ import annotations

import pandas as pd

from bench.tune_compare import compare, main


def _trials(rows):
    return pd.DataFrame(rows, columns=["arch", "task", "lr", "val_acc", "steps_done", "stop_reason"])


def test_cells_that_learn_only_under_the_new_rule_are_counted(tmp_path):
    before = _trials([("vit", "alignment", 1e-3, 0.27, 500, "plateau"),
                      ("vit", "alignment", 5e-4, 0.30, 600, "plateau"),
                      ("resnet", "scale", 1e-3, 0.99, 400, "criterion"),
                      ("swin", "scale", 1e-3, 0.5, 500, "plateau")])
    after = _trials([("vit", "alignment", 1e-3, 0.26, 1500, "cap"),
                     ("vit", "alignment", 5e-4, 0.90, 1200, "criterion"),
                     ("resnet", "scale", 1e-3, 0.99, 400, "criterion")])  # swin not tried after: left out
    table = compare(before, after, {"alignment": 0.25, "scale": 0.5}).set_index("arch")
    assert list(table.index) == ["resnet", "vit"]
    vit = table.loc["vit"]
    assert (vit.learned_before, vit.learned_after) == (False, True)  # line: 0.25 + 0.5 * 0.75 = 0.625
    assert (vit.best_after, vit.steps_after, vit.stops_after) == (0.90, 1200, "cap/criterion")
    assert table.loc["resnet", "learned_before"] and table.loc["resnet", "learned_after"]

    before.to_csv(b := tmp_path / "b.csv", index=False)
    after.to_csv(a := tmp_path / "a.csv", index=False)
    pd.DataFrame({"task": ["alignment", "scale", "scale"], "chance": [0.25, 0.5, None]}).to_csv(
        led := tmp_path / "ledger.csv", index=False)
    assert main(["--before", str(b), "--after", str(a), "--ledger", str(led), "--out", str(tmp_path / "c.md")]) == 0
    text = (tmp_path / "c.md").read_text()
    assert "2 cells tried in both" in text and "1 cells learn only after" in text and "| vit " in text
