"""The mount's decoder processes: chunks of a local store read and decoded outside the daemon.

In the daemon, decoding threads and the thread that answers the kernel share one GIL. A
cold `cat data.raw` through threads handed the GIL over about nine times a chunk, and
the answering thread waited for it for a quarter of the read. Processes have a GIL each:
they read a chunk from the store (a directory or a zip, opened again on their side) and
decode it straight into shared memory (:mod:`.arena`), which the daemon replies from.
Each chunk costs the daemon two small messages (:mod:`.wire`) and no thread.

:mod:`.pool` is the daemon's side (one per mount, in its context); :mod:`.child` is what
each process runs (it imports nothing of the daemon's: no trio, no FUSE). Anything the
processes cannot serve (a remote store, a chunk that does not fit, metadata they read
otherwise) is decoded in the worker threads as before.
"""
