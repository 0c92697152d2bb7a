import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # tests/_launch.py and tests/workers/


def pytest_addoption(parser):
    parser.addoption(
        "--uniccl-platform",
        default="cpu",
        help="platform the conformance suite (tests/conformance) checks: cpu, nvidia, iluvatar, "
        "metax, moore or cambricon (all but cpu against the ABI emulation)",
    )
    parser.addoption(
        "--uniccl-real",
        action="store_true",
        help="conformance: use the installed vendor SDK and hardware instead of the emulation",
    )


# The test tiers.  The whole suite is CI's gate (scripts/test.sh); `pytest -m "not slow"` is the
# contributor's fast tier, under 3 minutes with every package covered (comm: test_bad_input,
# test_errors, test_group_seen, test_steady_state, test_shrink; transport: test_netns, test_buffer,
# conformance; bootstrap and launch: test_env, test_ssh, test_launcher_killed; observability:
# test_visibility; tools: test_bench; kit and plugins: test_vendor_plugins, test_cambricon,
# conformance, plugins/cpu/tests).
# Slow: these files, by their wall time in a full run on the 2-core CI machine (seconds, 2026-12-02).
SLOW_FILES = {
    "test_collectives.py": 437,  # the differential matrix: every collective x 1-4 ranks x shm/mpi/tcp
    "test_tcp_hardening.py": 86,
    "test_torch.py": 70,
    "test_multinode.py": 53,
    "test_api.py": 50,
    "test_first_contact.py": 41,
    "test_examples.py": 33,
    "test_launcher_signals.py": 31,
    "test_faults.py": 27,
    "test_shm.py": 27,
    "test_fork_and_shm.py": 24,
    "test_integrity.py": 22,
    "test_chaos.py": 20,
    "test_mpi_timeouts.py": 18,
    "test_mixed_platforms.py": 18,
    "test_local_user.py": 11,
    "test_timeouts.py": 11,
    "test_cuda_kernels.py": 15,
    "test_emulation.py": 15,
    "test_run.py": 13,
}


def pytest_collection_modifyitems(config, items):
    import pytest

    slow = pytest.mark.slow
    for item in items:
        if item.path.name in SLOW_FILES and item.path.parent.name == "tests":
            item.add_marker(slow)
