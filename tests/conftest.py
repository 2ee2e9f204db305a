from __future__ import annotations

import pytest

from daifu.cells import options
from daifu.engine import ENGINE


@pytest.fixture(autouse=True)
def _fresh_engine():
    ENGINE.reset()
    saved = (options.strict, options.dump)
    options.strict = True  # tests want transform failures to be loud
    yield ENGINE
    ENGINE.reset()
    options.strict, options.dump = saved


@pytest.fixture
def engine():
    return ENGINE
