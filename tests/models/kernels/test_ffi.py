"""ffi.py against native/verispec.h, the two sides of the C boundary: the ctypes structs have the
C structs' fields, offsets and sizes (as a small probe compiled with the header prints them),
every entry point has the header's parameters on both sides, and every C file includes the
header. A field or parameter changed on one side alone fails here, as the planted changes of
the last tests show."""

from __future__ import annotations

import ctypes
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import pytest

from verispec.models.kernels import build, ffi

MIRRORS: dict[str, type[ctypes.Structure]] = {
    "Linear": ffi.CLinear, "Layer": ffi.CLayer, "Keys": ffi.CKeys,
}  # fmt: skip
"""Each struct of the header and its ctypes mirror."""
SCALARS: dict[str, type] = {
    "int": ctypes.c_int, "WeightFormat": ffi.CWeightFormat, "GGMLType": ctypes.c_int,
    "int64_t": ctypes.c_int64, "float": ctypes.c_float,
}  # fmt: skip
"""The header's parameter types that are not pointers, as ctypes passes them."""
C_ONLY = {"verispec_linear_portable"}
"""Entry points only C calls (linear.c hands isa 0 to portable.c's products)."""
ENUMS = ("WeightFormat", "GGMLType")
"""The header's enum types, passed by ctypes as ints."""

needs_compiler = pytest.mark.skipif(build._compiler() is None, reason="no C compiler")


def _code(text: str) -> str:
    """The header's C without comments and preprocessor lines."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def c_structs(text: str) -> dict[str, list[str]]:
    """Each `typedef struct { ... } Name;` of a header: its field names in order.

    >>> c_structs("typedef struct { const float *a, *b; int64_t n; } S;")
    {'S': ['a', 'b', 'n']}
    """
    structs = {}
    for body, name in re.findall(r"typedef struct\s*\w*\s*\{(.*?)\}\s*(\w+)\s*;", _code(text),
                                 flags=re.S):  # fmt: skip
        declarations = [d for d in body.split(";") if d.strip()]
        structs[name] = [re.findall(r"\w+", declarator)[-1]
                         for d in declarations for declarator in d.split(",")]  # fmt: skip
    return structs


def c_functions(text: str) -> dict[str, tuple[str, list[str]]]:
    """Each prototype of a verispec_ function in a header: its return type and its parameters.

    >>> c_functions("int verispec_f(void); void verispec_g(const float *x, int64_t n);")
    {'verispec_f': ('int', []), 'verispec_g': ('void', ['const float *x', 'int64_t n'])}
    """
    found = re.findall(r"(\w+)\s+(verispec_\w+)\s*\(([^)]*)\)\s*;", _code(text))
    return {name: (result, [] if params.strip() == "void" else
                   [" ".join(p.split()) for p in params.split(",")])
            for result, name, params in found}  # fmt: skip


def probe(header: Path, structs: dict[str, list[str]], tmp_path: Path) -> dict[str, int]:
    """sizeof of each struct and enum, and offsetof and sizeof of each struct field, as the
    compiler lays them out (build._compiler(), the library's): keys "Keys", "Keys.cu@" (offset),
    "Keys.cu" (size)."""
    lines = [f'printf("{name} %zu\\n", sizeof({name}));' for name in (*structs, *ENUMS)]
    for name, fields in structs.items():
        for field in fields:
            lines.append(f'printf("{name}.{field}@ %zu\\n", offsetof({name}, {field}));')
            lines.append(f'printf("{name}.{field} %zu\\n", sizeof((({name} *)0)->{field}));')
    source = tmp_path / "probe.c"
    body = "\n  ".join(lines)
    source.write_text('#include <stddef.h>\n#include <stdio.h>\n#include "verispec.h"\n'
                      f"int main(void) {{\n  {body}\n  return 0;\n}}\n")  # fmt: skip
    exe = tmp_path / "probe"
    compiler = build._compiler()
    assert compiler is not None
    subprocess.run([compiler, "-I", str(header.parent), "-o", str(exe), str(source)],
                   check=True, capture_output=True, timeout=120)  # fmt: skip
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=60)
    return {key: int(value) for key, value in (line.split() for line in out.stdout.splitlines())}


def _fields(struct: type[ctypes.Structure]) -> list[str]:
    """A ctypes struct's field names in memory order, its base classes' first."""
    return [name for cls in reversed(struct.__mro__) if "_fields_" in vars(cls)
            for name, *_ in vars(cls)["_fields_"]]  # fmt: skip


def layout_mismatches(
    structs: dict[str, list[str]], layout: dict[str, int],
    mirrors: dict[str, type[ctypes.Structure]],
) -> list[str]:  # fmt: skip
    """Where the C structs (their fields, and the probe's layout) and their ctypes mirrors
    differ: names, order, offsets, sizes; also a struct with no mirror or the reverse."""
    wrong = [f"{name}: no ctypes mirror" for name in structs.keys() - mirrors.keys()]
    wrong += [f"{name}: not in the header" for name in mirrors.keys() - structs.keys()]
    wrong += [f"{enum}: {layout[enum]} bytes, ctypes passes {ctypes.sizeof(ctypes.c_int)}"
              for enum in ENUMS if layout[enum] != ctypes.sizeof(ctypes.c_int)]  # fmt: skip
    for name in structs.keys() & mirrors.keys():
        mirror = mirrors[name]
        if structs[name] != _fields(mirror):
            wrong.append(f"{name}: C fields {structs[name]}, ctypes {_fields(mirror)}")
            continue
        if layout[name] != ctypes.sizeof(mirror):
            wrong.append(f"{name}: sizeof {layout[name]} in C, {ctypes.sizeof(mirror)} in ctypes")
        for field in structs[name]:
            c_field = getattr(mirror, field)
            c_place = (layout[f"{name}.{field}@"], layout[f"{name}.{field}"])
            if c_place != (c_field.offset, c_field.size):
                wrong.append(f"{name}.{field}: offset and size {c_place} in C, "
                             f"{(c_field.offset, c_field.size)} in ctypes")  # fmt: skip
    return wrong


def _expected(param: str) -> type:
    """The ctypes type that passes one of the header's parameters: a scalar's, a pointer to a
    mirrored struct as a POINTER of its mirror, any other pointer as c_void_p."""
    kind = re.sub(r"\w+$", "", param)  # the parameter's name off
    base = next(word for word in re.findall(r"\w+", kind) if word != "const")
    if kind.count("*") == 1 and base in MIRRORS:
        return ctypes.POINTER(MIRRORS[base])
    return ctypes.c_void_p if "*" in kind else SCALARS[base]


def declared() -> dict[str, SimpleNamespace]:
    """The argtypes and restype ffi.declare gives each entry point, read off a stand-in for the
    library (so no build is needed)."""

    class Library:
        def __init__(self) -> None:
            self.functions: dict[str, SimpleNamespace] = {}

        def __getattr__(self, name: str) -> SimpleNamespace:
            return self.functions.setdefault(name, SimpleNamespace())

    lib = Library()
    ffi.declare(lib)  # type: ignore[arg-type]
    return lib.functions


def signature_mismatches(
    functions: dict[str, tuple[str, list[str]]], python: dict[str, SimpleNamespace]
) -> list[str]:  # fmt: skip
    """Where the header's prototypes and ffi.declare's types differ: an entry point on one side
    only, a result type, the number of parameters, a parameter's type."""
    wrong = [f"{name}: not declared in ffi.py" for name in functions.keys() - python.keys()
             if name not in C_ONLY]  # fmt: skip
    wrong += [f"{name}: not in the header" for name in python.keys() - functions.keys()]
    for name in functions.keys() & python.keys():
        result, params = functions[name]
        argtypes, restype = python[name].argtypes, python[name].restype
        if restype is not (None if result == "void" else SCALARS[result]):
            wrong.append(f"{name}: returns {result} in C, {restype} in ctypes")
        if len(argtypes) != len(params):
            wrong.append(f"{name}: {len(params)} parameters in C, {len(argtypes)} in ctypes")
            continue
        wrong += [f"{name}: parameter {i} ({param}) is {argtype.__name__} in ctypes"
                  for i, (param, argtype) in enumerate(zip(params, argtypes, strict=True))
                  if argtype is not _expected(param)]  # fmt: skip
    return wrong


@needs_compiler
def test_the_ctypes_structs_have_the_c_layout(tmp_path: Path) -> None:
    text = build.HEADER.read_text()
    structs = c_structs(text)
    assert set(structs) == {"Linear", "Layer", "Keys"}  # the parser finds them all
    assert layout_mismatches(structs, probe(build.HEADER, structs, tmp_path), MIRRORS) == []


def test_every_entry_point_has_the_header_parameters() -> None:
    functions = c_functions(build.HEADER.read_text())
    assert {"verispec_linear", "verispec_decoder_stack", "verispec_greedy_steps"} <= set(functions)
    assert signature_mismatches(functions, declared()) == []


def test_every_c_file_includes_the_header_and_defines_only_its_entry_points() -> None:
    """No C file declares an entry point of its own (as layer.c once redeclared
    verispec_linear): each one it defines is in the header."""
    header = set(c_functions(build.HEADER.read_text()))
    for source in sorted(build.NATIVE.glob("*.c")):
        text = source.read_text()
        assert '#include "verispec.h"' in text, source.name
        defined = set(re.findall(r"^(?:int|void)\s+(verispec_\w+)\(", text, flags=re.M))
        assert defined and defined <= header, (source.name, defined - header)
    assert set(map(Path, build.sources("aarch64"))) <= set(build.NATIVE.glob("*.c"))


@needs_compiler
def test_a_field_on_one_side_only_is_found(tmp_path: Path) -> None:
    """A field added to a ctypes mirror alone, or to the header's struct alone, or a field
    whose type differs (a narrower window), fails the layout check."""
    text = build.HEADER.read_text()
    structs = c_structs(text)
    layout = probe(build.HEADER, structs, tmp_path)

    class LongerLinear(ffi.CLinear):
        _fields_: ClassVar = [("extra", ctypes.c_int64)]

    wrong = layout_mismatches(structs, layout, {**MIRRORS, "Linear": LongerLinear})
    assert len(wrong) == 1 and wrong[0].startswith("Linear: C fields")

    planted = tmp_path / "planted" / "verispec.h"
    planted.parent.mkdir()
    planted.write_text(text.replace("int64_t num_masks, max_q, max_ctx;",
                                    "int64_t num_masks, max_q, max_ctx, extra;"))  # fmt: skip
    structs = c_structs(planted.read_text())
    wrong = layout_mismatches(structs, probe(planted, structs, tmp_path), MIRRORS)
    assert len(wrong) == 1 and wrong[0].startswith("Keys: C fields")

    planted.write_text(text.replace("  int64_t window;\n} Layer;", "  int32_t window;\n} Layer;"))
    structs = c_structs(planted.read_text())
    wrong = layout_mismatches(structs, probe(planted, structs, tmp_path), MIRRORS)
    assert wrong and all(w.startswith("Layer") for w in wrong)


def test_a_parameter_on_one_side_only_is_found() -> None:
    text = build.HEADER.read_text()
    one_more = text.replace("uint8_t *out, int threads);", "uint8_t *out, int threads, int x);")
    assert signature_mismatches(c_functions(one_more), declared()) == [
        "verispec_pack_q6: 6 parameters in C, 5 in ctypes"
    ]
    python = declared()
    python["verispec_decoder_stack"].argtypes[1] = ctypes.c_void_p  # an untyped Layer pointer
    python["verispec_linear"].argtypes[1] = ctypes.c_int64  # the format as an int64
    assert len(signature_mismatches(c_functions(text), python)) == 2
