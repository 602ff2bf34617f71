"""Which seed a node's run uses: its own per install, an explicit one, or the one its run began with.

Every round's questions and samples follow from the node seed (engine/node/loop.py).
Two installs with the same seed are clones: they draw the same questions and
write the same completions in the same rounds, so what they share is refused
as `duplicate` and teaches nothing. So the default seed is the install's own:

1. `run.seed = -1` (AUTO, the default) takes the install's seed, a random
   number written once in the data dir (`node-seed`) the first time a node
   runs there, and read from then on;
2. `run.seed = N` (0 or more) is that seed: the same N reproduces a run
   exactly, and the experiment gives its simulated nodes explicit seeds;
3. a run that has checkpoints keeps the seed its first round used (recorded
   in every checkpoint's state), whatever the settings say now. Checkpoints
   made before the seed was recorded carry on with the seed chosen by 1 or 2.

A round's own seeds follow from the run's: `derive_seed(seed, round, slot)` (slots in engine/questions/probe.py).
"""

from __future__ import annotations

import logging
import secrets
from pathlib import Path

from engine.common.atomicio import atomic_write_text
from engine.common.rules import stable_seed

log = logging.getLogger(__name__)

AUTO_SEED = -1
MAX_SEED = 2**31 - 1  # run.seed's range; the experiment spaces nodes within it (engine/experiment/plan.py)
SEED_FILE = "node-seed"


def install_seed(data_dir: Path) -> int:
    """This install's seed: read from `data_dir/node-seed`, or drawn at random and written there once.

    A file that does not hold a seed (hand-edited, damaged) is replaced by a new
    one with a warning: a seed carries no data that could be lost.
    """
    path = Path(data_dir) / SEED_FILE
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        text = None
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("Cannot read %s (%s); drawing a new seed for this install.", path, exc)
        text = None
    if text is not None:
        if text.isdigit() and int(text) <= MAX_SEED:
            return int(text)
        log.warning("%s does not hold a seed (%r); drawing a new one for this install.", path, text[:40])
    seed = secrets.randbelow(MAX_SEED + 1)
    atomic_write_text(path, f"{seed}\n")
    return seed


def node_seed(config_seed: int, data_dir: Path) -> int:
    """The seed a new run starts with: `config_seed`, or the install's own when it is AUTO."""
    return install_seed(data_dir) if config_seed == AUTO_SEED else config_seed


def fixed_seed(config_seed: int) -> int:
    """A concrete seed where the choice changes nothing a user sees (an adapter's initial values
    before a checkpoint replaces them): `config_seed`, or 0 for AUTO."""
    return 0 if config_seed == AUTO_SEED else config_seed


def run_seed(chosen: int, recorded: object) -> int:
    """The seed a run uses: the one its checkpoints recorded, else `chosen` (a run that predates the record)."""
    if isinstance(recorded, int) and not isinstance(recorded, bool) and 0 <= recorded <= MAX_SEED:
        if recorded != chosen:
            log.info("This run began with seed %d; it keeps it (settings say %d). A new run name starts a run "
                     "with the new seed.", recorded, chosen)
        return recorded
    return chosen


def derive_seed(*parts: int) -> int:
    """A stable 63-bit seed from integers (`engine.common.rules.stable_seed`, top bit dropped so that
    the runs recorded in docs/results.md keep their sampling seeds)."""
    return stable_seed(*parts) >> 1
