"""Install what the benchmark needs when it is missing, and report what could not be had."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

from .procs import log

# Debian package -> the command it provides
APT = {"rclone": "rclone", "s3fs": "s3fs", "fuse-zip": "fuse-zip", "zip": "zip", "fuse3": "fusermount3"}
# PyPI requirement -> importable module (or console script, prefixed with "bin:")
PIP = {"ratarmount": "bin:ratarmount", "tensorstore": "tensorstore", "moto[server]": "moto.server",
       "zarr>=3": "zarr", "zarrs": "zarrs"}


def _have_module(name: str) -> bool:
    if name.startswith("bin:"):
        return shutil.which(name[4:]) is not None
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def importable(module: str) -> bool:
    """Whether ``module`` imports in this interpreter (a peer library is there and works)."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def _apt_candidate(pkg: str) -> bool:
    r = subprocess.run(["apt-cache", "policy", pkg], capture_output=True, text=True)
    for line in r.stdout.splitlines():
        line = line.strip()
        if line.startswith("Candidate:"):
            return line.split(":", 1)[1].strip() not in ("", "(none)")
    return False


def _pip_available(req: str) -> bool:
    name = req.split("[")[0].split(">")[0].split("=")[0]
    r = subprocess.run([sys.executable, "-m", "pip", "index", "versions", name],
                       capture_output=True, text=True)
    return r.returncode == 0 and "Available versions" in r.stdout


def ensure(install: bool = True) -> dict[str, str]:
    """Make sure the peers are installed. Returns {package: problem} for what is still missing.

    Exits 1 (printing the command to run) when Debian packages are missing and we are not root.
    """
    missing: dict[str, str] = {}
    apt_missing = [p for p, cmd in APT.items() if shutil.which(cmd) is None]
    if apt_missing:
        if not install:
            missing.update({p: "not installed (--no-install)" for p in apt_missing})
        elif os.geteuid() != 0:
            print("scripts/bench needs these Debian packages; run:\n"
                  f"  sudo apt-get update && sudo apt-get install -y {' '.join(apt_missing)}",
                  file=sys.stderr)
            sys.exit(1)
        else:
            available = [p for p in apt_missing if _apt_candidate(p)]
            if len(available) < len(apt_missing):
                subprocess.run(["apt-get", "update"], check=False, stdout=subprocess.DEVNULL)
                available = [p for p in apt_missing if _apt_candidate(p)]
            for p in apt_missing:
                if p not in available:
                    missing[p] = "no installation candidate in apt (apt-cache policy)"
            if available:
                log(f"apt-get install -y {' '.join(available)}")
                env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
                r = subprocess.run(["apt-get", "install", "-y", *available], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                if r.returncode != 0:
                    log(f"apt-get failed: {r.stderr.strip()[-500:]}")
            for p in available:
                if shutil.which(APT[p]) is None:
                    missing[p] = "apt-get install failed"
    pip_missing = [req for req, mod in PIP.items() if not _have_module(mod)]
    if pip_missing:
        if not install:
            missing.update({p: "not installed (--no-install)" for p in pip_missing})
        else:
            available = [r for r in pip_missing if _pip_available(r)]
            for r in pip_missing:
                if r not in available:
                    missing[r] = "not found on the package index (pip index versions)"
            if available:
                log(f"pip install {' '.join(available)}")
                r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", *available],
                                   capture_output=True, text=True)
                if r.returncode != 0:
                    log(f"pip install failed: {r.stderr.strip()[-500:]}")
                importlib.invalidate_caches()
            for r in available:
                if not _have_module(PIP[r]):
                    missing[r] = "pip install failed"
    for p, why in missing.items():
        log(f"peer unavailable: {p}: {why}")
    return missing


def versions() -> dict[str, str]:
    """Versions of every tool in the run, for the machine description."""
    out: dict[str, str] = {}

    def cmd(name: str, argv: list[str], pick=lambda s: s.splitlines()[0] if s else "?") -> None:
        if shutil.which(argv[0]) is None:
            return
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            out[name] = pick((r.stdout or r.stderr).strip())
        except Exception:  # noqa: BLE001
            out[name] = "?"

    cmd("rclone", ["rclone", "version"])
    cmd("s3fs", ["s3fs", "--version"])
    for pkg in ("rclone", "s3fs", "fuse-zip", "fuse3", "zip"):
        cmd(f"{pkg} (Debian package)", ["dpkg-query", "-W", "-f", "${Version}", pkg])
    for dist in ("zvfs", "ratarmount", "tensorstore", "zarr", "zarrs", "numcodecs", "moto",
                 "pyfuse3", "boto3", "numpy"):
        try:
            from importlib.metadata import version
            out[dist] = version(dist)
        except Exception:  # noqa: BLE001
            pass
    return out


def pip_install(reqs: list[str]) -> None:
    log(f"pip install {' '.join(reqs)}")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", *reqs], check=False)


def compile_zvfs(package: Path) -> None:
    """zvfs's bytecode, as pip writes it for a regular install (not for an editable one):
    without it, with PYTHONDONTWRITEBYTECODE set or a read-only checkout, every mount would
    compile the package from source first, and the mount-time rows would time the compiler."""
    import compileall

    compileall.compile_dir(str(package), quiet=1)
