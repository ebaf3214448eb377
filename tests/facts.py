"""Layouts the real XLA TPU compiler picks, as observed on TPU hardware and by
ahead-of-time compiles (the seed shapes of kvref.oracle.table_shapes):
(generations, dtype, dims, layout text, addressable)."""

NEWER = ("v4", "v5e", "v5p", "v6e", "tpu7x")
ALL = ("v3",) + NEWER

LAYOUT_FACTS = [
    (NEWER, "bf16", (512, 3, 2048), "bf16[512,3,2048]{2,0,1:T(8,128)(2,1)}", False),
    (NEWER, "bf16", (512, 6144), "bf16[512,6144]{1,0:T(8,128)(2,1)}", False),
    (NEWER, "s8", (512, 12288), "s8[512,12288]{1,0:T(32,128)(4,1)}", False),
    (("v3",), "s8", (512, 12288), "s8[512,12288]{1,0:T(8,128)(4,1)}", False),
    (("v5e", "tpu7x"), "bf16", (512, 4, 2048), "bf16[512,4,2048]{2,1,0:T(4,128)(2,1)}", True),
    (ALL, "bf16", (512, 8, 2048), "bf16[512,8,2048]{2,1,0:T(8,128)(2,1)}", True),
    (ALL, "bf16", (512, 16, 2048), "bf16[512,16,2048]{2,1,0:T(8,128)(2,1)}", True),
    (("v5e", "tpu7x"), "bf16", (1024, 32, 576), "bf16[1024,32,576]{0,2,1:T(8,128)(2,1)}", False),
    (("v5e", "tpu7x"), "bf16", (2048, 64, 2, 128), "bf16[2048,64,2,128]{3,2,1,0:T(2,128)(2,1)}", True),
    (("tpu7x",), "f32", (512, 1, 128), "f32[512,1,128]{2,1,0:T(1,128)}", True),
    (("tpu7x",), "f32", (7,), "f32[7]{0:T(128)}", False),
    (("tpu7x",), "f32", (1024,), "f32[1024]{0:T(1024)}", True),
]


def fact_cases():
    return [(gen, dtype, dims, text, ok) for gens, dtype, dims, text, ok in LAYOUT_FACTS for gen in gens]
