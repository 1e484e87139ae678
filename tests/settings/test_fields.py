"""Field validators: a base URL is a scheme and a host (and a port), nothing more."""

from __future__ import annotations

import pytest

from tierlink.errors import ConfigError
from tierlink.settings.fields import as_url


def test_base_urls_are_accepted_without_their_trailing_slash() -> None:
    assert as_url("http://edge-1.example:8000/", "advertise_url") == "http://edge-1.example:8000"
    assert as_url("https://10.0.0.7", "x") == "https://10.0.0.7"


@pytest.mark.parametrize("bad", ["edge-1:8000", "ftp://edge-1", "http://", "http://e:port",
                                 "http://e:8000/v2", "http://u:p@e:1", "http://e:1?x=1", 8000,
                                 None, "http://e:0"])
def test_anything_else_is_refused_with_the_field_named(bad: object) -> None:
    with pytest.raises(ConfigError, match="advertise_url must be a base URL"):
        as_url(bad, "advertise_url")
