"""The host names that carry a fleet identity in a certificate, and how a client checks them.

An address proves nothing on a fleet: nodes on one machine share 127.0.0.1, and a node's
CSR names whatever addresses it likes. So the CA also writes the identity it vouches for as
a DNS name under a domain it alone assigns, and a caller that knows whom it means to reach
asks TLS for that name (the ``server_hostname`` / SNI it verifies the certificate against):

    <node_id>.node.tierlink.internal     the node <node_id>
    control.tierlink.internal            any replica of the fleet's control plane

A node forwarding to ``edge-1`` then reaches ``edge-1`` or nobody, wherever the address
leads; a certificate the CA issued to any other node fails the handshake before a byte of
the input is sent. ``.internal`` is the top-level domain reserved for private use: these
names never resolve, they are only ever checked. Pure, no imports: the transport uses it.
"""

from __future__ import annotations

DOMAIN = "tierlink.internal"
CONTROL_HOST = f"control.{DOMAIN}"


def node_host(node_id: str) -> str:
    """The name a certificate of node ``node_id`` carries (ValueError: the id is no host
    name — an empty label, as in ``a..b`` or ``a.``)."""
    if not node_id or any(not label or len(label) > 63 for label in node_id.split(".")):
        raise ValueError(f"node id {node_id!r} cannot be named in a certificate: a node id "
                         "on a fleet with TLS needs non-empty parts between its dots")
    return f"{node_id}.node.{DOMAIN}"


def identity_hosts(role: str, name: str) -> tuple[str, ...]:
    """The names a certificate for ``role`` / ``name`` carries beside its URI (servers
    only: nodes and control-plane replicas)."""
    if role == "node":
        return (node_host(name),)
    if role == "control":
        return (CONTROL_HOST,)
    return ()


def expect_node(node_id: str | None, tls: object | None) -> str | None:
    """The ``server_hostname`` under which TLS verifies that the server is ``node_id``
    (None without TLS or without a node to expect: the URL's host is checked)."""
    return node_host(node_id) if tls is not None and node_id else None


def reserved(host: str) -> bool:
    """Whether ``host`` lies in the identity domain: the CA assigns those names itself and
    never takes one from a request."""
    host = host.lower().rstrip(".")
    return host == DOMAIN or host.endswith("." + DOMAIN)
