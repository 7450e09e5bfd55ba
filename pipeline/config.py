"""Typed schema for ``params.yaml``: loaded once, validated before any stage does work.

Every section is a frozen, strict pydantic model that rejects unknown keys. ``load_params`` turns any
problem into a single :class:`ConfigError` line naming the key and the reason; stage entry points print
that line and exit non-zero without writing anything (see :mod:`pipeline.stages.common`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

PosInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
PosFloat = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]


class ConfigError(ValueError):
    """A params problem, phrased as one line: ``<file>: <key>: <reason>``."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# --------------------------------------------------------------------------- geometry
class Geometry(Section):
    """Image and patch grid shared by tasks, models and the reachability prediction."""

    image_size: PosInt = 16  # H = W in pixels
    patch_size: PosInt = 4  # P: ViT patch, and the grid the controlled tasks are built against
    channels: PosInt = 3

    @model_validator(mode="after")
    def _divides(self) -> Geometry:
        if self.image_size % self.patch_size:
            raise ValueError(
                f"patch_size: {self.patch_size} does not divide image_size {self.image_size}"
            )
        return self

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size


# --------------------------------------------------------------------------- interface (level 1)
class PairCounts(Section):
    image_size: PosInt = 224
    patch_sizes: list[PosInt] = [4, 8, 16, 32]
    window: PosInt = 7
    extra_image_sizes: list[PosInt] = [384, 512, 1024]  # at extra_patch_size
    extra_patch_size: PosInt = 16


class Interface(Section):
    patch_size: PosInt = 4  # P of the null-space study: D = P * P * channels
    widths: list[PosInt] = [8, 16, 24, 32, 40, 48, 56, 64, 96]  # embedding widths d
    collision_width: PosInt = 16  # d < D for the collision pair (and a full-width control at d >= D)
    embed_dim: PosInt = 32  # width of the attention/ViT modules in the permutation checks
    num_heads: PosInt = 4
    small_tokens: Annotated[int, Field(gt=1, le=7)] = 5  # every permutation (n! of them)
    large_tokens: PosInt = 64
    random_permutations: PosInt = 20
    atol: PosFloat = 1e-5  # float32 tolerance for "equal"
    pair_counts: PairCounts = PairCounts()

    @model_validator(mode="after")
    def _heads(self) -> Interface:
        if self.embed_dim % self.num_heads:
            raise ValueError(f"num_heads: {self.num_heads} does not divide embed_dim {self.embed_dim}")
        return self


# --------------------------------------------------------------------------- models
class ViTParams(Section):
    depth: PosInt = 4
    num_heads: PosInt = 2
    mlp_ratio: PosFloat = 2.0


class SwinParams(Section):
    patch_size: PosInt = 2
    window_size: PosInt = 4
    depths: list[PosInt] = [2, 2]  # blocks per stage; a patch merging between stages
    num_heads: list[PosInt] = [2, 4]
    mlp_ratio: PosFloat = 2.0


class ResNetParams(Section):
    layers: list[PosInt] = [1, 1, 1, 1]


class Models(Section):
    param_target: PosInt = 100_000  # widths are solved so every architecture lands near this count
    param_tolerance: Annotated[float, Field(gt=0, lt=1)] = 0.10
    vit: ViTParams = ViTParams()
    swin: SwinParams = SwinParams()
    resnet: ResNetParams = ResNetParams()

    @model_validator(mode="after")
    def _swin_lists(self) -> Models:
        if len(self.swin.depths) != len(self.swin.num_heads):
            raise ValueError(
                f"swin.num_heads: has {len(self.swin.num_heads)} entries, "
                f"swin.depths has {len(self.swin.depths)}"
            )
        return self


# --------------------------------------------------------------------------- tracking
class Tracking(Section):
    # None: sqlite:///<repository root>/mlflow.db (absolute, so `dvc exp run --queue` copies log to it)
    tracking_uri: str | None = None
    experiment_prefix: str = "bias"


# --------------------------------------------------------------------------- root
class Params(Section):
    seed: NonNegInt = 0
    geometry: Geometry = Geometry()
    interface: Interface = Interface()
    models: Models = Models()
    tracking: Tracking = Tracking()

    @model_validator(mode="after")
    def _cross(self) -> Params:
        g, s = self.geometry, self.models.swin
        if g.image_size % s.patch_size:
            raise ValueError(
                f"models.swin.patch_size: {s.patch_size} does not divide geometry.image_size {g.image_size}"
            )
        grid = g.image_size // s.patch_size
        if s.window_size > grid:
            raise ValueError(
                f"models.swin.window_size: {s.window_size} is larger than the token grid {grid}x{grid}"
            )
        if grid % s.window_size:
            raise ValueError(
                f"models.swin.window_size: {s.window_size} does not divide the token grid {grid}"
            )
        if grid % (2 ** (len(s.depths) - 1)):
            raise ValueError(
                f"models.swin.depths: {len(s.depths)} stages halve the {grid}x{grid} grid too often"
            )
        return self


def _format(err: ValidationError) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
    # A validator message that already starts with a key name ("swin.depths: ...") is more precise.
    if ":" in msg.split(" ")[0]:
        key, _, msg = msg.partition(": ")
        loc = f"{loc}.{key}" if loc else key
    return f"{loc}: {msg}" if loc else msg


def parse_params(raw: object, source: str = "params.yaml") -> Params:
    """Validate an already-loaded mapping; raises :class:`ConfigError` with one line."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: top level must be a mapping of sections, got {type(raw).__name__}")
    try:
        return Params.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(f"{source}: {_format(err)}") from None


def load_params(path: str | Path = "params.yaml") -> Params:
    """Read and validate ``params.yaml`` (safe YAML loading)."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise ConfigError(f"{path}: malformed YAML{where}") from None
    return parse_params(raw if raw is not None else {}, str(path))
