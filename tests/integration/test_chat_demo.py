"""The demo's chat phase on the real chat fleet: three runs, privacy held by tierlink and
broken by cloud-only, the device-only run never leaves the devices."""

from __future__ import annotations

import pytest

from tierlink.demo.chat_run import chat_phase

pytestmark = pytest.mark.integration


def test_chat_phase_runs_and_keeps_prompts_where_they_belong() -> None:
    # 2 devices x (local, site, any), everyday and labelled
    report = chat_phase(quick=True, per_device=3)
    runs = report["runs"]
    assert set(runs) == {"tierlink", "cloud_only", "device_only"}
    for run in runs.values():
        assert run["requests"] == 12 and run["answered"] == 12 and run["labelled"] == 6
        assert 0.0 <= run["labelled_right"] <= 1.0
    assert runs["tierlink"]["privacy_violations"] == 0
    assert runs["tierlink"]["by_privacy"]["any"]["left_device"] == 1.0
    assert runs["tierlink"]["by_privacy"]["local"]["left_device"] == 0.0
    assert runs["cloud_only"]["privacy_violations"] == 8
    assert runs["device_only"]["left_device"] == 0.0
    assert runs["cloud_only"]["same_as_large"] == 1.0  # the reference itself
    # what tierlink speculates is the large model's own answer, token for token
    assert runs["tierlink"]["by_privacy"]["any"]["same_as_large"] == 1.0
