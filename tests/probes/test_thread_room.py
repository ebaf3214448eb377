"""A case that hands a library a huge thread count runs out of room for
threads in its own process, before the machine runs out of process ids."""

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_process_has_room_for_a_thousand_threads_not_the_machines_last_ids():
    # In a process of its own: the limit holds for every thread of the process it is set in.
    script = textwrap.dedent("""
        import resource, threading
        from probes.suite.thread_room import room_for_threads
        before = resource.getrlimit(resource.RLIMIT_AS)
        started, stop, refused = [], threading.Event(), ""
        with room_for_threads():
            try:
                for _ in range(3000):  # past the room, well short of the machine's ids
                    thread = threading.Thread(target=stop.wait)
                    thread.start()
                    started.append(thread)
            except RuntimeError as e:
                refused = str(e)
        stop.set()
        for thread in started:
            thread.join()
        print(len(started), refused, resource.getrlimit(resource.RLIMIT_AS) == before)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    count, *said, restored = done.stdout.split()
    assert 500 < int(count) <= 1024 and restored == "True", done.stdout
    assert "can't start new thread" in " ".join(said)
