"""The embedded object store: a local directory, for one machine and for tests.

Each object is a file under ``root`` at its key's path. A write goes to a temporary file
in the same directory, then ``os.replace`` puts it in place, so a reader (or a crash)
never sees half an object; the same bytes written twice (a rerun) leave one file. A key
is a relative path of plain segments: ``..``, an absolute path or an empty segment is
refused, so no key reaches outside ``root``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from pyrula_stream.errors import ConfigurationError
from pyrula_stream.objects.store import ObjectInfo

TEMP_SUFFIX = ".part"
"""A write in progress (or one a crash cut short): never listed as an object."""


class LocalObjectStore:
    """``ObjectStore`` on a directory (made, 0700, if missing)."""

    def __init__(self, root: str | Path, *, name: str = "local") -> None:
        self.root = Path(root).resolve()
        self._name = name
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)

    @property
    def name(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return f"LocalObjectStore({str(self.root)!r})"

    def path(self, key: str) -> Path:
        """Where ``key`` lives; ``ConfigurationError`` for a key that could leave ``root``."""
        parts = key.split("/")
        if (
            not key
            or key.startswith("/")
            or "\\" in key
            or "\0" in key
            or any(p in ("", ".", "..") for p in parts)
            or key.endswith(TEMP_SUFFIX)
        ):
            raise ConfigurationError(f"object key {key!r} is not a plain relative path")
        return self.root.joinpath(*parts)

    def put(self, key: str, data: bytes, content_type: str) -> None:
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=TEMP_SUFFIX)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def get(self, key: str) -> bytes:
        try:
            return self.path(key).read_bytes()
        except FileNotFoundError:
            raise KeyError(key) from None

    def exists(self, key: str) -> bool:
        return self.path(key).is_file()

    def delete(self, key: str) -> None:
        self.path(key).unlink(missing_ok=True)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        for dirpath, _, files in os.walk(self.root):
            for file in files:
                if file.endswith(TEMP_SUFFIX):
                    continue
                full = Path(dirpath, file)
                key = full.relative_to(self.root).as_posix()
                if not key.startswith(prefix):
                    continue
                try:
                    st = full.stat()
                except FileNotFoundError:  # swept meanwhile
                    continue
                yield ObjectInfo(key, st.st_size, int(st.st_mtime * 1000))
