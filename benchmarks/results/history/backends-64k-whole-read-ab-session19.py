"""A/B of the directory backend's read in pieces (A) against one whole read (B), 64 KiB.

Run from benchmarks/: ``python ab.py a|b --sizes 64KiB --rounds 9 --processes 0 --json F``.
B raises ``PARTS_FROM`` past any entry, so every file is read whole and the front copies
the value out of it; A is the code as it is.
"""

import runpy
import sys

sys.path.insert(0, ".")
if sys.argv[1] == "b":
    import runtime_cache.backends.bounded_reads as bounded_reads

    bounded_reads.PARTS_FROM = 1 << 30  # (read_parts moved out of dir_fs)
sys.argv = ["bench_backends.py", *sys.argv[2:]]
runpy.run_path("bench_backends.py", run_name="__main__")
