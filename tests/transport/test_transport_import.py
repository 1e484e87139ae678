"""Importing tierlink.transport is cheap: numpy and httpx load only when a name is used."""

from __future__ import annotations

import subprocess
import sys


def test_package_import_loads_neither_numpy_nor_httpx() -> None:
    code = (
        "import sys, tierlink.transport as t\n"
        "assert 'numpy' not in sys.modules and 'httpx' not in sys.modules, sorted(sys.modules)\n"
        "assert t.OipClient.__name__ == 'OipClient' and callable(t.decode_infer_request)\n"
        "try:\n    t.nope\nexcept AttributeError:\n    pass\n"
        "else:\n    raise SystemExit('no error')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
