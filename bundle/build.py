#!/usr/bin/env python3
"""Build the LocalAI artifact: dist/<name>/ and dist/<name>.tar (`make package`).

    python bundle/build.py [--out dist] [--name NAME] [--image PREFIX] [--version latest]
                           [--python-dist python-build-standalone.tar.gz] [--force]
                           [--layer-cache DIR]

The tree holds `run.sh` at its top, the backend and common code with the generated stubs,
and `python/`: an interpreter of its own with the runtime packages only (pip, the test
packages and the gRPC code generator are not in it). The tar is the same tree as a
docker-archive image, what `local-ai backends install ocifile://...` reads, and index.yaml
beside them is a backend gallery for it. A second run with the same sources, packages and
interpreter reuses the first one's output (the key is in dist/<name>.key); one with other
sources only reuses the interpreter with its packages (layer_cache.py, --layer-cache).
"""

import argparse
import contextlib
import fcntl
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import docker_archive  # noqa: E402
import gallery  # noqa: E402
import interpreter  # noqa: E402
import layer_cache as layer_cache_module  # noqa: E402
import precompile  # noqa: E402
import relocate  # noqa: E402
import store  # noqa: E402  (the backend's, on the path through layer_cache)

log = logging.getLogger("bundle")

REPO = Path(__file__).resolve().parent.parent
SOURCES = ("backend", "common")
# Development tools beside the server: the checkout's own launcher (it runs install.sh),
# the demo, the smoke test and the folder layout for a checkout.
DEV_ONLY = {"backend/run.sh", "backend/demo.py", "backend/test.py", "backend/localai_backend.py",
            "common/launcher.py"}
BUILD_ONLY = {"grpcio-tools"}  # generates the stubs at build time; the server never imports it
RUNTIME_UNNEEDED = ("pip", "setuptools", "wheel")  # installers, removed unless a package needs one
STUBS = ("backend/backend_pb2.py", "backend/backend_pb2_grpc.py")


def flavour_of_this_build() -> str:
    if sys.platform == "darwin":
        return "metal"
    return "cuda12" if os.environ.get("MLX_BACKEND_CUDA", "0") == "1" else "cpu"


def install_specs() -> dict:
    """The MLX package for this platform and the embedded model's package, as install.sh has them."""
    out = subprocess.run(["bash", str(REPO / "install.sh"), "--print-specs"], check=True,
                         capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def runtime_requirements() -> list:
    reqs = []
    for line in (REPO / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        name = re.split(r"[<>=!~;\[ ]", line, maxsplit=1)[0]
        if line and name.lower() not in BUILD_ONLY:
            reqs.append(line)
    return reqs


def tested_versions() -> str:
    """The versions installed where this build runs (the checkout's venv, which the tests used):
    constraints, so the artifact carries what was tested rather than what resolves today."""
    out = subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
                         capture_output=True, text=True).stdout
    return "".join(line + "\n" for line in out.splitlines() if re.fullmatch(r"[A-Za-z0-9_.\-]+==[^\s;@]+", line))


def source_files() -> list:
    files = []
    for top in SOURCES:
        for folder, dirs, names in os.walk(REPO / top):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(names):
                rel = (Path(folder) / name).relative_to(REPO).as_posix()
                if rel not in DEV_ONLY and not name.endswith((".pyc", ".pyo")):
                    files.append(rel)
    return files


def build_key(parts: list, files: list) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() + b"\0")
    for rel in files:
        digest.update(rel.encode() + b"\0" + (REPO / rel).read_bytes() + b"\0")
    return digest.hexdigest()


def install_packages(python: Path, specs: dict, constraints: Path) -> None:
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "-q"]
    env = interpreter.python_env()
    log.info("installing %s and the runtime packages into the bundled interpreter", specs["mlx"])
    # --no-compile: precompile.py writes the byte-code of what the server imports, not of everything.
    install = [*pip, "install", "--no-warn-script-location", "--no-compile"]
    subprocess.run([*install, "-c", str(constraints), specs["mlx"], *runtime_requirements()], check=True, env=env)
    # --no-deps as install.sh does: the package's own dependency is a CLI we do not use.
    subprocess.run([*install, "--no-deps", specs["model"]], check=True, env=env)
    # The installers go unless an installed package asks for one at run time.
    found = subprocess.run([str(python), "-c", (
        "import importlib.metadata as m, re\n"
        "names = {d.metadata['Name'].lower() for d in m.distributions()}\n"
        "needed = {re.split(r'[^A-Za-z0-9_.-]', r, maxsplit=1)[0].lower()"
        " for d in m.distributions() for r in (d.requires or []) if 'extra ==' not in r}\n"
        f"print(' '.join(p for p in {RUNTIME_UNNEEDED!r} if p in names and p not in needed))")],
        check=True, capture_output=True, text=True, env=env).stdout.split()
    if found:
        subprocess.run([*pip, "uninstall", "-y", *found], check=True, env=env)


def copy_sources(files: list, tree: Path) -> None:
    for rel in files:
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, tree / rel)
    shutil.copy2(REPO / "bundle" / "run.sh", tree / "run.sh")
    (tree / "run.sh").chmod(0o755)


@contextlib.contextmanager
def step(what: str):
    started = time.monotonic()
    yield
    log.info("%s: %.0f s", what, time.monotonic() - started)


def size_of(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum((Path(d) / f).lstat().st_size for d, _, names in os.walk(path) for f in names)


def build(out: Path, name: str, image: str, version: str, python_dist: str, force: bool,
          layer_cache: str = "") -> Path:
    missing = [s for s in STUBS if not (REPO / s).exists()]
    if missing:
        raise SystemExit(f"{', '.join(missing)} missing: run `make install` first (it generates the gRPC stubs)")
    flavour = flavour_of_this_build()
    name = name or gallery.FLAVOURS[flavour].name
    if "/" in name or name.startswith("."):
        raise SystemExit(f"--name {name!r} must be a plain folder name")
    gallery.check_image(image)
    specs, constraints, files = install_specs(), tested_versions(), source_files()
    dist_id = hashlib.sha256(Path(python_dist).read_bytes()).hexdigest() if python_dist else sys.version
    interpreter_parts = [flavour, *specs.values(), dist_id, sys.base_prefix, constraints]
    build_files = ["requirements.txt", "install.sh", *(f"bundle/{f}" for f in sorted(
        os.listdir(REPO / "bundle")) if f.endswith((".py", ".sh")))]
    key = build_key([name, image, version, *interpreter_parts], files + build_files)
    layer_key = build_key(interpreter_parts, build_files)
    out.mkdir(parents=True, exist_ok=True)
    tree, tar, stamp = out / name, out / f"{name}.tar", out / f"{name}.key"
    with open(out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build of a folder at a time
        current = stamp.exists() and stamp.read_text() == key and (tree / "run.sh").exists() and tar.exists()
        if current and not force:
            log.info("%s is up to date (same sources, packages and interpreter)", tree)
        else:
            stamp.unlink(missing_ok=True)
            staging = (out / f".{name}.building").resolve()
            shutil.rmtree(staging, ignore_errors=True)
            lay_out_tree(staging, specs, constraints, files, python_dist, layer_cache, layer_key)
            store.publish(staging, tree)
            with step("docker-archive written"):
                docker_archive.write(tree, tar, repo_tag=gallery.archive_tag(image, version, gallery.FLAVOURS[flavour]))
            stamp.write_text(key)
        gallery.write(out / "index.yaml", image, version, [flavour], tar.resolve())
    log.info("%s: %s/ %.0f MB, %s %.0f MB, gallery %s", name, tree, size_of(tree) / 1e6, tar,
             size_of(tar) / 1e6, out / "index.yaml")
    return tree


def lay_out_tree(staging: Path, specs: dict, constraints: str, files: list, python_dist: str,
                 layer_cache: str, layer_key: str) -> None:
    log.info("laying out %s (interpreter: %s)", staging, python_dist or f"this machine's {sys.base_prefix}")
    forbidden = [str(staging), "" if python_dist else sys.base_prefix]

    def interpreter_layer(dest: Path) -> None:
        with step("interpreter laid out"):
            python = interpreter.lay_out(dest, python_dist)
        constraints_file = staging.with_name(staging.name + ".constraints.txt")
        constraints_file.write_text(constraints)
        try:
            with step("packages installed"):
                install_packages(python, specs, constraints_file)
        finally:
            constraints_file.unlink()
        interpreter.prune(dest)
        relocate.rewrite_shebangs(dest / "bin", str(staging))
        found = relocate.problems(dest, forbidden)  # before the layer is stored for later builds
        if found:
            raise SystemExit("the interpreter would not survive a move:\n  " + "\n  ".join(found[:20]))

    with step("interpreter and packages ready"):
        if layer_cache_module.provide(layer_cache, layer_key, staging / "python", interpreter_layer):
            log.info("interpreter and packages copied from %s (same packages, interpreter and build scripts)",
                     layer_cache)
    python = staging / "python" / "bin" / "python3"
    copy_sources(files, staging)
    with step("byte-code of what the server imports written"):
        failed = precompile.warm(python, staging, [staging / f for f in files if f.endswith(".py")],
                                 interpreter.python_env())
    if failed:
        log.info("not importable at build time (compiled when first used): %s", ", ".join(failed))
    found = relocate.problems(staging, forbidden)
    if found:
        raise SystemExit("the tree would not survive a move:\n  " + "\n  ".join(found[:20]))


def main(argv=None) -> None:
    logging.basicConfig(level=logging.INFO, format="[package] %(message)s", stream=sys.stderr)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "dist"), help="output folder (default: dist)")
    parser.add_argument("--name", default="", help="the backend's name (default: this platform's gallery entry)")
    parser.add_argument("--image", default="", help="the registry's image prefix in the gallery (quay.io/, ghcr.io/, "
                        "docker.io/ or oci://...; default: none, the gallery installs the tar built here, ocifile://)")
    parser.add_argument("--version", default="latest", help="image tag prefix and gallery version")
    parser.add_argument("--python-dist", default=os.environ.get("PYTHON_DIST", ""),
                        help="a python-build-standalone install_only .tar.gz (default: copy this interpreter)")
    parser.add_argument("--force", action="store_true", help="rebuild even when the output is up to date")
    parser.add_argument("--layer-cache", default=layer_cache_module.default_root(),
                        help="where the interpreter with its packages is kept between builds "
                             "(default: %(default)s; '' keeps none)")
    args = parser.parse_args(argv)
    tree = build(Path(args.out), args.name, args.image, args.version, args.python_dist, args.force,
                 args.layer_cache)
    sys.stdout.write(f"{tree.resolve()}\n")  # the one line of output: where the tree is


if __name__ == "__main__":
    main()
