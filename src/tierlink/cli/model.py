"""``tierlink model``: signing keys, and publishing / listing versions in the repository.

``keygen --out PATH``: a new ed25519 signing key (PEM, mode 0600); prints its public key
string for the fleet file's ``trusted_keys``.
``publish NAME ONNX --card CARD --version V --notes TEXT --key KEY --control URL``: measure
the graph's accuracy on the test split of the card's task, set the card's version, sign the
manifest, upload both files and publish them as version V of NAME.
``list [NAME]`` and ``show NAME VERSION``: what the control plane's repository holds.

The lead registers ``app`` as ``tierlink model``.
"""

from __future__ import annotations

import datetime as dt
import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from tierlink.cli.errors import ADMIN_TOKEN_HELP, admin_headers, fail, fleet_verify
from tierlink.core.progress import Reporter, as_reporter
from tierlink.errors import TierlinkError

if TYPE_CHECKING:
    from tierlink.repo.client import RepositoryClient
    from tierlink.repo.manifest import PublishedVersion, SignedManifest, Validation

app = typer.Typer(help="Models: import your own; versions: signing keys, publish, list, "
                       "show.", no_args_is_help=True)
console = Console(stderr=True)
CONTROL_HELP = "control plane URL, e.g. http://127.0.0.1:7000"


def _client(url: str, admin_token: str | None) -> RepositoryClient:
    """The repository client (tests replace this to talk to an in-process app)."""
    from tierlink.repo.client import RepositoryClient

    return RepositoryClient(url, headers=admin_headers(admin_token), verify=fleet_verify())


def _token_option() -> Any:
    return typer.Option(None, "--admin-token", envvar="TIERLINK_ADMIN_TOKEN",
                        help=ADMIN_TOKEN_HELP)


@app.command("keygen")
def keygen(out: Path = typer.Option(..., "--out", help="where the private key goes (PEM, "
                                    "mode 0600; an existing file is never overwritten)"),
           ) -> None:
    """Make an ed25519 signing key; print its public key (for `trusted_keys`)."""
    from tierlink.repo.signing import generate_key, key_id

    try:
        public = generate_key(out)
    except TierlinkError as exc:
        fail(exc)
    console.print(f"wrote private key {out} (key id {key_id(public)}); trust it by adding "
                  "the public key below to `trusted_keys` in the fleet file")
    print(public)


@app.command("publish")
def publish(
    name: str = typer.Argument(..., help="model name nodes serve it under, e.g. fmnist-medium"),
    onnx: Path = typer.Argument(..., help="the model's file: an ONNX graph, a Python "
                                          "model's model.zip, or a multi-exit model's whole "
                                          "graph (its segments beside its card are packed)"),
    card: Path = typer.Option(..., "--card", help="its model card (JSON)"),
    version: str = typer.Option(..., "--version", help="the new version, e.g. 2"),
    notes: str = typer.Option(..., "--notes", help="what changed in this version"),
    key: Path = typer.Option(..., "--key", help="private key file (`tierlink model keygen`)"),
    control: str = typer.Option(..., "--control", help=CONTROL_HELP),
    eval_limit: int | None = typer.Option(None, "--eval-limit", min=1, help="validate on the "
                                          "first N test images (default: all)"),
    as_json: bool = typer.Option(False, "--json", help="print the published entry as JSON"),
    admin_token: str | None = _token_option(),
) -> None:
    """Validate, sign, upload and publish a model version."""
    try:
        entry, created = run_publish(name, onnx, card, version, notes, key, control,
                                     eval_limit=eval_limit, progress=not as_json,
                                     admin_token=admin_token)
    except TierlinkError as exc:
        fail(exc)
    if as_json:
        print(json.dumps({**entry.to_dict(), "created": created}, indent=2))
        return
    v = entry.signed.manifest.validation
    state = "published" if created else "already published (the same files)"
    Console().print(f"{name} version {version} {state}: accuracy {100 * v.accuracy:.2f}% on "
                    f"{v.n} {v.dataset} {v.split} images, signed by {entry.signed.key_id}")


def run_publish(name: str, onnx: Path, card: Path, version: str, notes: str, key: Path,
                control: str, *, eval_limit: int | None = None,
                progress: bool | Reporter = False,
                admin_token: str | None = None,
                validation: Validation | None = None) -> tuple[PublishedVersion, bool]:
    """What ``publish`` does: the key and the control plane first (fail before minutes of
    evaluation), then the validation, the manifest, the uploads and the publication. A
    re-run with the same files and notes (a retried publish) is reported as already
    published instead of a conflict."""
    from tierlink.errors import VersionConflict
    from tierlink.repo.manifest import PublishedVersion
    from tierlink.repo.publish import measure_validation, prepare_version
    from tierlink.repo.signing import load_private_key, sign_manifest

    private = load_private_key(key)
    with _client(control, admin_token) as client:
        _preflight(client, name, version)
        if validation is None:  # an imported model brings the one its import measured
            with as_reporter(progress).phase(f"validating {onnx.name}") as phase:
                validation = measure_validation(
                    onnx, card, eval_limit,
                    progress=lambda done, total: phase.update(completed=done, total=total))
        with tempfile.TemporaryDirectory(prefix="tierlink-publish-") as tmp:
            manifest, onnx_path, card_path = prepare_version(name, onnx, card, version, notes,
                                                             tmp, validation)
            signed = sign_manifest(manifest, private)
            client.upload_blob(onnx_path)
            client.upload_blob(card_path)
            try:
                answer = client.publish(signed)
            except VersionConflict:
                return _same_files_or_raise(client, signed), False
    return PublishedVersion.from_dict(answer), bool(answer.get("created"))


def _preflight(client: RepositoryClient, name: str, version: str) -> None:
    """Reach the control plane (and have the credentials checked) before the evaluation,
    not after it. An unknown version is the expected answer."""
    from tierlink.errors import RepositoryError

    try:
        client.get(name, version)
    except RepositoryError as exc:
        if exc.http_status != 404:
            raise


def _same_files_or_raise(client: RepositoryClient, signed: SignedManifest) -> PublishedVersion:
    """A re-run of the same publish (same files, another timestamp): the version that is
    already there. Anything else: the conflict stands."""
    from tierlink.errors import VersionConflict

    m = signed.manifest
    old = client.get(m.name, m.version)
    o = old.signed.manifest
    if (o.onnx_sha256, o.card_sha256, o.notes) == (m.onnx_sha256, m.card_sha256, m.notes):
        return old
    raise VersionConflict(
        f"{m.name} version {m.version} is already published with other files or notes "
        f"(onnx {o.onnx_sha256[:12]}..., notes {_short(o.notes)!r})")


@app.command("list")
def list_cmd(name: str | None = typer.Argument(None, help="only this model's versions"),
             control: str = typer.Option(..., "--control", help=CONTROL_HELP),
             as_json: bool = typer.Option(False, "--json", help="print JSON"),
             admin_token: str | None = _token_option()) -> None:
    """Published versions, oldest first, the latest of each model marked."""
    try:
        with _client(control, admin_token) as client:
            entries = client.list_versions(name)
    except TierlinkError as exc:
        fail(exc)
    if as_json:
        print(json.dumps([e.to_dict() for e in entries], indent=2))
        return
    Console().print(_table(control, entries))


def _table(url: str, entries: list[PublishedVersion]) -> Table:
    latest = {e.signed.name: e.signed.version for e in entries}  # entries: oldest first
    table = Table(title=f"model versions at {url}")
    for col in ("model", "version", "task", "accuracy", "published", "key", "notes"):
        table.add_column(col)
    for e in entries:
        m = e.signed.manifest
        mark = " (latest)" if latest[m.name] == m.version else ""
        table.add_row(m.name, m.version + mark, m.task, _accuracy(m.validation),
                      _when(e.published_at), e.signed.key_id, _short(m.notes))
    return table


@app.command("show")
def show(name: str = typer.Argument(...), version: str = typer.Argument(...),
         control: str = typer.Option(..., "--control", help=CONTROL_HELP),
         as_json: bool = typer.Option(False, "--json", help="print JSON"),
         admin_token: str | None = _token_option()) -> None:
    """One version: files, validation, notes, signature."""
    try:
        with _client(control, admin_token) as client:
            entry = client.get(name, version)
    except TierlinkError as exc:
        fail(exc)
    if as_json:
        print(json.dumps(entry.to_dict(), indent=2))
        return
    Console().print(_details(entry))


def _details(entry: PublishedVersion) -> Table:
    m = entry.signed.manifest
    table = Table(title=f"{m.name} version {m.version}", show_header=False)
    rows: list[tuple[str, Any]] = [
        ("task", m.task), ("notes", m.notes or "-"),
        ("validation", (f"{_accuracy(m.validation)} on {m.validation.n} "
                        f"{m.validation.dataset} {m.validation.split} images")),
        ("onnx", f"{m.onnx_sha256}  {m.onnx_size} bytes"),
        ("card", f"{m.card_sha256}  {m.card_size} bytes"),
        ("created", _when(m.created_at)), ("published", _when(entry.published_at)),
        ("signed by", entry.signed.key_id or "(unsigned)"),
    ]
    for key, value in rows:
        table.add_row(key, str(value))
    return table


def _accuracy(v: Validation) -> str:
    return f"{100 * v.accuracy:.2f}%"


def _when(epoch_s: float) -> str:
    return dt.datetime.fromtimestamp(epoch_s).strftime("%Y-%m-%d %H:%M:%S")


def _short(text: str, width: int = 40) -> str:
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= width else line[:width - 1] + "…"
