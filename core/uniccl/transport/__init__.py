"""Moving bytes between ranks: shared memory within a host (``shm``: the C engine and its
attachment), our TCP mesh (``tcp``) and MPI (``mpi``); addresses (``net``); and ``factory``,
which picks and builds a new communicator's transport.

May import: ``bootstrap``, ``observability``, ``reliability`` and the base modules; never
``comm`` (a transport knows nothing of plans or the public object).
"""

TRANSPORTS = ("shm", "tcp", "mpi")  # shared memory within a host, our TCP mesh, MPI (``uniccl info``)
