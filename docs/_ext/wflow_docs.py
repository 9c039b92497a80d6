"""Sphinx extension of the wflow docs: the configuration-key table of ``wflow run``.

``{wflow-config-keys}`` (a MyST directive, ``.. wflow-config-keys::`` in reST) renders
:data:`wflow.config.KEYS` -- key, type, default, choices, meaning -- so the CLI
reference is generated from the code that validates the configuration and cannot drift.
"""

from __future__ import annotations

from docutils import nodes
from docutils.parsers.rst import Directive


def _entry(text: str, literal: bool = False) -> nodes.entry:
    para = nodes.paragraph()
    para += nodes.literal(text=text) if literal and text else nodes.Text(text)
    return nodes.entry("", para)


class ConfigKeys(Directive):
    """A table of every configuration key of ``wflow run``, grouped by TOML section."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        from wflow.config import KEYS

        table = nodes.table(classes=["wflow-config-keys"])
        group = nodes.tgroup(cols=4)
        table += group
        for width in (22, 10, 12, 56):
            group += nodes.colspec(colwidth=width)
        head = nodes.thead()
        row = nodes.row()
        for title in ("key", "type", "default", "meaning"):
            row += _entry(title)
        head += row
        group += head
        body = nodes.tbody()
        for name, key in KEYS.items():
            row = nodes.row()
            row += _entry(name, literal=True)
            row += _entry(key.type.__name__)
            default = key.default
            row += _entry(
                "true"
                if default is True
                else "false"
                if default is False
                else repr(default)
                if isinstance(default, str)
                else str(default),
                literal=True,
            )
            meaning = key.help
            choices = getattr(key, "choices", None)
            if choices:
                meaning += " (one of: " + ", ".join(choices) + ")"
            row += _entry(meaning)
            body += row
        group += body
        return [table]


def setup(app):
    app.add_directive("wflow-config-keys", ConfigKeys)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
