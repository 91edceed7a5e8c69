"""The implementation of ``castmesh.MPI`` (mpi4py's API over castmesh's Communicator).

One module per job: errors and constants, datatypes, buffer specs, ops,
statuses, requests, communicators (point to point, collectives, pickled
objects) and how COMM_WORLD is found. ``castmesh/MPI.py`` re-exports them.
"""
