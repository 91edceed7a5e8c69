"""MPI's integer constants (ranks, tags, thread levels, attribute keys, ...).

ANY_SOURCE/ANY_TAG/UNDEFINED are castmesh's own values, so they pass to the
Communicator unchanged; PROC_NULL never reaches it (calls with it do
nothing here, as in MPI).
"""

from __future__ import annotations

from .. import _castmesh

ANY_SOURCE: int = _castmesh.ANY_SOURCE
ANY_TAG: int = _castmesh.ANY_TAG
UNDEFINED: int = _castmesh.UNDEFINED
PROC_NULL: int = -2 if -2 not in (ANY_SOURCE, UNDEFINED) else -3
ROOT: int = -4
KEYVAL_INVALID: int = -1

# Attribute keys for Comm.Get_attr.
TAG_UB = 0
HOST = 1
IO = 2
WTIME_IS_GLOBAL = 3
APPNUM = 4
LASTUSEDCODE = 5
UNIVERSE_SIZE = 6

TAG_UB_VALUE = 2**31 - 1
BSEND_OVERHEAD = 128
BUFFER_AUTOMATIC = None
MAX_PROCESSOR_NAME = 256
MAX_ERROR_STRING = 256
MAX_OBJECT_NAME = 64
MAX_LIBRARY_VERSION_STRING = 256

THREAD_SINGLE = 0
THREAD_FUNNELED = 1
THREAD_SERIALIZED = 2
THREAD_MULTIPLE = 3

IDENT = 0
CONGRUENT = 1
SIMILAR = 2
UNEQUAL = 3

VERSION = 3
SUBVERSION = 1
