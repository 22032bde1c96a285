"""The artifact's own Python, in `<tree>/python`: never the host's.

Two sources:
- a python-build-standalone `install_only` archive (`PYTHON_DIST`): relocatable by design,
  runs on any Linux of its architecture with glibc 2.17 or newer (or any macOS 11+ for a
  darwin build); what a release build uses;
- else the interpreter this build runs on, copied: its binary, its shared libpython and its
  standard library, without the host's site-packages; the copy looks for libpython next to
  itself (`$ORIGIN`) instead of the host prefix. It needs the same system libraries as the
  build machine (libc, OpenSSL, libffi, ...): it runs on hosts of the build machine's kind.
"""

import fnmatch
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

import elf

log = logging.getLogger("bundle")

# Parts of a standard library that no server imports: test packages (at any depth), GUIs,
# the static library and build configuration, C test modules; pip's bootstrap once used.
PRUNED_NAMES = ("test", "tests", "idlelib", "tkinter", "turtledemo", "config-3.*", "ensurepip",
                "_test*.so", "_tkinter*.so", "xxlimited*.so", "__phello__")


def python_version_dir(prefix: Path) -> Path:
    """lib/python3.X of an install prefix."""
    found = sorted(p for p in (prefix / "lib").glob("python3.*") if (p / "os.py").exists())
    if not found:
        raise SystemExit(f"no standard library under {prefix / 'lib'}")
    return found[-1]


def from_dist(archive: Path, dest: Path) -> Path:
    """Unpack a python-build-standalone install_only archive (one top folder `python/`)."""
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        if not names or any(n.split("/")[0] != "python" for n in names):
            raise SystemExit(f"{archive}: not a python-build-standalone install_only archive "
                             "(its entries must all sit under python/)")
        tar.extractall(dest.parent, filter="tar" if hasattr(tarfile, "tar_filter") else None)
    return dest


def from_host(dest: Path) -> Path:
    """Copy the interpreter running this build (for a venv: the one it was made from)."""
    if sys.platform == "darwin":
        raise SystemExit("on macOS give PYTHON_DIST=<python-build-standalone install_only .tar.gz>: "
                         "a copied framework Python is not relocatable")
    prefix = Path(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    binary = Path(sys.base_prefix) / "bin" / version
    if not binary.exists():
        binary = Path(os.path.realpath(sys.executable))
    (dest / "bin").mkdir(parents=True)
    (dest / "lib").mkdir()
    shutil.copy2(binary, dest / "bin" / version)
    for alias in ("python3", "python"):
        os.symlink(version, dest / "bin" / alias)
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        libdir = Path(sysconfig.get_config_var("LIBDIR"))
        soname = sysconfig.get_config_var("INSTSONAME") or sysconfig.get_config_var("LDLIBRARY")
        shutil.copy2(libdir / soname, dest / "lib" / soname)
    # Not the host's own packages: only what this build installs will be there. A distribution's
    # EXTERNALLY-MANAGED marker speaks for the host's Python, not for this copy of it.
    keep_ensurepip = [n for n in PRUNED_NAMES if n != "ensurepip"]
    shutil.copytree(prefix / "lib" / version, dest / "lib" / version, symlinks=True,
                    ignore=shutil.ignore_patterns("site-packages", "EXTERNALLY-MANAGED", *keep_ensurepip))
    (dest / "lib" / version / "site-packages").mkdir()
    point_at_bundled_libs(dest, str(prefix))
    return dest


def point_at_bundled_libs(root: Path, host_prefix: str) -> None:
    """Every ELF file under `root` linked to the host prefix looks in root/lib instead."""
    lib = root / "lib"
    for folder, _dirs, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            if path.is_symlink() or not elf.is_elf64(path):
                continue
            rel = os.path.relpath(lib, folder)
            if elf.replace_search_path(path, host_prefix, "$ORIGIN" if rel == "." else f"$ORIGIN/{rel}"):
                log.debug("search path of %s now relative", path.relative_to(root))


def prune(root: Path) -> None:
    """Drop PRUNED_NAMES from the standard library, the installed packages' own test folders,
    and the build-only scripts from bin/."""
    stdlib = python_version_dir(root)
    site = stdlib / "site-packages"
    for folder, dirs, files in os.walk(stdlib):
        inside_site = Path(folder).is_relative_to(site)
        for name in [*dirs, *([] if inside_site else files)]:
            patterns = ("test", "tests") if inside_site else PRUNED_NAMES
            if not any(fnmatch.fnmatch(name, p) for p in patterns):
                continue
            target = Path(folder) / name
            if name in dirs:
                dirs.remove(name)
                if not target.is_symlink():
                    shutil.rmtree(target)
                    continue
            target.unlink()
    for script in (root / "bin").glob("*-config"):
        script.unlink()


def python_env() -> dict:
    """The environment for the bundled interpreter: none of the host's Python settings."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONNOUSERSITE"] = "1"
    env["PIP_ROOT_USER_ACTION"] = "ignore"  # a build as root installs into its own tree, not the system's
    return env


def bootstrap_pip(python: Path) -> None:
    """pip from the standard library's own wheel (ensurepip: no download)."""
    probe = subprocess.run([str(python), "-m", "pip", "--version"], capture_output=True, env=python_env())
    if probe.returncode != 0:
        # Quiet unless it fails: ensurepip drops the PIP_* settings, so pip's root warning comes back.
        done = subprocess.run([str(python), "-m", "ensurepip", "--default-pip"], capture_output=True, text=True,
                              env=python_env())
        if done.returncode != 0:
            raise SystemExit(f"ensurepip failed in the bundled interpreter:\n{done.stdout}{done.stderr}")


def lay_out(dest: Path, dist_archive: str = "") -> Path:
    """`dest` (the tree's python/ folder) holding a working interpreter with pip; its binary."""
    if dist_archive:
        from_dist(Path(dist_archive), dest)
    else:
        from_host(dest)
    python = dest / "bin" / "python3"
    bootstrap_pip(python)
    return python
