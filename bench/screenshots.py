"""Screenshots of the tools a user opens, each checked on the DOM: MLflow's runs table, a run's logged model, its
metrics page and table of scalars, a student run, and DVC's plots.

    python -m bench.screenshots --store mlflow.db --out reports/screens [--port 5123]
    python -m bench.screenshots --tiny /tmp/tiny --out /tmp/screens   # a tiny repository reproduced first

Starts ``mlflow server`` on 127.0.0.1 at ``--port`` (not MLflow's default 5000, so a link that hard-codes it
fails) over the sqlite store and serves ``dvc plots show`` output from a temporary folder, opens each page in
headless Chromium (``bench.browser``), waits until it has drawn, saves a PNG and asserts on what is on the page:

- ``mlflow_runs.png``: the train experiment's description links to its runs table on this server (a link to any
  other local address fails), and following it opens the runs table (MLflow 3.x opens experiments on the GenAI
  overview until the user picks "Model training") with the headline metric columns: the server-side view stored
  as experiment tag ``mlflow.sharedViewState.headline``, or, without one, the columns picked the way the column
  selector keeps them (in the browser);
- ``mlflow_models.png``: the experiment's Models tab lists a run's logged model ``network``, and its page names
  its source run and headline metrics;
- ``mlflow_metrics.png``: that run's "Model metrics" page opens on curves: a line chart on the first screen and no
  section of single-value charts from the table's sections (``slice``, ``budget``, ... :
  ``pipeline.tracking.TABLE_PREFIXES``);
- ``mlflow_scalars.png``: its artifact ``scalars.csv`` shows as a table with a row per slice;
- ``mlflow_student.png``: a distilled student's run page shows its headline metrics and its teacher's tags;
- ``dvc_plots.png``: every vega plot drew an svg/canvas with marks (offline: ``.dvc/plots/offline.html``), each
  drawn line has data (no line where a column is empty) and each legend entry a line; every image plot loaded.

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

from bench import tiny
from bench.browser import Browser
from pipeline.tracking import HEADLINE_COLUMNS, MODEL_NAME, SCALARS, TABLE_PREFIXES

# Columns to show in the runs table where the store keeps no shared view: the pipeline's own headline columns.
HEADLINE = HEADLINE_COLUMNS
WORKFLOW_KEY = "mlflow.workflowType_v1"  # what the sidebar's "GenAI / Model training" toggle writes
SHARED_VIEW = "headline"  # runs-table view stored as experiment tag mlflow.sharedViewState.<key> (pipeline.tracking)
PORT = 5123  # not MLflow's default 5000: a link that hard-codes the default fails here
ASSISTANT_KEYS = {"mlflow.assistant.panelOpen_v1": "false", "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1": "true"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def mlflow_server(store: Path, port: int | None = None) -> Iterator[str]:
    """``mlflow server`` over ``store`` on ``port`` (default: a free one) of 127.0.0.1; yields its URL."""
    port = port or free_port()
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", port)) == 0:
            raise RuntimeError(f"port {port} is in use: pass another --port")
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
        dvc = shutil.which("dvc") or str(Path(sys.executable).with_name("dvc"))  # the venv's, PATH or not
        subprocess.run([dvc, "plots", "show", "-o", str(out), *extra], cwd=repo, check=True, capture_output=True,
                       text=True)
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
    modelled = [r for r in runs if "mlflow.parentRunId" in r.data.tags and r.outputs and r.outputs.model_outputs]
    if not modelled:
        raise SystemExit(f"error: {store}: no run of {experiment!r} logged a model")
    view = json.loads(exp.tags.get(f"mlflow.sharedViewState.{SHARED_VIEW}", "{}")).get("selectedColumns", [])
    shared = [c.split("`")[1] for c in view if c.startswith("metrics.`")]
    return {"exp_id": exp.experiment_id, "metrics": [k for k in HEADLINE if k in logged], "shared_view": shared,
            "parents": sorted({r.data.tags["mlflow.parentRunId"] for r in runs if "mlflow.parentRunId" in r.data.tags}),
            "student": (students[0].info.experiment_id, students[0].info.run_id),
            "run": (modelled[0].info.run_id, modelled[0].info.run_name, modelled[0].outputs.model_outputs[0].model_id)}


def js(value) -> str:
    return json.dumps(value)


LINKS = "[...document.querySelectorAll('a[href]')].map(a => a.href)"  # resolved: a relative link gets the origin
SHARED_LINK = f"viewStateShareKey={SHARED_VIEW}"


def foreign_links(b: Browser, url: str) -> list[str]:
    """Links on the page to a local server other than ``url`` (a port hard-coded in a description or report)."""
    local = re.compile(r"https?://(127\.0\.0\.1|localhost|0\.0\.0\.0)(:\d+)?(/|$)")
    return sorted({h for h in b.evaluate(LINKS) if local.match(h) and not h.startswith(f"{url}/")})


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
        # the experiment's description links to it on this server: follow the link in a browser with no choice
        # of workflow stored, so the link alone must open the runs table
        b.wait(f"{LINKS}.some(h => h.includes({js(SHARED_LINK)}))")
        described = [h for h in b.evaluate(LINKS) if SHARED_LINK in h]
        failures += [f"experiment page: a link to another server: {h}" for h in foreign_links(b, url)]
        if not described or not described[0].startswith(f"{url}/"):
            failures.append(f"experiment page: no link to the headline view on {url} (links: {described})")
        here = [h for h in described if h.startswith(f"{url}/")]
        page = here[0] if here else f"{page}?{SHARED_LINK}"  # another server's link: checked no further
        b.evaluate(f"localStorage.removeItem({js(WORKFLOW_KEY)})")
        metrics = ids["shared_view"]
    else:  # no stored view: pick the columns as the column selector does (kept in the browser)
        select_columns(b, exp_id, metrics, ids["parents"])
    headers = "[...document.querySelectorAll('.ag-header-cell')].map(c => c.innerText.trim())"
    ready = f"{rows} && {js(metrics)}.every(m => {headers}.includes(m))"
    b.open(page, ready, wait=90)
    if "/runs" not in b.evaluate("location.hash"):
        failures.append(f"runs table: {page} opened {b.evaluate('location.href')}, not the runs table")
    shown = b.evaluate(headers)
    missing = [m for m in metrics if m not in shown]
    if not metrics or missing:
        failures.append(f"runs table: metric columns missing {missing or HEADLINE} (headers: {shown})")
    b.screenshot(out / "mlflow_runs.png")
    b.open(f"{url}/#/", "document.readyState === 'complete'", settle=0)  # this server's storage, as the link left it
    b.evaluate(f"localStorage.setItem({js(WORKFLOW_KEY)}, {js(js('machine_learning'))})")
    return failures


TEXT = "document.body.innerText"
LOADED = f"!{TEXT}.includes('loading')"  # MLflow's "Run page loading" and the like


def check_model(b: Browser, url: str, exp_id: str, run: tuple[str, str, str], out: Path) -> list[str]:
    """The experiment's Models tab lists the run's logged model, and its page names its source run and metrics."""
    run_id, run_name, model_id = run
    failures = []
    listed = f"[...document.querySelectorAll('a[href]')].some(a => a.href.endsWith({js(model_id)}))"
    if not b.open(f"{url}/#/experiments/{exp_id}/models", f"{LOADED} && {listed}", wait=90):
        failures.append(f"models tab: the logged model {model_id} of {run_name} is not listed")
    b.open(f"{url}/#/experiments/{exp_id}/models/{model_id}", f"{LOADED} && {TEXT}.includes({js(run_name)})",
           wait=90, settle=2)
    body = b.evaluate(TEXT)
    failures += [f"logged model {model_id}: {want!r} not on its page"
                 for want in (MODEL_NAME, run_name, run_id, "Ready", "test_acc") if want not in body]
    b.screenshot(out / "mlflow_models.png")
    return failures


# Plotly's marks: a line chart draws .js-line paths, a single-value metric a bar
CHARTS = """[...document.querySelectorAll('.js-plotly-plot')].map(p => ({top: p.getBoundingClientRect().top,
    line: p.querySelectorAll('.scatterlayer .js-line').length > 0,
    bar: p.querySelectorAll('.barlayer .point').length > 0}))"""
SECTIONS = ("[...document.querySelectorAll('[data-testid=\"experiment-view-compare-runs-section-header\"]')]"
            ".map(e => e.innerText.trim().split('\\n')[0])")


def check_metrics(b: Browser, url: str, exp_id: str, run: tuple[str, str, str], out: Path) -> list[str]:
    """The run's "Model metrics" page opens on curves: a line chart on the first screen, and no section of the
    single-value scalars the run logs as its table (:data:`pipeline.tracking.TABLE_PREFIXES`)."""
    run_id, run_name, _ = run
    drawn = f"{LOADED} && {CHARTS}.some(c => c.line)"
    if not b.open(f"{url}/#/experiments/{exp_id}/runs/{run_id}/model-metrics", drawn, wait=120, settle=3):
        b.screenshot(out / "mlflow_metrics.png")
        return [f"metrics page of {run_name}: no line chart drawn"]
    charts, height = b.evaluate(CHARTS), b.evaluate("window.innerHeight")
    sections = b.evaluate(SECTIONS)
    tabled = [name for name in sections if any(name == p.rstrip("/") for p in TABLE_PREFIXES)]
    first = min(c["top"] for c in charts if c["line"])
    bars_before = sum(c["bar"] and c["top"] < first for c in charts)
    print(f"metrics page: sections {sections}; first curve at {first:.0f} px of {height}, "
          f"{bars_before} single-value charts before it")
    failures = [f"metrics page of {run_name}: a section of single-value charts {name!r} (its table's)"
                for name in tabled]
    if first > height:
        failures.append(f"metrics page of {run_name}: the first curve is below the first screen "
                        f"({bars_before} single-value charts before it)")
    b.screenshot(out / "mlflow_metrics.png")
    return failures


def check_scalars(b: Browser, url: str, exp_id: str, run: tuple[str, str, str], out: Path) -> list[str]:
    """The run's table artifact shows as a table (section, name, value) with a row per slice."""
    run_id, run_name, _ = run
    cells = ("[...document.querySelectorAll('td, th, [role=gridcell], [role=columnheader]')]"
             ".map(c => c.innerText.trim())")
    ready = f"{LOADED} && ['section', 'name', 'value', 'slice'].every(w => {cells}.includes(w))"
    ok = b.open(f"{url}/#/experiments/{exp_id}/runs/{run_id}/artifacts/{SCALARS}", ready, wait=90, settle=2)
    b.screenshot(out / "mlflow_scalars.png")
    return [] if ok else [f"{SCALARS} of {run_name}: no table with a slice row (cells: {b.evaluate(cells)[:12]})"]


def check_student(b: Browser, url: str, exp_id: str, run_id: str, metrics: list[str], out: Path) -> list[str]:
    ready = f"{TEXT}.includes('teacher.arch') || {TEXT}.includes('test/acc')"
    b.open(f"{url}/#/experiments/{exp_id}/runs/{run_id}", ready, wait=90)
    body = b.evaluate(TEXT)
    failures = [f"student run {run_id}: {want!r} not on the page"
                for want in [*metrics, "teacher.arch", "teacher.checkpoint_sha256"] if want not in body]
    b.screenshot(out / "mlflow_student.png")
    return failures


# Each vega plot drawn again as svg (the page draws canvas), to read its lines and its legends' entries.
SERIES = r"""(async specs => { const out = {};
  const colour = e => e.getAttribute('stroke') || e.style.stroke || e.getAttribute('fill') || e.style.fill || '';
  for (const [id, spec] of Object.entries(specs)) {
    const div = document.createElement('div'); document.body.appendChild(div);
    const {view} = await vegaEmbed(div, spec, {renderer: 'svg', actions: false});
    out[id] = {height: view.height(),
      lines: [...div.querySelectorAll('.mark-line path')].map(p => ({colour: colour(p), d: p.getAttribute('d')})),
      legends: [...div.querySelectorAll('.role-legend')].map(g => ({
        title: (g.querySelector('.role-legend-title text') || {}).textContent,
        entries: [...g.querySelectorAll('.role-legend-label text')].map(t => t.textContent),
        colours: [...g.querySelectorAll('.role-legend-symbol path')].map(colour)}))};
    div.remove(); }
  return out; })"""


def series_failures(plots: dict) -> list[str]:
    """No series without data: no line flat at the axis's bottom (a missing value drawn as 0), and no legend entry
    (a colour) without a line of that colour (an architecture the plot has no number for)."""
    failures = []
    for pid, plot in plots.items():
        for line in plot["lines"]:
            ys = {float(y) for y in re.findall(r"[ML][^,]+,([-\d.e]+)", line["d"] or "")}
            if ys and min(ys) >= plot["height"] - 0.5:
                failures.append(f"dvc plots: #{pid} draws a {line['colour']} line flat at 0 (a series without data)")
        drawn = {line["colour"] for line in plot["lines"]}
        for legend in plot["legends"]:
            if all(c in ("transparent", "") for c in legend["colours"]):
                continue  # a dash legend (DVC's revisions), not colours
            empty = [e for e, c in zip(legend["entries"], legend["colours"], strict=False) if c not in drawn]
            if empty:
                failures.append(f"dvc plots: #{pid}'s legend ({legend['title']}) lists {len(empty)} series without "
                                f"data: {', '.join(empty)}")
    return failures


def no_rows(repo: Path) -> set[str]:
    """Ids of the dvc.yaml plots whose CSVs hold no rows (a profile without that task): DVC draws them blank."""
    out = set()
    for plot in yaml.safe_load((repo / "dvc.yaml").read_text()).get("plots", []):
        for title, spec in plot.items() if isinstance(plot, dict) else []:
            files = list((spec or {}).get("y", {})) if isinstance((spec or {}).get("y"), dict) else []
            if files and all(len((repo / f).read_text().strip().splitlines()) <= 1 for f in files
                             if (repo / f).is_file()):
                out.add(re.sub(r"[^\w-]", "_", title))
    return out


def check_dvc_plots(b: Browser, url: str, out: Path, wait: float = 60.0, repo: Path | None = None) -> list[str]:
    """Every plot drawn, no series without data (:func:`series_failures`), every image loaded. A plot whose CSVs
    hold no rows in ``repo`` (a profile without its task) is named, not failed."""
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
    unrun = (no_rows(repo) if repo else set()) & empty & set(blank)
    for i in sorted(unrun):
        print(f"dvc plots: #{i} has no rows in this study (its CSVs hold a header alone): drawn blank")
    blank = [i for i in blank if i not in unrun]
    specs = {i: json.loads(spec) for spec, i in re.findall(r"var spec = (\{.*?\});\s*vegaEmbed\('#([^']+)'", html, re.S)
             if i not in empty}
    if specs and b.evaluate("typeof vegaEmbed === 'function'"):  # else nothing drew (failed above)
        failures += series_failures(b.evaluate(f"({SERIES})({js(specs)})"))
    failures += [f"dvc plots: vega plot #{i} drew nothing" + (
        " (DVC gave it an empty spec: a y column listed under dvc.yaml `plots:` is missing from its CSV)"
        if i in empty else "") for i in blank]
    failures += [f"dvc plots: image {src} did not load" for src in broken]
    print(f"dvc plots: {len(ids) - len(blank) - len(unrun)}/{len(ids) - len(unrun)} vega plots with rows drawn,"
          f" {n_img - len(broken)}/{n_img} images loaded")
    b.screenshot(out / "dvc_plots.png", full_page=True)
    return failures


SCREENS = ("mlflow_runs.png", "mlflow_models.png", "mlflow_metrics.png", "mlflow_scalars.png", "mlflow_student.png",
           "dvc_plots.png")


def tiny_study(dest: Path) -> Path:
    """A tiny copy of this repository reproduced at ``dest`` (reused when it already has its store)."""
    repo = dest / "repo"
    if not (repo / "mlflow.db").is_file():
        print(f"reproducing a tiny copy of the repository in {repo} (minutes)", flush=True)
        tiny.make_repo(repo)
        tiny.dvc(repo, "repro", timeout=3600)
    return repo


def running(store: Path) -> int:
    """How many runs of ``store`` are RUNNING: a study in progress writes to it (not to be screenshot)."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{store.resolve()}")
    ids = [e.experiment_id for e in client.search_experiments()]
    return len(client.search_runs(ids, "attributes.status = 'RUNNING'", max_results=1000)) if ids else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Screenshot and check the MLflow UI and DVC's plots page.")
    parser.add_argument("--store", type=Path, default=Path("mlflow.db"), help="MLflow sqlite store")
    parser.add_argument("--out", type=Path, default=Path("reports/screens"), help="folder for the PNGs")
    parser.add_argument("--repo", type=Path, default=Path("."), help="repository for params.yaml and dvc plots")
    parser.add_argument("--port", type=int, default=PORT, help=f"the MLflow server's port (default {PORT})")
    parser.add_argument("--tiny", type=Path, metavar="DIR",
                        help="reproduce a tiny copy of this repository in DIR and use its store and plots")
    parser.add_argument("--force", action="store_true", help="even while runs of the store are RUNNING")
    args = parser.parse_args(argv)
    if args.tiny:
        args.repo = tiny_study(args.tiny)
        args.store = args.repo / "mlflow.db"
    if not args.store.is_file():
        print(f"error: {args.store}: no MLflow store (run the pipeline first)", file=sys.stderr)
        return 2
    if (n := running(args.store)) and not args.force:
        print(f"error: {args.store}: {n} runs are RUNNING (a study in progress?): wait for it, or --force",
              file=sys.stderr)
        return 2
    ids = find_runs(args.store, train_experiment(args.repo))
    args.out.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []
    with (mlflow_server(args.store, args.port) as url, dvc_plots(args.repo) as plots_url,
          Browser(1600, 1000) as b):
        failures += check_runs_table(b, url, ids, args.out)
        failures += check_model(b, url, ids["exp_id"], ids["run"], args.out)
        failures += check_metrics(b, url, ids["exp_id"], ids["run"], args.out)
        failures += check_scalars(b, url, ids["exp_id"], ids["run"], args.out)
        failures += check_student(b, url, *ids["student"], ids["metrics"], args.out)
        failures += check_dvc_plots(b, plots_url, args.out, repo=args.repo)
    for line in failures:
        print(f"FAIL {line}")
    print(f"screenshots in {args.out}: {' '.join(SCREENS)}"
          f" ({'all checks passed' if not failures else f'{len(failures)} failed'})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
