import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import logging  # noqa: E402

import pytest  # noqa: E402

# the answer logger's own handler (standard output) first: it is added only where the logger has none yet
import msprobe_lite.compare.console  # noqa: E402,F401


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.long = []

    def emit(self, record):
        self.long += [line for line in record.getMessage().splitlines() if len(line) > 160]


@pytest.fixture(autouse=True)
def _answers_fit_a_terminal():
    """Every answer said in the suite (the `msprobe_lite.answer` logger: compare's verdict blocks and the
    like) keeps its lines within 160 characters (issue 33)."""
    handler = _Lines()
    logger = logging.getLogger("msprobe_lite.answer")
    logger.addHandler(handler)
    yield
    logger.removeHandler(handler)
    assert not handler.long, f"answer lines over 160 characters: {handler.long[:3]}"
