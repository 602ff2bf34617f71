"""What Sapling says joining does carries a number that docs/results.md measures (engine/common/claims.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine.common import claims

ROOT = Path(__file__).resolve().parents[1]

# Claims of a benefit that no measurement per hour has supported (issue: "Does sharing ever pay?"). A sentence
# like these may come back only through engine/common/claims.py, with its number on docs/results.md.
UNMEASURED = [
    r"helps? the others",
    r"gift to the others",
    r"helps? (the )?other (computers|nodes|volunteers)",
    r"helps? the swarm'?s? other",
    r"(learns?|train) faster (together|in a swarm|with the swarm)",
    r"sharing (helps|pays)",
]


def results_section(title: str) -> str:
    text = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", text, re.S | re.M)
    assert match, f"docs/results.md has no '## {title}' section"
    return match.group(1)


def every_claim() -> list[claims.Claim]:
    return [value for value in vars(claims).values() if isinstance(value, claims.Claim)]


@pytest.mark.parametrize("claim", every_claim(), ids=lambda c: c.text[:40])
def test_each_sentence_carries_numbers_that_results_md_measures(claim: claims.Claim) -> None:
    assert claim.numbers, "a sentence about what Sapling does for people carries a number"
    section = results_section(claim.source.split("#", 1)[1].capitalize())
    for number in claim.numbers:
        assert number in section, f"{number} is not measured in {claim.source}"
        spoken = {f"{float(number):.2f}", number.lstrip("+-")}  # 0.900 as 0.90; a difference of -7.0 points as 7.0
        assert any(form in claim.text for form in spoken), f"the sentence does not say {number}"


def people_facing_texts() -> list[Path]:
    paths = [*sorted((ROOT / "app").rglob("*.py")), ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "engine").rglob("*.py"))]
    return [p for p in paths if p != ROOT / "engine" / "common" / "claims.py"]  # it names them to forbid them


def test_no_text_claims_a_benefit_of_joining_that_results_md_does_not_show() -> None:
    found = []
    for path in people_facing_texts():
        text = " ".join(path.read_text(encoding="utf-8").split())  # sentences wrapped over lines and strings too
        text = re.sub(r'"\s*"', "", text)  # Python's implicit string concatenation
        for pattern in UNMEASURED:
            found += [f"{path.relative_to(ROOT)}: {m.group(0)!r}" for m in re.finditer(pattern, text, re.I)]
    assert not found, f"unmeasured claims of what joining does: {found}"


def test_the_first_run_and_join_dialogs_say_the_measured_sentence() -> None:
    for module in ("dialogs.py", "join.py"):
        assert "JOINING.text" in (ROOT / "app" / module).read_text(encoding="utf-8"), module


def test_the_check_finds_the_sentence_that_shipped() -> None:
    shipped = "Your answers help the others most: per hour on your computer, your own model learns a little less"
    assert any(re.search(p, shipped, re.I) for p in UNMEASURED)
    assert any(re.search(p, "so sharing is a gift to the others.", re.I) for p in UNMEASURED)
