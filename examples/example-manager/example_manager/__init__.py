"""A team's KV-cache offload manager, as kvprobe sees it from outside: the
manager (`manager.py`, here a thin layer over kvref's reference standing in
for your own), and its declaration as an implementation under test
(`iut.py`)."""
