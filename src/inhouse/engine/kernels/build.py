"""Build and load the C++ CPU kernels (this folder's ``*.cpp``, one kernel family a file,
linked into one library) once per machine.

The library is compiled with the system C++ compiler for this CPU (``-march=native``:
AVX2 code on an AVX2 host, AVX-512 code where the CPU has it, AMX tiles for the linears'
prompt rows where it has those) and cached under ``$INHOUSE_CACHE/kernels/<digest>``, the
digest covering the sources, torch's version, the compiler and the CPU's flags, so a warm
start only loads it. ``INHOUSE_KERNELS_ISA`` caps the build below the host's own, to test
another host's path here: ``avx512-vnni`` (no AMX, ``-mno-amx-*``) or ``avx2`` (the code an
AVX2-only host gets, ``-mno-avx512f``). Without a compiler,
or when the build fails, :func:`load_kernels` returns None and says why once; the
engine then keeps its eager torch path.

``python -m inhouse.engine.kernels.build`` builds it ahead of time (``make`` does).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from inhouse.manifests.hashing import default_cache_dir

log = logging.getLogger(__name__)
HERE = Path(__file__).parent
SOURCES = tuple(sorted(HERE.glob("*.cpp")))
HEADERS = tuple(sorted(HERE.glob("*.h")))
_SIMD_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "amx_bf16",
    "amx_int8",
    "amx_tile",
)
_NO_AMX = ("-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16")


@dataclass(frozen=True, slots=True)
class Kernels:
    """The loaded library: where it lives and the SIMD level it was compiled for."""

    path: Path
    isa: str  # "avx512-amx", "avx512-vnni", "avx512", "avx2" or "scalar"


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The SIMD flags this CPU reports (empty when /proc/cpuinfo is unreadable)."""
    try:
        words = cpuinfo.read_text().split()
    except OSError:
        return frozenset()
    return frozenset(w for w in words if w in _SIMD_FLAGS)


def build_flags() -> tuple[frozenset[str], tuple[str, ...]]:
    """The CPU flags the build targets and the compiler options that cap it there:
    ``INHOUSE_KERNELS_ISA`` ``native`` (the default), ``avx512-vnni`` or ``avx2``."""
    wanted = os.environ.get("INHOUSE_KERNELS_ISA", "native")
    flags = cpu_flags()
    if wanted == "native":
        return flags, ()
    if wanted == "avx512-vnni":
        return frozenset(f for f in flags if not f.startswith("amx")), _NO_AMX
    if wanted == "avx2":
        capped = frozenset(f for f in flags if not f.startswith(("avx512", "amx")))
        return capped, ("-mno-avx512f", *_NO_AMX)
    raise RuntimeError(f"INHOUSE_KERNELS_ISA must be native, avx512-vnni or avx2, not {wanted!r}")


def isa_of(flags: frozenset[str]) -> str:
    """The instruction set the kernels compile to with ``-march=native`` on these flags."""
    if {"avx512f", "avx512bw", "avx512vl", "fma"} <= flags:
        if "avx512_vnni" not in flags:
            return "avx512"
        return "avx512-amx" if {"amx_tile", "amx_int8"} <= flags else "avx512-vnni"
    if {"avx2", "fma"} <= flags:
        return "avx2"
    return "scalar"


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def _compile_options(caps: tuple[str, ...]) -> list[str]:
    # torch.utils.cpp_extension loads setuptools: only a build needs it.
    from torch.utils.cpp_extension import include_paths

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [
        "-O3",
        "-march=native",
        *caps,
        "-fopenmp",
        "-std=c++17",
        "-fPIC",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        *(f"-I{p}" for p in include_paths()),
    ]


def _link_command(compiler: str, objects: list[Path], out: Path) -> list[str]:
    torch_lib = Path(torch.__file__).parent / "lib"
    return [
        compiler,
        "-shared",
        "-fopenmp",
        *(str(o) for o in objects),
        f"-L{torch_lib}",
        "-lc10",
        "-ltorch_cpu",
        f"-Wl,-rpath,{torch_lib}",
        "-o",
        str(out),
    ]


def _run(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"compiling the kernels failed:\n{result.stderr[-2000:]}")


def _compile(compiler: str, caps: tuple[str, ...], scratch: Path, out: Path) -> None:
    """All sources as one translation unit (torch's headers, most of the compile time, parsed
    once), then linked."""
    unit = scratch / "all_kernels.cpp"
    unit.write_text("".join(f'#include "{source}"\n' for source in SOURCES))
    obj = scratch / "all_kernels.o"
    _run([compiler, *_compile_options(caps), "-c", str(unit), "-o", str(obj)])
    _run(_link_command(compiler, [obj], out))


def _digest(compiler: str, flags: frozenset[str]) -> str:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    digest = hashlib.sha256()
    for path in (*SOURCES, *HEADERS):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    for part in (torch.__version__, version, " ".join(sorted(flags)), sys.version):
        digest.update(part.encode())
    return digest.hexdigest()[:16]


def build(cache_dir: Path) -> Kernels:
    """Compile the library unless a build for this machine is cached; raises on failure."""
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C++ compiler (g++ or $CXX) found")
    flags, caps = build_flags()
    folder = cache_dir / "kernels" / _digest(compiler, flags)
    library = folder / "inhouse_cpu_kernels.so"
    if not library.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f"build-{os.getpid()}.so"
        with tempfile.TemporaryDirectory(dir=folder) as scratch:
            _compile(compiler, caps, Path(scratch), tmp)
        tmp.rename(library)
    return Kernels(library, isa_of(flags))


@cache
def load_kernels() -> Kernels | None:
    """The kernels, built if needed and registered as ``torch.ops.inhouse_cpu``; None (said
    once in the log) when this machine cannot build them."""
    if os.environ.get("INHOUSE_NO_KERNELS"):
        log.warning("C++ CPU kernels disabled by INHOUSE_NO_KERNELS: eager torch path")
        return None
    try:
        kernels = build(default_cache_dir())
        torch.ops.load_library(str(kernels.path))
    except (OSError, RuntimeError) as err:
        log.warning("C++ CPU kernels unavailable (%s): eager torch path", err)
        return None
    if kernels.isa == "avx512-amx" and not torch.ops.inhouse_cpu.use_amx(True):
        log.warning("Linux refused this process the AMX tiles: the linears keep VNNI")
        return Kernels(kernels.path, "avx512-vnni")
    return kernels


if __name__ == "__main__":
    built = load_kernels()
    print(f"inhouse CPU kernels: {built.path} ({built.isa})" if built else "no CPU kernels")
    sys.exit(0 if built else 1)
