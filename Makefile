# attn — the two commands of the README, plus the pieces they are made of.
#   make demo   install what is missing, configure, build, run the demo
#   make test   the same, then every test (ctest: unit, against PyTorch, install/consumer)
#   make train-example  a tiny transformer learning with attn's MHA backward (examples/tiny_decoder)
#   make serve-example  continuous batching over the paged KV cache with fork (examples/paged_server)
#   make bench  a Release build, `attn bench` on every shape id, results into BENCHMARKS.md
#   make fuzz   the libFuzzer targets (clang, ASan + UBSan), each for FUZZ_SECONDS (fuzz/README.md)
#   make tsan   the threaded tests under ThreadSanitizer (clang, libomp + Archer; docs/build.md)
BUILD    ?= build
JOBS     ?= $(shell nproc)
GENERATOR := $(shell command -v ninja >/dev/null 2>&1 && echo Ninja || echo "Unix Makefiles")

.PHONY: all demo test deps deps-test configure build bench clean train-example serve-example fuzz tsan

all: build

deps:
	@bash scripts/install-deps.sh build

deps-test:
	@bash scripts/install-deps.sh test

# Re-running cmake on a configured tree is quick and picks up packages installed since.
configure:
	@if [ -f $(BUILD)/CMakeCache.txt ]; then cmake $(BUILD) >/dev/null; \
	else cmake -S . -B $(BUILD) -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=Release; fi

build: deps configure
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	$(BUILD)/tools/attn demo

test: deps-test configure
	cmake --build $(BUILD) -j $(JOBS)
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# The benchmark: Release build (the build dir is reconfigured as Release), `attn bench` over
# every shape id of bench/shapes.md on BENCH_THREADS threads beside the reference and torch,
# the JSON kept in $(BUILD)/bench.json and its section of BENCHMARKS.md refreshed.
# Extra options: make bench BENCH_ARGS="--shapes S1,S2 --runs 7".
BENCH_THREADS ?= $(shell nproc)
BENCH_ARGS ?=
bench: deps-test
	@if [ -f $(BUILD)/CMakeCache.txt ]; then cmake $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null; \
	else cmake -S . -B $(BUILD) -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=Release; fi
	cmake --build $(BUILD) -j $(JOBS) --target attn_cli
	$(BUILD)/tools/attn bench --threads $(BENCH_THREADS) --json $(BUILD)/bench.json $(BENCH_ARGS)
	/usr/bin/python3 scripts/bench-to-markdown.py $(BUILD)/bench.json BENCHMARKS.md

# A tiny decoder-only transformer learning to reverse sequences with attn's causal MHA
# (examples/tiny_decoder): prints the loss as it trains, then held-out accuracy.
train-example: build
	$(BUILD)/examples/tiny_decoder/tiny_decoder

serve-example: build
	$(BUILD)/examples/paged_server/paged_server

# The parsers under libFuzzer: .npy, safetensors, the CLI's arguments, the Python array
# conversion. Their own clang build dir ($(BUILD)/fuzz; the main build stays g++); what the
# fuzzer learns is kept there, findings land in $(BUILD)/fuzz/findings/<target>/.
# One target: make fuzz FUZZ_TARGETS=fuzz_npy. `make test` runs each for 15 s.
FUZZ_SECONDS ?= 300
FUZZ_TARGETS ?=
fuzz: deps-test
	bash fuzz/run.sh . $(BUILD)/fuzz $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# ThreadSanitizer (docs/build.md, "ThreadSanitizer build"): its own clang build dir
# ($(BUILD)-tsan), then the tests of threads, interrupts and every kernel on OpenMP teams of
# TSAN_THREADS (more than the CPUs: more interleavings). Not part of `make test`: it builds attn
# again with clang and runs for tens of minutes.
TSAN_THREADS ?= 2
TSAN_TESTS ?= ^(threads_|ConcurrentCalls|Interrupt|SameBits|Flash|Shards/FlashRandom|Decode|Paged|KVCache|Incremental|Varlen|Mha)
tsan: deps-test
	@if [ ! -f $(BUILD)-tsan/CMakeCache.txt ]; then cmake -S . -B $(BUILD)-tsan -G "$(GENERATOR)" \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++-14 -DATTN_SANITIZE=thread \
	  -DATTN_BUILD_DEV=OFF -DATTN_BUILD_EXAMPLES=OFF; fi
	cmake --build $(BUILD)-tsan -j $(JOBS)
	OMP_NUM_THREADS=$(TSAN_THREADS) ctest --test-dir $(BUILD)-tsan -R '$(TSAN_TESTS)' --timeout 1200 --output-on-failure

clean:
	rm -rf $(BUILD)
