"""mkdocs hook: Reference > C++ API, generated from the contract comments of include/castmesh/*.h.

Every public header carries a leading comment (what it is for, an example) and a one-line contract above each
public type and method (the project's rule). This hook turns each header into one page: the leading comment,
then every commented declaration at namespace or public class scope, in file order. ``namespace detail``,
private sections and function bodies are left out. The pages are generated in memory (nothing is written under
docs/) and added to the nav under the ``reference/cpp/index.md`` entry.

Kept deliberately small: it reads comments and the declarations they precede, not C++ semantics. A declaration
without a comment above it is not shown (the project's rule is that every public one has one).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from mkdocs.structure.files import File, Files

_INDEX = "reference/cpp/index.md"
_PAGE_DIR = "reference/cpp"
_ACCESS = re.compile(r"^\s*(public|private|protected)\s*:\s*$")


def _headers(root: Path) -> List[Path]:
    return sorted(p for p in (root / "include" / "castmesh").glob("*.h"))


def _comment_text(line: str) -> Optional[str]:
    stripped = line.strip()
    if stripped.startswith("//"):
        text = stripped[2:]
        if text.startswith("/"):  # ///
            text = text[1:]
        return text[1:] if text.startswith(" ") else text
    return None


def _prose(lines: List[str]) -> str:
    """Comment lines to Markdown: lines indented by two or more spaces become code blocks, the rest prose."""
    out: List[str] = []
    code: List[str] = []

    def flush() -> None:
        if code:
            while code and not code[-1].strip():
                code.pop()
            out.extend(["", "```cpp", *code, "```", ""])
            code.clear()

    for raw in lines:
        bullet = re.match(r"^\s{0,2}[*-]\s+(.*)$", raw)
        if not code and not bullet and raw.startswith(" ") and out and out[-1].startswith("- "):
            out[-1] += " " + _escape(raw.strip())  # continuation of a bullet
            continue
        if raw.startswith("  ") and not bullet:
            code.append(raw[2:] if not code else raw[2:])
            continue
        if code and not raw.strip():
            code.append("")
            continue
        flush()
        if bullet:
            out.append(f"- {_escape(bullet.group(1))}")
        else:
            out.append(_escape(raw))
    flush()
    return "\n".join(out).strip() + "\n"


def _escape(text: str) -> str:
    """Comment text as literal Markdown: <...>, * and _ outside `code spans` are escaped."""
    parts = text.split("`")
    for n in range(0, len(parts), 2):  # the even parts are outside code spans
        parts[n] = parts[n].replace("<", "&lt;").replace(">", "&gt;").replace("*", r"\*").replace("_", r"\_")
    if len(parts) % 2 == 0:  # an unpaired backtick: keep it literal
        tail = parts.pop()
        parts[-1] += r"\`" + tail
    return "`".join(parts)


_BODY = re.compile(r"(\)|\bconst|\boverride|\bnoexcept|\bfinal|\bmutable)\s*(->\s*[\w:<>, ]+)?\s*\{")


def _declaration(joined: str) -> str:
    """A statement without its function body: `int f() const { ... }` -> `int f() const;`."""
    body = _BODY.search(joined)
    if body:
        return joined[: body.start() + len(body.group(0)) - 1].rstrip() + ";"
    if "{" in joined and not joined.rstrip().endswith(";"):  # a type or a block: its head
        return joined.split("{")[0].rstrip()
    return joined.rstrip()


def _strip_code(line: str) -> str:
    """The code part of a line: without a trailing // comment and without string and char literals."""
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])*'", "''", line)
    cut = line.find("//")
    return line if cut < 0 else line[:cut]


def _scope_kind(statement: str) -> str:
    s = " ".join(statement.split())
    if re.match(r"^(inline\s+)?namespace\s+(detail|internal)\b", s):
        return "skip"
    if re.match(r"^(inline\s+)?namespace\b", s):
        return "namespace"
    if re.match(r"^(template\s*<.*>\s*)?(class|struct|union)\s+\w", s) and "(" not in s.split("{")[0]:
        return "class"
    if re.match(r"^enum\b", s):
        return "enum"
    if s.startswith('extern "C"') or s.startswith("extern \"\""):
        return "namespace"
    return "body"


def _entries(text: str) -> Tuple[List[str], List[Tuple[str, List[str], bool]]]:
    """(leading comment lines, [(declaration, comment lines, is_type)])."""
    lines = text.splitlines()
    intro: List[str] = []
    i = 0
    while i < len(lines) and _comment_text(lines[i]) is not None:
        intro.append(_comment_text(lines[i]) or "")
        i += 1

    entries: List[Tuple[str, List[str], bool]] = []
    group_open = False  # the last entry may take the next declaration (no blank line or comment between)
    scopes: List[List[str]] = []  # [kind, access]
    comment: List[str] = []
    statement: List[str] = []  # raw lines of the declaration being read
    statement_comment: List[str] = []
    for line in lines[i:]:
        visible = all(kind in ("namespace", "class") and access != "private" for kind, access in scopes)
        code = _strip_code(line)
        if not statement:
            text_of_comment = _comment_text(line)
            if text_of_comment is not None:
                comment.append(text_of_comment)
                group_open = False
                continue
            if not line.strip() or line.lstrip().startswith("#"):
                comment = []
                group_open = False
                continue
            access = _ACCESS.match(line)
            if access and scopes and scopes[-1][0] == "class":
                scopes[-1][1] = access.group(1)
                comment = []
                group_open = False
                continue
            statement_comment, comment = comment, []
        statement.append(line)
        opened = code.count("{")
        closed = code.count("}")
        joined = " ".join(_strip_code(s).strip() for s in statement)
        ends = code.rstrip().endswith((";", "{", "}")) or opened or closed
        if not ends:
            continue
        # The statement is complete on this line: record it, then follow the braces it opens and closes.
        head = _declaration(joined).strip()
        if not statement_comment and group_open and opened == closed and visible and head:
            entries[-1] = (entries[-1][0] + "\n" + head, entries[-1][1], entries[-1][2])
            statement = []
            continue
        group_open = False
        if opened > closed:
            kind = _scope_kind(joined)
            if visible and statement_comment and kind in ("class", "enum"):
                entries.append((head, statement_comment, True))
            elif visible and statement_comment and kind == "body":
                entries.append((head, statement_comment, False))
                group_open = True
            for _ in range(opened - closed):
                default_access = "private" if joined.lstrip().startswith("class") else "public"
                scopes.append([kind, default_access if kind == "class" else "public"])
                kind = "body"  # a second brace on one line opens an inner block
        else:
            if visible and statement_comment and head and not head.startswith("}"):
                entries.append((head if head.endswith(";") else head + ";", statement_comment, False))
                group_open = True
            for _ in range(closed - opened):
                if scopes:
                    scopes.pop()
        statement = []
        statement_comment = []
    return intro, entries


def _page(header: Path) -> str:
    name = f"castmesh/{header.name}"
    text = header.read_text(encoding="utf-8")
    intro, entries = _entries(text)
    if not intro and not entries:  # a plain-C header with /* */ comments (backend_abi.h): the header is the page
        return "\n".join([f"# `{name}`", "", f"`#include \"{name}\"`: the header as it is.", "", "```c", text.rstrip(),
                          "```", ""])
    out = [f"# `{name}`", "", f"`#include \"{name}\"` — generated from the header's comments.", ""]
    if intro:
        out += [_prose(intro), ""]
    for decl, comment, is_type in entries:
        if is_type:
            out += [f"## `{' '.join(decl.split())}`", ""]
        out += ["```cpp", decl, "```", "", _prose(comment), ""]
    return "\n".join(out)


def _index(headers: List[Path]) -> str:
    out = [
        "# C++ API",
        "",
        "One page per public header of `include/castmesh/`, generated from the headers' own comments when the site",
        "is built (docs/hooks/cpp_api.py): the header's leading comment, then each public type and method with its",
        "one-line contract and its thread. `castmesh/castmesh.h` includes them all. The headers are the source of",
        "truth; `backend_abi.h` is the plain-C plugin ABI (see [Plugins](../../plugins.md)).",
        "",
        "| header | what it is for |",
        "|--------|----------------|",
    ]
    for header in headers:
        text = header.read_text(encoding="utf-8")
        intro, _ = _entries(text)
        if not intro and text.startswith("/*"):
            intro = [text[2:].split("\n", 1)[0].strip()]
        first = _escape(intro[0]).replace("|", r"\|") if intro else ""
        out.append(f"| [`castmesh/{header.name}`]({header.stem}.md) | {first} |")
    return "\n".join(out) + "\n"


def _root(config) -> Path:
    return Path(config["config_file_path"]).resolve().parent


def on_config(config):
    """Adds one nav entry per header under the C++ API index entry."""
    headers = _headers(_root(config))

    def expand(items):
        for n, item in enumerate(items):
            if isinstance(item, dict):
                for key, value in item.items():
                    if value == _INDEX:
                        item[key] = [_INDEX] + [{f"castmesh/{h.name}": f"{_PAGE_DIR}/{h.stem}.md"} for h in headers]
                    elif isinstance(value, list):
                        expand(value)
        return items

    expand(config["nav"] or [])
    return config


def on_files(files: Files, config) -> Files:
    headers = _headers(_root(config))
    pages: Dict[str, str] = {_INDEX: _index(headers)}
    for header in headers:
        pages[f"{_PAGE_DIR}/{header.stem}.md"] = _page(header)
    for uri, content in pages.items():
        files.append(File.generated(config, uri, content=content))
    return files
