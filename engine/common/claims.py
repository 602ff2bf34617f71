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
    text=("What joining does has been measured on the bundled model: per hour on each computer, joined models "
          "learned about as much as models training alone (1.04 of alone in 25 rounds; 0.90 in earlier runs), and "
          "did no better on held-out questions; training on the swarm's answers every round for 100 rounds, they "
          "fell 3.3 points behind. The paper behind Sapling reported its gains with larger models."),
    numbers=("1.037", "0.900", "-3.3"),
    source="docs/results.md#swarm",
)
"""The first-run dialog and the join dialog say this about sharing."""
