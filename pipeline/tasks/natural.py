"""``natural``: CIFAR-10 (Krizhevsky 2009), read straight from its archive, resized to the study's geometry.

``tasks.natural.path`` lists candidate archives, tried in order; when none exists the official
``cifar-10-python.tar.gz`` is downloaded from ``tasks.natural.url`` (torchvision's downloader) to the
last candidate and checked against ``tasks.natural.md5`` (offline or a mismatch: one error line, nothing
written).

Two archive formats are accepted (detected from the member names, no unpacking):
- a JPEG tarball ``train/<class>/NNNN.jpg``, ``test/<class>/NNNN.jpg`` (the shared ``cifar10_jpg.tar.gz``);
- the official python archive ``cifar-10-batches-py/data_batch_1..5``, ``test_batch`` (pickled dicts,
  rows of 3072 bytes: the R, G, B planes of a 32 x 32 image).

The first ``per_class_train`` / ``per_class_test`` images of each class are kept, in archive order (file
number for JPEG, batch order for python), independent of the seed. Rows are ordered split, class, index.
Resizing is exact integer area averaging when the size divides 32 (32 -> 16: each output pixel is the
mean of a 2 x 2 block, rounded half up: ``(a + b + c + d + 2) // 4``) and pixel repetition when 32
divides the size. JPEG decoding goes through Pillow's bundled libjpeg-turbo; the images' sha256 in
meta.json exposes any decoder difference between machines.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import re
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import numpy as np
import pandas as pd
from PIL import Image
from pydantic import Field, field_validator

from pipeline.errors import StageError
from pipeline.repository import repo_root
from pipeline.sections import Geometry, NonNegInt, Section, TaskSection
from pipeline.tasks.common import ROLE_EVAL, ROLE_FIT, TaskData

CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
SLICE_FACTORS = ["class"]
SOURCE = 32  # CIFAR images are 32 x 32 RGB
NATIVE = "native_eval"  # data-stage file stem of the eval rows at SOURCE px (resolution evaluation)

_JPG = re.compile(r"(?:^|/)(train|test)/([a-z]+)/(\d+)\.jpe?g$")
_BATCH = re.compile(r"(?:^|/)(data_batch_[1-5]|test_batch)$")


class Augment(Section):
    """Label-preserving training views (pipeline.learner.augment_views), drawn per (seed, step): the standard
    CIFAR recipe of a random crop of the image padded with black, and a left-right mirror."""

    crop_pad: NonNegInt  # px of black on each side before a random crop back to size (0: no crop)
    flip: bool  # mirror left-right with probability 1/2

    @property
    def on(self) -> bool:
        return bool(self.crop_pad or self.flip)


class NaturalParams(TaskSection):
    """CIFAR-10 from an archive outside the repository (never committed), downloaded when none is found."""

    # Candidate archives, tried in order, relative to the repository root (jpg tarball or python archive);
    # when none exists the official archive is downloaded to the last one. A single string is one candidate.
    path: Annotated[list[str], Field(min_length=1)]
    url: str  # the official archive
    md5: Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")] = "c58f30108f718f92721af3b95e74349a"  # published
    per_class_train: Annotated[int, Field(ge=1, le=5000)]  # first k per class of the official train
    per_class_test: Annotated[int, Field(ge=1, le=1000)]  # ... and of the official test split
    augment: Augment  # training views of every run on natural (a grid with augment: false turns them off)

    @field_validator("path", mode="before")
    @classmethod
    def _one_path(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @property
    def n(self) -> int:
        """Pool size (CIFAR-10 has 10 classes)."""
        return 10 * (self.per_class_train + self.per_class_test)


def fits(params) -> list[tuple[bool, str, str]]:
    """(bad, key, why): CIFAR's 32 px must map to the geometry by whole blocks or repetition."""
    h = params.geometry.image_size
    return [("natural" in params.tasks.names and 32 % h and h % 32, "geometry.image_size",
             f"{h} is neither a divisor nor a multiple of CIFAR's 32 px")]


def candidate_paths(cfg: NaturalParams) -> list[Path]:
    """``tasks.natural.path``: candidate archives in the order tried, relative to the repository root (also
    inside DVC's experiment copies)."""
    return [p if p.is_absolute() else repo_root() / p for p in map(Path, cfg.path)]


def resolve_path(cfg: NaturalParams) -> Path:
    """The first candidate that exists; none: the official archive is downloaded to the last candidate."""
    paths = candidate_paths(cfg)
    for path in paths:
        if path.is_file():
            return path
    try:
        return download_archive(cfg.url, cfg.md5, paths[-1])
    except StageError as err:
        raise StageError(f"tasks.natural.path: no archive at {', '.join(map(str, paths))}; {err}") from None


def download_archive(url: str, md5: str, dest: Path) -> Path:
    """Fetch ``url`` with torchvision's downloader into ``dest`` and check its md5; all or nothing.

    The file is downloaded into a temporary folder beside ``dest`` and moved in only once its checksum
    matched, so an offline machine, a truncated transfer or a wrong archive leaves nothing behind (not even
    the folders created for it). Raises :class:`StageError` naming ``tasks.natural.url`` and what to do.
    """
    from torchvision.datasets.utils import check_integrity, download_url

    made = [p for p in (dest.parent, *dest.parent.parents) if not p.exists()]
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        if url.startswith("file:"):  # a local mirror: torchvision's downloader reads HTTP(S) only
            urllib.request.urlretrieve(url, tmp / dest.name)  # noqa: S310 (file:// is the offline test path by design)
            if not check_integrity(str(tmp / dest.name), md5):
                raise RuntimeError("checksum mismatch")
        else:  # its tqdm bar goes to a buffer: a failure must stay one line on stderr
            with contextlib.redirect_stderr(io.StringIO()):
                download_url(url, str(tmp), filename=dest.name, md5=md5)  # RuntimeError on a bad md5
        (tmp / dest.name).replace(dest)
    except (urllib.error.URLError, OSError, RuntimeError, ValueError) as err:
        reason = "checksum mismatch" if isinstance(err, RuntimeError) else f"{type(err).__name__}: {err}"
        raise StageError(
            f"tasks.natural.url: could not fetch {url} into {dest} ({reason}); download it by hand "
            f"(md5 {md5}) to {dest}, or list an existing copy in tasks.natural.path") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        for folder in made:  # innermost first: only the folders this call created, and only if empty
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
    print(f"tasks.natural: downloaded {url} -> {dest} (md5 {md5} verified)")
    return dest


def read_cifar10(path: Path, per_class_train: int, per_class_test: int) -> tuple[np.ndarray, pd.DataFrame]:
    """Images uint8 (N, 32, 32, 3) and a table (split, label, class, index) sorted by split, label, index."""
    if not path.is_file():
        raise StageError(
            f"tasks.natural.path: {path} not found; put CIFAR-10 there (cifar10_jpg.tar.gz with "
            "train/<class>/NNNN.jpg, or the official cifar-10-python.tar.gz) or point tasks.natural.path at it"
        )
    keep = {"train": per_class_train, "test": per_class_test}
    try:
        with tarfile.open(path, "r:*") as tar:
            names = tar.getnames()
            if any(_BATCH.search(n) for n in names):
                images, rows = _read_batches(tar, keep)
            elif any(_JPG.search(n) for n in names):
                images, rows = _read_jpgs(tar, keep)
            else:
                raise StageError(f"tasks.natural.path: {path} holds neither train/<class>/*.jpg "
                                 "nor CIFAR-10 python batches")
    except (tarfile.TarError, OSError, EOFError) as err:
        raise StageError(f"tasks.natural.path: {path} is not a readable tar archive ({err})") from None
    table = pd.DataFrame(rows, columns=["split", "label", "index"])
    order = np.lexsort((table["index"], table["label"], table["split"] != "train"))
    table = table.iloc[order].reset_index(drop=True)
    table["class"] = np.array(CLASSES)[table["label"]]
    counts = table.groupby(["split", "label"]).size()
    for split, want in keep.items():
        have = counts.get(split, pd.Series(dtype=int)).reindex(range(len(CLASSES)), fill_value=0)
        if (have < want).any():
            raise StageError(f"tasks.natural.per_class_{split}: {want} requested, archive has "
                             f"{int(have.min())} for class {CLASSES[int(have.idxmin())]}")
    return np.stack(images)[order], table


def _read_jpgs(tar: tarfile.TarFile, keep: dict[str, int]) -> tuple[list[np.ndarray], list[tuple]]:
    images, rows = [], []
    for member in tar:
        hit = _JPG.search(member.name)
        if not hit or hit[2] not in CLASSES or int(hit[3]) >= keep[hit[1]]:
            continue
        with Image.open(io.BytesIO(tar.extractfile(member).read())) as im:
            images.append(np.asarray(im.convert("RGB"), dtype=np.uint8))
        rows.append((hit[1], CLASSES.index(hit[2]), int(hit[3])))
    return images, rows


def _read_batches(tar: tarfile.TarFile, keep: dict[str, int]) -> tuple[list[np.ndarray], list[tuple]]:
    members = sorted((m for m in tar.getmembers() if _BATCH.search(m.name)), key=lambda m: m.name)
    images, rows = [], []
    seen = {"train": np.zeros(len(CLASSES), int), "test": np.zeros(len(CLASSES), int)}
    for member in members:  # data_batch_1..5 sort before test_batch
        split = "test" if member.name.endswith("test_batch") else "train"
        # The official archive is pickled; only open archives you trust (the sha256 is recorded).
        batch = pickle.load(tar.extractfile(member), encoding="bytes")
        data = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, SOURCE, SOURCE).transpose(0, 2, 3, 1)
        labels = np.asarray(batch[b"labels"], dtype=np.int64)
        for c in range(len(CLASSES)):  # per class: running index across batches, keep the first ones
            where = np.flatnonzero(labels == c)
            index = seen[split][c] + np.arange(len(where))
            kept = index < keep[split]
            images.extend(data[where[kept]])
            rows.extend((split, c, int(i)) for i in index[kept])
            seen[split][c] += len(where)
    return images, rows


def resize(images: np.ndarray, size: int) -> np.ndarray:
    """(N, S, S, C) uint8 -> (N, size, size, C): exact block mean (rounded half up) or pixel repetition."""
    n, s, _, c = images.shape
    if size == s:
        return images
    if s % size == 0:
        f = s // size
        blocks = images.reshape(n, size, f, size, f, c).sum(axis=(2, 4), dtype=np.uint32)
        return ((blocks + f * f // 2) // (f * f)).astype(np.uint8)
    if size % s == 0:
        f = size // s
        return images.repeat(f, axis=1).repeat(f, axis=2)
    raise ValueError(f"geometry.image_size: {size} is neither a divisor nor a multiple of {s}")


@dataclass(frozen=True)
class NaturalData(TaskData):
    """A CIFAR-10 pool plus its eval rows at the native 32 px, for the resolution evaluation.

    extra_arrays: ``native_eval`` uint8 (M, 32, 32, 3) and ``native_eval_index`` int64 (M,), the pool rows
    they belong to (increasing); the data stage saves each as ``<name>.npy`` beside ``images.npy``.
    """

    extra_arrays: dict[str, np.ndarray] = field(default_factory=dict)


def native_images(folder: Path, index: np.ndarray) -> np.ndarray:
    """The native 32 px images of pool rows ``index`` (eval rows only) from a data folder ``data/tasks/natural``."""
    have = np.load(folder / f"{NATIVE}_index.npy")
    pos = np.searchsorted(have, index)
    if (pos >= len(have)).any() or (have[np.minimum(pos, len(have) - 1)] != index).any():
        raise StageError(f"{folder}: native images are stored for eval rows only; asked for other rows")
    return np.load(folder / f"{NATIVE}.npy", mmap_mode="r")[pos]


def generate(n: int, seed: int, geometry: Geometry, cfg: NaturalParams) -> NaturalData:
    """The kept CIFAR-10 images at ``geometry.image_size``. ``n`` and ``seed`` do not choose images (the
    pool is fixed by ``per_class_train``/``per_class_test`` in archive order); the signature is shared."""
    images, table = read_cifar10(resolve_path(cfg), cfg.per_class_train, cfg.per_class_test)
    evals = np.flatnonzero(table["split"].to_numpy() != "train")
    factors = pd.DataFrame({
        "split": table["split"], "class": table["class"], "index": table["index"],
        "id": True,
        "role": np.where(table["split"] == "train", ROLE_FIT, ROLE_EVAL),
    })
    labels = table["label"].to_numpy(dtype=np.int64)
    native = {NATIVE: images[evals], f"{NATIVE}_index": evals.astype(np.int64)}
    return NaturalData(resize(images, geometry.image_size), labels, factors, list(CLASSES), native)
