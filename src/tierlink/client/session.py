"""How both application clients open their ``httpx`` pool, and where httpx's errors become
tierlink errors (``raise ... from exc`` at the one boundary)::

    a URL that is not http(s)://host[:port]       → ConfigError (at construction)
    node:          timeout                        → UpstreamTimeout
                   refused / reset / broken       → UpstreamUnavailable
    control plane: any failure to exchange        → ControlPlaneError

The error's hint says what to check (is a node / control plane serving at that URL?) and
``details["url"]`` names the call. Non-2xx answers are not errors here: the parsers in
:mod:`tierlink.client.wire` read them.
"""

from __future__ import annotations

from typing import Any

import httpx

from tierlink.client.wire import NODE, Call
from tierlink.errors import (
    ConfigError,
    ControlPlaneError,
    TierlinkError,
    UpstreamTimeout,
    UpstreamUnavailable,
)

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MAX_CONNECTIONS = 100
# Errors httpx raises for a request it cannot make or complete.
HTTPX_ERRORS = (httpx.HTTPError, httpx.InvalidURL)


def checked_url(url: str, name: str) -> str:
    """``url`` without its trailing slash; a :class:`ConfigError` naming ``name`` unless it
    is ``http(s)://host[:port][/prefix]``."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as exc:
        raise ConfigError(f"{name} {url!r} is not a URL: {exc}",
                          hint="give the node's base URL, e.g. http://127.0.0.1:8000") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigError(f"{name} {url!r} is not an http(s)://host:port URL",
                          hint="give the base URL, e.g. http://127.0.0.1:8000")
    return str(url).rstrip("/")


def pool_options(timeout_s: float, max_connections: int) -> dict[str, Any]:
    """Keyword arguments of ``httpx.Client`` / ``httpx.AsyncClient``: one keep-alive pool for
    the node and the control plane. ``trust_env=False``: a proxy from the environment must
    not sit between an application and its node (usually on loopback or the site's LAN).
    ``Accept-Encoding: identity``: tensors compress poorly; the node sends them plain."""
    if not timeout_s > 0 or max_connections < 1:
        raise ConfigError(f"the client needs timeout_s > 0 and max_connections >= 1, got "
                          f"{timeout_s} and {max_connections}")
    return {"timeout": httpx.Timeout(timeout_s), "trust_env": False,
            "limits": httpx.Limits(max_connections=max_connections),
            "headers": {"Accept-Encoding": "identity"}}


def timeout(call: Call[Any], default_s: float) -> httpx.Timeout:
    """The call's own timeout, else the client's: each of connect, write and read."""
    return httpx.Timeout(call.timeout_s if call.timeout_s is not None else default_s)


def transport_error(exc: Exception, call: Call[Any]) -> TierlinkError:
    """The tierlink error for an exchange that failed before an answer was read."""
    what = f"{call.method} {call.url}"
    reason = f"{type(exc).__name__}: {str(exc) or 'connection lost'}"
    if call.target != NODE:
        return ControlPlaneError(f"{what} failed: {reason}", url=call.url)
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamTimeout(f"{what} got no answer in time ({reason})",
                               hint="raise timeout_s, or check the node's load", url=call.url)
    return UpstreamUnavailable(f"{what} failed: {reason}",
                               hint="is a tierlink node serving at that URL? (`tierlink node`)",
                               url=call.url)


def closed_error(kind: str) -> TierlinkError:
    return TierlinkError(f"this {kind} is closed", hint=f"make a new {kind}, or use it "
                                                        "inside its `with` block")


__all__ = ["DEFAULT_MAX_CONNECTIONS", "DEFAULT_TIMEOUT_S", "HTTPX_ERRORS", "checked_url",
           "closed_error", "pool_options", "timeout", "transport_error"]
