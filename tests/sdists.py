"""The test suites of third-party packages whose wheels ship none.

``more-itertools`` and ``attrs`` keep their tests in the source distribution
only; the soak (tests/test_soak.py) runs them against the installed package
(the pinned version of pyproject.toml's ``test`` extra).  ``unpacked(name)``
gives the unpacked sdist: the first call downloads it with pip (from PyPI, the
pinned version, its sha256 checked) into ``.cache/sdists/`` at the repository's
root (ignored by git) and unpacks it there; later calls reuse it.  Offline, put
the ``.tar.gz`` in that folder by hand: it is checked and unpacked the same way.

``python -m tests.sdists`` fetches them all (``make soak-sources``).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "sdists"

# name: (version, sha256 of the sdist, its file name); the versions are those
# pinned in pyproject.toml's test extra (the tests must match the package)
SDISTS = {
    "more-itertools": ("11.2.1",
                       "cbf08fd0af284dc69718b9b76a8e6203df624d70209ea511e4219d350c856f63",
                       "more_itertools-11.2.1.tar.gz"),
    "attrs": ("26.1.0",
              "d03ceb89cb322a8fd706d4fb91940737b6642aa36998fe130a9bc96c985eff32",
              "attrs-26.1.0.tar.gz"),
}


class SdistError(RuntimeError):
    """The sdist could not be had; the message says what to do."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _how_to(name: str) -> str:
    version, sha, filename = SDISTS[name]
    return (f"To fetch it by hand: `{Path(sys.executable).name} -m pip download --no-binary :all: "
            f"--no-deps {name}=={version} -d {CACHE}` (or copy {filename}, sha256 {sha}, into "
            f"{CACHE}), then run the test again.")


def _download(name: str) -> Path:
    version, sha, filename = SDISTS[name]
    CACHE.mkdir(parents=True, exist_ok=True)
    tarball = CACHE / filename
    if tarball.exists() and _sha256(tarball) == sha:
        return tarball
    tarball.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text(f"{name}=={version} --hash=sha256:{sha}\n")
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                 "--require-hashes", "--disable-pip-version-check", "-r", str(requirements),
                 "-d", tmp],
                capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SdistError(f"pip download of {name}=={version} did not finish: {exc}. "
                             + _how_to(name)) from None
        got = Path(tmp) / filename
        if proc.returncode != 0 or not got.exists():
            raise SdistError(
                f"pip could not download the sdist of {name}=={version} (no access to PyPI?); "
                f"pip said:\n{(proc.stdout + proc.stderr)[-2000:]}\n" + _how_to(name))
        if _sha256(got) != sha:  # (pip checked it too)
            raise SdistError(f"{got.name}: sha256 is not {sha}. " + _how_to(name))
        got.replace(tarball)
    return tarball


def unpacked(name: str) -> Path:
    """The unpacked sdist of ``name`` (it has ``tests/``); raises SdistError."""
    version, sha, filename = SDISTS[name]
    try:
        installed = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        installed = None
    if installed != version:
        raise SdistError(f"{name}=={version} is not installed here (found {installed}): "
                         "`make setup` (or `pip install -e '.[test]'`) installs the test extra")
    folder = CACHE / filename.removesuffix(".tar.gz")
    if (folder / ".complete").exists():
        return folder
    tarball = _download(name)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp, tarfile.open(tarball) as tar:
        tar.extractall(tmp, filter="data")
        top = Path(tmp) / folder.name
        if not (top / "tests").is_dir():
            raise SdistError(f"{tarball} has no {folder.name}/tests/. " + _how_to(name))
        (top / ".complete").write_text(sha + "\n")
        shutil.rmtree(folder, ignore_errors=True)
        top.replace(folder)
    return folder


if __name__ == "__main__":
    for package in SDISTS:
        print(unpacked(package))
