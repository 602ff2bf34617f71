"""What Sapling tells people that joining a swarm does: measured sentences, each with the number it rests on.

Every sentence the app, the README or the docs say about what training
together does for a person's model, or for the others', comes from here, and
each carries the number docs/results.md measures, with the section that
measures it. tests/test_claims.py keeps it honest both ways: each number
below must appear in docs/results.md, and no text in app/, README.md or
docs/ may claim a benefit ("helps the others", "a gift to the others") that
is not one of these sentences.

When a new measurement changes the answer (the 200-round comparison, a
swarm-only lever), change the sentence and its number here, and the dialogs
follow. Stdlib only: the app imports it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Claim:
    """One sentence for people, the numbers in it, and where docs/results.md measures them."""

    text: str
    numbers: tuple[str, ...]
    source: str  # a section of docs/results.md


JOINING = Claim(
    text=("What joining does has been measured on the bundled model in runs of 15 to 40 rounds: per hour on each "
          "computer, joined models learned a little less than models training alone (0.90 of alone for yours, "
          "0.97 for your neighbours'), and their accuracy on held-out questions did not change. The paper behind "
          "Sapling reported its gains with larger models and longer runs."),
    numbers=("0.900", "0.971"),
    source="docs/results.md#swarm",
)
"""The first-run dialog and the join dialog say this about sharing."""
