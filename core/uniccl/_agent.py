"""``python -m uniccl._agent``: the node agent at the path remote nodes start (the launcher
runs this on every node, and as the rank wrapper under mpiexec and srun); it lives in
:mod:`uniccl.launch.agent`."""

import sys

from uniccl.launch.agent import main

if __name__ == "__main__":
    sys.exit(main())
