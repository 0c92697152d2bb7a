"""How ranks find each other: which bootstrap a process uses (``select``: MPI inside an MPI
job, TCP otherwise) and the unique-id rendezvous server and client (``rendezvous``).

May import: ``observability.log`` and the base modules.  A leaf otherwise: transports and
launchers import it, it imports none of them.
"""
