"""``tierlink pki``: the fleet's certificate authority (see tierlink.security.pki).

    tierlink pki init DIR                          make the CA (ca.pem, ca.key 0600)
    tierlink pki issue ROLE NAME --ca DIR --out STEM [--host H]... [--ttl-days N]
                                                   a key and certificate for a control-plane
                                                   replica, an operator or an application
    tierlink pki show CERT.pem [--json]            who a certificate names, until when

Nodes never need `issue`: they get their certificates from the control plane at enrollment
and renew them themselves.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer
from rich.console import Console

from tierlink.cli.errors import fail
from tierlink.errors import ConfigError, TierlinkError

app = typer.Typer(help="The fleet's certificate authority: init, issue, show.",
                  no_args_is_help=True)
console = Console(stderr=True)
_ISSUED_ROLES = ("control", "operator", "client")


@app.command("init")
def init(directory: Path = typer.Argument(..., help="where the CA goes (created)"),
         name: str = typer.Option("fleet", help="the CA's name"),
         ttl_days: float = typer.Option(3650.0, min=1.0, help="the CA's life")) -> None:
    """Make a fleet CA: DIR/ca.pem (give it to every node) and DIR/ca.key (0600: only the
    control plane, which signs node certificates, reads it)."""
    from tierlink.security.pki import Authority

    try:
        Authority.create(name, time.time(), ttl_days).save(directory)
    except TierlinkError as exc:
        fail(exc)
    console.print(f"fleet CA in {directory}: ca.pem (public), ca.key (keep it secret)")


@app.command("issue")
def issue(role: str = typer.Argument(..., help=f"one of {', '.join(_ISSUED_ROLES)}"),
          name: str = typer.Argument(..., help="who it names"),
          ca: Path = typer.Option(..., "--ca", help="the CA's folder (`pki init`)"),
          out: Path = typer.Option(..., "--out", help="writes OUT.pem and OUT.key"),
          host: list[str] = typer.Option([], "--host", help="an address it serves on "
                                         "(IP or DNS name; repeat; control planes)"),
          ttl_days: float = typer.Option(365.0, min=0.001, help="its life")) -> None:
    """A key and certificate for a control-plane replica, an operator or an application."""
    from tierlink.security.pki import Authority, CertIdentity, write_file

    try:
        if role not in _ISSUED_ROLES:
            raise ConfigError(f"role must be one of {_ISSUED_ROLES}, not {role!r}",
                              hint="nodes get theirs from the control plane at enrollment")
        key, issued = Authority.load(ca).issue_pair(CertIdentity(role, name), tuple(host),
                                                    time.time(), ttl_days * 86_400.0)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_file(out.with_suffix(".key"), key, 0o600)
        write_file(out.with_suffix(".pem"), issued.cert_pem, 0o644)
    except TierlinkError as exc:
        fail(exc)
    console.print(f"{role} {name}: {out.with_suffix('.pem')} and {out.with_suffix('.key')}")


@app.command("show")
def show(cert: Path = typer.Argument(..., help="a PEM certificate"),
         as_json: bool = typer.Option(False, "--json")) -> None:
    """Who a certificate names, who issued it, and until when it is valid."""
    from tierlink.security.pki import describe

    try:
        facts = describe(cert.read_bytes())
    except (OSError, ValueError) as exc:
        fail(ConfigError(f"{cert} is not a readable PEM certificate: {exc}"))
    if as_json:
        print(json.dumps(facts, indent=2))
        return
    for key, value in facts.items():
        if key in ("not_before", "not_after"):
            value = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(str(value))))
        console.print(f"{key:>10}: {value}")
