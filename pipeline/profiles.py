"""Profiles: ``params.yaml`` with a short overlay on top, composed into the full params file a profile runs with.

``profiles/<name>.yaml`` holds only what the profile changes (docs/methods.md). :func:`compose` lays it over
``params.yaml``: a mapping merges key by key, a list or scalar replaces the base's value, and a mapping tagged
``!replace`` is taken whole (how a profile drops or adds architectures, grids or students; it may name a key the
base lacks). Any other key the base lacks is refused, naming the overlay and the key: a misspelt key would
otherwise add nothing. ``params.yaml`` stays the one file ``dvc repro`` reads and ``dvc exp run -S`` edits.

The overlay's first header line says what the profile is (``bias profile`` lists it); its ``# last run:`` line
cites what its latest committed run took and found (``tests/test_profiles.py`` checks it against
``reports/<name>/``).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from pipeline.config import Params, StrictLoader, load_params, parse_params, read_params_text
from pipeline.errors import ConfigError

DIR = "profiles"  # the overlays, beside params.yaml
REPLACE = "!replace"


class Replace(dict):
    """A mapping the overlay gives whole (``!replace``): it replaces the base's instead of merging into it."""


class OverlayLoader(StrictLoader):
    """The params loader (duplicate keys refused) that also reads ``!replace`` mappings."""


def _replace(loader: OverlayLoader, node: yaml.Node) -> Replace:
    if not isinstance(node, yaml.MappingNode):
        raise yaml.constructor.ConstructorError(None, None, f"{REPLACE} tags a mapping only", node.start_mark)
    return Replace(loader.construct_mapping(node, deep=True))


OverlayLoader.add_constructor(REPLACE, _replace)


class OverlayDumper(yaml.SafeDumper):
    """Writes :class:`Replace` mappings with their tag."""


OverlayDumper.add_representer(Replace, lambda dumper, data: dumper.represent_mapping(REPLACE, dict(data)))


def dump(overlay: dict) -> str:
    """An overlay as YAML text (``!replace`` kept)."""
    return yaml.dump(overlay, Dumper=OverlayDumper, sort_keys=False)


def overlay_path(root: Path, name: str) -> Path:
    return root / DIR / f"{name}.yaml"


def names(root: Path) -> list[str]:
    """Every profile of the repository at ``root``, by name."""
    return sorted(p.stem for p in (root / DIR).glob("*.yaml"))


def base_of(overlay: Path) -> Path:
    """The ``params.yaml`` an overlay composes onto: its repository's, beside ``profiles/``."""
    return overlay.parent.parent / "params.yaml"


def read_overlay(path: Path) -> dict:
    text = read_params_text(path)
    try:
        raw = yaml.load(text, Loader=OverlayLoader)  # noqa: S506  a SafeLoader subclass
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise ConfigError(f"{path}: malformed YAML{where}: {getattr(err, 'problem', None) or err}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: an overlay is a mapping of the params.yaml keys it changes")
    return raw


def merge(base: dict, overlay: dict, source: Path, at: str = "") -> dict:
    """``base`` with ``overlay`` laid over it (the module's rules); neither argument is changed."""
    out = dict(base)
    for key, value in overlay.items():
        where = f"{at}.{key}" if at else str(key)
        if isinstance(value, Replace):
            out[key] = _plain(value)
        elif key not in base:
            raise ConfigError(f"{source}: {where}: not a key of params.yaml (tag a mapping {REPLACE} to give it "
                              f"whole)")
        elif isinstance(value, dict) and isinstance(base[key], dict):
            out[key] = merge(base[key], value, source, where)
        else:
            out[key] = _plain(value)
    return out


def _plain(value):
    """``value`` without :class:`Replace` marks (nested ones included), as the params loader would read it."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def compose(overlay: Path) -> dict:
    """The full params of a profile: its repository's ``params.yaml`` (validated first) with ``overlay`` over it."""
    base = base_of(overlay)
    load_params(base)  # a broken base is named as the base, not as the profile
    raw = yaml.load(read_params_text(base), Loader=StrictLoader)  # noqa: S506  a SafeLoader subclass
    return merge(raw, read_overlay(overlay), overlay)


def load(path: str | Path) -> Params:
    """A params file, or an overlay (a file under ``profiles/``) composed onto its repository's ``params.yaml``,
    validated; a bad key is named with the overlay's path."""
    path = Path(path)
    if path.parent.name == DIR and base_of(path).is_file():
        return parse_params(compose(path), str(path))
    return load_params(path)


def write(composed: dict, dest: Path, overlay: Path) -> None:
    """The composed params as a file a stage reads (generated: edit params.yaml or the overlay instead)."""
    head = f"# Generated from params.yaml and {DIR}/{overlay.name} (pipeline/profiles.py); edit those, not this.\n"
    dest.write_text(head + yaml.safe_dump(composed, sort_keys=False))


def headline(overlay: Path) -> str:
    """The first line of the overlay's header comment: what the profile is."""
    for line in overlay.read_text().splitlines():
        return line.lstrip("#").strip() if line.startswith("#") else ""
    return ""
