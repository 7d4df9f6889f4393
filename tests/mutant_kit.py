"""What a mutant is and where it applies: a qualified name in a file, and a pattern inside it.

A mutant names the function (or class, or ``""``: the module) it mutates by its qualified name
(``ModelSharder.plan``, ``block_type``) and gives each edit as the code it replaces and the code that
replaces it. The edit is matched inside that definition only, and as a pattern, not as text: every
name in the code that is not an attribute, a keyword argument, a keyword, a builtin or a name the
module defines (a local variable, a parameter) matches any name, the same one wherever it recurs, and
the replacement reuses what it matched; comments are not part of the pattern (the code's own are
dropped, and the text may have one, any, before each line end). A local variable renamed inside the function leaves the mutant
applicable; a function removed or renamed is reported by its name; a pattern found other than once
inside its definition is reported with the count.

Each part of the code declares its mutants in a file of its own beside the checks they claim
(``tests/mutant_parts/<part>.py`` for the core, ``plugins/shard-<family>/tests/mutants_<family>.py``
for a plugin), as a list ``MUTANTS`` of :func:`m`.
"""

from __future__ import annotations

import ast
import builtins
import io
import keyword
import re
import tokenize
from dataclasses import dataclass

__all__ = ["Mutant", "MutantError", "Raised", "apply", "definition", "m", "pattern"]


class MutantError(SystemExit):
    """A mutant that no longer applies: its definition is gone, or its pattern is not there exactly once."""


@dataclass(frozen=True)
class Raised:
    """A mutant's check declared by its identity, not its words: the exception type ``error`` raised in
    ``site`` (``"file::function"``, the innermost frame; a rank's, for a failure on the ranks). Rewording
    the message leaves it standing (``tests/mutant_report.py`` writes the line it matches)."""

    error: str
    site: str

    def __str__(self) -> str:
        return f"raised {self.error} in {self.site}"

    __repr__ = __str__


@dataclass(frozen=True)
class Mutant:
    """One deliberate bug: ``edits`` (code, replacement) applied inside ``where`` (a qualified name in
    ``file``; ``""``: the module); ``test`` (a pytest node id) must fail with ``expect`` in its report: a
    fragment of what the failure says, or where it is raised (:class:`Raised`)."""

    name: str
    bug: str
    file: str
    where: str
    edits: tuple[tuple[str, str], ...]
    test: str
    expect: str | Raised
    fast: bool = False  # in CI's subset


def m(name, bug, file, where, edits, test, expect, fast=False) -> Mutant:
    edits = (edits,) if isinstance(edits[0], str) else edits
    return Mutant(name, bug, file, where, tuple(tuple(e) for e in edits), test, expect, fast)


def definition(text: str, where: str, file: str = "") -> tuple[int, int]:
    """``(start, end)`` character offsets of the definition ``where`` (dotted qualified name) in ``text``:
    from its first decorator to its last line; the whole text for ``""``."""
    if not where:
        return 0, len(text)
    body = ast.parse(text).body
    node = None
    for part in where.split("."):
        node = next(
            (
                n
                for n in body
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and n.name == part
            ),
            None,
        )
        if node is None:
            raise MutantError(f"{file} has no {where} (removed or renamed): anchor the mutant to where the code is now")
        body = node.body
    lines = text.splitlines(keepends=True)
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
    start = sum(len(line) for line in lines[:first])
    return start, start + sum(len(line) for line in lines[first : node.end_lineno])


def _module_names(text: str) -> set[str]:
    """Names the module itself binds at its top level (imports, functions, classes, constants)."""
    names: set[str] = set()
    for node in ast.parse(text).body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


_FIXED = set(keyword.kwlist) | set(keyword.softkwlist) | set(dir(builtins)) | {"self", "cls"}


def _names(code: str) -> list[tuple[int, int, str]]:
    """``(start, end, name)`` of every NAME token in ``code`` (outside strings and comments)."""
    out = []
    offsets = [0]
    for line in code.splitlines(keepends=True):
        offsets.append(offsets[-1] + len(line))
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        tokens = []
        for found in re.finditer(r"\"[^\"\n]*\"|'[^'\n]*'|#[^\n]*|[A-Za-z_]\w*", code):
            if found.group()[0] not in "\"'#":
                out.append((found.start(), found.end(), found.group()))
        return out
    for tok in tokens:
        if tok.type == tokenize.NAME:
            start = offsets[tok.start[0] - 1] + tok.start[1]
            out.append((start, start + len(tok.string), tok.string))
    return out


def _free(code: str, start: int, end: int, name: str, module: set[str]) -> bool:
    """Whether the name at ``code[start:end]`` may be a local (renamable): not an attribute, a keyword
    argument, a keyword, a builtin, ``self`` or a name the module defines."""
    if name in _FIXED or name in module:
        return False
    before = code[:start].rstrip(" ")
    if before.endswith("."):
        return False  # an attribute
    after = code[end:]
    # a keyword argument or a default (formatted ``name=value``), not an assignment (``name = value``)
    return not (after.startswith("=") and not after.startswith("=="))


def _uncommented(code: str) -> str:
    """``code`` without its comments (and the blanks before them), strings left as they are."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return re.sub(r"[ \t]*#[^\n\"']*$", "", code, flags=re.M)  # a fragment: comments after the code
    lines = code.splitlines(keepends=True)
    for tok in reversed([t for t in tokens if t.type == tokenize.COMMENT]):
        row, col = tok.start
        line = lines[row - 1]
        head = line[:col].rstrip(" \t")
        lines[row - 1] = head + line[col + len(tok.string) :]
    return "".join(lines)


#: where the code a mutant names has a line end, the text may have a comment before it
_LINE_END = r"(?:[ \t]*\#[^\n]*)?\n(?:[ \t]*\#[^\n]*\n)*"


def _literal(text: str) -> str:
    return _LINE_END.join(re.escape(part) for part in text.split("\n"))


#: a one-line string literal (any prefix): where its text holds a space it is a message, and matches any literal
_STRING = re.compile(r"""(?<!["'])[rRbBfFuU]{0,2}(?:"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')(?!["'])""")


def _messages(code: str) -> list[tuple[int, int, str]]:
    """``(start, end, literal)`` of each message in ``code``: a one-line string literal whose text holds a
    space (a name or a key, such as ``"q_proj"``, has none and stays as written)."""
    return [(s.start(), s.end(), s.group()) for s in _STRING.finditer(code) if " " in s.group()]


def pattern(code: str, module: set[str]) -> tuple[re.Pattern, dict[str, str]]:
    """``code`` as a regular expression in which each free name (:func:`_free`) matches any name, the
    same one each time it recurs, each message (:func:`_messages`) matches any one-line string literal,
    and a comment is ignored (the code's own are dropped, one in the text before any line end matches);
    and ``{name or message literal in code: its group}``."""
    code = _uncommented(code)
    messages = _messages(code)
    inside_message = lambda at: any(s <= at < e for s, e, _ in messages)  # noqa: E731
    holes = [(s, e, n, "n") for s, e, n in _names(code) if not inside_message(s) and _free(code, s, e, n, module)]
    holes = sorted([*holes, *((s, e, lit, "s") for s, e, lit in messages)])
    groups: dict[str, str] = {}
    parts, at = [], 0
    for start, end, key, kind in holes:
        parts.append(_literal(code[at:start]))
        if key in groups:
            parts.append(f"(?P={groups[key]})")
        else:
            groups[key] = f"{kind}{len(groups)}"
            parts.append(
                rf"(?P<{groups[key]}>[A-Za-z_]\w*)" if kind == "n" else f"(?P<{groups[key]}>{_STRING.pattern})"
            )
        at = end
    parts.append(_literal(code[at:]))
    return re.compile("".join(parts)), groups


def _filled(replacement: str, bound: dict[str, str]) -> str:
    """``replacement`` with each name and message the mutant's patterns matched (``bound``: ``{name or literal
    in the code: what was found}``) replaced by what it matched."""
    out, at = [], 0
    messages = _messages(replacement)
    holes = [(s, e, lit) for s, e, lit in messages if lit in bound]
    for start, end, name in _names(replacement):
        if any(s <= start < e for s, e, _ in messages):
            continue  # a word inside a message
        after = replacement[end:]
        if name in bound and not (after.startswith("=") and not after.startswith("==")):  # not a keyword argument
            before = replacement[:start].rstrip(" ")
            if not before.endswith("."):
                holes.append((start, end, name))
    for start, end, key in sorted(holes):
        out += [replacement[at:start], bound[key]]
        at = end
    out.append(replacement[at:])
    return "".join(out)


def apply(mutant: Mutant, text: str) -> str:
    """``text`` with the mutant's edits made inside its definition, in order; a :class:`MutantError` when the
    definition is gone or an edit's pattern is not found there exactly once. A name an edit's code matched
    is known to the later edits' replacements too (an edit whose replacement is its own code only binds
    names: a local a later replacement uses)."""
    module = _module_names(text)
    bound: dict[str, str] = {}
    for code, replacement in mutant.edits:
        start, end = definition(text, mutant.where, mutant.file)
        inside = text[start:end]
        regex, groups = pattern(code, module)
        found = list(regex.finditer(inside))
        if len(found) != 1:
            where = mutant.where or "the module"
            raise MutantError(
                f"mutant {mutant.name}: its code is found {len(found)} times in {where} of {mutant.file}, not once: "
                f"{code.strip()[:80]!r}"
            )
        hit = found[0]
        bound.update({name: hit.group(group) for name, group in groups.items()})
        inside = inside[: hit.start()] + _filled(replacement, bound) + inside[hit.end() :]
        text = text[:start] + inside + text[end:]
    return text
