"""`tierlink.Client` loads on first use, with numpy and httpx only: an application that
imports the client pulls in no runtime, web server or node-to-node client."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("onnxruntime", "onnx", "torch", "fastapi", "starlette", "uvicorn", "aiohttp",
         "prometheus_client")


def test_the_clients_load_lazily_and_nothing_heavy() -> None:
    code = (
        "import sys, tierlink\n"
        "assert 'tierlink.client' not in sys.modules and 'httpx' not in sys.modules\n"
        "assert tierlink.Client.__name__ == 'Client'\n"
        "assert tierlink.AsyncClient.__name__ == 'AsyncClient'\n"
        "assert 'Client' in dir(tierlink)\n"
        f"print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))\n"
        "try:\n    tierlink.Nope\nexcept AttributeError:\n    pass\n"
        "else:\n    raise SystemExit('tierlink.Nope did not raise AttributeError')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""
