"""The binding's declarations against the headers they are read from
(hetccl._cdef): every function of include/nccl.h and include/hetccl.h is
callable through hetccl._lib.lib(), and every struct layout, enumerator and
integer macro is what a C compiler makes of the same headers."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from libpath import REPO_ROOT

from hetccl import _cdef, _lib, nccl

INCLUDE = REPO_ROOT / "include"
HEADERS = ("nccl.h", "hetccl.h")


def _header_functions() -> Dict[str, int]:
    """name -> parameter count of every prototype in the two headers, read
    with a regex of its own (not the reader under test)."""
    found: Dict[str, int] = {}
    for header in HEADERS:
        text = re.sub(r"/\*.*?\*/|//[^\n]*", " ", (INCLUDE / header).read_text(), flags=re.S)
        text = re.sub(r"^\s*#(?:[^\n]*\\\n)*[^\n]*", " ", text, flags=re.M)
        for m in re.finditer(r"\b((?:p?nccl|hetccl)\w*)\s*\(([^()]*)\)\s*;", text):
            params = m.group(2).strip()
            found[m.group(1)] = 0 if params in ("", "void") else params.count(",") + 1
    return found


def test_the_headers_declare_what_the_package_calls() -> None:
    functions = _header_functions()
    assert len(functions) > 150 and "ncclAllReduce" in functions, sorted(functions)
    for name in ("ncclCommInitRankConfig", "ncclGroupEnd", "ncclRedOpCreatePreMulSum",
                 "hetcclCommInitRankAs", "hetcclKnobInfo", "hetcclCommCopiedBytes"):
        assert name in _lib.DECLARATIONS.functions


@pytest.mark.usefixtures("hetccl_library")
def test_every_header_function_is_callable() -> None:
    """A function added to a header is declared for cffi with it (the
    declarations were a hand-copied subset that could drift)."""
    lib, ffi = _lib.lib(), _lib.ffi
    exported = ctypes.CDLL(str(_lib.loaded_path()))
    missing: List[str] = []
    for name, nparams in _header_functions().items():
        if name in _lib.DECLARATIONS.aliases:  # pnccl*: the same function, exported
            assert name[1:] in _lib.DECLARATIONS.functions and hasattr(exported, name), name
            continue
        try:
            fn = getattr(lib, name)
        except AttributeError:
            missing.append(name)
            continue
        assert len(ffi.typeof(fn).args) == nparams, name
    assert not missing, f"declared in include/ but not callable through hetccl._lib: {missing}"
    assert set(_lib.DECLARATIONS.functions) <= set(_header_functions())


def _compiler_view(tmp_path: Path, lines: List[str]) -> Dict[str, str]:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    src = tmp_path / "view.c"
    src.write_text("#include <stddef.h>\n#include <stdio.h>\n#include \"hetccl.h\"\n"
                   "int main(void) {\n" + "\n".join(lines) + "\nreturn 0;\n}\n")
    exe = tmp_path / "view"
    subprocess.run([cc, f"-I{INCLUDE}", str(src), "-o", str(exe)], check=True, timeout=60)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=60)
    return dict(line.split(" ", 1) for line in out.stdout.splitlines())


def _print(key: str, expr: str) -> str:
    return f'printf("{key} %lld\\n", (long long)({expr}));'


def test_declarations_match_a_compiler(tmp_path: Path) -> None:
    """Struct sizes and field offsets, enumerators and integer macros as
    cffi has them from the reader, and as cc has them from the headers."""
    ffi = _lib.ffi
    expected: Dict[str, Tuple[str, int]] = {}
    typedefs, _, _ = ffi.list_types()
    for name in typedefs:
        ctype = ffi.typeof(name)
        if ctype.kind == "struct":
            expected[f"sizeof:{name}"] = (f"sizeof({name})", ffi.sizeof(ctype))
            for field, _ in ctype.fields:
                expected[f"offset:{name}.{field}"] = (f"offsetof({name}, {field})",
                                                      ffi.offsetof(ctype, field))
        elif ctype.kind == "enum":
            expected[f"sizeof:{name}"] = (f"sizeof({name})", ffi.sizeof(ctype))
            for enumerator, value in ctype.relements.items():
                expected[f"enum:{enumerator}"] = (enumerator, value)
    for macro, value in _lib.CONSTANTS.items():
        expected[f"macro:{macro}"] = (macro, value)
    assert "sizeof:ncclConfig_t" in expected and "enum:ncclMaxRedOp" in expected
    assert "macro:NCCL_CONFIG_UNDEF_INT" in expected
    seen = _compiler_view(tmp_path, [_print(k, e) for k, (e, _) in expected.items()])
    wrong = {k: (v, int(seen[k])) for k, (_, v) in expected.items() if int(seen[k]) != v}
    assert not wrong, f"cffi's value, the compiler's: {wrong}"


def test_new_config_is_the_initializer() -> None:
    cfg = _lib.new_config()
    assert cfg.size == 120 and cfg.magic == 0xCAFEBEEF and cfg.version == 23203
    assert cfg.blocking == cfg.nvlsHostMode == _lib.CONFIG_UNDEF_INT
    assert cfg.netName == _lib.ffi.NULL
    assert _lib.new_config(blocking=False).blocking == 0


def test_constants_follow_the_header() -> None:
    """Every NCCL_* constant of hetccl.nccl (CuPy's names) is the header's
    enumerator or macro of that name."""
    ffi = _lib.ffi
    header: Dict[str, int] = dict(_lib.CONSTANTS)
    for name in ffi.list_types()[0]:
        if ffi.typeof(name).kind == "enum":
            header.update({k.lower(): v for k, v in ffi.typeof(name).relements.items()})
    constants = {k: v for k, v in vars(nccl).items() if k.startswith("NCCL_")}
    assert len(constants) > 30
    for name, value in constants.items():
        key = name if name in header else name.replace("_", "").lower()
        assert header.get(key) == value, name
    assert ffi.string(ffi.cast("ncclDataType_t", nccl.NCCL_FLOAT64)) == "ncclFloat64"
    assert nccl.get_build_version() == 23203


def test_reader_takes_the_headers_subset_of_c(tmp_path: Path) -> None:
    (tmp_path / "base.h").write_text(
        "#ifndef BASE_H\n#define BASE_H\n#include <limits.h>\n"
        "#define API __attribute__((visibility(\"default\")))\n#define EXPORT\n"
        "#define N 4\n#define LIMIT INT_MIN\n#define NAME \"x\"\n#define F(a) ((a) + 1)\n"
        "typedef enum { small = 1 } small_t;\n"
        "typedef enum { big = 0x7fffffff >> (32 - 8 * sizeof(small_t)), low = LIMIT } e_t;\n"
        "#endif\n")
    (tmp_path / "top.h").write_text(
        '#include "base.h"\n#include "base.h"\n#ifdef __cplusplus\nextern "C" {\n#endif\n'
        "/* a comment; with f(void); inside */\n"
        "#if defined(BASE_H) && N > 2\ntypedef struct { char b[N]; } s_t;\n"
        "#elif 1\nint never(void);\n#else\nint nor(void);\n#endif\n"
        "API int f(s_t *s,\n    e_t e);\nint pf(s_t *s, e_t e);\nEXPORT void g(void);\n"
        "#ifdef __cplusplus\n}\n#endif\n")
    decl = _cdef.read(tmp_path / "top.h")
    assert decl.functions == ("f", "g") and decl.aliases == ("pf",)
    assert decl.constants == {"N": 4, "LIMIT": -2**31}
    assert "extern" not in decl.cdef and "never" not in decl.cdef
    import cffi

    ffi = cffi.FFI()
    ffi.cdef(decl.cdef)
    assert ffi.sizeof("s_t") == 4
    assert ffi.typeof("e_t").relements == {"big": 2**31 - 1, "low": -2**31}
    (tmp_path / "odd.h").write_text("#line 3\nint h(void);\n")
    with pytest.raises(_cdef.HeaderError, match="odd.h:1: #line"):
        _cdef.read(tmp_path / "odd.h")
