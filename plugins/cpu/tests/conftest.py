"""Fixtures of the cpu plugin's tests (helpers live in cpu_helpers.py)."""

import pytest
import uniccl_cpu
from uniccl_cpu import _kernels


@pytest.fixture
def plugin():
    return uniccl_cpu


@pytest.fixture(params=_kernels.available())
def variant(request):
    """Run a test once per kernel variant this CPU supports, restoring the best."""
    _kernels.select(request.param)
    yield request.param
    _kernels.select(_kernels.available()[0])
