"""A step's freed temporaries stay in the process for the next step (memory.py), measured as the
page faults of a second allocation of a logits-sized block, each way in a fresh interpreter."""

import subprocess
import sys

import pytest

from egrm.engines.embedded.memory import retain_freed_memory

CYCLE = """
import ctypes, resource, sys
from egrm.engines.embedded.memory import retain_freed_memory
if sys.argv[1] == "retain":
    assert retain_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
size = 19 * 2**20  # 96 rows of logits over a 49k vocabulary, float32

def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)  # written, as a step writes its logits
    libc.free(block)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

faults()  # the first time, the pages are new either way
print(faults())
"""


def second_allocation_faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", CYCLE, mode], capture_output=True, text=True, check=True)
    return int(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc: Linux only")
def test_a_freed_block_is_reused_without_faulting_its_pages_in_again():
    pages = 19 * 2**20 // 4096
    assert second_allocation_faults("default") > pages // 2  # glibc gave it back and faults it in again
    assert second_allocation_faults("retain") < pages // 50
    assert retain_freed_memory()  # idempotent, in this process too
