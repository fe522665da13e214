# attn — the two commands of the README, plus the pieces they are made of.
#   make demo   install what is missing, configure, build, run the demo
#   make test   the same, then every test (ctest: unit, against PyTorch, install/consumer)
BUILD    ?= build
JOBS     ?= $(shell nproc)
GENERATOR := $(shell command -v ninja >/dev/null 2>&1 && echo Ninja || echo "Unix Makefiles")

.PHONY: all demo test deps deps-test configure build bench clean

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

clean:
	rm -rf $(BUILD)
