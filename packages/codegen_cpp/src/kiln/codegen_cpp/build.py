"""Compile generated C++ into shared libraries with the system compiler.

One compile of a graph yields one or a few sources; each becomes one shared
library. Libraries missing from the cache are built by parallel compiler
processes, each writing a temporary file that is renamed into place only when
the compiler succeeded, together with a sidecar recording its size and hash (a
cached library whose sidecar disagrees is rebuilt). After new builds the
folder is trimmed to ``KILN_CACHE_SIZE_MB``, least recently used first. The flags and compiler version are recorded in every
result and folded into its cache key.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
import platform
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kiln.codegen_cpp import cache
from kiln.codegen_cpp.__about__ import __version__
from kiln.codegen_cpp.errors import CompilerNotFound, CppBuildError
from kiln.loopir.disk_cache import memoized

__all__ = [
    "BuiltLibrary",
    "Toolchain",
    "build_libraries",
    "cpu_identity",
    "include_dir",
    "toolchain",
    "toolchain_stamp",
]

log = logging.getLogger(__name__)
build_log = logging.getLogger("kiln.codegen_cpp.build")

BASE_FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC", "-std=c++17")
MARCH_ENV = "KILN_CPP_MARCH"
"""Names the ``-march`` target (default ``native``): e.g. ``haswell`` for an AVX2 build."""
# Errno-free math lets the compiler inline sqrt; NaN/Inf semantics stay IEEE. No contraction
# of a * b + c into one fused multiply-add: ATen rounds the product, and near a cancellation
# (asin's gradient 1 / sqrt(1 - x * x) as x nears 1) the two differ far beyond rounding.
EXTRA_FLAGS = ("-fno-math-errno", "-ffp-contract=off", "-fno-plt", "-w")


@dataclasses.dataclass(frozen=True)
class Toolchain:
    """The compiler and flags every build of this process uses."""

    compiler: str
    version: str
    target: str  # what -march=native resolves to: part of the cache key
    flags: tuple[str, ...]
    vector_bytes: int = 16  # the SIMD width -march=native enables (kiln_vec.h's choice)

    @property
    def lanes(self) -> int:
        """Lanes of every ``kiln::Vec`` (``kiln::kLanes``): 32-bit elements per register."""
        return self.vector_bytes // 4

    def command(self, source: Path, output: Path) -> list[str]:
        return [self.compiler, *self.flags, str(source), "-o", str(output)]


@dataclasses.dataclass(frozen=True)
class BuiltLibrary:
    """A shared library in the cache, and how it was made."""

    path: Path
    source_path: Path
    key: str
    flags: tuple[str, ...]
    cached: bool


def include_dir() -> Path:
    """The folder of Kiln's own C++ headers (``kiln_vec.h`` and friends)."""
    return Path(__file__).parent / "include"


@functools.cache
def _headers_digest() -> str:
    digest = hashlib.sha256()
    for header in sorted(include_dir().glob("*.h")):
        digest.update(header.name.encode())
        digest.update(header.read_bytes())
    return digest.hexdigest()


def _compiler() -> tuple[list[str], str | None]:
    """The names looked for (``CXX``'s first word, else ``g++`` and ``c++``) and the path of
    the first one found, or None."""
    cxx_env = os.environ.get("CXX")
    candidates = shlex.split(cxx_env)[:1] if cxx_env else ["g++", "c++"]
    return candidates, next((found for c in candidates if (found := shutil.which(c))), None)


def _march() -> str:
    return f"-march={os.environ.get(MARCH_ENV, 'native')}"


@functools.cache
def cpu_identity() -> str:
    """What identifies this CPU's instruction set (what ``-march=native`` targets): a digest of
    its model and feature lines."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    wanted = ("model name", "flags", "Features", "CPU implementer", "CPU part")
    lines = sorted({line for line in text.splitlines() if line.startswith(wanted)})
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:20]


def toolchain_stamp() -> str:
    """The toolchain, told without running it: the compiler by path, real path, size and
    modification time (an upgrade replaces the file), the ``-march`` target and the CPU it
    means. What the compiler says of itself (:func:`toolchain`'s probes) is kept on disk
    under this stamp, and the whole-graph cache keys CPU programs on it."""
    _, compiler = _compiler()
    if compiler is None:
        return "no C++ compiler"
    real = os.path.realpath(compiler)
    info = os.stat(real)
    return repr(
        (compiler, real, info.st_size, info.st_mtime_ns, _march(), cpu_identity(), __version__)
    )


@functools.cache
def toolchain() -> Toolchain:
    """Find the compiler (``CXX``, else ``g++``, else ``c++``) and what it says of itself:
    its version, what ``-march`` resolves to and the vector width it enables. Those probes run
    the compiler three times, a good part of a warm start's time, so their answers are kept
    in the cache's ``probes`` folder under :func:`toolchain_stamp` and run again only when
    the compiler, the target or the CPU changes."""
    candidates, compiler = _compiler()
    if compiler is None:
        msg = (
            f"no C++ compiler found (looked for {', '.join(candidates)}); install g++ "
            "or set CXX, or run CPU graphs with another backend"
        )
        raise CompilerNotFound(msg)
    march = _march()

    def probe() -> list[str | int]:
        version = _run([compiler, "--version"]).splitlines()[0]
        return [version, _native_target(compiler, march), _vector_bytes(compiler, march)]

    try:
        folder = cache.probe_dir()
    except OSError:  # no usable private folder: probe, as without the cache
        answer = probe()
    else:
        answer = memoized(folder, "toolchain", toolchain_stamp(), probe, _well_formed)
    version, target, vector_bytes = str(answer[0]), str(answer[1]), int(answer[2])
    flags = (BASE_FLAGS[0], march, *BASE_FLAGS[1:], *EXTRA_FLAGS, f"-I{include_dir()}")
    build_log.debug(
        "toolchain: %s (%s), target %s, %d-byte vectors", compiler, version, target, vector_bytes
    )
    return Toolchain(compiler, version, target, flags, vector_bytes)


def _well_formed(answer: Any) -> bool:
    """Whether a kept probe answer is (version, target, vector bytes)."""
    return (
        isinstance(answer, list)
        and len(answer) == 3
        and all(isinstance(a, str) for a in answer[:2])
        and answer[2] in (16, 32, 64)
    )


def _run(command: list[str]) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        msg = f"could not run the C++ compiler ({' '.join(command)}): {exc}"
        raise CompilerNotFound(msg) from exc
    return done.stdout


def _native_target(compiler: str, march: str) -> str:
    output = _run([compiler, march, "-Q", "--help=target"])
    for line in output.splitlines():
        fields = line.split()
        if fields and fields[0] == "-march=" and len(fields) > 1:
            return fields[1]
    return hashlib.sha256(output.encode()).hexdigest()[:16]


def _vector_bytes(compiler: str, march: str) -> int:
    """The register width kiln_vec.h will pick, from the compiler's predefined macros."""
    macros = _run([compiler, march, "-dM", "-E", "-x", "c++", os.devnull])
    defined = {line.split()[1] for line in macros.splitlines() if line.startswith("#define ")}
    if "__AVX512F__" in defined:
        return 64
    return 32 if "__AVX__" in defined else 16


def library_key(source: str, tools: Toolchain) -> str:
    """The cache key of ``source`` built by ``tools``."""
    return cache.cache_key(
        [source, " ".join(tools.flags), tools.version, tools.target, _headers_digest(), __version__]
    )


def build_libraries(sources: Sequence[str], max_jobs: int | None = None) -> list[BuiltLibrary]:
    """Build (or find in the cache) one shared library per source, in order.

    Misses compile in parallel processes, at most ``max_jobs`` at once (default:
    the CPU count). Raises :class:`CppBuildError` for the first source that fails,
    after every started compiler has finished.
    """
    tools = toolchain()
    folder = cache.cache_dir()
    results: list[BuiltLibrary] = []
    pending: list[tuple[int, BuiltLibrary]] = []
    for index, source in enumerate(sources):
        key = library_key(source, tools)
        lib = BuiltLibrary(folder / f"{key}.so", folder / f"{key}.cpp", key, tools.flags, True)
        if not cache.verified(lib.path):
            # Missing, or truncated / empty / foreign (its sidecar disagrees): rebuilt,
            # and the new file replaces it by rename.
            lib = dataclasses.replace(lib, cached=False)
            cache.atomic_write(lib.source_path, source)
            pending.append((index, lib))
        else:
            cache.touch(lib.path)
            build_log.debug("cache hit %s", lib.path)
        results.append(lib)
    _compile_all([lib for _, lib in pending], tools, max_jobs or os.cpu_count() or 1)
    if pending:
        cache.evict(folder, keep={lib.key for lib in results})
    return results


def _compile_all(libs: list[BuiltLibrary], tools: Toolchain, max_jobs: int) -> None:
    failures: list[CppBuildError] = []
    queue = list(libs)
    running: list[tuple[BuiltLibrary, Path, list[str], subprocess.Popen[str]]] = []
    while queue or running:
        while queue and len(running) < max_jobs:
            lib = queue.pop(0)
            tmp = cache.temporary_sibling(lib.path)
            command = tools.command(lib.source_path, tmp)
            build_log.debug("compiling: %s", " ".join(command))
            proc = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            running.append((lib, tmp, command, proc))
        lib, tmp, command, proc = running.pop(0)
        output, _ = proc.communicate()
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            failures.append(CppBuildError(lib.source_path, command, output))
            continue
        try:
            cache.seal(tmp, lib.path)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
        build_log.debug("built %s", lib.path)
    if failures:
        raise failures[0]
