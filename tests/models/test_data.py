"""Labelled data for an import (``modelstore/data.py``): an ``.npz`` or a folder of ``.npy``
files with ``labels.csv``; what is refused (naming the problem); the seeded split."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from byo_support import classification_data, npy_folder, save_npz
from tierlink.errors import ImportRefused
from tierlink.models.data import Labelled, load_data, split


@pytest.fixture
def xy() -> tuple[np.ndarray, np.ndarray]:
    return classification_data(n=20)


def refused(path: Path, inputs: tuple[str, ...] = ("x",), labels: tuple[str, ...] = ()
            ) -> str:
    with pytest.raises(ImportRefused) as err:
        load_data(path, inputs, labels)
    return err.value.message


# -- .npz ----------------------------------------------------------------------------------

def test_npz_with_x_and_y_feeds_the_one_input_by_its_name(tmp_path, xy):
    data = load_data(save_npz(tmp_path / "d.npz", x=xy[0], y=xy[1]), ["tokens"])
    assert list(data.inputs) == ["tokens"] and len(data) == 20
    np.testing.assert_array_equal(data.inputs["tokens"], xy[0])
    np.testing.assert_array_equal(data.labels, xy[1])
    assert len(data.sha256) == 64


def test_npz_of_a_multi_input_model_is_keyed_by_input_names(tmp_path, xy):
    x, y = xy
    path = save_npz(tmp_path / "d.npz", a=x[:, :3], b=x[:, 3:], y=y, extra=np.zeros(3))
    data = load_data(path, ["a", "b"])
    assert sorted(data.inputs) == ["a", "b"]  # what the model does not take is left out
    assert data.inputs["a"].shape == (20, 3) and data.inputs["b"].shape == (20, 1)


def test_npz_without_labels_is_refused(tmp_path, xy):
    assert "has no array 'y' (the labels); it has ['x']" in refused(
        save_npz(tmp_path / "d.npz", x=xy[0]))


def test_npz_lacking_an_input_names_it(tmp_path, xy):
    message = refused(save_npz(tmp_path / "d.npz", a=xy[0], y=xy[1]), ("a", "b"))
    assert "lacks the model's input(s) ['b']" in message


def test_npz_with_a_wrong_name_for_the_one_input(tmp_path, xy):
    assert "lacks the model's input(s) ['tokens']" in refused(
        save_npz(tmp_path / "d.npz", inputs=xy[0], y=xy[1]), ("tokens",))


def test_labels_of_the_wrong_length_are_refused(tmp_path, xy):
    message = refused(save_npz(tmp_path / "d.npz", x=xy[0], y=xy[1][:-1]))
    assert "input 'x' has 20 samples but there are 19 labels" in message


def test_empty_data_is_refused(tmp_path, xy):
    assert "holds no samples" in refused(save_npz(tmp_path / "d.npz", x=xy[0][:0], y=xy[1][:0]))


def test_random_bytes_named_npz_are_refused(tmp_path):
    path = tmp_path / "d.npz"
    path.write_bytes(np.random.default_rng(0).bytes(300))
    assert "is not a readable .npz" in refused(path)


def test_a_truncated_npz_is_refused(tmp_path, xy):
    path = save_npz(tmp_path / "d.npz", x=xy[0], y=xy[1])
    path.write_bytes(path.read_bytes()[:200])  # a copy cut short
    assert "is not a readable .npz" in refused(path)


def test_pickled_arrays_are_not_loaded(tmp_path):
    path = tmp_path / "d.npz"
    np.savez(path, x=np.array([{"a": 1}, {"b": 2}], dtype=object), y=np.array([0, 1]))
    assert "is not a readable .npz" in refused(path)


@pytest.mark.parametrize("name", ["d.csv", "missing.npz", "nothing"])
def test_neither_an_npz_nor_a_folder_is_refused(tmp_path, name):
    if name == "d.csv":
        (tmp_path / name).write_text("x,y\n")
    assert "not an .npz file or a folder of .npy files" in refused(tmp_path / name)


# -- a folder of .npy with labels.csv ------------------------------------------------------

def test_a_folder_with_class_ids(tmp_path, xy):
    x, y = xy
    data = load_data(npy_folder(tmp_path / "f", x, y.tolist()), ["x"])
    np.testing.assert_array_equal(data.inputs["x"], x)
    np.testing.assert_array_equal(data.labels, y)


def test_a_folder_with_class_names_and_ids_mixed_without_a_header(tmp_path, xy):
    x, _ = xy
    labels = ["cat", "dog", "2", "bird", "0"]
    data = load_data(npy_folder(tmp_path / "f", x[:5], labels, header=False), ["x"],
                     ("cat", "dog", "bird"))
    assert data.labels.tolist() == [0, 1, 2, 2, 0]


def test_a_folder_orders_samples_as_the_csv_does(tmp_path, xy):
    x, y = xy
    folder = npy_folder(tmp_path / "f", x[:3], y[:3].tolist())
    (folder / "labels.csv").write_text("s0002.npy,2\n\ns0000.npy,0\n")  # blank lines skipped
    data = load_data(folder, ["x"])
    np.testing.assert_array_equal(data.inputs["x"], x[[2, 0]])
    assert data.labels.tolist() == [2, 0]


def test_a_folder_without_labels_csv_is_refused(tmp_path, xy):
    folder = npy_folder(tmp_path / "f", xy[0][:3], [0, 1, 2])
    (folder / "labels.csv").unlink()
    assert "has no labels.csv" in refused(folder)


def test_a_csv_naming_a_missing_file_is_refused(tmp_path, xy):
    folder = npy_folder(tmp_path / "f", xy[0][:3], [0, 1, 2])
    (folder / "s0001.npy").unlink()
    assert "'s0001.npy' does not exist in" in refused(folder)


def test_a_label_that_is_neither_an_id_nor_a_class_name_is_refused(tmp_path, xy):
    folder = npy_folder(tmp_path / "f", xy[0][:2], ["cat", "zebra"])
    message = refused(folder, labels=("cat", "dog"))
    assert "label 'zebra' is neither a class id nor one of the task's labels" in message


def test_a_row_without_a_label_is_refused(tmp_path, xy):
    folder = npy_folder(tmp_path / "f", xy[0][:2], [0, 1])
    (folder / "labels.csv").write_text("file,label\ns0000.npy,0\ns0001.npy\n")
    assert "row 2 is not 'file,label'" in refused(folder)


def test_an_unreadable_npy_is_refused(tmp_path, xy):
    folder = npy_folder(tmp_path / "f", xy[0][:2], [0, 1])
    (folder / "s0001.npy").write_bytes(b"not numpy")
    assert "s0001.npy is not a readable .npy" in refused(folder)


def test_samples_of_different_shapes_are_refused(tmp_path, xy):
    folder = npy_folder(tmp_path / "f", xy[0][:2], [0, 1])
    np.save(folder / "s0001.npy", np.zeros(5, np.float32))
    assert "samples differ in shape" in refused(folder)


def test_an_empty_csv_is_no_samples(tmp_path):
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "labels.csv").write_text("file,label\n")
    assert "holds no samples" in refused(folder)


def test_a_folder_feeds_one_input_only(tmp_path, xy):
    folder = npy_folder(tmp_path / "f", xy[0][:2], [0, 1])
    assert "a folder of .npy files feeds one input" in refused(folder, ("a", "b"))


# -- digest and split ----------------------------------------------------------------------

def test_the_digest_names_the_data(tmp_path, xy):
    x, y = xy
    a = load_data(save_npz(tmp_path / "a.npz", x=x, y=y), ["x"])
    b = load_data(npy_folder(tmp_path / "f", x, y.tolist()), ["x"])
    assert a.sha256 == b.sha256  # the same samples, whatever the file format
    y2 = y.copy()
    y2[0] = (y2[0] + 1) % 3
    assert load_data(save_npz(tmp_path / "c.npz", x=x, y=y2), ["x"]).sha256 != a.sha256
    assert load_data(save_npz(tmp_path / "d.npz", x=x, y=y), ["z"]).sha256 != a.sha256


def test_the_split_is_seeded_sorted_and_whole():
    data = Labelled({"x": np.arange(10.0)[:, None]}, np.arange(10), "sha")
    parts = split(data, 0.3, seed=4)
    assert len(parts.calib) == 3 and len(parts.test) == 7 and parts.seed == 4
    both = np.concatenate([parts.calib.labels, parts.test.labels])
    assert sorted(both.tolist()) == list(range(10))
    assert parts.calib.labels.tolist() == sorted(parts.calib.labels.tolist())
    np.testing.assert_array_equal(parts.calib.inputs["x"][:, 0], parts.calib.labels)  # rows kept paired
    assert parts.calib.sha256 == parts.test.sha256 == "sha"
    again = split(data, 0.3, seed=4)
    assert again.calib.labels.tolist() == parts.calib.labels.tolist()
    assert any(split(data, 0.3, seed=s).calib.labels.tolist() != parts.calib.labels.tolist()
               for s in range(5, 10))


@pytest.mark.parametrize("share", [0.01, 0.99])
def test_each_part_keeps_at_least_one_sample(share):
    parts = split(Labelled({"x": np.zeros((3, 1))}, np.arange(3), "sha"), share)
    assert len(parts.calib) >= 1 and len(parts.test) >= 1


def test_a_split_needs_two_samples_and_a_share_inside_zero_one():
    one = Labelled({"x": np.zeros((1, 1))}, np.zeros(1), "sha")
    with pytest.raises(ImportRefused, match="at least 2 are needed"):
        split(one)
    two = Labelled({"x": np.zeros((2, 1))}, np.zeros(2), "sha")
    for share in (0.0, 1.0, 1.5):
        with pytest.raises(ImportRefused, match="--calib-share must be in"):
            split(two, share)
