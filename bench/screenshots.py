"""Screenshots of the tools a user opens, each checked on the DOM: the MLflow runs table, a student run, DVC's plots.

    python -m bench.screenshots --store mlflow.db --out reports/screens

Starts ``mlflow server`` on 127.0.0.1 over the sqlite store and serves ``dvc plots show`` output from a temporary
folder, opens each page in headless Chromium (``bench.browser``), waits until it has drawn, saves a PNG and
asserts on what is on the page:

- ``mlflow_runs.png``: the train experiment opens on its runs table (MLflow 3.x opens experiments on the GenAI
  overview until the user picks "Model training"; we do what that toggle does, then check the landing page), with
  the headline metric columns shown: the server-side view stored as experiment tag
  ``mlflow.sharedViewState.headline`` (opened by its link, ``#/experiments/<id>/runs?viewStateShareKey=headline``),
  or, without one, the columns picked the way the column selector keeps them (in the browser);
- ``mlflow_student.png``: a distilled student's run page shows its headline metrics and its teacher's tags;
- ``dvc_plots.png``: every vega plot drew an svg/canvas with marks (offline: ``.dvc/plots/offline.html``) and
  every image plot loaded.

Exits 1 naming each failed check (the screenshots are still written, to show what went wrong).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import yaml

from bench.browser import Browser
from pipeline.tracking import HEADLINE_COLUMNS

# Columns to show in the runs table where the store keeps no shared view: the pipeline's own headline columns.
HEADLINE = HEADLINE_COLUMNS
WORKFLOW_KEY = "mlflow.workflowType_v1"  # what the sidebar's "GenAI / Model training" toggle writes
SHARED_VIEW = "headline"  # runs-table view stored as experiment tag mlflow.sharedViewState.<key> (pipeline.tracking)
ASSISTANT_KEYS = {"mlflow.assistant.panelOpen_v1": "false", "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1": "true"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def mlflow_server(store: Path) -> Iterator[str]:
    """``mlflow server`` over ``store`` on a free local port; yields its URL."""
    port = free_port()
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{store.resolve()}",
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(OSError):
                if urllib.request.urlopen(f"{url}/health", timeout=2).status == 200:  # noqa: S310 (a 127.0.0.1 URL we built)
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise RuntimeError(f"mlflow server did not start:\n{log.read().decode()[-2000:]}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


@contextlib.contextmanager
def dvc_plots(repo: Path, template: Path | None = None) -> Iterator[str]:
    """``dvc plots show`` of ``repo`` (its configured HTML template, or ``template``) over HTTP; yields the URL."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "dvc_plots"
        extra = ["--html-template", str(template.resolve())] if template else []
        subprocess.run([shutil.which("dvc") or "dvc", "plots", "show", "-o", str(out), *extra], cwd=repo,
                       check=True, capture_output=True, text=True)
        with serve_folder(out) as root:
            yield f"{root}/index.html"


@contextlib.contextmanager
def serve_folder(folder: Path) -> Iterator[str]:
    """``folder`` over HTTP on 127.0.0.1 (no network), quietly; yields the URL of its root."""
    server = QuietServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        """A client hanging up early (a browser, a downloader refusing the file) is not an error to print."""


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # keep the console to what the caller prints
        pass


def train_experiment(repo: Path) -> str:
    params = yaml.safe_load((repo / "params.yaml").read_text())
    return f"{params['tracking']['experiment_prefix']}-train"


def find_runs(store: Path, experiment: str) -> dict:
    """Ids for the pages: the train experiment, its parent runs, a distilled student, the headline metrics logged."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{store.resolve()}")
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise SystemExit(f"error: {store}: no experiment {experiment!r}")
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    everywhere = client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=1000)
    students = [r for r in everywhere if "teacher.arch" in r.data.tags]  # the distill stage may log elsewhere
    if not students:
        raise SystemExit(f"error: {store}: no distilled student (a run tagged teacher.arch)")
    logged = {key for r in runs for key in r.data.metrics}
    view = json.loads(exp.tags.get(f"mlflow.sharedViewState.{SHARED_VIEW}", "{}")).get("selectedColumns", [])
    shared = [c.split("`")[1] for c in view if c.startswith("metrics.`")]
    return {"exp_id": exp.experiment_id, "metrics": [k for k in HEADLINE if k in logged], "shared_view": shared,
            "parents": sorted({r.data.tags["mlflow.parentRunId"] for r in runs if "mlflow.parentRunId" in r.data.tags}),
            "student": (students[0].info.experiment_id, students[0].info.run_id)}


def js(value) -> str:
    return json.dumps(value)


def select_columns(b: Browser, exp_id: str, metrics: list[str], parents: list[str]) -> None:
    """Show ``metrics`` as the runs table's columns, in the view state the column selector writes."""
    key = f'MLflowLocalStorage-1.1-ExperimentPage-["{exp_id}"]-ReactComponentState'
    columns = [f"metrics.`{m}`" for m in metrics]
    b.evaluate(f"""(() => {{ const s = JSON.parse(localStorage.getItem({js(key)}) || '{{}}');
        s.selectedColumns = {js(columns)};  // the metrics alone: the grid draws only the columns in view
        s.orderByKey = {js(columns[0] if columns else 'attributes.start_time')}; s.orderByAsc = false;
        s.runsExpanded = Object.fromEntries({js(parents)}.map(id => [id, true]));  // nested runs shown
        localStorage.setItem({js(key)}, JSON.stringify(s)); }})()""")


def check_runs_table(b: Browser, url: str, ids: dict, out: Path) -> list[str]:
    exp_id, metrics = ids["exp_id"], ids["metrics"]
    failures = []
    # A fresh browser: where does the experiment link land (MLflow 3 default: the GenAI overview)?
    b.open(f"{url}/#/", "document.readyState === 'complete'", settle=0)
    b.evaluate(f"localStorage.setItem({js(WORKFLOW_KEY)}, {js(js('machine_learning'))})")
    for key, value in ASSISTANT_KEYS.items():  # the assistant's chat panel would cover the columns
        b.evaluate(f"localStorage.setItem({js(key)}, {js(value)})")
    rows = "document.querySelectorAll('.ag-center-cols-container .ag-row').length > 0"
    if not b.open(f"{url}/#/experiments/{exp_id}", rows, wait=90):
        failures.append(f"runs table: no rows at {b.evaluate('location.href')}")
    if "/runs" not in b.evaluate("location.hash"):
        failures.append(f"runs table: the experiment opened on {b.evaluate('location.hash')}, not on its runs")
    page = f"{url}/#/experiments/{exp_id}/runs"
    if ids["shared_view"]:  # the server-side view the pipeline stored: its link shows its columns in any browser
        page += f"?viewStateShareKey={SHARED_VIEW}"
        metrics = ids["shared_view"]
    else:  # no stored view: pick the columns as the column selector does (kept in the browser)
        select_columns(b, exp_id, metrics, ids["parents"])
    headers = "[...document.querySelectorAll('.ag-header-cell')].map(c => c.innerText.trim())"
    ready = f"{rows} && {js(metrics)}.every(m => {headers}.includes(m))"
    b.open(page, ready, wait=90)
    shown = b.evaluate(headers)
    missing = [m for m in metrics if m not in shown]
    if not metrics or missing:
        failures.append(f"runs table: metric columns missing {missing or HEADLINE} (headers: {shown})")
    b.screenshot(out / "mlflow_runs.png")
    return failures


def check_student(b: Browser, url: str, exp_id: str, run_id: str, metrics: list[str], out: Path) -> list[str]:
    text = "document.body.innerText"
    ready = f"{text}.includes('teacher.arch') || {text}.includes('test/acc')"
    b.open(f"{url}/#/experiments/{exp_id}/runs/{run_id}", ready, wait=90)
    body = b.evaluate(text)
    failures = [f"student run {run_id}: {want!r} not on the page"
                for want in [*metrics, "teacher.arch", "teacher.checkpoint_sha256"] if want not in body]
    b.screenshot(out / "mlflow_student.png")
    return failures


def check_dvc_plots(b: Browser, url: str, out: Path, wait: float = 60.0) -> list[str]:
    # The ids come from the page's source: vega-embed replaces each div's content (its script) as it draws.
    html = urllib.request.urlopen(url).read().decode()  # noqa: S310 (a 127.0.0.1 URL we built)
    ids = re.findall(r"vegaEmbed\('#([^']+)'", html)
    drawn = ("(id => { const d = document.getElementById(id), g = d && d.querySelector('svg, canvas');"
             " return Boolean(g) && g.getBoundingClientRect().height > 50"
             " && (g.tagName === 'CANVAS' || g.querySelectorAll('path').length > 3); })")
    imgs = "[...document.images]"
    b.open(url, f"{js(ids)}.every({drawn}) && {imgs}.every(i => i.complete)", wait=wait)
    blank = b.evaluate(f"{js(ids)}.filter(id => !{drawn}(id))")
    broken = b.evaluate(f"{imgs}.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src)")
    n_img = b.evaluate(f"{imgs}.length")
    failures = [] if ids or n_img else ["dvc plots: the page has no plots"]
    empty = set(re.findall(r"var spec = \{\};\s*vegaEmbed\('#([^']+)'", html))
    failures += [f"dvc plots: vega plot #{i} drew nothing" + (
        " (DVC gave it an empty spec: a y column listed under dvc.yaml `plots:` is missing from its CSV)"
        if i in empty else "") for i in blank]
    failures += [f"dvc plots: image {src} did not load" for src in broken]
    print(f"dvc plots: {len(ids) - len(blank)}/{len(ids)} vega plots drawn,"
          f" {n_img - len(broken)}/{n_img} images loaded")
    b.screenshot(out / "dvc_plots.png", full_page=True)
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Screenshot and check the MLflow UI and DVC's plots page.")
    parser.add_argument("--store", type=Path, default=Path("mlflow.db"), help="MLflow sqlite store")
    parser.add_argument("--out", type=Path, default=Path("reports/screens"), help="folder for the PNGs")
    parser.add_argument("--repo", type=Path, default=Path("."), help="repository for params.yaml and dvc plots")
    args = parser.parse_args(argv)
    if not args.store.is_file():
        print(f"error: {args.store}: no MLflow store (run the pipeline first)", file=sys.stderr)
        return 2
    ids = find_runs(args.store, train_experiment(args.repo))
    args.out.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []
    with mlflow_server(args.store) as url, dvc_plots(args.repo) as plots_url, Browser(1600, 1000) as b:
        failures += check_runs_table(b, url, ids, args.out)
        failures += check_student(b, url, *ids["student"], ids["metrics"], args.out)
        failures += check_dvc_plots(b, plots_url, args.out)
    for line in failures:
        print(f"FAIL {line}")
    print(f"screenshots in {args.out}: mlflow_runs.png mlflow_student.png dvc_plots.png"
          f" ({'all checks passed' if not failures else f'{len(failures)} failed'})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
