"""What a sender may claim about a request, once TLS says who the sender is. Pure.

A routed request carries claims in its parameters: where the input came from
(``tierlink.origin``), how many hops it made, its privacy level. On an open fleet they are
whatever the client says; on a fleet with TLS a node binds them to the authenticated
sender before anything is planned:

* **An application** (no fleet certificate, or a ``client`` / ``operator`` one) speaks
  for itself at the node it calls: it may name no origin but that node, and carries no
  hops (``unauthenticated_peer``: it acts as a node without being one; ``forged_origin``:
  it names another node's input).
* **A node** relays what it holds: a device only its own inputs; an edge or cloud its own
  or those of a node of a lower tier (the registry says which tier a node is). Nobody may
  claim the input came from the receiver itself — that would make a ``local`` input
  "at origin" there (``forged_origin``).
* **A ``local`` input never arrives from another node** (``local_forwarded``): it may not
  leave its origin, so a peer that sends one is refused whatever it claims.

A request a node relays without naming an origin gets the sender's id: the default
("the receiver") would make the receiver its origin.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tierlink.core.types import Tier
from tierlink.security.pki import CertIdentity

ORIGIN, HOPS, PRIVACY = "tierlink.origin", "tierlink.hops", "tierlink.privacy"
REASONS = ("forged_origin", "unauthenticated_peer", "local_forwarded", "replayed")


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: str  # one of REASONS: the label of tierlink_peer_refusals_total
    message: str


def bind_claims(receiver: str, sender: CertIdentity | None, params: Mapping[str, Any],
                tier_of: Callable[[str], Tier | None]) -> dict[str, Any] | Refusal:
    """The request's parameters with its origin bound to ``sender`` (see the module doc),
    or why it is refused. ``tier_of``: a node's tier from the fleet view (None: unknown)."""
    origin = str(params.get(ORIGIN) or "") or None
    if sender is None or sender.role != "node":
        return _from_application(receiver, sender, params, origin)
    if str(params.get(PRIVACY, "")) == "local":
        return Refusal("local_forwarded", f"a 'local' input arrived from node {sender.name}: "
                                          "a local input never leaves its origin")
    if origin == receiver:
        return Refusal("forged_origin", f"node {sender.name} claims the input came from "
                                        f"{receiver}, the node it sends to")
    if origin is None or origin == sender.name:
        return {**params, ORIGIN: sender.name}
    relay_tier = Tier.parse(sender.tier or "device")
    origin_tier = tier_of(origin)
    if relay_tier is Tier.DEVICE or (origin_tier is not None and origin_tier >= relay_tier):
        return Refusal("forged_origin", f"node {sender.name} ({relay_tier.label}) may not "
                                        f"relay an input of {origin}")
    return dict(params)


def _from_application(receiver: str, sender: CertIdentity | None, params: Mapping[str, Any],
                      origin: str | None) -> dict[str, Any] | Refusal:
    who = "a caller without a fleet certificate" if sender is None else str(sender)
    if _hops(params) > 0:
        return Refusal("unauthenticated_peer", f"{who} sent a relayed request "
                                               f"({HOPS}={params.get(HOPS)}): only nodes relay")
    if origin not in (None, receiver):
        return Refusal("forged_origin", f"{who} claims the input came from {origin}; an "
                                        f"application speaks for {receiver} only")
    return dict(params)


def _hops(params: Mapping[str, Any]) -> int:
    try:
        return int(params.get(HOPS, 0) or 0)
    except (TypeError, ValueError):
        return 0  # a malformed value is the request parser's to refuse (400)
