"""Experiment records packed into records.tar.xz and read back (engine/experiment/records.py, bench/records.py)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from bench.experiment_report import main as report_main
from bench.records import main as records_main
from engine.experiment.records import ARCHIVE, experiment_folder, pack, record_path, unpack

ROUND = {"external_groups": [0, 0], "informative_groups": [1, 1], "trained_own_informative": [1, 1], "seconds": 2.0,
         "generate_seconds": 1.0, "train_seconds": 1.0}
REPORT = ("# Experiment\n\n| mix | rounds |\n\n![reward per round](reward.png)\n\n"
          "![reward against hours](reward-hours.png)\n")


def fake_experiment(folder: Path, rewards: list[list[float]], mix: str = "4/4") -> Path:
    """An experiment folder with one mix of these [round][node] rewards, a report, its plot and a run script."""
    slug = folder / ("mix-" + mix.replace("/", "-"))
    (slug / "node-0").mkdir(parents=True)
    (folder / "experiment.json").write_text(json.dumps(
        {"nodes": 2, "mixes": [mix], "rounds": len(rewards), "preset": "default", "overrides": []}))
    (slug / "progress.json").write_text(json.dumps({"round": len(rewards)}))
    (slug / "rounds.jsonl").write_text(
        "".join(json.dumps({"round": r + 1, "rewards": row, **ROUND}) + "\n" for r, row in enumerate(rewards)))
    (slug / "node-0" / "metrics.jsonl").write_text('{"kind": "round", "round": 1}\n')
    (folder / "report.md").write_text(REPORT)
    (folder / "reward.png").write_bytes(b"\x89PNG not really")
    (folder / "run-fake.sh").write_text("#!/bin/sh\nsapling-node experiment --out fake\n")
    return folder


def files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def archive_with(path: Path, name: str) -> Path:
    """A tar.xz holding one member called `name`."""
    with tarfile.open(path, "w:xz") as tar:
        info = tarfile.TarInfo(name)
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    return path


@pytest.fixture(autouse=True)
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SAPLING_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_a_packed_experiment_keeps_its_report_and_script_and_reads_back_as_it_was(tmp_path: Path,
                                                                                  cache_home: Path) -> None:
    folder = fake_experiment(tmp_path / "runs" / "a", [[0.1, 0.2], [0.3, 0.3]])
    records = {k: v for k, v in files(folder).items() if k not in ("report.md", "reward.png", "run-fake.sh")}
    archive = pack(folder, shown="runs/a")
    assert archive == folder / ARCHIVE
    assert sorted(files(folder)) == [ARCHIVE, "report.md", "run-fake.sh"]
    report = (folder / "report.md").read_text()
    assert "](reward" not in report and "`python -m bench.experiment_report runs/a` draws reward.png and" in report
    readable = experiment_folder(folder)
    assert readable.parent == cache_home / "cache" / "records" and files(readable) == records
    assert experiment_folder(archive) == readable  # the archive itself
    assert record_path(folder / "mix-4-4") == readable / "mix-4-4"  # a path inside the packed folder
    assert experiment_folder(tmp_path / "plain") == tmp_path / "plain"
    assert list(readable.parent.iterdir()) == [readable]  # unpacked once, no temporary folder left


def test_packing_again_changes_nothing_and_repacking_gives_the_same_bytes(tmp_path: Path) -> None:
    folder = fake_experiment(tmp_path / "a", [[0.1, 0.2]])
    archive = pack(folder)
    assert archive is not None
    first, report = archive.read_bytes(), (folder / "report.md").read_text()
    assert pack(folder) is None and archive.read_bytes() == first
    unpack(folder)
    assert not archive.exists() and (folder / "mix-4-4" / "rounds.jsonl").is_file()
    assert pack(folder) == archive and archive.read_bytes() == first
    assert (folder / "report.md").read_text() == report


def test_the_report_reads_a_packed_folder_and_says_the_same(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = fake_experiment(tmp_path / "a", [[0.2, 0.4], [0.3, 0.3]])
    b = fake_experiment(tmp_path / "b", [[0.1, 0.2], [0.3, 0.2]], mix="8/0")
    args = ["--compare", str(a), str(b), "4/4", "8/0"]
    assert report_main(args) == 0
    before = capsys.readouterr().out
    assert records_main(["pack", str(a), str(b)]) == 0
    capsys.readouterr()
    assert report_main(args) == 0
    assert capsys.readouterr().out == before
    assert report_main(["--pool", "4/4", "8/0", f"{a},{b}"]) == 0
    assert json.loads(capsys.readouterr().out)["pairs"][0]["a"] == str(a)


@pytest.mark.parametrize("name", ["../outside", "/etc/outside", "mix/../../outside"])
def test_an_archive_member_outside_the_folder_is_refused_with_a_sentence(tmp_path: Path, name: str) -> None:
    folder = tmp_path / "runs" / "evil"
    folder.mkdir(parents=True)
    archive_with(folder / ARCHIVE, name)
    with pytest.raises(ValueError, match=r"a path outside the experiment folder, so it is not unpacked\.$"):
        experiment_folder(folder)
    assert not (tmp_path / "runs" / "outside").exists() and not (tmp_path / "outside").exists()


def test_a_link_in_an_archive_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "records.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        info = tarfile.TarInfo("experiment.json")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(info)
    with pytest.raises(ValueError, match="a link or a device"):
        experiment_folder(archive)


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_damaged_archive_is_one_sentence_and_exit_code_2(tmp_path: Path, damage: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    folder = fake_experiment(tmp_path / "a", [[0.1, 0.2]])
    archive = pack(folder)
    assert archive is not None
    data = archive.read_bytes()
    archive.write_bytes(b"not an archive at all" if damage == "garbage" else data[: len(data) // 2])
    assert report_main([str(folder)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert captured.err.startswith(f"experiment_report: {archive} is damaged") and captured.err.count("\n") == 1
    assert records_main(["path", str(folder)]) == 2


def test_a_folder_with_loose_records_beside_its_archive_asks_to_pack_again(tmp_path: Path) -> None:
    folder = fake_experiment(tmp_path / "a", [[0.1, 0.2]])
    pack(folder)
    (folder / "experiment.json").write_text("{}")
    with pytest.raises(ValueError, match=r"both loose records and records\.tar\.xz"):
        experiment_folder(folder)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "notes.txt").write_text("no plan here")
    with pytest.raises(ValueError, match="holds no experiment"):
        pack(tmp_path / "b")


def test_rebuilding_a_packed_report_writes_it_beside_the_unpacked_records(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    folder = fake_experiment(tmp_path / "a", [[0.2, 0.4], [0.3, 0.3]], mix="8/0")
    pack(folder)
    report = (folder / "report.md").read_text()
    assert report_main([str(folder)]) == 0
    captured = capsys.readouterr()
    readable = experiment_folder(folder)
    assert json.loads(captured.out)["8/0"]["rounds"] == 2
    assert f"is packed; its report and plots are in {readable}" in captured.err
    assert (readable / "reward.png").is_file() and (folder / "report.md").read_text() == report
