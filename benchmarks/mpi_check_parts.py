"""Where the MPI transport's mismatch check spends its time: benchmarks/check_cost.py run with
one part of the check changed (for this measurement only; the results are not checked).

usage: UNICCL_TRANSPORT=mpi mpiexec -n N python benchmarks/mpi_check_parts.py VARIANT [BYTES] [CALLS]
  VARIANT  no_messages: the records are not sent (each rank copies its own into every slot):
                        what the Python of the check costs alone
           at_end:      the records are compared when the call ends instead of at its first
                        wait (unsafe for a mismatch: a rank could wait for data never sent)
           with_data:   the first wait completes the records and the data in one Waitall
           allgather:   one persistent MPI_Allgather_init of the records (MPI 4.0) instead of
                        point-to-point requests to every rank
"""

import os
import runpy
import sys

from uniccl.transport.mpi import MPITransport

variant = sys.argv[1]
T = MPITransport


def _same(self):
    if self._recs != self._own * self.size:
        self._mismatch()


if variant == "no_messages":

    def announce(self, seq, tag, record, full, light, mismatched):
        self._own, self._full, self._mismatched = record, full, mismatched
        self.active = self._unsettled = True

    def settle(self):
        self._unsettled = False
        self._recs[:] = self._own * self.size
        _same(self)

    T.announce, T._settle = announce, settle
elif variant == "at_end":

    def late_wait(self, req):
        req.Wait()

    def late_waitall(self, reqs):
        if reqs:
            self.MPI.Request.Waitall(reqs)

    T.wait, T.waitall = late_wait, late_waitall  # finish() still compares them
elif variant == "with_data":

    def wait(self, req):
        self.waitall([req])

    def waitall(self, reqs):
        if self._unsettled:
            self._unsettled = False
            self.MPI.Request.Waitall(self._rec_reqs + list(reqs))
            _same(self)
        elif reqs:
            self.MPI.Request.Waitall(reqs)

    T.wait, T.waitall = wait, waitall
elif variant == "allgather":
    init = T.__init__

    def __init__(self, mpi_comm):
        init(self, mpi_comm)
        for req in self._rec_reqs:
            req.Free()
        self._rec_reqs = [self.agree.Allgather_init(self.MPI.IN_PLACE, [self._recs, self.MPI.BYTE])]

    T.__init__ = __init__
else:
    sys.exit(__doc__)
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.argv = [os.path.join(here, "check_cost.py")] + sys.argv[2:]
if int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))) == 0:
    print(f"variant {variant}:", flush=True)
runpy.run_path(sys.argv[0], run_name="__main__")
