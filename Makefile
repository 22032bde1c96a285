# The README's two commands: `make demo` and `make test`.
PY := .venv/bin/python
PYTEST := $(PY) -m pytest
ADDR ?= 127.0.0.1:50051

.PHONY: install install-test protogen serve serve-distributed demo smoke unit e2e test families-doc group-families bench bench-adapt bench-vision bench-audio bench-spec bench-distributed bench-embed bench-peers soak localai-backend package clean

install:
	./install.sh

install-test:
	./install.sh --test

protogen: install
	$(PY) -m grpc_tools.protoc -I. --python_out=backend --grpc_python_out=backend backend.proto

serve: install
	$(PY) backend/backend.py --addr $(ADDR)

# One model over RANKS local processes (ring backend on loopback); rank 0 serves ADDR.
RANKS ?= 2
# The ranks' control channel is authenticated with MLX_BACKEND_GROUP_SECRET: a fresh one per start when unset.
serve-distributed: install
	MLX_BACKEND_GROUP_SECRET="$${MLX_BACKEND_GROUP_SECRET:-$$($(PY) -c 'import secrets; print(secrets.token_hex(32))')}" \
	.venv/bin/mlx.launch --backend ring -n $(RANKS) --python $(abspath $(PY)) backend/backend.py --addr $(ADDR)

demo: install
	$(PY) backend/demo.py

smoke: install
	$(PY) backend/test.py

unit: install-test
	$(PYTEST) -q tests -m "not e2e"

e2e: install-test
	$(PYTEST) -q tests -m e2e

# The slowest tests are named at the end: the suite is kept under 30 minutes on 2 cores.
test: install-test
	$(PYTEST) -q tests --durations=25
	$(PY) backend/test.py

# The family matrices (every model_type mlx-lm and mlx-vlm ship, tiny, against the libraries'
# own output) into ZOO_RESULTS, then docs/model-families.md from their results. The doc is
# written even when families fail (it says which and why); the target then fails too. It also
# checks the families built with a full-size vision tower (ZOO_FULL_TOWERS=1: minutes each).
ZOO_RESULTS ?= .zoo-results
families-doc: install-test
	rm -rf $(ZOO_RESULTS)
	ZOO_FULL_TOWERS=1 ZOO_RESULTS_DIR=$(abspath $(ZOO_RESULTS)) $(PYTEST) -q -rs $(wildcard tests/e2e/test_e2e_zoo_*.py); \
	status=$$?; $(PY) tests/zoo/families_doc.py $(ZOO_RESULTS) docs/model-families.md && exit $$status

# Every family mlx-lm can divide over 2 and 3 ranks, tensor and pipeline (`make test` runs all but
# most 3-rank tensor cases, the slowest on 2 cores: tests/e2e/test_e2e_group_zoo.py says which).
group-families: install-test
	GROUP_FULL=1 $(PYTEST) -q tests/e2e/test_e2e_group_zoo.py --durations=10

# BENCH=prefix: only the prefix-cache scenarios (tests/bench/bench_prefix.py, ~10 min); BENCH=all: both.
BENCH ?= main
bench: install-test
	$(if $(filter main all,$(BENCH)),$(PY) tests/bench/bench.py)
	$(if $(filter prefix all,$(BENCH)),$(PY) tests/bench/bench_prefix.py $(BENCH_ARGS))

bench-adapt: install-test
	$(PY) tests/bench/bench_adapt.py
bench-vision: install-test
	$(PY) tests/bench/bench_vision.py
bench-audio: install-test
	$(PY) tests/bench/bench_audio.py $(BENCH_ARGS)
bench-spec: install-test
	$(PY) tests/bench/bench_spec.py
bench-distributed: install-test
	$(PY) tests/bench/bench_distributed.py $(BENCH_ARGS)
# Ours against mlx_lm.server, vllm-mlx and rapid-mlx on a seeded chat trace; each peer installs into a
# venv of its own outside the repo on first use (several GB). BENCH_ARGS=... sets the trace (see --help).
bench-peers: install-test
	$(PY) tests/bench/bench_peers.py $(BENCH_ARGS)

soak: install-test
	SOAK_REQUESTS=300 $(PYTEST) -q -s tests/e2e/test_soak.py

NAME ?= mlx
localai-backend: install
	@test -n "$(DEST)" || { echo "usage: make localai-backend DEST=<LocalAI backends folder> [NAME=mlx] [ALIAS=...]" >&2; exit 2; }
	$(PY) backend/localai_backend.py "$(DEST)" --name "$(NAME)" $(if $(ALIAS),--alias "$(ALIAS)")

# The LocalAI artifact (docs/localai.md): dist/<name>/ and dist/<name>.tar with a Python of its
# own, and dist/index.yaml, a backend gallery: of this machine (its entry the tar, ocifile://) or, with
# PACKAGE_IMAGE (quay.io/, ghcr.io/, docker.io/ or oci://<registry>/...), of PACKAGE_IMAGE:PACKAGE_TAG-<platform>.
# PYTHON_DIST=<python-build-standalone install_only .tar.gz> bundles that interpreter instead
# of a copy of this machine's; PACKAGE_NAME overrides the platform's entry name (cpu-mx-backend).
PACKAGE_IMAGE ?=
PACKAGE_TAG ?= latest
package: install
	$(PY) bundle/build.py --image "$(PACKAGE_IMAGE)" --version "$(PACKAGE_TAG)" $(if $(PACKAGE_NAME),--name "$(PACKAGE_NAME)") \
		$(if $(PYTHON_DIST),--python-dist "$(PYTHON_DIST)") >/dev/null

clean:
	rm -rf .venv dist backend/backend_pb2.py backend/backend_pb2_grpc.py .pytest_cache .hypothesis .zoo-results
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

bench-embed: install-test
	$(PY) tests/bench/bench_embed.py
