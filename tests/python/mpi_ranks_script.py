"""Run by test_mpi.py under ``mpirun -n 2`` (or more): castmesh.MPI between real processes.

Each check prints ``OK <name>`` on every rank that passed it; the test
asserts that every rank printed every name. A failed check raises, so the
rank exits non-zero and the output shows the traceback.
"""

import sys

import numpy as np

from castmesh import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
peer = (rank + 1) % size
left = (rank - 1) % size


def ok(name: str) -> None:
    print(f"OK {name} rank={rank}", flush=True)


# Buffer specs: plain, [buf, type], [buf, count, type], [buf, (count, displ), type].
a = np.arange(10, dtype="i") + 100 * rank
got = np.zeros(10, dtype="i")
comm.Sendrecv(a, peer, 1, got, left, 1)
assert got.tolist() == (np.arange(10) + 100 * left).tolist(), got
got[:] = -1
comm.Sendrecv([a, 3, MPI.INT], peer, 2, [got, MPI.INT], left, 2)
assert got[:3].tolist() == [100 * left, 100 * left + 1, 100 * left + 2] and got[3] == -1, got
got[:] = -1
comm.Sendrecv([a, (2, 4), MPI.INT], peer, 3, [got, (2, 5), MPI.INT], left, 3)
assert got[5:7].tolist() == [100 * left + 4, 100 * left + 5] and got[4] == -1 and got[7] == -1, got
d = np.zeros(4)
st = MPI.Status()
comm.Sendrecv([np.full(4, rank + 0.5), MPI.DOUBLE], peer, 4, [d, MPI.DOUBLE], left, 4, st)
assert d.tolist() == [left + 0.5] * 4 and st.Get_source() == left and st.Get_tag() == 4 and st.Get_count(MPI.DOUBLE) == 4
ok("buffer_specs")

# Derived datatypes between processes: a column of a C-ordered matrix, and a struct.
m = np.arange(16, dtype="d").reshape(4, 4) + rank
column = MPI.DOUBLE.Create_vector(4, 1, 4).Commit()
col = np.zeros(4)
comm.Sendrecv([m.reshape(-1)[1:], 1, column], peer, 5, [col, MPI.DOUBLE], left, 5)
assert col.tolist() == (np.arange(16.0).reshape(4, 4)[:, 1] + left).tolist(), col
into = np.zeros((4, 4))
comm.Sendrecv([col, MPI.DOUBLE], peer, 6, [into.reshape(-1)[2:], 1, column], left, 6)
assert into[:, 2].tolist() == (np.arange(16.0).reshape(4, 4)[:, 1] + (rank - 2) % size).tolist() and into[:, 3].sum() == 0
column.Free()
rec = np.dtype([("x", "f8"), ("n", "i4"), ("pad", "i4")])
pair = MPI.Datatype.Create_struct([1, 1], [0, 8], [MPI.DOUBLE, MPI.INT]).Commit()
assert pair.size == 12 and pair.extent == 16
out = np.zeros(3, dtype=rec)
src = np.zeros(3, dtype=rec)
src["x"], src["n"], src["pad"] = [1.5, 2.5, 3.5], [rank, rank + 1, rank + 2], 77
comm.Sendrecv([src, 3, pair], peer, 7, [out, 3, pair], left, 7)
assert out["x"].tolist() == [1.5, 2.5, 3.5] and out["n"].tolist() == [left, left + 1, left + 2]
assert out["pad"].tolist() == [0, 0, 0]  # padding is not part of the type map: never sent
ok("derived_datatypes")

# Objects (pickle).
obj = {"rank": rank, "list": list(range(rank + 2))}
assert comm.sendrecv(obj, dest=peer, source=left) == {"rank": left, "list": list(range(left + 2))}
req = comm.irecv(source=left, tag=9)
comm.isend(("hello", rank), dest=peer, tag=9).wait()
assert req.wait() == ("hello", left)
assert comm.bcast({"root": "data"} if rank == 0 else None, root=0) == {"root": "data"}
g = comm.gather(rank * 2, root=size - 1)
assert g == ([r * 2 for r in range(size)] if rank == size - 1 else None), g
assert comm.scatter([f"item{r}" for r in range(size)] if rank == 0 else None, root=0) == f"item{rank}"
assert comm.allgather(rank) == list(range(size))
assert comm.alltoall([(rank, j) for j in range(size)]) == [(j, rank) for j in range(size)]
assert comm.reduce(rank + 1, op=MPI.PROD, root=0) == (np.prod(range(1, size + 1)) if rank == 0 else None)
assert comm.allreduce(rank, op=MPI.MAX) == size - 1
assert comm.allreduce([rank], op=lambda x, y: x + y) == list(range(size))  # any callable, in rank order
assert comm.scan(rank) == sum(range(rank + 1))
assert comm.exscan(rank) == (None if rank == 0 else sum(range(rank)))
ok("objects")

# MAXLOC / MINLOC on objects and on pair buffers.
assert comm.allreduce((rank % 2, rank), op=MPI.MAXLOC) == (1 if size > 1 else 0, 1 if size > 1 else 0)
assert comm.allreduce((5, size - rank), op=MPI.MINLOC) == (5, 1)  # ties take the lowest index
vals = np.zeros(2, dtype=[("v", "f8"), ("i", "i4"), ("p", "i4")])
vals["v"] = [float(rank), -float(rank)]
vals["i"] = rank
res = np.zeros_like(vals)
comm.Allreduce([vals, MPI.DOUBLE_INT], [res, MPI.DOUBLE_INT], op=MPI.MAXLOC)
assert res["v"].tolist() == [size - 1.0, 0.0] and res["i"].tolist() == [size - 1, 0], res
two = np.array([[7 - rank, rank]], dtype="i")
low = np.zeros_like(two)
comm.Reduce([two, MPI.TWOINT], [low, MPI.TWOINT], op=MPI.MINLOC, root=0)
if rank == 0:
    assert low.tolist() == [[7 - (size - 1), size - 1]], low
ok("maxloc_minloc")

# Built-in and user-defined ops on buffers; a non-commutative op sees ranks in order.
x = np.array([rank + 1, 2], dtype="i")
y = np.zeros(2, dtype="i")
comm.Allreduce(x, y, op=MPI.SUM)
assert y.tolist() == [sum(range(1, size + 1)), 2 * size]
z = np.array([rank], dtype="i")
comm.Allreduce(MPI.IN_PLACE, z, op=MPI.MAX)
assert z[0] == size - 1


def digits(invec, inoutvec, datatype):
    """Concatenates decimal numbers held as (value, 10**digits) pairs: associative, not commutative."""
    a_ = np.frombuffer(invec, dtype="i8").reshape(-1, 2)
    b_ = np.frombuffer(inoutvec, dtype="i8").reshape(-1, 2)
    b_[:, 0] = a_[:, 0] * b_[:, 1] + b_[:, 0]
    b_[:, 1] = a_[:, 1] * b_[:, 1]


concat = MPI.Op.Create(digits, commute=False)
v = np.zeros(2, dtype="i8")
comm.Allreduce(np.array([rank + 1, 10], dtype="i8"), v, op=concat)
assert v[0] == int("".join(str(r + 1) for r in range(size))), v
w = np.array([rank + 1], dtype="i8")
sc = np.zeros(1, dtype="i8")
comm.Scan(w, sc, op=MPI.SUM)
assert sc[0] == sum(range(1, rank + 2))
ex = np.full(1, -5, dtype="i8")
comm.Exscan(w, ex, op=MPI.SUM)
assert rank == 0 or ex[0] == sum(range(1, rank + 1))
rs = np.zeros(2, dtype="i")
comm.Reduce_scatter_block(np.arange(2 * size, dtype="i"), rs, op=MPI.SUM)
assert rs.tolist() == [size * (2 * rank), size * (2 * rank + 1)]
concat.Free()
ok("ops")

# Vector collectives.
counts = [r + 1 for r in range(size)]
displs = [sum(counts[:r]) for r in range(size)]
mine = np.full(rank + 1, rank, dtype="i")
allv = np.zeros(sum(counts), dtype="i")
comm.Allgatherv(mine, [allv, counts, displs, MPI.INT])
assert allv.tolist() == [r for r in range(size) for _ in range(r + 1)]
gv = np.zeros(sum(counts), dtype="i") if rank == 0 else None
comm.Gatherv(mine, [gv, (counts, displs), MPI.INT] if rank == 0 else None, root=0)
assert rank != 0 or gv.tolist() == allv.tolist()
sv = np.zeros(rank + 1, dtype="i")
comm.Scatterv([allv, counts, displs, MPI.INT] if rank == 0 else None, sv, root=0)
assert sv.tolist() == [rank] * (rank + 1)
sendc = [1] * size
recvd = np.zeros(size, dtype="i")
comm.Alltoallv([np.arange(size, dtype="i") + 10 * rank, sendc], [recvd, sendc])
assert recvd.tolist() == [10 * r + rank for r in range(size)]
ok("vector_collectives")

# Persistent requests: started twice.
sbuf = np.zeros(3, dtype="d")
rbuf = np.zeros(3, dtype="d")
sreq = comm.Send_init(sbuf, peer, 11)
rreq = comm.Recv_init(rbuf, left, 11)
for round_ in range(2):
    sbuf[:] = rank * 10 + round_
    MPI.Prequest.Startall([rreq, sreq])
    MPI.Request.Waitall([sreq, rreq])
    assert rbuf.tolist() == [left * 10 + round_] * 3
    assert sreq != MPI.REQUEST_NULL and rreq != MPI.REQUEST_NULL
sreq.Free()
rreq.Free()
ok("persistent_requests")

# Bsend: needs an attached buffer, and fits in it.
try:
    comm.Bsend(np.zeros(1), peer, 12)
    raise AssertionError("Bsend without an attached buffer did not fail")
except MPI.Exception as e:
    assert e.Get_error_class() == MPI.ERR_BUFFER
MPI.Attach_buffer(bytearray(100 + MPI.BSEND_OVERHEAD))
try:
    comm.Bsend(np.zeros(1000, dtype="u1"), peer, 12)
    raise AssertionError("Bsend larger than the attached buffer did not fail")
except MPI.Exception as e:
    assert e.Get_error_class() == MPI.ERR_BUFFER
payload = np.arange(10, dtype="u1") + rank
comm.Bsend(payload, peer, 12)
payload[:] = 0  # the message was copied: changing the buffer now changes nothing
back = np.zeros(10, dtype="u1")
comm.Recv(back, left, 12)
assert back.tolist() == (np.arange(10) + left).tolist()
assert len(MPI.Detach_buffer()) == 100 + MPI.BSEND_OVERHEAD
ok("bsend")

# Probe / Iprobe, then a receive sized from the status.
comm.Barrier()
comm.Send(np.arange(rank + 3, dtype="f"), peer, 13)
st = MPI.Status()
comm.Probe(MPI.ANY_SOURCE, 13, st)
assert st.Get_source() == left and st.Get_count(MPI.FLOAT) == left + 3
buf = np.zeros(st.Get_count(MPI.FLOAT), dtype="f")
comm.Recv(buf, st.Get_source(), 13)
assert buf.tolist() == list(range(left + 3))
assert not comm.Iprobe(MPI.ANY_SOURCE, 14)
ok("probe")

# Requests: Waitany/Testall, REQUEST_NULL after completion.
rr = [comm.Irecv(np.zeros(1), left, 15 + k) for k in range(2)]
ss = [comm.Isend(np.ones(1) * k, peer, 15 + k) for k in range(2)]
i = MPI.Request.Waitany(rr)
assert i in (0, 1) and rr[i] == MPI.REQUEST_NULL
MPI.Request.Waitall(rr + ss)
assert MPI.Request.Testall(rr) and all(r == MPI.REQUEST_NULL for r in rr)
ok("requests")

# Errors: truncation is MPI's ERR_TRUNCATE (and the message is consumed); a count beyond the buffer is a ValueError.
comm.Send(np.arange(8, dtype="i"), peer, 16)
try:
    comm.Recv(np.zeros(4, dtype="i"), left, 16)
    raise AssertionError("truncated receive did not fail")
except MPI.Exception as e:
    assert e.Get_error_class() == MPI.ERR_TRUNCATE and "MPI_ERR_TRUNCATE" in str(e), e
try:
    comm.Send([np.zeros(4, dtype="i"), 5, MPI.INT], peer, 17)
    raise AssertionError("count beyond the buffer did not fail")
except ValueError as e:
    assert "buffer too small" in str(e), e
comm.Barrier()
ok("errors")

# Blocking Send/Recv take a fast path for plain buffers and [buf, count, contiguous type] (p2p.py: _span);
# every other spec the general one. Both keep MPI's order per source and tag, match any-source/any-tag
# receives of either kind, and give the general path's errors.
ints = np.arange(6, dtype="i") + 10 * rank
vector = MPI.INT.Create_vector(3, 1, 2).Commit()  # every other int: not contiguous, packed
fortran = np.asfortranarray(np.arange(6, dtype="d").reshape(2, 3) + rank)  # no C-contiguous export
comm.Send([ints, 2, MPI.INT], peer, 18)              # fast
comm.Send([ints, 1, vector], peer, 18)               # general (packed)
comm.Send(bytearray(b"abc") + bytes([rank]), float(peer), 18)  # fast, plain bytes; a float rank as int()
comm.Send(fortran, peer, 18)                         # general (Fortran order)
comm.Send(ints[::2].copy(), peer, 18)                # fast
first = np.zeros(2, dtype="i")
st = MPI.Status()
comm.Recv([first, 2, MPI.INT], MPI.ANY_SOURCE, MPI.ANY_TAG, st)
assert first.tolist() == [10 * left, 10 * left + 1] and st.Get_source() == left and st.Get_tag() == 18
assert st.Get_count(MPI.INT) == 2
packed = np.full(6, -1, dtype="i")
comm.Recv([packed, 1, vector], left, 18)
assert packed.tolist() == [10 * left, -1, 10 * left + 2, -1, 10 * left + 4, -1], packed
raw = bytearray(4)
comm.Recv(raw, MPI.ANY_SOURCE, 18, st)
assert bytes(raw) == b"abc" + bytes([left]) and st.Get_count(MPI.BYTE) == 4
back_f = np.zeros((2, 3), dtype="d", order="F")
comm.Recv(back_f, left, MPI.ANY_TAG)
assert (back_f == np.arange(6, dtype="d").reshape(2, 3) + left).all(), back_f
strided = np.zeros(3, dtype="i")
comm.Recv([strided, MPI.INT], left, 18)
assert strided.tolist() == [10 * left, 10 * left + 2, 10 * left + 4]
vector.Free()
try:
    comm.Send(ints[::2], peer, 19)  # strided: the general path's error
    raise AssertionError("a strided view was sent")
except BufferError as e:
    assert "not contiguous" in str(e), e
try:
    comm.Recv(bytes(4), left, 19)  # read-only: refused before anything is received
    raise AssertionError("a receive into bytes did not fail")
except BufferError as e:
    assert "read-only" in str(e), e
try:
    comm.Send(np.array([object()] * 2), peer, 19)
    raise AssertionError("an object array was sent")
except TypeError:
    pass  # the general path's error (NumPy's: an array of references has no bytes to send)
comm.Barrier()
ok("fast_path")

# Split / Dup and COMM_SELF.
half = comm.Split(rank % 2, key=-rank)
assert half.Get_size() == len(range(rank % 2, size, 2)) and half.Get_rank() == (half.Get_size() - 1 - rank // 2)
assert comm.Split(MPI.UNDEFINED) == MPI.COMM_NULL
dup = comm.Dup()
assert dup.allreduce(1) == size
dup.Free()
assert MPI.COMM_SELF.Get_size() == 1 and MPI.COMM_SELF.allgather(rank) == [rank]
assert comm.Get_attr(MPI.TAG_UB) >= 32767
ok("communicators")
sys.stdout.flush()
