"""Write measured settings into a fleet YAML file, keeping everything else as written:
tuned cascade thresholds with the models they belong to and their calibration records
(``tierlink cascade tune``) and measured feature-codec losses (``tierlink split codecs
--write``).

Uses ruamel.yaml's round-trip mode, so comments, key order and flow style survive (only
the padding inside flow mappings is normalised to one space); the
result is validated with :func:`tierlink.fleet.config.parse_fleet` before it replaces the
file (atomically), so a failed write never leaves a broken fleet file behind.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tierlink.errors import ConfigError


def write_thresholds(path: Path, thresholds: Mapping[str, float],
                     comment: str | None = None) -> str:
    """Set ``routing.thresholds[model] = value`` for each entry (other models' thresholds
    are kept); returns the new file text."""
    return update_routing(path, "thresholds", thresholds, comment)


def write_codec_losses(path: Path, losses: Mapping[str, float],
                       comment: str | None = None) -> str:
    """Set ``routing.split_codec_loss[codec] = points`` for each entry (other codecs'
    figures are kept); returns the new file text."""
    return update_routing(path, "split_codec_loss", losses, comment)


def update_routing(path: Path, key: str, values: Mapping[str, float],
                   comment: str | None = None) -> str:
    """Set ``routing.<key>[name] = value`` (a flow mapping of numbers, rounded to 4 places)
    for each entry, keeping the other entries and the rest of the file; validated, then
    written atomically. Returns the new file text."""
    data, yaml = _load(path)
    routing = _routing(data)
    _set_numbers(routing, key, values)
    if comment:
        routing.yaml_add_eol_comment(comment, key)
    return _dump(path, data, yaml)


def write_cascade(path: Path, thresholds: Mapping[str, float], tuned_on: Mapping[str, str],
                  records: Mapping[str, Mapping[str, float]], comment: str,
                  target: Mapping[str, float] | None = None) -> str:
    """What ``cascade tune`` writes, in one atomic replace: ``routing.thresholds`` (with
    ``comment``: the target, its confidence and the bound reached) and ``routing.cascade``
    — the target (``target``, for a re-tune), the models' sha256 the thresholds were tuned
    on (``tuned_on``) and each model's figures on the calibration inputs that reach it
    (``records``, by path)."""
    from ruamel.yaml.comments import CommentedMap

    data, yaml = _load(path)
    routing = _routing(data)
    _set_numbers(routing, "thresholds", thresholds)
    routing.yaml_add_eol_comment(comment, "thresholds")
    block = CommentedMap()
    if target:  # what a re-tune for other models aims at again
        block["target"] = _flow(dict(target))
    block["tuned_on"] = _flow({m: str(h) for m, h in tuned_on.items()})
    block["records"] = CommentedMap((k, _flow(dict(v))) for k, v in records.items())
    routing["cascade"] = block
    routing.yaml_add_eol_comment("written by `tierlink cascade tune`: the thresholds "
                                 "belong to these models", "cascade")
    return _dump(path, data, yaml)


def promote_policy(path: Path, policy: str | Mapping[str, Any],
                   weights: Mapping[str, float] | None, comment: str) -> str:
    """Make ``policy`` (a name, or ``{name, options}``; with ``weights``, if given) the
    fleet's acting policy and end its shadow mode; the rest of the file as it was. Returns
    the new text."""
    data, yaml = _load(path)
    routing = _routing(data)
    routing["policy"] = policy if isinstance(policy, str) else _flow(
        {"name": policy["name"], "options": _flow(dict(policy.get("options") or {}))})
    if weights:
        routing["weights"] = _flow({k: round(float(v), 4) for k, v in weights.items()})
    routing.pop("shadow", None)
    routing.yaml_add_eol_comment(comment, "policy")
    return _dump(path, data, yaml)


def _load(path: Path) -> tuple[Any, Any]:
    from ruamel.yaml import YAML

    yaml = YAML()  # round-trip
    yaml.preserve_quotes = True
    yaml.indent(mapping=2, sequence=4, offset=2)  # "  - item" under a key, as people write it
    yaml.width = 4096  # never fold a long flow mapping (a link list) onto two lines
    try:
        data = yaml.load(Path(path).read_text())
    except (OSError, Exception) as exc:  # ruamel raises many error types
        raise ConfigError(f"cannot read fleet file {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"fleet file {path} is not a YAML mapping")
    return data, yaml


def _routing(data: Any) -> Any:
    from ruamel.yaml.comments import CommentedMap

    return data.setdefault("routing", CommentedMap())


def _flow(values: Mapping[str, Any]) -> Any:
    from ruamel.yaml.comments import CommentedMap

    out = CommentedMap(values)
    out.fa.set_flow_style()
    return out


def _set_numbers(routing: Any, key: str, values: Mapping[str, float]) -> None:
    current = routing.get(key)
    if not isinstance(current, dict):
        current = _flow({})
        routing[key] = current
    for name, value in values.items():
        current[name] = round(float(value), 4)


def _dump(path: Path, data: Any, yaml: Any) -> str:
    from tierlink.fleet.config import parse_fleet

    out = io.StringIO()
    yaml.dump(data, out)
    text = out.getvalue()
    parse_fleet(_plain(text), source=str(path))  # never write a fleet that does not load
    _replace(Path(path).resolve(), text)  # through a symlink, not over it
    return text


def _plain(text: str) -> Any:
    import yaml as pyyaml

    return pyyaml.safe_load(text)


def _replace(path: Path, text: str) -> None:
    from tierlink.durable import replace_synced

    try:
        replace_synced(path, text.encode())
    except OSError as exc:
        path.with_name(f".{path.name}.tmp").unlink(missing_ok=True)
        raise ConfigError(f"cannot write fleet file {path}: {exc}") from exc
