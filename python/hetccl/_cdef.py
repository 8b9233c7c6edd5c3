"""The cffi declarations, read from the public headers at import.

`_lib` declares the C API by reading include/hetccl.h (which includes
nccl.h), so that the Python package and the headers cannot drift apart.
cffi's cdef takes plain C declarations and no preprocessor beyond
`#define NAME <integer>`; this module is a preprocessor for the subset of
C the headers use, and fails loudly on anything beyond it:

- conditionals are decided as a C compiler (not C++, no CUDA header
  included first) decides them: `defined(X)` is true for a macro defined so
  far, an unknown identifier is 0;
- `#include "x.h"` is followed (include guards apply), `#include <...>`
  is not: cffi knows size_t and the <stdint.h> types, and the <limits.h>
  macros the headers use are predefined here (LIMITS);
- object-like macros are expanded in declarations; those whose value is an
  integer constant expression are also passed on as `#define NAME value`
  and returned in `constants`; function-like macros and macros of other
  values (strings, floats, initializers) are dropped;
- `sizeof(E)` of an enum type E declared in the headers is sizeof(int), as
  gcc and clang lay out an enum whose values fit an int (cffi's constant
  expressions have no sizeof);
- `__attribute__((...))` is removed (an API-export macro defined empty
  goes by expansion);
- a prototype of `pX` where `X` is declared too (NCCL's second name of each
  function, for profilers that interpose on the first) is left out: the
  package calls the first name, and the aliases would double cffi's parse
  at import (`aliases` lists them; tests/test_abi.py checks they are
  exported).

Runs once per process, before any library is loaded; it needs no C
compiler.
"""

from __future__ import annotations

import ast
import ctypes
import re
from pathlib import Path
from typing import Dict, Iterator, List, NamedTuple, Optional, Set, Tuple

_INT_BITS = 8 * ctypes.sizeof(ctypes.c_int)
LIMITS: Dict[str, str] = {
    "INT_MIN": f"(-{2 ** (_INT_BITS - 1) - 1} - 1)",
    "INT_MAX": str(2 ** (_INT_BITS - 1) - 1),
    "UINT_MAX": str(2 ** _INT_BITS - 1),
}

_IDENT = re.compile(r"\b[A-Za-z_]\w*\b")
_INT_LITERAL = re.compile(r"\b(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9]\d*)[uUlL]*\b")
_DIRECTIVE = re.compile(r"^\s*#\s*(\w+)\s*(.*)$")
_DEFINE = re.compile(r"^([A-Za-z_]\w*)(\(?)\s*(.*)$")
_DEFINED = re.compile(r"\bdefined\s*(?:\(\s*([A-Za-z_]\w*)\s*\)|([A-Za-z_]\w*))")
_ATTRIBUTE = re.compile(r"__attribute__\s*\(\((?:[^()]|\([^()]*\))*\)\)")
_ENUM_TYPEDEF = re.compile(r"typedef\s+enum\s*\w*\s*\{[^}]*\}\s*(\w+)\s*;")
_SIZEOF = re.compile(r"\bsizeof\s*\(\s*(\w+)\s*\)")
_PROTOTYPE = re.compile(r"^[^(){}]*?\b([A-Za-z_]\w*)\s*\(")
_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)

_ALLOWED = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.Constant,
            ast.Add, ast.Sub, ast.Mult, ast.LShift, ast.RShift, ast.BitOr, ast.BitAnd,
            ast.BitXor, ast.USub, ast.UAdd, ast.Invert, ast.Not, ast.And, ast.Or, ast.Eq,
            ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)


class HeaderError(ValueError):
    """A header uses C the reader does not handle (the message names the
    file and line)."""


class Declarations(NamedTuple):
    cdef: str                   # text for cffi.FFI.cdef
    constants: Dict[str, int]   # every object-like macro of integer value
    functions: Tuple[str, ...]  # the functions cdef declares, in header order
    aliases: Tuple[str, ...]    # the profiler names left out


def _c_int(match: "re.Match[str]") -> str:
    text = match.group(1)
    if text.lower().startswith("0x"):
        return str(int(text, 16))
    return str(int(text, 8) if len(text) > 1 and text[0] == "0" else int(text))


def eval_int(expr: str) -> Optional[int]:
    """The value of a C integer constant expression whose identifiers are
    already expanded (no division, no sizeof); None if it is not one."""
    text = _INT_LITERAL.sub(_c_int, expr)
    text = re.sub(r"&&", " and ", re.sub(r"\|\|", " or ", text))
    text = re.sub(r"!(?!=)", " not ", text)
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED) or (isinstance(node, ast.Constant)
                                              and type(node.value) is not int):
            return None
    return int(eval(compile(tree, "<header>", "eval"), {"__builtins__": {}}))  # noqa: S307


class _Reader:
    def __init__(self) -> None:
        self.macros: Dict[str, str] = dict(LIMITS)
        self.guarded: Set[Path] = set()
        self.lines: List[str] = []

    def expand(self, text: str, depth: int = 0) -> str:
        if depth > 32:
            raise HeaderError(f"macro expansion does not end: {text!r}")
        out = _IDENT.sub(lambda m: self.macros.get(m.group(0), m.group(0)), text)
        return out if out == text else self.expand(out, depth + 1)

    def condition(self, expr: str, where: str) -> bool:
        expr = _DEFINED.sub(lambda m: "1" if (m.group(1) or m.group(2)) in self.macros else "0",
                            expr)
        value = eval_int(_IDENT.sub("0", self.expand(expr)))
        if value is None:
            raise HeaderError(f"{where}: cannot evaluate #if {expr}")
        return bool(value)

    def read(self, path: Path) -> None:
        if path in self.guarded:
            return
        self.guarded.add(path)  # every header here has an include guard
        text = _COMMENT.sub(" ", path.read_text().replace("\\\n", " "))
        taking: List[bool] = []  # one entry per open conditional: is its branch taken
        decided: List[bool] = []  # has one of its branches been taken
        for number, line in enumerate(text.splitlines(), 1):
            where = f"{path}:{number}"
            active = all(taking)
            directive = _DIRECTIVE.match(line)
            if directive is None:
                if active and line.strip():
                    self.lines.append(_ATTRIBUTE.sub("", self.expand(line)).rstrip())
                continue
            word, rest = directive.group(1), directive.group(2).strip()
            if word in ("if", "ifdef", "ifndef"):
                expr = {"if": rest, "ifdef": f"defined({rest})",
                        "ifndef": f"!defined({rest})"}[word]
                value = active and self.condition(expr, where)
                taking.append(value)
                decided.append(value)
            elif word == "elif":
                value = not decided[-1] and all(taking[:-1]) and self.condition(rest, where)
                taking[-1] = value
                decided[-1] = decided[-1] or value
            elif word == "else":
                taking[-1] = not decided[-1]
                decided[-1] = True
            elif word == "endif":
                taking.pop()
                decided.pop()
            elif not active:
                continue
            elif word == "define":
                self.define(rest, where)
            elif word == "include":
                if rest.startswith('"'):
                    self.read(path.parent / rest.strip('"'))
            elif word == "undef":
                self.macros.pop(rest, None)
            elif word not in ("pragma", "error", "warning"):
                raise HeaderError(f"{where}: #{word} is not handled")
        if taking:
            raise HeaderError(f"{path}: #if without #endif")

    def define(self, rest: str, where: str) -> None:
        match = _DEFINE.match(rest)
        if match is None:
            raise HeaderError(f"{where}: cannot read #define {rest}")
        name, paren, body = match.groups()
        if paren:  # function-like: declarations never use one
            return
        self.macros[name] = body.strip()


def _statements(text: str) -> Iterator[str]:
    """Top-level declarations, each with its ';' (a struct's members stay
    inside their declaration)."""
    depth, start = 0, 0
    for i, c in enumerate(text):
        depth += (c == "{") - (c == "}")
        if c == ";" and depth == 0:
            yield text[start:i + 1].strip("\n")
            start = i + 1


def _function(statement: str) -> Optional[str]:
    if statement.lstrip().startswith("typedef") or "{" in statement:
        return None
    match = _PROTOTYPE.match(statement.strip())
    return match.group(1) if match else None


def read(header: Path) -> Declarations:
    """cffi declarations and integer constants of `header` and the headers
    it includes with quotes."""
    reader = _Reader()
    reader.read(header.resolve())
    constants = {}
    for name, body in reader.macros.items():
        value = eval_int(reader.expand(body)) if name not in LIMITS and body else None
        if value is not None:
            constants[name] = value
    statements = list(_statements("\n".join(reader.lines)))
    declared = {_function(s) for s in statements} - {None}
    kept, functions, aliases = [], [], []
    for statement in statements:
        name = _function(statement)
        if name is not None and name.startswith("p") and name[1:] in declared:
            aliases.append(name)
            continue
        if name is not None:
            functions.append(name)
        kept.append(statement)
    body = "\n".join(kept)
    enums = set(_ENUM_TYPEDEF.findall(body))
    int_size = str(ctypes.sizeof(ctypes.c_int))
    body = _SIZEOF.sub(lambda m: int_size if m.group(1) in enums else m.group(0), body)
    defines = "".join(f"#define {name} {value}\n" for name, value in constants.items())
    return Declarations(defines + body + "\n", constants, tuple(functions), tuple(aliases))
