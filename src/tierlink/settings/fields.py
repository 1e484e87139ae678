"""Small validators for configuration sections: each error names the field and the fix."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from tierlink.core.types import Tier
from tierlink.errors import ConfigError

__all__ = ["as_bool", "as_float", "as_int", "as_mapping", "as_tier", "as_url", "known",
           "known_keys"]


def as_mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a mapping, got {type(value).__name__}")
    return value


def known(key: str, allowed: tuple[str, ...], where: str) -> bool:
    """``key`` is one of ``allowed``, else a ``ConfigError`` naming its path and the
    nearest valid key: ``routing.polcy: unknown key (did you mean routing.policy?)``."""
    if key not in allowed:
        path = f"{where}.{key}" if where else str(key)
        close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
        guess = f" (did you mean {where + '.' if where else ''}{close[0]}?)" if close else ""
        raise ConfigError(f"{path}: unknown key{guess}", hint=f"use {', '.join(allowed)}")
    return True


def known_keys(raw: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    """Every key of the mapping ``raw`` is one of ``allowed`` (see :func:`known`)."""
    for key in raw:
        known(str(key), allowed, where)


def as_float(value: Any, where: str, lo: float | None = None, hi: float | None = None) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where} must be a number, got {value!r}") from None
    if (lo is not None and out < lo) or (hi is not None and out > hi):
        raise ConfigError(f"{where} = {out} is out of range [{lo}, {hi}]")
    return out


def as_int(value: Any, where: str, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ConfigError(f"{where} must be an integer >= {lo}, got {value!r}")
    return value


def as_bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    return value


def as_tier(value: Any, where: str) -> Tier:
    try:
        return Tier.parse(value)
    except (ValueError, AttributeError) as exc:
        raise ConfigError(f"{where}: {exc}", hint="use device, edge or cloud") from None


def as_url(value: Any, where: str) -> str:
    """An ``http(s)://host[:port]`` base URL (no path, query or credentials), without a
    trailing slash."""
    text = str(value).strip() if isinstance(value, str) else ""
    try:
        parts = urlsplit(text)
        ok = (parts.scheme in ("http", "https") and bool(parts.hostname)
              and not (parts.path.strip("/") or parts.query or parts.fragment
                       or parts.username) and (parts.port is None or parts.port > 0))
    except ValueError:  # a port that is not a number, a malformed address
        ok = False
    if not ok:
        raise ConfigError(f"{where} must be a base URL such as http://edge-1.example:8000, "
                          f"got {value!r}")
    return text.rstrip("/")
