"""A node's language models travel in its heartbeat and come back in the registry's view."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tierlink.control.client import node_views
from tierlink.control.schemas import Heartbeat
from tierlink.core.types import LanguageModelView

LM = LanguageModelView("smollm2", ("chat",), 0.76, running=2, queued=1, price_per_1k=0.002)


def _beat(**extra: object) -> dict[str, object]:
    return {"node_id": "cloud-1", "tier": "cloud", "address": "http://127.0.0.1:1",
            "started_at": 1.0, **extra}


def test_language_models_round_trip_through_the_registry_record() -> None:
    beat = Heartbeat.model_validate(_beat(language_models=[LM.to_dict()]))
    (node,), _ = node_views([beat.model_dump(mode="json")])
    assert node.language_models == (LM,)
    (older,), _ = node_views([_beat()])  # a node without any: none
    assert older.language_models == ()


def test_a_malformed_language_model_is_refused() -> None:
    with pytest.raises(ValidationError):
        Heartbeat.model_validate(_beat(language_models=[{**LM.to_dict(), "quality": 3}]))
