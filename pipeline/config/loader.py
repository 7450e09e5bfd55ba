"""Reading a params file: strict YAML (duplicate keys refused), then the schema; any problem is one
:class:`ConfigError` line naming the file and the key."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from pipeline.config.params import Params
from pipeline.errors import ConfigError
from pipeline.io import check_kind


def _format(err: ValidationError) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
    elif first["type"] == "missing":
        msg = "missing (params.yaml holds every value; the schema has no defaults)"
    # A validator message that already starts with a key name ("swin.depths: ...") is more precise.
    key, sep, rest = msg.partition(": ")
    if sep and key.split(".", 1)[0].isidentifier():  # "archs.v it: ..." (a key may hold a space)
        msg, loc = rest, f"{loc}.{key}" if loc else key
    return f"{loc}: {msg}" if loc else msg


def parse_params(raw: object, source: str = "params.yaml") -> Params:
    """Validate an already-loaded mapping; raises :class:`ConfigError` with one line."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: top level must be a mapping of sections, got {type(raw).__name__}")
    try:
        return Params.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(f"{source}: {_format(err)}") from None


MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKey(yaml.YAMLError):
    """A mapping names one key twice: ``safe_load`` would keep the last value without a word (DVC refuses it)."""

    def __init__(self, key: object, first: int, second: int):
        super().__init__(f"duplicate key {key!r} at lines {first} and {second}")


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key repeated within one mapping (``<<`` merges may still override)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[object, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark.line + 1)
                except TypeError:  # an unhashable key: SafeLoader's own error names it
                    continue
                if first != key_node.start_mark.line + 1:
                    raise DuplicateKey(key, first, key_node.start_mark.line + 1)
        return super().construct_mapping(node, deep)


def read_params_text(path: Path) -> str:
    """The text of a params file, or one :class:`ConfigError` line naming the file (missing, not a file,
    unreadable, binary, not UTF-8)."""
    if not path.exists():
        raise ConfigError(f"{path}: file not found")
    check_kind(path, error=ConfigError)  # a FIFO would block the read below
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read ({err.strerror or err})") from None
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise ConfigError(f"{path}: UTF-16 text; save it as UTF-8")
    if b"\0" in data:
        raise ConfigError(f"{path}: holds NUL bytes (binary, or UTF-16 without a BOM), not UTF-8 YAML text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text (byte {err.start})") from None


def load_params(path: str | Path = "params.yaml") -> Params:
    """Read and validate ``params.yaml`` (safe YAML loading, duplicate keys refused): every stage's one loader."""
    path = Path(path)
    text = read_params_text(path)
    try:
        raw = yaml.load(text, Loader=StrictLoader)  # noqa: S506  a SafeLoader subclass
    except DuplicateKey as err:
        raise ConfigError(f"{path}: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise ConfigError(f"{path}: malformed YAML{where}") from None
    except RecursionError:  # thousands of nested brackets
        raise ConfigError(f"{path}: malformed YAML (nested too deeply)") from None
    return parse_params(raw if raw is not None else {}, str(path))
