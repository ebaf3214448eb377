"""Stand-in for libtpu (no TPU runtime on a CPU machine).

vLLM chooses its TPU platform, the one that loads tpu-inference's worker and
model runner, only if `import libtpu` succeeds (vllm/platforms/__init__.py,
tpu_platform_plugin). The real wheel is a TPU runtime that cannot run here;
nothing the engine runs on the CPU backend calls into it. This package is
put on sys.path by tests.engine.standins.install() only."""

__version__ = "0.0.0+kvprobe-cpu-standin"
