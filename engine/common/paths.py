"""Where Sapling keeps things on disk, from platformdirs (docs/architecture.md).

`Paths.default()` gives the per-user folders; `Paths.under(root)` puts all four
under one folder, which is what `--home` and the tests use.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

APP_NAME = "sapling"
HOME_ENV = "SAPLING_HOME"
# Written into every Hugging Face export (run, round, version): the mark of a folder an export may replace.
EXPORT_MARKER = "sapling-export.json"


def nearest_existing(path: Path) -> Path:
    """`path`, or its nearest parent that exists (the root at worst): where a missing folder would be made."""
    path = Path(path)
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


@dataclass(frozen=True)
class Paths:
    config_dir: Path
    data_dir: Path
    cache_dir: Path
    log_dir: Path

    @classmethod
    def default(cls) -> Paths:
        """Per-user platform folders, or all under $SAPLING_HOME when it is set."""
        home = os.environ.get(HOME_ENV)
        if home:
            return cls.under(Path(home))
        import platformdirs

        dirs = platformdirs.PlatformDirs(APP_NAME, appauthor=False)
        return cls(
            config_dir=Path(dirs.user_config_dir),
            data_dir=Path(dirs.user_data_dir),
            cache_dir=Path(dirs.user_cache_dir),
            log_dir=Path(dirs.user_log_dir),
        )

    @classmethod
    def under(cls, root: Path) -> Paths:
        root = Path(root).expanduser()
        return cls(root / "config", root / "data", root / "cache", root / "logs")

    def problem(self) -> str | None:
        """One sentence when a folder cannot be made or written (a file is in the way, no permission), else None.

        Nothing is created: commands that only read (`identity show`, `stats`) make no folders.
        """
        for folder in (self.config_dir, self.data_dir, self.cache_dir, self.log_dir):
            existing = nearest_existing(folder)
            if not existing.is_dir():
                return f"{existing} is a file, so the folder {folder} cannot be made there; give another folder."
            if not os.access(existing, os.W_OK | os.X_OK):
                return f"Sapling cannot write in {existing} (no permission); give a folder that you can write in."
        return None

    @property
    def config_file(self) -> Path:
        return self.config_dir / "config.toml"

    @property
    def metrics_file(self) -> Path:
        return self.data_dir / "metrics.jsonl"

    @property
    def models_cache(self) -> Path:
        return self.cache_dir / "models"

    @property
    def identity_file(self) -> Path:
        return self.data_dir / "identity.key"

    def checkpoints(self, run: str) -> Path:
        return self.data_dir / "checkpoints" / run
