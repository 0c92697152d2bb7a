"""``uniccl run``: the local, MPI, ssh and slurm launchers (``run``, ``remote``), the node agent
that starts and watches ranks (``agent``; remote nodes start it as ``python -m uniccl._agent``),
host files and cluster.yaml (``cluster``), ssh command lines (``ssh``) and what they share
(``common``).

May import: ``bootstrap``, ``transport.net``, ``observability`` and the base modules; never
``comm`` (the launcher starts processes, it makes no communicator).  ``agent`` imports nothing
of uniccl: it runs on nodes before anything else is set up.
"""
