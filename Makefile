# Two entry points: `make probe` (the main job) and `make test`. Each creates
# .venv and installs what it needs on first use (torch pinned: 2.13.0 is the
# CPU build this kind of machine carries).
# The first Python >= 3.11 on PATH (a TPU VM's stock image ships 3.10).
FIND_PYTHON = for p in $(1); do $$p -c 'import sys; sys.exit(sys.version_info[:2] < (3, 11))' 2>/dev/null && \
  { echo $$p; break; }; done
PYTHON ?= $(shell $(call FIND_PYTHON,python3 python3.13 python3.12 python3.11))
# How to get Python 3.12, as probes/iut/peer_env.py declares it (read only when a check fails).
GET_PYTHON = $(shell python3 -c 'import ast, re; print(ast.literal_eval(re.search(r"^GET_PYTHON = (\(.*?\))$$", \
  open("probes/iut/peer_env.py").read(), re.S | re.M).group(1)))')
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.kvref-installed
PEER_STAMP := .venv-peer/.kvref-installed
XLA_STAMP := .venv-xla/.kvref-installed
ENGINE_STAMP := .venv-engine/engine-env.json

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# libibverbs1: the tpu-sync nightlies' native module links it. cmake and g++: the C++ core
# builds with them (a stock TPU VM image has neither).
SYSTEM_PACKAGES := libprotobuf-dev protobuf-compiler libibverbs1 iproute2 cmake g++

.PHONY: python-check peer-python-check probe peer-probe connectors peer-env peer-env-torch xla-env xla-probe engine-env engine tpu-test test test-quick bench fuzz baseline refresh-layouts docs wheel clean system-deps

python-check:
	@test -n "$(PYTHON)" || { echo "kvref needs Python >= 3.11 and found none on PATH (python3 is" \
	  "$$(python3 -V 2>&1 | cut -d' ' -f2)); on Ubuntu, as on a TPU VM: $(GET_PYTHON); then run make again" >&2; exit 1; }

# The peer environments need Python 3.12: pyenv's or python3.12 on PATH (probes.iut.peer_env.base_python).
peer-python-check:
	@{ command -v pyenv >/dev/null && pyenv versions --bare | grep -q '^3\.12\.'; } || python3.12 -V >/dev/null 2>&1 || \
	  { echo "the peer environments need Python 3.12 and found none (no pyenv 3.12, no python3.12);" \
	  "on Ubuntu, as on a TPU VM: $(GET_PYTHON); then run make again" >&2; exit 1; }

# C++ protobuf for the plan binding comes from Debian.
system-deps: python-check
	@command -v protoc >/dev/null && command -v ip >/dev/null && test -f /usr/include/google/protobuf/message.h && \
	  ldconfig -p | grep -q libibverbs.so.1 && command -v cmake >/dev/null && command -v g++ >/dev/null || \
	  { $(SUDO) apt-get install -y -q $(SYSTEM_PACKAGES) || \
	    { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q $(SYSTEM_PACKAGES); }; }

$(STAMP): pyproject.toml CMakeLists.txt $(wildcard csrc/*) $(wildcard kvref/proto/*.proto) \
  $(wildcard plugins/pytest-kvprobe/*) | system-deps
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "scikit-build-core>=0.10" "nanobind>=2.4" "torch==2.13.0"
	$(BIN)/python -m pip install -q --no-build-isolation -e ".[dev,oracle,torch,ray]"
	$(BIN)/python -m pip install -q --no-build-isolation --no-deps ./plugins/pytest-kvprobe
	touch $@

probe: $(STAMP)
	$(BIN)/kvprobe run --generation all --out reports

# Python 3.12 with the pinned production tpu-sync-jax, for the peer probes.
$(PEER_STAMP): $(STAMP)
	$(BIN)/kvprobe peer-env
	touch $@

peer-env: $(PEER_STAMP)

# Python 3.11 with torch_xla 2.9.0 and its torch (PyPI's CUDA build: about 3 GB
# to download, 7 GB installed; runs on the CPU): kvref over real lazy tensors.
$(XLA_STAMP): $(STAMP)
	$(BIN)/kvprobe peer-env --lib xla
	touch $@

xla-env: $(XLA_STAMP)

# kvref on torch_xla's CPU device, every probe -> reports/xla/
xla-probe: $(XLA_STAMP)
	$(BIN)/kvprobe run --generation cpu --iut kvref-torch-xla --matrix cpu --probe all --out reports/xla

# Python 3.11 with vLLM (built from its TPU sdist), tpu-inference and JAX for the
# CPU: the real engine as the facade's client (tests/integration/test_engine.py, tests/engine/README.md).
$(ENGINE_STAMP): $(STAMP)
	$(BIN)/python -m tests.engine.build_env

engine-env: $(ENGINE_STAMP)

# Greedy tokens with no connector and with the offload connector over the facade -> reports/cpu/engine.json
engine: $(ENGINE_STAMP)
	.venv-engine/bin/python -m tests.engine.driver --jobs 2 --out reports/cpu/engine.json

# On a TPU VM: tpu-sync-torch with torch and TorchTPU (TorchTPU has no CPU device).
peer-env-torch: $(STAMP)
	$(BIN)/kvprobe peer-env --lib torch

# On a TPU VM: both production libraries on this TPU's arrays and tensors.
tpu-test: peer-python-check $(PEER_STAMP) peer-env-torch
	$(BIN)/python -m pytest -m tpu

# The reference and the production library side by side on JAX CPU arrays. Exit 1
# (cases that disagree with their prediction) is the production library's findings:
# the reports are what this target makes; any other code fails it.
peer-probe: $(PEER_STAMP)
	$(BIN)/kvprobe run --generation cpu --iut kvref-jax,kvref-compat,tpu-sync-jax --matrix cpu --probe all \
	  --out reports || test $$? -eq 1
	$(MAKE) connectors

# tpu-inference's connectors, unmodified, on tpu-sync-jax (in a loopback-only
# namespace) -> reports/cpu/connectors.json; the facade's run is a test.
connectors: $(PEER_STAMP)
	PYTHONPATH=.venv-peer/beside unshare -rn .venv-peer/bin/python -m probes.run.netns tests.connectors.driver \
	  --lib tpu-sync-jax --out reports/cpu/connectors.json

# The two peer environments build side by side (mostly unpacking wheels: one
# core each). One pytest worker per core (pytest-xdist), a test module to a
# worker: the tests of a module share its costly fixtures (a whole run, a cluster).
test: $(STAMP)
	$(MAKE) -j2 $(PEER_STAMP) $(XLA_STAMP) $(ENGINE_STAMP)
	$(BIN)/python -m pytest -n auto --dist loadfile --durations=40

# The inner loop: what a change to one room needs (ROOM=tests/kvref, ...; default every room), without the
# modules marked slow (tests/conftest.py) or the environments they build. CI runs `make test`.
ROOM ?= tests
test-quick: $(STAMP)
	$(BIN)/python -m pytest -n auto --dist loadfile -m "not slow" $(ROOM)

bench: $(STAMP) $(PEER_STAMP)
	$(BIN)/python -m probes.bench.layout
	$(BIN)/python -m probes.bench.manager
	$(BIN)/python -m probes.bench.run
	$(BIN)/python -m probes.bench.plugin
	$(BIN)/python -m probes.bench.pull
	.venv-peer/bin/python -m probes.bench.peer

# Rewrite the committed baselines from the latest run of each generation.
baseline: $(STAMP)
	$(BIN)/kvprobe report --out reports --update-baseline

refresh-layouts: $(STAMP)
	$(BIN)/python -m kvref.oracle.refresh

# Rewrite the lists in docs/ (probes, fault models, options, TPU chips) from their declarations.
docs: $(STAMP)
	$(BIN)/python -m probes.run.docs_lists --write

# The wheels a team installs (docs/iuts.md): kvref's, its C++ core made manylinux by auditwheel (the
# C++ runtime it links taken in, so it runs where glibc is at least this machine's), and the plugin's.
MANYLINUX := manylinux_2_35_x86_64
wheel: $(STAMP)
	rm -rf dist && $(BIN)/python -m pip wheel -q --no-deps --no-build-isolation -w dist/built . ./plugins/pytest-kvprobe
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/auditwheel repair --plat $(MANYLINUX) -w dist dist/built/kvref-*.whl
	mv dist/built/pytest_kvprobe-*.whl dist/ && rm -rf dist/built

clean:
	rm -rf $(VENV) .venv-peer .venv-peer-torch .venv-peer-builds .venv-xla .venv-engine build dist

# A fuzz campaign over kvref's API and the process around it: inputs, refusals, acceptances, failures per category.
fuzz: $(STAMP)
	$(BIN)/python -m probes.fuzz.campaign --inputs 100000 --lifecycle 600 --listener 2000 --imports 200 --verdicts 100
