"""Headless Chromium driven over the Chrome DevTools protocol: open a page, wait for a DOM condition, screenshot.

A small synchronous client (aiohttp's websocket underneath, already installed with DVC) so that checks wait for
what a page draws instead of sleeping: single-page apps like the MLflow UI fill in their tables after their own
API calls, and ``chromium --dump-dom`` alone cannot tell when that has happened.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp

# Flags that work in a container without a GPU, a sandbox or network access.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars",
         # Only this machine resolves: a page that needs a CDN fails here as it would offline.
         "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"]


def chromium_path() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    raise FileNotFoundError("no chromium on PATH (Debian: apt-get install -y chromium)")


class Browser:
    """One headless Chromium with one page; use as a context manager."""

    def __init__(self, width: int = 1600, height: int = 1000, timeout: float = 120.0):
        self.width, self.height, self.timeout = width, height, timeout
        self._ids = itertools.count(1)

    def __enter__(self) -> Browser:
        self._profile = tempfile.mkdtemp(prefix="chromium-")
        self._proc = subprocess.Popen(
            [chromium_path(), *FLAGS, f"--user-data-dir={self._profile}", "--remote-debugging-port=0",
             f"--window-size={self.width},{self.height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port = self._devtools_port()
        pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list"))
        ws_url = next(p["webSocketDebuggerUrl"] for p in pages if p["type"] == "page")
        self._loop = asyncio.new_event_loop()
        self._session = self._run(self._open_session())
        self._ws = self._run(self._session.ws_connect(ws_url, max_msg_size=0))
        self.call("Page.enable")
        self.call("Emulation.setDeviceMetricsOverride",
                  width=self.width, height=self.height, deviceScaleFactor=1, mobile=False)
        return self

    def __exit__(self, *exc) -> None:
        self._run(self._ws.close())
        self._run(self._session.close())
        self._loop.close()
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        shutil.rmtree(self._profile, ignore_errors=True)

    def _devtools_port(self) -> int:
        marker = Path(self._profile) / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if marker.is_file() and (lines := marker.read_text().split()):
                return int(lines[0])
            if self._proc.poll() is not None:
                raise RuntimeError(f"chromium exited with code {self._proc.returncode}")
            time.sleep(0.2)
        raise TimeoutError("chromium did not open its DevTools port")

    @staticmethod
    async def _open_session() -> aiohttp.ClientSession:
        return aiohttp.ClientSession()

    def _run(self, coro):
        return self._loop.run_until_complete(asyncio.wait_for(coro, self.timeout))

    async def _call(self, method: str, params: dict) -> dict:
        msg_id = next(self._ids)
        await self._ws.send_str(json.dumps({"id": msg_id, "method": method, "params": params}))
        async for msg in self._ws:
            data = json.loads(msg.data)
            if data.get("id") == msg_id:
                if "error" in data:
                    raise RuntimeError(f"{method}: {data['error']}")
                return data["result"]
        raise RuntimeError(f"{method}: DevTools connection closed")

    def call(self, method: str, **params: Any) -> dict:
        return self._run(self._call(method, params))

    def evaluate(self, expression: str) -> Any:
        """Value of a JavaScript expression in the page (promises awaited)."""
        out = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in out:
            raise RuntimeError(f"page script failed: {out['exceptionDetails'].get('text')}: {expression[:80]}")
        return out["result"].get("value")

    def open(self, url: str, ready: str, wait: float = 60.0, settle: float = 1.0) -> bool:
        """Load ``url`` afresh and poll the JS expression ``ready`` until it is truthy; False on timeout."""
        self.call("Page.navigate", url="about:blank")  # a hash-only change would not reload a single-page app
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            time.sleep(0.5)
            if self.evaluate(f"Boolean({ready})"):
                time.sleep(settle)  # let late layout (charts, column widths) finish before a screenshot
                return True
        return False

    def wait(self, ready: str, wait: float = 10.0) -> bool:
        """Poll the JS expression ``ready`` on the page as it is until it is truthy; False on timeout."""
        deadline = time.monotonic() + wait
        while not self.evaluate(f"Boolean({ready})"):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)
        return True

    def screenshot(self, path: Path, full_page: bool = False) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": size[0], "height": min(size[1], 6000), "scale": 1})
        data = self.call("Page.captureScreenshot", **params)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path
