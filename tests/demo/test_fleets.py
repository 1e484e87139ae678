"""The demo's fleet files are package data, found through :func:`fleet_path`."""

import pytest

from tierlink.demo.fleets import CHAT_FLEET, FLEET, fleet_path
from tierlink.fleet.config import load_fleet


def test_the_demo_fleet_and_the_chat_fleet_load():
    assert load_fleet(fleet_path()).name == "demo" == load_fleet(fleet_path(FLEET)).name
    chat = load_fleet(fleet_path(CHAT_FLEET))
    assert any(n.chat for n in chat.nodes if n.tier.label == "device")


def test_an_unknown_fleet_file_is_named():
    with pytest.raises(FileNotFoundError, match="no-such.yaml"):
        fleet_path("no-such.yaml")
