"""A machine's local rank 1, 2, ... as its first rank starts it (deepinfer.launch.start_local_ranks): reads the
engine configuration from stdin, builds the engine's options as the first rank does, and runs rank 0's steps until
rank 0 stops (DeepInferenceEngine ends a worker rank's process). Not imported by the package, so that
`python -m deepinfer.local_rank` runs it once."""

from __future__ import annotations

import logging
import pickle
import sys


def main() -> int:
    config = pickle.loads(sys.stdin.buffer.read())
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(asctime)s %(name)s: %(message)s")
    from deepinfer.engine import DeepInferenceEngine

    DeepInferenceEngine(config)
    return 1  # not reached: a worker rank's engine ends the process with SystemExit


if __name__ == "__main__":
    sys.exit(main())
