"""Loaded at start-up by Python processes whose ``PYTHONPATH`` starts with this directory
(:func:`checkpoint_delay.delayed_env`): slows the bundle writer down for kill-during-write
tests."""

import os
import sys

if os.environ.get("EMBTRAIN_TEST_CHECKPOINT_FILE_DELAY"):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import checkpoint_delay

    checkpoint_delay.install()
    del sys.path[0]
