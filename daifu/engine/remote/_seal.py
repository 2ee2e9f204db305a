"""Messages only the job's user can write or read, through a store others can reach.

A distributed job's ranks on other nodes are reached through the job's own
store (torchrun's TCPStore, ``_jobstore``), which any user who can reach its
port may read and write.  What daifu puts there is *sealed* with a key only
this user has: encrypted (a keystream of HMAC-SHA256 blocks in counter mode)
and then authenticated (HMAC-SHA256 over everything, the message's place
included), so another user can neither read a command or its answer nor
forge, alter, move or replay one.  Only the standard library is used.

The key: ``DAIFU_JOB_KEY_FILE`` if set, else ``~/.config/daifu/job.key``
(``$XDG_CONFIG_HOME``), created on first use -- 32 random bytes, mode 0600 in
a 0700 directory.  On a cluster whose home directories are shared (the usual
set-up) every node reads the same file; elsewhere point
``DAIFU_JOB_KEY_FILE`` at a file every node of the job can read.  A key file
that others can read or write is refused.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import stat

KEY_ENV = "DAIFU_JOB_KEY_FILE"
_KEY_BYTES = 32
_BLOCK = hashlib.sha256().digest_size


class SealError(Exception):
    """A key that cannot be had, or a message that is not sealed with it."""


def key_path() -> str:
    explicit = os.environ.get(KEY_ENV)
    if explicit:
        return explicit
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"),
                                                                 ".config")
    return os.path.join(config, "daifu", "job.key")


def load_key(create: bool = True) -> bytes:
    """This user's key (made when ``create`` and there is none yet; never
    when ``DAIFU_JOB_KEY_FILE`` names it).  Raises ``SealError`` saying why not."""
    path = key_path()
    try:
        return _read(path)
    except FileNotFoundError:
        if not create or os.environ.get(KEY_ENV):
            raise SealError(f"no daifu key at {path}") from None
    _make(path)
    try:
        return _read(path)
    except FileNotFoundError:
        raise SealError(f"no daifu key at {path}") from None


def _read(path: str) -> bytes:
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise SealError(f"cannot read the daifu key {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise SealError(f"refusing the daifu key {path}: it must be a regular file of "
                            f"yours that nobody else can read or write (chmod 600 {path})")
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    key = data.strip()
    if len(key) < 16:
        raise SealError(f"the daifu key {path} is too short ({len(key)} bytes; 32 random "
                        "bytes are made when there is no file)")
    return key


def _make(path: str) -> None:
    """Create the key file atomically: a private temporary file, then a hard
    link to the name (so that two ranks starting at once agree on one key)."""
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, 0o700, exist_ok=True)
        st = os.lstat(directory)
        if stat.S_ISLNK(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
            raise SealError(f"refusing to make the daifu key in {directory}: it is not a "
                            "directory only you can write")
        tmp = os.path.join(directory, f".job.key.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, base64.b64encode(os.urandom(_KEY_BYTES)) + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process made it first: theirs it is
        finally:
            os.unlink(tmp)
    except OSError as exc:
        raise SealError(f"cannot make the daifu key {path}: {exc.strerror or exc}") from None


def _subkey(key: bytes, use: str) -> bytes:
    return hmac.new(key, f"daifu {use}".encode(), hashlib.sha256).digest()


def _keystream(key: bytes, nonce: bytes, size: int) -> bytes:
    enc = _subkey(key, "encryption")
    blocks = (size + _BLOCK - 1) // _BLOCK
    return b"".join(hmac.new(enc, nonce + i.to_bytes(8, "big"), hashlib.sha256).digest()
                    for i in range(blocks))[:size]


def _xor(data: bytes, stream: bytes) -> bytes:
    return (int.from_bytes(data, "big") ^ int.from_bytes(stream, "big")).to_bytes(len(data),
                                                                                  "big")


def seal(key: bytes, place: str, payload: dict) -> str:
    """``payload`` (JSON-able) sealed for ``place`` (where it is written: a
    message opened anywhere else is refused)."""
    nonce = os.urandom(16)
    plain = json.dumps(payload).encode()
    cipher = _xor(plain, _keystream(key, nonce, len(plain)))
    mac = hmac.new(_subkey(key, "authentication"), place.encode() + b"\0" + nonce + cipher,
                   hashlib.sha256).hexdigest()
    return json.dumps({"v": 1, "n": nonce.hex(), "c": base64.b64encode(cipher).decode(),
                       "m": mac})


def unseal(key: bytes, place: str, text: str | bytes) -> dict:
    """The payload of a message sealed with ``key`` for ``place``; raises
    ``SealError`` for anything else (forged, altered, moved, another key)."""
    try:
        outer = json.loads(text)
        nonce, cipher, mac = bytes.fromhex(outer["n"]), base64.b64decode(outer["c"]), outer["m"]
    except (ValueError, KeyError, TypeError):
        raise SealError("not a sealed daifu message") from None
    want = hmac.new(_subkey(key, "authentication"), place.encode() + b"\0" + nonce + cipher,
                    hashlib.sha256).hexdigest()
    if not isinstance(mac, str) or not hmac.compare_digest(mac, want):
        raise SealError("not sealed with this key (or altered)")
    plain = _xor(cipher, _keystream(key, nonce, len(cipher)))
    payload = json.loads(plain)
    if not isinstance(payload, dict):
        raise SealError("not a sealed daifu message")
    return payload


def fingerprint(key: bytes, job: str) -> str:
    """What the ranks publish to find out whether they hold the same key
    (reveals nothing of it)."""
    return hmac.new(_subkey(key, "fingerprint"), job.encode(), hashlib.sha256).hexdigest()[:32]
