import subprocess
import sys

HEAVY = ("torch", "onnxruntime", "fastapi", "uvicorn", "numpy", "httpx", "prometheus_client")


def test_import_tierlink_is_cheap_and_side_effect_free():
    code = ("import sys; before = set(sys.modules); import tierlink, tierlink.core, "
            "tierlink.policy, tierlink.estimate; "
            "print(','.join(sorted(m for m in set(sys.modules) - before "
            f"if m.split('.')[0] in {HEAVY!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
