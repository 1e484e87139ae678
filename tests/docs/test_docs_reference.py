"""The Reference pages the documentation site generates from the code
(``docs/gen/reference.py``, run by the mkdocs gen-files plugin), held to the code they are
generated from: every command, fleet-file key, request parameter, route, metric, error
class and module is on its page, and the tables the pages read (the fleet file's allowed
keys, the OIP parameters) are the ones the parsers use. No build, no server, no network:
the pages are made in this process (the site's strict build is ``test_docs_site.py``)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "docs" / "gen" / "reference.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_gen_reference", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ref() -> ModuleType:
    return _load()


@pytest.fixture(scope="module")
def pages(ref: ModuleType) -> dict[str, str]:
    """Every page, made with processes and sockets out of reach: the generator starts no
    server and calls nothing."""
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"the generator tried to reach out: {args!r}")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "connect", refuse)
        mp.setattr(socket.socket, "bind", refuse)
        mp.setattr(subprocess.Popen, "__init__", refuse)
        return dict(ref.pages())


def _section(page: str, heading: str) -> str:
    """The text of a page under ``heading`` (a ``##`` heading), to the next one."""
    start = page.index(f"\n{heading}\n")
    end = page.find("\n## ", start + 1)
    return page[start:] if end < 0 else page[start:end]


# -- the pages as a whole ----------------------------------------------------------------


def test_importing_the_generator_writes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import mkdocs_gen_files

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("importing docs/gen/reference.py wrote a page")

    monkeypatch.setattr(mkdocs_gen_files, "open", refuse)
    _load()
    assert not list((ROOT / "docs" / "reference").glob("*.md"))  # made at build time only


def test_every_page_says_it_is_generated_and_the_index_lists_them(
        ref: ModuleType, pages: dict[str, str]) -> None:
    assert set(pages) == {"reference/index.md", *ref.PAGES}
    for path, text in pages.items():
        head = text.splitlines()[:6]
        assert head[0].startswith("# "), path
        assert any(ref.NOTE in line for line in head), path
        assert "docs/gen/reference.py" in ref.NOTE
    for path in ref.PAGES:
        assert f"]({Path(path).name})" in pages["reference/index.md"]


def test_write_all_hands_every_page_to_the_opener(ref: ModuleType, tmp_path: Path) -> None:
    def opener(path: str, mode: str) -> Any:
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        return target.open(mode)

    ref.write_all(opener)
    assert sorted(p.name for p in (tmp_path / "reference").iterdir()) == sorted(
        Path(p).name for p in ("reference/index.md", *ref.PAGES))


# -- the command line ------------------------------------------------------------------------


def _commands() -> Iterator[tuple[tuple[str, ...], Any]]:
    import typer.main

    from tierlink.cli.main import app

    def walk(cmd: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
        yield path, cmd
        for name, sub in (getattr(cmd, "commands", None) or {}).items():
            yield from walk(sub, (*path, name))

    yield from walk(typer.main.get_command(app), ("tierlink",))


def test_every_cli_command_and_option_is_on_its_page(pages: dict[str, str]) -> None:
    page = pages["reference/cli.md"]
    commands = list(_commands())
    assert len(commands) > 40
    for path, cmd in commands:
        if cmd.hidden:
            continue
        heading = re.search(rf"^#+ `{re.escape(' '.join(path))}`$", page, flags=re.MULTILINE)
        assert heading, f"{' '.join(path)} has no section"
        rest = page[heading.end():]
        following = re.search(r"^#+ `tierlink", rest, flags=re.MULTILINE)
        body = rest[: following.start() if following else None]
        for param in cmd.params:
            if param.hidden:
                continue
            names = [param.name.upper()] if param.param_type_name == "argument" \
                else [*param.opts, *param.secondary_opts]
            for name in names:
                assert f"`{name}`" in body, f"{' '.join(path)}: {name} is missing"


def test_the_cli_page_names_the_entry_point(pages: dict[str, str]) -> None:
    import tomllib

    target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert f"`{target['tierlink']}`" in pages["reference/cli.md"]
    assert str(ROOT) not in pages["reference/cli.md"]  # no path of this machine


# -- the fleet file ---------------------------------------------------------------------------


def test_every_allowed_key_of_every_fleet_section_is_on_its_page(
        ref: ModuleType, pages: dict[str, str]) -> None:
    page = pages["reference/fleet-file.md"]
    sections = ref.fleet_sections()
    for section in sections:
        heading = f"## `{section.label}`" if section.label else "## Top level"
        text = _section(page, heading)
        for key in section.keys:
            assert re.search(rf"^\| `{re.escape(key)}` \|", text, flags=re.MULTILINE), \
                f"{section.label or 'top level'}: {key} is missing"
    labels = {s.label for s in sections}
    assert {"", "nodes[]", "nodes[].chat", "nodes[].chat.models[]", "nodes[].ray", "links[]",
            "routing", "routing.policy", "routing.weights", "routing.breaker",
            "routing.hedging", "routing.overload", "routing.cascade", "routing.bandit.reward",
            "routing.shadow", "cost", "zoo", "control", "hard_examples", "tasks.<task>",
            "tracing", "security"} <= labels


def test_the_fleet_keys_are_the_ones_the_parsers_list(ref: ModuleType) -> None:
    """The keys on the page are what the strict unknown-key check allows: where the code
    keeps them in a table, that table."""
    from tierlink.fleet import config
    from tierlink.settings import engine, routing, security, tracing

    by_label = {s.label: s.keys for s in ref.fleet_sections()}
    assert by_label[""] == config.FLEET_KEYS
    assert by_label["nodes[]"] == config.NODE_KEYS
    assert by_label["links[]"] == config.LINK_KEYS
    assert by_label["control"] == config._CONTROL_KEYS
    assert by_label["routing"] == routing.ROUTING_KEYS
    assert by_label["routing.overload"] == tuple(routing.OverloadConfig.__dataclass_fields__)
    assert by_label["nodes[].ray"] == engine._RAY_KEYS
    assert by_label["security"] == security._KEYS
    assert by_label["tracing"] == tracing._KEYS


def test_a_key_added_to_the_code_shows_up_on_the_page(
        ref: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    from tierlink.fleet import config
    from tierlink.settings import security

    monkeypatch.setattr(config, "FLEET_KEYS", (*config.FLEET_KEYS, "brand_new"))
    monkeypatch.setattr(security, "_KEYS", (*security._KEYS, "also_new"))
    page = ref.fleet_file_page()
    assert "| `brand_new` |" in _section(page, "## Top level")
    assert "| `also_new` |" in _section(page, "## `security`")


def test_every_fleet_key_has_a_type_and_a_default(ref: ModuleType) -> None:
    keys = ref.fleet_keys()
    assert len(keys) > 120
    untyped = [f"{k.section}.{k.key}" for k in keys if not k.type]
    assert untyped == []
    assert all(k.default for k in keys)
    by_path = {(k.section, k.key): k for k in keys}
    assert by_path[("routing.hedging", "quantile")].default == "`0.95`"
    assert by_path[("routing.hedging", "quantile")].allowed == "0.5 to 1.0"
    assert by_path[("nodes[]", "id")].default == "**required**"
    assert by_path[("control", "store")].allowed == "must be sqlite or etcd"


def test_every_fleet_key_has_a_description(ref: ModuleType) -> None:
    keys = ref.fleet_keys()
    bare = [f"{k.section}.{k.key}".lstrip(".") for k in keys
            if not re.sub(r"\s*See `[^`]+`\.$", "", k.help).strip()]
    assert bare == []  # each says what it does, not only where its subsection is


# -- request parameters ------------------------------------------------------------------------


class _Spy(dict):  # type: ignore[type-arg]
    """A parameters mapping that remembers every name the code reads from it."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.read: set[str] = set()

    def get(self, key: Any, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return super().__contains__(key)


def test_the_request_parameters_are_the_ones_the_parser_reads(
        pages: dict[str, str]) -> None:
    from tierlink.core.types import Fallback, Outcome, Tier
    from tierlink.node import async_requests, protocol

    request = [p.name for p in protocol.REQUEST_PARAMETERS]
    response = [p.name for p in protocol.RESPONSE_PARAMETERS]
    assert len(set(request)) == len(request) and len(set(response)) == len(response)
    # every parameter name the module spells is in one of the tables
    spelled = {v for k, v in vars(protocol).items() if k.isupper() and isinstance(v, str)
               and (v.startswith("tierlink.") or v == "traceparent")}
    assert spelled <= set(request) | set(response)
    assert async_requests.ASYNC in request and async_requests.UPLINK in response
    # what the parser reads, and what a forwarding node sends on, is in the request table
    spy = _Spy({protocol.VERSION: "3", protocol.POLICY: "tierlink", protocol.LABEL: 1})
    protocol.parse_request("t", spy, request_id="r", receiver="n", input_bytes=1)
    protocol.parse_labels(spy, 1)
    async_requests.is_async(spy)
    assert spy.read <= set(request)
    req = protocol.parse_request("t", {protocol.VERSION: "3", protocol.POLICY: "p"},
                                 request_id="r", receiver="n", input_bytes=1)
    assert set(protocol.forward_params(req, 10.0, "00-a-b-01", (1,))) <= set(request)
    # the defaults in the table are the parser's
    table = {p.name: p.default for p in protocol.REQUEST_PARAMETERS}
    plain = protocol.parse_request("t", {}, request_id="r", receiver="n", input_bytes=1)
    assert plain.deadline_ms == float(table[protocol.DEADLINE])
    assert table[protocol.PRIVACY].startswith(plain.privacy.value)
    assert table[protocol.PRIORITY] == plain.priority.label
    assert plain.hops == int(table[protocol.HOPS])
    # an answer carries exactly the response table (the uplink's state on nodes with one)
    out = Outcome("c", Tier.CLOUD, "m", ("d", "c"), 0.9, fallbacks=(Fallback("e", "x", ""),))
    written = protocol.outcome_params(out, 1.0)
    # (and a model's own answer, e.g. a split's tail, what it computed)
    assert set(written) | {async_requests.UPLINK, protocol.COMPUTE_MS} == set(response)
    spy = _Spy(written)
    protocol.parse_outcome(spy)
    assert spy.read <= set(response)
    page = pages["reference/request-parameters.md"]
    for name in (*request, *response):
        assert f"| `{name}` |" in page


def test_the_chat_parameters_are_the_fields_the_chat_parser_fills(
        pages: dict[str, str]) -> None:
    import dataclasses

    from tierlink.chat import openai

    page = _section(pages["reference/request-parameters.md"], "## Chat API: the `tierlink` object")
    source = inspect.getsource(openai._tierlink)
    for field in dataclasses.fields(openai.TierlinkParams):
        assert f"| `{field.name}` |" in page
        assert field.name in source  # the parser fills it


# -- HTTP APIs, metrics, errors, packages, the Python API -------------------------------------


def test_every_route_of_every_app_is_on_its_page(ref: ModuleType, pages: dict[str, str]) -> None:
    page = pages["reference/http-api.md"]
    apis = ref.http_apis()
    assert [a.title for a in apis] == ["Control plane", "Node", "Node: chat API", "Link emulator"]
    for api in apis:
        text = _section(page, f"## {api.title}")
        assert api.document["paths"], api.title
        for path, methods in api.document["paths"].items():
            for method in methods:
                assert f"### `{method.upper()} {path}`" in text, f"{api.title}: {path}"
    node = _section(page, "## Node")
    assert "### `POST /v2/models/{name}/infer`" in node
    assert "### `POST /v1/chat/completions`" in _section(page, "## Node: chat API")


def _metric_holders() -> list[tuple[Any, Any]]:
    """Each class that declares metrics and can be built alone, with its registry."""
    from prometheus_client import CollectorRegistry

    from tierlink.control.metrics import ControlMetrics
    from tierlink.control.results import ResultMetrics
    from tierlink.node.uplink import UplinkMetrics
    from tierlink.telemetry.llm_metrics import LLMMetrics
    from tierlink.telemetry.metrics import NodeMetrics

    llm = CollectorRegistry()
    holders: list[Any] = [NodeMetrics("edge", CollectorRegistry()),
                          UplinkMetrics("edge", CollectorRegistry()), ControlMetrics.create(),
                          ResultMetrics(CollectorRegistry())]
    return [(h, h.registry) for h in holders] + [(LLMMetrics("edge", llm), llm)]


def test_every_metric_is_on_its_page_as_its_registry_exposes_it(
        ref: ModuleType, pages: dict[str, str]) -> None:
    from prometheus_client.metrics import MetricWrapperBase

    page = pages["reference/metrics.md"]
    declared = {m.exposed: m for m in ref.declared_metrics()}
    seen = 0
    for holder, registry in _metric_holders():
        labels = {m._name: tuple(m._labelnames) for m in vars(holder).values()
                  if isinstance(m, MetricWrapperBase)}
        for family in registry.collect():
            exposed = family.name + ("_total" if family.type == "counter" else "")
            row = declared[exposed]
            assert (row.type, row.help) == (family.type, family.documentation), exposed
            assert row.labels == labels[family.name], exposed
            assert f"| `{exposed}` | {family.type} |" in page
            seen += 1
    assert seen > 40
    # ... and every metric the source declares, whoever holds it
    source = "\n".join(p.read_text() for p in (ROOT / "src" / "tierlink").rglob("*.py"))
    names = re.findall(r"(?:Counter|Gauge|Histogram|Summary|Info|MetricFamily)\(\s*"
                       r"\"(tierlink_\w+)\"", source)
    assert len(names) >= seen
    for name in names:
        assert f"`{name}" in page, name


def test_every_error_class_is_on_its_page(pages: dict[str, str]) -> None:
    from tierlink import errors

    page = pages["reference/errors.md"]
    classes = [c for c in vars(errors).values()
               if inspect.isclass(c) and issubclass(c, errors.TierlinkError)]
    assert len(classes) > 30
    for cls in classes:
        line = next((x for x in page.splitlines() if f"**`{cls.__name__}`**" in x), None)
        assert line is not None, cls.__name__
        assert f"code `{cls.code}`" in line and f"HTTP {cls.http_status}" in line
    depth = {m.group(2): len(m.group(1)) // 4
             for m in re.finditer(r"^( *)- \*\*`(\w+)`\*\*", page, flags=re.MULTILINE)}
    for cls in classes:  # nested under its base
        base = cls.__bases__[0]
        if base is not Exception:
            assert depth[cls.__name__] == depth[base.__name__] + 1, cls.__name__


def test_every_module_is_on_the_packages_page(pages: dict[str, str]) -> None:
    page = pages["reference/packages.md"]
    src = ROOT / "src"
    for path in (src / "tierlink").rglob("*.py"):
        parts = path.relative_to(src).with_suffix("").parts
        if parts[-1] == "__init__":
            assert f"## `{'.'.join(parts[:-1])}`" in page, path
        else:
            assert f"| `{'.'.join(parts)}` |" in page, path


def test_the_python_api_directives_name_real_public_objects(
        ref: ModuleType, pages: dict[str, str]) -> None:
    page = pages["reference/python-api.md"]
    assert {"tierlink.client.sync", "tierlink.policy.base", "tierlink.models.card",
            "tierlink.models.task"} <= set(ref.PYTHON_API)
    for module_name in ref.PYTHON_API:
        assert f"::: {module_name}\n" in page
        module = importlib.import_module(module_name)
        names = ref.public_names(module_name)
        assert names, module_name
        for name in names:
            assert hasattr(module, name), f"{module_name}.{name}"
            assert f"        - {name}\n" in page
    assert "Client" in ref.public_names("tierlink.client.sync")
    assert ref.sphinx_roles_as_code(":class:`~tierlink.client.aio.AsyncClient` and "
                                    ":mod:`tierlink.client.wire`") \
        == "`AsyncClient` and `tierlink.client.wire`"


def test_every_external_link_is_listed_on_its_page_and_well_formed(
        ref: ModuleType, pages: dict[str, str]) -> None:
    from urllib.parse import urlsplit

    links = ref.external_links()
    assert links, "the explanation pages cite their sources"
    page = pages["reference/external-links.md"]
    for url, on in links.items():
        parts = urlsplit(url)
        assert parts.scheme == "https" and "." in parts.netloc and " " not in url, url
        assert f"<{url}>" in page and all(f"`{p}`" in page for p in on)
    print(f"{len(links)} external links, listed and not fetched:", *links, sep="\n  ")


def test_links_in_code_are_not_links(ref: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "p.md").write_text(
        "See [the spec](https://example.org/spec) and <https://example.org/auto>.\n"
        "`curl [x](https://example.org/span)`\n```text\n[y](https://example.org/fence)\n```\n")
    (tmp_path / "README.md").write_text("[z](https://example.org/spec)\n")
    assert ref.external_links(tmp_path) == {
        "https://example.org/auto": ["docs/p.md"],
        "https://example.org/spec": ["README.md", "docs/p.md"]}
