import _platform
import pytest


@pytest.fixture(scope="session")
def platform(request):
    if request.config.getoption("--uniccl-real"):
        _platform.REAL.add(request.config.getoption("--uniccl-platform"))
    return request.config.getoption("--uniccl-platform")


@pytest.fixture(scope="session")
def backend(platform):
    """The chosen platform's hooks, resolved like a communicator resolves them."""
    from uniccl._plugins import manager

    _platform.apply(platform)
    record, _ = manager().choose(platform)
    assert record.name == platform
    return manager().backend(record)


@pytest.fixture(scope="session")
def rank_env(platform):
    """Environment for the worker processes of multi-rank checks."""
    return _platform.platform_env(platform)
