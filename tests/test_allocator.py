"""What the console script's allocator policy (vitcli/allocator.py) does: memory freed by one batch is reused by
the next instead of being handed back to the kernel and faulted in again. Each case runs in a fresh process, so
this test process keeps the C library's defaults."""

from __future__ import annotations

import subprocess
import sys

import pytest

from vitcli.allocator import runs_on_glibc

# Batches like a forward's, straight through the C library (torch takes its tensors' memory from malloc too): three
# 24 MiB activations written, then all freed. By default glibc either maps each block on its own, or, once its
# thresholds have adapted to such blocks, trims the 72 MiB freed at the top of the heap: either way the pages go back
# to the kernel and are faulted in again by the next batch. Prints the page faults of the last five of ten batches.
BATCHES = """
import ctypes, resource, sys
from vitcli import allocator
print(allocator.keep_freed_memory() if sys.argv[1] == "policy" else "defaults")
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
size = 24 * 2**20

def batch():
    activations = [libc.malloc(size) for _ in range(3)]
    for block in activations:
        ctypes.memset(block, 1, size)
    for block in activations:
        libc.free(block)

for _ in range(5):
    batch()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    batch()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def page_faults(mode: str) -> tuple[str, int]:
    result = subprocess.run([sys.executable, "-c", BATCHES, mode], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    applied, faults = result.stdout.split()
    return applied, int(faults)


@pytest.mark.skipif(not runs_on_glibc(), reason="the policy applies to glibc only")
def test_freed_activations_are_reused_instead_of_faulted_in_again():
    defaults, faults_by_default = page_faults("defaults")
    applied, faults_with_policy = page_faults("policy")
    assert applied == "True"
    # Each batch writes 18,432 pages of 4 KiB; by default most are fresh again in every batch.
    assert faults_by_default >= 5 * 9216, faults_by_default
    assert faults_with_policy * 20 <= faults_by_default, (faults_with_policy, faults_by_default)


@pytest.mark.skipif(runs_on_glibc(), reason="this C library is glibc")
def test_other_c_libraries_are_left_alone():
    from vitcli import allocator

    assert allocator.keep_freed_memory() is False
