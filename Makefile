# Convenience front end over CMake presets. `make` builds build/ferry; `make demo` runs the main
# job; `make test` runs the whole suite (default preset, then asan, then docs). Missing Debian
# packages are installed first when run as root (scripts/setup-deps.sh).
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
DEMO_DIR ?= build/demo

.PHONY: all build deps demo test test-default test-asan docs install clean

all: build

deps:
	@scripts/setup-deps.sh

build: deps
	@cmake --preset default >/dev/null
	@cmake --build --preset default -j $(JOBS)

demo: build
	@scripts/demo.sh $(DEMO_DIR)

test-default: build
	ctest --preset default -j $(JOBS)

test-asan: deps
	@cmake --preset asan >/dev/null
	@cmake --build --preset asan -j $(JOBS)
	ctest --preset asan -j $(JOBS)

test: test-default test-asan docs

docs: deps
	@mkdir -p build/docs
	doxygen Doxyfile
	@echo "API documentation: build/docs/html/index.html"

install: build
	cmake --install build

clean:
	rm -rf build build-asan build-release
