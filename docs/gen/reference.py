"""The documentation site's Reference pages, generated from the code at build time.

The mkdocs ``gen-files`` plugin runs this file (``runpy.run_path``: ``__name__`` is
``"<run_path>"``) and the pages go into the build as virtual files under ``reference/``;
nothing is written to ``docs/``. Each page is one plain function returning Markdown, so the
tests (``tests/docs/test_docs_reference.py``) import this file and check the pages against
the same sources of truth. ``python docs/gen/reference.py OUT_DIR`` writes the pages to
``OUT_DIR`` to read them without a build.

Nothing here starts a process or opens a socket: apps are built and asked for their OpenAPI
documents without serving, metrics are read from their declarations, the fleet file's keys
from its parser.
"""

from __future__ import annotations

import ast
import copy
import enum
import inspect
import io
import json
import re
import sys
import tempfile
import time
import tokenize
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, NamedTuple

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
PACKAGE = SRC / "tierlink"
GENERATOR = "docs/gen/reference.py"
NOTE = f"Generated from the code by {GENERATOR} — do not edit."

if str(SRC) not in sys.path:  # a checkout without `pip install -e .`
    sys.path.insert(0, str(SRC))


# -- Markdown helpers ---------------------------------------------------------------------


def _rst(text: str) -> str:
    """Docstring text as Markdown: ``x`` -> `x`, Sphinx roles -> code, ``::`` -> ``:``."""
    text = sphinx_roles_as_code(text)
    text = re.sub(r"``(.+?)``", r"`\1`", text, flags=re.DOTALL)
    return re.sub(r"::$", ":", text, flags=re.MULTILINE)


def _escape(text: str) -> str:
    """Text for a table cell or a line of prose: one line, no HTML, no stray emphasis.
    Code spans (backticks) are kept as they are."""
    parts = re.split(r"(`[^`]*`)", " ".join(str(text).split()))
    out = []
    for part in parts:
        if part.startswith("`") and part.endswith("`") and len(part) > 1:
            out.append(part.replace("|", "\\|"))
        else:
            out.append(part.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;")
                       .replace(">", "&gt;").replace("*", "\\*").replace("[", "\\[")
                       .replace("_", "\\_"))
    return "".join(out)


def _code(value: Any) -> str:
    """A value as a Markdown code span."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = " ".join(text.split()).replace("|", "\\|")
    fence = "``" if "`" in text else "`"
    pad = " " if "`" in text else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _table(header: tuple[str, ...], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell or "—" for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _page(title: str, intro: str, *sections: str) -> str:
    body = [f"# {title}", "", f"*{NOTE}*", ""]
    if intro:
        body += [intro.strip(), ""]
    body += [s.strip() + "\n" for s in sections if s.strip()]
    return "\n".join(body).rstrip() + "\n"


def _first_paragraph(doc: str | None) -> str:
    if not doc:
        return ""
    return inspect.cleandoc(doc).split("\n\n")[0].strip()


def _first_line(doc: str | None) -> str:
    """The first sentence-line of a docstring (its first paragraph, joined)."""
    return " ".join(_first_paragraph(doc).split())


def _relative(path: Path) -> str:
    """A path as the reader's checkout would spell it (never this machine's home)."""
    for base, shown in ((ROOT, ""), (Path.home(), "~/")):
        try:
            return shown + str(path.resolve().relative_to(base.resolve()))
        except ValueError:
            continue
    return str(path)


# -- the command line ---------------------------------------------------------------------


class CliCommand(NamedTuple):
    path: tuple[str, ...]  # ("tierlink", "zoo", "build")
    command: Any  # the click (typer) command object


def cli_commands() -> list[CliCommand]:
    """Every command of the ``tierlink`` program (``[project.scripts]``), depth first, from
    the click command tree typer builds."""
    import typer.main

    from tierlink.cli.main import app

    out: list[CliCommand] = []

    def walk(cmd: Any, path: tuple[str, ...]) -> None:
        out.append(CliCommand(path, cmd))
        for name, sub in (getattr(cmd, "commands", None) or {}).items():
            walk(sub, (*path, name))

    walk(typer.main.get_command(app), ("tierlink",))
    return out


def _script_target() -> str:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return str(project["scripts"]["tierlink"])


def _param_type(param: Any) -> str:
    desc = getattr(param, "type_descriptor", None)
    ann = getattr(desc, "annotation", None)
    if ann is None:  # plain click
        return str(getattr(getattr(param, "type", None), "name", "text"))
    names = {bool: "boolean", int: "integer", float: "number", str: "text", Path: "path"}
    text = names.get(ann)
    if text is None and isinstance(ann, type) and issubclass(ann, enum.Enum):
        text = "choice: " + ", ".join(str(m.value) for m in ann)
    if text is None:
        args = getattr(ann, "__args__", ())
        if args and getattr(ann, "__origin__", None) in (list, tuple):
            text = f"{names.get(args[0], getattr(args[0], '__name__', '?'))} (repeatable)"
        else:
            text = getattr(ann, "__name__", str(ann))
    bounds = []
    if getattr(param, "min", None) is not None:
        bounds.append(f"≥ {param.min}")
    if getattr(param, "max", None) is not None:
        bounds.append(f"≤ {param.max}")
    return text + (f" ({', '.join(bounds)})" if bounds else "")


def _param_default(param: Any) -> str:
    shown = _param_value(param)
    envvar = getattr(param, "envvar", None)
    if envvar:
        names = [envvar] if isinstance(envvar, str) else list(envvar)
        shown = ("; " if shown else "").join(
            (shown, "env " + ", ".join(_code(n) for n in names)))
    return shown


def _param_value(param: Any) -> str:
    if getattr(param, "required", False):
        return "required"
    value = param.default
    if callable(value):
        return "computed"
    if value is None or value == ():
        return ""
    if isinstance(value, Path):
        return _code(_relative(value))
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, list | tuple):
        return _code(list(value))
    return _code(json.dumps(value) if isinstance(value, bool) or value == "" else str(value))


def _param_names(param: Any) -> str:
    if param.param_type_name == "argument":
        return _code(param.name.upper())
    names = [*param.opts, *getattr(param, "secondary_opts", [])]
    if getattr(param, "is_flag", False) and param.secondary_opts:
        return " / ".join(_code(n) for n in names)
    return ", ".join(_code(n) for n in names)


def _usage(entry: CliCommand) -> str:
    cmd = entry.command
    words = [" ".join(entry.path)]
    if any(p.param_type_name == "option" for p in cmd.params) or getattr(cmd, "commands", None):
        words.append("[OPTIONS]")
    for p in cmd.params:
        if p.param_type_name == "argument":
            name = p.name.upper() + ("..." if p.nargs == -1 else "")
            words.append(name if p.required else f"[{name}]")
    if getattr(cmd, "commands", None):
        words.append("COMMAND [ARGS]...")
    return " ".join(words)


def _help_text(cmd: Any) -> str:
    text = inspect.cleandoc(cmd.help or "")
    text = "\n".join(line for line in text.splitlines() if line.strip() != "\b")
    return _rst(text)


def cli_page() -> str:
    sections = []
    for entry in cli_commands():
        cmd = entry.command
        if getattr(cmd, "hidden", False):
            continue
        level = "#" * min(len(entry.path) + 1, 4)
        lines = [f"{level} `{' '.join(entry.path)}`", "", _help_text(cmd) or "", "",
                 "```text", _usage(entry), "```", ""]
        subs = getattr(cmd, "commands", None) or {}
        if subs:
            rows = [(_code(f"{' '.join(entry.path)} {name}"),
                     _escape(_first_line(_help_text(sub))))
                    for name, sub in subs.items() if not sub.hidden]
            lines += [_table(("Command", "What it does"), rows), ""]
        params = [p for p in cmd.params if not getattr(p, "hidden", False)]
        if params:
            options = [(_param_names(p), _param_type(p), _param_default(p),
                        _escape(_rst(getattr(p, "help", None) or ""))) for p in params]
            lines += [_table(("Argument / option", "Type", "Default", "Help"), options), ""]
        sections.append("\n".join(lines))
    intro = (f"Every command of the `tierlink` program (`[project.scripts]`: "
             f"`{_script_target()}`), read from the click command tree that typer builds "
             "(`typer.main.get_command`). `tierlink COMMAND --help` prints the same.")
    return _page("Command line", intro, *sections)


# -- the fleet file -----------------------------------------------------------------------

PROBE = "__probe__"
BOGUS = "__bogus__"
# A valid fleet that holds one of each section the parser only reaches through another
# (a node's chat block, its models, a task, a shadow policy). The parser itself says which
# keys each section allows: every probe below adds an unknown key or a wrong value and
# reads the ConfigError the fleet file's own strict check raises.
_PROBE_BASE: dict[str, Any] = {
    "nodes": [
        {"id": "dev-1", "tier": "device", "models": []},
        {"id": "cloud-1", "tier": "cloud", "models": ["<model>"], "engine": "ray", "ray": {},
         "chat": {"models": [{"name": "lm", "model": "lm"}]}},
    ],
    "links": [{"from": "dev-1", "to": "cloud-1"}],
    "tasks": {"<task>": {"input": {"name": "x", "shape": [-1, 4]}}},
    "routing": {"shadow": {"policy": "bandit"}},
    "batching": {"<model>": {}},
}
_SOURCE = "<file name>.yaml"  # the name a fleet takes when it names none: the file's stem
Loc = tuple[str | int, ...]
# Exceptions other than ConfigError that probes drew from the parser (for its maintainers).
PARSER_ESCAPES: set[str] = set()


class FleetSection(NamedTuple):
    label: str  # "routing.hedging", "nodes[]", "" for the top level
    keys: tuple[str, ...]  # in the order the parser lists them
    doc: dict[str, Any]  # a valid fleet (as parsed YAML) that holds this section ...
    loc: Loc  # ... here


class FleetKey(NamedTuple):
    section: str
    key: str
    type: str
    default: str  # Markdown
    allowed: str  # Markdown
    help: str  # Markdown
    subsection: str | None  # the label of the section this key opens, if any


def _parse_fleet(doc: dict[str, Any]) -> tuple[Any, Any]:
    """``(config, None)`` or ``(None, the ConfigError)``."""
    from tierlink.errors import ConfigError
    from tierlink.fleet.config import parse_fleet

    try:
        return parse_fleet(copy.deepcopy(doc), source=_SOURCE), None
    except ConfigError as exc:
        return None, exc
    except Exception as exc:  # noqa: BLE001  # a wrong shape the parser lets through
        PARSER_ESCAPES.add(f"{type(exc).__name__}: {exc}")
        return None, ConfigError(f"<{type(exc).__name__}>")


def _at(doc: Any, loc: Loc) -> Any:
    for part in loc:
        doc = doc[part]
    return doc


def _concrete(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _label(loc: Loc) -> str:
    return re.sub(r"\[\d+\]", "[]", _concrete(loc))


def _allowed_keys(doc: dict[str, Any], loc: Loc) -> tuple[str, ...] | None:
    """The keys the parser allows in the mapping at ``loc``, as its unknown-key error lists
    them; None when it takes an unknown key there (or does not reach it)."""
    probed = copy.deepcopy(doc)
    _at(probed, loc)[PROBE] = 0
    _, err = _parse_fleet(probed)
    if err is None:
        return None
    where = _concrete(loc)
    hint = str(err.hint or "")
    path = re.escape(f"{where}.{PROBE}" if where else PROBE)
    if re.fullmatch(path + r": unknown key( \(did you mean .*\))?", err.message) \
            and hint.startswith("use "):
        return tuple(hint.removeprefix("use ").split(", "))
    if err.message.startswith(f"{where}: unknown key(s)") and hint.startswith("known: "):
        return tuple(ast.literal_eval(hint.removeprefix("known: ")))
    return None


def fleet_sections() -> list[FleetSection]:
    """Every section of the fleet file whose keys the parser checks, with the keys it allows
    — found by asking the parser (``tierlink.fleet.config.parse_fleet``) itself: a key it
    does not know, added to a section, is refused with the list of the keys it does."""
    found: dict[str, FleetSection] = {}

    def visit(doc: dict[str, Any], loc: Loc, trials: bool, seen: set[Loc]) -> None:
        label = _label(loc)
        if loc in seen:
            return
        seen.add(loc)
        here = _at(doc, loc)
        if label in found:
            keys = found[label].keys
        else:
            allowed = _allowed_keys(doc, loc)
            if allowed is None:  # names of the user's (tasks:): each may hold a section
                for key, value in here.items():
                    if isinstance(value, dict):
                        visit(doc, (*loc, key), trials, seen)
                return
            doc = _repaired(doc, loc, allowed)
            here = _at(doc, loc)
            found[label] = FleetSection(label, allowed, doc, loc)
            keys = allowed
        for key in keys:
            value = here.get(key)
            if isinstance(value, dict):
                visit(doc, (*loc, key), trials, seen)
            elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
                for i in range(len(value)):
                    visit(doc, (*loc, key, i), trials, seen)
            elif trials:  # a section the base does not hold: a mapping, or a list of them
                for trial, sub in (({}, (key,)), ([{}], (key, 0))):
                    if _label((*loc, *sub)) in found:
                        continue
                    variant = copy.deepcopy(doc)
                    _at(variant, loc)[key] = trial
                    visit(variant, (*loc, *sub), trials, seen)

    visit(_PROBE_BASE, (), False, set())  # the sections the base holds, from where it holds them
    visit(_PROBE_BASE, (), True, set())  # then every other one
    return _in_file_order(found)


_SAMPLES = ((0.5, "number"), (1.5, "number"), (3, "integer"), (True, "boolean"),
            ("x-1", "string"))


def _repaired(doc: dict[str, Any], loc: Loc, keys: tuple[str, ...]) -> dict[str, Any]:
    """``doc`` made valid, when the section at ``loc`` lacks a key it needs: the first
    sample value of the first key that makes the parser take it (or ``doc`` as it is)."""
    if _parse_fleet(doc)[1] is None:
        return doc
    for key in keys:
        for value, _ in _SAMPLES:
            variant = copy.deepcopy(doc)
            _at(variant, loc)[key] = value
            if _parse_fleet(variant)[1] is None:
                return variant
    return doc


def _in_file_order(found: Mapping[str, FleetSection]) -> list[FleetSection]:
    """Depth first, each section's subsections in the order of the keys that open them."""
    children: dict[str, list[tuple[int, str]]] = {}
    for label in found:
        parts = label.split(".") if label else []
        for i in range(len(parts) - 1, -1, -1):
            parent = ".".join(parts[:i])
            if parent in found:
                key = parts[i].removesuffix("[]")
                children.setdefault(parent, []).append((found[parent].keys.index(key), label))
                break
    out: list[FleetSection] = []

    def walk(label: str) -> None:
        out.append(found[label])
        for _, child in sorted(children.get(label, [])):
            walk(child)

    walk("")
    return out


def _dict_at(doc: Any, loc: Loc) -> tuple[bool, Any]:
    for part in loc:
        if isinstance(part, int):
            if not isinstance(doc, list) or part >= len(doc):
                return False, None
        elif not isinstance(doc, dict) or part not in doc:
            return False, None
        doc = doc[part]
    return True, doc


def _clause(message: str, where: str) -> str:
    """The part of a parser error that says what a value must be."""
    text = message.removeprefix(where).lstrip(":").strip()
    text = re.sub(r",? got .*$", "", text)
    kept = [part for part in text.split("; ") if BOGUS not in part and str(-10**9) not in part]
    return "; ".join(kept).strip()


_GENERIC = re.compile(r"^(must be (a number|true or false|a mapping|an integer >= \S+)|"
                      r"is out of range .*)$")


def _constraint(section: FleetSection, key: str) -> tuple[str, str]:
    """What the parser says a value of ``key`` must be: ``(range, rule)``."""
    where = f"{_concrete(section.loc)}.{key}" if section.loc else key
    found_range, rule = "", ""
    for value in (-10**9, BOGUS):
        variant = copy.deepcopy(section.doc)
        _at(variant, section.loc)[key] = value
        _, err = _parse_fleet(variant)
        if err is None or not re.match(re.escape(where) + r"(:| |$)", err.message):
            continue
        m = re.search(r"out of range \[(\S+), (\S+)\]", err.message)
        if m:
            lo, hi = (None if x == "None" else x for x in m.groups())
            found_range = (f"{lo} to {hi}" if lo and hi else f"≥ {lo}" if lo else f"≤ {hi}")
            continue
        m = re.search(r"must be an integer >= (\S+)", err.message)
        if m:
            found_range = found_range or f"≥ {m.group(1).rstrip(',')}"
            continue
        clause = _clause(err.message, where)
        if clause and not _GENERIC.match(clause) and clause not in rule:
            hint = str(err.hint or "")
            named = hint.startswith(("use ", "one of ")) and hint[4:] not in clause
            rule = clause + (f" ({hint})" if named else "")
    return found_range, rule


# Where a section's typed settings live (for types, defaults and the comments beside them);
# a key is looked up as the field of its own name, ``<section>_<key>``, or as renamed here.
def _section_classes() -> dict[str, tuple[tuple[type, ...], dict[str, str]]]:
    from tierlink.estimate.cost import CostModel
    from tierlink.fleet.chat_config import ChatConfig
    from tierlink.fleet.config import FleetConfig, LinkConfig, NodeConfig
    from tierlink.llm.source import LMSource
    from tierlink.models.task import TaskSpec
    from tierlink.policy.base import DeviceStateRule, RewardWeights, Weights
    from tierlink.settings.batching import BatchSettings
    from tierlink.settings.engine import EngineConfig
    from tierlink.settings.hard_examples import HardExampleConfig
    from tierlink.settings.routing import (
        BreakerConfig,
        HedgeConfig,
        MirrorConfig,
        OverloadConfig,
        RoutingConfig,
        ShadowConfig,
    )
    from tierlink.settings.security import SecurityConfig
    from tierlink.settings.tracing import TracingConfig
    from tierlink.telemetry.tracing import TraceSettings

    policy = ((RoutingConfig,), {"name": "policy", "options": "policy_options"})
    return {
        "": ((FleetConfig,), {}),
        "zoo": ((FleetConfig,), {}),
        "control": ((FleetConfig,), {}),
        "nodes[]": ((NodeConfig, EngineConfig),
                    {"id": "node_id", "engine": "kind", "ray": "engine"}),
        "nodes[].ray": ((EngineConfig,), {}),
        "nodes[].chat": ((ChatConfig,), {}),
        "nodes[].chat.models[]": ((LMSource,), {"model": "path"}),
        "nodes[].chat.models[].split": ((LMSource,), {"to": "split"}),
        "links[]": ((LinkConfig,), {"from": "src", "to": "dst"}),
        "routing": ((RoutingConfig,), {"bandit": "reward"}),
        "routing.policy": policy,
        "routing.weights": ((Weights,), {}),
        "routing.breaker": ((BreakerConfig,), {}),
        "routing.hedging": ((HedgeConfig,), {}),
        "routing.overload": ((OverloadConfig,), {}),
        "routing.mirror": ((MirrorConfig,), {}),
        "routing.device_state": ((DeviceStateRule,), {}),
        "routing.cascade": ((RoutingConfig,), {}),
        "routing.bandit": ((RoutingConfig,), {}),
        "routing.bandit.reward": ((RewardWeights,), {}),
        "routing.shadow": ((ShadowConfig,), {}),
        "routing.shadow.policy": policy,
        "routing.shadow.weights": ((Weights,), {}),
        "cost": ((CostModel,), {}),
        "hard_examples": ((HardExampleConfig,), {}),
        "tasks.<task>": ((TaskSpec,), {}),
        "batching.<model>": ((BatchSettings,), {}),
        "tracing": ((TraceSettings, TracingConfig), {}),
        "security": ((SecurityConfig,), {}),
    }


# Keys that fill no dataclass field of their own (a section the parser spreads over its
# parent's fields, a value converted on the way in, an entry of a mapping): what each holds.
# ``*``: every key of the section.
_KEY_HELP: dict[tuple[str, str], str] = {
    ("", "cost"): "The prices routing and reports cost each answer at: USD per "
                  "compute-second by tier, USD per GB sent into a tier; a tier left out "
                  "keeps its default price.",
    ("", "zoo"): "Which build of the model zoo (its training recipes) the fleet's zoo "
                 "models come from.",
    ("", "control"): "The control plane: its port, its tier, how long a silent node stays "
                     "in the fleet's view, and where it keeps its state.",
    ("routing", "cascade"): "What `tierlink cascade tune` wrote: the models the thresholds "
                            "were tuned on, their measured figures and the target (not "
                            "meant to be edited by hand).",
    ("routing.cascade.target", "accuracy_drop"): "Points of accuracy the cascade may lose "
                                                 "against the most accurate model alone; a "
                                                 "re-tune aims at it again (left out: 0.3).",
    ("routing.cascade.target", "confidence"): "Probability that the accuracy target holds "
                                              "on unseen inputs (0: the calibration split's "
                                              "point estimate; left out: 0.95).",
    ("routing.split_codec_loss", "*"): "This codec's measured accuracy loss in points "
                                       "(`tierlink split codecs`); left out, the default "
                                       "table's figure prices split plans.",
    ("tasks.<task>", "input"): "The task's one input tensor, `{name, datatype, shape}` "
                               "(`-1`: any size); short for `inputs` with one entry.",
    ("nodes[].chat.models[]", "kv_cache_mib"): "MiB of KV cache per sequence: a sliding "
                                               "window with attention sinks keeps longer "
                                               "ones within it (left out: unbounded).",
    ("nodes[].chat.models[]", "kv_move"): "Whether a conversation's KV cache is shipped to "
                                          "the upstream that answers its next turn: `auto` "
                                          "(when the link makes it faster than prefilling "
                                          "there), `always` or `never`. Only between models "
                                          "of the same weights file and precision, and only "
                                          "where the conversation's privacy lets it go.",
    ("nodes[].chat.models[]", "kv_codec"): "The cache on the wire: `fp32` (the next turn is "
                                           "computed exactly as unmoved), `fp16` (half the "
                                           "bytes), `int8` (a quarter, plus 3% of scales) or "
                                           "`int4` (16%: groups of 32 with a scale and a "
                                           "minimum each).",
}


def _field_comments(cls: type) -> dict[str, str]:
    """The comments beside (or right above) each field of a dataclass, by field name."""
    try:
        source = inspect.cleandoc("\n" + inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    lines = source.splitlines()
    out: dict[str, str] = {}
    for i, line in enumerate(lines, start=1):
        m = re.match(r"^    (\w+): ", line)
        if not m:
            continue
        above: list[str] = []
        j = i - 1
        while j >= 1 and lines[j - 1].strip().startswith("#"):
            above.insert(0, comments.get(j, ""))
            j -= 1
        text = " ".join([*above, comments.get(i, "")] if i in comments else above)
        # a trailing comment of the line before ("... = x  # like this ...") that goes on
        # over the following comment lines, indented under it, belongs to that line, not to
        # this field (comment lines at the field's own indentation are the field's)
        if above and j >= 1 and j in comments and not lines[j - 1].strip().startswith("#") \
                and lines[j].startswith("     "):
            text = comments.get(i, "")
        if text.strip():
            out[m.group(1)] = text.strip()
    return out


def _enum_label(member: enum.Enum) -> str:
    return str(getattr(member, "label", member.value))


def _annotation_type(ann: str, namespace: Mapping[str, Any] | None = None) -> str:
    """A field's annotation (a string: the modules use postponed annotations) as a YAML or
    JSON type; an enum of ``namespace`` (the field's module) as its values."""
    ann = ann.strip()
    if ann.endswith(" | None"):
        return _annotation_type(ann.removesuffix(" | None"), namespace)
    simple = {"bool": "boolean", "int": "integer", "float": "number", "str": "string",
              "Any": "any", "TensorDecl": "tensor"}
    if ann in simple:
        return simple[ann]
    named = (namespace or {}).get(ann)
    if ann == "Tier" or (isinstance(named, type) and issubclass(named, enum.Enum)):
        from tierlink.core.types import Tier

        return " | ".join(_enum_label(m) for m in (named if named is not None else Tier))
    m = re.match(r"^(tuple|list|Mapping|dict)\[(.+)\]$", ann)
    if m:
        args, depth, start = [], 0, 0
        for i, ch in enumerate(m.group(2)):
            depth += {"[": 1, "]": -1}.get(ch, 0)
            if ch == "," and depth == 0:
                args.append(m.group(2)[start:i].strip())
                start = i + 1
        args.append(m.group(2)[start:].strip())
        if m.group(1) in ("tuple", "list"):
            return f"list of {_annotation_type(args[0], namespace)}"
        key = _annotation_type(args[0], namespace)
        return f"mapping: {'string' if key.startswith('list') else key} → " \
               f"{_annotation_type(args[-1], namespace)}"
    return "mapping"


def _namespace(classes: tuple[type, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for cls in classes:
        out.update(vars(sys.modules[cls.__module__]))
    return out


def _value_type(value: Any) -> str:
    for kind, name in ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"),
                       (list, "list"), (dict, "mapping")):
        if isinstance(value, kind):
            return name
    return ""


def _field_of(label: str, key: str) -> tuple[Any, str]:
    """``(dataclass field, its comment)`` for a key, when the code has one."""
    import dataclasses

    classes, renames = _section_classes().get(label, ((), {}))
    last = label.split(".")[-1].removesuffix("[]")
    for name in (renames.get(key), key, f"{last}_{key}"):
        for cls in classes:
            by_name = {f.name: f for f in dataclasses.fields(cls)}
            if name and name in by_name:
                return by_name[name], _field_comments(cls).get(name, "")
    return None, ""


def fleet_keys() -> list[FleetKey]:
    """Every key of every checked section (:func:`fleet_sections`), with what the code
    says of it: its type (the dataclass field it fills), its default (what the parser puts
    in the configuration when it is left out, as ``FleetConfig.to_dict`` writes it back),
    its range or rule (the parser's own error for a wrong value) and the comment beside it."""
    sections = fleet_sections()
    labels = {s.label for s in sections}
    out = []
    for section in sections:
        here = _at(section.doc, section.loc)
        for key in section.keys:
            path = f"{section.label}.{key}" if section.label else key
            sub = next((lbl for lbl in sorted(labels) if lbl in (path, f"{path}[]")
                        or lbl.startswith(f"{path}.<")), None)
            field, comment = _field_of(section.label, key)
            comment = comment or _KEY_HELP.get((section.label, key)) \
                or _KEY_HELP.get((section.label, "*"), "")
            config, err = _parse_fleet(section.doc)
            if key in here:  # the base gives it: is it required, else what when left out?
                variant = copy.deepcopy(section.doc)
                del _at(variant, section.loc)[key]
                config, err = _parse_fleet(variant)
            if err is not None:
                default = "**required**"
            else:
                present, value = _dict_at(config.to_dict(), (*section.loc, key))
                default = "not set" if not present else f"see `{sub}`" if sub and value \
                    and isinstance(value, dict | list) else _code(value)
            ftype = "" if field is None else _annotation_type(str(field.type), _namespace(
                _section_classes()[section.label][0]))
            if not ftype and sub:
                ftype = "list of mapping" if sub.endswith("[]") else "mapping"
            elif sub and not ftype.startswith(("mapping", "list of mapping")):
                ftype += " or mapping"  # a name, or {name, options}
            ftype = ftype or _probed_type(section, key)
            rng, rule = ("", "") if sub and "mapping" in ftype else _constraint(section, key)
            allowed = "; ".join(x for x in (_escape(rng), _escape(rule)) if x)
            help_text = _escape(_rst(comment))
            if help_text and not help_text.endswith("."):
                help_text += "."
            if sub:
                help_text = (help_text + " " if help_text else "") + f"See `{sub}`."
            out.append(FleetKey(section.label, key, ftype, default, allowed, help_text, sub))
    return out


def _probed_type(section: FleetSection, key: str) -> str:
    """A key no dataclass field names: the first kind of value the parser takes and keeps."""
    for value, name in _SAMPLES:
        variant = copy.deepcopy(section.doc)
        _at(variant, section.loc)[key] = value
        config, err = _parse_fleet(variant)
        if err is None and _dict_at(config.to_dict(), (*section.loc, key)) == (True, value):
            return name
    return _value_type(_at(section.doc, section.loc).get(key))


def _section_intro(label: str) -> str:
    """The docstring of the settings a section fills (not its parent's, not one that only
    names the section); a policy's ``{name, options}`` form, from its parser."""
    from tierlink.settings.routing import policy_choice

    if label.endswith(".policy"):
        return _rst(_first_line(policy_choice.__doc__))
    table = _section_classes()
    classes = table.get(label, ((), {}))[0]
    parent = label.rsplit(".", 1)[0] if "." in label else ""
    inherited = set(table.get(parent, ((), {}))[0]) if label else set()
    for cls in classes:
        text = _first_line(cls.__doc__)
        if cls in inherited or not text or text.startswith(cls.__name__ + "(") \
                or re.fullmatch(r"(Fleet YAML )?``[\w.]+``\.?", text):
            continue
        return _rst(text)
    return ""


def fleet_file_page() -> str:
    from tierlink.fleet import config as fleet_config
    from tierlink.settings.routing import LIVE_KEYS

    keys = fleet_keys()
    sections = []
    for section in fleet_sections():
        title = f"`{section.label}`" if section.label else "Top level"
        lines = [f"## {title}", ""]
        intro = _section_intro(section.label)
        if intro and section.label:
            lines += [_escape(intro), ""]
        if section.label == "routing":
            lines += ["A running node takes these keys from a new routing revision "
                      "(`tierlink policy apply`; `LIVE_KEYS` in `tierlink.settings.routing`): "
                      + ", ".join(_code(k) for k in LIVE_KEYS)
                      + ". The others are fixed for the life of its processes.", ""]
        rows = [(_code(k.key), _escape(k.type), k.default, k.allowed, k.help)
                for k in keys if k.section == section.label]
        lines.append(_table(("Key", "Type", "Default", "Allowed", "Description"), rows))
        sections.append("\n".join(lines))
    example = PACKAGE / "demo" / "fleets" / "fleet.yaml"
    intro = "\n\n".join([
        _rst(_first_paragraph(fleet_config.__doc__)),
        ("Every section below is the parser's own: `tierlink.fleet.config.parse_fleet` refuses "
         "a key it does not know (`routing.polcy: unknown key (did you mean routing.policy?)`), "
         "and that check is what lists each section's keys here. *Type* and *Description* "
         "come from the dataclass field each key fills (and the comment beside it), *Default* "
         "from what the parser puts in the configuration when the key is left out, *Allowed* "
         "from the parser's own error for a wrong value. `nodes[]` is an entry of the `nodes` "
         "list; `tasks.<task>` a task declared by name, `batching.<model>` a served model by name. A mapping not listed as a section "
         "(`routing.thresholds`, `nodes[].labels`, ...) takes names of the user's."),
        (f"## Example\n\nThe demo's fleet (`{_relative(example)}`):\n\n"
         f"```yaml\n{example.read_text().rstrip()}\n```")])
    return _page("Fleet file", intro, *sections)


# -- request parameters -------------------------------------------------------------------


def _parameter_rows(params: Any) -> list[tuple[str, ...]]:
    return [(_code(p.name), _escape(p.type), _escape(p.default) if p.default else "",
             _escape(_rst(p.meaning))) for p in params]


def request_parameters_page() -> str:
    import dataclasses

    from tierlink.chat import openai
    from tierlink.node import protocol

    header = ("Parameter", "Type", "Default", "Meaning")
    chat_fields = dataclasses.fields(openai.TierlinkParams)
    comments = _field_comments(openai.TierlinkParams)
    chat_rows = []
    for f in chat_fields:
        default = f.default
        shown = _enum_label(default) if isinstance(default, enum.Enum) else default
        chat_rows.append((_code(f.name),
                          _escape(_annotation_type(str(f.type), vars(openai))),
                          "" if shown is None else _code(shown),
                          _escape(_rst(comments.get(f.name, "")))))
    return _page(
        "Request parameters",
        "What travels with a request as Open Inference Protocol `parameters` (and, on the "
        "chat API, in the body's `tierlink` object). Tables: `REQUEST_PARAMETERS` and "
        "`RESPONSE_PARAMETERS` in `tierlink.node.protocol` (a unit test holds them to the "
        "parser), and the fields of `tierlink.chat.openai.TierlinkParams`.",
        "## Request parameters\n\nAll optional: a client on the device may send none.\n\n"
        + _table(header, _parameter_rows(protocol.REQUEST_PARAMETERS)),
        "## Response parameters\n\nWhat a routed answer carries (a model endpoint's answer "
        "carries only `tierlink.server_ms` and `tierlink.model_version`).\n\n"
        + _table(header, _parameter_rows(protocol.RESPONSE_PARAMETERS)),
        "## Chat API: the `tierlink` object\n\n" + _escape(_rst(" ".join(
            _first_paragraph(openai.__doc__.split("\n\n", 1)[1]).split()))) + "\n\n"
        + _table(("Field", "Type", "Default", "Meaning"), chat_rows),
    )


# -- HTTP APIs ------------------------------------------------------------------------------


class HttpApi(NamedTuple):
    title: str
    factory: str  # where its app comes from
    note: str
    document: dict[str, Any]  # the OpenAPI document
    hidden: tuple[str, ...]  # routes served but left out of the document


def _hidden_routes(app: Any) -> tuple[str, ...]:
    own = {app.openapi_url, app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url}
    out = []
    for route in app.routes:
        if getattr(route, "include_in_schema", True) is False and route.path not in own:
            methods = ",".join(sorted(getattr(route, "methods", None) or ())) or "ANY"
            out.append(f"{methods} {route.path}")
    return tuple(out)


def http_apis() -> list[HttpApi]:
    """The OpenAPI document of every HTTP server of a fleet, each app built as the tests
    build it (``tests/transport/test_openapi_bodies.py``): never served, its stores in a
    temporary directory."""
    from tierlink.chat.service import ChatService
    from tierlink.control.app import create_app as control_app
    from tierlink.control.identity import IdentityStore
    from tierlink.control.store import SqliteRegistryStore
    from tierlink.core.types import Tier
    from tierlink.netem.server import LinkEmulator, create_control_app
    from tierlink.node.app import create_app as node_app
    from tierlink.node.inbox_routes import install_inbox_routes
    from tierlink.node.service import NodeService
    from tierlink.node.spec import NodeSpec
    from tierlink.repo.blobs import BlobStore
    from tierlink.repo.service import RepositoryService
    from tierlink.repo.store import SqliteVersionStore
    from tierlink.security.pki import Authority

    out = []
    with tempfile.TemporaryDirectory(prefix="tierlink-docs-") as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        db = Path(tmp) / "control.db"
        registry, identity = SqliteRegistryStore(db), IdentityStore(db, "docs-admin-token-0123")
        try:
            repo = RepositoryService(SqliteVersionStore(db), BlobStore(Path(tmp) / "blobs"))
            control = control_app(registry, identity=identity, repository=repo,
                                  authority=Authority.create("docs", time.time()))
            out.append(HttpApi(
                "Control plane", "tierlink.control.app.create_app",
                "Built with every optional part: identity (enrollment, credentials), the fleet "
                "CA (`/v1/certificate`) and the model repository (`/v1/blobs`, `/v1/models`).",
                control.openapi(), _hidden_routes(control)))
        finally:
            identity.close()
            registry.close()
        node = node_app(NodeService(NodeSpec("node-1", Tier.DEVICE, ()), {}))
        install_inbox_routes(node, None)  # type: ignore[arg-type]  # only its document is read
        chat_node = node_app(NodeService(NodeSpec("node-1", Tier.DEVICE, ()), {}),
                             chat=ChatService("node-1", Tier.DEVICE, {}, {}))
        plain = node.openapi()
        out.append(HttpApi(
            "Node", "tierlink.node.app.create_app",
            "The Open Inference Protocol (v2) and tierlink's own routes. "
            "`/tierlink/v1/inbox` is there on a node with a state directory (store-and-forward "
            "from the nodes below it).", plain, _hidden_routes(node)))
        with_chat = chat_node.openapi()
        chat_paths = {path: ops for path, ops in with_chat["paths"].items()
                      if path not in plain["paths"]}
        out.append(HttpApi(
            "Node: chat API", "tierlink.chat.routes.install_chat_routes",
            "OpenAI-compatible: on a node whose fleet entry has a `chat:` block, beside its "
            "other routes (in the same OpenAPI document).", {**with_chat, "paths": chat_paths},
            ()))
        links = create_control_app(LinkEmulator([]))
        out.append(HttpApi(
            "Link emulator", "tierlink.netem.server.create_control_app",
            "The emulated links of a fleet on one machine (`tierlink up`).", links.openapi(),
            _hidden_routes(links)))
    return out


def _schema_name(schema: Mapping[str, Any]) -> str:
    if "$ref" in schema:
        return _code(str(schema["$ref"]).rsplit("/", 1)[-1])
    if schema.get("type") == "array" and isinstance(schema.get("items"), Mapping):
        return "list of " + _schema_name(schema["items"])
    if "anyOf" in schema:
        return " or ".join(_schema_name(s) for s in schema["anyOf"])
    if schema.get("format") == "binary":
        return "bytes"
    if schema.get("type") == "object" and schema.get("properties"):
        return "object {" + ", ".join(_code(p) for p in schema["properties"]) + "}"
    return _escape(str(schema.get("type", "any")))


def _operation(method: str, path: str, op: Mapping[str, Any]) -> str:
    lines = [f"### `{method.upper()} {path}`", ""]
    summary = op.get("summary", "")
    description = _rst(inspect.cleandoc(op.get("description", "")))
    lines += [f"**{_escape(summary)}**" + (f" — {_escape(description)}" if description else ""),
              ""]
    params = op.get("parameters", [])
    if params:
        rows = [(_code(p["name"]), p.get("in", ""), "yes" if p.get("required") else "no",
                 _schema_name(p.get("schema", {})), _escape(p.get("description", "")))
                for p in params]
        lines += [_table(("Parameter", "In", "Required", "Type", "Description"), rows), ""]
    body = op.get("requestBody")
    if body:
        kinds = [f"{_code(media)}: {_schema_name(c.get('schema', {}))}"
                 for media, c in body.get("content", {}).items()]
        lines += [f"Request body ({'required' if body.get('required') else 'optional'}): "
                  + "; ".join(kinds), ""]
    responses = []
    for code, resp in op.get("responses", {}).items():
        schemas = [_schema_name(c.get("schema", {})) for c in resp.get("content", {}).values()
                   if c.get("schema")]
        text = f"`{code}` {_escape(resp.get('description', ''))}"
        responses.append(text + (f" ({', '.join(schemas)})" if schemas else ""))
    lines += ["Responses: " + "; ".join(responses), ""]
    return "\n".join(lines)


def http_api_page() -> str:
    sections = []
    for api in http_apis():
        doc = api.document
        ops = [(m, p, op) for p, methods in doc["paths"].items() for m, op in methods.items()]
        rows = [(f"`{m.upper()}`", _code(p), _escape(op.get("summary", ""))) for m, p, op in ops]
        lines = [f"## {api.title}", "", f"`{api.factory}` — {api.note}", "",
                 (f"OpenAPI document: `{doc['info']['title']}` version "
                  f"`{doc['info']['version']}`, served at `/openapi.json`."), "",
                 _table(("Method", "Path", "Summary"), rows), ""]
        if api.hidden:
            lines += ["Served but not in the document: "
                      + ", ".join(_code(r) for r in api.hidden) + ".", ""]
        lines += [_operation(m, p, op) for m, p, op in ops]
        sections.append("\n".join(lines))
    return _page("HTTP APIs", "Every route of every HTTP server of a fleet, from each app's "
                 "OpenAPI document (the apps are built, never served).", *sections)


# -- metrics ----------------------------------------------------------------------------------

_METRIC_TYPES = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram",
                 "Summary": "summary", "Info": "info", "Enum": "stateset",
                 "CounterMetricFamily": "counter", "GaugeMetricFamily": "gauge",
                 "HistogramMetricFamily": "histogram", "SummaryMetricFamily": "summary",
                 "InfoMetricFamily": "info"}


class Metric(NamedTuple):
    name: str  # as declared
    type: str
    labels: tuple[str, ...] | None  # None: not a literal in the declaration
    help: str
    module: str  # tierlink.telemetry.metrics
    owner: str  # the class (or function) that declares it

    @property
    def exposed(self) -> str:
        """The series name on ``/metrics`` (prometheus_client adds ``_total`` to counters)."""
        return self.name.removesuffix("_total") + "_total" if self.type == "counter" \
            else self.name


def _literal_strings(node: ast.AST | None) -> tuple[str, ...] | None:
    if isinstance(node, ast.List | ast.Tuple) and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        return tuple(e.value for e in node.elts)  # type: ignore[attr-defined]
    return None


def declared_metrics() -> list[Metric]:
    """Every Prometheus metric declared in ``src/tierlink`` (a ``Counter``, ``Gauge``,
    ``Histogram``... or ``*MetricFamily`` built with a literal name), read from the source
    with ``ast``: nothing is imported, so no registry is touched."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        if '"tierlink_' not in text:
            continue
        tree = ast.parse(text, str(path))
        module = ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
        lists: dict[str, set[tuple[str, ...]]] = {}  # name = ["literal", ...] anywhere
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                    and isinstance(node.targets[0], ast.Name):
                value = _literal_strings(node.value)
                if value is not None:
                    lists.setdefault(node.targets[0].id, set()).add(value)
        owners: dict[ast.AST, str] = {}  # node -> the top-level class or function holding it
        for top in tree.body:
            if isinstance(top, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                for inner in ast.walk(top):
                    owners[inner] = top.name
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            kind = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if kind not in _METRIC_TYPES or not node.args:
                continue
            name = node.args[0]
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)
                    and name.value.startswith("tierlink_")):
                continue
            doc = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg in ("documentation", "doc")), None)
            labels_node = node.args[2] if len(node.args) > 2 else next(
                (k.value for k in node.keywords if k.arg in ("labelnames", "labels")), None)
            labels = () if labels_node is None else _literal_strings(labels_node)
            if isinstance(labels_node, ast.Name) and len(lists.get(labels_node.id, ())) == 1:
                labels = next(iter(lists[labels_node.id]))
            text = doc.value if isinstance(doc, ast.Constant) and isinstance(doc.value, str) \
                else ""
            out.append(Metric(name.value, _METRIC_TYPES[kind], labels, str(text), module,
                              owners.get(node, "")))
    return out


def metrics_page() -> str:
    by_owner: dict[tuple[str, str], list[Metric]] = {}
    for metric in declared_metrics():
        by_owner.setdefault((metric.module, metric.owner), []).append(metric)
    sections = []
    for (module, owner), metrics in by_owner.items():
        where = f"{module}.{owner}" if owner else module
        rows = [(_code(m.exposed), m.type,
                 ", ".join(_code(x) for x in m.labels) if m.labels is not None else "computed",
                 _escape(m.help)) for m in metrics]
        sections.append(f"## `{where}`\n\n" + _table(("Series", "Type", "Labels", "Help"), rows))
    return _page(
        "Metrics", "Every Prometheus series tierlink declares, by the class that declares it, "
        "read from the declarations in the source. Nodes serve theirs on `/metrics` "
        "(`tierlink.telemetry.metrics.NodeMetrics`, the outbox's, the language models', the "
        "model installs), the control plane on its own `/metrics` (`tierlink.control.*`). "
        "A node process also serves Prometheus's standard `process_*` series "
        "(`process_cpu_seconds_total`, `process_resident_memory_bytes`, `process_open_fds`, "
        "...: `tierlink.telemetry.process`). Counters are exposed with the `_total` suffix (and `_created`), histograms as "
        "`_bucket`, `_sum` and `_count`; Prometheus adds `instance` (the node) when it "
        "scrapes.", *sections)


# -- errors -----------------------------------------------------------------------------------


def error_classes() -> list[tuple[int, type]]:
    """The exception tree of ``tierlink.errors``, depth first: ``(depth, class)``."""
    from tierlink import errors

    out: list[tuple[int, type]] = []

    def walk(cls: type, depth: int) -> None:
        out.append((depth, cls))
        subclasses: list[type] = sorted(cls.__subclasses__(), key=_definition_order)
        for sub in subclasses:
            if sub.__module__ == errors.__name__:
                walk(sub, depth + 1)

    walk(errors.TierlinkError, 0)
    return out


def _definition_order(cls: type) -> int:
    try:
        return inspect.getsourcelines(cls)[1]
    except (OSError, TypeError):
        return 10**9


def _tree_descriptions(doc: str) -> dict[str, str]:
    """The one-line descriptions in the module docstring's tree, by class name."""
    out: dict[str, str] = {}
    name = None
    for line in doc.splitlines():
        m = re.match(r"^[\s│├└─]*([A-Z]\w+)(?:\s{2,}(.*))?$", line)
        if m:
            name = m.group(1)
            out[name] = (m.group(2) or "").strip()
        elif name and line.strip(" │").strip():
            out[name] += " " + line.strip(" │").strip()
        else:
            name = None
    return out


def errors_page() -> str:
    from tierlink import errors

    tree = _tree_descriptions(errors.__doc__ or "")
    lines = []
    for depth, cls in error_classes():
        own = cls.__dict__.get("__doc__")
        desc = _first_line(own) or re.sub(r"^\d{3}(?::\s*|$)", "", tree.get(cls.__name__, ""))
        facts = [f"code {_code(cls.code)}", f"HTTP {cls.http_status}"]  # type: ignore[attr-defined]
        if cls.hint:  # type: ignore[attr-defined]
            facts.append(f"hint: {_escape(cls.hint)}")  # type: ignore[attr-defined]
        lines.append("    " * depth + f"- **`{cls.__name__}`**"
                     + (f" — {_escape(_rst(desc))}" if desc else "") + " (" + "; ".join(facts)
                     + ")")
    intro = (_rst(" ".join(_first_paragraph(errors.__doc__).split())) + " Each class below: "
             "its `code`, the HTTP status it maps to and its default hint (from the class), "
             "and what it means (its docstring, else the tree in the module's docstring). "
             "Over HTTP an error is `{\"error\": message, \"code\", \"hint\", \"details\"}`.")
    return _page("Errors", intro, "\n".join(lines))


# -- packages ---------------------------------------------------------------------------------


class Module(NamedTuple):
    name: str  # tierlink.node.app
    package: str  # tierlink.node
    is_package: bool
    summary: str  # the first paragraph of its docstring


def modules() -> list[Module]:
    """Every package and module under ``src/tierlink``, from the files (docstrings read with
    ``ast``: nothing is imported)."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        if is_package and not all((SRC.joinpath(*parts[:i]) / "__init__.py").exists()
                                  for i in range(1, len(parts))):
            continue
        doc = ast.get_docstring(ast.parse(path.read_text(), str(path)))
        package = name if is_package else name.rsplit(".", 1)[0]
        out.append(Module(name, package, is_package, _first_line(doc)))
    return sorted(out, key=lambda m: (m.package, not m.is_package, m.name))


def packages_page() -> str:
    sections = []
    by_package: dict[str, list[Module]] = {}
    for module in modules():
        by_package.setdefault(module.package, []).append(module)
    for package, members in by_package.items():
        head = next((m for m in members if m.is_package), None)
        lines = [f"## `{package}`", ""]
        if head and head.summary and head.summary != package:
            lines += [_escape(_rst(head.summary)), ""]
        rows = [(_code(m.name), _escape(_rst(m.summary))) for m in members if not m.is_package]
        if rows:
            lines.append(_table(("Module", "What it is"), rows))
        sections.append("\n".join(lines))
    return _page("Packages", "Every package and module of `src/tierlink`, with the first "
                 "paragraph of its docstring.", *sections)


# -- the Python API -------------------------------------------------------------------------

_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):`(~?)([^`]+)`")


def sphinx_roles_as_code(text: str) -> str:
    """``:class:`~a.b.C``` -> ```C```, ``:mod:`a.b``` -> ```a.b```: what mkdocstrings
    would otherwise print as it is (it renders no Sphinx role)."""
    return _ROLE.sub(lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}`",
                     text)


try:  # mkdocstrings' griffe, when this file is loaded as its extension
    from griffe import Extension as _GriffeExtension
except ImportError:  # pragma: no cover
    _GriffeExtension = object  # type: ignore[assignment,misc]


class SphinxRoles(_GriffeExtension):  # type: ignore[misc,valid-type]
    """A griffe extension (``docs/gen/reference.py:SphinxRoles``): the Sphinx roles of
    tierlink's docstrings as code spans, so the Python API page reads cleanly."""

    def on_object(self, *, obj: Any, **kwargs: Any) -> None:
        if getattr(obj, "docstring", None) is not None:
            obj.docstring.value = sphinx_roles_as_code(obj.docstring.value)


# The public Python API, as mkdocstrings renders it: module -> what this page says of it.
PYTHON_API = {
    "tierlink.client.sync": "The blocking client.",
    "tierlink.client.aio": "The asyncio client: the same methods, awaited.",
    "tierlink.client.results": "What the clients return.",
    "tierlink.policy.base": "The placement policy contract, its configuration and registry.",
    "tierlink.models.task": "Tasks: the input a request carries and the kind of answer.",
    "tierlink.models.kinds": "Output kinds: how a task's raw outputs become an answer.",
    "tierlink.models.kind_registry": "The registry of output kinds (entry points).",
    "tierlink.models.card": "The model card.",
}


def public_names(module: str) -> tuple[str, ...]:
    """A module's public names: its ``__all__``, else what it defines without a leading
    underscore (read with ``ast``)."""
    path = SRC.joinpath(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    tree = ast.parse(path.read_text(), str(path))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            names = _literal_strings(node.value)
            if names is not None:
                return names
    defined = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            defined.append(node.name)
        elif isinstance(node, ast.Assign):
            defined += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined.append(node.target.id)
    return tuple(n for n in defined if not n.startswith("_") and n != "T")


def python_api_page() -> str:
    sections = []
    for module, what in PYTHON_API.items():
        members = "\n".join(f"        - {name}" for name in public_names(module))
        sections.append(f"## `{module}`\n\n{what}\n\n::: {module}\n    options:\n"
                        f"      show_root_heading: false\n      heading_level: 3\n"
                        f"      members:\n{members}")
    return _page("Python API", "The classes and functions an application or a plugin "
                 "(a policy, an output kind) uses, rendered by mkdocstrings from their "
                 "docstrings; each module limited to its public names (`__all__`).", *sections)


# -- the index and the writer -----------------------------------------------------------------

_FENCE = re.compile(r"^\s*(```|~~~)")
_LINK = re.compile(r"\]\(\s*(https?://[^)\s]+)|<(https?://[^>\s]+)>")


def external_links(root: Path = ROOT) -> dict[str, list[str]]:
    """Every external link of the documentation (the pages under ``docs/`` and the README),
    outside code blocks and code spans: URL -> the pages that carry it, sorted. The site
    build checks internal links and anchors; these are listed, never fetched."""
    found: dict[str, set[str]] = {}
    sources = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    for path in sources:
        if not path.is_file() or (root / "docs" / "gen") in path.parents:
            continue
        fenced = False
        for line in path.read_text().splitlines():
            if _FENCE.match(line):
                fenced = not fenced
                continue
            if fenced:
                continue
            for m in _LINK.finditer(re.sub(r"`[^`]*`", "", line)):
                found.setdefault(m.group(1) or m.group(2), set()).add(
                    path.relative_to(root).as_posix())
    return {url: sorted(pages) for url, pages in sorted(found.items())}


def external_links_page() -> str:
    links = external_links()
    rows = [(f"<{url}>", ", ".join(f"`{p}`" for p in pages)) for url, pages in links.items()]
    return _page("External links",
                 f"Every link out of this documentation ({len(links)}), and the pages that "
                 "carry it. The site's build checks every internal link and anchor; these "
                 "are listed here and never fetched by the tests.",
                 _table(("link", "on"), rows))


PAGES: dict[str, tuple[str, str, Callable[[], str]]] = {
    "reference/cli.md": (
        "Command line", "every `tierlink` command, its arguments and options", cli_page),
    "reference/fleet-file.md": (
        "Fleet file", "every key of the fleet YAML file, by section", fleet_file_page),
    "reference/request-parameters.md": (
        "Request parameters",
        "the OIP parameters tierlink reads from requests and writes into answers",
        request_parameters_page),
    "reference/http-api.md": (
        "HTTP APIs", "the routes of the node, chat API, control plane and link emulator",
        http_api_page),
    "reference/metrics.md": (
        "Metrics", "every Prometheus series, its type, labels and help", metrics_page),
    "reference/errors.md": (
        "Errors", "the exception tree: codes, HTTP statuses, hints", errors_page),
    "reference/packages.md": (
        "Packages", "every package and module of `src/tierlink`", packages_page),
    "reference/python-api.md": (
        "Python API", "the clients, the policy contract, tasks, output kinds and the model card",
        python_api_page),
    "reference/external-links.md": (
        "External links", "every link out of the documentation, and where", external_links_page),
}


def index_page() -> str:
    rows = "\n".join(f"- [{title}]({Path(path).name}) — {what}"
                     for path, (title, what, _) in PAGES.items())
    return _page("Reference", f"Every page of this section is generated from the code when "
                 f"the site is built (`{GENERATOR}`, run by the mkdocs `gen-files` plugin), so "
                 f"it is never out of date and never edited by hand.", rows)


def pages() -> Iterator[tuple[str, str]]:
    yield "reference/index.md", index_page()
    for path, (_, _, make) in PAGES.items():
        yield path, make()


def write_all(open_fn: Callable[..., IO[str]]) -> None:
    """Write every page through ``open_fn(path, "w")`` (``mkdocs_gen_files.open``)."""
    for path, text in pages():
        with open_fn(path, "w") as f:
            f.write(text)


if __name__ == "<run_path>":  # the gen-files plugin (runpy.run_path)
    import mkdocs_gen_files

    write_all(mkdocs_gen_files.open)
elif __name__ == "__main__":  # python docs/gen/reference.py OUT_DIR
    if len(sys.argv) != 2:
        sys.exit("usage: python docs/gen/reference.py OUT_DIR")
    out_dir = Path(sys.argv[1])

    def _open(path: str, mode: str) -> IO[str]:
        target = out_dir / path
        target.parent.mkdir(parents=True, exist_ok=True)
        return target.open(mode)

    write_all(_open)
