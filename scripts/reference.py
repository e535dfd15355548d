"""Write the reference pages from the code, so that they cannot drift from it:

- ``docs/api.md`` from the docstrings: every name in ``nbmonitor.__all__`` (its signature, its
  docstring, and a class's public members), the attach options (``nbmonitor.options``: each
  option's type, default and doc), the fields of ``Thresholds``, and the framework callbacks;
- ``docs/cli.md`` from the command line's own ``--help``: the program and every command.

    python3 scripts/reference.py           # rewrite both pages
    python3 scripts/reference.py --check   # exit 1 if either is out of date

Docstrings are written in reStructuredText's small subset the code uses (double backquotes,
``Args:`` lists, ``>>>`` examples, ``::`` literal blocks); they are turned into Markdown here.
"""

from __future__ import annotations

import argparse
import dataclasses
import doctest
import importlib
import inspect
import os
import re
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
API = ROOT / "docs" / "api.md"
CLI = ROOT / "docs" / "cli.md"
HEADER = "<!-- written by python3 scripts/reference.py from the {what}; do not edit by hand -->"

# The public names, in the order a reader meets them (any other name of __all__ follows).
ORDER = (
    "attach",
    "Monitor",
    "Profile",
    "open",
    "Run",
    "Job",
    "tail",
    "list_runs",
    "compare",
    "summary",
    "devices",
    "DeviceWatch",
    "Thresholds",
    "export",
    "NonFiniteError",
    "RunDirError",
    "__version__",
)
# How a member is written: ``mon.log(...)`` rather than ``Monitor.log(...)``.
INSTANCE = {
    "Monitor": "mon",
    "Run": "run",
    "Job": "job",
    "Profile": "prof",
    "DeviceWatch": "watch",
    "Thresholds": "thresholds",
    "RunMemory": "mon.memory",
}
# Types the public calls return, documented with them: (module, name).
RETURNED = (
    ("nbmonitor.health", "Alert"),
    ("nbmonitor.health.explain", "Explanation"),
    ("nbmonitor.health.finetune", "AdapterVerdict"),
    ("nbmonitor.live.run_memory", "RunMemory"),
)
# The framework callbacks (each needs its framework's extra).
INTEGRATIONS = (
    ("nbmonitor.integrations.hf", "NbmonitorCallback", "hf"),
    ("nbmonitor.integrations.lightning", "NbmonitorCallback", "lightning"),
)
# Markdown's lines are not wrapped; argparse's help is formatted for this many columns.
CLI_COLUMNS = 100


# -- docstrings to Markdown -------------------------------------------------------------------

_SECTION = re.compile(r"^(Args|Arguments|Returns|Raises|Options|Yields|Example|Examples):\s*$")
_ITEM = re.compile(r"^(\*{0,2}[A-Za-z_][\w.]*)(?: \(([^)]*)\))?: (.*)$")


def markdown(doc: str) -> str:
    """A docstring (already ``inspect.cleandoc``-ed) as Markdown."""
    out: list[str] = []
    lines = doc.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(">>>"):
            block = []
            while i < len(lines) and lines[i].strip():
                block.append(lines[i])
                i += 1
            out += ["", "```pycon", *block, "```", ""]
            continue
        if line.rstrip().endswith("::") and not line.lstrip().startswith(".."):
            text = line.rstrip()[:-1]  # "Live::" -> "Live:"
            if text.strip() not in ("", ":"):
                out.append(_inline(text))
            i += 1
            block, i = _indented(lines, i)
            out += ["", "```", *textwrap.dedent("\n".join(block)).strip("\n").splitlines(), "```"]
            continue
        section = _SECTION.match(line)
        if section:
            out += ["", f"**{section.group(1)}:**", ""]
            i += 1
            block, i = _indented(lines, i)
            out += _items(textwrap.dedent("\n".join(block)).splitlines())
            out.append("")
            continue
        if line.startswith("    ") and (not out or not out[-1].strip()):
            block, i = _indented(lines, i)
            out += ["```", *textwrap.dedent("\n".join(block)).strip("\n").splitlines(), "```"]
            continue
        out.append(_inline(line))
        i += 1
    text = "\n".join(out)
    return re.sub(r"\n{3,}", "\n\n", text).strip("\n")


def _indented(lines: list[str], i: int) -> tuple[list[str], int]:
    """The block of indented (or blank) lines from ``i``; where it ends."""
    block: list[str] = []
    while i < len(lines) and (not lines[i].strip() or lines[i].startswith((" ", "\t"))):
        block.append(lines[i])
        i += 1
    while block and not block[-1].strip():
        block.pop()
        i -= 1
    return block, i


def _items(lines: list[str]) -> list[str]:
    """``name: text`` entries (continued by indented lines) as a Markdown list."""
    items: list[str] = []
    for line in lines:
        match = _ITEM.match(line)
        if match and not line.startswith(" "):
            name, kind, text = match.groups()
            kind = f" ({_inline(kind)})" if kind else ""
            items.append(f"- `{name}`{kind}: {_inline(text)}")
        elif line.strip() and items:
            items[-1] += " " + _inline(line.strip())
        elif line.strip():
            items.append(_inline(line.strip()))
    return items


def _inline(text: str) -> str:
    text = re.sub(r":(?:func|class|meth|data|attr|mod|exc):`~?([^`]+)`", r"``\1``", text)
    return text.replace("``", "`")


def fields_doc(doc: str) -> dict[str, str]:
    """The ``name: text`` entries of a docstring whose fields are documented one by one
    (``AttachOptions``, ``Thresholds`` after its ``Fields:`` line): each name's text,
    continuation lines (indented deeper) joined."""
    found: dict[str, str] = {}
    name = ""
    base: int | None = None
    text = inspect.cleandoc(doc)
    text = re.split(r"\n\s*Fields:\n", text, maxsplit=1)[-1]
    for line in text.splitlines():
        indent = len(line) - len(line.lstrip())
        match = _ITEM.match(line.strip())
        if match and (base is None or indent <= base):
            base = indent
            name = match.group(1)
            found[name] = match.group(3).strip()
        elif name and base is not None and indent > base and line.strip():
            found[name] += " " + line.strip()
        elif line.strip():
            name = ""
    return {key: _inline(text) for key, text in found.items()}


def _before(doc: str, section: str) -> str:
    """``doc`` without its ``section`` (listed in a table instead)."""
    return re.split(rf"\n\s*{section}:\n", doc, maxsplit=1)[0].rstrip()


# -- signatures -------------------------------------------------------------------------------


class _Text:
    """An annotation or default written as given, without quotes."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _default(value: object) -> object:
    if inspect.isbuiltin(value) or inspect.isfunction(value):
        module = getattr(value, "__module__", None) or ""
        return _Text(f"{module}.{value.__name__}" if module else value.__name__)
    return value


def signature(obj: Callable[..., object], name: str) -> str:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return name
    params = []
    for param in sig.parameters.values():
        annotation = param.annotation
        if isinstance(annotation, str):
            annotation = _Text(annotation)
        default = param.default
        if default is not inspect.Parameter.empty:
            default = _default(default)
        params.append(param.replace(annotation=annotation, default=default))
    returns = sig.return_annotation
    if isinstance(returns, str):
        returns = _Text(returns)
    text = str(sig.replace(parameters=params, return_annotation=returns))
    return f"{name}{text}"


# -- the API page -----------------------------------------------------------------------------


@dataclasses.dataclass
class Entry:
    """One documented thing: its heading, its signature (or None) and its docstring."""

    title: str
    signature: str | None
    doc: str | None
    obj: object


def public_names() -> list[str]:
    import nbmonitor

    names = list(nbmonitor.__all__)
    return [n for n in ORDER if n in names] + sorted(n for n in names if n not in ORDER)


def _own_doc(obj: object) -> str | None:
    """``obj``'s docstring, not one inherited from a builtin type (``int``'s for a field)."""
    doc = getattr(obj, "__doc__", None)
    if not isinstance(doc, str) or not doc.strip():
        return None
    for builtin in (int, float, str, bool, type(None), tuple, list, dict, object):
        if doc == builtin.__doc__:
            return None
    return inspect.cleandoc(doc)


def members(cls: type) -> Iterator[tuple[str, object]]:
    """The public members ``cls`` defines (or inherits from nbmonitor's classes), in source
    order; dataclass fields are left to the field table."""
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    seen: set[str] = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("nbmonitor"):
            continue
        for key, value in vars(klass).items():
            if key.startswith("_") or key in seen or key in fields:
                continue
            seen.add(key)
            if isinstance(value, (staticmethod, classmethod)):
                value = getattr(cls, key)  # bound: no ``cls`` in its signature
            if callable(value) or isinstance(value, (property, functools_cached())):
                yield key, value


def functools_cached() -> type:
    import functools

    return functools.cached_property


def member_entry(owner: str, key: str, value: object) -> Entry:
    instance = INSTANCE.get(owner, owner[:1].lower() + owner[1:])
    if inspect.ismethod(value):  # a classmethod, called on the class
        instance = owner
    if isinstance(value, (property, functools_cached())):
        getter = value.fget if isinstance(value, property) else value.func
        return Entry(f"{instance}.{key}", None, _own_doc(getter), value)
    assert callable(value)
    sig = signature(value, f"{instance}.{key}")
    sig = re.sub(r"\(self(?:, )?", "(", sig, count=1)
    return Entry(f"{instance}.{key}", sig, _own_doc(value), value)


def option_rows() -> list[tuple[str, str, str, str]]:
    """(option, type, default, doc) for every attach option."""
    from nbmonitor.options import AttachOptions, Options

    docs = fields_doc(AttachOptions.__doc__ or "")
    hints = AttachOptions.__annotations__
    rows = []
    for field in dataclasses.fields(Options):
        if field.default is not dataclasses.MISSING:
            default = repr(field.default)
        else:
            assert field.default_factory is not dataclasses.MISSING
            made = field.default_factory()
            default = "()" if made == () else f"{type(made).__name__}()"
        kind = hints.get(field.name, "")
        kind = kind if isinstance(kind, str) else getattr(kind, "__forward_arg__", str(kind))
        rows.append((field.name, kind, default, docs.get(field.name, "")))
    return rows


def threshold_rows() -> list[tuple[str, str, str, str]]:
    from nbmonitor.health import Thresholds

    docs = fields_doc(Thresholds.__doc__ or "")
    return [
        (f.name, str(f.type), repr(f.default), docs.get(f.name, ""))
        for f in dataclasses.fields(Thresholds)
    ]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(head: tuple[str, ...], rows: list[tuple[str, str, str, str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, kind, default, doc in rows:
        lines.append(f"| `{name}` | `{_cell(kind)}` | `{_cell(default)}` | {_cell(doc)} |")
    return lines


def entries() -> Iterator[tuple[int, Entry]]:
    """Every documented thing with its heading level, in the page's order."""
    import nbmonitor

    for name in public_names():
        obj = getattr(nbmonitor, name)
        if name == "__version__":
            yield 2, Entry("nbmonitor.__version__", None, f"The installed version (`{obj}`).", obj)
        elif inspect.ismodule(obj):
            yield 2, Entry(f"nbmonitor.{name}", None, _own_doc(obj), obj)
            for key in getattr(obj, "__all__", ()):
                value = getattr(obj, key)
                title = f"nbmonitor.{name}.{key}"
                if inspect.isclass(value):
                    yield 3, _class_entry(title, value)
                elif inspect.isfunction(value):
                    yield 3, Entry(title, signature(value, title), _own_doc(value), value)
        elif inspect.isclass(obj):
            yield 2, _class_entry(f"nbmonitor.{name}", obj)
            for key, value in members(obj):
                yield 3, member_entry(name, key, value)
        else:
            doc = _own_doc(obj)
            if name == "attach" and doc is not None:
                doc = _before(doc, "Options")
            yield 2, Entry(f"nbmonitor.{name}", signature(obj, f"nbmonitor.{name}"), doc, obj)
    for module, name in RETURNED:
        cls = getattr(importlib.import_module(module), name)
        yield 2, _class_entry(f"{module}.{name}", cls)
        for key, value in members(cls):
            yield 3, member_entry(name, key, value)
    for module, name, _extra in INTEGRATIONS:
        cls = getattr(importlib.import_module(module), name)
        entry = _class_entry(f"{module}.{name}", cls)
        entry.doc = f"{entry.doc}\n\n{_own_doc(sys.modules[module])}"
        yield 2, entry


def _class_entry(title: str, cls: type) -> Entry:
    if issubclass(cls, BaseException):
        bases = ", ".join(b.__name__ for b in cls.__bases__)
        return Entry(title, f"class {title.rsplit('.', 1)[1]}({bases})", _own_doc(cls), cls)
    sig = signature(cls, title.rsplit(".", 1)[1])
    doc = _own_doc(cls)
    return Entry(title, f"class {sig}", doc and _before(doc, "Fields"), cls)


def _anchor(title: str) -> str:
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def api_page() -> str:
    import nbmonitor

    listed = list(entries())
    lines = [
        "# API reference",
        "",
        HEADER.format(what="docstrings"),
        "",
        "Everything public is importable from `nbmonitor` (`nbmonitor.__all__`): "
        + ", ".join(f"`{n}`" for n in public_names())
        + ". `import nbmonitor` loads no torch: each name loads on first use. The same text "
        "is in Python: `help(nbmonitor.attach)`. Also here: the types the calls return "
        "(alerts, explanations, the adapters' verdict, `mon.memory`) and the framework "
        "callbacks "
        "(Hugging Face, Lightning). The command line: [cli.md](cli.md).",
        "",
        f"Version {nbmonitor.__version__}.",
        "",
    ]
    for level, entry in listed:
        if level == 2:
            lines.append(f"- [`{entry.title}`](#{_anchor(entry.title)})")
    lines.append("")
    for level, entry in listed:
        lines += ["#" * level + f" `{entry.title}`", ""]
        if entry.signature:
            lines += ["```python", entry.signature, "```", ""]
        if entry.doc:
            lines += [markdown(entry.doc), ""]
        if entry.title == "nbmonitor.attach":
            lines += ["### Attach options", ""]
            lines += [
                "The keyword options of `attach` and `Monitor` "
                "(`nbmonitor.options.AttachOptions`; an unknown or ill-typed option raises at "
                "the call, in one line, and nothing starts):",
                "",
            ]
            lines += _table(("option", "type", "default", "what it does"), option_rows())
            lines.append("")
        if entry.title == "nbmonitor.Thresholds":
            lines += _table(("field", "type", "default", "what it does"), threshold_rows())
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


# -- the CLI page -----------------------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    # argparse has no public way to list a parser's commands.
    for action in parser._actions:  # noqa: SLF001
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            return dict(action.choices)
    return {}


def cli_commands() -> list[str]:
    from nbmonitor.__main__ import build_parser

    return list(_subcommands(build_parser()))


def cli_page() -> str:
    from nbmonitor.__main__ import build_parser

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(CLI_COLUMNS)
    try:
        parser = build_parser()
        lines = [
            "# Command line",
            "",
            HEADER.format(what="command line's own --help"),
            "",
            "`nbmonitor` is installed with the package (also `python -m nbmonitor`). Each "
            "command prints what went wrong as one line on stderr with a non-zero exit status. "
            "The same text: `nbmonitor --help`, `nbmonitor COMMAND --help`. The Python API: "
            "[api.md](api.md).",
            "",
            "## `nbmonitor`",
            "",
            "```text",
            parser.format_help().rstrip(),
            "```",
            "",
        ]
        for name, sub in _subcommands(parser).items():
            help_text = sub.format_help().rstrip()
            lines += [f"## `nbmonitor {name}`", "", "```text", help_text, "```", ""]
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    return "\n".join(lines).rstrip() + "\n"


# -- checks -----------------------------------------------------------------------------------


def missing_docs() -> list[str]:
    """Every public name, member, attach option and threshold without a doc."""
    missing = [entry.title for _, entry in entries() if not entry.doc]
    missing += [f"attach option {row[0]}" for row in option_rows() if not row[3]]
    missing += [f"Thresholds.{row[0]}" for row in threshold_rows() if not row[3]]
    return missing


def examples() -> list[doctest.DocTest]:
    """The ``>>>`` examples of every documented docstring (``# doctest: +SKIP`` marks those
    that need a model, a GPU or a run)."""
    import nbmonitor

    finder = doctest.DocTestFinder(recurse=False)
    tests: list[doctest.DocTest] = []
    seen: set[int] = set()
    objects: list[tuple[str, object]] = [("nbmonitor", nbmonitor)]
    objects += [(entry.title, entry.obj) for _, entry in entries()]
    for title, obj in objects:
        target = obj.fget if isinstance(obj, property) else obj
        if id(target) in seen or not _own_doc(target):
            continue
        seen.add(id(target))
        try:
            found = finder.find(target, title, globs={"nbmonitor": nbmonitor})
        except ValueError:  # a builtin without source
            continue
        tests += [t for t in found if t.examples]
    return tests


PAGES: dict[Path, Callable[[], str]] = {API: api_page, CLI: cli_page}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only say whether they are current")
    args = parser.parse_args(argv)
    missing = missing_docs()
    if missing:
        print("no doc: " + ", ".join(missing), file=sys.stderr)
        return 1
    stale = []
    for path, page in PAGES.items():
        text = page()
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        if args.check:
            stale.append(path.relative_to(ROOT))
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        names = ", ".join(str(p) for p in stale)
        print(f"out of date: {names}; run python3 scripts/reference.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
