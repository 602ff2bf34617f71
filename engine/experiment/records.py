"""An experiment's records packed into one archive, and read back as a folder.

A finished experiment folder (docs/dev-log/runs/NAME) keeps report.md and its
run-*.sh scripts as they are and everything else (experiment.json, the mixes'
rounds.jsonl, evals.jsonl, node-K/metrics.jsonl, logs, report.json) in
records.tar.xz. The report's own plots (reward.png, reward-hours.png) are not
kept: `python -m bench.experiment_report DIR` draws them again from the records,
and report.md says so where it linked them.

`experiment_folder` gives the readers (engine/experiment/report.py, the
benches) a folder they can read either way: a plain experiment folder as it
is, a packed one unpacked once into the cache (`Paths.default().cache_dir /
"records" / <sha256 of the archive>`). The unpacking goes into a temporary
folder renamed into place, so two readers at once and a crash half-way leave
either nothing or the whole folder. Archive members with absolute paths, `..`
or links are refused.

`pack` writes the archive deterministically (members sorted by name, mtime 0,
owner 0, mode 0644, xz preset 6), so packing the same records again gives the
same bytes; `python -m bench.records pack DIR` is the command.
"""

from __future__ import annotations

import contextlib
import fnmatch
import gzip
import io
import lzma
import os
import re
import shlex
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import Mapping
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from engine.common.atomicio import atomic_write_bytes, atomic_write_text
from engine.common.model_policy import file_sha256
from engine.common.paths import Paths
from engine.experiment.plan import PLAN_FILE

ARCHIVE = "records.tar.xz"
ARCHIVES = (ARCHIVE, "records.tar.gz")  # what a folder may hold; `pack` writes the first
ARCHIVE_SUFFIXES = (".tar.xz", ".tar.gz", ".tgz", ".tar")
REPORT = "report.md"
SCRIPTS = "run-*.sh"  # the exact commands, kept beside the report
REPORT_PLOTS = ("reward.png", "reward-hours.png")  # write_report draws them from the records
XZ_PRESET = 6
FILE_MODE = 0o644
DAMAGE = (tarfile.TarError, lzma.LZMAError, zlib.error, EOFError, gzip.BadGzipFile)
IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")
PLOT_NAMES = "|".join(re.escape(name) for name in REPORT_PLOTS)
PLOTS_RUN = re.compile(rf"!\[[^\]]*\]\((?:{PLOT_NAMES})\)(?:\s*!\[[^\]]*\]\((?:{PLOT_NAMES})\))*")


def archive_in(folder: Path) -> Path | None:
    """The records archive `folder` holds, or None."""
    return next((folder / name for name in ARCHIVES if (folder / name).is_file()), None)


def default_cache() -> Path:
    """Where packed records are unpacked to be read."""
    return Paths.default().cache_dir / "records"


def experiment_folder(path: Path, cache: Path | None = None) -> Path:
    """A folder the experiment readers can read, for an experiment folder, a folder holding records.tar.xz, or the
    archive itself: the folder as it is when it is not packed, else the archive unpacked once into `cache`."""
    path = Path(path)
    if path.is_file() and path.name.endswith(ARCHIVE_SUFFIXES):
        return _unpacked(path, cache or default_cache())
    archive = archive_in(path) if path.is_dir() else None
    if archive is None:
        return path
    if (path / PLAN_FILE).exists():
        raise ValueError(f"{path} holds both loose records and {archive.name}; `python -m bench.records pack {path}` "
                         "folds them into one archive.")
    return _unpacked(archive, cache or default_cache())


def record_path(path: Path, cache: Path | None = None) -> Path:
    """`path`, or the same path inside its packed experiment once unpacked (DIR/mix-8-0 of a packed DIR)."""
    path = Path(path)
    if path.exists():
        return experiment_folder(path, cache) if path.is_dir() else path
    for parent in path.parents:
        if parent.is_dir() and archive_in(parent) is not None:
            return experiment_folder(parent, cache) / path.relative_to(parent)
    return path


def named_back(value: Any, names: Mapping[Path, Path]) -> Any:
    """`value` (JSON-like) with every path under a readable folder (a key of `names`) written under the folder the
    user named instead (its value), so output reads the same whether the records were packed or not."""
    if isinstance(value, dict):
        return {key: named_back(item, names) for key, item in value.items()}
    if isinstance(value, list):
        return [named_back(item, names) for item in value]
    if not isinstance(value, str):
        return value
    for readable, given in names.items():
        if readable != given and (value == str(readable) or value.startswith(f"{readable}{os.sep}")):
            return str(given) + value[len(str(readable)):]
    return value



def _member_name(member: tarfile.TarInfo, archive: Path) -> str:
    """The member's path inside the experiment folder; a ValueError for one that would land outside it or is not a
    plain file or folder."""
    name = member.name
    parts = PurePosixPath(name).parts + PureWindowsPath(name).parts
    if not name or name.startswith(("/", "\\")) or PureWindowsPath(name).drive or ".." in parts:
        raise ValueError(f"{archive} holds {name!r}, a path outside the experiment folder, so it is not unpacked.")
    if not (member.isfile() or member.isdir()):
        raise ValueError(f"{archive} holds {name!r}, which is a link or a device, not a file, so it is not unpacked.")
    return PurePosixPath(name).as_posix()


def _stream(archive: Path) -> io.BufferedIOBase:
    """The archive's tar stream, decompressed as its name says (so a damaged one gives one reason, not three)."""
    if archive.name.endswith(".xz"):
        return lzma.open(archive)
    if archive.name.endswith("gz"):
        return gzip.open(archive)
    return open(archive, "rb")


def read_members(archive: Path) -> dict[str, bytes]:
    """Every file in `archive` by its path in the experiment folder; a ValueError in one sentence when the archive
    is damaged or holds a path outside the folder."""
    members = {}
    try:
        with _stream(archive) as stream, tarfile.open(fileobj=stream, mode="r:") as tar:
            for member in tar:
                name = _member_name(member, archive)
                if member.isfile():
                    handle = tar.extractfile(member)
                    members[name] = handle.read() if handle is not None else b""
    except DAMAGE as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"{archive} is damaged or not a records archive ({reason}); restore it from git.") from None
    return members


def archive_bytes(members: Mapping[str, bytes]) -> bytes:
    """A tar.xz of `members`, the same bytes for the same members: sorted names, mtime 0, owner 0, mode 0644."""
    buffer = io.BytesIO()
    with lzma.LZMAFile(buffer, "w", preset=XZ_PRESET) as xz, tarfile.open(fileobj=xz, mode="w",
                                                                          format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(members):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(members[name]), 0, FILE_MODE
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(members[name]))
    return buffer.getvalue()


def _write_tree(members: Mapping[str, bytes], folder: Path) -> None:
    for name, data in members.items():
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())


def _unpacked(archive: Path, cache: Path) -> Path:
    """`archive` unpacked under `cache`, once: a temporary folder renamed into place (another reader may win)."""
    target = cache / file_sha256(archive)
    if target.is_dir():
        return target
    members = read_members(archive)
    cache.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(prefix=f".{target.name[:16]}-", dir=cache))
    try:
        _write_tree(members, temporary)
        os.rename(temporary, target)
    except OSError:
        shutil.rmtree(temporary, ignore_errors=True)
        if target.is_dir():  # another reader unpacked the same archive first
            return target
        raise
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return target


def _kept(relative: PurePosixPath) -> bool:
    """Files that stay beside the archive (or go, for the report's plots): the report, the scripts, the archive."""
    if len(relative.parts) != 1:
        return False
    name = relative.name
    return name in (REPORT, *ARCHIVES, *REPORT_PLOTS) or fnmatch.fnmatchcase(name, SCRIPTS)


def loose_records(folder: Path) -> list[Path]:
    """The files of `folder` that belong in its archive, sorted."""
    files = (path for path in folder.rglob("*") if path.is_file())
    return sorted(path for path in files if not _kept(PurePosixPath(path.relative_to(folder).as_posix())))


def _plots_line(links: str, shown: str) -> str:
    names = " and ".join(match.group(2) for match in IMAGE.finditer(links))
    what = ", ".join(match.group(1) for match in IMAGE.finditer(links))
    return (f"Plots ({what}): `python -m bench.experiment_report {shlex.quote(shown)}` draws {names} again from "
            "records.tar.xz and names the folder they are in (the ones drawn at the time are in git history).")


def _image_line(match: re.Match[str], folder: Path, shown: str) -> str:
    target = match.group(2)
    if "://" in target or (folder / target).is_file():
        return match.group(0)
    return (f"{match.group(1) or target} ({target}) is in records.tar.xz: `python -m bench.records path "
            f"{shlex.quote(shown)}` unpacks the records and names the folder.")


def report_text(text: str, folder: Path, shown: str) -> str:
    """report.md with its links to images no longer in `folder` replaced by the command that gives them back."""
    text = PLOTS_RUN.sub(lambda match: _plots_line(match.group(0), shown), text)
    return IMAGE.sub(lambda match: _image_line(match, folder, shown), text)


def _rewrite_report(folder: Path, shown: str) -> None:
    report = folder / REPORT
    if report.is_file():
        text = report.read_text(encoding="utf-8")
        new = report_text(text, folder, shown)
        if new != text:
            atomic_write_text(report, new, mode=FILE_MODE)


def _remove_empty_folders(folder: Path) -> None:
    for path in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            path.rmdir()


def pack(folder: Path, shown: str | None = None) -> Path | None:
    """Fold `folder`'s records into folder/records.tar.xz, in place: report.md and run-*.sh stay, the report's own
    plots go (report.md says how to draw them again), everything else goes into the archive (merged with the one
    already there). `shown`: how report.md names the folder in its commands (the folder as given by default).

    Returns the archive, or None when there was nothing left to pack."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder, so there is nothing to pack.")
    old = archive_in(folder)
    loose = loose_records(folder)
    plots = [folder / name for name in REPORT_PLOTS if (folder / name).is_file()]
    if old is not None and not loose and not plots:
        _rewrite_report(folder, shown or folder.as_posix())
        return None
    members = read_members(old) if old is not None else {}
    members.update({path.relative_to(folder).as_posix(): path.read_bytes() for path in loose})
    if PLAN_FILE not in members:
        raise ValueError(f"{folder} holds no experiment ({PLAN_FILE} is missing), so it is not packed.")
    archive = folder / ARCHIVE
    atomic_write_bytes(archive, archive_bytes(members), mode=FILE_MODE)
    if read_members(archive) != members:
        raise OSError(f"{archive} did not read back as written; the loose records are left as they were.")
    for path in [*loose, *plots, *([old] if old not in (None, archive) else [])]:
        path.unlink()
    _remove_empty_folders(folder)
    _rewrite_report(folder, shown or folder.as_posix())
    return archive


def unpack(folder: Path) -> Path:
    """Put `folder`'s packed records back as loose files in `folder` (to resume the experiment) and remove the
    archive; `pack` gives the same archive again. Returns the archive that was removed."""
    folder = Path(folder)
    archive = archive_in(folder) if folder.is_dir() else None
    if archive is None:
        raise ValueError(f"{folder} holds no {ARCHIVE}, so there is nothing to unpack.")
    if loose_records(folder):
        raise ValueError(f"{folder} holds loose records beside {archive.name}; `python -m bench.records pack "
                         f"{folder}` folds them in first.")
    _write_tree(read_members(archive), folder)
    archive.unlink()
    return archive
