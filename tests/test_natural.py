"""Natural images (CIFAR-10): where the archive comes from, the subgroups of the test set, resolution change."""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import json
import pickle
import tarfile
import threading
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipeline.config import NaturalParams
from pipeline.errors import StageError
from pipeline.stages import generate as gen_stage
from pipeline.tasks import natural
from pipeline.tasks.natural import CLASSES


# --------------------------------------------------------------------------- archives
def fake_python_archive(path: Path, per_class: int = 2) -> np.ndarray:
    """A tiny ``cifar-10-python.tar.gz`` with the official layout (pickled batches of R, G, B planes).

    Returns the test images (10 * per_class, 32, 32, 3) in archive order.
    """
    rng = np.random.default_rng(7)
    test = None
    with tarfile.open(path, "w:gz") as tar:
        for name in ("batches.meta", "data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4",
                     "data_batch_5", "test_batch"):
            if name == "batches.meta":
                payload = {b"label_names": [c.encode() for c in CLASSES]}
            else:
                labels = np.repeat(np.arange(10), per_class)
                imgs = rng.integers(0, 256, (len(labels), 32, 32, 3), dtype=np.uint8)
                payload = {b"data": imgs.transpose(0, 3, 1, 2).reshape(len(labels), -1),
                           b"labels": labels.tolist()}
                test = imgs if name == "test_batch" else test
            blob = pickle.dumps(payload)
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return test


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def cfg(paths: list[Path], url: str = "http://127.0.0.1:9/cifar-10-python.tar.gz",
        digest: str = "c58f30108f718f92721af3b95e74349a") -> NaturalParams:
    return NaturalParams(path=[str(p) for p in paths], url=url, md5=digest, per_class_train=2,
                         per_class_test=2)


def test_default_candidates_and_official_checksum():
    c = NaturalParams()
    assert c.path == ["../shared/data/cifar10_jpg.tar.gz", "data/raw/cifar-10-python.tar.gz"]
    assert c.md5 == "c58f30108f718f92721af3b95e74349a" and c.url.endswith("/cifar-10-python.tar.gz")
    assert NaturalParams(path="a.tar.gz").path == ["a.tar.gz"]  # one string is one candidate
    repo = yaml.safe_load(Path("params.yaml").read_text())["tasks"]["natural"]
    assert (repo["path"], repo["md5"], repo["url"]) == (c.path, c.md5, c.url)


def test_candidates_tried_in_order(tmp_path):
    first, second, third = (tmp_path / f"{k}.tar.gz" for k in "abc")
    fake_python_archive(second)
    fake_python_archive(third)
    assert natural.resolve_path(cfg([first, second, third])) == second  # first missing: skipped
    fake_python_archive(first)
    assert natural.resolve_path(cfg([first, second, third])) == first
    assert natural.candidate_paths(cfg([first, second])) == [first, second]


@contextmanager
def http_server(folder: Path):
    """A local HTTP server for ``folder`` on 127.0.0.1 (no network): the URL of its root."""
    handler = functools.partial(QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # keep pytest's output to the test's own
        pass


@pytest.mark.parametrize("scheme", ["file", "http"])
def test_download_lands_in_last_candidate(tmp_path, scheme):
    """file://: the issue's local-archive test; http://127.0.0.1: torchvision's own downloader end to end."""
    src = tmp_path / "mirror" / "cifar-10-python.tar.gz"
    src.parent.mkdir()
    test = fake_python_archive(src)
    dest = tmp_path / "repo" / "data" / "raw" / "cifar-10-python.tar.gz"
    with http_server(src.parent) as root:
        url = src.as_uri() if scheme == "file" else f"{root}/{src.name}"
        c = cfg([tmp_path / "nowhere.tar.gz", dest], url=url, digest=md5(src))
        assert natural.resolve_path(c) == dest and dest.read_bytes() == src.read_bytes()
    assert sorted(p.name for p in dest.parent.iterdir()) == [dest.name]  # no temporary left behind
    images, table = natural.read_cifar10(dest, 2, 2)
    np.testing.assert_array_equal(images[(table["split"] == "test").to_numpy()], test)


@pytest.mark.parametrize("case", ["checksum file", "checksum http", "offline"])
def test_refusal_is_one_line_and_writes_nothing(tmp_path, capsys, case):
    src = tmp_path / "mirror" / "cifar-10-python.tar.gz"
    src.parent.mkdir()
    fake_python_archive(src)
    with http_server(src.parent) as root:
        # checksum: an archive arrives but it is not the published one; offline: nothing listens on port 9
        url = {"checksum file": src.as_uri(), "checksum http": f"{root}/{src.name}",
               "offline": "http://127.0.0.1:9/cifar-10-python.tar.gz"}[case]
        _refused(tmp_path, capsys, url, case)


def _refused(tmp_path: Path, capsys, url: str, case: str) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    dest = repo / "data" / "raw" / "cifar-10-python.tar.gz"
    with pytest.raises(StageError) as err:
        natural.resolve_path(cfg([dest], url=url))
    msg = str(err.value)
    assert "\n" not in msg and "tasks.natural.url" in msg and url in msg and "tasks.natural.path" in msg
    assert ("checksum" in msg) == case.startswith("checksum"), msg
    assert list(repo.iterdir()) == []  # not even data/raw/

    # the data stage: exit 2, the one line, no output folder
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"tasks": {"natural": {"path": [str(dest)], "url": url}}}))
    out = repo / "data" / "tasks" / "natural"
    assert gen_stage.main(["--params", str(params), "--task", "natural", "--out", str(out)]) == 2
    line = capsys.readouterr().err.strip()
    assert line.count("\n") == 0 and line.startswith("error: tasks.natural.path") and url in line
    assert list(repo.iterdir()) == []


def test_stage_stores_native_eval_images(tmp_path):
    src = tmp_path / "c.tar.gz"
    test = fake_python_archive(src, per_class=3)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"tasks": {"natural": {"path": [str(tmp_path / "no.tar.gz"), str(src)],
                                                            "per_class_train": 2, "per_class_test": 3}}}))
    out = tmp_path / "natural"
    assert gen_stage.main(["--params", str(params), "--task", "natural", "--out", str(out)]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["archive"]["path"] == str(src)
    images = np.load(out / "images.npy")
    index = np.load(out / "native_eval_index.npy")
    assert images.shape[1] == 16 and len(index) == 30
    np.testing.assert_array_equal(natural.native_images(out, index), test)  # class-sorted == archive order
    np.testing.assert_array_equal(natural.resize(natural.native_images(out, index), 16), images[index])
    with pytest.raises(StageError, match="eval rows only"):
        natural.native_images(out, np.array([0]))
