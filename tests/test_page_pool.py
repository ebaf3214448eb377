"""The page pool a zygote lends to its workers (kvref's page_pool.h): the
simulated device's memory comes from the worker's slot and is given back when
dropped, private again in a child the worker forks; and a buffer the slot cannot hold maps its own pages.
Each test runs in a fresh interpreter (a process reserves its pool once)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PRELUDE = """
import os, sys
import numpy as np
import kvref
from kvref import page_pool

def in_child(body):
    '''Run body() in a forked child; its exit status.'''
    pid = os.fork()
    if pid == 0:
        try:
            body()
        except BaseException as e:
            print('CHILD', type(e).__name__, e, flush=True)
            os._exit(1)
        os._exit(0)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
"""


def run(script: str) -> str:
    done = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(script)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_workers_device_memory_is_lent_and_given_back():
    out = run("""
        page_pool.reserve(2, 64 << 20)
        def worker():
            page_pool.attach(1)
            device = kvref.SimDevice("v5e")
            array = device.zeros((512, 1024), "f32")  # 2 MiB: lent
            array.await_buffer()
            print("lent", page_pool.stats()["lent_bytes"])
            del array
            print("after", page_pool.stats()["lent_bytes"])
            print("small", device.zeros((8, 128), "f32") is not None, page_pool.stats()["lent_bytes"])
        assert in_child(worker) == 0
        print("parent", page_pool.stats())
    """)
    lent = dict(line.split(" ", 1) for line in out.splitlines())
    assert lent["lent"] == str(2 << 20)
    assert lent["after"] == "0"
    assert lent["small"] == "True 0"  # 4 KiB: mapped as before, never lent
    assert "'attached': -1" in lent["parent"] and "'lent_bytes': 0" in lent["parent"]


def test_a_child_forked_by_a_worker_has_its_own_copy_of_the_slot():
    out = run("""
        page_pool.reserve(1, 64 << 20)
        def worker():
            page_pool.attach(0)
            device = kvref.SimDevice("v5e")
            array = device.put(np.arange(512 * 1024, dtype=np.float32).reshape(512, 1024))
            array.await_buffer()
            at_fork = array.physical_bytes()
            written, child_may_look = os.pipe()
            pid = os.fork()
            if pid == 0:  # the grandchild looks once the worker has overwritten its array
                os.read(written, 1)
                print("child still sees the bytes at fork", np.array_equal(array.physical_bytes(), at_fork),
                      flush=True)
                os._exit(0)
            array.fill_(3.0)
            array.await_buffer()
            os.write(child_may_look, b"x")
            os.waitpid(pid, 0)
            print("worker sees its write", bool((device.fetch(array) == 3.0).all()), flush=True)
        assert in_child(worker) == 0
    """)
    assert "child still sees the bytes at fork True" in out
    assert "worker sees its write True" in out


def test_a_buffer_the_slot_cannot_hold_maps_its_own_pages():
    out = run("""
        page_pool.reserve(1, 1 << 20)
        def worker():
            page_pool.attach(0)
            values = np.arange(512 * 1024, dtype=np.float32).reshape(512, 1024)  # 2 MiB > the slot
            device = kvref.SimDevice("v5e")
            array = device.put(values)
            print("lent", page_pool.stats()["lent_bytes"])
            print("exact", bool((device.fetch(array) == values).all()))
        assert in_child(worker) == 0
    """)
    assert "lent 0" in out and "exact True" in out


def test_buffers_dropped_after_exit_began_are_given_back_safely():
    """A device op still running when the process exits ends after C++'s
    static destructors: the pool must outlive them (a heap corruption abort
    before)."""
    out = run("""
        import ctypes
        page_pool.reserve(1, 256 << 20)
        def worker():
            page_pool.attach(0)
            device = kvref.SimDevice("v5e")
            arrays = [device.zeros((512, 1024), "f32") for _ in range(8)]
            for a in arrays:
                a.write_(np.ones((512, 1024), np.float32), run_us=50_000)
            globals()["kept"] = (device, arrays)
            ctypes.PyDLL(None).exit(0)
        print("status", in_child(worker))
    """)
    assert "status 0" in out


def test_arrays_made_inside_lent_arrays_come_from_the_slot_and_only_those():
    out = run("""
        page_pool.reserve(1, 64 << 20)
        def worker():
            page_pool.attach(0)
            outside = np.ones(1 << 20, np.uint8)
            print("outside", page_pool.stats()["lent_bytes"])
            with page_pool.lent_arrays():
                print("handler", np._core.multiarray.get_handler_name())
                inside = np.arange(1 << 18, dtype=np.int32)  # 1 MiB
                zeros = np.zeros(1 << 20, np.uint8)
                small = np.ones(1000)
            print("after", np._core.multiarray.get_handler_name(), page_pool.stats()["lent_bytes"])
            inside.resize(1 << 19, refcheck=False)  # realloc through the handler the array was made with
            print("kept", bool((inside[: 1 << 18] == np.arange(1 << 18)).all()), page_pool.stats()["lent_bytes"],
                  not zeros.any())
            del inside, zeros
            print("returned", page_pool.stats()["lent_bytes"])
        assert in_child(worker) == 0
        with page_pool.lent_arrays():  # no slot in this process: NumPy's own handler
            print("unattached", np._core.multiarray.get_handler_name())
    """)
    said = dict(line.split(" ", 1) for line in out.splitlines())
    assert said["outside"] == "0"
    assert said["handler"] == "kvref_page_pool"
    assert said["after"] == f"default_allocator {(1 << 20) + (1 << 20)}"
    assert said["kept"] == f"True {(2 << 20) + (1 << 20)} True"
    assert said["returned"] == "0"
    assert said["unattached"] == "default_allocator"


@pytest.mark.parametrize("call, needle", [
    ("page_pool.attach(0)", "attach before reserve"),
    ("page_pool.reserve(2, 1 << 20); page_pool.attach(2)", "slot 2 is not in [0, 2)"),
    ("page_pool.reserve(2, 1000)", "positive multiple of 4096"),
    ("page_pool.reserve(1, 1 << 20); page_pool.reserve(1, 1 << 20)", "already reserved"),
    ("page_pool.reserve(1, 1 << 20); page_pool.attach(0); page_pool.attach(0)",
     "already attached"),
])
def test_bad_pool_calls_are_refused_by_name(call, needle):
    out = run(f"""
        try:
            {call}
        except Exception as e:
            print("refused", e)
    """)
    assert needle in out
