"""A report written as one JSON file in its output dir: its text, `write`, `read`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar, TypeVar

from pydantic import BaseModel


R = TypeVar("R", bound="JsonFile")


class JsonFile(BaseModel):
    """A pydantic report stored as `FILE` (`json.dumps(..., indent=2)` of the plain data)."""

    FILE: ClassVar[str]

    def to_json(self) -> str:
        return json.dumps(self.model_dump(), indent=2)

    def write(self, out_dir: Path) -> Path:
        """Write `out_dir`/`FILE`; its path."""
        path = Path(out_dir) / self.FILE
        path.write_text(self.to_json())
        return path

    @classmethod
    def read(cls: type[R], path: Path) -> R:
        """The file (or the directory holding it) as written by `write`; a
        `pydantic.ValidationError` (a ValueError) names what does not fit."""
        path = Path(path)
        if path.is_dir():
            path = path / cls.FILE
        return cls.model_validate_json(path.read_text())
