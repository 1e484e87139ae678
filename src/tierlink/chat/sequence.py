"""One sequence a device keeps on an upstream node's language model — drafts it verifies
(``chat/verify.py``), a split's upper layers it runs (``chat/splitting.py``): calls over the
node's pooled HTTP session with the sequence's failures named as the error tree names them,
and the sequence freed there when the answer ends."""

from __future__ import annotations

from typing import Any

import aiohttp

from tierlink.errors import UpstreamTimeout, UpstreamUnavailable


class UpstreamSequence:
    """``url``: the route on the upstream (``…/verify``, ``…/split``); ``what`` names the
    upstream's role in errors (``verifier``, ``split upstream``)."""

    def __init__(self, http: aiohttp.ClientSession, url: str, key: str, timeout_s: float,
                 server_hostname: str | None, what: str) -> None:
        self.http = http
        self.url = url
        self.key = key
        self.timeout_s = timeout_s
        self.server_hostname = server_hostname  # the upstream's identity, checked by TLS
        self.what = what
        self.server_s = 0.0  # the upstream's own time on this sequence's calls

    async def call(self, **request: Any) -> dict[str, Any]:
        """POST ``request`` (aiohttp's ``json=``, ``data=``, ``params=``); its JSON answer."""
        try:
            async with self.http.post(self.url,
                                      timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                                      server_hostname=self.server_hostname, **request) as r:
                data = await r.json(content_type=None)
                if r.status != 200:
                    raise UpstreamUnavailable(f"{self.what} answered {r.status}: "
                                              f"{data.get('error', data)}")
        except TimeoutError as exc:
            raise UpstreamTimeout(f"{self.what} did not answer in {self.timeout_s} s") \
                from exc
        except (aiohttp.ClientError, ValueError) as exc:
            raise UpstreamUnavailable(f"{self.what} unreachable: {exc}") from exc
        self.server_s += float(data.get("server_ms", 0.0)) / 1e3
        return dict(data)

    async def close(self) -> None:
        """Free the sequence there (best effort: the upstream evicts idle ones anyway)."""
        try:
            async with self.http.delete(f"{self.url}/{self.key}",
                                        timeout=aiohttp.ClientTimeout(total=2.0),
                                        server_hostname=self.server_hostname):
                pass
        except (aiohttp.ClientError, TimeoutError):
            pass
