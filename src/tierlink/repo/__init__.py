"""tierlink.repo: the model repository — signed, content-addressed model versions.

``manifest``: :class:`~tierlink.repo.manifest.VersionManifest` (files by sha256 + size, notes,
validation), :class:`~tierlink.repo.manifest.SignedManifest`.
``signing``: ed25519 keys (PEM files, ``"ed25519:<base64>"`` public strings), sign / verify.
``verify``: :func:`~tierlink.repo.verify.verify_artifact` — signature, sizes, hashes, card.
``blobs``: the content-addressed blob store on disk. ``store``: the SQLite version store.
``service`` + ``routes``: the control plane's ``/v1/blobs`` and ``/v1/models`` API.
``client``: the CLI's sync client and the nodes' :func:`~tierlink.repo.client.fetch_artifact`.
``publish``: a zoo model -> a publishable version with its measured validation.

Importing this package loads nothing (cryptography, httpx and fastapi load with the
submodules that need them).
"""
