"""Pack an experiment folder's records into one archive, and read them back (engine/experiment/records.py).

    python -m bench.records pack DIR ...     # DIR/records.tar.xz; report.md and run-*.sh stay; again: nothing to do
    python -m bench.records path DIR ...     # the folder DIR's records can be read in (unpacked once into the cache)
    python -m bench.records unpack DIR ...   # the records back as loose files in DIR (to resume it); pack again after

The benches that read experiment folders (bench.experiment_report, selection_bound, score_shares, probe_replay,
curriculum_replay) take a packed folder as it is; `path` is for everything else (a shell glob inside a run, jq).
"""

from __future__ import annotations

import sys
from pathlib import Path

from engine.experiment.records import experiment_folder, pack, unpack

USAGE = "usage: python -m bench.records pack|path|unpack DIR ..."


def _pack(folder: str) -> str:
    archive = pack(Path(folder))
    if archive is None:
        return f"{folder}: already packed, nothing to do"
    return f"{folder}: wrote {archive} ({archive.stat().st_size:,} bytes)"


def _path(folder: str) -> str:
    return str(experiment_folder(Path(folder)))


def _unpack(folder: str) -> str:
    archive = unpack(Path(folder))
    return f"{folder}: the records are loose again ({archive.name} removed; pack before committing)"


COMMANDS = {"pack": _pack, "path": _path, "unpack": _unpack}


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] not in COMMANDS:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        for folder in args[1:]:
            print(COMMANDS[args[0]](folder))
    except (ValueError, OSError) as exc:
        print(f"records: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
