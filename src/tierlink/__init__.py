"""tierlink: cloud-edge-device collaborative inference.

Importing this package is cheap and has no side effects: heavy libraries (onnxruntime,
torch, fastapi) are imported inside the adapters that need them.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
