"""Real photos for the ImageNet network, from files that installed packages already ship.

scikit-image bundles a few colour photographs (a cat, a coffee cup, an astronaut, a rocket
launch, ...) and matplotlib one portrait (Grace Hopper); both are read straight from the
package directories, never downloaded. Each photo is resized like ImageNet evaluation (shorter
side 256, centre crop 224) and, for agreement statistics, also seen through deterministic
extra views: the centre and four corner crops, each also mirrored (10 views a photo).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from tierlink.errors import ZooError

# (name, package, file inside the package): only files shipped in the wheels.
PHOTOS: tuple[tuple[str, str, str], ...] = (
    ("chelsea", "skimage", "data/chelsea.png"),
    ("coffee", "skimage", "data/coffee.png"),
    ("astronaut", "skimage", "data/astronaut.png"),
    ("rocket", "skimage", "data/rocket.jpg"),
    ("motorcycle", "skimage", "data/motorcycle_left.png"),
    ("camera", "skimage", "data/camera.png"),
    ("coins", "skimage", "data/coins.png"),
    ("hubble", "skimage", "data/hubble_deep_field.jpg"),
    ("retina", "skimage", "data/retina.jpg"),
    ("grace_hopper", "matplotlib", "mpl-data/sample_data/grace_hopper.jpg"),
)
CROPS = ("center", "tl", "tr", "bl", "br")


def imagenet_photos(size: int = 224, views: bool = True) -> tuple[np.ndarray, list[str]]:
    """``(images, names)``: float32 RGB in [0, 1] shaped (N, 3, size, size). With ``views``,
    ten views per photo (``chelsea``, ``chelsea:flip``, ``chelsea:tl``, ...,
    ``chelsea:br+flip``; the plain name is the standard centre crop); without, one centre
    crop each. Photos whose package is not installed are skipped; needs scikit-image."""
    found = [(name, path) for name, package, rel in PHOTOS
             if (path := _package_file(package, rel)) is not None]
    if not any(name == "chelsea" for name, _ in found):
        raise ZooError("the sample photos need scikit-image", hint="pip install scikit-image")
    images, names = [], []
    for name, path in found:
        resized = _resize_shorter(_read_rgb(path), round(size * 256 / 224))
        for crop in CROPS if views else CROPS[:1]:
            view = _crop(resized, crop, size)
            for flip in (False, True) if views else (False,):
                images.append(view[:, ::-1] if flip else view)
                names.append(_view_name(name, crop, flip))
    batch = np.stack(images).transpose(0, 3, 1, 2)
    return np.ascontiguousarray(batch, dtype=np.float32), names


def _view_name(name: str, crop: str, flip: bool) -> str:
    parts = [p for p in (crop if crop != "center" else "", "flip" if flip else "") if p]
    return f"{name}:{'+'.join(parts)}" if parts else name


def _package_file(package: str, rel: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / rel
    return path if path.is_file() else None


def _read_rgb(path: Path) -> np.ndarray:
    """(H, W, 3) float in [0, 1]; grey images are repeated, alpha dropped."""
    from skimage import io

    try:
        image = np.asarray(io.imread(str(path)))
    except (OSError, ValueError) as exc:
        raise ZooError(f"cannot read sample photo {path}: {exc}") from exc
    if image.ndim == 2:
        image = np.repeat(image[:, :, None], 3, axis=2)
    image = image[:, :, :3]
    scale = 255.0 if image.dtype == np.uint8 else float(max(image.max(), 1))
    return image.astype(np.float64) / scale


def _resize_shorter(image: np.ndarray, shorter: int) -> np.ndarray:
    from skimage.transform import resize

    h, w = image.shape[:2]
    scale = shorter / min(h, w)
    shape = (max(shorter, round(h * scale)), max(shorter, round(w * scale)))
    return np.clip(resize(image, shape, order=1, anti_aliasing=True), 0.0, 1.0)


def _crop(image: np.ndarray, where: str, size: int) -> np.ndarray:
    h, w = image.shape[:2]
    top = {"center": (h - size) // 2, "tl": 0, "tr": 0, "bl": h - size, "br": h - size}[where]
    left = {"center": (w - size) // 2, "tl": 0, "bl": 0, "tr": w - size, "br": w - size}[where]
    return image[top:top + size, left:left + size]
