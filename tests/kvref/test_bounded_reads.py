"""Reads bounded where they enter (kvref.bounded_reads and each place that
reads what a user, a host or a peer hands it): a FIFO, /dev/zero, a 2 GiB
file, an endless or dripping answer, a peer's oversized reply are each
refused at their bound, quickly, never read whole."""

import io
import os
import time
from concurrent import futures

import grpc
import pytest

from kvref import bounded_reads
from kvref.compat import data_rails
from kvref.listener import REPLY_FRAMING_BYTES, peer_channel
from probes.run import forked
from probes.suite import matrix


def test_a_fifo_or_a_device_is_refused_unread_and_a_long_file_at_its_bound(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # nobody writes it: a blocking open or read would never return
    with pytest.raises(ValueError, match=r"an MTU \(.*fifo\) is not a regular file \(a FIFO\)"):
        bounded_reads.read_file(fifo, 32, "an MTU")
    with pytest.raises(ValueError, match="not a regular file .a character device"):
        bounded_reads.read_file("/dev/zero", 32, "an MTU")
    long = tmp_path / "long"
    long.write_bytes(b"9" * 33)
    with pytest.raises(bounded_reads.TooLarge, match="larger than 32 bytes"):
        bounded_reads.read_file(long, 32, "an MTU")
    long.write_bytes(b"9" * 32)
    assert bounded_reads.read_file(long, 32, "an MTU") == b"9" * 32


def test_an_interface_whose_mtu_is_a_fifo_or_endless_is_no_data_plane_nic(tmp_path):
    net = tmp_path / "class" / "net"
    for name, how in (("fifo0", "fifo"), ("zero0", "zero"), ("big0", "big"), ("jumbo0", "ok")):
        (net / name / "device").mkdir(parents=True)
        mtu = net / name / "mtu"
        if how == "fifo":
            os.mkfifo(mtu)
        elif how == "zero":
            mtu.symlink_to("/dev/zero")
        else:
            mtu.write_text("8" * 10**6 if how == "big" else "8896\n")
    started = time.monotonic()
    assert data_rails.data_nics({data_rails.SYSFS_VARIABLE: str(tmp_path)}) == ["jumbo0"]
    assert time.monotonic() - started < 5


def test_a_matrix_file_beyond_its_bound_is_refused_before_it_is_read(tmp_path):
    huge = tmp_path / "huge.csv"
    with open(huge, "wb") as f:
        f.truncate(2 * 2**30)  # 2 GiB with no newline (sparse: no disk taken)
    with pytest.raises(ValueError, match=f"larger than {matrix.MATRIX_FILE_BYTES:,} bytes"):
        matrix.load_matrix(str(huge))


def test_an_answer_that_never_ends_or_drips_is_cut_off():
    class Endless(io.RawIOBase):
        def read1(self, n):
            return b"x" * n

    with pytest.raises(bounded_reads.TooLarge, match="larger than 1,000 bytes"):
        bounded_reads.read_stream(Endless(), 1000, "an answer")

    class Drip(io.RawIOBase):
        def read1(self, n):
            time.sleep(0.05)
            return b"x"

    with pytest.raises(TimeoutError, match="did not end within 0.3 s"):
        bounded_reads.read_stream(Drip(), 10**6, "an answer", seconds=0.3)


def test_a_peer_answering_more_than_the_call_can_carry_fails_the_call_before_it_is_held():
    answer = b"x" * (REPLY_FRAMING_BYTES + 4096)
    server = grpc.server(futures.ThreadPoolExecutor(2))
    handler = grpc.method_handlers_generic_handler("t.T", {"Big": grpc.unary_unary_rpc_method_handler(
        lambda request, context: answer, request_deserializer=lambda b: b, response_serializer=lambda b: b)})
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        address = f"127.0.0.1:{port}"
        with peer_channel(address, 1024) as channel:
            with pytest.raises(grpc.RpcError) as raised:
                channel.unary_unary("/t.T/Big", request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)(b"", timeout=10)
            assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        with peer_channel(address, len(answer)) as channel:
            assert channel.unary_unary("/t.T/Big", request_serializer=lambda b: b,
                                       response_deserializer=lambda b: b)(b"", timeout=10) == answer
    finally:
        server.stop(None)


def test_a_workers_output_is_kept_to_its_end_within_the_bound():
    tail = forked.KeptEnd(10_000)
    for n in range(100):
        tail.add(bytes([n]) * 1000)
    kept = tail.bytes()
    assert 10_000 <= len(kept) < 11_000 and kept.endswith(bytes([99]) * 1000) and tail.held == len(kept)
    everything = forked.KeptEnd(None)
    for n in range(100):
        everything.add(b"y" * 1000)
    assert len(everything.bytes()) == 100_000
