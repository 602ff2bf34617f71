"""`python -m engine.relay`: the same as `sapling-relay`."""

import sys

from engine.relay.cli import main

sys.exit(main())
