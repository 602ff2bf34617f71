"""`sapling-relay`: the websocket relay that nodes share rollouts through.

The relay is built in the swarm work (issue 3). Until then this command says
so plainly and exits 2, and `sapling-node run` trains solo.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    print(
        "sapling-relay: the swarm relay is not in this version of Sapling yet; "
        "nodes train solo (single-node GRPO) until it lands.",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
