"""mkdocs hook: Sphinx roles in the package's docstrings read as plain code in the API reference.

The docstrings use reST cross-reference roles (:class:`Stacks`, :func:`~castmesh.endpoint`); mkdocstrings renders
them as ":class:" followed by code. This drops the role and, as Sphinx does for a leading ``~``, the module path.
"""

from __future__ import annotations

import re

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|exc|data|obj|const):<code>(~?)([^<]*)</code>")


def _code(match: re.Match) -> str:
    tilde, target = match.group(1), match.group(2)
    return f"<code>{target.rsplit('.', 1)[-1] if tilde else target}</code>"


def on_page_content(html: str, page, config, files) -> str:
    return _ROLE.sub(_code, html)
