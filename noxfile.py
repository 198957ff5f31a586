"""Kiln's sessions: tests on 3.11, 3.12 and 3.13, lint, typecheck, per-package isolation, demo,
bench, models-latest, docs, no-triton, lowering-corpus.

torch with its CUDA libraries is ~5.7 GB, so no session gets its own copy: one dependency
environment per Python version (`.nox/_deps-<version>`) holds every third-party package, and each
session's venv sees it through a `.pth` file. Kiln's own packages are installed editable into the
session's venv alone, so a session proves exactly which kiln packages it can import. pip keeps
no cache of the wheels, and a new environment on a nearly full disk first removes the other
Python versions' (not 3.11's), which their sessions rebuild when run again.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).parent
nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["lint", "typecheck", "tests"]

# Layer order; each package may import only those to its left (the codegens not each other).
PACKAGES = [
    "capture",
    "guards",
    "autograd_aot",
    "loopir",
    "codegen_triton",
    "codegen_cpp",
    "frontend",
]
ALLOWED: dict[str, list[str]] = {
    "capture": [],
    "guards": ["capture"],
    "autograd_aot": ["capture", "guards"],
    "loopir": ["capture", "guards", "autograd_aot"],
    "codegen_triton": ["capture", "guards", "autograd_aot", "loopir"],
    "codegen_cpp": ["capture", "guards", "autograd_aot", "loopir"],
    "frontend": PACKAGES[:-1],
}
PYTEST = ["python", "-m", "pytest", "-q", "--timeout=600"]
# Tools beside requirements-dev.txt in the shared environment (editables: hatchling's editable builds).
TOOLS = ["ruff", "mypy", "hatchling", "editables"]


def _python(version: str) -> str:
    """An interpreter for `version`: pyenv's if it has one, else whatever PATH offers."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    for candidate in sorted(pyenv.glob(f"{version}.*"), reverse=True):
        exe = candidate / "bin" / f"python{version}"
        if exe.exists():
            return str(exe)
    return version


PY311, PY312, PY313 = _python("3.11"), _python("3.12"), _python("3.13")


def _site_packages(session: nox.Session, python: str) -> str:
    out = session.run(
        python,
        "-c",
        "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        silent=True,
        external=True,
    )
    return str(out).strip().splitlines()[-1]


def _deps_env(session: nox.Session) -> Path:
    """The shared third-party environment for this session's Python, (re)built when pins change."""
    version = session.run(
        "python", "-c", "import sys; print('%d.%d' % sys.version_info[:2])", silent=True
    )
    env = ROOT / ".nox" / f"_deps-{str(version).strip()}"
    wanted = hashlib.sha256(
        (ROOT / "constraints.txt").read_bytes()
        + (ROOT / "requirements-dev.txt").read_bytes()
        + " ".join(TOOLS).encode()
    ).hexdigest()
    stamp = env / "kiln-deps.sha256"
    if not stamp.exists() or stamp.read_text() != wanted:
        _make_room(session, env)
        session.log(f"building the shared dependency environment {env}")
        session.run("python", "-m", "venv", str(env))
        py = str(env / "bin" / "python")
        # pip reinstalls nothing already there, so a changed pin costs only the changed packages.
        # No pip cache: it would keep a second copy of every wheel installed (gigabytes).
        session.run(
            py,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-cache-dir",
            "-r",
            str(ROOT / "requirements-dev.txt"),
            "-c",
            str(ROOT / "constraints.txt"),
            *TOOLS,
            external=True,
        )
        stamp.write_text(wanted)
    return env


ENV_ROOM_GB = 10.0
"""Free disk a new shared environment needs (torch with its CUDA libraries, and pip's
unpacking of them)."""


def _make_room(session: nox.Session, env: Path) -> None:
    """Where the disk has less than ``ENV_ROOM_GB`` free, remove the other Python versions'
    shared environments, newest version first, but never 3.11's (the default sessions' and
    the later CI sessions'): a session rebuilds one it finds missing. CI builds all three on
    one disk; tests-3.12's is unused once that session is done."""
    others = sorted(env.parent.glob("_deps-3.*"), key=lambda p: -int(p.name.split(".")[-1]))
    for other in others:
        if shutil.disk_usage(env.parent).free >= ENV_ROOM_GB * 2**30:
            return
        if other == env or other.name == "_deps-3.11":
            continue
        session.log(f"too little free disk for {env.name}: removing {other}")
        shutil.rmtree(other, ignore_errors=True)


def _use_deps(session: nox.Session) -> None:
    """Make the shared dependency environment visible inside this session's venv."""
    deps_site = _site_packages(session, str(_deps_env(session) / "bin" / "python"))
    own_site = Path(_site_packages(session, "python"))
    (own_site / "_kiln_shared_deps.pth").write_text(deps_site + "\n")


def _install(session: nox.Session, packages: list[str]) -> None:
    args = []
    for name in packages:
        args += ["-e", str(ROOT / "packages" / name)]
    session.run("python", "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", *args)


def _uninstall_all_but(session: nox.Session, keep: list[str]) -> None:
    drop = [p for p in PACKAGES if p not in keep]
    dists = ["kiln" if p == "frontend" else "kiln-" + p.replace("_", "-") for p in drop]
    if dists:
        session.run("python", "-m", "pip", "uninstall", "-q", "-y", *dists, silent=True)


# What tests-3.12 and tests-3.13 run of tests/: the end-to-end model tests. Every root test
# file on each of three Pythons would take CI past its time budget; what differs between
# Python versions is capture's bytecode layer, which the package tests and the models cover.
VERSION_E2E = [ROOT / "tests" / "test_models_e2e.py"]


def _staged_tests(session: nox.Session, e2e: list[Path] | None = None) -> None:
    """Each package's tests with only it and its left-hand layers installed, then end-to-end tests
    (``e2e``: these root test files; None: all of ``tests/``).

    Running every package in its own minimal install proves the layering (kiln.capture alone,
    kiln.loopir without codegens) without paying for the suite twice.
    """
    _use_deps(session)
    workers = ["-n", "2"] if (os.cpu_count() or 1) > 1 else []
    for name in PACKAGES:
        keep = [*ALLOWED[name], name]
        _uninstall_all_but(session, keep)
        _install(session, keep)
        session.log(f"kiln.{name}: installed alone with {ALLOWED[name] or 'no other kiln package'}")
        session.run(*PYTEST, *workers, str(ROOT / "packages" / name / "tests"), *session.posargs)
    roots = [ROOT / "tests"] if e2e is None else e2e
    session.run(*PYTEST, *workers, *map(str, roots), *session.posargs)


@nox.session(name="tests", python=PY311)
def tests(session: nox.Session) -> None:
    """The whole suite on Python 3.11, package by package in minimal installs."""
    _staged_tests(session)


@nox.session(name="tests-3.12", python=PY312)
def tests_312(session: nox.Session) -> None:
    """Every package's tests and the end-to-end model tests on Python 3.12 (the GPU machine's
    Python); the other root test files run on 3.11 only (see VERSION_E2E)."""
    _staged_tests(session, VERSION_E2E)


@nox.session(name="tests-3.13", python=PY313)
def tests_313(session: nox.Session) -> None:
    """Every package's tests and the end-to-end model tests on Python 3.13 (see VERSION_E2E)."""
    _staged_tests(session, VERSION_E2E)


@nox.session(python=PY311)
@nox.parametrize("package", PACKAGES)
def package(session: nox.Session, package: str) -> None:
    """One package's tests with only it and what it declares installed."""
    _use_deps(session)
    _install(session, [*ALLOWED[package], package])
    session.run(*PYTEST, str(ROOT / "packages" / package / "tests"), *session.posargs)


@nox.session(name="no-triton", python=PY311)
def no_triton(session: nox.Session) -> None:
    """Kiln where Triton is absent: every package but kiln.codegen_triton installed and
    `import triton` refused (torch depends on triton, so the shared environment has it; the
    `sitecustomize` in `tests/no_triton` hides it): `import kiln`, CPU compiles and the
    frontend's tests."""
    _use_deps(session)
    keep = [p for p in PACKAGES if p != "codegen_triton"]
    _uninstall_all_but(session, keep)
    _install(session, keep)
    env = {"PYTHONPATH": str(ROOT / "tests" / "no_triton")}
    workers = ["-n", "2"] if (os.cpu_count() or 1) > 1 else []
    tests = [ROOT / "tests" / "test_no_triton.py", ROOT / "packages" / "frontend" / "tests"]
    session.run(*PYTEST, *workers, *map(str, tests), *session.posargs, env=env)


@nox.session(python=PY311)
def lint(session: nox.Session) -> None:
    """ruff: lint and formatting."""
    _use_deps(session)
    session.run("python", "-m", "ruff", "check", str(ROOT))
    session.run("python", "-m", "ruff", "format", "--check", str(ROOT))


@nox.session(python=PY311)
def typecheck(session: nox.Session) -> None:
    """mypy, strict, over every package's source."""
    _use_deps(session)
    srcs = [str(ROOT / "packages" / p / "src" / "kiln") for p in PACKAGES]
    session.run("python", "-m", "mypy", *srcs)


def _all_installed(session: nox.Session) -> None:
    _use_deps(session)
    _install(session, PACKAGES)


# The lowering corpus: loopir's eager-parity tests, which compile through `loopir_testing`.
_CORPUS = ROOT / "packages" / "loopir" / "tests"
# Per code generator, the corpus tests it leaves out: they count kernels or fallbacks as the
# reference backend makes them (the values still match eager), or fail under Triton's
# interpreter (a data type it does not support).
_CORPUS_LEAVES_OUT = {
    "kiln.codegen_cpp:CppBackend": [
        "test_lowering_pooling.py::test_max_pool2d_big_window_uses_the_decomposition",
        "test_lowering_pooling.py::test_a_costly_gradient_read_at_each_window_tap_is_stored_once",
    ],
    "kiln.codegen_triton:TritonBackend": [
        "test_lowering_pooling.py::test_max_pool2d_big_window_uses_the_decomposition",
        *(
            f"test_lowering_pooling.py::test_max_pool2d_and_backward[{layout}-3]"
            for layout in ("contiguous", "channels_last", "transposed")
        ),
        "test_lowering_pointwise.py::test_binary[rank-dtype2]",
        "test_lowering_views.py::test_gather_index_scatter[dtype2]",
    ],
}


def _run_corpus(session: nox.Session, backend: str, tests: list[Path], env: dict[str, str]) -> None:
    workers = ["-n", "2"] if (os.cpu_count() or 1) > 1 else []
    left_out = [f"--deselect={_CORPUS.relative_to(ROOT) / t}" for t in _CORPUS_LEAVES_OUT[backend]]
    env = {**env, "KILN_LOOPIR_TEST_BACKEND": backend}
    session.run(*PYTEST, *workers, *left_out, *map(str, tests), *session.posargs, env=env)


@nox.session(name="lowering-corpus", python=PY311)
def lowering_corpus(session: nox.Session) -> None:
    """loopir's lowering corpus compiled by the real code generators instead of loopir's
    reference backend, each kernel checked against eager: the C++ one always; Triton's (under
    its interpreter, on CPU tensors) only where a GPU is present."""
    _all_installed(session)
    _run_corpus(session, "kiln.codegen_cpp:CppBackend", [_CORPUS], {})
    gpu = session.run("python", "-c", "import torch; print(torch.cuda.is_available())", silent=True)
    if str(gpu).strip() != "True":
        session.log("no GPU: the corpus through Triton is left out")
        return
    tests = [*sorted(_CORPUS.glob("test_lowering_*.py")), _CORPUS / "test_decompositions.py"]
    tests.append(_CORPUS / "test_pipeline.py")
    _run_corpus(session, "kiln.codegen_triton:TritonBackend", tests, {"TRITON_INTERPRET": "1"})


@nox.session(python=PY311)
def demo(session: nox.Session) -> None:
    """Compile a real model on CPU with the default backend and compare it with eager."""
    _all_installed(session)
    session.run("python", str(ROOT / "benchmarks" / "demo.py"), *session.posargs)


@nox.session(python=PY311)
@nox.parametrize("mode", ["float32", "bfloat16", "grad"])
def opinfo(session: nox.Session, mode: str) -> None:
    """PyTorch's CPU OpInfos compiled with the default backend and compared with eager.

    `nox -s opinfo` runs the three modes; `nox -s "opinfo(mode='grad')" -- --ops 'linalg.*'`
    one, on some ops. Extra arguments go to `python -m opinfo` (`--workers`, `--samples`, ...).
    """
    _all_installed(session)
    workers = ["--workers", "2"] if (os.cpu_count() or 1) > 1 else []
    session.run(
        "python",
        "-m",
        "opinfo",
        "--mode",
        mode,
        *workers,
        *session.posargs,
        env={"PYTHONPATH": str(ROOT)},
    )


@nox.session(python=PY311)
def fuzz(session: nox.Session) -> None:
    """The differential fuzzer's long run: `nox -s fuzz -- --examples 20000 [--seed N]`.

    Findings are shrunk and written as self-contained repro files under `fuzz-findings/`.
    """
    _all_installed(session)
    session.run(
        "python",
        "-m",
        "fuzz.run",
        "--out",
        str(ROOT / "fuzz-findings"),
        *session.posargs,
        env={"PYTHONPATH": str(ROOT / "tests")},
    )


# The model libraries whose newest releases `models-latest` tries; their dependencies come from
# the shared environment (add one here when a release needs a newer version of it).
LATEST = ["timm", "transformers"]


@nox.session(name="models-latest", python=PY311)
def models_latest(session: nox.Session) -> None:
    """The model tests against the newest timm and transformers (not part of CI).

    The newest releases go into an overlay (`pip --target`, no dependencies) in front of the
    shared environment on `PYTHONPATH`, so the pinned environment is neither copied nor
    changed. `nox -s models-latest -- -k bert` picks tests.
    """
    _all_installed(session)
    overlay = Path(session.virtualenv.location) / "latest"
    session.run(
        "python", "-m", "pip", "install", "-q", "--upgrade", "--no-deps", "--target",
        str(overlay), *LATEST,
    )  # fmt: skip
    env = {"PYTHONPATH": str(overlay)}
    versions = "import timm, transformers; print('timm', timm.__version__, 'transformers', transformers.__version__)"
    session.run("python", "-c", versions, env=env)
    tests = [
        str(ROOT / "tests" / "test_models_e2e.py"),
        str(ROOT / "packages" / "capture" / "tests" / "test_model_suite.py"),
        str(ROOT / "packages" / "capture" / "tests" / "test_modules.py"),
    ]
    session.run(*PYTEST, *tests, *session.posargs, env=env)


@nox.session(python=PY311)
def bench(session: nox.Session) -> None:
    """Benchmarks: Kiln against eager and torch.compile, side by side in one run."""
    _all_installed(session)
    session.run("python", "-m", "benchmarks", *session.posargs, env={"PYTHONPATH": str(ROOT)})


@nox.session(python=PY311)
def zoo(session: nox.Session) -> None:
    """The model zoo: every timm family and transformers architecture, tiny and on CPU, under
    Kiln and torch.compile in eval and train mode; writes `benchmarks/results/<version>/zoo/`
    (JSON and the Markdown report) and `docs/zoo.md`. Extra arguments go to
    `python -m benchmarks.zoo` (`--only 'hf:*bert*'`, `--workers`, `--timeout`)."""
    _all_installed(session)
    workers = str(max(1, (os.cpu_count() or 2) - 1))
    args = ["--workers", workers, "--docs", str(ROOT / "docs" / "zoo.md"), *session.posargs]
    session.run("python", "-m", "benchmarks.zoo", *args, env={"PYTHONPATH": str(ROOT)})


@nox.session(python=PY311)
def docs(session: nox.Session) -> None:
    """The user documentation site, built into `build/site` with `mkdocs build --strict`.

    Strict mode fails on any warning: a broken link, a page left out of the navigation, an API
    name the reference pages name that no longer exists, an environment variable the
    configuration page does not describe. The docs tools go into this session's venv alone
    (before the shared environment is linked in), so the tests' environment never changes.
    """
    reqs = ["-r", str(ROOT / "requirements-docs.txt"), "-c", str(ROOT / "constraints.txt")]
    session.run("python", "-m", "pip", "install", "-q", *reqs)
    _all_installed(session)
    config = str(ROOT / "mkdocs.yml")
    quiet = {"NO_MKDOCS_2_WARNING": "1"}  # Material's banner about MkDocs 2, not a build warning
    session.run(
        "python", "-m", "mkdocs", "build", "--strict", "-f", config, *session.posargs, env=quiet
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run with: python3 -m nox")
