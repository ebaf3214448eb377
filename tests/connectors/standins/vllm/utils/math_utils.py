"""Stand-in for vllm.utils.math_utils: the disaggregated connector rounds prompt lengths down to whole blocks with round_down."""


def round_down(x: int, y: int) -> int:
    return (x // y) * y


def cdiv(a: int, b: int) -> int:
    return -(a // -b)
