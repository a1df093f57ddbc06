"""The sizes, windows and waits of a lazy module's read-ahead thread (:mod:`.prefetch`).

Each is read by the thread when it needs it, from :mod:`.prefetch`'s names (which a test
may patch there).
"""

from __future__ import annotations

__all__ = [
    "CHUNK",
    "FIRST_CHUNKS",
    "LEAD",
    "LOAD_CHUNK",
    "LOAD_PATIENCE",
    "LOAD_WINDOW",
    "MAX_HELD",
    "YIELD_SECONDS",
]

#: Programs whose entries one backend call reads ahead; the first chunks are smaller,
#: so that a program asked for early waits for few others' reads. The chunks leave out
#: the program the caller reads itself when it comes back, so in-order calls see chunks
#: of 1, 2, 4, 8 from the third program. (With chunks of 2, 4, 8 from the third, the
#: fourth waited for four reads: on the H200, 12 programs, 0.57 ms over the floor's
#: program, against 0.11 ms with 1, 2, 4, 8.)
CHUNK = 16
FIRST_CHUNKS = (1, 2, 4, 8)
#: Bytes read ahead and not yet taken at which the thread stops reading; the programs it
#: has not reached are then read one at a time, when asked for (a module whose caller
#: asks for few of many programs does not hold every binary in memory).
MAX_HELD = 64 << 20
#: Programs the thread has loaded (or is loading) ahead and the caller has not taken, at
#: which it waits for the caller: a module whose caller asks for few of many programs
#: has at most this many loaded for nothing.
LOAD_WINDOW = 2
#: Programs a chunk reads while the thread also loads: small, because a caller that asks
#: for a program of a chunk being read waits for the whole chunk.
LOAD_CHUNK = 2
#: Seconds the thread waits for the caller to take a program loaded ahead; then it ends
#: (what it loaded stays for the caller to take; the rest is read when asked for).
LOAD_PATIENCE = 0.25
#: The first place after the caller's last program (in the chunks' order) that the
#: thread may load: with 3, a caller asking in order loads every other program itself
#: while the thread loads the one after, two loads at once (PoCL 3.1, 12 programs: each
#: program the thread loaded took 0.15 ms on the caller's thread, the caller's own 0.25
#: ms more than the floor's; with 1 or 2 the caller waited for the thread's loads).
LEAD = 3
#: The thread's pause between two programs' plans (see ``ReadAhead._read``).
YIELD_SECONDS = 20e-6
