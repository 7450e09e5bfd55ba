"""The DVC plots page draws every plot with no network (headless Chromium, hosts other than 127.0.0.1 unresolvable),
and no series without data; on a reproduced tiny study (slow), the MLflow pages ``bench.screenshots`` checks pass
on a non-default port.

``python -m bench.screenshots --store mlflow.db --out reports/screens`` takes the screenshots of a finished study.
"""

import shutil
from pathlib import Path

import pytest

from bench import screenshots
from bench.browser import Browser
from bench.screenshots import check_dvc_plots, dvc_plots, no_rows, series_failures

ROOT = Path(__file__).resolve().parents[1]
chromium = pytest.mark.skipif(not shutil.which("chromium"), reason="needs chromium (apt-get install chromium)")


def test_series_without_data_are_named():
    """A line flat at the bottom (value 0) and a legend colour with no line are failures; a dash legend is not."""
    legend = {"title": "architecture", "entries": ["vit", "resnet"], "colours": ["#1", "#2"]}
    dash = {"title": "revision", "entries": ["workspace"], "colours": ["transparent"]}
    good = {"height": 300, "lines": [{"colour": "#1", "d": "M0,250L140,280"}, {"colour": "#2", "d": "M0,10L140,0"}],
            "legends": [legend, dash]}
    assert series_failures({"p": good}) == []
    flat = {**good, "lines": [good["lines"][0], {"colour": "#2", "d": "M0,300L140,300L280,300"}]}
    assert series_failures({"p": flat}) == ["dvc plots: #p draws a #2 line flat at 0 (a series without data)"]
    missing = {**good, "lines": good["lines"][:1]}
    assert series_failures({"p": missing}) == [
        "dvc plots: #p's legend (architecture) lists 1 series without data: resnet"]


def test_a_plot_whose_csvs_hold_no_rows_is_known(tmp_path):
    (tmp_path / "dvc.yaml").write_text(
        "plots:\n  - a vs b (scale):\n      y:\n        empty.csv: [vit]\n"
        "  - full:\n      y:\n        full.csv: [vit]\n")
    (tmp_path / "empty.csv").write_text("x,vit\n")
    (tmp_path / "full.csv").write_text("x,vit\n1,0.5\n")
    assert no_rows(tmp_path) == {"a_vs_b__scale_"}


def dvc_page_failures(tmp_path) -> tuple[list[str], list[str]]:
    """The committed plots page's failures: (drawing and lines, legends)."""
    with dvc_plots(ROOT) as url, Browser() as b:
        failures = check_dvc_plots(b, url, tmp_path)
    assert (tmp_path / "dvc_plots.png").stat().st_size > 10_000
    legends = [f for f in failures if "'s legend (" in f]
    return [f for f in failures if f not in legends], legends


@chromium
@pytest.mark.slow  # a stage, a store, a browser or a long fit: make test, not test-fast
def test_dvc_plots_draw_offline(tmp_path):
    failures, _ = dvc_page_failures(tmp_path)
    assert not failures, "\n".join(failures)


@chromium
@pytest.mark.slow  # a stage, a store, a browser or a long fit: make test, not test-fast
def test_dvc_plot_legends_list_only_series_with_data(tmp_path):
    _, legends = dvc_page_failures(tmp_path)
    assert not legends, "\n".join(legends)


@chromium
@pytest.mark.slow  # a stage, a store, a browser or a long fit: make test, not test-fast
def test_cdn_page_is_blank_offline(tmp_path):
    """The check is not vacuous: DVC's default page (vega from the CDN) draws nothing here."""
    page = (ROOT / ".dvc/plots/offline.html").read_text()
    head, body = page.split("<script", 1)[0], page.rsplit("<body>", 1)[1]
    cdn = "".join(f'<script src="https://cdn.jsdelivr.net/npm/{p}"></script>'
                  for p in ("vega@5.20.2", "vega-lite@5.2.0", "vega-embed@6.18.2"))
    bare = head + cdn + "</head><body>" + body
    template = tmp_path / "cdn.html"
    template.write_text(bare)
    with dvc_plots(ROOT, template) as url, Browser() as b:
        failures = check_dvc_plots(b, url, tmp_path, wait=3)  # offline the CDN fails at once
    assert failures and all("drew nothing" in f for f in failures)


@chromium
@pytest.mark.slow
def test_mlflow_pages_on_a_tiny_study(reproduced_repo, tmp_path):
    """On a reproduced tiny study served at a non-default port: the description's link opens the runs table there,
    a run's logged model is listed with its page, its metrics page opens on curves (no slice/budget sections) and
    its scalars table shows."""
    from bench.browser import Browser

    store = reproduced_repo / "mlflow.db"
    ids = screenshots.find_runs(store, screenshots.train_experiment(reproduced_repo))
    with screenshots.mlflow_server(store, screenshots.free_port()) as url, Browser(1600, 1000) as b:
        failures = screenshots.check_runs_table(b, url, ids, tmp_path)
        for check in (screenshots.check_model, screenshots.check_metrics, screenshots.check_scalars):
            failures += check(b, url, ids["exp_id"], ids["run"], tmp_path)
    assert not failures, "\n".join(failures)
    assert {p.name for p in tmp_path.glob("*.png")} == {"mlflow_runs.png", "mlflow_models.png", "mlflow_metrics.png",
                                                        "mlflow_scalars.png"}
