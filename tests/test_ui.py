"""The DVC plots page draws every plot with no network (headless Chromium, hosts other than 127.0.0.1 unresolvable).

The MLflow half of ``bench.screenshots`` needs a store with real runs; run it with
``python -m bench.screenshots --store mlflow.db --out reports/screens`` after a repro.
"""

import shutil
from pathlib import Path

import pytest

from bench.browser import Browser
from bench.screenshots import check_dvc_plots, dvc_plots

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not shutil.which("chromium"), reason="needs chromium (apt-get install chromium)")


def test_dvc_plots_draw_offline(tmp_path):
    with dvc_plots(ROOT) as url, Browser() as b:
        failures = check_dvc_plots(b, url, tmp_path)
    assert not failures, "\n".join(failures)
    assert (tmp_path / "dvc_plots.png").stat().st_size > 10_000


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
