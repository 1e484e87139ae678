"""The content-addressed blob store: verified or nothing, and no path outside its root."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from tierlink.errors import ArtifactRejected, InvalidRequest, RepositoryError
from tierlink.repo.blobs import BlobStore

DATA = b"weights " * 1000
SHA = hashlib.sha256(DATA).hexdigest()


def leftovers(store: BlobStore) -> list[Path]:
    return sorted((store.root / "tmp").iterdir())


def test_put_bytes_stores_by_hash(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    assert store.put_bytes(DATA) == SHA
    assert store.path(SHA) == tmp_path / "blobs" / "sha256" / SHA[:2] / SHA
    assert store.path(SHA).read_bytes() == DATA and store.has(SHA)
    assert store.put_bytes(DATA, expect_sha=SHA) == SHA  # again: fine, still one file
    assert leftovers(store) == []


def test_put_stream_and_put_file(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    chunks = [DATA[i:i + 777] for i in range(0, len(DATA), 777)]
    assert store.put_stream(iter(chunks), SHA) == SHA
    src = tmp_path / "model.onnx"
    src.write_bytes(b"other")
    assert store.put_file(src) == hashlib.sha256(b"other").hexdigest()
    with store.writer(SHA) as w:
        w.write(DATA)
        assert w.commit() is False  # already stored
    assert leftovers(store) == []


def test_a_hash_mismatch_leaves_nothing_behind(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    wrong = hashlib.sha256(b"something else").hexdigest()
    with pytest.raises(ArtifactRejected, match=f"expected {wrong[:12]}") as info:
        store.put_stream([DATA[:100], DATA[100:]], wrong)
    assert f"sha256 {SHA[:12]}" in info.value.message
    assert not store.has(wrong) and not store.has(SHA)
    assert leftovers(store) == []
    assert list((tmp_path / "sha256").iterdir()) == []


def test_an_upload_past_the_limit_is_refused(tmp_path: Path) -> None:
    store = BlobStore(tmp_path, max_bytes=1000)
    with pytest.raises(ArtifactRejected, match="larger than the store's limit"):
        store.put_bytes(DATA)
    assert leftovers(store) == []


@pytest.mark.parametrize("bad", [
    "../../../etc/passwd", SHA.upper(), SHA[:63], SHA + "0", f"{SHA[:62]}/x", "", "..",
    f"{SHA[:63]}\n",
])
def test_malformed_hashes_never_reach_the_filesystem(tmp_path: Path, bad: str) -> None:
    store = BlobStore(tmp_path)
    for call in (store.has, store.path, store.writer,
                 lambda s: store.put_stream([b"x"], s), lambda s: store.put_bytes(b"x", s)):
        with pytest.raises(InvalidRequest, match="is not a sha256"):
            call(bad)
    assert leftovers(store) == []


def test_a_missing_blob_is_a_404(tmp_path: Path) -> None:
    with pytest.raises(RepositoryError, match="not in the repository") as info:
        BlobStore(tmp_path).path(SHA)
    assert info.value.http_status == 404 and "PUT /v1/blobs" in info.value.hint


def test_stale_temp_files_are_swept_on_open(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    old, fresh = tmp_path / "tmp" / "old.tmp", tmp_path / "tmp" / "fresh.tmp"
    old.write_bytes(b"killed mid-upload")
    fresh.write_bytes(b"someone is writing this")
    an_hour_ago = time.time() - 3700
    os.utime(old, (an_hour_ago, an_hour_ago))
    BlobStore(store.root)
    assert leftovers(store) == [fresh]
