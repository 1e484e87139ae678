"""tierlink: cloud-edge-device collaborative inference.

Importing this package is cheap and has no side effects: heavy libraries (onnxruntime,
torch, fastapi) are imported inside the adapters that need them. ``tierlink.Client`` and
``tierlink.AsyncClient`` (:mod:`tierlink.client`) load on first use, with numpy and httpx.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tierlink.client import AsyncClient, Client, ClientTLS

__version__ = "0.1.0"

# Names loaded on first use (module-level __getattr__), so `import tierlink` stays cheap.
_LAZY = {"Client": "tierlink.client", "AsyncClient": "tierlink.client",
         "ClientTLS": "tierlink.client"}

__all__ = ["AsyncClient", "Client", "ClientTLS", "__version__"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tierlink' has no attribute {name!r}")
    return getattr(import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
