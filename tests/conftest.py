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
