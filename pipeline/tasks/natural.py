"""``natural``: CIFAR-10 (Krizhevsky 2009), read straight from its archive, resized to the study's geometry.

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

import io
import pickle
import re
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.config import Geometry, NaturalParams
from pipeline.errors import StageError
from pipeline.tasks.common import ROLE_EVAL, ROLE_FIT, TaskData

CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
SLICE_FACTORS = ["class"]
SOURCE = 32  # CIFAR images are 32 x 32 RGB

_JPG = re.compile(r"(?:^|/)(train|test)/([a-z]+)/(\d+)\.jpe?g$")
_BATCH = re.compile(r"(?:^|/)(data_batch_[1-5]|test_batch)$")


def resolve_path(cfg: NaturalParams) -> Path:
    """``tasks.natural.path``, relative to the repository root (also inside DVC's experiment copies)."""
    from pipeline.tracking import repo_root

    path = Path(cfg.path)
    return path if path.is_absolute() else repo_root() / path


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
    from PIL import Image

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


def generate(n: int, seed: int, geometry: Geometry, cfg: NaturalParams) -> TaskData:
    """The kept CIFAR-10 images at ``geometry.image_size``. ``n`` and ``seed`` do not choose images (the
    pool is fixed by ``per_class_train``/``per_class_test`` in archive order); the signature is shared."""
    images, table = read_cifar10(resolve_path(cfg), cfg.per_class_train, cfg.per_class_test)
    factors = pd.DataFrame({
        "split": table["split"], "class": table["class"], "index": table["index"],
        "id": True,
        "role": np.where(table["split"] == "train", ROLE_FIT, ROLE_EVAL),
    })
    labels = table["label"].to_numpy(dtype=np.int64)
    return TaskData(resize(images, geometry.image_size), labels, factors, list(CLASSES))
