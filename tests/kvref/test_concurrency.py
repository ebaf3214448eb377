"""Several threads moving disjoint blocks at once; every byte checked."""

import threading

import numpy as np

import kvref

THREADS, ROUNDS, BLOCKS_PER_THREAD = 4, 150, 64


def test_concurrent_disjoint_transfers():
    dev = kvref.SimDevice("tpu7x")
    shape = kvref.Shape.parse("f32[512,256]{1,0}")
    caches = [dev.zeros((512, 256), "f32", shape=shape) for _ in range(2)]
    m = kvref.KVCacheManager(caches, THREADS * BLOCKS_PER_THREAD * 2)
    block = m.bytes_per_block
    failures = []

    def worker(t: int):
        rng = np.random.default_rng(t)
        own_device = t * BLOCKS_PER_THREAD + np.arange(BLOCKS_PER_THREAD)
        own_host = 2 * t * BLOCKS_PER_THREAD + np.arange(2 * BLOCKS_PER_THREAD)
        try:
            for _ in range(ROUNDS):
                picks = rng.choice(BLOCKS_PER_THREAD, 8, replace=False)
                payloads = rng.integers(0, 256, (2, 8, block), dtype=np.uint8)
                for layer in range(2):
                    for k, h in enumerate(own_host[picks]):
                        m.write_block_bytes(layer, int(h), payloads[layer, k])
                m.h2d(own_host[picks], own_device[picks]).result(timeout=60)
                back = own_host[BLOCKS_PER_THREAD + picks]
                m.d2h(own_device[picks], back).result(timeout=60)
                for layer in range(2):
                    for k, h in enumerate(back):
                        if m.read_block_bytes(layer, int(h)) != payloads[layer, k].tobytes():
                            failures.append((t, layer, int(h)))
        except Exception as e:  # reported below, with the thread that saw it
            failures.append((t, repr(e)))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not any(th.is_alive() for th in threads)
    assert failures == []
    # 4 threads x 150 rounds x 2 transfers x 8 blocks x 2 layers of copies happened.
    assert dev.dma_count >= THREADS * ROUNDS * 2 * 8 * 2
