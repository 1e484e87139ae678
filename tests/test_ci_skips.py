"""In CI a skipped test is a failed one (tests/conftest.py): a machine without a package,
a service or a data set cannot pass by not running the tests that need it."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = (Path(__file__).parent / "conftest.py").read_text()


NEEDS = ("import pytest\n"
         "def test_needs_a_server():\n"
         "    pytest.skip('apt-get install -y some-server')\n"
         "@pytest.mark.xfail(reason='known')\n"
         "def test_known_failure():\n"
         "    assert False\n")
MODULE = ("import pytest\n"
          "pytest.importorskip('no_such_package_anywhere')\n"
          "def test_x():\n"
          "    pass\n")


@pytest.mark.parametrize("ci", ["true", ""])
def test_a_skip_fails_in_ci_only(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                 ci: str) -> None:
    monkeypatch.setenv("CI", ci)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_needs=NEEDS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    if ci:
        result.assert_outcomes(failed=1, xfailed=1)  # an expected failure stays one
        result.stdout.fnmatch_lines(["*skipped in CI*apt-get install -y some-server*"])
    else:
        result.assert_outcomes(skipped=1, xfailed=1)


def test_a_module_that_cannot_import_what_it_needs_fails_in_ci(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_module=MODULE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*skipped in CI*no_such_package_anywhere*"])
