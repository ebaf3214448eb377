"""The TPU generations kvref knows, and the topology each is compiled for."""

GENERATIONS: tuple[str, ...] = ("v3", "v4", "v5e", "v5p", "v6e", "tpu7x")

TOPOLOGIES: dict[str, str] = {
    "v3": "v3:2x2",
    "v4": "v4:2x2x1",
    "v5e": "v5e:1x1",
    "v5p": "v5p:2x2x1",
    "v6e": "v6e:1x1",
    "tpu7x": "tpu7x:2x2x1",
}


def check_generation(generation: str) -> str:
    if generation not in TOPOLOGIES:
        raise ValueError(f"unknown TPU generation {generation!r}; expected one of "
                         f"{', '.join(GENERATIONS)}")
    return generation
